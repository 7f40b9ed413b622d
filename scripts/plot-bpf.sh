#!/usr/bin/env bash
# Plot a scripts/bench-bpf.sh result: busbw per round with tracking off and
# on, one panel per size (the rounds alternate off/on, so neighbours are pairs).
#   scripts/plot-bpf.sh [IN.json [OUT.png]]
# IN defaults to the newest docs/perf/bpf-overhead-*.json, OUT to
# docs/perf/bpf-overhead.png. Needs gnuplot (scripts/deps.sh --bench).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/scripts/plot-lib.sh"
plot_begin plot-bpf "$top/docs/perf/bpf-overhead-*.json" "$top/docs/perf/bpf-overhead.png" "run scripts/bench-bpf.sh --json FILE" "$@"
n=$(python3 - "$in" "$tmp" <<'PY'
import json, statistics, sys
d = json.load(open(sys.argv[1]))
for i, r in enumerate(d["results"]):
    with open("%s/%d.dat" % (sys.argv[2], i), "w") as f:
        for k, (a, b) in enumerate(zip(r["off"], r["on"]), 1):
            f.write("%d %f %f\n" % (k, a, b))
    with open("%s/%d.title" % (sys.argv[2], i), "w") as f:
        f.write("%s: median on/off per round %.2f" % (r["size"], statistics.median(r["paired_ratios"])))
print(len(d["results"]))
PY
)
{
	echo "set terminal pngcairo size 1200,400 font ',10'"
	echo "set output '$out'"
	echo "set multiplot layout 1,$n title 'kcoll all-reduce, 4 netns hosts: busbw with the eBPF tracker off and on (same run)'"
	echo "set xlabel 'round'; set ylabel 'busbw (GB/s)'; set yrange [0:*]; set key bottom right"
	for i in $(seq 0 $((n - 1))); do
		echo "set title '$(cat "$tmp/$i.title")'"
		echo "plot '$tmp/$i.dat' using 1:2 with linespoints title 'off', '' using 1:3 with linespoints title 'on'"
	done
	echo "unset multiplot"
} | gnuplot
echo "plot-bpf: wrote $out"
