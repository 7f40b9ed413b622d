# SPDX-License-Identifier: MIT
"""What kcollctl says of a communicator through its life: active while its
ranks run ops, "ended" once a member left with kcoll_comm_destroy (no op
failed), "aborted" once a member died, and gone when the last one left.
Usage: comm_state.py KCOLLCTL SOCKET (KCOLL_SOCKET names the same daemon).
Prints one "ok<TAB>what" or "not ok<TAB>what" line per check."""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np

import kcoll

CTL, SOCK = sys.argv[1], sys.argv[2]
failed = 0


def ok(cond, what):
    global failed
    failed += not cond
    print(f"{'ok' if cond else 'not ok'}\t{' '.join(what.split())}", flush=True)


def ctl(*args):
    return subprocess.run([CTL, "-s", SOCK, *args], capture_output=True, text=True, check=True).stdout


def states():
    return {c["id"]: c["state"] for c in json.loads(ctl("status", "--json"))["communicators"]}


def metric(state):
    for line in ctl("metrics").splitlines():
        if line.startswith(f'kcoll_communicators{{state="{state}"}}'):
            return int(line.split()[-1])
    return None


def settle(want, secs=10):
    """The communicators' states once they equal want (or the last seen)."""
    end = time.monotonic() + secs
    while True:
        got = sorted(states().values())
        if got == sorted(want) or time.monotonic() > end:
            return got
        time.sleep(0.05)


def form(conns):
    """A communicator of len(conns) ranks in this process; one op run."""
    uid = conns[0].get_unique_id()
    comms = [None] * len(conns)

    def join(r):
        comms[r] = kcoll.Comm.init(uid, len(conns), r, conns[r])
    th = [threading.Thread(target=join, args=(r,)) for r in range(len(conns))]
    for x in th:
        x.start()
    for x in th:
        x.join()
    bufs = [np.full(1024, r + 1, np.float32) for r in range(len(conns))]
    reqs = [c.allreduce(b) for c, b in zip(comms, bufs)]
    for q in reqs:
        q.wait()
    ok(all((b == 3).all() for b in bufs), "the communicator ran an all-reduce")
    return comms


# A clean end: one rank destroys its side, then the other.
conns = [kcoll.Connection(), kcoll.Connection()]
comms = form(conns)
ok(settle(["active"]) == ["active"], "a formed communicator is 'active'")
comms[0].destroy()
got = settle(["ended"])
ok(got == ["ended"], f"after one rank's destroy it is 'ended', not 'aborted' (got {got})")
ok(metric("ended") == 1 and metric("aborted") == 0,
     f"metrics count it as ended (ended {metric('ended')}, aborted {metric('aborted')})")
comms[1].destroy()
got = settle([])
ok(got == [], f"after the last rank's destroy it is gone (got {got})")
for c in conns:
    c.close()

# A death: the other rank is a process that is killed.
CHILD = """
import sys, time, numpy as np, kcoll
c = kcoll.Comm.init(bytes.fromhex(sys.argv[1]), 2, 1)
b = np.full(1024, 2, np.float32)
c.allreduce(b).wait()
print("ran", flush=True)
time.sleep(60)
"""
conn = kcoll.Connection()
uid = conn.get_unique_id()
child = subprocess.Popen([sys.executable, "-c", CHILD, bytes(uid).hex()], stdout=subprocess.PIPE, text=True)
comm = kcoll.Comm.init(uid, 2, 0, conn)
buf = np.full(1024, 1, np.float32)
comm.allreduce(buf).wait()
ok(child.stdout.readline().strip() == "ran" and (buf == 3).all(), "a rank in another process ran an op")
os.kill(child.pid, signal.SIGKILL)
child.wait()
got = settle(["aborted"])
ok(got == ["aborted"], f"after a rank was killed it is 'aborted' (got {got})")
ok(metric("aborted") == 1 and metric("ended") == 0,
     f"metrics count it as aborted (aborted {metric('aborted')}, ended {metric('ended')})")
try:
    comm.allreduce(buf).wait(5)
    ok(False, "an op on the aborted communicator fails")
except kcoll.KcollError as e:
    ok(e.code < 0, f"an op on the aborted communicator fails ({e})")
comm.destroy()
conn.close()
ok(settle([]) == [], "it is gone once the survivor left")
sys.exit(1 if failed else 0)
