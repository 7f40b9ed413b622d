# SPDX-License-Identifier: MIT
"""One rank of the torch-free tests of the kcoll package: numpy arrays,
bytearray/bytes, kcoll.empty, Request test/wait, error mapping. Run by
launch.py; every check is computed from data all ranks can rebuild."""
import errno
import gc
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tap import Report  # noqa: E402

import numpy as np  # noqa: E402

import kcoll  # noqa: E402

rep = Report()
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
uids = [bytes.fromhex(u) for u in os.environ["KCOLL_TEST_UIDS"].split(",")]
N = 1003  # not a multiple of any vector width: the tail is reduced too
DTYPES = ["float16", "float32", "float64", "int8", "uint8", "int32", "uint32", "int64", "uint64"]
OPS = ["sum", "prod", "min", "max", "avg"]

comm = kcoll.Comm.init(uids[0], world, rank)
rep.check(comm.rank == rank and comm.size == world, "Comm.init: rank and size",
          f"{comm.rank}/{comm.size}")
rep.check("torch" not in sys.modules, "import kcoll and its use pull in no torch")


def data(r, dt, op, n=N):
    """Rank r's input: small integers, so every reduction is exact."""
    rng = np.random.default_rng(1000 * r + 10 * DTYPES.index(dt) + OPS.index(op))
    signed = np.dtype(dt).kind != "u"
    lo, hi = ((-1 if signed else 1), 3) if op == "prod" else ((-5 if signed else 0), 10)
    return rng.integers(lo, hi, n).astype(dt)


def reference(dt, op, n=N):
    x = np.stack([data(r, dt, op, n).astype(np.float64 if np.dtype(dt).kind == "f" else np.int64)
                  for r in range(world)])
    if op == "avg":
        s = x.sum(0)
        if np.dtype(dt).kind == "f":
            return (s / world).astype(dt)
        return (np.sign(s) * (np.abs(s) // world)).astype(dt)  # C's truncation toward zero
    return {"sum": x.sum(0), "prod": x.prod(0), "min": x.min(0), "max": x.max(0)}[op].astype(dt)


def same(got, want, dt, op):
    if op == "avg" and np.dtype(dt).kind == "f":  # the daemon rounds the sum, then the quotient
        return np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=2.0 ** -10)
    return np.array_equal(got, want)


for dt in DTYPES:
    bad = []
    for i, op in enumerate(OPS):
        x = data(rank, dt, op)
        if i % 2:  # out of place, plain numpy memory (one-copy path)
            out = np.zeros_like(x)
            comm.allreduce(x, out, op=op).wait()
        else:  # in place in kcolld-shared memory (zero-copy path)
            out = kcoll.empty(N, dt)
            out[:] = x
            comm.allreduce(out, op=op).wait()
        if not same(out, reference(dt, op), dt, op):
            bad.append(op)
    rep.check(not bad, f"allreduce {dt}: sum prod min max avg, in and out of place", f"wrong: {bad}")

for dt in DTYPES:
    mine = data(rank, dt, "sum")
    want = np.concatenate([data(r, dt, "sum") for r in range(world)])
    out = np.zeros(world * N, dt)
    comm.allgather(mine, out).wait()
    inplace = kcoll.empty(world * N, dt)
    inplace[rank * N:(rank + 1) * N] = mine
    comm.allgather(inplace[rank * N:(rank + 1) * N], inplace).wait()
    rep.check(np.array_equal(out, want) and np.array_equal(inplace, want),
              f"allgather {dt}: out of place and in place")

for dt in DTYPES:
    bad = []
    for op in ("sum", "max", "avg"):
        full = data(rank, dt, op, world * N)
        out = np.zeros(N, dt)
        comm.reduce_scatter(full, out, op=op).wait()
        if not same(out, reference(dt, op, world * N)[rank * N:(rank + 1) * N], dt, op):
            bad.append(op)
    rep.check(not bad, f"reduce_scatter {dt}: sum max avg", f"wrong: {bad}")

for i, dt in enumerate(DTYPES):
    root = i % world
    buf = data(rank, dt, "min") if rank == root else np.zeros(N, dt)
    comm.broadcast(buf, root=root).wait()
    rep.check(np.array_equal(buf, data(root, dt, "min")), f"broadcast {dt} from rank {root}")

# Untyped memory: bytearray is u8; read-only bytes may be sent (one private copy).
ba = bytearray([rank + 1] * 16)
comm.allreduce(ba, op="sum").wait()
rep.check(ba == bytearray([sum(range(1, world + 1))] * 16), "allreduce on a bytearray (u8)")
got = bytearray(4 * world)
comm.allgather(bytes([rank] * 4), got).wait()
rep.check(got == bytearray(b"".join(bytes([r] * 4) for r in range(world))),
          "allgather from read-only bytes")
rep.raises(ValueError, lambda: comm.allreduce(np.ones(8)[::2]), "non-contiguous array: ValueError",
           ["contiguous"])
rep.raises(ValueError, lambda: comm.allreduce(np.ones(4), bytes(32)), "read-only receive buffer: ValueError",
           ["read-only"])
rep.raises(ValueError, lambda: comm.allgather(np.ones(4), np.ones(4 * world + 1)),
           "allgather with a wrong receive size: ValueError before anything is queued")
rep.raises(TypeError, lambda: comm.allreduce(np.ones(4, np.int16)), "int16 (no kcoll dtype): TypeError",
           ["int16"])

# Several requests in flight at once, waited for in reverse order.
bufs = [np.full(64, rank + k, np.int64) for k in range(8)]
reqs = [comm.allreduce(b) for b in bufs]
done = [rq.wait() for rq in reversed(reqs)]
rep.check(all(done) and all((b == sum(r + k for r in range(world))).all() for k, b in enumerate(bufs)),
          "8 allreduces in flight, waited in reverse order")
rep.check(all(rq.test() for rq in reqs), "test() on a completed request stays True")

# wait(timeout) and test() while a peer has not joined yet: the others come
# one second late to the barrier.
if rank == 0:
    t0 = time.monotonic()
    rq = comm.barrier()
    early = (rq.wait(0.2), rq.test())
    last = rq.wait()
    took = time.monotonic() - t0
    rep.check(early == (False, False) and last and took > 0.5,
              "barrier: wait(0.2) and test() False before the last rank joins, wait() True after",
              f"early {early}, last {last}, {took:.2f} s")
else:
    time.sleep(1.0)
    rep.check(comm.barrier().wait(), "barrier: wait(0.2) and test() False before the last rank joins, "
              "wait() True after")

# kcoll.empty: memory mapped from kcolld, freed with the last view.
def kcoll_maps():
    with open("/proc/self/maps") as f:
        return sum("kcoll-buf" in line for line in f)


gc.collect()
before = kcoll_maps()
a = kcoll.empty((3, 4), "float32")
view = a[1:]
shape_ok = a.shape == (3, 4) and a.dtype == np.float32 and a.flags.writeable and a.flags.c_contiguous
mapped = kcoll_maps() == before + 1
del a
gc.collect()
kept = kcoll_maps() == before + 1
view[:] = 7  # must still be valid memory
del view
gc.collect()
rep.check(shape_ok and mapped and kept and kcoll_maps() == before,
          "kcoll.empty: writable array in a kcolld mapping, freed with its last view",
          f"shape_ok {shape_ok} mapped {mapped} kept {kept} after {kcoll_maps()} before {before}")
# close() with an array of its memory still alive: the array stays valid,
# the connection refuses new work, and it disconnects with the last view.
c2 = kcoll.Connection()
kept_arr = c2.empty(1000, "float32")
maps_open = kcoll_maps()
c2.close()
kept_arr[:] = 5  # must still be valid memory
refused = False
try:
    c2.empty(4)
except ValueError:
    refused = True
held = kcoll_maps() == maps_open and c2.closed and c2._h is not None
del kept_arr
gc.collect()
rep.check(refused and held and kcoll_maps() == maps_open - 1 and c2._h is None,
          "Connection.close() with a kcoll.empty array alive: the array stays valid, the connection "
          "refuses new work, disconnects once the array is gone",
          f"refused {refused} held {held} maps {kcoll_maps()} (open {maps_open}) handle {c2._h}")
# kcoll.mem_alloc: raw bytes of kcoll memory, viewed as any dtype.
raw = kcoll.mem_alloc(4 * 1000 + 3)
mv = raw[:4000].view(np.float32)
mv[:] = rank + 1
maps_raw = kcoll_maps()
comm.allreduce(mv).wait()
rep.check(raw.dtype == np.uint8 and raw.shape == (4003,) and maps_raw == before + 1
          and np.array_equal(mv, np.full(1000, float(sum(range(1, world + 1))), np.float32)),
          "kcoll.mem_alloc(4003): uint8 bytes in a kcolld mapping; a float32 view of them all-reduced",
          f"dtype {raw.dtype} shape {raw.shape} maps {maps_raw} (before {before})")
del raw, mv
gc.collect()
rep.raises(ValueError, lambda: kcoll.empty((2, -3), "float32"), "kcoll.empty with a negative dimension: ValueError",
           want=("negative",))
z = kcoll.empty(0, "int32")
rep.check(z.shape == (0,) and z.dtype == np.int32, "kcoll.empty of zero elements")
zr = np.zeros(0, np.float32)
rep.check(comm.allreduce(zr).wait(), "allreduce of zero elements")
rep.raises(TypeError, lambda: kcoll.empty(4, "complex64"), "kcoll.empty refuses a dtype no collective takes")

# Errors: KcollError is a RuntimeError with errno, code, strerror, rank.
try:
    kcoll.Comm.init(kcoll.get_unique_id(), 0, 0)
    rep.check(False, "Comm.init nranks=0: KcollError EINVAL", "no error")
except kcoll.KcollError as e:
    rep.check(isinstance(e, RuntimeError) and e.errno == errno.EINVAL and e.code == -errno.EINVAL
              and e.strerror and e.strerror in str(e) and e.rank is None,
              "Comm.init nranks=0: KcollError EINVAL (errno, code, strerror, no rank)", repr(e))
rep.raises(ValueError, lambda: kcoll.Comm.init(b"short", world, rank), "Comm.init with a short id: ValueError")
try:
    kcoll.Connection(socket_path=f"/nonexistent/kcolld-{os.getpid()}.sock")
    rep.check(False, "Connection to a missing socket: KcollError", "no error")
except kcoll.KcollError as e:
    rep.check(e.errno in (errno.ENOENT, errno.ECONNREFUSED), "Connection to a missing socket: KcollError",
              repr(e))

# Ranks disagree on the count: every rank fails at once, a rank is blamed.
t0 = time.monotonic()
try:
    comm.allreduce(np.ones(4 + rank, np.float32)).wait()
    rep.check(False, "mismatched counts: KcollError EBADMSG on every rank, a rank blamed", "no error")
except kcoll.KcollError as e:
    rep.check(e.errno == errno.EBADMSG and e.rank is not None and time.monotonic() - t0 < 10,
              "mismatched counts: KcollError EBADMSG on every rank, a rank blamed", repr(e))
rep.check(comm.barrier().wait(), "the communicator still works after a refused operation")

# A rank skips a collective: with a 1.5 s timeout the others fail naming it,
# and the late rank fails at once (the communicator is aborted).
conn = kcoll.Connection(timeout_ms=1500)
short = kcoll.Comm.init(uids[1], world, rank, conn)
last = world - 1
t0 = time.monotonic()
if rank == last:
    time.sleep(2.5)
    t0 = time.monotonic()
try:
    short.allreduce(np.ones(4)).wait()
    rep.check(False, "a rank skips: ETIMEDOUT naming it on the others, an error on it too", "no error")
except kcoll.KcollError as e:
    took = time.monotonic() - t0
    good = e.errno == errno.ETIMEDOUT and e.rank == last and took < (2 if rank == last else 8)
    rep.check(good, "a rank skips: ETIMEDOUT naming it on the others, an error on it too",
              f"{e!r} after {took:.2f} s")
short.destroy()
conn.close()

# A connection closed before its communicator (the garbage collector may
# finalize them in either order, at interpreter exit it did): close()
# destroys what is left on it, a request pending then fails with
# ECANCELED, and the communicator's own destroy() frees nothing twice.
conn = kcoll.Connection()
late = kcoll.Comm.init(uids[2], world, rank, conn)
rep.check(late.barrier().wait(), "a communicator on a second connection works")
pending = late.allreduce(np.ones(4)) if rank == 0 else None  # the others never join it
conn.close()
if rank == 0:
    try:
        pending.wait()
        rep.check(False, "closing the connection fails its pending request with ECANCELED", "no error")
    except kcoll.KcollError as e:
        rep.check(e.errno == errno.ECANCELED,
                  "closing the connection fails its pending request with ECANCELED", repr(e))
else:
    rep.skip("closing the connection fails its pending request with ECANCELED",
             "only rank 0 leaves one pending")
rep.raises(ValueError, lambda: late.barrier(),
           "a communicator whose connection was closed refuses new operations",
           ("connection was closed",))
late.destroy()
rep.check(late._h is None, "destroy() after the connection's close() is a no-op")

# The same in a reference cycle, left to the collector.
conn = kcoll.Connection()
cyc = kcoll.Comm.init(uids[3], world, rank, conn)
rep.check(cyc.barrier().wait(), "a communicator in a cycle with its connection works")
conn.cycle = cyc
del conn, cyc
gc.collect()
rep.check(comm.barrier().wait() and comm.allreduce(np.ones(4)).wait(),
          "after the collector took a connection and its communicator, the first one works")
comm.destroy()
rep.raises(ValueError, lambda: comm.barrier(), "a destroyed communicator refuses new operations")
