#!/usr/bin/env bash
# The torch.distributed backend (import kcoll.torch) under torch 2.x: the
# same checks as t_python.sh's torch part (tests/python_lib.sh's
# torch_checks: every collective x dtype x op against a reference and gloo in
# the same processes, async ops, strided and empty tensors, mismatched and
# skipped ops raise instead of hanging, DDP parity with gloo, imported twice,
# kcolld killed mid-training), run by the python3 (3.13) and python3-torch
# (2.x) of a Debian 13 root that scripts/torch2-root.sh builds at
# ${KCOLL_TORCH2_ROOT:-/var/cache/kcoll/torch2-root}. Debian 12 ships torch
# 1.13 only. This tree's libkcoll and kcolld (the host's, at $KCOLL_SOCKET)
# serve it: each python3 runs chrooted in a private mount namespace that
# binds the tree (at its own path), /tmp, /dev, /proc and /sys into the
# root, so no mount shows on the host and kcolld's socket and shared memory
# are the host's.
# A missing root: SKIP, unless CI=true or KCOLL_TORCH2=1 (then not ok). A
# build in progress (scripts/deps.sh starts one in the background in CI) is
# waited for, up to KCOLL_TORCH2_WAIT seconds (default 900). TAP.
set -u
. "${KCOLL_TOP:?run through tests/run.sh}/tests/python_lib.sh"
root=${KCOLL_TORCH2_ROOT:-/var/cache/kcoll/torch2-root}
need=0
{ [ "${CI:-}" = true ] || [ "${KCOLL_TORCH2:-}" = 1 ]; } && need=1
missing() {	# why: SKIP, or not ok where the root is required
	if [ "$need" -eq 1 ]; then
		ok 1 "$1 (CI=true or KCOLL_TORCH2=1: required)"
	else
		skip "$1 (set KCOLL_TORCH2=1 to require it)"
	fi
	echo "1..$n"
	exit $failed
}

[ "$(id -u)" -eq 0 ] || missing "needs root for its mount namespace and chroot"
if ! "$TOP/scripts/torch2-root.sh" --check && [ -e "$root.lock" ] && ! flock -n "$root.lock" true; then
	wait_s=${KCOLL_TORCH2_WAIT:-900}
	t0=$SECONDS
	echo "# a build of $root is running; waiting up to $wait_s s for it"
	flock -w "$wait_s" "$root.lock" true
	echo "# waited $((SECONDS - t0)) s"
fi
if ! "$TOP/scripts/torch2-root.sh" --check; then
	[ -f "$root.bg.log" ] && tail -5 "$root.bg.log" | sed 's/^/#   /'
	missing "no complete torch 2.x root at $root: scripts/torch2-root.sh builds it (~1.3 GB)"
fi

# PY: the root's python3, entered through a private mount namespace (it and
# its mounts end with the last process in it).
w=$(mktemp -d "${KCOLL_TEST_TMP:-/tmp}/torch2.XXXXXX")
trap 'rm -rf "$w"' EXIT
binds=("$TOP" /tmp /dev /proc /sys)
case "${KCOLL_TEST_TMP:-/tmp}" in /tmp/*|"$TOP"/*) ;; *) binds+=("$KCOLL_TEST_TMP") ;; esac
cat >"$w/python3" <<PYWRAP
#!/usr/bin/env bash
exec unshare --mount --propagation private bash -c '
	set -e
	r=\$1 cwd=\$2; shift 2
	while [ "\$1" != -- ]; do mkdir -p "\$r\$1"; mount --rbind "\$1" "\$r\$1"; shift; done
	shift
	exec chroot "\$r" /bin/sh -c "cd \\"\\\$0\\" 2>/dev/null; exec /usr/bin/python3 \\"\\\$@\\"" "\$cwd" "\$@"
' torch2-python3 ${root@Q} "\$PWD" ${binds[*]@Q} -- "\$@"
PYWRAP
chmod +x "$w/python3"
PY=$w/python3

# Debian's torch 2.6 is built without libuv, yet its TCPStore (env:// and
# tcp://) asks for libuv unless USE_LIBUV=0 ("use_libuv was requested but
# PyTorch was build without libuv support"): any user of it must set this.
export USE_LIBUV=0

ver=$("$PY" -c 'import sys, torch; print(sys.version.split()[0], torch.__version__)' 2>&1)
case "$ver" in 3.*" 2."*) ok 0 "the root's python3 and torch: $ver" ;;
*) ok 1 "the root's python3 and torch are 3.x and 2.x (got: $ver)" ;; esac
"$PY" -c 'import kcoll, sys; sys.exit(0 if kcoll._lib.path == sys.argv[1] else 1)' "$KCOLL_LIB"
ok $? "kcoll in the root loads this tree's libkcoll ($KCOLL_LIB)"
torch_checks
# The namespaces took their mounts with them.
! grep -q " $root/" /proc/self/mountinfo
ok $? "no mount under $root is left on the host"
echo "1..$n"
exit $failed
