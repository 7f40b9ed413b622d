#!/usr/bin/env bash
# Multi-host anchors on the netns cluster (scripts/netns-cluster.sh): what the
# established libraries reach over TCP between "hosts", and what the network
# itself can carry, for kcolld's multi-host collectives to be measured against.
#   scripts/cluster-anchors.sh [--kcoll] [BUILD]   (BUILD defaults to build)
# Brings up its own cluster (prefix $KCOLL_CLUSTER_PREFIX, default "kca", so a
# cluster of yours under "kc" is left alone; no kcolld), measures, tears it
# down (also on failure or Ctrl-C), writes docs/perf/cluster-anchors-<date>.json
# and prints a markdown table. Needs root.
#
# --kcoll (what scripts/bench-cluster.sh runs): kcoll too, in the same run and
# rotation: the cluster comes up with a kcolld per host (KCOLL_LOG_LEVEL=warn)
# and `kcoll-bench allreduce --hosts HOSTS -N 1` runs from the root namespace,
# one rank per host started through `netns-cluster.sh exec %h` (zero-copy
# kcoll_mem_alloc buffers; the anchors use malloc'ed ones). The daemons
# advertise only their eth0 address (KCOLL_ADDRS, set by restarting each one),
# so that kcoll, the anchors and the capacity measure share one network. Writes
# docs/perf/allreduce-cluster-<date>.json and .md (the table: busbw per
# library, kcoll / best anchor, kcoll / ring bound) and draws
# docs/perf/allreduce-cluster.png (gnuplot, as scripts/plot-perf.sh; with
# BENCH_BASE the base build's curve too, dashed).
#
# What runs, one process per host, every transfer on eth0 (10.10.0.0/24):
#  - kcoll-tcpcap ring: every host streams to its ring neighbour at once for
#    CAP_SECONDS; per-link rates, aggregate, and the ring all-reduce bound.
#  - Open MPI 4.1 (mpi-coll-bench): mpirun started in host 0's namespace (its
#    daemons must reach it over the cluster network), the other ranks launched
#    through scripts/netns-rsh.sh as plm_rsh_agent; --mca pml ob1 --mca btl
#    self,tcp --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0
#    --mca mpi_yield_when_idle 1 (4 ranks on 2 cores: without it busy polling
#    made 1 KiB take 4.4 ms instead of 67 us here).
#  - Gloo (gloo-allreduce-bench): gloo::allreduce ring over Gloo's TCP device,
#    bound to eth0's address, rendezvous through a FileStore in a /tmp
#    directory (one filesystem for all namespaces). Skipped, with a note, if
#    the binary was not built (libgloo-dev missing).
# f32 sum, 1 KiB..256 MiB x4, results checked. Each library runs the sweep in
# two parts, SMALL_ITERS iterations up to 1 MiB and LARGE_ITERS from 4 MiB (a
# 256 MiB all-reduce takes about a second here). ROUNDS rounds, the libraries'
# order rotating by one each round (with two: alternating); the summary keeps
# the best round per point (other load only slows a point down) and the
# median; the JSON keeps every raw run.
#
# The bound: in a ring all-reduce of S bytes over n hosts every host sends
# 2(n-1)/n * S bytes to its neighbour, all links at once, each step waiting
# for the slowest link; with B the per-link rate when all links stream at once
# (kcoll-tcpcap ring's slowest link), t >= 2(n-1)/n * S / B, so
# busbw = 2(n-1)/n * S / t <= B. On this VM B is bounded by the 2 CPUs that
# every "link" shares, not by the veths, and the reduction's own CPU work
# comes on top: the bound is not reachable, it is the ceiling.
#
# Environment: ROUNDS (3), HOSTS (4), CAP_SECONDS (3), SMALL_ITERS (20),
# LARGE_ITERS (5), BENCH_OUT (docs/perf), KCOLL_CLUSTER_PREFIX (kca);
# with --kcoll also KCOLL_MEM (shm; host: malloc'ed buffers, one copy),
# KCOLL_NETS (eth0; all: kcolld's default, every interface: eth0 and eth1,
# which the ring bound does not cover) and KCOLL_BENCH_EXTRA (more kcoll-bench
# options; "-s /run/kcoll-kca/h0/kcolld.sock" puts every rank on host 0's
# daemon: only to test the launcher) and BENCH_BASE=DIR (a second build dir,
# e.g. an older commit's build: an A/B in one run; DIR's kcolld on every host
# and DIR's kcoll-bench are measured as library "base" in the same rotation,
# the daemons restarted from the other build whenever the rotation switches;
# the table gains base busbw, base / best anchor and kcoll / base).
# Bounded: about 2-3 minutes with the defaults (4-5 with --kcoll); every
# command under a timeout.
set -euo pipefail

with_kcoll=0
if [ "${1:-}" = --kcoll ]; then
	with_kcoll=1
	shift
fi
BUILD=${1:-build}
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/scripts/plot-lib.sh"	# plot_py, plot_busbw
. "$top/scripts/bench-lib.sh"	# bench_tcpcap_ring
cd "$top"
bin="$top/$BUILD/bin"
export KCOLL_CLUSTER_PREFIX=${KCOLL_CLUSTER_PREFIX:-kca}
export KCOLL_BUILD="$top/$BUILD"
rounds=${ROUNDS:-3}
hosts=${HOSTS:-4}
cap_seconds=${CAP_SECONDS:-3}
small_iters=${SMALL_ITERS:-20}
large_iters=${LARGE_ITERS:-5}
outdir=${BENCH_OUT:-docs/perf}
stamp=$(date +%Y-%m-%d-%H%M)
json="$outdir/cluster-anchors-$stamp.json"
if [ "$with_kcoll" -eq 1 ]; then
	json="$outdir/allreduce-cluster-$stamp.json"
	table="$outdir/allreduce-cluster-$stamp.md"
	png="$outdir/allreduce-cluster.png"
fi
kcoll_mem=${KCOLL_MEM:-shm}
kcoll_nets=${KCOLL_NETS:-eth0}
read -r -a kcoll_extra <<<"${KCOLL_BENCH_EXTRA:-}"
cluster="$top/scripts/netns-cluster.sh"
rsh="$top/scripts/netns-rsh.sh"
port=17660

die() { echo "cluster-anchors: $*" >&2; exit 1; }
note() { echo "cluster-anchors: $*" >&2; }

[ "$(id -u)" -eq 0 ] || die "needs root (it builds a cluster of network namespaces): run it with sudo"
[ -x "$bin/kcoll-tcpcap" ] || die "$bin/kcoll-tcpcap missing: run make"
command -v python3 >/dev/null || die "python3 is needed to merge the JSON results"
have_mpi=0 have_gloo=0
if [ -x "$bin/mpi-coll-bench" ] && command -v mpirun >/dev/null; then
	have_mpi=1
else
	note "no mpirun or $bin/mpi-coll-bench: Open MPI skipped"
fi
if [ -x "$bin/gloo-allreduce-bench" ]; then
	have_gloo=1
else
	note "no $bin/gloo-allreduce-bench (needs libgloo-dev: scripts/deps.sh --bench, then make): Gloo skipped"
fi
if [ "$with_kcoll" -eq 1 ]; then
	for b in kcoll-bench kcolld; do [ -x "$bin/$b" ] || die "$bin/$b missing: run make"; done
	case "$kcoll_nets" in eth0 | all) ;; *) die "KCOLL_NETS is eth0 or all, not '$kcoll_nets'" ;; esac
	command -v gnuplot >/dev/null || note "no gnuplot (scripts/deps.sh --bench): no plot"
fi
base_build=
if [ -n "${BENCH_BASE:-}" ]; then
	[ "$with_kcoll" -eq 1 ] || die "BENCH_BASE needs --kcoll"
	base_build=$(cd "$BENCH_BASE" && pwd)
	for b in kcoll-bench kcolld; do
		[ -x "$base_build/bin/$b" ] || die "$base_build/bin/$b missing: build BENCH_BASE"
	done
fi

tmp=$(mktemp -d /tmp/kcoll-cluster-anchors.XXXXXX)
chmod 755 "$tmp"
cleanup() {
	"$cluster" down >/dev/null 2>&1 || note "could not take cluster '$KCOLL_CLUSTER_PREFIX' down"
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$cluster" down >/dev/null 2>&1 || true
if [ "$with_kcoll" -eq 1 ]; then
	export KCOLL_LOG_LEVEL=warn
	"$cluster" up -H "$hosts" >&2
	if [ "$kcoll_nets" = eth0 ]; then
		for ((i = 0; i < hosts; i++)); do
			KCOLL_ADDRS=10.10.0.$((i + 1)) "$cluster" restart "$i" >&2
		done
	fi
	unset KCOLL_LOG_LEVEL
else
	"$cluster" up -H "$hosts" --no-daemon >&2
fi

addrs=()
for ((i = 0; i < hosts; i++)); do addrs+=("10.10.0.$((i + 1))"); done
addr_list=$(IFS=,; echo "${addrs[*]}")
hostfile="$tmp/hostfile"
for a in "${addrs[@]}"; do echo "$a slots=1"; done >"$hostfile"

# shellcheck disable=SC2054  # "self,tcp" is one argument
mpirun_args=(mpirun --allow-run-as-root --hostfile "$hostfile" --mca plm_rsh_agent "$rsh"
	     --mca pml ob1 --mca btl self,tcp --mca btl_tcp_if_include eth0
	     --mca oob_tcp_if_include eth0 --mca mpi_yield_when_idle 1 -np "$hosts")
sweep_small=(allreduce -b 1K -e 1M -f 4 -n "$small_iters" -w 3 -c 1 -d f32 -o sum --json)
sweep_large=(allreduce -b 4M -e 256M -f 4 -n "$large_iters" -w 1 -c 1 -d f32 -o sum --json)

run=0
record() {	# round system file: tag a tool's JSON document
	printf '{"round": %s, "system": "%s", "result": ' "$1" "$2" >"$tmp/run-$run.json"
	cat "$3" >>"$tmp/run-$run.json"
	echo "}" >>"$tmp/run-$run.json"
	run=$((run + 1))
}

capacity() {	# round
	bench_tcpcap_ring "$tmp/cap.json" "$addr_list" "$port" "$cap_seconds"
	record "$1" tcpcap "$tmp/cap.json"
}

openmpi() {	# round part args...
	local out="$tmp/mpi.json"
	timeout -k 10 240 "$cluster" exec 0 "${mpirun_args[@]}" "$bin/mpi-coll-bench" "${@:3}" \
		>"$out" 2>"$tmp/mpi.err" || { cat "$tmp/mpi.err" >&2; die "Open MPI $2 sweep failed"; }
	record "$1" openmpi "$out"
}

gloo() {	# round part args...
	local out="$tmp/gloo.json" store="$tmp/store-$1-$2" pids=() i rc=0
	mkdir -p "$store"
	for ((i = 1; i < hosts; i++)); do
		timeout -k 5 240 "$cluster" exec "$i" "$bin/gloo-allreduce-bench" "${@:3}" -N "$hosts" \
			--rank "$i" --store "$store" --host "${addrs[$i]}" --timeout 60 \
			>/dev/null 2>"$tmp/gloo-$i.err" &
		pids+=($!)
	done
	timeout -k 5 240 "$cluster" exec 0 "$bin/gloo-allreduce-bench" "${@:3}" -N "$hosts" \
		--rank 0 --store "$store" --host "${addrs[0]}" --timeout 60 >"$out" \
		2>"$tmp/gloo-0.err" || rc=1
	for p in "${pids[@]}"; do wait "$p" || rc=1; done
	[ "$rc" -eq 0 ] || { cat "$tmp"/gloo-*.err >&2; die "Gloo $2 sweep failed"; }
	record "$1" gloo "$out"
}

# kcoll-bench's parent runs here, in the root namespace: it asks host 0's
# daemon for the id and starts each rank on its host through the launcher.
kcoll_opts=(--hosts "$hosts" -N 1 --mem "$kcoll_mem" --launch "$cluster exec %h" "${kcoll_extra[@]}")
kcoll_cmd=("$bin/kcoll-bench" "${kcoll_opts[@]}")
daemons_of=$KCOLL_BUILD
daemons() {	# build dir: every host's kcolld from that build (as at start-up)
	local i
	[ "$daemons_of" = "$1" ] && return 0
	for ((i = 0; i < hosts; i++)); do
		if [ "$kcoll_nets" = eth0 ]; then
			KCOLL_BUILD=$1 KCOLL_LOG_LEVEL=warn KCOLL_ADDRS=10.10.0.$((i + 1)) \
				"$cluster" restart "$i" >&2
		else
			KCOLL_BUILD=$1 KCOLL_LOG_LEVEL=warn "$cluster" restart "$i" >&2
		fi || die "cannot start $1's kcolld on host $i"
	done
	daemons_of=$1
}
kcoll() {	# round part args...
	daemons "$KCOLL_BUILD"
	kcoll_sys kcoll "$bin/kcoll-bench" "$@"
}
base() {	# round part args...: BENCH_BASE's daemons and kcoll-bench
	daemons "$base_build"
	kcoll_sys base "$base_build/bin/kcoll-bench" "$@"
}
kcoll_sys() {	# system kcoll-bench round part args...
	local sys=$1 cmd=$2 out="$tmp/kcoll.json" i
	shift 2
	if ! timeout -k 10 240 "$cmd" "${kcoll_opts[@]}" "${@:3}" >"$out" 2>"$tmp/kcoll.err"; then
		cat "$tmp/kcoll.err" >&2
		for ((i = 0; i < hosts; i++)); do
			tail -n 5 "/run/kcoll-$KCOLL_CLUSTER_PREFIX/h$i/kcolld.log" 2>/dev/null |
				sed "s/^/kcolld h$i: /" >&2 || true
		done
		die "$sys $2 sweep failed"
	fi
	record "$1" "$sys" "$out"
}

kcoll_desc=
if [ "$with_kcoll" -eq 1 ]; then
	kcoll_desc="$(printf '%q ' "${kcoll_cmd[@]}")allreduce ..."
fi

systems=()
[ "$with_kcoll" -eq 1 ] && systems+=(kcoll)
[ -n "$base_build" ] && systems+=(base)
[ "$have_mpi" -eq 1 ] && systems+=(openmpi)
[ "$have_gloo" -eq 1 ] && systems+=(gloo)
[ ${#systems[@]} -gt 0 ] || note "no library to measure: capacity only"
start=$SECONDS
for r in $(seq "$rounds"); do
	# Round r starts one further along the list: every library takes every
	# place in the order once per ${#systems[@]} rounds.
	order=()
	for ((i = 0; i < ${#systems[@]}; i++)); do
		order+=("${systems[$(((r - 1 + i) % ${#systems[@]}))]}")
	done
	note "round $r/$rounds: capacity ($cap_seconds s), then ${order[*]:-nothing}"
	capacity "$r"
	for sys in "${order[@]}"; do
		"$sys" "$r" small "${sweep_small[@]}"
		"$sys" "$r" large "${sweep_large[@]}"
	done
done
note "measured in $((SECONDS - start)) s"

mkdir -p "$outdir"
python3 - "$tmp" "$json" "$rounds" "$hosts" "${mpirun_args[*]} $bin/mpi-coll-bench" \
	"gloo-allreduce-bench allreduce -N $hosts --rank R --store DIR --host 10.10.0.(R+1)" \
	"kcoll-tcpcap ring -r R $addr_list -t $cap_seconds" \
	"$kcoll_desc" "$kcoll_mem" "$kcoll_nets" "$base_build" <<'EOF'
import glob, json, os, platform, statistics, sys, time

tmp, out, rounds, hosts = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
cmd_mpi, cmd_gloo, cmd_cap, cmd_kcoll, kcoll_mem, kcoll_nets, base = sys.argv[5:12]
runs = []
for f in sorted(glob.glob(os.path.join(tmp, "run-*.json")),
                key=lambda p: int(p.rsplit("-", 1)[1].split(".")[0])):
    with open(f) as fh:
        runs.append(json.load(fh))

points = {}	# (system, size) -> [rows]
caps = []
for run in runs:
    if run["system"] == "tcpcap":
        caps.append(run["result"])
        continue
    for row in run["result"]["rows"]:
        points.setdefault((run["system"], row["size"]), []).append(row)

summary = []
for (system, size), rows in sorted(points.items()):
    best = min(rows, key=lambda r: r["time_us"])
    summary.append({
        "system": system, "N": hosts, "size": size,
        "time_us": best["time_us"], "algbw": best["algbw"], "busbw": best["busbw"],
        "time_us_median": statistics.median(r["time_us"] for r in rows),
        "busbw_median": statistics.median(r["busbw"] for r in rows),
        "wrong": sum(r["wrong"] or 0 for r in rows),
        "samples": len(rows),
    })

def best_med(key):
    v = [c[key] for c in caps]
    return {"best": max(v), "median": statistics.median(v)} if v else None

commands = {"openmpi": cmd_mpi, "gloo": cmd_gloo, "capacity": cmd_cap}
doc = {
    "tool": "scripts/cluster-anchors.sh" + (" --kcoll" if cmd_kcoll else ""),
    "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    "host": platform.node(), "kernel": platform.release(), "cpus": os.cpu_count(),
    "hosts": hosts,
    "network": "netns cluster (scripts/netns-cluster.sh): one veth per host into a bridge, "
               "eth0 10.10.0.0/24, no qdisc",
    "collective": "allreduce", "dtype": "f32", "op": "sum", "mem": "host",
    "rounds": rounds,
    "commands": commands,
    "capacity": {
        "aggregate_GBps": best_med("aggregate_GBps"),
        "min_link_GBps": best_med("min_link_GBps"),
        "ring_allreduce_busbw_bound_GBps": best_med("ring_allreduce_busbw_bound_GBps"),
        "bound_formula": "busbw = 2(n-1)/n * S / t <= B, B = slowest link while all links "
                         "stream at once (each ring step waits for the slowest link)",
    },
    "note": "summary: best round (and median) per point; the libraries' order rotates "
            "round by round",
    "summary": summary, "runs": runs,
}
if cmd_kcoll:
    commands["kcoll"] = cmd_kcoll
    versions = {r["result"].get("version") for r in runs if r["system"] == "kcoll"}
    doc["kcoll"] = {"mem": kcoll_mem, "daemons": "one kcolld per host, KCOLL_LOG_LEVEL=warn",
                    "networks": "eth0 (KCOLL_ADDRS=10.10.0.(i+1))" if kcoll_nets == "eth0"
                                else "every interface (eth0 and eth1)",
                    "version": sorted(v for v in versions if v)}
    if base:
        doc["kcoll"]["base"] = base	# library "base": this build's kcollds and kcoll-bench
with open(out, "w") as fh:
    json.dump(doc, fh, indent=1)
    fh.write("\n")
EOF
note "wrote $json"

# The markdown table: the anchors alone, or (--kcoll) kcoll beside them.
python3 - "$json" <<'EOF' | if [ "$with_kcoll" -eq 1 ]; then tee "$table"; else cat; fi
import json, sys

doc = json.load(open(sys.argv[1]))
pt = {(s["system"], s["size"]): s for s in doc["summary"]}
sizes = sorted({s["size"] for s in doc["summary"]})
cap = doc["capacity"]
bound = cap["ring_allreduce_busbw_bound_GBps"]
agg = cap["aggregate_GBps"]
anchors = {"openmpi": "Open MPI", "gloo": "Gloo"}

def human(b):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return "%d %s" % (b >> shift, unit)
    return "%d B" % b

def cell(system, size, key, fmt):
    s = pt.get((system, size))
    return fmt % s[key] if s else "-"

def row(cells):
    print("| " + " | ".join(cells) + " |")

print("All-reduce f32 sum across %d netns hosts over TCP (eth0), best of %d rounds, %s, "
      "%d CPUs, %s" % (doc["hosts"], doc["rounds"], doc["host"], doc["cpus"], doc["date"]))
print()
if "kcoll" in doc:
    base = "base" in doc["kcoll"]
    head = ["size", "kcoll busbw", "Open MPI busbw", "Gloo busbw", "kcoll time (us)",
            "best anchor time (us)", "kcoll / best anchor", "kcoll / ring bound"]
    if base:
        head += ["base busbw", "base / best anchor", "kcoll / base"]
    row(head)
    print("|" + "|".join(["---:"] * len(head)) + "|")
    for size in sizes:
        k = pt.get(("kcoll", size))
        best = max((pt[(a, size)] for a in anchors if (a, size) in pt),
                   key=lambda s: s["busbw"], default=None)
        ratio = "-"
        if k and best and best["busbw"] > 0:
            ratio = "%.2f (%s)" % (k["busbw"] / best["busbw"], anchors[best["system"]])
        cells = [human(size), cell("kcoll", size, "busbw", "%.3f"),
                 cell("openmpi", size, "busbw", "%.3f"), cell("gloo", size, "busbw", "%.3f"),
                 cell("kcoll", size, "time_us", "%.1f"),
                 "%.1f" % best["time_us"] if best else "-", ratio,
                 "%.2f" % (k["busbw"] / bound["best"]) if k and bound else "-"]
        if base:
            b = pt.get(("base", size))
            cells += [cell("base", size, "busbw", "%.3f"),
                      "%.2f" % (b["busbw"] / best["busbw"]) if b and best and best["busbw"] > 0
                      else "-",
                      "%.2f" % (k["busbw"] / b["busbw"]) if k and b and b["busbw"] > 0 else "-"]
        row(cells)
    print()
    print("busbw in GB/s. kcoll: kcoll-bench --hosts %d -N 1, one kcolld per host on %s, %s "
          "buffers (%s); the anchors: malloc'ed buffers, eth0. Ratios of busbw (above 1: kcoll "
          "faster)." % (doc["hosts"], doc["kcoll"]["networks"], doc["kcoll"]["mem"],
                        "kcoll_mem_alloc, zero-copy" if doc["kcoll"]["mem"] == "shm"
                        else "one copy"))
    if base:
        print("base: %s, its kcolld on every host, same rotation." % doc["kcoll"]["base"])
else:
    head = ["size", "Open MPI busbw", "Open MPI time (us)", "Gloo busbw", "Gloo time (us)",
            "raw aggregate", "ring bound"]
    row(head)
    print("|" + "|".join(["---:"] * len(head)) + "|")
    for size in sizes:
        row([human(size),
             cell("openmpi", size, "busbw", "%.3f"), cell("openmpi", size, "time_us", "%.1f"),
             cell("gloo", size, "busbw", "%.3f"), cell("gloo", size, "time_us", "%.1f"),
             "%.3f" % agg["best"] if agg else "-",
             "%.3f" % bound["best"] if bound else "-"])
    print()
if bound:
    print("GB/s throughout. Raw TCP capacity (kcoll-tcpcap ring, every host streaming "
          "to its neighbour at once): aggregate %.3f GB/s (median %.3f), slowest link %.3f GB/s "
          "(median %.3f) = ring all-reduce busbw bound: busbw = 2(n-1)/n * S / t <= B."
          % (agg["best"], agg["median"], bound["best"], bound["median"]))
wrong = sum(s["wrong"] for s in doc["summary"])
print("Results checked: %s." % ("all correct" if not wrong else "%d WRONG elements" % wrong))
EOF
[ "$with_kcoll" -eq 1 ] && note "wrote $table"

# The plot (--kcoll): busbw vs size per library, the ring bound dashed
# (scripts/plot-lib.sh's plot_py and plot_busbw, as in scripts/plot-perf.sh).
if [ "$with_kcoll" -eq 1 ] && command -v gnuplot >/dev/null; then
	plot_py - "$json" "$tmp" >"$tmp/plot.gp" <<'EOF'
import json, os, sys

from plot_axis import size_axis

doc = json.load(open(sys.argv[1]))
tmp = sys.argv[2]
names = {"kcoll": "kcoll", "base": "kcoll, base build", "openmpi": "Open MPI",
         "gloo": "Gloo"}
colors = {"kcoll": "#1f77b4", "base": "#6baed6", "openmpi": "#d62728", "gloo": "#2ca02c"}
clauses = []
for system in ("kcoll", "base", "openmpi", "gloo"):
    pts = sorted((s["size"], s["busbw"]) for s in doc["summary"] if s["system"] == system)
    if not pts:
        continue
    path = os.path.join(tmp, "%s.dat" % system)
    with open(path, "w") as fh:
        for size, bw in pts:
            fh.write("%d %g\n" % (size, bw))
    clauses.append("'%s' using 1:2 with linespoints lw 2 pt %d ps 0.6 lc rgb '%s'%s title '%s'"
                   % (path, 6 if system == "base" else 7, colors[system],
                      " dt 2" if system == "base" else "", names[system]))
bound = doc["capacity"]["ring_allreduce_busbw_bound_GBps"]
if bound:
    clauses.append("%g with lines dt 2 lw 2 lc rgb '#555555' title 'ring bound (kcoll-tcpcap: "
                   "slowest link while all stream)'" % bound["best"])
sizes = sorted({s["size"] for s in doc["summary"]})
ymax = max([s["busbw"] for s in doc["summary"]] + [bound["best"] if bound else 0, 0.1]) * 1.15
print("set yrange [0:%g]" % ymax)
print(size_axis(sizes))
print("set title 'All-reduce %s %s across %d netns hosts over TCP, busbw vs size, best of %d "
      "rounds (%s, %s CPUs, %s)' noenhanced"
      % (doc["dtype"], doc["op"], doc["hosts"], doc["rounds"], doc["host"], doc["cpus"],
         doc["date"][:10]))
print("plot " + ", \\\n     ".join(clauses))
EOF
	plot_busbw "$png" "$tmp/plot.gp"
	note "drew $png"
fi
