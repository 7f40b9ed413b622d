# SPDX-License-Identifier: MIT
"""Finding libkcoll and declaring its functions for ctypes.

ctypes.CDLL releases the GIL around every call, so a blocking libkcoll call
(kcoll_wait, kcoll_comm_init_rank) never stalls the interpreter's other
threads.
"""
import ctypes
import os
import pathlib

UNIQUE_ID_BYTES = 128  # KCOLL_UNIQUE_ID_BYTES in <kcoll/kcoll.h>
DEFAULT_SOCKET = "/run/kcoll/kcolld.sock"  # KCOLL_DEFAULT_SOCKET in <kcoll/kcoll.h>

# enum kcoll_dtype / enum kcoll_redop in <linux/kcoll.h>; the ABI fixes these.
F32, F64, F16, BF16, I8, U8, I32, U32, I64, U64 = range(10)
SUM, PROD, MIN, MAX, AVG = range(5)


class UniqueId(ctypes.Structure):
    _fields_ = [("bytes", ctypes.c_uint8 * UNIQUE_ID_BYTES)]


class Status(ctypes.Structure):
    """struct kcoll_status: a finished request's result and blamed rank."""
    _fields_ = [("result", ctypes.c_int), ("err_rank", ctypes.c_int), ("reserved", ctypes.c_uint32 * 2)]


# KV-cache transfers (<kcoll/kcoll.h>, <linux/kcoll.h>); kcoll.kv uses them.
SEG_DESC_BYTES = 128
XFER_MAX_ENTRIES = 4096
SEG_MAX_NOTIFY = 1024
NOTIFY_NONE = 0xFFFFFFFF
NOTIF_MAX_BYTES = 512
NOTIF_WAIT_MAX = 128  # KCOLL_NOTIF_WAIT_MAX: segments per kcoll_seg_notif_wait_any
SEG_NOTIF_QUEUE = 256
SEG_F_GRANT_UID = 1


class SegDesc(ctypes.Structure):
    _fields_ = [("bytes", ctypes.c_uint8 * SEG_DESC_BYTES)]


class SegOpts(ctypes.Structure):
    _fields_ = [("size", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                ("nr_notify", ctypes.c_uint32), ("grant_uid", ctypes.c_uint32)]


class Notif(ctypes.Structure):
    _fields_ = [("size", ctypes.c_uint32), ("flags", ctypes.c_uint32), ("sender", ctypes.c_uint64),
                ("notify_id", ctypes.c_uint32), ("len", ctypes.c_uint32),
                ("data", ctypes.c_uint8 * NOTIF_MAX_BYTES)]


def _candidates():
    env = os.environ.get("KCOLL_LIB")
    if env:
        # Named explicitly: no silent fallback to another build.
        return [env]
    top = pathlib.Path(__file__).resolve().parents[3]
    return [str(top / "build" / "lib" / "libkcoll.so.1"), "libkcoll.so.1"]


def _load():
    errors = []
    for path in _candidates():
        if "/" in path and not os.path.exists(path):
            errors.append(f"{path}: no such file")
            continue
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            errors.append(f"{path}: {e}")
    raise ImportError("kcoll: cannot load libkcoll (set KCOLL_LIB to its path, or run make): "
                      + "; ".join(errors))


lib, path = _load()

_p = ctypes.c_void_p
_pp = ctypes.POINTER(ctypes.c_void_p)
_i = ctypes.c_int
_sz = ctypes.c_size_t
_u32 = ctypes.c_uint32

_protos = {
    "kcoll_connect": (_i, [_p, _pp]),
    "kcoll_disconnect": (None, [_p]),
    "kcoll_version": (ctypes.c_char_p, []),
    "kcoll_get_unique_id": (_i, [_p, ctypes.POINTER(UniqueId)]),
    "kcoll_comm_init_rank": (_i, [_p, ctypes.POINTER(UniqueId), _i, _i, _pp]),
    "kcoll_comm_destroy": (_i, [_p]),
    "kcoll_comm_rank": (_i, [_p]),
    "kcoll_comm_size": (_i, [_p]),
    "kcoll_allreduce": (_i, [_p, _p, _p, _sz, _i, _i, _pp]),
    "kcoll_reduce_scatter": (_i, [_p, _p, _p, _sz, _i, _i, _pp]),
    "kcoll_allgather": (_i, [_p, _p, _p, _sz, _i, _pp]),
    "kcoll_broadcast": (_i, [_p, _p, _sz, _i, _i, _pp]),
    "kcoll_barrier": (_i, [_p, _pp]),
    "kcoll_test": (_i, [_p, ctypes.POINTER(_i)]),
    "kcoll_wait": (_i, [_p, _i]),
    "kcoll_timedwait": (_i, [_p, _i, ctypes.POINTER(_i)]),
    "kcoll_wait_status": (_i, [_p, _i, ctypes.POINTER(Status)]),
    "kcoll_mem_alloc": (_i, [_p, _sz, _pp]),
    "kcoll_mem_free": (_i, [_p, _p]),
    "kcoll_mem_deregister": (_i, [_p, _p]),
    "kcoll_dtype_size": (_sz, [_i]),
    "kcoll_strerror": (ctypes.c_char_p, [_i]),
    "kcoll_seg_register": (_i, [_p, _p, _sz, ctypes.POINTER(SegOpts), _pp]),
    "kcoll_seg_unregister": (_i, [_p]),
    "kcoll_seg_export": (_i, [_p, ctypes.POINTER(SegDesc)]),
    "kcoll_seg_import": (_i, [_p, ctypes.POINTER(SegDesc), _pp]),
    "kcoll_rseg_close": (_i, [_p]),
    "kcoll_rseg_size": (ctypes.c_uint64, [_p]),
    "kcoll_xfer_write_notif": (_i, [_p, _p, _p, _u32, _u32, _p, _u32, _pp]),
    "kcoll_xfer_read_notif": (_i, [_p, _p, _p, _u32, _u32, _p, _u32, _pp]),
    "kcoll_xfer_write": (_i, [_p, _p, _p, _u32, _u32, _pp]),
    "kcoll_xfer_read": (_i, [_p, _p, _p, _u32, _u32, _pp]),
    "kcoll_seg_notify_get": (_i, [_p, _u32, ctypes.POINTER(_u32)]),
    "kcoll_seg_notify_wait": (_i, [_p, _u32, _u32, _i]),
    "kcoll_seg_get_notifs": (_i, [_p, ctypes.POINTER(Notif), _u32, ctypes.POINTER(_u32)]),
    "kcoll_seg_notif_wait": (_i, [_p, _i]),
    "kcoll_xfer_plan": (_i, [_p, _sz, ctypes.c_uint64, ctypes.c_uint64, _i,
                             ctypes.POINTER(_sz)]),
}
# Newer than libkcoll 1.0: absent from an older library (mem_share is then
# None and kcoll.torch does without it; without notif_wait_any, kcoll.kv
# polls several segments every millisecond).
_optional = {
    "kcoll_mem_share": (_i, [_p, _p, _sz, _pp, ctypes.POINTER(_sz)]),  # KCOLL_1.4
    "kcoll_seg_notif_wait_any": (_i, [_p, _u32, _i]),  # KCOLL_1.5
}
for _name, (_res, _args) in list(_protos.items()) + list(_optional.items()):
    _f = getattr(lib, _name, None)
    if _f is None and _name in _optional:
        continue
    _f.restype = _res
    _f.argtypes = _args
mem_share = getattr(lib, "kcoll_mem_share", None)
notif_wait_any = getattr(lib, "kcoll_seg_notif_wait_any", None)


def strerror(err):
    return lib.kcoll_strerror(err).decode(errors="replace")
