#!/usr/bin/env bash
# VM tier, kcoll.ko loaded: kcolld takes chunk_bytes/timeout_ms from sysfs,
# follows a `kcollctl set` (polled, the time printed), and kcollctl set refuses bad
# values and non-root writers with a message. TAP.
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
B=$top/${KCOLL_VM_BUILD:-build}
T=$(mktemp -d /tmp/tune.XXXXXX)
n=0 failed=0
ok() { n=$((n + 1)); if [ "$1" -eq 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; failed=1; fi; }
# VALUE SOURCE of a tunable from status --json (one line, compact); sed, not
# python3: under TCG on a busy host python's start-up alone took seconds per
# query, and the script ran past its 120 s.
tun() { "$B/bin/kcollctl" -s "$T/k.sock" status --json |
	sed -n "s/.*\"$1\":{\"value\":\([0-9]*\),\"source\":\"\([a-z]*\)\".*/\1 \2/p"; }
cleanup() { kill -TERM "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -rf "$T"; }

[ -d /sys/kernel/kcoll ] || { echo "Bail out! kcoll.ko not loaded"; exit 1; }
orig_chunk=$(cat /sys/kernel/kcoll/chunk_bytes)
env -u KCOLL_CHUNK_BYTES -u KCOLL_TIMEOUT_MS "$B/bin/kcolld" -f -s "$T/k.sock" -l "$T/k.log" &
pid=$!
trap cleanup EXIT
for _ in $(seq 100); do "$B/bin/kcollctl" -s "$T/k.sock" status >/dev/null 2>&1 && break; sleep 0.1; done

[ "$(tun chunk_bytes)" = "$orig_chunk sysfs" ]; ok $? "kcolld starts with sysfs chunk_bytes ($(tun chunk_bytes))"
"$B/bin/kcollctl" set chunk_bytes 131072; ok $? "kcollctl set chunk_bytes 131072"
# Poll with a generous deadline: under TCG on a busy host one status query
# (kcollctl + python3) alone can take seconds.
follows() {	# tunable value: 0 once status shows it from sysfs (60 s at most)
	local t0=$SECONDS
	while [ $((SECONDS - t0)) -lt 60 ]; do
		[ "$(tun "$1")" = "$2 sysfs" ] && return 0
		sleep 0.1
	done
	return 1
}
t0=$SECONDS
follows chunk_bytes 131072; ok $? "kcolld follows the change ($((SECONDS - t0)) s, polled)"
grep -q "tunable chunk_bytes: $orig_chunk -> 131072" "$T/k.log"; ok $? "the change is logged"
"$B/bin/kcollctl" set timeout_ms 1500 && follows timeout_ms 1500; ok $? "timeout_ms followed too"
out=$("$B/bin/kcollctl" set chunk_bytes 1000 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "out of range" <<<"$out"; ok $? "a value sysfs refuses: exit 1 and why"
[ "$(cat /sys/kernel/kcoll/chunk_bytes)" = 131072 ]; ok $? "the refused write changed nothing"
out=$(setpriv --reuid 65534 --regid 65534 --clear-groups "$B/bin/kcollctl" set chunk_bytes 65536 2>&1); rc=$?
[ $rc -eq 1 ] && grep -qi "root\|permission" <<<"$out"; ok $? "a non-root writer is refused, saying why"
"$B/bin/kcollctl" set no_such_knob 1 2>&1 | grep -q "no such tunable"; ok $? "an unknown tunable is named"
echo "$orig_chunk" > /sys/kernel/kcoll/chunk_bytes
echo 30000 > /sys/kernel/kcoll/timeout_ms
echo "1..$n"
exit $failed
