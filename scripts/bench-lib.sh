# shellcheck shell=bash
# Sourced by the benchmarks that talk to one kcolld (bench-intra.sh,
# bench-torch.sh).
#
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
