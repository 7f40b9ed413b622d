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
PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3)

if [ -n "${KCOLL_TEST_SAN:-}" ]; then
	# As in t_python.sh: the ASan runtime first in python, libstdc++ after it.
	asan=$(${CC:-gcc} -print-file-name=libasan.so 2>/dev/null)
	cxx=$(${CC:-gcc} -print-file-name=libstdc++.so.6 2>/dev/null)
	if [ ! -f "$asan" ] || [ ! -f "$cxx" ]; then
		skip "ASan build: no libasan.so/libstdc++.so.6 to preload into python (gcc -print-file-name)"
		echo "1..$n"; exit 0
	fi
	export LD_PRELOAD="$asan $cxx" ASAN_OPTIONS="detect_leaks=0:abort_on_error=1"
fi

if ! "$PY" -c 'import torch, numpy' 2>/dev/null; then
	skip "torch missing for $PY (apt-get install python3-torch python3-numpy): zero-copy tensor tests"
else
	worlds=(2 3 4)
	[ -n "${KCOLL_TEST_SAN:-}" ] && worlds=(2)	# ASan slows every rank
	share_checks "${worlds[@]}"
fi
echo "1..$n"
exit $failed
