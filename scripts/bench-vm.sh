#!/usr/bin/env bash
# Intra-node all-reduce in the VM, one run, side by side: kcoll with the
# kernel module's zero-copy path (malloc buffers + kcoll_mem_register),
# kcoll's single-copy path (malloc, process_vm_readv/writev), and Open MPI
# (shared memory). f32 sum, 64 MiB, N=2 and N=4. TCG distorts absolute times;
# the ratios within one run are the result.
#   scripts/bench-vm.sh [BUILD]     host side: boots the VM, writes
#                                   docs/perf/vm-<date>.json, prints a table
#   scripts/bench-vm.sh --guest B   what runs inside the guest
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/scripts/bench-lib.sh"	# bench_opts, bench_build_dir
iters=${BENCH_VM_ITERS:-5}
size=${BENCH_VM_SIZE:-64M}

guest() {
	local B=$1 T
	T=$(mktemp -d /tmp/bvm.XXXXXX)
	ulimit -l unlimited
	ip link set lo up	# Open MPI/PMIx need an interface
	hostname kcoll-vm	# and a valid node name
	insmod "$top/build/kmod/kmod/kcoll.ko"
	"$B/bin/kcolld" -f -s "$T/k.sock" -l "$T/k.log" &
	local pid=$!
	for _ in $(seq 100); do KCOLL_SOCKET=$T/k.sock "$B/bin/kcollctl" status >/dev/null 2>&1 && break; sleep 0.1; done
	export KCOLL_SOCKET=$T/k.sock
	for n in 2 4; do
		for mem in reg host; do
			echo "BENCHJSON $n kcoll-$mem $("$B/bin/kcoll-bench" allreduce -N "$n" -b "$size" -e "$size" \
				-n "$iters" -w 1 -c 1 --mem "$mem" --json | tr -d '\n')"
		done
		echo "BENCHJSON $n openmpi $(mpirun --allow-run-as-root --oversubscribe --mca pml ob1 \
			--mca btl self,vader -np "$n" "$B/bin/mpi-coll-bench" allreduce -b "$size" -e "$size" \
			-n "$iters" -w 1 -c 1 --json | tr -d '\n')"
	done
	"$B/bin/kcollctl" status | sed 's/^/# /'
	kill -TERM "$pid"; wait "$pid" || true
	rmmod kcoll
}

if [ "${1:-}" = "--guest" ]; then
	guest "$2"
	exit 0
fi

bench_opts "$@"
BUILD=${1:-build}
B=$top/$BUILD
bench_build_dir "$B" "$BUILD"
[ -f "$top/build/kmod/kmod/kcoll.ko" ] || { echo "bench-vm.sh: build the module first (make vmtest)"; exit 1; }
out=$top/docs/perf/vm-$(date +%Y-%m-%d-%H%M).json
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
"$top/scripts/vmtest.sh" --mem 3072 --timeout 900 -- "$top/scripts/bench-vm.sh" --guest "$B" | tee "$raw" | grep -v '^BENCHJSON'
python3 - "$raw" "$out" <<'PY'
import json, sys
rows = {}
for line in open(sys.argv[1]):
    if not line.startswith("BENCHJSON "):
        continue
    _, n, system, doc = line.split(" ", 3)
    rows.setdefault(int(n), {})[system] = json.loads(doc)
json.dump({"what": "all-reduce f32 sum in the QEMU/TCG guest, one run", "results": rows},
          open(sys.argv[2], "w"), indent=1)
def busbw(d):
    r = d["rows"][-1] if "rows" in d else d["results"][-1]
    return r.get("busbw_oop", r.get("busbw")), r.get("time_us_oop", r.get("time_us"))
print("| N | kcoll zero-copy (module) | kcoll single-copy | Open MPI | zero-copy / single-copy | zero-copy / Open MPI |")
print("|---|---|---|---|---|---|")
for n in sorted(rows):
    z, h, m = (busbw(rows[n][k]) for k in ("kcoll-reg", "kcoll-host", "openmpi"))
    print(f"| {n} | {z[0]:.2f} GB/s | {h[0]:.2f} GB/s | {m[0]:.2f} GB/s | {z[0]/h[0]:.2f}x | {z[0]/m[0]:.2f}x |")
print(f"(json: {sys.argv[2]})")
PY
