#!/usr/bin/env bash
# kcoll-bench against the shared test daemon: every collective at N=1,2,3 with
# checking on (exit 0, every #wrong 0, one row per size), the JSON output, the
# memcpy reference, and usage errors; the benchmark scripts' --help and usage
# errors. Run by tests/run.sh, which exports KCOLL_BUILD, KCOLL_SOCKET and
# KCOLL_TOP. Prints TAP.
set -u
bench="${KCOLL_BUILD:?run me from tests/run.sh}/bin/kcoll-bench"
tmp=$(mktemp -d /tmp/kcoll-t-bench.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
n=0

ok() {	# status description
	n=$((n + 1))
	if [ "$1" -eq 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; fi
}

# The benchmark scripts' command line (scripts/bench-lib.sh): --help is the
# usage and exit 0, an unknown option and a build dir that is not one are
# usage errors (exit 2) that say so; nothing here starts a benchmark.
top=${KCOLL_TOP:?run me from tests/run.sh}
for s in "$top"/scripts/bench-*.sh; do
	name=$(basename "$s")
	[ "$name" != bench-lib.sh ] || continue	# sourced, not run
	bash "$s" --help >"$tmp/out" 2>&1
	rc=$?
	[ $rc -eq 0 ] && grep -q "^usage:" "$tmp/out" && [ "$(wc -l <"$tmp/out")" -gt 2 ]
	ok $? "$name --help prints the usage and exits 0 (exit $rc)"
	bash "$s" --no-such-option >"$tmp/out" 2>&1
	rc=$?
	[ $rc -eq 2 ] && grep -q "unknown option.*--no-such-option" "$tmp/out"
	ok $? "$name: an unknown option is a usage error (exit $rc)"
	[ "$name" != bench-bpf.sh ] || continue	# its build is $KCOLL_BUILD, not an argument
	bash "$s" "$tmp/no-such-build" >"$tmp/out" 2>&1
	rc=$?
	[ $rc -eq 2 ] && grep -q "no-such-build' is not a build directory" "$tmp/out"
	ok $? "$name: a missing build dir is a usage error (exit $rc)"
done

if [ ! -x "$bench" ]; then
	ok 0 "# SKIP $bench not built"
	echo "1..$n"
	exit 0
fi

# 8 B, 128 B, 2 KiB, 32 KiB, 512 KiB: five rows per run (the largest spans
# several daemon chunks).
sizes=(-b 8 -e 1M -f 16)
want_rows=5

# Check the table in $tmp/out: rows, and every #wrong column (9th, and 13th
# with --inplace) is 0.
table_ok() {	# expected rows, columns of #wrong...
	local rows=$1; shift
	awk -v rows="$rows" -v cols="$*" '
		/^#/ || NF == 0 { next }
		{ got++; split(cols, c, " "); for (i in c) if ($(c[i]) != "0") bad++ }
		END { exit !(got == rows && !bad) }' "$tmp/out"
}

# collective N dtype op [extra...]: dtypes and ops rotate so every one is
# exercised at least once without multiplying the runs.
run_case() {
	local coll=$1 nr=$2 dt=$3 op=$4; shift 4
	local rc
	"$bench" "$coll" -N "$nr" "${sizes[@]}" -n 2 -w 1 -c 1 -d "$dt" -o "$op" --inplace "$@" \
		>"$tmp/out" 2>"$tmp/err"
	rc=$?
	[ $rc -ne 0 ] && sed 's/^/# /' "$tmp/err"
	ok $rc "$coll -N $nr -d $dt -o $op $* exits 0"
	table_ok "$want_rows" 9 13
	ok $? "$coll -N $nr -d $dt: $want_rows rows, out-of-place and in-place #wrong all 0"
}

run_case allreduce 1 f32 sum
run_case allreduce 2 bf16 avg
run_case allreduce 3 i8 prod --mem host
run_case reducescatter 1 f64 max
run_case reducescatter 2 f16 sum --mem host
run_case reducescatter 3 u8 avg
run_case allgather 1 i32 sum
run_case allgather 2 u64 sum
run_case allgather 3 f16 sum --mem host
run_case broadcast 1 u32 sum
run_case broadcast 2 i64 sum -r 1
run_case broadcast 3 bf16 sum -r 2 --mem host
run_case allreduce 3 u32 min
run_case allreduce 2 i64 max

"$bench" allreduce -N 2 -b 8 -e 1K -f 4 -n 2 -w 1 --json >"$tmp/json" 2>"$tmp/err"
ok $? "--json exits 0"
python3 -m json.tool "$tmp/json" >/dev/null 2>&1
ok $? "--json output parses"
python3 - "$tmp/json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["collective"] == "allreduce" and d["N"] == 2 and d["dtype"] == "f32"
assert d["op"] == "sum" and d["mem"] == "shm" and d["host"]
assert [r["size"] for r in d["rows"]] == [8, 32, 128, 512]
assert all(r["wrong"] == 0 for r in d["rows"])
EOF
ok $? "--json has the metadata and one row per size"

"$bench" memcpy -b 1K -e 8K -f 8 -n 2 -w 1 >"$tmp/out" 2>"$tmp/err"
ok $? "memcpy reference runs"
[ "$(grep -cv '^#' "$tmp/out")" -eq 2 ]
ok $? "memcpy prints one row per size"

"$bench" allreduce --no-such-option >"$tmp/out" 2>"$tmp/err"
rc=$?
[ $rc -eq 2 ] && grep -q "^usage:" "$tmp/err"
ok $? "an unknown option is a usage error (exit $rc)"
"$bench" allreduce -d f99 >"$tmp/out" 2>"$tmp/err"
[ $? -eq 2 ] && grep -q "f99" "$tmp/err"
ok $? "an unknown datatype is a usage error naming it"
"$bench" -N 2 >"$tmp/out" 2>"$tmp/err"
[ $? -eq 2 ]
ok $? "a missing collective is a usage error"
"$bench" --help >"$tmp/out" 2>&1
[ $? -eq 0 ] && grep -q "^usage:" "$tmp/out"
ok $? "--help prints usage and exits 0"

"$bench" allreduce -N 2 -b 8 -e 8 -s "$tmp/no-daemon.sock" >"$tmp/out" 2>"$tmp/err"
rc=$?
[ $rc -ne 0 ] && grep -q "cannot reach kcolld at $tmp/no-daemon.sock" "$tmp/err"
ok $? "no daemon at the socket: a clear error and exit $rc"

# The launcher path of --hosts without a cluster: "env" starts every rank
# here, all on the test daemon (two "hosts" of two ranks).
"$bench" allreduce --hosts 2 -N 2 --launch env -b 8 -e 64K -f 64 -n 2 -w 1 --json \
	>"$tmp/json" 2>"$tmp/err"
ok $? "--hosts 2 -N 2 --launch env exits 0"
python3 - "$tmp/json" <<'EOF2'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["hosts"] == 2 and d["ranks_per_host"] == 2 and len(d["rank_hosts"]) == 4
assert [r["size"] for r in d["rows"]] == [8, 512, 32768]
assert all(r["wrong"] == 0 for r in d["rows"])
EOF2
ok $? "--hosts JSON: hosts, ranks per host, every rank's host, rows checked"
"$bench" allreduce --hosts 2 --launch false -b 8 -e 8 >"$tmp/out" 2>"$tmp/err"
rc=$?
[ $rc -ne 0 ] && [ -s "$tmp/err" ]
ok $? "--hosts with a launcher that fails: exit $rc with a message"

echo "1..$n"
