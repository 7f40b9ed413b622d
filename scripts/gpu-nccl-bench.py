#!/usr/bin/env python3
"""The NCCL anchor of scripts/gpu-check.sh: torch.distributed all-reduce (f32
sum) with every rank on CUDA device 0, as kcolld's ranks share one GPU.

NCCL normally refuses two ranks on one device ("Duplicate GPU detected"): that
refusal is a result too, recorded with NCCL's words, and the comparison then
falls back to the copy bound (kcoll-gpu-bench allreduce). Writes one JSON
object to --out: {"bench": "nccl", "status": "ok" | "refused" | "error",
"summary": ..., "rows": [...], "ranks": [...]}.
Exit status: 0 measured or refused cleanly, 1 error, 77 no torch/CUDA here.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import time


def rank_main(a):
    import torch
    import torch.distributed as dist
    from datetime import timedelta

    res = {"rank": a.rank, "rows": [], "error": None}
    try:
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{a.port}",
                                rank=a.rank, world_size=a.world,
                                timeout=timedelta(seconds=a.timeout))
        size = 1 << 20
        while size <= a.max_bytes:
            n = size // 4
            x = torch.full((n,), float(a.rank + 1), device="cuda:0")
            dist.all_reduce(x)      # warm-up, and the first place NCCL may refuse
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            dist.all_reduce(x)
            torch.cuda.synchronize()
            t1 = time.perf_counter() - t0
            reps = max(3, min(1000, int(a.seconds / max(t1, 1e-9))))
            t = torch.tensor([float(reps)], device="cuda:0")
            dist.all_reduce(t, op=dist.ReduceOp.MAX)    # every rank the same count
            reps = int(t.item())
            x.fill_(float(a.rank + 1))
            torch.cuda.synchronize()
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(reps):
                dist.all_reduce(x)
            torch.cuda.synchronize()
            el = (time.perf_counter() - t0) / reps
            res["rows"].append({"bytes": size, "time_us": el * 1e6, "reps": reps})
            size *= 4
        dist.destroy_process_group()
    except Exception as e:      # NCCL's refusal arrives as an exception
        res["error"] = f"{type(e).__name__}: {e}"
    with open(a.rank_out, "w") as f:
        json.dump(res, f)
    return 0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--max-bytes", type=int, default=256 << 20)
    p.add_argument("--seconds", type=float, default=0.25)
    p.add_argument("--timeout", type=int, default=60)
    p.add_argument("--rank", type=int)
    p.add_argument("--world", type=int)
    p.add_argument("--port", type=int)
    p.add_argument("--rank-out")
    a = p.parse_args()
    if a.rank is not None:
        return rank_main(a)

    doc = {"bench": "nccl", "ranks_requested": a.ranks, "device": "cuda:0 for every rank",
           "status": "error", "summary": "", "rows": [], "ranks": []}

    def finish(code):
        with open(a.out, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"nccl: {doc['status']}: {doc['summary']}")
        return code

    try:
        import torch
        doc["torch"] = torch.__version__
        if not torch.cuda.is_available():
            doc["status"], doc["summary"] = "skipped", "torch sees no CUDA device"
            return finish(77)
        doc["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        doc["gpu"] = torch.cuda.get_device_name(0)
    except Exception as e:
        doc["status"] = "skipped"
        doc["summary"] = f"torch with CUDA not importable by {sys.executable}: {type(e).__name__}: {e}"
        return finish(77)

    port = free_port()
    env = dict(os.environ, NCCL_DEBUG=os.environ.get("NCCL_DEBUG", "WARN"))
    procs, outs = [], []
    for r in range(a.ranks):
        ro = f"{a.out}.rank{r}"
        outs.append(ro)
        procs.append(subprocess.Popen(
            [sys.executable, __file__, "--out", a.out, "--rank", str(r), "--world", str(a.ranks),
             "--port", str(port), "--rank-out", ro, "--max-bytes", str(a.max_bytes),
             "--seconds", str(a.seconds), "--timeout", str(a.timeout)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = []
    for pr in procs:
        try:
            logs.append(pr.communicate(timeout=a.timeout + 30)[0])
        except subprocess.TimeoutExpired:
            pr.kill()
            logs.append(pr.communicate()[0] + "\n[killed: no answer within the timeout]")
    errors = []
    for r, ro in enumerate(outs):
        try:
            with open(ro) as f:
                rr = json.load(f)
            os.unlink(ro)
        except (OSError, ValueError):
            rr = {"rank": r, "rows": [], "error": "no result (the rank died or hung)"}
        rr["exit"] = procs[r].returncode
        rr["log_tail"] = logs[r][-2000:]
        doc["ranks"].append(rr)
        if rr["error"]:
            errors.append(f"rank {r}: {rr['error']}")
    for line in "".join(logs).splitlines():
        print(f"  {line}")
    if not errors:
        w = a.ranks
        for row in doc["ranks"][0]["rows"]:
            t = max(rk["rows"][i]["time_us"] for rk in doc["ranks"]
                    for i in range(len(rk["rows"])) if rk["rows"][i]["bytes"] == row["bytes"])
            alg = row["bytes"] / (t * 1e-6) / 1e9
            doc["rows"].append({"ranks": w, "dtype": "f32", "op": "sum", "bytes": row["bytes"],
                                "time_us": t, "algbw_gbps": alg,
                                "busbw_gbps": alg * 2 * (w - 1) / w})
            print(f"nccl {w} ranks {row['bytes']:>12} bytes {t:10.1f} us "
                  f"busbw {alg * 2 * (w - 1) / w:8.2f} GB/s")
        doc["status"] = "ok"
        doc["summary"] = f"NCCL ran {w} ranks on one GPU: {len(doc['rows'])} sizes measured"
        return finish(0)
    text = " ".join(errors)
    if "Duplicate GPU" in text or "Duplicate GPU" in "".join(logs):
        doc["status"] = "refused"
        doc["summary"] = ("NCCL refuses ranks sharing one device (Duplicate GPU detected); "
                          "compare kcoll with the copy bound instead. " + errors[0])[:600]
        return finish(0)
    doc["summary"] = text[:600]
    return finish(1)


if __name__ == "__main__":
    sys.exit(main())
