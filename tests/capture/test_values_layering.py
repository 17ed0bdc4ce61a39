"""The value modules import one way: ``base`` (the Value protocol) and ``lookup`` (Python's
attribute lookup rules) import no other value module, so every other can import them at module
level and a new kind of value is added without touching them.

Function-level imports count too: they dodge a cycle at import time but keep the modules one knot.
"""

import ast
import importlib
from pathlib import Path

import pytest

import framejit.capture.values.base as base_module

VALUES = Path(base_module.__file__).parent
LEAVES = ["base.py", "lookup.py"]


def _sibling_imports(path: Path, module_level_only=False) -> list[tuple[int, str]]:
    """``(line, module)`` for each import of another value module in ``path``."""
    siblings = {p.stem for p in VALUES.glob("*.py")}
    tree = ast.parse(path.read_text())
    nodes = tree.body if module_level_only else ast.walk(tree)
    found = []
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            names = [node.module.split(".")[0]] if node.module else [a.name for a in node.names]
            found += [(node.lineno, name) for name in names if name in siblings]
    return found


@pytest.mark.parametrize("leaf", LEAVES)
def test_leaf_modules_import_no_other_value_module(leaf):
    assert _sibling_imports(VALUES / leaf) == [], (
        f"values/{leaf} is imported by every value module, so it must not import them back: move "
        f"the code that needs another value module into that module (or a new one)")


def test_module_level_imports_form_no_cycle():
    # Imports inside functions may close a cycle (builder's wrap knows every kind, and many kinds
    # wrap their results); at module level a cycle would make import order matter.
    graph = {p.stem: {m for _, m in _sibling_imports(p, module_level_only=True)} for p in VALUES.glob("*.py")}
    done, path = set(), []

    def visit(module):
        if module in path:
            raise AssertionError(f"module-level import cycle: {' -> '.join(path[path.index(module):] + [module])}")
        if module in done:
            return
        path.append(module)
        for dep in graph[module]:
            visit(dep)
        path.pop()
        done.add(module)

    for module in graph:
        visit(module)


def test_every_iterable_kind_says_how_it_iterates():
    # Value.make_iterator cannot default to a snapshot iterator (base imports no other module),
    # so a kind that lists its items must also say what iter() of it is.
    for path in VALUES.glob("*.py"):
        importlib.import_module(f"framejit.capture.values.{path.stem}")
    Value = base_module.Value
    todo, kinds = [Value], []
    while todo:
        for sub in todo.pop().__subclasses__():
            kinds.append(sub)
            todo.append(sub)
    missing = [k.__qualname__ for k in kinds
               if k.iterate is not Value.iterate and k.make_iterator is Value.make_iterator]
    assert missing == [], f"these override iterate() but not make_iterator(): {missing}"
