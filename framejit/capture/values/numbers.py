"""Numbers read from outside the frame whose value is guarded only when capture needs it.

``self.step += 1`` reads an int, adds one and writes it back: nothing in the graph or the
control flow depends on its value, so specialising on it would recompile on every call. An int
or float from a source is therefore guarded on its type at first; ``+ - * / // % **`` with other
numbers build a runtime expression (``(self.step + 1)``) that the entry function evaluates when
the side effect is replayed or the value returned. Anything that needs the actual value (an
``if``, a graph operation, a shape, a format) reads ``.value``, which adds the equality guard
then, as for any constant.
"""

from __future__ import annotations

import operator

from .base import ConstantValue, Value

_SYMBOLS = {
    operator.add: "+", operator.iadd: "+", operator.sub: "-", operator.isub: "-",
    operator.mul: "*", operator.imul: "*", operator.truediv: "/", operator.itruediv: "/",
    operator.floordiv: "//", operator.ifloordiv: "//", operator.mod: "%", operator.imod: "%",
    operator.pow: "**", operator.ipow: "**",
}
_NUMBER_TYPES = (int, float)


class DeferredNumber(ConstantValue):
    __slots__ = ("_raw", "_realize", "_expr")

    def __init__(self, raw, source=None, realize=None, expr=None):
        Value.__init__(self, source)
        self._raw = raw
        self._realize = realize  # adds the guards that fix this value; None once added
        self._expr = expr        # cg -> runtime expression, for computed numbers

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
            return None
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

        return DeferredNumber(raw, None, realize, expr)

    def reconstruct(self, cg):
        if self._realize is None:
            return cg.literal(self._raw)  # guarded: the value is fixed
        if self._expr is not None:
            return self._expr(cg)
        return cg.source_expr(self.source)


def deferred_number(out, obj, source):
    """A number from ``source``: type guard now, equality guard when its value is used."""
    from ..guards import EqualsGuard, TypeGuard

    out.guards.add(TypeGuard(source, type(obj)))
    return DeferredNumber(obj, source, lambda: out.guards.add(EqualsGuard(source, obj)))
