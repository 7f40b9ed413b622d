#!/usr/bin/env bash
# kcolld's seams may only get better: no call cycle among daemon files
# beyond the recorded ones, no library (rdma/, bpf/, gpu/) newly reaching
# into user/daemon/ (scripts/layering.py reads the objects with nm and the
# compile records; scripts/layering.baseline is the debt still owed). Then
# each check must fail on a planted fault: a call from the ring server up to
# the network linked into a copy of client.o, the recorded cycle (if any)
# taken out of the baseline, and a library's compile record given
# -Iuser/daemon.
set -u
: "${KCOLL_BUILD:?run through tests/run.sh}" "${KCOLL_TOP:?}"
skip_all() { echo "ok 1 # SKIP $1"; echo "1..1"; exit 0; }
[ -n "${KCOLL_TEST_SAN:-}" ] && skip_all "the same objects' graph: the plain pass ran it"
command -v nm >/dev/null || skip_all "nm missing (binutils)"
command -v ld >/dev/null || skip_all "ld missing (binutils)"
py=/usr/bin/python3
out=$($py "$KCOLL_TOP/scripts/layering.py" --build "$KCOLL_BUILD" --check "$KCOLL_TOP/scripts/layering.baseline" 2>&1)
rc=$?
printf '%s\n' "$out" | grep -v '^1\.\.'
n=$(grep -cE '^(not )?ok ' <<<"$out")
ok() { n=$((n + 1)); if [ "$1" -eq 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; fi; }
[ "$rc" -eq 0 ] || grep -q '^not ok' <<<"$out"
ok $? "layering.py's exit status ($rc) agrees with its TAP"

# A baseline without the cycle stands for "a new cycle appeared".
T=$(mktemp -d "${KCOLL_TEST_TMP:-/tmp}/layer.XXXXXX")
trap 'rm -rf "$T"' EXIT
if ! grep -q '"user/daemon/' "$KCOLL_TOP/scripts/layering.baseline"; then
	ok 0 "# SKIP the baseline records no cycle: nothing to take out"
else
	$py -c 'import json,sys; b=json.load(open(sys.argv[1])); b["cycles"]=[]; json.dump(b,open(sys.argv[2],"w"))' \
		"$KCOLL_TOP/scripts/layering.baseline" "$T/b.json"
	bad=$($py "$KCOLL_TOP/scripts/layering.py" --build "$KCOLL_BUILD" --check "$T/b.json" 2>&1); rc=$?
	[ $rc -ne 0 ] && grep -q '^not ok 1 ' <<<"$bad"
	ok $? "with the recorded cycle taken out of the baseline, the cycle check fails (exit $rc)"
fi
# The faults below are planted in copies of the build's objects and
# command records.
copy_build() {
	for d in user/daemon rdma bpf gpu; do
		mkdir -p "$1/obj/$d"
		cp "$KCOLL_BUILD/obj/$d/"*.o "$KCOLL_BUILD/obj/$d/"*.o.cmd "$1/obj/$d/" 2>/dev/null
	done
}
# A back-edge: client.o (the ring server, below comm.c and net.c) given an
# undefined reference to net.c's kd_net_self, as if client.c called it.
# net.c calls comm.c, which calls client.c: the cycle check must fail and
# name both files, whatever the baseline records.
copy_build "$T/c"
o="$T/c/obj/user/daemon/client.o"
if ! ld -r -u kd_net_self "$o" -o "$o.new" || ! mv "$o.new" "$o"; then
	ok 1 "planting a call from client.o to net.c (ld -r -u) failed"
else
	bad=$($py "$KCOLL_TOP/scripts/layering.py" --build "$T/c" --check "$KCOLL_TOP/scripts/layering.baseline" 2>&1); rc=$?
	[ $rc -ne 0 ] && grep -q '^not ok 1 ' <<<"$bad" && grep -q '^ok 2 ' <<<"$bad" &&
		grep -q 'cycle.*user/daemon/client\.c.*user/daemon/net\.c' <<<"$bad"
	ok $? "client.o planted with a call to net.c: the cycle check fails naming the cycle, the library check still passes (exit $rc)"
fi
# A library built with -Iuser/daemon: the library check must name it.
copy_build "$T/b"
echo ' -Iuser/daemon' >>"$T/b/obj/rdma/verbs.o.cmd"
bad=$($py "$KCOLL_TOP/scripts/layering.py" --build "$T/b" --check "$KCOLL_TOP/scripts/layering.baseline" 2>&1); rc=$?
[ $rc -ne 0 ] && grep -q '^not ok 2 ' <<<"$bad" && grep -q 'rdma/verbs.c' <<<"$bad" && grep -q '^ok 1 ' <<<"$bad"
ok $? "rdma/verbs.c planted with -Iuser/daemon: the library check fails naming it, the cycle check still passes (exit $rc)"
echo "1..$n"
