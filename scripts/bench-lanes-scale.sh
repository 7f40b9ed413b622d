#!/usr/bin/env bash
# What a multi-host communicator costs in TCP connections as hosts are added,
# and what lanes (one TCP connection per host pair per communicator in each
# rank, docs/multihost.md "Lanes") buy: on the netns cluster
# (scripts/netns-cluster.sh), for each host count H, one rank per host:
#   - communicator creation: tests/mh_rank init on every host at once, the
#     slowest rank's kcoll_comm_init time;
#   - a 1 KiB f32 all-reduce loop (tests/c4_rank loop, checked sums) for
#     SECONDS, once with lanes (the default KCOLL_LANE_BYTES, 64 KiB) and once
#     without (kcollctl set lane_bytes 0 on the root daemon: the daemons' path);
#     halfway through it counts the established TCP connections of host 0's
#     kcolld and rank (ss -tnp in its namespace), the rank's open fds, and
#     every connection of the cluster; at the end, rank 0's ops give the mean
#     latency (SECONDS / ops: submit, all-reduce, check).
#   scripts/bench-lanes-scale.sh [-s SECONDS] [BUILD] [HOSTS...]   (default: 6 s, build, 4 8 16)
# Prints one table (markdown) on stdout; needs root. The cluster's prefix is
# ls<pid>: it makes and deletes its own namespaces only.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/scripts/bench-lib.sh"
secs=6
if [ "${1:-}" = -s ]; then secs=${2:?-s needs SECONDS}; shift 2; fi
bench_opts "$@"
if ! [[ "$secs" =~ ^[0-9]+$ ]] || [ "$secs" -lt 4 ]; then
	echo "bench-lanes-scale: -s $secs: 4 seconds at least (the counts are taken halfway)" >&2
	exit 2
fi
build=${1:-build}
shift || true
hosts=("$@")
[ ${#hosts[@]} -gt 0 ] || hosts=(4 8 16)
B=$top/$build
bench_build_dir "$B" "$build"
C=$top/scripts/netns-cluster.sh
export KCOLL_BUILD=$B KCOLL_CLUSTER_PREFIX=ls$$
P=$KCOLL_CLUSTER_PREFIX

die() { echo "bench-lanes-scale: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "needs root (network namespaces)"
for f in bin/kcolld bin/kcollctl tests/mh_rank tests/c4_rank; do
	[ -x "$B/$f" ] || die "$B/$f missing: run make"
done
command -v ss >/dev/null || die "ss (iproute2) is missing"
T=$(mktemp -d /tmp/kcoll-lanes.XXXXXX)
trap '"$C" down >/dev/null 2>&1 || true; rm -rf "$T"' EXIT
trap 'exit 130' INT TERM

# Established TCP connections in host I's namespace owned by process NAME.
conns() {	# i name
	ip netns exec "$P-h$1" ss -tnpH state established 2>/dev/null | grep -c "\"$2\"" || true
}
# Every established connection of the cluster (each counted at both ends: / 2).
all_conns() {
	local i t=0
	for ((i = 0; i < $1; i++)); do
		t=$((t + $(ip netns exec "$P-h$i" ss -tnH state established 2>/dev/null | wc -l)))
	done
	echo $((t / 2))
}
rank_pid() {	# i
	local p
	for p in $(ip netns pids "$P-h$1"); do
		grep -q c4_rank "/proc/$p/cmdline" 2>/dev/null && { echo "$p"; return; }
	done
}

# One loop of 1 KiB all-reduces on H hosts; prints "kcolld_conns rank_conns rank_fds all_conns us_per_op".
measure() {	# H tag
	local h=$1 tag=$2 id i p pid kc rc rf ac ops pids=()
	id=$("$C" exec 0 "$B/tests/c4_rank" id)
	for ((i = 0; i < h; i++)); do
		"$C" exec "$i" "$B/tests/c4_rank" loop "$id" "$h" "$i" "$secs" 1024 >"$T/$tag.$i" 2>&1 &
		pids+=($!)
	done
	sleep $((secs / 2 + 1))
	kc=$(conns 0 kcolld)
	rc=$(conns 0 c4_rank)
	pid=$(rank_pid 0)
	rf=$(find "/proc/${pid:-0}/fd" -mindepth 1 2>/dev/null | wc -l)
	ac=$(all_conns "$h")
	for p in "${pids[@]}"; do wait "$p" || die "$tag: a rank failed: $(tail -n 2 "$T/$tag".* | tr '\n' ' ')"; done
	ops=$(sed -n 's/^done ops=\([0-9]*\).*/\1/p' "$T/$tag.0")
	if [ -z "$ops" ] || [ "$ops" -eq 0 ]; then die "$tag: rank 0 reported no ops"; fi
	echo "$kc $rc $rf $ac $(awk -v s="$secs" -v n="$ops" 'BEGIN { printf "%.0f", s * 1e6 / n }')"
}

echo "| hosts | comm init, slowest rank (ms) | lanes: conns kcolld h0 | lanes: conns rank h0 | lanes: rank fds | lanes: conns in cluster | lanes: 1 KiB all-reduce (us) | no lanes: conns kcolld h0 | no lanes: conns rank h0 | no lanes: conns in cluster | no lanes: 1 KiB all-reduce (us) |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for h in "${hosts[@]}"; do
	"$C" up -H "$h" >"$T/up.$h" 2>&1 || { cat "$T/up.$h" >&2; die "cluster up -H $h failed"; }
	id=$("$C" exec 0 "$B/tests/mh_rank" id)
	pids=()
	for ((i = 0; i < h; i++)); do
		"$C" exec "$i" "$B/tests/mh_rank" init "$id" "$h" "$i" >"$T/init.$h.$i" 2>&1 &
		pids+=($!)
	done
	for p in "${pids[@]}"; do wait "$p" || die "H=$h: comm init failed: $(cat "$T/init.$h".* | tr '\n' ' ')"; done
	init=$(sed -n 's/^init err=0 .*ms=\([0-9.]*\).*/\1/p' "$T/init.$h".* | sort -g | tail -1)
	m=$(measure "$h" "lanes.$h") || exit 1
	read -r lk lr lf la lus <<<"$m"
	# host 0 issued the id: its daemon is the root, whose lane_bytes counts
	"$B/bin/kcollctl" -s "${KCOLL_CLUSTER_RUNDIR:-/run/kcoll-$P}/h0/kcolld.sock" set lane_bytes 0 >/dev/null
	m=$(measure "$h" "nolanes.$h") || exit 1
	read -r nk nr _ na nus <<<"$m"
	echo "| $h | $init | $lk | $lr | $lf | $la | $lus | $nk | $nr | $na | $nus |"
	"$C" down >/dev/null 2>&1
done
