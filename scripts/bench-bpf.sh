#!/usr/bin/env bash
# Cost of the eBPF flow tracker (bpf/): kcoll all-reduce busbw across a
# 4-host netns cluster with tracking off and on, in one run, alternating
# (off, on, on, off, ...) so drift hits both alike. "On" is the full tracker:
# tc classifiers on both interfaces of every host, sockops, the daemons' port
# tracked, link/peer config filled. Prints a table and the on/off ratio per
# size (median of the rounds, and the median of each round's on/off pair);
# then, with the kernel's bpf_stats on, the tracker's own CPU time per
# all-reduce (every program on every host) against the op's time: a bound
# on the overhead that the busbw noise of a shared machine cannot blur.
# --json also writes the raw numbers.
#
#   scripts/bench-bpf.sh [-r ROUNDS] [-s SIZES] [-n ITERS] [--json FILE]
#     ROUNDS: off/on pairs (default 5); SIZES: comma list (default 1M,16M,64M)
# Root; takes the heavy-job lock itself (flock /tmp/kcoll-heavy.lock).
# KCOLL_CLUSTER_PREFIX defaults to "bb$$"; the cluster is torn down at exit.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/scripts/bench-lib.sh"	# bench_help
BUILD_DIR=${KCOLL_BUILD:-$top/build}
C="$top/scripts/netns-cluster.sh"
KB="$BUILD_DIR/bin/kcoll-bpf"
rounds=5 sizes=1M,16M,64M iters=10 json= H=4 PORT=47000
while [ $# -gt 0 ]; do
	case "$1" in
	-r) rounds=$2; shift 2 ;;
	-s) sizes=$2; shift 2 ;;
	-n) iters=$2; shift 2 ;;
	--json) json=$2; shift 2 ;;
	-h|--help) bench_help ;;
	*) echo "bench-bpf: unknown option or argument '$1' (the build is \$KCOLL_BUILD; try --help)" >&2; exit 2 ;;
	esac
done
[ "$(id -u)" -eq 0 ] || { echo "bench-bpf: needs root (netns cluster, BPF)" >&2; exit 1; }
[ -x "$KB" ] || { echo "bench-bpf: $KB missing: run make (needs clang, bpftool, libbpf-dev)" >&2; exit 1; }
if [ -z "${KCOLL_BENCH_BPF_LOCKED:-}" ]; then
	export KCOLL_BENCH_BPF_LOCKED=1
	exec flock /tmp/kcoll-heavy.lock "$0" -r "$rounds" -s "$sizes" -n "$iters" ${json:+--json "$json"}
fi
export KCOLL_CLUSTER_PREFIX=${KCOLL_CLUSTER_PREFIX:-bb$$}
P=$KCOLL_CLUSTER_PREFIX
T=$(mktemp -d /tmp/bench-bpf.XXXXXX)
export KCOLL_CLUSTER_RUNDIR="$T/run"
PY=python3
[ -x /usr/bin/python3 ] && PY=/usr/bin/python3
K() { local i=$1; shift; "$KB" --pin "/sys/fs/bpf/$P-h$i" --netns "$P-h$i" "$@"; }
off() { for i in $(seq 0 $((H - 1))); do K "$i" detach; done; }
on() {
	for i in $(seq 0 $((H - 1))); do
		K "$i" attach eth0,eth1 && K "$i" track $PORT && K "$i" link eth0 any 0 && K "$i" link eth1 any 1
		for j in $(seq 0 $((H - 1))); do
			[ "$j" = "$i" ] || { K "$i" peer 10.10.0.$((j + 1)) "$j"; K "$i" peer 10.20.0.$((j + 1)) "$j"; }
		done
	done
}
cleanup() { off >/dev/null 2>&1 || true; "$C" down >/dev/null 2>&1 || true; rm -rf "$T"; }
trap cleanup EXIT
KCOLL_ALGO=ring KCOLL_LISTEN=0.0.0.0:$PORT "$C" up -H $H >/dev/null

IFS=, read -ra S <<<"$sizes"
run() {	# mode round
	for s in "${S[@]}"; do
		"$BUILD_DIR/bin/kcoll-bench" allreduce --hosts $H -N 1 -b "$s" -e "$s" -n "$iters" -w 2 -c 0 \
			--json > "$T/$1-$2-$s.json"
	done
}
for r in $(seq 1 "$rounds"); do
	if [ $((r % 2)) = 1 ]; then off; run off "$r"; on; run on "$r"
	else on; run on "$r"; off; run off "$r"; fi
	echo "bench-bpf: round $r/$rounds done" >&2
done

# The tracker's own CPU time, measured by the kernel (bpf_stats): every
# program on every host, over one run per size with tracking on. This bounds
# the overhead independently of the run-to-run noise of busbw.
stats_old=$(sysctl -n kernel.bpf_stats_enabled)
sysctl -qw kernel.bpf_stats_enabled=1
progstats() {	# file: "run_time_ns run_cnt" summed over every host's programs
	for i in $(seq 0 $((H - 1))); do
		for p in prog_tc_ingress prog_tc_egress prog_sockops; do
			bpftool prog show pinned "/sys/fs/bpf/$P-h$i/$p" --json
			echo
		done
	done | $PY -c 'import json, sys
t = c = 0
for l in sys.stdin:
    if l.strip():
        d = json.loads(l); t += d.get("run_time_ns", 0); c += d.get("run_cnt", 0)
print(t, c)' > "$1"
}
on
for s in "${S[@]}"; do
	progstats "$T/stats0-$s"
	"$BUILD_DIR/bin/kcoll-bench" allreduce --hosts $H -N 1 -b "$s" -e "$s" -n "$iters" -w 2 -c 0 \
		--json > "$T/cost-$s.json"
	progstats "$T/stats1-$s"
done
sysctl -qw kernel.bpf_stats_enabled="$stats_old"
# And in isolation: the egress classifier on one tracked TCP packet, 2M times
# (BPF_PROG_TEST_RUN through bpftool; the flow record exists after the first).
$PY -c 'import struct, sys
tcp = struct.pack("!HHIIBBHHH", 40000, '$PORT', 1, 0, 5 << 4, 0x18, 65535, 0, 0)
ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp) + 1000, 1, 0x4000, 64, 6, 0,
                 bytes([10, 99, 0, 1]), bytes([10, 99, 0, 2]))
sys.stdout.buffer.write(b"\x02" * 6 + b"\x04" * 6 + b"\x08\x00" + ip + tcp + b"x" * 1000)' > "$T/pkt.bin"
bpftool prog run pinned "/sys/fs/bpf/$P-h0/prog_tc_egress" data_in "$T/pkt.bin" repeat 2000000 |
	sed -n 's/.*duration (average): \([0-9]*\)ns.*/\1/p' > "$T/testrun_ns"

$PY - "$T" "$rounds" "$sizes" "$json" "$(nproc)" "$(uname -r)" "$iters" <<'EOF'
import json, statistics, sys
t, rounds, sizes, out = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(","), sys.argv[4]
ops = int(sys.argv[7]) + 2
testrun_ns = open("%s/testrun_ns" % t).read().strip()
def field(doc, name):
    found = []
    def walk(x):
        if isinstance(x, dict):
            if name in x:
                found.append(x[name])
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)
    walk(doc)
    return found[0]
def busbw(doc):
    return field(doc, "busbw")
res = []
print("| size | busbw off (GB/s) | busbw on (GB/s) | on / off (medians) | paired on / off: median [min, max] | BPF runs per op | BPF ns per run | BPF CPU per op / op time |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|")
for s in sizes:
    off = [busbw(json.load(open("%s/off-%d-%s.json" % (t, r, s)))) for r in range(1, rounds + 1)]
    on = [busbw(json.load(open("%s/on-%d-%s.json" % (t, r, s)))) for r in range(1, rounds + 1)]
    mo, mn = statistics.median(off), statistics.median(on)
    pairs = [a / b for a, b in zip(on, off)]
    t0, c0 = map(int, open("%s/stats0-%s" % (t, s)).read().split())
    t1, c1 = map(int, open("%s/stats1-%s" % (t, s)).read().split())
    op_us = field(json.load(open("%s/cost-%s.json" % (t, s))), "time_us")
    runs, ns = (c1 - c0) / ops, (t1 - t0) / max(c1 - c0, 1)
    frac = (t1 - t0) / ops / (op_us * 1000.0)
    print("| %s | %.3f | %.3f | %.3f | %.3f [%.2f, %.2f] | %.0f | %.0f | %.2f%% |" % (
        s, mo, mn, mn / mo, statistics.median(pairs), min(pairs), max(pairs), runs, ns, 100 * frac))
    res.append({"size": s, "off": off, "on": on, "median_off": mo, "median_on": mn, "ratio": mn / mo,
                "paired_ratios": pairs, "bpf_runs_per_op": runs, "bpf_ns_per_run": ns,
                "op_time_us": op_us, "bpf_cpu_fraction_of_op": frac})
print()
print("egress classifier alone (BPF_PROG_TEST_RUN, 2M runs): %s ns per packet" % testrun_ns)
if out:
    json.dump({"bench": "bench-bpf.sh", "hosts": 4, "cpus": int(sys.argv[5]), "kernel": sys.argv[6],
               "iters": ops - 2, "warmup": 2, "testrun_ns_per_packet": int(testrun_ns or 0),
               "results": res}, open(out, "w"), indent=1)
EOF
