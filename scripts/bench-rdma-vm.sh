#!/usr/bin/env bash
# RDMA transport benchmark in the VM (issue 6), one run, side by side on one
# Soft-RoCE device (two addresses, two GIDs, real RC traffic through rxe):
#   1. point-to-point write bandwidth, 64 KiB..4 MiB: perftest's ib_write_bw
#      vs kcoll between two daemons (a 2-host broadcast: the root's daemon
#      writes the buffer into the other's slots; the time includes both
#      clients' round trips through their daemons)
#   2. 2-host all-reduce (f32 sum): kcoll over rdma vs kcoll over tcp on the
#      same pair of addresses
# TCG distorts absolute numbers; the ratios within one run are the result.
#   scripts/bench-rdma-vm.sh [BUILD]      host side (run under flock): boots
#                                         the VM, prints tables, writes
#                                         docs/perf/rdma-vm-<date>.json
#   scripts/bench-rdma-vm.sh --guest B [BASE]   inside the guest
# BENCH_BASE=DIR (a second build dir, e.g. an older commit's build): an A/B
# in one guest; every kcoll measurement (its daemons and kcoll-bench) is also
# taken with DIR's build, right after BUILD's in round 1 and right before it
# in round 2 and the all-reduces, between the same two ib_write_bw passes; its
# rows are tagged "base" (JSON keys base-*) beside BUILD's in the tables.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/scripts/bench-lib.sh"	# bench_opts, bench_build_dir
. "$top/scripts/vm-rxe-setup.sh"
iters=${BENCH_RDMA_ITERS:-20}
sizes="65536 262144 1048576 4194304"

# shellcheck disable=SC2317  # start, stop, bench run through ab() and one()
guest() {
	local B=$1 BASE=${2:-} T pids=() s
	T=$(mktemp -d /tmp/brd.XXXXXX)
	ulimit -l unlimited
	vm_rxe_load || { echo "bench-rdma-vm: cannot load rdma_rxe: $why" >&2; exit 1; }
	vm_rxe_link krdma0 krxe0 10.31.0.1 10.31.0.2
	sleep 1
	perftest() {	# tag
		for s in $sizes; do
			echo "$1 $s $(vm_ib_write_bw krxe0 10.31.0.1 "$s" "$iters" "$T")"
		done
	}
	perftest PERFTEST
	local K=$B P=	# the build measured now, its tags' prefix
	start() {	# xport [env...]: $K's daemons
		local h x=$1
		shift
		for h in 0 1; do
			env KCOLL_NET_XPORT=$x KCOLL_IB_QPS=2 "$@" "$K/bin/kcolld" -f -s "$T/h$h.sock" -l "$T/h$h-$x.log" \
				--listen "10.31.0.$((h + 1)):0" --addrs "10.31.0.$((h + 1))" &
			pids[h]=$!
		done
		for h in 0 1; do
			for _ in $(seq 100); do [ -S "$T/h$h.sock" ] && break; sleep 0.1; done
		done
	}
	stop() { kill -TERM "${pids[@]}"; wait "${pids[@]}" || true; rm -f "$T"/h*.sock; }
	bench() {	# tag coll
		echo "KCOLLJSON $P$1 $("$K/bin/kcoll-bench" "$2" --hosts 2 -N 1 -b 64K -e 4M -f 4 -n "$iters" -w 2 \
			-c 1 --json --launch "env KCOLL_SOCKET=$T/h%h.sock" | tr -d '\n')"
	}
	# Where the time goes: the copy into 1 MiB slots, zero-copy from the
	# registered buffer, zero-copy with 256 KiB pieces; two rounds,
	# interleaved, so that drift in the shared machine shows.
	local -A V=([copy]="KCOLL_IB_ZC_BYTES=0 KCOLL_IB_PIECE_BYTES=1048576"
		    [zc]="KCOLL_IB_ZC_BYTES=65536 KCOLL_IB_PIECE_BYTES=1048576"
		    [zc256]="KCOLL_IB_ZC_BYTES=65536 KCOLL_IB_PIECE_BYTES=262144")
	ab() {	# first(B|BASE) command...: the command with $B's build, and $BASE's
		local k
		for k in "$1" $([ "$1" = B ] && echo BASE || echo B); do
			[ "$k" = BASE ] && [ -z "$BASE" ] && continue
			if [ "$k" = B ]; then K=$B P=; else K=$BASE P=base-; fi
			"${@:2}"
		done
		K=$B P=
	}
	one() {	# tag coll xport [env...]
		start "${@:3}"
		bench "$1" "$2"
		[ "$1" = rdma-allreduce-zc ] && "$K/bin/kcollctl" -s "$T/h0.sock" status | sed "s/^/# ${P:+base: }/"
		stop
	}
	local r v
	for r in 1 2; do
		for v in copy zc zc256; do
			# shellcheck disable=SC2086
			ab "$([ $r = 1 ] && echo B || echo BASE)" one "rdma-bcast-$v-$r" broadcast rdma ${V[$v]}
		done
	done
	for v in copy zc; do
		# shellcheck disable=SC2086
		ab BASE one "rdma-allreduce-$v" allreduce rdma ${V[$v]}
	done
	ab BASE one tcp-allreduce allreduce tcp
	perftest PERFTEST2
	grep -h "transport between daemons" "$T"/h0-*.log | sed 's/^/# /'
	rdma link delete krxe0 || true
}

if [ "${1:-}" = "--guest" ]; then
	guest "$2" "${3:-}"
	exit 0
fi

bench_opts "$@"
B=$top/${1:-build}
bench_build_dir "$B" "${1:-build}"
base=
[ -z "${BENCH_BASE:-}" ] || base=$(cd "$BENCH_BASE" && pwd)
out=$top/docs/perf/rdma-vm-$(date +%Y-%m-%d-%H%M).json
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
"$top/scripts/vmtest.sh" --mem 2048 --timeout 900 -- "$top/scripts/bench-rdma-vm.sh" --guest "$B" ${base:+"$base"} | tee "$raw" |
	grep -v '^KCOLLJSON'
python3 - "$raw" "$out" "$base" <<'PY'
import json, sys
perf, kc = {}, {}
perf2 = {}
for line in open(sys.argv[1]):
    w = line.split(" ", 2)
    if w[0] in ("PERFTEST", "PERFTEST2") and len(w) == 3 and w[2].strip():
        # perftest's "MB/sec" is 2^20 bytes/s; kcoll's MB/s is 10^6 bytes/s
        (perf if w[0] == "PERFTEST" else perf2)[int(w[1])] = float(w[2]) * 1.048576
    elif w[0] == "KCOLLJSON":
        kc[w[1]] = json.loads(w[2])
json.dump({"what": "rdma_rxe in the QEMU/TCG guest, one run",
           "units": "ib_write_bw_MBps*: 10^6 bytes/s (perftest's 2^20 figures converted)",
           "ib_write_bw_MBps": perf,
           "ib_write_bw_MBps_after": perf2, "kcoll": kc,
           **({"base": sys.argv[3]} if sys.argv[3] else {})},
          open(sys.argv[2], "w"), indent=1)
def rows(tag):
    return {r["size"]: r for r in kc.get(tag, {}).get("rows", [])}
names = {"copy": "copy, 1 MiB pieces", "zc": "zero-copy, 1 MiB", "zc256": "zero-copy, 256 KiB"}
variants = [(f"{p}rdma-bcast-{v}-{r}", f"{b}{n} (round {r})") for r in (1, 2) for v, n in names.items()
            for p, b in (("", ""), ("base-", "base "))]
variants = [(t, n) for t, n in variants if t in kc]
print("kcoll point-to-point (2-host broadcast) in MB/s, and / ib_write_bw (mean of before and after)")
print("| size | ib_write_bw before / after | " + " | ".join(n for _, n in variants) + " |")
print("|---|---|" + "---|" * len(variants))
for s in sorted(perf):
    both = [v for v in (perf[s], perf2.get(s, 0.0)) if v > 0]  # a failed run prints nothing (0)
    ref = sum(both) / len(both) if both else float("nan")
    cells = []
    for t, _ in variants:
        r = rows(t).get(s)
        k = s / r["time_us"] if r else float("nan")   # bytes/us = MB/s
        cells.append(f"{k:.1f} ({k / ref:.2f})")
    print(f"| {s >> 10} KiB | {perf[s]:.1f} / {perf2.get(s, float('nan')):.1f} | " + " | ".join(cells) + " |")
for p in ("", "base-"):
    rc, rz, rt = rows(p + "rdma-allreduce-copy"), rows(p + "rdma-allreduce-zc"), rows(p + "tcp-allreduce")
    if not rc:
        continue
    print()
    print("| size | %sall-reduce over rdma, copy | rdma, zero-copy | over tcp | tcp time / rdma (copy) time |"
          % ("base " if p else ""))
    print("|---|---|---|---|---|")
    for s in sorted(rc):
        if s in rt and s in rz:
            a, z, t = rc[s]["time_us"], rz[s]["time_us"], rt[s]["time_us"]
            print(f"| {s >> 10} KiB | {a:.0f} us | {z:.0f} us | {t:.0f} us | {t / a:.2f} |")
print(f"(json: {sys.argv[2]})")
PY
