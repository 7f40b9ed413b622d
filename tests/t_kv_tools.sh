#!/usr/bin/env bash
# kcoll-kvbench and examples/kv_prefill_decode against the test kcolld:
# usage errors, a short local sweep (table and JSON: every row measured,
# percentiles ordered, the memcpy anchor beside), read and many-to-one,
# target + initiator as two processes through a descriptor file, and the
# prefill/decode example moving a paged KV cache intact. No timing
# assertions. TAP.
set -u
B=${KCOLL_BUILD:?run through tests/run.sh}
KV="$B/bin/kcoll-kvbench"
EX="$B/bin/kv_prefill_decode"
T=$(mktemp -d "${KCOLL_TEST_TMP:-/tmp}/kvtools.XXXXXX")
trap 'jobs -p | xargs -r kill 2>/dev/null; rm -rf "$T"' EXIT
n=0
ok() { n=$((n + 1)); if [ "$1" -eq 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; fi; }

"$KV" --help | grep -q -- "--pattern"; ok $? "kcoll-kvbench --help"
"$KV" --batch 5000 >/dev/null 2>&1; [ $? -eq 2 ]; ok $? "batch over the limit: usage error (exit 2)"
"$KV" --mode initiator >/dev/null 2>"$T/err"; [ $? -eq 2 ] && grep -q "need --desc" "$T/err"
ok $? "initiator without --desc: says what is missing"
# No kcolld: the forked target fails and local mode ends, saying why (it
# used to wait for the target for ever).
KCOLL_SOCKET="$T/none.sock" timeout 60 "$KV" -d 0.1 -b 64K -s 8M >/dev/null 2>"$T/err"; rc=$?
[ $rc -eq 1 ] && grep -q "kcolld is not running" "$T/err" && grep -q "target 0 failed to start" "$T/err"
ok $? "no kcolld: local mode exits 1, naming the cause (exit $rc)"

# JSON checks: rows, fields, order of percentiles; bytes is every batch
# counted, and the time it implies at GBps is at least a quarter of -d (a
# row measures about -d seconds) and, over all rows, no more than the wall
# time of the whole run (no tighter: the machine may be loaded).
jcheck() {	# file nrows anchor(0/1) duration start(date +%s.%N)
	python3 - "$@" <<'PY'
import json, sys, time
d = json.load(open(sys.argv[1]))
rows = d["rows"]
dur, wall = float(sys.argv[4]), time.time() - float(sys.argv[5])
assert len(rows) == int(sys.argv[2]), rows
for r in rows:
    assert r["batches"] > 0 and r["GBps"] > 0, r
    assert r["bytes"] == r["batches"] * r["batch"] * r["block"], r
    assert r["bytes"] / 1e9 / r["GBps"] >= dur / 4, (r, dur)
    assert 0 < r["p50_us"] <= r["p99_us"] <= r["p999_us"], r
    if sys.argv[3] == "1":
        assert r["memcpy_GBps"] > 0 and abs(r["ratio"] - r["GBps"] / r["memcpy_GBps"]) < 0.01, r
assert sum(r["bytes"] / 1e9 / r["GBps"] for r in rows) <= wall, (rows, wall)
PY
}
t0=$(date +%s.%N)
"$KV" -d 0.2 -b 4K,64K,1M -B 32 -s 16M --json >"$T/a.json" 2>"$T/a.err"
jcheck "$T/a.json" 3 1 0.2 "$t0"; ok $? "local write sweep: 3 rows with GB/s, percentiles and the memcpy ratio"
t0=$(date +%s.%N)
"$KV" -d 0.2 -b 64K -B 16 -s 8M -o read -M malloc -t 2 -p many-to-one --json >"$T/b.json" 2>"$T/b.err"
jcheck "$T/b.json" 1 1 0.2 "$t0"; ok $? "read, malloc buffers, 2 threads many-to-one"
"$KV" -d 0.2 -b 4K,1M -B 8 -s 8M | grep -cE '^ +[0-9]+ +8 ' | grep -qx 2; ok $? "table: one row per block size"

"$KV" --mode target --desc "$T/desc" -s 8M 2>"$T/t.err" &
tgt=$!
t0=$(date +%s.%N)
"$KV" --mode initiator --desc "$T/desc" -d 0.2 -b 64K -B 16 -s 8M --json >"$T/c.json" 2>"$T/c.err"
jcheck "$T/c.json" 1 0 0.2 "$t0"; ok $? "target and initiator processes through a descriptor file"
kill -TERM $tgt; wait $tgt; ok $? "the target ends cleanly on SIGTERM"

# The raw TCP anchor (tcp-sink / tcp-source) on loopback: every byte sent is
# confirmed by the sink (the source fails otherwise), 2 and 3 streams.
"$KV" --mode tcp-source >/dev/null 2>"$T/err"; [ $? -eq 2 ] && grep -q "need --addr" "$T/err"
ok $? "tcp-source without --addr: says what is missing"
for try in 1 2 3 4 5; do	# a port in use: the sink exits at once, try another
	port=$((20000 + ($$ * 7 + try * 977) % 20000))
	"$KV" --mode tcp-sink --addr "127.0.0.1:$port" -s 8M 2>"$T/s.err" &
	snk=$!
	sleep 0.5
	kill -0 $snk 2>/dev/null && break
done
for k in 2 3; do
	KCOLL_KV_STREAMS=$k "$KV" --mode tcp-source --addr "127.0.0.1:$port,localhost:$port" -d 0.2 -b 4K,100000 -B 7 -s 8M \
		--json >"$T/tcp$k.json" 2>"$T/tcp$k.err"
	rc=$?
	python3 - "$T/tcp$k.json" "$k" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["mode"] == "tcp-source" and d["streams"] == int(sys.argv[2]), d
assert [r["block"] for r in d["rows"]] == [4096, 100000], d
for r in d["rows"]:
    assert r["batch"] == 7 and r["bytes"] > 0 and r["GBps"] > 0, r
    assert r["batches"] == r["bytes"] // (r["batch"] * r["block"]), r
PY
	[ $? -eq 0 ] && [ $rc -eq 0 ]; ok $? "raw TCP anchor, $k streams: 2 rows, all bytes confirmed by the sink (exit $rc)"
done
# The anchor's buffer on another memory kind (--tcp-mem): a memfd collapsed
# into huge pages where the kernel can (a refusal is only reported).
"$KV" --mode tcp-source --addr "127.0.0.1:$port" --tcp-mem memfd-huge -d 0.2 -b 1M -B 3 -s 8M \
	--json >"$T/tcpm.json" 2>"$T/tcpm.err"
rc=$?
python3 - "$T/tcpm.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["mem"] == "memfd-huge" and [r["block"] for r in d["rows"]] == [1 << 20], d
r = d["rows"][0]
assert r["bytes"] > 0 and r["GBps"] > 0 and r["batches"] == r["bytes"] // (3 << 20), d
PY
[ $? -eq 0 ] && [ $rc -eq 0 ]; ok $? "raw TCP anchor from a memfd-huge buffer: all bytes confirmed (exit $rc)"
"$KV" --mode tcp-source --addr "127.0.0.1:$port" --tcp-mem bogus >/dev/null 2>"$T/err"
[ $? -eq 2 ] && grep -q "tcp-mem must be" "$T/err"; ok $? "--tcp-mem bogus: refused with what it takes"
kill -TERM $snk; wait $snk; ok $? "the tcp-sink ends cleanly on SIGTERM"

"$EX" --help | grep -q -- "--layers"; ok $? "kv_prefill_decode --help"
"$EX" --layers 4 --heads 4 --head-dim 64 --block-tokens 16 --blocks 64 --requests 6 \
	--max-tokens 512 >"$T/ex.out" 2>&1
rc=$?
[ $rc -eq 0 ] && grep -q "arrived intact" "$T/ex.out" && [ "$(grep -c '^decode  request' "$T/ex.out")" -eq 6 ]
ok $? "prefill/decode example: 6 requests, every page intact (exit $rc)"
grep "^prefill:" "$T/ex.out" | sed 's/^/# /'
"$EX" --max-tokens 4096 --blocks 64 >/dev/null 2>&1; [ $? -eq 2 ]; ok $? "example: a pool too small is refused"
echo "1..$n"
