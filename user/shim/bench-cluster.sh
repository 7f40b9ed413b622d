#!/usr/bin/env bash
# MPI_Allreduce across the netns test bed with and without libkcoll_mpi.so,
# same run: mpi-coll-bench under Open MPI (TCP between hosts, one rank per
# host, launched through scripts/netns-rsh.sh as docs/perf.md section 4 does),
# then the same with the shim preloaded (each rank on its own host's kcolld),
# for malloc and MPI_Alloc_mem buffers. Brings up its own cluster (prefix
# $KCOLL_CLUSTER_PREFIX, default "kshb") and takes it down. Root.
#   user/shim/bench-cluster.sh [BUILD] [HOSTS]      (default: build 4)
#   env: BENCH_ARGS (default "-b 16M -e 64M -f 4 -n 5 -w 1 -c 1 -d f32 -o sum"),
#        BENCH_MEM (default "malloc alloc-mem"), KCOLL_MPI_MIN_BYTES (default 64K)
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-build}" && pwd)
hosts=${2:-4}
args=(${BENCH_ARGS:--b 16M -e 64M -f 4 -n 5 -w 1 -c 1 -d f32 -o sum})
mems=(${BENCH_MEM:-malloc alloc-mem})
export KCOLL_CLUSTER_PREFIX=${KCOLL_CLUSTER_PREFIX:-kshb} KCOLL_BUILD=$build
export KCOLL_MPI_MIN_BYTES=${KCOLL_MPI_MIN_BYTES:-65536} KCOLL_LOG_LEVEL=warn
cluster="$top/scripts/netns-cluster.sh"
tmp=$(mktemp -d)
trap '"$cluster" down >/dev/null 2>&1; rm -rf "$tmp"' EXIT
"$cluster" up -H "$hosts" >/dev/null
for ((i = 0; i < hosts; i++)); do echo "10.10.0.$((i + 1)) slots=1"; done >"$tmp/hosts"
# shellcheck disable=SC2054  # "self,tcp" is one argument
mpi=(mpirun --allow-run-as-root --hostfile "$tmp/hosts" --mca plm_rsh_agent "$top/scripts/netns-rsh.sh"
     --mca pml ob1 --mca btl self,tcp --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0
     --mca mpi_yield_when_idle 1 -x LD_PRELOAD -x KCOLL_MPI_MIN_BYTES -np "$hosts")
for mem in "${mems[@]}"; do
	case $mem in
	malloc) extra=() ;;
	alloc-mem) extra=(--alloc-mem) ;;
	*) echo "bench-cluster.sh: BENCH_MEM takes malloc and alloc-mem, not '$mem'" >&2; exit 2 ;;
	esac
	echo "## $hosts hosts, $mem buffers: Open MPI alone"
	"$cluster" exec 0 env LD_PRELOAD= "${mpi[@]}" "$build/bin/mpi-coll-bench" allreduce \
		"${args[@]}" "${extra[@]}"
	echo "## $hosts hosts, $mem buffers: Open MPI + libkcoll_mpi.so (KCOLL_MPI_MIN_BYTES=$KCOLL_MPI_MIN_BYTES)"
	"$cluster" exec 0 env LD_PRELOAD="$build/lib/libkcoll_mpi.so" "${mpi[@]}" \
		"$build/bin/mpi-coll-bench" allreduce "${args[@]}" "${extra[@]}"
done
