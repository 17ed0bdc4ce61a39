"""Numbers read from outside the frame whose value is guarded only when capture needs it.

``self.step += 1`` reads an int, adds one and writes it back: nothing in the graph or the
control flow depends on its value, so specialising on it would recompile on every call. An int
or float from a source is therefore guarded on its type at first; ``+ - * / // % **`` with other
numbers build a runtime expression (``(self.step + 1)``) that the entry function evaluates when
the side effect is replayed or the value returned. Anything that needs the actual value (an
``if``, a graph operation, a shape, a format) reads ``.value``, which adds the equality guard
then, as for any constant.

A number a resume function receives (``.item()`` or ``.tolist()`` computed natively at a graph
break) goes further: where tensor arithmetic uses it, it is a graph input (a Python number the
graph takes as an argument), and compared with a constant (``if v > 0``) it is guarded on the
comparison's outcome, so one version serves every value on the same side.
"""

from __future__ import annotations

import operator

from ..guards import EqualsGuard
from ..sources import Source
from .base import Value
from .constants import ConstantValue

_SYMBOLS = {
    operator.add: "+", operator.iadd: "+", operator.sub: "-", operator.isub: "-",
    operator.mul: "*", operator.imul: "*", operator.truediv: "/", operator.itruediv: "/",
    operator.floordiv: "//", operator.ifloordiv: "//", operator.mod: "%", operator.imod: "%",
    operator.pow: "**", operator.ipow: "**",
}
_NUMBER_TYPES = (int, float)
_UNARY = {operator.neg, operator.pos, abs, int, float, round}


class DeferredNumber(ConstantValue):
    __slots__ = ("_raw", "_realize", "_expr", "carried", "node", "_parts")

    def __init__(self, raw, source=None, realize=None, expr=None, carried=False, parts=None):
        Value.__init__(self, source)
        self._raw = raw
        self._realize = realize  # adds the guards that fix this value; None once added
        self._expr = expr        # cg -> runtime expression, for computed numbers
        #: A number a resume function receives (computed natively at a graph break, such as
        #: ``.item()``): a graph input where tensor arithmetic uses it, and compared with a
        #: constant, guarded on the comparison's outcome only.
        self.carried = carried
        self.node = None         # its graph node, once it is a graph operand
        self._parts = parts      # (fn, *operands) for a number computed from carried ones

    @property
    def value(self):
        realize = self._realize
        if realize is not None:
            self._realize = None
            realize()
        return self._raw

    @value.setter
    def value(self, v):
        self._raw = v

    def python_type(self):
        return type(self._raw)

    def describe(self):
        return self.source.name() if self.source is not None else "a number"

    def binary_op(self, tx, fn, other, reflected):
        symbol = _SYMBOLS.get(fn)
        if symbol is None:
            return self._compare(tx, fn, other, reflected)
        if isinstance(other, DeferredNumber):
            other_raw = other._raw
        elif type(other) is ConstantValue and type(other.value) in _NUMBER_TYPES:
            other_raw = other.value
        else:
            return None
        a, b = (other, self) if reflected else (self, other)
        raw_a, raw_b = (other_raw, self._raw) if reflected else (self._raw, other_raw)
        try:
            raw = fn(raw_a, raw_b)
        except Exception:
            return None  # let the generic path realise the values and report the error
        deps = [v for v in (a, b) if isinstance(v, DeferredNumber)]

        def realize():
            for d in deps:
                d.value  # noqa: B018  (reading the value adds its guards)

        def expr(cg):
            return f"({cg.expr(a)} {symbol} {cg.expr(b)})"

        carried = any(d.carried for d in deps)
        return DeferredNumber(raw, None, realize, expr, carried=carried, parts=(fn, a, b) if carried else None)

    def unary_op(self, tx, fn):
        """``-v``, ``int(v)``, ``abs(v)`` of a carried number: still a graph operand."""
        if fn not in _UNARY or not self.carried or self._realize is None:
            return None
        try:
            raw = fn(self._raw)
        except Exception:
            return None

        def realize():
            self.value  # noqa: B018

        def expr(cg):
            return f"{cg.const_name(fn)}({cg.expr(self)})"

        return DeferredNumber(raw, None, realize, expr, carried=True, parts=(fn, self))

    def _compare(self, tx, fn, other, reflected):
        """``v > 0`` on a carried number: the answer, guarded on the comparison's outcome."""
        op = _COMPARISONS.get(fn)
        from ..sources import LocalSource

        # Only for a frame argument: its type guard then runs before this one (same depth).
        if op is None or not self.carried or self._realize is None \
                or not isinstance(self.source, LocalSource) \
                or not (type(other) is ConstantValue and type(other.value) in _NUMBER_TYPES
                        and abs(other.value) < float("inf")):  # a literal in guard code
            return None
        if reflected:
            op = _REFLECTED[op]
        source = ComparisonSource(self.source, op, other.value)
        answer = fn(other.value, self._raw) if reflected else fn(self._raw, other.value)
        out = tx.output
        return DeferredNumber(answer, source, lambda: out.guards.add(EqualsGuard(source, answer)))

    def reconstruct(self, cg):
        if self._realize is None:
            return cg.literal(self._raw)  # guarded: the value is fixed
        if self._expr is not None:
            return self._expr(cg)
        return cg.source_expr(self.source)


def deferred_number(out, obj, source, carried=False):
    """A number from ``source``: type guard now, equality guard when its value is used."""
    from ..guards import TypeGuard

    out.guards.add(TypeGuard(source, type(obj)))
    return DeferredNumber(obj, source, lambda: out.guards.add(EqualsGuard(source, obj)), carried=carried)


def is_carried(tx, source) -> bool:
    """``source`` is an argument of a resume function being captured as the top frame, or an
    item of one: a value the frame before the break computed, possibly natively (``.item()``,
    ``.tolist()``)."""
    from ..resume import origin
    from ..sources import ItemSource, LocalSource

    while isinstance(source, ItemSource):
        source = source.base
    code = tx.code
    return tx.parent is None and isinstance(source, LocalSource) and origin(code, 0)[0] is not code


# -- carried numbers as graph inputs ---------------------------------------------------------------

_ARITHMETIC = {
    operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv, operator.mod,
    operator.pow, operator.iadd, operator.isub, operator.imul, operator.itruediv,
    operator.ifloordiv, operator.imod, operator.ipow, operator.lt, operator.le, operator.gt,
    operator.ge, operator.eq, operator.ne,
}
_ARITHMETIC_METHODS = {
    "add", "sub", "mul", "div", "true_divide", "floor_divide", "pow", "remainder", "fmod",
    "add_", "sub_", "mul_", "div_", "pow_", "__add__", "__radd__", "__sub__", "__rsub__",
    "__mul__", "__rmul__", "__truediv__", "__rtruediv__", "__pow__", "__rpow__",
}


def _arithmetic(kind: str, target) -> bool:
    import torch
    if kind == "call_method":
        return target in _ARITHMETIC_METHODS
    if target in _ARITHMETIC:
        return True
    return target in (torch.add, torch.sub, torch.mul, torch.div, torch.true_divide, torch.pow,
                      torch.rsub, torch.remainder, torch.fmod, torch.floor_divide)


class NumberInputValue(Value):
    """A carried number as a tensor operation's operand: its graph placeholder. The operation's
    example runs with the number's value now (a number's value does not change the result's
    shape or dtype in these operations, only its type does, which is guarded)."""

    __slots__ = ("node", "example")

    def __init__(self, node, example):
        super().__init__(None)
        self.node = node
        self.example = example

    @property
    def device(self):
        return None


def as_graph_inputs(tx, kind: str, target, args: list, kwargs: dict):
    """``args``/``kwargs`` of a tensor operation with each carried number not yet fixed by a
    guard turned into a graph input, for arithmetic only (elsewhere, a shape or a size, the
    value matters and is guarded as usual)."""
    def convert(v):
        if isinstance(v, DeferredNumber) and v.carried and v._realize is not None:
            return NumberInputValue(_graph_node(tx, v), v._raw)
        return v

    if not any(isinstance(v, DeferredNumber) and v.carried for v in (*args, *kwargs.values())) \
            or not _arithmetic(kind, target):
        return args, kwargs
    return [convert(v) for v in args], {k: convert(v) for k, v in kwargs.items()}


def _graph_node(tx, number: DeferredNumber):
    """The number in the graph: a placeholder for a received one, the same arithmetic on
    Python numbers for one computed from them (``s / 2``)."""
    if number.node is not None:
        return number.node
    if number._parts is None:
        return _placeholder(tx, number)
    fn, *parts = number._parts
    operands = tuple(_graph_node(tx, v) if isinstance(v, DeferredNumber) and v.carried else v.value
                     for v in parts)
    node = tx.output.graph.call_function(fn, operands)
    node.meta["val"] = number._raw
    number.node = node
    return node


def _placeholder(tx, number: DeferredNumber):
    out = tx.output
    graph = out.graph
    from ..output import _identifier
    name = _identifier(number.source.name())
    anchor = next((n for n in graph.nodes if n.op != "placeholder"), None)
    if anchor is not None:
        with graph.inserting_before(anchor):
            node = graph.placeholder(name)
    else:
        node = graph.placeholder(name)
    node.meta["val"] = number._raw
    node.meta["source"] = number.source.name()
    out.inputs.append((number.source, number._raw, node))
    number.node = node
    return node


# -- the outcome of a comparison as a guard ----------------------------------------------------------

_COMPARISONS = {operator.lt: "<", operator.le: "<=", operator.gt: ">", operator.ge: ">=",
                operator.eq: "==", operator.ne: "!="}
_REFLECTED = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "==", "!=": "!="}


class ComparisonSource(Source):
    """``number <op> constant`` for a number the frame receives (``___stack0 > 0``): guarding
    this instead of the number reuses a graph for every number on the same side."""

    __slots__ = ("operand", "op", "other")

    def __init__(self, operand: Source, op: str, other):
        self.operand = operand
        self.op = op
        self.other = other
        self.key = ("cmp", operand.key, op, other)

    def expr(self, names):
        return f"({self.operand.expr(names)} {self.op} {self.other!r})"

    def name(self):
        return f"{self.operand.name()} {self.op} {self.other!r}"
