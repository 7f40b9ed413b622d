#!/usr/bin/env bash
# Device memory from Python: the kcoll package takes objects with
# __cuda_array_interface__ (CuPy, Numba, torch CUDA tensors) and hands
# their device pointers to libkcoll, as the C API takes them, for
# collectives and as KV segments.
# tests/python/cuda_rank.py at 2 and 3 ranks against a private kcolld,
# rank processes and kcolld all seeing the fake CUDA driver
# ($B/tests/fixtures/libcuda-fake.so, gpu/fake_cuda.c) as libcuda.so.1;
# then kcolld's log must show the ops ran on the (fake) GPU, or the device
# path was never taken (the fake's memory is host memory underneath, so
# results alone cannot tell); python3 -m kcoll reports the driver. On a
# GPU, scripts/gpu-check.sh runs the same ranks on the real driver.
# Needs /usr/bin/python3 with numpy. About 2 s. TAP.
set -u
. "${KCOLL_TOP:?run through tests/run.sh}/tests/python_lib.sh"
pick_python
fake="$B/tests/fixtures/libcuda-fake.so"

py_asan_preload || skip_all "$why"
"$PY" -c 'import numpy' 2>/dev/null || skip_all "numpy missing for $PY (apt-get install python3-numpy)"
[ -f "$fake" ] || skip_all "the fake CUDA driver $fake is missing (make builds it)"

T=$(mktemp -d "${KCOLL_TEST_TMP:-/tmp}/pycuda.XXXXXX")
kpid=
cleanup() {
	[ -n "$kpid" ] && kill "$kpid" 2>/dev/null && wait "$kpid" 2>/dev/null
	rm -rf "$T"
}
trap cleanup EXIT
ln -s "$fake" "$T/libcuda.so.1"
ldp=${LD_LIBRARY_PATH:-}	# without the fake
export LD_LIBRARY_PATH="$T${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export KCOLL_GPU_LIB="$fake" KCOLL_SOCKET="$T/k.sock" KCOLL_TEST_CUDA=fake
"$B/bin/kcolld" -f -v -s "$KCOLL_SOCKET" -l "$T/k.log" &
kpid=$!
for _ in $(seq 200); do [ -S "$KCOLL_SOCKET" ] && break; sleep 0.05; done
[ -S "$KCOLL_SOCKET" ]; ok $? "kcolld with the fake CUDA driver listens"
if [ ! -S "$KCOLL_SOCKET" ]; then
	sed 's/^/# kcolld: /' "$T/k.log" 2>/dev/null | tail -20
	echo "1..$n"
	exit 1
fi

export KCOLL_TEST_KV_OUT="$T/kv.want"
kv_dev_bytes() {
	"$B/bin/kcollctl" status --json | "$PY" -c 'import json, sys; print(json.load(sys.stdin)["kv"]["dev_bytes"])'
}
for w in 2 3; do
	before=$(grep -c "runs on GPU" "$T/k.log")
	kvb=$(kv_dev_bytes)
	rm -f "$T/kv.want"
	launch 90 "$TOP/tests/python/cuda_rank.py" "$w" "cuda $w" 60
	# 20 ops of every rank's buffers on the device: every dtype's sum (9),
	# 4 operators, all-gather, reduce-scatter, broadcast, the view, 3 of
	# the stream check. The host+device op and the refusals are not among them.
	runs=$(( $(grep -c "runs on GPU" "$T/k.log") - before ))
	[ "$runs" -ge 20 ]; ok $? "kcolld ran the $w-rank device ops on the GPU: $runs ops logged 'runs on GPU' (20 wanted)"
	# The KV blocks into and out of device segments went through the
	# GPU's copies, every byte once (kcolld counts them; process_vm on
	# the fake's memory would have moved the same bytes uncounted).
	got=$(( $(kv_dev_bytes) - kvb ))
	want=$(cat "$T/kv.want" 2>/dev/null || echo missing)
	[ "$got" = "$want" ]; ok $? "kcolld copied the $w-rank KV blocks of device segments through the GPU: $got bytes ($want wanted)"
done
# The same count in the metrics (docs/metrics.md), and no device segment
# left once the ranks are gone.
m=$("$B/bin/kcollctl" metrics)
mb=$(awk '$1 == "kcoll_kv_device_bytes_total" { print $2 }' <<<"$m")
ms=$(awk '$1 == "kcoll_kv_segments{memory=\"device\"}" { print $2 }' <<<"$m")
[ -n "$mb" ] && [ "$mb" = "$(kv_dev_bytes)" ] && [ "$ms" = 0 ]
ok $? "kcollctl metrics: kcoll_kv_device_bytes_total $mb as in status, kcoll_kv_segments{memory=\"device\"} $ms after the ranks"
# python3 -m kcoll tells whether this process has a driver for device memory.
out=$("$PY" -m kcoll --json 2>&1)
"$PY" -c 'import json, sys; r = json.loads(sys.argv[1])
sys.exit(0 if r["daemon"]["ok"] and r["cuda"] == {"driver": "13.0", "devices": 1} else 1)' "$out"
ok $? "python3 -m kcoll --json: the fake driver 13.0 with 1 device, kcolld usable ($(head -c 300 <<<"$out" | tr '\n' ' '))"
if /sbin/ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
	skip "python3 -m kcoll without a driver: this machine has a libcuda.so.1"
else
	out=$(LD_LIBRARY_PATH=$ldp "$PY" -m kcoll 2>&1)
	grep -q "^cuda: none (no CUDA driver: libcuda.so.1.*): host memory only" <<<"$out"
	ok $? "python3 -m kcoll without a driver says so, naming libcuda.so.1 ($(grep '^cuda' <<<"$out"))"
fi
kill "$kpid"; wait "$kpid"; rc=$?; kpid=
[ "$rc" -eq 0 ]; ok $? "kcolld drained and exited 0 (exit $rc)"
echo "1..$n"
exit $failed
