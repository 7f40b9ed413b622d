#!/usr/bin/env bash
# The RDMA transport (issue 6) between two QEMU guests, each with its own
# kernel, its own virtio-net NIC on a virtual wire and its own rxe device on
# it (scripts/vmtest-pair.sh boots both and runs this in each):
#   t_rdma_pair.sh BUILD_DIR ROLE DIR
# ROLE is 0 or 1, DIR a directory both guests share (rendezvous files).
#   1. this guest's rxe device sits on its NIC (the only RDMA device here),
#      RC traffic crosses the wire both ways (ibv_rc_pingpong, rxe counters)
#   2. kcolld per host: guest 0 holds hosts 0 and 2 (10.32.0.1, .3), guest 1
#      hosts 1 and 3 (10.32.0.2, .4); each chose rdma on its guest's device
#   3. C4 names a degraded RDMA link: guest 1 rate-limits host 1's data to
#      host 0 on its NIC (tc) under checked all-reduces of the 2-host
#      communicator; nothing named before, host 0's detector names host 1's
#      link (evidence: its rx from host 1) after, nothing once tc is removed
#   4. every collective (mh_rank coll: all-reduce, reduce-scatter, all-gather,
#      broadcast, barrier; f32 f64 i32 bf16 f16 u8 ...; 0..1 MiB) bit-exact
#      with 2 hosts (one per guest) and 4 hosts (two per guest: ring
#      neighbours across the wire), a 4 MiB all-reduce, and the data went
#      through this guest's rxe (its packet counters grew by at least the
#      bytes / MTU that had to cross)
#   5. faults across the wire, with the survivor in the other guest: guest
#      1's kcolld killed mid-transfer, guest 1's NIC set down, guest 1's rxe
#      link deleted: guest 0's rank fails within a bound (no hang), its log
#      names the reason; afterwards a new communicator over RDMA works
# Each guest prints TAP about what it saw; a step both guests take meets in
# DIR first (files written here, polled there, generous deadlines; a guest
# that exits leaves "gone.ROLE" so the other stops waiting).
# PAIR_ONLY=c4 runs 1, 2 and 3 only (while working on C4); PAIR_ONLY=faults
# skips 3 (while working on the faults):
#   scripts/vmtest-pair.sh -- env PAIR_ONLY=c4 bash tests/vm/t_rdma_pair.sh build
set -u
B=${1:?usage: t_rdma_pair.sh BUILD_DIR ROLE DIR}
role=${2:?usage: t_rdma_pair.sh BUILD_DIR ROLE DIR}
S=${3:?usage: t_rdma_pair.sh BUILD_DIR ROLE DIR}
top=$(cd "$(dirname "$0")/../.." && pwd)
peer=$((1 - role))
RANK="$B/tests/mh_rank"
CTL="$B/bin/kcollctl"
D="$B/bin/kcolld"
TMO=4000
RXE=wrxe$role
only=${PAIR_ONLY:-}
n=0 failed=0
ok() { n=$((n + 1)); if [ "$1" -eq 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; failed=1; fi; }
now_ms() { date +%s%3N; }

# ---- rendezvous ------------------------------------------------------------------
# Soft-RoCE between two TCG guests on 2 shared cores answers late: with the
# usual 67 ms ACK timeout (KCOLL_IB_TIMEOUT=14) the QPs retransmit early and
# often, and rxe in 6.1 then NAKs a transfer with "remote invalid request"
# (the requester's QP fails: ops of 1 MiB and up failed within seconds).
# 18 (1.07 s) is NCCL's default for NCCL_IB_TIMEOUT; PAIR_IB_TIMEOUT=14
# shows the failure.
put() {	# name [content]: appears at once and whole in the other guest
	printf '%s\n' "${2:-}" >"$S/.$1.$role" && mv "$S/.$1.$role" "$S/$1"
}
await() {	# name secs: prints the content; 1 on timeout or when the peer left
	local i
	for ((i = 0; i < $2 * 10; i++)); do
		[ -e "$S/$1" ] && { cat "$S/$1"; return 0; }
		[ -e "$S/gone.$peer" ] && return 1
		sleep 0.1
	done
	return 1
}
meet() {	# name [secs]: both guests got here
	put "$1.$role"
	await "$1.$peer" "${2:-300}" >/dev/null
}
skip_all() {
	put "gone.$role" "$1"
	echo "ok 1 # SKIP $1"
	echo "1..1"
	exit 0
}

[ "$(id -u)" -eq 0 ] && [ -n "${KCOLL_VM:-}" ] || skip_all "runs in a guest of scripts/vmtest-pair.sh"
[ -x "$RANK" ] && [ -x "$D" ] || { put "gone.$role"; echo "Bail out! $B has no kcolld/mh_rank: run make"; exit 1; }
. "$top/scripts/vm-rxe-setup.sh"
modprobe virtio_net 2>/dev/null
vm_rxe_load || skip_all "cannot load rdma_rxe: ${why:-no such module in this kernel}"

T=$(mktemp -d /tmp/rdma-pair.XXXXXX)
pids=()
cleanup() {
	local p
	for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
	rdma link delete "$RXE" 2>/dev/null
	[ -e "$S/gone.$role" ] || put "gone.$role"
	rm -rf "$T"
}
trap cleanup EXIT

# ---- 1. this guest's NIC and rxe device ------------------------------------------
mac=52:54:00:4b:00:0$((role + 1))
IF=
for _ in $(seq 100); do
	for f in /sys/class/net/*/address; do
		[ "$(cat "$f")" = "$mac" ] && IF=$(basename "$(dirname "$f")")
	done
	[ -n "$IF" ] && break
	sleep 0.1
done
[ -n "$IF" ] || skip_all "no NIC with MAC $mac (not started by scripts/vmtest-pair.sh?)"
my_hosts=("$role" "$((role + 2))")
addr() { echo "10.32.0.$(($1 + 1))"; }
ip link set lo up
ip link set "$IF" up &&
	ip addr add "$(addr "$role")/24" dev "$IF" && ip addr add "$(addr $((role + 2)))/24" dev "$IF" &&
	rdma link add "$RXE" type rxe netdev "$IF"
rc=$?
devs=$(ls /sys/class/infiniband 2>/dev/null | tr '\n' ' ')
gids=
for i in 0 1 2 3; do
	g=$(cat "/sys/class/infiniband/$RXE/ports/1/gids/$i" 2>/dev/null)
	t=$(cat "/sys/class/infiniband/$RXE/ports/1/gid_attrs/types/$i" 2>/dev/null)
	case "$g" in 0000:0000:0000:0000:0000:ffff:*) gids+=" $i:${g:30}($t)" ;; esac
done
[ $rc -eq 0 ] && [ "$devs" = "$RXE " ] && [ -n "$gids" ]
ok $? "own rxe device on this guest's NIC: $RXE over $IF ($mac), RDMA devices here: ${devs:-none}, IPv4 GIDs:${gids:- none}"

ctr() { cat "/sys/class/infiniband/$RXE/ports/1/hw_counters/$1" 2>/dev/null || echo 0; }

# Reach the other guest: both NICs up, then ping over the wire.
meet up 300 || skip_all "the other guest never came up (see its output)"
ping -c 2 -W 5 "$(addr "$peer")" >"$T/ping" 2>&1
ok $? "ping $(addr "$peer") (the other guest) over the wire"

# A client/server pair of perftest-style tools across the wire: guest 1
# serves (CMD), guest 2 connects (CMD ADDR_OF_GUEST_1) once guest 1 said
# TAG-listen, retrying up to 5 times while OUT matches RETRY (a BRE: the
# server not listening yet). Status: the tool's (guest 1), 0/1 (guest 2).
pair_run() {	# TAG OUT SECONDS RETRY CMD...
	local tag=$1 out=$2 secs=$3 retry=$4 p
	shift 4
	if [ "$role" -eq 1 ]; then
		timeout "$secs" "$@" >"$out" 2>&1 &
		p=$!
		sleep 1
		put "$tag-listen"
		wait $p
		return
	fi
	await "$tag-listen" 300 >/dev/null
	for _ in 1 2 3 4 5; do
		timeout "$secs" "$@" "$(addr 1)" >"$out" 2>&1 && return 0
		grep -q "$retry" "$out" || return 1
		sleep 1
	done
	return 1
}

# RC traffic: ibv_rc_pingpong between the two rxe devices (guest 1 serves).
# GID index 1 is each device's RoCE v2 GID of its first address.
r0=$(ctr rcvd_pkts) s0=$(ctr sent_pkts)
pair_run pp "$T/pp" 90 "Couldn't connect" ibv_rc_pingpong -d "$RXE" -g 1 -n 100 -s 4096
pprc=$?
dr=$(($(ctr rcvd_pkts) - r0)) ds=$(($(ctr sent_pkts) - s0))
sed 's/^/# /' "$T/pp"
# 100 round trips of 4 KiB at an MTU of at most 4 KiB: at least 100 packets
# each way through this device
[ $pprc -eq 0 ] && grep -q "remote address: .*GID ::ffff:$(addr "$peer")" "$T/pp" && [ $dr -ge 100 ] && [ $ds -ge 100 ]
ok $? "RC traffic across the wire: ibv_rc_pingpong with ::ffff:$(addr "$peer") (status $pprc), $RXE sent $ds and received $dr packets"
meet pp-done 300

# perftest's ib_write_bw across the wire, 1 MiB messages on 2 QPs (guest 1
# serves): what rxe alone carries between the two kernels.
pair_run bw "$T/bw" 120 "Couldn't connect\|Unable to init the socket" \
	ib_write_bw -d "$RXE" -x 1 -s 1048576 -n 20 -q 2 -F
bwrc=$?
mbs=$(awk '$1 == 1048576 && NF >= 4 { print $4 }' "$T/bw" | tail -1)
[ $bwrc -eq 0 ] && [ -n "$mbs" ]
ok $? "ib_write_bw across the wire: 20 x 1 MiB on 2 QPs (status $bwrc, ${mbs:-no} MB/sec)"
[ $bwrc -eq 0 ] || tail -n 5 "$T/bw" | sed 's/^/# /'
meet bw-done 300

# ---- 2. daemons -----------------------------------------------------------------
sock() { echo "$T/h$1.sock"; }
start_daemon() {	# host [env...]
	local h=$1
	shift
	rm -f "$(sock "$h")"
	env KCOLL_NET_XPORT=rdma KCOLL_NET_CHUNK_BYTES=65536 KCOLL_IB_QPS=2 KCOLL_SPIN_US=0 \
		KCOLL_IB_TIMEOUT="${PAIR_IB_TIMEOUT:-18}" "$@" "$D" -f -s "$(sock "$h")" -l "$T/h$h.log" --listen "$(addr "$h"):0" \
		--addrs "$(addr "$h")" >"$T/h$h.out" 2>&1 &
	pids[h]=$!
	for _ in $(seq 600); do
		[ -S "$(sock "$h")" ] && "$CTL" -s "$(sock "$h")" status >/dev/null 2>&1 && break
		sleep 0.1
	done
	for _ in $(seq 600); do
		grep -q "transport between daemons:" "$T/h$h.log" 2>/dev/null && return 0
		sleep 0.1
	done
	return 1
}
dump() {
	local h
	for h in "${my_hosts[@]}"; do
		tail -n 8 "$T/h$h.log" 2>/dev/null | sed "s/^/# h$h: /"
		head -n 20 "$T/h$h.out" 2>/dev/null | sed "s/^/# h$h out: /"
	done
}
bad=
for h in "${my_hosts[@]}"; do
	start_daemon "$h" || bad+=" h$h(not up)"
	grep -q "transport between daemons: rdma, device $RXE" "$T/h$h.log" || bad+=" h$h(not rdma on $RXE)"
done
[ -z "$bad" ]; ok $? "kcolld for hosts ${my_hosts[*]} ($(addr "$role"), $(addr $((role + 2)))): rdma on $RXE${bad:+ (got:$bad)}"
[ -z "$bad" ] || dump
meet daemons 300 || skip_all "the other guest's daemons did not come up (see its output)"

# Run mh_rank MODE on this guest's share of hosts 0..NH-1 (rank = host);
# guest 0 takes the id from host 0 and hands it over. Sets rc_all, dr (rxe
# packets received meanwhile) and leaves $T/TAG.RANK.out.
run_ranks() {	# tag mode nhosts secs [args...]
	local tag=$1 mode=$2 nh=$3 s=$4 id h p=() rc=0 r1
	shift 4
	if [ "$role" -eq 0 ]; then
		id=$(KCOLL_SOCKET=$(sock 0) timeout 20 "$RANK" id)
		put "id.$tag" "$id"
	else
		id=$(await "id.$tag" 300)
	fi
	[ -n "$id" ] || { rc_all=99; dr=0; return; }
	r1=$(ctr rcvd_pkts)
	for h in "${my_hosts[@]}"; do
		[ "$h" -lt "$nh" ] || continue
		env KCOLL_SOCKET="$(sock "$h")" KCOLL_TIMEOUT_MS=$TMO timeout -k 2 "$s" \
			"$RANK" "$mode" "$id" "$nh" "$h" "$@" >"$T/$tag.$h.out" 2>&1 &
		p+=($!)
	done
	for h in "${p[@]}"; do wait "$h" || rc=$?; done
	dr=$(($(ctr rcvd_pkts) - r1))
	rc_all=$rc
}
# The result lines of this guest's ranks: all "bad=0", at least MIN groups each.
judge() {	# tag nhosts min-groups -> 0 when good
	local tag=$1 nh=$2 min=$3 h g b=0
	for h in "${my_hosts[@]}"; do
		[ "$h" -lt "$nh" ] || continue
		g=$(grep -c '^group cases=[1-9][0-9]* bad=0 ' "$T/$tag.$h.out")
		grep -q '^group .* bad=[1-9]' "$T/$tag.$h.out" && b=1
		[ "$g" -ge "$min" ] || b=1
	done
	[ "$rc_all" -eq 0 ] && [ $b -eq 0 ]
}
show() {	# tag
	cat "$T/$1".*.out | grep -v '^group .* bad=0 ' | head -20 | sed 's/^/# /'
}
mine() {	# nhosts: this guest's ranks among them
	local h out=
	for h in "${my_hosts[@]}"; do [ "$h" -lt "$1" ] && out+="${out:+, }$h"; done
	echo "$out"
}

counters() {	# the rxe counters that tell retransmissions and errors apart
	local c out=
	for c in sent_pkts rcvd_pkts duplicate_request out_of_seq_request rcvd_seq_err completer_retry_err \
		retry_exceeded_err rcvd_rnr_err send_rnr_err send_err; do
		out+=" $c=$(ctr $c)"
	done
	echo "# $RXE counters:$out"
}

# ---- the end: SIGTERM, no sanitizer report ------------------------------------------
the_end() {	# [--alone]: without meeting the other guest (it left)
	[ "${1:-}" = --alone ] || meet end 600
	local h bad=
	for h in "${my_hosts[@]}"; do
		kill -TERM "${pids[h]}" 2>/dev/null
		wait "${pids[h]}" 2>/dev/null || bad+=" h$h(status $?)"
	done
	pids=()
	grep -l "ERROR: AddressSanitizer\|runtime error:\|LeakSanitizer" "$T"/h*.out >/dev/null 2>&1 && bad+=" sanitizer report"
	[ -z "$bad" ]; ok $? "this guest's daemons exit 0 on SIGTERM, no sanitizer report${bad:+ (got:$bad)}"
	[ -z "$bad" ] || head -n 30 "$T"/h*.out | sed 's/^/# /'
	echo "1..$n"
	exit $failed
}

# ---- 3. C4 names a degraded RDMA link (issue 22) ---------------------------------
# The 2-host communicator (host 0 in guest 0, host 1 in guest 1): every link it
# has crosses the wire. (The 4-host one also has links between the two hosts
# of one guest, through rxe inside one kernel, ten times faster than the wire:
# against their median every healthy wire link looked slow; docs/c4.md, "Links
# of one class".) Both ranks run checked 1 MiB all-reduces (mh_rank traffic)
# throughout:
#   (a) 20 s healthy: no communication-slow event on either host;
#   (b) guest 1 rate-limits host 1's data to host 0 on its NIC: prio + u32 on
#       the source and destination addresses, tbf at a quarter of the rate
#       host 0's detector measured for it; packets under 256 bytes
#       (acknowledgements, credits) pass. Host 0's detector names host 1's
#       link 0, its evidence the rx from host 1, within 60 s; host 1's merged
#       view names it too;
#   (c) the tc rules removed: no active anomaly on either host within 60 s;
#   (d) every all-reduce of the traffic was right, none failed.
# Debian's python: the python3 first on PATH may be a pyenv shim, a shell
# script that takes seconds to start in a TCG guest
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
c4_view() {	# expr [--local]: the active entries of this guest's host for which
		# the Python expression EXPR (on e) holds, one JSON line each; 0 if any
	timeout 20 "$CTL" -s "$(sock "$role")" anomalies --json ${2:+"$2"} >"$T/c4view" 2>/dev/null
	"$PY" - "$1" "$T/c4view" <<'EOF'
import json, sys
try:
    d = json.load(open(sys.argv[2]))
except (OSError, ValueError):
    sys.exit(2)
hit = [e for c in d["comms"] for e in c["active"] if eval(sys.argv[1])]
for e in hit:
    print(json.dumps({k: e.get(k) for k in ("kind", "host", "link", "via_host", "dir", "value", "ref",
                                          "samples", "seen_by")}))
sys.exit(0 if hit else 1)
EOF
}
c4_json() {	# python expression on d, this guest's host's anomalies --json
	timeout 20 "$CTL" -s "$(sock "$role")" anomalies --json 2>/dev/null |
		"$PY" -c 'import json, sys
try:
    d = json.load(sys.stdin)
except ValueError:
    sys.exit(1)
print(eval(sys.argv[1]))' "$1"
}
c4_raised() {	# comm: comm-slow raises in this guest's host's event log (merged)
	timeout 20 "$CTL" -s "$(sock "$role")" events --json 2>/dev/null |
		"$PY" -c 'import json, sys
try:
    d = json.load(sys.stdin)
except ValueError:
    print("unreadable"); sys.exit()
print(sum(1 for e in d["events"] if e["kind"] == "comm_slow" and e["raised"] and e["comm"] == sys.argv[1]))' "$1"
}
c4_poll() {	# secs expr [--local|--gone]: polls this guest's host's anomalies
		# --json in one python (its start takes seconds in a loaded TCG
		# guest) until an active entry e satisfies EXPR (with --gone: until
		# none does); prints the ms taken, or "timeout"; matches in $T/c4hit
	"$PY" - "$CTL" "$(sock "$role")" "$1" "$2" "${3:-}" "$T/c4hit" <<'EOF'
import json, subprocess, sys, time
ctl, sock, secs, expr, opt, hit = sys.argv[1:7]
gone = opt == "--gone"
args = [ctl, "-s", sock, "anomalies", "--json"] + (["--local"] if opt == "--local" else [])
t0 = time.time()
while True:
    try:
        d = json.loads(subprocess.run(args, capture_output=True, timeout=20).stdout)
        found = [e for c in d["comms"] for e in c["active"] if eval(expr)]
        with open(hit, "w") as f:
            for e in found:
                f.write(json.dumps({k: e.get(k) for k in ("kind", "host", "link", "via_host", "dir",
                                    "value", "ref", "samples", "seen_by")}) + "\n")
        if bool(found) != gone:
            print(int((time.time() - t0) * 1000))
            sys.exit(0)
    except (ValueError, KeyError, subprocess.TimeoutExpired):
        pass
    if time.time() - t0 > float(secs):
        print("timeout")
        sys.exit(1)
    time.sleep(0.5)
EOF
}
c4_show() {	# the rates and anomalies host $role sees, the traffic's last lines
	c4_json '"rates: " + " ".join("%s/%s=%.2fMB/s" % (l["host"], l["dir"], l["rate"] / 1e6) for c in d["comms"] for l in c["links"])' |
		sed 's/^/# /'
	c4_view 'True' | sed 's/^/# active: /'
	grep "C4\|rdma" "$T/h$role.log" 2>/dev/null | tail -n 6 | sed 's/^/# log: /'
}
c4_timeline() {	# comm t_degrade t_heal: the comm-slow events this guest's host knows, in time
	timeout 20 "$CTL" -s "$(sock "$role")" events --json 2>/dev/null |
		"$PY" -c 'import json, sys
d = json.load(sys.stdin)
for e in d["events"]:
    if e["kind"] == "comm_slow" and e["comm"] == sys.argv[1]:
        print("# %s by host %d: host %d link %d, %+d ms from the degrade, %+d ms from the heal" % (
            "raised" if e["raised"] else "cleared", e["observer"], e["host"], e["link"],
            e["time_ms"] - int(sys.argv[2]), e["time_ms"] - int(sys.argv[3])))' "$@"
}
SLOW1='e["kind"] == "comm_slow" and e["host"] == 1 and e["link"] == 0'
c4_section() {
	local id tp comm raised rate kbit ms t deg_ok=0 sent res t_deg t_heal
	meet c4 600 || { ok 1 "C4: the other guest reached the C4 section"; return; }
	mkdir -p "$T/c4"
	if [ "$role" -eq 0 ]; then
		id=$(KCOLL_SOCKET=$(sock 0) timeout 20 "$RANK" id)
		put "id.c4" "$id"
	else
		id=$(await "id.c4" 300)
	fi
	env KCOLL_SOCKET="$(sock "$role")" KCOLL_TIMEOUT_MS=20000 timeout -k 2 500 \
		"$RANK" traffic "$id" 2 "$role" "$T/c4" 262144 400 >"$T/c4.out" 2>&1 &
	tp=$!
	for _ in $(seq 1200); do
		[ -e "$T/c4/ready.$role" ] || ! kill -0 $tp 2>/dev/null && break
		sleep 0.1
	done
	meet c4-ready 300
	# (a) healthy
	sleep 20
	comm=$(c4_json 'd["comms"][0]["comm"]')
	raised=$(c4_raised "$comm")
	[ -e "$T/c4/ready.$role" ] && [ "$raised" = 0 ]
	ok $? "C4 (a) 20 s of checked 1 MiB all-reduces over the healthy wire (comm ${comm:-none}): no communication-slow event on host $role (got ${raised:-none})"
	c4_show
	# (b) degrade host 1's data to host 0
	if [ "$role" -eq 0 ]; then
		rate=$(c4_json 'max([l["rate"] for c in d["comms"] for l in c["links"] if l["host"] == 1 and l["dir"] == "rx"] or [0])')
		put c4rate "${rate:-0}"
		t_deg=$(await c4deg 300)
		if [ "${t_deg%% *}" = 1 ]; then
			ms=$(c4_poll 60 "$SLOW1 and e.get(\"dir\") == \"rx\"" --local)
			ok $? "C4 (b) host 0's detector names host 1's link 0, evidence its rx from host 1, $ms ms after the degrade"
			sed 's/^/# /' "$T/c4hit"
			[ "$ms" != timeout ] || c4_show
		else
			ok 1 "C4 (b) guest 1 degraded host 1's data to host 0"
		fi
		put c4named
	else
		rate=$(await c4rate 300)
		kbit=$(( ${rate:-0} * 8 / 1000 / 4 ))
		[ "$kbit" -ge 800 ] || kbit=800
		modprobe -a sch_prio sch_tbf cls_u32 2>/dev/null
		# band 1 (1:2) for all; 1:3 (tbf) for host 1's data to host 0
		tc qdisc add dev "$IF" root handle 1: prio bands 3 priomap 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 &&
			tc qdisc add dev "$IF" parent 1:3 handle 30: tbf rate "${kbit}kbit" burst 16kb limit 4mb &&
			tc filter add dev "$IF" parent 1: protocol ip prio 1 u32 match u16 0 0xff00 at 2 flowid 1:2 &&
			tc filter add dev "$IF" parent 1: protocol ip prio 2 u32 \
				match ip src "$(addr 1)/32" match ip dst "$(addr 0)/32" flowid 1:3
		t=$?
		[ $t -eq 0 ] && deg_ok=1
		t_deg="$deg_ok $(now_ms)"
		put c4deg "$t_deg"
		ok $t "C4 (b) $IF: host 1's data to host 0 at ${kbit} kbit/s (a quarter of host 0's rate for it: $(( ${rate:-0} / 1000 )) kB/s)"
		ms=$(c4_poll 60 "$SLOW1 and 0 in e[\"seen_by\"]")
		ok $? "C4 (b) host 1's merged view names host 1's link 0 as host 0 saw it, $ms ms after the degrade"
		sed 's/^/# /' "$T/c4hit"
		await c4named 120 >/dev/null
		sent=$(tc -s qdisc show dev "$IF" | sed -n '/qdisc tbf 30:/,/Sent/s/.*Sent \([0-9]*\) bytes.*/\1/p')
		[ "${sent:-0}" -ge 262144 ]
		ok $? "C4 (b) the tbf carried host 1's data to host 0 (${sent:-0} bytes)"
		tc qdisc del dev "$IF" root
		put c4healed "$(now_ms)"
	fi
	# (c) heal (guest clocks agree to a few ms: the timeline compares them)
	t_heal=$(await c4healed 300)
	ms=$(c4_poll 60 'e["kind"] == "comm_slow"' --gone)
	ok $? "C4 (c) tc removed: no communication-slow anomaly active on host $role, $ms ms after it saw the heal"
	[ "$ms" != timeout ] || sed 's/^/# /' "$T/c4hit"
	c4_timeline "$comm" "${t_deg##* }" "${t_heal:-0}"
	# (d) stop the traffic: both ranks stop after the same op
	meet c4-stop 300
	touch "$T/c4/stop"
	wait $tp
	t=$?
	res=$(grep '^traffic ' "$T/c4.out")
	[ $t -eq 0 ] && grep -q '^traffic ops=[1-9][0-9]* bad=0 err=0 ' "$T/c4.out"
	ok $? "C4 (d) host $role's traffic: every all-reduce right, none failed (status $t: ${res:-no result})"
	[ $t -eq 0 ] || { tail -n 5 "$T/c4.out" | sed 's/^/# /'; dump; counters; }
}

[ "$only" = faults ] || c4_section
[ "$only" != c4 ] || the_end

# ---- 4. collectives across the wire ----------------------------------------------
# mh_rank coll: 10 groups (every collective; the 1 MiB f32 all-reduce alone
# makes each rank receive 1 MiB from across the wire: at most 4 KiB a packet)
coll_ok=1
for nh in 2 4; do
	meet "coll$nh" 600 || break
	t0=$(now_ms)
	run_ranks "coll$nh" coll $nh 400
	judge "coll$nh" $nh 10; r=$?
	[ $r -eq 0 ] || coll_ok=0
	ok $r "every collective bit-exact over RDMA across two guests, $nh hosts (ranks $(mine $nh) here), $RXE received $dr packets [$(( ($(now_ms) - t0) / 1000 )) s]"
	[ $r -eq 0 ] || { show "coll$nh"; dump; counters; }
	[ $dr -ge 256 ]; ok $? "coll, $nh hosts: the data crossed the wire through $RXE ($dr packets received, >= 256 needed for 1 MiB)"
done
meet big 600
t0=$(now_ms)
run_ranks big big 2 300 1048579
judge big 2 1; r=$?
[ $r -eq 0 ] || coll_ok=0
ok $r "4 MiB f32 all-reduce bit-exact over RDMA across two guests, 2 hosts, $RXE received $dr packets [$(( ($(now_ms) - t0) / 1000 )) s]"
[ $r -eq 0 ] || { show big; dump; counters; }
grep -h '^# rank' "$T"/big.*.out | sed 's/^/# /'

# The faults need a transport that carries the fault loop's 4 MiB
# all-reduces (mh_rank loop) across the wire: after a failure above they
# would only measure that failure (and wait out every deadline).
put "collok.$role" $coll_ok
[ "$(await "collok.$peer" 600)" = 1 ] || coll_ok=0
if [ $coll_ok -eq 0 ]; then
	put "gone.$role" "faults skipped"
	echo "ok $((n + 1)) # SKIP faults across the wire (peer kcolld killed, NIC down, rxe link deleted): the collectives above failed"
	n=$((n + 1))
	the_end --alone
fi

# ---- 5. faults across the wire (guest 1 strikes, guest 0 judges) -----------------
# Both guests run mh_rank loop (checked 4 MiB all-reduces until one fails)
# on hosts 0 and 1; once both are past their first rounds guest 1 strikes;
# guest 0 notes when it saw the strike file (clocks of the two guests are
# not compared).
fault_run() {	# tag strike-command
	local tag=$1 id h=$role rc
	if [ "$role" -eq 0 ]; then
		id=$(KCOLL_SOCKET=$(sock 0) timeout 20 "$RANK" id)
		put "id.$tag" "$id"
	else
		id=$(await "id.$tag" 300)
	fi
	mkdir -p "$T/$tag"
	env KCOLL_SOCKET="$(sock "$h")" KCOLL_TIMEOUT_MS=$TMO timeout -k 2 180 \
		"$RANK" loop "$id" 2 "$h" "$T/$tag" >"$T/$tag.$h.out" 2>&1 &
	lp=$!
	for _ in $(seq 1200); do [ -e "$T/$tag/ready.$h" ] && break; sleep 0.1; done
	meet "ready.$tag" 300
	if [ "$role" -eq 1 ]; then
		eval "$2"
		put "struck.$tag"
	else
		await "struck.$tag" 300 >/dev/null
	fi
	t_seen=$(now_ms)
	# A rank still waiting past the bound: where this guest's daemons are
	# (their threads' kernel stacks name a verbs call that blocks).
	( sleep $(((TMO * 3 + 10000) / 1000 + 1)); kill -0 $lp 2>/dev/null || exit 0
	  for h in "${my_hosts[@]}"; do
		for t in /proc/${pids[h]}/task/*; do
			echo "# h$h thread ${t##*/} ($(cat "$t/comm" 2>/dev/null)): $(cat "$t/wchan" 2>/dev/null)"
			sed 's/^/#     /' "$t/stack" 2>/dev/null | head -n 12
		done
	  done >"$T/$tag.stacks" ) &
	wait $lp; rc=$?
	[ -s "$T/$tag.stacks" ] && { echo "# past the bound, this guest's kcolld threads:"; cat "$T/$tag.stacks"; }
	fault_line=$(grep '^fault ' "$T/$tag.$h.out")
	# guest 1 repairs only after guest 0's rank has its result
	if [ "$role" -eq 0 ]; then put "seen.$tag"; else await "seen.$tag" 300 >/dev/null; fi
	echo "# rank $h (status $rc): ${fault_line:-no fault line}"
}
# Guest 0's rank must fail (err != 0) within the bound after it saw the strike.
judge_fault() {	# label
	local e t
	e=$(sed -n 's/.* name=\([^ ]*\) .*/\1/p' <<<"$fault_line")
	t=$(sed -n 's/.* t_ms=\([0-9]*\).*/\1/p' <<<"$fault_line")
	[ -n "$e" ] && [ "$e" != 0 ] && [ -n "$t" ] && [ $((t - t_seen)) -le $((TMO * 3 + 10000)) ]
	ok $? "$1: host 0's op fails (${e:-nothing}), $((${t:-0} - t_seen)) ms from when guest 0 saw the strike file (bound $((TMO * 3 + 10000)) ms)"
	[ -n "$e" ] && [ "$e" != 0 ] || { show "$tag"; dump; }
}
works_again() {	# tag label
	meet "pre.$1" 300
	run_ranks "$1" check 2 240
	judge "$1" 2 1
	ok $? "$2"
	[ "$rc_all" -eq 0 ] || { show "$1"; dump; }
}

tag=kill
fault_run kill 'kill -KILL ${pids[1]}'
if [ "$role" -eq 0 ]; then
	judge_fault "guest 1's kcolld (host 1) killed mid-transfer"
	for _ in $(seq 100); do
		grep -q "closed its connection\|rdma to host 1\|lost host 1" "$T/h0.log" && break
		sleep 0.1
	done
	why=$(grep -o "closed its connection.*\|rdma to host 1.*\|lost host 1.*" "$T/h0.log" | head -1 | cut -c1-120)
	[ -n "$why" ]; ok $? "host 0's log names the dead host 1 (${why:-nothing})"
else
	wait "${pids[1]}" 2>/dev/null
	e=$(sed -n 's/.* name=\([^ ]*\) .*/\1/p' <<<"$fault_line")
	[ -n "$e" ] && [ "$e" != 0 ]
	ok $? "host 1's own rank fails when its kcolld dies (${e:-nothing}), no hang"
	start_daemon 1
	ok $? "kcolld for host 1 started again"
fi
works_again afterkill "after the kill: a new communicator over RDMA across the guests works"

# The other guest's NIC goes down mid-transfer: nothing crosses the wire;
# guest 0's transfers fail (retries exhausted, op timeout).
tag=nicdown
fault_run nicdown "ip link set $IF down"
if [ "$role" -eq 0 ]; then
	judge_fault "guest 1's NIC ($IF under wrxe1) down mid-transfer"
	why=$(grep -ho "rdma to host 1 .*\|lost host 1.*\|timed out.*" "$T/h0.log" | head -1 | cut -c1-150)
	[ -n "$why" ]; ok $? "host 0's log says why (${why:-nothing})"
	[ -n "$why" ] || tail -n 5 "$T/h0.log" | sed 's/^/# /'
else
	ip link set "$IF" up
	for _ in $(seq 100); do rdma link show "$RXE/1" 2>/dev/null | grep -q "state ACTIVE" && break; sleep 0.2; done
	bad=
	for h in "${my_hosts[@]}"; do kill -0 "${pids[h]}" 2>/dev/null || bad+=" h$h"; done
	[ -z "$bad" ]; ok $? "every kcolld here survives its NIC going down${bad:+ (dead:$bad)}"
fi
works_again afternic "NIC up again: a new communicator over RDMA across the guests works"

# The other guest's rxe link deleted mid-transfer: guest 1's kcolld fails the
# transfers on it and closes it (rxe in 6.1 waits for that); guest 0's fail.
tag=linkdel
fault_run linkdel "rdma link delete $RXE >$T/linkdel.out 2>&1 & delpid=\$!"
if [ "$role" -eq 0 ]; then
	judge_fault "guest 1's rxe link (wrxe1) deleted mid-transfer"
else
	for _ in $(seq 600); do kill -0 "$delpid" 2>/dev/null || break; sleep 0.1; done
	if kill -0 "$delpid" 2>/dev/null; then
		ok 1 "rdma link delete completes once kcolld closed the device (still waiting after 60 s)"
		kill -KILL "$delpid" 2>/dev/null
	else
		wait "$delpid"; drc=$?
		[ $drc -eq 0 ] && ! rdma link show 2>/dev/null | grep -q "link $RXE/"
		ok $? "rdma link delete $RXE completes once kcolld closed the device (status $drc)"
	fi
	bad=
	for h in "${my_hosts[@]}"; do
		kill -0 "${pids[h]}" 2>/dev/null || bad+=" h$h(dead)"
		grep -q "closed $RXE (being removed)" "$T/h$h.log" || bad+=" h$h(no 'closed $RXE')"
	done
	[ -z "$bad" ]; ok $? "every kcolld here alive and closed $RXE${bad:+ (got:$bad)}"
	rdma link add "$RXE" type rxe netdev "$IF"
	for _ in $(seq 100); do rdma link show "$RXE/1" 2>/dev/null | grep -q "state ACTIVE" && break; sleep 0.2; done
fi
works_again afterdel "rxe link added again: a new communicator over RDMA across the guests works"

the_end
