#!/usr/bin/env bash
# Install the Debian packages kcoll needs that are missing. Idempotent: does
# nothing (and needs no network) when everything is there.
#   scripts/deps.sh            build + host-tier test dependencies
#   scripts/deps.sh --vm       also the VM tier (QEMU, guest kernel, rdma-core)
#   scripts/deps.sh --bench    also what the benchmarks and plots need
#   scripts/deps.sh --list ... print the packages those options name, one a
#                              line, and install nothing (tests/t_deps.sh)
# Every command a test or script of a tier calls must come from a package of
# its list (or from Debian's minbase): tests/t_deps.sh checks it.
set -euo pipefail

pkgs=(build-essential clang llvm pkg-config gcc-multilib libbpf-dev libibverbs-dev
      libnl-3-dev libnl-route-3-dev openmpi-bin libopenmpi-dev iproute2 bpftool
      python3 python3-mpi4py python3-numpy mpich libmpich-dev procps iputils-ping
      curl python3-prometheus-client python3-torch libclang-rt-dev)
list=0
for a in "$@"; do
	case "$a" in
	--vm) pkgs+=(qemu-system-x86 linux-image-amd64 linux-headers-amd64 busybox-static
		     rdma-core ibverbs-utils perftest kmod linux-source cpio xz-utils zstd perl) ;;
	--bench) pkgs+=(gnuplot-nox iperf3 libgloo-dev) ;;
	--list) list=1 ;;
	-h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "deps.sh: unknown option '$a' (try --help)" >&2; exit 2 ;;
	esac
done

if [ "$list" -eq 1 ]; then
	printf '%s\n' "${pkgs[@]}"
	exit 0
fi

missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
	echo "deps.sh: missing Debian packages: ${missing[*]}" >&2
	echo "deps.sh: run 'sudo make deps' (or apt-get install them) and retry" >&2
	exit 1
fi
echo "deps.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
