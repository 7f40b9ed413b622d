# SPDX-License-Identifier: MIT
"""One rank of the device-memory tests of the kcoll package: buffers that
export __cuda_array_interface__ (as CuPy, Numba and torch CUDA tensors do),
allocated and filled through the CUDA driver API with ctypes, the driver
being the first libcuda.so.1 the loader finds: the fake (gpu/fake_cuda.c)
in t_python_cuda.sh, the real one on a GPU (scripts/gpu-check.sh). Every
collective on device buffers against numpy, a host-memory rank beside
device-memory ranks, the producer's stream synchronized, refusals; on a GPU
also CuPy arrays and torch CUDA tensors where those are installed. Run by
launch.py; KCOLL_TEST_CUDA says which driver ("fake" or "gpu")."""
import ctypes
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tap import Report  # noqa: E402

import numpy as np  # noqa: E402

import kcoll  # noqa: E402

rep = Report()
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
uids = [bytes.fromhex(u) for u in os.environ["KCOLL_TEST_UIDS"].split(",")]
FAKE = os.environ.get("KCOLL_TEST_CUDA") == "fake"
N = 4099  # odd: the tails are reduced too
DTYPES = ["float16", "float32", "float64", "int8", "uint8", "int32", "uint32", "int64", "uint64"]

cu = ctypes.CDLL("libcuda.so.1")
u64, vp = ctypes.c_ulonglong, ctypes.c_void_p
cu.cuMemAlloc_v2.argtypes = [ctypes.POINTER(u64), ctypes.c_size_t]
cu.cuMemFree_v2.argtypes = [u64]
cu.cuMemcpyHtoD_v2.argtypes = [u64, vp, ctypes.c_size_t]
cu.cuMemcpyDtoH_v2.argtypes = [vp, u64, ctypes.c_size_t]
cu.cuCtxSetCurrent.argtypes = [vp]


def ck(r, what):
    if r:
        raise RuntimeError(f"{what}: CUresult {r}")


ck(cu.cuInit(0), "cuInit")
dev, ctx = ctypes.c_int(), vp()
ck(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
ck(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
ck(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")


class DevArray:
    """A 1-D device array the way CuPy shows one to a consumer."""

    def __init__(self, n, dtype, stream=None, readonly=False, version=3, base=None, offset=0):
        self.dtype, self.n = np.dtype(dtype), n
        self.stream, self.readonly, self.version = stream, readonly, version
        self.strides = self.mask = None
        if base is not None:  # a view into another's allocation
            self.owner, self.ptr = base, base.ptr + offset
            return
        self.owner, p = None, u64(0)
        if n:
            ck(cu.cuMemAlloc_v2(ctypes.byref(p), n * self.dtype.itemsize), "cuMemAlloc_v2")
        self.ptr = p.value

    @property
    def __cuda_array_interface__(self):
        cai = {"shape": (self.n,), "typestr": self.dtype.str, "data": (self.ptr, self.readonly),
               "version": self.version, "strides": self.strides, "mask": self.mask}
        if self.version >= 3:
            cai["stream"] = self.stream
        return cai

    def put(self, host):
        host = np.ascontiguousarray(host, self.dtype)
        ck(cu.cuMemcpyHtoD_v2(self.ptr, host.ctypes.data, host.nbytes), "cuMemcpyHtoD_v2")
        return self

    def get(self):
        out = np.empty(self.n, self.dtype)
        ck(cu.cuMemcpyDtoH_v2(out.ctypes.data, self.ptr, out.nbytes), "cuMemcpyDtoH_v2")
        return out

    def free(self):
        if self.owner is None and self.ptr:
            ck(cu.cuMemFree_v2(self.ptr), "cuMemFree_v2")
        self.ptr = 0


def dev(host, dtype=None, **kw):
    host = np.asarray(host, dtype)
    return DevArray(host.size, host.dtype, **kw).put(host)


def data(r, dt, n=N, salt=0):
    """Rank r's input: small integers, so every reduction is exact."""
    rng = np.random.default_rng(1000 * r + 10 * DTYPES.index(dt) + salt)
    return rng.integers(0 if np.dtype(dt).kind == "u" else -5, 10, n).astype(dt)


def wide(dt):
    return np.float64 if np.dtype(dt).kind == "f" else np.int64


comm = kcoll.Comm.init(uids[0], world, rank)

# All-reduce sum of every dtype, in place on the device.
bad = []
for dt in DTYPES:
    d = dev(data(rank, dt))
    comm.allreduce(d).wait()
    want = sum(data(r, dt).astype(wide(dt)) for r in range(world)).astype(dt)
    if not np.array_equal(d.get(), want):
        bad.append(dt)
    d.free()
rep.check(not bad, "allreduce sum in device memory, every dtype (f16 f32 f64 i8 u8 i32 u32 i64 u64)",
          f"wrong: {bad}")

# Every operator on f32, out of place device to device.
bad = []
for op, fold in (("prod", np.prod), ("min", np.min), ("max", np.max), ("avg", None)):
    x = [np.clip(data(r, "float32", salt=1), -1, 2) for r in range(world)]
    s, o = dev(x[rank]), DevArray(N, "float32")
    comm.allreduce(s, o, op=op).wait()
    st = np.stack(x).astype(np.float64)
    want = (st.sum(0) / world if fold is None else fold(st, axis=0)).astype(np.float32)
    if not np.allclose(o.get(), want, rtol=1e-6) or not np.array_equal(s.get(), x[rank]):
        bad.append(op)
    s.free()
    o.free()
rep.check(not bad, "allreduce prod/min/max/avg f32, device to device out of place (input untouched)",
          f"wrong: {bad}")

mine = data(rank, "int32")
s, o = dev(mine), DevArray(world * N, "int32")
comm.allgather(s, o).wait()
rep.check(np.array_equal(o.get(), np.concatenate([data(r, "int32") for r in range(world)])),
          "allgather int32 in device memory")
s.free()
o.free()

full = data(rank, "float32", world * N, salt=2)
s, o = dev(full), DevArray(N, "float32")
comm.reduce_scatter(s, o).wait()
want = sum(data(r, "float32", world * N, salt=2).astype(np.float64) for r in range(world))
rep.check(np.array_equal(o.get(), want[rank * N:(rank + 1) * N].astype(np.float32)),
          "reduce_scatter sum float32 in device memory")
s.free()
o.free()

root = world - 1
b = dev(data(rank, "uint8", salt=3))
comm.broadcast(b, root=root).wait()
rep.check(np.array_equal(b.get(), data(root, "uint8", salt=3)), f"broadcast uint8 from rank {root} "
          "in device memory")
b.free()

# Rank 0 in host memory (numpy), the others on the device: kcolld stages.
x = data(rank, "float64", salt=4)
buf = x.copy() if rank == 0 else dev(x)
comm.allreduce(buf).wait()
got = buf if rank == 0 else buf.get()
rep.check(np.array_equal(got, sum(data(r, "float64", salt=4) for r in range(world))),
          "allreduce float64, rank 0 host memory and the others device memory")
if rank:
    buf.free()

# A view at an offset inside an allocation is a buffer of its own.
whole = dev(np.zeros(3 * 1024, np.int64))
part = DevArray(1024, "int64", base=whole, offset=1024 * 8).put(np.full(1024, rank + 1))
comm.allreduce(part).wait()
got = whole.get()
rep.check(np.array_equal(got[1024:2048], np.full(1024, sum(range(1, world + 1))))
          and not got[:1024].any() and not got[2048:].any(),
          "allreduce of a view in the middle of a device allocation leaves the rest alone")

# The producer's stream (CUDA Array Interface v3) is synchronized before
# kcolld reads; no stream, or a v2 interface, costs no synchronization.
if FAKE:
    syncs = cu.kcoll_fake_cuda_stream_syncs
    d = dev(np.ones(64, np.float32))
    n0 = syncs()
    d.stream = 2  # the per-thread default stream
    comm.allreduce(d).wait()
    n1 = syncs()
    d.stream = None
    comm.allreduce(d).wait()
    d.version, d.stream = 2, 2
    comm.allreduce(d).wait()
    n2 = syncs()
    rep.check(n1 - n0 == 1 and n2 == n1 and np.array_equal(d.get(), np.full(64, world ** 3, np.float32)),
              "v3 stream synchronized once before the op; stream None and v2 arrays not",
              f"syncs {n0} {n1} {n2}")
    d.free()
else:
    rep.skip("v3 stream synchronized once before the op; stream None and v2 arrays not",
             "counted by the fake driver only")

# Refusals, before anything is queued.
d = dev(np.zeros(16, np.float32))
rep.raises(ValueError, lambda: comm.allreduce(DevArray(16, "float32", base=d, readonly=True)),
           "read-only device receive buffer: ValueError", ["read-only"])
strided = DevArray(8, "float32", base=d)
strided.strides = (8,)
rep.raises(ValueError, lambda: comm.allreduce(strided), "strided device array: ValueError",
           ["not C-contiguous"])
masked = DevArray(8, "float32", base=d)
masked.mask = masked  # any object: a consumer must not ignore a mask
rep.raises(ValueError, lambda: comm.allreduce(masked), "masked device array: ValueError", ["masked"])
rep.raises(TypeError, lambda: comm.allreduce(DevArray(8, "int16", base=d)),
           "int16 device array (no kcoll dtype): TypeError", ["<i2"])
rep.raises(TypeError, lambda: comm.allreduce(DevArray(4, "complex64", base=d)),
           "complex64 device array: TypeError", ["<c8"])
# A buffer running past the end of its allocation: libkcoll refuses it.
try:
    comm.allreduce(DevArray(1 << 22, "float32", base=d, offset=32)).wait()
    rep.check(False, "device buffer running past its allocation: KcollError EINVAL", "no error")
except kcoll.KcollError as e:
    rep.check(e.errno == 22, "device buffer running past its allocation: KcollError EINVAL", str(e))
d.free()

# KV segments in device memory (docs/kv.md "Device memory"). Every rank
# owns a device segment and a host one; descriptors go round in an
# all-gather; each rank moves blocks into and out of the next rank's
# device segment: host -> device and device -> device writes (tagged),
# device -> host and device -> device reads. Its own device segment is
# written only by the previous rank, at the destinations of W_H and W_D;
# no block is read from any of those (their bytes would depend on timing)
# but the one R_H reads back from what this rank wrote.
import kcoll.kv  # noqa: E402

SEG = 1 << 20
W_H = [(0, 4096, 1000), (65536, 131072, 70000), (300000, 600000, 4097)]  # host -> peer's device
W_D = [(20007, 9000, 5000), (400000, 700000, 66000)]                       # device -> peer's device
R_H = [(100000, 20000, 30000), (500000, 131072 + 100, 1000)]             # peer's device -> host
R_D = [(900000, 800000, 100000)]                                            # peer's device -> device
KV_DEV_BYTES = sum(b[2] for b in W_H + W_D + R_H + R_D)  # per rank, as kcolld counts them


def pat(r, salt):
    return np.random.default_rng(7000 + 10 * r + salt).integers(0, 256, SEG, dtype=np.uint8)


nxt, prv = (rank + 1) % world, (rank - 1) % world
agent = kcoll.kv.Agent("cuda")
dmem = dev(pat(rank, 1))
hmem = pat(rank, 2)
dseg = agent.register(dmem, nr_notify=1)
hseg = agent.register(hmem)
rep.check(dseg.size == SEG, "kcoll.kv: a device array registers as a segment (its bytes)")
rep.raises(ValueError, lambda: agent.register(strided), "kcoll.kv: a strided device array: "
           "ValueError", ["not C-contiguous"])
mine = np.frombuffer(dseg.desc + hseg.desc, np.uint8).copy()
descs = np.empty(world * mine.size, np.uint8)
comm.allgather(mine, descs).wait()
at = nxt * mine.size
pdev = agent.import_desc(bytes(descs[at:at + 128]))
agent.write(hseg, pdev, np.array(W_H), msg=f"h2d {rank}").wait(30)
agent.write(dseg, pdev, np.array(W_D), notify=0, msg=f"d2d {rank}").wait(30)
got_h = np.zeros(SEG, np.uint8)
hgot = agent.register(got_h)
agent.read(hgot, pdev, np.array(R_H)).wait(30)
dgot = DevArray(SEG, "uint8").put(np.zeros(SEG, np.uint8))
dgseg = agent.register(dgot)
agent.read(dgseg, pdev, np.array(R_D)).wait(30)
# What the next rank's device segment holds now: its pattern, with this
# rank's blocks written over it.
want_next = pat(nxt, 1)
for lo, ro, n in W_H:
    want_next[ro:ro + n] = hmem[lo:lo + n]
for lo, ro, n in W_D:
    want_next[ro:ro + n] = pat(rank, 1)[lo:lo + n]
bad = [b for b in R_H if not np.array_equal(got_h[b[0]:b[0] + b[2]], want_next[b[1]:b[1] + b[2]])]
rest = np.ones(SEG, bool)
for lo, _, n in R_H:
    rest[lo:lo + n] = False
rep.check(not bad and not got_h[rest].any(), "kcoll.kv: device -> host read: the blocks, "
          "nothing else", f"wrong blocks {bad}")
g = dgot.get()
rest = np.ones(SEG, bool)
for lo, _, n in R_D:
    rest[lo:lo + n] = False
ok = all(np.array_equal(g[lo:lo + n], want_next[ro:ro + n]) for lo, ro, n in R_D)
rep.check(ok and not g[rest].any(), "kcoll.kv: device -> device read: the blocks, nothing else")
# The owner's view: the previous rank's two tagged batches landed in this
# rank's device memory, each tag once, and nothing else changed.
try:
    agent.wait_notif(f"h2d {prv}", timeout=30)
    agent.wait_notif(f"d2d {prv}", timeout=30)
    tags = True
except Exception as e:  # noqa: BLE001 (reported)
    tags = str(e)
rep.check(tags is True, "kcoll.kv: the host -> device and device -> device batches' tags arrive",
          str(tags))
rep.check(dseg.notify_get(0) == 1, "kcoll.kv: the device segment's notify counter is 1",
          str(dseg.notify_get(0)))
comm.barrier().wait()
want = pat(rank, 1)
for lo, ro, n in W_H:
    want[ro:ro + n] = pat(prv, 2)[lo:lo + n]
for lo, ro, n in W_D:
    want[ro:ro + n] = pat(prv, 1)[lo:lo + n]
g = dmem.get()
rep.check(np.array_equal(g, want), "kcoll.kv: host -> device and device -> device writes: "
          "every block in this rank's device memory, the rest untouched",
          f"{int((g != want).sum())} bytes differ")
rep.check(not agent.get_notifs(), "kcoll.kv: no notification twice")
# A range past the device allocation is refused as it is registered.
rep.raises(kcoll.KcollError, lambda: agent.register((dmem.ptr + 16, SEG)),
           "kcoll.kv: a device range running past its allocation: KcollError", ["EINVAL"])
comm.barrier().wait()
agent.close()
out = os.environ.get("KCOLL_TEST_KV_OUT")
if out and rank == 0:
    with open(out, "w") as f:
        f.write(f"{KV_DEV_BYTES * world}\n")
dgot.free()
dmem.free()

# What users bring on a GPU (issue 24's machine has both): a CuPy array
# made on a stream of its own, whose interface names that stream, and a
# torch CUDA tensor (bf16 too: it has no __cuda_array_interface__, kcoll
# takes its data_ptr). Neither exists on the fake driver.
ON_FAKE = "needs a GPU (this is the fake driver)"
why = ON_FAKE
if not FAKE:
    try:
        import cupy
        why = None
    except ImportError as e:
        why = f"no CuPy here: {e}"
desc = "CuPy array written on a stream of its own, all-reduced as it is (its stream synchronized)"
if why:
    rep.skip(desc, why)
else:
    with cupy.cuda.Stream(non_blocking=True):
        a = cupy.arange(1 << 20, dtype=cupy.float32) * (rank + 1)
        comm.allreduce(a).wait()
        got = cupy.asnumpy(a)
    want = np.arange(1 << 20, dtype=np.float32) * sum(range(1, world + 1))
    rep.check(np.array_equal(got, want), desc)

desc = "torch CUDA tensors (f32, bf16) through kcoll.Comm"
why = ON_FAKE
if not FAKE:
    try:
        import torch
        why = None if torch.cuda.is_available() else f"torch {torch.__version__} sees no GPU"
    except ImportError as e:
        why = f"no torch here: {e}"
if why:
    rep.skip(desc, why)
else:
    bad = []
    for dt in (torch.float32, torch.bfloat16):
        t = torch.full((N,), float(rank + 1), dtype=dt, device="cuda")
        t.mul_(2)  # queued on torch's stream: kcoll must wait for it
        comm.allreduce(t).wait()
        if not torch.equal(t.cpu(), torch.full((N,), 2.0 * sum(range(1, world + 1)), dtype=dt)):
            bad.append(str(dt))
    rep.check(not bad, desc, f"wrong: {bad}")

# Zero elements: nothing to read, no pointer needed.
z = DevArray(0, "float32", stream=2)
rep.check(comm.allreduce(z).wait(), "allreduce of zero device elements")
comm.barrier().wait()
comm.destroy()
