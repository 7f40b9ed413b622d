#!/usr/bin/env bash
# kcoll.torch's zero-copy path for plain tensors (storages shared with
# kcolld in place, kcoll_mem_share) under torch 2.x: the checks of
# t_python_share.sh (tests/python/torch_share.py) at 2 and 4 ranks, run by
# the python3 (3.13) and torch (2.x) of the Debian 13 root that
# scripts/torch2-root.sh builds, as t_python_torch2.sh runs the other torch
# checks (tests/python_lib.sh's torch2_enter: chrooted python3 in a private
# mount namespace; a missing root is a SKIP, or a failure with CI=true or
# KCOLL_TORCH2=1). 3 ranks run under torch 1.13 only (CI time: each world
# here costs about 20-30 s). TAP.
set -u
. "${KCOLL_TOP:?run through tests/run.sh}/tests/python_lib.sh"
torch2_enter
share_checks 2 4
torch2_leave
echo "1..$n"
exit $failed
