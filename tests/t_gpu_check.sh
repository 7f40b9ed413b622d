#!/usr/bin/env bash
# scripts/gpu-check.sh, the device check, must not rot between the sessions
# that have a GPU: its no-GPU mode end to end (every part SKIPs with the
# doctor's reason, the JSON is valid and complete), its usage errors, and its
# GPU mode rehearsed on the fake driver for the quick parts. TAP.
set -u
B=${KCOLL_BUILD:?run through tests/run.sh}
TOP=${KCOLL_TOP:?run through tests/run.sh}
T=$(mktemp -d "${KCOLL_TEST_TMP:-/tmp}/gpu-check.XXXXXX")
S=$TOP/scripts/gpu-check.sh
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
n=0 failed=0
ok() { n=$((n + 1)); if [ "$1" -eq 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; failed=1; fi; }
skip() { n=$((n + 1)); echo "ok $n - $1 # SKIP $2"; }
trap 'rm -rf "$T"' EXIT
PARTS="test_gpu test_gpudirect ipc test_gpu_ring test_gpu_mh test_gpu_kv python_cuda bench_reduce bench_allreduce_2 bench_allreduce_4 bench_staging bench_kv bench_nccl"

if ! "$PY" -c 'import json' 2>/dev/null; then
	echo "1..0 # SKIP no python3 to check the JSON with"
	exit 0
fi
# On a machine with a GPU the full check takes minutes: force the no-GPU mode.
"$B/bin/kcollctl" gpu >"$T/doctor.txt" 2>&1; drc=$?
verdict=$(head -1 "$T/doctor.txt")
force=()
[ "$drc" -eq 0 ] && force=(--no-gpu)

"$S" --build "$B" --out "$T/o" "${force[@]}" >"$T/stdout" 2>"$T/stderr"; rc=$?
ok $rc "no-GPU mode exits 0 (${force[*]:-the doctor: $verdict})"
[ -s "$T/stderr" ] && sed 's/^/# stderr: /' "$T/stderr"
for f in gpu-check.json gpu-check.tap doctor.json doctor.txt env.txt; do
	[ -s "$T/o/$f" ] || { echo "# missing: $f"; false; }
done
ok $? "it writes gpu-check.json, gpu-check.tap, doctor.json, doctor.txt, env.txt"
"$PY" -m json.tool "$T/o/gpu-check.json" >/dev/null; ok $? "gpu-check.json parses ($PY -m json.tool)"
"$PY" -m json.tool "$T/o/doctor.json" >/dev/null; ok $? "doctor.json (kcollctl gpu --json) parses"
"$PY" - "$T/o/gpu-check.json" "$PARTS" "${force[*]:-}" "$verdict" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
want, forced, verdict = sys.argv[2].split(), sys.argv[3], sys.argv[4]
assert d["gpu"] is None, "gpu must be null"
assert d["mode"] == "no-gpu" and d["failed"] is False and d["rehearsal"] is False, d
assert [p["name"] for p in d["parts"]] == want, [p["name"] for p in d["parts"]]
for p in d["parts"]:
    assert p["status"] == "skipped", p
    assert p["reason"].startswith("no GPU: ") and len(p["reason"]) > 10, p
    if not forced:
        assert verdict.endswith(p["reason"][len("no GPU: "):]), (verdict, p["reason"])
PYEOF
ok $? "JSON: gpu null, every part present in order, each skipped with the doctor's reason"
grep -c '# SKIP no GPU: ' "$T/stdout" | grep -qx 13 && grep -qx "1..13" "$T/stdout"
ok $? "TAP: 13 parts, each a SKIP with 'no GPU: <reason>', plan 1..13"
grep -E '^(ok|not ok|1\.\.)' "$T/stdout" | cmp -s - <(grep -E '^(ok|not ok|1\.\.)' "$T/o/gpu-check.tap")
ok $? "gpu-check.tap holds the TAP lines printed"
OUT=$T/env-out "$S" --build "$B" --parts bench_kv,test_gpu "${force[@]}" >"$T/stdout2" 2>&1 &&
	"$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); assert [p["name"] for p in d["parts"]] == ["bench_kv", "test_gpu"]' "$T/env-out/gpu-check.json"
ok $? "\$OUT is the default --out; --parts runs the parts named, in that order"
"$S" --bogus >/dev/null 2>&1; [ $? -eq 2 ]; ok $? "an unknown argument exits 2"
"$S" --parts nope --out "$T/x" >/dev/null 2>&1; [ $? -eq 2 ]; ok $? "an unknown part exits 2"
"$S" --build "$T/nobuild" --out "$T/nb" >"$T/stdout3" 2>&1 &&
	grep -q '# SKIP no GPU: no doctor in' "$T/stdout3" && "$PY" -m json.tool "$T/nb/gpu-check.json" >/dev/null
ok $? "a build without the doctor: every part SKIPs naming that, still valid JSON, exit 0"

# The GPU mode on the fake driver, quick parts only: the benchmark program,
# kcolld, the JSON assembly. Numbers mean nothing; statuses and shape do.
if [ ! -f "$B/tests/fixtures/libcuda-fake.so" ] || [ ! -x "$B/bin/kcoll-gpu-bench" ]; then
	skip "GPU mode rehearsed on the fake driver" "needs $B/tests/fixtures/libcuda-fake.so and bin/kcoll-gpu-bench (make check builds them)"
else
	# python_cuda's python3 cannot load an ASan libkcoll (t_python_cuda.sh
	# runs the same ranks with the ASan runtime preloaded).
	pyc=python_cuda,
	[ -n "${KCOLL_TEST_SAN:-}" ] && pyc=
	"$S" --build "$B" --out "$T/f" --fake --max-bytes 1M \
		--parts "ipc,${pyc}bench_reduce,bench_allreduce_2,bench_kv" >"$T/fstdout" 2>&1; rc=$?
	[ $rc -eq 0 ] || sed 's/^/# /' "$T/fstdout" | tail -30
	"$PY" - "$T/f/gpu-check.json" "$pyc" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["mode"] == "fake" and d["rehearsal"] is True and d["gpu"] is not None, d["mode"]
st = {p["name"]: p for p in d["parts"]}
assert [st[k]["status"] for k in ("ipc", "bench_reduce", "bench_allreduce_2", "bench_kv")] == \
    ["pass", "pass", "pass", "pass"], {k: (v["status"], v["reason"]) for k, v in st.items()}
assert all(r["result_ok"] for r in st["bench_reduce"]["results"]["rows"])
assert len(st["bench_reduce"]["results"]["rows"]) == 3
ar = st["bench_allreduce_2"]
assert ar["results"]["rows"] and all(r["result_ok"] for r in ar["results"]["rows"]), ar
assert ar["ops_on_gpu"] > 0, ar     # kcolld took the on-GPU path
kv = st["bench_kv"]["results"]
assert kv["bytes_ok"] is True and {r["path"] for r in kv["rows"]} == {"d2d", "h2d", "d2h"}, kv
assert all(r["gbps"] > 0 and r["anchor_gbps"] > 0 for r in kv["rows"]), kv
if sys.argv[2]:
    pc = st["python_cuda"]   # deps.sh installs numpy: no skip here
    assert pc["status"] == "pass" and pc["ops_on_gpu"] >= 20, pc
PYEOF
	ok $(( rc | $? )) "GPU mode on the fake driver: ipc, Python on device memory (20 ops on GPU in kcolld; not under ASan), reduce, 2-rank all-reduce (on GPU), KV blocks to and from a device segment pass"
fi
echo "1..$n"
exit $failed
