#!/usr/bin/env bash
# KV-cache transfers over RDMA in the VM (issue 9), one run, side by side on
# one Soft-RoCE device (two addresses, two GIDs, real RC traffic through rxe):
#   1. the ceiling: perftest's ib_write_bw between the two GIDs, 4 KiB and
#      64 KiB..4 MiB messages
#   2. two kcollds (KCOLL_NET_XPORT=rdma), kcoll-kvbench target on one and
#      initiator on the other (kcoll_mem_alloc buffers: kcolld registers
#      them), write batches of 64 KiB..4 MiB blocks and of 4 KiB blocks, with
#      per-batch latency percentiles
#   3. ib_write_bw again (the higher reading is the ceiling)
# TCG distorts absolute numbers; the ratios within one run are the result.
#   scripts/bench-kv-rdma-vm.sh [BUILD]     host side (run under flock): boots
#                                           the VM, prints the table, writes
#                                           docs/perf/kv-rdma-vm-<date>.json
#   scripts/bench-kv-rdma-vm.sh --guest B   inside the guest
#   scripts/bench-kv-rdma-vm.sh --parse F   the table from a saved guest output
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/scripts/bench-lib.sh"	# bench_opts, bench_build_dir
. "$top/scripts/vm-rxe-setup.sh"
dur=${BENCH_KV_SECONDS:-3}
sizes="4096 65536 262144 1048576 4194304"

guest() {
	local B=$1 T pids=() s iters
	T=$(mktemp -d /tmp/bkv.XXXXXX)
	ulimit -l unlimited
	vm_rxe_load || { echo "bench-kv-rdma-vm: cannot load rdma_rxe: $why" >&2; exit 1; }
	vm_rxe_link kvb0 kvbrxe0 10.34.0.1 10.34.0.2
	sleep 1
	perftest() {	# tag
		for s in $sizes; do
			iters=$(( (32 << 20) / s )); [ "$iters" -le 4096 ] || iters=4096; [ "$iters" -ge 8 ] || iters=8
			echo "PERFTEST $1 $s $(vm_ib_write_bw kvbrxe0 10.34.0.1 "$s" "$iters" "$T")"
		done
	}
	perftest before
	for h in 0 1; do
		KCOLL_NET_XPORT=rdma "$B/bin/kcolld" -f -s "$T/h$h.sock" -l "$T/h$h.log" \
			--listen "10.34.0.$((h + 1)):0" --addrs "10.34.0.$((h + 1))" &
		pids[h]=$!
	done
	for h in 0 1; do
		for _ in $(seq 100); do [ -S "$T/h$h.sock" ] && break; sleep 0.1; done
	done
	KCOLL_SOCKET=$T/h0.sock "$B/bin/kcoll-kvbench" -m target -D "$T/desc" -s 64M &
	local tgt=$!
	for _ in $(seq 100); do [ -s "$T/desc" ] && break; sleep 0.1; done
	echo "KVJSON large $(KCOLL_SOCKET=$T/h1.sock "$B/bin/kcoll-kvbench" -m initiator -D "$T/desc" -s 64M \
		-b 64K,256K,1M,4M -B 8 -d "$dur" --json | tr -d '\n')"
	echo "KVJSON small $(KCOLL_SOCKET=$T/h1.sock "$B/bin/kcoll-kvbench" -m initiator -D "$T/desc" -s 64M \
		-b 4K -B 256 -d "$dur" --json | tr -d '\n')"
	"$B/bin/kcollctl" -s "$T/h1.sock" status | grep '^kv' | sed 's/^/# initiator: /'
	grep -h 'kv: segment' "$T/h1.log" | sed 's/^/# initiator log: /' | head -3
	kill -TERM $tgt "${pids[@]}"; wait || true
	perftest after
}

if [ "${1:-}" = --guest ]; then
	guest "$2"
	exit 0
fi

out=$top/docs/perf/kv-rdma-vm-$(date +%Y-%m-%d-%H%M).json
if [ "${1:-}" = --parse ]; then	# the guest's output, saved from another run
	raw=${2:?--parse needs a file}
else
	bench_opts "$@"
	B=$top/${1:-build}
	bench_build_dir "$B" "${1:-build}"
	raw=$(mktemp)
	trap 'rm -f "$raw"' EXIT
	"$top/scripts/vmtest.sh" --mem 2048 --timeout 900 -- "$top/scripts/bench-kv-rdma-vm.sh" --guest "$B" |
		tee "$raw" | grep -v '^KVJSON'
fi
python3 - "$raw" "$out" <<'PY'
import json, sys
perf, kv = {}, {}
for line in open(sys.argv[1]):
    f = line.split()
    if line.startswith("PERFTEST ") and len(f) == 4:
        perf.setdefault(int(f[2]), []).append(float(f[3]))
    elif line.startswith("KVJSON "):
        kv[f[1]] = json.loads(line.split(" ", 2)[2])
json.dump({"what": "KV transfers over rdma_rxe in the QEMU/TCG guest, one run",
           "ib_write_bw_MBps": perf, "kvbench": kv}, open(sys.argv[2], "w"), indent=1)
# perftest's MB/sec is 2^20 bytes a second; kcoll-kvbench's GB/s is 1e9.
ceil = {s: max(v) * 1048576 / 1e6 for s, v in perf.items() if v}
top_ = max(ceil.values()) if ceil else 0
print("| block | batch | KV GB/s | ib_write_bw GB/s (same size) | ratio | ratio to peak ib_write_bw | avg us | p50 us | p99 us |")
print("|---|---|---|---|---|---|---|---|---|")
for tag in ("large", "small"):
    for r in kv.get(tag, {}).get("rows", []):
        c = ceil.get(r["block"], 0) / 1000
        print("| %d KiB | %d | %.4f | %.4f | %s | %s | %.0f | %.0f | %.0f |" % (
            r["block"] // 1024, r["batch"], r["GBps"], c, "%.2f" % (r["GBps"] / c) if c else "-",
            "%.2f" % (r["GBps"] / (top_ / 1000)) if top_ else "-", r["avg_us"], r["p50_us"], r["p99_us"]))
print("ib_write_bw MiB/s (perftest MB/sec) per size (before, after):", {s: v for s, v in sorted(perf.items())})
print("raw:", sys.argv[2])
PY
