#!/usr/bin/env bash
# KV-cache transfers across hosts (docs/kv.md): a 2-host netns cluster
# (scripts/netns-cluster.sh, prefix unique to this run), an owner process on
# host 0 and an initiator on host 1 (tests/kv_peer). Random scattered batches
# (1 B .. 16 MiB) and 4 KiB batches written and read back between the hosts'
# kcollds, the target's checksum compared with the initiator's image, a wrong
# token and bad input refused, the notify counter across hosts, and the
# owner unregistering while the initiator floods it: -EIDRM, no hang, no
# write after unregister. Needs root and network namespaces (SKIP otherwise).
# Bounded: about 10-30 s. TAP.
set -u
. "${KCOLL_TOP:?run through tests/run.sh}/tests/cluster_lib.sh"
PEER="$B/tests/kv_peer"
cluster_prefix "kv$$"

need_root "network namespaces, veth"
command -v ip >/dev/null || skip_all "iproute2 (ip) is missing"
need_netns
[ -x "$PEER" ] || { echo "Bail out! $PEER missing: run make"; exit 1; }

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
	[ $frc -ne 124 ] && [ $frc -ne 137 ]; ok $? "$mem: the flooding initiator ends on its own (exit $frc)"
	cat "$T"/*.out >>"$T/all.log"
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
if [ -n "${KCOLL_TEST_VERBOSE:-}" ]; then cat "$T/all.log"; fi
echo "1..$n"
