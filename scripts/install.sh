#!/usr/bin/env bash
# Install (or uninstall) what `make` built, the way packagers expect:
#   scripts/install.sh [--uninstall] [--dry-run] BUILD
# Environment (what `make install` passes on):
#   PREFIX      /usr/local     must be absolute
#   DESTDIR     (empty)        staging root prepended to every path (packaging)
#   BINDIR      $PREFIX/bin    tools: kcollctl, kcoll-bench, kcoll-kvbench, ...
#   SBINDIR     $PREFIX/sbin   the daemon, kcolld
#   LIBDIR      $PREFIX/lib    libkcoll.so.1, libkcoll.a, libkcoll_gpu.so, the MPI shim
#   INCLUDEDIR  $PREFIX/include
#   MANDIR      $PREFIX/share/man
#   UNITDIR     $PREFIX/lib/systemd/system   (systemd reads /usr/local/lib/systemd/system too)
#   PYDIR       the Python package kcoll: /usr/lib/python3/dist-packages for
#               PREFIX=/usr, else $PREFIX/lib/python3.N/dist-packages, N of
#               /usr/bin/python3 (Debian's python3 searches both); not
#               installed when there is no python3 and PYDIR is unset
# What is installed is listed in $LIBDIR/kcoll/installed.txt (paths without
# DESTDIR); --uninstall removes exactly those files and the list, then the
# directories it leaves empty. Only what BUILD holds is installed: a build
# without clang/bpftool has no kcoll-bpf, one without Open MPI no shim.
#
# Layout constraints the code relies on: kcolld and the tools find
# libkcoll_gpu.so at <exe dir>/../lib unless KCOLL_GPU_LIB says otherwise, so
# with a LIBDIR other than $PREFIX/lib set KCOLL_GPU_LIB; libkcoll_mpi.so finds
# libkcoll_mpi_ompi.so / _mpich.so next to itself. The public headers are
# <kcoll/kcoll.h> and the ring ABI <linux/kcoll.h>, installed under
# $INCLUDEDIR/kcoll/uapi so that /usr/include/linux stays the kernel's;
# `pkg-config --cflags kcoll` names both directories.
set -euo pipefail

usage() {
	sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//'
	exit "${1:-2}"
}
uninstall=0 dry=0
while [ $# -gt 0 ]; do
	case $1 in
	--uninstall) uninstall=1 ;;
	--dry-run) dry=1 ;;
	-h | --help) usage 0 ;;
	-*) echo "install.sh: unknown option '$1'" >&2; usage ;;
	*) break ;;
	esac
	shift
done
[ $# -eq 1 ] || usage
BUILD=$1
top=$(cd "$(dirname "$0")/.." && pwd)

PREFIX=${PREFIX:-/usr/local}
DESTDIR=${DESTDIR:-}
case $PREFIX in
/*) ;;
*) echo "install.sh: PREFIX must be an absolute path (got '$PREFIX'); use DESTDIR to stage elsewhere" >&2; exit 2 ;;
esac
PREFIX=${PREFIX%/}
BINDIR=${BINDIR:-$PREFIX/bin}
SBINDIR=${SBINDIR:-$PREFIX/sbin}
LIBDIR=${LIBDIR:-$PREFIX/lib}
INCLUDEDIR=${INCLUDEDIR:-$PREFIX/include}
MANDIR=${MANDIR:-$PREFIX/share/man}
UNITDIR=${UNITDIR:-$PREFIX/lib/systemd/system}
if [ -z "${PYDIR:-}" ]; then
	py=/usr/bin/python3
	[ -x "$py" ] || py=$(command -v python3 || true)
	if [ "$PREFIX" = /usr ]; then
		PYDIR=/usr/lib/python3/dist-packages
	elif [ -n "$py" ]; then
		PYDIR=$PREFIX/lib/python$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')/dist-packages
	fi
fi
PYDIR=${PYDIR:-}
for d in BINDIR SBINDIR LIBDIR INCLUDEDIR MANDIR UNITDIR ${PYDIR:+PYDIR}; do
	case ${!d} in
	/*) ;;
	*) echo "install.sh: $d must be an absolute path (got '${!d}')" >&2; exit 2 ;;
	esac
done
LIST=$LIBDIR/kcoll/installed.txt

run() {
	if [ "$dry" -eq 1 ]; then echo "$*"; else "$@"; fi
}

if [ "$uninstall" -eq 1 ]; then
	if [ ! -f "$DESTDIR$LIST" ]; then
		echo "install.sh: nothing to uninstall: $DESTDIR$LIST not found (installed with another PREFIX/DESTDIR?)" >&2
		exit 1
	fi
	dirs=()
	while IFS= read -r f; do
		[ -n "$f" ] || continue
		run rm -f "$DESTDIR$f"
		dirs+=("$(dirname "$DESTDIR$f")")
		case $f in	# what python compiled from an installed module
		*.py)
			run rm -f "$(dirname "$DESTDIR$f")/__pycache__/$(basename "$f" .py)".*.pyc
			dirs+=("$(dirname "$DESTDIR$f")/__pycache__") ;;
		esac
	done < "$DESTDIR$LIST"
	run rm -f "$DESTDIR$LIST"
	dirs+=("$(dirname "$DESTDIR$LIST")")
	# Remove directories left empty, deepest first; never above PREFIX.
	printf '%s\n' "${dirs[@]}" | sort -ru | while IFS= read -r d; do
		while [ "$d" != "$DESTDIR$PREFIX" ] && [ "$d" != / ] && [ "$d" != "$DESTDIR" ] &&
		      [ -d "$d" ] && [ -z "$(ls -A "$d")" ]; do
			run rmdir "$d"
			d=$(dirname "$d")
		done
	done
	echo "uninstalled kcoll from ${DESTDIR}$PREFIX"
	exit 0
fi

B=$top/$BUILD
[ -d "$BUILD" ] && B=$(cd "$BUILD" && pwd)
[ -x "$B/bin/kcolld" ] && [ -f "$B/lib/libkcoll.so.1" ] ||
	{ echo "install.sh: $B has no kcolld or libkcoll.so.1: run make first" >&2; exit 1; }
version=$(sed -n 's/^KCOLL_VERSION := //p' "$top/Makefile")

installed=()
put() {	# mode source destination-directory [name]
	local mode=$1 src=$2 dir=$3 name=${4:-$(basename "$2")}
	run install -d -m 0755 "$DESTDIR$dir"
	run install -m "$mode" "$src" "$DESTDIR$dir/$name"
	installed+=("$dir/$name")
}
link() {	# target directory name
	run ln -sfn "$1" "$DESTDIR$2/$3"
	installed+=("$2/$3")
}

# The daemon and the tools.
put 0755 "$B/bin/kcolld" "$SBINDIR"
for t in kcollctl kcoll-bench kcoll-kvbench kcoll-bpf kcoll-gpu-doctor kcoll-tcpcap; do
	[ -x "$B/bin/$t" ] && put 0755 "$B/bin/$t" "$BINDIR"
done

# Libraries: the shared one under its soname plus the link-time name, the
# static one, the GPU kernels and the MPI shim where they were built.
put 0755 "$B/lib/libkcoll.so.1" "$LIBDIR"
link libkcoll.so.1 "$LIBDIR" libkcoll.so
put 0644 "$B/lib/libkcoll.a" "$LIBDIR"
for l in libkcoll_gpu.so libkcoll_mpi.so libkcoll_mpi_ompi.so libkcoll_mpi_mpich.so; do
	[ -f "$B/lib/$l" ] && put 0755 "$B/lib/$l" "$LIBDIR"
done

# The Python package: pure Python, it finds libkcoll.so.1 through the
# dynamic loader (or $KCOLL_LIB).
if [ -n "$PYDIR" ]; then
	for f in "$top"/user/python/kcoll/*.py; do
		put 0644 "$f" "$PYDIR/kcoll"
	done
	put 0644 "$top/user/python/_kcoll_torch.py" "$PYDIR"	# kcoll.torch's registration
fi

# Headers and pkg-config.
put 0644 "$top/include/kcoll/kcoll.h" "$INCLUDEDIR/kcoll"
put 0644 "$top/include/uapi/linux/kcoll.h" "$INCLUDEDIR/kcoll/uapi/linux"
pc=$(mktemp)
trap 'rm -f "$pc" "${unit:-}"' EXIT
cat > "$pc" <<EOF
prefix=$PREFIX
libdir=$LIBDIR
includedir=$INCLUDEDIR

Name: kcoll
Description: hand collectives and KV-cache transfers to the local kcolld
Version: $version
Cflags: -I\${includedir} -I\${includedir}/kcoll/uapi
Libs: -L\${libdir} -lkcoll
Libs.private: -pthread -lm
EOF
put 0644 "$pc" "$LIBDIR/pkgconfig" kcoll.pc

# Manual pages, by section.
for m in "$top"/man/*.[0-9]; do
	put 0644 "$m" "$MANDIR/man${m##*.}"
done

# The systemd unit, pointing at the daemon where it now lives.
unit=$(mktemp)
sed "s|^ExecStart=[^ ]*/kcolld|ExecStart=$SBINDIR/kcolld|" "$top/scripts/systemd/kcolld.service" > "$unit"
put 0644 "$unit" "$UNITDIR" kcolld.service

if [ "$dry" -eq 0 ]; then
	install -d -m 0755 "$DESTDIR$(dirname "$LIST")"
	installed+=("$LIST")
	printf '%s\n' "${installed[@]}" > "$DESTDIR$LIST"
	chmod 0644 "$DESTDIR$LIST"
fi
echo "installed kcoll $version into ${DESTDIR}$PREFIX (${#installed[@]} files; list: ${DESTDIR}$LIST)"
if [ -z "$DESTDIR" ] && [ "$(id -u)" -eq 0 ] && command -v ldconfig >/dev/null; then
	ldconfig
fi
