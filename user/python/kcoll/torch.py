# SPDX-License-Identifier: MIT
"""torch.distributed backend "kcoll": ``import kcoll.torch`` registers it.

    import kcoll.torch
    dist.init_process_group("kcoll", init_method="env://", rank=r, world_size=n)

Installed by pip, under torch 2.5 and later the import is not needed:
torch registers the backend as it starts (_kcoll_torch.autoload).

A ProcessGroup written in Python (torch 1.13 and 2.x let Python subclass
c10d's ProcessGroup; C++ callers such as DDP's reducer reach the Python
methods through pybind's trampoline). Tested on torch 1.13 (Debian 12) and
2.6 (Debian 13, tests/t_python_torch2.sh). In 2.x a backend's creator
usually returns a c10d Backend, but Backend has no Python constructor
there ("No constructor defined", 2.6); a creator that returns a
ProcessGroup subclass becomes the whole group, torch's path for process
groups written in Python. Each group has its own kcolld
connection and communicator; a progress thread waits for the collectives in
submission order (kcoll_wait releases the GIL) and completes the futures
the Work objects wrap. CPU tensors only.

Plain tensors, zero-copy (docs/python.md "Plain tensors, zero-copy"): an
all_reduce or broadcast of at least $KCOLL_TORCH_SHARE_MIN_BYTES runs as two
kcoll ops, the tensor's first and last 4 KiB (staged together in one small
tensor) and the middle; the middle is zero-copy because the whole pages
inside the tensor's storage are shared with kcolld in place on first use
(kcoll_mem_share), which DDP's reused buckets pay once.
"""
import atexit
import collections
import ctypes
import math
import os
import queue
import sys
import threading

import torch
from torch._C._distributed_c10d import ProcessGroup, ReduceOp, Work, _create_work_from_future

import _kcoll_torch
import kcoll
from kcoll import _lib

BACKEND = "kcoll"
_UID_KEY = "kcoll/unique_id"
_GLOO_HINT = "use gloo for it in a second group: dist.new_group(backend='gloo')"

_SUPPORTED = {torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8,
              torch.uint8, torch.int32, torch.int64}
_OPS = [(ReduceOp.SUM, kcoll.SUM), (ReduceOp.PRODUCT, kcoll.PROD), (ReduceOp.MIN, kcoll.MIN),
        (ReduceOp.MAX, kcoll.MAX), (ReduceOp.AVG, kcoll.AVG)]


def _op(reduce_op):
    for theirs, ours in _OPS:
        if reduce_op == theirs:
            return ours
    # ReduceOp objects print as addresses in 1.13: name the op ourselves.
    name = next((n for n in ("BAND", "BOR", "BXOR", "PREMUL_SUM")
                 if hasattr(ReduceOp, n) and reduce_op == getattr(ReduceOp, n)), str(reduce_op))
    raise RuntimeError(f"kcoll: reduce op {name} is not supported (SUM, PRODUCT, MIN, MAX, AVG "
                       f"are); {_GLOO_HINT}")


def _check(t):
    if t.device.type != "cpu":
        raise RuntimeError(f"kcoll: {t.device.type} tensors are not supported by the kcoll torch "
                           "backend (CPU tensors only); use nccl or gloo for them, in a group of "
                           "their own (dist.new_group), or kcoll.Comm, which takes CUDA memory")
    if t.dtype not in _SUPPORTED:
        raise RuntimeError(f"kcoll: dtype {t.dtype} is not supported (f16, bf16, f32, f64, i8, u8, "
                           f"i32, i64); {_GLOO_HINT}")
    return t


def _dense(t):
    """t itself if libkcoll can use its memory, else a contiguous copy."""
    _check(t)
    return t if t.is_contiguous() else t.contiguous()


def _reduce_op(opts):
    """The ReduceOp of an options struct; pybind also lets callers pass the
    op itself (pg.allreduce(tensors, ReduceOp.MAX)) or nothing."""
    if opts is None:
        return ReduceOp.SUM
    return getattr(opts, "reduceOp", opts)


def _root(opts, size):
    """The root rank of a rooted op's options (0 without options)."""
    root = getattr(opts, "rootRank", 0) if opts is not None else 0
    if not 0 <= root < size:
        raise RuntimeError(f"kcoll: root rank {root} is not in the group (0..{size - 1})")
    return root


def _python_caller(pg):
    """Is the collective called by torch.distributed's Python API (which
    calls work.wait() from Python), rather than from C++ through pybind
    (DDP, torch's C++ helpers) or by other code calling the group's methods
    (which may hand the Work on to C++)? Frames of functions whose first
    argument is this group (wrappers of its methods, e.g. a profiler's) are
    looked through. When unsure the answer is no: a C++ wait() on our
    Python Work would never return, a lost error only fails later."""
    try:
        frame = sys._getframe(3)  # 0 this, 1 _work, 2 the collective, 3 its caller
    except ValueError:
        return False
    while frame is not None and frame.f_code.co_argcount and \
            frame.f_locals.get(frame.f_code.co_varnames[0]) is pg:
        frame = frame.f_back
    return frame is not None and frame.f_globals.get("__name__") == "torch.distributed.distributed_c10d"


def _one(tensors, what):
    if len(tensors) != 1:
        raise RuntimeError(f"kcoll: {what} takes one tensor per process, got {len(tensors)}")
    return tensors[0]


# The knobs (declared with the others in user/common/config.c, which
# kcollctl config prints). Every rank must see the same MIN_BYTES: it
# decides how an op is cut into kcoll ops.
_SHARE_MIN_DEFAULT = 1 << 20
_SHARE_MAX_DEFAULT = 1 << 30
# The ends staged apart: a fixed size, not this rank's page offset, so that
# every rank cuts an op the same way whatever its tensors' addresses. With
# pages of at most this size the middle lies inside the shared pages.
_END_BYTES = 4096


def _knob(name, default):
    v = os.environ.get(name, "").strip()
    if not v:
        return default
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(v[-1:].upper(), 1)
    digits = v[:-1] if mult > 1 else v
    # Digits only: int() would also take "-1", "+1" and "1_000".
    if not (digits.isascii() and digits.isdigit()):
        raise RuntimeError(f"kcoll: {name}={v!r} is not a byte count (e.g. 1048576, 1M, 0)")
    return int(digits) * mult


def _storage(t):
    """t's storage (an object that keeps its memory alive), its address and size."""
    st = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
    return st, st.data_ptr(), st.nbytes()


class _Shared:
    """The storages a group shared with kcolld (kcoll_mem_share), least
    recently used first, at most max_bytes of them: each entry holds its
    storage, so the memory cannot be freed and its address reused while
    kcolld maps it. Storages it could not share are remembered (without
    holding them) so that none is tried on every op."""

    _REFUSED_MAX = 256

    def __init__(self, conn, max_bytes):
        self._conn = conn
        self.max_bytes = max_bytes
        self.entries = collections.OrderedDict()  # (ptr, nbytes) -> (storage, lo, length)
        self.refused = collections.OrderedDict()  # (ptr, nbytes) -> errno
        self.total = 0
        self.busy = collections.Counter()  # (ptr, nbytes) -> this group's ops in flight on it
        self.lock = threading.Lock()

    def key(self, t):
        _, ptr, nbytes = _storage(t)
        return (ptr, nbytes)

    def ensure(self, t):
        """Share t's storage if it is not yet (and may be). Never raises for
        a storage that cannot be shared: its ops stay on the copy path."""
        st, ptr, nbytes = _storage(t)
        key = (ptr, nbytes)
        with self.lock:
            self._drop_moved()
            if key in self.entries:
                self.entries.move_to_end(key)
                return True
            if key in self.refused or nbytes > self.max_bytes or self.busy[key] or \
                    _lib.mem_share is None:
                # busy: an op of ours may be writing it; sharing copies the
                # pages, and a write during the copy would be lost.
                return False
            lo, length = ctypes.c_void_p(), ctypes.c_size_t()
            r = _lib.mem_share(self._conn.handle, ctypes.c_void_p(ptr), nbytes, ctypes.byref(lo),
                               ctypes.byref(length))
            if r:
                self.refused[key] = -r
                if len(self.refused) > self._REFUSED_MAX:
                    self.refused.popitem(last=False)
                return False
            self.entries[key] = (st, lo.value, length.value)
            self.total += length.value
            while self.total > self.max_bytes and len(self.entries) > 1:
                self._evict(next(iter(self.entries)))
            return True

    def _evict(self, key):
        _, lo, length = self.entries.pop(key)
        self.total -= length
        # kcolld drops its mapping (an op of it still in flight keeps its
        # own); the pages and their data stay where they are.
        _lib.lib.kcoll_mem_deregister(self._conn.handle, ctypes.c_void_p(lo))

    def _drop_moved(self):
        """A storage resized since (its data elsewhere now): the old pages
        were freed, so kcolld must stop taking that range as this storage."""
        for key in [k for k, (st, _, _) in self.entries.items()
                    if (st.data_ptr(), st.nbytes()) != k]:
            self._evict(key)

    def clear(self):
        with self.lock:
            while self.entries:
                self._evict(next(iter(self.entries)))


class _Reqs:
    """The kcoll requests of one torch op: wait() waits for all of them,
    then raises the first failure."""

    def __init__(self, reqs):
        self._reqs = reqs

    def wait(self):
        err = None
        for rq in self._reqs:
            try:
                rq.wait()
            except Exception as e:
                err = err or e
        if err is not None:
            raise err


class _Held:
    """A request that, once over, lets go of its storages' in-flight counts."""

    def __init__(self, req, keys, shared):
        self._req, self._keys, self._shared = req, keys, shared

    def wait(self):
        try:
            self._req.wait()
        finally:
            with self._shared.lock:
                self._shared.busy.subtract(self._keys)
                for k in self._keys:
                    if self._shared.busy[k] <= 0:
                        del self._shared.busy[k]


class _Work(Work):
    """A Work over a future the progress thread completes, for Python callers.

    Not _create_work_from_future: in torch 1.13 its wait() returns True even
    when the future holds an error. But 1.13 does not route C++ calls of
    Work::wait to a Python subclass (it waits for a completion no Python
    code can signal), so C++ callers get _create_work_from_future's Work."""

    def __init__(self, fut):
        super().__init__()
        self._fut = fut

    def wait(self, timeout=None):
        self._fut.wait()  # raises the operation's error
        return True

    def get_future(self):
        return self._fut

    def is_completed(self):
        return self._fut.done()

    def is_success(self):
        if not self._fut.done():
            raise RuntimeError("kcoll: operation still in flight")
        try:
            self._fut.value()
        except RuntimeError:
            return False
        return True


def _unwrap(src):
    value = src.value()
    if isinstance(value, Exception):
        raise value
    return value


# The running progress threads and their queues.
_progress_threads = {}


@atexit.register
def _stop_progress_threads():
    """At exit, before Python stops its daemon threads: one stopped while
    it completes a torch future (C++ calling back into Python) would abort
    the process ("terminate called without an active exception"), as it
    did after kcolld died mid-training. Queued operations finish first
    (they fail at once when kcolld is gone); a hung one gets 5 s."""
    for q in list(_progress_threads.values()):
        q.put(None)
    for t in list(_progress_threads):
        t.join(timeout=5)


def _progress(q, hidden_error):
    """A group's progress thread: wait for its operations in submission
    order (kcoll_wait releases the GIL) and complete their futures."""
    try:
        _progress_loop(q, hidden_error)
    finally:
        _progress_threads.pop(threading.current_thread(), None)


def _progress_loop(q, hidden_error):
    while True:
        item = q.get()
        if item is None:
            return
        req, src, finish, from_cpp = item
        try:
            req.wait()
            src.set_result(finish())
        except Exception as e:  # the op failed: every waiter sees why (_unwrap)
            if from_cpp:
                # A C++ caller's wait() drops the error (torch 1.13's
                # future-wrapping Work): fail the group's next op instead.
                # Before the future completes: whoever it wakes must see it.
                hidden_error[0] = e
            src.set_result(e if isinstance(e, RuntimeError) else RuntimeError(str(e)))
        # Not kept until the next op: the item holds the op's tensors.
        item = req = src = finish = None


class ProcessGroupKcoll(ProcessGroup):
    def __init__(self, store, rank, size, timeout):
        super().__init__(rank, size)
        # The group's timeout is kcolld's hang timeout for this communicator
        # ($KCOLL_TIMEOUT_MS in the environment overrides it).
        ms = min(int(timeout.total_seconds() * 1000), 86400000)
        self._conn = kcoll.Connection(timeout_ms=max(ms, 1))
        if rank == 0:
            uid = self._conn.get_unique_id()
            store.set(_UID_KEY, uid)
        else:
            uid = store.get(_UID_KEY)
        self._comm = kcoll.Comm.init(uid, size, rank, self._conn)
        self._group_name = ""  # torch 2.x sets it (_set_group_name)
        # Plain tensors, zero-copy: see _cut. 0 turns it off.
        self._share_min = _knob("KCOLL_TORCH_SHARE_MIN_BYTES", _SHARE_MIN_DEFAULT)
        self._shared = _Shared(self._conn, _knob("KCOLL_TORCH_SHARE_MAX_BYTES", _SHARE_MAX_DEFAULT))
        # What the progress thread shares with the group; not the group
        # itself, so that dropping the group ends the thread (__del__).
        self._hidden_error = [None]
        self._queue = queue.SimpleQueue()
        t = threading.Thread(target=_progress, args=(self._queue, self._hidden_error),
                             name=f"kcoll-pg{rank}", daemon=True)
        _progress_threads[t] = self._queue
        t.start()

    def __del__(self):
        # Operations still queued finish first; their requests keep the
        # communicator (and it the connection) until then. A group whose
        # __init__ raised (no kcolld, a failed join) has no queue.
        q = getattr(self, "_queue", None)
        if q is not None:
            q.put(None)

    def getBackendName(self):
        return BACKEND

    def name(self):
        return BACKEND

    # torch 2.x names every group (_set_group_name) and reads the name back
    # (group_name) to unregister it in destroy_process_group(group). c10d's
    # ProcessGroup keeps the name in its c10d Backends, which a group
    # written in Python has none of: without these, destroying a kcoll
    # group other than the default one raised "ProcessGroup name not set"
    # (2.6). 1.13 calls neither.
    def _set_group_name(self, name):
        self._group_name = name

    @property
    def group_name(self):
        return self._group_name

    # ---- completion ----------------------------------------------------------

    def _work(self, req, finish):
        # The progress thread completes src with the result or the error;
        # fut, derived from it by then(), fails in C++ terms when _unwrap
        # raises. (Future.set_exception in 1.13 only marks the Python
        # wrapper: through C++, e.g. DDP or Work.get_future(), the future
        # looks successful, its value the exception object.)
        src = torch.futures.Future()
        fut = src.then(_unwrap)
        python = _python_caller(self)
        self._queue.put((req, src, finish, not python))
        return _Work(fut) if python else _create_work_from_future(fut)

    def _held(self, req, tensors):
        """req, counting this group's ops in flight on the tensors' storages
        until it is over (the progress thread waits for it)."""
        if not self._share_min:
            return req
        keys = [self._shared.key(t) for t in tensors if t.numel()]
        with self._shared.lock:
            self._shared.busy.update(keys)
        return _Held(req, keys, self._shared)

    def _cut(self, t, d, share=True):
        """How an all_reduce or broadcast of d (t, or t's contiguous copy)
        runs: None, as one kcoll op; or (ends, middle, put_back): d's first
        and last _END_BYTES staged in one small tensor, its middle in place,
        and what copies the staged ends back once both ops are done. The cut
        depends only on the size, so every rank cuts the same way; the
        middle is zero-copy where t's storage could be shared (a contiguous
        copy is not worth sharing: it is new every op)."""
        nbytes = d.numel() * d.element_size()
        if not self._share_min or nbytes < max(self._share_min, 4 * _END_BYTES):
            return None
        if d is t and share:
            self._shared.ensure(t)
        h = _END_BYTES // d.element_size()
        flat = d.view(-1)
        n = flat.numel()
        ends = torch.cat([flat[:h], flat[n - h:]])

        def put_back():
            flat[:h].copy_(ends[:h])
            flat[n - h:].copy_(ends[h:])
        return ends, flat[h:n - h], put_back

    def _enter(self):
        if self._hidden_error[0] is not None:
            raise RuntimeError(f"kcoll: an earlier operation of this group failed where torch "
                               f"could not report it: {self._hidden_error[0]}")

    # ---- collectives ------------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        self._enter()
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        op = _op(_reduce_op(opts))
        t = _one(tensors, "allreduce")
        return self._allreduce(tensors, t, _dense(t), op)

    def _allreduce(self, result, t, d, op, share=True):
        """All-reduce d (t, or t's contiguous copy) and copy it back into t;
        the Work's result is result. share=False: d is scratch of our own,
        not worth sharing with kcolld."""
        cut = self._cut(t, d, share)
        if cut is None:
            req = self._comm.allreduce(d, op=op)
            return self._work(self._held(req, [t]), lambda: _back(result, [(t, d)]))
        ends, middle, put_back = cut
        req = _Reqs([self._comm.allreduce(ends, op=op), self._comm.allreduce(middle, op=op)])
        return self._work(self._held(req, [t]), lambda: (put_back(), _back(result, [(t, d)]))[1])

    def reduce(self, tensors, opts=None):
        """reduce to opts.rootRank, as an all_reduce (kcolld has no rooted
        reduce, so it costs as much as one): the root's tensor gets the
        result, the others reduce a copy and keep theirs as it was."""
        self._enter()
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        op = _op(_reduce_op(opts))
        t = _one(tensors, "reduce")
        d = _dense(t)
        if self.rank() == _root(opts, self.size()):
            return self._allreduce(tensors, t, d, op)
        scratch = d.clone() if d is t else d
        return self._allreduce(tensors, scratch, scratch, op, share=False)

    def allgather(self, output_tensors, input_tensors, opts=None):
        self._enter()
        src = _dense(_one(input_tensors, "allgather"))
        return self._gather(output_tensors, src, _one(output_tensors, "allgather"), "allgather")

    def gather(self, output_tensors, input_tensors, opts=None):
        """gather to opts.rootRank, as an all_gather (every rank receives
        every piece, so it costs as much as one); only the root's list is
        filled."""
        self._enter()
        root = _root(opts, self.size())
        src = _dense(_one(input_tensors, "gather"))
        outs = _one(output_tensors, "gather") if self.rank() == root else None
        return self._gather(output_tensors, src, outs, "gather")

    def _gather(self, result, src, outs, what):
        """All-gather src into one flat tensor, then copy its pieces into
        outs (None: a gather's other ranks keep nothing); the Work's result
        is result."""
        if outs is not None:
            if len(outs) != self.size():
                raise RuntimeError(f"kcoll: {what} needs {self.size()} output tensors, got {len(outs)}")
            for o in outs:
                _check(o)
                if o.numel() != src.numel() or o.dtype != src.dtype:
                    raise RuntimeError(f"kcoll: {what} output tensors must match the input's size and dtype")
        flat = torch.empty(src.numel() * self.size(), dtype=src.dtype)
        req = self._comm.allgather(src, flat)

        def finish():
            for o, piece in zip(outs or [], flat.split(src.numel())):
                o.copy_(piece.view(o.shape))
            return result
        return self._work(req, finish)

    def _allgather_base(self, output, input, opts=None):
        self._enter()
        src, dst = _dense(input), _dense(output)
        req = self._comm.allgather(src, dst)
        return self._work(self._held(req, [output]), lambda: _back([output], [(output, dst)]))

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        self._enter()
        out = _one(output_tensors, "reduce_scatter")
        ins = _one(input_tensors, "reduce_scatter")
        if len(ins) != self.size():
            raise RuntimeError(f"kcoll: reduce_scatter needs {self.size()} input tensors, got {len(ins)}")
        for i in ins:
            _check(i)
        flat = torch.cat([i.reshape(-1) for i in ins])
        d = _dense(out)
        req = self._comm.reduce_scatter(flat, d, op=_op(_reduce_op(opts)))
        return self._work(self._held(req, [out]), lambda: _back(output_tensors, [(out, d)]))

    def _reduce_scatter_base(self, output, input, opts=None):
        self._enter()
        src, dst = _dense(input), _dense(output)
        req = self._comm.reduce_scatter(src, dst, op=_op(_reduce_op(opts)))
        return self._work(self._held(req, [output]), lambda: _back([output], [(output, dst)]))

    def broadcast(self, tensors, opts=None):
        self._enter()
        t = _one(tensors, "broadcast")
        root = _root(opts, self.size())
        d = _dense(t)
        cut = self._cut(t, d)
        if cut is None:
            req = self._comm.broadcast(d, root=root)
            return self._work(self._held(req, [t]), lambda: _back(tensors, [(t, d)]))
        ends, middle, put_back = cut
        req = _Reqs([self._comm.broadcast(ends, root=root), self._comm.broadcast(middle, root=root)])
        return self._work(self._held(req, [t]), lambda: (put_back(), _back(tensors, [(t, d)]))[1])

    def barrier(self, opts=None):
        self._enter()
        return self._work(self._comm.barrier(), lambda: [])

    # ---- what kcoll does not do (yet): say so, and what to use -------------------

    def _unsupported(self, what, instead=None):
        also = f" ({instead} is)" if instead else ""
        raise RuntimeError(f"kcoll: {what} is not supported by the kcoll backend{also}; {_GLOO_HINT}")

    def send(self, *a, **k):
        self._unsupported("send")

    def recv(self, *a, **k):
        self._unsupported("recv")

    def recv_anysource(self, *a, **k):
        self._unsupported("recv")

    def scatter(self, *a, **k):
        self._unsupported("scatter")

    def alltoall(self, *a, **k):
        self._unsupported("all_to_all")

    def alltoall_base(self, *a, **k):
        self._unsupported("all_to_all_single")

    def allreduce_coalesced(self, *a, **k):
        self._unsupported("all_reduce_coalesced")

    def allgather_coalesced(self, *a, **k):
        self._unsupported("all_gather_coalesced")

    def monitored_barrier(self, *a, **k):
        self._unsupported("monitored_barrier", "barrier")


def _back(result, pairs):
    """Copy results made in contiguous stand-ins back into their tensors."""
    for t, d in pairs:
        if d is not t:
            t.copy_(d)
    return result


def _device_backends():
    """The device -> backend map of the group torch 2.x is making, as the
    _new_process_group_helper frame that called the creator holds it (the
    creator's arguments do not carry it); None where that is not found."""
    f = sys._getframe(1)
    for _ in range(8):
        if f is None:
            return None
        if f.f_code.co_name == "_new_process_group_helper":
            get = getattr(f.f_locals.get("backend_config"), "get_device_backend_map", None)
            return dict(get()) if get else None
        f = f.f_back
    return None


def _create(store, rank, size, timeout):
    m = _device_backends()
    if m and set(m.values()) != {BACKEND}:
        # torch uses a ProcessGroup a creator returns as the whole group:
        # "cuda:nccl,cpu:kcoll" would drop nccl, "cpu:kcoll,cuda:nccl"
        # would send CUDA tensors here. Refuse it now, not at the first
        # CUDA collective.
        spec = ",".join(f"{d}:{b}" for d, b in m.items())
        raise RuntimeError(f"kcoll: backend '{spec}': kcoll cannot serve only some devices of a "
                           "group (torch gives a process group written in Python, as kcoll's is, "
                           "every device of it); make the group with the other backend and a "
                           "second one for CPU tensors: dist.new_group(backend='kcoll')")
    return ProcessGroupKcoll(store, rank, size, timeout)


def empty(*size, dtype=None, device=None, requires_grad=False, group=None):
    """A CPU tensor in memory that kcolld maps for group's connection
    (default: the default group), like torch.empty(*size, dtype=dtype,
    device=device, requires_grad=requires_grad); device must be the CPU.

    Collectives of that group on it are zero-copy from the first op, with
    no kcoll_mem_share (whose first use copies the pages) and for every
    dtype kcoll takes, bf16 included. Freed once the tensor and every view
    of it are gone; it stays valid after the group is destroyed (other
    groups see plain memory and share or copy it as usual)."""
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    size = tuple(int(d) for d in size)
    if any(d < 0 for d in size):
        raise ValueError(f"kcoll.torch.empty: negative dimension in {size}")
    if device is not None and torch.device(device).type != "cpu":
        raise ValueError(f"kcoll.torch.empty: device {device}: kcoll memory is host memory (CPU "
                         "tensors only); allocate device tensors with torch.empty")
    dtype = dtype or torch.get_default_dtype()
    if dtype not in _SUPPORTED:
        raise TypeError(f"kcoll.torch.empty: dtype {dtype} is not one kcoll takes (f16, bf16, f32, "
                        "f64, i8, u8, i32, i64)")
    if group is None:
        if not torch.distributed.is_initialized():
            raise RuntimeError("kcoll.torch.empty: no default process group: call "
                               "dist.init_process_group('kcoll') first, or pass group=")
        group = torch.distributed.distributed_c10d._get_default_group()
    if not isinstance(group, ProcessGroupKcoll):
        name = getattr(group, "name", lambda: type(group).__name__)()
        raise ValueError(f"kcoll.torch.empty: group is a {name} group, not a kcoll one: pass a "
                         "group made with backend 'kcoll' (dist.new_group(backend='kcoll'))")
    n = math.prod(size)
    if n == 0:
        return torch.empty(size, dtype=dtype, requires_grad=requires_grad)
    nbytes = n * torch.empty((), dtype=dtype).element_size()
    raw = group._conn.mem_alloc(nbytes)  # bytes: numpy has no bf16
    # frombuffer holds raw, and raw its kcoll memory, for the tensor's life.
    return torch.frombuffer(raw, dtype=dtype).view(size).requires_grad_(requires_grad)


# Unless registered already: imported again (importlib.reload, a second
# copy of the package), or by _kcoll_torch.autoload (torch 2.5+, pip).
_kcoll_torch.register(_create)

__all__ = ["ProcessGroupKcoll", "BACKEND", "empty"]
