#!/usr/bin/env python3
"""Reports import circles among a crate's modules: module A uses B and B uses A, directly or
through a chain. A circle means neither side can be read, tested or changed without the other,
and every new feature tends to widen it.

    scripts/module-cycles.py [CRATE-SRC-DIR ...]      (default: crates/server/src)

A module is a file reached from lib.rs or main.rs through `mod` declarations. A module uses
another when its code names a path into it: `crate::a::b`, `super::x`, `self::x`, or a child
module's name. Re-exports are followed to the module that defines the item, since that is what
the code depends on. `mod` declarations themselves are not uses (a parent always declares its
children), nor are comments, strings, or `#[cfg(test)]` items (tests may reach across modules).

Prints each circle (a strongly connected component of the module graph) with the uses that
close it, file:line. Exits 1 if any directory has a circle.
"""

import os
import re
import sys

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
USE = re.compile(r"\buse\s+([^;]*);")
MOD = re.compile(rf"\bmod\s+({IDENT})\s*;")
# A path of at least two segments, not itself the tail of a longer path.
PATH = re.compile(rf"(?<![A-Za-z0-9_:])(?:r#)?({IDENT}(?:\s*::\s*{IDENT})+)")
CFG_TEST = re.compile(r"#\s*\[\s*cfg\s*\(\s*test\s*\)\s*\]")
ATTRIBUTE = re.compile(r"\s*#\s*\[")


def blank(text, start, end):
    """`text[start:end]` replaced by spaces, newlines kept so that line numbers hold."""
    return text[:start] + re.sub(r"[^\n]", " ", text[start:end]) + text[end:]


def strip_comments_and_literals(text):
    """The code with comments and string and character literals blanked out."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
        elif (m := re.match(r'b?r(#*)"', text[i:])) and (i == 0 or not re.match(r"\w", text[i - 1])):
            close = '"' + m.group(1)
            j = text.find(close, i + m.end())
            j = n if j < 0 else j + len(close)
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j += 1
        elif c == "'" and (m := re.match(r"'(?:\\(?:u\{[0-9a-fA-F]+\}|x[0-9a-fA-F]{2}|.)|[^\\'])'", text[i:])):
            j = i + m.end()
        else:
            out.append(c)
            i += 1
            continue
        out.append(re.sub(r"[^\n]", " ", text[i:j]))
        i = j
    return "".join(out)


def strip_test_items(code):
    """The code with every `#[cfg(test)]` item blanked out (`mod tests { .. }`, `mod tests;`)."""
    while m := CFG_TEST.search(code):
        j = m.end()
        while a := ATTRIBUTE.match(code, j):
            j = code.index("]", a.end()) + 1  # attributes after cfg(test): no nested brackets
        semi, brace = code.find(";", j), code.find("{", j)
        if brace < 0 or 0 <= semi < brace:
            end = semi + 1
        else:
            depth, end = 0, brace
            while True:
                depth += {"{": 1, "}": -1}.get(code[end], 0)
                end += 1
                if depth == 0:
                    break
        code = blank(code, m.start(), end)
    return code


def expand_use_tree(tree):
    """`a::{b, c::{self, d as e}}` as flat paths with the names they bind:
    [("a::b", "b"), ("a::c", "c"), ("a::c::d", "e")]."""
    tree = re.sub(r"\s*(::|\{|\}|,)\s*", r"\1", tree.strip())
    tree = re.sub(r"\s+as\s+", " as ", tree)

    def parse(s, prefix):
        items, depth, start = [], 0, 0
        for k, ch in enumerate(s + ","):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == "," and depth == 0:
                part, start = s[start:k], k + 1
                if part.endswith("}"):
                    head, inner = part.split("{", 1)
                    items += parse(inner[:-1], prefix + head)
                elif part:
                    name, _, alias = part.partition(" as ")
                    full = prefix + name
                    if full.endswith("::self"):
                        full = full[: -len("::self")]
                    items.append((full, alias or full.rsplit("::", 1)[-1]))
        return items

    return parse(tree, "")


class Module:
    def __init__(self, path, file, code):
        self.path = path  # tuple of segments; () is the crate root
        self.file = file
        self.code = code
        self.children = set(MOD.findall(code))
        self.aliases = {}  # local name -> absolute path (tuple), from `use`
        self.paths = []  # (segments as written, line)


def name_of(path):
    return "::".join(path) if path else "crate"


def load(src):
    """Every module reachable from the crate root, by path."""
    roots = [f for f in ("lib.rs", "main.rs") if os.path.isfile(os.path.join(src, f))]
    if not roots:
        raise SystemExit(f"{src}: neither lib.rs nor main.rs")
    modules = {}
    pending = [((), os.path.join(src, roots[0]), src)]
    while pending:
        path, file, child_dir = pending.pop()
        with open(file, encoding="utf-8") as f:
            code = strip_test_items(strip_comments_and_literals(f.read()))
        module = modules[path] = Module(path, file, code)
        for child in sorted(module.children):
            for candidate, its_dir in (
                (os.path.join(child_dir, child + ".rs"), os.path.join(child_dir, child)),
                (os.path.join(child_dir, child, "mod.rs"), os.path.join(child_dir, child)),
            ):
                if os.path.isfile(candidate):
                    pending.append((path + (child,), candidate, its_dir))
                    break
            else:
                raise SystemExit(f"{file}: mod {child}: no file found")
    return modules


def absolute(module, segments):
    """A written path as an absolute one, or None if it leads outside the crate."""
    head, rest = segments[0], list(segments[1:])
    if head == "crate":
        return tuple(rest)
    if head == "self":
        return module.path + tuple(rest)
    if head == "super":
        base = module.path[:-1]
        while rest and rest[0] == "super":
            base, rest = base[:-1], rest[1:]
        return base + tuple(rest)
    if head in module.children:
        return module.path + tuple(segments)
    return None


def collect(module):
    """Fills in the module's `use` aliases and the paths its code names."""
    code = module.code
    for m in USE.finditer(code):
        line = code.count("\n", 0, m.start()) + 1
        for full, local in expand_use_tree(m.group(1)):
            segments = full.lstrip(":").split("::")
            if segments[-1] == "*":
                segments = segments[:-1]
            if not segments:
                continue
            module.paths.append((segments, line))
            target = absolute(module, segments)
            if target is not None and local != "*" and local != "_":
                module.aliases[local] = target
        code = blank(code, m.start(), m.end())
    for m in PATH.finditer(code):
        segments = re.sub(r"\s+", "", m.group(1)).split("::")
        module.paths.append((segments, code.count("\n", 0, m.start()) + 1))


def resolve(modules, path, seen=()):
    """The module that defines the item at an absolute path, following re-exports."""
    current = ()
    for k, segment in enumerate(path):
        if current + (segment,) in modules:
            current += (segment,)
            continue
        alias = modules[current].aliases.get(segment)
        if alias is not None and alias not in seen and alias != current + (segment,):
            return resolve(modules, alias + tuple(path[k + 1 :]), seen + (alias,))
        break
    return current


def file_line(where):
    """Sorts `file:line` by file, then line number."""
    file, _, line = where.rpartition(":")
    return file, int(line)


def circles(src):
    """The circles of the crate at `src`: lists of (module names, uses closing them)."""
    modules = load(src)
    for module in modules.values():
        collect(module)
    edges = {path: {} for path in modules}  # from -> {to: [(file, line)]}
    for module in modules.values():
        for segments, line in module.paths:
            target = absolute(module, segments)
            if target is None:
                continue
            to = resolve(modules, target)
            if to != module.path:
                where = f"{os.path.relpath(module.file, src)}:{line}"
                edges[module.path].setdefault(to, []).append(where)

    # Tarjan's strongly connected components.
    index, low, on_stack, stack, found = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in sorted(modules):
        if v not in index:
            visit(v)
    result = []
    for component in sorted(found, key=lambda c: (-len(c), c)):
        inside = set(component)
        uses = [
            (name_of(a), name_of(b), sorted(set(edges[a][b]), key=file_line))
            for a in component
            for b in sorted(edges[a])
            if b in inside
        ]
        result.append(([name_of(p) for p in component], uses))
    return result


def main(args):
    failed = False
    for src in args or ["crates/server/src"]:
        found = circles(src)
        if not found:
            print(f"{src}: no import circle")
            continue
        failed = True
        print(f"{src}: {len(found)} import circle(s)")
        for names, uses in found:
            print(f"  circle of {len(names)} modules: {', '.join(names)}")
            for a, b, where in uses:
                print(f"    {a} -> {b}  ({', '.join(where)})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
