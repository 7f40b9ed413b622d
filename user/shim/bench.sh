#!/usr/bin/env bash
# MPI_Allreduce with and without libkcoll_mpi.so, same run, same machine:
# Open MPI's anchor benchmark (mpi-coll-bench) twice per rank count and buffer
# kind, the second time with the shim preloaded; the same binary and
# arguments both times. ROUNDS rounds, the order of the runs rotating per
# round; prints every run's table, then min / median busbw per size and the
# ratios shim / MPI. Needs a kcolld on $KCOLL_SOCKET.
#   user/shim/bench.sh [BUILD] [NP...]    (default: build, 2 4)
#   env: BENCH_ARGS (default "-b 1K -e 64M -f 4 -n 20 -w 5 -c 1 -d f32 -o sum"),
#        BENCH_MEM (default "malloc alloc-mem"; also "huge": aligned_alloc
#        buffers advised MADV_HUGEPAGE, Open MPI alone on the huge pages the
#        shim's libkcoll collapses malloc buffers into (KCOLL_THP_MIN_BYTES),
#        so the table shows how much of the gain huge pages alone give MPI),
#        ROUNDS (default 1), BENCH_JSON (a file: every run's JSON there),
#        KCOLL_MPI_MIN_BYTES (default here 64K, so the sweep shows where kcoll
#        pays off; the shim's own default is 16M)
set -euo pipefail
build=${1:-build}; shift || true
nps=("$@"); [ ${#nps[@]} -eq 0 ] && nps=(2 4)
read -r -a args <<<"${BENCH_ARGS:--b 1K -e 64M -f 4 -n 20 -w 5 -c 1 -d f32 -o sum}"
read -r -a mems <<<"${BENCH_MEM:-malloc alloc-mem}"
rounds=${ROUNDS:-1}
shim="$(cd "$build/lib" && pwd)/libkcoll_mpi.so"
# shellcheck disable=SC2054  # "self,vader" is one argument
mpi=(mpirun --oversubscribe --mca mpi_yield_when_idle 1 --mca btl self,vader)
[ "$(id -u)" -eq 0 ] && mpi+=(--allow-run-as-root)
: "${KCOLL_SOCKET:?start kcolld and export KCOLL_SOCKET}"
export KCOLL_MPI_MIN_BYTES=${KCOLL_MPI_MIN_BYTES:-65536}
for mem in "${mems[@]}"; do
	case $mem in malloc | huge | alloc-mem) ;; *)
		echo "bench.sh: BENCH_MEM takes malloc, huge and alloc-mem, not '$mem'" >&2; exit 2 ;;
	esac
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
run=0
one() {	# np mem shim(0/1)
	local extra=() pre=() name
	case $2 in huge) extra=(--huge-pages) ;; alloc-mem) extra=(--alloc-mem) ;; esac
	name="mpi-$2"
	if [ "$3" = 1 ]; then
		pre=(env LD_PRELOAD="$shim")
		name="shim-$2"
		echo "## np $1, $2 buffers: Open MPI + libkcoll_mpi.so (KCOLL_MPI_MIN_BYTES=$KCOLL_MPI_MIN_BYTES)"
	else
		echo "## np $1, $2 buffers: Open MPI alone"
	fi
	"${pre[@]}" "${mpi[@]}" -np "$1" "$build/bin/mpi-coll-bench" allreduce "${args[@]}" "${extra[@]}" \
		--json >"$tmp/out.json"
	printf '{"np": %d, "system": "%s", "round": %d, "result": ' "$1" "$name" "$r" >"$tmp/run-$run.json"
	cat "$tmp/out.json" >>"$tmp/run-$run.json"
	echo "}" >>"$tmp/run-$run.json"
	python3 -c 'import json,sys
for row in json.load(open(sys.argv[1]))["rows"]:
    print("%12d %10.1f us %7.2f GB/s busbw %s wrong" % (row["size"], row["time_us"], row["busbw"], row["wrong"]))' \
		"$tmp/out.json"
	run=$((run + 1))
}
for ((r = 1; r <= rounds; r++)); do
	echo "# round $r/$rounds $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
	for np in "${nps[@]}"; do
		steps=()
		for mem in "${mems[@]}"; do steps+=("$mem 0" "$mem 1"); done
		for ((i = 0; i < ${#steps[@]}; i++)); do
			# shellcheck disable=SC2086  # "mem shim" is two arguments
			one "$np" ${steps[$(((i + r - 1) % ${#steps[@]}))]}
		done
	done
done
[ -n "${BENCH_JSON:-}" ] && cat "$tmp"/run-*.json >"$BENCH_JSON"
python3 - "$tmp" <<'EOF'
import glob, json, os, statistics as st, sys
runs = [json.load(open(f)) for f in sorted(glob.glob(os.path.join(sys.argv[1], "run-*.json")),
                                           key=lambda f: int(f.rsplit("-", 1)[1].split(".")[0]))]
pts, wrong, nr = {}, 0, max(r["round"] for r in runs)
for r in runs:
    for row in r["result"]["rows"]:
        pts.setdefault((r["np"], r["system"], row["size"]), []).append(row["busbw"])
        wrong += row.get("wrong") or 0
order = ["mpi-malloc", "shim-malloc", "mpi-huge", "shim-huge", "mpi-alloc-mem", "shim-alloc-mem"]
def size(b):
    return "%dM" % (b >> 20) if b >= 1 << 20 else "%dK" % (b >> 10) if b >= 1024 else str(b)
print("\nbusbw GB/s, min / median over %d rounds; wrong results: %d" % (nr, wrong))
for np in sorted({k[0] for k in pts}):
    systems = [s for s in order if any(k[:2] == (np, s) for k in pts)]
    sizes = sorted({k[2] for k in pts if k[0] == np})
    pairs = [(s, "mpi-" + s[5:]) for s in systems if s.startswith("shim-") and "mpi-" + s[5:] in systems]
    if "shim-malloc" in systems and "mpi-huge" in systems:
        pairs.append(("shim-malloc", "mpi-huge"))
    print("\nnp %d\n| size | " % np + " | ".join(systems) + " | " +
          " | ".join("%s / %s" % p for p in pairs) + " |")
    print("|---:|" + "---:|" * (len(systems) + len(pairs)))
    for s in sizes:
        cells = ["%.2f / %.2f" % (min(pts[(np, x, s)]), st.median(pts[(np, x, s)])) for x in systems]
        # ratio: each round's shim over the same round's anchor, min / median over rounds
        for a, b in pairs:
            q = sorted(x / y for x, y in zip(pts[(np, a, s)], pts[(np, b, s)]))
            cells.append("%.2fx / %.2fx" % (q[0], st.median(q)))
        print("| %s | " % size(s) + " | ".join(cells) + " |")
EOF
