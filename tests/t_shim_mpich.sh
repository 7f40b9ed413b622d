#!/usr/bin/env bash
# tests/t_shim.sh under MPICH (Debian's mpich, mpirun.mpich): the same
# with/without comparison at 1..4 ranks, MPI_Init_thread, no daemon, and the
# selector without its shim. Run by tests/run.sh. TAP.
SHIM_MPI=mpich exec bash "$(dirname "$0")/t_shim.sh"
