#!/usr/bin/python3
"""Import circles among the C files of one directory.

    c_circles.py DIR [CFLAGS...]

Each DIR/*.c is compiled alone to an object; nm tells the symbols it defines and those it
uses. File a uses file b when a uses a symbol b defines. Prints each file with the files it
uses, then "circles: none" or each strongly connected set of more than one file, one a line
("circle: a.c b.c ..."). Exit 0 either way; 2 when a file does not compile.
"""
import os
import subprocess
import sys
import tempfile


def graph(d, cflags):
    srcs = sorted(f for f in os.listdir(d) if f.endswith(".c"))
    defs, uses = {}, {}
    with tempfile.TemporaryDirectory(prefix="corral-circles.") as tmp:
        for f in srcs:
            obj = os.path.join(tmp, f + ".o")
            r = subprocess.run(["cc", "-c", "-D_GNU_SOURCE", "-o", obj, os.path.join(d, f)] + cflags)
            if r.returncode != 0:
                sys.exit(2)
            out = subprocess.run(["nm", obj], capture_output=True, text=True, check=True).stdout
            rows = [line.split() for line in out.splitlines()]
            defs[f] = {r[2] for r in rows if len(r) == 3 and r[1] in "TDBR"}
            uses[f] = {r[1] for r in rows if len(r) == 2 and r[0] == "U"}
    owner = {s: f for f in srcs for s in defs[f]}
    return {f: sorted({owner[s] for s in uses[f] if owner.get(s, f) != f}) for f in srcs}


def circles(g):
    """Tarjan's strongly connected components, those of more than one file."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g[v]:
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
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in g:
        if v not in index:
            visit(v)
    return found


g = graph(sys.argv[1], sys.argv[2:])
for f, used in g.items():
    print(f"{f:12} -> {' '.join(used)}")
found = circles(g)
for c in found:
    print("circle: " + " ".join(c))
if not found:
    print("circles: none")
