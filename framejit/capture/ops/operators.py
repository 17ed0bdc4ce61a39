"""Arithmetic, comparison, identity, membership and unary operators."""

from __future__ import annotations

import operator

from ...errors import Unsupported
from ..interpreter import handler
from ..values.base import ConstantValue, const
from ..values.containers import DictValue, SequenceValue
from ..values.tensor import TensorValue

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
    fn = _BINARY[inst.arg.name]
    tx.push(tx.apply_operator(fn, [a, b]))


@handler("COMPARE_OP")
def compare_op(tx, inst):
    b = tx.pop()
    a = tx.pop()
    name = inst.arg.name.replace("_CAST", "")
    fn = _COMPARE[name]
    if fn in (operator.eq, operator.ne) and not isinstance(a, TensorValue) and not isinstance(b, TensorValue):
        same = _identity(a, b)
        if same is not None and not (a.is_constant() and b.is_constant()):
            tx.push(const(same if fn is operator.eq else not same))
            return
    tx.push(tx.apply_operator(fn, [a, b]))


def _real(v):
    for attr in ("module", "obj", "fn", "cls"):
        if hasattr(v, attr) and type(v).__name__ != "MethodValue":
            return getattr(v, attr)
    if isinstance(v, ConstantValue):
        return v.value
    raise KeyError


def _identity(a, b) -> bool | None:
    """``a is b`` when it is known at capture time, else None."""
    if a is b:
        return True
    if isinstance(a, TensorValue) and isinstance(b, TensorValue):
        if a.node is b.node:
            return True
        if a.source is not None and b.source is not None:
            return None  # two inputs may be the same tensor: not decidable without a guard
        return False
    if isinstance(a, TensorValue) or isinstance(b, TensorValue):
        return False  # a tensor is never a constant, module or container
    try:
        return _real(a) is _real(b)
    except KeyError:
        return None


@handler("IS_OP")
def is_op(tx, inst):
    b = tx.pop()
    a = tx.pop()
    same = _identity(a, b)
    if same is None:
        raise Unsupported(f"`is` between {a.describe()} and {b.describe()}")
    tx.push(const(same != bool(inst.arg)))


@handler("CONTAINS_OP")
def contains_op(tx, inst):
    container = tx.pop()
    item = tx.pop()
    if isinstance(container, DictValue):
        found = container.contains(item)
    elif isinstance(container, ConstantValue) and item.is_constant():
        found = item.as_constant() in container.value
    elif isinstance(container, SequenceValue) and item.is_constant():
        v = item.as_constant()
        found = False
        for x in container.items:
            if not x.is_constant():
                raise Unsupported(f"`in` over {container.describe()}, which holds values that are not constants")
            if x.as_constant() == v:
                found = True
                break
    else:
        raise Unsupported(f"`in` between {item.describe()} and {container.describe()}")
    tx.push(const(found != bool(inst.arg)))


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


__all__ = ["Unsupported"]
