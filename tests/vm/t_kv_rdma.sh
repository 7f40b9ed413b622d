#!/usr/bin/env bash
# KV-cache transfers over RDMA (issue 9; docs/kv.md "Across hosts over
# RDMA") on Soft-RoCE, in the VM (tests/vm/run.sh runs it; needs root,
# rdma_rxe and the host's build). Two kcollds ("hosts" 10.33.0.1 and .2 on
# one veth with one rxe device, as in t_rdma.sh: rxe in this kernel sends
# from the initial namespace only), owners and initiators from tests/kv_peer
# with kcoll_mem_alloc'd buffers on both sides (what kcolld registers):
#   1. integrity: random scattered batches (1 B .. 16 MiB) and 4 KiB batches
#      written and read back, the owner's checksum equals the initiator's
#      image; bad input (wrong token, out of range, over the limit) refused
#      and writes nothing; the bytes went over RDMA (status counters)
#   2. four initiators at once, each 5 notifying batches into its slice: the
#      counter is exactly 20 and every slice holds its writer's pattern
#   2b. notifications: messages with batches over RDMA, each once, in order,
#      after their bytes; bad input, the full queue, the owner gone
#   2c. the same through the Python agent (kcoll.kv, tests/python/kv_check.py)
#   3. the owner unregisters during a flood: the initiator gets -EIDRM or
#      -ECONNRESET, no hang, the buffer does not change after unregister,
#      a neighbouring segment is untouched, the next write says -EIDRM
#   1b. a hostile peer (tests/kv_hostile.c, raw verbs): refused without the
#      token, its bad accesses fail, nothing outside its grant changes
#   3b. the initiator's kcolld, then the initiator process, killed mid-batch:
#      an error not a hang, connections dropped, counters count whole
#      batches, a neighbour intact, a fresh initiator's batch lands whole
#   4. the owner's kcolld is killed during a flood: the initiator's requests
#      fail (no hang) and its kcolld still serves
# Bounded (TCG): small buffers, about 1-3 minutes. TAP.
set -u
B=${1:?usage: t_kv_rdma.sh BUILD_DIR}
PEER="$B/tests/kv_peer"
D="$B/bin/kcolld"
CTL="$B/bin/kcollctl"
n=0
ok() { n=$((n + 1)); if [ "$1" -eq 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; fi; }
skip_all() { echo "ok 1 # SKIP $1"; echo "1..1"; exit 0; }

[ "$(id -u)" -eq 0 ] || skip_all "needs root"
[ -x "$PEER" ] && [ -x "$D" ] || { echo "Bail out! $B has no kcolld/kv_peer: run make"; exit 1; }
. "$(dirname "$0")/../../scripts/vm-rxe-setup.sh"
vm_rxe_load || skip_all "cannot load rdma_rxe: ${why:-no such module in this kernel}"

# Outside the guest's /tmp when KV_RDMA_KEEP names a directory (debugging).
T=$(mktemp -d "${KV_RDMA_KEEP:-/tmp}/kvrdma-vm.XXXXXX")
chmod 755 "$T"
IF=kvr0
RXE=kvrxe0
pids=()
cleanup() {
	local p
	jobs -p | xargs -r kill -KILL 2>/dev/null
	for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
	wait 2>/dev/null
	rdma link delete $RXE 2>/dev/null
	ip link del $IF 2>/dev/null
	[ -n "${KV_RDMA_KEEP:-}" ] || rm -rf "$T"
}
trap cleanup EXIT

vm_rxe_link $IF $RXE 10.33.0.1 10.33.0.2
ok $? "rxe device $RXE on $IF (10.33.0.1, 10.33.0.2)"

sock() { echo "$T/h$1.sock"; }
start_daemon() {	# host
	local h=$1
	env KCOLL_NET_XPORT=rdma KCOLL_TIMEOUT_MS=20000 KCOLL_LOG_LEVEL=info \
		"$D" -f -s "$(sock "$h")" -l "$T/h$h.log" --listen "10.33.0.$((h + 1)):0" \
		--addrs "10.33.0.$((h + 1))" >"$T/h$h.out" 2>&1 &
	pids[h]=$!
	for _ in $(seq 100); do [ -S "$(sock "$h")" ] && return 0; sleep 0.1; done
	return 1
}
on() {	# host cmd...: a client of that host's kcolld
	local h=$1
	shift
	KCOLL_SOCKET=$(sock "$h") "$@"
}
tap_checks() {	# prefix file
	local lines
	lines=$(grep '^check ' "$2")
	[ -n "$lines" ] || { ok 1 "$1$(basename "$2" .out) printed its checks"; sed 's/^/# /' "$2"; return; }
	while read -r _ name verdict rest; do
		name=${name%:}
		[ "$verdict" = PASS ]; ok $? "$1$name $rest"
	done <<<"$lines"
}
counter() {	# host field: a number from kcollctl status --json's "kv" object
	on "$1" "$CTL" status --json 2>/dev/null | grep -o "\"$2\":[0-9]*" | head -1 | cut -d: -f2
}
dump() {
	for h in 0 1; do tail -n 15 "$T/h$h.log" 2>/dev/null | sed "s/^/# h$h: /"; done
}

t_start=$(date +%s)
start_daemon 0 && start_daemon 1
ok $? "two kcollds up" || { dump; echo "1..$n"; exit 1; }

# ---- 1. integrity and bad input
mkdir -p "$T/a"
on 0 "$PEER" owner "$T/a" $((24 * 1024 * 1024)) shm >"$T/owner.out" 2>&1 &
owner=$!
KV_PEER_MIB=20 on 1 timeout -k 5 240 "$PEER" init "$T/a" shm >"$T/init.out" 2>&1
irc=$?
wait $owner
orc=$?
tap_checks "integrity: " "$T/init.out"
tap_checks "integrity: " "$T/owner.out"
[ $irc -eq 0 ] && [ $orc -eq 0 ]; ok $? "integrity: initiator and owner exit 0 (init $irc, owner $orc)"
cmp -s "$T/a/init_hash" "$T/a/owner_hash"
ok $? "integrity: the owner's 24 MiB buffer matches the initiator's image (checksum)"
rb=$(counter 1 rdma_bytes) rs=$(counter 0 rdma_sessions)
[ "${rb:-0}" -gt $((20 * 1024 * 1024)) ] && [ "${rs:-0}" -ge 1 ]
ok $? "integrity: the batches went over RDMA (initiator: ${rb:-?} bytes over rdma; owner: ${rs:-?} sessions)"
grep -q "over RDMA ($RXE)" "$T/h1.log"; ok $? "the initiator's kcolld logs the RDMA path"
[ $irc -eq 0 ] || dump

# ---- 1b. a hostile peer (tests/kv_hostile.c: raw TCP and libibverbs, not
# kcolld): no/wrong/another segment's token and no HELLO refused; outside
# the granted segment, another connection's rkey, after unregister: failed
# completions; nothing outside the granted 4 KiB changes; kcolld survives
# (and serves the legitimate initiators of 2. and 3.)
rs0=$(counter 0 rdma_sessions)
on 0 timeout -k 5 240 "$B/tests/kv_hostile" 10.33.0.2 >"$T/hostile.out" 2>&1
hrc=$?
tap_checks "hostile peer: " "$T/hostile.out"
[ $hrc -eq 0 ]; ok $? "hostile peer: kv_hostile exits 0 ($hrc)"
kill -0 "${pids[0]}" && on 0 "$CTL" status >/dev/null 2>&1
ok $? "hostile peer: the owner's kcolld survives and answers"
rs1=$(counter 0 rdma_sessions)
[ "${rs1:-0}" -gt "${rs0:-0}" ]
ok $? "hostile peer: its sessions reached the RDMA setup (owner's sessions ${rs0:-?} -> ${rs1:-?})"

# ---- 2. four initiators at once, counters exact
mkdir -p "$T/c"
on 0 "$PEER" count "$T/c" $((8 * 1024 * 1024)) 20 4 >"$T/count.out" 2>&1 &
owner=$!
parts=()
for i in 0 1 2 3; do
	on 1 timeout -k 5 240 "$PEER" part "$T/c" $i 4 5 shm >"$T/part$i.out" 2>&1 &
	parts+=($!)
done
prc=0
for p in "${parts[@]}"; do wait "$p" || prc=$?; done
wait $owner
orc=$?
for i in 0 1 2 3; do tap_checks "concurrent: " "$T/part$i.out"; done
tap_checks "concurrent: " "$T/count.out"
[ $prc -eq 0 ] && [ $orc -eq 0 ]; ok $? "concurrent: 4 initiators and the owner exit 0 (parts $prc, owner $orc)"
[ $prc -eq 0 ] || dump

# ---- 2b. notifications over RDMA (docs/kv.md "Notifications"): two parts,
# kcoll_mem_alloc'd like the owner, 16 batches of 256 KiB with a message
# each, 4 in flight; each message once, in order, after its bytes; bad
# input, the full queue (-ENOBUFS, then a plain batch), the owner gone.
mkdir -p "$T/n"
rb0=$(counter 1 rdma_bytes)
on 0 "$PEER" notif-owner "$T/n" $((8 * 1024 * 1024)) 2 16 shm >"$T/nowner.out" 2>&1 &
owner=$!
on 1 timeout -k 5 240 "$PEER" notif-part "$T/n" 1 2 16 shm >"$T/npart1.out" 2>&1 &
p1=$!
on 1 timeout -k 5 240 "$PEER" notif-part "$T/n" 0 2 16 shm >"$T/npart0.out" 2>&1
p0rc=$?
wait $p1; p1rc=$?
wait $owner; orc=$?
for f in npart0 npart1 nowner; do tap_checks "notif: " "$T/$f.out"; done
[ $p0rc -eq 0 ] && [ $p1rc -eq 0 ] && [ $orc -eq 0 ]
ok $? "notif: both parts and the owner exit 0 (parts $p0rc $p1rc, owner $orc)"
rb1=$(counter 1 rdma_bytes)
[ $((${rb1:-0} - ${rb0:-0})) -ge $((8 * 1024 * 1024)) ]
ok $? "notif: the batches went over RDMA (${rb0:-?} -> ${rb1:-?} bytes)"
[ $p0rc -eq 0 ] || dump

# ---- 2c. the Python agent (kcoll.kv; tests/python/kv_check.py owner/init
# with Agent.alloc'd segments, which kcolld moves over RDMA): 8 tagged
# batches of ~1000 scattered blocks, every byte there when its tag comes,
# the counter, the full notification queue with batches in flight, an
# entry past the end, the owner's segment gone; the bytes went over RDMA.
PY=/usr/bin/python3
if ! "$PY" -c 'import numpy' 2>/dev/null; then
	n=$((n + 1)); echo "ok $n # SKIP the Python agent over RDMA: no numpy for $PY (apt-get install python3-numpy)"
else
	mkdir -p "$T/py"
	top=$(cd "$(dirname "$0")/../.." && pwd)
	kvpy() { on "$1" env PYTHONPATH="$top/user/python" PYTHONDONTWRITEBYTECODE=1 \
		KCOLL_LIB="$(cd "$B" && pwd)/lib/libkcoll.so.1" timeout -k 5 240 "$PY" "$top/tests/python/kv_check.py" "${@:2}"; }
	b0=$(counter 1 bytes) rb0=$(counter 1 rdma_bytes)
	kvpy 0 owner "$T/py" 8 mapped >"$T/pyowner.out" 2>&1 &
	owner=$!
	kvpy 1 init "$T/py" 8 mapped >"$T/pyinit.out" 2>&1
	irc=$?
	wait $owner; orc=$?
	for f in pyinit pyowner; do
		while IFS= read -r line; do
			case $line in
			"ok - "*) ok 0 "python: ${line#ok - }" ;;
			"not ok - "*) ok 1 "python: ${line#not ok - }" ;;
			*) echo "# $line" ;;
			esac
		done <"$T/$f.out"
	done
	[ $irc -eq 0 ] && [ $orc -eq 0 ]; ok $? "python: initiator and owner exit 0 (init $irc, owner $orc)"
	b1=$(counter 1 bytes) rb1=$(counter 1 rdma_bytes)
	db=$((${b1:-0} - ${b0:-0})) drb=$((${rb1:-0} - ${rb0:-0}))
	[ $drb -ge $((4 * 1024 * 1024)) ] && [ $((drb * 10)) -ge $((db * 9)) ]
	ok $? "python: the batches went over RDMA ($drb of the initiator's $db bytes)"
	[ $irc -eq 0 ] || dump
fi

# ---- 3. unregister during a flood
mkdir -p "$T/b"
on 0 "$PEER" unreg "$T/b" $((8 * 1024 * 1024)) shm >"$T/unreg.out" 2>&1 &
owner=$!
on 1 timeout -k 5 180 "$PEER" flood "$T/b" shm >"$T/flood.out" 2>&1
frc=$?
wait $owner
tap_checks "unregister: " "$T/flood.out"
tap_checks "unregister: " "$T/unreg.out"
[ $frc -eq 0 ]	# not 124/137 (a hang), not a failed check or a crash
ok $? "unregister: the flooding initiator ends on its own (exit $frc)"

# ---- 3b. the initiator's side dies mid-batch (as in t_kv_cluster.sh, over
# RDMA): host 1's stream initiator writes whole-segment batches notifying
# counter 1 into host 0's victim segment; after two, kill -9 host 1's kcolld
# or the initiator itself. The initiator gets an error, not a hang (kcolld
# killed); host 0's kcolld drops every connection (and so every RDMA
# session: the region goes with it) and serves on; the counter counts only
# whole batches, the segment no longer changes, a neighbour is intact; a
# fresh kcolld or process on host 1 then writes a batch that lands whole.
held() {	# TCP connections host 0's kcolld still holds (it has none of its own)
	ss -Htnp 2>/dev/null | grep -c "pid=${pids[0]},"
}
none_held() { [ "$(held)" -eq 0 ]; }
wait_for() {	# seconds cmd...: poll until cmd succeeds
	local i
	for ((i = 0; i < $1 * 10; i++)); do "${@:2}" && return 0; sleep 0.1; done
	return 1
}
for what in kcolld app; do
	d="$T/k-$what"
	mkdir -p "$d"
	rsb=$(counter 0 rdma_sessions)
	on 0 "$PEER" victim "$d" $((4 * 1024 * 1024)) shm >"$d/victim.out" 2>&1 &
	victim=$!
	on 1 timeout -k 5 200 "$PEER" stream "$d" shm >"$d/stream.out" 2>&1 &
	st=$!
	wait_for 120 grep -q '^done 2$' "$d/stream.out"
	ok $? "$what dies: the initiator moves whole batches first" || sed 's/^/# /' "$d/stream.out"
	if [ $what = kcolld ]; then
		kill -KILL "${pids[1]}"
		wait "${pids[1]}" 2>/dev/null
		wait "$st"
		src=$?
		[ $src -eq 0 ]	# not 124/137 (a hang), not a failed check
		ok $? "$what dies: the initiator's request ends on its own (exit $src)"
	else
		ipid=$(pgrep -f "^$PEER stream $d")
		[ -n "$ipid" ] && kill -KILL "$ipid"
		wait "$st" 2>/dev/null
	fi
	wait_for 60 none_held
	ok $? "$what dies: host 0's kcolld drops every connection from host 1 ($(held) left)"
	grep -c '^done ' "$d/stream.out" >"$d/killed.tmp"	# the victim polls for it
	mv "$d/killed.tmp" "$d/killed"
	wait_for 60 test -e "$d/checked"
	if [ $what = kcolld ]; then
		rm -f "$(sock 1)"
		start_daemon 1
		ok $? "$what dies: a fresh kcolld on host 1"
	fi
	on 1 timeout -k 5 120 "$PEER" after "$d" shm >"$d/after.out" 2>&1
	arc=$?
	wait "$victim"
	vrc=$?
	[ $what = app ] || tap_checks "$what dies: " "$d/stream.out"	# killed: no checks
	tap_checks "$what dies: " "$d/victim.out"
	tap_checks "$what dies: " "$d/after.out"
	[ $arc -eq 0 ] && [ $vrc -eq 0 ]
	ok $? "$what dies: victim and fresh initiator exit 0 (victim $vrc, after $arc)"
	rsa=$(counter 0 rdma_sessions)
	[ "${rsa:-0}" -ge $((${rsb:-0} + 2)) ]
	ok $? "$what dies: both initiators went over RDMA (owner's sessions ${rsb:-?} -> ${rsa:-?})"
	[ $arc -eq 0 ] && [ $vrc -eq 0 ] || dump
done

# ---- 4. the owner's kcolld dies during a flood
mkdir -p "$T/d"
on 0 "$PEER" count "$T/d" $((8 * 1024 * 1024)) 1000000 1 >"$T/dcount.out" 2>&1 &
owner=$!
t0=$(date +%s)
rb=$(counter 1 rdma_bytes)	# host 1's kcolld may be a fresh one (3b)
on 1 timeout -k 5 180 "$PEER" flood "$T/d" shm any >"$T/dflood.out" 2>&1 &
fl=$!
# the flood notifies counter 0 before it starts: wait for its first write
for _ in $(seq 300); do [ "$(counter 1 rdma_bytes)" -gt "${rb:-0}" ] 2>/dev/null && break; sleep 0.1; done
sleep 1
kill -KILL "${pids[0]}"
wait "$fl"
frc=$?
kill -KILL $owner 2>/dev/null
tap_checks "daemon death: " "$T/dflood.out"
[ $frc -eq 0 ]	# not 124/137 (a hang), not a failed check or a crash
ok $? "daemon death: the initiator's requests end on their own (exit $frc, $(($(date +%s) - t0)) s)"
on 1 "$CTL" status >/dev/null 2>&1; ok $? "daemon death: the initiator's kcolld still serves"
echo "# t_kv_rdma: $(($(date +%s) - t_start)) s"
echo "1..$n"
