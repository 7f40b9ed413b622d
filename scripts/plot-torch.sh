#!/usr/bin/env bash
# Draw torch.distributed all_reduce busbw vs size (log x) from a
# scripts/bench-torch.sh result: the kcoll backend and gloo, one line per N,
# and dashed the kcoll backend on tensors in kcolld-mapped memory and on
# plain tensors with sharing off (copied by kcolld); a
# --cluster result says so in the title.
#   scripts/plot-torch.sh [IN.json [OUT.png]]
# IN defaults to the newest docs/perf/torch-*.json, OUT to
# docs/perf/torch-allreduce.png. Needs gnuplot (scripts/deps.sh --bench).
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/scripts/plot-lib.sh"
plot_begin plot-torch "$top/docs/perf/torch-*.json" "$top/docs/perf/torch-allreduce.png" \
	"run scripts/bench-torch.sh" "$@"

# One data file per series ("size busbw"), and a gnuplot plot clause naming them.
plot_py - "$in" "$tmp" >"$tmp/plot.gp" <<'EOF'
import json, os, sys

from plot_axis import size_axis

doc = json.load(open(sys.argv[1]))
tmp = sys.argv[2]
series = {}
for s in doc["summary"]:
    if s["part"] == "sweep" and s["system"] in ("kcoll", "gloo", "kcoll_shm", "kcoll_copy"):
        series.setdefault((s["system"], s["N"]), []).append((s["size"], s["busbw"]))
if not series:
    sys.exit("plot-torch: no sweep in %s" % sys.argv[1])

names = {"kcoll": "torch, kcoll backend", "gloo": "torch, gloo",
         "kcoll_shm": "torch, kcoll backend, kcolld-mapped tensors",
         "kcoll_copy": "torch, kcoll backend, plain tensors copied (sharing off)"}
colors = {"kcoll": ["#1f77b4", "#0b3d91"], "gloo": ["#d62728", "#8c1c13"],
          "kcoll_shm": ["#6baed6", "#3182bd"], "kcoll_copy": ["#2ca02c", "#176117"]}
order = {"kcoll": 0, "gloo": 1, "kcoll_shm": 2, "kcoll_copy": 3}
clauses = []
for (system, n) in sorted(series, key=lambda k: (order[k[0]], k[1])):
    path = os.path.join(tmp, "%s-%d.dat" % (system, n))
    with open(path, "w") as fh:
        for size, bw in sorted(series[(system, n)]):
            fh.write("%d %g\n" % (size, bw))
    idx = sum(1 for c in clauses if c[0] == system)
    dash = "dt 2" if system in ("kcoll_shm", "kcoll_copy") else "dt 1"
    clauses.append((system, "'%s' using 1:2 with linespoints lw 2 pt 7 ps 0.6 %s lc rgb '%s' "
                    "title '%s N=%d'" % (path, dash, colors[system][idx % 2], names[system], n)))
ymax = max(bw for pts in series.values() for _, bw in pts) * 1.15
print("set yrange [0:%g]" % ymax)
sizes = sorted({size for pts in series.values() for size, _ in pts})
print(size_axis(sizes))
where = (", one rank on each of %d netns hosts" % doc["cluster_hosts"]) if doc.get("cluster_hosts") else ""
print("set title 'torch.distributed all_reduce f32 sum%s, busbw vs size, best of %s rounds "
      "(%s, %s CPUs, torch %s, %s)' noenhanced"
      % (where, doc.get("rounds", "?"), doc.get("host", "?"), doc.get("cpus", "?"), doc.get("torch", "?"),
         doc.get("date", "?")[:10]))
print("plot " + ", \\\n     ".join(c[1] for c in clauses))
EOF

plot_busbw "$out" "$tmp/plot.gp"
