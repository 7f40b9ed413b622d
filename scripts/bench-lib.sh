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
