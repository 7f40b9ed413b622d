#!/usr/bin/env bash
# MPI_Allreduce with and without libkcoll_mpi.so, same run, same machine:
# Open MPI's anchor benchmark (mpi-coll-bench) twice per rank count and buffer
# kind, the second time with the shim preloaded. Needs a kcolld on
# $KCOLL_SOCKET.
#   user/shim/bench.sh [BUILD] [NP...]    (default: build, 2 4)
#   env: BENCH_ARGS (default "-b 1K -e 64M -f 4 -n 20 -w 5 -c 1 -d f32 -o sum"),
#        BENCH_MEM (default "malloc alloc-mem": buffers from aligned_alloc, then
#        from MPI_Alloc_mem, which the shim serves with kcoll_mem_alloc),
#        KCOLL_MPI_MIN_BYTES (default here 64K, so the sweep shows where kcoll
#        pays off; the shim's own default is 16M, the break-even measured so)
set -euo pipefail
build=${1:-build}; shift || true
nps=("$@"); [ ${#nps[@]} -eq 0 ] && nps=(2 4)
args=(${BENCH_ARGS:--b 1K -e 64M -f 4 -n 20 -w 5 -c 1 -d f32 -o sum})
mems=(${BENCH_MEM:-malloc alloc-mem})
shim="$(cd "$build/lib" && pwd)/libkcoll_mpi.so"
mpi=(mpirun --oversubscribe --mca mpi_yield_when_idle 1 --mca btl self,vader)
[ "$(id -u)" -eq 0 ] && mpi+=(--allow-run-as-root)
: "${KCOLL_SOCKET:?start kcolld and export KCOLL_SOCKET}"
export KCOLL_MPI_MIN_BYTES=${KCOLL_MPI_MIN_BYTES:-65536}
for np in "${nps[@]}"; do
	for mem in "${mems[@]}"; do
		case $mem in
		malloc) extra=() ;;
		alloc-mem) extra=(--alloc-mem) ;;
		*) echo "bench.sh: BENCH_MEM takes malloc and alloc-mem, not '$mem'" >&2; exit 2 ;;
		esac
		echo "## np $np, $mem buffers: Open MPI alone"
		"${mpi[@]}" -np "$np" "$build/bin/mpi-coll-bench" allreduce "${args[@]}" "${extra[@]}"
		echo "## np $np, $mem buffers: Open MPI + libkcoll_mpi.so (KCOLL_MPI_MIN_BYTES=$KCOLL_MPI_MIN_BYTES)"
		LD_PRELOAD="$shim" "${mpi[@]}" -np "$np" "$build/bin/mpi-coll-bench" allreduce \
			"${args[@]}" "${extra[@]}"
	done
done
