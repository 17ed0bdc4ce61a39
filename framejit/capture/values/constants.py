"""Python values known at capture time, and the methods of immutable ones.

Operations on a :class:`ConstantValue` fold: its attributes, items and calls of its methods are
computed at capture time and wrapped again. The modules that folding needs (``builder`` to wrap
results, ``containers`` for iterators) themselves build constants, so they are imported where they
are used.
"""

from __future__ import annotations

import inspect
import operator
import types

import torch

from ...errors import Unsupported
from .base import Value


class ConstantValue(Value):
    """A Python value known at capture time: numbers, strings, None, dtypes, devices, types,
    tuples of constants, torch.Size, ranges, slices. Operations on constants fold."""

    __slots__ = ("value",)

    def __init__(self, value, source=None):
        super().__init__(source)
        self.value = value

    def describe(self):
        from ..guards import short_repr
        r = short_repr(self.value)
        return r if len(r) < 40 else f"a {type(self.value).__name__}"

    def python_type(self):
        return type(self.value)

    def is_constant(self):
        return True

    def as_constant(self):
        value = self.value
        if _holds_sym(value):
            # A shape with symbolic sizes (or a slice with a symbolic bound) used as a plain
            # Python value (formatted, hashed, passed to a Python function, slicing a list): the
            # sizes it had, each guarded.
            return _concrete(value)
        return value

    def held(self):
        """The value as an operand of folded arithmetic or a constant tuple: symbolic sizes
        stay symbolic."""
        return self.value

    def hasattr(self, tx, name):
        return hasattr(self.value, name)

    def truthy(self, tx):
        return bool(self.value)

    def make_iterator(self, tx):
        from .containers import IteratorValue  # containers builds constants
        return IteratorValue(self.iterate(tx))  # over a snapshot of the items

    def iterate(self, tx):
        try:
            items = list(self.value)
        except TypeError:
            return super().iterate(tx)
        return [const(x) for x in items]

    def length(self, tx):
        try:
            return len(self.value)
        except TypeError as e:
            raise Unsupported(f"len() of {self.describe()} (TypeError)") from e

    def contains(self, tx, item):
        if item.is_constant():
            try:
                return item.as_constant() in self.value
            except TypeError as e:
                raise Unsupported(f"`in` {self.describe()} raises TypeError: {e}") from e
        if isinstance(self.value, (tuple, list)):
            from .pyops import sequence_contains
            return sequence_contains(tx, [const(x) for x in self.value], item)
        return super().contains(tx, item)

    def getitem(self, tx, key):
        from .builder import wrap_sourceless

        k = key.as_constant()
        try:
            return wrap_sourceless(tx, self.value[k])
        except (IndexError, KeyError) as e:
            from .exceptions import raise_python
            raise_python(type(e), *e.args)
        except TypeError as e:
            raise Unsupported(f"{self.describe()}[{k!r}] raises {type(e).__name__}: {e}") from e

    def getattr(self, tx, name):
        from .builder import wrap_sourceless
        from .functions import fold_call_allowed

        try:
            attr = getattr(self.value, name)
        except AttributeError as e:
            raise Unsupported(f"{self.describe()} has no attribute {name!r}") from e
        if isinstance(attr, types.MappingProxyType) and isinstance(self.value, inspect.Signature):
            from .containers import DictValue
            return DictValue({k: ConstantValue(v) for k, v in attr.items()})  # sig.parameters
        if callable(attr) and not isinstance(attr, type):  # list[int].__origin__ is a value
            if not fold_call_allowed(type(self.value), name):
                raise Unsupported(f"calling {type(self.value).__name__}.{name}()")
            return ConstantMethodValue(attr, f"{type(self.value).__name__}.{name}")
        return wrap_sourceless(tx, attr)

    def reconstruct(self, cg):
        if type(self.value) is slice and _holds_sym(self.value):
            return cg.literal(self.as_constant())  # the bounds it had, guarded
        if _holds_sym(self.value):
            from ..shapes import reconstruct_sizes
            return reconstruct_sizes(cg, self.value)
        return cg.literal(self.value)


_SIZED = (torch.Size, tuple, list)
_SYM_NUMBERS = (torch.SymInt, torch.SymFloat, torch.SymBool)


def _concrete(v, memo=None):
    """``v`` with each symbolic number replaced by its value (guarded); a container ``v`` holds
    more than once is converted once (``t = (t, t)`` in a loop: 2^k paths, k containers)."""
    memo = {} if memo is None else memo
    done = memo.get(id(v))
    if done is not None:
        return done[1]
    if type(v) is slice:
        out = slice(*_concrete((v.start, v.stop, v.step), memo))
    else:
        items = [int(x) if type(x) is torch.SymInt else _concrete(x, memo) if _holds_sym(x) else
                 x if type(x) not in _SYM_NUMBERS else (bool(x) if type(x) is torch.SymBool else float(x))
                 for x in v]
        out = torch.Size(items) if type(v) is torch.Size else type(v)(items)
    memo[id(v)] = (v, out)  # (v kept alive: its id is not reused while memo lives)
    return out


def _has_sym(v) -> bool:
    """Whether the items of ``v`` hold a symbolic number at any depth: each container looked
    at once, and without recursion (a tuple built as ``t = (t, t)`` in a loop holds one tuple
    2^k ways; ``t = (t, 1)`` nests thousands deep)."""
    seen = {id(v): v}  # (the containers kept alive, so that no id is reused meanwhile)
    pending = [v]
    while pending:
        for x in pending.pop():
            if isinstance(x, _SYM_NUMBERS):
                return True
            if type(x) is slice:
                x = (x.start, x.stop, x.step)
            elif type(x) not in _SIZED:
                continue
            if id(x) not in seen:
                seen[id(x)] = x
                pending.append(x)
    return False


def _holds_sym(v) -> bool:
    """Whether ``v`` is a shape, tuple, list or slice with a symbolic size in it."""
    if type(v) is slice:
        return _has_sym((v.start, v.stop, v.step))
    return type(v) in _SIZED and _has_sym(v)


_SIZE_ARITHMETIC = {
    operator.add, operator.iadd, operator.sub, operator.isub, operator.mul, operator.imul,
    operator.floordiv, operator.ifloordiv, operator.mod, operator.imod,
}
_SIZE_COMPARISONS = {operator.lt, operator.le, operator.gt, operator.ge, operator.eq, operator.ne}


class SymNumberValue(ConstantValue):
    """A size in a capture with dynamic shapes (``x.shape[0]``, ``n * 2 - 1``): a
    ``torch.SymInt``. Arithmetic with ints stays symbolic, and so does passing it to a torch
    operation (it becomes size nodes of the graph); a comparison answers by the size seen at
    capture and records a guard (``if n > 8``); any other use (``range(n)``, ``int(n)``, a
    format) reads ``.value``, which specializes the size to what it was (a guard too)."""

    __slots__ = ("sym", "_fixed")

    def __init__(self, sym):
        Value.__init__(self, None)
        self.sym = sym
        self._fixed = None

    @property
    def value(self):
        if self._fixed is None:
            self._fixed = int(self.sym)  # a guard that the size is what it was
        return self._fixed

    def graph_arg(self):
        """What a graph operation receives: the symbol, unless already specialized."""
        return self.sym if self._fixed is None else self._fixed

    held = graph_arg

    def python_type(self):
        return int

    def describe(self):
        return "a size"

    def truthy(self, tx):
        return bool(self.sym)

    def binary_op(self, tx, fn, other, reflected):
        if isinstance(other, SymNumberValue):
            b = other.graph_arg()
        elif type(other) is ConstantValue and type(other.value) is int:
            b = other.value
        else:
            return None
        a = self.graph_arg()
        if reflected:
            a, b = b, a
        if fn in _SIZE_ARITHMETIC:
            return const(fn(a, b))
        if fn in _SIZE_COMPARISONS:
            return const(bool(fn(a, b)))  # a guard on the outcome
        return None

    def reconstruct(self, cg):
        if self._fixed is not None:
            return repr(self._fixed)
        from ..shapes import reconstruct_sizes
        return reconstruct_sizes(cg, self.sym)


class ConstantMethodValue(Value):
    """A method of a constant of an immutable type (``"a,b".split``, ``x.shape.numel``): a call
    with constant arguments folds to its result."""

    __slots__ = ("method", "name")

    def __init__(self, method, name: str):
        super().__init__(None)
        self.method = method
        self.name = name

    def describe(self):
        return f"{self.name}()"

    def call(self, tx, args, kwargs):
        from .builder import wrap_sourceless

        # as_constant() raises Unsupported for anything not known at capture time; lists of
        # constants are fine here (the methods of immutable types do not mutate arguments), and
        # iterators are read out (",".join(str(i) for i in range(3))).
        a = [_constant_argument(tx, v) for v in args]
        k = {n: _constant_argument(tx, v) for n, v in kwargs.items()}
        try:
            result = self.method(*a, **k)
        except Exception as e:
            raise Unsupported(f"{self.name}() raises {type(e).__name__}: {e}") from e
        return wrap_sourceless(tx, result)


def _constant_argument(tx, v: Value):
    from .containers import IteratorValue
    if isinstance(v, IteratorValue):
        return [x.as_constant() for x in v.iterate(tx)]
    return v.as_constant()


def const(value) -> ConstantValue:
    if type(value) in _SYM_NUMBERS:
        return _symbolic(value)
    return ConstantValue(value)


def _symbolic(value) -> ConstantValue:
    """A SymInt as a value (a plain int when it is a number after all); a symbolic bool or
    float is decided now, by its value at capture (a guard)."""
    if type(value) is torch.SymInt:
        if value.node.expr.is_number:
            return ConstantValue(int(value))
        return SymNumberValue(value)
    if type(value) is torch.SymBool:
        return ConstantValue(bool(value))
    return ConstantValue(float(value))


NONE = ConstantValue(None)
