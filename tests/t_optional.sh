#!/usr/bin/env bash
# The optional parts stay optional at run time (issue 22; docs/architecture.md
# "Optional parts"): libibverbs is dlopened (rdma/ibv_dl.c), not linked.
#   1. no NEEDED libibverbs in kcolld, the test programs and the helpers
#      (readelf -d); kv_hostile is a raw verbs tool and keeps it
#   2. two kcolld on loopback whose loader is pointed at a missing library
#      (KCOLL_IB_LIB) start, log why RDMA is not used, and a 2-rank
#      communicator across them (one rank per daemon) runs one of each
#      collective over TCP
# tests/test_ibv_dl.c checks the loader against this machine's libibverbs.
# No root, no netns. TAP.
set -u
B=${KCOLL_BUILD:?run through tests/run.sh}
RANK="$B/tests/mh_rank"
n=0 failed=0
ok() { n=$((n + 1)); if [ "$1" -eq 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; failed=1; fi; }
skip() { n=$((n + 1)); echo "ok $n # SKIP $1"; }

T=$(mktemp -d "${KCOLL_TEST_TMP:-/tmp}/optional.XXXXXX")
pids=()
cleanup() {
	local p
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null && wait "$p"; done
	rm -rf "$T"
}
trap cleanup EXIT

# ---- 1. nothing links libibverbs
if ! command -v readelf >/dev/null; then
	skip "readelf (binutils) is missing"
else
	bins=("$B/bin/kcolld" "$RANK")
	for f in "$B"/tests/test_* "$B/tests/rdma_onesided"; do
		[ -f "$f" ] && [ -x "$f" ] && bins+=("$f")
	done
	bad=
	for f in "${bins[@]}"; do
		if [ ! -f "$f" ]; then
			bad+=" ${f#"$B"/} (missing)"
		elif ! readelf -d "$f" >"$T/dyn" 2>&1; then
			bad+=" ${f#"$B"/} (readelf failed)"
		elif grep -q 'NEEDED.*libibverbs' "$T/dyn"; then
			bad+=" ${f#"$B"/}"
		fi
	done
	[ -z "$bad" ]; ok $? "no NEEDED libibverbs in kcolld and ${#bins[@]} test programs${bad:+ (in:$bad)}"
fi

# ---- 2. kcolld without libibverbs: TCP, the reason logged, collectives work
[ -x "$RANK" ] || { echo "Bail out! $RANK missing: run make"; exit 1; }
lib=/nonexistent/libibverbs.so.1
for i in 0 1; do
	KCOLL_IB_LIB=$lib KCOLL_NET_XPORT=auto "$B/bin/kcolld" -f -s "$T/d$i.sock" -l "$T/d$i.log" \
		--listen 127.0.0.1:0 --addrs 127.0.0.1 >"$T/d$i.out" 2>&1 &
	pids+=($!)
done
up=0
for i in 0 1; do
	for _ in $(seq 300); do [ -S "$T/d$i.sock" ] && break; sleep 0.1; done
	kill -0 "${pids[$i]}" 2>/dev/null && [ -S "$T/d$i.sock" ] && up=$((up + 1))
done
[ $up -eq 2 ]; ok $? "KCOLL_IB_LIB=$lib: both kcolld start ($up of 2)"
for _ in $(seq 100); do grep -q "transport between daemons" "$T/d0.log" 2>/dev/null && break; sleep 0.1; done
line=$(grep -m1 "transport between daemons" "$T/d0.log")
grep -q "transport between daemons: tcp (rdma not used: cannot load libibverbs ($lib: .*install rdma-core's libibverbs1" <<<"$line"
ok $? "the log says TCP and why: ${line#*] }"

id=$(KCOLL_SOCKET="$T/d0.sock" timeout 10 "$RANK" id)
for r in 0 1; do
	KCOLL_SOCKET="$T/d$r.sock" timeout -k 2 120 "$RANK" check "$id" 2 "$r" >"$T/r$r.out" 2>&1 &
	rp[r]=$!
done
rc=0
for r in 0 1; do wait "${rp[$r]}" || rc=$((rc + 1)); done
groups=$(grep -h '^group ' "$T/r0.out" "$T/r1.out")
[ -n "$id" ] && [ $rc -eq 0 ] && [ "$(grep -c ' bad=0 ' <<<"$groups")" -eq 2 ]
ok $? "a 2-rank communicator across the two daemons: one of each collective, bit-exact (${groups//$'\n'/; })"
if [ $rc -ne 0 ]; then
	sed 's/^/# r0: /' "$T/r0.out" | head -20
	sed 's/^/# r1: /' "$T/r1.out" | head -20
	tail -n 10 "$T/d0.log" "$T/d1.log" | sed 's/^/# /'
fi
tr=$("$B/bin/kcollctl" -s "$T/d0.sock" status 2>&1 | grep -m1 '^transport between daemons')
grep -q "^transport between daemons: tcp (rdma not used: cannot load libibverbs ($lib" <<<"$tr"
ok $? "kcollctl status says TCP and why: $tr"
js=$("$B/bin/kcollctl" -s "$T/d0.sock" status --json 2>&1 |
	python3 -c 'import json,sys; print(json.load(sys.stdin)["net_xport"])' 2>&1)
[ "$js" = "${tr#transport between daemons: }" ]; ok $? "and status --json has the same in net_xport"

echo "1..$n"
exit $failed
