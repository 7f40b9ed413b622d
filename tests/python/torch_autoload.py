# SPDX-License-Identifier: MIT
"""torch 2.5+ loading a pip-installed kcoll's backend by itself (the
"torch.backends" entry point, _kcoll_torch.autoload): run with the python
of a venv kcoll was pip-installed into. Prints "ok - ..." / "not ok - ..."
lines (python_lib.sh's emit numbers them).

    torch_autoload.py            the checks (spawns the ranks below)
    torch_autoload.py rank R N   one rank: init_process_group("kcoll") with
                                 no import of kcoll, all_reduce, broadcast

The ranks reach kcolld at $KCOLL_SOCKET; KCOLL_LIB may name libkcoll.
"""
import json
import os
import subprocess
import sys
import tempfile


def rank_main(rank, world, init):
    import torch
    import torch.distributed as dist

    loaded = sorted(m for m in sys.modules if "kcoll" in m)
    dist.init_process_group("kcoll", init_method=f"file://{init}", rank=rank, world_size=world)
    t = torch.arange(1000, dtype=torch.float32) + rank
    dist.all_reduce(t)
    want = torch.arange(1000, dtype=torch.float32) * world + sum(range(world))
    b = torch.full((7,), float(rank + 5))
    dist.broadcast(b, src=world - 1)
    print(f"modules-at-import {','.join(loaded)} backend {dist.get_backend()} "
          f"allreduce {'right' if torch.equal(t, want) else 'wrong'} "
          f"broadcast {'right' if bool((b == world + 4).all()) else 'wrong'}", flush=True)
    dist.destroy_process_group()


def run_ranks(world, env_extra, timeout=120):
    """world ranks of rank_main; returns [(rc, output)]."""
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, USE_LIBUV="0", **env_extra)
        env.pop("PYTHONPATH", None)  # the venv's kcoll, not the tree's
        procs = [subprocess.Popen([sys.executable, __file__, "rank", str(r), str(world), f"{d}/init"],
                                  env=env, cwd=d, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True) for r in range(world)]
        out = []
        for p in procs:
            try:
                o, _ = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                o, _ = p.communicate()
                o += " (timed out)"
            out.append((p.returncode, o.strip()))
        return out


def check(cond, desc, detail=""):
    print(f"{'ok' if cond else 'not ok'} - {desc}{': ' + detail if detail and not cond else ''}",
          flush=True)


def main():
    os.environ.pop("PYTHONPATH", None)
    probe = ("import sys, torch; "
             "print(sorted(m for m in sys.modules if 'kcoll' in m), "
             "any('libkcoll' in l for l in open('/proc/self/maps')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd="/")
    check(out.returncode == 0 and out.stdout.strip() == "['_kcoll_torch'] False",
          "autoload: import torch imports _kcoll_torch and loads no libkcoll",
          f"rc {out.returncode}: {out.stdout.strip()} {out.stderr.strip()[-300:]}")

    res = run_ranks(2, {})
    good = all(rc == 0 and "backend kcoll allreduce right broadcast right" in o
               and "modules-at-import _kcoll_torch " in o for rc, o in res)
    check(good, "autoload: 2 ranks, init_process_group('kcoll') with no import of kcoll: "
          "all_reduce and broadcast right", repr(res)[-600:])

    for var in ("TORCH_DEVICE_BACKEND_AUTOLOAD", "KCOLL_TORCH_AUTOLOAD"):
        res = run_ranks(1, {var: "0"})
        rc, o = res[0]
        check(rc != 0 and "kcoll" in o and "backend kcoll" not in o,
              f"{var}=0: no backend 'kcoll' without import kcoll.torch", f"rc {rc}: {o[-400:]}")

    res = run_ranks(1, {"KCOLL_LIB": "/nonexistent/libkcoll.so.1"})
    rc, o = res[0]
    check(rc != 0 and "the torch.distributed backend 'kcoll' cannot load" in o
          and "/nonexistent/libkcoll.so.1: no such file" in o and "modules-at-import" not in o,
          "no libkcoll: import torch works, init_process_group('kcoll') raises saying why",
          f"rc {rc}: {o[-400:]}")

    out = subprocess.run([sys.executable, "-m", "kcoll", "--json"], capture_output=True, text=True,
                         cwd="/", timeout=120)
    try:
        torch = json.loads(out.stdout)["torch"]
    except ValueError:
        torch = {}
    text = subprocess.run([sys.executable, "-m", "kcoll"], capture_output=True, text=True, cwd="/",
                          timeout=120).stdout
    check(out.returncode == 0 and torch.get("autoload") is True and torch.get("backend") == "kcoll"
          and "registered (CPU tensors; by import torch itself: no import kcoll.torch needed)" in text,
          "python -m kcoll says torch itself registered the backend",
          f"rc {out.returncode}: {out.stdout[-300:]} {out.stderr[-300:]} {text[-300:]}")

    code = ("import torch, torch.distributed as dist, kcoll.torch, _kcoll_torch; "
            "assert not _kcoll_torch.register(kcoll.torch._create); "
            "import tempfile; d = tempfile.mkdtemp(); "
            "dist.init_process_group('kcoll', init_method=f'file://{d}/i', rank=0, world_size=1); "
            "t = torch.ones(5); dist.all_reduce(t); assert t.sum().item() == 5; "
            "dist.destroy_process_group(); print('fine')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/",
                         env=dict(os.environ, USE_LIBUV="0"), timeout=120)
    check(out.returncode == 0 and out.stdout.strip() == "fine",
          "import kcoll.torch after autoload: registered once, a 1-rank group works",
          f"rc {out.returncode}: {out.stdout.strip()} {out.stderr.strip()[-400:]}")


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "rank":
        rank_main(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
    else:
        main()
