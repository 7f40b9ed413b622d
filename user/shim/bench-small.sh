#!/usr/bin/env bash
# Small MPI_Allreduce messages with and without libkcoll_mpi.so, same run,
# interleaved: is the shim's below-threshold path free? Per round, three
# variants of the same mpi-coll-bench sweep, in alternating order (ABC, CBA,
# ...) so that a change in the machine's load hits all of them alike:
#   mpi       plain MPI, nothing preloaded
#   shim      LD_PRELOAD=libkcoll_mpi.so, connected to kcolld, default
#             threshold (KCOLL_MPI_MIN_BYTES unset: every row below it)
#   shim-off  the same with KCOLL_MPI_DISABLE=1 (the shim loaded, no kcolld
#             connection): separates the shim's code from the daemon's presence
# Prints, per size, the median over rounds of each variant's time (us) and
# the ratios shim/mpi and shim-off/mpi, plus in how many rounds shim beat mpi.
#   user/shim/bench-small.sh [BUILD] local NP...     (needs kcolld on $KCOLL_SOCKET)
#   user/shim/bench-small.sh [BUILD] cluster HOSTS   (root; own netns cluster,
#                                                     prefix $KCOLL_CLUSTER_PREFIX)
#   env: ROUNDS (default 6), BENCH_ARGS (default "-b 8 -e 64K -f 2 -n 1000
#        -w 100 -c 1 -d f32 -o sum"), MPI (local: openmpi or mpich)
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-build}" && pwd)
where=${2:-local}
shift 2 || true
nps=("$@"); [ ${#nps[@]} -eq 0 ] && nps=(2)
rounds=${ROUNDS:-6}
read -r -a args <<<"${BENCH_ARGS:--b 8 -e 64K -f 2 -n 1000 -w 100 -c 1 -d f32 -o sum}"
shim="$build/lib/libkcoll_mpi.so"
py=/usr/bin/python3
tmp=$(mktemp -d)
unset KCOLL_MPI_MIN_BYTES KCOLL_MPI_DISABLE KCOLL_MPI_DEBUG
cleanup() { [ "$where" = cluster ] && "$top/scripts/netns-cluster.sh" down >/dev/null 2>&1; rm -rf "$tmp"; }
trap cleanup EXIT

pre=()	# cluster: run mpirun inside host 0's namespace
case $where in
local)
	: "${KCOLL_SOCKET:?start kcolld and export KCOLL_SOCKET}"
	case ${MPI:-openmpi} in
	openmpi)
		# shellcheck disable=SC2054  # "self,vader" is one argument
		launch=(mpirun --oversubscribe --mca mpi_yield_when_idle 1 --mca btl self,vader)
		[ "$(id -u)" -eq 0 ] && launch+=(--allow-run-as-root)
		bench="$build/bin/mpi-coll-bench" ;;
	mpich)
		launch=(env MPIR_CVAR_POLLS_BEFORE_YIELD=1 mpirun.mpich)
		bench="$build/bin/mpi-coll-bench-mpich"
		[ -x "$bench" ] || { echo "bench-small.sh: $bench not built (needs mpicc.mpich)" >&2; exit 2; } ;;
	*) echo "bench-small.sh: MPI takes openmpi or mpich" >&2; exit 2 ;;
	esac ;;
cluster)
	export KCOLL_CLUSTER_PREFIX=${KCOLL_CLUSTER_PREFIX:-kshs} KCOLL_BUILD=$build KCOLL_LOG_LEVEL=warn
	hosts=${nps[0]}
	"$top/scripts/netns-cluster.sh" up -H "$hosts" >/dev/null
	for ((i = 0; i < hosts; i++)); do echo "10.10.0.$((i + 1)) slots=1"; done >"$tmp/hosts"
	pre=("$top/scripts/netns-cluster.sh" exec 0)
	# shellcheck disable=SC2054  # "self,tcp" is one argument
	launch=(mpirun --allow-run-as-root --hostfile "$tmp/hosts"
		--mca plm_rsh_agent "$top/scripts/netns-rsh.sh" --mca pml ob1 --mca btl self,tcp
		--mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0
		--mca mpi_yield_when_idle 1 -x LD_PRELOAD -x KCOLL_MPI_DISABLE)
	bench="$build/bin/mpi-coll-bench" ;;
*) echo "usage: bench-small.sh [BUILD] local NP... | cluster HOSTS" >&2; exit 2 ;;
esac

run() { # variant np round
	local so='' dis=0
	case $1 in shim) so=$shim ;; shim-off) so=$shim dis=1 ;; esac
	"${pre[@]}" env LD_PRELOAD="$so" KCOLL_MPI_DISABLE=$dis "${launch[@]}" -np "$2" "$bench" allreduce \
		"${args[@]}" --json >"$tmp/$1.$2.$3.json"
}

for np in "${nps[@]}"; do
	[ "$where" = cluster ] && np=$hosts
	for ((r = 0; r < rounds; r++)); do
		if ((r % 2)); then order=(shim-off shim mpi); else order=(mpi shim shim-off); fi
		for v in "${order[@]}"; do run "$v" "$np" "$r"; done
	done
	echo "## $where, $np ranks, ${MPI:-openmpi}, $rounds rounds: mpi-coll-bench allreduce ${args[*]}"
	"$py" - "$tmp" "$np" "$rounds" <<'EOF'
import json, statistics, sys
tmp, np, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
t = {}
for v in ("mpi", "shim", "shim-off"):
    for r in range(rounds):
        d = json.load(open(f"{tmp}/{v}.{np}.{r}.json"))
        for row in d["rows"]:
            if row["wrong"]:
                sys.exit(f"{v} round {r}: {row['wrong']} wrong elements at {row['size']} B")
            t.setdefault((v, row["size"]), []).append(row["time_us"])
sizes = sorted({s for (_, s) in t})
print("| size | mpi us | shim us | shim-off us | shim/mpi | shim-off/mpi | rounds shim faster |")
print("|---|---:|---:|---:|---:|---:|---:|")
for s in sizes:
    m = {v: statistics.median(t[(v, s)]) for v in ("mpi", "shim", "shim-off")}
    wins = sum(a < b for a, b in zip(t[("shim", s)], t[("mpi", s)]))
    print(f"| {s} | {m['mpi']:.2f} | {m['shim']:.2f} | {m['shim-off']:.2f} | "
          f"{m['shim'] / m['mpi']:.3f} | {m['shim-off'] / m['mpi']:.3f} | {wins}/{rounds} |")
EOF
	[ "$where" = cluster ] && break
done
