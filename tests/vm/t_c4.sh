#!/usr/bin/env bash
# VM tier, kcoll.ko loaded: the C4 detector/planner core built into the
# module (kmod/c4_core.c = user/common/c4.c) runs in the kernel, and its
# thresholds are sysfs knobs that round-trip and that kcolld follows.
#   - /sys/kernel/kcoll/c4_selftest (0400) feeds the in-kernel core a
#     synthetic 4-host trace: 40 healthy ticks raise nothing; host 0's link 1
#     at 10% raises communication slow naming host 0, link 1; the planner
#     moves host 0's stream 1 to link 0 (avoid degraded link);
#   - slow_ratio_pct, hang_ms, straggler_ms: written values read back, bad
#     ones refused (EINVAL) leaving the value; the self-test runs with them
#     (slow_ratio_pct 10000: the 10% link is no longer slow);
#   - kcolld (no KCOLL_C4_* in its environment) takes them from sysfs and
#     follows `kcollctl set straggler_ms`.
# TAP.
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
B=$top/${KCOLL_VM_BUILD:-build}
S=/sys/kernel/kcoll
T=$(mktemp -d /tmp/c4vm.XXXXXX)
n=0 failed=0
ok() { n=$((n + 1)); if [ "$1" -eq 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; failed=1; fi; }
pid=
cleanup() {
	[ -n "$pid" ] && { kill -TERM "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; }
	echo 200 >$S/slow_ratio_pct; echo 5000 >$S/hang_ms; echo 20 >$S/straggler_ms
	rm -rf "$T"
}
trap cleanup EXIT

[ -d $S ] || { echo "Bail out! kcoll.ko not loaded"; exit 1; }
[ -r $S/c4_selftest ] || { echo "Bail out! $S/c4_selftest missing (kcoll.ko without the C4 core)"; exit 1; }
kv() { sed -n "s/.*\\b$1=\\([^ ]*\\).*/\\1/p" | head -1; }	# key=value from a line on stdin

out=$(cat $S/c4_selftest); rc=$?
printf '%s\n' "$out" | sed 's/^/# /'
ok $rc "read $S/c4_selftest"
[ "$(grep '^healthy' <<<"$out" | kv events)" = 0 ]
ok $? "in-kernel core: 40 healthy evaluations raise nothing"
deg=$(grep '^degraded' <<<"$out")
[ "$(kv raised <<<"$deg")" = comm_slow ] && [ "$(kv host <<<"$deg")" = 0 ] && [ "$(kv link <<<"$deg")" = 1 ]
ok $? "in-kernel core: host 0's link 1 at 10% -> communication slow, host 0, link 1 ($deg)"
grep -q '^plan host=0 stream=0 link=0 stream=1 link=0 why="avoid degraded link"' <<<"$out"
ok $? "in-kernel planner: host 0's stream 1 moves to link 0, avoiding the degraded link"
[ "$(stat -c %a $S/c4_selftest)" = 400 ]
ok $? "c4_selftest is root-only (mode $(stat -c %a $S/c4_selftest))"

# Knobs round-trip; refused writes change nothing.
for kvp in slow_ratio_pct:350 hang_ms:2500 straggler_ms:37; do
	k=${kvp%%:*} v=${kvp#*:}
	echo "$v" >$S/$k
	[ "$(cat $S/$k)" = "$v" ]
	ok $? "$k: wrote $v, read $(cat $S/$k)"
	echo 0 >$S/$k 2>"$T/err"
	rc=$?
	[ $rc -ne 0 ] && grep -qi "invalid" "$T/err" && [ "$(cat $S/$k)" = "$v" ]
	ok $? "$k: 0 refused ($(tr -d '\n' <"$T/err")), still $(cat $S/$k)"
done
out=$(cat $S/c4_selftest)
grep -q "params slow_ratio_pct=350 hang_ms=2500 straggler_ms=37" <<<"$out"
ok $? "the self-test runs with the sysfs values ($(grep -o 'params.*' <<<"$out"))"
echo 10000 >$S/slow_ratio_pct
out=$(cat $S/c4_selftest)
[ "$(grep '^degraded' <<<"$out" | kv raised)" = none ]
ok $? "slow_ratio_pct 10000: the 10% link is within the threshold, nothing raised ($(grep '^degraded' <<<"$out"))"
echo 200 >$S/slow_ratio_pct

# kcolld follows them.
env -u KCOLL_C4_SLOW_RATIO_PCT -u KCOLL_C4_HANG_MS -u KCOLL_C4_STRAGGLER_MS \
	"$B/bin/kcolld" -f -s "$T/k.sock" -l "$T/k.log" &
pid=$!
for _ in $(seq 100); do "$B/bin/kcollctl" -s "$T/k.sock" status >/dev/null 2>&1 && break; sleep 0.1; done
tun() { "$B/bin/kcollctl" -s "$T/k.sock" status --json |
	python3 -c 'import json,sys; t=json.load(sys.stdin)["tunables"][sys.argv[1]]; print(t["value"], t["source"])' "$1"; }
[ "$(tun straggler_ms)" = "37 sysfs" ] && [ "$(tun hang_ms)" = "2500 sysfs" ]
ok $? "kcolld starts with sysfs straggler_ms ($(tun straggler_ms)) and hang_ms ($(tun hang_ms))"
"$B/bin/kcollctl" set straggler_ms 45
ok $? "kcollctl set straggler_ms 45"
for _ in $(seq 30); do [ "$(tun straggler_ms)" = "45 sysfs" ] && break; sleep 0.1; done
[ "$(tun straggler_ms)" = "45 sysfs" ] && [ "$(cat $S/straggler_ms)" = 45 ]
ok $? "sysfs and kcolld follow ($(cat $S/straggler_ms); $(tun straggler_ms))"
echo "1..$n"
exit $failed
