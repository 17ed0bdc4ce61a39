"""Statements as source lines: AST nodes (unparsed by ``ast``) mixed with comments, which
``ast.unparse`` cannot carry, so compound statements are laid out here."""

from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass


@dataclass
class Comment:
    text: str
    eol: bool = False  # at the end of the previous line


class Null:
    """A NULL marker on the value stack (below a callable)."""


NULL = Null()


def name_node(n: str, ctx=None) -> ast.Name:
    return ast.Name(id=n, ctx=ctx or ast.Load())


def assign(target: str, value: ast.expr) -> ast.Assign:
    return ast.Assign(targets=[name_node(target, ast.Store())], value=value, lineno=0)


def names_in(node) -> set:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


class Emitter:
    """Source lines from a list of statements (AST nodes and :class:`Comment`)."""

    def __init__(self):
        self.lines: list[str] = []

    def block(self, stmts: list, indent: str) -> None:
        if not [s for s in stmts if not isinstance(s, Comment)]:
            stmts = [*stmts, ast.Pass()]
        for s in stmts:
            if isinstance(s, Comment):
                if s.eol and self.lines:
                    self.lines[-1] += f"  # {s.text}"
                else:
                    width = max(40, 100 - len(indent) - 2)
                    self.lines.extend(f"{indent}# {line}" for line in textwrap.wrap(s.text, width))
            elif isinstance(s, ast.Try):
                self.lines.append(f"{indent}try:")
                self.block(s.body, indent + "    ")
                for h in s.handlers:
                    head = "except"
                    if h.type is not None:
                        head += f" {ast.unparse(h.type)}"
                    if h.name:
                        head += f" as {h.name}"
                    self.lines.append(f"{indent}{head}:")
                    self.block(h.body, indent + "    ")
                if s.orelse:
                    self.lines.append(f"{indent}else:")
                    self.block(s.orelse, indent + "    ")
                if s.finalbody:
                    self.lines.append(f"{indent}finally:")
                    self.block(s.finalbody, indent + "    ")
            elif isinstance(s, ast.If):
                self.lines.append(f"{indent}if {ast.unparse(s.test)}:")
                self.block(s.body, indent + "    ")
                if s.orelse:
                    self.lines.append(f"{indent}else:")
                    self.block(s.orelse, indent + "    ")
            else:
                for line in ast.unparse(ast.fix_missing_locations(s)).splitlines():
                    self.lines.append(indent + line)
