#!/usr/bin/env bash
# make install / uninstall into a staging DESTDIR: the layout, then a program
# built only from what was installed (pkg-config, shared and static) doing an
# all-reduce through the test daemon, the Python package installed by make
# install and by pip into a venv, the installed kcolld and tools running
# from their new home, the systemd unit pointing at them, and uninstall
# taking back exactly what install put there.
set -u
: "${KCOLL_BUILD:?run through tests/run.sh}" "${KCOLL_TOP:?}"
n=0
ok() { n=$((n + 1)); if [ "$1" -eq 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; fi; }
skip_all() { echo "ok 1 # SKIP $1"; echo "1..1"; exit 0; }

command -v pkg-config >/dev/null || skip_all "pkg-config missing (scripts/deps.sh installs it)"
command -v cc >/dev/null || skip_all "no C compiler"
T=$(mktemp -d "${KCOLL_TEST_TMP:-/tmp}/install.XXXXXX")
trap 'rm -rf "$T"' EXIT
D=$T/stage P=/opt/kcoll-test
inst() { PREFIX=$P DESTDIR=$D "$KCOLL_TOP/scripts/install.sh" "$@"; }

out=$(inst "$KCOLL_BUILD" 2>&1); rc=$?
ok $rc "install into DESTDIR=$D PREFIX=$P: $out"
[ $rc -eq 0 ] || { echo "1..$n"; exit 1; }

miss=
for f in sbin/kcolld bin/kcollctl bin/kcoll-bench lib/libkcoll.so.1 lib/libkcoll.so lib/libkcoll.a \
	 include/kcoll/kcoll.h include/kcoll/uapi/linux/kcoll.h lib/pkgconfig/kcoll.pc \
	 share/man/man8/kcolld.8 share/man/man3/libkcoll.3 lib/systemd/system/kcolld.service \
	 lib/kcoll/installed.txt; do
	[ -e "$D$P/$f" ] || miss="$miss $f"
done
ok "$([ -z "$miss" ]; echo $?)" "the expected files are there${miss:+ (missing:$miss)}"
miss=
for f in "$D$P"/bin/* "$D$P"/sbin/*; do
	f=${f##*/}
	compgen -G "$D$P/share/man/man[18]/$f.[18]" >/dev/null || miss="$miss $f"
done
ok "$([ -z "$miss" ]; echo $?)" "every installed program has its man page in man1 or man8${miss:+ (none for:$miss)}"
[ "$(readlink "$D$P/lib/libkcoll.so")" = libkcoll.so.1 ]
ok $? "libkcoll.so is a relative link to the soname libkcoll.so.1"
bad=$(find "$D$P/bin" "$D$P/sbin" -type f ! -perm 0755; find "$D$P/include" "$D$P/share" -type f ! -perm 0644)
ok "$([ -z "$bad" ]; echo $?)" "programs are 0755, headers and man pages 0644${bad:+ (wrong: $bad)}"
listed=$(sort "$D$P/lib/kcoll/installed.txt")
onfs=$(cd "$D" && find . \( -type f -o -type l \) | sed 's|^\.||' | sort)
ok "$([ "$listed" = "$onfs" ]; echo $?)" "installed.txt lists every installed file and nothing else"
grep -q "^ExecStart=$P/sbin/kcolld " "$D$P/lib/systemd/system/kcolld.service"
ok $? "the systemd unit starts $P/sbin/kcolld"

# A program that sees only the installed headers and libraries.
export PKG_CONFIG_PATH=$D$P/lib/pkgconfig PKG_CONFIG_SYSROOT_DIR=$D
cat > "$T/app.c" <<'EOF'
#include <stdio.h>
#include <string.h>
#include <kcoll/kcoll.h>

int main(void)
{
	struct kcoll *k;
	struct kcoll_comm *c;
	struct kcoll_req *r;
	kcoll_unique_id_t id;
	float in[1000], out[1000];
	int e, i;

	for (i = 0; i < 1000; i++)
		in[i] = (float)i;
	if ((e = kcoll_connect(NULL, &k)) || (e = kcoll_get_unique_id(k, &id)) ||
	    (e = kcoll_comm_init_rank(k, &id, 1, 0, &c)) ||
	    (e = kcoll_allreduce(c, in, out, 1000, KCOLL_F32, KCOLL_SUM, &r)) || (e = kcoll_wait(r, 10000))) {
		fprintf(stderr, "app: %s\n", kcoll_strerror(e));
		return 1;
	}
	if (memcmp(in, out, sizeof(in))) {
		fprintf(stderr, "app: wrong result\n");
		return 1;
	}
	printf("libkcoll %s, ring ABI %d: all-reduce ok\n", kcoll_version(), KCOLL_ABI_VERSION);
	kcoll_comm_destroy(c);
	kcoll_disconnect(k);
	return 0;
}
EOF
# The ASan tier installs instrumented libraries: the app must be built the same way.
SANF=
[ "${KCOLL_TEST_SAN:-0}" = 1 ] && SANF="-fsanitize=address,undefined"
v=$(pkg-config --modversion kcoll 2>&1)
ok "$([ "$v" = "$(sed -n 's/^KCOLL_VERSION := //p' "$KCOLL_TOP/Makefile")" ]; echo $?)" "pkg-config --modversion kcoll: $v"
flags=$(pkg-config --cflags --libs kcoll 2>&1)
case " $flags " in *" -I$D$P/include "*" -L$D$P/lib "*) r=0 ;; *) r=1 ;; esac
ok $r "pkg-config --cflags --libs kcoll points into the install: $flags"
# shellcheck disable=SC2086
err=$(cc $SANF -Werror -Wall -o "$T/app" "$T/app.c" $flags 2>&1)
ok $? "an app compiles against the installed headers and links the shared library${err:+: $err}"
out=$(LD_LIBRARY_PATH=$D$P/lib "$T/app" 2>&1); rc=$?
so=$(LD_LIBRARY_PATH=$D$P/lib ldd "$T/app" | awk '/libkcoll/ { print $3 }')
ok "$([ $rc -eq 0 ] && [ "$so" = "$D$P/lib/libkcoll.so.1" ]; echo $?)" "it runs an all-reduce through kcolld with the installed libkcoll.so.1 ($so): $out"
# shellcheck disable=SC2086
err=$(cc $SANF -Werror -Wall -o "$T/app-static" "$T/app.c" $(pkg-config --cflags kcoll) \
	"$D$P/lib/libkcoll.a" $(pkg-config --static --libs-only-other --libs-only-l kcoll | sed 's/-lkcoll//') 2>&1)
rc=$?
out=$([ $rc -eq 0 ] && "$T/app-static" 2>&1); rc2=$?
ok "$([ $rc -eq 0 ] && [ $rc2 -eq 0 ] && ! ldd "$T/app-static" 2>/dev/null | grep -q libkcoll; echo $?)" \
	"linked statically with pkg-config --static's flags, it runs without libkcoll.so${err:+: $err}${out:+: $out}"

# The installed Python package, finding the installed libkcoll.so.1 through
# the loader (an ASan libkcoll would need libasan preloaded: plain pass only).
pydir=$(sed -n 's|^\(.*/dist-packages\)/kcoll/__init__.py$|\1|p' "$D$P/lib/kcoll/installed.txt")
if [ -n "${KCOLL_TEST_SAN:-}" ]; then
	n=$((n + 1)); echo "ok $n # SKIP the installed Python package with an ASan libkcoll (t_python.sh covers it)"
elif [ -z "$pydir" ]; then
	ok 1 "the Python package is installed (no kcoll/__init__.py under a dist-packages in installed.txt)"
else
	out=$(cd "$T" && env -u KCOLL_LIB PYTHONDONTWRITEBYTECODE=1 PYTHONPATH="$D$pydir" LD_LIBRARY_PATH="$D$P/lib" python3 -c '
import kcoll, sys
assert kcoll.__file__.startswith(sys.argv[1]), kcoll.__file__
assert kcoll._lib.path == "libkcoll.so.1", kcoll._lib.path
assert len(kcoll.get_unique_id()) == 128
import importlib.util
if importlib.util.find_spec("torch"):
    import kcoll.torch, _kcoll_torch
    assert _kcoll_torch.__file__.startswith(sys.argv[1]), _kcoll_torch.__file__' "$D$pydir" 2>&1)
	ok $? "the installed Python package ($pydir/kcoll, and kcoll.torch where torch is) loads the installed libkcoll and talks to kcolld${out:+: $out}"
fi

# pip: user/python/pyproject.toml built offline into a virtual environment
# (how torch users install packages), the venv's python3 -m kcoll going
# through the installed libkcoll to kcolld, then pip uninstall. A copy of
# user/python is built: setuptools writes build/ and kcoll.egg-info beside
# what it builds.
vpy=/usr/bin/python3
mkv=$($vpy -c 'import venv, ensurepip' 2>&1)
if [ -n "${KCOLL_TEST_SAN:-}" ]; then
	n=$((n + 1)); echo "ok $n # SKIP pip install of the Python package with an ASan libkcoll (the plain pass runs it)"
elif [ -n "$mkv" ] || ! $vpy -c 'import wheel' 2>/dev/null; then
	n=$((n + 1)); echo "ok $n # SKIP no venv/ensurepip or wheel for $vpy (apt-get install python3-venv python3-wheel, as scripts/deps.sh does): pip install of the Python package"
else
	mkdir "$T/pysrc" && cp -r "$KCOLL_TOP"/user/python/{pyproject.toml,_kcoll_torch.py,kcoll} "$T/pysrc/" &&
		rm -rf "$T/pysrc/kcoll/__pycache__"
	out=$($vpy -m venv --system-site-packages "$T/venv" 2>&1 &&
		"$T/venv/bin/pip" install --no-index --no-build-isolation --disable-pip-version-check -q "$T/pysrc" 2>&1)
	ok $? "pip install --no-index --no-build-isolation user/python into a venv${out:+: $out}"
	want=$(sed -n 's/^KCOLL_VERSION *:= *//p' "$KCOLL_TOP/Makefile")
	out=$(cd "$T" && env -u KCOLL_LIB -u PYTHONPATH LD_LIBRARY_PATH="$D$P/lib" "$T/venv/bin/python" -c '
import importlib.metadata as md, kcoll, sys
assert kcoll.__file__.startswith(sys.argv[1]), "imported " + kcoll.__file__
assert kcoll._lib.path == "libkcoll.so.1", kcoll._lib.path
assert md.version("kcoll") == sys.argv[2] == kcoll.version(), (md.version("kcoll"), sys.argv[2], kcoll.version())
' "$T/venv/lib" "$want" 2>&1)
	ok $? "the venv imports its own kcoll $want (pyproject.toml, the Makefile and libkcoll agree) over the installed libkcoll${out:+: $out}"
	out=$(cd "$T" && env -u KCOLL_LIB -u PYTHONPATH LD_LIBRARY_PATH="$D$P/lib" "$T/venv/bin/python" -m kcoll --json \
		-s "$KCOLL_SOCKET" 2>&1); rc=$?
	chk=$(printf '%s' "$out" | $vpy -c '
import json, sys
r = json.load(sys.stdin)
torch = r.get("torch") or {}
print("ok" if r["daemon"]["ok"] and (torch.get("version") is None or torch.get("backend") == "kcoll")
      else "daemon %s, torch backend %s" % (r["daemon"], torch.get("backend")))' 2>&1)
	ok "$([ $rc -eq 0 ] && [ "$chk" = ok ]; echo $?)" "the venv's python -m kcoll: an all-reduce through kcolld, torch's kcoll backend registered (exit $rc${chk:+, $chk})"
	out=$("$T/venv/bin/pip" uninstall -y -q kcoll 2>&1) &&
		! (cd "$T" && env -u PYTHONPATH "$T/venv/bin/python" -c 'import kcoll' 2>/dev/null) &&
		[ -z "$(find "$T/venv/lib" -name '*kcoll*' -print -quit)" ]
	ok $? "pip uninstall kcoll leaves nothing of it in the venv${out:+: $out}"
fi

# The installed programs run from their new home.
v=$("$D$P/sbin/kcolld" --version 2>&1); rc=$?
ok "$([ $rc -eq 0 ] && case $v in *1.*) true ;; *) false ;; esac; echo $?)" "installed kcolld --version: $v"
LD_LIBRARY_PATH=$D$P/lib "$D$P/bin/kcollctl" status >/dev/null 2>&1
ok $? "installed kcollctl status talks to the daemon"
# The doctor exits 0 (GPU path usable) or 1 (not, reported); either way it
# must have loaded the installed libkcoll_gpu.so, not the build tree's.
if [ -f "$D$P/lib/libkcoll_gpu.so" ]; then
	"$D$P/bin/kcollctl" gpu --json > "$T/gpu.json" 2>/dev/null; rc=$?
	lib=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["runtime"]; print(r["library"] if r["loaded"] else "not loaded")' "$T/gpu.json" 2>&1)
	ok "$([ $rc -le 1 ] && [ "$(realpath -q "$lib")" = "$(realpath "$D$P/lib/libkcoll_gpu.so")" ]; echo $?)" "installed kcollctl gpu loads the installed kernels library ($lib, exit $rc)"
else
	ok 0 "# SKIP libkcoll_gpu.so not built (no nvcc): nothing for the doctor to load"
fi

# Again: idempotent, same list.
inst "$KCOLL_BUILD" >/dev/null 2>&1
ok "$([ $? -eq 0 ] && [ "$(sort "$D$P/lib/kcoll/installed.txt")" = "$listed" ]; echo $?)" "a second install over the first succeeds and lists the same files"

out=$(PREFIX=relative/path DESTDIR=$D "$KCOLL_TOP/scripts/install.sh" "$KCOLL_BUILD" 2>&1); rc=$?
ok "$([ $rc -eq 2 ] && case $out in *"must be an absolute path"*) true ;; *) false ;; esac; echo $?)" \
	"a relative PREFIX is refused, saying why ($out)"

out=$(inst --uninstall "$KCOLL_BUILD" 2>&1); rc=$?
left=$(cd "$D" && find . -mindepth 1 ! -type d)
ok "$([ $rc -eq 0 ] && [ -z "$left" ] && [ ! -e "$D$P/lib" ]; echo $?)" "uninstall removes every file and the emptied directories ($out)${left:+; left: $left}"
out=$(inst --uninstall "$KCOLL_BUILD" 2>&1); rc=$?
ok "$([ $rc -eq 1 ] && case $out in *"nothing to uninstall"*) true ;; *) false ;; esac; echo $?)" \
	"uninstall with nothing installed: exit 1, says so"
echo "1..$n"
