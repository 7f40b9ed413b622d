#!/usr/bin/env bash
# kcollctl top: its rates add up to what kcolld counted. A --json top spans a
# kcoll-bench run; the sum over refreshes of allreduce ops/s x interval must
# equal the change of kcolld's own allreduce counter over the same window,
# and likewise bytes. Then the text view, an idle kcolld (all rates zero),
# and bad arguments and a missing daemon.
set -u
: "${KCOLL_BUILD:?run through tests/run.sh}" "${KCOLL_SOCKET:?}"
n=0
ok() { n=$((n + 1)); if [ "$1" -eq 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; fi; }
CTL=$KCOLL_BUILD/bin/kcollctl
py=/usr/bin/python3
T=$(mktemp -d "${KCOLL_TEST_TMP:-/tmp}/top.XXXXXX")
trap 'rm -rf "$T"' EXIT
counter() {	# name{labels}
	"$CTL" metrics | awk -v k="$1" '$1 == k { print $2 }'
}

a0=$(counter 'kcoll_ops_total{op="allreduce",status="ok"}')
b0=$(counter 'kcoll_op_bytes_total{op="allreduce"}')
timeout 60 "$CTL" top --json -d 0.5 -n 10 >"$T/top.json" 2>"$T/top.err" &
top=$!
sleep 0.3
timeout 60 "$KCOLL_BUILD/bin/kcoll-bench" allreduce -N 2 -b 64K -e 1M -n 20 -w 2 >"$T/bench.out" 2>&1
brc=$?
a1=$(counter 'kcoll_ops_total{op="allreduce",status="ok"}')
b1=$(counter 'kcoll_op_bytes_total{op="allreduce"}')
wait $top
trc=$?
ok $((brc + trc)) "top --json -d 0.5 -n 10 ran across a kcoll-bench run (exit $trc, bench $brc)"
sums=$($py - "$T/top.json" <<'X'
import json, sys
ops = byt = 0.0
lines = open(sys.argv[1]).read().splitlines()
for l in lines:
    d = json.loads(l)
    ops += d["ops"]["allreduce"]["ops_per_s"] * d["interval_s"]
    byt += d["ops"]["allreduce"]["bytes_per_s"] * d["interval_s"]
print(len(lines), "%.1f" % ops, "%.0f" % byt)
X
) || sums="0 0 0"
read -r lines tops topb <<<"$sums"
[ "$lines" -eq 10 ]
ok $? "10 refreshes, each one JSON object (got $lines)"
$py -c "import sys; a,b,c,d = map(float, sys.argv[1:]); sys.exit(0 if a > 0 and abs(a - b) <= max(2, 0.01 * b) and abs(c - d) <= 0.01 * d else 1)" \
	"$tops" "$((a1 - a0))" "$topb" "$((b1 - b0))"
ok $? "the rates add up to kcolld's counters: $tops allreduce ops and $topb B over the window, counters moved $((a1 - a0)) and $((b1 - b0))"

"$CTL" top -d 0.2 -n 2 >"$T/top.txt" 2>&1
rc=$?
[ $rc -eq 0 ] && grep -q '^OPERATION  *OPS/S  *MB/S' "$T/top.txt" && grep -q '^COMMUNICATOR' "$T/top.txt" &&
	grep -q '^LINK TO PEER' "$T/top.txt" && [ "$(grep -c '^kcolld: clients' "$T/top.txt")" -eq 2 ]
ok $? "the text view: two refreshes with the operation, communicator and link tables"
grep -q '^ANOMALIES ACTIVE: none' "$T/top.txt"
ok $? "... and no anomaly active on one host"

"$CTL" top --json -d 0.2 -n 2 | $py -c 'import json,sys
ls = [json.loads(l) for l in sys.stdin]
busy = [o for d in ls for o in d["ops"].values() if o["ops_per_s"] or o["bytes_per_s"]]
sys.exit(0 if len(ls) == 2 and not busy else 1)'
ok $? "an idle kcolld: every rate is zero"

"$CTL" top -d 0 -n 1 >/dev/null 2>"$T/e1"; r1=$?
"$CTL" top -n x >/dev/null 2>"$T/e2"; r2=$?
[ $r1 -eq 2 ] && [ $r2 -eq 2 ] && grep -q 'delay must be' "$T/e1" && grep -q 'needs a number' "$T/e2"
ok $? "bad -d / -n: exit 2 saying why ($(cat "$T/e1" "$T/e2" | tr '\n' ' '))"
"$CTL" -s "$T/nothing.sock" top -n 1 >/dev/null 2>"$T/e3"; r3=$?
[ $r3 -eq 1 ] && grep -q 'cannot reach kcolld' "$T/e3"
ok $? "no kcolld: exit 1, 'cannot reach kcolld'"
echo "1..$n"
