#!/usr/bin/env bash
# Draw KV-cache transfer throughput vs block size (log x, batches of 64
# blocks) from a scripts/bench-kv.sh result: across namespaces kcoll (and the
# A/B base build when the run had one) beside its two ceilings measured in
# the same run, the raw TCP anchor (same batches, no kcolld) and iperf3, as
# medians over the rounds; same host kcoll beside memcpy when part 1 ran.
# From a scripts/bench-kv-rdma-vm.sh result (kv-rdma-vm-*.json): kcoll over
# rxe beside ib_write_bw at the same message size.
#   scripts/plot-kv.sh [IN.json [OUT.png]]
# IN defaults to the newest docs/perf/kv-*.json, OUT to docs/perf/kv.png.
# Needs gnuplot (scripts/deps.sh --bench).
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/scripts/plot-lib.sh"
plot_begin plot-kv "$top/docs/perf/kv-2*.json" "$top/docs/perf/kv.png" "run scripts/bench-kv.sh" "$@"

# One data file per series ("block GB/s") and the gnuplot plot clause.
python3 - "$in" "$tmp" "$(basename "$in")" >"$tmp/plot.gp" <<'EOF'
import json, os, statistics, sys

doc = json.load(open(sys.argv[1]))
tmp = sys.argv[2]
med = statistics.median
series = []		# (panel, title, style, [(block, GB/s)])

def rows64(rows):
    return [r for r in rows if r["batch"] == 64]

def rounds(key):
    """Median GB/s per block over the rounds of a *_rounds list."""
    rs = doc.get(key) or []
    if not rs:
        return []
    out = []
    for i, r0 in enumerate(rs[0]):
        if r0["batch"] != 64:
            continue
        out.append((r0["block"], med(r[i]["GBps"] for r in rs)))
    return out

ips = doc.get("iperf3_GBps") or []
net = rounds("net_rounds")
if net:
    b = doc.get("builds", {})
    series.append(("net", "kcoll (%s)" % b.get("net", "build"), "lw 2 lc rgb '#1f77b4' pt 7", net))
    base = rounds("base_rounds")
    if base:
        series.append(("net", "kcoll, base build (%s)" % b.get("base"), "lw 2 lc rgb '#6baed6' pt 6 dt 2", base))
    series.append(("net", "raw TCP anchor, same batches", "lw 2 lc rgb '#d62728' pt 5", rounds("rawtcp_rounds")))
    if ips:
        ceil = med(max(ips[r], ips[r + 1]) for r in range(len(ips) - 1))
        series.append(("net", "iperf3 -P %d (median ceiling)" % doc.get("iperf3_streams", 4),
                       "lw 1 lc rgb '#555555' dt 3 pt 0", [(x, ceil) for x, _ in net]))
shm = rows64(doc.get("local-shm", {}).get("rows", []))
if shm:
    series.append(("local", "kcoll (kcoll_mem_alloc buffers)", "lw 2 lc rgb '#1f77b4' pt 7",
                   [(r["block"], r["GBps"]) for r in shm]))
    series.append(("local", "memcpy of the same batches", "lw 2 lc rgb '#d62728' pt 5",
                   [(r["block"], r["memcpy_GBps"]) for r in shm]))
# scripts/bench-kv-rdma-vm.sh's result: kcoll over rxe beside ib_write_bw
rd = doc.get("kvbench", {}).get("large", {}).get("rows", [])
if rd:
    series.append(("rdma", "kcoll over rxe (batches of %d)" % rd[0]["batch"], "lw 2 lc rgb '#1f77b4' pt 7",
                   [(r["block"], r["GBps"]) for r in rd]))
    sm = doc.get("kvbench", {}).get("small", {}).get("rows", [])
    if sm:
        series.append(("rdma", "kcoll over rxe, %d KiB x %d" % (sm[0]["block"] // 1024, sm[0]["batch"]),
                       "lc rgb '#1f77b4' pt 6 ps 1.5", [(r["block"], r["GBps"]) for r in sm]))
    pf = doc.get("ib_write_bw_MBps", {})	# MiB/s, before and after
    series.append(("rdma", "ib_write_bw, same message size (higher reading)", "lw 2 lc rgb '#d62728' pt 5",
                   [(int(k), max(v) * 1048576 / 1e9) for k, v in pf.items() if v]))
clauses = {"net": [], "local": [], "rdma": []}
for k, (panel, title, style, pts) in enumerate(series):
    path = os.path.join(tmp, "s%d.dat" % k)
    with open(path, "w") as fh:
        for x, y in sorted(pts):
            fh.write("%d %g\n" % (x, y))
    clauses[panel].append("'%s' using 1:2 with linespoints %s title '%s'" % (path, style, title))
panels = [(p, t) for p, t in (("net", "across namespaces (TCP between kcollds), medians over rounds"),
                             ("local", "same host"),
                             ("rdma", "Soft-RoCE in the QEMU/TCG guest")) if clauses[p]]
print("set multiplot layout 1,%d title '%s%s'" % (len(panels), "" if rd else "batches of 64 blocks, ",
                                                  sys.argv[3]))
for p, t in panels:
    print("set title '%s'" % t)
    print("plot " + ", \\\n     ".join(clauses[p]))
print("unset multiplot")
EOF

gnuplot <<EOF
set terminal pngcairo size 1300,520 font ",10" noenhanced
set output "$out"
set logscale x 2
set xlabel "block size"
set xtics ("4 KiB" 4096, "16 KiB" 16384, "64 KiB" 65536, "256 KiB" 262144, "1 MiB" 1048576, "4 MiB" 4194304)
set xrange [3000:5600000]
set ylabel "GB/s"
set key bottom right
set grid
set yrange [0:*]
load "$tmp/plot.gp"
EOF
echo "plot-kv: wrote $out"
