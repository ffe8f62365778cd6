#!/usr/bin/env python3
"""Checks the README and the docs/ tree (python3, standard library only).

    python3 docs/check.py

Fails, with one line per problem, when:

- README.md is longer than 400 lines, or its first fenced code block is
  not exactly the two quick-start commands;
- a relative Markdown link in README.md or docs/**/*.md names a file that
  does not exist (paths relative to the linking file), or an anchor
  (`#anchor` in the same page, `file.md#anchor` in another) that matches
  no heading of the target, by GitHub's slug rules;
- a file under docs/ is not linked from the README's index (the
  "Documentation" section), directly or from docs/benchmarks/README.md or
  docs/decisions/README.md, which that index links.
"""

import os
import re
import sys
import unicodedata
from urllib.parse import unquote

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
DOCS = os.path.join(ROOT, "docs")
MAX_README_LINES = 400
QUICK_START = ["dpu-service/run-dev.sh", "tests/run.sh"]
INDEX_HEADING = "documentation"
SUB_INDEXES = ["docs/benchmarks/README.md", "docs/decisions/README.md"]

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)[ \t]*#*[ \t]*$")
# [text](target) or [text](target "title"); text may span lines, and may
# hold one level of brackets ([`a[0]`](x)). Images (![alt](src)) too.
LINK = re.compile(
    r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*<?([^)\s>]*)>?(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)"
)
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)

problems = []


def rel(path):
    return os.path.relpath(path, ROOT)


def problem(path, line, msg):
    where = rel(path) + (f":{line}" if line else "")
    problems.append(f"{where}: {msg}")


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def split_fences(text):
    """Yields (line number, line, in_fence) for every line; the fence
    lines themselves count as in the fence."""
    fence = None
    for n, line in enumerate(text.split("\n"), 1):
        m = FENCE.match(line)
        if fence is None:
            if m:
                fence = m.group(1)
                yield n, line, True
                continue
            yield n, line, False
        else:
            yield n, line, True
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not m.group(2).strip():
                fence = None


def slug(heading):
    """GitHub's anchor for a heading's text."""
    text = heading
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML tags
    text = text.strip().lower()
    out = []
    for ch in text:
        if ch == " ":
            out.append("-")
        elif ch in "-_":
            out.append(ch)
        elif unicodedata.category(ch)[0] in "LNM":
            out.append(ch)
        # anything else (punctuation, symbols) is dropped
    return "".join(out)


_anchor_cache = {}


def anchors(path):
    """The anchors of a Markdown file's headings, duplicates numbered."""
    if path not in _anchor_cache:
        seen = {}
        result = set()
        for _, line, in_fence in split_fences(read(path)):
            if in_fence:
                continue
            m = HEADING.match(line)
            if not m:
                continue
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            result.add(base if n == 0 else f"{base}-{n}")
        _anchor_cache[path] = result
    return _anchor_cache[path]


def prose(text):
    """The text with fenced code blocks blanked and code spans emptied,
    line numbers kept."""
    lines = [("" if in_fence else line) for _, line, in_fence in split_fences(text)]
    joined = "\n".join(lines)

    def blank(m):
        return "".join("\n" if c == "\n" else " " for c in m.group(0))

    return CODE_SPAN.sub(blank, joined)


def links(path):
    """(line, target) of every link in a Markdown file, outside code."""
    text = prose(read(path))
    for m in LINK.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        yield line, m.group(2)


def is_external(target):
    return bool(re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target)) or target.startswith("//")


def resolve(path, target):
    """The file a relative link names (None for external links), and its
    anchor."""
    if is_external(target):
        return None, None
    file_part, _, anchor = target.partition("#")
    file_part = unquote(file_part)
    if file_part:
        dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part))
    else:
        dest = path
    return dest, unquote(anchor) if anchor else None


def check_readme():
    if not os.path.isfile(README):
        problem(README, 0, "missing")
        return
    text = read(README)
    n = len(text.splitlines())
    if n > MAX_README_LINES:
        problem(README, 0, f"{n} lines; at most {MAX_README_LINES}")
    block, start = None, None
    for line_no, line, in_fence in split_fences(text):
        if in_fence:
            if block is None:
                block, start = [], line_no
                continue
            if FENCE.match(line) and not FENCE.match(line).group(2).strip():
                break
            block.append(line)
    if block is None:
        problem(README, 0, "no fenced code block; the first must be the quick start")
    elif [l.strip() for l in block if l.strip()] != QUICK_START or len(block) != len(QUICK_START):
        problem(
            README,
            start,
            "the first fenced code block must be exactly "
            + " and ".join(f"`{c}`" for c in QUICK_START)
            + f", one a line; it holds {block!r}",
        )


def markdown_files():
    files = [README]
    for dirpath, dirnames, filenames in os.walk(DOCS):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for f in sorted(filenames):
            if f.endswith(".md"):
                files.append(os.path.join(dirpath, f))
    return files


def check_links():
    for path in markdown_files():
        for line, target in links(path):
            if not target:
                problem(path, line, "empty link")
                continue
            dest, anchor = resolve(path, target)
            if dest is None:
                continue
            if not os.path.exists(dest):
                problem(path, line, f"link to {target}: {rel(dest)} does not exist")
                continue
            if anchor is not None:
                if not dest.endswith(".md") or not os.path.isfile(dest):
                    problem(path, line, f"link to {target}: an anchor into a file that is not Markdown")
                elif anchor not in anchors(dest):
                    problem(
                        path,
                        line,
                        f"link to {target}: no heading of {rel(dest)} has the anchor #{anchor}",
                    )


def index_section(path, heading_slug):
    """The lines of the README section whose heading has this anchor."""
    out, level, inside = [], None, False
    for _, line, in_fence in split_fences(read(path)):
        m = None if in_fence else HEADING.match(line)
        if m:
            if inside and len(m.group(1)) <= level:
                break
            if slug(m.group(2)) == heading_slug:
                inside, level = True, len(m.group(1))
                continue
        if inside:
            out.append(line)
    return "\n".join(out) if inside else None


def linked_files(path, text):
    found = set()
    for m in LINK.finditer(prose(text)):
        dest, _ = resolve(path, m.group(2))
        if dest is not None:
            found.add(dest)
    return found


def check_index():
    if not os.path.isfile(README):
        return
    section = index_section(README, INDEX_HEADING)
    if section is None:
        problem(README, 0, f"no section with the anchor #{INDEX_HEADING} (the index of docs/)")
        return
    reached = linked_files(README, section)
    for sub in SUB_INDEXES:
        sub_path = os.path.join(ROOT, sub)
        if sub_path in reached and os.path.isfile(sub_path):
            reached |= linked_files(sub_path, read(sub_path))
    for dirpath, dirnames, filenames in os.walk(DOCS):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for f in sorted(filenames):
            path = os.path.join(dirpath, f)
            if path not in reached:
                problem(
                    path,
                    0,
                    "not linked from the README's index, nor from "
                    + " or ".join(SUB_INDEXES)
                    + " (linked from that index)",
                )


def main():
    check_readme()
    check_links()
    check_index()
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print(f"docs/check.py: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print(f"docs/check.py: README.md and {len(markdown_files()) - 1} files under docs/ are fine")
    return 0


if __name__ == "__main__":
    sys.exit(main())
