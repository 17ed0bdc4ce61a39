"""Python's operator semantics over symbolic values: identity (``is``), equality (``==``),
membership (``in``), and the binary operators of kinds that define their own (sets, deques,
objects of user classes).

Each answer is either exact under the guards of the values involved or :class:`Unsupported`;
in particular ``is`` between two values is only decided when it cannot change from call to call
(two inputs of the same type may or may not be one object).
"""

from __future__ import annotations

import enum
import inspect
import operator
import types

import torch

from ...errors import Unsupported
from .base import UNPINNED, Value
from .constants import ConstantValue, const
from .tensor import TensorValue

#: Types whose equal values are one object, so ``is`` between two of them is ``==``.
_SINGLETON_TYPES = (type(None), bool, type(Ellipsis), type(NotImplemented), type, enum.Enum,
                    torch.dtype, torch.layout, torch.memory_format)
#: Builtin types whose ``__eq__`` answers NotImplemented for objects of unrelated types, so
#: comparing one with an object of a class without ``__eq__`` is ``False``.
_PLAIN_EQ_TYPES = (type(None), bool, int, float, complex, str, bytes, tuple, list, dict, set,
                   frozenset, range)
_UNKNOWN = object()


def _python_type(v: Value):
    try:
        return v.python_type()
    except Unsupported:
        return None


def _is_fresh(v: Value) -> bool:
    """A mutable object created during this capture (never an input, never another value)."""
    return v.fresh and v.source is None


def _pinned(v: Value):
    """The real object ``v`` always is under its guards, or ``_UNKNOWN``."""
    if isinstance(v, ConstantValue):
        return v.value
    obj = v.pinned_object()
    return _UNKNOWN if obj is None else obj


def identity(a: Value, b: Value, tx=None) -> bool | None:
    """``a is b`` when it is known at capture time and holds for every call the guards admit;
    None when it is not. With ``tx``, objects from outside that are guarded only by type get an
    identity guard instead (the cache entry is then specific to those objects)."""
    if a is b:
        return True
    if isinstance(a, TensorValue) and isinstance(b, TensorValue):
        if a.node is b.node:
            return True
        if a.source is not None and b.source is not None:
            # Two inputs may be one tensor: decide from the real ones, and guard that it stays so.
            if tx is None:
                return None
            return tx.output.alias(a, b)
        return False
    if isinstance(a, TensorValue) or isinstance(b, TensorValue):
        return False  # a tensor is never a constant, module, container or user object
    if _is_fresh(a) or _is_fresh(b):
        return False
    ta, tb = _python_type(a), _python_type(b)
    if ta is not None and tb is not None and ta is not tb:
        return False  # one object has one type
    ra, rb = _pinned(a), _pinned(b)
    if tx is not None and (ra is _UNKNOWN or rb is _UNKNOWN):
        ra, rb = (_pin(tx, v) if r is _UNKNOWN else r for v, r in ((a, ra), (b, rb)))
    if ra is _UNKNOWN or rb is _UNKNOWN:
        return None
    if isinstance(a, ConstantValue) and isinstance(b, ConstantValue) and not isinstance(ra, _SINGLETON_TYPES):
        # Equal ints, strings or tuples may or may not be one object, depending on how Python
        # built them; unequal ones never are.
        try:
            if ra != rb:
                return False
        except Exception:
            pass
        return None
    return ra is rb


def _pin(tx, v: Value):
    obj = v.pin(tx)
    return _UNKNOWN if obj is UNPINNED else obj


def is_same(a: Value, b: Value, tx=None) -> bool:
    same = identity(a, b, tx)
    if same is None:
        raise Unsupported(f"`is` between {a.describe()} and {b.describe()}",
                          "whether these are one object can change from call to call")
    return same


def _uses_identity_eq(t) -> bool:
    return t is not None and t.__eq__ is object.__eq__


def equals(tx, a: Value, b: Value) -> bool:
    """``bool(a == b)`` for values that are not tensors (raises Unsupported when unknown)."""
    if isinstance(a, TensorValue) or isinstance(b, TensorValue):
        if identity(a, b):
            return True  # containers compare items by identity first
        raise Unsupported(f"comparing {a.describe()} and {b.describe()} with == inside a container",
                          "the comparison reads tensor values; compare tensors with torch.equal outside "
                          "the compiled function")
    if a.is_constant() and b.is_constant():
        x, y = a.as_constant(), b.as_constant()
        try:
            return bool(x == y)
        except Exception as e:
            raise Unsupported(f"{x!r} == {y!r} raises {type(e).__name__}") from e
    result = _user_eq(tx, a, b)
    if result is not None:
        return result
    ta, tb = _python_type(a), _python_type(b)
    if _uses_identity_eq(ta) and (_uses_identity_eq(tb) or (tb is not None and tb in _PLAIN_EQ_TYPES)) \
            or _uses_identity_eq(tb) and ta is not None and ta in _PLAIN_EQ_TYPES:
        return is_same(a, b)
    for x, y in ((a, b), (b, a)):
        result = x.equals(tx, y)
        if result is not None:
            return result
    raise Unsupported(f"comparing {a.describe()} and {b.describe()} with ==")


def _user_eq(tx, a, b) -> bool | None:
    """``__eq__`` written in Python on a user class (a dataclass's, say), run symbolically; the
    right operand's first when its class is a proper subclass of the left's, as in Python."""
    ta, tb = _python_type(a), _python_type(b)
    order = ((a, b), (b, a))
    if ta is not None and tb is not None and tb is not ta and issubclass(tb, ta):
        order = ((b, a), (a, b))
    for x, y in order:
        cls = x.user_class
        if cls is None:
            continue
        method = inspect.getattr_static(cls, "__eq__", None)
        if isinstance(method, types.FunctionType):
            r = tx.inline_function(method, [x, y], {})
            if isinstance(r, ConstantValue) and r.value is NotImplemented:
                continue
            return r.truthy(tx)
    return None


def items_equal(tx, xs: list[Value], ys: list[Value]) -> bool:
    """Sequence equality as list/tuple do it: lengths, then identity-or-== item by item."""
    if len(xs) != len(ys):
        return False
    for x, y in zip(xs, ys):
        if identity(x, y):
            continue
        if not equals(tx, x, y):
            return False
    return True


def contains(tx, container: Value, item: Value) -> bool:
    """``item in container``."""
    return container.contains(tx, item)


def sequence_contains(tx, items: list[Value], item: Value) -> bool:
    for x in items:
        if identity(x, item) or equals(tx, x, item):
            return True
    return False


def binary(tx, fn, a: Value, b: Value) -> Value:
    """``a <op> b``: kinds with their own operators first (``a``'s, then ``b``'s reflected), then
    tensors (graph nodes) and constants (folded)."""
    if not isinstance(a, TensorValue) and not isinstance(b, TensorValue):
        r = a.binary_op(tx, fn, b, False)
        if r is None:
            r = b.binary_op(tx, fn, a, True)
        if r is not None:
            return r
    if fn is operator.mod and a.is_constant() and isinstance(a.as_constant(), (str, bytes)) \
            and not isinstance(b, TensorValue):
        # "%(name)s" % {...} and "%s %d" % [...]: the values must be known.
        fmt, values = a.as_constant(), b.as_constant()
        try:
            return const(fmt % values)
        except Exception as e:
            raise Unsupported(f"{fmt!r} % ... raises {type(e).__name__}: {e}") from e
    if fn in (operator.eq, operator.ne) and not isinstance(a, TensorValue) and not isinstance(b, TensorValue) \
            and not (a.is_constant() and b.is_constant()):
        same = equals(tx, a, b)
        return const(same if fn is operator.eq else not same)
    return tx.apply_operator(fn, [a, b])


def apply_operator(tx, fn, args: list[Value]) -> Value:
    """A function of the ``operator`` module called on symbolic values."""
    if fn in (operator.getitem, operator.setitem, operator.delitem, operator.contains,
              operator.not_, operator.truth, operator.is_, operator.is_not):
        if fn is operator.getitem:
            return args[0].getitem(tx, args[1])
        if fn is operator.setitem:
            args[0].setitem(tx, args[1], args[2])
            return const(None)
        if fn is operator.delitem:
            args[0].delitem(tx, args[1])
            return const(None)
        if fn is operator.contains:
            return const(contains(tx, args[0], args[1]))
        if fn is operator.not_:
            return const(not args[0].truthy(tx))
        if fn is operator.truth:
            return const(args[0].truthy(tx))
        same = is_same(args[0], args[1], tx)
        return const(same if fn is operator.is_ else not same)
    if len(args) == 2:
        return binary(tx, fn, args[0], args[1])
    return tx.apply_operator(fn, args)
