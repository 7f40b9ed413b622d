#!/usr/bin/env bash
# KV-cache transfers beside their ceilings, in one run (docs/perf/kv.md section
# "KV-cache transfers"):
#   1. same host: kcoll-kvbench local (shm and malloc buffers) with its memcpy
#      anchor measured in the same process run, write, 4 KiB .. 4 MiB blocks;
#   2. across namespaces: a 2-host netns cluster (prefix kvb$$), kcoll-kvbench
#      target on host 0 and initiator on host 1, beside iperf3 with as many
#      parallel streams as kcolld uses (KCOLL_KV_STREAMS, default 4) between
#      the same namespaces, measured right before and after, and beside the
#      raw TCP anchor that moves the SAME batches with no kcolld
#      (kcoll-kvbench -m tcp-sink on host 0, -m tcp-source on host 1: the
#      same generator, seeds and 256 MiB buffers, KCOLL_KV_STREAMS plain TCP
#      streams, each batch split evenly over them, one sendmsg/recvmsg of
#      iovecs per stream and batch straight from/into the blocks); and the
#      same two again with 64 KiB..4 MiB blocks of the first 8 MiB of each
#      segment only, which stay in cache like iperf3's one buffer, so that
#      kcoll meets iperf3 on the bytes iperf3 moves.
#   scripts/bench-kv.sh [BUILD [BASE]]  (root for part 2; run under flock
#                                        /tmp/kcoll-heavy.lock on shared machines)
# KV_BENCH_ROUNDS=N (default 1) repeats part 2 N times, each round iperf3 then
# kcoll, with a last iperf3 after the last round: a round's ceiling is the
# higher of the iperf3 readings around it, and the table gives the median
# over rounds (the load of a shared machine moves between readings). With a
# second build dir BASE, every round also runs BASE's kcolld and kvbench
# (daemons restarted for each), in alternating order: an A/B of two builds in
# one run; part 1 then runs BASE's kcolld and kvbench too, right after
# BUILD's (tables and JSON keys "base-local-*"); a last table gives
# BUILD / BASE row by row (GB/s over GB/s; across namespaces the median over
# rounds, per-round ratios in brackets). KV_BENCH_PARTS=net skips part 1,
# KV_BENCH_PARTS=local part 2. KV_BENCH_DURATION=S (default 2,
# whole seconds: iperf3 -t takes an integer and runs forever on 0).
# KV_BENCH_RAW_MEM="KIND..." (default anon) runs the raw TCP anchor once per
# memory kind of kcoll-kvbench --tcp-mem (anon, memfd, anon-huge,
# memfd-huge) in every round; the first kind is the table's "raw TCP", the
# others get a table of their own (rawtcp_<kind>_rounds in the JSON).
# Prints the tables and writes docs/perf/kv-<date>.json.
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/scripts/bench-lib.sh"
bench_opts "$@"
B=${1:-build}
BASE=${2:-}
ROUNDS=${KV_BENCH_ROUNDS:-1}
PARTS=${KV_BENCH_PARTS:-local,net}
bdir() { case $1 in /*) echo "$1" ;; *) echo "$top/$1" ;; esac; }
bench_build_dir "$(bdir "$B")" "$B"
[ -z "$BASE" ] || bench_build_dir "$(bdir "$BASE")" "$BASE"
BIN="$(bdir "$B")/bin"
C="$top/scripts/netns-cluster.sh"
DUR=${KV_BENCH_DURATION:-2}
# Part 2's ceiling is iperf3's: say so before anything runs, not as a
# traceback from the JSON it did not print.
case ,$PARTS, in *,net,*)
	command -v iperf3 >/dev/null || { echo "bench-kv: iperf3 missing (part 2 measures its ceiling with it):" \
		"install it with 'scripts/deps.sh --bench' (root), or run only part 1 with KV_BENCH_PARTS=local" >&2
		exit 2; } ;;
esac
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
case ,$PARTS, in *,local,*) ;; *) echo "(skipped: KV_BENCH_PARTS=$PARTS)"; echo '{"rows":[]}' |
	tee "$T/local-shm.json" "$T/local-shm-4k.json" >"$T/local-malloc.json" ;; esac
local_run() {	# BIN PREFIX: that build's kcolld and kvbench, same host
"$1/kcolld" -f -s "$T/kcolld.sock" -l "$T/kcolld.log" &
dpid=$!
for _ in $(seq 100); do [ -S "$T/kcolld.sock" ] && break; sleep 0.05; done
export KCOLL_SOCKET="$T/kcolld.sock"
"$1/kcoll-kvbench" -d "$DUR" -b 4K,64K,256K,1M,4M -B 64 --json >"$T/$2local-shm.json"
"$1/kcoll-kvbench" -d "$DUR" -b 4K -B 1024 --json >"$T/$2local-shm-4k.json"
"$1/kcoll-kvbench" -d "$DUR" -b 4K,64K,256K,1M,4M -B 64 -M malloc --json >"$T/$2local-malloc.json"
kill "$dpid"; wait "$dpid" 2>/dev/null; dpid=
unset KCOLL_SOCKET
}
case ,$PARTS, in *,local,*)
local_run "$BIN" ""
[ -z "$BASE" ] || local_run "$(bdir "$BASE")/bin" base-
;; esac

echo "# 2. across namespaces"
case ,$PARTS, in *,net,*) ;; *) ROUNDS=0; echo "(skipped: KV_BENCH_PARTS=$PARTS)" ;; esac
((ROUNDS == 0)) || "$C" up -H 2 >"$T/up.log" 2>&1 || { cat "$T/up.log"; exit 1; }
A0=10.10.0.1 A0b=10.20.0.1	# host 0 on the two networks
iperf() {	# -> GB/s host1 -> host0 with $STREAMS streams
	"$C" exec 0 iperf3 -s -1 -B "$A0" >/dev/null 2>&1 &
	sleep 0.5
	"$C" exec 1 iperf3 -c "$A0" -P "$STREAMS" -t "$DUR" -J 2>/dev/null |
		python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 8e9)'
	wait
}
kvrun() {	# BUILD TAG: restart both kcollds from BUILD, kvbench target/initiator
	local bin; bin="$(bdir "$1")/bin"
	KCOLL_BUILD="$(bdir "$1")" "$C" restart 0 >/dev/null && KCOLL_BUILD="$(bdir "$1")" "$C" restart 1 >/dev/null ||
		{ echo "bench-kv: cannot start $1's kcolld" >&2; exit 1; }
	rm -f "$T/desc"
	"$C" exec 0 "$bin/kcoll-kvbench" -m target -D "$T/desc" -s 256M 2>/dev/null &
	tgt=$!
	"$C" exec 1 "$bin/kcoll-kvbench" -m initiator -D "$T/desc" -d "$DUR" -b 4K,64K,256K,1M,4M -B 64 \
		--json >"$T/$2.json"
	"$C" exec 1 "$bin/kcoll-kvbench" -m initiator -D "$T/desc" -d "$DUR" -b 4K -B 1024 \
		--json >"$T/$2-4k.json"
	"$C" exec 1 "$bin/kcoll-kvbench" -m initiator -D "$T/desc" -d "$DUR" -s "$CACHE_SEG" \
		-b "$CACHE_BLOCKS" -B 64 --json >"$T/$2-c.json"
	kill "$tgt"; wait "$tgt" 2>/dev/null
}
# The cache-resident rows: blocks of the first CACHE_SEG bytes of both
# segments only, which stay in cache as iperf3's one buffer does (the 256 MiB
# rows sweep DRAM, where iperf3 never goes).
CACHE_SEG=8M CACHE_BLOCKS=64K,1M,4M
read -r -a RAWMEM <<<"${KV_BENCH_RAW_MEM:-anon}"
rawtcp() {	# TAG KIND: the raw TCP anchor, same batches, no kcolld (BUILD's kvbench)
	# streams over both of host 0's addresses in turn, as kcolld's (a
	# descriptor carries every address of the owner's host)
	local mem=(); [ "$2" = anon ] || mem=(--tcp-mem "$2")	# anon: as before the option
	"$C" exec 0 "$BIN/kcoll-kvbench" -m tcp-sink -A 0.0.0.0:47811 -s 256M "${mem[@]}" 2>/dev/null &
	local snk=$!
	"$C" exec 1 "$BIN/kcoll-kvbench" -m tcp-source -A "$A0:47811,$A0b:47811" -s 256M -d "$DUR" \
		"${mem[@]}" -b 4K,64K,256K,1M,4M -B 64 --json >"$T/$1.json" &&
	"$C" exec 1 "$BIN/kcoll-kvbench" -m tcp-source -A "$A0:47811,$A0b:47811" -s 256M -d "$DUR" \
		"${mem[@]}" -b 4K -B 1024 --json >"$T/$1-4k.json" ||
		{ echo "bench-kv: the raw TCP anchor failed" >&2; kill "$snk"; exit 1; }
	kill "$snk"; wait "$snk" 2>/dev/null
	[ "$2" = "${RAWMEM[0]}" ] || return 0	# cache-resident: the first kind only
	"$C" exec 0 "$BIN/kcoll-kvbench" -m tcp-sink -A 0.0.0.0:47812 -s "$CACHE_SEG" "${mem[@]}" 2>/dev/null &
	snk=$!
	"$C" exec 1 "$BIN/kcoll-kvbench" -m tcp-source -A "$A0:47812,$A0b:47812" -s "$CACHE_SEG" -d "$DUR" \
		"${mem[@]}" -b "$CACHE_BLOCKS" -B 64 --json >"$T/$1-c.json" ||
		{ echo "bench-kv: the raw TCP anchor (cache-resident) failed" >&2; kill "$snk"; exit 1; }
	kill "$snk"; wait "$snk" 2>/dev/null
}
for ((r = 0; r < ROUNDS; r++)); do
	cut -d' ' -f1-3 /proc/loadavg >>"$T/load"
	echo "iperf3 $(iperf)" >>"$T/iperf"
	rawtcp "raw$r" "${RAWMEM[0]}"
	for kind in "${RAWMEM[@]:1}"; do rawtcp "raw$r-$kind" "$kind"; done
	if [ -n "$BASE" ] && ((r % 2)); then kvrun "$B" "net$r"; kvrun "$BASE" "base$r"
	elif [ -n "$BASE" ]; then kvrun "$BASE" "base$r"; kvrun "$B" "net$r"
	else kvrun "$B" "net$r"; fi
done
((ROUNDS)) && echo "iperf3 $(iperf)" >>"$T/iperf"

python3 - "$T" "$out" "$STREAMS" "$ROUNDS" "$B" "$BASE" "${RAWMEM[*]}" "$CACHE_SEG" <<'PY'
import json, os, statistics, sys
d, out, streams, rounds, build, base, rawmem, cache_seg = sys.argv[1:9]
rawmem = rawmem.split()
rounds = int(rounds)
load = lambda n: json.load(open(f"{d}/{n}.json"))
ips = [float(l.split()[1]) for l in open(f"{d}/iperf")] if rounds else []
res = {n: load(n) for n in ("local-shm", "local-shm-4k", "local-malloc")}
res["iperf3_GBps"] = ips	# before round 0, between rounds, after the last
res["iperf3_streams"] = int(streams)
res["loadavg"] = [l.strip() for l in open(f"{d}/load")] if rounds else []	# at each round's start
res["rawtcp_rounds"] = [load(f"raw{r}")["rows"] + load(f"raw{r}-4k")["rows"] for r in range(rounds)]
res["rawtcp_mem"] = rawmem	# the kinds; rawtcp_rounds is the first
res["cache_seg"] = cache_seg
res["rawtcp_cache_rounds"] = [load(f"raw{r}-c")["rows"] for r in range(rounds)]
for m in rawmem[1:]:
    res[f"rawtcp_{m}_rounds"] = [load(f"raw{r}-{m}")["rows"] + load(f"raw{r}-{m}-4k")["rows"]
                                 for r in range(rounds)]
res["builds"] = {"net": build, "base": base or None}
if base and os.path.exists(f"{d}/base-local-shm.json"):
    for n in ("local-shm", "local-shm-4k", "local-malloc"):
        res["base-" + n] = load("base-" + n)
for k in ("net", "base") if base else ("net",):
    res[f"{k}_rounds"] = [load(f"{k}{r}")["rows"] + load(f"{k}{r}-4k")["rows"] for r in range(rounds)]
    res[f"{k}_cache_rounds"] = [load(f"{k}{r}-c")["rows"] for r in range(rounds)]
if rounds:
    res["net"], res["net-4k"] = load("net0"), load("net0-4k")	# round 0 as before
json.dump(res, open(out, "w"), indent=1)
def table(title, rows, anchor=None, aname="memcpy"):
    print(f"\n{title}\n| block | batch | GB/s | {aname} GB/s | ratio | avg us | p50 us | p99 us | p99.9 us |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        a = r.get("memcpy_GBps", anchor)
        print(f"| {r['block']} | {r['batch']} | {r['GBps']:.2f} | {a:.2f} | {r['GBps']/a:.2f} | "
              f"{r['avg_us']:.0f} | {r['p50_us']:.0f} | {r['p99_us']:.0f} | {r['p999_us']:.0f} |")
if res["local-shm"]["rows"]:
    table("same host, kcoll_mem_alloc buffers (zero copy in kcolld) vs memcpy",
          res["local-shm"]["rows"] + res["local-shm-4k"]["rows"])
    table("same host, malloc buffers (process_vm_readv + process_vm_writev) vs memcpy",
          res["local-malloc"]["rows"])
if res.get("base-local-shm", {}).get("rows"):
    table(f"same host, base build {base}, kcoll_mem_alloc buffers vs memcpy",
          res["base-local-shm"]["rows"] + res["base-local-shm-4k"]["rows"])
    table(f"same host, base build {base}, malloc buffers vs memcpy", res["base-local-malloc"]["rows"])
if rounds:
    ceil = [max(ips[r], ips[r + 1]) for r in range(rounds)]
    keys = ("base", "net") if base else ("net",)
    name = {"net": build, "base": base}
    med = statistics.median
    print(f"\nacross namespaces (TCP, {streams} streams), {rounds} round(s); iperf3 -P {streams} GB/s: "
          f"{', '.join(f'{x:.2f}' for x in ips)} (a round's iperf3 ceiling is the higher reading "
          f"around it); raw TCP = the same batches over {streams} plain TCP streams, no kcolld, "
          f"measured in the round; load average at each round's start: {'; '.join(res['loadavg'])}; "
          f"medians over rounds (per-round ratios in brackets)")
    hdr = "| block | batch | iperf3 GB/s | raw TCP GB/s | " + " | ".join(
        f"{name[k]} GB/s | {name[k]} / iperf3 | {name[k]} / raw TCP | {name[k]} p50 / p99 us" for k in keys) + " |"
    print(hdr + "\n" + "|---" * (4 + 4 * len(keys)) + "|")
    for i, r0 in enumerate(res["net_rounds"][0]):
        raw = [res["rawtcp_rounds"][r][i]["GBps"] for r in range(rounds)]
        cells = [f"{med(ceil):.2f}", f"{med(raw):.2f}"]
        for k in keys:
            rows = [res[f"{k}_rounds"][r][i] for r in range(rounds)]
            g = [x["GBps"] for x in rows]
            q = [g[r] / ceil[r] if ceil[r] > 0 else 0 for r in range(rounds)]
            w = [g[r] / raw[r] if raw[r] > 0 else 0 for r in range(rounds)]
            cells += [f"{med(g):.2f}", f"{med(q):.2f} [{' '.join(f'{x:.2f}' for x in q)}]",
                      f"{med(w):.2f} [{' '.join(f'{x:.2f}' for x in w)}]",
                      f"{med(x['p50_us'] for x in rows):.0f} / {med(x['p99_us'] for x in rows):.0f}"]
        print(f"| {r0['block']} | {r0['batch']} | " + " | ".join(cells) + " |")
    print(f"\ncache-resident blocks: the first {res['cache_seg']} of each segment only, kcoll and the "
          f"raw TCP anchor alike (iperf3 resends one buffer from cache); same rounds, same iperf3 "
          f"ceilings; medians, per-round ratios in brackets")
    print("| block | batch | iperf3 GB/s | raw TCP GB/s | " + " | ".join(
        f"{name[k]} GB/s | {name[k]} / iperf3 | {name[k]} / raw TCP" for k in keys) + " |")
    print("|---" * (4 + 3 * len(keys)) + "|")
    for i, r0 in enumerate(res["net_cache_rounds"][0]):
        raw = [res["rawtcp_cache_rounds"][r][i]["GBps"] for r in range(rounds)]
        cells = [f"{med(ceil):.2f}", f"{med(raw):.2f}"]
        for k in keys:
            g = [res[f"{k}_cache_rounds"][r][i]["GBps"] for r in range(rounds)]
            q = [g[r] / ceil[r] if ceil[r] > 0 else 0 for r in range(rounds)]
            w = [g[r] / raw[r] if raw[r] > 0 else 0 for r in range(rounds)]
            cells += [f"{med(g):.2f}", f"{med(q):.2f} [{' '.join(f'{x:.2f}' for x in q)}]",
                      f"{med(w):.2f} [{' '.join(f'{x:.2f}' for x in w)}]"]
        print(f"| {r0['block']} | {r0['batch']} | " + " | ".join(cells) + " |")
    for m in rawmem[1:]:
        print(f"\nraw TCP anchor on {m} memory beside it on {rawmem[0]} (same rounds): medians, "
              f"per-round ratios in brackets")
        print(f"| block | batch | raw {rawmem[0]} GB/s | raw {m} GB/s | {m} / {rawmem[0]} | " +
              " | ".join(f"{name[k]} / raw {m}" for k in keys) + " |")
        print("|---" * (5 + len(keys)) + "|")
        for i, r0 in enumerate(res["net_rounds"][0]):
            a = [res["rawtcp_rounds"][r][i]["GBps"] for r in range(rounds)]
            b = [res[f"rawtcp_{m}_rounds"][r][i]["GBps"] for r in range(rounds)]
            q = [b[r] / a[r] if a[r] > 0 else 0 for r in range(rounds)]
            cells = [f"{med(a):.2f}", f"{med(b):.2f}", f"{med(q):.2f} [{' '.join(f'{x:.2f}' for x in q)}]"]
            for k in keys:
                g = [res[f"{k}_rounds"][r][i]["GBps"] for r in range(rounds)]
                w = [g[r] / b[r] if b[r] > 0 else 0 for r in range(rounds)]
                cells.append(f"{med(w):.2f} [{' '.join(f'{x:.2f}' for x in w)}]")
            print(f"| {r0['block']} | {r0['batch']} | " + " | ".join(cells) + " |")
if base:	# the A/B itself: BUILD's GB/s over BASE's, row by row
    med = statistics.median
    def ab(g, h):
        return f"{g / h:.2f}" if h > 0 else "-"
    local = {}
    for n in ("local-shm", "local-shm-4k", "local-malloc"):
        for r, q in zip(res[n]["rows"], res.get("base-" + n, {}).get("rows", [])):
            local[(n.replace("-4k", ""), r["block"], r["batch"])] = ab(r["GBps"], q["GBps"])
    print(f"\n{build} / {base}, GB/s over GB/s: same host (one run each, {base} right after), "
          f"across namespaces (median over rounds, per-round ratios in brackets)")
    print("| block | batch | same host shm | same host malloc | across namespaces |")
    print("|---|---|---|---|---|")
    blocks = [(r["block"], r["batch"]) for r in (res["net_rounds"][0] if rounds else
              res["local-shm"]["rows"] + res["local-shm-4k"]["rows"])]
    def net(k, i):
        q = [res[f"net{k}"][r][i]["GBps"] / res[f"base{k}"][r][i]["GBps"]
             if res[f"base{k}"][r][i]["GBps"] > 0 else 0 for r in range(rounds)]
        return f"{med(q):.2f} [{' '.join(f'{x:.2f}' for x in q)}]" if q else "-"
    for i, (b, n) in enumerate(blocks):
        print(f"| {b} | {n} | {local.get(('local-shm', b, n), '-')} | "
              f"{local.get(('local-malloc', b, n), '-')} | {net('_rounds', i) if rounds else '-'} |")
    for i, r0 in enumerate(res["net_cache_rounds"][0] if rounds else []):
        print(f"| cache-resident {r0['block']} | {r0['batch']} | - | - | {net('_cache_rounds', i)} |")
print(f"\nraw results: {out}")
PY
