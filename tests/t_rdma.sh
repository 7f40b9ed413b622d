#!/usr/bin/env bash
# The RDMA transport on the host tier (issue 6): without an RDMA device the
# daemon falls back to TCP and logs why; KCOLL_NET_XPORT=tcp and a bad value
# are logged as such. The RDMA path itself runs in the VM tier
# (tests/vm/t_rdma.sh, Soft-RoCE). TAP.
set -u
B=${KCOLL_BUILD:?run through tests/run.sh}
D="$B/bin/kcolld"
n=0 failed=0
ok() { n=$((n + 1)); if [ "$1" -eq 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; failed=1; fi; }

T=$(mktemp -d "${KCOLL_TEST_TMP:-/tmp}/rdma.XXXXXX")
pid=
cleanup() { [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null; rm -rf "$T"; }
trap cleanup EXIT

# Start kcolld with env $@, wait for its transport line, stop it; log in $T/log.
run_daemon() {
	rm -f "$T/log" "$T/s"
	env "$@" "$D" -f -s "$T/s" -l "$T/log" --listen 127.0.0.1:0 --addrs 127.0.0.1 >"$T/out" 2>&1 &
	pid=$!
	for _ in $(seq 300); do grep -q "transport between daemons" "$T/log" 2>/dev/null && break; sleep 0.1; done
	kill -TERM "$pid" 2>/dev/null
	wait "$pid" 2>/dev/null
	pid=
}

if [ -n "$(ls /sys/class/infiniband 2>/dev/null)" ]; then
	echo "ok 1 # SKIP this machine has RDMA devices: the fallback is not what runs here"
	n=1
else
	run_daemon KCOLL_NET_XPORT=auto
	grep -q "transport between daemons: tcp (rdma not used: no RDMA device" "$T/log"
	ok $? "no RDMA device: kcolld uses TCP and logs why ($(grep -o 'rdma not used: [^;(]*' "$T/log" | head -1))"
	run_daemon KCOLL_NET_XPORT=rdma
	grep -q "KCOLL_NET_XPORT=rdma but no RDMA device.*falling back to tcp" "$T/log"
	ok $? "KCOLL_NET_XPORT=rdma without a device: an error line, then TCP"
fi
run_daemon KCOLL_NET_XPORT=tcp
grep -q "transport between daemons: tcp (KCOLL_NET_XPORT=tcp)" "$T/log"
ok $? "KCOLL_NET_XPORT=tcp is logged"
run_daemon KCOLL_NET_XPORT=carrier-pigeon
grep -q "KCOLL_NET_XPORT='carrier-pigeon' is not auto, rdma or tcp: using tcp" "$T/log"
ok $? "a bad KCOLL_NET_XPORT is refused with a warning"
echo "1..$n"
exit $failed
