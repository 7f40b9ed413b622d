#!/usr/bin/env python3
"""Checks for t_metrics.sh: kcolld's metrics text read by Prometheus' own
parser (Debian's python3-prometheus-client), never by regular expressions.

    metrics_check.py parse FILE [DOC]
        FILE parses; every family has HELP and a TYPE, the kcoll_ prefix and,
        with DOC (docs/metrics.md), a line of that document naming it.
    metrics_check.py series SCRAPE... --bench JSON --nranks N
        Every counter, histogram bucket, _count and _sum never goes down from
        one scrape to the next; between the first and the last scrape the
        all-reduce ops and bytes grew by exactly what the benchmark (its
        --json report) ran; each histogram is cumulative with _count equal to
        +Inf and, for all-reduce, to the ops.
    metrics_check.py value FILE NAME [LABEL=VALUE...]
        Print one sample's value (for the shell).
Prints one line per failed check on stderr; exit 1 if any failed.
"""
import json
import math
import sys

from prometheus_client.parser import text_string_to_metric_families

failed = []


def check(cond, what):
    if not cond:
        failed.append(what)
    return cond


def families(path):
    with open(path, encoding="utf-8") as f:
        return list(text_string_to_metric_families(f.read()))


def samples(fams):
    """{(sample name, sorted labels): value} and {sample name: family type}."""
    vals, types = {}, {}
    for fam in fams:
        for s in fam.samples:
            vals[(s.name, tuple(sorted(s.labels.items())))] = s.value
            types[s.name] = fam.type
    return vals, types


def cmd_parse(path, doc=None):
    fams = families(path)
    check(len(fams) >= 10, f"{path}: only {len(fams)} metric families")
    text = open(doc, encoding="utf-8").read() if doc else ""
    with open(path, encoding="utf-8") as f:
        raw = f.read()
    for fam in fams:
        name = fam.name + ("_total" if fam.type == "counter" else "")
        check(name.startswith("kcoll_"), f"{name}: no kcoll_ prefix")
        check(bool(fam.documentation), f"{name}: no HELP text")
        check(fam.type in ("counter", "gauge", "histogram"), f"{name}: type {fam.type}")
        check(f"# TYPE {name} {fam.type}\n" in raw, f"{name}: no TYPE line")
        if doc:
            check(f"`{name}`" in text, f"{name}: not documented in {doc}")
        for s in fam.samples:
            for k in ("op_id", "request", "seq", "user_data", "pid"):
                check(k not in s.labels, f"{s.name}: high-cardinality label {k}")


def hist_checks(vals, name, labels, where):
    """Buckets cumulative, +Inf == _count; returns _count."""
    base = tuple(sorted(labels.items()))
    buckets = sorted(((float(dict(k[1])["le"]), v) for k, v in vals.items()
                      if k[0] == name + "_bucket" and
                      tuple(sorted((a, b) for a, b in k[1] if a != "le")) == base),
                     key=lambda x: x[0])
    check(len(buckets) >= 2 and math.isinf(buckets[-1][0]), f"{where}: {name}{labels} has no +Inf bucket")
    prev = 0
    for le, v in buckets:
        check(v >= prev, f"{where}: {name}{labels} bucket le={le} ({v}) below the one before ({prev})")
        prev = v
    count = vals.get((name + "_count", base))
    check(count is not None and buckets and count == buckets[-1][1],
          f"{where}: {name}{labels} _count {count} != +Inf bucket")
    return count


def cmd_series(paths, bench, nranks):
    scrapes = []
    for p in paths:
        vals, types = samples(families(p))
        scrapes.append((p, vals, types))
    # Monotonic: every sample of a counter or histogram, scrape after scrape.
    for (pa, a, types), (pb, b, _) in zip(scrapes, scrapes[1:]):
        for key, va in a.items():
            if types.get(key[0]) not in ("counter", "histogram"):
                continue
            vb = b.get(key)
            check(vb is not None, f"{pb}: {key} vanished")
            if vb is not None:
                check(vb >= va, f"{key} went down: {va} in {pa}, {vb} in {pb}")
    first, last = scrapes[0][1], scrapes[-1][1]
    for p, vals, _ in scrapes:
        for op in ("allreduce", "allgather", "barrier", "broadcast", "reduce_scatter"):
            hist_checks(vals, "kcoll_op_duration_seconds", {"op": op}, p)

    with open(bench, encoding="utf-8") as f:
        rep = json.load(f)
    runs = rep["check"] + rep["warmup"] + rep["iters"]
    want_ops = runs * len(rep["rows"])
    want_bytes = nranks * runs * sum(r["size"] for r in rep["rows"])

    def get(vals, name, **labels):
        return vals.get((name, tuple(sorted(labels.items()))), 0)

    d_ops = get(last, "kcoll_ops_total", op="allreduce", status="ok") - \
        get(first, "kcoll_ops_total", op="allreduce", status="ok")
    d_bytes = get(last, "kcoll_op_bytes_total", op="allreduce") - \
        get(first, "kcoll_op_bytes_total", op="allreduce")
    print(f"# all-reduce ops {d_ops:.0f} (bench ran {want_ops}), bytes {d_bytes:.0f} "
          f"(bench: {nranks} ranks x {runs} runs x sizes = {want_bytes})")
    check(d_ops == want_ops, f"all-reduce ops grew by {d_ops}, the benchmark ran {want_ops}")
    check(want_bytes > 0 and abs(d_bytes - want_bytes) <= want_bytes / 100,
          f"all-reduce bytes grew by {d_bytes}, the benchmark moved {want_bytes} (> 1% apart)")
    check(d_bytes == want_bytes, f"all-reduce bytes {d_bytes} != {want_bytes} (exact)")
    ops_all = sum(v for k, v in last.items() if k[0] == "kcoll_ops_total" and ("op", "allreduce") in k[1])
    cnt = get(last, "kcoll_op_duration_seconds_count", op="allreduce")
    check(cnt == ops_all, f"all-reduce histogram _count {cnt} != kcoll_ops_total {ops_all}")
    check(get(last, "kcoll_op_duration_seconds_sum", op="allreduce") > 0, "all-reduce latency _sum is 0")


def cmd_value(path, name, labels):
    want = dict(x.split("=", 1) for x in labels)
    for fam in families(path):
        for s in fam.samples:
            if s.name == name and s.labels == want:
                print(f"{s.value:.0f}" if s.value == int(s.value) else s.value)
                return
    failed.append(f"{path}: no sample {name}{want}")


def main(argv):
    if argv[1] == "parse":
        cmd_parse(*argv[2:4])
    elif argv[1] == "series":
        i = argv.index("--bench")
        cmd_series(argv[2:i], argv[i + 1], int(argv[argv.index("--nranks") + 1]))
    elif argv[1] == "value":
        cmd_value(argv[2], argv[3], argv[4:])
    for f in failed:
        print(f"# {f}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
