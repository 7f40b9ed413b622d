#!/usr/bin/env bash
# kcolld's Prometheus metrics (docs/metrics.md): off by default; scraped with
# curl while kcoll-bench runs and read by Prometheus' own parser
# (python3-prometheus-client): counters monotonic, all-reduce ops and bytes
# equal to what the benchmark ran, histograms consistent; malformed requests
# answered with errors while the daemon goes on serving; the textfile; and
# `kcollctl metrics`. Each part runs its own kcolld. TAP.
set -u
B=${KCOLL_BUILD:?run through tests/run.sh}
top=${KCOLL_TOP:?run through tests/run.sh}
T=$(mktemp -d "${KCOLL_TEST_TMP:-/tmp}/metrics.XXXXXX")
CHECK="$top/tests/metrics_check.py"
DOC="$top/docs/metrics.md"
n=0 failed=0
pids=()
ok() { n=$((n + 1)); if [ "$1" -eq 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; failed=1; fi; }
skip_all() { echo "ok 1 # SKIP $1"; echo "1..1"; exit 0; }
cleanup() { for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done; rm -rf "$T"; }
trap cleanup EXIT

# Debian's python3 has Debian's modules (another python3 on PATH may not).
PY=python3
[ -x /usr/bin/python3 ] && PY=/usr/bin/python3
"$PY" -c 'import prometheus_client.parser' 2>/dev/null ||
	skip_all "no Prometheus parser: install python3-prometheus-client (scripts/deps.sh)"
command -v curl >/dev/null || skip_all "no curl: install curl (scripts/deps.sh)"

# start NAME [VAR=VALUE...]: a kcolld on $T/NAME.sock in the foreground, its
# environment without the metrics knobs but for those given; pid in $dpid.
start() {
	local name=$1; shift
	env -u KCOLL_METRICS -u KCOLL_METRICS_FILE -u KCOLL_METRICS_INTERVAL "$@" \
		"$B/bin/kcolld" -f -s "$T/$name.sock" -l "$T/$name.log" &
	dpid=$!
	pids+=("$dpid")
	for _ in $(seq 300); do [ -S "$T/$name.sock" ] && return 0; sleep 0.05; done
	return 1
}
stop() { kill -TERM "$1" 2>/dev/null && wait "$1"; }
json_field() { "$B/bin/kcollctl" -s "$1" status --json | "$PY" -c "import json,sys; print(json.load(sys.stdin)['$2'])"; }
# Listening TCP sockets a process owns (its fds against /proc/net/tcp).
tcp_listeners() {
	"$PY" - "$1" <<'EOF'
import os, sys
pid = sys.argv[1]
inodes = set()
for fd in os.listdir(f"/proc/{pid}/fd"):
    try:
        t = os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        continue
    if t.startswith("socket:["):
        inodes.add(t[8:-1])
n = 0
for tab in ("/proc/net/tcp", "/proc/net/tcp6"):
    for line in open(tab).readlines()[1:]:
        f = line.split()
        n += f[3] == "0A" and f[9] in inodes
print(n)
EOF
}
# raw ADDR BYTES-EXPR: send what the Python expression makes, print the status line.
raw() {
	"$PY" - "$1" "$2" <<'EOF'
import socket, sys
host, port = sys.argv[1].rsplit(":", 1)
s = socket.create_connection((host, int(port)), timeout=10)
try:
    s.sendall(eval(sys.argv[2]))
except OSError:
    pass
data = b""
try:
    while not data.endswith(b"\n") and b"\n" not in data:
        got = s.recv(4096)
        if not got:
            break
        data += got
except OSError:
    pass
print(data.split(b"\r\n")[0].decode(errors="replace") or "(closed)")
EOF
}

# --- off by default ----------------------------------------------------------
start off || { echo "Bail out! kcolld did not start"; cat "$T/off.log"; exit 1; }
[ "$(json_field "$T/off.sock" metrics)" = "" ]; ok $? "off by default: status names no metrics endpoint"
[ "$(tcp_listeners "$dpid")" = 1 ] && ! grep -q "metrics:" "$T/off.log"
ok $? "off by default: kcolld listens on one TCP port (its peers'), none for metrics"
"$B/bin/kcollctl" -s "$T/off.sock" metrics >"$T/off.txt" && "$PY" "$CHECK" parse "$T/off.txt" "$DOC"
ok $? "kcollctl metrics works with the endpoint off; every metric has HELP, TYPE and a line in docs/metrics.md"
stop "$dpid"

out=$(env KCOLL_METRICS=localhost:x "$B/bin/kcolld" -f -s "$T/bad.sock" -l "$T/bad.log" 2>&1); rc=$?
[ $rc -ne 0 ] && grep -q "KCOLL_METRICS=localhost:x: not PORT or IPV4:PORT" "$T/bad.log"
ok $? "KCOLL_METRICS that does not parse: kcolld refuses to start, saying why (rc $rc)"

# --- scraped while a benchmark runs -------------------------------------------
start on KCOLL_METRICS=127.0.0.1:0 || { echo "Bail out! kcolld did not start"; cat "$T/on.log"; exit 1; }
on=$dpid
A=$(json_field "$T/on.sock" metrics)
grep -q "metrics: serving http://$A/metrics" "$T/on.log" && [ "$(tcp_listeners "$on")" = 2 ]
ok $? "KCOLL_METRICS=127.0.0.1:0: serving on $A, said in the log and status"
curl -sS -D "$T/h0" -o "$T/s0" "http://$A/metrics"; rc=$?
[ $rc -eq 0 ] && head -1 "$T/h0" | grep -q "^HTTP/1.1 200" &&
	grep -qi "^content-type: text/plain; version=0.0.4" "$T/h0"
ok $? "GET /metrics: 200, text/plain; version=0.0.4"

"$B/bin/kcoll-bench" allreduce -N 2 -b 1K -e 16M -n 200 -w 2 --json -s "$T/on.sock" >"$T/bench.json" \
	2>"$T/bench.err" &
bpid=$!
pids+=("$bpid")
scrapes=("$T/s0") during=0 i=1
while kill -0 "$bpid" 2>/dev/null; do
	curl -sSf -o "$T/s$i" "http://$A/metrics" || break
	kill -0 "$bpid" 2>/dev/null && during=$((during + 1))
	scrapes+=("$T/s$i")
	i=$((i + 1))
	sleep 0.05
done
wait "$bpid"; brc=$?
curl -sSf -o "$T/s$i" "http://$A/metrics"
scrapes+=("$T/s$i")
[ $brc -eq 0 ]; ok $? "kcoll-bench allreduce -N 2 -b 1K -e 16M ran (rc $brc)"
[ "$during" -ge 2 ]; ok $? "scraped $during times while the benchmark ran"
"$PY" "$CHECK" series "${scrapes[@]}" --bench "$T/bench.json" --nranks 2
ok $? "${#scrapes[@]} scrapes: counters monotonic, all-reduce ops and bytes equal what the bench ran, histograms consistent"
"$PY" "$CHECK" parse "$T/s$i" "$DOC"; ok $? "the last scrape parses, every family documented"
"$B/bin/kcollctl" -s "$T/on.sock" metrics >"$T/ctl.txt" &&
	[ "$("$PY" "$CHECK" value "$T/ctl.txt" kcoll_op_bytes_total op=allreduce)" = \
	  "$("$PY" "$CHECK" value "$T/s$i" kcoll_op_bytes_total op=allreduce)" ]
ok $? "kcollctl metrics prints the same counters as the endpoint"

# --- malformed requests ---------------------------------------------------------
st=$(raw "$A" 'b"hello there\r\n\r\n"'); [[ $st == "HTTP/1.1 400 "* ]]; ok $? "a garbage request line: $st"
st=$(raw "$A" 'b"GET /metrics HTTP/1.1\r\nX-Big: " + b"a" * 200000 + b"\r\n\r\n"')
[[ $st == "HTTP/1.1 431 "* ]]; ok $? "200 kB of header: $st"
st=$(raw "$A" 'b"GET /metrics HTTP/3.0\r\n\r\n"'); [[ $st == "HTTP/1.1 400 "* ]]; ok $? "an unknown HTTP version: $st"
code=$(curl -s -o /dev/null -w '%{http_code}' "http://$A/nope"); [ "$code" = 404 ]; ok $? "an unknown path: $code"
code=$(curl -s -o /dev/null -D "$T/h405" -w '%{http_code}' -X POST -d x=1 "http://$A/metrics")
[ "$code" = 405 ] && grep -qi "^allow: GET, HEAD" "$T/h405"; ok $? "POST: $code with Allow: GET, HEAD"
code=$(curl -s -0 -o "$T/s10" -w '%{http_code}' "http://$A/metrics?x=1") && [ "$code" = 200 ] &&
	"$PY" "$CHECK" parse "$T/s10"
ok $? "HTTP/1.0 with a query string: 200 and parses"
[ "$(curl -s -I "http://$A/metrics" | head -1 | tr -d '\r')" = "HTTP/1.1 200 OK" ] &&
	[ -z "$(curl -s -X HEAD -m 5 "http://$A/metrics" 2>/dev/null)" ]
ok $? "HEAD: 200 without a body"
# A client that connects and sends nothing: others are served meanwhile, it
# is answered 408 (or closed) after the 5 s deadline.
"$PY" - "$A" >"$T/silent" 2>&1 <<'EOF' &
import socket, sys, time
host, port = sys.argv[1].rsplit(":", 1)
s = socket.create_connection((host, int(port)))
t0 = time.time()
s.settimeout(15)
try:
    data = s.recv(4096)
except OSError as e:
    data = repr(e).encode()
first = data.split(b"\r\n")[0].decode(errors="replace") or "(closed)"
print(f"{time.time() - t0:.1f} {first}")
EOF
spid=$!
sleep 0.5
t0=$(date +%s%N)
curl -sSf -m 3 -o "$T/s11" "http://$A/metrics"; rc=$?
ms=$((($(date +%s%N) - t0) / 1000000))
[ $rc -eq 0 ]; ok $? "a silent client does not block the endpoint (a scrape took $ms ms)"
wait "$spid"
read -r secs line <"$T/silent"
[[ $line == "HTTP/1.1 408 "* || $line == "(closed)" ]] && "$PY" -c "import sys; sys.exit(not 4 <= float(sys.argv[1]) <= 8)" "$secs"
ok $? "the silent client: '$line' after $secs s"
# More idle connections than the endpoint keeps: the extra ones are closed.
"$PY" - "$A" <<'EOF'
import socket, sys
host, port = sys.argv[1].rsplit(":", 1)
conns = [socket.create_connection((host, int(port))) for _ in range(24)]
closed = 0
for s in conns[16:]:
    s.settimeout(2)
    try:
        closed += s.recv(1) == b""
    except ConnectionResetError:
        closed += 1
    except OSError:
        pass
for s in conns:
    s.close()
sys.exit(0 if closed == 8 else 1)
EOF
ok $? "24 idle connections at once: the 8 beyond 16 are closed at once"
sleep 0.3
kill -0 "$on" 2>/dev/null && curl -sSf -o "$T/s12" "http://$A/metrics" && "$PY" "$CHECK" parse "$T/s12"
ok $? "after all that the daemon is alive and serves a parseable scrape"
bad=1
for c in 400 404 405 408 431 503; do
	v=$("$PY" "$CHECK" value "$T/s12" kcoll_metrics_requests_total code=$c) && [ "${v:-0}" -ge 1 ] || bad=0
done
[ $bad -eq 1 ]; ok $? "kcoll_metrics_requests_total counted each error code (400 404 405 408 431 503)"
"$B/bin/kcoll-bench" allreduce -N 2 -b 1K -e 64K -n 2 -w 1 -s "$T/on.sock" >/dev/null 2>&1
ok $? "collectives still run on that daemon"
stop "$on"; ok $? "that kcolld exits 0 on SIGTERM (under ASan: no leak, no error)"

# --- a bare port, and the textfile ------------------------------------------------
port=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
start file KCOLL_METRICS="$port" KCOLL_METRICS_FILE="$T/kcoll.prom" KCOLL_METRICS_INTERVAL=1 ||
	{ echo "Bail out! kcolld did not start"; cat "$T/file.log"; exit 1; }
fpid=$dpid
[ "$(json_field "$T/file.sock" metrics)" = "127.0.0.1:$port" ] && curl -sSf -o /dev/null "http://127.0.0.1:$port/metrics"
ok $? "KCOLL_METRICS=$port (a bare port) serves on 127.0.0.1:$port"
for _ in $(seq 50); do [ -s "$T/kcoll.prom" ] && break; sleep 0.1; done
"$PY" "$CHECK" parse "$T/kcoll.prom" "$DOC"; ok $? "KCOLL_METRICS_FILE: the textfile parses"
"$B/bin/kcoll-bench" allreduce -N 2 -b 4K -e 4K -n 3 -w 0 -c 0 -s "$T/file.sock" >/dev/null 2>&1
sleep 2.5
v=$("$PY" "$CHECK" value "$T/kcoll.prom" kcoll_ops_total op=allreduce status=ok)
[ "$v" = 3 ] && [ ! -e "$T/kcoll.prom.tmp" ]
ok $? "the textfile is rewritten every second (all-reduce ops now $v, want 3), no .tmp left"
stop "$fpid" && "$PY" "$CHECK" parse "$T/kcoll.prom" && [ ! -e "$T/kcoll.prom.tmp" ]
ok $? "SIGTERM: kcolld exits 0 and leaves a final parseable textfile"

echo "1..$n"
exit $failed
