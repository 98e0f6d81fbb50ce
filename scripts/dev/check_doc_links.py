#!/usr/bin/env python3
"""Checks the relative links of the repository's Markdown files: every `[text](target)` whose target is not a URL
must name a file or folder that exists (relative to the linking file), and a `#anchor` on a Markdown target must be
one of that file's headings, spelled as GitHub spells heading anchors.

Why: the docs cross-reference each other by file and section (the design documents point into their history files,
the README into docs/), and a moved section or renamed file breaks such a link silently.

Usage: scripts/dev/check_doc_links.py [ROOT]   (default: the repository root; checks README.md and docs/*.md)
Exit status 0 when every link resolves, 1 otherwise (each broken link printed as FILE:LINE: target: reason).
"""
import pathlib
import re
import sys

LINK = re.compile(r"\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def github_anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, inline code marks dropped, every character that is not a letter,
    digit, space, hyphen or underscore removed, spaces turned into hyphens."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def lines_outside_fences(path: pathlib.Path):
    """(line number, line) of every line that is not inside a fenced code block (nor a fence itself)."""
    in_fence = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence:
            yield number, line


def anchors_of(path: pathlib.Path) -> set:
    seen = {}
    anchors = set()
    for _, line in lines_outside_fences(path):
        m = HEADING.match(line)
        if not m:
            continue
        base = github_anchor(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        anchors.add(base if n == 0 else f"{base}-{n}")  # repeated headings get -1, -2, ...
    return anchors


def links_of(path: pathlib.Path):
    for number, line in lines_outside_fences(path):
        line = re.sub(r"`[^`]*`", "", line)  # links inside inline code are examples, not links
        for m in LINK.finditer(line):
            yield number, m.group(1)


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[2])
    files = [root / "README.md"] + sorted((root / "docs").glob("*.md"))
    cache = {}
    broken = 0
    checked = 0
    for md in files:
        for number, target in links_of(md):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:, ...
                continue
            checked += 1
            file_part, _, anchor = target.partition("#")
            dest = md if file_part == "" else (md.parent / file_part)
            where = f"{md.relative_to(root)}:{number}: {target}"
            if not dest.exists():
                print(f"{where}: no such file", file=sys.stderr)
                broken += 1
                continue
            if anchor and dest.suffix == ".md":
                if dest not in cache:
                    cache[dest] = anchors_of(dest)
                if anchor not in cache[dest]:
                    print(f"{where}: no heading with this anchor in {dest.relative_to(root)}", file=sys.stderr)
                    broken += 1
    print(f"{checked} relative links in {len(files)} files, {broken} broken")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
