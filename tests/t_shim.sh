#!/usr/bin/env bash
# libkcoll_mpi.so (the LD_PRELOAD MPI shim) under Debian's Open MPI and
# MPICH, against the shared test daemon: tests/shim/shim_check gives the same
# bytes with and without the shim at 1..4 ranks (every intercepted call,
# blocking and non-blocking, types, ops, sizes around KCOLL_MPI_MIN_BYTES,
# MPI_IN_PLACE, dup/split/create communicators, MPI_Init_thread; fractional
# float sums within a tolerance) and the shim did route calls to kcoll; no
# daemon, or no per-MPI shim beside the selector: same bytes and one log line;
# 200 x dup/split/free leaks no communicator and no fd, kcolld killed mid-run,
# mpi4py on numpy arrays (where Debian's mpi4py links the MPI under test: Open
# MPI's only, so a SKIP under MPICH).
# SHIM_MPI=mpich (tests/t_shim_mpich.sh): all of it under MPICH.
# Run by tests/run.sh, which exports KCOLL_BUILD and KCOLL_SOCKET.
# Prints TAP.
set -u
build="${KCOLL_BUILD:?run me from tests/run.sh}"
top="${KCOLL_TOP:-$(cd "$(dirname "$0")/.." && pwd)}"
shim="$build/lib/libkcoll_mpi.so"
tmp=$(mktemp -d /tmp/kcoll-t-shim.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
n=0

ok() {	# status description
	n=$((n + 1))
	if [ "$1" -eq 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; fi
}
skip_all() {
	echo "ok 1 # SKIP $1"
	echo "1..1"
	exit 0
}

command -v mpirun >/dev/null || skip_all "mpirun not installed (Debian openmpi-bin)"
[ -f "$shim" ] || skip_all "$shim not built (needs mpicc)"

# The MPI to test: SHIM_MPI=ompi (Open MPI, the default; this script) or
# mpich (tests/t_shim_mpich.sh), each with its own time budget in run.sh.
# On a small shared machine: root allowed, more ranks than cores, yield while
# waiting (MPICH: poll once before yielding), shared memory only.
m=${SHIM_MPI:-ompi}
declare -A launch
ompi_run=$(command -v mpirun.openmpi || command -v mpirun)
launch[ompi]="$ompi_run --oversubscribe --mca mpi_yield_when_idle 1 --mca btl self,vader"
[ "$(id -u)" -eq 0 ] && launch[ompi]+=" --allow-run-as-root"
launch[mpich]="env MPIR_CVAR_POLLS_BEFORE_YIELD=1 mpirun.mpich"
case $m in
ompi) ;;
mpich)
	command -v mpirun.mpich >/dev/null || skip_all "MPICH not installed (Debian mpich, libmpich-dev)"
	[ -f "$build/lib/libkcoll_mpi_mpich.so" ] || skip_all "libkcoll_mpi_mpich.so not built (needs mpicc.mpich)" ;;
*) echo "Bail out! SHIM_MPI is ompi or mpich, not '$m'"; exit 1 ;;
esac
[ -x "$build/tests/shim_check_$m" ] || skip_all "shim_check_$m not built (needs that MPI's mpicc)"
# MPICH polls hard with more ranks than cores: check three of the five
# communicators there (WORLD, split halves, MPI_Comm_create's), not the dup
# and the reversed split, to keep its runtime near Open MPI's.
ncomms=5
if [ "$m" = mpich ]; then
	export SHIM_CHECK_COMMS=world,split,created
	ncomms=3
fi
# The test program's sizes sit around 64 KiB (1000 B, 72 KiB, 1 MiB): pin the
# threshold there rather than rely on the default (16 MiB).
export KCOLL_MPI_MIN_BYTES=${KCOLL_MPI_MIN_BYTES:-65536}
san=""
if [ "${KCOLL_TEST_SAN:-0}" = 1 ]; then
	# The ASan-built shim needs the sanitizer runtimes loaded first; MPI's
	# own allocations are not ours to leak-check.
	for l in libasan.so libubsan.so; do
		p=$(gcc -print-file-name="$l")
		[ -f "$p" ] && san="$san$p "
	done
	export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1"
fi
preload="$san$shim"

# run MPI NP ARGS...: MPI's launcher; with_shim: the same with the shim
# preloaded (into the launcher and so into every rank).
run() {
	local m=$1 np=$2; shift 2
	${launch[$m]} -np "$np" "$@"
}
with_shim() {
	local m=$1; shift
	LD_PRELOAD="$preload" KCOLL_MPI_DEBUG=1 run "$m" "$@"
}

# The shim exports the MPI functions it interposes and nothing else, and the
# selector exports exactly what each per-MPI build does.
bad=$(nm -D --defined-only "$shim" | awk '$3 !~ /^MPI_/ { print $3 }')
[ -z "$bad" ]
ok $? "libkcoll_mpi.so exports only MPI_* symbols${bad:+ (also: $(echo $bad))}"
v="$build/lib/libkcoll_mpi_$m.so"
diff <(nm -D --defined-only "$shim" | awk '{ print $3 }' | sort) \
	<(nm -D --defined-only "$v" | awk '{ print $3 }' | sort) >/dev/null
ok $? "libkcoll_mpi.so and libkcoll_mpi_$m.so export the same MPI_* set"

# Sum of the "kcoll N" (or with $3=pmpi, "pmpi N") figures of call $2 in the
# shim's summaries in file $1.
kcoll_calls() {
	grep -o " $2 kcoll [0-9]* pmpi [0-9]*" "$1" |
		awk -v f="${3:-kcoll}" '{ s += f == "pmpi" ? $5 : $3 } END { print s + 0 }'
}

{
	check="$build/tests/shim_check_$m"
	# Under ASan (make check's second pass) 2 and 3 ranks: the shim's code
	# is the same at 1 and 4, which the plain pass runs, and 4 ASan ranks
	# on 2 cores cost most of this test's time there.
	nps="1 2 3 4"
	[ "${KCOLL_TEST_SAN:-0}" = 1 ] && nps="2 3"
	for np in $nps; do
		run "$m" "$np" "$check" check >"$tmp/plain.$m.$np" 2>"$tmp/plain.$m.$np.err"
		ok $? "$m np $np: shim_check without the shim exits 0"
		with_shim "$m" "$np" "$check" check >"$tmp/shim.$m.$np" 2>"$tmp/shim.$m.$np.err"
		rc=$?
		[ $rc -ne 0 ] && sed 's/^/# /' "$tmp/shim.$m.$np.err" | tail -20
		ok $rc "$m np $np: shim_check with the shim exits 0"
		lines=$(wc -l <"$tmp/plain.$m.$np")
		cmp -s "$tmp/plain.$m.$np" "$tmp/shim.$m.$np"
		rc=$?
		[ $rc -ne 0 ] && diff "$tmp/plain.$m.$np" "$tmp/shim.$m.$np" | head -10 | sed 's/^/# /'
		ok $rc "$m np $np: all $lines result lines identical with and without the shim"
		! grep '^tolerance/' "$tmp/shim.$m.$np" | grep -q BAD &&
			[ "$(grep -c '^tolerance/.* float ok double ok$' "$tmp/shim.$m.$np")" -eq $ncomms ]
		ok $? "$m np $np: fractional f32/f64 sums within 1e-5/1e-12 of exact on all $ncomms comms"
		summaries=$(grep -c '^kcoll_mpi: rank [0-9]*: Allreduce' "$tmp/shim.$m.$np.err")
		others=$(grep '^kcoll_mpi:' "$tmp/shim.$m.$np.err" |
			grep -vc '^kcoll_mpi: rank [0-9]*: Allreduce')
		[ "$summaries" -eq "$np" ] && [ "$others" -eq 0 ]
		ok $? "$m np $np: KCOLL_MPI_DEBUG=1 prints one summary per rank and nothing else"
		routed=0
		for call in Allreduce Reduce_scatter_block Allgather Bcast; do
			k=$(kcoll_calls "$tmp/shim.$m.$np.err" "$call")
			if [ "$np" -eq 1 ]; then [ "$k" -eq 0 ] || routed=1
			else [ "$k" -gt 0 ] || routed=1; fi
		done
		if [ "$np" -eq 1 ]; then
			ok $routed "$m np 1: nothing went to kcoll (one rank: MPI's copy is cheaper)"
		else
			ok $routed "$m np $np: every routable call went to kcoll at least once"
		fi
		# Non-blocking forms, barriers and communicator calls: seen, passed on.
		seen=0
		for call in Iallreduce Ireduce_scatter_block Iallgather Ibcast Ibarrier Barrier \
			Comm_dup Comm_split Comm_create Comm_free; do
			[ "$(kcoll_calls "$tmp/shim.$m.$np.err" "$call")" -eq 0 ] &&
				[ "$(kcoll_calls "$tmp/shim.$m.$np.err" "$call" pmpi)" -ge "$np" ] || seen=1
		done
		ok $seen "$m np $np: non-blocking, barrier and communicator calls counted, all to PMPI"
		# MPI_Alloc_mem of 1 MiB (>= the 64 KiB threshold): kcoll memory.
		[ "$(kcoll_calls "$tmp/shim.$m.$np.err" Alloc_mem)" -eq $((2 * np)) ] &&
			[ "$(kcoll_calls "$tmp/shim.$m.$np.err" Free_mem)" -eq $((2 * np)) ]
		ok $? "$m np $np: MPI_Alloc_mem / MPI_Free_mem served by kcoll_mem_alloc on every rank"
	done

	# MPI_Init_thread: same results, calls still routed.
	SHIM_CHECK_THREAD=1 with_shim "$m" 2 "$check" check >"$tmp/thr.$m" 2>"$tmp/thr.$m.err"
	rc=$?
	cmp -s "$tmp/plain.$m.2" "$tmp/thr.$m" && [ $rc -eq 0 ] &&
		[ "$(kcoll_calls "$tmp/thr.$m.err" Allreduce)" -gt 0 ]
	ok $? "$m np 2: MPI_Init_thread: same results, all-reduces routed to kcoll"

	# No daemon: same results, one line from the whole job, exit 0.
	KCOLL_SOCKET="$tmp/no-daemon.sock" LD_PRELOAD="$preload" run "$m" 3 "$check" check \
		>"$tmp/nod.$m" 2>"$tmp/nod.$m.err"
	ok $? "$m no daemon: shim_check exits 0"
	cmp -s "$tmp/plain.$m.3" "$tmp/nod.$m"
	ok $? "$m no daemon: results identical to plain MPI"
	[ "$(grep -c '^kcoll_mpi:' "$tmp/nod.$m.err")" -eq 1 ] &&
		grep -q 'cannot connect to kcolld' "$tmp/nod.$m.err"
	ok $? "$m no daemon: exactly one 'kcoll_mpi: cannot connect' line for the whole job"
	sed 's/^/# /' "$tmp/nod.$m.err"

	# The selector alone, without the per-MPI shim beside it: it says so
	# once per rank and hands every call to MPI.
	mkdir -p "$tmp/alone"
	cp "$shim" "$tmp/alone/"
	LD_PRELOAD="$san$tmp/alone/libkcoll_mpi.so" run "$m" 2 "$check" check \
		>"$tmp/alone.$m" 2>"$tmp/alone.$m.err"
	rc=$?
	cmp -s "$tmp/plain.$m.2" "$tmp/alone.$m" && [ $rc -eq 0 ] &&
		[ "$(grep -c "cannot load .*libkcoll_mpi_$m.so" "$tmp/alone.$m.err")" -eq 2 ]
	ok $? "$m: libkcoll_mpi.so without libkcoll_mpi_$m.so: one line per rank, plain MPI results"
}
# From here on, churn, per-call debug lines, kcolld killed and mpi4py, under
# the MPI being tested ($m); mpi4py only where Debian's mpi4py links it.

# Communicators made and freed 200 times: the daemon holds only the live ones
# (then none), the fd count stays put. Freed communicators leave kcolld on its
# next watchdog tick (50 ms; later on a busy machine), so the probe waits up
# to 20 s for the count this point expects (3 live, then 0) and prints the
# last one it saw.
cat >"$tmp/probe.sh" <<'EOF'
want=3
[ "$SHIM_CHECK_WHEN" = after ] && want=0
for _ in $(seq 200); do
	got=$("$1" -s "$2" status --json | python3 -c '
import json, sys
c = json.load(sys.stdin)["communicators"]
print("comms", len(c), "active", sum(x["state"] == "active" for x in c))')
	[ "$got" = "comms $want active $want" ] && break
	sleep 0.1
done
printf %s "$got"
EOF
probe="sh '$tmp/probe.sh' '$build/bin/kcollctl' '$KCOLL_SOCKET'"
SHIM_CHECK_PROBE="$probe" LD_PRELOAD="$preload" run "$m" 4 "$check" loop 200 \
	>"$tmp/loop" 2>"$tmp/loop.err"
rc=$?
[ $rc -ne 0 ] && sed 's/^/# /' "$tmp/loop.err" | tail -10
ok $rc "$m: 200 x dup+split+allreduce+free at np 4 exits 0"
sed 's/^/# /' "$tmp/loop" | grep -E 'probe|fds'
grep -q '^probe live: comms 3 active 3$' "$tmp/loop"
ok $? "$m: while live: kcolld holds exactly the 3 live communicators (dup, two split halves)"
grep -q '^probe after: comms 0 active 0$' "$tmp/loop"
ok $? "$m: after 200 frees: kcolld holds no communicator of ours"
grep -q '^fds steady' "$tmp/loop"
ok $? "$m: fd count steady over 200 iterations on every rank"
run "$m" 4 "$check" loop 2 >"$tmp/loop.plain" 2>/dev/null
diff <(grep '^loop/' "$tmp/loop.plain") <(grep '^loop/' "$tmp/loop") >/dev/null
ok $? "$m: loop results identical with and without the shim"

# KCOLL_MPI_DEBUG=2: one line per call saying where it went, as many as the
# summaries count.
KCOLL_MPI_DEBUG=2 LD_PRELOAD="$preload" run "$m" 2 "$check" loop 3 \
	>/dev/null 2>"$tmp/dbg2.err"
rc=$?
to_kcoll=$(grep -c '^kcoll_mpi: comm rank [0-9]*: MPI_Allreduce [0-9]* bytes -> kcoll$' "$tmp/dbg2.err")
to_pmpi=$(grep -c '^kcoll_mpi: comm rank [0-9]*: MPI_Comm_dup [0-9]* bytes -> PMPI$' "$tmp/dbg2.err")
[ $rc -eq 0 ] && [ "$to_kcoll" -gt 0 ] && [ "$to_kcoll" -eq "$(kcoll_calls "$tmp/dbg2.err" Allreduce)" ] &&
	[ "$to_pmpi" -eq "$(kcoll_calls "$tmp/dbg2.err" Comm_dup pmpi)" ] && [ "$to_pmpi" -eq 6 ]
ok $? "$m: KCOLL_MPI_DEBUG=2: a line per call ($to_kcoll all-reduces -> kcoll, $to_pmpi dups -> PMPI), matching the summaries"

# kcolld killed in the middle of a run of large out-of-place all-reduces:
# the ranks agree, fall back to MPI, redo the op, and the results stay right
# (mpi-coll-bench checks every element of the first call at each size).
bench="$build/bin/mpi-coll-bench"
[ "$m" = mpich ] && bench="$build/bin/mpi-coll-bench-mpich"
if [ -x "$bench" ]; then
	kd_sock="$tmp/kd.sock"
	"$build/bin/kcolld" -f -s "$kd_sock" -l "$tmp/kd.log" &
	kd=$!
	for _ in $(seq 100); do [ -S "$kd_sock" ] && break; sleep 0.05; done
	# Kill it once it has completed an all-reduce of this job (not on a
	# fixed timer: under ASan MPI_Init alone can take longer than that).
	(
		for _ in $(seq 600); do
			"$build/bin/kcollctl" -s "$kd_sock" status --json 2>/dev/null |
				grep -q '"ops_ok":[1-9]' && break
			sleep 0.05
		done
		kill -KILL "$kd" 2>/dev/null
	) &
	killer=$!
	KCOLL_SOCKET="$kd_sock" with_shim "$m" 2 "$bench" allreduce -b 4M -e 64M -f 2 -n 30 -w 2 -c 1 \
		>"$tmp/kill" 2>"$tmp/kill.err"
	rc=$?
	wait "$killer" "$kd" 2>/dev/null
	[ $rc -ne 0 ] && sed 's/^/# /' "$tmp/kill.err" | tail -5
	ok $rc "$m: kcolld killed mid-run: mpi-coll-bench exits 0, no wrong element"
	grep -q 'goes back to MPI' "$tmp/kill.err" && grep -q 'fallbacks 1' "$tmp/kill.err"
	ok $? "$m: kcolld killed mid-run: logged, and the communicator went back to MPI"
else
	echo "ok $((n + 1)) # SKIP $bench not built"
	n=$((n + 1))
fi

# mpi4py (Debian's, for /usr/bin/python3) on numpy arrays, where its MPI
# module is linked against the MPI tested here (Debian builds it for Open MPI
# only: libmpi.so.40).
declare -A soname=([ompi]=libmpi.so.40 [mpich]=libmpich.so.12)
mpi4py_so=$(/usr/bin/python3 -c 'import mpi4py, numpy, os; d = os.path.dirname(mpi4py.__file__)
print(next(os.path.join(d, f) for f in os.listdir(d) if f.startswith("MPI.") and f.endswith(".so")))' 2>/dev/null)
if [ -z "$mpi4py_so" ]; then
	echo "ok $((n + 1)) # SKIP /usr/bin/python3 lacks mpi4py or numpy (python3-mpi4py, python3-numpy)"
	n=$((n + 1))
elif ! ldd "$mpi4py_so" | grep -q "${soname[$m]}"; then
	echo "ok $((n + 1)) # SKIP $m: Debian's mpi4py ($mpi4py_so) is linked against $(ldd "$mpi4py_so" | grep -o 'libmpi[a-z]*\.so\.[0-9]*' | head -1), not ${soname[$m]}"
	n=$((n + 1))
else
	for np in 2 4; do
		with_shim "$m" "$np" /usr/bin/python3 "$top/tests/shim/shim_mpi4py.py" >"$tmp/py.$np" \
			2>"$tmp/py.$np.err"
		rc=$?
		[ $rc -ne 0 ] && { grep -v '^ok' "$tmp/py.$np"; tail -5 "$tmp/py.$np.err"; } | sed 's/^/# /'
		ok $rc "$m: mpi4py np $np: $(tail -1 "$tmp/py.$np")"
		[ "$(kcoll_calls "$tmp/py.$np.err" Allreduce)" -gt 0 ]
		ok $? "$m: mpi4py np $np: Allreduce went to kcoll"
	done
fi
echo "1..$n"
