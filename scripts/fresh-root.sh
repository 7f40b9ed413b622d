#!/usr/bin/env bash
# Run a command in a freshly made Debian 12 root, the way a new user's machine
# would run it: nothing of kcoll's installed, only make, git and
# ca-certificates on top of debootstrap's minbase. Proves that the README's
# set-up installs everything it needs (.ci/run runs the suites this way).
#
#   scripts/fresh-root.sh [options] [--] CMD...
#       make the root (from the cached tarball, or debootstrap), clone this
#       checkout into /work/kcoll inside it, run CMD there with bash -c, and
#       exit with CMD's status
#   --root DIR      where the root is made (default /var/tmp/kcoll-fresh-root);
#                   an existing one is removed first
#   --cache FILE    tarball of the minbase root (default
#                   /var/cache/kcoll/bookworm-minbase.tar); made once with
#                   debootstrap (about 40 s), unpacked in a few seconds after
#   --mirror URL    Debian mirror for debootstrap and apt (default: the
#                   host's deb.debian.org entry, else http://deb.debian.org/debian)
#   --worktree      also copy this checkout's uncommitted changes and
#                   untracked files (not ignored ones); default: HEAD only
#   --env NAME      pass the host's NAME into the root (repeatable); CI,
#                   DEBIAN_FRONTEND and TERM always pass
#   --no-cuda       leave the CUDA toolkit out (default: /usr/local/cuda*
#                   bound read-only when the host has it: it is not a Debian
#                   package, so deps.sh cannot install it)
#   --keep          keep the root afterwards (it is removed otherwise)
#
# What the command gets, and what still differs from a real machine:
#   - its own mount namespace with the root as a mount point (ip netns exec
#     works), its own PID namespace and /proc, sysfs, cgroup2, bpffs,
#     debugfs/tracefs, /dev (bound from the host, with its own /dev/shm),
#     tmpfs /run, /tmp on disk (as Debian 12 has it), the host's resolv.conf,
#     hosts and apt sources (so apt reaches the same mirror)
#   - it shares the host's kernel (so its limits: no modules, no RDMA, no BPF
#     tracing), network namespace (addresses, veths and bridges it makes in
#     the host's namespace are the host's) and hostname; no systemd runs
#     (nothing in kcoll needs it; kcolld.service is only installed)
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
root=/var/tmp/kcoll-fresh-root
cache=/var/cache/kcoll/bookworm-minbase.tar
mirror=
worktree=0
keep=0
cuda=1
pass_env=(CI DEBIAN_FRONTEND TERM)
cmd=

usage() { sed -n '2,37p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "fresh-root.sh: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
	case "$1" in
	--root) root=${2:?--root needs a directory}; shift 2 ;;
	--cache) cache=${2:?--cache needs a file}; shift 2 ;;
	--mirror) mirror=${2:?--mirror needs a URL}; shift 2 ;;
	--worktree) worktree=1; shift ;;
	--env) pass_env+=("${2:?--env needs a name}"); shift 2 ;;
	--no-cuda) cuda=0; shift ;;
	--keep) keep=1; shift ;;
	-h|--help) usage; exit 0 ;;
	--) shift; cmd="$*"; break ;;
	-*) die "unknown option '$1' (try --help)" ;;
	*) cmd="$*"; break ;;
	esac
done
[ -n "$cmd" ] || { usage >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap, mount and chroot)"
case "$root" in /|/usr|/var|/tmp|/work|"") die "refusing --root '$root'" ;; esac
for c in unshare chroot mount tar git flock; do
	command -v "$c" >/dev/null || die "'$c' missing (apt-get install util-linux tar git)"
done

if [ -z "$mirror" ]; then
	mirror=$(grep -hoE 'https?://deb\.debian\.org/debian/?( |$)' \
		/etc/apt/sources.list /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1 | tr -d ' ' || true)
	mirror=${mirror:-http://deb.debian.org/debian}
fi

# Anything still mounted under the root (an earlier run killed hard) must not
# be deleted through.
remove_root() {
	[ -e "$root" ] || return 0
	if grep -q " $root[/ ]" /proc/self/mountinfo; then
		die "$root still has mounts (see /proc/self/mountinfo): unmount them first"
	fi
	local p users=
	for p in /proc/[0-9]*; do
		case "$(readlink "$p/root" 2>/dev/null)" in
		"$root"|"$root"/*) users="$users ${p#/proc/}" ;;
		esac
	done
	[ -z "$users" ] || die "processes$users still run in $root: kill them first"
	rm -rf --one-file-system "$root"
}

# ---------------------------------------------------------------------------
# The minbase root: cached as a tarball, made by debootstrap when missing.

make_cache() {
	command -v debootstrap >/dev/null || die "debootstrap missing: apt-get install debootstrap"
	local t0=$SECONDS stage=$root.debootstrap
	echo "fresh-root: debootstrap --variant=minbase bookworm from $mirror"
	rm -rf --one-file-system "$stage"
	debootstrap --variant=minbase --include=make,git,ca-certificates bookworm "$stage" "$mirror" \
		>"$stage.log" 2>&1 || { tail -20 "$stage.log" >&2; die "debootstrap failed (log: $stage.log)"; }
	rm -rf "$stage"/var/cache/apt/archives/*.deb "$stage"/var/lib/apt/lists/*_Packages
	mkdir -p "$(dirname "$cache")"
	tar -C "$stage" --numeric-owner -cf "$cache.tmp" . && mv "$cache.tmp" "$cache"
	rm -rf --one-file-system "$stage" "$stage.log"
	echo "fresh-root: made $cache in $((SECONDS - t0)) s"
}

# One run per root: a second one would unpack into a root the first is
# still using or removing.
mkdir -p "$(dirname "$root")"
exec 9>"$root.lock"
flock -n 9 || die "another fresh-root.sh is using $root (lock $root.lock): wait for it or use --root"
[ -s "$cache" ] || make_cache
remove_root
mkdir -p "$root"
tar -C "$root" --numeric-owner -xf "$cache"

# Network and apt as the host has them: resolver, hosts, the Debian sources
# (the host's bookworm, -updates and -security entries) and Acquire settings.
cp -L /etc/resolv.conf "$root/etc/resolv.conf"
cp /etc/hosts "$root/etc/hosts"
if [ -f /etc/apt/sources.list.d/debian.sources ]; then
	cp /etc/apt/sources.list.d/debian.sources "$root/etc/apt/sources.list.d/"
	: >"$root/etc/apt/sources.list"
fi
for f in /etc/apt/apt.conf.d/*; do
	[ -f "$f" ] && grep -q '^Acquire::' "$f" && cp "$f" "$root/etc/apt/apt.conf.d/"
done

# The checkout: a clean clone of HEAD, plus (--worktree) what is not committed.
dest=$root/work/kcoll
git clone -q --no-hardlinks "$top" "$dest"
if [ "$worktree" -eq 1 ]; then
	(cd "$top" && git ls-files -z --cached --others --exclude-standard |
		tar --null -T - --ignore-failed-read -cf - 2>/dev/null) | tar -C "$dest" -xf -
	(cd "$top" && git ls-files -z --deleted) | (cd "$dest" && xargs -0 -r rm -f)
fi

cuda_dirs=()
if [ "$cuda" -eq 1 ]; then
	for d in /usr/local/cuda /usr/local/cuda-*; do
		[ -d "$d" ] && [ ! -L "$d" ] && cuda_dirs+=("$d")
	done
	[ -L /usr/local/cuda ] && cp -P /usr/local/cuda "$root/usr/local/cuda"
fi

envs=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8)
for n in "${pass_env[@]}"; do
	[ -n "${!n+x}" ] && envs+=("$n=${!n}")
done

# Inside a new mount and PID namespace: the root a mount point of its own,
# the kernel's file systems, then chroot. The namespaces die with the
# command, taking every mount (and any network namespace made by name) along.
# The namespace's init is the bash that runs the command (the trailing exit
# keeps it from exec'ing the last command): it reaps orphans, as init must,
# or a daemonized kcolld that died would linger as a zombie that kill -0
# still finds.
inner=$(cat <<'EOF'
set -e
r=$1; shift
mount --bind "$r" "$r"
mount -t proc proc "$r/proc"
mount -t sysfs sysfs "$r/sys"
mount -t cgroup2 cgroup2 "$r/sys/fs/cgroup" 2>/dev/null || true
mount -t bpf bpf "$r/sys/fs/bpf"
mount -t debugfs debugfs "$r/sys/kernel/debug" 2>/dev/null || true
mount -t tracefs tracefs "$r/sys/kernel/tracing" 2>/dev/null || true
mount --rbind /dev "$r/dev"
mount -t tmpfs -o mode=1777 tmpfs "$r/dev/shm"
mount -t tmpfs -o mode=755 tmpfs "$r/run"
chmod 1777 "$r/tmp"
while [ "$1" != "--" ]; do
	mkdir -p "$r$1"
	mount --bind -o ro "$1" "$r$1"
	mount -o remount,bind,ro "$r$1"
	shift
done
shift
cd "$r/work/kcoll"
exec chroot "$r" /usr/bin/env -i "$@"
EOF
)

t0=$SECONDS
echo "fresh-root: running '$cmd' in $root (a fresh Debian 12 minbase root)"
set +e
unshare --mount --pid --fork --propagation private \
	bash -c "$inner" inner "$root" "${cuda_dirs[@]}" -- "${envs[@]}" \
	bash -c "cd /work/kcoll && { $cmd
}; exit \$?" 9>&- &
ushare=$!
# Stopped early (Ctrl-C, a CI timeout): the namespace's init is immune to its
# parent-death signal, so kill it from here, which ends every process in it.
stop_ns() {
	local init
	init=$(grep -l "^PPid:[[:space:]]*$ushare\$" /proc/[0-9]*/status 2>/dev/null | head -1 | cut -d/ -f3)
	[ -n "$init" ] && kill -KILL "$init" 2>/dev/null
	kill -KILL "$ushare" 2>/dev/null
}
stopped() {
	stop_ns
	wait "$ushare" 2>/dev/null
	[ "$keep" -eq 1 ] || remove_root
	exit "$1"
}
trap 'stopped 130' INT
trap 'stopped 143' TERM HUP
wait "$ushare"
rc=$?
trap - INT TERM HUP
set -e
echo "fresh-root: '$cmd' exited $rc after $((SECONDS - t0)) s"
[ "$keep" -eq 1 ] || remove_root
exit "$rc"
