#!/usr/bin/env bash
# Draw busbw vs size (log x) from a scripts/bench-intra.sh result: one line per
# system and N, plus the memcpy reference (its copy bandwidth) dashed.
#   scripts/plot-perf.sh [IN.json [OUT.png]]
# IN defaults to the newest docs/perf/intra-*.json, OUT to
# docs/perf/allreduce-intra.png. Needs gnuplot (scripts/deps.sh --bench).
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/scripts/plot-lib.sh"
plot_begin plot-perf "$top/docs/perf/intra-*.json" "$top/docs/perf/allreduce-intra.png" "run scripts/bench-intra.sh" "$@"

# One data file per series ("size busbw"), and a gnuplot plot clause naming them.
plot_py - "$in" "$tmp" >"$tmp/plot.gp" <<'EOF'
import json, os, sys

from plot_axis import size_axis

doc = json.load(open(sys.argv[1]))
tmp = sys.argv[2]
series = {}
for s in doc["summary"]:
    if s["size"] <= 8:		# the latency point is not part of the sweep
        continue
    series.setdefault((s["system"], s["N"]), []).append(
        (s["size"], s["algbw"] if s["system"] == "memcpy" else s["busbw"]))

names = {"kcoll": "kcoll", "openmpi": "Open MPI", "memcpy": "memcpy (copy GB/s, clipped)"}
colors = {"kcoll": ["#1f77b4", "#0b3d91", "#6baed6"], "openmpi": ["#d62728", "#8c1c13", "#fc9272"],
          "memcpy": ["#555555"]}
order = {"kcoll": 0, "openmpi": 1, "memcpy": 2}
clauses = []
for (system, n) in sorted(series, key=lambda k: (order.get(k[0], 9), k[1])):
    path = os.path.join(tmp, "%s-%d.dat" % (system, n))
    with open(path, "w") as fh:
        for size, bw in sorted(series[(system, n)]):
            fh.write("%d %g\n" % (size, bw))
    pal = colors.get(system, ["#000000"])
    idx = sum(1 for c in clauses if c[0] == system)
    title = names.get(system, system) + ("" if system == "memcpy" else " N=%d" % n)
    dash = "dt 2" if system == "memcpy" else "dt 1"
    clauses.append((system, "'%s' using 1:2 with linespoints lw 2 pt 7 ps 0.6 %s lc rgb '%s' "
                    "title '%s'" % (path, dash, pal[idx % len(pal)], title)))
# memcpy in cache runs far above any collective: clip the y range to the
# collectives, but keep memcpy's largest (DRAM) size in view.
coll = [bw for (system, _), pts in series.items() if system != "memcpy" for _, bw in pts]
dram = [max(pts)[1] for (system, _), pts in series.items() if system == "memcpy"]
ymax = max(coll + dram + [0.1]) * 1.15
print("set yrange [0:%g]" % ymax)
sizes = sorted({size for pts in series.values() for size, _ in pts})
print(size_axis(sizes))
print("set title 'All-reduce %s %s, busbw vs size, best of %s rounds (%s, %s CPUs, %s)' noenhanced"
      % (doc.get("dtype", "f32"), doc.get("op", "sum"), doc.get("rounds", "?"),
         doc.get("host", "?"), doc.get("cpus", "?"), doc.get("date", "?")[:10]))
print("plot " + ", \\\n     ".join(c[1] for c in clauses))
EOF

plot_busbw "$out" "$tmp/plot.gp"
