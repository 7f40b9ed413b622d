#!/usr/bin/env bash
# RDMA point-to-point between two QEMU guests (issue 6), one run, side by
# side on one pair of rxe devices on a virtual wire (scripts/vmtest-pair.sh):
#   1. perftest's ib_write_bw, 64 KiB..4 MiB (guest 1 serves)
#   2. kcoll: a 2-host broadcast from guest 0's rank (one kcolld per guest,
#      KCOLL_NET_XPORT=rdma): the root's daemon writes the buffer into the
#      other's slots; the time includes both ranks' round trips
#   3. ib_write_bw again (drift)
# TCG distorts absolute numbers; the ratios within one run are the result.
#   scripts/bench-rdma-pair.sh [BUILD]   host side (run under flock): prints
#                                        a table, writes docs/perf/rdma-pair-<date>.json
#   scripts/bench-rdma-pair.sh --guest BUILD ROLE DIR   in each guest
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/scripts/bench-lib.sh"	# bench_opts, bench_build_dir
iters=${BENCH_RDMA_ITERS:-10}
sizes="65536 262144 1048576 4194304"

guest() {
	local B=$1 role=$2 S=$3 T IF f rxe addr peer s k=0
	. "$top/scripts/vm-rxe-setup.sh"
	T=$(mktemp -d /tmp/brp.XXXXXX)
	ulimit -l unlimited
	modprobe virtio_net
	vm_rxe_load || { echo "bench-rdma-pair: cannot load rdma_rxe: $why" >&2; exit 1; }
	IF=
	for _ in $(seq 100); do
		for f in /sys/class/net/*/address; do
			[ "$(cat "$f")" = "52:54:00:4b:00:0$((role + 1))" ] && IF=$(basename "$(dirname "$f")")
		done
		[ -n "$IF" ] && break
		sleep 0.1
	done
	rxe=wrxe$role addr=10.32.0.$((role + 1)) peer=10.32.0.$((2 - role))
	ip link set lo up
	ip link set "$IF" up
	ip addr add "$addr/24" dev "$IF"
	rdma link add "$rxe" type rxe netdev "$IF"
	wait_for() { for _ in $(seq 3000); do [ -e "$S/$1" ] && return 0; sleep 0.1; done; return 1; }
	touch "$S/up.$role"
	wait_for "up.$((1 - role))"
	ping -c 2 -W 5 "$peer" >/dev/null
	perftest() {	# tag
		for s in $sizes; do
			k=$((k + 1))
			if [ "$role" -eq 1 ]; then
				timeout 300 ib_write_bw -d "$rxe" -x 1 -s "$s" -n "$iters" -F >"$T/srv" 2>&1 &
				local sp=$!
				sleep 1
				touch "$S/listen.$k"
				wait $sp || true	# (not a bare wait: kcolld runs in the background too)
				touch "$S/bwdone.$k"
			else
				wait_for "listen.$k"
				timeout 300 ib_write_bw -d "$rxe" -x 1 -s "$s" -n "$iters" -F "$peer" >"$T/cli" 2>&1 || true
				echo "$1 $s $(awk -v s="$s" '$1 == s && NF >= 4 { print $4 }' "$T/cli" | tail -1)"
				wait_for "bwdone.$k"
			fi
		done
	}
	perftest PERFTEST
	env KCOLL_NET_XPORT=rdma KCOLL_IB_QPS=2 KCOLL_IB_TIMEOUT=18 "$B/bin/kcolld" -f -s "$T/h.sock" \
		-l "$T/h.log" --listen "$addr:0" --addrs "$addr" &
	local dpid=$!
	for _ in $(seq 300); do grep -q "transport between daemons" "$T/h.log" 2>/dev/null && break; sleep 0.1; done
	touch "$S/kd.$role"
	wait_for "kd.$((1 - role))"
	bench() {	# tag coll
		local j
		j=$(PMI_RANK=$role PMI_SIZE=2 KCOLL_SOCKET=$T/h.sock "$B/bin/kcoll-bench" "$2" -b 64K -e 4M -f 4 \
			-n "$iters" -w 2 -c 1 --json --id-file "$S/id.$1" | tr -d '\n')
		[ "$role" -ne 0 ] || echo "KCOLLJSON $1 $j"
		touch "$S/bdone.$1.$role"
		wait_for "bdone.$1.$((1 - role))"
	}
	bench rdma-bcast broadcast
	perftest PERFTEST2
	grep -h "transport between daemons" "$T/h.log" | sed 's/^/# /'
	kill -TERM $dpid
	wait $dpid || true
	rdma link delete "$rxe" || true
}

if [ "${1:-}" = "--guest" ]; then
	guest "$2" "$3" "$4"
	exit 0
fi

bench_opts "$@"
B=$top/${1:-build}
bench_build_dir "$B" "${1:-build}"
out=$top/docs/perf/rdma-pair-$(date +%Y-%m-%d-%H%M).json
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
"$top/scripts/vmtest-pair.sh" --mem 2048 --timeout 900 -- "$top/scripts/bench-rdma-pair.sh" --guest "$B" |
	tee "$raw" | grep -v '^KCOLLJSON'
python3 - "$raw" "$out" <<'PY'
import json, sys
perf, perf2, kc = {}, {}, {}
for line in open(sys.argv[1]):
    w = line.split(" ", 2)
    if w[0] in ("PERFTEST", "PERFTEST2") and len(w) == 3 and w[2].strip():
        # perftest's "MB/sec" is 2^20 bytes/s; kcoll's MB/s is 10^6 bytes/s
        (perf if w[0] == "PERFTEST" else perf2)[int(w[1])] = float(w[2]) * 1.048576
    elif w[0] == "KCOLLJSON":
        kc[w[1]] = json.loads(w[2])
json.dump({"what": "rdma_rxe between two QEMU/TCG guests on a dgram wire, one run",
           "units": "ib_write_bw_MBps*: 10^6 bytes/s (perftest's 2^20 figures converted)",
           "ib_write_bw_MBps": perf, "ib_write_bw_MBps_after": perf2, "kcoll": kc},
          open(sys.argv[2], "w"), indent=1)
rows = {r["size"]: r for r in kc.get("rdma-bcast", {}).get("rows", [])}
print("| size | ib_write_bw before / after (MB/s) | kcoll 2-host broadcast (MB/s) | kcoll / mean ib_write_bw |")
print("|---|---|---|---|")
for s in sorted(perf):
    both = [v for v in (perf[s], perf2.get(s, 0.0)) if v > 0]
    ref = sum(both) / len(both) if both else float("nan")
    r = rows.get(s)
    k = s / r["time_us"] if r else float("nan")
    print(f"| {s >> 10} KiB | {perf[s]:.1f} / {perf2.get(s, float('nan')):.1f} | {k:.1f} | {k / ref:.2f} |")
print(f"(json: {sys.argv[2]})")
PY
