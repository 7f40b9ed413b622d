#!/usr/bin/env bash
# Draw median busbw vs size from user/shim/bench.sh's BENCH_JSON file (every
# run's JSON document, one after the other): one line per variant and rank
# count, Open MPI alone dashed, with the shim solid.
#   user/shim/plot-bench.sh IN.json [OUT.png]   (default docs/perf/shim-intra.png)
# Needs gnuplot (scripts/deps.sh --bench).
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
in=${1:?usage: user/shim/plot-bench.sh IN.json [OUT.png]}
out=${2:-$top/docs/perf/shim-intra.png}
command -v gnuplot >/dev/null || { echo "plot-bench: gnuplot missing: scripts/deps.sh --bench" >&2; exit 1; }
tmp=$(mktemp -d /tmp/kcoll-shimplot.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
python3 - "$in" "$tmp" "$out" >"$tmp/plot.gp" <<'EOF'
import json, os, statistics, sys
text, tmp, out = open(sys.argv[1]).read(), sys.argv[2], sys.argv[3]
dec, i, runs = json.JSONDecoder(), 0, []
while i < len(text):
    while i < len(text) and text[i].isspace():
        i += 1
    if i < len(text):
        doc, i = dec.raw_decode(text, i)
        runs.append(doc)
pts = {}
for r in runs:
    for row in r["result"]["rows"]:
        pts.setdefault((r["np"], r["system"], row["size"]), []).append(row["busbw"])
names = {"mpi-malloc": "Open MPI, malloc", "shim-malloc": "+shim, malloc",
         "mpi-huge": "Open MPI, malloc on huge pages", "shim-huge": "+shim, malloc on huge pages",
         "mpi-alloc-mem": "Open MPI, MPI_Alloc_mem", "shim-alloc-mem": "+shim, MPI_Alloc_mem"}
colors = {"malloc": "#d62728", "huge": "#ff7f0e", "alloc-mem": "#1f77b4"}
clauses = []
for np in sorted({k[0] for k in pts}):
    for sysname in names:
        sizes = sorted(k[2] for k in pts if k[:2] == (np, sysname))
        if not sizes:
            continue
        path = os.path.join(tmp, "%s-%d.dat" % (sysname, np))
        with open(path, "w") as fh:
            for s in sizes:
                fh.write("%d %g\n" % (s, statistics.median(pts[(np, sysname, s)])))
        kind = sysname.split("-", 1)[1]
        clauses.append("'%s' using 1:2 with linespoints lw 2 pt %d dt %d lc rgb '%s' title 'np %d: %s'"
                       % (path, 7 if np == 2 else 5, 2 if sysname.startswith("mpi") else 1,
                          colors[kind], np, names[sysname]))
rounds = max(r["round"] for r in runs)
print("set terminal pngcairo size 1300,650 noenhanced")
print("set output '%s'" % out)
print("set title 'MPI_Allreduce f32 sum, one host: Open MPI 4.1.4 vs Open MPI + libkcoll_mpi.so "
      "(median of %d rounds)'" % rounds)
print("set logscale x 2\nset xlabel 'message size (bytes)'\nset ylabel 'busbw (GB/s)'")
print("set key outside right\nset grid\nset format x \"%.0b %BB\"")
print("plot " + ", \\\n     ".join(clauses))
EOF
gnuplot "$tmp/plot.gp"
echo "plot-bench: wrote $out"
