#!/usr/bin/env bash
# kcoll.torch's zero-copy path for plain tensors (their storages shared with
# kcolld in place by kcoll_mem_share): tests/python/torch_share.py at 2, 3
# and 4 ranks on one host against the kcolld at $KCOLL_SOCKET. Sharing
# leaves every byte alone; all_reduce every dtype x op and broadcast
# against a reference and gloo; kcolld copies only the staged ends (its
# counters, with a control that copies); LRU eviction, a freed tensor,
# async, small and strided tensors. The 4-host run is in
# t_python_cluster.sh, torch 2.x's (2 and 4 ranks) in
# t_python_torch2_share.sh. TAP.
# Needs /usr/bin/python3 with torch and numpy (python3-torch, python3-numpy).
set -u
. "${KCOLL_TOP:?run through tests/run.sh}/tests/python_lib.sh"
pick_python
py_asan_preload || { skip "$why"; echo "1..$n"; exit 0; }

if ! "$PY" -c 'import torch, numpy' 2>/dev/null; then
	skip "torch missing for $PY (apt-get install python3-torch python3-numpy): zero-copy tensor tests"
else
	worlds=(2 3 4)
	[ -n "${KCOLL_TEST_SAN:-}" ] && worlds=(2)	# ASan slows every rank
	share_checks "${worlds[@]}"
fi
echo "1..$n"
exit $failed
