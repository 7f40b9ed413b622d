"""The size axis the busbw-vs-size plots share (scripts/plot-perf.sh,
plot-torch.sh, cluster-anchors.sh; run through plot-lib.sh's plot_py):
gnuplot lines for log-2 x tics labelled 1K, 4M, 1G at the measured sizes."""


def size_label(b):
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return "%d%s" % (b >> shift, unit)
    return str(b)


def size_axis(sizes):
    """The xtics and xrange lines for sorted sizes."""
    return ("set xtics (" + ", ".join("'%s' %d" % (size_label(b), b) for b in sizes) + ")\n"
            "set xrange [%g:%g]" % (sizes[0] / 1.25, sizes[-1] * 1.25))
