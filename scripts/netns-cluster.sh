#!/usr/bin/env bash
# A multi-host test bed on one machine: H "hosts" as network namespaces, each
# with two interfaces on two separate networks, and one kcolld per host.
#
#   scripts/netns-cluster.sh up [-H HOSTS] [--no-daemon] [--gso BYTES]
#                                                          create (default 4 hosts)
#   scripts/netns-cluster.sh down                          delete everything (idempotent)
#   scripts/netns-cluster.sh exec HOST CMD...              run CMD on HOST
#   scripts/netns-cluster.sh restart HOST                  (re)start HOST's kcolld
#   scripts/netns-cluster.sh degrade HOST IFACE RATE [--egress-only] [--burst B] [--latency L]
#   scripts/netns-cluster.sh heal HOST [IFACE]             remove what degrade set
#   scripts/netns-cluster.sh status [--json]
#
# Topology (P = $KCOLL_CLUSTER_PREFIX, default "kc"; host i of H):
#   netns P-hi: lo, eth0 10.10.0.(i+1)/24, eth1 10.20.0.(i+1)/24
#   netns P-sw: the "switches": bridges P-br0 (network 10.10.0.0/24) and
#               P-br1 (10.20.0.0/24); port hi-eth0 / hi-eth1 is the other end
#               of host i's eth0 / eth1 veth.
# The bridges live in their own namespace so that the root namespace gains no
# interface, address or route: nothing outside the cluster can send into it,
# and two clusters with different prefixes use the same addresses side by side.
# Every host pair has two disjoint paths (eth0-br0-eth0, eth1-br1-eth1).
# The bridges forward frames without br_netfilter's IP hooks, as a switch
# would (KCOLL_CLUSTER_BRIDGE_NF=1 keeps them where the module is loaded).
# --gso BYTES (default $KCOLL_CLUSTER_GSO_BYTES, else the kernel's 64 KiB)
# lets TCP hand the links packets of up to BYTES, both ends of every veth:
# above 64 KiB that is BIG TCP (IPv4 needs Linux 6.3; set through rtnetlink
# by build/tests/link_gso), fewer packets for the hosts' CPUs to carry
# through veth and bridge per byte.
#
# HOST is an index (2), hN, P-hN, or one of the host's addresses.
# exec runs CMD in the host's namespace and in a UTS namespace of its own whose
# hostname is the namespace name (each host names itself in logs and benchmark
# results, as separate machines would), with KCOLL_SOCKET set to that host's
# kcolld socket (unset without one), KCOLL_CLUSTER_HOST=i, KCOLL_CLUSTER_HOSTS=H
# and KCOLL_CLUSTER_PREFIX exported.
# degrade puts a tbf qdisc on the host's interface (its egress) and, unless
# --egress-only, on the bridge port of that interface (the host's ingress), so
# the link is slow both ways. RATE is tc's: 100mbit, 1gbit, 20mbps (bytes/s).
#
# Daemons: kcolld from $KCOLL_BUILD/bin (default build/bin), one per host,
# socket, log and pid file in $KCOLL_CLUSTER_RUNDIR/hN/ (default
# /run/kcoll-P/hN/). down stops them, kills whatever else still runs in the
# cluster's namespaces (only those), deletes the namespaces (their veths and
# bridges go with them) and the run dir; it is safe after a partial up and
# when nothing is up. restart stops HOST's kcolld if it still runs (TERM, then
# KILL after 3 s) and starts a fresh one on the same socket, log and pid
# file; a killed daemon (a fault test) is simply started again. Needs root.
set -euo pipefail

prog=netns-cluster
top=$(cd "$(dirname "$0")/.." && pwd)
P=${KCOLL_CLUSTER_PREFIX:-kc}
RUNDIR=${KCOLL_CLUSTER_RUNDIR:-/run/kcoll-$P}
SW=$P-sw
BUILD_DIR=${KCOLL_BUILD:-$top/build}
NET0=10.10.0
NET1=10.20.0
MAX_HOSTS=64

die() { echo "$prog: $*" >&2; exit 1; }
note() { echo "$prog: $*" >&2; }
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

need_root() {
	[ "$(id -u)" -eq 0 ] ||
		die "needs root (network namespaces, veth, bridges, tc): run it with sudo"
	command -v ip >/dev/null || die "'ip' (iproute2) is missing: scripts/deps.sh installs it"
}

# Interface names are at most 15 characters: P-br0 must fit.
check_prefix() {
	[[ "$P" =~ ^[A-Za-z][A-Za-z0-9_]{0,10}$ ]] ||
		die "KCOLL_CLUSTER_PREFIX '$P': 1-11 letters, digits or _, starting with a letter"
}

host_ns() { echo "$P-h$1"; }

# Where br_netfilter is loaded (Docker loads it), every frame a bridge forwards
# also goes through the IP netfilter hooks, by default in each new namespace
# too: the hosts' CPU would pay for firewalling that a real switch never does
# (3% of an all-reduce's time across 4 hosts). The switches' namespace turns
# that off; KCOLL_CLUSTER_BRIDGE_NF=1 leaves it on.
switch_nf_off() {
	[ "${KCOLL_CLUSTER_BRIDGE_NF:-0}" = 1 ] && return 0
	local k
	for k in iptables ip6tables arptables; do
		[ -e "/proc/sys/net/bridge/bridge-nf-call-$k" ] || continue
		ip netns exec "$SW" sh -c "echo 0 >/proc/sys/net/bridge/bridge-nf-call-$k"
	done
}

# The namespaces of this cluster that exist now: hosts (by index) then the switch.
cluster_hosts() {
	ip netns list 2>/dev/null | awk '{print $1}' | sed -n "s/^$P-h\([0-9][0-9]*\)\$/\1/p" | sort -n
}
nhosts() { cluster_hosts | wc -l; }

# HOST argument -> index, checked against the namespaces that exist.
resolve_host() {
	local h=$1 i
	case "$h" in
	"$P"-h[0-9]*) i=${h#"$P"-h} ;;
	h[0-9]*) i=${h#h} ;;
	"$NET0".* | "$NET1".*) i=$(( ${h##*.} - 1 )) ;;
	*) i=$h ;;
	esac
	[[ "$i" =~ ^[0-9]+$ ]] || die "no such host '$h' (an index, hN, $P-hN or an address)"
	i=$((10#$i))
	ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "$(host_ns "$i")" ||
		die "host '$h' ($(host_ns "$i")) does not exist: is the cluster up? ($0 status)"
	echo "$i"
}

sock_of() { echo "$RUNDIR/h$1/kcolld.sock"; }

# ---- down ---------------------------------------------------------------------

# TERM, wait up to 10 s (an ASan build on a busy machine exits slowly, and a
# KILLed kcolld leaves its BPF pins behind), then KILL; pids given.
stop_pids() {
	[ $# -gt 0 ] || return 0
	kill -TERM "$@" 2>/dev/null || true
	for _ in $(seq 100); do
		local alive=0
		for p in "$@"; do kill -0 "$p" 2>/dev/null && alive=1; done
		[ "$alive" -eq 0 ] && return 0
		sleep 0.1
	done
	kill -KILL "$@" 2>/dev/null || true
}

cmd_down() {
	need_root
	check_prefix
	local ns nss pids=() pidfile p
	nss=$(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$P-(h[0-9]+|sw)\$" || true)
	# The daemons by their pid files (only if the pid is still a kcolld), and
	# whatever else runs in the namespaces (a namespace with a process in it
	# outlives 'ip netns del'); all stopped together.
	for pidfile in "$RUNDIR"/h*/kcolld.pid; do
		[ -f "$pidfile" ] || continue
		p=$(cat "$pidfile" 2>/dev/null || true)
		[[ "$p" =~ ^[0-9]+$ ]] && grep -q kcolld "/proc/$p/cmdline" 2>/dev/null && pids+=("$p")
	done
	for ns in $nss; do
		# shellcheck disable=SC2207
		pids+=($(ip netns pids "$ns" 2>/dev/null || true))
	done
	stop_pids "${pids[@]}"
	for ns in $nss; do
		ip netns del "$ns" 2>/dev/null || note "could not delete netns $ns"
	done
	rm -rf "$RUNDIR"
	nss=$(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$P-(h[0-9]+|sw)\$" || true)
	[ -z "$nss" ] || die "namespaces left: $(echo "$nss" | tr '\n' ' ')"
}

# ---- up -------------------------------------------------------------------------

# One veth from host i's interface IF to bridge BR, with address ADDR/24.
add_link() {	# i iface bridge addr
	local ns; ns=$(host_ns "$1")
	ip -n "$SW" link add "h$1-$2" type veth peer name "$2" netns "$ns"
	ip -n "$SW" link set "h$1-$2" master "$3" up
	ip -n "$ns" addr add "$4/24" dev "$2"
	ip -n "$ns" link set "$2" up
}

# Both ends of host i's two links take packets of up to BYTES; the kernel's
# own reading back, so that a kernel without IPv4 BIG TCP is named.
set_gso() {	# i bytes
	local ns got
	ns=$(host_ns "$1")
	ip netns exec "$ns" "$BUILD_DIR/tests/link_gso" "$2" eth0 eth1 || return 1
	ip netns exec "$SW" "$BUILD_DIR/tests/link_gso" "$2" "h$1-eth0" "h$1-eth1" || return 1
	got=$(ip netns exec "$ns" "$BUILD_DIR/tests/link_gso" --get eth0 | awk '$1 == "gso_ipv4_max_size" { print $2 }')
	[ "$got" = "$2" ] ||
		die "--gso $2: eth0 of $ns takes IPv4 packets of up to ${got:-?} bytes (IPv4 BIG TCP needs Linux 6.3)"
}

start_daemon() {	# i
	local i=$1 ns dir
	ns=$(host_ns "$i")
	dir=$RUNDIR/h$i
	mkdir -p "$dir"
	chmod 755 "$RUNDIR" "$dir"
	# kcolld daemonizes (the parent exits once it is set up) and writes its pid.
	# Its stdio goes to a file: a daemon holding our stdout would keep a
	# caller's $(netns-cluster.sh up) waiting for ever.
	ip netns exec "$ns" "$BUILD_DIR/bin/kcolld" -s "$dir/kcolld.sock" -l "$dir/kcolld.log" \
		-p "$dir/kcolld.pid" </dev/null >"$dir/kcolld.out" 2>&1 ||
		{ cat "$dir/kcolld.out" "$dir/kcolld.log" >&2 2>/dev/null; return 1; }
}

wait_daemon() {	# i
	local sock; sock=$(sock_of "$1")
	for _ in $(seq 600); do
		[ -S "$sock" ] && [ -s "$RUNDIR/h$1/kcolld.pid" ] && return 0
		sleep 0.05
	done
	cat "$RUNDIR/h$1/kcolld.out" "$RUNDIR/h$1/kcolld.log" >&2 2>/dev/null || true
	note "kcolld on $(host_ns "$1") did not create $sock"
	return 1
}

cmd_up() {
	local hosts=4 daemons=1 i gso=${KCOLL_CLUSTER_GSO_BYTES:-}
	while [ $# -gt 0 ]; do
		case "$1" in
		-H | --hosts) [ $# -ge 2 ] || die "-H needs a number"; hosts=$2; shift ;;
		--hosts=*) hosts=${1#*=} ;;
		--no-daemon) daemons=0 ;;
		--gso) [ $# -ge 2 ] || die "--gso needs a size in bytes"; gso=$2; shift ;;
		--gso=*) gso=${1#*=} ;;
		-h | --help) usage; exit 0 ;;
		*) die "up: unknown option '$1' (try --help)" ;;
		esac
		shift
	done
	if ! [[ "$hosts" =~ ^[0-9]+$ ]] || [ "$hosts" -lt 2 ] || [ "$hosts" -gt $MAX_HOSTS ]; then
		die "-H $hosts: between 2 and $MAX_HOSTS hosts"
	fi
	need_root
	check_prefix
	command -v tc >/dev/null || die "'tc' (iproute2) is missing"
	if [ -n "$gso" ]; then
		[[ "$gso" =~ ^[0-9]+$ ]] || die "--gso $gso: a size in bytes"
		[ -x "$BUILD_DIR/tests/link_gso" ] ||
			die "$BUILD_DIR/tests/link_gso missing (--gso): run make (it needs libnl-3-dev: make deps)"
	fi
	if [ "$daemons" -eq 1 ] && [ ! -x "$BUILD_DIR/bin/kcolld" ]; then
		die "$BUILD_DIR/bin/kcolld missing: run make (or up --no-daemon)"
	fi
	if ip netns list 2>/dev/null | awk '{print $1}' | grep -qE "^$P-(h[0-9]+|sw)\$"; then
		die "cluster '$P' is already (partly) up: '$0 down' first"
	fi

	# Whatever fails (or interrupts) from here on, leave nothing behind.
	up_done=0
	trap '[ "$up_done" -eq 1 ] || { note "up failed: cleaning up"; cmd_down; }' EXIT
	trap 'exit 130' INT TERM
	mkdir -p "$RUNDIR"
	echo "$hosts" >"$RUNDIR/hosts"
	ip netns add "$SW"
	ip -n "$SW" link set lo up
	switch_nf_off
	ip -n "$SW" link add "$P-br0" type bridge
	ip -n "$SW" link add "$P-br1" type bridge
	ip -n "$SW" link set "$P-br0" up
	ip -n "$SW" link set "$P-br1" up
	for ((i = 0; i < hosts; i++)); do
		ip netns add "$(host_ns "$i")"
		ip -n "$(host_ns "$i")" link set lo up
		add_link "$i" eth0 "$P-br0" "$NET0.$((i + 1))"
		add_link "$i" eth1 "$P-br1" "$NET1.$((i + 1))"
		[ -z "$gso" ] || set_gso "$i" "$gso"
	done
	if [ "$daemons" -eq 1 ]; then
		for ((i = 0; i < hosts; i++)); do start_daemon "$i"; done
		for ((i = 0; i < hosts; i++)); do wait_daemon "$i"; done
	fi
	up_done=1

	echo "$prog: cluster '$P' up: $hosts hosts, bridges $P-br0 ($NET0.0/24) and $P-br1 ($NET1.0/24) in netns $SW"
	for ((i = 0; i < hosts; i++)); do
		printf '%s: %-8s eth0 %-11s eth1 %-11s' "$prog" "$(host_ns "$i")" "$NET0.$((i + 1))" \
			"$NET1.$((i + 1))"
		if [ "$daemons" -eq 1 ]; then
			printf ' kcolld %s (pid %s)\n' "$(sock_of "$i")" "$(cat "$RUNDIR/h$i/kcolld.pid")"
		else
			printf '\n'
		fi
	done
}

# ---- exec -----------------------------------------------------------------------

cmd_exec() {
	[ $# -ge 2 ] || die "usage: $0 exec HOST CMD..."
	need_root
	check_prefix
	local i ns
	i=$(resolve_host "$1")
	shift
	ns=$(host_ns "$i")
	export KCOLL_CLUSTER_PREFIX=$P KCOLL_CLUSTER_HOST=$i KCOLL_CLUSTER_HOSTS
	KCOLL_CLUSTER_HOSTS=$(nhosts)
	# A socket path reaches across network namespaces: never leave one that
	# names another host's (or the root namespace's) daemon.
	unset KCOLL_SOCKET
	if [ -S "$(sock_of "$i")" ]; then
		KCOLL_SOCKET=$(sock_of "$i")
		export KCOLL_SOCKET
	fi
	# shellcheck disable=SC2016
	exec ip netns exec "$ns" unshare --uts -- sh -c \
		'echo "$0" >/proc/sys/kernel/hostname && exec "$@"' "$ns" "$@"
}

# ---- restart --------------------------------------------------------------------

cmd_restart() {
	[ $# -eq 1 ] || die "usage: $0 restart HOST"
	need_root
	check_prefix
	local i p pidfile
	i=$(resolve_host "$1")
	[ -x "$BUILD_DIR/bin/kcolld" ] || die "$BUILD_DIR/bin/kcolld missing: run make"
	pidfile=$RUNDIR/h$i/kcolld.pid
	p=$(cat "$pidfile" 2>/dev/null || true)
	if [[ "$p" =~ ^[0-9]+$ ]] && grep -q kcolld "/proc/$p/cmdline" 2>/dev/null; then
		stop_pids "$p"
		# After a KILL: gone before the new one probes the socket.
		for _ in $(seq 20); do kill -0 "$p" 2>/dev/null || break; sleep 0.05; done
	fi
	# wait_daemon waits for the new pid file (written once the socket listens).
	rm -f "$pidfile"
	start_daemon "$i"
	wait_daemon "$i"
	echo "$prog: $(host_ns "$i") kcolld $(sock_of "$i") (pid $(cat "$pidfile"))"
}

# ---- degrade / heal -------------------------------------------------------------

# tc rate -> bytes per second (integers with tc's unit names).
rate_bytes() {
	local r=$1 n u
	[[ "$r" =~ ^([0-9]+)([A-Za-z]*)$ ]] || return 1
	n=${BASH_REMATCH[1]}
	u=${BASH_REMATCH[2],,}
	case "$u" in
	bit) echo $((n / 8)) ;;
	kbit) echo $((n * 1000 / 8)) ;;
	mbit) echo $((n * 1000000 / 8)) ;;
	gbit) echo $((n * 1000000000 / 8)) ;;
	bps) echo "$n" ;;
	kbps) echo $((n * 1000)) ;;
	mbps) echo $((n * 1000000)) ;;
	gbps) echo $((n * 1000000000)) ;;
	*) return 1 ;;
	esac
}

check_iface() {
	case "$1" in
	eth0 | eth1) ;;
	*) die "no interface '$1' (eth0 or eth1)" ;;
	esac
}

cmd_degrade() {
	[ $# -ge 3 ] || die "usage: $0 degrade HOST IFACE RATE [--egress-only] [--burst BYTES] [--latency L]"
	need_root
	check_prefix
	local i iface=$2 rate=$3 both=1 burst='' latency=50ms bps
	i=$(resolve_host "$1")
	shift 3
	while [ $# -gt 0 ]; do
		case "$1" in
		--egress-only) both=0 ;;
		--burst) [ $# -ge 2 ] || die "--burst needs bytes"; burst=$2; shift ;;
		--latency) [ $# -ge 2 ] || die "--latency needs a time (50ms)"; latency=$2; shift ;;
		*) die "degrade: unknown option '$1'" ;;
		esac
		shift
	done
	check_iface "$iface"
	if ! bps=$(rate_bytes "$rate") || [ "$bps" -le 0 ]; then
		die "rate '$rate': a whole number with bit, kbit, mbit, gbit, bps, kbps, mbps or gbps"
	fi
	# 10 ms worth of tokens, at least ten full frames: enough for TCP to keep
	# the rate, small enough that a burst does not skew a one-second measure.
	if [ -z "$burst" ]; then
		burst=$((bps / 100))
		[ "$burst" -lt 15140 ] && burst=15140
	fi
	ip -n "$(host_ns "$i")" link show "$iface" >/dev/null 2>&1 || die "$(host_ns "$i") has no $iface"
	ip netns exec "$(host_ns "$i")" tc qdisc replace dev "$iface" root tbf rate "$rate" \
		burst "$burst" latency "$latency"
	if [ "$both" -eq 1 ]; then
		ip netns exec "$SW" tc qdisc replace dev "h$i-$iface" root tbf rate "$rate" \
			burst "$burst" latency "$latency"
	else
		ip netns exec "$SW" tc qdisc del dev "h$i-$iface" root 2>/dev/null || true
	fi
	echo "$prog: $(host_ns "$i") $iface: tbf rate $rate burst $burst latency $latency" \
		"($([ "$both" -eq 1 ] && echo "both directions" || echo "egress only"))"
}

cmd_heal() {
	[ $# -ge 1 ] || die "usage: $0 heal HOST [IFACE]"
	need_root
	check_prefix
	local i ifaces=(eth0 eth1) f
	i=$(resolve_host "$1")
	if [ $# -ge 2 ]; then
		check_iface "$2"
		ifaces=("$2")
	fi
	for f in "${ifaces[@]}"; do
		# Deleting the root qdisc puts the veth's default back; none there is fine.
		ip netns exec "$(host_ns "$i")" tc qdisc del dev "$f" root 2>/dev/null || true
		ip netns exec "$SW" tc qdisc del dev "h$i-$f" root 2>/dev/null || true
	done
	echo "$prog: $(host_ns "$i") ${ifaces[*]}: healed"
}

# ---- status -----------------------------------------------------------------------

# The tbf on a device, or "" when it has none.
tbf_of() {	# netns dev
	ip netns exec "$1" tc qdisc show dev "$2" root 2>/dev/null |
		sed -n 's/^qdisc tbf [0-9a-f]*: root refcnt [0-9]* \(.*\)$/tbf \1/p' | head -1
}

# "eth1 out 200Mbit in 200Mbit", or nothing: a link's shaping, both ways.
shaping() {	# netns index iface
	local out in
	out=$(tbf_of "$1" "$3" | awk '{print $3}')
	in=$(tbf_of "$SW" "h$2-$3" | awk '{print $3}')
	if [ -n "$out$in" ]; then echo "$3 out ${out:-full} in ${in:-full}"; fi
}

json_str() { if [ -n "$1" ]; then printf '"%s"' "${1//\"/}"; else printf null; fi; }

cmd_status() {
	local json=0 i n pid alive sock e0 e1 first=1 ns
	[ "${1:-}" = --json ] && json=1
	need_root
	check_prefix
	n=$(nhosts)
	if [ "$json" -eq 1 ]; then
		printf '{\n  "prefix": "%s", "up": %s, "hosts": %s, "switch_netns": %s, "rundir": "%s",\n' \
			"$P" "$([ "$n" -gt 0 ] && echo true || echo false)" "$n" \
			"$(ip netns list | awk '{print $1}' | grep -qx "$SW" && json_str "$SW" || echo null)" \
			"$RUNDIR"
		printf '  "bridges": {"eth0": {"bridge": "%s-br0", "net": "%s.0/24"}, "eth1": {"bridge": "%s-br1", "net": "%s.0/24"}},\n' \
			"$P" "$NET0" "$P" "$NET1"
		printf '  "host": ['
	elif [ "$n" -eq 0 ]; then
		echo "$prog: cluster '$P' is not up"
		return 0
	else
		echo "cluster '$P': $n hosts; bridges $P-br0 ($NET0.0/24), $P-br1 ($NET1.0/24) in netns $SW; run dir $RUNDIR"
		printf '%-8s %-11s %-11s %-8s %-30s %s\n' HOST ETH0 ETH1 KCOLLD SOCKET QDISC
	fi
	for i in $(cluster_hosts); do
		ns=$(host_ns "$i")
		sock=$(sock_of "$i")
		pid=$(cat "$RUNDIR/h$i/kcolld.pid" 2>/dev/null || true)
		alive=false
		[ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && alive=true
		e0=$(tbf_of "$ns" eth0)
		e1=$(tbf_of "$ns" eth1)
		if [ "$json" -eq 1 ]; then
			[ "$first" -eq 1 ] || printf ','
			first=0
			printf '\n    {"index": %s, "netns": "%s", "eth0": "%s.%s", "eth1": "%s.%s", ' \
				"$i" "$ns" "$NET0" "$((i + 1))" "$NET1" "$((i + 1))"
			printf '"socket": %s, "kcolld_pid": %s, "kcolld_alive": %s, ' \
				"$([ -S "$sock" ] && json_str "$sock" || echo null)" "${pid:-null}" "$alive"
			printf '"qdisc": {"eth0": %s, "eth1": %s, "eth0_ingress": %s, "eth1_ingress": %s}}' \
				"$(json_str "$e0")" "$(json_str "$e1")" \
				"$(json_str "$(tbf_of "$SW" "h$i-eth0")")" "$(json_str "$(tbf_of "$SW" "h$i-eth1")")"
		else
			e0=$(shaping "$ns" "$i" eth0)
			e1=$(shaping "$ns" "$i" eth1)
			printf '%-8s %-11s %-11s %-8s %-30s %s\n' "$ns" "$NET0.$((i + 1))" "$NET1.$((i + 1))" \
				"$([ "$alive" = true ] && echo "$pid" || echo -)" \
				"$([ -S "$sock" ] && echo "$sock" || echo -)" "$e0${e0:+${e1:+, }}$e1"
		fi
	done
	[ "$json" -eq 1 ] && printf '\n  ]\n}\n'
	return 0
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
up) cmd_up "$@" ;;
down) cmd_down ;;
exec) cmd_exec "$@" ;;
restart) cmd_restart "$@" ;;
degrade) cmd_degrade "$@" ;;
heal) cmd_heal "$@" ;;
status) cmd_status "$@" ;;
-h | --help | help) usage ;;
"") usage >&2; exit 2 ;;
*) echo "$prog: unknown command '$cmd' (try --help)" >&2; exit 2 ;;
esac
