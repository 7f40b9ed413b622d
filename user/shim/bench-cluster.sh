#!/usr/bin/env bash
# MPI_Allreduce across the netns test bed with and without libkcoll_mpi.so,
# side by side in one run with what bounds it: per round, the raw TCP ring
# capacity (kcoll-tcpcap ring, as docs/perf/cluster.md §4), mpi-coll-bench
# under Open MPI (TCP between hosts, one rank per host, launched through
# scripts/netns-rsh.sh), the same with the shim preloaded (each rank on its
# own host's kcolld), for malloc and MPI_Alloc_mem buffers, and kcoll-bench's
# own all-reduce (--mem host: malloc, one copy; --mem shm: kcoll_mem_alloc,
# zero copy). Every kcolld advertises only its eth0 address, the network
# Open MPI and kcoll-tcpcap use. The order of the runs rotates per round.
# Prints every run's table, then min / median busbw per size and system.
# Brings up its own cluster (prefix $KCOLL_CLUSTER_PREFIX, default "kshb")
# and takes it down. Root.
#   user/shim/bench-cluster.sh [BUILD] [HOSTS]      (default: build 4)
#   env: BENCH_ARGS (default "-b 16M -e 64M -f 4 -n 5 -w 1 -c 1 -d f32 -o sum"),
#        BENCH_MEM (default "malloc alloc-mem"), KCOLL_MPI_MIN_BYTES (default 64K),
#        ROUNDS (default 3), CAP_SECONDS (default 3), BENCH_KCOLL (default
#        "host shm": kcoll-bench --mem kinds; empty: none), BENCH_JSON (a file:
#        every run's JSON there)
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-build}" && pwd)
hosts=${2:-4}
read -r -a args <<<"${BENCH_ARGS:--b 16M -e 64M -f 4 -n 5 -w 1 -c 1 -d f32 -o sum}"
read -r -a mems <<<"${BENCH_MEM:-malloc alloc-mem}"
read -r -a kmems <<<"${BENCH_KCOLL-host shm}"
rounds=${ROUNDS:-3}
cap_seconds=${CAP_SECONDS:-3}
export KCOLL_CLUSTER_PREFIX=${KCOLL_CLUSTER_PREFIX:-kshb} KCOLL_BUILD=$build
export KCOLL_MPI_MIN_BYTES=${KCOLL_MPI_MIN_BYTES:-65536} KCOLL_LOG_LEVEL=warn
cluster="$top/scripts/netns-cluster.sh"
[ "$(id -u)" -eq 0 ] || { echo "bench-cluster.sh: needs root (network namespaces)" >&2; exit 1; }
for m in "${mems[@]}"; do
	case $m in malloc | alloc-mem) ;; *)
		echo "bench-cluster.sh: BENCH_MEM takes malloc and alloc-mem, not '$m'" >&2; exit 2 ;;
	esac
done
tmp=$(mktemp -d)
trap '"$cluster" down >/dev/null 2>&1; rm -rf "$tmp"' EXIT
"$cluster" up -H "$hosts" >/dev/null
addrs=()
for ((i = 0; i < hosts; i++)); do
	addrs+=("10.10.0.$((i + 1))")
	KCOLL_ADDRS=${addrs[$i]} "$cluster" restart "$i" >/dev/null
	echo "${addrs[$i]} slots=1"
done >"$tmp/hosts"
addr_list=$(IFS=,; echo "${addrs[*]}")
# shellcheck disable=SC2054  # "self,tcp" is one argument
mpi=(mpirun --allow-run-as-root --hostfile "$tmp/hosts" --mca plm_rsh_agent "$top/scripts/netns-rsh.sh"
     --mca pml ob1 --mca btl self,tcp --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0
     --mca mpi_yield_when_idle 1 -x LD_PRELOAD -x KCOLL_MPI_MIN_BYTES -np "$hosts")
run=0
keep() {	# system: file $tmp/out.json becomes run-N.json tagged with the system and round
	printf '{"system": "%s", "round": %d, "result": ' "$1" "$r" >"$tmp/run-$run.json"
	cat "$tmp/out.json" >>"$tmp/run-$run.json"
	echo "}" >>"$tmp/run-$run.json"
	run=$((run + 1))
}
capacity() {
	local pids=() i rc=0
	for ((i = 1; i < hosts; i++)); do
		timeout -k 5 60 "$cluster" exec "$i" "$build/bin/kcoll-tcpcap" ring -r "$i" "$addr_list" \
			-t "$cap_seconds" 2>"$tmp/cap-$i.err" >/dev/null &
		pids+=($!)
	done
	timeout -k 5 60 "$cluster" exec 0 "$build/bin/kcoll-tcpcap" ring -r 0 "$addr_list" \
		-t "$cap_seconds" --json >"$tmp/out.json" 2>"$tmp/cap-0.err" || rc=1
	for p in "${pids[@]}"; do wait "$p" || rc=1; done
	[ "$rc" -eq 0 ] || { cat "$tmp"/cap-*.err >&2; echo "bench-cluster.sh: kcoll-tcpcap failed" >&2; exit 1; }
	keep tcpcap
}
mpirun_one() {	# mem shim(0/1)
	local extra=() pre='' name="mpi-$1"
	[ "$1" = alloc-mem ] && extra=(--alloc-mem)
	[ "$2" = 1 ] && { pre="$build/lib/libkcoll_mpi.so"; name="shim-$1"; }
	timeout -k 10 300 "$cluster" exec 0 env LD_PRELOAD="$pre" "${mpi[@]}" \
		"$build/bin/mpi-coll-bench" allreduce "${args[@]}" "${extra[@]}" --json >"$tmp/out.json" \
		2>"$tmp/err" || { cat "$tmp/err" >&2; echo "bench-cluster.sh: $name failed" >&2; exit 1; }
	keep "$name"
}
kcoll_one() {	# mem
	timeout -k 10 300 "$build/bin/kcoll-bench" allreduce --hosts "$hosts" -N 1 --mem "$1" \
		--launch "$cluster exec %h" "${args[@]}" --json >"$tmp/out.json" 2>"$tmp/err" ||
		{ cat "$tmp/err" >&2; echo "bench-cluster.sh: kcoll-bench --mem $1 failed" >&2; exit 1; }
	keep "kcoll-$1"
}
steps=()
for m in "${mems[@]}"; do steps+=("mpirun_one $m 0" "mpirun_one $m 1"); done
for m in "${kmems[@]}"; do steps+=("kcoll_one $m"); done
echo "# $hosts netns hosts, eth0; ${rounds} rounds; mpi-coll-bench / kcoll-bench allreduce ${args[*]}"
echo "# Open MPI: ${mpi[*]}"
echo "# shim: LD_PRELOAD=$build/lib/libkcoll_mpi.so KCOLL_MPI_MIN_BYTES=$KCOLL_MPI_MIN_BYTES"
for ((r = 1; r <= rounds; r++)); do
	echo "# round $r/$rounds $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
	capacity
	for ((i = 0; i < ${#steps[@]}; i++)); do
		${steps[$(((i + r - 1) % ${#steps[@]}))]}
	done
done
[ -n "${BENCH_JSON:-}" ] && cat "$tmp"/run-*.json >"$BENCH_JSON"
python3 - "$tmp" <<'EOF'
import glob, json, os, statistics, sys
runs = [json.load(open(f)) for f in sorted(glob.glob(os.path.join(sys.argv[1], "run-*.json")),
                                           key=lambda f: int(f.rsplit("-", 1)[1].split(".")[0]))]
caps = [r["result"] for r in runs if r["system"] == "tcpcap"]
pts, wrong = {}, 0
for r in runs:
    if r["system"] == "tcpcap":
        continue
    for row in r["result"]["rows"]:
        pts.setdefault((r["system"], row["size"]), []).append(row["busbw"])
        wrong += row.get("wrong") or 0
order = ["mpi-malloc", "shim-malloc", "mpi-alloc-mem", "shim-alloc-mem", "kcoll-host", "kcoll-shm"]
systems = [s for s in order if any(k[0] == s for k in pts)]
sizes = sorted({k[1] for k in pts})
def mm(v):
    return "%.3f / %.3f" % (min(v), statistics.median(v))
def ratio(a, b):
    return "%.2f / %.2f" % (min(a) / statistics.median(b), statistics.median(a) / statistics.median(b))
link = [c["min_link_GBps"] for c in caps]
bound = [c["ring_allreduce_busbw_bound_GBps"] for c in caps]
agg = [c["aggregate_GBps"] for c in caps]
print("\nbusbw GB/s, min / median of %d rounds; wrong results: %d" % (len(caps), wrong))
print("ring bound (kcoll-tcpcap ring, same rounds): slowest link %s, aggregate %s, all-reduce busbw bound %s"
      % (mm(link), mm(agg), mm(bound)))
print("| size | " + " | ".join(systems) + " | ring bound |")
print("|---:|" + "---:|" * (len(systems) + 1))
for s in sizes:
    print("| %dM | " % (s >> 20) + " | ".join(mm(pts[(x, s)]) if (x, s) in pts else "" for x in systems)
          + " | %s |" % mm(bound))
print("\nratios (min / median over the median of the anchor):")
for s in sizes:
    out = []
    for a, b in (("shim-malloc", "mpi-malloc"), ("shim-alloc-mem", "mpi-alloc-mem"),
                 ("shim-malloc", "kcoll-host"), ("kcoll-host", "mpi-malloc"), ("kcoll-shm", "mpi-malloc")):
        if (a, s) in pts and (b, s) in pts:
            out.append("%s/%s %s" % (a, b, ratio(pts[(a, s)], pts[(b, s)])))
    if ("mpi-malloc", s) in pts and bound:
        out.append("2 x mpi-malloc / bound %.2f" % (2 * statistics.median(pts[("mpi-malloc", s)]) / statistics.median(bound)))
    print("%dM: " % (s >> 20) + "; ".join(out))
EOF
