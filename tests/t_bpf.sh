#!/usr/bin/env bash
# The eBPF flow tracker (bpf/, kcoll-bpf) on a veth pair between two network
# namespaces of its own: attach on both ends (two pin directories), send a
# known number of bytes over TCP and UDP, and check that the counters agree
# (payload exactly, within 1% as the issue asks), through kcoll-bpf and
# through `bpftool map dump pinned`; a flow is counted only once tracked (by
# port or by cgroup); link/peer config tags flows; a lossy path shows TCP
# retransmissions; RoCEv2 (UDP 4791) is counted; detach removes filters,
# sockops and pins; no root / no bpffs give a clear message. Needs root
# (SKIP otherwise). About 5-10 s. TAP.
set -u
. "${KCOLL_TOP:?run through tests/run.sh}/tests/cluster_lib.sh"
KB="$B/bin/kcoll-bpf"
pick_python
NET="$PY $top/tests/bpf_net.py"
# within1 GOT WANT: |GOT - WANT| <= 1% of WANT, and WANT > 0
within1() { [ "$2" -gt 0 ] && [ $(( ($1 - $2) * 100 )) -le "$2" ] && [ $(( ($2 - $1) * 100 )) -le "$2" ]; }

need_kcoll_bpf
command -v bpftool >/dev/null || skip_all "bpftool missing (scripts/deps.sh installs it)"
P="kb$$"
A="$P-a" Bn="$P-b"
ip netns add "$A" 2>/dev/null || skip_all "cannot create network namespaces here"
ip netns add "$Bn"
T=$(mktemp -d "${KCOLL_TEST_TMP:-/tmp}/bpf.XXXXXX")
PINA=/sys/fs/bpf/kcoll-t$$-a PINB=/sys/fs/bpf/kcoll-t$$-b
CG=
cleanup() {
	"$KB" --pin "$PINA" --netns "$A" detach >/dev/null 2>&1
	"$KB" --pin "$PINB" --netns "$Bn" detach >/dev/null 2>&1
	ip netns del "$A" 2>/dev/null; ip netns del "$Bn" 2>/dev/null
	[ -n "$CG" ] && rmdir "$CG" 2>/dev/null
	rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ip link add "$P-va" type veth peer name "$P-vb"
ip link set "$P-va" netns "$A"
ip link set "$P-vb" netns "$Bn"
ip -n "$A" addr add 10.77.0.1/24 dev "$P-va"
ip -n "$Bn" addr add 10.77.0.2/24 dev "$P-vb"
for ns in "$A" "$Bn"; do ip -n "$ns" link set lo up; done
ip -n "$A" link set "$P-va" up
ip -n "$Bn" link set "$P-vb" up
KA() { "$KB" --pin "$PINA" --netns "$A" "$@"; }
KBB() { "$KB" --pin "$PINB" --netns "$Bn" "$@"; }

# tcp PORT BYTES [wrapper...]: serve in B, send from A; prints what B received.
tcp() {
	local port=$1 bytes=$2; shift 2
	ip netns exec "$Bn" $NET serve-tcp 10.77.0.2 "$port" > "$T/recv" &
	local srv=$!
	# the sender does not retry a refused connect: wait until the server
	# listens (30 s: python starts slowly on a busy machine)
	for _ in $(seq 600); do
		ip netns exec "$Bn" ss -Hltn "sport = :$port" | grep -q . && break; sleep 0.05
	done
	"$@" ip netns exec "$A" $NET send-tcp 10.77.0.2 "$port" "$bytes"
	wait "$srv"
	cat "$T/recv"
}
flow() {	# side proto port field
	if [ "$1" = a ]; then KA flows --json > "$T/f.json"; else KBB flows --json > "$T/f.json"; fi
	$NET flow "$T/f.json" "$2" "$3" "$4"
}

out=$(KA attach "$P-va" 2>&1); rc=$?
ok $rc "attach on $P-va (netns $A), pins in $PINA${out:+: $out}"
[ $rc -eq 0 ] || { echo "1..$n"; exit 1; }
KBB attach "$P-vb" >/dev/null 2>&1
ok $? "attach on the other end, second pin directory $PINB"
miss=
for m in flows tcp link_cfg peer_cfg track_ports track_cg track_flows settings ifaces \
	 prog_tc_ingress prog_tc_egress prog_sockops link_sockops; do
	[ -e "$PINA/$m" ] || miss="$miss $m"
done
ok "$([ -z "$miss" ]; echo $?)" "every map and program is pinned${miss:+ (missing:$miss)}"
ip netns exec "$A" tc filter show dev "$P-va" egress | grep -q kcoll_egress &&
	ip netns exec "$A" tc filter show dev "$P-va" ingress | grep -q kcoll_ingress
ok $? "tc shows both classifiers on $P-va"

# An untracked flow is not counted.
got=$(tcp 6001 1000000)
c=$(flow a tcp 6001 tx_payload)
ok "$([ "$got" = 1000000 ] && [ "$c" = 0 ]; echo $?)" "untracked TCP flow (port 6001) not counted (moved $got, counted $c)"

KA track 5001-5002 && KBB track 5001-5002 && KA link "$P-va" any 7 && KA peer 10.77.0.2 3
ok $? "track 5001-5002, link $P-va = 7, peer 10.77.0.2 = host 3"

TCPB=8000000
got=$(tcp 5001 $TCPB)
tx=$(flow a tcp 5001 tx_payload)
rx=$(flow b tcp 5001 rx_payload)
# The classifiers count what crosses the wire, so a segment TCP retransmits
# (a starved receiver's backlog overflows on a loaded machine) is counted
# again: beyond 1%, the excess must be explained by retransmissions that
# sockops saw (at most 64 KiB, one GSO segment, each).
rt=$(flow a tcp 5001 retrans)
# counted COUNT EXPECTED RETRANS: within 1%, or the excess explained.
counted() {
	within1 "$1" "$2" ||
		{ [ "$1" -ge "$2" ] && [ "${3:-0}" -gt 0 ] && [ $(( $1 - $2 )) -le $(( $3 * 65536 )) ]; }
}
ok "$([ "$got" = $TCPB ] && counted "$tx" $TCPB "$rt" && counted "$rx" $TCPB "$rt"; echo $?)" \
	"TCP $TCPB bytes: sender counted $tx, receiver $rx (within 1%, or the excess covered by $rt retransmissions)"
link=$(flow a tcp 5001 link) peer=$(flow a tcp 5001 peer) srtt=$(flow a tcp 5001 srtt_us)
ok "$([ "$link" = 7 ] && [ "$peer" = 3 ]; echo $?)" "the flow carries link 7 and peer host 3 (got $link, $peer)"
ok "$([ "$srtt" -gt 0 ]; echo $?)" "sockops reports a smoothed RTT for it (${srtt} us)"
KA links --json > "$T/l.json"
ltx=$($PY -c 'import json,sys; print(sum(l["tx_bytes"] for l in json.load(open(sys.argv[1]))["links"] if l["link"] == 7 and l["peer"] == 3))' "$T/l.json")
# The link total counts whole packets: the flow's payload (checked above,
# retransmissions included) plus its headers, at most 1% more on 64 KiB GSO
# segments.
ok "$([ "$ltx" -ge "$tx" ] && within1 "$ltx" "$tx"; echo $?)" "link 7 / peer 3 total: $ltx bytes sent (the flow's $tx payload bytes plus headers, within 1%)"

# bpftool reads the same records, with field names from BTF.
bpftool map dump pinned "$PINA/flows" > "$T/dump.json" 2>"$T/dump.err"
ok $? "bpftool map dump pinned $PINA/flows"
btx=$($NET dump "$T/dump.json" tcp 5001 tx_payload 2>&1)
ok "$([ "$btx" = "$tx" ]; echo $?)" "bpftool's tx_payload for the flow equals kcoll-bpf's ($btx vs $tx)"

# UDP: count the sender's egress (a receiver may drop datagrams it cannot keep up with).
ip netns exec "$A" $NET send-udp 10.77.0.2 5002 2000 1000
utx=$(flow a udp 5002 tx_payload) upk=$(flow a udp 5002 tx_pkts)
ok "$([ "$upk" = 2000 ] && within1 "$utx" 2000000; echo $?)" "UDP 2000 x 1000 B: counted $upk packets, $utx payload bytes"
ip netns exec "$A" $NET send-udp 10.77.0.2 4791 300 512
roce=$(flow a udp 4791 roce_pkts)
ok "$([ "$roce" = 300 ]; echo $?)" "RoCEv2 (UDP 4791) counted without a port filter: $roce of 300 packets"

# A lossy path (a classifier on B's ingress drops 1 data packet in 8) shows retransmissions.
if ip netns exec "$Bn" tc filter add dev "$P-vb" ingress prio 1 bpf da \
	obj "$B/tests/bpf_lossy.bpf.o" sec tc 2>"$T/lossy.err"; then
	got=$(tcp 5002 3000000)
	rt=$(flow a tcp 5002 retrans)
	ok "$([ "$got" = 3000000 ] && [ "$rt" -gt 0 ]; echo $?)" "lossy path: $rt retransmissions counted (moved $got)"
	ip netns exec "$Bn" tc filter del dev "$P-vb" ingress prio 1
else
	echo "ok $((n += 1)) # SKIP cannot add the lossy classifier: $(head -1 "$T/lossy.err")"
fi

# A foreign program's flow, tracked by its cgroup (as for Open MPI or Gloo).
CG2=$(awk '$3 == "cgroup2" { print $2; exit }' /proc/self/mounts)
if [ -n "$CG2" ] && mkdir "$CG2/kcoll-bpf-t$$" 2>/dev/null; then
	CG="$CG2/kcoll-bpf-t$$"
	incg() { sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$CG" "$@"; }
	tcp 6003 500000 incg >/dev/null
	c0=$(flow a tcp 6003 tx_payload)
	KA track --cgroup "$CG"
	ok $? "track --cgroup $CG"
	got=$(tcp 6004 2000000 incg)
	c1=$(flow a tcp 6004 tx_payload)
	fl=$(flow a tcp 6004 flags)
	rt=$(flow a tcp 6004 retrans)
	ok "$([ "$c0" = 0 ] && [ "$got" = 2000000 ] && counted "$c1" 2000000 "$rt" && [ $((fl & 4)) -ne 0 ]; echo $?)" \
		"cgroup flow: before tracking $c0, after $c1 of $got bytes (flags $fl, $rt retransmissions)"
else
	echo "ok $((n += 1)) # SKIP no writable cgroup v2 here"
fi

KA reset
ok "$([ "$(flow a tcp 5001 tx_payload)" = 0 ] && [ -e "$PINA/flows" ]; echo $?)" "reset zeroes the counters, the maps stay"

# Failures a person must act on say what to do.
out=$(setpriv --reuid=65534 --regid=65534 --clear-groups "$KB" --pin "$PINA" flows 2>&1); rc=$?
ok "$([ $rc -ne 0 ] && grep -q "needs root" <<<"$out"; echo $?)" "unprivileged reader: refused, says it needs root ($out)"
mkdir -p "$T/nobpffs"
out=$("$KB" --pin "$T/nobpffs/kcoll" --netns "$A" attach "$P-va" 2>&1); rc=$?
ok "$([ $rc -ne 0 ] && grep -q "not a bpf filesystem" <<<"$out"; echo $?)" "pin directory not on bpffs: clear error ($out)"
out=$(ip netns exec "$A" "$KB" --pin /sys/fs/bpf/kcoll-t$$-c attach "$P-va" 2>&1); rc=$?
ok "$([ $rc -ne 0 ] && grep -q "ip netns exec" <<<"$out"; echo $?)" "inside ip netns exec (private /sys): refused, says why ($out)"
out=$(KA track 5003-5001 2>&1); rc=$?
ok "$([ $rc -eq 2 ] && grep -q "bad port range" <<<"$out"; echo $?)" "reversed port range: usage error ($out)"
out=$(KA peer 10.77.0.2 2>&1); rc=$?
ok "$([ $rc -eq 2 ] && grep -q "give ADDR HOST" <<<"$out"; echo $?)" "peer without a host index: usage error"
out=$(KA attach nosuchif0 2>&1); rc=$?
ok "$([ $rc -ne 0 ] && grep -q "no interface 'nosuchif0'" <<<"$out"; echo $?)" "unknown interface: clear error"

sockops_id=$(bpftool prog show pinned "$PINA/prog_sockops" 2>/dev/null | awk -F: 'NR == 1 { print $1 }')
KA detach && KBB detach
ok $? "detach both"
ok "$([ ! -e "$PINA" ] && [ ! -e "$PINB" ]; echo $?)" "pin directories removed"
ip netns exec "$A" tc filter show dev "$P-va" ingress | grep -q kcoll
ok "$([ $? -ne 0 ]; echo $?)" "no kcoll classifier left on $P-va"
bpftool cgroup show "${CG2:-/sys/fs/cgroup}" 2>/dev/null | awk '{ print $1 }' | grep -qx "${sockops_id:-none}"
rc=$?
ok "$([ -n "$sockops_id" ] && [ $rc -ne 0 ]; echo $?)" "our sockops program (id ${sockops_id:-?}) is off the cgroup root"
out=$(KA flows 2>&1); rc=$?
ok "$([ $rc -ne 0 ] && grep -q "not attached" <<<"$out"; echo $?)" "flows after detach: 'not attached' ($out)"
echo "1..$n"
exit $failed
