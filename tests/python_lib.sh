# shellcheck shell=bash
# shellcheck disable=SC2034 # n, failed are the sourcing test's
# What t_python.sh (Debian 12's python3 and torch 1.13) and
# t_python_torch2.sh (torch 2.x in a Debian 13 root) share: TAP numbering of
# tests/python/launch.py's lines and the torch.distributed checks. Sourced
# right after `set -u`; the test sets PY, the python3 that runs launch.py and
# the ranks (a plain path or a wrapper that enters a root).
shopt -s lastpipe	# emit, at the end of a pipe, counts in this shell
B=${KCOLL_BUILD:?run through tests/run.sh}
TOP=${KCOLL_TOP:?run through tests/run.sh}
n=0 failed=0
export PYTHONPATH="$TOP/user/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1	# leave no __pycache__ in the source tree
export KCOLL_LIB="$B/lib/libkcoll.so.1"
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

# The torch.distributed backend with $PY: torch_rank.py at 2 ranks (env://),
# 3 (file://) and 4 (tcp://): every collective x dtype x op against a
# reference and gloo, async, strided and empty tensors, refusals, DDP,
# mismatched and skipped ops, imported twice; then kcolld killed
# mid-training (torch_kill.py, manual all_reduce and DDP).
torch_checks() {
	local specs spec kt kpid mode
	specs=("2 env" "3 file" "4 tcp")
	# ASan slows every rank: the sanitizer pass keeps to 2 ranks (~40 s).
	# 120 s per pass leaves room for a loaded machine
	# (4 ranks importing torch on 2 busy cores passed 60 s) and still
	# ends a hang.
	[ -n "${KCOLL_TEST_SAN:-}" ] && specs=("2 env")
	for spec in "${specs[@]}"; do
		set -- $spec
		launch 150 "$TOP/tests/python/torch_rank.py" "$1" "torch $1 $2://" 120 "$2"
	done
	# kcolld killed mid-training: a private kcolld, SIGKILLed by launch.py
	# once both ranks trained 3 steps; every rank must raise, not hang.
	# (The plain pass only: under ASan the same libkcoll path runs in
	# test_faults' daemon-death cases.)
	[ -z "${KCOLL_TEST_SAN:-}" ] || return 0
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
}
