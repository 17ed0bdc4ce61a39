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


#: A computed number whose expression would be longer than this many operations and operands
#: is computed once into a local of the entry function (EntryCodegen.shared), which the longer
#: expressions name instead. ``n = n + n`` in a loop doubles its expression at each step: inline,
#: 36 steps made a text of 2^36 operands and capture never ended; ``n += 1`` 200 times nested
#: more parentheses than Python's parser takes.
MAX_INLINE = 32


class DeferredNumber(ConstantValue):
    __slots__ = ("_raw", "_realize", "_expr", "carried", "node", "_parts", "_deps", "_size",
                 "_below")

    def __init__(self, raw, source=None, realize=None, expr=None, carried=False, parts=None,
                 deps=()):
        Value.__init__(self, source)
        self._raw = raw
        #: Adds the guards that fix this value (a number read from a source, or a comparison's
        #: outcome); None once added. A computed number's is :func:`_fix_operands`: the
        #: guards of its operands, ``deps``.
        self._realize = realize
        self._expr = expr        # cg -> runtime expression, for computed numbers
        #: A number a resume function receives (computed natively at a graph break, such as
        #: ``.item()``): a graph input where tensor arithmetic uses it, and compared with a
        #: constant, guarded on the comparison's outcome only.
        self.carried = carried
        self.node = None         # its graph node, once it is a graph operand
        self._parts = parts      # (fn, *operands) for a number computed from carried ones
        self._deps = deps        # the DeferredNumber operands of a computed number
        # The operations and operands of its expression inline, counting each operand computed
        # into a local (size > MAX_INLINE) as one; and those operands (see reconstruct).
        self._size = 1 + sum(1 if d._size > MAX_INLINE else d._size for d in deps)
        self._below = tuple({id(b): b for d in deps
                             for b in ((d,) if d._size > MAX_INLINE else d._below)}.values())

    @property
    def value(self):
        if self._realize is not None:
            # Every number it was computed from, without recursion (a loop's `n += 1` may
            # chain thousands): computed ones are fixed once their operands are.
            pending = [self]
            while pending:
                number = pending.pop()
                realize = number._realize
                if realize is None:
                    continue
                number._realize = None
                if realize is _fix_operands:
                    pending.extend(number._deps)
                else:
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
        deps = tuple(v for v in (a, b) if isinstance(v, DeferredNumber))

        def expr(cg):
            return f"({cg.expr(a)} {symbol} {cg.expr(b)})"

        carried = any(d.carried for d in deps)
        return DeferredNumber(raw, None, _fix_operands, expr, carried=carried,
                              parts=(fn, a, b) if carried else None, deps=deps)

    def unary_op(self, tx, fn):
        """``-v``, ``int(v)``, ``abs(v)`` of a carried number: still a graph operand."""
        if fn not in _UNARY or not self.carried or self._realize is None:
            return None
        try:
            raw = fn(self._raw)
        except Exception:
            return None

        def expr(cg):
            return f"{cg.const_name(fn)}({cg.expr(self)})"

        return DeferredNumber(raw, None, _fix_operands, expr, carried=True, parts=(fn, self),
                              deps=(self,))

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
        if self._expr is None:
            return cg.source_expr(self.source)
        if self._size <= MAX_INLINE:
            if self._below:
                _compute_into_locals(cg, self._below)
            return self._expr(cg)
        _compute_into_locals(cg, (self,))
        return cg.shared(self, None)


def _fix_operands():
    """A computed number's ``_realize``: DeferredNumber.value fixes its operands instead."""


def _compute_into_locals(cg, numbers) -> None:
    """Each of ``numbers``, and every number below them that is long too, computed into a local
    of the entry function, operands first: then each expression names its operands' locals."""
    cg.shared_innermost_first([n for n in numbers if n._realize is not None],
                              lambda n: [b for b in n._below if b._realize is not None],
                              lambda n: n._expr(cg))


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
    # Operands first, without recursion (a loop's `s = s + 1` may chain thousands).
    pending = [(number, False)]
    while pending:
        n, ready = pending.pop()
        if n.node is not None:
            continue
        if n._parts is None:
            _placeholder(tx, n)
            continue
        fn, *parts = n._parts
        if not ready:
            pending.append((n, True))
            pending.extend((v, False) for v in reversed(parts) if _in_graph(v))
            continue
        operands = tuple(v.node if _in_graph(v) else v.value for v in parts)
        node = tx.output.graph.call_function(fn, operands)
        node.meta["val"] = n._raw
        n.node = node
    return number.node


def _in_graph(v) -> bool:
    return isinstance(v, DeferredNumber) and v.carried


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
