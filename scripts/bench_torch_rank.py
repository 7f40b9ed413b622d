#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""One rank of scripts/bench-torch.sh: torch.distributed through the kcoll
backend and through gloo, side by side in the same processes.

    RANK=r WORLD_SIZE=n MASTER_ADDR=... MASTER_PORT=... \\
        bench_torch_rank.py OUT.jsonl PART...

One round of each PART (the script starts the ranks afresh for every
round, between its C runs). The default group is kcoll, a second group gloo
(dist.new_group); every point runs on each system in turn, the order
rotating with the round, and each rank's time is the mean over the point's
iterations; the slowest rank's time counts (an all-reduce MAX over gloo).
Rank 0 appends one JSON object a line to OUT.jsonl. PARTs:

  sweep    all_reduce f32 SUM, BENCH_MIN..BENCH_MAX by BENCH_FACTOR, one
           blocking call after another, on plain torch tensors ("kcoll":
           the backend as it is, large tensors shared with kcolld in place;
           "kcoll_copy": the same with KCOLL_TORCH_SHARE_MIN_BYTES=0, every
           tensor copied by kcolld; "gloo") and on tensors in
           kcolld-mapped memory ("kcoll_shm", zero-copy); the result of
           the first call is checked
  latency  8 bytes (2 floats): the torch path of both backends, and the
           kcoll package without torch (numpy buffers, plain and mapped:
           "kcoll_np", "kcoll_np_shm") on the group's own communicator
  ddp      DistributedDataParallel training steps: "tiny" (examples/
           ddp_train.py's 32-64-1 MLP) and "mlp" (4 x 1024-wide layers,
           4.2 M parameters, 16.8 MB of gradients), batch 32 per rank, with
           kcoll, gloo and without DDP ("local": the same step, no
           communication)

Environment: BENCH_ROUND (this round's number, 1), BENCH_MIN (1K), BENCH_MAX (64M), BENCH_FACTOR
(4), BENCH_LAT_ITERS (2000). One intra-op thread per rank (the ranks share
the cores).
"""
import json
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

import kcoll.torch  # registers the "kcoll" backend; kcoll.torch.empty


def to_bytes(v):
    v = v.strip()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(v[-1:].upper(), 1)
    return int(v[:-1] if mult > 1 else v) * mult


def iters_for(size):
    """Enough calls to average a small size, bounded for a large one (about
    64 MiB per point, 5..500 calls)."""
    return max(5, min(500, (64 << 20) // size))


class Bench:
    def __init__(self, out):
        self.rank, self.world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        self.round = int(os.environ.get("BENCH_ROUND", "1"))
        torch.set_num_threads(1)
        dist.init_process_group("kcoll", init_method="env://", rank=self.rank,
                                world_size=self.world)
        self.gloo = dist.new_group(backend="gloo")
        self.kpg = dist.distributed_c10d._get_default_group()
        self.out = out
        self.failed = []

    def emit(self, **rec):
        if self.rank == 0:
            rec.update(N=self.world)
            with open(self.out, "a") as f:
                f.write(json.dumps(rec) + "\n")

    def slowest(self, seconds):
        t = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.gloo)
        return t.item()

    def timed(self, fn, iters, warmup):
        """Mean seconds per call of fn on the slowest rank."""
        for _ in range(warmup):
            fn()
        dist.barrier(group=self.gloo)
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return self.slowest((time.perf_counter() - t0) / iters)

    def shm_tensor(self, count):
        """A float32 tensor in memory kcolld maps for the kcoll group
        (kcoll.torch.empty)."""
        return kcoll.torch.empty(count, dtype=torch.float32, group=self.kpg)

    def check(self, what, t):
        want = float(self.world)
        ok = bool((t == want).all())
        if not ok:
            self.failed.append(what)
            print(f"rank {self.rank}: {what}: wrong result {t[:4].tolist()} (want {want})",
                  file=sys.stderr, flush=True)

    def sweep(self):
        lo, hi = to_bytes(os.environ.get("BENCH_MIN", "1K")), to_bytes(os.environ.get("BENCH_MAX", "64M"))
        factor = int(os.environ.get("BENCH_FACTOR", "4"))
        sizes = []
        s = lo
        while s <= hi:
            sizes.append(s)
            s *= factor
        calls = {"kcoll": lambda t: dist.all_reduce(t),
                 "gloo": lambda t: dist.all_reduce(t, group=self.gloo),
                 "kcoll_shm": lambda t: dist.all_reduce(t),
                 "kcoll_copy": lambda t: dist.all_reduce(t)}
        systems = list(calls)
        bus = 2 * (self.world - 1) / self.world
        r = self.round - 1
        order = systems[r % len(systems):] + systems[:r % len(systems)]
        share_min = self.kpg._share_min
        for size in sizes:
            iters = iters_for(size)
            # One size's tensors at a time: 256 MiB x 4 per rank at most.
            n = size // 4
            tensors = {"kcoll": torch.ones(n), "gloo": torch.ones(n),
                       "kcoll_shm": self.shm_tensor(n).fill_(1), "kcoll_copy": torch.ones(n)}
            for system in order:
                # Every rank runs the same system at a time: they cut ops alike.
                self.kpg._share_min = 0 if system == "kcoll_copy" else share_min
                t = tensors[system]
                calls[system](t)
                self.check(f"{system} {size} bytes", t)
                t.zero_()  # zeros stay zeros: no overflow, no denormals
                sec = self.timed(lambda: calls[system](t), iters, max(1, iters // 5))
                us = sec * 1e6
                self.emit(part="sweep", round=self.round, system=system, size=size, iters=iters,
                          time_us=us, algbw=size / us / 1e3, busbw=bus * size / us / 1e3)

    def latency(self):
        iters = int(os.environ.get("BENCH_LAT_ITERS", "2000"))
        comm = self.kpg._comm
        bufs = {"kcoll": torch.zeros(2), "gloo": torch.zeros(2),
                "kcoll_np": np.zeros(2, np.float32), "kcoll_np_shm": self.kpg._conn.empty(2)}
        bufs["kcoll_np_shm"][:] = 0
        calls = {"kcoll": lambda: dist.all_reduce(bufs["kcoll"]),
                 "gloo": lambda: dist.all_reduce(bufs["gloo"], group=self.gloo),
                 "kcoll_np": lambda: comm.allreduce(bufs["kcoll_np"]).wait(),
                 "kcoll_np_shm": lambda: comm.allreduce(bufs["kcoll_np_shm"]).wait()}
        systems = list(calls)
        r = self.round - 1
        for system in systems[r % 4:] + systems[:r % 4]:
            sec = self.timed(calls[system], iters, iters // 10)
            self.emit(part="latency", round=self.round, system=system, size=8, iters=iters,
                      time_us=sec * 1e6)

    def ddp(self):
        models = {
            "tiny": (lambda: torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                                 torch.nn.Linear(64, 1)), 32, 50),
            "mlp": (lambda: torch.nn.Sequential(
                *[m for _ in range(4) for m in (torch.nn.Linear(1024, 1024), torch.nn.ReLU())],
                torch.nn.Linear(1024, 1)), 1024, 10),
        }
        for name, (make, width, steps) in models.items():
            g = torch.Generator().manual_seed(self.rank)
            x = torch.randn(32, width, generator=g)
            y = torch.randn(32, 1, generator=g)
            runs = {}
            for system, pg in (("kcoll", None), ("gloo", self.gloo), ("local", False)):
                torch.manual_seed(0)
                model = make()
                net = model if pg is False else torch.nn.parallel.DistributedDataParallel(
                    model, process_group=pg)
                runs[system] = (net, torch.optim.SGD(net.parameters(), lr=1e-3))
            params = sum(p.numel() for p in runs["local"][0].parameters())

            def step(net, opt):
                opt.zero_grad()
                torch.nn.functional.mse_loss(net(x), y).backward()
                opt.step()
            systems = list(runs)
            r = self.round - 1
            for system in systems[r % 3:] + systems[:r % 3]:
                net, opt = runs[system]
                sec = self.timed(lambda: step(net, opt), steps, max(2, steps // 10))
                self.emit(part="ddp", round=self.round, system=system, model=name, params=params,
                          grad_bytes=4 * params, steps=steps, step_ms=sec * 1e3)
            # DDP keeps every rank's replica the same, whichever backend averaged.
            for system in ("kcoll", "gloo"):
                p = torch.cat([q.detach().flatten() for q in runs[system][0].parameters()])
                ref = p.clone()
                dist.broadcast(ref, 0, group=self.gloo)
                if not torch.equal(p, ref):
                    self.failed.append(f"ddp {name} {system}: replicas differ")


def main():
    out, parts = sys.argv[1], sys.argv[2:]
    b = Bench(out)
    for part in parts:
        if part not in ("sweep", "latency", "ddp"):
            raise SystemExit(f"bench_torch_rank: unknown part {part!r} (sweep, latency, ddp)")
        t0 = time.monotonic()
        getattr(b, part)()
        if b.rank == 0:
            print(f"bench_torch_rank: N={b.world} {part} in {time.monotonic() - t0:.1f} s",
                  file=sys.stderr, flush=True)
    dist.barrier(group=b.gloo)
    dist.destroy_process_group()
    if b.failed:
        raise SystemExit(f"bench_torch_rank: rank {b.rank}: wrong results: {', '.join(b.failed)}")


if __name__ == "__main__":
    main()
