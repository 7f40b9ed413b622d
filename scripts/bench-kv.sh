#!/usr/bin/env bash
# KV-cache transfers beside their ceilings, in one run (docs/perf.md section
# "KV-cache transfers"):
#   1. same host: kcoll-kvbench local (shm and malloc buffers) with its memcpy
#      anchor measured in the same process run, write, 4 KiB .. 4 MiB blocks;
#   2. across namespaces: a 2-host netns cluster (prefix kvb$$), kcoll-kvbench
#      target on host 0 and initiator on host 1, beside iperf3 with as many
#      parallel streams as kcolld uses (KCOLL_KV_STREAMS, default 4) between
#      the same namespaces, measured right before and after.
#   scripts/bench-kv.sh [BUILD]     (root for part 2; run under flock
#                                    /tmp/kcoll-heavy.lock on shared machines)
# Prints the tables and writes docs/perf/kv-<date>.json.
set -u
B=${1:-build}
top=$(cd "$(dirname "$0")/.." && pwd)
BIN="$top/$B/bin"
C="$top/scripts/netns-cluster.sh"
DUR=${KV_BENCH_DURATION:-2}
STREAMS=${KCOLL_KV_STREAMS:-4}
stamp=$(date -u +%Y-%m-%d-%H%M)
out="$top/docs/perf/kv-$stamp.json"
T=$(mktemp -d /tmp/kvbench.XXXXXX)
chmod 755 "$T"
export KCOLL_CLUSTER_PREFIX="kvb$$" KCOLL_CLUSTER_RUNDIR="$T/run"
cleanup() {
	jobs -p | xargs -r kill 2>/dev/null
	[ -n "${dpid:-}" ] && kill "$dpid" 2>/dev/null
	"$C" down >/dev/null 2>&1
	rm -rf "$T"
}
trap cleanup EXIT

echo "# 1. same host (kcolld with its default settings)"
"$BIN/kcolld" -f -s "$T/kcolld.sock" -l "$T/kcolld.log" &
dpid=$!
for _ in $(seq 100); do [ -S "$T/kcolld.sock" ] && break; sleep 0.05; done
export KCOLL_SOCKET="$T/kcolld.sock"
"$BIN/kcoll-kvbench" -d "$DUR" -b 4K,64K,256K,1M,4M -B 64 --json >"$T/local-shm.json"
"$BIN/kcoll-kvbench" -d "$DUR" -b 4K -B 1024 --json >"$T/local-shm-4k.json"
"$BIN/kcoll-kvbench" -d "$DUR" -b 4K,64K,256K,1M,4M -B 64 -M malloc --json >"$T/local-malloc.json"
kill "$dpid"; wait "$dpid" 2>/dev/null; dpid=
unset KCOLL_SOCKET

echo "# 2. across namespaces"
"$C" up -H 2 >"$T/up.log" 2>&1 || { cat "$T/up.log"; exit 1; }
A0=10.10.0.1
iperf() {	# -> GB/s host1 -> host0 with $STREAMS streams
	"$C" exec 0 iperf3 -s -1 -B "$A0" >/dev/null 2>&1 &
	sleep 0.5
	"$C" exec 1 iperf3 -c "$A0" -P "$STREAMS" -t "$DUR" -J 2>/dev/null |
		python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 8e9)'
	wait
}
ip_before=$(iperf)
"$C" exec 0 "$BIN/kcoll-kvbench" -m target -D "$T/desc" -s 256M 2>/dev/null &
tgt=$!
"$C" exec 1 "$BIN/kcoll-kvbench" -m initiator -D "$T/desc" -d "$DUR" -b 4K,64K,256K,1M,4M -B 64 \
	--json >"$T/net.json"
"$C" exec 1 "$BIN/kcoll-kvbench" -m initiator -D "$T/desc" -d "$DUR" -b 4K -B 1024 \
	--json >"$T/net-4k.json"
kill "$tgt"; wait "$tgt" 2>/dev/null
ip_after=$(iperf)

python3 - "$T" "$ip_before" "$ip_after" "$out" "$STREAMS" <<'PY'
import json, sys
d, before, after, out, streams = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5]
load = lambda n: json.load(open(f"{d}/{n}.json"))
res = {n: load(n) for n in ("local-shm", "local-shm-4k", "local-malloc", "net", "net-4k")}
res["iperf3_GBps"] = [before, after]
res["iperf3_streams"] = int(streams)
json.dump(res, open(out, "w"), indent=1)
def table(title, rows, anchor=None, aname="memcpy"):
    print(f"\n{title}\n| block | batch | GB/s | {aname} GB/s | ratio | avg us | p50 us | p99 us | p99.9 us |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        a = r.get("memcpy_GBps", anchor)
        print(f"| {r['block']} | {r['batch']} | {r['GBps']:.2f} | {a:.2f} | {r['GBps']/a:.2f} | "
              f"{r['avg_us']:.0f} | {r['p50_us']:.0f} | {r['p99_us']:.0f} | {r['p999_us']:.0f} |")
table("same host, kcoll_mem_alloc buffers (zero copy in kcolld) vs memcpy",
      res["local-shm"]["rows"] + res["local-shm-4k"]["rows"])
table("same host, malloc buffers (process_vm_readv + process_vm_writev) vs memcpy",
      res["local-malloc"]["rows"])
ceil = max(before, after)
table(f"across namespaces (TCP, {streams} streams) vs iperf3 -P {streams} (before {before:.2f}, after {after:.2f} GB/s; the larger is the ceiling)",
      res["net"]["rows"] + res["net-4k"]["rows"], ceil, "iperf3")
print(f"\nraw results: {out}")
PY
