#!/usr/bin/env python3
"""kcolld's seams, measured from the build: which daemon files call which,
the call cycles among them, and the libraries (rdma/, bpf/, gpu/) that reach
into user/daemon/.

    scripts/layering.py [--build DIR] [--json] [--check BASELINE]

A file A depends on file B when A's object has an undefined symbol that B's
object defines (nm), so calls through function pointers are not counted:
the graph is the linker's. Cycles are the strongly connected components of
that graph with more than one file. A library reaches into the daemon when
its object's recorded compile command (BUILD/obj/.../x.o.cmd) has
-Iuser/daemon, or its source includes a header that lives there.

--check BASELINE compares with a recorded state (scripts/layering.baseline)
and fails only when things got worse: a cycle that is not inside one of the
baseline's, or a library reaching into the daemon that the baseline does not
list. It says so when the baseline can shrink. docs/architecture.md states
the rules; the baseline is the debt still owed to them.
"""
import argparse
import glob
import json
import os
import re
import subprocess
import sys

DAEMON = "user/daemon"
LIBS = ("rdma", "bpf", "gpu")


def defined_and_used(obj):
    out = subprocess.run(["nm", obj], capture_output=True, text=True, check=True).stdout
    d, u = set(), set()
    for line in out.splitlines():
        f = line.split()
        if len(f) == 2 and f[0] == "U":
            u.add(f[1])
        elif len(f) == 3 and f[1] in "TDBRCGSV":
            d.add(f[2])
    return d, u


def sccs(nodes, edges):
    """Tarjan's strongly connected components."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return [c for c in out if len(c) > 1]


def measure(top, build):
    objdir = os.path.join(build, "obj")
    files = {}
    for sub in (DAEMON,) + LIBS:
        for o in sorted(glob.glob(os.path.join(objdir, sub, "*.o"))):
            rel = os.path.relpath(o, objdir)[:-2] + ".c"
            if os.path.exists(os.path.join(top, rel)):
                files[rel] = o
    sym = {f: defined_and_used(o) for f, o in files.items()}
    owner = {}
    for f, (d, _) in sym.items():
        for s in d:
            owner.setdefault(s, f)
    edges, why = {}, {}
    for f, (_, u) in sym.items():
        for s in u:
            g = owner.get(s)
            if g and g != f:
                edges.setdefault(f, set()).add(g)
                why.setdefault((f, g), []).append(s)
    daemon = [f for f in files if f.startswith(DAEMON + "/")]
    dedges = {f: {g for g in edges.get(f, ()) if g in daemon} for f in daemon}
    cycles = sccs(daemon, dedges)

    headers = {os.path.basename(h) for h in glob.glob(os.path.join(top, DAEMON, "*.h"))}
    reach = []
    for f in files:
        if not f.startswith(LIBS):
            continue
        cmd = files[f] + ".cmd"
        how = []
        if os.path.exists(cmd) and re.search(r"-I\s*user/daemon\b", open(cmd).read()):
            how.append("-Iuser/daemon")
        src = open(os.path.join(top, f), errors="replace").read()
        for h in re.findall(r'#\s*include\s+"([^"]+)"', src):
            if os.path.basename(h) in headers and not os.path.exists(
                    os.path.join(top, os.path.dirname(f), h)):
                how.append('#include "%s"' % h)
        if how:
            reach.append({"file": f, "how": how})
    lib_to_daemon = sorted({(f, g) for f, gs in edges.items() if f.startswith(LIBS)
                            for g in gs if g.startswith(DAEMON + "/")})
    return {
        "cycles": cycles,
        "cycle_edges": {"%s -> %s" % (f, g): sorted(why[(f, g)])[:4]
                        for c in cycles for f in c for g in sorted(dedges.get(f, ())) if g in c},
        "library_reaches_daemon": reach,
        "library_calls_daemon": ["%s -> %s (%s)" % (f, g, ", ".join(sorted(why[(f, g)])[:3]))
                                 for f, g in lib_to_daemon],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--check", metavar="BASELINE")
    a = ap.parse_args()
    top = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
    build = os.path.join(top, a.build) if not os.path.isabs(a.build) else a.build
    if not os.path.isdir(os.path.join(build, "obj", DAEMON)):
        print("layering.py: no objects under %s/obj/%s: run make first" % (build, DAEMON),
              file=sys.stderr)
        return 2
    m = measure(top, build)
    if a.json:
        print(json.dumps(m, indent=1))
    elif not a.check:
        for c in m["cycles"]:
            print("cycle of %d daemon files: %s" % (len(c), " ".join(c)))
        for e, s in sorted(m["cycle_edges"].items()):
            print("  %s: %s" % (e, ", ".join(s)))
        for r in m["library_reaches_daemon"]:
            print("library reaches into user/daemon: %s (%s)" % (r["file"], ", ".join(r["how"])))
        for c in m["library_calls_daemon"]:
            print("library calls the daemon: %s" % c)
    if not a.check:
        return 0

    base = json.load(open(a.check))
    worse, better = [], []
    for c in m["cycles"]:
        if not any(set(c) <= set(b) for b in base["cycles"]):
            worse.append("a call cycle the baseline does not allow: %s" % " ".join(c))
    for b in base["cycles"]:
        if not any(set(b) <= set(c) for c in m["cycles"]):
            better.append("the baseline's cycle %s is gone or smaller" % " ".join(b))
    was = {r["file"] for r in base["library_reaches_daemon"]}
    now = {r["file"] for r in m["library_reaches_daemon"]}
    worse += ["%s now reaches into user/daemon/ (%s)" % (r["file"], ", ".join(r["how"]))
              for r in m["library_reaches_daemon"] if r["file"] not in was]
    better += ["%s no longer reaches into user/daemon/" % f for f in sorted(was - now)]
    print("ok 1 - no new call cycle among daemon files (%d cycle(s), the largest %d files)" % (
        len(m["cycles"]), max((len(c) for c in m["cycles"]), default=0))
          if not [w for w in worse if "cycle" in w] else
          "not ok 1 - a new call cycle among daemon files")
    print("ok 2 - no new library (rdma/, bpf/, gpu/) reaching into user/daemon/ (%d baseline)" %
          len(was) if not [w for w in worse if "reaches" in w] else
          "not ok 2 - a library newly reaches into user/daemon/")
    for w in worse:
        print("#   worse: %s" % w)
    for b in better:
        print("#   better: %s: shrink %s (scripts/layering.py --build BUILD --json > it)"
              % (b, a.check))
    print("1..2")
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main())
