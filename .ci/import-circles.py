#!/usr/bin/env python3
"""Fails when a source file imports a file that imports it back, directly
or around a longer circle.

Every crate of the workspace is read on its own: each file under the
crate's `src/` is a module (`src/a/b.rs` and `src/a/b/mod.rs` are
`crate::a::b`; each binary under `src/bin/` is a crate of its own). An
import is a `use crate::...`, `use super::...` or `use self::...` path
(braces expanded), or such a path written out in the code; it points at
the deepest module file it names. A circle is a strongly connected set of
two or more files. A module's use of its own submodules is not an
import (it declares them); a submodule's use of what its parent holds
is. Test-only code is skipped: `tests.rs` files and everything after a
`#[cfg(test)]` line.

Usage: .ci/import-circles.py [ROOT]   (default: the repository root)
Prints each circle with the lines that make it; exit 1 if any.
"""
import os
import re
import sys


def crates(root):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in ("target", ".git", "node_modules")]
        if "Cargo.toml" in filenames and os.path.isdir(os.path.join(dirpath, "src")):
            yield dirpath


def module_of(src, path):
    rel = os.path.relpath(path, src)[: -len(".rs")].split(os.sep)
    if rel[-1] == "mod":
        rel = rel[:-1]
    if rel in (["lib"], ["main"]):
        return ()
    # Binaries: src/bin/NAME.rs and src/bin/NAME/main.rs are crates of their own.
    if rel[0] == "bin":
        if rel[-1] == "main":
            rel = rel[:-1]
        return ("bin:" + rel[1],) + tuple(rel[2:])
    return tuple(rel)


def expand(tree):
    """`a::{b, c::{d as e}}` -> [a::b, a::c::d]."""
    tree = re.sub(r"\s+as\s+\w+", "", tree)
    tree = re.sub(r"\s+", "", tree)
    out = []

    def walk(prefix, s):
        depth, start, parts = 0, 0, []
        for i, ch in enumerate(s):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == "," and depth == 0:
                parts.append(s[start:i])
                start = i + 1
        parts.append(s[start:])
        for p in parts:
            if not p:
                continue
            if "{" in p:
                head, rest = p.split("{", 1)
                walk(prefix + head, rest[: rest.rfind("}")])
            else:
                out.append(prefix + p)

    walk("", tree)
    return out


USE = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?use\s+([^;]+);", re.M)
PATH = re.compile(r"(?<![\w:])((?:crate|super|self)(?:::\w+)+)")


def uses(text):
    """(line, path, how) for every import of `text`."""
    cut = re.search(r"^\s*#\[cfg\(test\)\]", text, re.M)
    if cut:
        text = text[: cut.start()]
    # Drop comments and strings' contents so that neither counts; keep
    # the lines where they were.
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r'"(?:\\.|[^"\\])*"', lambda m: "\n" * m.group(0).count("\n"), text)
    for m in USE.finditer(text):
        line = text[: m.start()].count("\n") + 1
        for path in expand(m.group(1)):
            yield line, path, "use"
    rest = USE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    for m in PATH.finditer(rest):
        yield rest[: m.start()].count("\n") + 1, m.group(1), "path"


def resolve(module, path, modules):
    segs = [s for s in path.split("::") if s]
    if not segs:
        return None
    if segs[0] == "crate":
        base = module[:1] if module and module[0].startswith("bin:") else ()
        segs = segs[1:]
    elif segs[0] in ("super", "self"):
        base = module
        while segs and segs[0] in ("super", "self"):
            if segs[0] == "super":
                base = base[:-1]
            segs = segs[1:]
    else:
        return None
    best = None
    for n in range(len(segs) + 1):
        cand = base + tuple(segs[:n])
        if cand in modules:
            best = cand
    return best


def sccs(graph):
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
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

    sys.setrecursionlimit(10000)
    for v in list(graph):
        if v not in index:
            strong(v)
    return out


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    found = 0
    for crate in sorted(crates(root)):
        src = os.path.join(crate, "src")
        files = {}
        for dirpath, _, filenames in os.walk(src):
            for f in filenames:
                if f.endswith(".rs") and f != "tests.rs":
                    p = os.path.join(dirpath, f)
                    files[module_of(src, p)] = p
        graph, why = {}, {}
        for mod, path in files.items():
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
            for line, used, how in uses(text):
                target = resolve(mod, used, files)
                # A module reaches its own descendants by declaring them:
                # that is not an import. A descendant's import of its
                # ancestor (`super::`, `crate::`) is.
                if target is None or target[: len(mod)] == mod:
                    continue
                graph.setdefault(mod, set()).add(target)
                why.setdefault((mod, target), f"{os.path.relpath(path, root)}:{line}: {how} {used}")
        for comp in sccs(graph):
            found += 1
            names = ["::".join(m) or "crate" for m in comp]
            print(f"import circle in {os.path.relpath(crate, root)}: {', '.join(names)}")
            members = set(comp)
            for a in comp:
                for b in sorted(graph.get(a, ())):
                    if b in members:
                        print(f"    {why[(a, b)]}")
    if found:
        print(f"{found} import circle(s): move what both sides need into a module of its own",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
