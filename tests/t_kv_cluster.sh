#!/usr/bin/env bash
# KV-cache transfers across hosts (docs/kv.md): a 2-host netns cluster
# (scripts/netns-cluster.sh, prefix unique to this run), an owner process on
# host 0 and an initiator on host 1 (tests/kv_peer). Random scattered batches
# (1 B .. 16 MiB) and 4 KiB batches written and read back between the hosts'
# kcollds, the target's checksum compared with the initiator's image, a wrong
# token and bad input refused, the notify counter across hosts, and the
# owner unregistering while the initiator floods it: -EIDRM, no hang, no
# write after unregister; the initiator's kcolld, or the initiator itself,
# killed mid-batch: an error, no hang, the owner's kcolld drops the
# connections, counters count whole batches only, other segments intact, a
# fresh initiator works; the owner's kcolld killed while 8 batches are in
# flight: every request ends with an error, none hangs; notifications
# across hosts (once, in order, after their bytes; full queue; owner gone);
# malformed notification frames from a peer that is not kcolld.
# Needs root and
# network namespaces (SKIP otherwise).
# Bounded: about 10-30 s. TAP.
set -u
. "${KCOLL_TOP:?run through tests/run.sh}/tests/cluster_lib.sh"
PEER="$B/tests/kv_peer"
cluster_prefix "kv$$"

need_root "network namespaces, veth"
command -v ip >/dev/null || skip_all "iproute2 (ip) is missing"
need_netns
[ -x "$PEER" ] || { echo "Bail out! $PEER missing: run make"; exit 1; }
[ -x "$B/tests/kv_badmsg" ] || { echo "Bail out! $B/tests/kv_badmsg missing: run make"; exit 1; }

cluster_tmp kvcluster
chmod 755 "$T"
trap cluster_cleanup EXIT
trap 'exit 130' INT TERM

"$C" up -H 2 >"$T/up.log" 2>&1
ok $? "cluster of 2 hosts up (prefix $P)" || { cat "$T/up.log"; echo "1..$n"; exit 1; }

# Each check line of kv_peer becomes one TAP line.
tap_checks() {	# file
	while read -r _ name verdict rest; do
		name=${name%:}
		name=${name/:/ }
		[ "$verdict" = PASS ]; ok $? "$name $rest"
	done < <(grep '^check ' "$1")
}

# ---- integrity, bad input, notify across hosts; then unregister during a flood.
# The owner's buffer: malloc (kcolld writes it with process_vm_writev) or
# kcoll_mem_alloc (kcolld receives frames straight into it).
for mem in malloc shm; do
	mkdir -p "$T/a-$mem" "$T/b-$mem"
	"$C" exec 0 "$PEER" owner "$T/a-$mem" $((48 * 1024 * 1024)) $mem >"$T/owner.out" 2>&1 &
	owner=$!
	# shm: the initiator's buffers are kcoll_mem_alloc'd too (both sides
	# mapped: the RDMA path's condition; here it falls back to TCP).
	timeout -k 5 180 "$C" exec 1 "$PEER" init "$T/a-$mem" $mem >"$T/init.out" 2>&1
	irc=$?
	wait "$owner"
	orc=$?
	sed -i "s/^check \([a-z_]*\):/check $mem:\1:/" "$T/init.out" "$T/owner.out"
	tap_checks "$T/init.out"
	tap_checks "$T/owner.out"
	[ $irc -eq 0 ] && [ $orc -eq 0 ]; ok $? "$mem: initiator and owner exit 0 (init $irc, owner $orc)"
	cmp -s "$T/a-$mem/init_hash" "$T/a-$mem/owner_hash"
	ok $? "$mem: the owner's 48 MiB buffer matches the initiator's image (checksum)"

	"$C" exec 0 "$PEER" unreg "$T/b-$mem" $((32 * 1024 * 1024)) $mem >"$T/unreg.out" 2>&1 &
	owner=$!
	timeout -k 5 120 "$C" exec 1 "$PEER" flood "$T/b-$mem" >"$T/flood.out" 2>&1
	frc=$?
	wait "$owner"
	sed -i "s/^check \([a-z_]*\):/check $mem:\1:/" "$T/flood.out" "$T/unreg.out"
	tap_checks "$T/flood.out"
	tap_checks "$T/unreg.out"
	[ $frc -eq 0 ]	# not 124/137 (a hang), not a failed check or a crash
	ok $? "$mem: the flooding initiator ends on its own (exit $frc)"
	cat "$T"/*.out >>"$T/all.log"
done

# ---- several batches in flight per initiator (kcolld's stream threads take
# frames of queued batches as they go): two parts on host 1, one from a
# kcoll_mem_alloc buffer and one from malloc, each writing its half of host
# 0's segment in notifying batches of 1 B .. 64 KiB blocks, 4 batches in
# flight; the owner checks the counter is exact and both halves intact, each
# part reads its half back.
#   depth_case NAME SEGMENT_BYTES BATCHES_PER_PART
depth_case() {
	local name=$1 size=$2 rounds=$3 d="$T/$1" owner p0 p0rc p1rc orc f
	mkdir -p "$d"
	"$C" exec 0 "$PEER" count "$d" "$size" $((2 * rounds)) 2 >"$d/count.out" 2>&1 &
	owner=$!
	"$C" exec 1 timeout -k 5 120 "$PEER" part "$d" 0 2 "$rounds" shm 4 >"$d/part0.out" 2>&1 &
	p0=$!
	"$C" exec 1 timeout -k 5 120 "$PEER" part "$d" 1 2 "$rounds" malloc 4 >"$d/part1.out" 2>&1
	p1rc=$?
	wait "$p0"
	p0rc=$?
	wait "$owner"
	orc=$?
	sed -i "s/^check \([a-z_]*\):/check $name:\1:/" "$d"/*.out
	for f in part0 part1 count; do tap_checks "$d/$f.out"; done
	[ $p0rc -eq 0 ] && [ $p1rc -eq 0 ] && [ $orc -eq 0 ]
	ok $? "$name: both parts and the owner exit 0 (parts $p0rc $p1rc, owner $orc)"
	cat "$d"/*.out >>"$T/all.log"
}
# 64 MiB in 8 batches of 4 MiB per part: several frames each; counter 16.
depth_case depth4 $((64 * 1024 * 1024)) 8
# 16 MiB in 32 batches of 256 KiB per part: one frame each. A one-frame
# batch runs on the ring thread only when nothing waits behind it in the
# ring; here most join the import's queue and go out on several streams at
# once. Counter 64.
depth_case depth4-one-frame $((16 * 1024 * 1024)) 32

# ---- notifications across hosts: two parts on host 1 (kcoll_mem_alloc and
# malloc buffers) each send 16 batches of 2 MiB (up to 64 blocks) with a
# message "i:q", 4 in flight, into host 0's segment; the owner takes every
# message once, in order per sender, after its bytes; then part 0 checks
# bad input, fills the owner's queue (-ENOBUFS for the one past it) and
# gets -EIDRM once the owner unregistered.
d="$T/notif"
mkdir -p "$d"
"$C" exec 0 "$PEER" notif-owner "$d" $((64 * 1024 * 1024)) 2 16 shm >"$d/owner.out" 2>&1 &
owner=$!
"$C" exec 1 timeout -k 5 120 "$PEER" notif-part "$d" 1 2 16 malloc >"$d/part1.out" 2>&1 &
p1=$!
"$C" exec 1 timeout -k 5 180 "$PEER" notif-part "$d" 0 2 16 shm >"$d/part0.out" 2>&1
p0rc=$?
wait "$p1"; p1rc=$?
wait "$owner"; orc=$?
for f in part0 part1 owner; do tap_checks "$d/$f.out"; done
[ $p0rc -eq 0 ] && [ $p1rc -eq 0 ] && [ $orc -eq 0 ]
ok $? "notif: both parts and the owner exit 0 (parts $p0rc $p1rc, owner $orc)"
cat "$d"/*.out >>"$T/all.log"

# ---- malformed notification frames from a peer that is not kcolld
# (tests/kv_badmsg.c, raw TCP with the segment's token, on host 0): dropped
# connections, -EINVAL, -ENOBUFS on a connection that goes on, the owner's
# queue exact, its kcolld serving.
"$C" exec 0 timeout -k 5 60 "$B/tests/kv_badmsg" >"$T/badmsg.out" 2>&1
brc=$?
sed -i "s/^check \([a-z_]*\):/check badmsg:\1:/" "$T/badmsg.out"
tap_checks "$T/badmsg.out"
[ $brc -eq 0 ]; ok $? "badmsg: kv_badmsg exits 0 ($brc)"

# ---- the initiator's side dies mid-batch (docs/kv.md "Unregister and death").
# Host 1's stream initiator writes whole-segment batches, each notifying
# counter 1, into host 0's victim segment; once two batches are done, kill -9
# either host 1's kcolld or the initiator process itself. Then: the
# initiator gets an error, not a hang (kcolld killed); host 0's kcolld
# drops every connection from host 1 and serves on; the victim's counter
# counts only whole batches, its segment no longer changes, a neighbouring
# segment is intact; a fresh kcolld (or process) on host 1 then writes a
# new batch that lands whole.
held() {	# sockets host 0's kcolld still holds to host 1
	local pid
	pid=$(cat "$T/run/h0/kcolld.pid" 2>/dev/null) || { echo 0; return; }
	"$C" exec 0 ss -Htnp 2>/dev/null | grep "pid=$pid," |
		awk '$5 ~ /^10\.(10|20)\.0\.2:/' | wc -l
}
none_held() { [ "$(held)" -eq 0 ]; }
wait_for() {	# seconds cmd...: poll until cmd succeeds
	local i
	for ((i = 0; i < $1 * 10; i++)); do "${@:2}" && return 0; sleep 0.1; done
	return 1
}
for what in kcolld app; do
	for mem in malloc shm; do
		d="$T/k-$what-$mem"
		mkdir -p "$d"
		"$C" exec 0 "$PEER" victim "$d" $((16 * 1024 * 1024)) $mem >"$d/victim.out" 2>&1 &
		victim=$!
		"$C" exec 1 timeout -k 5 200 "$PEER" stream "$d" $mem >"$d/stream.out" 2>&1 &
		st=$!
		wait_for 120 grep -q '^done 2$' "$d/stream.out"
		ok $? "$what dies ($mem): the initiator moves whole batches first" ||
			sed 's/^/# /' "$d/stream.out"
		if [ $what = kcolld ]; then
			kill -KILL "$(cat "$T/run/h1/kcolld.pid")"
			wait "$st" 2>/dev/null
			src=$?
			[ $src -eq 0 ]	# not 124/137 (a hang), not a failed check or a leak
			ok $? "$what dies ($mem): the initiator's request ends on its own (exit $src)"
		else
			# the process running kv_peer inside the host's namespace
			ipid=$(pgrep -f "^$PEER stream $d")
			[ -n "$ipid" ] && kill -KILL "$ipid"
			wait "$st" 2>/dev/null
		fi
		wait_for 60 none_held
		ok $? "$what dies ($mem): host 0's kcolld drops every connection from host 1 ($(held) left)"
		grep -c '^done ' "$d/stream.out" >"$d/killed.tmp"	# the victim polls for it
		mv "$d/killed.tmp" "$d/killed"
		wait_for 60 test -e "$d/checked"
		[ $what = kcolld ] && "$C" restart 1 >/dev/null 2>&1
		"$C" exec 1 timeout -k 5 120 "$PEER" after "$d" $mem >"$d/after.out" 2>&1
		arc=$?
		wait "$victim"
		vrc=$?
		sed -i "s/^check \([a-z_]*\):/check $what-dies-$mem:\1:/" "$d"/*.out
		tap_checks "$d/stream.out"
		tap_checks "$d/victim.out"
		tap_checks "$d/after.out"
		[ $arc -eq 0 ] && [ $vrc -eq 0 ]
		ok $? "$what dies ($mem): victim and fresh initiator exit 0 (victim $vrc, after $arc)"
		cat "$d"/*.out >>"$T/all.log"
	done
done

# Both sides mapped and no RDMA device here: TCP, and the initiator's kcolld
# said why (docs/kv.md "Across hosts over RDMA").
if [ -d /sys/class/infiniband ] && [ -n "$(ls /sys/class/infiniband 2>/dev/null)" ]; then
	echo "ok $((n += 1)) # SKIP this machine has an RDMA device: the fallback is not exercised"
else
	grep -q "over TCP (RDMA not used: no RDMA device" "$T/run/h1/kcolld.log"
	ok $? "no RDMA device: the initiator's kcolld logs the reason and moves the batches over TCP"
fi

# Both daemons are still alive.
for h in 0 1; do
	"$C" exec "$h" sh -c 'test -S "$KCOLL_SOCKET"'; ok $? "host $h's kcolld still serves"
done
# ---- the owner's kcolld dies while host 1's initiator keeps 8 batches of
# 32 MiB in flight (16 frames each; kcolld queues up to 4 per import on its
# stream threads, the rest wait in the ring): every request ends with an
# error, none hangs, host 1's kcolld serves on; then a fresh kcolld on host 0.
kvbytes() {	# host: the "bytes" of kcollctl status --json's "kv" object
	"$C" exec "$1" "$B/bin/kcollctl" status --json 2>/dev/null | grep -o '"kv":{[^}]*}' |
		grep -o '"bytes":[0-9]*' | cut -d: -f2
}
mkdir -p "$T/d"
"$C" exec 0 "$PEER" count "$T/d" $((32 * 1024 * 1024)) 1000000 1 >"$T/d/count.out" 2>&1 &
owner=$!
b0=$(kvbytes 0)
t0=$(date +%s)
"$C" exec 1 timeout -k 5 120 "$PEER" flood "$T/d" shm any >"$T/d/flood.out" 2>&1 &
fl=$!
# two batches landed (the flood moves 320): it is in full swing
for _ in $(seq 600); do
	[ "$(kvbytes 0)" -gt $((${b0:-0} + 64 * 1024 * 1024)) ] 2>/dev/null && break
	sleep 0.1
done
kill -KILL "$(cat "$T/run/h0/kcolld.pid")"
wait "$fl"
frc=$?
kill -KILL "$owner" 2>/dev/null
wait "$owner" 2>/dev/null
sed -i "s/^check \([a-z_]*\):/check owner-kcolld-dies:\1:/" "$T/d/flood.out"
tap_checks "$T/d/flood.out"
[ $frc -eq 0 ]	# not 124/137 (a hang), not a failed check or a crash
ok $? "owner's kcolld dies mid-flood: the initiator's requests end on their own (exit $frc, $(($(date +%s) - t0)) s)"
"$C" exec 1 "$B/bin/kcollctl" status >/dev/null 2>&1
ok $? "owner's kcolld dies mid-flood: host 1's kcolld still serves"
"$C" restart 0 >/dev/null 2>&1
ok $? "owner's kcolld dies mid-flood: a fresh kcolld starts on host 0"
cat "$T/d"/*.out >>"$T/all.log"

if [ -n "${KCOLL_TEST_VERBOSE:-}" ]; then cat "$T/all.log"; fi
echo "1..$n"
