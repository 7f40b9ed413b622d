#!/usr/bin/env bash
# Set-up can be proven only on a fresh machine; this catches the next missing
# install step where it is written: every command the test and set-up scripts
# call must come from a package scripts/deps.sh installs for their tier, or
# from Debian's minbase (tests/deps_check.py says how it reads them). Then
# the check is shown to fail: a tree whose deps.sh leaves out iproute2 and
# numpy, whose test sorts in gawk-only awk and whose Python imports numpy
# must be refused, naming all three (and not CuPy, whose import is guarded).
set -u
: "${KCOLL_TOP:?run through tests/run.sh}"
skip_all() { echo "ok 1 # SKIP $1"; echo "1..1"; exit 0; }
[ -n "${KCOLL_TEST_SAN:-}" ] && skip_all "nothing here is compiled: the plain pass ran it"
py=/usr/bin/python3
[ -x $py ] || skip_all "/usr/bin/python3 missing (scripts/deps.sh installs python3)"
command -v dpkg >/dev/null && command -v apt-cache >/dev/null || skip_all "not a Debian system (no dpkg/apt-cache)"

out=$($py "$KCOLL_TOP/tests/deps_check.py" --top "$KCOLL_TOP" 2>&1); rc=$?
printf '%s\n' "$out" | grep -v '^1\.\.'
m=$(grep -cE '^(not )?ok ' <<<"$out")
n=$m
ok() { n=$((n + 1)); if [ "$1" -eq 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; fi; }
[ "$rc" -eq 0 ] || [ "$(grep -c '^not ok' <<<"$out")" -gt 0 ]
ok $? "deps_check.py's status agrees with its TAP (exit $rc)"

# The negative case: a tree of two files.
T=$(mktemp -d "${KCOLL_TEST_TMP:-/tmp}/deps.XXXXXX")
trap 'rm -rf "$T"' EXIT
mkdir -p "$T/scripts" "$T/tests"
printf '#!/bin/sh\necho python3\n' >"$T/scripts/deps.sh"
chmod +x "$T/scripts/deps.sh"
cat >"$T/tests/t_x.sh" <<'X'
ip link show lo >/dev/null
timeout 5 ip netns list
printf '3\n1\n' | awk '{ v[NR] = $1 } END { n = asort(v); print v[1] }'
X
printf 'import json\nimport numpy\ntry:\n    import cupy\nexcept ImportError:\n    cupy = None\n' >"$T/tests/x.py"
bad=$($py "$KCOLL_TOP/tests/deps_check.py" --top "$T" 2>&1); rc=$?
[ "$rc" -ne 0 ] && grep -q '^not ok 1 - host tier' <<<"$bad"
ok $? "a tree whose deps.sh lacks what its test calls is refused (exit $rc)"
grep -q 'missing: ip (package iproute2) at tests/t_x.sh:1, tests/t_x.sh:2' <<<"$bad"
r1=$?
ok $r1 "... naming ip, its package iproute2 and both lines, past 'timeout 5'"
grep -q 'gawk-only function at tests/t_x.sh:3' <<<"$bad"
r2=$?
ok $r2 "... and the gawk-only awk (asort) on line 3"
grep -q 'python module numpy (package python3-numpy) imported at tests/x.py:2' <<<"$bad" &&
	! grep -q 'module json' <<<"$bad" && ! grep -q 'module cupy' <<<"$bad"
r3=$?
ok $r3 "... and the Python import of numpy (python3-numpy) on tests/x.py:2, not json (stdlib) nor cupy (in a try that catches ImportError: optional)"
[ $((r1 + r2 + r3)) -eq 0 ] || printf '# %s\n' "$bad"
echo "1..$n"
