"""The import graph of framejit/capture/values/: who imports whom, at module level and inside
functions, and the cycles (strongly connected components) that makes.

    python tools/values_imports.py [--edges] [CHECKOUT]

CHECKOUT (default: this one) is the repository to read, to compare with another branch.

Function-level imports count as edges too: they dodge the cycle at import time but leave the
modules one knot all the same (a change to one can break the other).
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

_ROOT = next((Path(a) for a in sys.argv[1:] if not a.startswith("-")), Path(__file__).resolve().parent.parent)
PKG = _ROOT / "framejit" / "capture" / "values"


def sibling_imports(path: Path) -> list[tuple[str, bool]]:
    """``(module, at module level?)`` for each import of a sibling value module in ``path``;
    imports under ``if TYPE_CHECKING:`` are for annotations only and not counted."""
    tree = ast.parse(path.read_text())
    typing_only, top = set(), set()
    for node in tree.body:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            typing_only |= {id(sub) for sub in ast.walk(node)}
        top.add(id(node))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or node.level != 1 or id(node) in typing_only:
            continue
        names = [node.module.split(".")[0]] if node.module else [a.name for a in node.names]
        found += [(name, id(node) in top) for name in names if (PKG / f"{name}.py").exists()]
    return found


def graph(module_level_only=False):
    edges = defaultdict(set)
    counts = {"module": 0, "function": 0}
    for path in sorted(PKG.glob("*.py")):
        src = path.stem
        edges.setdefault(src, set())
        for dst, top in sibling_imports(path):
            if module_level_only and not top:
                continue
            counts["module" if top else "function"] += 1
            if dst != src:
                edges[src].add(dst)
    return edges, counts


def sccs(edges):
    """Tarjan's algorithm."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
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
            out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in list(edges):
        if v not in index:
            visit(v)
    return out


def main():
    edges, counts = graph()
    if "--edges" in sys.argv:
        for src in sorted(edges):
            print(f"{src}: {' '.join(sorted(edges[src]))}")
    cycles = [c for c in sccs(edges) if len(c) > 1]
    print(f"modules: {len(edges)}, edges: {sum(map(len, edges.values()))}")
    print(f"imports of sibling modules: {counts['module']} at module level, {counts['function']} inside functions")
    print(f"cycles (SCCs with >1 module): {len(cycles)}, largest: {max(map(len, cycles), default=0)}")
    for c in sorted(cycles, key=len, reverse=True):
        print(f"  {len(c)}: {' '.join(c)}")
    top_cycles = [c for c in sccs(graph(module_level_only=True)[0]) if len(c) > 1]
    print(f"cycles of module-level imports alone: {len(top_cycles)}")
    leaves = sorted(m for m, d in edges.items() if not d)
    print(f"leaves (import no sibling): {' '.join(leaves)}")


if __name__ == "__main__":
    main()
