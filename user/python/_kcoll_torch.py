# SPDX-License-Identifier: MIT
"""Registering the torch.distributed backend "kcoll", without loading kcoll.

torch 2.5 and later call the entry points of the group "torch.backends"
while ``import torch`` runs; a pip-installed kcoll names autoload() there
(user/python/pyproject.toml), so that ``init_process_group("kcoll")`` works
with no ``import kcoll.torch`` in the script. autoload() registers a
creator that imports kcoll.torch when the first kcoll group is made, not
before: ``import torch`` loads no libkcoll, and a missing libkcoll or
kcolld is an error of init_process_group("kcoll"), saying why, never of
``import torch``. KCOLL_TORCH_AUTOLOAD=0 turns it off (as does torch's
TORCH_DEVICE_BACKEND_AUTOLOAD=0 for every extension).

This module lives outside the kcoll package because importing anything in
the package loads libkcoll. kcoll.torch registers through register() too.
"""
import inspect
import os
import warnings

BACKEND = "kcoll"


def register(create):
    """Register create as the "kcoll" backend's creator, unless registered
    already (kcoll.torch imported after autoload, or imported twice).
    Returns whether this call registered it."""
    import torch.distributed as dist

    if BACKEND.upper() in getattr(dist.Backend, "_plugins", {}):
        return False
    if "devices" in inspect.signature(dist.Backend.register_backend).parameters:
        # torch 2.x: say which devices the backend serves so a default
        # "cpu:gloo,cuda:nccl"-style mapping does not route CUDA here.
        dist.Backend.register_backend(BACKEND, create, devices=["cpu"])
    else:
        dist.Backend.register_backend(BACKEND, create)
    return True


def _create(store, rank, size, timeout):
    try:
        import kcoll.torch
    except Exception as e:
        raise RuntimeError(f"kcoll: the torch.distributed backend 'kcoll' cannot load: {e}") from e
    return kcoll.torch._create(store, rank, size, timeout)


def autoload():
    """The "torch.backends" entry point. Never raises: torch turns an
    exception here into a failed ``import torch`` for every program of
    this Python environment."""
    if os.environ.get("KCOLL_TORCH_AUTOLOAD", "1") == "0":
        return
    try:
        import torch.distributed as dist

        if dist.is_available():
            register(_create)
    except Exception as e:
        warnings.warn(f"kcoll: could not register the torch.distributed backend 'kcoll' "
                      f"({type(e).__name__}: {e}); import kcoll.torch to register it by hand",
                      RuntimeWarning, stacklevel=2)
