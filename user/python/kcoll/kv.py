# SPDX-License-Identifier: MIT
"""KV-cache transfers from Python: an agent in the shape serving engines use
(NIXL's nixl_agent, Mooncake's TransferEngine), over libkcoll's segments,
batches, notify counters and notifications (docs/kv.md, docs/python.md).

    import kcoll.kv as kv, numpy as np
    agent = kv.Agent("decode")
    cache = np.zeros((layers, blocks, block_bytes), np.uint8)
    seg = agent.register(cache, nr_notify=1)
    desc = seg.desc                       # 128 bytes: send them to the peer
    # the peer:
    remote = agent.import_desc(desc)
    req = agent.write(mine, remote, blocks, msg=b"req-17")  # blocks: (N, 3) offsets
    req.wait()
    # the owner:
    agent.wait_notif(b"req-17", timeout=5)

blocks is an (N, 3) integer array of (local offset, remote offset, length)
in bytes, or a tuple (local offsets, remote offsets, lengths) whose length
may be a scalar. They are checked here as a whole (ranges, overlapping
destinations) before anything is submitted, sorted, and adjacent blocks
(contiguous on both sides) merged, in one libkcoll call per batch
(kcoll_xfer_plan); batches of more than 4096 entries are split. Python
never loops over blocks. Every blocking call releases the GIL (ctypes
does). Errors raise kcoll.KcollError (code: the negative errno,
strerror: kcoll_strerror's sentence).
"""
import collections
import ctypes
import errno as _errno
import sys
import threading
import time

import numpy as np

from . import U8, Connection, KcollError, _Buf, _check
from . import _lib
from ._lib import NOTIF_MAX_BYTES, NOTIF_WAIT_MAX, NOTIFY_NONE, SEG_DESC_BYTES, XFER_MAX_ENTRIES

__all__ = ["Agent", "Segment", "Remote", "XferRequest", "Notif", "NOTIF_MAX_BYTES",
           "XFER_MAX_ENTRIES", "SEG_DESC_BYTES"]

_lc = _lib.lib
_MAX_U64 = np.uint64(0xFFFFFFFFFFFFFFFF)

Notif = collections.namedtuple("Notif", "sender notify_id msg")
Notif.__doc__ = """One notification: sender (int, one value per importing handle),
notify_id (the counter bumped with it, or None) and msg (bytes)."""


def _raise(code, what):
    raise KcollError(-abs(code), what)


def _addr_of(buf):
    """(address, bytes, keep-alive) of buf: (ptr, len) (host or device
    memory), a numpy array, a CPU or CUDA torch tensor, an object with the
    CUDA Array Interface (CuPy, Numba), or a writable buffer-protocol
    object; C-contiguous."""
    if isinstance(buf, tuple) and len(buf) == 2 and all(isinstance(x, int) for x in buf):
        return int(buf[0]), int(buf[1]), None
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(buf, torch.Tensor):
        if buf.device.type not in ("cpu", "cuda"):
            raise RuntimeError(f"kcoll.kv: a {buf.device.type} tensor: KV segments are CPU or "
                               "CUDA memory")
        if not buf.is_contiguous():
            raise ValueError("kcoll.kv: tensor is not contiguous")
        return buf.data_ptr(), buf.numel() * buf.element_size(), buf
    if hasattr(buf, "__cuda_array_interface__"):
        # The checks (contiguous, writable, unmasked) of kcoll.Comm's
        # device buffers; bytes, whatever the element type.
        b = _Buf(buf, True, U8)
        return b.addr, b.nbytes, b.keep
    if isinstance(buf, np.ndarray):
        if not buf.flags.c_contiguous:
            raise ValueError("kcoll.kv: array is not C-contiguous (np.ascontiguousarray)")
        return buf.__array_interface__["data"][0], buf.nbytes, buf
    mv = memoryview(buf)
    if not mv.c_contiguous:
        raise ValueError("kcoll.kv: buffer is not C-contiguous")
    if mv.readonly:
        raise ValueError("kcoll.kv: read-only buffer (register a writable one, or pass (ptr, len))")
    flat = mv.cast("B") if mv.nbytes else mv
    holder = (ctypes.c_char * mv.nbytes).from_buffer(flat)
    return ctypes.addressof(holder), mv.nbytes, (buf, holder)


def _msg_bytes(msg):
    if msg is None:
        return None
    m = msg.encode() if isinstance(msg, str) else bytes(msg)
    if not m:
        _raise(_errno.EINVAL, "notification: empty message")
    if len(m) > NOTIF_MAX_BYTES:
        _raise(_errno.EMSGSIZE, f"notification of {len(m)} bytes (at most {NOTIF_MAX_BYTES})")
    return m


def _column(c):
    """One column of blocks=(local, remote, lengths): a Python int (a scalar
    for every block) or an integer numpy array, not a copy."""
    if type(c) is int:
        if c < 0:
            _raise(_errno.ERANGE, "a negative offset or length")
        return c
    if type(c) is not np.ndarray:
        c = np.asarray(c)
    if c.dtype.kind not in "iu" and c.size:
        raise TypeError(f"kcoll.kv: block offsets and lengths must be integers, got {c.dtype}")
    return c if c.ndim == 1 else c.reshape(-1)


def _as_rows(blocks):
    """blocks as an (N, 3) uint64 array. A negative value becomes one >=
    2^63, beyond any segment: plan_blocks refuses it with ERANGE."""
    if isinstance(blocks, tuple):
        if len(blocks) != 3:
            raise ValueError("kcoll.kv: blocks=(local offsets, remote offsets, lengths)")
        cols = [_column(c) for c in blocks]
        n = 1  # a scalar or a 1-element column goes with any length
        for c in cols:
            if type(c) is not int and c.size != 1:
                if n != 1 and c.size != n:
                    sizes = [1 if type(x) is int else x.size for x in cols]
                    raise ValueError("kcoll.kv: blocks=(local, remote, lengths) of different "
                                     f"lengths {sizes}")
                n = c.size
        a = np.empty((n, 3), np.uint64)
        # Assignment casts unsafely: an int64 -1 lands as 2^64 - 1.
        a[:, 0], a[:, 1], a[:, 2] = cols
        return a
    a = blocks if type(blocks) is np.ndarray else np.asarray(blocks)
    if a.size == 0:
        a = a.reshape(0, 3)
    if a.ndim != 2 or a.shape[1] != 3:
        raise ValueError(f"kcoll.kv: blocks must be (N, 3) (local, remote, length), got {a.shape}")
    if a.dtype == np.uint64:
        return a
    if a.size and a.dtype.kind not in "iu":
        raise TypeError(f"kcoll.kv: block offsets and lengths must be integers, got {a.dtype}")
    return a.astype(np.int64, copy=False).view(np.uint64)


def _refuse(a, lsz, rsz):
    """Raise ERANGE naming the first block of a (as given) outside a segment."""
    if int(a.max()) >= 1 << 63:
        _raise(_errno.ERANGE, "a negative offset or length (or one >= 2^63)")
    lo, ro, ln = a[:, 0], a[:, 1], a[:, 2]
    l64, r64 = np.uint64(lsz), np.uint64(rsz)
    bad = (lo >= l64) | (ln > l64 - np.minimum(lo, l64)) | (ro >= r64) | (ln > r64 - np.minimum(ro, r64))
    i = int(np.flatnonzero(bad)[0])
    _raise(_errno.ERANGE, f"block {i} ({int(lo[i])}, {int(ro[i])}, {int(ln[i])}) lies outside "
           f"the local ({lsz} B) or remote ({rsz} B) segment; {int(bad.sum())} such block(s)")


def _refuse_plan(given, lsz, rsz, write, r):
    """Raise the error for a batch kcoll_xfer_plan refused with r, naming
    what is wrong (the numpy passes run only for a refused batch)."""
    ln = given[:, 2]
    if r == -_errno.EINVAL and not ln.all():
        _raise(_errno.EINVAL, f"{int((ln == 0).sum())} zero-length block(s)")
    if r == -_errno.ERANGE:
        _refuse(given, lsz, rsz)
    if r == -_errno.EINVAL:
        col = 1 if write else 0
        order = given[:, col].argsort(kind="stable")
        dst = given[order, col]
        over = np.flatnonzero(dst[:-1] + ln[order][:-1] > dst[1:])
        if over.size:
            i, j = int(order[over[0]]), int(order[over[0] + 1])
            _raise(_errno.EINVAL, f"destinations of two blocks overlap: block {i} "
                   f"{tuple(int(x) for x in given[i])} and block {j} "
                   f"{tuple(int(x) for x in given[j])}")
    _raise(r, "kcoll_xfer_plan refused the batch")


_plan = _lc.kcoll_xfer_plan


def plan_blocks(blocks, local_size, remote_size, write=True):
    """The (M, 3) uint64 entry array for blocks (C-contiguous): checked
    (non-empty, inside both segments, destinations disjoint), sorted by
    destination, adjacent blocks merged. Raises KcollError(-EINVAL /
    -ERANGE) for a bad batch."""
    given = _as_rows(blocks)
    n = given.shape[0]
    if n == 0:
        return np.empty((0, 3), np.uint64)
    # One libkcoll call plans the batch in place (kcoll_xfer_plan: one pass
    # for a batch given in destination order) on a C-contiguous copy: the
    # caller may reuse theirs, and a refused one is diagnosed on it.
    a = given.copy()
    m = ctypes.c_size_t()
    r = _plan(a.ctypes.data, n, local_size, remote_size, 1 if write else 0, ctypes.byref(m))
    if r:
        _refuse_plan(given, int(local_size), int(remote_size), write, r)
    return a[:m.value]


class Segment:
    """A registered buffer of this process (kcoll_seg_register)."""

    def __init__(self, agent, handle, addr, size, nr_notify, keep):
        self._agent = agent
        self._h = handle
        self.addr = addr
        self.size = size
        self.nr_notify = nr_notify
        self._keep = keep
        d = _lib.SegDesc()
        _check(_lc.kcoll_seg_export(handle, ctypes.byref(d)), "seg_export")
        self.desc = bytes(d.bytes)
        self._notifs = (_lib.Notif * 64)()
        agent._conn._adopt(handle, _lc.kcoll_seg_unregister)

    @property
    def handle(self):
        if not self._h or self._agent._conn.closed:
            raise ValueError("kcoll.kv: segment is closed")
        return self._h

    def close(self):
        """Unregister: transfers in flight into or out of it fail (EIDRM)."""
        if getattr(self, "_h", None):
            h, self._h = self._h, None
            self._agent._segs.discard(self)
            self._keep = None
            if self._agent._conn._release(h):  # else the connection's close() did
                _check(_lc.kcoll_seg_unregister(h), "seg_unregister")

    def notify_get(self, i=0):
        v = ctypes.c_uint32()
        _check(_lc.kcoll_seg_notify_get(self.handle, int(i), ctypes.byref(v)), f"notify_get {i}")
        return v.value

    def notify_wait(self, i, value, timeout=None):
        """Until counter i reaches value: True, or False after timeout seconds."""
        ms = -1 if timeout is None else max(0, int(timeout * 1000))
        r = _lc.kcoll_seg_notify_wait(self.handle, int(i), int(value) & 0xFFFFFFFF, ms)
        if r == -_errno.ETIMEDOUT:
            return False
        _check(r, f"notify_wait {i} >= {value}")
        return True

    def get_notifs(self, max=None):
        """Take queued notifications (all, or at most max), oldest first."""
        out = []
        while max is None or len(out) < max:
            want = 64 if max is None else min(64, max - len(out))
            n = ctypes.c_uint32()
            self._notifs[0].size = ctypes.sizeof(_lib.Notif)
            _check(_lc.kcoll_seg_get_notifs(self.handle, self._notifs, want, ctypes.byref(n)),
                   "get_notifs")
            for i in range(n.value):
                x = self._notifs[i]
                out.append(Notif(x.sender, None if x.notify_id == NOTIFY_NONE else x.notify_id,
                                 bytes(x.data[:x.len])))
            if n.value < want:
                break
        return out

    def wait_notifs(self, timeout=None):
        """Until a notification is queued: True, or False after timeout seconds."""
        ms = -1 if timeout is None else max(0, int(timeout * 1000))
        r = _lc.kcoll_seg_notif_wait(self.handle, ms)
        if r == -_errno.ETIMEDOUT:
            return False
        _check(r, "notif_wait")
        return True


class Remote:
    """An imported segment (kcoll_seg_import of a peer's descriptor)."""

    def __init__(self, agent, handle, desc):
        self._agent = agent
        self._h = handle
        self.desc = desc
        self.size = _lc.kcoll_rseg_size(handle)
        agent._conn._adopt(handle, _lc.kcoll_rseg_close)

    @property
    def handle(self):
        if not self._h or self._agent._conn.closed:
            raise ValueError("kcoll.kv: remote segment is closed")
        return self._h

    def close(self):
        if getattr(self, "_h", None):
            h, self._h = self._h, None
            if self._agent._conn._release(h):  # else the connection's close() did
                _check(_lc.kcoll_rseg_close(h), "rseg_close")


class XferRequest:
    """One write or read of many blocks: one or more libkcoll batches.

    state(): "PROC" (in flight), "DONE" or "ERR"; wait(timeout) raises the
    first batch's error; stats() says what moved. With more than 4096
    entries (after merging) and a counter or message, the data batches go
    first and the counter/message follows as an empty batch once they all
    succeeded: submitted by the state() or wait() call that sees them done.
    """

    def __init__(self, agent, write, local, remote, ents, notify_id, msg, nblocks):
        self._agent = agent
        self._write = write
        self._local = local
        self._remote = remote
        self._lock = threading.Lock()
        self._pending = []      # libkcoll request handles
        self._keep = msg        # kcolld reads the message until done
        self._ents = ents       # and the entries (kept: stats() sums their bytes)
        self.error = None       # KcollError once failed
        self._final = None      # (notify_id, msg) still to send after the data
        self._t0 = time.monotonic()
        self._t1 = None
        n = ents.shape[0]
        # bytes: summed when asked for (stats(), an error's text)
        self._stats = {"bytes": None, "blocks": nblocks, "entries": n, "batches": 0,
                       "notify_id": notify_id, "msg_bytes": len(msg) if msg else 0}
        if n <= XFER_MAX_ENTRIES:
            self._submit(ents if n else None, notify_id, msg)
        else:
            for i in range(0, n, XFER_MAX_ENTRIES):
                c = ents[i:i + XFER_MAX_ENTRIES]
                if self.error:
                    break
                self._submit(c, NOTIFY_NONE, None)
            if notify_id != NOTIFY_NONE or msg:
                self._final = (notify_id, msg)
        if self.error and not self._pending:
            raise self.error

    def _submit(self, ents, notify_id, msg):
        h = ctypes.c_void_p()
        n = 0 if ents is None else ents.shape[0]
        ptr = None if ents is None else ents.ctypes.data
        fn = _lc.kcoll_xfer_write_notif if self._write else _lc.kcoll_xfer_read_notif
        if msg:
            r = fn(self._local.handle, self._remote.handle, ptr, n, notify_id, msg, len(msg),
                   ctypes.byref(h))
        else:
            fn = _lc.kcoll_xfer_write if self._write else _lc.kcoll_xfer_read
            r = fn(self._local.handle, self._remote.handle, ptr, n, notify_id, ctypes.byref(h))
        if r < 0:
            self.error = KcollError(r, self._what())
            return
        self._pending.append(h)
        self._stats["batches"] += 1

    def _bytes(self):
        s = self._stats
        if s["bytes"] is None:
            s["bytes"] = int(self._ents[:, 2].sum()) if s["entries"] else 0
        return s["bytes"]

    def _what(self):
        self._bytes()
        s = self._stats
        return (f"{'write' if self._write else 'read'} of {s['blocks']} blocks "
                f"({s['entries']} entries, {s['bytes']} bytes)")

    def _done(self, res):
        if res and self.error is None:
            self.error = KcollError(res, self._what())

    def _progress(self):
        """Test every pending batch; send the deferred final one when due."""
        still = []
        for h in self._pending:
            res = ctypes.c_int()
            r = _lc.kcoll_test(h, ctypes.byref(res))
            if r < 0:
                self._done(r)
            elif r == 1:
                self._done(res.value)
            else:
                still.append(h)
        self._pending = still
        self._after()

    def _after(self):
        if not self._pending and self._final and self.error is None:
            notify_id, msg = self._final
            self._final = None
            self._submit(None, notify_id, msg)
        elif not self._pending and self._final:
            self._final = None  # the data failed: no counter, no message
        if not self._pending and self._t1 is None:
            self._t1 = time.monotonic()
            self._keep = None

    def state(self):
        with self._lock:
            if self._pending or self._final:
                self._progress()
            if self._pending or self._final:
                return "PROC"
            return "ERR" if self.error else "DONE"

    def wait(self, timeout=None):
        """True once done (raises KcollError if a batch failed), False if
        timeout seconds passed first (the request goes on)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while self._pending or self._final:
                if deadline is None:
                    h = self._pending.pop(0) if self._pending else None
                    if h is not None:
                        self._done(_lc.kcoll_wait(h, -1))
                    self._after()
                    continue
                self._progress()
                if not self._pending and not self._final:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                ms = max(1, int(left * 1000))
                res = ctypes.c_int()
                r = _lc.kcoll_timedwait(self._pending[0], ms, ctypes.byref(res))
                if r == 0:
                    return False  # still pending
                self._pending.pop(0)
                self._done(res.value if r == 1 else r)
                self._after()
        if self.error:
            raise self.error
        return True

    def stats(self):
        """bytes, blocks (given), entries (after merging), batches (submitted),
        elapsed_s (submission to completion, or so far), state."""
        st = self.state()
        self._bytes()
        s = dict(self._stats)
        end = self._t1 if self._t1 is not None else time.monotonic()
        s["elapsed_s"] = end - self._t0
        s["state"] = st
        return s


class Agent:
    """The KV side of one process: its segments, its imports, its transfers.

    A connection of its own (its own ring) unless conn= is given. name is
    only for messages."""

    def __init__(self, name="", conn=None, socket_path=None):
        self.name = name
        self._conn = conn or Connection(socket_path)
        self._segs = set()
        self._inbox = collections.deque()  # notifications taken, not yet asked for
        self._lock = threading.Lock()

    # ---- memory
    def register(self, buf, nr_notify=0, grant_uid=None):
        """Register buf ((ptr, len), numpy array, CPU or CUDA tensor, CuPy or
        other __cuda_array_interface__ array, writable buffer) with
        nr_notify counters; it must stay alive until close(). Device memory
        needs a GPU in kcolld; kcolld copies it with the GPU's copy engines
        when a batch runs, so finish the work that writes a block (e.g.
        torch.cuda.current_stream().synchronize()) before sending it."""
        addr, size, keep = _addr_of(buf)
        opts = _lib.SegOpts(ctypes.sizeof(_lib.SegOpts),
                            0 if grant_uid is None else _lib.SEG_F_GRANT_UID, int(nr_notify),
                            0 if grant_uid is None else int(grant_uid))
        h = ctypes.c_void_p()
        _check(_lc.kcoll_seg_register(self._conn.handle, ctypes.c_void_p(addr), size,
                                      ctypes.byref(opts), ctypes.byref(h)),
               f"register {size} bytes at {addr:#x}")
        seg = Segment(self, h, addr, size, int(nr_notify), keep)
        self._segs.add(seg)
        return seg

    def alloc(self, shape, dtype="uint8", nr_notify=0):
        """A numpy array in memory kcolld maps (moved in place, no
        process_vm_* calls) and its segment."""
        dt = np.dtype(dtype)
        shape = tuple(shape) if isinstance(shape, (tuple, list)) else (int(shape),)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        # Bytes, viewed as any dtype (empty() takes collective dtypes only).
        arr = self._conn.mem_alloc(nbytes).view(dt).reshape(shape)
        return arr, self.register(arr, nr_notify)

    def import_desc(self, desc):
        """A Remote from a peer's descriptor (Segment.desc, 128 bytes)."""
        desc = bytes(desc)
        if len(desc) != SEG_DESC_BYTES:
            _raise(_errno.EINVAL, f"import: a descriptor is {SEG_DESC_BYTES} bytes, got {len(desc)}")
        d = _lib.SegDesc.from_buffer_copy(desc)
        h = ctypes.c_void_p()
        _check(_lc.kcoll_seg_import(self._conn.handle, ctypes.byref(d), ctypes.byref(h)),
               "import descriptor")
        return Remote(self, h, desc)

    @staticmethod
    def export_descs(segs):
        """Several descriptors as one bytes object (import_descs splits it)."""
        return b"".join(s.desc for s in segs)

    def import_descs(self, blob):
        blob = bytes(blob)
        if len(blob) % SEG_DESC_BYTES:
            _raise(_errno.EINVAL, f"import: {len(blob)} bytes is no whole number of descriptors")
        return [self.import_desc(blob[i:i + SEG_DESC_BYTES])
                for i in range(0, len(blob), SEG_DESC_BYTES)]

    # ---- transfers
    def _xfer(self, write, local, remote, blocks, notify, msg):
        if not isinstance(local, Segment) or not isinstance(remote, Remote):
            raise TypeError("kcoll.kv: transfers go between a Segment of this agent and a Remote")
        m = _msg_bytes(msg)
        nid = NOTIFY_NONE if notify is None else int(notify)
        rows = np.empty((0, 3), np.uint64) if blocks is None else _as_rows(blocks)
        ents = plan_blocks(rows, local.size, remote.size, write)
        nblocks = rows.shape[0]
        return XferRequest(self, write, local, remote, ents, nid, m, nblocks)

    def write(self, local, remote, blocks, notify=None, msg=None):
        """local -> remote; notify: the remote counter to bump once all
        landed; msg: a notification (bytes/str) for the remote's owner."""
        return self._xfer(True, local, remote, blocks, notify, msg)

    def read(self, local, remote, blocks, notify=None, msg=None):
        """remote -> local; notify/msg reach the remote's owner once read."""
        return self._xfer(False, local, remote, blocks, notify, msg)

    def send_notif(self, local, remote, msg, notify=None):
        """A notification alone (an empty batch, in order with this import's batches)."""
        if msg is None:
            _raise(_errno.EINVAL, "send_notif without a message")
        return self._xfer(True, local, remote, None, notify, msg)

    # ---- notifications
    def get_notifs(self):
        """Every notification queued for this agent's segments:
        {sender: [msg, ...]} in arrival order per sender."""
        out = collections.defaultdict(list)
        with self._lock:
            for n in self._take():
                out[n.sender].append(n.msg)
        return dict(out)

    def _take(self):
        got = list(self._inbox)
        self._inbox.clear()
        for s in list(self._segs):
            got.extend(s.get_notifs())
        return got

    def wait_notif(self, msg, timeout=None):
        """Until a notification equal to msg arrived (it is consumed; others
        stay for get_notifs): True, or False after timeout seconds."""
        want = _msg_bytes(msg)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                got = self._take()
                hit = next((i for i, n in enumerate(got) if n.msg == want), None)
                if hit is not None:
                    del got[hit]
                self._inbox.extend(got)
            if hit is not None:
                return True
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            segs = list(self._segs)
            if len(segs) == 1:
                segs[0].wait_notifs(0.5 if left is None else min(left, 0.5))
            elif segs and _lib.notif_wait_any and len(segs) <= NOTIF_WAIT_MAX:
                # one sleep on every segment (kcoll_seg_notif_wait_any)
                hs = (ctypes.c_void_p * len(segs))(*[s.handle.value for s in segs])
                r = _lib.notif_wait_any(hs, len(segs), 500 if left is None else
                                        max(1, min(500, int(left * 1000))))
                if r < 0 and r != -_errno.ETIMEDOUT:
                    _check(r, "notif_wait_any")
            else:
                time.sleep(0.001 if left is None else min(left, 0.001))

    def close(self):
        for s in list(self._segs):
            s.close()
        self._conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
