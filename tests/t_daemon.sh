#!/usr/bin/env bash
# kcolld and kcollctl as a person or a script meets them: usage errors,
# daemonizing, pid file, SIGTERM, a second daemon on a live socket, a stale
# socket, status and config in both formats. TAP.
set -u
B=${KCOLL_BUILD:?run through tests/run.sh}
T=$(mktemp -d "${KCOLL_TEST_TMP:-/tmp}/daemon.XXXXXX")
n=0 failed=0
ok() { n=$((n + 1)); if [ "$1" -eq 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; failed=1; fi; }
cleanup() { local p; p=$(cat "$T/d.pid" 2>/dev/null) && kill -KILL "$p" 2>/dev/null; rm -rf "$T"; }
trap cleanup EXIT

"$B/bin/kcolld" --help | grep -q "Usage: kcolld"; ok $? "kcolld --help prints usage"
"$B/bin/kcolld" --bogus >/dev/null 2>&1; [ $? -eq 2 ]; ok $? "kcolld: unknown option exits 2"
"$B/bin/kcolld" -L loud -f 2>&1 | grep -q "unknown log level"; ok $? "kcolld: bad log level is named"
"$B/bin/kcollctl" >/dev/null 2>&1; [ $? -eq 2 ]; ok $? "kcollctl without a command exits 2"
err=$("$B/bin/kcollctl" frobnicate 2>&1 >/dev/null); rc=$?
[ $rc -eq 2 ] && [ "$(wc -l <<<"$err")" -eq 1 ] && grep -q "unknown command 'frobnicate'.*--help" <<<"$err"
ok $? "kcollctl: unknown command exits 2 with one line naming it and --help (got $rc: $err)"
err=$("$B/bin/kcollctl" status extra 2>&1 >/dev/null); rc=$?
[ $rc -eq 2 ] && [ "$(wc -l <<<"$err")" -eq 1 ] && grep -q "unexpected argument 'extra'.*--help" <<<"$err"
ok $? "kcollctl: an extra argument exits 2 with one line naming it (got $rc: $err)"
out=$("$B/bin/kcollctl" plan --local 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "local goes with 'anomalies' and 'events'" <<<"$out"
ok $? "kcollctl: --local with another command than anomalies or events exits 2 and says why"
out=$("$B/bin/kcollctl" -s "$T/none.sock" status 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "is it running" <<<"$out"; ok $? "kcollctl: no daemon -> exit 1 and what to do"

"$B/bin/kcolld" -s "$T/d.sock" -l "$T/d.log" -p "$T/d.pid"; rc=$?
[ $rc -eq 0 ]; ok $? "kcolld daemonizes (parent exits 0)"
for _ in $(seq 300); do [ -S "$T/d.sock" ] && [ -s "$T/d.pid" ] && break; sleep 0.1; done
pid=$(cat "$T/d.pid" 2>/dev/null)
[ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; ok $? "pid file names a live daemon"
[ "$(stat -c %a "$T/d.sock" 2>/dev/null)" = 666 ]; ok $? "socket is connectable by every local user (0666)"

"$B/bin/kcollctl" -s "$T/d.sock" status | grep -q "kcolld 1"; ok $? "kcollctl status (table)"
"$B/bin/kcollctl" -s "$T/d.sock" status --json | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["pid"] > 0 and "counters" in d and "communicators" in d'
ok $? "kcollctl status --json parses and has pid, counters, communicators"
# A communicator's state through its life (tests/python/comm_state.py; the
# python and ASan preload of the python tests, cluster_lib.sh).
cs=0
while IFS=$'\t' read -r res what; do
	cs=$((cs + 1))
	[ "$res" = ok ]; ok $? "comm state: $what"
done < <(. "$KCOLL_TOP/tests/cluster_lib.sh"; pick_python
	 py_asan_preload || { echo "$why" >"$T/cs.err"; exit; }
	 KCOLL_SOCKET="$T/d.sock" PYTHONPATH="$KCOLL_TOP/user/python" KCOLL_LIB="$B/lib/libkcoll.so.1" \
		 exec timeout -k 5 90 "$PY" "$KCOLL_TOP/tests/python/comm_state.py" "$B/bin/kcollctl" \
		 "$T/d.sock" 2>"$T/cs.err")
[ $cs -eq 10 ]; ok $? "comm state: all 10 checks ran (ran $cs; stderr: $(tail -c 300 "$T/cs.err" | tr '\n' ' '))"
"$B/bin/kcollctl" config --json | python3 -c 'import json,sys; k={x["name"] for x in json.load(sys.stdin)}; assert "KCOLL_TIMEOUT_MS" in k and "KCOLL_SOCKET" in k'
ok $? "kcollctl config --json lists the knobs"
KCOLL_SPIN_US=7 "$B/bin/kcollctl" config | grep -E "^KCOLL_SPIN_US +7 .*\[set\]" -q; ok $? "kcollctl config shows a knob set in the environment"

"$B/bin/kcollctl" gpu --json >"$T/gpu.json"; rc=$?
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); sys.exit(0 if d["usable"] == (sys.argv[2] == "0") else 1)' "$T/gpu.json" $rc
ok $? "kcollctl gpu --json: valid JSON whose 'usable' matches the exit status ($rc)"

out=$("$B/bin/kcolld" -f -s "$T/d.sock" 2>&1); rc=$?
[ $rc -ne 0 ] && grep -q "already listening" <<<"$out"; ok $? "a second kcolld on a live socket refuses, saying why"
kill -0 "$pid" 2>/dev/null; ok $? "the first daemon is untouched"

kill -TERM "$pid"
for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
! kill -0 "$pid" 2>/dev/null; ok $? "SIGTERM: daemon exits"
[ ! -e "$T/d.sock" ] && [ ! -e "$T/d.pid" ]; ok $? "SIGTERM: socket and pid file removed"
grep -q "draining and exiting" "$T/d.log"; ok $? "SIGTERM: the log says it drained"

# A stale socket file (nobody listening) is replaced.
python3 -c 'import socket,sys; s=socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET); s.bind(sys.argv[1])' "$T/stale.sock"
"$B/bin/kcolld" -s "$T/stale.sock" -l "$T/s.log" -p "$T/d.pid"
for _ in $(seq 300); do "$B/bin/kcollctl" -s "$T/stale.sock" status >/dev/null 2>&1 && break; sleep 0.1; done
"$B/bin/kcollctl" -s "$T/stale.sock" status >/dev/null 2>&1; ok $? "a stale socket file is replaced"
kill -TERM "$(cat "$T/d.pid")" 2>/dev/null
echo "1..$n"
exit $failed
