"""A generated program as a tree of statements, so that the shrinker can delete parts of it and
still render valid, indented Python source.

A module is a list of nodes. A ``Line`` is one simple statement; a ``Block`` is a compound
statement: a header (``if ...:``, ``for ...:``, ``def f(...):``), its body, and optional clauses
(``else:``, ``except ...:``, ``finally:``), each with a body of its own. An empty body renders as
``pass``, so deleting every statement of a body still gives valid source.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field


@dataclass
class Line:
    text: str
    keep: bool = False


@dataclass
class Block:
    header: str
    body: list = field(default_factory=list)
    # (clause header, body): "else:", "except ValueError as e:", "finally:"
    clauses: list = field(default_factory=list)
    # Shrinking keeps some blocks (f itself, make_inputs): their removal can only hide the
    # difference behind a NameError, so trying is wasted time.
    keep: bool = False


@dataclass
class Program:
    nodes: list
    # Where it came from ("seed:index"), for messages; a shrunk program keeps its origin.
    origin: str = ""

    def source(self) -> str:
        out: list[str] = []
        _render(self.nodes, 0, out)
        return "\n".join(out) + "\n"

    def size(self) -> int:
        """Statements in the program (a block counts as one plus its contents)."""
        return _count(self.nodes)

    def copy(self) -> Program:
        return copy.deepcopy(self)


def _render(nodes: list, depth: int, out: list[str]) -> None:
    pad = "    " * depth
    if not nodes:
        out.append(pad + "pass")
        return
    for node in nodes:
        if isinstance(node, Line):
            out.extend(pad + part for part in node.text.split("\n"))
        else:
            out.append(pad + node.header)
            _render(node.body, depth + 1, out)
            for header, body in node.clauses:
                out.append(pad + header)
                _render(body, depth + 1, out)


def _count(nodes: list) -> int:
    total = 0
    for node in nodes:
        total += 1
        if isinstance(node, Block):
            total += _count(node.body) + sum(_count(body) for _, body in node.clauses)
    return total


def bodies(nodes: list):
    """Every statement list in the tree (the top level, each block's body and each clause's body),
    outermost first, so that the shrinker tries to remove big pieces before small ones."""
    yield nodes
    for node in nodes:
        if isinstance(node, Block):
            yield from bodies(node.body)
            for _, body in node.clauses:
                yield from bodies(body)
