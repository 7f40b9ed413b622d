# shellcheck shell=bash
# Sourced by the benchmarks (scripts/bench-*.sh): their common command line,
# and for those that talk to one kcolld (bench-intra.sh, bench-torch.sh)
# that daemon.
#
# bench_help: the usage, which is the head comment of the script $0 (the
# comment lines after #!), on stdout; exit 0.
bench_help() {
	echo "usage: scripts/$(basename "$0") (from its head comment):"
	awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
	exit 0
}

# bench_opts "$@": after the script took its own options: -h/--help prints
# the usage; any other leading '-' word is an unknown option (exit 2).
bench_opts() {
	case "${1:-}" in
	-h|--help) bench_help ;;
	-*) echo "$(basename "$0"): unknown option '$1' (try --help)" >&2; exit 2 ;;
	esac
}

# bench_build_dir DIR NAME: exit 2 unless DIR (NAME as the user gave it) is
# a build directory, one that holds bin/.
bench_build_dir() {
	[ -d "$1/bin" ] && return
	echo "$(basename "$0"): '$2' is not a build directory ($1/bin missing: run make, or name one; try --help)" >&2
	exit 2
}

# bench_kcolld: sock = $KCOLL_SOCKET when set, else a private kcolld from
# $bin started on $tmp/kcolld.sock (log $tmp/kcolld.log), its pid in
# daemon_pid for the caller's cleanup to stop with bench_kcolld_stop. Needs
# bin, tmp and die().
bench_kcolld() {
	if [ -n "${KCOLL_SOCKET:-}" ]; then
		sock=$KCOLL_SOCKET
		return
	fi
	[ -x "$bin/kcolld" ] || die "$bin/kcolld missing: run make (or set KCOLL_SOCKET)"
	sock="$tmp/kcolld.sock"
	"$bin/kcolld" -f -s "$sock" -l "$tmp/kcolld.log" &
	daemon_pid=$!
	for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
	[ -S "$sock" ] || { cat "$tmp/kcolld.log" >&2; die "kcolld did not create $sock"; }
}

# bench_kcolld_stop: stop (SIGTERM, then wait) the kcolld bench_kcolld
# started, if any; for the caller's EXIT trap.
bench_kcolld_stop() {
	if [ -n "${daemon_pid:-}" ]; then
		kill -TERM "$daemon_pid" 2>/dev/null || true
		wait "$daemon_pid" 2>/dev/null || true
	fi
}

# bench_tcpcap_ring OUT ADDRS PORT SECONDS: the raw TCP ring of a netns
# cluster (scripts/netns-cluster.sh, the hosts 0..n-1 of the comma list
# ADDRS): kcoll-tcpcap ring on every host at once, each streaming to its
# ring neighbour for SECONDS; rank 0's JSON (every link, the aggregate and
# the ring all-reduce bound) into OUT. Dies, with the ranks' stderr, if
# any rank fails. Needs bin, tmp, die() and the cluster's environment.
bench_tcpcap_ring() {
	local out=$1 addrs=$2 port=$3 secs=$4 n i rc=0 pids=()
	local cluster
	cluster="$(dirname "${BASH_SOURCE[0]}")/netns-cluster.sh"
	n=$(tr ',' '\n' <<<"$addrs" | wc -l)
	for ((i = 1; i < n; i++)); do
		timeout -k 5 60 "$cluster" exec "$i" "$bin/kcoll-tcpcap" ring -r "$i" "$addrs" -p "$port" \
			-t "$secs" >/dev/null 2>"$tmp/cap-$i.err" &
		pids+=($!)
	done
	timeout -k 5 60 "$cluster" exec 0 "$bin/kcoll-tcpcap" ring -r 0 "$addrs" -p "$port" -t "$secs" \
		--json >"$out" 2>"$tmp/cap-0.err" || rc=1
	for i in "${pids[@]}"; do wait "$i" || rc=1; done
	[ "$rc" -eq 0 ] || { cat "$tmp"/cap-*.err >&2; die "kcoll-tcpcap ring failed"; }
}
