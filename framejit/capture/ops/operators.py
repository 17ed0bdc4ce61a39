"""Arithmetic, comparison, identity, membership and unary operators.

The semantics (``is`` decided only when the guards make it stable, ``==`` through ``__eq__``,
``in`` item by item) live in ``values/pyops.py``; these handlers only move the stack.
"""

from __future__ import annotations

import operator

from ..interpreter import handler
from ..values.constants import const
from ..values.pyops import binary, contains, is_same

_BINARY = {
    "ADD": operator.add, "SUBTRACT": operator.sub, "MULTIPLY": operator.mul,
    "TRUE_DIVIDE": operator.truediv, "FLOOR_DIVIDE": operator.floordiv, "REMAINDER": operator.mod,
    "POWER": operator.pow, "MATRIX_MULTIPLY": operator.matmul, "LSHIFT": operator.lshift,
    "RSHIFT": operator.rshift, "AND": operator.and_, "OR": operator.or_, "XOR": operator.xor,
    "INPLACE_ADD": operator.iadd, "INPLACE_SUBTRACT": operator.isub, "INPLACE_MULTIPLY": operator.imul,
    "INPLACE_TRUE_DIVIDE": operator.itruediv, "INPLACE_FLOOR_DIVIDE": operator.ifloordiv,
    "INPLACE_REMAINDER": operator.imod, "INPLACE_POWER": operator.ipow,
    "INPLACE_MATRIX_MULTIPLY": operator.imatmul, "INPLACE_LSHIFT": operator.ilshift,
    "INPLACE_RSHIFT": operator.irshift, "INPLACE_AND": operator.iand, "INPLACE_OR": operator.ior,
    "INPLACE_XOR": operator.ixor,
}
_COMPARE = {"LT": operator.lt, "LE": operator.le, "EQ": operator.eq, "NE": operator.ne,
            "GT": operator.gt, "GE": operator.ge}


@handler("BINARY_OP")
def binary_op(tx, inst):
    b = tx.pop()
    a = tx.pop()
    tx.push(binary(tx, _BINARY[inst.arg.name], a, b))


@handler("COMPARE_OP")
def compare_op(tx, inst):
    b = tx.pop()
    a = tx.pop()
    name = inst.arg.name.replace("_CAST", "")
    tx.push(binary(tx, _COMPARE[name], a, b))


@handler("IS_OP")
def is_op(tx, inst):
    b = tx.pop()
    a = tx.pop()
    tx.push(const(is_same(a, b, tx) != bool(inst.arg)))


@handler("CONTAINS_OP")
def contains_op(tx, inst):
    container = tx.pop()
    item = tx.pop()
    tx.push(const(contains(tx, container, item) != bool(inst.arg)))


@handler("UNARY_NOT")
def unary_not(tx, inst):
    tx.push(const(not tx.pop().truthy(tx)))


@handler("UNARY_NEGATIVE")
def unary_negative(tx, inst):
    tx.push(tx.apply_operator(operator.neg, [tx.pop()]))


@handler("UNARY_POSITIVE")
def unary_positive(tx, inst):
    tx.push(tx.apply_operator(operator.pos, [tx.pop()]))


@handler("UNARY_INVERT")
def unary_invert(tx, inst):
    tx.push(tx.apply_operator(operator.invert, [tx.pop()]))
