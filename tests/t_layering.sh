#!/usr/bin/env bash
# kcolld's seams may only get better: no call cycle among daemon files
# beyond the recorded ones, no library (rdma/, bpf/, gpu/) newly reaching
# into user/daemon/ (scripts/layering.py reads the objects with nm and the
# compile records; scripts/layering.baseline is the debt still owed). Then
# each check must fail on a planted fault: the recorded cycle taken out of
# the baseline, and a library's compile record given -Iuser/daemon.
set -u
: "${KCOLL_BUILD:?run through tests/run.sh}" "${KCOLL_TOP:?}"
skip_all() { echo "ok 1 # SKIP $1"; echo "1..1"; exit 0; }
[ -n "${KCOLL_TEST_SAN:-}" ] && skip_all "the same objects' graph: the plain pass ran it"
command -v nm >/dev/null || skip_all "nm missing (binutils)"
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
# A library built with -Iuser/daemon: planted in a copy of the build's
# objects and command records, the library check must name it.
for d in user/daemon rdma bpf gpu; do
	mkdir -p "$T/b/obj/$d"
	cp "$KCOLL_BUILD/obj/$d/"*.o "$KCOLL_BUILD/obj/$d/"*.o.cmd "$T/b/obj/$d/" 2>/dev/null
done
echo ' -Iuser/daemon' >>"$T/b/obj/rdma/verbs.o.cmd"
bad=$($py "$KCOLL_TOP/scripts/layering.py" --build "$T/b" --check "$KCOLL_TOP/scripts/layering.baseline" 2>&1); rc=$?
[ $rc -ne 0 ] && grep -q '^not ok 2 ' <<<"$bad" && grep -q 'rdma/verbs.c' <<<"$bad" && grep -q '^ok 1 ' <<<"$bad"
ok $? "rdma/verbs.c planted with -Iuser/daemon: the library check fails naming it, the cycle check still passes (exit $rc)"
echo "1..$n"
