# SPDX-License-Identifier: MIT
"""One rank of the zero-copy plain-tensor checks of kcoll.torch (its
storages shared with kcolld by kcoll_mem_share). Run by launch.py, from
t_python_share.sh (2..4 ranks, one host) and t_python_cluster.sh (4 hosts).

Tensors of at least KCOLL_TORCH_SHARE_MIN_BYTES (1 MiB) are views at odd
offsets into larger storages. Checks: sharing leaves every byte of the
storage as it was; all_reduce for every dtype x op and broadcast against a
reference and gloo (where gloo can); kcolld (this host's, through kcollctl
status) copied only the staged ends of an op on a shared tensor, and the
whole tensor with sharing off (the control); LRU eviction deregisters and
leaves the data, a tensor freed after eviction and new tensors are fine;
async ops; a small tensor and a strided one unchanged; a shared tensor
resized past its storage (the stale range deregistered); the knobs'
syntax, and groups made with them in the environment (MIN_BYTES=0 is the
control); a group keeps a dropped tensor's memory while it shares it and
frees it when destroy_process_group ends the group (torch 2.6 refused
that destroy before kcoll.torch kept the group's name); DDP shares its
bucket once and matches gloo; kcoll.torch.empty's tensors are zero-copy
from their first op in every dtype and outlive their group. Runs under torch 1.13 and 2.x
(t_python_torch2_share.sh). KCOLL_CTL names kcollctl."""
import ctypes
import gc
import os
import re
import subprocess
import sys
import weakref

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tap import Report  # noqa: E402
import torch_ref  # noqa: E402
from torch_ref import DTYPES, OPS, data, name, same  # noqa: E402

import numpy  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import kcoll.torch  # noqa: E402
from kcoll import _lib  # noqa: E402

rep = Report()
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("kcoll", init_method="env://", rank=rank, world_size=world)
gloo = dist.new_group(backend="gloo")
pg = dist.distributed_c10d._get_default_group()
R = dist.ReduceOp
SKEW = 37  # elements between the storage's start and the tensor's


def count(dt):
    """Elements of a tensor a little over 1 MiB, not a whole number of pages."""
    return (1 << 20) // torch.empty((), dtype=dt).element_size() + 777


def reference(dt, op, n):
    return torch_ref.reference(dt, op, n, world)


def in_storage(x, skew=SKEW, pad=100):
    """x copied into a view at element skew of a larger storage with a
    pattern around it; (view, storage tensor)."""
    big = torch.arange(x.numel() + skew + pad, dtype=torch.float64).remainder(97).to(x.dtype)
    v = big[skew:skew + x.numel()]
    v.copy_(x)
    return v, big


def copied():
    """Bytes this host's kcolld copied with process_vm_readv/writev so far."""
    out = subprocess.run([os.environ["KCOLL_CTL"], "status", "--json"], check=True,
                         stdout=subprocess.PIPE, timeout=20).stdout
    return int(re.search(rb'"bytes_copied":(\d+)', out).group(1))


def quiet_copied(fn):
    """The bytes this host's kcolld copied while every rank ran fn: the
    ranks line up (gloo barriers) so that nothing else lands in the window."""
    dist.barrier(group=gloo)
    c0 = copied()
    dist.barrier(group=gloo)
    fn()
    dist.barrier(group=gloo)
    c1 = copied()
    dist.barrier(group=gloo)
    return c1 - c0


# ---- sharing leaves the bytes alone ------------------------------------------------
x = data(rank, torch.float32, "SUM", count(torch.float32))
v, big = in_storage(x)
before = big.clone()
shared = pg._shared.ensure(v)
key = pg._shared.key(v)
st, lo, length = pg._shared.entries.get(key, (None, 0, 0))
inner = lo and lo >= big.data_ptr() and lo + length <= big.data_ptr() + big.numel() * 4
rep.check(shared and inner and torch.equal(big, before),
          "sharing a storage: only pages inside it, every byte of it unchanged",
          f"shared {shared} range {lo:#x}+{length} storage {big.data_ptr():#x}+{big.numel() * 4}")


def mapped(addr):
    """Is a kcoll-share memfd mapped at addr in this process?"""
    with open("/proc/self/maps") as f:
        return any(int(ln.split("-")[0], 16) == addr for ln in f if "kcoll-share" in ln)


rep.check(mapped(lo), "the shared pages are a kcoll-share memfd mapping at the same address")

# ---- all_reduce: dtype x op on shared tensors, against the reference and gloo ----------
for dt in DTYPES:
    bad = []
    n = count(dt)
    for op, rop in OPS.items():
        k, kbig = in_storage(data(rank, dt, op, n))
        around = torch.cat([kbig[:SKEW], kbig[SKEW + n:]]).clone()
        dist.all_reduce(k, op=rop)
        if not same(k, reference(dt, op, n), dt, op):
            bad.append(f"{op} vs reference")
        if not torch.equal(torch.cat([kbig[:SKEW], kbig[SKEW + n:]]), around):
            bad.append(f"{op}: bytes around the tensor changed")
        if pg._shared.key(k) not in pg._shared.entries:
            bad.append(f"{op}: storage not shared")
        if dt != torch.bfloat16 and op != "AVG":
            g = data(rank, dt, op, n)
            dist.all_reduce(g, op=rop, group=gloo)
            if not torch.equal(k, g):
                bad.append(f"{op} vs gloo")
    rep.check(not bad, f"all_reduce {name(dt)} {n} elements, shared: SUM PRODUCT MIN MAX AVG vs reference"
              + ("" if dt == torch.bfloat16 else " and gloo (not AVG)"), f"wrong: {bad}")

# ---- broadcast ---------------------------------------------------------------------
bad = []
for root in range(world):
    for dt in (torch.float32, torch.int8, torch.bfloat16):
        n = count(dt)
        b, _ = in_storage(data(rank, dt, "MAX", n))
        dist.broadcast(b, src=root)
        if not torch.equal(b, data(root, dt, "MAX", n)):
            bad.append(f"{name(dt)} from {root}")
rep.check(not bad, "broadcast f32, i8, bf16 from every root, shared", f"wrong: {bad}")

# ---- zero-copy: kcolld copies the staged ends only -----------------------------------
n = count(torch.float32)
z, _ = in_storage(torch.ones(n))
dist.all_reduce(z)  # shares it
nbytes = n * 4
got = quiet_copied(lambda: dist.all_reduce(z))
ends = 2 * kcoll.torch._END_BYTES
# Each rank's ends are read and the result written: a few times the ends,
# far below the tensor (one host: every rank's copies count here; across
# hosts the ends may run over the lanes, and 0 is copied).
rep.check(got <= 8 * ends * world and torch.equal(z, torch.full((n,), float(world * world))),
          f"all_reduce of a shared {nbytes}-byte tensor: kcolld copied {got} bytes (the ends, "
          f"at most {8 * ends * world})")
os.environ["KCOLL_TORCH_SHARE_MIN_BYTES"] = "0"  # every rank alike: they cut ops alike
off = dist.new_group(backend="kcoll")
del os.environ["KCOLL_TORCH_SHARE_MIN_BYTES"]
y, _ = in_storage(torch.ones(n))
got = quiet_copied(lambda: dist.all_reduce(y, group=off))
rep.check(got >= nbytes and not off._shared.entries and torch.equal(y, torch.full((n,), float(world))),
          f"control, a group made with KCOLL_TORCH_SHARE_MIN_BYTES=0: nothing shared, kcolld "
          f"copied {got} bytes (at least {nbytes})")

# ---- kcoll.torch.empty: mapped from the first op, any dtype, outlives its group ----------


def kcoll_bufs():
    """kcoll_mem_alloc mappings in this process."""
    with open("/proc/self/maps") as f:
        return sum("kcoll-buf" in ln for ln in f)


e = kcoll.torch.empty(n)
e.fill_(1)
got = quiet_copied(lambda: dist.all_reduce(e))  # its first op
rep.check(e.dtype == torch.get_default_dtype() and e.shape == (n,) and got <= 8 * ends * world
          and torch.equal(e, torch.full((n,), float(world))) and pg._shared.key(e) not in pg._shared.entries,
          f"kcoll.torch.empty({n}): a {e.dtype} tensor whose first all_reduce is zero-copy (kcolld "
          f"copied {got} bytes, at most {8 * ends * world}), no kcoll_mem_share", f"shape {tuple(e.shape)}")
bad = []
for dt in (torch.bfloat16, torch.float16, torch.int64, torch.uint8):
    m = count(dt) // 2
    t = kcoll.torch.empty((2, m), dtype=dt)
    t.copy_(data(rank, dt, "SUM", 2 * m).view(2, m))
    dist.all_reduce(t)
    if t.dtype != dt or t.shape != (2, m) or not same(t.view(-1), reference(dt, "SUM", 2 * m), dt, "SUM"):
        bad.append(name(dt))
rep.check(not bad, "kcoll.torch.empty((2, m), dtype=bf16 / f16 / i64 / u8): all_reduce SUM exact",
          f"wrong: {bad}")
threads = set(kcoll.torch._progress_threads)
sub2 = dist.new_group(backend="kcoll")
sub2_thread = (set(kcoll.torch._progress_threads) - threads).pop()
maps0 = kcoll_bufs()
k = kcoll.torch.empty(4, 1000, group=sub2)
k.fill_(float(rank))
dist.all_reduce(k, group=sub2)
row = k[1]
one_map = kcoll_bufs() == maps0 + 1 and torch.equal(k, torch.full((4, 1000), float(sum(range(world)))))
del k
dist.destroy_process_group(sub2)
del sub2
gc.collect()
row.fill_(3)  # must still be memory of ours
dist.all_reduce(row)  # another group: plain memory to it
kept = kcoll_bufs() == maps0 + 1 and torch.equal(row, torch.full((1000,), 3.0 * world))
del row
# Progress threads hold their group's last op (and its tensors) until the
# next one or their end: one more op here, and sub's thread gone.
dist.all_reduce(torch.ones(4))
sub2_thread.join(10)
gc.collect()
rep.check(one_map and kept and kcoll_bufs() == maps0,
          "kcoll.torch.empty(4, 1000, group=sub): one kcoll-buf mapping; after destroy_process_group(sub) "
          "a view of it still written and all_reduced on the default group; unmapped with that view",
          f"one map {one_map} kept {kept} maps now {kcoll_bufs()} before {maps0}")
z0 = kcoll.torch.empty(0, dtype=torch.int32)
rep.check(z0.shape == (0,) and z0.dtype == torch.int32, "kcoll.torch.empty(0): an empty tensor")
g = kcoll.torch.empty([3, 5], device="cpu", requires_grad=True)
rep.check(g.shape == (3, 5) and g.requires_grad and g.is_leaf and g.device.type == "cpu",
          "kcoll.torch.empty([3, 5], device='cpu', requires_grad=True): a leaf that requires grad",
          f"shape {tuple(g.shape)} requires_grad {g.requires_grad} leaf {g.is_leaf}")
rep.raises(ValueError, lambda: kcoll.torch.empty(8, device="cuda"),
           "kcoll.torch.empty(device='cuda'): ValueError saying kcoll memory is host memory",
           want=("host memory",))
rep.raises(ValueError, lambda: kcoll.torch.empty(8, group=gloo),
           "kcoll.torch.empty(group=<a gloo group>): ValueError, names the kcoll backend",
           want=("not a kcoll one", "backend='kcoll'"))
rep.raises(TypeError, lambda: kcoll.torch.empty(8, dtype=torch.complex64),
           "kcoll.torch.empty(dtype=complex64): TypeError")

# ---- async ops, a small tensor, a strided one ------------------------------------------
works, want = [], []
for i in range(3):
    t, _ = in_storage(torch.full((n,), float(rank + i)))
    works.append((t, dist.all_reduce(t, async_op=True)))
    want.append(float(sum(range(world)) + world * i))
for w in works:
    w[1].wait()
rep.check(all(torch.equal(t, torch.full((n,), v)) for (t, _), v in zip(works, want)),
          "three async all_reduces of shared tensors in flight together")
entries = len(pg._shared.entries)
small = torch.full((1000,), float(rank))
dist.all_reduce(small)
m = torch.arange(2 * n, dtype=torch.float32).view(n, 2)
col = m[:, 1]
dist.all_reduce(col)
rep.check(torch.equal(small, torch.full((1000,), float(sum(range(world)))))
          and len(pg._shared.entries) == entries
          and torch.equal(m[:, 1], torch.arange(1, 2 * n, 2, dtype=torch.float32) * world)
          and torch.equal(m[:, 0], torch.arange(0, 2 * n, 2, dtype=torch.float32)),
          "a small tensor and a strided column: exact, nothing new shared")

# ---- eviction: LRU, deregistered, data stays; a freed tensor's address reused -----------
pg._shared.clear()
pg._shared.max_bytes = 5 << 19  # room for two
ts = []
for i in range(3):
    t, _ = in_storage(torch.full((count(torch.float32),), float(i)))
    dist.all_reduce(t)
    ts.append(t)
keys = [pg._shared.key(t) for t in ts]
evicted = keys[0] not in pg._shared.entries and keys[1] in pg._shared.entries \
    and keys[2] in pg._shared.entries and pg._shared.total <= pg._shared.max_bytes
lo0 = (keys[0][0] + 4095) & ~4095
again = _lib.lib.kcoll_mem_deregister(pg._conn.handle, ctypes.c_void_p(lo0))
rep.check(evicted and again == -2 and torch.equal(ts[0], torch.full_like(ts[0], 0.0 * world)),
          "LRU eviction past KCOLL_TORCH_SHARE_MAX_BYTES: the oldest storage deregistered "
          "(a second deregister: ENOENT), its data in place", f"evicted {evicted} again {again}")
ts[0].fill_(5)
dist.all_reduce(ts[0])  # shared again, evicting the next
ok = torch.equal(ts[0], torch.full_like(ts[0], 5.0 * world)) and keys[1] not in pg._shared.entries
del ts[1]
gc.collect()
fresh = []
for i in range(4):  # may land where the freed storage was
    t, _ = in_storage(torch.full((count(torch.float32),), float(rank + i)))
    dist.all_reduce(t)
    fresh.append(torch.equal(t, torch.full_like(t, float(sum(range(world)) + world * i))))
rep.check(ok and all(fresh), "an evicted storage shared again; after one is freed, new tensors "
          "(maybe at its address) exact", f"ok {ok} fresh {fresh}")
pg._shared.max_bytes = kcoll.torch._SHARE_MAX_DEFAULT

# ---- a shared storage resized (its data moved): the stale entry dropped ------------------
rs = torch.ones(count(torch.float32))
dist.all_reduce(rs)
k_old = pg._shared.key(rs)
lo_old = pg._shared.entries[k_old][1] if k_old in pg._shared.entries else 0
rs.resize_(2 * rs.numel())  # more than the storage holds: new memory, the old freed
rs.fill_(float(rank))
dist.all_reduce(rs)
gone = k_old not in pg._shared.entries
again = _lib.lib.kcoll_mem_deregister(pg._conn.handle, ctypes.c_void_p(lo_old))
rep.check(lo_old and gone and again == -2 and pg._shared.key(rs) in pg._shared.entries
          and torch.equal(rs, torch.full_like(rs, float(sum(range(world))))),
          "a shared tensor resized past its storage: the old range deregistered (ENOENT after), "
          "the new storage shared, exact", f"old shared at {lo_old:#x}, gone {gone}, again {again}")

# ---- the knobs: byte counts with K/M/G, anything else refused by name -------------------


def knob(v):
    os.environ["KCOLL_TORCH_SHARE_MAX_BYTES"] = v
    try:
        return kcoll.torch._knob("KCOLL_TORCH_SHARE_MAX_BYTES", 7)
    except RuntimeError as e:
        return "refused" if "KCOLL_TORCH_SHARE_MAX_BYTES" in str(e) else str(e)
    finally:
        del os.environ["KCOLL_TORCH_SHARE_MAX_BYTES"]


want = {"": 7, "0": 0, "4096": 4096, "2560K": 5 << 19, "64m": 64 << 20, "1G": 1 << 30,
        "1X": "refused", "-1": "refused", "1_000": "refused", "1.5M": "refused", "M": "refused"}
got = {v: knob(v) for v in want}
rep.check(got == want, "KCOLL_TORCH_SHARE_*_BYTES: digits with K/M/G taken, -1, 1_000, 1.5M, 1X refused "
          "naming the knob", f"got {got}")

# ---- a group holds its shared storages, and lets go of them when destroyed --------------
# The tensor lives in a numpy array, whose end a weakref shows (whether
# freed memory is unmapped depends on the allocator).
os.environ["KCOLL_TORCH_SHARE_MAX_BYTES"] = "64M"
threads = set(kcoll.torch._progress_threads)
sub = dist.new_group(backend="kcoll")
del os.environ["KCOLL_TORCH_SHARE_MAX_BYTES"]
sub_thread = (set(kcoll.torch._progress_threads) - threads).pop()
arr = numpy.full(count(torch.float32), float(rank), dtype=numpy.float32)
arr_alive = weakref.ref(arr)
held = torch.from_numpy(arr)
del arr
dist.all_reduce(held, group=sub)
exact = torch.equal(held, torch.full_like(held, float(sum(range(world)))))
was_shared = sub._shared.key(held) in sub._shared.entries
del held
# The group's progress thread holds its last op (and so its tensors) until
# the next one: a small op, so that only the group's own hold is left.
dist.all_reduce(torch.ones(4), group=sub)
gc.collect()
rep.check(sub._shared.max_bytes == 64 << 20 and exact and was_shared and arr_alive() is not None,
          "a tensor shared by a group made with KCOLL_TORCH_SHARE_MAX_BYTES=64M, then dropped: "
          "the group keeps its memory",
          f"max {sub._shared.max_bytes} exact {exact} shared {was_shared} kept {arr_alive() is not None}")
try:
    dist.destroy_process_group(sub)  # torch 2.6 raised "ProcessGroup name not set" here
    destroyed = ""
except RuntimeError as e:
    destroyed = str(e)
del sub
gc.collect()
sub_thread.join(10)  # the group's progress thread ends once the group is gone
gc.collect()
rep.check(not destroyed and not sub_thread.is_alive() and arr_alive() is None,
          "destroy_process_group(that group): its progress thread ends, the memory is freed",
          f"destroy: {destroyed or 'ok'}; thread alive {sub_thread.is_alive()}; "
          f"memory kept {arr_alive() is not None}")

# ---- DDP: its bucket shared once, the same parameters as with gloo ------------------------
WIDE = 16384  # 2 x 5 x WIDE doubles of gradients: a 1.3 MB bucket


class Net(torch.nn.Module):
    """As torch_rank.py's: two linear branches added, so with integer data
    and start, lr 2^-8 and 4 steps every value stays a short dyadic
    rational and every sum is exact in any order."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, WIDE)
        self.b = torch.nn.Linear(4, WIDE)

    def forward(self, x):
        return self.a(x) + self.b(x)


shares = []
real_share = _lib.mem_share


def counting_share(*a):
    shares.append(len(steps))
    return real_share(*a)


def train(group):
    torch.manual_seed(0)
    model = Net().double()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randint(-2, 3, p.shape))
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group)
    opt = torch.optim.SGD(ddp.parameters(), lr=2.0 ** -8)
    g = torch.Generator().manual_seed(rank)
    for _ in range(4):
        x = torch.randint(-3, 4, (8, 4), generator=g).double()
        y = torch.randint(-3, 4, (8, WIDE), generator=g).double()
        opt.zero_grad()
        (torch.nn.functional.mse_loss(ddp(x), y, reduction="sum") * world).backward()
        opt.step()
        steps.append(1)
    return [p.detach().clone() for p in model.parameters()]


steps = []
_lib.mem_share = counting_share
pk = train(None)
_lib.mem_share = real_share
steps = []
pgl = train(gloo)
rep.check(all(torch.equal(a, b) for a, b in zip(pk, pgl)),
          "DDP, a 1.3 MB gradient bucket: 4 SGD steps with kcoll and gloo give identical parameters",
          f"largest difference {max((a - b).abs().max().item() for a, b in zip(pk, pgl))}")
# The first step's bucket, and the one DDP rebuilds after it (torch
# reorders its buckets once): shared then, never again.
rep.check(shares and all(s <= 1 for s in shares),
          "DDP: its gradient buckets shared in the first steps only, reused after",
          f"shares at steps {shares}")

dist.barrier()
dist.destroy_process_group()
