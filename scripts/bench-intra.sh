#!/usr/bin/env bash
# Intra-node all-reduce, kcoll vs Open MPI, f32 sum, N=2 and N=4, 1 KiB..64 MiB.
#   scripts/bench-intra.sh [BUILD]        (BUILD defaults to build)
# Writes docs/perf/intra-<date>.json, draws docs/perf/allreduce-intra.png
# (scripts/plot-perf.sh) and prints a markdown table of busbw with the
# kcoll/Open MPI ratio per size, plus the 8-byte latency at N=2.
#
# Fairness on a small, noisy machine: the two systems alternate size by size
# (kcoll, Open MPI, next N, next size), each point is repeated in ROUNDS rounds
# and the best round is reported (load from other users only ever slows a
# point down; the JSON also keeps the median and every raw run); a plain
# memcpy sweep runs in every round as the DRAM reference. kcoll uses
# kcoll_mem_alloc buffers (zero-copy).
#
# Open MPI (Debian 4.1.4): mpirun --allow-run-as-root (only when root)
#   --oversubscribe (N may exceed the cores) --mca pml ob1 --mca btl self,vader
#   (shared memory; without pml ob1 the UCX pml is picked, ignores the btl list
#   and was 2-5x slower at 4-16 MiB here), --mca mpi_yield_when_idle 1 only
#   when N exceeds the cores (no measurable gain otherwise on shared memory).
#   Binding is left at Open MPI's default (cores for N <= cores, none when
#   oversubscribed): --bind-to none was no better.
#
# Environment: KCOLL_SOCKET  use that daemon (else a private kcolld is started
#              and stopped); BENCH_ROUNDS (4), BENCH_MIN (1K), BENCH_MAX (64M),
#              BENCH_FACTOR (4), BENCH_NS ("2 4"), BENCH_OUT (docs/perf).
# BENCH_BASE=DIR (a second build dir, e.g. an older commit's build): an A/B
# in one run. DIR's own kcolld (private, beside BUILD's) and kcoll-bench are
# measured as system "base" at every point, right after BUILD's kcoll and
# before Open MPI; the table gains a base column and kcoll / base per N.
# Bounded: about 1-2 minutes on the 2-core VM with the defaults (each
# command also under a 120 s timeout).
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/scripts/bench-lib.sh"
bench_opts "$@"
BUILD=${1:-build}
bench_build_dir "$top/$BUILD" "$BUILD"
cd "$top"
bin="$top/$BUILD/bin"
rounds=${BENCH_ROUNDS:-4}
min=${BENCH_MIN:-1K}
max=${BENCH_MAX:-64M}
factor=${BENCH_FACTOR:-4}
ns=${BENCH_NS:-2 4}
outdir=${BENCH_OUT:-docs/perf}
stamp=$(date +%Y-%m-%d-%H%M)
json="$outdir/intra-$stamp.json"
png="$outdir/allreduce-intra.png"
ncpu=$(nproc)

die() { echo "bench-intra: $*" >&2; exit 1; }
note() { echo "bench-intra: $*" >&2; }

[ -x "$bin/kcoll-bench" ] || die "$bin/kcoll-bench missing: run make"
base_bin=
if [ -n "${BENCH_BASE:-}" ]; then
	base_bin=$(cd "$BENCH_BASE" && pwd)/bin
	for b in kcoll-bench kcolld; do
		[ -x "$base_bin/$b" ] || die "$base_bin/$b missing: build BENCH_BASE"
	done
fi
command -v python3 >/dev/null || die "python3 is needed to merge the JSON results"

to_bytes() {	# 64M -> 67108864
	local v=$1 m=1
	case "$v" in
	*[Gg]) m=$((1 << 30)); v=${v%?} ;;
	*[Mm]) m=$((1 << 20)); v=${v%?} ;;
	*[Kk]) m=$((1 << 10)); v=${v%?} ;;
	esac
	echo $((v * m))
}

tmp=$(mktemp -d /tmp/kcoll-bench-intra.XXXXXX)
daemon_pid=
base_pid=
cleanup() {
	bench_kcolld_stop
	if [ -n "$base_pid" ]; then
		kill -TERM "$base_pid" 2>/dev/null || true
		wait "$base_pid" 2>/dev/null || true
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

bench_kcolld
if [ -n "$base_bin" ]; then
	base_sock="$tmp/base.sock"
	"$base_bin/kcolld" -f -s "$base_sock" -l "$tmp/base.log" &
	base_pid=$!
	for _ in $(seq 100); do [ -S "$base_sock" ] && break; sleep 0.05; done
	[ -S "$base_sock" ] || { cat "$tmp/base.log" >&2; die "BENCH_BASE's kcolld did not create $base_sock"; }
fi

mpi=()
if [ -x "$bin/mpi-coll-bench" ] && command -v mpirun >/dev/null; then
	mpi=(mpirun)
	[ "$(id -u)" -eq 0 ] && mpi+=(--allow-run-as-root)
	mpi+=(--oversubscribe --mca pml ob1 --mca btl self,vader)
else
	note "no mpirun or $bin/mpi-coll-bench: measuring kcoll only"
fi

# Iterations per point: enough to average out a small size, bounded for a
# large one (about 512 MiB per point, 10..500 iterations).
iters_for() {
	local n=$(( (512 << 20) / $1 ))
	[ "$n" -lt 10 ] && n=10
	[ "$n" -gt 500 ] && n=500
	echo "$n"
}

run=0
record() {	# round system N file: tag a tool's JSON document
	printf '{"round": %s, "system": "%s", "N": %s, "result": ' "$1" "$2" "$3" >"$tmp/run-$run.json"
	cat "$4" >>"$tmp/run-$run.json"
	echo "}" >>"$tmp/run-$run.json"
	run=$((run + 1))
}

point() {	# round system N size iters warmup
	local out="$tmp/point.json"
	local args=(allreduce -b "$4" -e "$4" -n "$5" -w "$6" -c 0 -d f32 -o sum --json)
	if [ "$2" = kcoll ]; then
		timeout 120 "$bin/kcoll-bench" "${args[@]}" -N "$3" -s "$sock" >"$out" ||
			die "kcoll-bench -N $3 at $4 bytes failed"
	elif [ "$2" = base ]; then
		timeout 120 "$base_bin/kcoll-bench" "${args[@]}" -N "$3" -s "$base_sock" >"$out" ||
			die "BENCH_BASE's kcoll-bench -N $3 at $4 bytes failed"
	else
		local extra=()
		[ "$3" -gt "$ncpu" ] && extra=(--mca mpi_yield_when_idle 1)
		timeout 120 "${mpi[@]}" "${extra[@]}" -np "$3" "$bin/mpi-coll-bench" "${args[@]}" \
			>"$out" 2>"$tmp/mpi.err" ||
			{ cat "$tmp/mpi.err" >&2; die "mpi-coll-bench -np $3 at $4 bytes failed"; }
	fi
	record "$1" "$2" "$3" "$out"
}

lo=$(to_bytes "$min")
hi=$(to_bytes "$max")
start=$SECONDS
for r in $(seq "$rounds"); do
	note "round $r/$rounds: memcpy reference, 8-byte latency, sweep $min..$max x$factor for N=${ns// /,}"
	timeout 120 "$bin/kcoll-bench" memcpy -b "$lo" -e "$hi" -f "$factor" -n 20 -w 5 --json \
		>"$tmp/point.json" || die "kcoll-bench memcpy failed"
	record "$r" memcpy 1 "$tmp/point.json"
	# latency: 8 bytes at N=2, both systems back to back
	point "$r" kcoll 2 8 2000 200
	if [ -n "$base_bin" ]; then point "$r" base 2 8 2000 200; fi
	if [ ${#mpi[@]} -gt 0 ]; then point "$r" openmpi 2 8 2000 200; fi
	for ((size = lo; size <= hi; size *= factor)); do
		n=$(iters_for "$size")
		for N in $ns; do
			point "$r" kcoll "$N" "$size" "$n" $((n / 5 + 1))
			if [ -n "$base_bin" ]; then point "$r" base "$N" "$size" "$n" $((n / 5 + 1)); fi
			if [ ${#mpi[@]} -gt 0 ]; then
				point "$r" openmpi "$N" "$size" "$n" $((n / 5 + 1))
			fi
		done
	done
done
note "measured in $((SECONDS - start)) s"

mkdir -p "$outdir"
mpirun_line="${mpi[*]:-none}"
python3 - "$tmp" "$json" "$rounds" "$mpirun_line" "${BENCH_BASE:-}" <<'EOF'
import glob, json, os, platform, statistics, sys, time

tmp, out, rounds, mpirun, base = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
runs = []
for f in sorted(glob.glob(os.path.join(tmp, "run-*.json")),
                key=lambda p: int(p.rsplit("-", 1)[1].split(".")[0])):
    with open(f) as fh:
        runs.append(json.load(fh))

points = {}	# (system, N, size) -> [rows]
for run in runs:
    for row in run["result"]["rows"]:
        points.setdefault((run["system"], run["N"], row["size"]), []).append(row)

summary = []
for (system, n, size), rows in sorted(points.items()):
    best = min(rows, key=lambda r: r["time_us"])
    summary.append({
        "system": system, "N": n, "size": size,
        "time_us": best["time_us"], "algbw": best["algbw"], "busbw": best["busbw"],
        "time_us_median": statistics.median(r["time_us"] for r in rows),
        "busbw_median": statistics.median(r["busbw"] for r in rows),
        "samples": len(rows),
    })

doc = {
    "tool": "scripts/bench-intra.sh",
    "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    "host": platform.node(), "kernel": platform.release(), "cpus": os.cpu_count(),
    "collective": "allreduce", "dtype": "f32", "op": "sum", "mem": "shm",
    "rounds": rounds, "mpirun": mpirun,
    "note": "summary: best round (and median) per point; systems alternate point by point",
    "summary": summary, "runs": runs,
}
if base:
    doc["base"] = base	# system "base": this build's kcolld and kcoll-bench
with open(out, "w") as fh:
    json.dump(doc, fh, indent=1)
    fh.write("\n")
EOF
note "wrote $json"

if command -v gnuplot >/dev/null; then
	"$top/scripts/plot-perf.sh" "$json" "$png" && note "drew $png"
else
	note "no gnuplot (scripts/deps.sh --bench installs it): skipped $png"
fi

python3 - "$json" <<'EOF'
import json, sys

doc = json.load(open(sys.argv[1]))
pt = {(s["system"], s["N"], s["size"]): s for s in doc["summary"]}
ns = sorted({s["N"] for s in doc["summary"] if s["system"] == "kcoll"})
sizes = sorted({s["size"] for s in doc["summary"] if s["system"] == "kcoll" and s["size"] > 8})

def human(b):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return "%d %s" % (b >> shift, unit)
    return "%d B" % b

def bw(key):
    return "%.2f" % pt[key]["busbw"] if key in pt else "-"

def ratio(a, b):
    if a in pt and b in pt and pt[b]["busbw"] > 0:
        return "%.2fx" % (pt[a]["busbw"] / pt[b]["busbw"])
    return "-"

base = "base" in doc
head = ["size"]
for n in ns:
    head += ["kcoll N=%d" % n, "Open MPI N=%d" % n, "ratio"]
    if base:
        head += ["base N=%d" % n, "base ratio", "kcoll / base"]
head.append("memcpy")
print("All-reduce f32 sum, busbw in GB/s (best of %d rounds), %s, %d CPUs, %s"
      % (doc["rounds"], doc["host"], doc["cpus"], doc["date"]))
print()
print("| " + " | ".join(head) + " |")
print("|" + "|".join(["---:"] * len(head)) + "|")
for size in sizes:
    cells = [human(size)]
    for n in ns:
        k, m = ("kcoll", n, size), ("openmpi", n, size)
        cells += [bw(k), bw(m), ratio(k, m)]
        if base:
            b = ("base", n, size)
            cells += [bw(b), ratio(b, m), ratio(k, b)]
    mc = ("memcpy", 1, size)
    cells.append("%.2f" % pt[mc]["algbw"] if mc in pt else "-")
    print("| " + " | ".join(cells) + " |")
print()
k, m = pt.get(("kcoll", 2, 8)), pt.get(("openmpi", 2, 8))
if k:
    line = "8-byte all-reduce latency, N=2: kcoll %.2f us" % k["time_us"]
    if m:
        line += ", Open MPI %.2f us (kcoll/Open MPI time %.2fx)" % (m["time_us"],
                                                                    k["time_us"] / m["time_us"])
    print(line)
b = pt.get(("base", 2, 8))
if b:
    line = "base (%s): %.2f us" % (doc["base"], b["time_us"])
    if m:
        line += " (base/Open MPI time %.2fx)" % (b["time_us"] / m["time_us"])
    print(line)
EOF
