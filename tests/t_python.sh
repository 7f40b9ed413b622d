#!/usr/bin/env bash
# The Python package (user/python/kcoll) and its torch.distributed backend
# against the kcolld at $KCOLL_SOCKET: numpy ranks (no torch) at 2 and 3
# ranks; torch ranks at 2, 3 and 4 with env://, file:// and tcp:// init,
# every collective x dtype x op against a reference and gloo, async ops,
# strided and empty tensors, refusals, DDP, skipped and mismatched ops,
# kcolld killed mid-training (manual all_reduce and DDP).
# tests/python/launch.py runs the ranks; tests/python_lib.sh (shared with
# t_python_torch2.sh, torch 2.x) numbers its lines and holds the torch
# part. TAP.
# Needs /usr/bin/python3 with numpy (and torch for the torch part): Debian's
# python3-numpy, python3-torch; the first python3 on PATH may lack them.
set -u
. "${KCOLL_TOP:?run through tests/run.sh}/tests/python_lib.sh"
pick_python
py_asan_preload || { skip "$why"; echo "1..$n"; exit 0; }

if ! "$PY" -c 'import numpy' 2>/dev/null; then
	skip "numpy missing for $PY (apt-get install python3-numpy): package tests"
else
	"$PY" -c 'import kcoll, sys; sys.exit(0 if kcoll._lib.path == sys.argv[1] else 1)' "$KCOLL_LIB"
	ok $? "kcoll loads libkcoll from \$KCOLL_LIB ($KCOLL_LIB)"
	out=$(KCOLL_LIB="$B/lib/none.so" "$PY" -c 'import kcoll' 2>&1)
	[ $? -ne 0 ] && grep -q "KCOLL_LIB" <<<"$out"; ok $? "a missing \$KCOLL_LIB fails the import, naming the knob"
	for w in 2 3; do
		launch 40 "$TOP/tests/python/np_rank.py" $w "numpy $w" 30
	done
fi

if ! "$PY" -c 'import torch, numpy' 2>/dev/null; then
	skip "torch missing for $PY (apt-get install python3-torch): torch.distributed backend tests"
else
	torch_checks
fi
echo "1..$n"
exit $failed
