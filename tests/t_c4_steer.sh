#!/usr/bin/env bash
# Issue 7, planner: foreign tracked flows follow the C4 plan. A 2-host netns
# cluster, kcolld with KCOLL_BPF=1 on both (pins in a bpffs of this test), a
# continuous all-reduce (tests/c4_rank) so the detector has timing, and a
# foreign TCP stream (tests/steer_net.py, paced, SHA-256 on both ends) from
# h0 to h1's eth0 address, port 5301, tracked by port on both hosts
# (kcoll-bpf track). Then:
#   - healthy: `kcollctl plan --json` lists the flow at home on link 0 and its
#     BPF record on eth0 carries its bytes;
#   - degrade h1's eth0: the detector marks it, the plan moves kcolld's
#     streams and the foreign flow (kcoll_steer, two phases: both hosts
#     restore before either sends) to link 1; h0's BPF flow record on eth1
#     (the via pair) and the steering rule's counters carry the stream's
#     bytes, its record on eth0 almost none; `kcollctl plan` says why;
#   - heal: the flow comes home (rules removed, its bytes on eth0 again);
#   - the stream arrived intact, the all-reduces ended well.
# Needs root, network namespaces and the BPF build (SKIP otherwise). About 60 s. TAP.
set -u
. "${KCOLL_TOP:?run through tests/run.sh}/tests/cluster_lib.sh"
KB="$B/bin/kcoll-bpf"
CTL="$B/bin/kcollctl"
RANK="$B/tests/c4_rank"
cluster_prefix "c4s$$"
H=2 PORT=5301 RATE=20000000

need_kcoll_bpf
[ -x "$RANK" ] || { echo "Bail out! $RANK missing: run make"; exit 1; }
need_netns
pick_python
NET="$PY $top/tests/steer_net.py"

cluster_tmp c4s
chmod 755 "$T"
PIDS=()
cleanup() {
	touch "$T/stop1"
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
	jobs -p | xargs -r kill -KILL 2>/dev/null
	wait 2>/dev/null
	cluster_cleanup
}
trap cleanup EXIT
trap 'exit 130' INT TERM
sock() { echo "$R/h$1/kcolld.sock"; }
pin() { echo "$T/bpffs/h$1"; }
K() { local i=$1; shift; "$KB" --pin "$(pin "$i")" --netns "$P-h$i" "$@"; }

export KCOLL_LOG_LEVEL=info
"$C" up -H $H >"$T/up.out" 2>&1 || { cat "$T/up.out"; echo "Bail out! cluster up failed"; exit 1; }
mkdir -p "$T/bpffs" && mount -t bpf bpf "$T/bpffs" || skip_all "cannot mount a bpffs"
err=0
for ((i = 0; i < H; i++)); do
	KCOLL_BPF=1 KCOLL_BPF_PIN=$(pin "$i") "$C" restart "$i" >>"$T/restart.out" 2>&1 || err=1
done
for ((i = 0; i < H; i++)); do
	for _ in $(seq 100); do
		grep -q "flow tracking: \(attached\|.*is off\)" "$R/h$i/kcolld.log" && break
		sleep 0.1
	done
	grep -q "flow tracking: attached" "$R/h$i/kcolld.log" || err=1
	"$KB" --pin "$(pin "$i")" track $PORT >>"$T/track.out" 2>&1 || err=1
done
ok $err "2 hosts, kcolld with KCOLL_BPF=1, port $PORT tracked on both$( [ $err = 0 ] ||
	{ echo ': '; cat "$T/restart.out" "$T/track.out"; grep -h "flow tracking" "$R"/h*/kcolld.log; })"
[ $err = 0 ] || { echo "1..$n"; exit 1; }

# The all-reduce loop (the detector's timing) and the foreign stream.
id=$("$C" exec 0 "$RANK" id) || { echo "Bail out! c4_rank id failed"; exit 1; }
for ((i = 0; i < H; i++)); do
	"$C" exec "$i" "$RANK" loop "$id" $H "$i" 60 $((4 << 20)) 0 >"$T/loop.$i.out" 2>&1 &
	rpid[$i]=$!
done
ip netns exec "$P-h1" $NET serve 10.10.0.2 $PORT "$T/prog1" >"$T/recv1" 2>"$T/recv1.err" &
PIDS+=($!)
for _ in $(seq 50); do
	ip netns exec "$P-h1" ss -Hltn "sport = :$PORT" | grep -q . && break
	sleep 0.1
done
ip netns exec "$P-h0" $NET send 10.10.0.2 $PORT "$T/stop1" $RATE >"$T/send1" 2>"$T/send1.err" &
SENDER=$!
PIDS+=($!)

got() { cat "$T/prog1" 2>/dev/null || echo 0; }
tx() { ip netns exec "$P-h0" cat "/sys/class/net/$1/statistics/tx_bytes"; }
# h0's BPF tx payload of the stream's records on link 0 (the home pair, eth0)
# and link 1 (the via pair, eth1), from one read of the map: "B0 B1"
bpf_tx() {
	"$KB" --pin "$(pin 0)" flows --json | $PY -c 'import json,sys
port = int(sys.argv[1])
f = [x for x in json.load(sys.stdin)["flows"] if port in (x["lport"], x["rport"])]
print(sum(x["tx_payload"] for x in f if x["link"] == 0), sum(x["tx_payload"] for x in f if x["link"] == 1))' $PORT
}
rule_out() {
	K 0 steer list --json 2>/dev/null | $PY -c 'import json,sys
try: r = json.load(sys.stdin)["rules"]
except Exception: r = []
print(sum(x["out_bytes"] for x in r if x["rport"] == int(sys.argv[1])))' $PORT
}
# window S: what moved over S seconds (stream received, h0 eth0 tx, BPF link 0/1 tx, rule out)
window() {
	local r e b0 b1 ro c0 c1
	r=$(got) e=$(tx eth0) ro=$(rule_out)
	read -r b0 b1 <<<"$(bpf_tx)"
	sleep "$1"
	read -r c0 c1 <<<"$(bpf_tx)"
	W_R=$(( $(got) - r )) W_E0=$(( $(tx eth0) - e )) W_B0=$((c0 - b0)) W_B1=$((c1 - b1))
	W_RO=$(( $(rule_out) - ro ))
	W_TXT="received +$W_R; h0 BPF tx on link 0 +$W_B0, link 1 +$W_B1; rule out +$W_RO; h0 eth0 tx +$W_E0"
}
# foreign STATE on both hosts: 0 when every host lists the flow in that state
foreign_state() {
	local i
	for ((i = 0; i < H; i++)); do
		timeout 10 "$CTL" -s "$(sock "$i")" plan --json | $PY -c 'import json,sys
f = [x for x in json.load(sys.stdin).get("foreign", []) if sys.argv[1] in (str(x["lport"]), str(x["rport"]))]
sys.exit(0 if f and all(x["state"] == sys.argv[2] for x in f) else 1)' $PORT "$1" || return 1
	done
}
wait_state() {	# state seconds
	local t0
	t0=$(now_ms)
	while [ $(($(now_ms) - t0)) -lt $(($2 * 1000)) ]; do
		foreign_state "$1" && return 0
		sleep 0.25
	done
	return 1
}

sleep 3
wait_state home 10
ok $? "healthy: both hosts' plans list the foreign flow (port $PORT) at home"
window 2
# (the receiver's progress only shows the stream runs: it also drains what
# the sender buffered, so it is not compared with the counters byte for byte)
[ "$W_R" -gt 1000000 ] && [ "$W_B0" -gt 1000000 ] && [ $((W_B1 * 20)) -lt "$W_B0" ]
ok $? "healthy: the stream's bytes are on link 0 (eth0): $W_TXT"

"$C" degrade 1 eth0 100mbit >/dev/null
t_deg=$(now_ms)
wait_state steered 20
rc=$?
ok $rc "degrade h1 eth0: the foreign flow is steered on both hosts ($(($(now_ms) - t_deg)) ms)"
timeout 10 "$CTL" -s "$(sock 0)" plan >"$T/plan.txt"
sed 's/^/# h0: /' "$T/plan.txt"
grep -q "tcp .*:$PORT .*steered .*avoid degraded link 0: on link 1" "$T/plan.txt"
ok $? "kcollctl plan on h0 shows the flow steered and why"
if [ $rc -eq 0 ]; then
	window 2
	# the flow's own record on eth0 (exact: the tracker counts what leaves
	# there) rather than eth0's counter, which also carries kcolld's streams
	# until the pair switched them
	[ "$W_R" -gt 1000000 ] && [ "$W_B1" -gt 1000000 ] && [ "$W_RO" -gt 1000000 ] &&
		[ $((W_B0 * 20)) -lt "$W_B1" ]
	ok $? "steered: the stream's bytes travel on link 1 (eth1), not eth0: $W_TXT"
else
	ok 1 "steered: the stream's bytes travel on link 1 (not steered)"
	grep -h "C4" "$R"/h*/kcolld.log | tail -20 | sed 's/^/# /'
fi

"$C" heal 1 >/dev/null
t_heal=$(now_ms)
wait_state home 30
rc=$?
ok $rc "heal: the foreign flow is home again on both hosts ($(($(now_ms) - t_heal)) ms)"
left=$(K 0 steer list --json 2>/dev/null | $PY -c 'import json,sys
try: print(len(json.load(sys.stdin)["rules"]))
except Exception: print(0)')
window 2
[ "$W_R" -gt 1000000 ] && [ "$W_B0" -gt 1000000 ] && [ $((W_B1 * 20)) -lt "$W_B0" ] && [ "$left" = 0 ]
rc=$?
ok $rc "home: the stream's bytes are on link 0 again, no steering rule left ($left): $W_TXT"
[ $rc -eq 0 ] || grep -h "C4" "$R"/h*/kcolld.log | tail -30 | sed 's/^/# /'

touch "$T/stop1"
err=0
wait "$SENDER" || err=1
for _ in $(seq 50); do [ -s "$T/recv1" ] && break; sleep 0.1; done
read -r sb sh <"$T/send1"; read -r rb rh _ _ <"$T/recv1"
[ $err = 0 ] && [ "${sb:-x}" = "${rb:-y}" ] && [ "${sh:-x}" = "${rh:-y}" ]
ok $? "the stream arrived intact through move and return: sent $sb B, received $rb B, sha256 ${sh:0:16}.. / ${rh:0:16}..$(cat "$T"/*.err 2>/dev/null)"
bad=0
for ((i = 0; i < H; i++)); do wait "${rpid[$i]}" || bad=1; done
ok $bad "every rank's all-reduces succeeded with the right sums$( [ $bad = 0 ] || tail -n 2 "$T"/loop.*.out)"

echo "1..$n"
exit $failed
