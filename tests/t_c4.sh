#!/usr/bin/env bash
# C4 (issue 7) on the netns test bed: 4 hosts, one rank each (tests/c4_rank,
# a continuous checked all-reduce loop), the detector and planner in every
# kcolld, judged through `kcollctl events --json` / `plan --json`:
#   (d) healthy soak: no anomaly raised on any host. KCOLL_C4_SOAK seconds
#       (default: the issue's 2 minutes in CI, CI=true, 20 s elsewhere
#       and in the ASan pass; the output says which ran)
#   (a) degrade h2's eth1 to 10% of its measured healthy rate (host 1's
#       stream to host 2 on it, bytes / busy time, as the detector measures
#       it; about 1 GB/s here, so about 800 Mbit/s) during a 16 MiB all-reduce loop: communication slow naming host 2 and its
#       eth1 address within 5 s; the plan moves the streams off it, the pairs
#       agree, and busbw recovers to >= 80% of the healthy busbw (in one of
#       three 4 s windows: the machine is shared); heal: the streams go back
#       on it
#   (b) SIGSTOP rank 2: non-communication hang naming exactly rank 2 within
#       hang_ms + 1 s (KCOLL_C4_HANG_MS=2000 here); SIGCONT: cleared, the
#       loop goes on and every rank ends well
#   (c) rank 1 sleeps 100 ms before each submission: straggler rank 1 named,
#       no other rank
#   one answer from any host (issue 23): in (a) every host's `anomalies
#       --json` names the degraded link within 5 s (hosts whose traffic does
#       not cross it hear of it from those that see it) and none after the
#       heal; host 0's --local anomalies and events hold only its own
#       verdicts, its merged ones its peers' too; every host's `status
#       --json` counts the anomaly; in (b) every host names rank 2 on host
#       2, every host's hang report shows per rank the last op it completed
#       and what it waits for (rank 2: its own submission of the op the
#       other ranks' hosts are stalled in), and none after SIGCONT. Views go to
#       the peers only when they change: in (d) and (a) each host sends at
#       most (peers) x (its own raise/clear events + 2)
# With BPF built (kcoll-bpf), every kcolld runs with KCOLL_BPF=1 (its pins in
# a bpffs of this test, sockops on a cgroup v2 mount of this test), so the
# detector also gets BPF flow statistics: (a) checks that the raised
# communication slow carries them for the degraded link (its wall-clock
# rate below its usual one; retransmissions and srtt are shown).
# Needs root and network namespaces (SKIP otherwise). About 110 s (210 s in CI). TAP.
set -u
. "${KCOLL_TOP:?run through tests/run.sh}/tests/cluster_lib.sh"
RANK="$B/tests/c4_rank"
CTL="$B/bin/kcollctl"
cluster_prefix "c4$$"
H=4
HANG_MS=2000
# The 2-minute soak runs once in CI, in the plain pass; the ASan pass soaks
# 20 s (the same code, slower: the pass's time matters more there).
if [ "${CI:-}" = true ] && [ -z "${KCOLL_TEST_SAN:-}" ]; then SOAK=${KCOLL_C4_SOAK:-120}; else SOAK=${KCOLL_C4_SOAK:-20}; fi

need_root "network namespaces, veth, tc"
command -v ip >/dev/null || skip_all "iproute2 (ip) is missing"
command -v tc >/dev/null || skip_all "tc (iproute2) is missing"
command -v python3 >/dev/null || skip_all "python3 is missing (JSON)"
# The interpreter itself, resolved once: python3 on PATH may be a wrapper
# (a pyenv shim, a bash script, took 0.8-1.4 s per start on a loaded
# machine here, the interpreter 0.25 s), and the polls below start many.
PY=$(python3 -c 'import sys; print(sys.executable)')
need_netns
[ -x "$RANK" ] || { echo "Bail out! $RANK missing: run make"; exit 1; }

cluster_tmp c4
chmod 755 "$T"
cleanup() { cluster_cleanup cg; }
trap cleanup EXIT
trap 'exit 130' INT TERM

sock() { echo "$R/h$1/kcolld.sock"; }

# The daemons inherit these (netns-cluster.sh starts them from here).
export KCOLL_C4_HANG_MS=$HANG_MS KCOLL_LOG_LEVEL=info
"$C" up -H $H >"$T/up.out" 2>&1 || { cat "$T/up.out"; echo "Bail out! cluster up failed"; exit 1; }

# BPF flow tracking in every kcolld when it is built and loads here.
BPF=0
if [ -x "$B/bin/kcoll-bpf" ] && mkdir -p "$T/bpffs" "$T/cg" && mount -t bpf bpf "$T/bpffs" 2>/dev/null; then
	cgenv=
	mount -t cgroup2 none "$T/cg" 2>/dev/null && cgenv=$T/cg
	BPF=1
	for ((i = 0; i < H; i++)); do
		KCOLL_BPF=1 KCOLL_BPF_PIN=$T/bpffs/h$i KCOLL_BPF_CGROUP=$cgenv "$C" restart "$i" \
			>>"$T/restart.out" 2>&1 || BPF=0
	done
	for ((i = 0; i < H; i++)); do	# it attaches after it listens: give it time
		for _ in $(seq 100); do
			grep -q "flow tracking: \(attached\|.*is off\)" "$R/h$i/kcolld.log" && break
			sleep 0.1
		done
		grep -q "flow tracking: attached" "$R/h$i/kcolld.log" || BPF=0
	done
	if [ $BPF = 1 ]; then
		echo "# kcolld runs with KCOLL_BPF=1 on every host (sockops: ${cgenv:-none, no cgroup v2 mount})"
	else
		echo "# BPF flow tracking did not attach; the test goes on without it:"
		grep -h "flow tracking" "$R"/h*/kcolld.log | head -4 | sed 's/^/#   /'
	fi
fi

dump_logs() {
	local i
	for ((i = 0; i < H; i++)); do
		echo "# --- h$i kcolld.log, C4 lines (last 12)"
		grep 'C4' "$R/h$i/kcolld.log" 2>/dev/null | tail -n 12 | sed 's/^/#   /'
	done
}

# Every host's events after the ids in $T/since.N, one JSON object per line.
# One python for all hosts: the polls below run this in their loops.
events() {
	local i s
	for ((i = 0; i < H; i++)); do
		s=$(cat "$T/since.$i" 2>/dev/null || echo 0)
		timeout 10 "$CTL" -s "$(sock "$i")" events --json --since "$s" >"$T/ev.$i" 2>/dev/null
	done
	"$PY" - "$T" $H <<'EOF'
import json, sys
for i in range(int(sys.argv[2])):
    try:
        d = json.load(open("%s/ev.%d" % (sys.argv[1], i)))
    except (OSError, ValueError):
        continue
    for e in d["events"]:
        print(json.dumps(e))
EOF
}
# Hosts (a line of indices) whose `anomalies --json [--local]` has an active
# entry e for which the Python expression EXPR holds.
views() {	# expr [--local]
	local i
	for ((i = 0; i < H; i++)); do
		timeout 10 "$CTL" -s "$(sock "$i")" anomalies --json ${2:+"$2"} >"$T/view.$i" 2>/dev/null
	done
	"$PY" - "$1" "$T" $H <<'EOF'
import json, sys
expr, t, h = sys.argv[1], sys.argv[2], int(sys.argv[3])
out = []
for i in range(h):
    try:
        d = json.load(open("%s/view.%d" % (t, i)))
    except (OSError, ValueError):
        continue
    if any(eval(expr) for c in d["comms"] for e in c["active"]):
        out.append(str(i))
print(" ".join(out))
EOF
}
ALL=$(seq -s ' ' 0 $((H - 1)))
# Poll until `views EXPR` prints WANT or MS milliseconds passed; prints the ms taken or "timeout".
views_until() {	# expr want ms
	local t0 v
	t0=$(now_ms)
	while [ $(($(now_ms) - t0)) -lt "$3" ]; do
		v=$(views "$1")
		[ "$v" = "$2" ] && { echo $(($(now_ms) - t0)); return 0; }
		sleep 0.2
	done
	echo "timeout (last: ${v:-none})"
	return 1
}

# C4 views each host has sent to its peers so far (kcoll_c4_views_sent_total), space-separated.
views_sent() {
	local i out=
	for ((i = 0; i < H; i++)); do
		out+="${out:+ }$(timeout 10 "$CTL" -s "$(sock "$i")" metrics |
			awk '$1 == "kcoll_c4_views_sent_total" { print $2 }')"
	done
	echo "$out"
}

# A view goes to the peers when its content changes: the host's own verdicts
# (each change is one of its own raise or clear events since the last mark)
# or its data path's stalled wait (2 per stall: stalled, resumed). Sent on
# every change of the op its data path waits in, a host sent 60-72 views in
# (a) (2026-11-27). Prints "0|1 details" for the views sent since BEFORE
# (views_sent's output at the last mark).
views_bound() {	# before
	local i
	for ((i = 0; i < H; i++)); do
		timeout 10 "$CTL" -s "$(sock "$i")" events --json --local --since "$(cat "$T/since.$i")" >"$T/evl.$i"
	done
	"$PY" - "$T" $H "$1" "$(views_sent)" <<'EOF'
import json, sys
t, h = sys.argv[1], int(sys.argv[2])
own = [len(json.load(open("%s/evl.%d" % (t, i)))["events"]) for i in range(h)]
before, after = [list(map(int, a.split())) for a in sys.argv[3:5]]
sent = [b - a for a, b in zip(before, after)]
bound = [(h - 1) * (o + 2) for o in own]
print(0 if len(sent) == h and all(x <= y for x, y in zip(sent, bound)) else 1,
      "sent %s, own raise/clear events %s, bound %s" % (sent, own, bound))
EOF
}

# Remember where each host's event log is now.
mark() {
	local i
	for ((i = 0; i < H; i++)); do
		timeout 10 "$CTL" -s "$(sock "$i")" events --json >"$T/ev.$i"
	done
	"$PY" - "$T" $H <<'EOF'
import json, sys
for i in range(int(sys.argv[2])):
    with open("%s/since.%d" % (sys.argv[1], i), "w") as f:
        print(json.load(open("%s/ev.%d" % (sys.argv[1], i)))["last"], file=f)
EOF
}

# One c4_rank loop per host: TAG SECONDS BYTES [DELAY_MS for rank DELAYED]
declare -A rpid
start_loop() {	# tag seconds bytes delayed_rank delay_ms
	local tag=$1 secs=$2 bytes=$3 dr=${4:--1} dms=${5:-0} id i d
	id=$("$C" exec 0 "$RANK" id) || { echo "Bail out! $tag: c4_rank id failed"; exit 1; }
	for ((i = 0; i < H; i++)); do
		d=0
		[ "$i" = "$dr" ] && d=$dms
		"$C" exec "$i" "$RANK" loop "$id" $H "$i" "$secs" "$bytes" "$d" >"$T/$tag.$i.out" 2>&1 &
		rpid[$i]=$!
	done
}
# Wait for the loop's ranks; 0 if every one exited 0.
wait_loop() {
	local i bad=0
	for ((i = 0; i < H; i++)); do
		wait "${rpid[$i]}" || bad=1
	done
	return $bad
}
loop_summary() {	# tag
	local i
	for ((i = 0; i < H; i++)); do
		echo "# rank $i: $(tail -n 1 "$T/$1.$i.out")"
	done
}
# Wait until rank 0 of TAG printed N busbw lines (or 30 s).
wait_lines() {	# tag n
	for _ in $(seq 300); do
		[ "$(grep -c busbw "$T/$1.0.out" 2>/dev/null)" -ge "$2" ] && return 0
		sleep 0.1
	done
	return 1
}
# Median busbw of rank 0's lines with t_ms in [from, to).
busbw() {	# tag from to
	awk -v a="$2" -v b="$3" '/^t_ms=/ { split($1, t, "="); split($3, w, "=");
		if (t[2] >= a && t[2] < b) print w[2] }' "$T/$1.0.out" | sort -g |
		awk '{ v[NR] = $1 } END { if (!NR) { print 0; exit } print v[int((NR + 1) / 2)] }'
}

# ---- (d) healthy soak --------------------------------------------------------
if [ "$SOAK" -ge 120 ]; then
	echo "# (d) soak: $SOAK s (the issue's full 2 minutes)"
else
	echo "# (d) soak: $SOAK s; the issue's full 2 minutes run in CI (CI=true) or with KCOLL_C4_SOAK=120"
fi
mark
start_loop soak "$SOAK" $((8 << 20))
wait_loop
rc=$?
ok $rc "(d) soak: every rank's all-reduces succeeded with the right sums"
[ $rc -eq 0 ] || loop_summary soak
raised=$(events | grep -c '"raised": true')
ops=$(sed -n 's/^done ops=\([0-9]*\).*/\1/p' "$T/soak.0.out")
[ "$raised" -eq 0 ] && [ "${ops:-0}" -gt 10 ]
ok $? "(d) healthy soak, ${ops:-0} ops of 8 MiB in $SOAK s: zero anomalies on every host (raised: $raised)"
[ "$raised" -eq 0 ] || { events | grep '"raised": true' | head -5 | sed 's/^/# /'; dump_logs; }
vres=$(views_bound "$(echo "$ALL" | sed 's/[0-9]\+/0/g')")
ok "${vres%% *}" "(d) each host's views to its peers: at most (peers) x (own events + 2): ${vres#* }"

# ---- (a) degrade a link ---------------------------------------------------------
mark
sent_a0=$(views_sent)
start_loop deg 50 $((16 << 20))
wait_lines deg 4
t_h0=$(now_ms)
sleep 4
t_h1=$(now_ms)
healthy=$(busbw deg "$t_h0" "$t_h1")
# The link's healthy rate: what host 1's streams to host 2 move over it while
# busy (bytes of large pieces / their busy time, the detector's per-link
# rate, read from host 1's kcollctl anomalies --json; on a veth pair that is
# what one TCP stream gets through h2's eth1). The degrade is 10% of it.
linkrate=$(timeout 10 "$CTL" -s "$(sock 1)" anomalies --json | "$PY" -c 'import json,sys
d = json.load(sys.stdin)
r = [l["rate"] for c in d["comms"] for l in c["links"] if l["host"] == 2 and l["link"] == 1 and l["dir"] == "tx"]
print(max(r) if r else 0)')
kbit=$(( ${linkrate:-0} * 8 / 1000 / 10 ))
[ "$kbit" -gt 0 ]
ok $? "(a) h2's eth1 healthy rate (host 1's stream to host 2 on it, while busy): $(( ${linkrate:-0} / 1000000 )) MB/s; degrade to 10%: ${kbit}kbit"
[ "$kbit" -gt 0 ] || kbit=1000000	# not measured: 1gbit, about 10% here
"$C" degrade 2 eth1 "${kbit}kbit" >/dev/null
t_deg=$(now_ms)
found='' t_all='' allv=''
SLOW21='e["kind"] == "comm_slow" and e["host"] == 2 and e["link_addr"] == "10.20.0.3"'
while [ $(($(now_ms) - t_deg)) -lt 8000 ]; do
	# views first: its time is when we look (events carry their own)
	if [ -z "$t_all" ]; then
		allv=$(views "$SLOW21")
		[ "$allv" = "$ALL" ] && t_all=$(now_ms)
	fi
	[ -n "$found" ] || found=$(events | "$PY" -c 'import json,sys
for l in sys.stdin:
    e = json.loads(l)
    if e["kind"] == "comm_slow" and e["raised"] and e["host"] == 2 and e["link_addr"] == "10.20.0.3":
        print(e["time_ms"], e["observer"])' | sort -n | head -1)
	[ -n "$found" ] && [ -n "$t_all" ] && break
	sleep 0.2
done
dt=$(( ${found%% *} - t_deg )) 2>/dev/null || dt=99999
[ -n "$found" ] && [ "$dt" -le 5000 ]
rc=$?
if [ -n "$found" ]; then seen="$dt ms, seen first by host ${found#* }"; else seen="not seen"; fi
ok $rc "(a) communication slow names host 2 and link 10.20.0.3 (its eth1) within 5 s ($seen)"
[ -n "$found" ] || dump_logs
# The one-answer-from-any-host checks (issue 23) are judged further down,
# after the plan's: here only their snapshots, so that the plan check starts
# at once. A link the plan empties stays judged slow for probe_ms (5 s) with
# no traffic, then is tried again and the plan may move back: on a loaded
# machine the views' and --local checks run here (a dozen kcollctl and
# python runs) made the plan check start after that window (2026-11-27).
# The views (every host's anomalies --json) are in $T/view.N from the poll.
for f in "" --local; do
	timeout 10 "$CTL" -s "$(sock 0)" anomalies --json ${f:+"$f"} >"$T/a0$f.json"
	timeout 10 "$CTL" -s "$(sock 0)" events --json ${f:+"$f"} --since "$(cat "$T/since.0")" >"$T/e0$f.json"
done
for ((i = 0; i < H; i++)); do
	timeout 10 "$CTL" -s "$(sock "$i")" status --json >"$T/status.$i"
done
# The observer's active anomaly: the timing evidence and the BPF statistics
# of the same (peer, link, direction).
if [ $BPF = 1 ] && [ -n "$found" ]; then
	obs=${found#* }
	bpfres=$(timeout 10 "$CTL" -s "$(sock "$obs")" anomalies --json | "$PY" -c 'import json,sys
d = json.load(sys.stdin)
a = [e for c in d["comms"] for e in c["active"] if e["kind"] == "comm_slow" and e["host"] == 2 and e["link"] == 1]
if not a or "bpf" not in a[0]:
    print("1 no BPF evidence in", json.dumps(a)[:300]); sys.exit()
b = a[0]["bpf"]
# the key carries BPF numbers and its wall-clock rate fell below its usual one
# (by how much depends on how much the slow link holds the ring back)
good = b["usual"] > 0 and 0 < b["rate"] < b["usual"]
print(0 if good else 1, "timing %.1f MB/s vs median %.1f; BPF %s %.1f MB/s (usually %.1f), %d retransmissions, srtt %.2f ms (usually %.2f)%s" % (
    a[0]["value"] / 1e6, a[0]["ref"] / 1e6, b["dir"], b["rate"] / 1e6, b["usual"] / 1e6, b["retrans"],
    b["srtt_us"] / 1e3, b["usual_srtt_us"] / 1e3, ", corroborates" if b["corroborates"] else ""))')
	ok "${bpfres%% *}" "(a) host $obs's anomaly carries BPF flow statistics of the degraded link: ${bpfres#* }"
elif [ $BPF = 1 ]; then
	ok 1 "(a) the anomaly carries BPF flow statistics (no anomaly to look at)"
else
	ok 0 "# SKIP BPF flow tracking not built or not attached here"
fi
# Under ASan the CPU, not the degraded link, sets the pace: in the
# fresh-root CI's ASan pass busbw fell only from 245.3 to 217.7 MB/s with
# the link at 10%, host 1's detector never judged the link slow (host 3
# did) and so host 1 planned no move, twice in two runs. The plan, the
# recovery and the heal are checked by the plain pass; the ASan pass still
# degrades and heals under load and checks every sum (the next check).
if [ -n "${KCOLL_TEST_SAN:-}" ]; then
	for w in "plan on host 1 leaves the degraded link" "busbw recovers after the move" \
		 "heal: host 1's streams to host 2 in use again"; do
		ok 0 "# SKIP (a) $w: under ASan the CPU, not the degraded link, sets the pace; the plain pass checks it"
	done
	"$C" heal 2 >/dev/null
else	# (the body is not indented: it holds Python programs in quotes)
# The pairs with host 2 agree to leave their eth1 stream unused. A hang
# guard, not a speed check: host 1 plans once its own detector judges the
# link.
moved=1 t_plan=$(now_ms)
for _ in $(seq 120); do
	timeout 10 "$CTL" -s "$(sock 1)" plan --json | "$PY" -c 'import json,sys
d = json.load(sys.stdin)
s = [x for c in d["comms"] for x in c["streams"] if x["host"] == 2 and x["stream_link"] == 1]
sys.exit(0 if s and not any(x["in_use"] for x in s) and all(x["link"] == 0 for x in s) else 1)' && { moved=0; break; }
	sleep 0.25
done
ok $moved "(a) plan on host 1: its stream to host 2 on eth1 is no longer used (pieces on eth0; looked from $((t_plan - t_deg)) ms after the degrade)"
timeout 10 "$CTL" -s "$(sock 1)" plan | sed 's/^/# host 1: /'
[ $moved -eq 0 ] || timeout 10 "$CTL" -s "$(sock 1)" anomalies | sed 's/^/# /'
# The machine is shared (CPU, not the links, sets the pace while other work
# runs): the recovered busbw gets three 4 s windows after the move to reach
# 80% of the healthy one. Unmoved streams stay capped by the degraded link
# (10% of its healthy rate) in every window.
t_m=$(now_ms)
recovered= best=0
for w in 1 2 3; do
	sleep 5
	t_m1=$(now_ms)
	r=$(busbw deg "$((t_m1 - 4000))" "$t_m1")
	recovered+="${recovered:+, }$r"
	awk -v r="$r" -v h="$healthy" 'BEGIN { exit !(h > 0 && r >= 0.8 * h) }' && { best=1; break; }
done
degr=$(busbw deg "$t_deg" "$t_m")
[ "$best" = 1 ]
ok $? "(a) busbw with the link degraded: $degr MB/s before the move, $recovered MB/s after (healthy $healthy MB/s; >= 80% wanted in one of three 4 s windows)"
"$C" heal 2 >/dev/null
t_heal=$(now_ms)
back=1
# A hang guard: the heal needs the detector to see the link's rate back,
# which takes longer the busier the machine (once failed at 20 s, load 13).
while [ $(($(now_ms) - t_heal)) -lt 60000 ]; do
	timeout 10 "$CTL" -s "$(sock 1)" plan --json | "$PY" -c 'import json,sys
d = json.load(sys.stdin)
s = [x for c in d["comms"] for x in c["streams"] if x["host"] == 2]
sys.exit(0 if s and all(x["in_use"] for x in s) else 1)' && { back=0; break; }
	sleep 0.25
done
ok $back "(a) heal: host 1's streams to host 2 all in use again ($(($(now_ms) - t_heal)) ms after heal)"
[ $back -eq 0 ] || dump_logs
fi
# (issue 23) one answer from any host: every host's merged view names it.
# When each host came to hold it (held_ms: raised there or heard from a peer,
# the daemon's clock); the last of them counts, not when this poll looked.
if [ -n "$t_all" ]; then
	t_all=$("$PY" - "$T" $H <<'EOF'
import json, sys
t, h = sys.argv[1], int(sys.argv[2])
held = []
for i in range(h):
    d = json.load(open("%s/view.%d" % (t, i)))
    held.append(min(e["held_ms"] for c in d["comms"] for e in c["active"]
                    if e["kind"] == "comm_slow" and e["host"] == 2 and e["link_addr"] == "10.20.0.3"))
print(max(held))
EOF
)
fi
[ -n "$t_all" ] && [ $((t_all - t_deg)) -le 5000 ]
rc=$?
if [ -n "$t_all" ]; then seen="$((t_all - t_deg)) ms"; else seen="not all: hosts ${allv:-none}"; fi
ok $rc "(a) every host's anomalies --json names host 2's link 10.20.0.3 within 5 s ($seen)"
# --local on host 0 (taken at the detection, above): its own verdicts only,
# each seen by host 0; the merged view carries other hosts' verdicts (hosts
# 2 and 3 see this link), and so do host 0's events, while its --local
# events are its own.
locres=$("$PY" - "$T" <<'EOF'
import json, sys
t = sys.argv[1]
key = lambda e: (e["kind"], e["rank"], e["host"], e["link"])
mer = [e for c in json.load(open(t + "/a0.json"))["comms"] for e in c["active"]]
loc = [e for c in json.load(open(t + "/a0--local.json"))["comms"] for e in c["active"]]
ev = json.load(open(t + "/e0.json"))["events"]
evl = json.load(open(t + "/e0--local.json"))["events"]
bad = [e["seen_by"] for e in loc if e["seen_by"] != [0]] + [key(e) for e in loc if key(e) not in map(key, mer)]
others = any(o != 0 for e in mer for o in e["seen_by"])
evo = any(e["observer"] != 0 for e in ev)
bad += [e["observer"] for e in evl if e["observer"] != 0]
print(0 if not bad and others and evo else 1, "local %d entries, merged %d (seen by %s), events %d/%d local; bad: %s" % (
    len(loc), len(mer), sorted({o for e in mer for o in e["seen_by"]}), len(ev), len(evl), bad[:3]))
EOF
)
ok "${locres%% *}" "(a) host 0 --local: only its own verdicts and events; without it, its peers' too: ${locres#* }"
# kcollctl status on every host (taken with the snapshots) counts the
# communicator's active anomalies over all its hosts.
stres=$("$PY" - "$T" $H <<'EOF'
import json, sys
t, h = sys.argv[1], int(sys.argv[2])
got = []
for i in range(h):
    try:
        c = json.load(open("%s/status.%d" % (t, i)))["net"]["comms"]
    except (OSError, ValueError, KeyError) as e:
        got.append("host %d: %s" % (i, e)); continue
    got.append((c[0]["c4_active"], c[0]["c4_seen_by"]) if c else "host %d: no comm" % i)
good = all(isinstance(g, tuple) and g[0] >= 1 and g[1] for g in got)
print(0 if good else 1, "(active, held by hosts) per host: %s" % got)
EOF
)
ok "${stres%% *}" "(a) every host's status --json counts the communicator's anomalies: ${stres#* }"
r=$(views_until "$SLOW21" "" 30000)	# a hang guard: the rate must be seen back (load)
ok $? "(a) heal: no host's anomalies names host 2's link any more ($r ms later)"
wait_loop
rc=$?
ok $rc "(a) every rank's all-reduces succeeded with the right sums through degrade, move and heal"
[ $rc -eq 0 ] || { loop_summary deg; dump_logs; }
vres=$(views_bound "$sent_a0")
ok "${vres%% *}" "(a) each host's views to its peers: at most (peers) x (own events + 2): ${vres#* }"
# ---- (b) a stopped rank ----------------------------------------------------------
mark
# 26 s: the stop, its detection and the checks below take 6-16 s on a busy
# machine, and the loop must still run after SIGCONT for the hang to clear
# (it ended first once: "the hang is cleared (0 hosts)").
start_loop hang 26 $((1 << 20))
wait_lines hang 2
pid=$(ip netns pids "$KCOLL_CLUSTER_PREFIX-h2" | while read -r p; do
	grep -q c4_rank "/proc/$p/cmdline" 2>/dev/null && echo "$p"; done | head -1)
if [ -z "$pid" ]; then
	ok 1 "(b) find rank 2's process"
else
	kill -STOP "$pid"
	t_stop=$(now_ms)
	found=''
	while [ $(($(now_ms) - t_stop)) -lt $((HANG_MS + 3000)) ]; do
		found=$(events | "$PY" -c 'import json,sys
for l in sys.stdin:
    e = json.loads(l)
    if e["kind"] == "noncomm_hang" and e["raised"]:
        print(e["time_ms"], e["rank"], e["observer"])' | sort -n | head -1)
		[ -n "$found" ] && break
		sleep 0.1
	done
	read -r t_f r_f o_f <<<"${found:-0 -1 -1}"
	dt=$((t_f - t_stop))
	[ "$r_f" = 2 ] && [ "$dt" -le $((HANG_MS + 1000)) ]
	ok $? "(b) SIGSTOP rank 2: non-communication hang names rank $r_f (host $o_f saw it first) in $dt ms (hang_ms $HANG_MS + 1 s)"
	sleep 1
	# Raised since the SIGSTOP: what it caused. A link verdict raised
	# before it (a loaded box slows a link for a moment) is (a)'s business.
	others=$(events | "$PY" -c 'import json,sys
t = int(sys.argv[1])
print(sum(1 for l in sys.stdin for e in [json.loads(l)]
          if e["raised"] and e["time_ms"] >= t and (e["kind"] != "noncomm_hang" or e["rank"] != 2)))' "$t_stop")
	hosts=$(events | "$PY" -c 'import json,sys
print(len({e["observer"] for l in sys.stdin for e in [json.loads(l)] if e["raised"] and e["kind"] == "noncomm_hang" and e["rank"] == 2}))')
	[ "$others" -eq 0 ] && [ "$hosts" -eq $H ]
	ok $? "(b) every host ($hosts of $H) names rank 2 and nothing else ($others other anomalies since the SIGSTOP)"
	[ "$others" -eq 0 ] || { events | grep '"raised": true' | grep -v '"kind": "noncomm_hang", "raised": true, "rank": 2,' |
		head -8 | sed 's/^/# /'; dump_logs; }
	HANG2='e["kind"] == "noncomm_hang" and e["rank"] == 2 and e["host"] == 2'
	r=$(views_until "$HANG2" "$ALL" 3000)
	ok $? "(b) every host's anomalies --json names rank 2 on host 2 ($r ms)"
	# The hang report on every host, per rank: rank 2 completed every op
	# before the one it never submitted and waits for its own submission;
	# the others' hosts are stalled in that very op (whom each waits for is
	# the algorithm's order: host 2, or a host that waits for it).
	for ((i = 0; i < H; i++)); do
		timeout 10 "$CTL" -s "$(sock "$i")" anomalies --json >"$T/hang.$i.json"
	done
	hres=$("$PY" - "$T" $H <<'EOF'
import json, sys
t, nh = sys.argv[1], int(sys.argv[2])
bad, ops = [], set()
for i in range(nh):
    try:
        c = json.load(open("%s/hang.%d.json" % (t, i)))["comms"][0]
    except (OSError, ValueError, IndexError) as e:
        bad.append("host %d: %s" % (i, e)); continue
    h = [e for e in c["active"] if e["kind"] == "noncomm_hang" and e["rank"] == 2 and e["host"] == 2]
    if not h:
        bad.append("host %d: no hang entry for rank 2 on host 2" % i); continue
    op = h[0]["op"]
    ops.add(op)
    rk = {r["rank"]: r for r in c["ranks"]}
    w2 = rk[2].get("waits", {})
    others = {r: (rk[r].get("last_done"), rk[r].get("waits", {})) for r in rk if r != 2}
    good = w2.get("for") == "submission" and w2.get("op") == op and rk[2].get("last_done") == op - 1 and \
        all(d == op - 1 and w.get("for") == "host" and w.get("op") == op for d, w in others.values()) and \
        any(w.get("host") == 2 for d, w in others.values())
    if not good:
        bad.append("host %d: op %d; rank 2: last done %s, waits %s; others (last done, waits): %s" % (
            i, op, rk[2].get("last_done"), w2, others))
if len(ops) > 1:
    bad.append("the hosts name different ops: %s" % sorted(ops))
print(0 if not bad else 1, "op %s on %d hosts; rank 2 waits for its own submission, the others' hosts are stalled in it, every rank's last done is the op before%s" % (
    ",".join(map(str, sorted(ops))), nh, "; " + " | ".join(bad) if bad else ""))
EOF
)
	ok "${hres%% *}" "(b) every host's hang report: ${hres#* }"
	kill -CONT "$pid"
	# the clearing, while the loop still runs (it needs rank 2 to submit again)
	for _ in $(seq 100); do
		[ "$(events | grep -c '"kind": "noncomm_hang", "raised": false')" -gt 0 ] && break
		sleep 0.1
	done
	# still within the loop: a communicator gone would show nothing anyway
	r=$(views_until "$HANG2" "" 5000)
	ok $? "(b) SIGCONT: no host's anomalies names rank 2 any more ($r ms)"
fi
wait_loop
rc=$?
cleared=$(events | grep -c '"kind": "noncomm_hang", "raised": false')
[ $rc -eq 0 ] && [ "$cleared" -ge 1 ]
ok $? "(b) SIGCONT: the loop goes on, every rank ends well, the hang is cleared ($cleared clear events in the $H hosts' logs, peers' included)"
[ $rc -eq 0 ] || loop_summary hang

# ---- (c) a straggler ---------------------------------------------------------------
mark
start_loop strag 10 $((1 << 20)) 1 100
wait_loop
rc=$?
res=$(events | "$PY" -c 'import json,sys
ev = [json.loads(l) for l in sys.stdin]
named = {e["rank"] for e in ev if e["raised"] and e["kind"] == "straggler"}
other = [e for e in ev if e["raised"] and e["kind"] != "straggler"]
print(",".join(map(str, sorted(named))) or "none", len(other))')
[ $rc -eq 0 ] && [ "${res% *}" = 1 ] && [ "${res#* }" = 0 ]
ok $? "(c) rank 1 submits 100 ms late each op: straggler named: rank ${res% *}; other anomalies: ${res#* }"
[ "${res% *}" = 1 ] && [ "${res#* }" = 0 ] || { events | grep '"raised": true' | head -6 | sed 's/^/# /'; dump_logs; }

echo "1..$n"
exit $failed
