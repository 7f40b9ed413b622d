#!/usr/bin/env bash
# The RDMA transport (issue 6) on Soft-RoCE, in the VM (tests/vm/run.sh runs
# it; needs root, rdma_rxe and the host's build):
#   0. rdma_onesided: the verbs layer's calls (one-sided API) on rxe
#   1. one kcolld per "host", each with its own address; the transport is
#      rdma (the log says so) and each daemon's GID is the RoCE v2 GID of its
#      own address (automatic selection)
#   2. every collective bit-exact over RDMA with 2, 3 and 4 hosts
#      (mh_rank check), status --json shows QPs in RTS per peer and pieces
#      moved over RDMA, and C4's detector has link rates over RDMA (the step
#      engine observes every transport)
#   3. a GID that cannot work (KCOLL_IB_GID_INDEX past the table) fails comm
#      ops with a clear reason, no hang
#   4. faults: a daemon killed mid-transfer, the rxe device's netdev taken
#      down mid-transfer: the survivors' ops fail within the timeout (no
#      hang), and afterwards a new communicator over RDMA works
# Topology: rdma_rxe in this kernel (6.1) sends through the initial network
# namespace only (an rxe device on a veth inside another namespace cannot
# reach its peer: the work request completes in error), so the hosts share
# the guest's namespace: addresses 10.31.0.1..4 on one veth, one rxe device
# on it; each daemon binds and advertises its own address and picks the GID
# of that address. Traffic between them is real RC traffic through rxe's
# loopback path. TAP.
set -u
B=${1:?usage: t_rdma.sh BUILD_DIR}
top=$(cd "$(dirname "$0")/../.." && pwd)
RANK="$B/tests/mh_rank"
CTL="$B/bin/kcolld"
CTL="$B/bin/kcollctl"
D="$B/bin/kcolld"
H=4
TMO=4000
n=0 failed=0
ok() { n=$((n + 1)); if [ "$1" -eq 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; failed=1; fi; }
skip_all() { echo "ok 1 # SKIP $1"; echo "1..1"; exit 0; }
now_ms() { date +%s%3N; }

[ "$(id -u)" -eq 0 ] || skip_all "needs root"
[ -x "$RANK" ] && [ -x "$D" ] || { echo "Bail out! $B has no kcolld/mh_rank: run make"; exit 1; }
. "$top/scripts/vm-rxe-setup.sh"
vm_rxe_load || skip_all "cannot load rdma_rxe: ${why:-no such module in this kernel}"
[ -z "$why" ] || echo "# modprobe rdma_rxe: $why"

T=$(mktemp -d /tmp/rdma-vm.XXXXXX)
IF=krdma0
RXE=krxe0
pids=()
cleanup() {
	local p
	for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
	rdma link delete $RXE 2>/dev/null
	ip link del $IF 2>/dev/null
	rm -rf "$T"
}
trap cleanup EXIT

addrs=()
for ((i = 0; i < H; i++)); do addrs+=("10.31.0.$((i + 1))"); done
# second addresses (10.31.1.x): per-QP GIDs (KCOLL_IB_QP_ADDRS)
for ((i = 0; i < H; i++)); do addrs+=("10.31.1.$((i + 1))"); done
vm_rxe_link $IF $RXE "${addrs[@]}"
ok $? "rxe device $RXE on $IF (addresses 10.31.0.1..$H)"

# The verbs layer's own calls (the KV engine's API), checked byte for byte.
out=$(timeout 60 "$B/tests/rdma_onesided" 10.31.0.1 10.31.0.2 2>&1); rc=$?
sed 's/^/# /' <<<"$out"
np=$(grep -c '^ok ' <<<"$out")
[ $rc -eq 0 ] && ! grep -q '^not ok\|SKIP' <<<"$out" && [ "$np" -ge 15 ]
ok $? "rdma_onesided: endpoints, GID choice, WRITE_WITH_IMM / WRITE / READ, registration cache, errors ($np checks)"

sock() { echo "$T/h$1.sock"; }
start_daemon() {	# host [env...]
	local h=$1
	shift
	# A SIGKILLed daemon leaves its socket file behind: without this the wait
	# below returned at once, and ranks met the dead socket (ECONNREFUSED).
	rm -f "$(sock "$h")"
	env KCOLL_NET_XPORT=rdma KCOLL_NET_CHUNK_BYTES=65536 KCOLL_IB_QPS=2 KCOLL_SPIN_US=0 \
		KCOLL_IB_FLOW_LABEL=4096 KCOLL_IB_ZC_BYTES=65536 "$@" \
		"$D" -f -s "$(sock "$h")" -l "$T/h$h.log" --listen "10.31.0.$((h + 1)):0" \
		--addrs "10.31.0.$((h + 1))" >"$T/h$h.out" 2>&1 &
	pids[h]=$!
	for _ in $(seq 300); do
		[ -S "$(sock "$h")" ] && "$CTL" -s "$(sock "$h")" status >/dev/null 2>&1 && return 0
		sleep 0.1
	done
	return 1
}
dump() {
	local i
	for ((i = 0; i < H; i++)); do
		tail -n 6 "$T/h$i.log" 2>/dev/null | sed "s/^/# h$i: /"
		head -n 40 "$T/h$i.out" 2>/dev/null | sed "s/^/# h$i out: /"
	done
}

bad=
for ((i = 0; i < H; i++)); do start_daemon $i || bad+=" h$i"; done
[ -z "$bad" ]; ok $? "$H daemons up${bad:+ (not:$bad)}"
# A daemon logs its transport after it creates its socket, once the RDMA
# device is open (seconds under TCG on a busy host): wait for the line.
for _ in $(seq 300); do
	bad=
	for ((i = 0; i < H; i++)); do grep -q "transport between daemons:" "$T/h$i.log" || bad+=" h$i"; done
	[ -z "$bad" ] && break
	sleep 0.1
done
bad=
for ((i = 0; i < H; i++)); do grep -q "transport between daemons: rdma, device $RXE" "$T/h$i.log" || bad+=" h$i"; done
[ -z "$bad" ]; ok $? "every daemon chose rdma on $RXE${bad:+ (not:$bad)}"
[ -z "$bad" ] || dump

# Run mh_rank MODE on hosts 0..N-1, one rank each; sets rc_all and out files.
run_ranks() {	# tag mode nhosts secs [env...]
	local tag=$1 mode=$2 nh=$3 s=$4 id i p=() rc=0
	shift 4
	id=$(KCOLL_SOCKET=$(sock 0) timeout 10 "$RANK" id) || { rc_all=99; return; }
	for ((i = 0; i < nh; i++)); do
		env KCOLL_SOCKET="$(sock $i)" KCOLL_TIMEOUT_MS=$TMO "$@" timeout -k 2 "$s" \
			"$RANK" "$mode" "$id" "$nh" $i ${RARGS:-} >"$T/$tag.$i.out" 2>&1 &
		p+=($!)
	done
	for i in "${p[@]}"; do wait "$i" || rc=$?; done
	rc_all=$rc
}

for nh in 2 3 4; do
	t0=$(now_ms)
	run_ranks "check$nh" check $nh 240
	groups=$(cat "$T/check$nh".*.out | grep -c '^group cases=[1-9][0-9]* bad=0 ')
	[ "$rc_all" -eq 0 ] && [ "$groups" -eq "$nh" ]
	ok $? "every collective bit-exact over RDMA, $nh hosts [$(( ($(now_ms) - t0) / 1000 )) s]"
	if [ "$rc_all" -ne 0 ] || [ "$groups" -ne "$nh" ]; then
		cat "$T/check$nh".*.out | head -20 | sed 's/^/# /'
		dump
	fi
done

# ---- zero-copy sends (KCOLL_IB_ZC_BYTES=65536, the default, set here too: every piece) -----
# Hosts 0 and 1 now also pin their QPs to paths: QP 0 leaves from the GID of
# the host's own address, QP 1 from the GID of its second one (10.31.1.x),
# UDP source ports from 0xd100 (KCOLL_IB_UDP_SPORT).
for h in 0 1; do
	kill -TERM "${pids[h]}" 2>/dev/null; wait "${pids[h]}" 2>/dev/null
	start_daemon $h KCOLL_IB_QP_ADDRS=10.31.0.$((h + 1)),10.31.1.$((h + 1)) KCOLL_IB_UDP_SPORT=53504
done
# Registered buffers freed and allocated again in a loop: kcolld unmaps each
# region and maps the next one, mostly at the same address; the registration
# cache must drop the old one each time or the NIC would send stale pages.
RARGS="16 262147" run_ranks remap remap 2 240
grep -h '^# rank' "$T"/remap.*.out | sed 's/^/# /'
[ "$rc_all" -eq 0 ] && [ "$(cat "$T"/remap.*.out | grep -c '^group cases=16 bad=0 ')" -eq 2 ]
ok $? "zero-copy: 16 rounds of free + allocate again + all-reduce (1 MiB, in place and not) bit-exact"
[ "$rc_all" -eq 0 ] || { cat "$T"/remap.*.out | head -10 | sed 's/^/# /'; dump; }

# A client killed in the middle of zero-copy all-reduces: its daemon drops its
# regions (and their registrations) while the other side still sends; no
# daemon may crash, the survivor's op fails (no hang: it is not the 120 s
# timeout's 124; the dead rank never submits its next op, so the survivor's
# fails on the op timeout, 12-18 s here), and a new communicator works.
id=$(KCOLL_SOCKET=$(sock 0) timeout 10 "$RANK" id)
env KCOLL_SOCKET="$(sock 0)" KCOLL_TIMEOUT_MS=$TMO timeout -k 2 120 "$RANK" remap "$id" 2 0 100000 262147 \
	>"$T/ckill.0.out" 2>&1 &
cp0=$!
# (env execs mh_rank: $! is the rank itself, the process to kill)
env KCOLL_SOCKET="$(sock 1)" KCOLL_TIMEOUT_MS=$TMO "$RANK" remap "$id" 2 1 100000 262147 >"$T/ckill.1.out" 2>&1 &
cp1=$!
for _ in $(seq 300); do
	# past the first rounds: registrations exist, writes are in flight
	js=$(timeout 10 "$CTL" -s "$(sock 1)" status --json 2>/dev/null)
	z=$(python3 -c 'import json,sys; s=json.loads(sys.argv[1]); print(sum(p.get("pieces_zc",0) for c in s.get("net",{}).get("comms",[]) for p in c.get("rdma",[])))' "$js" 2>/dev/null)
	[ "${z:-0}" -gt 40 ] && break
	sleep 0.2
done
kill -KILL $cp1; killed=$?
t0=$(now_ms)
python3 - "$js" <<'EOF'
import json, sys
s = json.loads(sys.argv[1])
rd = [p for c in s["net"]["comms"] if c.get("xport") == "rdma" for p in c.get("rdma", [])]
assert len(rd) == 1, rd
q = rd[0]["qps"]
assert [x["gid"] for x in q] == ["::ffff:10.31.0.2", "::ffff:10.31.1.2"], q
assert q[0]["gid_index"] != q[1]["gid_index"], q
assert [x["udp_sport"] for x in q] == [0xd100, 0xd101], q
assert all(x["state"] == "RTS" for x in q), q
print("# host 1's QPs: %s" % [(x["gid_index"], x["gid"], hex(x["udp_sport"])) for x in q])
EOF
ok $? "per-QP paths: QP 0 on GID ::ffff:10.31.0.2, QP 1 on ::ffff:10.31.1.2 (KCOLL_IB_QP_ADDRS), UDP source ports 0xd100, 0xd101 (KCOLL_IB_UDP_SPORT), in status --json"
wait $cp0; rc0=$?
ms=$(( $(now_ms) - t0 ))
wait $cp1 2>/dev/null
tail -n 2 "$T"/ckill.*.out | sed 's/^/# /'
bad=
for ((i = 0; i < H; i++)); do kill -0 "${pids[i]}" 2>/dev/null || bad+=" h$i"; done
[ $killed -eq 0 ] && [ "${z:-0}" -gt 40 ] && [ -z "$bad" ] && [ $rc0 -ne 0 ] && [ $rc0 -ne 124 ]
ok $? "client killed mid zero-copy all-reduce (after ${z:-0} zero-copy pieces, kill status $killed): every kcolld alive${bad:+ (dead:$bad)}, the other rank's op fails (status $rc0, $ms ms)"
[ -z "$bad" ] || dump
run_ranks afterckill check 2 240
[ "$rc_all" -eq 0 ] && [ "$(cat "$T"/afterckill.*.out | grep -c '^group cases=[1-9][0-9]* bad=0 ')" -eq 2 ]
ok $? "after the client kill: a new communicator over RDMA on hosts 0, 1 works"
for h in 0 1; do
	kill -TERM "${pids[h]}" 2>/dev/null; wait "${pids[h]}" 2>/dev/null
	start_daemon $h
done


# ---- a GID that cannot work: clear error, no hang --------------------------------
kill -KILL "${pids[1]}" 2>/dev/null; wait "${pids[1]}" 2>/dev/null
start_daemon 1 KCOLL_IB_GID_INDEX=99
t0=$(now_ms)
run_ranks badgid check 2 60
ms=$(( $(now_ms) - t0 ))
for _ in $(seq 100); do grep -q "KCOLL_IB_GID_INDEX=99 names no GID" "$T/h1.log" && break; sleep 0.1; done
grep -q "KCOLL_IB_GID_INDEX=99 names no GID" "$T/h1.log"
gidmsg=$?
[ "$rc_all" -ne 0 ] && [ "$rc_all" -ne 124 ] && [ $gidmsg -eq 0 ] && [ $ms -lt $((TMO * 4 + 10000)) ]
ok $? "KCOLL_IB_GID_INDEX=99: ops fail with the reason logged, no hang (status $rc_all, $ms ms)"
kill -KILL "${pids[1]}" 2>/dev/null; wait "${pids[1]}" 2>/dev/null
start_daemon 1

# While a communicator runs: status --json shows its rdma peers, QPs, states.
check_status() {
	local js
	js=$(timeout 10 "$CTL" -s "$(sock 0)" status --json 2>/dev/null)
	python3 - "$js" <<'EOF'
import json, sys
s = json.loads(sys.argv[1])
comms = s.get("net", {}).get("comms", [])
rd = [p for c in comms if c.get("xport") == "rdma" for p in c.get("rdma", [])]
assert rd, "no comm with an rdma peer in status: %s" % comms
for p in rd:
    assert p["gid"] == "::ffff:10.31.0.1", p
    assert len(p["qps"]) == 2, p
    assert all(q["state"] == "RTS" for q in p["qps"]), p
    # KCOLL_IB_FLOW_LABEL=4096: QP i gets label 4096 + i, UDP source port 0xD000 + i
    assert [q["flow_label"] for q in p["qps"]] == [4096, 4097], p
    assert [q["udp_sport"] for q in p["qps"]] == [0xD000, 0xD001], p
assert sum(p["pieces_in"] + p["pieces_out"] for p in rd) > 0, "no piece moved over rdma"
# 4 MiB all-reduces from malloc'ed buffers: the accumulator goes zero-copy
assert sum(p["pieces_zc"] for p in rd) > 0, "no piece sent zero-copy"
print("# status: %d rdma peers, QPs %s" % (len(rd), [q["state"] for p in rd for q in p["qps"]]))
EOF
	ok $? "status --json during a run: rdma peers on GID ::ffff:10.31.0.1, 2 QPs each in RTS with flow labels 4096, 4097 (UDP ports 0xd000, 0xd001), pieces moved, some zero-copy"
	timeout 10 "$CTL" -s "$(sock 0)" status 2>/dev/null | grep -E "transport|rdma host" | sed 's/^/# /'
}

# The step engine observes RDMA links for C4 as TCP's: while the ranks run,
# the detector of host 0 has a rate for a link to a peer (kcollctl anomalies).
check_c4_links() {
	local js r=1
	for _ in $(seq 40); do
		js=$(timeout 10 "$CTL" -s "$(sock 0)" anomalies --json 2>/dev/null)
		python3 - "$js" <<'EOF'
import json, sys
def rates(o):
    if isinstance(o, dict):
        for k, v in o.items():
            if k == "links" and isinstance(v, list):
                for l in v:
                    if isinstance(l, dict) and l.get("rate", 0) > 0:
                        yield l
            else:
                yield from rates(v)
    elif isinstance(o, list):
        for v in o:
            yield from rates(v)
got = list(rates(json.loads(sys.argv[1])))
assert got, "no link rate yet"
print("# C4 link rates over rdma: %s" % ["host %d %s %.1f MB/s" % (l["host"], l["dir"], l["rate"] / 1e6) for l in got])
EOF
		r=$?
		[ $r -eq 0 ] && break
		sleep 0.25
	done
	ok $r "C4 link rates over RDMA: host 0's detector has a rate for a link to a peer (kcollctl anomalies --json)"
}

# ---- faults -----------------------------------------------------------------------
# mh_rank loop: checked all-reduces until one fails; "fault err=..." at the end.
fault_run() {	# tag nhosts victim-action
	local tag=$1 nh=$2 id i p=()
	id=$(KCOLL_SOCKET=$(sock 0) timeout 10 "$RANK" id) || return 1
	mkdir -p "$T/$tag"
	for ((i = 0; i < nh; i++)); do
		env KCOLL_SOCKET="$(sock $i)" KCOLL_TIMEOUT_MS=$TMO timeout -k 2 120 \
			"$RANK" loop "$id" "$nh" $i "$T/$tag" >"$T/$tag.$i.out" 2>&1 &
		p+=($!)
	done
	for _ in $(seq 600); do
		[ "$(ls "$T/$tag"/ready.* 2>/dev/null | wc -l)" -eq "$nh" ] && break
		sleep 0.1
	done
	[ -z "${4:-}" ] || eval "$4"
	t_strike=$(now_ms)
	eval "$3"
	for i in "${p[@]}"; do wait "$i"; done
}
# The survivors' fault lines: err must be non-zero and come within the bound.
judge_fault() {	# tag label ranks...
	local tag=$1 label=$2 r l e t bad='' dts=''
	shift 2
	for r in "$@"; do
		l=$(grep '^fault ' "$T/$tag.$r.out")
		e=$(sed -n 's/.* name=\([^ ]*\) .*/\1/p' <<<"$l")
		t=$(sed -n 's/.* t_ms=\([0-9]*\).*/\1/p' <<<"$l")
		dts+=" ${t:+$((t - t_strike))}"
		{ [ -n "$e" ] && [ "$e" != 0 ] && [ $((t - t_strike)) -le $((TMO * 3 + 5000)) ]; } ||
			bad+=" rank $r: ${l:-nothing}"
	done
	[ -z "$bad" ]; ok $? "$label: every survivor's op fails, within $((TMO * 3 + 5000)) ms (ms after the fault:${dts:- none})${bad:+ (got:$bad)}"
	[ -z "$bad" ] || { cat "$T/$tag".*.out | head -10 | sed 's/^/# /'; dump; }
}

# After a fault on the rxe device: once its port is ACTIVE again, a new
# 2-host communicator over RDMA runs the checked case list.
works_again() {	# tag label
	for _ in $(seq 50); do rdma link show $RXE/1 2>/dev/null | grep -q "state ACTIVE" && break; sleep 0.2; done
	run_ranks "$1" check 2 240
	[ "$rc_all" -eq 0 ] && [ "$(cat "$T/$1".*.out | grep -c '^group cases=[1-9][0-9]* bad=0 ')" -eq 2 ]
	ok $? "$2"
	[ "$rc_all" -eq 0 ] || { cat "$T/$1".*.out | head -10 | sed 's/^/# /'; dump; }
}

fault_run kill 3 'kill -KILL ${pids[2]}' 'check_status; check_c4_links'
judge_fault kill "kcolld of host 2 killed mid-transfer" 0 1
wait "${pids[2]}" 2>/dev/null
run_ranks after check 2 240
[ "$rc_all" -eq 0 ] && [ "$(cat "$T"/after.*.out | grep -c '^group cases=[1-9][0-9]* bad=0 ')" -eq 2 ]
ok $? "after the kill: a new communicator over RDMA on hosts 0, 1 works"
grep -q "closed its connection\|rdma to host 2\|lost host 2" "$T/h0.log" "$T/h1.log"
ok $? "the survivors' logs name the dead host (rdma transport or control connection, whichever saw it first)"
start_daemon 2

# The rxe link's netdev goes down mid-transfer: rxe reports IBV_EVENT_PORT_ERR
# and the transfers on that port fail. (rdma link delete is no use as a fault
# here: rxe in 6.1 cannot disassociate user contexts, so the deletion waits
# until every process has closed the device.)
# Only what the logs say from here on: the earlier cases logged "rdma to
# host N (...)" lines too (the GID case's).
l0=$(wc -l <"$T/h0.log") l1=$(wc -l <"$T/h1.log")
fault_run linkdown 2 "ip link set $IF down"
judge_fault linkdown "$IF (under $RXE) down mid-transfer" 0 1
# Which comes first varies: the port-down event, or a work completion in
# error on the transfer (rxe gives up retrying); the log must name one.
why=$( (tail -n +$((l0 + 1)) "$T/h0.log"; tail -n +$((l1 + 1)) "$T/h1.log") |
	grep -o "went down (IBV_EVENT_PORT_ERR)\|rdma to host [0-9] (.*): .*" | head -1 | cut -c1-150)
[ -n "$why" ]; ok $? "the log says why the transfer failed (${why:-nothing})"
[ -n "$why" ] || tail -n 5 "$T/h0.log" "$T/h1.log" | sed "s/^/# /"
bad=
for ((i = 0; i < H; i++)); do kill -0 "${pids[i]}" 2>/dev/null || bad+=" h$i"; done
[ -z "$bad" ]; ok $? "every daemon survives the link going down${bad:+ (dead:$bad)}"
ip link set $IF up
works_again afterlink "link up again: a new communicator over RDMA works"

# 'rdma link delete' mid-transfer. rxe in 6.1 cannot revoke user contexts:
# the kernel removes the device's uverbs node, then waits until every process
# has closed the device (no async event comes). kcolld notices the node gone,
# fails the transfers on it, and closes the device once its communicators end
# (a daemon with none closes it within a second), so the delete completes.
delpid=
fault_run linkdel 2 "rdma link delete $RXE >$T/linkdel.out 2>&1 & delpid=\$!"
judge_fault linkdel "rdma link delete $RXE mid-transfer" 0 1
grep -h "is being removed" "$T/h0.log" "$T/h1.log" | head -1 | cut -c1-160 | sed 's/^/# /'
for _ in $(seq 600); do kill -0 "$delpid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$delpid" 2>/dev/null; then
	ok 1 "rdma link delete completes once kcolld closed the device (still waiting after 60 s)"
	tail -n 5 "$T"/h*.log | sed 's/^/# /'
	kill -KILL "$delpid" 2>/dev/null
else
	wait "$delpid"; drc=$?
	rdma link show 2>/dev/null | grep -q "link $RXE/"; still=$?
	[ $drc -eq 0 ] && [ $still -ne 0 ]
	ok $? "rdma link delete completes once kcolld closed the device (status $drc, $(cat "$T/linkdel.out"))"
fi
bad=
for ((i = 0; i < H; i++)); do
	kill -0 "${pids[i]}" 2>/dev/null || bad+=" h$i(dead)"
	grep -q "closed $RXE (being removed)" "$T/h$i.log" || bad+=" h$i(no 'closed $RXE')"
done
[ -z "$bad" ]; ok $? "every daemon alive and closed $RXE${bad:+ (got:$bad)}"
rdma link add $RXE type rxe netdev $IF
works_again afterdel "$RXE added again: the daemons open it and a new communicator over RDMA works"

# Every daemon stops cleanly on SIGTERM; no sanitizer report anywhere (the
# ASan build: tests/vm/t_rdma.sh build-asan).
bad=
for ((i = 0; i < H; i++)); do
	kill -TERM "${pids[i]}" 2>/dev/null
	wait "${pids[i]}" 2>/dev/null || bad+=" h$i(status $?)"
done
pids=()
grep -l "ERROR: AddressSanitizer\|runtime error:\|LeakSanitizer" "$T"/h*.out >/dev/null 2>&1 && bad+=" sanitizer report"
[ -z "$bad" ]; ok $? "daemons exit 0 on SIGTERM, no sanitizer report${bad:+ (got:$bad)}"
[ -z "$bad" ] || head -n 30 "$T"/h*.out | sed 's/^/# /'

echo "1..$n"
exit $failed
