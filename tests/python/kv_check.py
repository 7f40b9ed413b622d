# SPDX-License-Identifier: MIT
"""Checks of kcoll.kv (the Python KV-transfer agent) against the kcolld at
$KCOLL_SOCKET; tests/t_python_kv.sh runs it and numbers the lines.

  kv_check.py local          one host: integrity of every byte (malloc'd and
                             kcolld-mapped memory, > 4096 blocks, merging),
                             notifications once and in order per sender,
                             errors as exceptions that write nothing, the GIL
  kv_check.py owner DIR N [mapped]
                             host 0 of a pair: a segment, its descriptor in
                             DIR/desc; N tagged batches, every byte checked
  kv_check.py init DIR N [mapped]
                             host 1: N batches of random blocks with a tag each
  mapped: both segments in memory kcolld maps (Agent.alloc), which kcolld
  moves over RDMA where it has a device (tests/vm/t_kv_rdma.sh); else numpy
  arrays of malloc'd memory, moved over TCP.

Prints "ok - ..." / "not ok - ..." lines.
"""
import errno
import os
import signal
import sys
import threading
import time

import numpy as np

import kcoll
import kcoll.kv as kv

failed = 0


def check(cond, what, detail=""):
    global failed
    failed += not cond
    print(f"{'ok' if cond else 'not ok'} - {what}{' (' + detail + ')' if detail else ''}", flush=True)
    return cond


def raises(code, fn, what):
    """fn() must raise KcollError with code (negative errno) and its sentence."""
    try:
        fn()
    except kcoll.KcollError as e:
        return check(e.code == code and e.strerror and e.strerror in str(e), what,
                     f"{errno.errorcode.get(-e.code)}: {e.strerror}")
    except Exception as e:
        return check(False, what, f"raised {e!r}")
    return check(False, what, "no exception")


def says(code, fn, words, what):
    """raises(), and the message names what is wrong: every one of words."""
    try:
        fn()
    except kcoll.KcollError as e:
        return check(e.code == code and all(w in str(e) for w in words), what, str(e))
    except Exception as e:
        return check(False, what, f"raised {e!r}")
    return check(False, what, "no exception")


def ranges(starts, lens):
    """Every index of the blocks [start, start + len), block after block."""
    starts = starts.astype(np.int64)
    lens = lens.astype(np.int64)
    first = np.cumsum(lens) - lens
    return np.arange(int(lens.sum())) - np.repeat(first, lens) + np.repeat(starts, lens)


def random_blocks(rng, n, src_size, dst_size, maxlen):
    """n blocks, destinations disjoint (in order with gaps, then shuffled),
    sources anywhere: (local, remote, len) arrays."""
    ln = rng.integers(1, maxlen + 1, n)
    gaps = rng.integers(0, maxlen + 1, n)
    ro = np.cumsum(gaps + ln) - ln
    keep = ro + ln <= dst_size
    ln, ro = ln[keep], ro[keep]
    lo = rng.integers(0, src_size - ln + 1)
    p = rng.permutation(len(ln))
    return lo[p], ro[p], ln[p]


def ten_batches(agent, seg, rem):
    """Submit 10 one-block batches at once (the first 8 tagged m0..m7, the
    last 2 untagged), each bumping counter 0; each one's end state or errno."""
    reqs = [agent.write(seg, rem, [(k << 12, k << 12, 4096)], notify=0,
                        msg=(b"m%d" % k) if k < 8 else None) for k in range(10)]
    res = []
    for r in reqs:
        try:
            r.wait(timeout=30)
            res.append(r.state())
        except kcoll.KcollError as e:
            res.append(errno.errorcode.get(-e.code, e.code))
    return res


def local():
    rng = np.random.default_rng(7)
    owner, init = kv.Agent("owner"), kv.Agent("init")
    size = 8 << 20

    # ---- integrity, each memory kind on either side
    for dkind in ("malloc", "mapped"):
        for skind in ("malloc", "mapped"):
            if dkind == "malloc":
                dst = np.zeros(size, np.uint8)
                dseg = owner.register(dst, nr_notify=2)
            else:
                dst, dseg = owner.alloc(size, nr_notify=2)
                dst[:] = 0
            if skind == "malloc":
                src = np.empty(size, np.uint8)
                sseg = init.register(src)
            else:
                src, sseg = init.alloc(size)
            src[:] = rng.integers(0, 256, size, dtype=np.uint8)
            rem = init.import_desc(dseg.desc)
            lo, ro, ln = random_blocks(rng, 12000, size, size, 600)
            t0 = time.monotonic()
            req = init.write(sseg, rem, (lo, ro, ln), notify=0, msg=f"w-{dkind}-{skind}")
            ok = req.wait(timeout=60)
            st = req.stats()
            want = np.zeros(size, np.uint8)
            want[ranges(ro, ln)] = src[ranges(lo, ln)]
            same = bool((want == dst).all())
            got = owner.get_notifs()
            check(ok and same and st["batches"] == 4 and st["entries"] == len(ln) and
                  got == {next(iter(got)): [f"w-{dkind}-{skind}".encode()]} and dseg.notify_get(0) == 1,
                  f"write {skind} -> {dkind}: {len(ln)} blocks in {st['batches'] - 1} batches + "
                  f"the tag after them, every one of {size} bytes",
                  f"{time.monotonic() - t0:.3f} s, state {st['state']}")
            # Read every written block back into a cleared source, each
            # to the local offset equal to its remote one (disjoint).
            src2 = src.copy()
            src[:] = 0
            req = init.read(sseg, rem, (ro, ro, ln), notify=1, msg=b"r")
            req.wait()
            back = np.zeros(size, np.uint8)
            back[ranges(ro, ln)] = dst[ranges(ro, ln)]
            check(bool((back == src).all()) and dseg.notify_wait(1, 1, 5) and
                  [n.msg for n in dseg.get_notifs()] == [b"r"],
                  f"read {dkind} -> {skind}: every byte back, counter and tag on the owner's side")
            src[:] = src2
            rem.close()
            sseg.close()
            dseg.close()

    # ---- merging: 1024 adjacent 4 KiB blocks are one entry
    dst = np.zeros(size, np.uint8)
    src = rng.integers(0, 256, size, dtype=np.uint8)
    dseg, sseg = owner.register(dst, nr_notify=1), init.register(src)
    rem = init.import_desc(dseg.desc)
    offs = np.arange(1024, dtype=np.uint64) * 4096
    req = init.write(sseg, rem, (offs, offs + 4096, 4096))
    req.wait()
    st = req.stats()
    check(st["entries"] == 1 and st["blocks"] == 1024 and
          bool((dst[4096:4096 + (4 << 20)] == src[:4 << 20]).all()) and not dst[:4096].any(),
          "1024 adjacent blocks merged into one entry, bytes in place", str(st))
    plan = kv.plan_blocks(np.array([[0, 100, 10], [10, 110, 5], [15, 200, 5]]), 1000, 1000)
    check(plan.tolist() == [[0, 100, 15], [15, 200, 5]], "plan_blocks merges only what is "
          "contiguous on both sides", str(plan.tolist()))

    # ---- errors: exceptions with the errno and kcoll_strerror's sentence; nothing written
    dst[:] = 0xAA
    snap = dseg.notify_get(0)
    raises(-errno.ERANGE, lambda: init.write(sseg, rem, [(0, size - 4, 8)]),
           "an entry past the remote end -> ERANGE")
    raises(-errno.ERANGE, lambda: init.write(sseg, rem, [(size, 0, 1)]),
           "an entry past the local end -> ERANGE")
    raises(-errno.ERANGE, lambda: init.write(sseg, rem, [(-1, 0, 1)]), "a negative offset -> ERANGE")
    raises(-errno.EINVAL, lambda: init.write(sseg, rem, [(0, 0, 8), (100, 4, 8)]),
           "overlapping destinations -> EINVAL")
    raises(-errno.EINVAL, lambda: init.write(sseg, rem, [(0, 0, 0)]), "a zero-length block -> EINVAL")
    # libkcoll refuses, numpy then says why: which blocks, how many.
    says(-errno.EINVAL, lambda: init.write(sseg, rem, [(0, 64, 8), (8, 0, 0), (200, 0, 8), (9, 9, 0)]),
         ["2 zero-length"], "zero lengths: counted (before the overlap)")
    says(-errno.EINVAL, lambda: init.write(sseg, rem, [(0, 64, 8), (100, 0, 8), (50, 4, 8)]),
         ["overlap", "block 1 (100, 0, 8)", "block 2 (50, 4, 8)"], "overlap: the two blocks named")
    says(-errno.EINVAL, lambda: init.read(sseg, rem, [(0, 0, 8), (4, 100, 8)]),
         ["overlap", "block 0", "block 1"], "a read: overlap at the local side")
    says(-errno.ERANGE, lambda: init.write(sseg, rem, [(0, 0, 8), (16, size - 4, 8)]),
         ["block 1 (16, %d, 8)" % (size - 4), "1 such block"], "out of range: the block named")
    raises(-errno.EMSGSIZE, lambda: init.send_notif(sseg, rem, b"x" * 513), "a 513-byte tag -> EMSGSIZE")
    raises(-errno.EINVAL, lambda: init.write(sseg, rem, [(0, 0, 8)], notify=5).wait(),
           "a counter the segment lacks -> EINVAL (from kcolld)")
    # Range errors inside the 4097th entry: nothing of the first 4096 is sent.
    bl = np.stack([np.arange(5000) * 2, np.arange(5000) * 2, np.ones(5000, np.int64)], axis=1)
    bl[4096, 1] = size
    raises(-errno.ERANGE, lambda: init.write(sseg, rem, bl), "entry 4097 of 5000 out of range -> ERANGE")
    bad = bytearray(dseg.desc)
    raises(-errno.EINVAL, lambda: init.import_desc(bad[:100]), "a truncated descriptor -> EINVAL")
    raises(-errno.EINVAL, lambda: init.import_desc(bytes(128)), "a zeroed descriptor -> EINVAL")
    tok = bytearray(dseg.desc)
    tok[56] ^= 0x01  # the first byte of the token (struct kcoll_seg_wire)
    raises(-errno.EACCES, lambda: init.import_desc(bytes(tok)),
           "a descriptor with a flipped token byte -> EACCES")
    check(bool((dst == 0xAA).all()) and dseg.notify_get(0) == snap and owner.get_notifs() == {},
          "after every refusal: nothing written, no counter, no tag")

    # ---- a dead owner: its process is killed with the segment imported
    rd, wr = os.pipe()
    pid = os.fork()
    if pid == 0:
        a = kv.Agent("doomed")
        buf = np.zeros(1 << 20, np.uint8)
        s = a.register(buf)
        os.write(wr, s.desc)
        time.sleep(60)
        os._exit(0)
    desc = os.read(rd, 128)
    drem = init.import_desc(desc)
    init.write(sseg, drem, [(0, 0, 64)]).wait()
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    err = None
    for _ in range(100):  # kcolld notices the death on its own time
        try:
            init.write(sseg, drem, [(0, 0, 64)], msg=b"dead?").wait()
        except kcoll.KcollError as e:
            err = e
            break
        time.sleep(0.05)
    # EIDRM once kcolld dropped the segment; ECONNRESET when the write
    # found the process gone first (docs/kv.md "Unregister and death").
    check(err is not None and err.code in (-errno.EIDRM, -errno.ECONNRESET) and
          err.strerror in str(err), "a dead owner -> EIDRM or ECONNRESET, with kcoll_strerror's "
          "sentence", str(err))
    drem.close()

    # ---- notifications: 3 senders x 120 tags, 8 batches in flight each;
    # exactly once, in order per sender, after their bytes
    dst[:] = 0
    nsend, per = 3, 120
    pids = []
    for i in range(nsend):
        pid = os.fork()
        if pid == 0:
            try:
                a = kv.Agent(f"s{i}")
                buf = np.full(per * 64, i + 1, np.uint8)
                s = a.register(buf)
                r = a.import_desc(dseg.desc)
                for j in range(0, per, 8):
                    reqs = [a.write(s, r, [((j + w) * 64, (i * per + j + w) * 64, 64)],
                                    msg=f"{i}:{j + w}") for w in range(8)]
                    for q in reqs:
                        q.wait()
                os._exit(0)
            except Exception as e:
                print(f"# sender {i}: {e!r}", flush=True)
                os._exit(1)
        pids.append(pid)
    seen, order_ok, late, total = {}, True, 0, 0
    t_end = time.monotonic() + 60
    while total < nsend * per and time.monotonic() < t_end:
        dseg.wait_notifs(0.5)
        for sender, msgs in owner.get_notifs().items():
            for m in msgs:
                i, j = map(int, m.decode().split(":"))
                first = seen.setdefault(i, (sender, -1))
                order_ok &= first[0] == sender and j == first[1] + 1
                seen[i] = (sender, j)
                late += int((dst[(i * per + j) * 64:(i * per + j + 1) * 64] != i + 1).sum())
                total += 1
    rcs = [os.waitpid(p, 0)[1] for p in pids]
    time.sleep(0.2)
    extra = owner.get_notifs()
    check(order_ok and total == nsend * per and not extra and not any(rcs) and late == 0 and
          len({s for s, _ in seen.values()}) == nsend,
          f"{nsend} senders x {per} tags, 8 in flight: each once, in order per sender, "
          "after its bytes", f"{total} taken, {late} bytes late, exits {rcs}")

    # ---- wait_notif: the tag asked for, others kept for get_notifs
    init.send_notif(sseg, rem, b"other").wait()
    init.send_notif(sseg, rem, b"mine").wait()
    t0 = time.monotonic()
    hit = owner.wait_notif(b"mine", timeout=5)
    miss = owner.wait_notif(b"never", timeout=0.2)
    rest = owner.get_notifs()
    check(hit and not miss and list(rest.values()) == [[b"other"]] and time.monotonic() - t0 >= 0.2,
          "wait_notif takes its tag, times out on another, leaves the rest")

    # ---- wait_notif over several segments: one sleep on all of them
    # (kcoll_seg_notif_wait_any), woken by a tag for the second one
    extra_dst, extra_seg = owner.alloc(4096, nr_notify=0)
    rem2 = init.import_desc(extra_seg.desc)
    c0 = time.process_time()
    idle = owner.wait_notif(b"none", timeout=0.5)
    cpu = time.process_time() - c0
    timer = threading.Timer(0.2, lambda: init.send_notif(sseg, rem2, b"second").wait())
    timer.start()
    woke = owner.wait_notif(b"second", timeout=20)
    timer.join()
    check(not idle and woke and cpu < 0.01,  # polling every ms took 31 ms here
          "wait_notif on 2 segments: woken by a tag for the second, sleeps while none comes",
          f"woke {woke}, {cpu * 1000:.1f} ms CPU in a 0.5 s wait")
    rem2.close()
    extra_seg.close()

    # ---- blocking calls release the GIL: a thread counts while we wait
    count = [0]
    stop = [False]

    def spin():
        while not stop[0]:
            count[0] += 1
    th = threading.Thread(target=spin)
    th.start()
    time.sleep(0.05)
    c0 = count[0]
    dseg.wait_notifs(0.5)
    dseg.notify_wait(0, 1 << 30, 0.3)
    c1 = count[0]
    stop[0] = True
    th.join()
    check(c1 - c0 > 100000, "the GIL is released while waiting (a thread ran meanwhile)",
          f"{c1 - c0} iterations in 0.8 s")

    # ---- the queue is bounded and says so
    for i in range(kv._lib.SEG_NOTIF_QUEUE):
        init.send_notif(sseg, rem, b"q%d" % i).wait()
    raises(-errno.ENOBUFS, lambda: init.send_notif(sseg, rem, b"over").wait(),
           "the 257th untaken tag -> ENOBUFS")
    got = dseg.get_notifs()
    check([n.msg for n in got] == [b"q%d" % i for i in range(kv._lib.SEG_NOTIF_QUEUE)],
          "the 256 queued tags, in order, the refused one not among them")

    # ---- the queue fills while batches are in flight: 4 places left, 8
    # tagged batches and 2 untagged ones behind them submitted at once. The
    # 4 that fit succeed, the next 4 fail with ENOBUFS (their bytes land:
    # the check is at delivery, docs/kv.md; no counter, no tag), the
    # untagged ones queued behind the refused go on and count.
    q = kv._lib.SEG_NOTIF_QUEUE
    for i in range(q - 4):
        init.send_notif(sseg, rem, b"f%d" % i).wait()
    dst[:] = 0
    c0 = dseg.notify_get(0)
    res = ten_batches(init, sseg, rem)
    landed = bool((dst[:10 << 12] == src[:10 << 12]).all())
    got = [n.msg for n in dseg.get_notifs()]
    check(res == ["DONE"] * 4 + ["ENOBUFS"] * 4 + ["DONE"] * 2 and landed and
          dseg.notify_get(0) == c0 + 6 and
          got == [b"f%d" % i for i in range(q - 4)] + [b"m%d" % k for k in range(4)],
          "full queue with 10 batches in flight: the 4 that fit are done, the next 4 tagged get "
          "ENOBUFS, the 2 untagged behind them go on; every byte landed, counter +6, queue exact",
          f"results {res}, bytes landed {landed}, counter +{dseg.notify_get(0) - c0}, "
          f"{len(got)} queued, last {got[-5:]}")
    rem.close()
    sseg.close()
    dseg.close()
    owner.close()
    init.close()


def pair_plan(seed, n, size):
    rng = np.random.default_rng(seed)
    src = rng.integers(0, 256, size, dtype=np.uint8)
    plans = [random_blocks(rng, 3000, size, size // n, 2048) for _ in range(n)]
    return src, plans


def owner_side(d, n, mapped):
    size = 16 << 20
    a = kv.Agent("owner")
    if mapped:
        dst, seg = a.alloc(size, nr_notify=1)
        dst[:] = 0
    else:
        dst = np.zeros(size, np.uint8)
        seg = a.register(dst, nr_notify=1)
    with open(os.path.join(d, "desc.tmp"), "wb") as f:
        f.write(seg.desc)
    os.rename(os.path.join(d, "desc.tmp"), os.path.join(d, "desc"))
    src, plans = pair_plan(11, n, size)
    want = np.zeros(size, np.uint8)
    order = []
    for k in range(n):
        ok = a.wait_notif(f"batch-{k}", timeout=60)
        lo, ro, ln = plans[k]
        ro = ro + k * (size // n)
        want[ranges(ro, ln)] = src[ranges(lo, ln)]
        region = slice(k * (size // n), (k + 1) * (size // n))
        order.append(ok and bool((dst[region] == want[region]).all()))
    check(all(order), f"across hosts: {n} tagged batches, each region's every byte there when "
          "its tag came", str(order))
    check(seg.notify_wait(0, n, 5) and seg.notify_get(0) == n, "across hosts: counter = batches")
    with open(os.path.join(d, "done"), "w") as f:
        f.write("1")
    # The initiator fills the queue with batches in flight (init_side):
    # the owner takes nothing until it says it is done.
    wait_file(os.path.join(d, "filled"))
    q = kv._lib.SEG_NOTIF_QUEUE
    got = [x.msg for x in seg.get_notifs()]
    landed = bool((dst[:10 << 12] == src[:10 << 12]).all())
    check(got == [b"f%d" % i for i in range(q - 4)] + [b"m%d" % k for k in range(4)] and landed and
          seg.notify_get(0) == n + 6,
          "across hosts, full queue with 10 batches in flight: the queue holds exactly the "
          "accepted tags in order, every batch's bytes landed, counter +6",
          f"{len(got)} queued, last {got[-5:]}, bytes landed {landed}, counter {seg.notify_get(0)}")
    time.sleep(0.3)
    seg.close()
    with open(os.path.join(d, "gone"), "w") as f:
        f.write("1")
    a.close()


def wait_file(path, seconds=60):
    for _ in range(seconds * 10):
        if os.path.exists(path):
            return True
        time.sleep(0.1)
    return False


def init_side(d, n, mapped):
    size = 16 << 20
    for _ in range(300):
        if os.path.exists(os.path.join(d, "desc")):
            break
        time.sleep(0.1)
    a = kv.Agent("init")
    src, plans = pair_plan(11, n, size)
    if mapped:
        buf, seg = a.alloc(size)
        buf[:] = src
    else:
        seg = a.register(src)
    rem = a.import_desc(open(os.path.join(d, "desc"), "rb").read())
    reqs = []
    t0 = time.monotonic()
    for k in range(n):
        lo, ro, ln = plans[k]
        reqs.append(a.write(seg, rem, (lo, ro + k * (size // n), ln), notify=0, msg=f"batch-{k}"))
    for q in reqs:
        q.wait(timeout=60)
    check(all(q.state() == "DONE" for q in reqs),
          f"across hosts: {n} batches of ~3000 blocks with a tag each", f"{time.monotonic() - t0:.2f} s")
    raises(-errno.ERANGE, lambda: a.write(seg, rem, [(0, size, 1)]),
           "across hosts: an entry past the end -> ERANGE")
    # The owner's queue with 4 places left, then 8 tagged and 2 untagged
    # batches at once: the 4 that fit are done, the next 4 get ENOBUFS, the
    # untagged ones queued behind them on the import go on.
    wait_file(os.path.join(d, "done"))
    q = kv._lib.SEG_NOTIF_QUEUE
    for i in range(q - 4):
        a.send_notif(seg, rem, b"f%d" % i).wait()
    res = ten_batches(a, seg, rem)
    check(res == ["DONE"] * 4 + ["ENOBUFS"] * 4 + ["DONE"] * 2,
          "across hosts, full queue with 10 batches in flight: 4 done, the next 4 tagged ENOBUFS, "
          "the 2 untagged behind them done", f"results {res}")
    with open(os.path.join(d, "filled"), "w") as f:
        f.write("1")
    for _ in range(300):
        if os.path.exists(os.path.join(d, "gone")):
            break
        time.sleep(0.1)
    raises(-errno.EIDRM, lambda: a.write(seg, rem, [(0, 0, 8)], msg=b"late").wait(),
           "across hosts: the owner's segment gone -> EIDRM")
    a.close()


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "local":
        local()
    elif mode == "owner":
        owner_side(sys.argv[2], int(sys.argv[3]), sys.argv[4:] == ["mapped"])
    else:
        init_side(sys.argv[2], int(sys.argv[3]), sys.argv[4:] == ["mapped"])
    sys.exit(1 if failed else 0)
