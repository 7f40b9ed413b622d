# SPDX-License-Identifier: MIT
"""kcoll: collectives through the local kcolld, from Python.

A thin ctypes layer over libkcoll (no compiled extension):

    import kcoll
    uid = kcoll.get_unique_id()            # on rank 0; share the bytes out of band
    comm = kcoll.Comm.init(uid, nranks, rank)
    buf = kcoll.empty(1024, "float32")     # numpy array in kcolld-shared memory
    comm.allreduce(buf, op="sum").wait()

Buffers: numpy arrays, bytearray, anything else with the buffer protocol,
torch tensors, and CUDA device memory (objects with __cuda_array_interface__:
CuPy, Numba, torch CUDA tensors; kcolld takes device buffers as the C API
does). They must be C-contiguous, and stay alive until the request
completes (the Request keeps a reference to them). docs/python.md.
"""
import ctypes
import errno as _errno
import math
import os
import sys
import threading

from . import _lib
from ._lib import AVG, BF16, F16, F32, F64, I8, I32, I64, MAX, MIN, PROD, SUM, U8, U32, U64
from ._lib import UNIQUE_ID_BYTES

__all__ = ["KcollError", "Connection", "Comm", "Request", "connection", "get_unique_id", "empty",
           "mem_alloc", "version", "SUM", "PROD", "MIN", "MAX", "AVG", "F32", "F64", "F16", "BF16",
           "I8", "U8", "I32", "U32", "I64", "U64", "UNIQUE_ID_BYTES"]

_lc = _lib.lib


class KcollError(RuntimeError):
    """A libkcoll call or a collective failed.

    errno: positive errno; code: the negative value libkcoll returned;
    strerror: kcoll_strerror's sentence; rank: the rank kcolld blamed
    (kcoll_wait_status) for a failed collective, else None.
    """

    def __init__(self, code, what, rank=None):
        self.code = code
        self.errno = -code
        self.strerror = _lib.strerror(code)
        self.rank = rank
        name = _errno.errorcode.get(self.errno, str(self.errno))
        blame = f" (rank {rank} blamed)" if rank is not None else ""
        super().__init__(f"kcoll: {what}: {name}: {self.strerror}{blame}")


def _check(r, what):
    if r < 0:
        raise KcollError(r, what)
    return r


def version():
    return _lc.kcoll_version().decode()


# ---- data types --------------------------------------------------------------

_NAMES = {"f32": F32, "float32": F32, "f64": F64, "float64": F64, "f16": F16, "float16": F16,
          "bf16": BF16, "bfloat16": BF16, "i8": I8, "int8": I8, "u8": U8, "uint8": U8,
          "i32": I32, "int32": I32, "u32": U32, "uint32": U32, "i64": I64, "int64": I64,
          "u64": U64, "uint64": U64}
_OPS = {"sum": SUM, "prod": PROD, "product": PROD, "min": MIN, "max": MAX, "avg": AVG}
# struct-module format kind -> {itemsize: kcoll dtype}; memoryview formats
# say 'l' or 'q' for int64 depending on the exporter, so go by size.
_FMT_KIND = {"e": "f", "f": "f", "d": "f", "b": "i", "h": "i", "i": "i", "l": "i", "q": "i",
             "B": "u", "H": "u", "I": "u", "L": "u", "Q": "u"}
_BY_KIND = {"f": {2: F16, 4: F32, 8: F64}, "i": {1: I8, 4: I32, 8: I64}, "u": {1: U8, 4: U32, 8: U64}}
_TORCH = {"torch.float16": F16, "torch.bfloat16": BF16, "torch.float32": F32,
          "torch.float64": F64, "torch.int8": I8, "torch.uint8": U8, "torch.int32": I32,
          "torch.int64": I64}


def dtype_of(spec):
    """A kcoll dtype from a name ("f32", "bfloat16"), a kcoll constant, a
    numpy dtype or type, or a torch dtype."""
    if isinstance(spec, int) and 0 <= spec <= U64:
        return spec
    if isinstance(spec, str) and spec.lower() in _NAMES:
        return _NAMES[spec.lower()]
    if str(spec) in _TORCH:
        return _TORCH[str(spec)]
    kind = getattr(spec, "kind", None)
    if kind is None:
        try:
            import numpy
            spec = numpy.dtype(spec)
            kind = spec.kind
        except (ImportError, TypeError):
            pass
    if kind in _BY_KIND and spec.itemsize in _BY_KIND[kind]:
        return _BY_KIND[kind][spec.itemsize]
    raise TypeError(f"kcoll: unsupported data type {spec!r} (f16, bf16 (torch only), f32, f64, "
                    "i8, u8, i32, u32, i64, u64)")


def op_of(spec):
    if isinstance(spec, int) and 0 <= spec <= AVG:
        return spec
    if isinstance(spec, str) and spec.lower() in _OPS:
        return _OPS[spec.lower()]
    raise ValueError(f"kcoll: unsupported reduction {spec!r} (sum, prod, min, max, avg)")


class _Buf:
    """Address, element count and dtype of a buffer, and what keeps it alive."""
    __slots__ = ("addr", "count", "dtype", "nbytes", "keep")

    def __init__(self, obj, writable, dtype=None):
        torch = sys.modules.get("torch")  # never imported here: only if the caller has
        if torch is not None and isinstance(obj, torch.Tensor):
            self._torch(torch, obj, dtype)
        elif hasattr(obj, "__cuda_array_interface__"):
            self._cuda(obj, obj.__cuda_array_interface__, writable, dtype)
        else:
            self._buffer(obj, writable, dtype)

    def _torch(self, torch, t, dtype):
        if t.device.type not in ("cpu", "cuda"):
            raise RuntimeError(f"kcoll: {t.device.type} tensors are not supported: use CPU or "
                               "CUDA tensors")
        if not t.is_contiguous():
            raise ValueError("kcoll: tensor is not contiguous (use .contiguous())")
        self.dtype = dtype_of(t.dtype) if dtype is None else dtype_of(dtype)
        self.nbytes = t.numel() * t.element_size()
        self.addr = t.data_ptr()
        self.keep = t
        if t.is_cuda:
            # kcolld reads it once the op is queued: the work torch queued
            # on the tensor's stream must be done by then.
            torch.cuda.current_stream(t.device).synchronize()
        self._count()

    def _cuda(self, obj, cai, writable, dtype):
        """Device memory described by the CUDA Array Interface (v2, v3)."""
        shape, typestr = tuple(cai["shape"]), cai["typestr"]
        addr, readonly = cai["data"]
        kind, itemsize = typestr[1:2], int(typestr[2:] or 0)
        if typestr[:1] == ">" and itemsize > 1:
            raise TypeError(f"kcoll: big-endian device array ({typestr}) is not supported")
        count = math.prod(shape)
        strides = cai.get("strides")
        if strides is not None and count > 1:
            step = itemsize  # C order: the last dimension's stride is the item size
            for d, st in reversed(list(zip(shape, strides))):
                if d > 1 and st != step:
                    raise ValueError("kcoll: device array is not C-contiguous (cupy: "
                                     "cupy.ascontiguousarray; torch: .contiguous())")
                step *= d
        if readonly and writable:
            raise ValueError("kcoll: receive buffer is read-only")
        if cai.get("mask") is not None:
            raise ValueError("kcoll: masked device arrays are not supported")
        if dtype is None:
            if kind not in _BY_KIND or itemsize not in _BY_KIND[kind]:
                raise TypeError(f"kcoll: device array type {typestr!r} has no kcoll data type "
                                "(f16, f32, f64, i8, u8, i32, u32, i64, u64); or pass dtype=")
            self.dtype = _BY_KIND[kind][itemsize]
        else:
            self.dtype = dtype_of(dtype)
        self.nbytes = count * itemsize
        self.addr = addr or 0
        self.keep = obj
        # v3: the producer's stream, to be synchronized before the memory
        # is read (1: legacy default stream, 2: per-thread default stream).
        stream = cai.get("stream") if cai.get("version", 0) >= 3 else None
        if stream is not None and self.nbytes:
            _cuda_sync(stream)
        self._count()

    def _buffer(self, obj, writable, dtype):
        mv = memoryview(obj)
        if not mv.c_contiguous:
            raise ValueError("kcoll: buffer is not C-contiguous (numpy: np.ascontiguousarray)")
        if dtype is None:
            fmt = mv.format.lstrip("@=<")
            kind = _FMT_KIND.get(fmt)
            if kind is None or mv.itemsize not in _BY_KIND[kind]:
                what = getattr(obj, "dtype", f"buffer format {mv.format!r}")
                raise TypeError(f"kcoll: {what} has no kcoll data type (f16, f32, f64, i8, u8, "
                                "i32, u32, i64, u64); or pass dtype=")
            self.dtype = _BY_KIND[kind][mv.itemsize]
        else:
            self.dtype = dtype_of(dtype)
        self.nbytes = mv.nbytes
        flat = mv.cast("B") if mv.nbytes else mv
        if mv.readonly:
            if writable:
                raise ValueError("kcoll: receive buffer is read-only")
            # A read-only send buffer (bytes): one private copy the daemon reads.
            flat = memoryview(bytearray(flat))
        holder = (ctypes.c_char * self.nbytes).from_buffer(flat)
        self.addr = ctypes.addressof(holder)
        self.keep = (obj, holder)
        self._count()

    def _count(self):
        size = _lc.kcoll_dtype_size(self.dtype)
        if self.nbytes % size:
            raise ValueError(f"kcoll: {self.nbytes} bytes is not a whole number of "
                             f"{size}-byte elements")
        self.count = self.nbytes // size


_cuda_lib = None


def _cuda_sync(stream):
    """cuStreamSynchronize(stream) through the CUDA driver this process
    already has loaded (it holds device memory, so it has one)."""
    global _cuda_lib
    if _cuda_lib is None:
        try:
            lib = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD)
        except OSError as e:
            raise RuntimeError("kcoll: a device array names a CUDA stream, but this process "
                               f"has no CUDA driver (libcuda.so.1) loaded: {e}") from None
        lib.cuStreamSynchronize.argtypes = [ctypes.c_void_p]
        _cuda_lib = lib
    r = _cuda_lib.cuStreamSynchronize(ctypes.c_void_p(stream))
    if r:
        raise RuntimeError(f"kcoll: cuStreamSynchronize of the device array's stream {stream:#x} "
                           f"failed: CUresult {r}")


# ---- connection --------------------------------------------------------------

class _ConnectOpts(ctypes.Structure):
    _fields_ = [("size", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                ("socket_path", ctypes.c_char_p), ("sq_entries", ctypes.c_uint32),
                ("reserved", ctypes.c_uint32)]


_env_lock = threading.Lock()


class Connection:
    """One connection to kcolld (its own ring). Thread-safe.

    timeout_ms: the hang and join timeout of communicators made on this
    connection. libkcoll reads it only from $KCOLL_TIMEOUT_MS at connect
    time, so it is put there for the duration of the call; an explicit
    $KCOLL_TIMEOUT_MS in the environment wins.
    """

    def __init__(self, socket_path=None, timeout_ms=None):
        opts = _ConnectOpts(ctypes.sizeof(_ConnectOpts), 0,
                            socket_path.encode() if socket_path else None, 0, 0)
        h = ctypes.c_void_p()
        with _env_lock:
            tmp = timeout_ms is not None and "KCOLL_TIMEOUT_MS" not in os.environ
            if tmp:
                os.environ["KCOLL_TIMEOUT_MS"] = str(int(timeout_ms))
            try:
                r = _lc.kcoll_connect(ctypes.byref(opts), ctypes.byref(h))
            finally:
                if tmp:
                    del os.environ["KCOLL_TIMEOUT_MS"]
        _check(r, f"connect to kcolld ({socket_path or os.environ.get('KCOLL_SOCKET') or 'default socket'})")
        self._h = h
        self._closed = False
        # kcoll memory (empty()) still viewed: libkcoll unmaps it when it
        # disconnects, so close() leaves that to the last one's release.
        self._mem_live = 0
        self._mem_lock = threading.RLock()  # RLock: a release may run in GC inside it
        # What lives on this connection in libkcoll (communicators, KV
        # segments and imports): handle value -> the C function freeing it.
        self._children = {}
        self._children_lock = threading.Lock()

    @property
    def handle(self):
        if self._closed:
            raise ValueError("kcoll: connection is closed")
        return self._h

    @property
    def closed(self):
        """True once close() ran: nothing new can be done on it."""
        return self._closed

    def _adopt(self, h, free):
        """Record h (a c_void_p) as freed by free(h) at close() unless its
        owner frees it first (_release)."""
        with self._children_lock:
            self._children[h.value] = free

    def _release(self, h):
        """True if h is still to be freed by its owner, now: close() has
        not freed it already (libkcoll's communicators and segments point
        into their connection, freed with it)."""
        with self._children_lock:
            return self._children.pop(h.value, None) is not None

    def close(self):
        """Destroy the communicators and KV segments still open on this
        connection (their pending requests fail with ECANCELED), then
        disconnect. Arrays from empty() stay valid: the disconnect (which
        unmaps them) waits until the last of them is gone.

        Safe whatever the order in which the garbage collector finalizes a
        connection and its communicators (at interpreter exit it may take
        the connection first): a communicator destroyed here is not
        destroyed again by its own destroy()."""
        if getattr(self, "_h", None) and not self._closed:
            self._closed = True
            with self._children_lock:
                left = list(self._children.items())
                self._children.clear()
            for h, free in reversed(left):
                free(ctypes.c_void_p(h))
            with self._mem_lock:
                if not self._mem_live:
                    self._disconnect()

    def _disconnect(self):
        h, self._h = self._h, None
        if h:
            _lc.kcoll_disconnect(h)

    def __del__(self):
        # Communicators, requests and kcoll.empty arrays hold their
        # connection: when it goes, none of them is left.
        try:
            self.close()
        except Exception:  # interpreter shutdown: nothing left to report to
            pass

    def get_unique_id(self):
        uid = _lib.UniqueId()
        _check(_lc.kcoll_get_unique_id(self.handle, ctypes.byref(uid)), "get_unique_id")
        return bytes(uid.bytes)

    def empty(self, shape, dtype="float32"):
        """A numpy array in memory shared with kcolld (collectives on it are
        zero-copy). Freed when the array and every view of it are gone."""
        import numpy as np
        dt = np.dtype(dtype)
        dtype_of(dt)  # refuse what no collective could take, before allocating
        dims = [int(d) for d in (shape if isinstance(shape, (tuple, list)) else (shape,))]
        if any(d < 0 for d in dims):
            raise ValueError(f"kcoll: negative dimension in shape {shape}")
        n = math.prod(dims)
        nbytes = n * dt.itemsize
        if nbytes == 0:
            return np.empty(shape, dt)
        ptr = ctypes.c_void_p()
        with self._mem_lock:
            _check(_lc.kcoll_mem_alloc(self.handle, nbytes, ctypes.byref(ptr)), f"mem_alloc {nbytes} bytes")
            self._mem_live += 1
        owner_t = type("KcollMemory", (ctypes.c_uint8 * nbytes,), {"__del__": _mem_release})
        owner = owner_t.from_address(ptr.value)
        # The array's base chain ends at owner: its __del__ frees the memory
        # once nothing views it any more; the connection lives as long.
        owner.conn = self
        owner.ptr = ptr.value
        return np.frombuffer(owner, dtype=dt, count=n).reshape(shape)

    def mem_alloc(self, nbytes):
        """nbytes of kcoll memory (kcoll_mem_alloc) as a writable uint8 numpy
        array, to view as any dtype (arr.view(np.float32)) or fill with
        anything; empty(nbytes, "uint8")."""
        return self.empty(int(nbytes), "uint8")


def _mem_release(owner):
    conn = owner.conn
    with conn._mem_lock:
        conn._mem_live -= 1
        if conn._h:
            _lc.kcoll_mem_free(conn._h, ctypes.c_void_p(owner.ptr))
            if conn._closed and not conn._mem_live:
                conn._disconnect()


_default = None
_default_lock = threading.Lock()


def connection():
    """The process's shared default connection ($KCOLL_SOCKET), made on first use."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Connection()
        return _default


def get_unique_id():
    return connection().get_unique_id()


def empty(shape, dtype="float32"):
    return connection().empty(shape, dtype)


def mem_alloc(nbytes):
    return connection().mem_alloc(nbytes)


# ---- requests ----------------------------------------------------------------

class Request:
    """One queued collective. test() and wait() raise KcollError if it failed."""

    def __init__(self, comm, handle, keep, what):
        self._comm = comm
        self._h = handle
        self._keep = keep
        self._what = what
        self._lock = threading.Lock()
        self.result = None  # the operation's result (0 or negative errno) once done
        self.err_rank = None

    @property
    def done(self):
        return self.result is not None

    def _settle(self, res, err_rank):
        self.err_rank = err_rank
        self.result = res
        self._h = None
        self._keep = None
        self._comm._pending.discard(self)

    def _raise(self):
        if self.result:
            raise KcollError(self.result, self._what, self.err_rank)

    def _closed(self):
        """The connection is gone, and with it the request: it failed."""
        if not self._comm._conn.closed:
            return False
        self._settle(-_errno.ECANCELED, None)
        return True

    def _poll(self):
        if not self._closed():
            self._wait_ms(0)

    def test(self):
        """True once the operation is complete (raises if it failed)."""
        with self._lock:
            if self.result is None:
                self._poll()
        self._raise()
        return self.done

    def wait(self, timeout=None):
        """Wait for completion: True, or False if timeout (seconds) passed
        first (the request stays valid). None waits until the operation
        ends; a hung peer ends it with ETIMEDOUT after the communicator's
        timeout ($KCOLL_TIMEOUT_MS, default 30 s)."""
        with self._lock:
            if self.result is None and not self._closed():
                self._wait_ms(-1 if timeout is None else max(0, int(timeout * 1000)))
        self._raise()
        return self.done

    def _wait_ms(self, ms):
        # kcoll_wait_status: 0 while pending (the request stays valid), 1
        # and the result and blamed rank once done (then freed).
        st = _lib.Status()
        r = _lc.kcoll_wait_status(self._h, ms, ctypes.byref(st))
        if r < 0:
            raise KcollError(r, f"{self._what}: wait")
        if r == 1:
            self._settle(st.result, st.err_rank if st.result and st.err_rank >= 0 else None)


# ---- communicators -------------------------------------------------------------

class Comm:
    """A communicator: nranks processes that each call the same collectives
    in the same order."""

    def __init__(self, conn, handle):
        self._conn = conn
        self._h = handle
        self._pending = set()
        conn._adopt(handle, _lc.kcoll_comm_destroy)

    @classmethod
    def init(cls, uid, nranks, rank, conn=None):
        """Join the communicator named by uid (bytes from get_unique_id) as
        rank of nranks; blocks until all have joined (or their timeout)."""
        conn = conn or connection()
        if len(uid) != UNIQUE_ID_BYTES:
            raise ValueError(f"kcoll: a unique id is {UNIQUE_ID_BYTES} bytes, got {len(uid)}")
        u = _lib.UniqueId.from_buffer_copy(bytes(uid))
        h = ctypes.c_void_p()
        _check(_lc.kcoll_comm_init_rank(conn.handle, ctypes.byref(u), int(nranks), int(rank),
                                        ctypes.byref(h)),
               f"comm_init_rank (rank {rank} of {nranks})")
        return cls(conn, h)

    @property
    def rank(self):
        return _lc.kcoll_comm_rank(self._handle())

    @property
    def size(self):
        return _lc.kcoll_comm_size(self._handle())

    def _handle(self):
        if not self._h or self._conn.closed:
            raise ValueError("kcoll: communicator is destroyed" +
                             (" (its connection was closed)" if self._h else ""))
        return self._h

    def destroy(self):
        """Leave the communicator; pending operations fail with ECANCELED."""
        if getattr(self, "_h", None):
            h, self._h = self._h, None
            if not self._conn._release(h):
                return  # the connection's close() destroyed it
            r = _lc.kcoll_comm_destroy(h)
            for rq in list(self._pending):
                try:
                    rq.wait()
                except KcollError:
                    pass
            _check(r, "comm_destroy")

    def __del__(self):
        try:
            self.destroy()
        except Exception:  # interpreter shutdown: nothing left to report to
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.destroy()

    def _submit(self, what, fn, args, keep):
        # Requests nobody waited for hold their buffers until seen done
        # (here, at later submissions): the daemon may still write to them.
        for rq in list(self._pending):
            if rq._lock.acquire(blocking=False):
                try:
                    if rq.result is None:
                        rq._poll()
                finally:
                    rq._lock.release()
        h = ctypes.c_void_p()
        _check(fn(self._handle(), *args, ctypes.byref(h)), what)
        rq = Request(self, h, keep, what)
        self._pending.add(rq)
        return rq

    def allreduce(self, sendbuf, recvbuf=None, op="sum", dtype=None):
        """recvbuf None: in place in sendbuf."""
        s = _Buf(sendbuf, recvbuf is None, dtype)
        r = s if recvbuf is None else _Buf(recvbuf, True, dtype)
        _same(r, s, s.count, "allreduce")
        o = op_of(op)
        return self._submit(f"allreduce {s.count} x {_name(s.dtype)}", _lc.kcoll_allreduce,
                            (s.addr, r.addr, s.count, s.dtype, o), (s.keep, r.keep))

    def reduce_scatter(self, sendbuf, recvbuf, op="sum", dtype=None):
        """recvbuf gets this rank's slice: sendbuf has size * len(recvbuf) elements."""
        s, r = _Buf(sendbuf, False, dtype), _Buf(recvbuf, True, dtype)
        _same(s, r, r.count * self.size, "reduce_scatter")
        return self._submit(f"reduce_scatter {r.count} x {_name(s.dtype)}", _lc.kcoll_reduce_scatter,
                            (s.addr, r.addr, r.count, s.dtype, op_of(op)), (s.keep, r.keep))

    def allgather(self, sendbuf, recvbuf, dtype=None):
        """recvbuf gets size * len(sendbuf) elements, rank r's at r * len(sendbuf)."""
        s, r = _Buf(sendbuf, False, dtype), _Buf(recvbuf, True, dtype)
        _same(r, s, s.count * self.size, "allgather")
        return self._submit(f"allgather {s.count} x {_name(s.dtype)}", _lc.kcoll_allgather,
                            (s.addr, r.addr, s.count, s.dtype), (s.keep, r.keep))

    def broadcast(self, buf, root=0, dtype=None):
        b = _Buf(buf, True, dtype)
        return self._submit(f"broadcast {b.count} x {_name(b.dtype)} from {root}",
                            _lc.kcoll_broadcast, (b.addr, b.count, b.dtype, int(root)), (b.keep,))

    def barrier(self):
        return self._submit("barrier", _lc.kcoll_barrier, (), ())


def _name(dtype):
    return [k for k, v in _NAMES.items() if v == dtype][0]


def _same(big, small, want, what):
    if big.dtype != small.dtype:
        raise TypeError(f"kcoll: {what}: send and receive buffers differ in data type "
                        f"({_name(big.dtype)}, {_name(small.dtype)})")
    if big.count != want:
        raise ValueError(f"kcoll: {what}: expected {want} elements, got {big.count}")
