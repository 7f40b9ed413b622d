# shellcheck shell=bash
# shellcheck disable=SC2034 # B, R, PY, failed... are the sourcing test's
# What the host-tier netns cluster tests (t_cluster.sh, t_multihost.sh,
# t_c4*.sh, t_bpf*.sh, t_kv_cluster.sh, t_python_cluster.sh,
# t_shim_cluster.sh) share. Sourced
# right after `set -u`, as tests/run.sh starts them:
#   . "${KCOLL_TOP:?run through tests/run.sh}/tests/cluster_lib.sh"
# It sets B (the build), top (the tree), C (scripts/netns-cluster.sh) and the
# TAP counters n and failed, and defines the helpers below. Each test keeps
# its own cluster prefix (cluster_prefix, with $$ so runs do not collide).
B=${KCOLL_BUILD:?run through tests/run.sh}
top=${KCOLL_TOP:?run through tests/run.sh}
C="$top/scripts/netns-cluster.sh"
n=0 failed=0

ok() { n=$((n + 1)); if [ "$1" -eq 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; failed=1; fi; }
skip() { n=$((n + 1)); echo "ok $n # SKIP $1"; }
# emit: number a Python driver's "ok - ..." / "not ok - ..." lines (stdin)
# as this test's own; comments pass, any other line becomes one. At the end
# of a pipe it counts in this shell only with `shopt -s lastpipe`.
emit() {
	local line
	while IFS= read -r line; do
		case "$line" in
		"ok - "*) ok 0 "${line#ok - }" ;;
		"not ok - "*) ok 1 "${line#not ok - }" ;;
		"#"*) echo "$line" ;;
		*) echo "# $line" ;;
		esac
	done
}
skip_all() { echo "ok 1 # SKIP $1"; echo "1..1"; exit 0; }
now_ms() { date +%s%3N; }

# need_kcoll_bpf: SKIP the whole test unless root and kcoll-bpf was built.
need_kcoll_bpf() {
	need_root "BPF programs, network namespaces"
	[ -x "$B/bin/kcoll-bpf" ] ||
		skip_all "kcoll-bpf not built (clang, bpftool or libbpf-dev missing: scripts/deps.sh)"
}

# pick_python: PY, Debian's python3 where there is one (the first python3 on
# PATH may be a separate build without Debian's modules).
pick_python() {
	PY=python3
	[ -x /usr/bin/python3 ] && PY=/usr/bin/python3
}

# py_asan_preload: for an ASan build (KCOLL_TEST_SAN), the ASan runtime
# first in every python the test starts, libstdc++ right after it: an ASan
# libkcoll loads into python only so, and without libstdc++ next ASan finds
# no __cxa_throw to intercept once torch loads. Python's own allocations at
# exit are not ours to judge (no leak check). Returns 1, with why set, when
# the compiler has no such libraries to preload.
py_asan_preload() {
	local asan cxx
	[ -n "${KCOLL_TEST_SAN:-}" ] || return 0
	asan=$(${CC:-gcc} -print-file-name=libasan.so 2>/dev/null)
	cxx=$(${CC:-gcc} -print-file-name=libstdc++.so.6 2>/dev/null)
	if [ ! -f "$asan" ] || [ ! -f "$cxx" ]; then
		why="ASan build: no libasan.so/libstdc++.so.6 to preload into python (gcc -print-file-name)"
		return 1
	fi
	export LD_PRELOAD="$asan $cxx" ASAN_OPTIONS="detect_leaks=0:abort_on_error=1"
}

# cluster_prefix NAME: the namespaces' prefix (KCOLL_CLUSTER_PREFIX, also P).
cluster_prefix() {
	export KCOLL_CLUSTER_PREFIX=$1
	P=$1
}

# need_root WHAT: SKIP the whole test unless root (WHAT: what needs it).
need_root() { [ "$(id -u)" -eq 0 ] || skip_all "needs root ($1)"; }

# need_netns: SKIP the whole test where no network namespace can be made.
need_netns() {
	ip netns add "$P-probe" 2>/dev/null || skip_all "cannot create network namespaces here"
	ip netns del "$P-probe"
}

# cluster_tmp NAME: T, a fresh directory under $KCOLL_TEST_TMP (or /tmp);
# the cluster's run directory (KCOLL_CLUSTER_RUNDIR, also R) inside it.
cluster_tmp() {
	T=$(mktemp -d "${KCOLL_TEST_TMP:-/tmp}/$1.XXXXXX")
	export KCOLL_CLUSTER_RUNDIR="$T/run"
	R=$KCOLL_CLUSTER_RUNDIR
}

# cluster_cleanup [DIR...]: our own background jobs killed (their processes
# in the namespaces go with down), the cluster down, whatever the test
# mounted at $T/bpffs and at each $T/DIR unmounted, $T removed. Tests with
# more to undo call it last from their own cleanup.
cluster_cleanup() {
	local d
	jobs -p | xargs -r kill -KILL 2>/dev/null
	"$C" down >/dev/null 2>&1
	for d in bpffs "$@"; do
		mountpoint -q "$T/$d" 2>/dev/null && umount "$T/$d"
	done
	rm -rf "$T"
}
