#!/usr/bin/env python3
"""Fails when the modules of a crate use each other in a circle.

A module is a file. An edge runs from a module to each module whose items it names through a
`crate::`, `self::` or `super::` path, or through `use child::` of a child it declares. A
child's use of its ancestors' items does not count: a parent's shared types are what its
children are made of. Comments and everything after a file's first `#[cfg(test)]` are skipped,
and so are separate `tests.rs` files. Usage: import-cycles.py SRC_DIR...
"""
import os
import re
import sys


def modules(src):
    """Module path (a tuple of names) -> file, for the crate rooted at src (lib.rs or main.rs)."""
    mods = {}
    for root, dirs, files in os.walk(src):
        # other crates' roots: src/bin, and folders with a main.rs or lib.rs of their own
        dirs[:] = [
            d for d in dirs
            if not (root == src and d == 'bin')
            and not any(os.path.exists(os.path.join(root, d, r)) for r in ('main.rs', 'lib.rs'))
        ]
        for f in files:
            if not f.endswith('.rs'):
                continue
            path = os.path.relpath(os.path.join(root, f), src)[:-3].split(os.sep)
            if path[-1] == 'mod':
                path = path[:-1]
            if path in (['lib'], ['main']):
                path = []
            if path and path[-1] == 'tests':
                continue
            mods[tuple(path)] = os.path.join(root, f)
    return mods


def resolve(mods, path):
    """The longest prefix of path that is a module."""
    for n in range(len(path), -1, -1):
        if tuple(path[:n]) in mods:
            return tuple(path[:n])
    return None


def edges(mods):
    out = {}
    for m, file in mods.items():
        text = open(file).read()
        text = text.split('#[cfg(test)]')[0]
        text = '\n'.join(l for l in text.split('\n') if not l.lstrip().startswith('//'))
        targets = set()
        for ref in re.findall(r'\b((?:crate|super|self)(?:::[A-Za-z_][A-Za-z0-9_]*)+)', text):
            parts = ref.split('::')
            base = [] if parts[0] == 'crate' else list(m)
            while parts[0] == 'super':
                base, parts = base[:-1], parts[1:]
            if parts[0] in ('crate', 'self'):
                parts = parts[1:]
            t = resolve(mods, base + parts)
            if t is not None and t != m and m[:len(t)] != t:
                targets.add(t)
        for child in re.findall(r'(?m)^\s*(?:pub(?:\([a-z]+\))?\s+)?mod\s+(\w+)\s*;', text):
            uses = r'(?m)^\s*(?:pub(?:\([a-z]+\))?\s+)?use\s+' + child + r'::'
            if m + (child,) in mods and re.search(uses, text):
                targets.add(m + (child,))
        out[m] = targets
    return out


def cycles(graph):
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
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
                found.append(comp)

    for v in graph:
        if v not in index:
            visit(v)
    return found


def main(srcs):
    bad = 0
    for src in srcs:
        mods = modules(src)
        for comp in cycles(edges(mods)):
            bad += 1
            names = sorted('::'.join(m) or 'crate' for m in comp)
            print(f'{src}: modules that use each other in a circle: {", ".join(names)}')
        print(f'{src}: {len(mods)} modules')
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
