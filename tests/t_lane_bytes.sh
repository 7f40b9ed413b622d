#!/usr/bin/env bash
# The lanes' size limit (KD_LANE_MAX_BYTES, 1 MiB) is one limit everywhere:
# kcolld started with more KCOLL_LANE_BYTES logs a warning naming the knob,
# the value and the limit, starts and uses the limit; kcollctl set refuses
# more; a member daemon fails a communicator whose root sends a TABLE with
# more (-EPROTO, saying why) and accepts one at the limit (answers READY).
# A lane HELLO that the daemon cannot take is refused with a REJECT saying
# why (net_lane.c, through net.c's HELLO kind table), for each of its
# refusals: no communicator forming with that token; a host not before us,
# a wrong nonce, or a communicator without lanes ("unexpected connection");
# a second lane from the same host ("duplicate lane").
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
# Writes its port to $1.port, then "ready" or "eof" to $1. With $3, the
# member daemon's port: on READY, before its REJECT, it sends that daemon
# the lane HELLOs of "host not before us", "wrong nonce" and two lanes from
# host 0 (one is taken: it stays open until the comm fails; the other is a
# duplicate), and writes what each got to $1.lanes.
fake_root() {
	python3 - "$@" <<'PY'
import select, socket, struct, sys
out, lane = sys.argv[1], int(sys.argv[2])
dport = int(sys.argv[3]) if len(sys.argv) > 3 else 0
MAGIC = 0x6b63706e
HELLO, REJECT, REGISTER, TABLE, READY = 1, 2, 3, 4, 5
VERSION, LANE, ROOT_NONCE = 3, 5, 0x1234
def lane_hello(token, host, nonce):
    s = socket.create_connection(("127.0.0.1", dport), timeout=30)
    body = struct.pack("<II", VERSION, LANE) + token + struct.pack("<IIQ", host, 0, nonce)
    s.sendall(struct.pack("<IHHII", MAGIC, HELLO, 0, 16 + len(body), 0) + body)
    return s
def lane_answer(s):	# the daemon's word, or none before it closed
    b = b""
    try:
        while len(b) < 16 + 128:
            d = s.recv(16 + 128 - len(b))
            if not d:
                break
            b += d
    except socket.timeout:
        return "no answer in 30 s"
    s.close()
    if len(b) < 16:
        return "closed without a reply"
    t = struct.unpack("<IHHII", b[:16])[1]
    return "type %d: %s" % (t, b[16:].split(b"\0")[0].decode(errors="replace"))
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
            root = struct.pack("<QHH4I4B48s", ROOT_NONCE, 1, 1,
                               struct.unpack("<I", socket.inet_aton("127.0.0.1"))[0], 0, 0, 0,
                               8, 0, 0, 0, b"fake-root")
            # token, nranks, nhosts, you, nstreams, algo, piece, lane_bytes, reserved
            tab = token + struct.pack("<8I", nranks, 2, 1, 1, 0, 1 << 20, lane, 0)
            tab += root + me + struct.pack("<%dH" % nranks, *[0] * (nranks - 1), 1)
            c.sendall(msg(TABLE, tab))
        elif t == READY:
            result = "ready"
            if dport:
                got = {}
                for name, host, nonce in (("host 1", 1, ROOT_NONCE), ("nonce", 0, ROOT_NONCE + 1)):
                    got[name] = lane_answer(lane_hello(token, host, nonce))
                pair = [lane_hello(token, 0, ROOT_NONCE) for _ in range(2)]
                # Which of the two the daemon takes is its business: the
                # duplicate is answered at once, the lane taken is closed
                # when the comm fails at our REJECT. That REJECT must wait
                # until the daemon has read both HELLOs (a slow daemon, as
                # under ASan, would else see the comm end first): until a
                # reply is there (a comm with lanes) or two (one without).
                want = 1 if lane else 2
                for _ in range(300):
                    r, _, _ = select.select(pair, [], [], 0.1)
                    if len(r) >= want:
                        break
                c.sendall(msg(REJECT, b"fake root: test done".ljust(128, b"\0")))
                got["pair"] = " + ".join(sorted(lane_answer(s) for s in pair))
                open(out + ".lanes", "w").write("".join("%s: %s\n" % kv for kv in got.items()))
            else:
                c.sendall(msg(REJECT, b"fake root: test done".ljust(128, b"\0")))
            break
except (EOFError, ConnectionError, socket.timeout):
    pass
open(out, "w").write(result)
PY
}

# One case: a fake root giving lane_bytes $1 (and sending lanes to our
# kcolld's port $2, if given); prints mh_rank's init line (rank 1 of 2 on
# our kcolld, rank 0 "on" the fake root).
table_case() {
	local f="$T/root.$1" id
	rm -f "$f" "$f.port" "$f.lanes"
	fake_root "$f" "$@" &
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
port=$("$B/bin/kcollctl" -s "$SOCK" status --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["net"]["port"])')
out=$(table_case $MAX "$port")
r=$(cat "$T/root.$MAX" 2>/dev/null)
grep -q "name=ECONNREFUSED" <<<"$out" && [ "$r" = ready ]
ok $? "a TABLE with lane_bytes $MAX: the member takes it and answers READY ($out; root saw: $r)"

# The lanes a forming comm with lanes refuses (net_lane.c's -EPROTO and
# -EEXIST), each with a REJECT naming why; the root (host 0) is before us.
lanes="$T/root.$MAX.lanes"
lane_got() { sed -n "s/^$1: //p" "$lanes" 2>/dev/null; }
got=$(lane_got "host 1")
[ "$got" = "type 2: unexpected connection (kind 5, host 1, stream 0)" ]
ok $? "a lane HELLO from a host not before us: REJECT, saying why ($got)"
got=$(lane_got nonce)
[ "$got" = "type 2: unexpected connection (kind 5, host 0, stream 0)" ]
ok $? "a lane HELLO with another nonce than the host's: REJECT, saying why ($got)"
got=$(lane_got pair)
[ "$got" = "closed without a reply + type 2: duplicate lane" ]
ok $? "two lanes from one host: one taken, the other a REJECT saying why ($got)"
out=$(table_case 0 "$port")
got=$(sed -n "s/^pair: //p" "$T/root.0.lanes" 2>/dev/null)
r=$(cat "$T/root.0" 2>/dev/null)
[ "$got" = "type 2: unexpected connection (kind 5, host 0, stream 0) + type 2: unexpected connection (kind 5, host 0, stream 0)" ] &&
	[ "$r" = ready ]
ok $? "a lane HELLO for a comm without lanes: REJECT, saying why ($got; root saw: $r)"

# A lane (KD_CONN_LANE) goes through the HELLO kind table (net_lane.c): one
# for a token no communicator here forms with is refused with a REJECT
# saying why, and counted as rejected.
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
