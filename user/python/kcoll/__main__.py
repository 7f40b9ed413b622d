# SPDX-License-Identifier: MIT
"""python3 -m kcoll: can this Python use kcoll, and if not, why.

Says which package and libkcoll it loaded, which kcolld socket it uses and
whether a one-rank all-reduce through that daemon works, whether this
process has a CUDA driver (device memory for kcoll.Comm), and what numpy and
torch offer (the "kcoll" torch.distributed backend; CUDA tensors). Exit
status 0 when the all-reduce worked, 1 when it did not, 2 on bad usage.
The text to paste into a bug report; --json for scripts."""
import argparse
import ctypes
import importlib
import json
import os
import sys
import time

import kcoll
from kcoll import _lib


def _daemon(socket_path, timeout_ms):
    d = {"socket": socket_path or os.environ.get("KCOLL_SOCKET") or _lib.DEFAULT_SOCKET,
         "ok": False}
    try:
        conn = kcoll.Connection(socket_path, timeout_ms=timeout_ms)
    except kcoll.KcollError as e:
        d["error"] = str(e)  # libkcoll's text says what to do
        return d
    try:
        uid = conn.get_unique_id()
        with kcoll.Comm.init(uid, 1, 0, conn) as comm:
            buf = bytearray((7).to_bytes(4, "little") * 4)
            t0 = time.perf_counter()
            comm.allreduce(buf, dtype="i32").wait(timeout_ms / 1000)
            d["allreduce_us"] = round((time.perf_counter() - t0) * 1e6, 1)
        d["ok"] = buf == bytearray((7).to_bytes(4, "little") * 4)
        if not d["ok"]:
            d["error"] = "a one-rank all-reduce changed its data"
    except kcoll.KcollError as e:
        d["error"] = str(e)
    finally:
        conn.close()
    return d


def _cuda():
    """The CUDA driver this process would use for device memory: its version
    and device count, or why there is none. Loads libcuda.so.1, nothing more
    (no context)."""
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        return {"driver": None, "devices": 0, "error": f"no CUDA driver: {e}"}
    r = cu.cuInit(0)
    if r:
        name = ctypes.c_char_p()
        cu.cuGetErrorName(r, ctypes.byref(name))
        what = name.value.decode() if name.value else f"CUresult {r}"
        return {"driver": None, "devices": 0, "error": f"cuInit: {what}"}
    v, n = ctypes.c_int(), ctypes.c_int()
    if cu.cuDriverGetVersion(ctypes.byref(v)) or cu.cuDeviceGetCount(ctypes.byref(n)):
        return {"driver": None, "devices": 0, "error": "the driver answers neither its version "
                "nor its device count"}
    return {"driver": f"{v.value // 1000}.{v.value % 1000 // 10}", "devices": n.value}


def _numpy():
    try:
        import numpy
    except ImportError as e:
        return {"version": None, "error": f"{e} (Debian: apt-get install python3-numpy)"}
    return {"version": numpy.__version__}


def _torch():
    try:
        import torch
    except ImportError as e:
        return {"version": None, "error": f"{e} (Debian: apt-get install python3-torch)"}
    t = {"version": torch.__version__, "cuda": torch.version.cuda,
         "cuda_available": bool(torch.cuda.is_available())}
    try:
        import torch.distributed as dist
        # Registered by import torch alone: the pip-installed entry point
        # (_kcoll_torch.autoload, torch 2.5+).
        t["autoload"] = _has_kcoll(dist)
        importlib.import_module("kcoll.torch")  # registers the backend
        t["backend"] = "kcoll" if _has_kcoll(dist) else None
        if not t["backend"]:
            t["error"] = "kcoll.torch imported but torch.distributed lists no 'kcoll' backend"
    except Exception as e:  # any import failure is what this tool reports
        t["backend"] = None
        t["error"] = f"import kcoll.torch: {e!r}"
    return t


def _has_kcoll(dist):
    b = getattr(dist, "Backend", None)
    names = getattr(b, "backend_list", None)
    if names is None:  # torch 1.13: the registered names are Backend's attributes
        names = [v for k, v in vars(b).items() if k.isupper() and isinstance(v, str)]
    return "kcoll" in [str(n).lower() for n in names]


def report(socket_path=None, timeout_ms=5000):
    return {"kcoll": {"package": os.path.dirname(kcoll.__file__), "libkcoll": _lib.path,
                      "version": kcoll.version()},
            "python": sys.version.split()[0], "executable": sys.executable,
            "daemon": _daemon(socket_path, timeout_ms), "cuda": _cuda(), "numpy": _numpy(),
            "torch": _torch()}


def _text(r):
    k, d, n, t = r["kcoll"], r["daemon"], r["numpy"], r["torch"]
    out = [f"kcoll {k['version']}: package {k['package']}", f"libkcoll: {k['libkcoll']}",
           f"python: {r['python']} ({r['executable']})"]
    if d["ok"]:
        out.append(f"kcolld: {d['socket']}: a one-rank all-reduce worked ({d['allreduce_us']} us)")
    else:
        out.append(f"kcolld: {d['socket']}: NOT usable: {d['error']}")
    c = r["cuda"]
    if c["driver"]:
        out.append(f"cuda: driver {c['driver']}, {c['devices']} device(s): device memory "
                   "(__cuda_array_interface__) can go to kcoll.Comm")
    else:
        out.append(f"cuda: none ({c['error']}): host memory only")
    out.append(f"numpy: {n['version']}" if n["version"] else f"numpy: missing: {n['error']}")
    if not t["version"]:
        out.append(f"torch: missing: {t['error']}")
    else:
        out.append(f"torch: {t['version']}, CUDA {t['cuda'] or 'not built in'}"
                   f"{', a GPU is available' if t['cuda_available'] else ''}")
        out.append("torch.distributed backend 'kcoll': " +
                   (f"registered (CPU tensors; {_how(t)})" if t.get("backend")
                    else f"NOT registered: {t['error']}"))
    return "\n".join(out)


def _how(t):
    if t.get("autoload"):
        return "by import torch itself: no import kcoll.torch needed"
    return "by import kcoll.torch"


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m kcoll", description=__doc__.split("\n\n")[0])
    ap.add_argument("-s", "--socket", help="kcolld's socket (default: $KCOLL_SOCKET, else "
                    f"{_lib.DEFAULT_SOCKET})")
    ap.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS",
                    help="give up on the daemon after this long (default 5)")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    a = ap.parse_args(argv)
    if a.timeout <= 0:
        ap.error("--timeout must be positive")
    r = report(a.socket, int(a.timeout * 1000))
    print(json.dumps(r, indent=2) if a.json else _text(r))
    return 0 if r["daemon"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
