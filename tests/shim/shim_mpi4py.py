# SPDX-License-Identifier: MIT
# mpi4py under the shim (tests/t_shim.sh): buffer-based Allreduce (plain and
# in place), Bcast, Allgather and Reduce_scatter_block on numpy arrays of
# several dtypes, sizes below and above KCOLL_MPI_MIN_BYTES, on COMM_WORLD and
# a dup; plus pickle-based allreduce/bcast. Every result is checked against
# the value computed here (exact: small integers), rank 0 prints one line per
# case and "mpi4py: N cases, N wrong". Run with /usr/bin/python3 (Debian's
# python3-mpi4py).
import sys

from mpi4py import MPI
import numpy as np

world = MPI.COMM_WORLD
cases = wrong = 0


def note(name, good):
    global cases, wrong
    good = world.allreduce(bool(good), op=MPI.LAND)  # pickled: tiny, PMPI
    cases += 1
    wrong += not good
    if world.rank == 0:
        print(f"{'ok' if good else 'WRONG'} {name}")


def inputs(n, dtype, rank, op):
    i = np.arange(n, dtype=np.int64)
    if op == "prod":
        v = 1 + ((i + rank) % 3 == 0)
    else:
        v = (i * 7 + rank * 13) % 25 - (12 if np.issubdtype(dtype, np.signedinteger) or
                                          np.issubdtype(dtype, np.floating) else 0)
    return v.astype(dtype)


def expected(n, dtype, size, op):
    a = [inputs(n, dtype, r, op) for r in range(size)]
    f = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}[op]
    out = a[0].copy()
    for x in a[1:]:
        out = f(out, x)
    return out


OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}

for comm, cname in ((world, "world"), (world.Dup(), "dup")):
    size, rank = comm.size, comm.rank
    for dtype in (np.float32, np.float64, np.int32, np.uint8, np.int64):
        for nbytes in (4096, 256 * 1024 + 64):
            n = nbytes // np.dtype(dtype).itemsize // size * size
            for op in ("sum", "prod", "min", "max"):
                want = expected(n, dtype, size, op)
                send = inputs(n, dtype, rank, op)
                recv = np.zeros_like(send)
                comm.Allreduce(send, recv, op=OPS[op])
                note(f"Allreduce/{cname}/{np.dtype(dtype).name}/{nbytes}/{op}",
                     np.array_equal(recv, want))
                comm.Allreduce(MPI.IN_PLACE, send, op=OPS[op])
                note(f"Allreduce/{cname}/{np.dtype(dtype).name}/{nbytes}/{op}/inplace",
                     np.array_equal(send, want))
            send = inputs(n, dtype, rank, "sum")
            block = n // size
            recv = np.zeros(block, dtype=dtype)
            comm.Reduce_scatter_block(send, recv, op=MPI.SUM)
            note(f"Reduce_scatter_block/{cname}/{np.dtype(dtype).name}/{nbytes}",
                 np.array_equal(recv, expected(n, dtype, size, "sum")[rank * block:(rank + 1) * block]))
            mine = inputs(block, dtype, rank, "sum")
            recv = np.zeros(n, dtype=dtype)
            comm.Allgather(mine, recv)
            note(f"Allgather/{cname}/{np.dtype(dtype).name}/{nbytes}",
                 np.array_equal(recv, np.concatenate([inputs(block, dtype, r, "sum")
                                                      for r in range(size)])))
            root = size - 1
            buf = inputs(n, dtype, rank, "max")
            comm.Bcast(buf, root=root)
            note(f"Bcast/{cname}/{np.dtype(dtype).name}/{nbytes}/root{root}",
                 np.array_equal(buf, inputs(n, dtype, root, "max")))
    # pickle-based (lowercase) forms: PMPI underneath, must still work
    got = comm.allreduce(np.full(1000, rank + 1.0), op=MPI.SUM)
    note(f"allreduce-pickle/{cname}", np.array_equal(got, np.full(1000, size * (size + 1) / 2)))
    got = comm.bcast({"x": np.arange(10)} if rank == 0 else None, root=0)
    note(f"bcast-pickle/{cname}", np.array_equal(got["x"], np.arange(10)))
    comm.Barrier()
    if comm is not world:
        comm.Free()

if world.rank == 0:
    print(f"mpi4py: {cases} cases, {wrong} wrong")
sys.exit(1 if wrong else 0)
