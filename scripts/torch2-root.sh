#!/usr/bin/env bash
# Build a Debian 13 "trixie" root holding python3 (3.13), python3-torch 2.x
# and python3-numpy (and venv and setuptools, to pip-install kcoll's
# package), so tests/t_python_torch2.sh can run kcoll's torch backend under
# torch 2.x (Debian 12, the host, ships torch 1.13 only).
#
#   scripts/torch2-root.sh          build the root unless it is complete
#   scripts/torch2-root.sh --check  exit 0 if the root is complete, 1 if not
#   scripts/torch2-root.sh --help
#
# The root lives at ${KCOLL_TORCH2_ROOT:-/var/cache/kcoll/torch2-root}. The
# file .kcoll-torch2-done in it (written last, holding the torch version
# and the package list) marks a complete root; a complete root of an older
# package list gets the missing packages installed into it; one with
# .kcoll-torch2-partial (written first) is half-built (an earlier run was
# killed) and is removed and built again. An
# existing non-empty directory with neither is refused, never removed. A
# lock ($root.lock) serializes builders; tests/t_python_torch2.sh waits on
# it while a build runs.
# Needs root, debootstrap and Debian's mirror (KCOLL_TORCH2_MIRROR, default
# the host's deb.debian.org entry); about 1.3 GB of disk. Measured here
# (2026-11-27, 2 busy cores): 496-517 s, 214 MB of packages downloaded.
set -euo pipefail

root=${KCOLL_TORCH2_ROOT:-/var/cache/kcoll/torch2-root}
stamp=$root/.kcoll-torch2-done
suite=trixie
pkgs=(python3 python3-torch python3-numpy python3-venv python3-setuptools)
want="packages: ${pkgs[*]}"
complete() { [ -f "$stamp" ] && grep -qxF "$want" "$stamp"; }

die() { echo "torch2-root.sh: $*" >&2; exit 1; }
say() { echo "torch2-root: $*"; }

case "${1:-}" in
-h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
--check) complete; exit ;;
"") ;;
*) die "unknown option '$1' (try --help)" ;;
esac

[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap, mount and chroot)"
case "$root" in /) die "refusing KCOLL_TORCH2_ROOT=/" ;; /*) ;;
*) die "KCOLL_TORCH2_ROOT='$root' must be an absolute path" ;; esac
command -v debootstrap >/dev/null || die "debootstrap missing: apt-get install debootstrap"
for c in unshare chroot mount flock curl; do
	command -v "$c" >/dev/null || die "'$c' missing"
done

mirror=${KCOLL_TORCH2_MIRROR:-}
if [ -z "$mirror" ]; then
	mirror=$(grep -hoE 'https?://deb\.debian\.org/debian/?( |$)' \
		/etc/apt/sources.list /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1 | tr -d ' ' || true)
	mirror=${mirror:-http://deb.debian.org/debian}
fi

mkdir -p "$(dirname "$root")"
exec 9>"$root.lock"
if ! flock -n 9; then
	say "another build holds $root.lock; waiting for it"
	flock 9
fi
if complete; then
	say "$root is complete ($(head -1 "$stamp"))"
	exit 0
fi
# A complete root of an older package list: add what it lacks, in place.
update=
[ -f "$stamp" ] && update=1

# A half-built root (this script's marker in it) is removed; never through
# a mount an earlier run left, and never a directory this script did not make.
if [ -z "$update" ] && [ -e "$root" ]; then
	if [ -f "$root/.kcoll-torch2-partial" ]; then
		grep -q " $root[/ ]" /proc/self/mountinfo &&
			die "$root has mounts left (see /proc/self/mountinfo): unmount them first"
		say "removing half-built $root"
		rm -rf --one-file-system "$root"
	elif [ -n "$(ls -A "$root" 2>/dev/null)" ] || [ ! -d "$root" ]; then
		die "$root exists and is not a root this script made (no .kcoll-torch2-partial):" \
			"refusing to touch it; remove it yourself or set KCOLL_TORCH2_ROOT"
	fi
fi

# Say "no network" plainly rather than through debootstrap's log.
curl -fsS --max-time 20 -o /dev/null "$mirror/dists/$suite/Release" 2>/dev/null ||
	die "cannot reach $mirror/dists/$suite/Release: no network (or no such mirror);" \
		"the root needs Debian's mirror"

t0=$SECONDS
log=$root.log
base_kb=0
if [ -n "$update" ]; then
	# Stays a complete root of its old list (usable) until the stamp changes.
	say "$root has an older package list ($(grep '^packages:' "$stamp" || echo "no package list")): adding the rest"
	: >"$log"
else
	mkdir -p "$root"
	: >"$root/.kcoll-torch2-partial"
	say "debootstrap --variant=minbase $suite $root from $mirror (log: $log)"
	# debootstrap mounts /proc and /sys in the root while it works: in a
	# private mount namespace, so that a killed run leaves none on the host.
	unshare --mount --propagation private \
		debootstrap --variant=minbase "$suite" "$root" "$mirror" >"$log" 2>&1 ||
		{ tail -20 "$log" >&2; die "debootstrap failed after $((SECONDS - t0)) s (log: $log)"; }
	base_kb=$(du -sk "$root/var/cache/apt/archives" | cut -f1)
	say "minbase done in $((SECONDS - t0)) s ($((base_kb / 1024)) MB of packages)"
	rm -f "$root"/var/cache/apt/archives/*.deb
fi

# The host's resolver and apt Acquire settings (as scripts/fresh-root.sh).
cp -L /etc/resolv.conf "$root/etc/resolv.conf"
for f in /etc/apt/apt.conf.d/*; do
	[ -f "$f" ] && grep -q '^Acquire::' "$f" && cp "$f" "$root/etc/apt/apt.conf.d/"
done
# apt inside the root, in a private mount namespace: its /proc and /dev
# mounts die with it and never show on the host.
t1=$SECONDS
say "apt-get install --no-install-recommends ${pkgs[*]}"
unshare --mount --propagation private bash -c '
	set -e
	r=$1; shift
	mount -t proc proc "$r/proc"
	mount --rbind /dev "$r/dev"
	chroot "$r" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
		DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8 sh -c "
		apt-get update -qq &&
		apt-get install -y -qq --no-install-recommends $* &&
		du -sk /var/cache/apt/archives | cut -f1 >/tmp/pkg-kb &&
		apt-get clean"
' inner "$root" "${pkgs[@]}" >>"$log" 2>&1 ||
	{ tail -20 "$log" >&2; die "apt-get install in $root failed (log: $log)"; }
pkg_kb=$(cat "$root/tmp/pkg-kb")
rm -f "$root/tmp/pkg-kb"
say "packages installed in $((SECONDS - t1)) s ($((pkg_kb / 1024)) MB of packages)"

ver=$(unshare --mount --propagation private bash -c '
	mount -t proc proc "$1/proc"
	chroot "$1" /usr/bin/python3 -c "import sys, torch; print(\"python\", sys.version.split()[0], \"torch\", torch.__version__)"
' inner "$root" 2>>"$log") || { tail -20 "$log" >&2; die "torch does not import in $root (log: $log)"; }
printf '%s\n%s\n' "$ver" "$want" >"$stamp.new" && mv "$stamp.new" "$stamp"
rm -f "$root/.kcoll-torch2-partial"
rm -f "$log"
say "$root complete: $ver; $((SECONDS - t0)) s, $(((base_kb + pkg_kb) / 1024)) MB downloaded, $(du -sm "$root" | cut -f1) MB on disk"
