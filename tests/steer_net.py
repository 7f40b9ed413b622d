#!/usr/bin/env python3
"""Streams for tests/t_bpf_steer.sh (not a test by itself).

  steer_net.py serve ADDR PORT PROGRESS   accept one connection; while receiving,
                                          keep the byte count in PROGRESS; at EOF
                                          print "BYTES SHA256 LOCAL PEER"
  steer_net.py send ADDR PORT STOP RATE   send pseudo-random data at most RATE
                                          bytes/s until the file STOP exists, then
                                          close and print "BYTES SHA256"
  steer_net.py udp-recv ADDR PORT COUNT   receive COUNT datagrams (5 s idle timeout);
                                          print "GOOD SOURCES" (GOOD: payloads intact)
  steer_net.py udp-send ADDR PORT COUNT   send COUNT numbered 1000-byte datagrams
Any socket error ends the program with status 1 and the error on stderr.
"""
import hashlib
import os
import random
import socket
import sys
import time


def serve(addr, port, progress):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port))
    s.listen(1)
    s.settimeout(30)
    c, peer = s.accept()
    c.settimeout(30)
    h, n, last = hashlib.sha256(), 0, 0.0
    while True:
        d = c.recv(1 << 20)
        if not d:
            break
        h.update(d)
        n += len(d)
        now = time.monotonic()
        if now - last > 0.05:
            with open(progress + ".tmp", "w") as f:
                f.write("%d\n" % n)
            os.replace(progress + ".tmp", progress)
            last = now
    with open(progress, "w") as f:
        f.write("%d\n" % n)
    print(n, h.hexdigest(), c.getsockname()[0], peer[0])


def send(addr, port, stop, rate):
    rng = random.Random(port)
    chunk = 64 << 10
    blocks = [rng.randbytes(chunk) for _ in range(16)]
    s = socket.create_connection((addr, port), timeout=30)
    h, n, i, t0 = hashlib.sha256(), 0, 0, time.monotonic()
    while not os.path.exists(stop):
        b = blocks[i % len(blocks)][i % 977:]
        i += 1
        s.sendall(b)
        h.update(b)
        n += len(b)
        ahead = n / rate - (time.monotonic() - t0)
        if ahead > 0:
            time.sleep(ahead)
    s.shutdown(socket.SHUT_WR)
    s.recv(1)  # wait for the receiver to close: everything arrived
    s.close()
    print(n, h.hexdigest())


def payload(i):
    return (b"%08d" % i) * 125


def udp_recv(addr, port, count):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    # room for every datagram even if this process is not scheduled while
    # they arrive (a busy machine): the test judges steering, not the
    # receiver's scheduling (SO_RCVBUFFORCE as root, else up to rmem_max)
    try:
        s.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_RCVBUFFORCE", 33), 4 << 20)
    except OSError:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    s.bind((addr, port))
    s.settimeout(5)
    good, srcs = 0, set()
    try:
        for _ in range(count):
            d, src = s.recvfrom(2048)
            srcs.add(src[0])
            if d == payload(int(d[:8])):
                good += 1
    except socket.timeout:
        pass
    print(good, ",".join(sorted(srcs)))


def udp_send(addr, port, count):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for i in range(count):
        s.sendto(payload(i), (addr, port))
        time.sleep(0.001)


def main(a):
    if a[0] == "serve":
        serve(a[1], int(a[2]), a[3])
    elif a[0] == "send":
        send(a[1], int(a[2]), a[3], float(a[4]))
    elif a[0] == "udp-recv":
        udp_recv(a[1], int(a[2]), int(a[3]))
    elif a[0] == "udp-send":
        udp_send(a[1], int(a[2]), int(a[3]))
    else:
        sys.exit("unknown command " + a[0])


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except OSError as e:
        sys.exit("steer_net.py: %s" % e)
