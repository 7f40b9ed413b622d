#!/usr/bin/env bash
# tests/t_shim.sh under MPICH (Debian's mpich, mpirun.mpich): the same
# with/without comparison at 1..4 ranks, MPI_Init_thread, no daemon, the
# selector without its shim, 200 x communicator churn, KCOLL_MPI_DEBUG=2,
# kcolld killed mid-run (mpi-coll-bench-mpich); mpi4py SKIPs where Debian's
# is built for Open MPI only. Run by tests/run.sh. TAP.
SHIM_MPI=mpich exec bash "$(dirname "$0")/t_shim.sh"
