#!/usr/bin/env bash
# Multi-host collectives (issue 4) on the netns test bed: one kcolld per
# "host" (scripts/netns-cluster.sh), ranks in the hosts' namespaces, each
# talking to its own host's daemon, one communicator across hosts.
#   1. correctness: every collective x dtypes x counts 0..262147 on 2, 3 and
#      4 hosts x 1 and 2 ranks per host, bit-exact against each rank's own
#      reference; broadcast from non-zero roots on other hosts; barrier
#      semantics; ops in flight at once; one 256 MiB all-reduce
#   2. KCOLL_ALGO ring, rd, rabenseifner, direct, auto (kcollctl set algo, checked in
#      status) over an all-reduce subset on 3 and 4 hosts
#   2b. ranks on two hosts leave one after the other while the third host's
#      rank has yet to run an op they did their part in: it must complete
#   3. faults, with KCOLL_TIMEOUT_MS=3000: a rank killed, a rank frozen
#      (SIGSTOP), a remote kcolld killed (the root's too) and restarted, a
#      wrong-token id, an id from before a restart, garbage on the daemon's
#      TCP port; after each failure the survivors build a new communicator
#      in the same processes and it works. Time bounds: timeout + 1 s.
# Ranks are tests/mh_rank (one process per rank runs a whole case list).
# Needs root and network namespaces (SKIP otherwise). About 30 s on the
# 2-core VM (40 s under ASan); a daemon whose communicators cannot form at
# all makes it bail out after the first layout. TAP.
# KCOLL_MH_ONE_DAEMON=1: every rank talks to host 0's daemon (the case lists
# and rank faults without the daemon-to-daemon transport; the checks that
# need one daemon per host are skipped).
set -u
. "${KCOLL_TOP:?run through tests/run.sh}/tests/cluster_lib.sh"
RANK="$B/tests/mh_rank"
CTL="$B/bin/kcollctl"
cluster_prefix "km$$"
H=4
TMO=3000			# KCOLL_TIMEOUT_MS of the fault runs
BOUND=$((TMO + 1000))		# a failure must be reported within this (ms)
TMO_CASES=15000			# ... of the case lists: a comm that cannot form fails fast
ONE=${KCOLL_MH_ONE_DAEMON:-0}
dumps=0

need_root "network namespaces, veth"
command -v ip >/dev/null || skip_all "iproute2 (ip) is missing"
command -v python3 >/dev/null || skip_all "python3 is missing (status JSON, raw TCP peer)"
need_netns
[ -x "$RANK" ] || { echo "Bail out! $RANK missing: run make"; exit 1; }

cluster_tmp multihost
chmod 755 "$T"
trap cluster_cleanup EXIT
trap 'exit 130' INT TERM

sock() { echo "$R/h$1/kcolld.sock"; }
dpid() { cat "$R/h$1/kcolld.pid" 2>/dev/null; }

# CMD on host $1, bounded by $2 seconds, talking to that host's daemon (or
# to host 0's with KCOLL_MH_ONE_DAEMON).
on() {	# host seconds cmd...
	local h=$1 s=$2
	shift 2
	if [ "$ONE" = 1 ]; then
		timeout -k 2 "$s" "$C" exec "$h" env KCOLL_SOCKET="$(sock 0)" "$@"
	else
		timeout -k 2 "$s" "$C" exec "$h" "$@"
	fi
}

# A fresh unique id from host $1's daemon (hex); extra args to mh_rank id.
new_id() { on "$1" 10 "$RANK" id "${@:2}"; }

# Every host's kcolld log, the tail, on the first few failures.
dump_logs() {
	local i
	[ "$dumps" -lt 4 ] || return 0
	dumps=$((dumps + 1))
	for ((i = 0; i < H; i++)); do
		echo "# --- $P-h$i kcolld.log (last 15 lines)"
		tail -n 15 "$R/h$i/kcolld.log" 2>/dev/null | sed 's/^/#   /'
		# stderr: an abort's message, a sanitizer report's head
		head -n 12 "$R/h$i/kcolld.out" 2>/dev/null | sed 's/^/#   out: /'
	done
}

# Every daemon must still run and answer; a dead or stuck one is shown and
# restarted, so that the checks after this one still test something.
daemons_alive() {	# label
	local i bad='' why=''
	for ((i = 0; i < H; i++)); do
		if ! kill -0 "$(dpid "$i")" 2>/dev/null; then
			bad+=" h$i (dead)"
		elif ! timeout 10 "$CTL" -s "$(sock "$i")" status >/dev/null 2>&1; then
			bad+=" h$i (alive, no answer to kcollctl status)"
		else
			continue
		fi
		why+=" $i"
	done
	[ -z "$bad" ]; ok $? "$1: every kcolld still runs and answers${bad:+ (not:$bad)}"
	for i in ${why:-}; do
		# stderr: an abort's message, a sanitizer report's head
		head -n 12 "$R/h$i/kcolld.out" 2>/dev/null | sed "s/^/# h$i kcolld.out: /"
		tail -n 5 "$R/h$i/kcolld.log" 2>/dev/null | sed "s/^/# h$i kcolld.log: /"
		"$C" restart "$i" >/dev/null 2>&1 || echo "# could not restart h$i"
	done
}

# Ranks that must not get a communicator: init fails, and fast.
refused() {	# tag label id placement
	local tag=$1 label=$2 id=$3 pl=$4 hr l e ms bad=''
	start_ranks "$tag" init "$pl" "$id" "KCOLL_TIMEOUT_MS=$TMO"
	wait_ranks
	for hr in $pl; do
		l=$(grep '^init ' "$T/$tag.${hr#*:}.out")
		e=$(sed -n 's/.* name=\([^ ]*\).*/\1/p' <<<"$l")
		ms=$(sed -n 's/.* ms=\([0-9]*\).*/\1/p' <<<"$l")
		{ [ -n "$e" ] && [ "$e" != 0 ] && [ "${ms:-99999}" -le $((TMO + 2000)) ]; } ||
			bad+=" rank ${hr#*:} on h${hr%:*}: ${l:-nothing}"
	done
	[ -z "$bad" ]; ok $? "$label: comm init fails on every rank within $((TMO + 2000)) ms, no hang${bad:+ (got:$bad)}"
	[ -z "$bad" ] || dump_logs
}

# "h:r" words: rank r on host h. Contiguous: ranks of a host in a row;
# rr: round robin, rank = j * nhosts + host index.
place() {	# "hosts" per_host contiguous|rr
	local hs per=$2 how=$3 x j
	read -ra hs <<<"$1"
	for ((x = 0; x < ${#hs[@]}; x++)); do
		for ((j = 0; j < per; j++)); do
			if [ "$how" = rr ]; then
				printf '%s:%s ' "${hs[x]}" $((j * ${#hs[@]} + x))
			else
				printf '%s:%s ' "${hs[x]}" $((x * per + j))
			fi
		done
	done
}

# Start one mh_rank per "h:r" of $3 in the background: mh_rank MODE ID N r ARGS,
# output in $T/TAG.r.out; ENV (VAR=value words, may be empty) for every rank.
declare -A rpid
start_ranks() {	# tag mode placement id env args...
	local tag=$1 mode=$2 pl=$3 id=$4 env=$5 hr nr
	shift 5
	nr=$(wc -w <<<"$pl")
	rpid=()
	for hr in $pl; do
		# shellcheck disable=SC2086
		on "${hr%:*}" 150 env $env "$RANK" "$mode" "$id" "$nr" "${hr#*:}" "$@" \
			>"$T/$tag.${hr#*:}.out" 2>&1 &
		rpid[${hr#*:}]=$!
	done
}

# Wait for every rank of the last start_ranks; "r:status" words in $rcs.
rcs=
wait_ranks() {
	local r
	rcs=
	for r in "${!rpid[@]}"; do
		wait "${rpid[$r]}"
		rcs+="$r:$? "
	done
}

# One TAP line for the exit statuses, one per case group all ranks reported.
judge() {	# tag label nranks
	local tag=$1 label=$2 nr=$3 seen bad name nz any=0
	nz=$(tr ' ' '\n' <<<"$rcs" | grep -v ':0$' | grep . | tr '\n' ' ')
	[ -z "$nz" ]; ok $? "$label: all $nr ranks exited 0${nz:+ (rank:status $nz)}"
	[ -z "$nz" ] || any=1
	while IFS='|' read -r seen bad name; do
		note=
		[ "$bad" -gt 0 ] && note+=" ($bad rank x case failures)"
		[ "$seen" -ne "$nr" ] && note+=" (reported by $seen of $nr ranks)"
		[ -z "$note" ]; ok $? "$label: $name$note"
		[ -z "$note" ] || any=1
	done < <(cat "$T/$tag".*.out 2>/dev/null | awk '
		/^group / {
			name = substr($0, index($0, "name=") + 5)
			split($3, b, "=")
			if (!(name in seen)) order[k++] = name
			seen[name]++; bad[name] += b[2]
		}
		END { for (i = 0; i < k; i++) printf "%d|%d|%s\n", seen[order[i]], bad[order[i]], order[i] }')
	if [ "$any" -eq 1 ]; then
		# The first failures in case order (each at most once): later
		# ones often only follow from a communicator the first aborted.
		grep -h '^#' "$T/$tag".*.out 2>/dev/null | awk '!seen[$0]++' | head -8
		grep -hv '^#\|^group ' "$T/$tag".*.out 2>/dev/null | head -10 | sed 's/^/# /'
		dump_logs
	fi
}

# Run a case list on hosts $3 (ids from host $2) and judge it.
cases_run() {	# mode idhost "hosts" per_host contiguous|rr
	local mode=$1 idh=$2 hosts=$3 per=$4 how=$5 id pl nr tag label t0
	tag="$mode-$(tr ' ' _ <<<"$hosts")-$per"
	pl=$(place "$hosts" "$per" "$how")
	nr=$(wc -w <<<"$pl")
	label="$mode: $(wc -w <<<"$hosts") hosts (h${hosts// / h}) x $per rank/host ($how), id from h$idh"
	if ! id=$(new_id "$idh"); then
		ok 1 "$label: no unique id from h$idh's kcolld"
		dump_logs
		return
	fi
	t0=$SECONDS
	start_ranks "$tag" "$mode" "$pl" "$id" "KCOLL_TIMEOUT_MS=$TMO_CASES"
	wait_ranks
	label+=" [$((SECONDS - t0)) s]"
	judge "$tag" "$label" "$nr"
}

# Every "key": value of status --json whose key is $2, anywhere in the tree.
status_key() {	# host key
	"$CTL" -s "$(sock "$1")" status --json 2>/dev/null | python3 -c '
import json, sys
def walk(o):
    if isinstance(o, dict):
        for k, v in o.items():
            if k == sys.argv[1]:
                print(json.dumps(v))
            walk(v)
    elif isinstance(o, list):
        for v in o:
            walk(v)
walk(json.load(sys.stdin))' "$2" 2>/dev/null
}

# The sum over every host of a number in status --json (0 where it is missing).
net_sum() {	# key
	local i v sum=0
	for ((i = 0; i < H; i++)); do
		v=$(status_key "$i" "$1" | head -1)
		[[ "$v" =~ ^[0-9]+$ ]] && sum=$((sum + v))
	done
	echo "$sum"
}

# The daemon's TCP port and first address from status --json "net".
net_of() {	# host -> "addr port"
	"$CTL" -s "$(sock "$1")" status --json 2>/dev/null | python3 -c '
import json, sys
n = json.load(sys.stdin)["net"]
print(n["addrs"][0] if n.get("addrs") else "10.10.0.%d" % (int(sys.argv[1]) + 1), n["port"])' "$1" 2>/dev/null
}

# ---- the cluster ------------------------------------------------------------------
out=$("$C" up -H $H 2>&1); rc=$?
[ $rc -eq 0 ]; ok $? "cluster up: $H hosts, one kcolld each (prefix $P)"
[ $rc -eq 0 ] || { echo "$out" | sed 's/^/# /'; echo "1..$n"; exit 1; }
[ "$ONE" = 1 ] && echo "# KCOLL_MH_ONE_DAEMON=1: every rank talks to h0's kcolld"

# ---- 1. correctness ------------------------------------------------------------------
t_start=$SECONDS
cases_run coll 1 "1 3" 1 contiguous
if [ -z "$(tr ' ' '\n' <<<"$rcs" | grep . | grep -v ':2$')" ]; then
	# Every rank's comm init failed: everything after would only time out.
	echo "Bail out! no multi-host communicator forms (h1 + h3, 2 ranks): see the logs above"
	exit 1
fi
cases_run coll 0 "0 1" 2 contiguous
cases_run coll 2 "0 1 2" 1 contiguous
cases_run coll 1 "1 2 3" 2 rr
cases_run coll 0 "0 1 2 3" 1 contiguous
cases_run coll 3 "0 1 2 3" 2 rr
cases_run big 0 "0 1 2 3" 1 contiguous
echo "# correctness: $((SECONDS - t_start)) s"

# ---- 2. algorithms ---------------------------------------------------------------------
t_start=$SECONDS
# With one rank per host, small all-reduces would run over lanes in the
# ranks: turn lanes off so that the daemons' algorithms run every size.
set_lanes() {	# bytes
	local i msg got bad=
	for ((i = 0; i < H; i++)); do
		msg=$(timeout 10 "$CTL" -s "$(sock "$i")" set lane_bytes "$1" 2>&1) || { bad+=" h$i: $msg;"; continue; }
		got=$(status_key "$i" lane_bytes | head -1)
		[ "$got" = "$1" ] || bad+=" h$i: status --json lane_bytes $got;"
	done
	[ -z "$bad" ]; ok $? "kcollctl set lane_bytes $1 on every daemon, status --json shows it${bad:+ (not:$bad)}"
}
if [ "$ONE" != 1 ]; then
	got=$(status_key 0 lane_bytes | head -1)
	[ "$got" = 65536 ]; ok $? "lanes are on by default (h0's status --json net.lane_bytes: $got, KCOLL_LANE_BYTES default 65536)"
	set_lanes 0
fi
for algo in ring rd rabenseifner direct auto; do
	if [ "$ONE" = 1 ]; then
		skip "KCOLL_ALGO=$algo: kcollctl set algo on each host's daemon (one daemon: KCOLL_MH_ONE_DAEMON)"
	else
		bad=
		for ((i = 0; i < H; i++)); do
			msg=$(timeout 10 "$CTL" -s "$(sock "$i")" set algo "$algo" 2>&1) ||
				{ bad+=" h$i: set: $msg;"; continue; }
			got=$(status_key "$i" algo | head -1)
			[ "$got" = "\"$algo\"" ] || bad+=" h$i: status --json algo $got;"
		done
		[ -z "$bad" ]; ok $? "KCOLL_ALGO=$algo: kcollctl set algo $algo on every daemon, status --json shows it${bad:+ (not:$bad)}"
	fi
	cases_run algo 0 "0 1 2" 1 contiguous
	cases_run algo 2 "0 1 2 3" 2 rr
done
[ "$ONE" = 1 ] || set_lanes 65536
echo "# algorithms: $((SECONDS - t_start)) s"

# ---- 2b. hosts leaving, one by one, while a peer still finishes the last op -----------
if [ "$ONE" = 1 ]; then
	skip "peers leaving during a late op: needs one daemon per host (KCOLL_MH_ONE_DAEMON)"
else
	cases_run leave 0 "0 1 2" 1 contiguous
fi

# ---- 3. faults ---------------------------------------------------------------------------

# SIGKILL the loop ranks that wrote their pid into $1 (a setup gone wrong).
kill_ranks() {	# dir
	local f
	for f in "$1"/pid.*; do [ -f "$f" ] && kill -KILL "$(cat "$f")" 2>/dev/null; done
	wait_ranks
}

# Wait until every rank of the last start_ranks has done three all-reduces.
wait_ready() {	# dir nranks
	local r
	for _ in $(seq 600); do
		r=$(find "$1" -name 'ready.*' 2>/dev/null | wc -l)
		[ "$r" -ge "$2" ] && return 0
		sleep 0.05
	done
	return 1
}

# Wait until $2 ranks printed their "fault" line.
wait_faults() {	# tag count seconds
	for _ in $(seq $(($3 * 20))); do
		[ "$(cat "$T/$1".*.out 2>/dev/null | grep -c '^fault ')" -ge "$2" ] && return 0
		sleep 0.05
	done
	return 1
}

# A field of rank $2's fault line: err, name, err_rank, t_ms, later_name, ...
field() {	# tag rank key
	sed -n "s/^fault .*\b$3=\([^ ]*\).*/\1/p" "$T/$1.$2.out" 2>/dev/null | head -1
}

# The survivors' new communicator: NEXT file with a fresh id from host $2
# and the map old rank -> new rank (-1: leaves).
write_next() {	# tag idhost nranks map...
	local tag=$1 idh=$2 nr=$3 id
	shift 3
	id=$(new_id "$idh") || id=none
	echo "$id $nr $*" >"$T/$tag.next.tmp" && mv "$T/$tag.next.tmp" "$T/$tag.next"
}

# Check the survivors' first and later errors and the time they took, and
# that every all-reduce before the fault was right.
judge_fault() {	# tag label t0 want_name "acceptable err_ranks" survivors...
	local tag=$1 label=$2 t0=$3 want=$4 ers=$5 r name er t dt bad='' late='' slow='' worst=0
	shift 5
	for r in "$@"; do
		name=$(field "$tag" "$r" name)
		er=$(field "$tag" "$r" err_rank)
		t=$(field "$tag" "$r" t_ms)
		if [ "$name" != "$want" ] || [ -z "$er" ] || ! grep -qw -- "$er" <<<"$ers"; then
			bad+=" rank $r: ${name:-no result} err_rank ${er:-?};"
		fi
		if [ -n "$t" ]; then
			dt=$((t - t0))
			[ "$dt" -gt "$worst" ] && worst=$dt
			[ "$dt" -le "$BOUND" ] || slow+=" rank $r: $dt ms;"
		else
			slow+=" rank $r: none;"
		fi
		late+=" $r:$(field "$tag" "$r" later_name)/$(field "$tag" "$r" later_err_rank)"
	done
	[ -z "$bad" ]; ok $? "$label: ranks $* fail with $want, err_rank in {$ers}${bad:+ (got:$bad)}"
	[ -z "$slow" ]; ok $? "$label: ... within $BOUND ms (KCOLL_TIMEOUT_MS + 1 s) of the fault (slowest $worst ms)${slow:+ (over:$slow)}"
	[ -z "$bad$slow" ] || dump_logs
	laters=$late
	bad=$(cat "$T/$tag".*.out 2>/dev/null | grep -c ': element .* wrong')
	[ "$bad" -eq 0 ]; ok $? "$label: every all-reduce before the fault was right ($bad ranks saw wrong data)"
}

# The survivors' "recover" group and exit statuses.
judge_recover() {	# tag label survivors...
	local tag=$1 label=$2 r bad=
	shift 2
	for r in "$@"; do
		grep -q '^group cases=[0-9]* bad=0 name=recover$' "$T/$tag.$r.out" 2>/dev/null ||
			bad+=" $r"
	done
	[ -z "$bad" ]; ok $? "$label: survivors $* destroy the communicator, join a new one (new id) in the same process, and it works${bad:+ (not: ranks$bad)}"
	[ -z "$bad" ] || { grep -h '^#' "$T/$tag".*.out | head -10; dump_logs; }
}

# Start a loop group for a fault case: sets nr, sur (the survivors) and map
# (old rank -> new rank, for write_next); 1 if the ranks did not get going.
fault_start() {	# tag idhost placement victim label
	local tag=$1 pl=$3 r nn=0
	nr=$(wc -w <<<"$pl")
	sur=
	map=
	for ((r = 0; r < nr; r++)); do
		if [ "$r" -eq "$4" ]; then map+="-1 "; else sur+="$r "; map+="$nn "; nn=$((nn + 1)); fi
	done
	mkdir -p "$T/$tag"
	start_ranks "$tag" loop "$pl" "$(new_id "$2")" "KCOLL_TIMEOUT_MS=$TMO" "$T/$tag" "$T/$tag.next"
	if ! wait_ready "$T/$tag" "$nr"; then
		ok 1 "$5: $nr ranks running checked all-reduces"
		grep -h . "$T/$tag".*.out | head -10 | sed 's/^/# /'
		dump_logs
		kill_ranks "$T/$tag"
		return 1
	fi
	ok 0 "$5: $nr ranks running checked all-reduces"
}

# Ranks placed $4 per host on $3; rank $5 is SIGKILLed in a loop of
# all-reduces (with one rank per host, small ones run over lanes).
kill_rank() {	# tag idhost "hosts" per victim
	local tag=$1 idh=$2 hosts=$3 vic=$5 bad
	fault_start "$tag" "$idh" "$(place "$hosts" "$4" contiguous)" "$vic" "kill a rank (hosts $hosts)" ||
		return
	t0=$(now_ms)
	kill -KILL "$(cat "$T/$tag/ready.$vic")"
	wait_faults "$tag" $((nr - 1)) $((TMO / 1000 + 10))
	# shellcheck disable=SC2086
	judge_fault $tag "kill a rank (rank $vic of $nr on hosts $hosts, SIGKILL)" "$t0" ECONNRESET "$vic" $sur
	bad=$(tr ' ' '\n' <<<"$laters" | grep . | grep -v ":ECONNRESET/$vic\$" | tr '\n' ' ')
	[ -z "$bad" ]; ok $? "kill a rank ($nr ranks): the next op fails too, ECONNRESET err_rank $vic${bad:+ (got: $bad)}"
	# shellcheck disable=SC2086
	write_next $tag "$idh" $((nr - 1)) $map
	wait_ranks
	# shellcheck disable=SC2086
	judge_recover $tag "kill a rank ($nr ranks)" $sur
}

t_start=$SECONDS
kill_rank rankkill 0 "0 1 2" 2 3
kill_rank rankkill4 1 "0 1 2 3" 1 1

# One rank per host on $3; rank $4 is frozen with SIGSTOP. With one rank
# per host small all-reduces run over lanes (docs/multihost.md): one
# exchange on 3 hosts, recursive doubling on 4, where ranks waiting for a
# rank that waits for the frozen one must still name the frozen one.
freeze_rank() {	# tag idhost "hosts" victim
	local tag=$1 idh=$2 hosts=$3 vic=$4 r frozen t early bad vh lanes
	fault_start "$tag" "$idh" "$(place "$hosts" 1 contiguous)" "$vic" "freeze a rank (hosts $hosts)" ||
		return
	frozen=$(cat "$T/$tag/ready.$vic")
	# One rank per host: the rank itself holds a lane (TCP) to every other host.
	vh=$(awk -v v="$vic" '{ print $(v + 1) }' <<<"$hosts")
	lanes=$(on "$vh" 10 ss -tnpH state established 2>/dev/null | grep -c "pid=$frozen,")
	[ "$lanes" -eq $((nr - 1)) ]; ok $? "lanes: rank $vic (pid $frozen, on h$vh) holds $((nr - 1)) TCP connections of its own, one per other host (ss -tnp: $lanes)"
	t0=$(now_ms)
	kill -STOP "$frozen"
	wait_faults "$tag" $((nr - 1)) $((TMO / 1000 + 10))
	# shellcheck disable=SC2086
	judge_fault $tag "freeze a rank ($nr hosts, rank $vic, SIGSTOP)" "$t0" ETIMEDOUT "$vic" $sur
	early=
	for r in $sur; do
		t=$(field $tag $r t_ms)
		[ -n "$t" ] && [ $((t - t0)) -lt $((TMO / 2)) ] && early+=" rank $r: $((t - t0)) ms"
	done
	[ -z "$early" ]; ok $? "freeze a rank ($nr hosts): not before KCOLL_TIMEOUT_MS/2 either${early:+ (too early:$early)}"
	bad=$(tr ' ' '\n' <<<"$laters" | grep -E '^[0-9]+:(0|)/' | tr '\n' ' ')
	[ -z "$bad" ]; ok $? "freeze a rank ($nr hosts): the next op fails too, no hang (got:$laters)"
	# shellcheck disable=SC2086
	write_next $tag "$idh" $((nr - 1)) $map
	for r in $sur; do wait "${rpid[$r]}"; done
	# shellcheck disable=SC2086
	judge_recover $tag "freeze a rank ($nr hosts, the frozen one still stopped)" $sur
	kill -KILL "$frozen" 2>/dev/null
	wait "${rpid[$vic]}"
}

freeze_rank stop 1 "1 2 3" 1
freeze_rank stop4 0 "0 1 2 3" 2

# A kcolld killed under a running all-reduce; its ranks are $4, the rest survive.
daemon_kill() {	# tag label idhost victim_host "hosts" per survivors_map idhost_next victims...
	local tag=$1 label=$2 idh=$3 vh=$4 hosts=$5 per=$6 map=$7 idn=$8 pl nr vic sur r
	shift 8
	vic=" $* "
	mkdir -p "$T/$tag"
	pl=$(place "$hosts" "$per" contiguous)
	nr=$(wc -w <<<"$pl")
	sur=
	for ((r = 0; r < nr; r++)); do [[ "$vic" == *" $r "* ]] || sur+="$r "; done
	start_ranks "$tag" loop "$pl" "$(new_id "$idh")" "KCOLL_TIMEOUT_MS=$TMO" "$T/$tag" "$T/$tag.next"
	if ! wait_ready "$T/$tag" "$nr"; then
		ok 1 "$label: $nr ranks on hosts $hosts running checked all-reduces"
		grep -h . "$T/$tag".*.out | head -10 | sed 's/^/# /'
		dump_logs
		kill_ranks "$T/$tag"
		return
	fi
	ok 0 "$label: $nr ranks on hosts $hosts running checked all-reduces"
	t0=$(now_ms)
	kill -KILL "$(dpid "$vh")"
	wait_faults "$tag" "$nr" $((TMO / 1000 + 10))
	# shellcheck disable=SC2086
	judge_fault "$tag" "$label" "$t0" ECONNRESET "$*" $sur
	bad=
	for r in "$@"; do
		case "$(field "$tag" "$r" name)" in
		ENOTCONN | ECONNRESET) ;;
		*) bad+=" rank $r: $(field "$tag" "$r" name)" ;;
		esac
	done
	[ -z "$bad" ]; ok $? "$label: the ranks on h$vh (their daemon gone) get ENOTCONN or ECONNRESET${bad:+ (got:$bad)}"
	bad=$(tr ' ' '\n' <<<"$laters" | grep -E '^[0-9]+:(0|)/' | tr '\n' ' ')
	[ -z "$bad" ]; ok $? "$label: the survivors' next op fails too, no hang${bad:+ (got: $bad)}"
	# shellcheck disable=SC2086
	write_next "$tag" "$idn" "$(wc -w <<<"$sur")" $map
	wait_ranks
	# shellcheck disable=SC2086
	judge_recover "$tag" "$label" $sur
}

if [ "$ONE" = 1 ]; then
	skip "kill a kcolld: needs one daemon per host (KCOLL_MH_ONE_DAEMON)"
else
	stale=$(new_id 2)
	daemon_kill dkill "kill h2's kcolld (not the id's root)" 0 2 "0 1 2 3" 2 "0 1 2 3 -1 -1 4 5" 0 4 5
	out=$("$C" restart 2 2>&1); rc=$?
	[ $rc -eq 0 ] && kill -0 "$(dpid 2)" 2>/dev/null
	ok $? "restart h2's kcolld (netns-cluster.sh restart 2)${out:+: $out}"
	cases_run check 2 "0 1 2 3" 1 contiguous
	# An id the old h2 daemon issued names a token the new one never did.
	refused stale "an id issued before h2's kcolld restarted (ranks on h2, h3)" "$stale" "2:0 3:1"
	# The refused communicator's remains are torn down later: wait past that.
	sleep 3
	daemons_alive "3 s after the refused stale id"

	daemon_kill rkill "kill h1's kcolld (the id's root)" 1 1 "1 2 3" 1 "-1 0 1" 2 0
	out=$("$C" restart 1 2>&1); rc=$?
	[ $rc -eq 0 ] && kill -0 "$(dpid 1)" 2>/dev/null
	ok $? "restart h1's kcolld${out:+: $out}"
fi

# ---- wrong token, garbage on the port ---------------------------------------------------
if [ "$ONE" = 1 ]; then
	skip "wrong token, garbage on the TCP port: need one daemon per host (KCOLL_MH_ONE_DAEMON)"
else
	# The token flipped in an id h1 issued: h1's own rank and the ranks
	# whose daemons (h0, h2) present it to h1 must all be refused.
	id=$(new_id 1 --corrupt-token)
	rej0=$(net_sum rejected)
	refused badtok "wrong token (an id h1 issued, one token byte flipped; ranks on h0 h1 h2)" "$id" \
		"0:0 1:1 2:2"
	rej=$(net_sum rejected)
	[ "$rej" -gt "$rej0" ]; ok $? "wrong token: the daemons count the refused peers (status --json net.rejected, all hosts: $rej0 -> $rej)"
	sleep 3
	daemons_alive "3 s after the wrong token"
	cases_run check 1 "0 1 2" 1 contiguous

	# shellcheck disable=SC2207
	net=($(net_of 0))
	if [ ${#net[@]} -ne 2 ]; then
		ok 1 "h0's kcollctl status --json has \"net\": {\"port\": N, \"addrs\": [...]}"
		timeout 10 "$CTL" -s "$(sock 0)" status --json 2>&1 | head -c 3000 | sed 's/^/# /'
		echo
	else
		ok 0 "h0's kcolld listens for daemons on ${net[0]}:${net[1]} (status --json net)"
		garbage0=$(status_key 0 garbage | head -1)
		# A peer that holds a half-sent message open the whole time...
		on 1 60 python3 -c '
import os, socket, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), 5)
s.sendall(b"\x01\x02\x03")
print("held", flush=True)
while not os.path.exists(sys.argv[3]):
    time.sleep(0.05)' "${net[@]}" "$T/hold.stop" >"$T/hold.out" 2>&1 &
		hold=$!
		# ...and bursts of garbage: random, all-ones (huge lengths), zeros,
		# connect-and-close.
		on 1 30 python3 -c '
import os, socket, sys
addr = (sys.argv[1], int(sys.argv[2]))
closed = 0
def send(data):
    global closed
    s = socket.create_connection(addr, 5)
    try:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
    except OSError:
        closed += 1     # the daemon hung up first: fine
    s.close()
for i in range(20):
    send(os.urandom(65536))
send(b"\xff" * (1 << 20))
send(b"\0" * 4096)
for i in range(50):
    send(b"")
print("sent; %d cut short by the daemon" % closed, flush=True)' "${net[@]}" >"$T/garbage.out" 2>&1
		for _ in $(seq 600); do grep -q held "$T/hold.out" && break; sleep 0.05; done
		grep -q '^sent' "$T/garbage.out"
		ok $? "garbage: 20 x 64 KiB random, 1 MiB of 0xff, 4 KiB of zeros, 50 empty connections sent to h0's port ($(head -3 "$T/garbage.out" | tr '\n' ' '))"
		garbage=$(status_key 0 garbage | head -1)
		[ "${garbage:-0}" -gt "${garbage0:-0}" ]
		ok $? "garbage: h0 counts it (status --json net.garbage: ${garbage0:-none} -> ${garbage:-none})"
		grep -q held "$T/hold.out"; ok $? "garbage: a peer holds a half-sent message open on h0's port"
		# A peer of another protocol version: a well-formed HELLO (kd_p_hello,
		# user/daemon/net.h) with version 1 gets a REJECT naming both versions.
		on 1 30 python3 -c '
import socket, struct, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), 5)
body = struct.pack("<II32sIIQ", 1, 2, b"\0" * 32, 1, 0, 7)
s.sendall(struct.pack("<IHHII", 0x6b63706e, 1, 0, 16 + len(body), 0) + body)
s.settimeout(10)
got = b""
while True:
    b = s.recv(4096)
    if not b:
        break
    got += b
magic, typ, _, ln, _ = struct.unpack_from("<IHHII", got)
print("type %d why: %s" % (typ, got[16:ln].split(b"\0")[0].decode()), flush=True)' "${net[@]}" >"$T/version.out" 2>&1
		grep -q '^type 2 why: peer protocol version 1, this daemon speaks [0-9]' "$T/version.out"
		ok $? "a peer HELLO of protocol version 1 gets a REJECT naming both versions ($(head -c 200 "$T/version.out" | tr '\n' ' '))"
		cases_run check 0 "0 1 2 3" 1 contiguous
		touch "$T/hold.stop"
		wait "$hold"
		daemons_alive "after the garbage"
	fi
fi
echo "# faults: $((SECONDS - t_start)) s"

# ---- the daemons survived all of it -------------------------------------------------------
daemons_alive "at the end"
"$C" down >/dev/null 2>&1; ok $? "cluster down"
echo "1..$n"
exit $failed
