#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The Python KV agent (kcoll.kv) moving the batches kcoll-kvbench -m local
moves, for scripts/bench-torch.sh's ratio to the C benchmark.

    bench_kv_agent.py [-b 64K,256K,1M,4M] [-B 64] [-q 2] [-d 1] [-s 256M] [-D FILE]

One process, two agents (each its own kcolld connection): the target
allocates a segment in kcolld-mapped memory, the initiator allocates its own
and writes batches of --batch blocks at random distinct block slots of both
segments, --depth batches in flight, for --duration seconds per block size.
With --desc FILE there is no target here: the initiator imports the
descriptor in FILE (128 bytes, as `kcoll-kvbench -m target -D FILE` writes
it, waited for up to 30 s), e.g. a target on another host of a netns
cluster, and writes into it through its kcolld (TCP between the kcollds).
As in kcoll-kvbench, the batches cycle through min(64, seg / (block x
batch)) distinct ones drawn beforehand, so that they sweep the segments,
and the bytes count from the first completion after a warm-up (0.2 s) to
the last (before 2026-11-28 the first pass, which faults in both
segments' pages in kcolld, was timed here but not in C);
what a batch costs in Python (plan_blocks' checks, sort and merge, the
submission, the wait) is in the time. Prints one JSON document:
{"rows": [{"block", "batch", "batches", "bytes", "GBps", "submit_cpu_us"}]};
submit_cpu_us is the CPU time of this thread per Agent.write call
(time.thread_time: planning and submitting one batch, whatever the load
on the machine does to the wall clock).
"""
import argparse
import collections
import json
import os
import time

import numpy as np

import kcoll.kv as kv


def size(v):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(v[-1:].upper(), 1)
    return int(v[:-1] if mult > 1 else v) * mult


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-b", "--block", default="64K,256K,1M,4M")
    ap.add_argument("-B", "--batch", type=int, default=64)
    ap.add_argument("-q", "--depth", type=int, default=2)
    ap.add_argument("-d", "--duration", type=float, default=1.0)
    ap.add_argument("-s", "--seg-bytes", type=size, default=256 << 20)
    ap.add_argument("-D", "--desc", help="a target's descriptor file (no target here)")
    a = ap.parse_args()

    rng = np.random.default_rng(1)
    target, init = None, kv.Agent("initiator")
    if a.desc:
        for _ in range(300):  # the target may still be starting
            if os.path.exists(a.desc):
                break
            time.sleep(0.1)
        with open(a.desc, "rb") as f:
            desc = f.read()
    else:
        target = kv.Agent("target")
        desc = target.alloc(a.seg_bytes)[1].desc
    src, sseg = init.alloc(a.seg_bytes)
    src[:] = 1  # touch every page before timing
    remote = init.import_desc(desc)
    seg = min(a.seg_bytes, remote.size)
    rows = []
    for block in (size(b) for b in a.block.split(",")):
        slots = seg // block
        batch = min(a.batch, slots)
        nb = max(1, min(64, seg // (block * batch)))
        plans = [(rng.choice(slots, batch, replace=False) * block,
                  rng.choice(slots, batch, replace=False) * block, block) for _ in range(nb)]
        # kcoll-kvbench's window: batches run from the start, but the
        # bytes count from the first completion after a warm-up (0.2 s, or
        # a fifth of a shorter run) to the last; the first pass over the
        # plans faults in both segments' pages in kcolld, and C does that
        # in its warm-up too.
        inflight = collections.deque()
        submitted = counted = 0
        cpu = 0.0
        warm = time.perf_counter() + (0.2 if a.duration > 1 else a.duration / 5)
        end = warm + a.duration
        t0 = t1 = None
        while True:
            now = time.perf_counter()
            if now < end and len(inflight) < a.depth:
                c0 = time.thread_time()
                inflight.append(init.write(sseg, remote, plans[submitted % nb]))
                cpu += time.thread_time() - c0
                submitted += 1
                continue
            if not inflight:
                break
            inflight.popleft().wait()
            now = time.perf_counter()
            if now >= warm:
                t0 = t0 or now
                t1 = now
                counted += 1
        done = max(0, counted - 1)  # the window opens at the first one's completion
        nbytes = done * batch * block
        rows.append({"block": block, "batch": batch, "batches": done, "bytes": nbytes,
                     "GBps": nbytes / (t1 - t0) / 1e9 if done else 0.0,
                     "submit_cpu_us": cpu / max(1, submitted) * 1e6})
    remote.close()
    if target:
        target.close()
    init.close()
    print(json.dumps({"tool": "scripts/bench_kv_agent.py", "depth": a.depth, "mem": "shm",
                      "seg_bytes": seg, "remote": bool(a.desc), "rows": rows}))


if __name__ == "__main__":
    main()
