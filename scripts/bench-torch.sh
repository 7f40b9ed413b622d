#!/usr/bin/env bash
# The Python layer beside gloo and beside the C path, in one run (issue 21;
# docs/perf/torch.md):
#   sweep    torch.distributed all_reduce f32 SUM, the kcoll backend and gloo
#            in the same processes (scripts/bench_torch_rank.py), N=2 and 4
#            ranks, BENCH_MIN..BENCH_MAX; the kcoll backend on plain tensors
#            as it is (large ones shared with kcolld in place) and with
#            sharing off (kcoll_copy), and on kcolld-mapped tensors
#            (kcoll_shm); beside it kcoll-bench allreduce
#            --mem host and --mem shm (C, the same sizes) as the ceiling of
#            the Python path
#   latency  8 bytes at N=2: the torch path of both backends, the kcoll
#            package without torch (numpy), and kcoll-bench (C)
#   ddp      DistributedDataParallel step time at N=2, kcoll vs gloo (and
#            without DDP: the compute alone)
#   kv       kcoll.kv Agent.write (scripts/bench_kv_agent.py) vs kcoll-kvbench
#            -m local in C, 64 KiB..4 MiB blocks, batches of 64, same host
#            (across two netns hosts: --cluster H with BENCH_PARTS=kv)
#   scripts/bench-torch.sh [BUILD]        (BUILD defaults to build)
#   scripts/bench-torch.sh --cluster H [BUILD]
#            the sweep (default) across H hosts of a netns cluster of its own
#            (scripts/netns-cluster.sh, one kcolld per host; needs root):
#            one rank per host, in the host's namespace, talking to its own
#            kcolld; the store and gloo on eth0; no C rows (kcoll-bench runs
#            its ranks on one daemon). BENCH_MAX defaults to 256M here.
#            Each round also measures the network's bound (kcoll-tcpcap
#            ring: every host streams raw TCP to the next at once; the
#            slowest link bounds a ring all-reduce's busbw).
#            KCOLL_CLUSTER_GSO_BYTES (netns-cluster.sh up --gso) is passed
#            on and recorded (cluster_gso_bytes in the JSON).
#            BENCH_PARTS picks "sweep" (the default), "kv" or both; kv here:
#            a kcoll-kvbench -m target on host 0 (256 MiB, kcolld-mapped),
#            written from host 1 by kcoll-kvbench -m initiator (C) and by
#            bench_kv_agent.py --desc (Python), the same blocks and batches,
#            through the two kcollds over TCP; e.g.
#            BENCH_PARTS=kv scripts/bench-torch.sh --cluster 2
# Writes docs/perf/torch-<date>.json (torch-cluster<H>-<date>.json), draws
# docs/perf/torch-allreduce.png (torch-cluster-allreduce.png) with
# scripts/plot-torch.sh and prints nccl-tests-style tables with the ratios.
#
# Every round starts the torch ranks afresh and runs the C benchmarks beside
# them (C latency, then per N the C sweep and the torch ranks, then the two KV
# benchmarks in alternating order), so that the load of a shared machine
# falls on both; tables give the best round (load only slows a point down)
# and the JSON also the median and every raw run. busbw = 2(n-1)/n x bytes /
# time (nccl-tests); GB = 1e9 bytes.
#
# Environment: KCOLL_SOCKET  use that daemon (else a private kcolld is
#              started and stopped); BENCH_ROUNDS (3), BENCH_MIN (1K),
#              BENCH_MAX (64M), BENCH_FACTOR (4), BENCH_NS ("2 4"),
#              BENCH_PARTS ("sweep latency ddp kv"; "kv": the KV part
#              alone, about 1 minute), BENCH_KV_DURATION (1,
#              seconds per block size), BENCH_KV_BASE (a directory holding
#              another kcoll package, e.g. main's user/python: the kv part
#              also runs bench_kv_agent.py on it, "python_base", for a
#              before/after in the same run), BENCH_OUT (docs/perf), PYTHON
#              (/usr/bin/python3: Debian's, with torch). PYTHONPATH and
#              KCOLL_LIB default to this tree's package and BUILD's libkcoll.
# Bounded: about 3-6 minutes on the 2-core VM with the defaults (each command
# also under a timeout).
set -euo pipefail

hosts=0
if [ "${1:-}" = --cluster ]; then
	hosts=${2:?--cluster needs the number of hosts}
	shift 2
fi
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/scripts/bench-lib.sh"
bench_opts "$@"
BUILD=${1:-build}
bench_build_dir "$top/$BUILD" "$BUILD"
cd "$top"
bin="$top/$BUILD/bin"
rounds=${BENCH_ROUNDS:-3}
min=${BENCH_MIN:-1K}
max=${BENCH_MAX:-64M}
factor=${BENCH_FACTOR:-4}
ns=${BENCH_NS:-2 4}
parts=" ${BENCH_PARTS:-sweep latency ddp kv} "
kvdur=${BENCH_KV_DURATION:-1}
outdir=${BENCH_OUT:-docs/perf}
py=${PYTHON:-/usr/bin/python3}
stamp=$(date -u +%Y-%m-%d-%H%M)
json="$outdir/torch-$stamp.json"
png="$outdir/torch-allreduce.png"
kvblocks=64K,256K,1M,4M
kvbase=${BENCH_KV_BASE:-}
master=127.0.0.1
rank_timeout=300
if [ "$hosts" -gt 0 ]; then
	max=${BENCH_MAX:-256M}
	ns=$hosts
	parts=" ${BENCH_PARTS:-sweep} "
	json="$outdir/torch-cluster$hosts-$stamp.json"
	png="$outdir/torch-cluster-allreduce.png"
	master=10.10.0.1
	rank_timeout=900
fi

die() { echo "bench-torch: $*" >&2; exit 1; }
note() { echo "bench-torch: $*" >&2; }
has() { [[ $parts == *" $1 "* ]]; }

[ -x "$bin/kcoll-bench" ] || die "$bin/kcoll-bench missing: run make"
[ "$hosts" -eq 0 ] || [ "$(id -u)" -eq 0 ] || die "--cluster needs root (network namespaces)"
[ -z "$kvbase" ] || [ -f "$kvbase/kcoll/kv.py" ] || die "BENCH_KV_BASE=$kvbase holds no kcoll/kv.py"
[[ $parts != *" kv "* ]] || [ -x "$bin/kcoll-kvbench" ] || die "$bin/kcoll-kvbench missing: run make"
[ -x "$py" ] || die "$py missing (scripts/deps.sh installs python3, python3-torch)"
export PYTHONPATH=${PYTHONPATH:-$top/user/python}
export KCOLL_LIB=${KCOLL_LIB:-$top/$BUILD/lib/libkcoll.so.1}
"$py" -c 'import torch, numpy, kcoll' || die "$py cannot import torch, numpy and kcoll"

tmp=$(mktemp -d /tmp/kcoll-bench-torch.XXXXXX)
daemon_pid=
rank_pids=()
kvt_pid=
cleanup() {
	local p
	for p in "${rank_pids[@]}" $kvt_pid; do kill "$p" 2>/dev/null || true; done
	[ "$hosts" -eq 0 ] || "$top/scripts/netns-cluster.sh" down >/dev/null 2>&1 || true
	bench_kcolld_stop
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

launch=()
if [ "$hosts" -gt 0 ]; then
	export KCOLL_CLUSTER_PREFIX="bt$$" KCOLL_CLUSTER_RUNDIR="$tmp/run" KCOLL_BUILD="$top/$BUILD"
	chmod 755 "$tmp"
	"$top/scripts/netns-cluster.sh" up -H "$hosts" >"$tmp/up.log" 2>&1 ||
		{ cat "$tmp/up.log" >&2; die "netns-cluster.sh up -H $hosts failed"; }
	export GLOO_SOCKET_IFNAME=eth0
	sock=
else
	bench_kcolld
	export KCOLL_SOCKET=$sock
fi

run=0
record() {	# round part system N file: tag a tool's JSON document
	printf '{"round": %s, "part": "%s", "system": "%s", "N": %s, "result": ' "$1" "$2" "$3" "$4" \
		>"$tmp/run-$run.json"
	cat "$5" >>"$tmp/run-$run.json"
	echo "}" >>"$tmp/run-$run.json"
	run=$((run + 1))
}

cbench() {	# round part system N mem args...: one kcoll-bench allreduce run
	local r=$1 part=$2 system=$3 N=$4 mem=$5
	shift 5
	timeout 120 "$bin/kcoll-bench" allreduce "$@" -c 0 -d f32 -o sum --json -N "$N" \
		--mem "$mem" -s "$sock" >"$tmp/point.json" ||
		die "kcoll-bench -N $N --mem $mem $* failed"
	record "$r" "$part" "$system" "$N" "$tmp/point.json"
}

ranks() {	# round N parts...: the torch ranks, one round
	local r=$1 N=$2 port i fail=0
	shift 2
	port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
	rank_pids=()
	for ((i = 0; i < N; i++)); do
		[ "$hosts" -eq 0 ] || launch=("$top/scripts/netns-cluster.sh" exec "$i")
		RANK=$i LOCAL_RANK=$i WORLD_SIZE=$N MASTER_ADDR=$master MASTER_PORT=$port \
			BENCH_ROUND=$r BENCH_MIN=$min BENCH_MAX=$max BENCH_FACTOR=$factor \
			"${launch[@]}" timeout "$rank_timeout" "$py" "$top/scripts/bench_torch_rank.py" \
			"$tmp/torch.jsonl" "$@" >"$tmp/rank$i.out" 2>&1 &
		rank_pids+=($!)
	done
	for i in "${rank_pids[@]}"; do wait "$i" || fail=1; done
	rank_pids=()
	if [ "$fail" -ne 0 ]; then
		for ((i = 0; i < N; i++)); do sed "s/^/rank $i | /" "$tmp/rank$i.out" | tail -n 15 >&2; done
		die "the torch ranks (N=$N, round $r, $*) failed"
	fi
	grep '^bench_torch_rank:' "$tmp/rank0.out" >&2 || true
}

# Across hosts, the network's own bound in the same round: every host
# streams raw TCP to its ring neighbour at once (kcoll-tcpcap ring, as
# scripts/cluster-anchors.sh does); the slowest link bounds a ring
# all-reduce's busbw, for kcoll and gloo alike.
capacity() {	# round
	local i addrs=()
	for ((i = 0; i < hosts; i++)); do addrs+=("10.10.0.$((i + 1))"); done
	bench_tcpcap_ring "$tmp/cap.json" "$(IFS=,; echo "${addrs[*]}")" 17670 3
	record "$1" cap tcpcap "$hosts" "$tmp/cap.json"
}

# The KV part across hosts: one target on host 0 for every round and system.
kv_target() {
	rm -f "$tmp/kvdesc"
	"$top/scripts/netns-cluster.sh" exec 0 "$bin/kcoll-kvbench" -m target -D "$tmp/kvdesc" -s 256M \
		>"$tmp/kvtarget.out" 2>&1 &
	kvt_pid=$!
	for _ in $(seq 300); do [ -s "$tmp/kvdesc" ] && return; sleep 0.1; done
	cat "$tmp/kvtarget.out" >&2
	die "kcoll-kvbench -m target on host 0 wrote no descriptor"
}

kv() {	# round system [PYTHONPATH]
	local on=() c=(-m local -a none) p=()
	if [ "$hosts" -gt 0 ]; then
		on=("$top/scripts/netns-cluster.sh" exec 1)
		c=(-m initiator -D "$tmp/kvdesc")
		p=(--desc "$tmp/kvdesc")
	fi
	if [ "$2" = c ]; then
		"${on[@]}" timeout 120 "$bin/kcoll-kvbench" "${c[@]}" -b "$kvblocks" -B 64 -d "$kvdur" --json \
			>"$tmp/point.json" 2>"$tmp/kv.err" || { cat "$tmp/kv.err" >&2; die "kcoll-kvbench failed"; }
	else
		PYTHONPATH=${3:-$PYTHONPATH} "${on[@]}" timeout 120 "$py" "$top/scripts/bench_kv_agent.py" \
			"${p[@]}" -b "$kvblocks" -B 64 -d "$kvdur" >"$tmp/point.json" ||
			die "bench_kv_agent.py ($2) failed"
	fi
	record "$1" kv "$2" 1 "$tmp/point.json"
}

if [ "$hosts" -gt 0 ] && has kv; then kv_target; fi
load_start=$(cat /proc/loadavg)
start=$SECONDS
for r in $(seq "$rounds"); do
	note "round $r/$rounds:$parts"
	if has latency; then
		cbench "$r" latency c_host 2 host -b 8 -e 8 -n 2000 -w 200
		cbench "$r" latency c_shm 2 shm -b 8 -e 8 -n 2000 -w 200
	fi
	for N in $ns; do
		tp=()
		if has sweep; then
			if [ "$hosts" -eq 0 ]; then
				cbench "$r" sweep c_host "$N" host -b "$min" -e "$max" -f "$factor" -n 50 -w 10
				cbench "$r" sweep c_shm "$N" shm -b "$min" -e "$max" -f "$factor" -n 50 -w 10
			fi
			tp+=(sweep)
		fi
		if [ "$N" = 2 ]; then
			has latency && tp+=(latency)
			has ddp && tp+=(ddp)
		fi
		if [ ${#tp[@]} -gt 0 ]; then ranks "$r" "$N" "${tp[@]}"; fi
	done
	if [ "$hosts" -gt 0 ] && has sweep; then capacity "$r"; fi
	if has kv; then
		kvrun=(c python)
		[ -z "$kvbase" ] || kvrun+=(python_base)
		for ((i = 0; i < ${#kvrun[@]}; i++)); do
			# the order rotates with the round, so that load falls on each
			sy=${kvrun[(i + r) % ${#kvrun[@]}]}
			if [ "$sy" = python_base ]; then kv "$r" "$sy" "$kvbase"; else kv "$r" "$sy"; fi
		done
	fi
done
note "measured in $((SECONDS - start)) s"
load_end=$(cat /proc/loadavg)

mkdir -p "$outdir"
touch "$tmp/torch.jsonl"
"$py" - "$tmp" "$json" "$rounds" "$load_start" "$load_end" "$hosts" <<'EOF'
import glob, json, os, platform, statistics, sys, time

import torch

tmp, out, rounds, load0, load1 = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
hosts = int(sys.argv[6])
runs = []
for f in sorted(glob.glob(os.path.join(tmp, "run-*.json")),
                key=lambda p: int(p.rsplit("-", 1)[1].split(".")[0])):
    with open(f) as fh:
        runs.append(json.load(fh))
torch_runs = [json.loads(l) for l in open(os.path.join(tmp, "torch.jsonl")) if l.strip()]

# Samples per point: (part, system, N, key) -> [(value, better-is-lower), ...]
pts = {}
def add(part, system, n, key, rec):
    pts.setdefault((part, system, n, key), []).append(rec)
for run in runs:
    if run["part"] == "cap":
        add("cap", "tcpcap", run["N"], 0, {"bound": run["result"]["ring_allreduce_busbw_bound_GBps"],
                                            "aggregate": run["result"]["aggregate_GBps"]})
    elif run["part"] == "kv":
        for row in run["result"]["rows"]:
            add("kv", run["system"], 1, row["block"], {"GBps": row["GBps"], "batch": row["batch"],
                                                       "submit_cpu_us": row.get("submit_cpu_us")})
    else:
        for row in run["result"]["rows"]:
            add(run["part"], run["system"], run["N"], row["size"],
                {"time_us": row["time_us"], "busbw": row["busbw"], "algbw": row["algbw"]})
for t in torch_runs:
    if t["part"] == "ddp":
        add("ddp", t["system"], t["N"], t["model"],
            {"step_ms": t["step_ms"], "params": t["params"], "steps": t["steps"]})
    else:
        add(t["part"], t["system"], t["N"], t["size"],
            {k: t[k] for k in ("time_us", "busbw", "algbw") if k in t})

summary = []
for (part, system, n, key), recs in sorted(pts.items(), key=lambda kv: tuple(map(str, kv[0]))):
    if part == "cap":
        best = max(recs, key=lambda r: r["bound"])
        s = {"bound_GBps": best["bound"], "bound_GBps_median": statistics.median(r["bound"] for r in recs),
             "aggregate_GBps": best["aggregate"]}
    elif part == "kv":
        best = max(recs, key=lambda r: r["GBps"])
        s = {"GBps": best["GBps"], "GBps_median": statistics.median(r["GBps"] for r in recs),
             "block": key, "batch": best["batch"]}
        cpu = [r["submit_cpu_us"] for r in recs if r.get("submit_cpu_us") is not None]
        if cpu:
            s["submit_cpu_us_median"] = statistics.median(cpu)
    elif part == "ddp":
        best = min(recs, key=lambda r: r["step_ms"])
        s = {"step_ms": best["step_ms"], "step_ms_median": statistics.median(r["step_ms"] for r in recs),
             "model": key, "params": best["params"], "steps": best["steps"]}
    else:
        best = min(recs, key=lambda r: r["time_us"])
        s = dict(best, size=key, time_us_median=statistics.median(r["time_us"] for r in recs))
        if "busbw" in best:
            s["busbw_median"] = statistics.median(r["busbw"] for r in recs)
    s.update(part=part, system=system, N=n, samples=len(recs))
    summary.append(s)

doc = {
    "tool": "scripts/bench-torch.sh",
    "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    "host": platform.node(), "kernel": platform.release(), "cpus": os.cpu_count(),
    "python": platform.python_version(), "torch": torch.__version__,
    "collective": "allreduce", "dtype": "f32", "op": "sum", "rounds": rounds,
    "loadavg_start": load0, "loadavg_end": load1, "cluster_hosts": hosts,
    "cluster_gso_bytes": int(os.environ["KCOLL_CLUSTER_GSO_BYTES"])
    if hosts and os.environ.get("KCOLL_CLUSTER_GSO_BYTES") else None,
    "note": "summary: best round (and median) per point; busbw = 2(n-1)/n x bytes / time, GB = 1e9 B; "
            "systems: kcoll, gloo = torch.distributed on plain tensors (kcoll: large ones shared with "
            "kcolld in place, kcoll_mem_share); kcoll_copy = kcoll on plain tensors with "
            "KCOLL_TORCH_SHARE_MIN_BYTES=0 (copied by kcolld); kcoll_shm = kcoll backend on "
            "tensors in kcolld-mapped memory; kcoll_np, kcoll_np_shm = the kcoll package, numpy buffers; "
            "c_host, c_shm = kcoll-bench --mem host / shm; ddp local = the step without DDP; "
            "kv c = kcoll-kvbench -m local, kv python = scripts/bench_kv_agent.py, kv python_base = "
            "the same on the BENCH_KV_BASE package; cluster_hosts > 0: one rank per netns host, "
            "kv from host 1 into a kcoll-kvbench -m target on host 0 (-m initiator, --desc); "
            "cap tcpcap: kcoll-tcpcap ring once per round, every host streaming raw TCP to the next "
            "at once, its slowest link the ring all-reduce busbw bound",
    "summary": summary, "runs": runs, "torch_runs": torch_runs,
}
with open(out, "w") as fh:
    json.dump(doc, fh, indent=1)
    fh.write("\n")
EOF
note "wrote $json"

if command -v gnuplot >/dev/null; then
	if has sweep; then "$top/scripts/plot-torch.sh" "$json" "$png" && note "drew $png"; fi
else
	note "no gnuplot (scripts/deps.sh --bench installs it): skipped $png"
fi

"$py" - "$json" <<'EOF'
import json, sys

doc = json.load(open(sys.argv[1]))
pt = {(s["part"], s["system"], s["N"], s.get("size", s.get("model", s.get("block")))): s
      for s in doc["summary"]}

def human(b):
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return "%d %s" % (b >> shift, unit)
    return "%d B" % b

def get(part, system, n, key, field):
    s = pt.get((part, system, n, key))
    return None if s is None else s.get(field)

def f(v, fmt="%.2f"):
    return "-" if v is None else fmt % v

def ratio(a, b):
    return "-" if a is None or b is None or b == 0 else "%.2fx" % (a / b)

def table(head, rows):
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join(["---:"] * len(head)) + "|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    print()

where = ""
if doc.get("cluster_hosts"):
    where = "one rank on each of %d netns hosts" % doc["cluster_hosts"]
    if doc.get("cluster_gso_bytes"):
        where += ", links taking %d-byte packets" % doc["cluster_gso_bytes"]
    where += "; "
print("torch.distributed all_reduce f32 sum: kcoll backend vs gloo, same processes; %sbest of %d "
      "rounds; %s, %s CPUs, torch %s, %s; load average before %s, after %s"
      % (where,
         doc["rounds"], doc["host"], doc["cpus"], doc["torch"], doc["date"],
         " ".join(doc["loadavg_start"].split()[:3]), " ".join(doc["loadavg_end"].split()[:3])))
print()
ns = sorted({s["N"] for s in doc["summary"] if s["part"] == "sweep"})
sizes = sorted({s["size"] for s in doc["summary"] if s["part"] == "sweep"})
for n in ns:
    print("N=%d: time in us, busbw in GB/s; ratios of busbw" % n)
    rows = []
    for size in sizes:
        k = lambda sy, fl: get("sweep", sy, n, size, fl)
        rows.append([human(size), str(size // 4),
                     f(k("kcoll", "time_us"), "%.1f"), f(k("kcoll", "busbw"), "%.3f"),
                     f(k("gloo", "time_us"), "%.1f"), f(k("gloo", "busbw"), "%.3f"),
                     ratio(k("kcoll", "busbw"), k("gloo", "busbw")),
                     f(k("kcoll_copy", "busbw"), "%.3f"), ratio(k("kcoll_copy", "busbw"), k("gloo", "busbw")),
                     f(k("kcoll_shm", "busbw"), "%.3f"), ratio(k("kcoll_shm", "busbw"), k("gloo", "busbw")),
                     f(k("c_host", "busbw"), "%.3f"), ratio(k("kcoll", "busbw"), k("c_host", "busbw")),
                     f(k("c_shm", "busbw"), "%.3f"), ratio(k("kcoll_shm", "busbw"), k("c_shm", "busbw"))])
    table(["size", "count", "kcoll us", "kcoll busbw", "gloo us", "gloo busbw", "kcoll/gloo",
           "copy busbw", "copy/gloo", "kcoll shm busbw", "shm/gloo", "C host busbw", "kcoll/C host", "C shm busbw",
           "kcoll shm/C shm"], rows)

cap = [s for s in doc["summary"] if s["part"] == "cap"]
if cap and ns:
    c, n = cap[0], ns[-1]
    bound = c["bound_GBps_median"]
    print("Ring bound (kcoll-tcpcap ring, once per round, its slowest link): %.3f GB/s median, "
          "%.3f best; busbw / the median bound, and the bound / gloo: what any backend could reach "
          "over gloo" % (bound, c["bound_GBps"]))
    rows = []
    for size in sizes:
        k = lambda sy: get("sweep", sy, n, size, "busbw")
        rows.append([human(size), ratio(k("kcoll"), bound), ratio(k("kcoll_shm"), bound),
                     ratio(k("gloo"), bound), ratio(bound, k("gloo"))])
    table(["size", "kcoll / bound", "kcoll shm / bound", "gloo / bound", "bound / gloo"], rows)

lat = [("torch, kcoll backend", "kcoll"), ("torch, gloo", "gloo"),
       ("kcoll package, numpy", "kcoll_np"), ("kcoll package, numpy, mapped", "kcoll_np_shm"),
       ("kcoll-bench --mem host (C)", "c_host"), ("kcoll-bench --mem shm (C)", "c_shm")]
if any(get("latency", sy, 2, 8, "time_us") for _, sy in lat):
    print("8-byte all_reduce, N=2: us per call (best round, median)")
    c = get("latency", "c_host", 2, 8, "time_us")
    table(["path", "best us", "median us", "/ C host"],
          [[name, f(get("latency", sy, 2, 8, "time_us")), f(get("latency", sy, 2, 8, "time_us_median")),
            ratio(get("latency", sy, 2, 8, "time_us"), c)] for name, sy in lat])

models = [m for m in ("tiny", "mlp") if ("ddp", "kcoll", 2, m) in pt]
if models:
    print("DDP training step, N=2, batch 32 per rank: ms per step (best round); comm = step - local")
    rows = []
    for m in models:
        g = lambda sy: get("ddp", sy, 2, m, "step_ms")
        loc = g("local")
        rows.append([m, str(get("ddp", "kcoll", 2, m, "params")), f(loc, "%.3f"), f(g("kcoll"), "%.3f"),
                     f(g("gloo"), "%.3f"), ratio(g("gloo"), g("kcoll")),
                     f(g("kcoll") - loc if loc and g("kcoll") else None, "%.3f"),
                     f(g("gloo") - loc if loc and g("gloo") else None, "%.3f")])
    table(["model", "params", "local ms", "kcoll ms", "gloo ms", "gloo/kcoll time",
           "kcoll comm ms", "gloo comm ms"], rows)

blocks = sorted({s["block"] for s in doc["summary"] if s["part"] == "kv"})
if blocks:
    print("KV writes, %s, batches of 64, depth 2, kcolld-mapped memory: GB/s (best round, median)"
          % ("host 1 -> host 0 of %d netns hosts, TCP between the kcollds" % doc["cluster_hosts"]
             if doc.get("cluster_hosts") else "same host"))
    base = any(s["part"] == "kv" and s["system"] == "python_base" for s in doc["summary"])
    rows = []
    for b in blocks:
        g = lambda sy, fl: get("kv", sy, 1, b, fl)
        row = [human(b), f(g("c", "GBps")), f(g("c", "GBps_median")), f(g("python", "GBps")),
               f(g("python", "GBps_median")), ratio(g("python", "GBps"), g("c", "GBps")),
               ratio(g("python", "GBps_median"), g("c", "GBps_median"))]
        row.append(f(g("python", "submit_cpu_us_median"), "%.1f"))
        if base:
            row += [f(g("python_base", "GBps")), ratio(g("python_base", "GBps"), g("c", "GBps")),
                    ratio(g("python_base", "GBps_median"), g("c", "GBps_median")),
                    f(g("python_base", "submit_cpu_us_median"), "%.1f")]
        rows.append(row)
    print("(submit CPU us: the Python thread's CPU time per Agent.write call, median of the rounds)")
    table(["block", "C GB/s", "C median", "Python GB/s", "Python median", "Python/C",
           "Python/C medians", "submit CPU us"]
          + (["base GB/s", "base/C", "base/C medians", "base submit CPU us"] if base else []), rows)
EOF
