#!/usr/bin/env bash
# The lanes' size limit (KD_LANE_MAX_BYTES, 1 MiB) is one limit everywhere:
# kcolld started with more KCOLL_LANE_BYTES logs a warning naming the knob,
# the value and the limit, starts and uses the limit; kcollctl set refuses
# more; a member daemon fails a communicator whose root sends a TABLE with
# more (-EPROTO, saying why) and accepts one at the limit (answers READY).
# A lane HELLO that no forming communicator here expects is refused with a
# REJECT saying why (net_lane.c, through net.c's HELLO kind table).
# The root here is a fake one (python, on loopback) that the id names.
# No netns, no root needed. TAP.
set -u
B=${KCOLL_BUILD:?run through tests/run.sh}
T=$(mktemp -d "${KCOLL_TEST_TMP:-/tmp}/lanebytes.XXXXXX")
pid=
trap '[ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null && wait "$pid"; rm -rf "$T"' EXIT
n=0
ok() { n=$((n + 1)); if [ "$1" -eq 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; fi; }
MAX=1048576
SOCK="$T/d.sock"

KCOLL_LANE_BYTES=$((2 * MAX)) KCOLL_LISTEN=127.0.0.1:0 "$B/bin/kcolld" -f -s "$SOCK" -l "$T/d.log" &
pid=$!
for _ in $(seq 300); do [ -S "$SOCK" ] && break; sleep 0.1; done
kill -0 "$pid" 2>/dev/null && [ -S "$SOCK" ]; ok $? "kcolld starts with KCOLL_LANE_BYTES=$((2 * MAX))"
# The socket exists before the network starts (and warns); kcolld answers
# status only once start-up is done: ask first, then read the log.
got=$("$B/bin/kcollctl" -s "$SOCK" status --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["net"]["lane_bytes"])')
grep -q "KCOLL_LANE_BYTES=$((2 * MAX)) is over the limit of $MAX" "$T/d.log"
ok $? "start-up warns, naming the knob, the value and the limit"
[ "$got" = "$MAX" ]; ok $? "and uses the limit (status --json net.lane_bytes: $got)"
msg=$("$B/bin/kcollctl" -s "$SOCK" set lane_bytes $((MAX + 1)) 2>&1); rc=$?
[ $rc -ne 0 ] && grep -q "0 (off) .. $MAX" <<<"$msg"; ok $? "kcollctl set lane_bytes $((MAX + 1)) is refused, naming the same limit"
"$B/bin/kcollctl" -s "$SOCK" set lane_bytes $MAX >/dev/null 2>&1; ok $? "kcollctl set lane_bytes $MAX is taken"

# A fake root daemon: answers the member's REGISTER with a TABLE giving
# lane_bytes $2, then waits for READY (answering REJECT to end it) or EOF.
# Writes its port to $1.port, then "ready" or "eof" to $1.
fake_root() {
	python3 - "$@" <<'PY'
import socket, struct, sys
out, lane = sys.argv[1], int(sys.argv[2])
MAGIC = 0x6b63706e
HELLO, REJECT, REGISTER, TABLE, READY = 1, 2, 3, 4, 5
ls = socket.socket()
ls.bind(("127.0.0.1", 0))
ls.listen(1)
ls.settimeout(60)
open(out + ".port", "w").write(str(ls.getsockname()[1]))
c, _ = ls.accept()
c.settimeout(60)
def recv(n):
    b = b""
    while len(b) < n:
        d = c.recv(n - len(b))
        if not d:
            raise EOFError
        b += d
    return b
def msg(t, body):
    return struct.pack("<IHHII", MAGIC, t, 0, 16 + len(body), 0) + body
result = "eof"
try:
    while True:
        magic, t, _, ln, _ = struct.unpack("<IHHII", recv(16))
        body = recv(ln - 16)
        if t == REGISTER:
            token, nranks, rank = body[:32], *struct.unpack("<II", body[32:40])
            me = body[40:120]	# the member's kd_p_hostinfo
            root = struct.pack("<QHH4I4B48s", 0x1234, 1, 1,
                               struct.unpack("<I", socket.inet_aton("127.0.0.1"))[0], 0, 0, 0,
                               8, 0, 0, 0, b"fake-root")
            # token, nranks, nhosts, you, nstreams, algo, piece, lane_bytes, reserved
            tab = token + struct.pack("<8I", nranks, 2, 1, 1, 0, 1 << 20, lane, 0)
            tab += root + me + struct.pack("<%dH" % nranks, *[0] * (nranks - 1), 1)
            c.sendall(msg(TABLE, tab))
        elif t == READY:
            result = "ready"
            c.sendall(msg(REJECT, b"fake root: test done".ljust(128, b"\0")))
            break
except (EOFError, ConnectionError, socket.timeout):
    pass
open(out, "w").write(result)
PY
}

# One case: a fake root giving lane_bytes $1; prints mh_rank's init line
# (rank 1 of 2 on our kcolld, rank 0 "on" the fake root).
table_case() {
	local f="$T/root.$1" id
	rm -f "$f" "$f.port"
	fake_root "$f" "$1" &
	local fp=$!
	for _ in $(seq 300); do [ -s "$f.port" ] && break; sleep 0.1; done
	id=$(KCOLL_SOCKET="$SOCK" "$B/tests/mh_rank" id) || { kill $fp; echo "init err=none (no id)"; return; }
	# The id names the fake root: another nonce, its port, 127.0.0.1.
	id=$(python3 - "$id" "$(cat "$f.port")" <<'PY'
import socket, struct, sys
b = bytearray(bytes.fromhex(sys.argv[1]))
struct.pack_into("<QIHH", b, 40, 0x1234, 0, int(sys.argv[2]), 1)
b[56:60] = socket.inet_aton("127.0.0.1")
print(b.hex())
PY
)
	KCOLL_SOCKET="$SOCK" timeout 120 "$B/tests/mh_rank" init "$id" 2 1 2>"$f.err"
	sed 's/^/# /' "$f.err" >&2
	wait $fp
}

out=$(table_case $((MAX + 1)))
r=$(cat "$T/root.$((MAX + 1))" 2>/dev/null)
grep -q "name=EPROTO" <<<"$out" && [ "$r" = eof ]
ok $? "a TABLE with lane_bytes $((MAX + 1)): the member fails the comm with EPROTO, no READY ($out; root saw: $r)"
grep -q "gives lanes of $((MAX + 1)) bytes, over the limit $MAX" "$T/d.log"
ok $? "and its log says why"
out=$(table_case $MAX)
r=$(cat "$T/root.$MAX" 2>/dev/null)
grep -q "name=ECONNREFUSED" <<<"$out" && [ "$r" = ready ]
ok $? "a TABLE with lane_bytes $MAX: the member takes it and answers READY ($out; root saw: $r)"

# A lane (KD_CONN_LANE) goes through the HELLO kind table (net_lane.c): one
# for a token no communicator here forms with is refused with a REJECT
# saying why, and counted as rejected.
port=$("$B/bin/kcollctl" -s "$SOCK" status --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["net"]["port"])')
before=$("$B/bin/kcollctl" -s "$SOCK" status --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["net"]["rejected"])')
got=$(python3 - "$port" <<'PY'
import os, socket, struct, sys
MAGIC, HELLO, REJECT, VERSION, LANE = 0x6b63706e, 1, 2, 3, 5
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=30)
body = struct.pack("<II", VERSION, LANE) + os.urandom(32) + struct.pack("<IIQ", 0, 0, 1)
c.sendall(struct.pack("<IHHII", MAGIC, HELLO, 0, 16 + len(body), 0) + body)
b = b""
while len(b) < 16 + 128:
    d = c.recv(16 + 128 - len(b))
    if not d:
        break
    b += d
if len(b) < 16:
    print("closed without a reply")
else:
    t = struct.unpack("<IHHII", b[:16])[1]
    print("type %d: %s" % (t, b[16:].split(b"\0")[0].decode(errors="replace")))
PY
)
after=$("$B/bin/kcollctl" -s "$SOCK" status --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["net"]["rejected"])')
[ "$got" = "type 2: no communicator here is forming with that token" ] && [ "$after" = $((before + 1)) ]
ok $? "a lane HELLO for an unknown token: REJECT, saying why ($got), rejected $before -> $after"
kill -TERM "$pid"; wait "$pid"; ok $? "kcolld exits 0 on SIGTERM"
pid=
echo "1..$n"
