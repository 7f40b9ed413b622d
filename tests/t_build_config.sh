#!/usr/bin/env bash
# The build's configuration cannot go stale: what make probes (here: the BPF
# toolchain) is recorded in BUILD/config.mk and in each object's command
# record (BUILD/obj/**/*.o.cmd), so switching a probe rebuilds exactly the
# objects whose command changed and relinks what links them. The case that
# bit a fresh machine: kcolld built before deps.sh installed clang/bpftool/
# libbpf-dev, then built again after, kept a main.o without flow tracking.
# WITH_BPF=0 stands in for "not installed yet".
set -u
: "${KCOLL_TOP:?run through tests/run.sh}"
n=0
ok() { n=$((n + 1)); if [ "$1" -eq 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; fi; }
skip_all() { echo "ok 1 # SKIP $1"; echo "1..1"; exit 0; }
[ -n "${KCOLL_TEST_SAN:-}" ] && skip_all "make's logic is the same under SAN=1: the plain pass ran it"
command -v make >/dev/null || skip_all "make missing"

B=$(mktemp -d "${KCOLL_TEST_TMP:-/tmp}/cfgbuild.XXXXXX")
trap 'rm -rf "$B"' EXIT
K=$B/bin/kcolld
mk() { make -C "$KCOLL_TOP" --no-print-directory -j2 BUILD="$B" "$@" "$K" 2>&1; }
compiled() { sed -n 's/^  CC  *\([^ ]*\.c\)$/\1/p' <<<"$1" | sort | tr '\n' ' '; }
linked() { grep -qE "^  LD  *$K\$" <<<"$1"; }

t0=$SECONDS
out=$(mk WITH_BPF=0); rc=$?
ok $rc "kcolld builds from nothing with WITH_BPF=0 ($((SECONDS - t0)) s)"
[ $rc -eq 0 ] || { printf '# %s\n' "$out" | tail -20; echo "1..$n"; exit 1; }
grep -qx 'BPF=n' "$B/config.mk"
ok $? "config.mk records BPF=n"
"$K" -V | grep -q '^built without: bpf'
ok $? "kcolld -V says it was built without bpf: $("$K" -V | tail -1)"

out=$(mk WITH_BPF=0)
[ -z "$(compiled "$out")" ] && ! linked "$out"
ok $? "the same make again compiles and links nothing${out:+ (it printed: $out)}"

found=$(make -C "$KCOLL_TOP" --no-print-directory BUILD="$B" config | grep -c '^BPF=y')
if [ "$found" -eq 0 ]; then
	for _ in 1 2 3 4 5; do ok 0 "# SKIP the BPF toolchain is missing here (scripts/deps.sh installs clang, bpftool, libbpf-dev)"; done
	echo "1..$n"; exit 0
fi

out=$(mk); rc=$?
c=$(compiled "$out")
ok $rc "the probe on (the toolchain 'installed'): make succeeds"
others=$(tr ' ' '\n' <<<"$c" | grep -v -e '^bpf/' -e '^user/daemon/main\.c$' -e '^user/daemon/kcolld_bpf\.c$' |
	tr '\n' ' ')
case " $c " in *" user/daemon/main.c "*) m=0 ;; *) m=1 ;; esac
[ $m -eq 0 ] && [ -z "${others// }" ] && linked "$out"
ok $? "exactly main.c (and bpf/ itself, with its adapter kcolld_bpf.c) recompiled, kcolld relinked: compiled $c"
grep -qx 'BPF=y' "$B/config.mk" && grep -q -- '-DKCOLL_HAVE_BPF' "$B/obj/user/daemon/main.o.cmd"
ok $? "config.mk records BPF=y, main.o's command record has -DKCOLL_HAVE_BPF"
"$K" -V | grep -q '^built with: .*bpf (flow tracking'
ok $? "kcolld has flow tracking: $("$K" -V | tail -1)"

out=$(mk WITH_BPF=0)
c=$(compiled "$out")
[ "$c" = "user/daemon/main.c " ] && linked "$out" && "$K" -V | grep -q '^built without: bpf'
ok $? "the probe off again: main.c alone recompiled, kcolld without bpf (compiled: $c)"
echo "1..$n"
