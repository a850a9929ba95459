#!/usr/bin/env python3
"""Checks the book's internal links: every relative link from a page (and from README.md into
the book) names a file that exists, a page that SUMMARY.md lists, and an #anchor that a heading
of that page produces, with mdbook's heading ids. mdbook itself checks none of this.

    scripts/check-book-links.py [docs/src [BUILT-HTML-DIR]]

With the built book's directory, the heading ids computed here are also checked against the
ids mdbook wrote into each page, so a change in mdbook's id scheme cannot go unnoticed.

Pages are read as mdbook renders them: `{{#include FILE}}` and `{{#include FILE:ANCHOR}}` are
expanded first, so the links and headings of included files (ARCHITECTURE.md, ...) count,
resolved from the including page. Exits 1 listing every broken link.
"""

import os
import re
import sys

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
INCLUDE = re.compile(r"\{\{#include\s+([^}\s:]+)(?::([^}\s]+))?\s*\}\}")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def expand(path, seen=()):
    """The page's text with its includes expanded, as mdbook's links preprocessor does."""
    if path in seen:
        raise SystemExit(f"{path}: includes itself")
    text = open(path, encoding="utf-8").read()

    def include(m):
        target = os.path.normpath(os.path.join(os.path.dirname(path), m.group(1)))
        if not os.path.isfile(target):
            return f"\0MISSING-INCLUDE {m.group(1)}\0"
        body = expand(target, seen + (path,))
        anchor = m.group(2)
        if anchor:
            part = re.search(
                rf"ANCHOR:\s*{re.escape(anchor)}\b.*?\n(.*?)\n[^\n]*ANCHOR_END:\s*{re.escape(anchor)}\b",
                body,
                re.S,
            )
            if not part:
                return f"\0MISSING-ANCHOR {m.group(1)}:{anchor}\0"
            body = part.group(1)
        return body

    return INCLUDE.sub(include, text)


def prose_lines(text):
    """(line number, line) outside fenced code blocks, inline code blanked out."""
    fence = None
    for number, line in enumerate(text.split("\n"), 1):
        stripped = line.lstrip()
        marker = re.match(r"(`{3,}|~{3,})", stripped)
        if marker:
            if fence is None:
                fence = marker.group(1)[0] * len(marker.group(1))
                continue
            if stripped.startswith(fence):
                fence = None
                continue
        if fence is None:
            yield number, re.sub(r"(`+)(.+?)\1", lambda m: " " * len(m.group(0)), line)


def heading_ids(text):
    """The ids mdbook gives the page's headings: alphanumerics, `_` and `-` kept and
    lowercased, whitespace to `-`, the rest dropped; repeats get `-1`, `-2`, ..."""
    ids, counts = set(), {}
    fence = None
    for line in text.split("\n"):
        stripped = line.lstrip()
        marker = re.match(r"(`{3,}|~{3,})", stripped)
        if marker:
            if fence is None:
                fence = marker.group(1)[0] * len(marker.group(1))
            elif stripped.startswith(fence):
                fence = None
            continue
        m = HEADING.match(line) if fence is None else None
        if not m:
            continue
        title = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", m.group(2))  # link text only
        title = re.sub(r"<[^>]+>", "", title).replace("`", "").replace("*", "")
        base = "".join(
            ch.lower() if ch.isalnum() or ch in "_-" else "-" if ch.isspace() else ""
            for ch in title
        )
        n = counts.get(base, 0)
        counts[base] = n + 1
        ids.add(base if n == 0 else f"{base}-{n}")
    return ids


def main():
    src = os.path.normpath(sys.argv[1] if len(sys.argv) > 1 else "docs/src")
    html = sys.argv[2] if len(sys.argv) > 2 else None
    summary = os.path.join(src, "SUMMARY.md")
    pages = {
        os.path.normpath(os.path.join(src, target.split("#")[0]))
        for _, line in prose_lines(open(summary, encoding="utf-8").read())
        for target in LINK.findall(line)
    }
    texts, ids = {}, {}

    def page_ids(path):
        if path not in ids:
            texts[path] = expand(path)
            ids[path] = heading_ids(texts[path])
        return ids[path]

    errors = []
    for page in sorted(pages):
        if not os.path.isfile(page):
            errors.append(f"{summary}: lists {os.path.relpath(page, src)}, which does not exist")
    sources = [os.path.join(d, f) for d, _, fs in os.walk(src) for f in fs if f.endswith(".md")]
    readme = os.path.join(os.path.dirname(os.path.dirname(src)), "README.md")
    if os.path.isfile(readme):
        sources.append(readme)
    for source in sorted(sources):
        page_ids(source)
        in_book = os.path.commonpath([os.path.abspath(source), os.path.abspath(src)]) == os.path.abspath(src)
        for number, line in prose_lines(texts[source]):
            for marker in re.findall(r"\0(MISSING-[A-Z]+ [^\0]*)\0", line):
                errors.append(f"{source}:{number}: {marker.lower().replace('-', ' ', 1)}")
            targets = LINK.findall(line)
            reference = REFERENCE.match(line)
            if reference:
                targets.append(reference.group(1))
            for target in targets:
                if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
                    continue  # http:, https:, mailto:
                path, _, anchor = target.partition("#")
                where = f"{source}:{number}: {target}"
                resolved = os.path.normpath(os.path.join(os.path.dirname(source), path)) if path else source
                if not os.path.exists(resolved):
                    errors.append(f"{where}: {path} does not exist")
                    continue
                if not resolved.endswith(".md"):
                    if anchor:
                        errors.append(f"{where}: an anchor into a file that is not a page")
                    continue
                inside = os.path.commonpath([os.path.abspath(resolved), os.path.abspath(src)]) == os.path.abspath(src)
                if in_book and not inside:
                    errors.append(f"{where}: leaves the book (the HTML would link nowhere); link the book's page for it")
                    continue
                if inside and resolved not in pages and resolved != summary:
                    errors.append(f"{where}: {os.path.relpath(resolved, src)} is not in SUMMARY.md, so mdbook does not render it")
                    continue
                if anchor and anchor not in page_ids(resolved):
                    errors.append(f"{where}: no heading of {resolved} has the id #{anchor}")
    if html:
        for page in sorted(p for p in pages if os.path.isfile(p)):
            built = os.path.join(html, os.path.relpath(page, src)[: -len(".md")] + ".html")
            if not os.path.isfile(built):
                errors.append(f"{built}: mdbook wrote no page for {page}")
                continue
            written = set(re.findall(r'\bid="([^"]+)"', open(built, encoding="utf-8").read()))
            for missing in sorted(page_ids(page) - written):
                errors.append(f"{page}: heading id #{missing} computed here is not in {built}")
    if errors:
        print("broken links in the book:", *errors, sep="\n  ", file=sys.stderr)
        sys.exit(1)
    print(f"book links: {len(sources)} files checked, every internal link resolves")


if __name__ == "__main__":
    main()
