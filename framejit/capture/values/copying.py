"""``copy.copy`` and ``copy.deepcopy`` during capture.

Copies of values the capture already models are built symbolically: constants are their own
copies, lists, dicts and tuples are rebuilt from (deep) copies of their items, and objects of
plain classes created in the frame get a new object with copied attributes.

An object from outside the frame is copied from its state: the object must hold plain data only
(numbers, strings, None and lists, tuples, dicts and sets of them, as ``transformers``' config
objects do), the copy is a new object created in the frame with that data, and one guard checks
on each call that the original still holds exactly the same data. This is what
``config.get_text_config()`` needs: it deep-copies the model's config inside the forward.

Only the default copy protocol is modelled (a new object of the class whose ``__dict__`` is a
copy of the original's); a class with its own ``__copy__``, ``__deepcopy__``, ``__reduce__``,
``__getstate__`` or ``__setstate__``, with ``__slots__`` or a ``__new__`` of its own, is not
copied here and the call is a graph break.
"""

from __future__ import annotations

import abc
import copy
import copyreg

from ...errors import Unsupported
from .base import Value
from .constants import ConstantValue, const
from .containers import DictValue, ListValue, TupleValue
from .instances import ObjectValue
from .lookup import HEAPTYPE, MISSING
from .objects import UserObjectValue
from .pycollections import SetValue

#: Immutable plain data: what deepcopy returns as is.
_ATOMIC = (type(None), bool, int, float, complex, str, bytes)
_CONTAINERS = (list, tuple, dict, set, frozenset)


def _copy_problem(tx, cls: type) -> str | None:
    """Why ``copy`` would not make an instance of ``cls`` by the default protocol (a new object
    whose ``__dict__`` is the copied state), or None. Guarded: a ``__deepcopy__`` added to the
    class later recompiles."""
    from .attributes import guarded_lookup

    if type(cls) not in (type, abc.ABCMeta) or not cls.__flags__ & HEAPTYPE:
        return "its class is not a plain Python class"
    if cls in copy._deepcopy_dispatch or cls in copyreg.dispatch_table:
        return "copy has a special case for its class"
    for name in ("__copy__", "__deepcopy__", "__getnewargs__", "__getnewargs_ex__", "__setstate__"):
        if guarded_lookup(tx, cls, name) is not MISSING:
            return f"its class defines {name}"
    for name in ("__reduce_ex__", "__reduce__", "__getstate__"):
        if guarded_lookup(tx, cls, name) not in (MISSING, vars(object).get(name)):
            return f"its class defines {name}"
    if guarded_lookup(tx, cls, "__new__") is not vars(object)["__new__"]:
        return "its class defines __new__"
    if any(vars(k).get("__slots__") for k in cls.__mro__) or guarded_lookup(tx, cls, "__dict__") is MISSING:
        return "its class has __slots__"
    return None


def is_plain_data(obj, depth: int = 0) -> bool:
    """Numbers, strings, None, and lists, tuples, dicts and sets of them (exact types)."""
    t = type(obj)
    if t in _ATOMIC:
        return True
    if depth > 16 or t not in _CONTAINERS:
        return False
    if t is dict:
        return all(is_plain_data(k, depth + 1) and is_plain_data(v, depth + 1) for k, v in obj.items())
    return all(is_plain_data(x, depth + 1) for x in obj)


def same_data(a, b) -> bool:
    """``a == b`` with the same exact types throughout (``1`` is not ``True`` here) and, for
    dicts, the same key order."""
    t = type(a)
    if t is not type(b):
        return False
    if t in (list, tuple):
        return len(a) == len(b) and all(map(same_data, a, b))
    if t is dict:
        return (len(a) == len(b) and all(map(same_data, a, b))
                and all(same_data(a[k], b[k]) for k in a))
    if t in (set, frozenset):
        return a == b and sorted(map(repr, a)) == sorted(map(repr, b))
    return a == b


def state_matches(obj, keys: tuple, state: dict, types_: tuple, nested: tuple) -> bool:
    """Used by guards: ``obj.__dict__`` holds exactly ``state``. The common case costs a few
    C-level comparisons; containers inside are compared in depth."""
    try:
        d = object.__getattribute__(obj, "__dict__")
    except AttributeError:
        return False
    return (tuple(d) == keys and d == state and tuple(map(type, d.values())) == types_
            and all(same_data(d[k], state[k]) for k in nested))


def fresh_value(tx, obj) -> Value:
    """A value for plain data created in the frame: constants, and new lists, dicts, tuples."""
    t = type(obj)
    if t in _ATOMIC or t is frozenset:
        return const(obj)
    if t is tuple:
        return TupleValue([fresh_value(tx, x) for x in obj])
    if t is list:
        return ListValue([fresh_value(tx, x) for x in obj])
    if t is dict:
        return DictValue({k: fresh_value(tx, v) for k, v in obj.items()})
    if t is set:
        return SetValue(obj)
    raise Unsupported(f"copying a {t.__name__} object")


def _copy_constant(tx, v: ConstantValue, copier) -> Value:
    """A constant is its own copy, unless it holds a mutable container."""
    obj = v.value
    if type(obj) in _CONTAINERS and type(obj) not in (tuple, frozenset):
        return fresh_value(tx, copier(obj))
    return v


# -- deepcopy -------------------------------------------------------------------------------------

def deepcopy_value(tx, v: Value, memo: dict) -> Value:
    """The value of ``copy.deepcopy(v)``. ``memo`` maps id(value) to its copy, so shared and
    recursive references are copied once, as copy.deepcopy does."""
    done = memo.get(id(v))
    if done is not None:
        return done
    t = type(v)
    if isinstance(v, ConstantValue):
        return _copy_constant(tx, v, copy.deepcopy)
    if t is TupleValue:
        items = [deepcopy_value(tx, x, memo) for x in v.items]
        return memo.setdefault(id(v), TupleValue(items, cls=v.cls, names=v._names))
    if t is ListValue:
        new = memo[id(v)] = ListValue([])
        new.items = [deepcopy_value(tx, x, memo) for x in v.items]
        return new
    if t is DictValue:
        new = memo[id(v)] = DictValue({})
        new.items = {k: deepcopy_value(tx, x, memo) for k, x in v.items.items()}
        return new
    if t is SetValue:
        return memo.setdefault(id(v), SetValue(v.real))  # set items are immutable
    if t is ObjectValue:
        problem = _copy_problem(tx, v.user_class)
        if problem is not None:
            raise Unsupported(f"copy.deepcopy() of {v.describe()} ({problem})")
        new = memo[id(v)] = ObjectValue(v.cls_value)
        new.attrs = {k: deepcopy_value(tx, x, memo) for k, x in v.attrs.items()}
        return new
    if t is UserObjectValue:
        new = memo[id(v)] = copy_of_outside_object(tx, v)
        return new
    raise Unsupported(f"copy.deepcopy() of {v.describe()}",
                      "framejit copies constants, lists, dicts, tuples and plain Python objects; "
                      "copy other values (tensors: x.clone()) outside the compiled function")


def copy_of_outside_object(tx, v) -> Value:
    """A deep copy of an object from outside the frame that holds plain data: a new object of
    its class, created in the frame, guarded on the original's state."""
    from ..guards import StateGuard
    from ..sources import ObjectSource
    from .builder import wrap_sourceless

    obj = v.obj
    cls = type(obj)
    problem = _copy_problem(tx, cls)
    if problem is not None:
        raise Unsupported(f"copy.deepcopy() of {v.describe()} ({problem})")
    source = v.source if v.source is not None else ObjectSource(obj)
    if tx.output.side_effects.touches(source):
        raise Unsupported(f"copy.deepcopy() of {v.describe()} after the compiled function changed it",
                          "copy the object before changing it")
    state = object.__getattribute__(obj, "__dict__")
    for name, value in state.items():
        if not is_plain_data(value):
            raise Unsupported(f"copy.deepcopy() of {v.describe()}, whose .{name} holds a "
                              f"{type(value).__name__} object",
                              "framejit copies objects whose attributes are numbers, strings, None "
                              "and lists, tuples, dicts and sets of them")
    snapshot = copy.deepcopy(state)
    tx.output.guards.add(StateGuard(source, snapshot))
    new = ObjectValue(wrap_sourceless(tx, cls))
    new.attrs = {k: fresh_value(tx, x) for k, x in snapshot.items()}
    return new


# -- copy.copy ------------------------------------------------------------------------------------

def shallow_copy_value(tx, v: Value) -> Value:
    """The value of ``copy.copy(v)`` for values created in the frame (or constants)."""
    t = type(v)
    if isinstance(v, ConstantValue):
        return _copy_constant(tx, v, copy.copy)
    if t is TupleValue:
        return v
    if t is ListValue:
        return ListValue(v.iterate(tx))
    if t is DictValue:
        return DictValue(dict(v.items))
    if t is SetValue:
        return SetValue(v.real)
    if t is ObjectValue:
        problem = _copy_problem(tx, v.user_class)
        if problem is not None:
            raise Unsupported(f"copy.copy() of {v.describe()} ({problem})")
        new = ObjectValue(v.cls_value)
        new.attrs = dict(v.attrs)
        return new
    raise Unsupported(f"copy.copy() of {v.describe()}",
                      "framejit copies constants, lists, dicts, tuples and plain Python objects "
                      "created in the compiled function; copy other values outside it")


def call_deepcopy(tx, args, kwargs):
    if len(args) == 2 and not kwargs:
        memo = args[1]
    else:
        memo = kwargs.get("memo")
        if len(args) != 1 or set(kwargs) - {"memo"}:
            raise Unsupported("copy.deepcopy() with these arguments (TypeError)")
    if memo is not None and not (isinstance(memo, ConstantValue) and memo.value is None):
        raise Unsupported("copy.deepcopy() with a memo dict")
    return deepcopy_value(tx, args[0], {})


def call_copy(tx, args, kwargs):
    if len(args) != 1 or kwargs:
        raise Unsupported("copy.copy() with these arguments (TypeError)")
    return shallow_copy_value(tx, args[0])


CONSTRUCTORS = {copy.deepcopy: call_deepcopy, copy.copy: call_copy}


__all__ = ["deepcopy_value", "shallow_copy_value", "state_matches"]
