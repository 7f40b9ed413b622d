#!/usr/bin/env python3
"""Known traffic for tests/t_bpf.sh (not a test by itself).

  bpf_net.py serve-tcp ADDR PORT            accept one connection, print bytes received
  bpf_net.py send-tcp ADDR PORT BYTES       connect, send BYTES, close
  bpf_net.py send-udp ADDR PORT COUNT SIZE  send COUNT datagrams of SIZE bytes
  bpf_net.py flow JSON PROTO RPORT FIELD    FIELD of the flow to RPORT (or LPORT) in
                                            'kcoll-bpf flows --json' output (0 if none)
  bpf_net.py dump DUMP PROTO PORT FIELD     same, from 'bpftool map dump pinned .../flows'
"""
import json
import socket
import sys


def main(a):
    cmd = a[0]
    if cmd == "serve-tcp":
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((a[1], int(a[2])))
        s.listen(1)
        s.settimeout(20)
        c, _ = s.accept()
        c.settimeout(20)
        n = 0
        while True:
            d = c.recv(1 << 20)
            if not d:
                break
            n += len(d)
        print(n)
    elif cmd == "send-tcp":
        s = socket.create_connection((a[1], int(a[2])), timeout=20)
        left = int(a[3])
        buf = b"k" * (1 << 20)
        while left:
            k = min(left, len(buf))
            s.sendall(buf[:k])
            left -= k
        s.shutdown(socket.SHUT_WR)
        s.recv(1)  # wait for the peer's close: everything was delivered
        s.close()
    elif cmd == "send-udp":
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        d = b"u" * int(a[4])
        for _ in range(int(a[3])):
            s.sendto(d, (a[1], int(a[2])))
    elif cmd in ("flow", "dump"):
        proto = {"tcp": 6, "udp": 17}[a[2]]
        port, field = int(a[3]), a[4]
        with open(a[1]) as f:
            doc = json.load(f)
        total = 0
        if cmd == "flow":
            for fl in doc["flows"]:
                if fl["proto"] == a[2] and port in (fl["rport"], fl["lport"]):
                    total += fl[field]
        else:
            for e in doc:
                k, v = e["key"], e["value"]
                if k["proto"] == proto and port in (k["rport"], k["lport"]):
                    total += v[field]
        print(total)
    else:
        sys.exit("bpf_net.py: unknown command " + cmd)


if __name__ == "__main__":
    main(sys.argv[1:])
