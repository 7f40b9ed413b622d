#!/usr/bin/env bash
# The Python package (user/python/kcoll) and its torch.distributed backend
# against the kcolld at $KCOLL_SOCKET: numpy ranks (no torch) at 2 and 3
# ranks; torch ranks at 2, 3 and 4 with env://, file:// and tcp:// init,
# every collective x dtype x op against a reference and gloo, async ops,
# strided and empty tensors, refusals, DDP, skipped and mismatched ops,
# kcolld killed mid-training (manual all_reduce and DDP).
# tests/python/launch.py runs the ranks; this numbers its lines. TAP.
# Needs /usr/bin/python3 with numpy (and torch for the torch part): Debian's
# python3-numpy, python3-torch; the first python3 on PATH may lack them.
set -u
shopt -s lastpipe	# emit, at the end of a pipe, counts in this shell
B=${KCOLL_BUILD:?run through tests/run.sh}
TOP=${KCOLL_TOP:?run through tests/run.sh}
PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3)
n=0 failed=0
emit() {	# number launch.py's "ok - ..." / "not ok - ..." lines
	local line
	while IFS= read -r line; do
		case "$line" in
		"ok - "*) n=$((n + 1)); echo "ok $n - ${line#ok - }" ;;
		"not ok - "*) n=$((n + 1)); failed=1; echo "not ok $n - ${line#not ok - }" ;;
		*) echo "$line" ;;
		esac
	done
}
launch() {	# TIMEOUT_S launch.py-args...: run it, number its lines, catch a hang
	local limit=$1 rc; shift
	timeout -k 5 "$limit" "$PY" "$TOP/tests/python/launch.py" "$@" 2>&1 | emit
	rc=${PIPESTATUS[0]}
	if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then ok 1 "launch.py $* finished within $limit s"; fi
}
skip() { n=$((n + 1)); echo "ok $n # SKIP $1"; }
ok() { n=$((n + 1)); if [ "$1" -eq 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; failed=1; fi; }

export PYTHONPATH="$TOP/user/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1	# leave no __pycache__ in the source tree
export KCOLL_LIB="$B/lib/libkcoll.so.1"
if [ -n "${KCOLL_TEST_SAN:-}" ]; then
	# An ASan libkcoll loads into python only with the ASan runtime first in
	# the process, and libstdc++ right after it (else ASan finds no
	# __cxa_throw to intercept once torch loads); python's own allocations
	# at exit are not ours to judge.
	asan=$(${CC:-gcc} -print-file-name=libasan.so 2>/dev/null)
	cxx=$(${CC:-gcc} -print-file-name=libstdc++.so.6 2>/dev/null)
	if [ ! -f "$asan" ] || [ ! -f "$cxx" ]; then
		skip "ASan build: no libasan.so/libstdc++.so.6 to preload into python (gcc -print-file-name)"
		echo "1..$n"; exit 0
	fi
	export LD_PRELOAD="$asan $cxx" ASAN_OPTIONS="detect_leaks=0:abort_on_error=1"
fi

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
	specs=("2 env" "3 file" "4 tcp")
	# ASan slows every rank: the sanitizer pass keeps to 2 ranks (~40 s).
	[ -n "${KCOLL_TEST_SAN:-}" ] && specs=("2 env")
	for spec in "${specs[@]}"; do
		set -- $spec
		launch 75 "$TOP/tests/python/torch_rank.py" $1 "torch $1 $2://" 60 $2
	done
	# kcolld killed mid-training: a private kcolld, SIGKILLed by launch.py
	# once both ranks trained 3 steps; every rank must raise, not hang.
	# (The plain pass only: under ASan the same libkcoll path runs in
	# test_faults' daemon-death cases.)
	if [ -z "${KCOLL_TEST_SAN:-}" ]; then
		kt=$(mktemp -d "${KCOLL_TEST_TMP:-/tmp}/pykill.XXXXXX")
		for mode in manual ddp; do
			"$B/bin/kcolld" -f -s "$kt/k.sock" -l "$kt/k-$mode.log" &
			kpid=$!
			for _ in $(seq 100); do [ -S "$kt/k.sock" ] && break; sleep 0.05; done
			KCOLL_SOCKET="$kt/k.sock" KCOLL_TEST_KILL_PID=$kpid KCOLL_TEST_KILL_MODE=$mode \
				launch 90 "$TOP/tests/python/torch_kill.py" 2 "torch kcolld killed, $mode" 75 env
			wait "$kpid" 2>/dev/null
			rm -f "$kt/k.sock"
		done
		rm -rf "$kt"
	fi
fi
echo "1..$n"
exit $failed
