# SPDX-License-Identifier: MIT
"""Run one rank program as WORLD processes on this host and merge their
check logs into TAP lines without numbers ("ok - [TAG] ..."), which
t_python.sh numbers. A check passes only if every rank passed it.

    launch.py [--hosts H] PROGRAM WORLD TAG TIMEOUT_S [INIT]
                                            INIT: env, file or tcp

--hosts H: the ranks run on the H hosts of the netns cluster that is up
(scripts/netns-cluster.sh, KCOLL_CLUSTER_PREFIX / _RUNDIR), rank r on
host r % H through `netns-cluster.sh exec`, so each talks to its own
host's kcolld; MASTER_ADDR is host 0's first address, gloo uses eth0
(GLOO_SOCKET_IFNAME) and the unique ids come from host 0's kcolld.

With KCOLL_TEST_KILL_PID=PID (and KCOLL_TEST_KILL_AFTER=STEPS, default 3)
each rank writes its step count to $KCOLL_TEST_PROGRESS; once every rank
passed STEPS, PID (a kcolld) gets SIGKILL, and every rank must report that
it raised ("raised TIME" in its progress file) within 30 s of the kill.
A check that some ranks skip and the others pass is a pass (a comment
names the skipping ranks); it is a SKIP only when every rank skipped it.

Ranks get RANK, WORLD_SIZE, MASTER_ADDR/MASTER_PORT (a free port),
KCOLL_TEST_INIT, KCOLL_TEST_UIDS (fresh kcoll unique ids, hex, comma
separated) and KCOLL_TEST_REPORT (their log). Exit status 1 if any check
failed, a rank failed or the time ran out.
"""
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import kcoll

CLUSTER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts",
                       "netns-cluster.sh")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def progress(path):
    """(steps written, time of "raised" or None) from a rank's progress file."""
    steps, raised = 0, None
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("raised "):
                    raised = float(line.split()[1])
                elif line.strip().isdigit():
                    steps = int(line)
    except FileNotFoundError:
        pass
    return steps, raised


def cluster_uids(n):
    """n unique ids from host 0's kcolld (they carry its cluster addresses)."""
    code = "import kcoll; print(','.join(kcoll.get_unique_id().hex() for _ in range(%d)))" % n
    out = subprocess.run([CLUSTER, "exec", "0", sys.executable, "-c", code], check=True,
                         stdout=subprocess.PIPE, timeout=30)
    return out.stdout.decode().strip()


def main():
    args = sys.argv[1:]
    hosts = 0
    if args[:1] == ["--hosts"]:
        hosts, args = int(args[1]), args[2:]
    prog, world, tag, limit = args[0], int(args[1]), args[2], float(args[3])
    init = args[4] if len(args) > 4 else "env"
    tmp = tempfile.mkdtemp(prefix="kcoll-py.", dir=os.environ.get("KCOLL_TEST_TMP"))
    if hosts:
        uids, master, extra = cluster_uids(4), "10.10.0.1", {"GLOO_SOCKET_IFNAME": "eth0"}
    else:
        uids, master, extra = ",".join(kcoll.get_unique_id().hex() for _ in range(4)), "127.0.0.1", {}
    port = free_port()
    procs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(world),
                   MASTER_ADDR=master, MASTER_PORT=str(port), KCOLL_TEST_INIT=init,
                   KCOLL_TEST_UIDS=uids, KCOLL_TEST_REPORT=f"{tmp}/rank{r}.log",
                   KCOLL_TEST_STORE=f"{tmp}/filestore", KCOLL_TEST_PROGRESS=f"{tmp}/progress{r}",
                   **extra)
        cmd = [sys.executable, prog]
        if hosts:
            cmd = [CLUSTER, "exec", str(r % hosts)] + cmd
        out = open(f"{tmp}/rank{r}.out", "w")
        procs.append(subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + limit
    timed_out = False
    kill_pid = int(os.environ.get("KCOLL_TEST_KILL_PID", "0"))
    kill_after = int(os.environ.get("KCOLL_TEST_KILL_AFTER", "3"))
    t_kill = None
    while kill_pid and t_kill is None and time.monotonic() < deadline:
        steps = [progress(f"{tmp}/progress{r}")[0] for r in range(world)]
        if all(s >= kill_after for s in steps) or any(p.poll() is not None for p in procs):
            os.kill(kill_pid, signal.SIGKILL)
            t_kill = time.time()
            print(f"# SIGKILL to kcolld (pid {kill_pid}) once the ranks were at steps {steps}")
        time.sleep(0.05)
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
    if timed_out:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    logs = []
    for r in range(world):
        try:
            with open(f"{tmp}/rank{r}.log") as f:
                logs.append([p for p in (l.rstrip("\n").split("\t", 2) for l in f)
                             if len(p) == 3 and p[0] in ("ok", "not ok", "skip")])
        except FileNotFoundError:
            logs.append([])
    order = []
    for log in logs:
        for status, desc, _ in log:
            if desc not in order:
                order.append(desc)
    failed = False
    for desc in order:
        per = {r: (s, d) for r, log in enumerate(logs) for s, dd, d in log if dd == desc}
        missing = [r for r in range(world) if r not in per]
        bad = {r: d for r, (s, d) in per.items() if s == "not ok"}
        skips = {r: d for r, (s, d) in per.items() if s == "skip"}
        if bad or missing:
            failed = True
            print(f"not ok - [{tag}] {desc}")
            for r, d in bad.items():
                print(f"#   rank {r}: {d}")
            if missing:
                print(f"#   no result from rank(s) {missing}")
        elif len(skips) == world:
            print(f"ok - [{tag}] {desc} # SKIP {skips[0]}")
        else:
            # Checked by some ranks only (e.g. those on a killed host): a pass.
            print(f"ok - [{tag}] {desc}")
            if skips:
                print(f"#   skipped by rank(s) {sorted(skips)}: {next(iter(skips.values()))}")
    if kill_pid:
        raised = [progress(f"{tmp}/progress{r}")[1] for r in range(world)]
        late = [r for r, t in enumerate(raised) if t is None or t_kill is None or t - t_kill > 30]
        print(f"{'not ok' if late else 'ok'} - [{tag}] every rank raised within 30 s of the kill"
              + (f" (slowest {max(t - t_kill for t in raised):.1f} s)" if not late else
                 f" (rank(s) {late} did not)"))
        failed |= bool(late)
    status = [p.returncode for p in procs]
    ok = not timed_out and all(s == 0 for s in status)
    print(f"{'ok' if ok else 'not ok'} - [{tag}] {world} ranks exited 0 within {limit:.0f} s"
          + ("" if ok else f" (timed out: {timed_out}, status {status})"))
    if not ok or failed:
        for r in range(world):
            with open(f"{tmp}/rank{r}.out") as f:
                tail = f.read().splitlines()[-15:]
            for line in tail:
                print(f"#   rank {r} | {line}")
    shutil.rmtree(tmp)
    return 0 if ok and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
