# Sourced by scripts/plot-*.sh (and cluster-anchors.sh for its plot): what
# they share.
#   plot_begin NAME GLOB DEFAULT_OUT HOW [IN [OUT]]
# Sets in (IN, else the newest file matching GLOB), out (OUT, else
# DEFAULT_OUT) and tmp (a scratch directory removed on exit); exits saying
# what to do when there is no input (HOW: the command that makes one) or no
# gnuplot.
plot_begin() {
	local name=$1 glob=$2 def_out=$3 how=$4
	# shellcheck disable=SC2086  # GLOB is meant to expand
	in=${5:-$(ls -t $glob 2>/dev/null | head -1)}
	out=${6:-$def_out}
	[ -n "$in" ] && [ -f "$in" ] || { echo "$name: no input ($how)" >&2; exit 1; }
	command -v gnuplot >/dev/null || { echo "$name: gnuplot missing: scripts/deps.sh --bench" >&2; exit 1; }
	tmp=$(mktemp -d /tmp/kcoll-plot.XXXXXX)
	trap 'rm -rf "$tmp"' EXIT
}

plot_lib_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# plot_py ARGS...: python3 with scripts/ importable (plot_axis.size_axis).
plot_py() {
	PYTHONPATH="$plot_lib_dir${PYTHONPATH:+:$PYTHONPATH}" python3 "$@"
}

# plot_busbw PNG GP: draw busbw (GB/s) against size (log 2) into PNG from the
# gnuplot lines in GP (ranges, tics, title and the plot clauses).
plot_busbw() {
	gnuplot <<EOF
set terminal pngcairo size 1000,620 font 'sans,10'
set output '$1'
set logscale x 2
set xlabel 'size (bytes)'
set ylabel 'bus bandwidth (GB/s)'
set grid
set key top left
load '$2'
EOF
}
