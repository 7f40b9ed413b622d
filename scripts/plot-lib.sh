# Sourced by scripts/plot-*.sh: the start they share.
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
