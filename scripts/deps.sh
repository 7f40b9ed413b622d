#!/usr/bin/env bash
# Install the Debian packages kcoll needs that are missing. Idempotent: does
# nothing (and needs no network) when everything is there.
#   scripts/deps.sh            build + host-tier test dependencies
#   scripts/deps.sh --vm       also the VM tier (QEMU, guest kernel, rdma-core)
#   scripts/deps.sh --bench    also what the benchmarks and plots need
#   scripts/deps.sh --list ... print the packages those options name, one a
#                              line, and install nothing (tests/t_deps.sh)
# With CI=true or KCOLL_TORCH2=1 it also starts scripts/torch2-root.sh (the
# Debian 13 root with torch 2.x that tests/t_python_torch2.sh runs in) in
# the background unless that root is complete; the test waits for it.
# Every command a test or script of a tier calls must come from a package of
# its list (or from Debian's minbase): tests/t_deps.sh checks it.
set -euo pipefail

pkgs=(build-essential clang llvm pkg-config gcc-multilib libbpf-dev libibverbs-dev
      libnl-3-dev libnl-route-3-dev openmpi-bin libopenmpi-dev iproute2 bpftool
      python3 python3-mpi4py python3-numpy mpich libmpich-dev procps iputils-ping
      curl python3-prometheus-client python3-torch libclang-rt-dev debootstrap
      python3-venv python3-wheel)
list=0
for a in "$@"; do
	case "$a" in
	--vm) pkgs+=(qemu-system-x86 linux-image-amd64 linux-headers-amd64 busybox-static
		     rdma-core ibverbs-utils perftest kmod linux-source cpio xz-utils zstd perl) ;;
	--bench) pkgs+=(gnuplot-nox iperf3 libgloo-dev) ;;
	--list) list=1 ;;
	-h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "deps.sh: unknown option '$a' (try --help)" >&2; exit 2 ;;
	esac
done

if [ "$list" -eq 1 ]; then
	printf '%s\n' "${pkgs[@]}"
	exit 0
fi

# The torch 2.x root takes minutes of downloading: it runs while the build
# and the other tests do. Started after the packages above (debootstrap).
torch2_root() {
	local top root
	[ "${CI:-}" = true ] || [ "${KCOLL_TORCH2:-}" = 1 ] || return 0
	top=$(cd "$(dirname "$0")/.." && pwd)
	root=${KCOLL_TORCH2_ROOT:-/var/cache/kcoll/torch2-root}
	"$top/scripts/torch2-root.sh" --check && return 0
	# A build already running (make demo's deps.sh, then make check's).
	[ -e "$root.lock" ] && ! flock -n "$root.lock" true && return 0
	mkdir -p "$(dirname "$root")"
	echo "deps.sh: building the torch 2.x root $root in the background (log: $root.bg.log)"
	setsid "$top/scripts/torch2-root.sh" </dev/null >"$root.bg.log" 2>&1 &
}

missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && { torch2_root; exit 0; }

if [ "$(id -u)" -ne 0 ]; then
	echo "deps.sh: missing Debian packages: ${missing[*]}" >&2
	echo "deps.sh: run 'sudo make deps' (or apt-get install them) and retry" >&2
	exit 1
fi
echo "deps.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
torch2_root
