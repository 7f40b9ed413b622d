#!/usr/bin/env bash
# make demo: start kcolld (unless one already answers on $KCOLL_SOCKET), run a
# 4-rank all-reduce sweep through it, show the daemon's status, stop what we
# started. KEEP=1 leaves the daemon running.
set -euo pipefail
BUILD=${1:-build}
bin=$BUILD/bin
sock=${KCOLL_SOCKET:-/run/kcoll/kcolld.sock}
export KCOLL_SOCKET=$sock
started=

if "$bin/kcollctl" status >/dev/null 2>&1; then
	echo "demo: using the kcolld already running on $sock"
else
	log=$(dirname "$sock")/kcolld.log
	mkdir -p "$(dirname "$sock")"
	"$bin/kcolld" -s "$sock" -l "$log" -p "$(dirname "$sock")/kcolld.pid"
	for _ in $(seq 50); do "$bin/kcollctl" status >/dev/null 2>&1 && break; sleep 0.1; done
	started=$(cat "$(dirname "$sock")/kcolld.pid")
	echo "demo: started kcolld (pid $started) on $sock, log $log"
fi
stop() { [ -n "$started" ] && [ -z "${KEEP:-}" ] && kill -TERM "$started" 2>/dev/null && echo "demo: stopped kcolld"; }
trap stop EXIT

echo "demo: 4 ranks, all-reduce f32 sum, 8 B .. 64 MiB, zero-copy buffers, results checked"
"$bin/kcoll-bench" allreduce -N 4 -b 8 -e 64M -f 2 -n 20 -w 5 -c 1 -d f32 -o sum
echo
"$bin/kcollctl" status
