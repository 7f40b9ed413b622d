#!/usr/bin/env bash
# The one device check (docs/gpu.md "Running the device check"): on a machine
# with a GPU, the GPU tests against the real driver and the GPU benchmarks,
# each beside its anchor; without one, every part says SKIP with the doctor's
# reason. Writes everything into OUT and exits 0 unless a part failed.
#
#   scripts/gpu-check.sh [--out DIR] [--build DIR] [--parts a,b] [--budget S]
#                        [--max-bytes N] [--no-gpu] [--fake]
#
#   --out DIR    results (default $OUT, else a new temp dir): gpu-check.tap,
#                gpu-check.json, doctor.txt, doctor.json, env.txt, and per
#                part <part>.log (+ <part>.json for benchmarks)
#   --build DIR  the build to run (default $KCOLL_BUILD, else build-gpu when
#                it exists (make gpu-carry), else build)
#   --parts LIST only these parts (comma separated; default all, in order)
#   --budget S   stop starting parts after S seconds (default 450); a part not
#                started is reported skipped for want of time
#   --max-bytes N  largest benchmark buffer (kcoll-gpu-bench -m; default its own)
#   --no-gpu     behave as on a machine without a GPU (what tests do on one)
#   --fake       rehearse the GPU mode on gpu/fake_cuda.c (tests/fixtures'
#                libcuda-fake.so): proves the script and the benchmarks run,
#                numbers mean nothing
# Output on stdout: TAP, one line per part, benchmark tables as comments.
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-} build=${KCOLL_BUILD:-} parts_sel= budget=450 mode=auto bench_max=()
ALL_PARTS=(test_gpu test_gpudirect ipc test_gpu_ring test_gpu_mh test_gpu_kv python_cuda bench_reduce
	bench_allreduce_2 bench_allreduce_4 bench_staging bench_kv bench_nccl)

usage() { sed -n '6,21p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
	case $1 in
	--out) out=${2:?--out needs a directory}; shift ;;
	--build) build=${2:?--build needs a directory}; shift ;;
	--parts) parts_sel=${2:?--parts needs a list}; shift ;;
	--budget) budget=${2:?--budget needs seconds}; shift ;;
	--max-bytes) bench_max=(-m "${2:?--max-bytes needs a size}"); shift ;;
	--no-gpu) mode=no-gpu ;;
	--fake) mode=fake ;;
	-h|--help) usage; exit 0 ;;
	*) echo "gpu-check.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
	esac
	shift
done
case $budget in ''|*[!0-9]*) echo "gpu-check.sh: --budget takes whole seconds" >&2; exit 2 ;; esac
if [ -z "$build" ]; then
	if [ -d "$top/build-gpu" ]; then build=$top/build-gpu; else build=$top/build; fi
fi
case $build in /*) ;; *) build=$top/$build ;; esac
B=$build
[ -n "$out" ] || out=$(mktemp -d /tmp/gpu-check.XXXXXX)
mkdir -p "$out" || { echo "gpu-check.sh: cannot create $out" >&2; exit 2; }
out=$(cd "$out" && pwd)
parts=()
if [ -n "$parts_sel" ]; then
	IFS=, read -r -a parts <<<"$parts_sel"
	for p in "${parts[@]}"; do
		[[ " ${ALL_PARTS[*]} " == *" $p "* ]] ||
			{ echo "gpu-check.sh: no part '$p' (parts: ${ALL_PARTS[*]})" >&2; exit 2; }
	done
else
	parts=("${ALL_PARTS[@]}")
fi

work=$(mktemp -d /tmp/gpu-check-work.XXXXXX)
chmod 755 "$work"
daemon_pid=
cleanup() {
	[ -n "$daemon_pid" ] && kill -TERM "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null
	rm -rf "$work"
}
trap cleanup EXIT

tap=$out/gpu-check.tap
: >"$tap"
say() { printf '%s\n' "$*" | tee -a "$tap"; }
# Indent a file into the TAP stream as comments.
say_file() { [ -s "$1" ] && sed 's/^/#   /' "$1" | tee -a "$tap"; }
json_str() {	# a JSON string of $1
	local s
	s=$(printf '%s' "$1" | tr -d '\000-\010\013\014\016-\037')	# control bytes but \t \n \r
	s=${s//\\/\\\\}; s=${s//\"/\\\"}; s=${s//$'\t'/\\t}; s=${s//$'\r'/}; s=${s//$'\n'/\\n}
	printf '"%s"' "$s"
}
t_start=$SECONDS

# ---- where we run: the machine, the libraries, the doctor -------------------
{
	echo "date: $(date -u +%FT%TZ)"
	echo "host: $(uname -a)"
	echo "cpus: $(nproc)"
	echo "build: $B"
	echo "top: $top"
	echo "git: $(git -C "$top" rev-parse HEAD 2>/dev/null || echo unknown)$(git -C "$top" \
		status --porcelain 2>/dev/null | grep -q . && echo ' (modified tree)')"
	[ -f "$B/config.mk" ] && sed 's/^/config: /' "$B/config.mk"
	command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,pci.bus_id,compute_cap --format=csv,noheader 2>&1 | sed 's/^/nvidia-smi: /'
	echo "python3: $(command -v python3 || echo none)"
} >"$out/env.txt" 2>&1

# Libraries the machine lacks (the carry brings them in syslib/, make gpu-carry).
missing=$(ldd "$B"/bin/* "$B"/tests/test_gpu* 2>/dev/null | awk '/not found/ { print $1 }' | sort -u | tr '\n' ' ')
if [ -n "$missing" ] && [ -d "$B/syslib" ]; then
	export LD_LIBRARY_PATH=$B/syslib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
	echo "missing here, taken from $B/syslib: $missing" >>"$out/env.txt"
	missing=$(ldd "$B"/bin/* "$B"/tests/test_gpu* 2>/dev/null | awk '/not found/ { print $1 }' | sort -u | tr '\n' ' ')
fi
[ -n "$missing" ] && echo "still missing: $missing" >>"$out/env.txt"
# libibverbs is dlopened (rdma/ibv_dl.c), so ldd does not say it is missing:
# without one on the machine, use the carried one (its libnl beside it).
if ! /sbin/ldconfig -p 2>/dev/null | grep -q 'libibverbs\.so\.1 ' && [ -f "$B/syslib/libibverbs.so.1" ]; then
	export KCOLL_IB_LIB=$B/syslib/libibverbs.so.1
	case ":${LD_LIBRARY_PATH:-}:" in *":$B/syslib:"*) ;; *) export LD_LIBRARY_PATH=$B/syslib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} ;; esac
	echo "libibverbs: not installed here, taken from $B/syslib (KCOLL_IB_LIB)" >>"$out/env.txt"
fi

if [ "$mode" = fake ]; then
	fakelib=$B/tests/fixtures/libcuda-fake.so
	[ -f "$fakelib" ] || { echo "gpu-check.sh: --fake needs $fakelib (make check builds it)" >&2; exit 2; }
	mkdir -p "$work/fakedrv" && ln -sf "$fakelib" "$work/fakedrv/libcuda.so.1"
	export LD_LIBRARY_PATH=$work/fakedrv${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
	export KCOLL_GPU_LIB=$fakelib
fi

doctor=$B/bin/kcollctl doctor_args=(gpu)
[ -x "$doctor" ] || { doctor=$B/bin/kcoll-gpu-doctor; doctor_args=(); }
if [ -x "$doctor" ]; then
	"$doctor" "${doctor_args[@]}" --json >"$out/doctor.json" 2>>"$out/env.txt"
	doctor_rc=$?
	"$doctor" "${doctor_args[@]}" >"$out/doctor.txt" 2>&1
	verdict=$(head -1 "$out/doctor.txt")
else
	doctor_rc=1 verdict="no GPU: no doctor in $B (neither bin/kcollctl nor bin/kcoll-gpu-doctor): run make"
	echo "$verdict" >"$out/doctor.txt"
	echo null >"$out/doctor.json"
fi
reason=${verdict#no GPU: }
if [ "$mode" = no-gpu ]; then
	gpu=0 reason="--no-gpu given (the doctor says: $verdict)"
elif [ "$doctor_rc" -eq 0 ]; then
	gpu=1
	[ "$mode" = fake ] || mode=gpu
else
	gpu=0 mode=no-gpu
fi
[ "$mode" = auto ] && mode=no-gpu
say "# gpu-check: mode $mode, build $B, out $out"
say "# doctor: $verdict"

# ---- the parts ----------------------------------------------------------------
n=0 failed=0 results=()
# record NAME KIND STATUS REASON SECONDS [EXTRA_JSON_MEMBERS]
record() {
	local name=$1 kind=$2 status=$3 why=$4 secs=$5 extra=${6:-}
	n=$((n + 1))
	case $status in
	pass) say "ok $n - $name${why:+: $why}" ;;
	skipped) say "ok $n - $name # SKIP $why" ;;
	not_applicable) say "ok $n - $name # SKIP not applicable: $why" ;;
	*) say "not ok $n - $name: $why"; failed=1 ;;
	esac
	local log=null
	[ -f "$out/$name.log" ] && log="\"$name.log\""
	results+=("{\"name\": \"$name\", \"kind\": \"$kind\", \"status\": \"$status\", \"reason\": $(json_str "$why"), \"seconds\": $secs, \"log\": $log${extra:+, $extra}}")
}

remaining() { echo $((budget - (SECONDS - t_start))); }

# Run a part's command with a time limit: out file, limit, command...
limited() {
	local log=$1 lim=$2; shift 2
	local left; left=$(remaining)
	[ "$left" -lt "$lim" ] && lim=$left
	[ "$lim" -lt 5 ] && lim=5
	timeout -k 10 "$lim" "$@" >"$log" 2>&1
}

# A TAP test program of the host tier, against the real driver.
run_test() {
	local name=$1 lim=$2 t0=$SECONDS rc okc notok skip nogpu status why log=$out/$1.log
	if [ ! -x "$B/tests/$name" ]; then
		record "$name" test fail "$B/tests/$name is missing (make gpu-carry builds it)" 0
		return
	fi
	KCOLL_BUILD=$B KCOLL_TOP=$top KCOLL_TEST_TMP=$work KCOLL_SOCKET=$work/unused.sock \
		ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1} \
		limited "$log" "$lim" "$B/tests/$name"
	rc=$?
	okc=$(grep -cE '^ok [0-9]+' "$log"); notok=$(grep -cE '^not ok [0-9]+' "$log")
	skip=$(grep -cE '^ok [0-9]+.*# *SKIP' "$log")
	nogpu=$(grep -cE '^ok [0-9]+.*# *SKIP (no GPU|needs a GPU)' "$log")
	status=pass why="$((okc - skip)) passed, $notok failed, $skip skipped"
	if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
		status=fail why="timed out ($why so far)"
	elif [ "$notok" -gt 0 ] || [ "$rc" -ne 0 ]; then
		status=fail why="exit $rc, $why"
	elif [ "$nogpu" -gt 0 ] && [ "$mode" = gpu ]; then
		status=fail why="$nogpu GPU checks skipped although the doctor found a GPU ($why)"
	fi
	# test_gpu_ring and test_gpu_kv keep their kcolld logs when they fail: bring them back.
	grep -oE 'kcolld logs kept in /tmp/gpu-(ring|kv)-[0-9]*' "$log" | awk '{print $NF}' | sort -u |
		while read -r d; do cp -r "$d" "$out/" 2>/dev/null; done
	grep -E '^not ok' "$log" | head -20 | sed 's/^/#   /' | tee -a "$tap"
	record "$name" test "$status" "$why" $((SECONDS - t0)) \
		"\"passed\": $((okc - skip)), \"failed\": $notok, \"skipped\": $skip, \"skipped_no_gpu\": $nogpu, \"exit\": $rc"
}

start_daemon() {
	[ -n "$daemon_pid" ] && return 0
	"$B/bin/kcolld" -f -v -s "$work/kcolld.sock" -l "$work/kcolld.log" &
	daemon_pid=$!
	for _ in $(seq 200); do [ -S "$work/kcolld.sock" ] && return 0; sleep 0.05; done
	return 1
}

# A benchmark: name, limit, expected JSON, kcoll-gpu-bench arguments...
run_bench() {
	local name=$1 lim=$2; shift 2
	local t0=$SECONDS rc status why log=$out/$name.log js=$out/$name.json res=null
	local before=0 after=0
	if ! start_daemon; then
		record "$name" bench fail "kcolld did not start: $(tail -3 "$work/kcolld.log" 2>/dev/null)" 0
		return
	fi
	before=$(grep -c 'runs on GPU' "$work/kcolld.log")
	limited "$log" "$lim" "$B/bin/kcoll-gpu-bench" -s "$work/kcolld.sock" -j "$js" \
		"${bench_max[@]}" "$@"
	rc=$?
	after=$(grep -c 'runs on GPU' "$work/kcolld.log")
	say_file "$log"
	if [ -s "$js" ] && python3 -m json.tool "$js" >/dev/null 2>&1; then
		res=$(cat "$js")
	fi
	case $rc in
	0) status=pass why="done" ;;
	77) status=fail why="no usable GPU in the benchmark: $(tail -1 "$log")" ;;
	124|137) status=fail why="timed out after its limit" ;;
	*) status=fail why="exit $rc: $(grep -v '^#' "$log" | tail -1)" ;;
	esac
	[ "$res" = null ] && [ "$status" = pass ] && status=fail why="no valid JSON in $js"
	record "$name" bench "$status" "$why" $((SECONDS - t0)) \
		"\"exit\": $rc, \"ops_on_gpu\": $((after - before)), \"results\": $res"
}

# KV: blocks into and out of another process's device segment (device to
# device, pageable host to device, device to host) against one cudaMemcpy
# of the same bytes; the owner's bytes checked at the end.
run_kv() {
	local t0=$SECONDS log=$out/bench_kv.log js=$out/bench_kv.json res=null rc why status
	start_daemon || { record bench_kv bench fail "kcolld did not start" 0; return; }
	limited "$log" 90 "$B/bin/kcoll-gpu-bench" -s "$work/kcolld.sock" -j "$js" "${bench_max[@]}" kv
	rc=$?
	say_file "$log"
	python3 -m json.tool "$js" >/dev/null 2>&1 && res=$(cat "$js")
	if [ "$rc" -ne 0 ]; then
		status=fail why="exit $rc: $(tail -1 "$log")"
	elif [ "$res" = null ] || ! grep -q '"bytes_ok": true' "$js"; then
		status=fail why="the owner's device segment did not read back right, or no JSON in $js"
	else
		status=pass
		why="kcoll / one cudaMemcpy of the same bytes: $(python3 -c 'import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
print("; ".join("%s %d KiB blocks %.2f GB/s (%.2fx)" % (r["path"], r["block_bytes"] >> 10, r["gbps"], r["ratio"]) for r in rows))' "$js")"
	fi
	record bench_kv bench "$status" "$why" $((SECONDS - t0)) "\"exit\": $rc, \"results\": $res"
}

# The Python package on device memory (tests/python/cuda_rank.py, what
# t_python_cuda.sh runs on the fake): 2 ranks with __cuda_array_interface__
# buffers from the driver in use, against the check's kcolld, whose log must
# count the device ops as run on the GPU (17: the fake-only stream check
# adds 3 more there).
run_python_cuda() {
	local t0=$SECONDS log=$out/python_cuda.log rc before after why status want=17 py='' p
	# The python3 on PATH first: the GPU machine's has CuPy and torch (as
	# bench_nccl's does); else Debian's, which has numpy where deps.sh ran.
	for p in python3 /usr/bin/python3; do
		if "$p" -c 'import numpy' >/dev/null 2>&1; then py=$p; break; fi
	done
	if [ -z "$py" ]; then
		record python_cuda test skipped "no python3 with numpy on this machine (PATH's python3, /usr/bin/python3)" 0
		return
	fi
	echo "python_cuda: $py ($("$py" -c 'import sys; print(sys.version.split()[0])'))" >>"$out/env.txt"
	if [ ! -f "$B/lib/libkcoll.so.1" ]; then
		record python_cuda test fail "$B/lib/libkcoll.so.1 is missing (make gpu-carry carries it)" 0
		return
	fi
	start_daemon || { record python_cuda test fail "kcolld did not start" 0; return; }
	[ "$mode" = fake ] && want=20
	before=$(grep -c 'runs on GPU' "$work/kcolld.log")
	PYTHONPATH=$top/user/python PYTHONDONTWRITEBYTECODE=1 KCOLL_LIB=$B/lib/libkcoll.so.1 \
		KCOLL_SOCKET=$work/kcolld.sock KCOLL_TEST_TMP=$work \
		KCOLL_TEST_CUDA=$([ "$mode" = fake ] && echo fake || echo gpu) \
		limited "$log" 90 "$py" "$top/tests/python/launch.py" "$top/tests/python/cuda_rank.py" 2 \
		"cuda 2" 75
	rc=$?
	after=$(grep -c 'runs on GPU' "$work/kcolld.log")
	# The serving-connector example with its KV pools in GPU memory (torch
	# CUDA tensors), where torch sees the GPU: not on the fake.
	local conn="not run (torch with CUDA not importable by $py, or the fake driver)" crc=0
	if [ "$mode" = gpu ] && "$py" -c 'import torch; assert torch.cuda.is_available()' >/dev/null 2>&1; then
		PYTHONPATH=$top/user/python PYTHONDONTWRITEBYTECODE=1 KCOLL_LIB=$B/lib/libkcoll.so.1 \
			KCOLL_SOCKET=$work/kcolld.sock \
			limited "$log.conn" 120 "$py" "$top/examples/kv_connector.py" both \
			"$work/kvconn" --device cuda --layers 8
		crc=$?
		conn="exit $crc: $(grep -E '^(not )?ok|^# decode' "$log.conn" | tr '\n' ' ')"
		cat "$log.conn" >>"$log"
	fi
	grep -E '^not ok' "$log" | head -20 | sed 's/^/#   /' | tee -a "$tap"
	why="$(grep -c '^ok' "$log") checks passed, $(grep -c '^not ok' "$log") failed, $((after - before)) ops ran on the GPU ($want wanted); examples/kv_connector.py --device cuda: $conn"
	status=pass
	if [ "$rc" -ne 0 ] || [ "$crc" -ne 0 ] || [ $((after - before)) -lt "$want" ]; then
		status=fail why="exit $rc: $why"
	fi
	record python_cuda test "$status" "$why" $((SECONDS - t0)) "\"exit\": $rc, \"ops_on_gpu\": $((after - before))"
}

run_nccl() {
	local t0=$SECONDS log=$out/bench_nccl.log js=$out/bench_nccl.json res=null rc status why
	limited "$log" 150 python3 "$top/scripts/gpu-nccl-bench.py" --out "$js" --ranks 2 \
		--max-bytes $((256 << 20))
	rc=$?
	say_file "$log"
	python3 -m json.tool "$js" >/dev/null 2>&1 && res=$(cat "$js")
	why=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["summary"])' "$js" 2>/dev/null)
	case $rc in
	0) status=pass ;;
	77) status=skipped ;;
	124|137) status=fail why="timed out (NCCL may hang with ranks sharing a GPU): ${why:-no summary}" ;;
	*) status=fail why="exit $rc: ${why:-$(tail -1 "$log")}" ;;
	esac
	record bench_nccl bench "$status" "${why:-no summary}" $((SECONDS - t0)) "\"exit\": $rc, \"results\": $res"
}

for p in "${parts[@]}"; do
	kind=test
	case $p in bench_*) kind=bench ;; ipc) kind=test ;; esac
	if [ "$gpu" -eq 0 ]; then
		record "$p" "$kind" skipped "no GPU: $reason" 0
		continue
	fi
	if [ "$(remaining)" -lt 10 ]; then
		record "$p" "$kind" skipped "out of time: the budget of $budget s is spent" 0
		continue
	fi
	say "# --- $p ($((SECONDS - t_start)) s of $budget s spent)"
	case $p in
	test_gpu) run_test test_gpu 150 ;;
	test_gpudirect) run_test test_gpudirect 60 ;;
	test_gpu_ring) run_test test_gpu_ring 200 ;;
	test_gpu_mh) run_test test_gpu_mh 120 ;;
	test_gpu_kv) run_test test_gpu_kv 60 ;;
	python_cuda) run_python_cuda ;;
	ipc)
		t0=$SECONDS
		limited "$out/ipc.log" 60 "$B/bin/kcoll-gpu-bench" -j "$out/ipc.json" ipc
		rc=$?
		say_file "$out/ipc.log"
		if [ $rc -eq 0 ]; then
			record ipc test pass "$(grep -E '^ok ipc' "$out/ipc.log" | sed 's/^ok ipc: //')" $((SECONDS - t0))
		else
			record ipc test fail "exit $rc: $(tail -1 "$out/ipc.log")" $((SECONDS - t0))
		fi
		;;
	bench_reduce) run_bench bench_reduce 120 reduce ;;
	bench_allreduce_2) run_bench bench_allreduce_2 90 -n 2 allreduce ;;
	bench_allreduce_4) run_bench bench_allreduce_4 90 -n 4 allreduce ;;
	bench_staging) run_bench bench_staging 90 staging ;;
	bench_kv) run_kv ;;
	bench_nccl) run_nccl ;;
	esac
done

if [ -n "$daemon_pid" ]; then
	kill -TERM "$daemon_pid"; wait "$daemon_pid"; drc=$?; daemon_pid=
	cp "$work/kcolld.log" "$out/kcolld.log"
	[ "$drc" -eq 0 ] || { say "# kcolld exited $drc on SIGTERM (log: kcolld.log)"; failed=1; }
fi
say "1..$n"

# ---- the JSON -----------------------------------------------------------------
{
	printf '{\n"tool": "scripts/gpu-check.sh",\n"mode": "%s",\n' "$mode"
	printf '"rehearsal": %s,\n' "$([ "$mode" = fake ] && echo true || echo false)"
	printf '"verdict": %s,\n"reason": %s,\n' "$(json_str "$verdict")" \
		"$(json_str "$([ "$gpu" -eq 1 ] && echo "" || echo "$reason")")"
	if [ "$gpu" -eq 1 ] && python3 -m json.tool "$out/doctor.json" >/dev/null 2>&1; then
		printf '"gpu": %s,\n' "$(cat "$out/doctor.json")"
	else
		printf '"gpu": null,\n'
	fi
	printf '"build": %s,\n"seconds": %d,\n"budget_seconds": %d,\n"failed": %s,\n"parts": [\n' \
		"$(json_str "$B")" $((SECONDS - t_start)) "$budget" \
		"$([ $failed -eq 0 ] && echo false || echo true)"
	for i in "${!results[@]}"; do
		printf '  %s%s\n' "${results[$i]}" "$([ "$i" -lt $((${#results[@]} - 1)) ] && echo ,)"
	done
	printf ']\n}\n'
} >"$out/gpu-check.json"
echo "# results in $out (gpu-check.json, gpu-check.tap, doctor.*, <part>.log)"
exit $failed
