#!/usr/bin/env bash
# The torch.distributed backend (import kcoll.torch) under torch 2.x: the
# same checks as t_python.sh's torch part (tests/python_lib.sh's
# torch_checks: every collective x dtype x op against a reference and gloo in
# the same processes, async ops, strided and empty tensors, mismatched and
# skipped ops raise instead of hanging, DDP parity with gloo, imported twice,
# kcolld killed mid-training; then the package pip-installed into a venv,
# where torch registers the backend with no import of kcoll.torch), run by
# the python3 (3.13) and python3-torch
# (2.x) of a Debian 13 root that scripts/torch2-root.sh builds at
# ${KCOLL_TORCH2_ROOT:-/var/cache/kcoll/torch2-root}. Debian 12 ships torch
# 1.13 only. This tree's libkcoll and kcolld (the host's, at $KCOLL_SOCKET)
# serve it; tests/python_lib.sh's torch2_enter says how python3 runs in the
# root (chrooted, in a private mount namespace) and when a missing root is
# a SKIP (by default) or a failure (CI=true or KCOLL_TORCH2=1). The share
# path (tensors of 1 MiB and more) is t_python_torch2_share.sh's. TAP.
set -u
. "${KCOLL_TOP:?run through tests/run.sh}/tests/python_lib.sh"
torch2_enter
torch_checks
torch2_autoload_checks
torch2_leave
echo "1..$n"
exit $failed
