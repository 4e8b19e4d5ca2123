#!/usr/bin/env python3
"""The house check: import arrows between the top-level modules of each crate run one way.

For every crate of the workspace (a folder with Cargo.toml and src/), each source file is a
module; a path `crate::a::...`, a `use crate::{a, b::c}` group or a `super::...` path that
leaves the file's own top-level module draws an arrow between two top-level modules. A child
module using its parent's items is normal Rust and draws none. Test code (from the first
`#[cfg(test)]` on) and binaries (src/bin/) are left out: they may use anything.

Prints every cycle (a strongly connected set of top-level modules) and exits 1 if there is
one. With --sizes it also lists non-test files over 1000 lines and functions over 120 lines
(outside tests), and with --strict those fail the check too. With --graph it prints each
top-level module's arrows (what ARCHITECTURE.md's code map describes).

Usage: check-house.py [ROOT] [--sizes] [--strict] [--graph]
"""
import os
import re
import sys

MAX_FILE_LINES = 1000
MAX_FN_LINES = 120


def crates(root):
    for d in sorted(os.listdir(root)):
        if os.path.isfile(os.path.join(root, d, "Cargo.toml")) and os.path.isdir(
            os.path.join(root, d, "src")
        ):
            yield d


def module_of(src, path):
    """The module path of a source file: src/a/b.rs and src/a/b/mod.rs are ("a", "b")."""
    parts = os.path.relpath(path, src)[: -len(".rs")].split(os.sep)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return tuple(parts)


def non_test(text):
    cut = text.find("#[cfg(test)]")
    return text if cut < 0 else text[:cut]


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def longest_known(modules, path):
    """The longest prefix of `path` that names a module of the crate (items are not files)."""
    path = list(path)
    while path:
        if tuple(path) in modules:
            return tuple(path)
        path.pop()
    return None


def arrows(modules, me, code):
    """Top-level modules that module `me` (whose code is `code`) uses, besides its own."""
    used = []
    for p in re.findall(r"\bcrate::((?:\w+::)*\w+)", code):
        used.append(p.split("::"))
    for group in re.findall(r"\buse\s+crate::\{([^;]*)\}\s*;", code, flags=re.S):
        for item in re.split(r"[,{}]", group):
            item = item.strip()
            if item and re.match(r"\w", item):
                used.append(item.split("::"))
    # `super::` names the parent of the file's module (for a/mod.rs, whose module is the
    # folder `a`, that is the crate root).
    base = list(me[:-1])
    for p in re.findall(r"\bsuper::((?:\w+::)*\w+)", code):
        used.append(base + p.split("::"))
    out = set()
    for p in used:
        m = longest_known(modules, p)
        if m and m[:1] != me[:1]:
            out.add(m[0])
    return out


def cycles(graph):
    """Strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
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
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def long_functions(path, text):
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if not re.match(r"\s*(pub(\([^)]*\))?\s+)?(const\s+)?(unsafe\s+)?fn\s+\w+", line):
            continue
        depth, opened = 0, False
        for j in range(i, len(lines)):
            depth += lines[j].count("{") - lines[j].count("}")
            opened = opened or "{" in lines[j]
            if not opened and lines[j].rstrip().endswith(";"):
                break
            if opened and depth <= 0:
                if j - i + 1 > MAX_FN_LINES:
                    yield j - i + 1, line.strip()[:70]
                break


def main(argv):
    root = "."
    sizes = "--sizes" in argv or "--strict" in argv
    strict = "--strict" in argv
    graph_out = "--graph" in argv
    for a in argv:
        if not a.startswith("--"):
            root = a
    found_cycles, oversized = 0, 0
    for crate in crates(root):
        src = os.path.join(root, crate, "src")
        files = {}
        for dirpath, _, names in os.walk(src):
            if os.path.relpath(dirpath, src).split(os.sep)[0] == "bin":
                continue
            for n in names:
                if n.endswith(".rs"):
                    p = os.path.join(dirpath, n)
                    files[module_of(src, p)] = p
        graph = {m[0]: set() for m in files if m}
        for m, p in files.items():
            with open(p, encoding="utf-8", errors="replace") as f:
                text = non_test(f.read())
            if m:
                graph[m[0]] |= arrows(files, m, strip_comments(text))
            if sizes:
                n = text.count("\n")
                if n > MAX_FILE_LINES:
                    oversized += 1
                    print(f"over {MAX_FILE_LINES} lines: {os.path.relpath(p, root)} {n}")
                for length, head in long_functions(p, text):
                    oversized += 1
                    print(f"fn over {MAX_FN_LINES} lines: {os.path.relpath(p, root)} {length} {head}")
        if graph_out:
            for m in sorted(graph):
                if graph[m]:
                    print(f"{crate}: {m} -> {' '.join(sorted(graph[m]))}")
        for c in cycles(graph):
            found_cycles += 1
            edges = ", ".join(
                f"{a} -> {b}" for a in c for b in sorted(graph[a]) if b in c
            )
            print(f"cycle in {crate}: {' '.join(c)}  ({edges})")
    print(f"house: {found_cycles} import cycles" + (f", {oversized} oversized" if sizes else ""))
    if found_cycles or (strict and oversized):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
