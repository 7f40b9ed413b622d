#!/usr/bin/env bash
# Guest side of `make vmtest` (scripts/vmtest.sh --suite runs it in the VM):
# the kcoll.ko tests in order, as root, each printing TAP.
#   tests/vm/run.sh KO BIN    KO: kcoll.ko, BIN: the built tests/vm programs
# Ends with "# guest: N passed, N failed, N skipped"; the host sums the TAP
# and checks the guest's dmesg after the run.
set -u
ko=$1 bin=$2
here=$(cd "$(dirname "$0")" && pwd)
per_test_timeout=${KCOLL_VM_TEST_TIMEOUT:-120}

if [ "$(id -u)" -ne 0 ] || [ -z "${KCOLL_VM:-}" ]; then
	echo "Bail out! tests/vm/run.sh loads kernel modules: run it through scripts/vmtest.sh"
	exit 1
fi

pass=0 fail=0 skip=0
run_one() {	# name, command...
	local name=$1 out rc p s f t0=$SECONDS; shift
	echo "# --- $name"
	out=$(timeout -k 5 "$per_test_timeout" "$@" 2>&1); rc=$?
	printf '%s\n' "$out"
	echo "# $name: $((SECONDS - t0)) s (limit $per_test_timeout s)"
	p=$(grep -cE '^ok [0-9]+' <<<"$out")
	s=$(grep -cE '^ok [0-9]+.*# *(SKIP|skip)' <<<"$out")
	f=$(grep -cE '^not ok' <<<"$out")
	p=$((p - s))
	if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
		echo "not ok - $name exited with status $rc"
		f=1
	fi
	if [ $((p + f + s)) -eq 0 ]; then
		echo "not ok - $name printed no test result"
		f=1
	fi
	pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + s))
}

rmmod kcoll 2>/dev/null
run_one "kcoll_kdev --absent" "$bin/kcoll_kdev" --absent
run_one "t_module.sh params" bash "$here/t_module.sh" params "$ko"

if insmod "$ko" max_pinned_mb=2 max_buf_mb=1; then
	run_one "kcoll_buf --limits" "$bin/kcoll_buf" --limits
	rmmod kcoll
else
	echo "not ok - insmod $ko max_pinned_mb=2 max_buf_mb=1"; fail=$((fail + 1))
fi

if insmod "$ko"; then
	for t in kcoll_ioctl kcoll_ring kcoll_buf kcoll_dmabuf kcoll_sysfs kcoll_kdev kcoll_ioctl32 kcoll_kdev32; do
		run_one "$t" "$bin/$t"
	done
	# The foundation's daemon integration tests again, now with the module:
	# kcolld opens /dev/kcoll and maps kcoll_mem_register'ed buffers
	# (test_kmod_path checks results, zero copied bytes, handle theft).
	# (three programs in one run_one: test_coll alone took 52 s of the 120
	# under TCG on a busy host)
	# (their staleness was checked on the host: scripts/vmtest.sh)
	KCOLL_TEST_SKIP_STALE=1 per_test_timeout=360 run_one "host-tier daemon tests with kcoll.ko loaded" \
		"$here/../run.sh" "${KCOLL_VM_BUILD:-build}" test_coll test_kmod_path test_faults
		run_one "t_tunables.sh" bash "$here/t_tunables.sh"
	run_one "t_c4.sh" bash "$here/t_c4.sh"
	# zero-copy RDMA from kcoll.ko regions through its dma-buf (refused on rxe)
	per_test_timeout=420 run_one "t_rdma_kmod.sh" bash "$here/t_rdma_kmod.sh" "${KCOLL_VM_BUILD:-build}"
	run_one "t_module.sh unload" bash "$here/t_module.sh" unload "$ko" "$bin"
else
	echo "Bail out! insmod $ko failed"; fail=$((fail + 1))
fi

# The RDMA transport on Soft-RoCE (issue 6): collectives over rxe, faults.
per_test_timeout=420 run_one "t_rdma.sh" bash "$here/t_rdma.sh" "${KCOLL_VM_BUILD:-build}"
# The same under ASan+UBSan (build-asan, which make check builds): the RDMA
# transport's userspace runs only here, so here is where it is checked clean.
if [ -x "$here/../../build-asan/bin/kcolld" ]; then
	per_test_timeout=600 run_one "t_rdma.sh, ASan build" bash "$here/t_rdma.sh" build-asan
else
	echo "ok 1 - t_rdma.sh, ASan build # SKIP build-asan/ not built (make SAN=1; make check builds it)"
	skip=$((skip + 1))
fi
# KV-cache transfers over RDMA (issue 9): integrity, concurrency, faults.
per_test_timeout=420 run_one "t_kv_rdma.sh" bash "$here/t_kv_rdma.sh" "${KCOLL_VM_BUILD:-build}"

echo "# guest: $pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
