"""Delta debugging over a program's statement tree: cut pieces out while the failure persists.

One pass walks every statement list (outermost first) and tries, for each statement from the
last to the first: deleting it; replacing a block by its body or by one of its clauses' bodies;
deleting one clause; for a line of several statements, deleting one of them; for a ``return`` of
several values, returning one of them. Each candidate is rendered to source, compiled (to drop
the ones that are no longer valid Python, such as a ``break`` left outside its loop), and run.
Passes repeat until one changes nothing or the budget of runs is spent.
"""

from __future__ import annotations

import ast
from collections.abc import Callable

from .program import Block, Line, Program, bodies


def shrink(program: Program, fails: Callable[[str], bool], budget: int = 400) -> Program:
    """The smallest program found for which ``fails(source)`` still holds."""
    program = program.copy()
    runs = 0

    def accept() -> bool:
        nonlocal runs
        source = program.source()
        try:
            compile(source, "<shrink>", "exec")
        except SyntaxError:
            return False
        runs += 1
        return fails(source)

    changed = True
    while changed and runs < budget:
        changed = False
        for body in list(bodies(program.nodes)):
            i = len(body) - 1
            while i >= 0 and runs < budget and _attached(program, body):
                if i < len(body) and _try_node(body, i, accept):
                    changed = True
                i -= 1
    return program


def _attached(program: Program, body: list) -> bool:
    """Whether ``body`` is still in the tree (an accepted change may have spliced it away)."""
    return any(b is body for b in bodies(program.nodes))


def _try_node(body: list, i: int, accept) -> bool:
    """Tries each simplification of ``body[i]`` in place; keeps the first that still fails."""
    node = body[i]
    if node.keep:
        return False
    for replacement in _replacements(node):
        body[i:i + 1] = replacement
        if accept():
            return True
        body[i:i + len(replacement)] = [node]
    return False


def _replacements(node) -> list[list]:
    options: list[list] = [[]]
    if isinstance(node, Block):
        options.append(node.body)
        options.extend(clause_body for _, clause_body in node.clauses)
        for k in range(len(node.clauses)):
            options.append([Block(node.header, node.body, node.clauses[:k] + node.clauses[k + 1:])])
    elif isinstance(node, Line):
        parts = node.text.split("\n")
        if len(parts) > 1 and not node.text.startswith(("class", "def", "@")):
            options.extend([Line("\n".join(parts[:k] + parts[k + 1:]))] for k in range(len(parts)))
        options.extend([Line(text)] for text in _smaller_returns(node.text))
    return options


def _smaller_returns(text: str) -> list[str]:
    """``return (a, b, c)`` -> ``return a``, ``return b``, ``return c``."""
    if not text.startswith("return "):
        return []
    try:
        value = ast.parse(text).body[0].value
    except (SyntaxError, AttributeError):
        return []
    if isinstance(value, (ast.Tuple, ast.List)):
        items = value.elts
    elif isinstance(value, ast.Dict):
        items = value.values
    else:
        return []
    return [f"return {ast.unparse(item)}" for item in items] if len(items) > 1 else []
