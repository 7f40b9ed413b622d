#!/usr/bin/env bash
# The VM tier: boot Debian's generic 6.1 kernel under QEMU/TCG with the host's
# root file system shared read-only over 9p, and run a command in a chroot of
# it (same paths as here, so build/ is reachable). Nothing is built inside the
# guest. See docs/vmtest.md.
#
#   scripts/vmtest.sh [--kernel PATH] [--timeout S] [--mem MB] -- CMD...
#       run CMD in the guest (cwd = the current directory); print its output
#       and exit with its status (124 on timeout)
#       two-guest options (scripts/vmtest-pair.sh uses them): --nic SPEC
#       adds a virtio-net NIC on QEMU backend SPEC (-netdev SPEC,id=n0),
#       --mac MAC its address, --share DIR mounts host DIR read-write at the
#       same path, --tag NAME names the kept logs console-NAME.log etc.
#   scripts/vmtest.sh --suite [--timeout S]
#       build kcoll.ko and the VM tests, run checkpatch and the ABI checks here,
#       then the whole VM suite in one guest; prints TAP and a final line
#       "N passed, N failed, N skipped"
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
kernel=
timeout_s=
mem_mb=1024
suite=0
cmd=()
nic= mac=52:54:00:12:34:56 share= tag=

usage() { sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
	case "$1" in
	--kernel) kernel=${2:?--kernel needs a path}; shift 2 ;;
	--timeout) timeout_s=${2:?--timeout needs seconds}; shift 2 ;;
	--mem) mem_mb=${2:?--mem needs MiB}; shift 2 ;;
	--suite) suite=1; shift ;;
	--nic) nic=${2:?--nic needs a QEMU -netdev spec}; shift 2 ;;
	--mac) mac=${2:?--mac needs an address}; shift 2 ;;
	--share) share=${2:?--share needs a directory}; shift 2 ;;
	--tag) tag=-${2:?--tag needs a name}; shift 2 ;;
	-h|--help) usage; exit 0 ;;
	--) shift; cmd=("$@"); break ;;
	*) echo "vmtest.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
	esac
done
if [ "$suite" -eq 0 ] && [ ${#cmd[@]} -eq 0 ]; then
	usage >&2
	exit 2
fi

die() { echo "vmtest.sh: $*" >&2; exit 1; }

# ---------------------------------------------------------------------------
# Guest kernel and its modules

pick_kernel() {
	if [ -z "$kernel" ]; then
		kernel=$(printf '%s\n' /boot/vmlinuz-6.1.0-*-amd64 | grep -v '\*' | sort -V | tail -1 || true)
		[ -n "$kernel" ] || die "no /boot/vmlinuz-6.1.0-*-amd64: run 'scripts/deps.sh --vm' as root"
	fi
	[ -r "$kernel" ] || die "cannot read kernel $kernel"
	kver=${kernel##*/vmlinuz-}
	kmods=/lib/modules/$kver
	[ -d "$kmods/kernel" ] || die "no modules for $kver in $kmods (kernel and modules must match)"
}

# Guest-visible paths must not contain characters the kernel command line or
# the init script would split on.
check_path() {
	case "$1" in
	*[!A-Za-z0-9._/+-]*) die "path '$1' has characters the guest cannot take; use a simpler checkout path" ;;
	esac
}

# ---------------------------------------------------------------------------
# Initramfs: busybox + the virtio/9p modules; /init mounts the host root and
# a read-write results share, chroots, runs the command script, powers off.

initramfs_mods=(virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci
		netfs fscache 9pnet 9pnet_virtio 9p)

write_init() {
	cat >"$1" <<'EOF'
#!/bin/busybox sh
# kcoll vmtest guest init. Kernel command line (env): KCOLL_VM_RES=<host dir>,
# KCOLL_VM_TOP=<checkout> (kept visible when it lies under /tmp).
/bin/busybox --install -s /bin
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in MODULES; do
	insmod /mods/$m.ko || echo "vm-init: insmod $m failed"
done
o=trans=virtio,version=9p2000.L,msize=262144
r=/mnt
if ! mount -t 9p -o $o,ro hostroot $r; then
	echo "vm-init: cannot mount the host root over 9p"
	poweroff -f
fi
# The guest gets its own writable /tmp. A checkout under the host's /tmp
# (CI clones there) would vanish under it: keep a view of it and put it back.
case "$KCOLL_VM_TOP" in
/tmp/*) mkdir -p /keep && mount -o bind $r$KCOLL_VM_TOP /keep ;;
esac
mount -t tmpfs -o mode=1777 tmp $r/tmp
case "$KCOLL_VM_TOP" in
/tmp/*) mkdir -p $r$KCOLL_VM_TOP && mount -o bind /keep $r$KCOLL_VM_TOP ;;
esac
if ! mount -t 9p -o $o,rw results $r$KCOLL_VM_RES; then
	echo "vm-init: cannot mount the results share"
	poweroff -f
fi
if [ -n "$KCOLL_VM_SHARE" ] && ! mount -t 9p -o $o,rw share $r$KCOLL_VM_SHARE; then
	echo "vm-init: cannot mount the shared directory"
	poweroff -f
fi
mount -t proc proc $r/proc
mount -t sysfs sys $r/sys
mount -t devtmpfs dev $r/dev
mount -t tmpfs tmp $r/run
mount -t tmpfs -o mode=1777 shm $r/dev/shm 2>/dev/null
mount -t debugfs debugfs $r/sys/kernel/debug 2>/dev/null
echo "vm-init: running command"
chroot $r /bin/sh $KCOLL_VM_RES/cmd.sh >$r$KCOLL_VM_RES/out 2>&1 </dev/null
echo $? >$r$KCOLL_VM_RES/rc
chroot $r /bin/dmesg >$r$KCOLL_VM_RES/dmesg 2>&1
sync
poweroff -f
EOF
	sed -i "s|MODULES|${initramfs_mods[*]}|" "$1"
}

build_initramfs() {
	local out=$top/build/vm/initramfs-$kver.cpio.gz
	initramfs=$out
	if [ -s "$out" ] && [ "$out" -nt "$0" ]; then
		return 0
	fi
	command -v busybox >/dev/null || die "busybox missing: run 'scripts/deps.sh --vm' as root"
	local d
	d=$(mktemp -d "$top/build/vm/initramfs.XXXXXX")
	mkdir -p "$d/bin" "$d/proc" "$d/sys" "$d/dev" "$d/mnt" "$d/mods"
	cp "$(command -v busybox)" "$d/bin/busybox"
	for m in "${initramfs_mods[@]}"; do
		local f
		f=$(find "$kmods/kernel" -name "$m.ko*" | head -1)
		[ -n "$f" ] || die "module $m not found under $kmods"
		case "$f" in
		*.ko.xz) xz -dc "$f" >"$d/mods/$m.ko" ;;
		*.ko.zst) zstd -qdc "$f" >"$d/mods/$m.ko" ;;
		*.ko.gz) gzip -dc "$f" >"$d/mods/$m.ko" ;;
		*) cp "$f" "$d/mods/$m.ko" ;;
		esac
	done
	write_init "$d/init"
	chmod +x "$d/init"
	# (two guests of scripts/vmtest-pair.sh may build it at once)
	(cd "$d" && find . | cpio -o -H newc --quiet | gzip -1) >"$out.tmp$$"
	mv "$out.tmp$$" "$out"
	rm -rf "$d"
}

# ---------------------------------------------------------------------------
# Run a command in a guest. Streams its output; returns its exit status.

qemu_pid=
tail_pid=
run_dir=

cleanup() {
	if [ -n "$tail_pid" ]; then
		kill "$tail_pid" 2>/dev/null || true
	fi
	if [ -n "$qemu_pid" ] && kill -0 "$qemu_pid" 2>/dev/null; then
		kill -TERM "$qemu_pid" 2>/dev/null || true
		sleep 1
		kill -KILL "$qemu_pid" 2>/dev/null || true
	fi
	[ -n "$run_dir" ] && rm -rf "$run_dir"
	return 0
}
trap cleanup EXIT
trap 'exit 130' INT TERM

vm_run() {	# timeout, cmd...
	local tmo=$1; shift
	pick_kernel
	command -v qemu-system-x86_64 >/dev/null ||
		die "qemu-system-x86_64 missing: run 'scripts/deps.sh --vm' as root"
	mkdir -p "$top/build/vm"
	build_initramfs
	run_dir=$(mktemp -d "$top/build/vm/run.XXXXXX")
	check_path "$run_dir"
	local cwd
	cwd=$(pwd)
	{
		printf 'cd %q || exit 125\n' "$cwd"
		printf 'export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n'
		printf 'export HOME=/root TERM=dumb KCOLL_VM=1\n'
		printf 'exec'
		printf ' %q' "$@"
		printf '\n'
	} >"$run_dir/cmd.sh"
	: >"$run_dir/out"

	local console=$top/build/vm/console$tag.log extra=()
	if [ -n "$share" ]; then
		check_path "$share"
		extra+=(-fsdev "local,id=s,path=$share,security_model=none,multidevs=remap"
			-device virtio-9p-pci,fsdev=s,mount_tag=share)
	fi
	if [ -n "$nic" ]; then
		extra+=(-netdev "$nic,id=n0" -device "virtio-net-pci,netdev=n0,mac=$mac")
	fi
	qemu-system-x86_64 -accel tcg,thread=multi -cpu max -m "$mem_mb" -smp 2 \
		-nographic -no-reboot -nodefaults -serial stdio -monitor none \
		-kernel "$kernel" -initrd "$initramfs" \
		-fsdev local,id=r,path=/,security_model=none,readonly=on,multidevs=remap \
		-device virtio-9p-pci,fsdev=r,mount_tag=hostroot \
		-fsdev local,id=w,path="$run_dir",security_model=none,multidevs=remap \
		-device virtio-9p-pci,fsdev=w,mount_tag=results "${extra[@]}" \
		-append "console=ttyS0 rdinit=/init panic=-1 quiet KCOLL_VM_RES=$run_dir KCOLL_VM_TOP=$top KCOLL_VM_SHARE=$share" \
		</dev/null >"$console" 2>&1 &
	qemu_pid=$!
	tail -n +1 -F "$run_dir/out" 2>/dev/null &
	tail_pid=$!

	local waited=0 rc
	while kill -0 "$qemu_pid" 2>/dev/null; do
		if [ "$waited" -ge "$tmo" ]; then
			break
		fi
		sleep 1
		waited=$((waited + 1))
	done
	if kill -0 "$qemu_pid" 2>/dev/null; then
		kill -TERM "$qemu_pid" 2>/dev/null || true
		wait "$qemu_pid" 2>/dev/null || true
		qemu_pid=
		sleep 0.3
		kill "$tail_pid" 2>/dev/null || true
		wait "$tail_pid" 2>/dev/null || true
		tail_pid=
		echo "vmtest.sh: timed out after ${tmo}s; last console lines ($console):" >&2
		tail -n 30 "$console" | tr -d '\r' >&2
		return 124
	fi
	wait "$qemu_pid" 2>/dev/null || true
	qemu_pid=
	sleep 0.3	# let tail print the last lines
	kill "$tail_pid" 2>/dev/null || true
	wait "$tail_pid" 2>/dev/null || true
	tail_pid=
	[ -f "$run_dir/dmesg" ] && cp "$run_dir/dmesg" "$top/build/vm/dmesg$tag.log"
	cp "$run_dir/out" "$top/build/vm/out$tag.log"
	if [ ! -s "$run_dir/rc" ]; then
		echo "vmtest.sh: the guest stopped before the command finished; console ($console):" >&2
		tail -n 30 "$console" | tr -d '\r' >&2
		return 1
	fi
	rc=$(cat "$run_dir/rc")
	return "$rc"
}

if [ "$suite" -eq 0 ]; then
	set +e
	vm_run "${timeout_s:-300}" "${cmd[@]}"
	exit $?
fi

# ---------------------------------------------------------------------------
# The suite

if ! "$top/scripts/deps.sh" --vm; then
	die "VM-tier packages missing (see above)"
fi
pick_kernel
check_path "$top"
cd "$top"

pass=0 fail=0 skip=0
count() {	# TAP text on stdin -> adds to the totals
	local out p s f
	out=$(cat)
	p=$(grep -cE '^ok [0-9]+' <<<"$out" || true)
	s=$(grep -cE '^ok [0-9]+.*# *(SKIP|skip)' <<<"$out" || true)
	f=$(grep -cE '^not ok' <<<"$out" || true)
	pass=$((pass + p - s)); fail=$((fail + f)); skip=$((skip + s))
}

host_tap=$top/build/vm/host.tap
mkdir -p "$top/build/vm"
: >"$host_tap"
n=0
host_check() {	# description, command... : one TAP line, output as diagnostics
	local desc=$1 out rc; shift
	n=$((n + 1))
	set +e
	out=$("$@" 2>&1); rc=$?
	set -e
	if [ "$rc" -eq 0 ]; then
		echo "ok $n - $desc"
	else
		printf '%s\n' "$out" | tail -n 40 | sed 's/^/# /'
		echo "not ok $n - $desc"
	fi | tee -a "$host_tap"
	return 0
}

kbuild=/lib/modules/$kver/build
kobj=$top/build/kmod
vmbin=$top/build/vm/bin
ksft=$top/build/ksft
vmcflags=(-std=gnu11 -O2 -g -Wall -Wextra -Werror -Wno-unused-parameter -D_GNU_SOURCE
	  -Iinclude -Iinclude/uapi -Iuser/common -I"$ksft" -pthread)

# from_linux_source DEST PATH...: files of Debian's kernel source tarball
# (package linux-source; PATH relative to its top) into DEST, flat.
from_linux_source() {
	local dest=$1 src dir p; shift
	src=$(printf '%s\n' /usr/src/linux-source-*.tar.xz | grep -v '\*' | sort -V | tail -1 || true)
	[ -n "$src" ] || { echo "no /usr/src/linux-source-*.tar.xz: install linux-source"; return 1; }
	dir=$(basename "$src" .tar.xz)
	mkdir -p "$dest"
	local paths=()
	for p in "$@"; do paths+=("$dir/$p"); done
	tar -xJf "$src" -C "$dest" --transform='s|.*/||' "${paths[@]}"
}

build_kmod() {
	[ -d "$kbuild" ] || { echo "no $kbuild: install linux-headers-$kver"; return 1; }
	mkdir -p "$kobj"
	# Build a copy so the objects stay out of the source tree; cp -p keeps
	# mtimes so unchanged sources are not rebuilt.
	cp -p Kbuild "$kobj/Kbuild"
	mkdir -p "$kobj/kmod" "$kobj/include/uapi/linux"
	cp -p kmod/*.[ch] kmod/Kbuild "$kobj/kmod/"
	cp -p include/uapi/linux/kcoll.h "$kobj/include/uapi/linux/"
	mkdir -p "$kobj/include/kcoll"
	cp -p include/kcoll/ring_layout.h "$kobj/include/kcoll/"
	# the C4 core kcolld and the module share (kmod/c4_core.c includes it)
	cp -p include/kcoll/c4.h "$kobj/include/kcoll/"
	mkdir -p "$kobj/user/common"
	cp -p user/common/c4.c "$kobj/user/common/"
	make -s -C "$kbuild" M="$kobj" W=1 KCFLAGS=-Werror modules
}

build_vmtests() {
	mkdir -p "$vmbin"
	local t
	# The tests count, print and exit through kselftest's kselftest.h.
	[ -f "$ksft/kselftest.h" ] ||
		from_linux_source "$ksft" tools/testing/selftests/kselftest.h || return 1
	for t in tests/vm/*.c; do
		gcc "${vmcflags[@]}" -o "$vmbin/$(basename "$t" .c)" "$t" user/common/kdev.c || return 1
	done
	# 32-bit clients go through the module's compat ioctl path
	for t in kcoll_ioctl kcoll_kdev; do
		gcc -m32 -D_FILE_OFFSET_BITS=64 "${vmcflags[@]}" -o "$vmbin/${t}32" "tests/vm/$t.c" \
			user/common/kdev.c || return 1
	done
}

# The guest's tests/run.sh would ask make -q about every test program: under
# TCG that took over 2 minutes. The host asks once here, and the guest skips
# it (tests/vm/run.sh sets KCOLL_TEST_SKIP_STALE).
fresh_tests() {
	local b=${KCOLL_VM_BUILD:-build} t stale=()
	for t in "$b"/tests/*; do
		[ -f "$t" ] && [ -x "$t" ] || continue
		make -q MTIME_ONLY=1 BUILD="$b" "$t" >/dev/null 2>&1
		[ $? -eq 1 ] && stale+=("$t")
	done
	[ ${#stale[@]} -eq 0 ] || { echo "stale, make would rebuild them: ${stale[*]} (run make check)"; return 1; }
}

abi_check() {	# -m64 / -m32
	gcc "$1" -std=gnu11 -Wall -Wextra -Werror -Iinclude -Iinclude/uapi -fsyntax-only \
		include/kcoll/abi_check_kmod.c
}

checkpatch() {
	local cp=$top/build/checkpatch
	if [ ! -x "$cp/checkpatch.pl" ]; then
		from_linux_source "$cp" scripts/checkpatch.pl scripts/spelling.txt \
			scripts/const_structs.checkpatch || return 1
	fi
	"$cp/checkpatch.pl" --no-tree --quiet --strict --show-types -f kmod/*.c kmod/*.h
}

echo "# --- host: build and static checks"
host_check "kcoll.ko builds against $kbuild (W=1, no warnings)" build_kmod
host_check "tests/vm programs build" build_vmtests
host_check "the host-tier test programs the guest runs are up to date" fresh_tests
host_check "abi_check_kmod.c compiles (-m64)" abi_check -m64
host_check "abi_check_kmod.c compiles (-m32)" abi_check -m32
host_check "checkpatch.pl --strict clean on kmod/" checkpatch
count <"$host_tap"

if [ ! -f "$kobj/kmod/kcoll.ko" ] || [ ! -x "$vmbin/kcoll_ioctl" ]; then
	echo "Bail out! nothing to run in the guest"
	echo "$pass passed, $((fail + 1)) failed, $skip skipped"
	exit 1
fi

guest_log=$top/build/vm/out.log
rm -f "$guest_log" "$top/build/vm/dmesg.log"
set +e
# A hang guard for the whole guest run (each test has its own limit too); the
# guest part took ~450 s under load here, and TCG scales with the CPU.
vm_run "${timeout_s:-1800}" bash tests/vm/run.sh "$kobj/kmod/kcoll.ko" "$vmbin"
rc=$?
set -e
touch "$guest_log"
count <"$guest_log"
if [ "$rc" -ne 0 ] && ! grep -q '^not ok' "$guest_log"; then
	echo "not ok - the guest run ended with status $rc"
	fail=$((fail + 1))
fi

# The guest kernel's log, dumped after the run: no warning or oops anywhere.
echo "# --- guest dmesg (build/vm/dmesg.log)"
dmesg_log=$top/build/vm/dmesg.log
bad=$(grep -E 'WARNING:|BUG:|Oops|general protection fault|refcount_t:' "$dmesg_log" 2>/dev/null || true)
if [ ! -s "$dmesg_log" ]; then
	echo "not ok 1 - the guest's dmesg was collected"
	fail=$((fail + 1))
elif [ -n "$bad" ]; then
	printf '%s\n' "$bad" | head -20 | sed 's/^/# /'
	echo "not ok 1 - guest dmesg has no WARNING:/BUG: lines"
	fail=$((fail + 1))
else
	echo "ok 1 - guest dmesg has no WARNING:/BUG: lines"
	pass=$((pass + 1))
fi

# Two guests at once on a virtual wire (scripts/vmtest-pair.sh): the RDMA
# transport between two kernels, each with its own NIC and rxe device.
echo "# --- two guests: tests/vm/t_rdma_pair.sh"
rm -f "$top"/build/vm/dmesg-pair[01].log
set +e
pair_out=$("$top/scripts/vmtest-pair.sh" --timeout 900 -- bash tests/vm/t_rdma_pair.sh build 2>&1)
rc=$?
set -e
printf '%s\n' "$pair_out"
count <<<"$pair_out"
if [ "$rc" -ne 0 ] && ! grep -q '^not ok' <<<"$pair_out"; then
	echo "not ok - the two-guest run ended with status $rc"
	fail=$((fail + 1))
fi
if ! grep -q '# SKIP' <<<"$pair_out"; then
	bad=$(grep -hE 'WARNING:|BUG:|Oops|general protection fault|refcount_t:' \
		"$top"/build/vm/dmesg-pair[01].log 2>/dev/null || true)
	if [ ! -s "$top/build/vm/dmesg-pair0.log" ] || [ ! -s "$top/build/vm/dmesg-pair1.log" ] ||
		[ -n "$bad" ]; then
		printf '%s\n' "$bad" | head -20 | sed 's/^/# /'
		echo "not ok 1 - both guests' dmesg collected, no WARNING:/BUG: lines (build/vm/dmesg-pair*.log)"
		fail=$((fail + 1))
	else
		echo "ok 1 - both guests' dmesg collected, no WARNING:/BUG: lines (build/vm/dmesg-pair*.log)"
		pass=$((pass + 1))
	fi
fi
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
