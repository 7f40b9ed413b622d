# SPDX-License-Identifier: MIT
"""One rank of the torch.distributed tests of kcoll.torch. Run by launch.py.

Every kcoll result is compared with a reference computed here from the
inputs of all ranks (which every rank can rebuild) and, where gloo 1.13 can
do the same thing (not bf16, not AVG), with gloo in a second group of the
same processes: reduce_scatter and the tensor forms against gloo's
all_reduce / all_gather, which gloo has."""
import datetime
import gc
import importlib
import inspect
import os
import sys
import time
import weakref

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tap import Report  # noqa: E402
import torch_ref  # noqa: E402
from torch_ref import DTYPES, OPS, name, same  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import kcoll.torch  # noqa: E402

rep = Report()
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
init = os.environ.get("KCOLL_TEST_INIT", "env")
importlib.reload(kcoll.torch)  # a second registration must be harmless
rep.check(True, "import kcoll.torch twice (reload) does not fail")

url = {"env": "env://", "file": f"file://{os.environ['KCOLL_TEST_STORE']}",
       "tcp": f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"}[init]
dist.init_process_group("kcoll", init_method=url, rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=60))
rep.check(dist.get_backend() == "kcoll" and dist.get_world_size() == world and dist.get_rank() == rank,
          f"init_process_group('kcoll', {init}://)", dist.get_backend())
gloo = dist.new_group(backend="gloo")

R = dist.ReduceOp
N = 257


def data(r, dt, op, n=N):
    return torch_ref.data(r, dt, op, n)


def reference(dt, op, n=N):
    return torch_ref.reference(dt, op, n, world)


def gloo_can(dt, op="SUM"):
    return dt != torch.bfloat16 and op != "AVG"


# ---- the plain package on tensors: bf16 (numpy has none), a Parameter -------------
comm = kcoll.Comm.init(bytes.fromhex(os.environ["KCOLL_TEST_UIDS"].split(",")[0]), world, rank)
bf = torch.full((5,), rank + 1.5, dtype=torch.bfloat16)
param = torch.nn.Parameter(torch.full((3,), float(rank)))
comm.allreduce(bf, op="max").wait()
comm.allreduce(param).wait()
rep.check(torch.equal(bf, torch.full((5,), world + 0.5, dtype=torch.bfloat16))
          and torch.equal(param.detach(), torch.full((3,), float(sum(range(world))))),
          "kcoll.Comm on CPU tensors: bf16 max, an nn.Parameter in place")
comm.destroy()

# ---- all_reduce: dtype x op -----------------------------------------------------
for dt in DTYPES:
    bad = []
    for op, rop in OPS.items():
        k = data(rank, dt, op)
        dist.all_reduce(k, op=rop)
        if not same(k, reference(dt, op), dt, op):
            bad.append(f"{op} vs reference")
        if gloo_can(dt, op):
            g = data(rank, dt, op)
            dist.all_reduce(g, op=rop, group=gloo)
            if not torch.equal(k, g):
                bad.append(f"{op} vs gloo")
    rep.check(not bad, f"all_reduce {name(dt)}: SUM PRODUCT MIN MAX AVG vs reference"
              + ("" if dt == torch.bfloat16 else " and gloo (not AVG)"), f"wrong: {bad}")

# ---- all_gather: list and tensor forms ------------------------------------------
for dt in DTYPES:
    want = [data(r, dt, "MIN") for r in range(world)]
    outs = [torch.zeros(N, dtype=dt) for _ in range(world)]
    dist.all_gather(outs, data(rank, dt, "MIN"))
    flat = torch.zeros(world * N, dtype=dt)
    dist.all_gather_into_tensor(flat, data(rank, dt, "MIN"))
    ok = all(torch.equal(o, w) for o, w in zip(outs, want)) and torch.equal(flat, torch.cat(want))
    if gloo_can(dt):
        gouts = [torch.zeros(N, dtype=dt) for _ in range(world)]
        dist.all_gather(gouts, data(rank, dt, "MIN"), group=gloo)
        ok = ok and all(torch.equal(o, g) for o, g in zip(outs, gouts))
    rep.check(ok, f"all_gather {name(dt)}: list and all_gather_into_tensor vs reference"
              + ("" if dt == torch.bfloat16 else " and gloo"))

# ---- reduce_scatter: list and tensor forms ----------------------------------------
for dt in DTYPES:
    bad = []
    for op in ("SUM", "MAX", "AVG"):
        full = data(rank, dt, op, world * N)
        mine = slice(rank * N, (rank + 1) * N)
        want = reference(dt, op, world * N)[mine]
        out = torch.zeros(N, dtype=dt)
        dist.reduce_scatter(out, list(full.split(N)), op=OPS[op])
        out2 = torch.zeros(N, dtype=dt)
        dist.reduce_scatter_tensor(out2, full.clone(), op=OPS[op])
        if not (same(out, want, dt, op) and same(out2, want, dt, op)):
            bad.append(f"{op} vs reference")
        if gloo_can(dt, op):  # gloo 1.13 has no reduce_scatter: its all_reduce, sliced
            g = full.clone()
            dist.all_reduce(g, op=OPS[op], group=gloo)
            if not (torch.equal(out, g[mine]) and torch.equal(out2, g[mine])):
                bad.append(f"{op} vs gloo")
    rep.check(not bad, f"reduce_scatter {name(dt)}: list and tensor forms, SUM MAX AVG", f"wrong: {bad}")

# ---- broadcast ----------------------------------------------------------------------
for i, dt in enumerate(DTYPES):
    root = i % world
    t = data(rank, dt, "MAX") if rank == root else torch.zeros(N, dtype=dt)
    dist.broadcast(t, src=root)
    ok = torch.equal(t, data(root, dt, "MAX"))
    if gloo_can(dt):
        g = data(rank, dt, "MAX") if rank == root else torch.zeros(N, dtype=dt)
        dist.broadcast(g, src=root, group=gloo)
        ok = ok and torch.equal(t, g)
    rep.check(ok, f"broadcast {name(dt)} from rank {root}")

# ---- reduce and gather: run as all_reduce / all_gather, the root keeps the result --------
for i, dt in enumerate(DTYPES):
    root = (i + 1) % world
    bad = []
    for op in ("SUM", "MIN", "PRODUCT", "AVG"):
        mine = data(rank, dt, op)
        t = mine.clone()
        dist.reduce(t, dst=root, op=OPS[op])
        if rank == root and not same(t, reference(dt, op), dt, op):
            bad.append(f"{op} vs reference")
        if rank != root and not torch.equal(t, mine):
            bad.append(f"{op}: a non-root tensor changed")
        if gloo_can(dt, op):
            g = mine.clone()
            dist.reduce(g, dst=root, op=OPS[op], group=gloo)
            if rank == root and not torch.equal(t, g):
                bad.append(f"{op} vs gloo")
    rep.check(not bad, f"reduce {name(dt)} to rank {root}: SUM MIN PRODUCT AVG vs reference"
              + ("" if dt == torch.bfloat16 else " and gloo (not AVG)") + ", other ranks' tensors unchanged",
              f"wrong: {bad}")
for i, dt in enumerate(DTYPES):
    root = i % world
    src = data(rank, dt, "MIN")
    outs = [torch.zeros(N, dtype=dt) for _ in range(world)] if rank == root else None
    dist.gather(src, gather_list=outs, dst=root)
    ok = rank != root or all(torch.equal(o, data(r, dt, "MIN")) for r, o in enumerate(outs))
    if gloo_can(dt):
        gouts = [torch.zeros(N, dtype=dt) for _ in range(world)] if rank == root else None
        dist.gather(src, gather_list=gouts, dst=root, group=gloo)
        ok = ok and (rank != root or all(torch.equal(o, g) for o, g in zip(outs, gouts)))
    rep.check(ok, f"gather {name(dt)} to rank {root} vs reference" + ("" if dt == torch.bfloat16 else " and gloo"))
# 4 MiB: the root's reduce is cut and shared in place, the others' scratch
# copies are cut alike (not shared); a strided view; async.
big = torch.arange(1 << 20, dtype=torch.float32) + rank
col = torch.full((64, 3), float(rank + 1))[:, 1]
wb = dist.reduce(big, dst=world - 1, async_op=True)
wc = dist.reduce(col, dst=0, op=R.MAX, async_op=True)
wb.wait()
wc.wait()
want_big = torch.arange(1 << 20, dtype=torch.float32) * world + sum(range(world))
rep.check((torch.equal(big, want_big) if rank == world - 1
           else torch.equal(big, torch.arange(1 << 20, dtype=torch.float32) + rank))
          and torch.equal(col, torch.full((64,), float(world if rank == 0 else rank + 1))),
          "async reduce of 4 MiB (cut, shared on the root) and of a strided column: right on the root, "
          "unchanged elsewhere")

# ---- async ops ----------------------------------------------------------------------------
ts = [torch.full((1000,), float(rank + k)) for k in range(6)]
works = [dist.all_reduce(t, async_op=True) for t in ts]
seen = []
futs = [w.get_future().then(lambda f: seen.append(f.value()[0].sum().item())) for w in works]
waited = [w.wait() for w in reversed(works)]
for f in futs:
    f.wait()
want = [sum(r + k for r in range(world)) for k in range(6)]
rep.check(all(waited) and all(torch.equal(t, torch.full((1000,), float(w))) for t, w in zip(ts, want))
          and sorted(seen) == sorted(1000.0 * w for w in want),
          "6 async all_reduce: wait() in reverse order, get_future().then() sees the results")
fut = dist.all_reduce(torch.ones(3), async_op=True).get_future()
val = fut.wait()
rep.check(isinstance(val, list) and torch.equal(val[0], torch.full((3,), float(world))),
          "get_future() completes to the list of tensors")
ag = [torch.zeros(2) for _ in range(world)]
w1 = dist.all_gather(ag, torch.full((2,), float(rank)), async_op=True)
b = torch.full((4,), float(rank))
w2 = dist.broadcast(b, src=world - 1, async_op=True)
w1.wait()
w2.wait()
rep.check(all(torch.equal(a, torch.full((2,), float(r))) for r, a in enumerate(ag))
          and torch.equal(b, torch.full((4,), float(world - 1))), "async all_gather and broadcast")

# A tensor dropped after its last op is freed then, not kept by the
# group's progress thread until its next op (it clears what it finished).
gone = torch.ones(1000)
ref = weakref.ref(gone)
dist.all_reduce(gone)
del gone
t0 = time.monotonic()
while ref() is not None and time.monotonic() - t0 < 5:
    gc.collect()
    time.sleep(0.01)
rep.check(ref() is None, "a tensor dropped after its op is freed before the group's next op",
          f"still alive after {time.monotonic() - t0:.1f} s")

if rank == 0:  # the others come one second late: the barrier must not be done before
    t0 = time.monotonic()
    w = dist.barrier(async_op=True)
    time.sleep(0.3)
    early = w.is_completed()
    w.wait()
    rep.check(not early and time.monotonic() - t0 > 0.5,
              "async barrier is not complete until the last rank arrives", f"early {early}")
else:
    time.sleep(1.0)
    dist.barrier(async_op=True).wait()
    rep.check(True, "async barrier is not complete until the last rank arrives")

# ---- non-contiguous and zero-sized tensors ------------------------------------------
m = torch.arange(12, dtype=torch.float32).view(4, 3) + 100 * rank
orig = m.clone()
dist.all_reduce(m[:, 1])  # a strided column: copied in and out
col = sum(torch.arange(12, dtype=torch.float32).view(4, 3)[:, 1] + 100 * r for r in range(world))
rep.check(torch.equal(m[:, 1], col) and torch.equal(m[:, [0, 2]], orig[:, [0, 2]]),
          "all_reduce on a strided column: result in place, neighbours untouched")
outm = torch.full((3, world), -1.0)
dist.all_gather([outm[:, r] for r in range(world)], torch.arange(6.)[::2] + rank)
rep.check(all(torch.equal(outm[:, r], torch.arange(6.)[::2] + r) for r in range(world)),
          "all_gather into strided outputs from a strided input")
tb = torch.zeros(3, 5)
if rank == 0:
    tb = torch.arange(15.).view(3, 5)
tt = tb.t()  # non-contiguous view
dist.broadcast(tt, src=0)
rep.check(torch.equal(tb, torch.arange(15.).view(3, 5)), "broadcast into a transposed view")
rs = torch.zeros(4, 2)
dist.reduce_scatter(rs[:, 0], [torch.full((4,), float(r + rank)) for r in range(world)])
rep.check(torch.equal(rs[:, 0], torch.full((4,), float(sum(rank + r for r in range(world)))))
          and torch.equal(rs[:, 1], torch.zeros(4)), "reduce_scatter into a strided output")

z = torch.zeros(0)
dist.all_reduce(z)
zs = [torch.zeros(0) for _ in range(world)]
dist.all_gather(zs, torch.zeros(0))
dist.broadcast(z, src=0)
dist.reduce_scatter(torch.zeros(0), [torch.zeros(0) for _ in range(world)])
dist.all_gather_into_tensor(torch.zeros(0), torch.zeros(0))
rep.check(z.shape == (0,) and all(x.shape == (0,) for x in zs),
          "zero-sized all_reduce, all_gather (both forms), broadcast, reduce_scatter")

# ---- what kcoll refuses, and says what to use ------------------------------------------
rep.raises(RuntimeError, lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32), op=R.BAND),
           "all_reduce BAND: RuntimeError naming the gloo alternative", ["BAND", "gloo"])
rep.raises(RuntimeError, lambda: dist.send(torch.ones(1), dst=(rank + 1) % world),
           "send: RuntimeError naming the gloo alternative", ["send", "gloo"])
rep.raises(RuntimeError, lambda: dist.scatter(torch.ones(2), [torch.ones(2)] * world if rank == 0 else None),
           "scatter: RuntimeError naming the gloo alternative", ["scatter", "gloo"])
rep.raises(RuntimeError, lambda: dist.all_reduce(torch.ones(2, dtype=torch.int16)),
           "all_reduce int16: RuntimeError naming the dtype", ["int16"])
rep.raises(RuntimeError, lambda: dist.all_reduce(torch.ones(2, device="meta")),
           "a non-CPU (meta) tensor: RuntimeError saying CPU only", ["CPU"])

# ---- DDP: kcoll and gloo from the same seed give identical parameters -------------------
class Net(torch.nn.Module):
    """Two linear branches added: the loss is quadratic in the parameters,
    so with integer data and start, lr 2^-8 and 4 steps every value stays a
    dyadic rational of at most ~30 bits and every sum is exact in any
    order (stacked layers multiply the bits per step: 59 after 3)."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 2)
        self.b = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.a(x) + self.b(x)


def net():
    return Net().double()


def batches(r):
    g = torch.Generator().manual_seed(r)
    return [(torch.randint(-3, 4, (8, 4), generator=g).double(),
             torch.randint(-3, 4, (8, 2), generator=g).double()) for _ in range(4)]


def train(group):
    """4 SGD steps; group "local": one process on every rank's data."""
    torch.manual_seed(0)
    model = net()
    with torch.no_grad():  # integer-valued start
        for p in model.parameters():
            p.copy_(torch.randint(-2, 3, p.shape))
    ddp = model if group == "local" else torch.nn.parallel.DistributedDataParallel(model, process_group=group)
    opt = torch.optim.SGD(ddp.parameters(), lr=2.0 ** -8)
    data = list(zip(*[batches(r) for r in range(world)])) if group == "local" else \
        [[b] for b in batches(rank)]
    for step in data:
        opt.zero_grad()
        # DDP averages the ranks' gradients: times world, that average is
        # the exact sum of the ranks' gradients (dividing by 3 would round),
        # the same as one process's gradient of the summed loss.
        loss = sum(torch.nn.functional.mse_loss(ddp(x), y, reduction="sum") for x, y in step)
        (loss * (1 if group == "local" else world)).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()], model


calls = []
kcoll_allreduce = kcoll.torch.ProcessGroupKcoll.allreduce


def counting(self, *a):
    work = kcoll_allreduce(self, *a)
    calls.append(type(work))
    return work


kcoll.torch.ProcessGroupKcoll.allreduce = counting  # C++ (DDP's reducer) looks it up per call
pk, model = train(None)  # the default group: kcoll
kcoll.torch.ProcessGroupKcoll.allreduce = kcoll_allreduce
rep.check(len(calls) >= 4, "DDP's reducer all-reduces its gradient bucket through kcoll at every step",
          f"{len(calls)} calls")
# torch 1.13 waits on a Python Work subclass from C++ forever: DDP (C++)
# must get torch's future-wrapping Work, the dist API the raising one.
rep.check(calls and kcoll.torch._Work not in calls
          and isinstance(dist.all_reduce(torch.ones(1), async_op=True), kcoll.torch._Work),
          "DDP's C++ calls get torch's future-wrapping Work, dist.* calls kcoll's raising Work",
          f"DDP got {set(calls)}")
pg, _ = train(gloo)
pl, _ = train("local")
torch.manual_seed(0)
net()
moved = any(not torch.equal(a, torch.randint(-2, 3, a.shape).double()) for a in pk)
rep.check(all(torch.equal(a, b) for a, b in zip(pk, pg)) and moved,
          "DDP: 4 SGD steps with kcoll and with gloo give identical parameters",
          f"moved {moved}, largest difference {max((a - b).abs().max().item() for a, b in zip(pk, pg))}")
rep.check(all(torch.equal(a, b) for a, b in zip(pk, pl)),
          "DDP with kcoll: the same parameters as one process trained on every rank's data",
          f"largest difference {max((a - b).abs().max().item() for a, b in zip(pk, pl))}, "
          f"gloo's {max((a - b).abs().max().item() for a, b in zip(pg, pl))}")
flat = torch.cat([p.reshape(-1) for p in pk])
allp = [torch.zeros_like(flat) for _ in range(world)]
dist.all_gather(allp, flat, group=gloo)
rep.check(all(torch.equal(a, flat) for a in allp), "DDP with kcoll: every rank has the same parameters")

# ---- a rank skips, ranks disagree: RuntimeError on every rank, no hang --------------------
short = dist.new_group(backend="kcoll", timeout=datetime.timedelta(seconds=2))
t0 = time.monotonic()
try:
    dist.all_reduce(torch.ones(4 + rank), group=short)
    rep.check(False, "mismatched sizes: RuntimeError on every rank", "no error")
except RuntimeError as e:
    rep.check("EBADMSG" in str(e) and time.monotonic() - t0 < 10,
              "mismatched sizes: RuntimeError on every rank", str(e))
dist.barrier(group=short)
# A direct call of the group's method gets torch's future-wrapping Work,
# whose wait() drops errors in 1.13: the future has it, the next op raises.
fut = short.allreduce([torch.ones(4 + rank)]).get_future()
rep.raises(RuntimeError, fut.wait, "direct group.allreduce, mismatched: its future raises", ["EBADMSG"])
rep.raises(RuntimeError, lambda: dist.barrier(group=short),
           "... and the group's next operation raises it too", ["earlier operation", "EBADMSG"])
short = dist.new_group(backend="kcoll", timeout=datetime.timedelta(seconds=2))
last = world - 1
if rank == last:
    time.sleep(3)
t0 = time.monotonic()
# Across hosts a small all_reduce runs rank to rank over the lanes, and the
# others' data is already in the late rank's lane sockets when it comes; it
# must still fail as they did (the ABORT they sent follows their data).
late_label = "a rank comes late to all_reduce: RuntimeError within the group's 2 s timeout on every rank"
try:
    x = torch.ones(4)
    dist.all_reduce(x, group=short)
    rep.check(False, late_label, f"no error (got {x.tolist()})")
except RuntimeError as e:
    took = time.monotonic() - t0
    rep.check("ETIMEDOUT" in str(e) and f"rank {last} blamed" in str(e) and took < 8,
              late_label, f"{e} after {took:.1f} s")
dist.barrier(group=gloo)  # nobody leaves before the late rank has its answer

# ---- a device-mixed backend string (torch 2.x): refused as the group is made ------------
mixed = "mixed backend string 'cpu:kcoll,cuda:gloo': RuntimeError at new_group, naming the way"
if "devices" in inspect.signature(dist.Backend.register_backend).parameters:
    rep.raises(RuntimeError, lambda: dist.new_group(backend="cpu:kcoll,cuda:gloo"), mixed,
               ["'cpu:kcoll,cuda:gloo'", "dist.new_group(backend='kcoll')"])
    dist.barrier(group=gloo)
else:
    rep.skip(mixed, f"torch {torch.__version__} has no device:backend strings")

dist.destroy_process_group()
rep.check(True, "destroy_process_group")
