#!/usr/bin/env bash
# libkcoll_mpi.so across hosts: the netns test bed (scripts/netns-cluster.sh,
# 3 hosts, one kcolld each), MPI ranks launched into the hosts' namespaces
# through scripts/netns-rsh.sh, each rank talking to its own host's daemon.
# tests/shim/shim_check gives the same bytes with and without the shim:
#   - Open MPI, 4 ranks on 3 hosts (2+1+1), TCP between hosts
#   - MPICH (Hydra, rsh launcher), 3 ranks on 3 hosts
# and the shim routed calls to kcoll, whose communicators did span the 3
# hosts (each remote kcolld logs "formed with N ranks on 3 hosts").
# Needs root and network namespaces (SKIP otherwise). About 50 s on the
# 2-core VM. Run by tests/run.sh. TAP.
set -u
. "${KCOLL_TOP:?run through tests/run.sh}/tests/cluster_lib.sh"
rsh="$top/scripts/netns-rsh.sh"
shim="$B/lib/libkcoll_mpi.so"

need_root "network namespaces, veth"
command -v ip >/dev/null || skip_all "iproute2 (ip) is missing"
[ -f "$shim" ] || skip_all "$shim not built (needs mpicc)"
cluster_prefix "ksh$$"
need_netns

cluster_tmp shim-cluster
chmod 755 "$T"
trap cluster_cleanup EXIT
trap 'exit 130' INT TERM

san=""
if [ "${KCOLL_TEST_SAN:-0}" = 1 ]; then
	for l in libasan.so libubsan.so; do
		p=$(gcc -print-file-name="$l")
		[ -f "$p" ] && san="$san$p "
	done
	export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1"
fi

if ! "$C" up -H 3 >"$T/up.log" 2>&1; then
	sed 's/^/# /' "$T/up.log"
	echo "Bail out! netns-cluster.sh up failed"
	exit 1
fi

# On a shared 2-core machine: yield while waiting; the hosts' eth0 only.
# The shim's knobs reach remote ranks only where named (Open MPI's -x,
# Hydra's -genvlist): each host's KCOLL_SOCKET comes from netns-rsh.sh, and
# a forwarded one would send every rank to host 0's daemon.
export KCOLL_MPI_MIN_BYTES=65536 KCOLL_MPI_DEBUG=1 MPIR_CVAR_POLLS_BEFORE_YIELD=1
export ASAN_OPTIONS=${ASAN_OPTIONS:-}
printf '10.10.0.1 slots=2\n10.10.0.2 slots=1\n10.10.0.3 slots=1\n' >"$T/hosts.ompi"
printf '10.10.0.1:1\n10.10.0.2:1\n10.10.0.3:1\n' >"$T/hosts.mpich"
ompi_run=$(command -v mpirun.openmpi || command -v mpirun)
# shellcheck disable=SC2054  # "self,tcp" is one argument
launch_ompi=("$ompi_run" --allow-run-as-root --hostfile "$T/hosts.ompi"
	     --mca plm_rsh_agent "$rsh" --mca pml ob1 --mca btl self,tcp
	     --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0
	     --mca mpi_yield_when_idle 1 -x LD_PRELOAD -x KCOLL_MPI_MIN_BYTES
	     -x KCOLL_MPI_DEBUG -x ASAN_OPTIONS -np 4)
launch_mpich=(mpirun.mpich -launcher rsh -launcher-exec "$rsh" -f "$T/hosts.mpich" -iface eth0
	      -genvlist LD_PRELOAD,KCOLL_MPI_MIN_BYTES,KCOLL_MPI_DEBUG,ASAN_OPTIONS,MPIR_CVAR_POLLS_BEFORE_YIELD
	      -np 3)

# Sum of the "kcoll N" figures of call $2 in the summaries in file $1.
kcoll_calls() {
	grep -o " $2 kcoll [0-9]*" "$1" | awk '{ s += $3 } END { print s + 0 }'
}

# case NAME NP LAUNCH...: plain, then with the shim, from host 0.
cluster_case() {
	local m=$1 np=$2 rc k log1 log2
	shift 2
	local check="$B/tests/shim_check_$m"
	timeout -k 5 150 "$C" exec 0 env LD_PRELOAD= "$@" "$check" check >"$T/plain.$m" \
		2>"$T/plain.$m.err"
	rc=$?
	[ $rc -ne 0 ] && tail -5 "$T/plain.$m.err" | sed 's/^/# /'
	ok $rc "$m np $np on 3 hosts: shim_check without the shim exits 0"
	log1=$(wc -l <"$T/run/h1/kcolld.log")
	log2=$(wc -l <"$T/run/h2/kcolld.log")
	timeout -k 5 150 "$C" exec 0 env LD_PRELOAD="$san$shim" "$@" "$check" check \
		>"$T/shim.$m" 2>"$T/shim.$m.err"
	rc=$?
	[ $rc -ne 0 ] && tail -5 "$T/shim.$m.err" | sed 's/^/# /'
	ok $rc "$m np $np on 3 hosts: shim_check with the shim exits 0"
	cmp -s "$T/plain.$m" "$T/shim.$m"
	rc=$?
	[ $rc -ne 0 ] && diff "$T/plain.$m" "$T/shim.$m" | head -10 | sed 's/^/# /'
	ok $rc "$m np $np on 3 hosts: all $(wc -l <"$T/plain.$m") result lines identical with and without the shim"
	[ "$(grep -c '^tolerance/.* float ok double ok$' "$T/shim.$m")" -eq 5 ]
	ok $? "$m np $np on 3 hosts: fractional f32/f64 sums within 1e-5/1e-12 of exact"
	rc=0
	[ "$(grep -c '^kcoll_mpi: rank [0-9]*: Allreduce' "$T/shim.$m.err")" -eq "$np" ] || rc=1
	for call in Allreduce Reduce_scatter_block Allgather Bcast; do
		k=$(kcoll_calls "$T/shim.$m.err" "$call")
		[ "$k" -gt 0 ] || rc=1
	done
	grep -q 'fallbacks [1-9]' "$T/shim.$m.err" && rc=1
	ok $rc "$m np $np on 3 hosts: every rank's summary: all four collectives to kcoll, no fallback"
	tail -n +$((log1 + 1)) "$T/run/h1/kcolld.log" | grep -q "formed with $np ranks on 3 hosts" &&
		tail -n +$((log2 + 1)) "$T/run/h2/kcolld.log" | grep -q "formed with $np ranks on 3 hosts"
	ok $? "$m np $np: the kcoll communicator of MPI_COMM_WORLD spans the 3 hosts (hosts 1, 2 log it)"
}

if [ -x "$B/tests/shim_check_ompi" ] && [ -n "$ompi_run" ]; then
	cluster_case ompi 4 "${launch_ompi[@]}"
else
	skip "Open MPI or shim_check_ompi missing"
fi
if [ -x "$B/tests/shim_check_mpich" ] && command -v mpirun.mpich >/dev/null; then
	cluster_case mpich 3 "${launch_mpich[@]}"
else
	skip "MPICH not installed or not built (Debian mpich, libmpich-dev)"
fi
echo "1..$n"
