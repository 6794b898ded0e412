#!/usr/bin/env python3
"""layering.py -- the whole tree's layering (issue 25 section 2).

Each folder of Reel's C code says in its README.md which folders it may use
("Uses: a b c"). This check reads those lines and then, from the sources and
from the built objects:

  1. includes: every quoted #include of a file in a folder names a header in
     the same folder or in one the folder may use (no upward arrow);
  2. calls: every symbol an object uses (nm) is defined in the same folder or
     in one it may use;
  3. the folders' allowed graph itself has no cycle;
  4. files: no two files call each other in a circle (the call graph between
     objects, symbol by symbol, has no cycle), and no headers include one
     another in a circle.

Prints every violation, then "layering: N passed, N failed".
Usage: layering.py --build BUILD
       layering.py --self-test   the checker itself, on tiny trees it builds
                                 with cc: it must find an upward include, an
                                 upward call, a circle of calls and a cycle
                                 of Uses: lines, each alone, and nothing on a
                                 clean tree ("layering_self: N passed, N failed")
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
# folders checked, and what a sub-folder belongs to
FOLDERS = ["base", "schema", "net", "catalog", "kernels", "capture_cache", "model", "media", "clients/c",
           "broker", "worker", "ctl"]
SOURCE_EXT = (".c", ".cc", ".h", ".cu", ".cuh")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)

passed = 0
failed = 0
failures = []  # (message, details) of every FAIL, for the self-test
quiet = False  # the self-test's runs print nothing


def ok(msg):
    global passed
    passed += 1
    if not quiet:
        print("PASS " + msg)


def bad(msg, details=()):
    global failed
    failed += 1
    failures.append((msg, list(details)))
    if quiet:
        return
    print("FAIL " + msg)
    for d in details:
        print("  | " + d)


def folder_of(rel):
    """The checked folder a repository-relative path belongs to, or None."""
    for f in sorted(FOLDERS, key=len, reverse=True):
        if rel == f or rel.startswith(f + "/"):
            return f
    return None


def read_uses():
    uses = {}
    for f in FOLDERS:
        path = os.path.join(ROOT, f, "README.md")
        try:
            text = open(path, encoding="utf-8").read()
        except OSError:
            bad("%s/README.md is missing: each folder says what lives there and what it may use" % f)
            continue
        m = re.search(r"^Uses:(.*)$", text, re.M)
        if not m:
            bad("%s/README.md has no 'Uses:' line" % f)
            continue
        names = [w for w in m.group(1).split() if w in FOLDERS]
        unknown = [w for w in m.group(1).split() if w not in FOLDERS and not w.startswith("(")]
        if unknown and not m.group(1).strip().startswith("("):
            bad("%s/README.md names unknown folders: %s" % (f, " ".join(unknown)))
        uses[f] = set(names)
    return uses


def sources():
    out = []
    for f in FOLDERS:
        for dirpath, _dirs, files in os.walk(os.path.join(ROOT, f)):
            for n in files:
                if n.endswith(SOURCE_EXT):
                    out.append(os.path.relpath(os.path.join(dirpath, n), ROOT))
    return sorted(out)


def resolve_include(src, inc):
    """The repository-relative path of a quoted include, or None (a system
    or generated header)."""
    for cand in (os.path.join(os.path.dirname(src), inc), inc):
        p = os.path.normpath(cand)
        if os.path.isfile(os.path.join(ROOT, p)):
            return p
    return None


def find_cycles(edges):
    """Strongly connected components with more than one node (Tarjan,
    iterative)."""
    nodes = set(edges)
    for vs in edges.values():
        nodes |= vs
    index, low, on, stack, comps = {}, {}, set(), [], []
    counter = [0]
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    advanced = True
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    comps.append(sorted(comp))
    return comps


def check_folder_graph(uses):
    edges = {f: set(u) for f, u in uses.items()}
    cyc = find_cycles(edges)
    if cyc:
        bad("the folders' Uses: lines form a cycle", [" <-> ".join(c) for c in cyc])
    else:
        ok("the folders' Uses: lines form layers (no cycle)")
    for f, u in uses.items():
        if f in u:
            bad("%s/README.md lists itself" % f)


def check_includes(uses, srcs):
    up, file_edges = [], {}
    for s in srcs:
        text = open(os.path.join(ROOT, s), encoding="utf-8", errors="replace").read()
        fs = folder_of(s)
        for inc in INCLUDE_RE.findall(text):
            p = resolve_include(s, inc)
            if p is None:
                continue
            ft = folder_of(p)
            if ft is None:
                up.append("%s includes %s, outside the library folders" % (s, p))
                continue
            if ft != fs and ft not in uses.get(fs, set()):
                up.append("%s (%s) includes %s (%s): %s may not use %s" % (s, fs, p, ft, fs, ft))
            if p != s:
                file_edges.setdefault(s, set()).add(p)
    if up:
        bad("every include points down the layers (%d do not)" % len(up), up)
    else:
        ok("every include of %d files points down the layers or within a folder" % len(srcs))
    cyc = find_cycles(file_edges)
    if cyc:
        bad("headers include one another in a circle", [" <-> ".join(c) for c in cyc])
    else:
        ok("no headers include one another in a circle")


def nm_all(objs):
    """{object: (defined symbols, undefined symbols)}, from one nm run per
    200 objects (nm -A names each line's object); an object nm cannot read
    is left out."""
    table = {o: ([], []) for o in objs}
    for i in range(0, len(objs), 200):
        chunk = objs[i:i + 200]
        r = subprocess.run(["nm", "-A"] + chunk, capture_output=True, text=True)
        for line in r.stdout.splitlines():
            obj, _, rest = line.partition(":")
            entry = table.get(obj)
            if entry is None:
                continue
            parts = rest.split()
            if len(parts) == 3 and parts[1] in "TDBRV":
                entry[0].append(parts[2])
            elif len(parts) >= 2 and parts[-2] == "U":
                entry[1].append(parts[-1])
    return table


def check_calls(uses, build):
    objs = []
    for f in FOLDERS:
        for dirpath, _dirs, files in os.walk(os.path.join(build, f)):
            for n in files:
                if n.endswith(".o"):
                    objs.append(os.path.join(dirpath, n))
    if not objs:
        bad("no objects under %s (build first)" % build)
        return
    src_of = {}
    stale = []
    for o in objs:
        rel = os.path.relpath(o, build)
        src = rel[:-len(".cu.o")] if rel.endswith(".cu.o") else rel[:-len(".o")]
        ext = ".cu" if rel.endswith(".cu.o") else ".c"
        if not os.path.isfile(os.path.join(ROOT, src + ext)):
            stale.append(o)  # left in a reused build folder by a file since moved or deleted
            continue
        src_of[o] = src
    objs = [o for o in objs if o in src_of]
    if stale:
        print("  (%d objects whose source is gone were left out: %s)" % (len(stale), " ".join(
            sorted(os.path.relpath(o, build) for o in stale)[:5])))
    syms = nm_all(objs)
    defs = {}
    for o in objs:
        for s in syms[o][0]:
            defs.setdefault(s, []).append(o)
    up, edges = [], {}
    for o in objs:
        so = src_of[o]
        fo = folder_of(so)
        for s in syms[o][1]:
            ds = defs.get(s)
            if not ds:
                continue
            if len(ds) > 1:  # the same name in several programs: the one beside the caller
                near = [d for d in ds if folder_of(src_of[d]) == fo]
                ds = near or ds
            for d in ds:
                sd = src_of[d]
                fd = folder_of(sd)
                if fd != fo and fd not in uses.get(fo, set()):
                    up.append("%s (%s) calls %s in %s (%s)" % (so, fo, s, sd, fd))
                if sd != so:
                    edges.setdefault(so, set()).add(sd)
    if up:
        bad("every call points down the layers (%d do not)" % len(up), sorted(set(up)))
    else:
        ok("every call of %d objects points down the layers or within a folder" % len(objs))
    cyc = find_cycles(edges)
    if cyc:
        bad("files call one another in a circle (%d circles)" % len(cyc), [" <-> ".join(c) for c in cyc])
    else:
        ok("no files call one another in a circle")


def check(build):
    uses = read_uses()
    check_folder_graph(uses)
    srcs = sources()
    check_includes(uses, srcs)
    check_calls(uses, build)


# ---- the self-test: the checker must fail where it should ---------------------

# A tiny tree of two folders, "low" and "high" (high may use low), clean:
# high includes and calls low, low's two files call in one direction.
CLEAN = {
    "low/README.md": "# low\n\nUses: (nothing)\n",
    "high/README.md": "# high\n\nUses: low\n",
    "low/a.h": "int low_a(int x);\n",
    "low/a.c": '#include "a.h"\nint low_a(int x) { return x + 1; }\n',
    "low/b.c": '#include "a.h"\nint low_b(int x) { return low_a(x) * 2; }\n',
    "high/h.h": "int high_h(int x);\n",
    "high/h.c": '#include "high/h.h"\n#include "low/a.h"\nint high_h(int x) { return low_a(x); }\n',
}
# Each fault alone: (what, files added or replaced, the FAIL it must
# raise, a text every detail line of that FAIL must hold between them).
FAULTS = [
    ("an upward include", {"low/up.c": '#include "high/h.h"\nint low_up(void) { return 0; }\n'},
     "every include points down the layers", "low/up.c (low) includes high/h.h (high)"),
    ("an upward call", {"low/up.c": "int high_h(int x);\nint low_up(void) { return high_h(1); }\n"},
     "every call points down the layers", "low/up (low) calls high_h in high/h (high)"),
    ("two files calling each other", {
        "low/x.c": "int low_y(int);\nint low_x(int n) { return n ? low_y(n - 1) : 0; }\n",
        "low/y.c": "int low_x(int);\nint low_y(int n) { return n ? low_x(n - 1) : 1; }\n"},
     "files call one another in a circle", "low/x <-> low/y"),
    ("a cycle of Uses: lines", {"low/README.md": "# low\n\nUses: high\n"},
     "the folders' Uses: lines form a cycle", "high <-> low"),
]


def run_tree(files):
    """Writes files into a fresh tree, compiles its .c files with cc -c
    into TREE/build, runs every check on it quietly; returns the failures
    (None when the tree did not compile)."""
    global ROOT, FOLDERS, passed, failed, failures, quiet
    tree = tempfile.mkdtemp(prefix="reel-layering.")
    saved = (ROOT, FOLDERS, passed, failed, failures, quiet)
    try:
        for rel, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(tree, rel)), exist_ok=True)
            with open(os.path.join(tree, rel), "w", encoding="utf-8") as f:
                f.write(text)
        for rel in files:
            if rel.endswith(".c"):
                obj = os.path.join(tree, "build", rel[:-2] + ".o")
                os.makedirs(os.path.dirname(obj), exist_ok=True)
                r = subprocess.run(["cc", "-c", "-I", tree, "-o", obj, os.path.join(tree, rel)],
                                   capture_output=True, text=True)
                if r.returncode != 0:
                    print("  | cc -c %s: %s" % (rel, r.stderr.strip()))
                    return None
        ROOT, FOLDERS, passed, failed, failures, quiet = tree, ["low", "high"], 0, 0, [], True
        check(os.path.join(tree, "build"))
        return failures
    finally:
        ROOT, FOLDERS, passed, failed, failures, quiet = saved
        shutil.rmtree(tree, ignore_errors=True)


def self_test():
    got = run_tree(CLEAN)
    if got is None:
        bad("the clean tiny tree compiles")
    elif got:
        bad("a clean tiny tree passes every check", ["%s: %s" % (m, "; ".join(d)) for m, d in got])
    else:
        ok("a clean tiny tree passes every check")
    for what, extra, want, detail in FAULTS:
        got = run_tree(dict(CLEAN, **extra))
        if got is None:
            bad("the tiny tree with %s compiles" % what)
            continue
        hits = [(m, d) for m, d in got if m.startswith(want) and detail in " ".join(d)]
        others = [m for m, _d in got if not m.startswith(want)]
        if hits and not others:
            ok("%s is reported, and nothing else (%s: %s)" % (what, want, detail))
        else:
            bad("%s is reported, and nothing else" % what,
                ["wanted: %s: ...%s..." % (want, detail)] +
                (["got: %s: %s" % (m, "; ".join(d)) for m, d in got] or ["got: no failure"]))
    print("layering_self: %d passed, %d failed" % (passed, failed))
    return 0 if failed == 0 else 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    if a.self_test:
        return self_test()
    build = a.build if os.path.isabs(a.build) else os.path.join(ROOT, a.build)
    check(build)
    print("layering: %d passed, %d failed" % (passed, failed))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
