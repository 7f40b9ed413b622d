#!/usr/bin/env python3
"""Every command the test and set-up scripts call must come from a package
that scripts/deps.sh installs for their tier, or from Debian's minbase (what a
fresh machine has). A command found here only because earlier work installed
its package is exactly what a fresh machine lacks: this check names it and
the package, where it is written.

    tests/deps_check.py [--top DIR] [--verbose]

Prints TAP. Commands are read statically from the scripts (the first word of
each simple command, after prefixes such as `timeout 10`, `ip netns exec NS`,
`env A=b`); a word that names a function of the scanned scripts or a shell
builtin is not a command. The modules the tree's Python files import (tests,
scripts, examples, the kcoll package) are found the way /usr/bin/python3 finds
them and held to the host tier's packages the same way, except an import
inside a `try` whose handler catches ImportError (optional by construction:
CuPy on a GPU machine). Each command is looked up on PATH, its file's package
found with dpkg -S, and that package must be in the closure (Depends and
Pre-Depends, recursively) of the tier's deps.sh list plus the packages of
priority required (debootstrap's minbase) and the README's prerequisites
(make, git, ca-certificates).
"""
import argparse
import ast
import glob
import os
import re
import subprocess
import sys

# Which scripts serve which tier, and the deps.sh options that install it.
TIERS = [
    ("host", [], ["tests/*.sh", "scripts/demo.sh", "scripts/netns-cluster.sh",
                  "scripts/netns-rsh.sh", "scripts/install.sh", "scripts/gpu-check.sh",
                  "scripts/torch2-root.sh"]),
    ("vm", ["--vm"], ["tests/vm/*.sh", "scripts/vmtest.sh", "scripts/vmtest-pair.sh",
                      "scripts/vm-rxe-setup.sh"]),
    ("bench", ["--bench", "--vm"], ["scripts/bench-*.sh", "scripts/plot-*.sh",
                                    "scripts/cluster-anchors.sh", "user/shim/*.sh"]),
]

# What the README asks a fresh machine to have before make demo.
PREREQS = ["make", "git", "ca-certificates"]

BUILTINS = set("""
alias bg bind break builtin caller cd command compgen complete compopt continue declare
dirs disown echo enable eval exec exit export false fc fg getopts hash help history jobs
kill let local logout mapfile popd printf pushd pwd read readarray readonly return set
shift shopt source suspend test times trap true type typeset ulimit umask unalias unset
wait if then else elif fi case esac for select while until do done in function time
coproc
""".split())

# Prefixes whose arguments are followed by the real command: name -> how many
# leading non-option words they take before it.
WRAPPERS = {"timeout": 1, "nice": 0, "nohup": 0, "setsid": 0, "stdbuf": 0, "exec": 0,
            "command": 0, "time": 0, "env": 0, "sudo": 0, "xargs": 0, "taskset": 1,
            "flock": 1, "chroot": 1, "unshare": 0, "ionice": 0, "!": 0, "then": 0,
            "do": 0, "else": 0, "elif": 0, "if": 0, "while": 0, "until": 0, "{": 0,
            "(": 0}
WORD = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*$")
ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\[[^]]*\])?\+?=")
FUNC = re.compile(r"^\s*(?:function\s+)?([A-Za-z_][A-Za-z0-9_.-]*)\s*\(\)")
SPLIT = re.compile(r"\|\||&&|[|;&`]|\$\(|\(|\)|\{|\}")


def code_text(text):
    """The script with what is not code blanked: comments, quoted strings
    (keeping command substitutions inside double quotes, where commands run)
    and here-document bodies (data for another program: a guest's init, a
    config file, a Python program). Newlines are kept, so line numbers hold."""
    out, i, n = [], 0, len(text)
    mode = ["code"]		# stack: code, sq, dq; $( inside dq pushes code
    depth = [0]			# parens open in each code level
    heredocs = []
    while i < n:
        ch, m = text[i], mode[-1]
        if ch == "\n":
            out.append(ch)
            i += 1
            if m == "code" and heredocs:
                while heredocs and i < n:
                    j = text.find("\n", i)
                    j = n if j < 0 else j
                    line = text[i:j]
                    out.append("\n")
                    i = j + 1
                    if line.strip() == heredocs[0]:
                        heredocs.pop(0)
            continue
        if m == "sq":
            if ch == "'":
                mode.pop()
            i += 1
            continue
        if m == "dq":
            if ch == "\\":
                i += 2
            elif ch == '"':
                mode.pop()
                out.append(' "" ')
                i += 1
            elif text.startswith("$(", i) and not text.startswith("$((", i):
                mode.append("code")
                depth.append(0)
                out.append(" ; ")
                i += 2
            else:
                i += 1
            continue
        # code
        if ch == "\\":
            out.append(text[i:i + 2])
            i += 2
        elif ch == "#" and (i == 0 or text[i - 1] in " \t\n;"):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif ch == "'":
            mode.append("sq")
            out.append(" '' ")
            i += 1
        elif ch == '"':
            mode.append("dq")
            i += 1
        elif text.startswith("<<", i) and not text.startswith("<<<", i):
            hm = re.match(r"<<-?\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1", text[i:])
            if hm:
                heredocs.append(hm.group(2))
                i += hm.end()
            else:
                out.append(ch)
                i += 1
        elif ch == "(" :
            depth[-1] += 1
            out.append(ch)
            i += 1
        elif ch == ")":
            if len(mode) > 1 and depth[-1] == 0:
                mode.pop()		# the end of a $( inside double quotes
                depth.pop()
                out.append(" ; ")
            else:
                depth[-1] = max(0, depth[-1] - 1)
                out.append(ch)
            i += 1
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def first_command(words):
    """The command of one simple command, past assignments, redirections and
    the wrappers above."""
    i = 0
    while i < len(words):
        w = words[i]
        if ASSIGN.match(w) or re.match(r"^[0-9]*[<>]", w):
            i += 1
            continue
        if w == "ip" and words[i + 1:i + 3] == ["netns", "exec"]:
            i += 4
            continue
        if w in WRAPPERS:
            skip = WRAPPERS[w]
            i += 1
            while i < len(words) and (words[i].startswith("-") or ASSIGN.match(words[i])):
                # an option with a separate value (-k 5, -n 19, -o 0)
                if re.match(r"^-[knoscu]$", words[i]) and i + 1 < len(words):
                    i += 1
                i += 1
            i += skip
            continue
        return w
    return None


TOKEN = re.compile(r"(\|\||&&|;;|[|;&`]|\$\(|\(|\)|\{|\})")
ARITH = re.compile(r"\$?\(\([^()]*(?:\([^()]*\)[^()]*)*\)\)|\[\[.*?\]\]")
GAWK_ONLY = re.compile(r"(?<![.\w])(asorti?|gensub|patsplit|strftime|systime|mktime)\s*\(|PROCINFO")


def commands_of(path):
    """(command, line number) pairs, the functions the file defines, and the
    lines whose awk programs use gawk-only functions."""
    found, funcs, gawk = [], set(), []
    with open(path, errors="replace") as f:
        raw = f.read()
    heredoc = None
    for n, line in enumerate(raw.splitlines(), 1):
        if heredoc:
            heredoc = None if line.strip() == heredoc else heredoc
            continue
        hm = re.search(r"<<-?\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1", line)
        heredoc = hm.group(2) if hm and not line.lstrip().startswith("#") else None
        fm = FUNC.match(line)
        if fm:
            funcs.add(fm.group(1))
        if GAWK_ONLY.search(line) and not re.search(r"\bgawk\b", line):
            gawk.append(n)
    for n, line in enumerate(code_text(raw).split("\n"), 1):
        line = ARITH.sub(" ", line)
        seg, depth = [], 0
        for tok in TOKEN.split(line) + [";"]:
            if not TOKEN.fullmatch(tok):
                seg.append(tok)
                continue
            words = " ".join(seg).split()
            seg = []
            if tok in ("(", "$("):
                depth += 1
            elif tok == ")":
                if depth == 0:
                    continue	# a case pattern ends here: not a command
                depth -= 1
            if not words:
                continue
            c = first_command(words)
            if c and WORD.match(c) and c not in BUILTINS:
                found.append((c, n))
    return found, funcs, gawk


PY_GLOBS = ["tests/*.py", "tests/python/*.py", "scripts/*.py", "examples/*.py",
            "user/python/kcoll/*.py", "user/python/*.py"]
IMPORT = re.compile(r"^\s*(?:import|from)\s+([A-Za-z_][A-Za-z0-9_]*)")


def py_imports(top):
    """module -> where it is imported, for the modules of the tree's Python
    files that are not the tree's own."""
    own = {"kcoll"}
    files = sorted({f for g in PY_GLOBS for f in glob.glob(os.path.join(top, g))})
    # Top-level modules of the tree (user/python/_kcoll_torch.py too); the
    # kcoll package's own files are kcoll.NAME (its torch.py is not torch).
    own |= {os.path.splitext(os.path.basename(f))[0] for f in files
            if not os.path.relpath(f, top).startswith("user/python/kcoll/")}
    uses = {}
    for f in files:
        for mod, n in imports_of(f):
            if mod not in own and mod != "__future__":
                uses.setdefault(mod, []).append("%s:%d" % (os.path.relpath(f, top), n))
    return uses


def imports_of(path):
    """(top-level module, line) for each absolute import in a Python file:
    from its syntax tree (a docstring line that starts with "from" is not
    an import), or line by line if this Python cannot parse it."""
    with open(path, errors="replace") as f:
        text = f.read()
    try:
        tree = ast.parse(text, path)
    except SyntaxError:
        return [(m.group(1), n) for n, line in enumerate(text.splitlines(), 1)
                for m in [IMPORT.match(line)] if m]
    # An import inside a try whose handler catches ImportError is optional
    # by construction (the module of a machine this is not, e.g. CuPy on a GPU).
    optional = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(catches_import_error(h.type) for h in node.handlers):
            optional |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    found = []
    for node in ast.walk(tree):
        if id(node) in optional:
            continue
        if isinstance(node, ast.Import):
            found += [(a.name.split(".")[0], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.append((node.module.split(".")[0], node.lineno))
    return found


def catches_import_error(t):
    """Does an except clause of type expression t catch ImportError (a bare
    except, ImportError, ModuleNotFoundError, or a tuple with one)?"""
    if t is None:
        return True
    if isinstance(t, ast.Tuple):
        return any(catches_import_error(e) for e in t.elts)
    return isinstance(t, ast.Name) and t.id in ("ImportError", "ModuleNotFoundError")


def module_files(mods):
    """module -> the file /usr/bin/python3 would load it from (None: not found,
    "": built into the interpreter)."""
    prog = ("import importlib.util, sys\n"
            "for m in sys.argv[1:]:\n"
            "    try: s = importlib.util.find_spec(m)\n"
            "    except Exception: s = None\n"
            "    print(m, 'NONE' if s is None else (s.origin if s.origin and s.origin.startswith('/') else 'BUILTIN'))\n")
    out = run(["/usr/bin/python3", "-c", prog] + sorted(mods))
    res = {}
    for l in out.splitlines():
        m, o = l.split(" ", 1)
        res[m] = None if o == "NONE" else ("" if o == "BUILTIN" else o)
    return res


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True).stdout


def closure(pkgs):
    out = run(["apt-cache", "depends", "--recurse", "--installed", "--no-recommends",
               "--no-suggests", "--no-conflicts", "--no-breaks", "--no-replaces",
               "--no-enhances"] + pkgs)
    have = {l.strip() for l in out.splitlines() if l and not l[0].isspace()}
    return {p.split(":")[0] for p in have if not p.startswith("<")}


def minbase():
    out = run(["dpkg-query", "-W", "-f=${Package} ${Priority} ${Essential}\n"])
    return {l.split()[0] for l in out.splitlines()
            if len(l.split()) >= 2 and (l.split()[1] == "required" or l.endswith(" yes"))}


def owners(paths):
    """path -> package, for the paths dpkg knows."""
    res = {}
    out = subprocess.run(["dpkg", "-S"] + sorted(paths), capture_output=True, text=True).stdout
    for l in out.splitlines():
        if ": " not in l or l.startswith("diversion"):
            continue
        pk, p = l.split(": ", 1)
        for pkg in pk.split(", "):
            res.setdefault(p.strip(), pkg.split(":")[0])
    return res


def candidates(path):
    """The file names dpkg may know a command by (merged /usr: /bin = /usr/bin)."""
    c = {path, os.path.realpath(path)}
    for p in list(c):
        if p.startswith("/usr/"):
            c.add(p[4:])
        else:
            c.add("/usr" + p)
    return c


def which(cmd):
    for d in "/usr/local/sbin /usr/local/bin /usr/sbin /usr/bin /sbin /bin".split():
        p = os.path.join(d, cmd)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--top", default=os.path.join(os.path.dirname(__file__), ".."))
    ap.add_argument("--verbose", action="store_true")
    a = ap.parse_args()
    top = os.path.abspath(a.top)

    base = minbase()
    funcs = set()
    for f in glob.glob(os.path.join(top, "**/*.sh"), recursive=True):
        if "/build" not in os.path.relpath(f, top):
            funcs |= commands_of(f)[1]
    tests = 0
    failed = 0

    def result(ok, text):
        nonlocal tests, failed
        tests += 1
        failed += not ok
        print(("ok" if ok else "not ok"), tests, "-", text)

    for tier, opts, globs in TIERS:
        pkgs = run([os.path.join(top, "scripts/deps.sh"), "--list"] + opts).split()
        allowed = closure(pkgs + PREREQS) | base | set(pkgs)
        files = sorted({f for g in globs for f in glob.glob(os.path.join(top, g))})
        uses, gawk_lines = {}, []
        for f in files:
            found, _, gawk = commands_of(f)
            for c, n in found:
                uses.setdefault(c, []).append("%s:%d" % (os.path.relpath(f, top), n))
            gawk_lines += ["%s:%d" % (os.path.relpath(f, top), n) for n in gawk]
        uses = {c: w for c, w in uses.items() if c not in funcs}
        paths, unknown = {}, []
        for c in sorted(uses):
            p = which(c)
            if p:
                paths[c] = p
            else:
                unknown.append(c)
        own = owners({x for p in paths.values() for x in candidates(p)})
        bad = []
        for c, p in sorted(paths.items()):
            pkg = next((own[x] for x in candidates(p) if x in own), None)
            if pkg is None and "/etc/alternatives/" in os.path.realpath(p) or (
                    pkg is None and os.path.islink(p)):
                pkg = "(alternative)"
            if pkg is None:
                bad.append("%s (%s: no Debian package owns it) at %s: install it from a "
                           "package deps.sh lists" % (c, p, uses[c][0]))
            elif pkg != "(alternative)" and pkg not in allowed:
                bad.append("%s (package %s) at %s: add %s to scripts/deps.sh's list for this tier"
                           % (c, pkg, ", ".join(uses[c][:3]), pkg))
            if a.verbose:
                print("# %s %s -> %s %s" % (tier, c, p, pkg))
        if a.verbose:
            for c in unknown:
                print("# %s: '%s' (at %s) is no command here: a function of a sourced file, "
                      "or a word this reader took for one" % (tier, c, uses[c][0]))
        for w in gawk_lines:
            bad.append("awk with a gawk-only function at %s: a fresh machine's awk is mawk; "
                       "write it in POSIX awk or call gawk" % w)
        result(not bad, "%s tier: the %d commands %d scripts call come from deps.sh %s or minbase"
               % (tier, len(uses), len(files), " ".join(opts) or "(host list)"))
        if tier == "host" and os.path.exists("/usr/bin/python3"):
            imports = py_imports(top)
            where = module_files(imports)
            own = owners({x for p in where.values() if p for x in candidates(p)})
            pbad = []
            for mod, p in sorted(where.items()):
                if p == "":
                    continue
                pkg = next((own[x] for x in candidates(p) if x in own), None) if p else None
                if p is None:
                    pbad.append("python module %s (imported at %s) is not installed here: "
                                "no package provides it" % (mod, ", ".join(imports[mod][:3])))
                elif pkg is None:
                    pbad.append("python module %s (%s) comes from no Debian package: "
                                "/usr/bin/python3 on a fresh machine will not have it" % (mod, p))
                elif pkg not in allowed:
                    pbad.append("python module %s (package %s) imported at %s: add %s to "
                                "scripts/deps.sh's list" % (mod, pkg, ", ".join(imports[mod][:3]), pkg))
            result(not pbad, "host tier: the %d modules the tree's Python imports come from "
                   "deps.sh's packages or minbase" % len(where))
            for b in pbad:
                print("#   missing: %s" % b)
        for b in bad:
            print("#   missing: %s" % b)
    print("1..%d" % tests)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
