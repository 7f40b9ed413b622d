# shellcheck shell=bash
# shellcheck disable=SC2034 # n, failed are the sourcing test's
# What t_python.sh and t_python_share.sh (Debian 12's python3 and torch
# 1.13) and t_python_torch2.sh and t_python_torch2_share.sh (torch 2.x in a
# Debian 13 root) share: TAP numbering of tests/python/launch.py's lines,
# the torch.distributed checks, the zero-copy share checks and the way into
# the torch 2.x root. Sourced right after `set -u`; the test sets PY, the
# python3 that runs launch.py and the ranks (a plain path, or torch2_enter's
# wrapper that enters the root).
# ok, skip, pick_python and py_asan_preload come from cluster_lib.sh.
shopt -s lastpipe	# emit, at the end of a pipe, counts in this shell
. "${KCOLL_TOP:?run through tests/run.sh}/tests/cluster_lib.sh"
TOP=$top
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
	# No kcolld on the socket: init_process_group raises, saying what to
	# do, and the half-made group's finalizer stays quiet (it raised
	# AttributeError, "Exception ignored", before).
	local out
	out=$(KCOLL_SOCKET=/nonexistent/kcolld.sock timeout 60 "$PY" -c '
import gc, socket
import torch.distributed as dist
import kcoll.torch
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
try:
    dist.init_process_group("kcoll", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    print("no error")
except RuntimeError as e:
    print("raised:", e)
gc.collect()
' 2>&1)
	grep -q "^raised:.*kcolld is not running" <<<"$out" && ! grep -q "Exception ignored" <<<"$out"
	ok $? "init_process_group(\"kcoll\") without kcolld raises, saying to start it, and nothing more: $(head -c 300 <<<"$out" | tr '\n' ' ')"
	# python3 -m kcoll: the set-up report (kcoll/__main__.py).
	out=$(timeout 60 "$PY" -m kcoll --json 2>&1); rc=$?
	[ $rc -eq 0 ] && "$PY" -c '
import json, sys
r = json.loads(sys.argv[1])
d, t = r["daemon"], r["torch"]
sys.exit(0 if d["ok"] and d["socket"] == sys.argv[2] and d["allreduce_us"] > 0 and
         r["kcoll"]["libkcoll"] == sys.argv[3] and t["backend"] == "kcoll" and
         t["autoload"] is False and isinstance(t["cuda_available"], bool) else 1)' "$out" "$KCOLL_SOCKET" "$KCOLL_LIB"
	ok $? "python3 -m kcoll --json: rc 0, this daemon ran a one-rank all-reduce, this libkcoll, backend 'kcoll' registered by import kcoll.torch (no pip entry point here) (rc $rc: $(head -c 300 <<<"$out" | tr '\n' ' '))"
	out=$(KCOLL_SOCKET=/nonexistent/kcolld.sock timeout 60 "$PY" -m kcoll 2>&1); rc=$?
	[ $rc -eq 1 ] && grep -q "^kcolld: /nonexistent/kcolld.sock: NOT usable: .*kcolld is not running" <<<"$out" &&
		grep -q "^torch.distributed backend 'kcoll': registered" <<<"$out"
	ok $? "python3 -m kcoll without kcolld: rc 1, says the daemon is not running (rc $rc: $(head -c 400 <<<"$out" | tr '\n' ' '))"
	"$PY" -m kcoll --timeout 0 >/dev/null 2>&1; rc=$?
	[ $rc -eq 2 ]; ok $? "python3 -m kcoll --timeout 0: usage error, rc 2 (rc $rc)"
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

# The torch 2.x root (t_python_torch2*.sh): torch2_enter sets PY to its
# python3 (the python3 3.13 and torch 2.x of the Debian 13 root that
# scripts/torch2-root.sh builds at ${KCOLL_TORCH2_ROOT:-/var/cache/kcoll/torch2-root};
# Debian 12 ships torch 1.13 only) and checks it: torch 2.x, this tree's
# libkcoll. Each python3 runs chrooted in a private mount namespace that
# binds the tree (at its own path), /tmp, /dev, /proc and /sys into the
# root, so no mount shows on the host and kcolld's socket and shared memory
# are the host's. A missing root: SKIP and exit, unless CI=true or
# KCOLL_TORCH2=1 (then not ok). A build in progress (scripts/deps.sh starts
# one in the background in CI) is waited for, up to KCOLL_TORCH2_WAIT
# seconds (default 900). Sets an EXIT trap (its wrapper's folder).
# torch2_leave checks that the namespaces took their mounts with them.
torch2_root=${KCOLL_TORCH2_ROOT:-/var/cache/kcoll/torch2-root}
torch2_missing() {	# WHY: SKIP, or not ok where the root is required; exit
	if [ "${CI:-}" = true ] || [ "${KCOLL_TORCH2:-}" = 1 ]; then
		ok 1 "$1 (CI=true or KCOLL_TORCH2=1: required)"
	else
		skip "$1 (set KCOLL_TORCH2=1 to require it)"
	fi
	echo "1..$n"
	exit $failed
}
# torch2_wrap EXE: print the path of a wrapper that runs EXE (a path in
# the root) chrooted in the root, in a private mount namespace that binds
# the tree, /tmp, /dev, /proc and /sys (and KCOLL_TEST_TMP) at their paths.
torch2_wrap() {
	local exe=$1 binds w
	w=$torch2_dir/$(basename "$exe").$RANDOM
	binds=("$TOP" /tmp /dev /proc /sys)
	case "${KCOLL_TEST_TMP:-/tmp}" in /tmp|/tmp/*|"$TOP"/*) ;; *) binds+=("$KCOLL_TEST_TMP") ;; esac
	cat >"$w" <<PYWRAP
#!/usr/bin/env bash
exec unshare --mount --propagation private bash -c '
	set -e
	r=\$1 cwd=\$2 exe=\$3; shift 3
	while [ "\$1" != -- ]; do mkdir -p "\$r\$1"; mount --rbind "\$1" "\$r\$1"; shift; done
	shift
	exec chroot "\$r" /bin/sh -c "cd \\"\\\$0\\" 2>/dev/null; exe=\\"\\\$1\\"; shift; exec \\"\\\$exe\\" \\"\\\$@\\"" "\$cwd" "\$exe" "\$@"
' torch2-exec ${torch2_root@Q} "\$PWD" ${exe@Q} ${binds[*]@Q} -- "\$@"
PYWRAP
	chmod +x "$w"
	echo "$w"
}
torch2_enter() {
	local root=$torch2_root wait_s t0 ver
	[ "$(id -u)" -eq 0 ] || torch2_missing "needs root for its mount namespace and chroot"
	if ! "$TOP/scripts/torch2-root.sh" --check && [ -e "$root.lock" ] && ! flock -n "$root.lock" true; then
		wait_s=${KCOLL_TORCH2_WAIT:-900}
		t0=$SECONDS
		echo "# a build of $root is running; waiting up to $wait_s s for it"
		flock -w "$wait_s" "$root.lock" true
		echo "# waited $((SECONDS - t0)) s"
	fi
	if ! "$TOP/scripts/torch2-root.sh" --check; then
		[ -f "$root.bg.log" ] && tail -5 "$root.bg.log" | sed 's/^/#   /'
		torch2_missing "no complete torch 2.x root at $root: scripts/torch2-root.sh builds it (~1.3 GB)"
	fi

	# PY: the root's python3, entered through a private mount namespace (it
	# and its mounts end with the last process in it).
	torch2_dir=$(mktemp -d "${KCOLL_TEST_TMP:-/tmp}/torch2.XXXXXX")
	# shellcheck disable=SC2064 # the folder is this call's
	trap "rm -rf '$torch2_dir'" EXIT
	PY=$(torch2_wrap /usr/bin/python3)

	# Debian's torch 2.6 is built without libuv, yet its TCPStore (env://
	# and tcp://) asks for libuv unless USE_LIBUV=0 ("use_libuv was
	# requested but PyTorch was build without libuv support"): any user of
	# it must set this.
	export USE_LIBUV=0

	ver=$("$PY" -c 'import sys, torch; print(sys.version.split()[0], torch.__version__)' 2>&1)
	case "$ver" in 3.*" 2."*) ok 0 "the root's python3 and torch: $ver" ;;
	*) ok 1 "the root's python3 and torch are 3.x and 2.x (got: $ver)" ;; esac
	"$PY" -c 'import kcoll, sys; sys.exit(0 if kcoll._lib.path == sys.argv[1] else 1)' "$KCOLL_LIB"
	ok $? "kcoll in the root loads this tree's libkcoll ($KCOLL_LIB)"
}
# torch 2.5+ registering a pip-installed kcoll's backend as it starts: the
# package pip-installed (offline) into a venv of the root's python3, then
# tests/python/torch_autoload.py run by the venv's python.
torch2_autoload_checks() {
	local src=$torch2_dir/pysrc venv=$torch2_dir/venv out rc
	mkdir "$src" && cp -r "$TOP"/user/python/{pyproject.toml,_kcoll_torch.py,kcoll} "$src/" &&
		rm -rf "$src/kcoll/__pycache__"
	out=$("$PY" -m venv --system-site-packages "$venv" 2>&1 &&
		"$(torch2_wrap "$venv/bin/pip")" install --no-index --no-build-isolation \
			--disable-pip-version-check -q "$src" 2>&1)
	rc=$?
	ok $rc "pip install user/python into a venv of the root's python3${out:+: $out}"
	[ $rc -eq 0 ] || return
	timeout -k 5 300 "$(torch2_wrap "$venv/bin/python")" "$TOP/tests/python/torch_autoload.py" 2>&1 | emit
	rc=${PIPESTATUS[0]}
	[ "$rc" -eq 0 ] || ok 1 "torch_autoload.py exited with status $rc"
}
torch2_leave() {
	! grep -q " $torch2_root/" /proc/self/mountinfo
	ok $? "no mount under $torch2_root is left on the host"
}

# Plain tensors, zero-copy (kcoll.torch sharing their storages with kcolld):
# tests/python/torch_share.py with $PY at each WORLD size given.
share_checks() {
	local w
	export KCOLL_CTL="$B/bin/kcollctl"
	for w in "$@"; do
		launch 150 "$TOP/tests/python/torch_share.py" "$w" "share $w" 120 env
	done
}
