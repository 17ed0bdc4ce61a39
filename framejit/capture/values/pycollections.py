"""Sets of constants, ``collections.deque``, ``OrderedDict`` and ``defaultdict`` created in the
frame. Like lists and dicts built in the frame, they are symbolic and mutable, and rebuilt in
the entry function when they are returned."""

from __future__ import annotations

import collections
import operator

from ...errors import Unsupported
from .base import BoundMethod, Value
from .constants import NONE, const
from .containers import DictValue, ItemsProtocol, TupleValue
from .exceptions import raise_python
from .iterators import LazyIteratorValue, as_iterator
from .objects import ClassValue
from .pyops import equals, identity
from .tensor import TensorValue

_SET_OPS = {operator.or_: "union", operator.and_: "intersection", operator.sub: "difference",
            operator.xor: "symmetric_difference", operator.ior: "update",
            operator.iand: "intersection_update", operator.isub: "difference_update",
            operator.ixor: "symmetric_difference_update"}
_SET_COMPARE = (operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge)


def _hashable_constant(v: Value, what: str):
    if not v.is_constant():
        raise Unsupported(f"{what} {v.describe()}", "sets are captured when they hold Python constants")
    c = v.as_constant()
    try:
        hash(c)
    except TypeError as e:
        raise Unsupported(f"{what} the unhashable {type(c).__name__} {c!r:.40} (TypeError)") from e
    return c


def _constants_of(tx, v: Value, what: str) -> list:
    return [_hashable_constant(x, what) for x in v.iterate(tx)]


def _identity_member(tx, v: Value, what: str):
    """A set member that is not a constant: a module (its identity is guarded) or a tensor read
    from outside (``named_parameters``' memo; their distinctness is guarded, see
    ``OutputGraph.note_identity_key``). Both hash by identity. Returns the real object."""
    if isinstance(v, TensorValue):
        real = tx.output.real_input(v)
        if real is None:
            raise Unsupported(f"{what} a tensor computed in the compiled function",
                              "sets are captured when they hold constants, modules and input tensors")
        tx.output.note_identity_key(v, real)
        return real
    obj = v.pinned_object()
    if obj is None or v.is_constant() or type(obj).__hash__ is not object.__hash__ \
            or type(obj).__eq__ is not object.__eq__:
        return _hashable_constant(v, what)
    return obj


class SetIterator(LazyIteratorValue):
    """Iterating a set: its items in the set's order; a change of the set's size while
    iterating raises RuntimeError, as in Python (the loop went on over a snapshot)."""

    __slots__ = ("set_value", "snapshot", "size", "index")
    kind = "set_iterator"

    def __init__(self, set_value: SetValue):
        super().__init__()
        self.set_value = set_value
        self.snapshot = list(set_value.real)
        self.size = len(self.snapshot)
        self.index = 0

    def python_type(self):
        return type(iter(set()))

    def _next(self):
        if len(self.set_value.real) != self.size:
            self.exhausted = True  # Python's iterator gives up for good, too
            raise_python(RuntimeError, "Set changed size during iteration")
        if self.index >= self.size:
            return None
        self.index += 1
        return self.set_value.item_value(self.snapshot[self.index - 1])

    def peek(self):
        if len(self.set_value.real) != self.size:
            return None
        return [self.set_value.item_value(x) for x in self.snapshot[self.index:]]


class SetValue(Value):
    """A ``set`` created in the frame, holding constants: ``real`` is a Python set that sees the
    same operations in the same order as the eager one, so it iterates in the same order."""

    __slots__ = ("real", "values")
    fresh = True

    def __init__(self, items=(), values=None):
        super().__init__(None)
        self.real = set(items)
        #: id of a member that is not a constant -> its value (a module, an input tensor)
        self.values: dict = dict(values or {})

    def member(self, tx, v: Value, what: str):
        if v.is_constant():
            return _hashable_constant(v, what)
        obj = _identity_member(tx, v, what)
        self.values.setdefault(id(obj), v)
        return obj

    def _derived(self, result: set, other=None) -> SetValue:
        values = dict(self.values)
        if other is not None:
            values.update(other.values)
        members = {id(x) for x in result}
        return SetValue(result, {k: v for k, v in values.items() if k in members})

    def describe(self):
        return "a set"

    def python_type(self):
        return set

    def as_constant(self):
        return set(self.real)

    def make_iterator(self, tx):
        return SetIterator(self)

    def item_value(self, x) -> Value:
        return self.values.get(id(x)) or const(x)

    def iterate(self, tx):
        return [self.item_value(x) for x in self.real]

    def length(self, tx):
        return len(self.real)

    def truthy(self, tx):
        return bool(self.real)

    def contains(self, tx, item):
        if item.is_constant():
            return _hashable_constant(item, "`in` on a set with") in self.real
        return _identity_member(tx, item, "`in` on a set with") in self.real

    def add(self, tx, item: Value):
        self.real.add(self.member(tx, item, "adding to a set"))

    def update(self, tx, iterable: Value):
        self.real.update([self.member(tx, x, "adding to a set") for x in iterable.iterate(tx)])

    def equals(self, tx, other):
        if isinstance(other, SetValue):
            return self.real == other.real
        if other.is_constant():
            return self.real == other.as_constant()
        return None

    def binary_op(self, tx, fn, other, reflected):
        if fn not in _SET_OPS and fn not in _SET_COMPARE:
            return None
        theirs = None
        if isinstance(other, SetValue):
            o, theirs = other.real, other
        elif other.is_constant() and isinstance(other.as_constant(), (set, frozenset)):
            o = other.as_constant()
        else:
            return None
        a, b = (o, self.real) if reflected else (self.real, o)
        if fn in _SET_COMPARE:
            return const(fn(a, b))
        if fn in (operator.ior, operator.iand, operator.isub, operator.ixor) and not reflected:
            getattr(self.real, _SET_OPS[fn])(o)
            return self
        base = {operator.ior: operator.or_, operator.iand: operator.and_, operator.isub: operator.sub,
                operator.ixor: operator.xor}.get(fn, fn)
        result = base(a, b)
        return self._derived(result, theirs) if isinstance(result, set) else const(result)

    def getattr(self, tx, name):
        if name in _SET_METHODS:
            return BoundMethod(self, name)
        raise Unsupported(f"reading .{name} of {self.describe()}")

    def call_method(self, tx, name, args, kwargs):
        if name in _SET_METHODS:
            return _set_method(tx, self, name, args, kwargs)
        return super().call_method(tx, name, args, kwargs)

    def reconstruct(self, cg):
        if any(isinstance(v, TensorValue) for v in self.values.values()):
            raise Unsupported("a set of tensors that outlives the compiled function",
                              "keep sets of tensors local to the compiled function")
        return cg.shared(self, lambda: f"set({cg.const_name(tuple(self.real))})")


_SET_METHODS = {"add", "discard", "remove", "pop", "clear", "update", "copy", "union",
                "intersection", "difference", "symmetric_difference", "issubset", "issuperset",
                "isdisjoint", "intersection_update", "difference_update",
                "symmetric_difference_update"}


def _set_method(tx, obj, name: str, args, kwargs):
    what = f"set.{name}"
    if kwargs:
        raise Unsupported(f"{what}() with keyword arguments (TypeError)")
    s = obj
    if name == "add":
        s.add(tx, args[0])
        return NONE
    if name == "update":
        for a in args:
            s.update(tx, a)
        return NONE
    if name == "copy":
        return s._derived(set(s.real))
    consts = [s.member(tx, a, f"set.{name}() of") if name in ("discard", "remove") else
              set(_constants_of(tx, a, f"set.{name}() of")) for a in args]
    try:
        result = getattr(s.real, name)(*consts)
    except (KeyError, TypeError) as e:
        raise Unsupported(f"{what}() raises {type(e).__name__}: {e}") from e
    if name == "pop":
        return s.values.get(id(result)) or const(result)
    return s._derived(result) if isinstance(result, set) else const(result)


class DequeValue(ItemsProtocol, Value):
    """A ``collections.deque`` created in the frame."""

    __slots__ = ("items", "maxlen", "state")
    fresh = True

    def __init__(self, items: list[Value], maxlen: int | None):
        super().__init__(None)
        self.maxlen = maxlen
        self.items: list[Value] = []
        #: counts the changes of the deque's items (an iterator of it stops at one, as in Python)
        self.state = 0
        for v in items:
            self.append(v)

    def make_iterator(self, tx):
        return DequeIterator(self)

    def describe(self):
        return "a deque"

    def python_type(self):
        return collections.deque

    def append(self, v: Value, left: bool = False):
        if self.maxlen == 0:
            return
        if self.maxlen is not None and len(self.items) >= self.maxlen:
            if left:
                self.items.pop()
            else:
                self.items.pop(0)
        if left:
            self.items.insert(0, v)
        else:
            self.items.append(v)


    def _index(self, key: Value) -> int:
        k = key.as_constant()
        if isinstance(k, bool) or not isinstance(k, int):
            raise Unsupported(f"indexing {self.describe()} with {key.describe()} (TypeError)")
        if not -len(self.items) <= k < len(self.items):
            raise Unsupported(f"{self.describe()}[{k}] is out of range (IndexError)")
        return k

    def getitem(self, tx, key):
        return self.items[self._index(key)]

    def setitem(self, tx, key, value):
        self.items[self._index(key)] = value

    def delitem(self, tx, key):
        self.state += 1
        del self.items[self._index(key)]

    def getattr(self, tx, name):
        if name == "maxlen":
            return const(self.maxlen)
        if name in _DEQUE_METHODS:
            return BoundMethod(self, name)
        raise Unsupported(f"reading .{name} of {self.describe()}")

    def call_method(self, tx, name, args, kwargs):
        if name in _DEQUE_METHODS:
            if name not in ("count", "index", "copy"):
                self.state += 1
            return _deque_method(tx, self, name, args, kwargs)
        return super().call_method(tx, name, args, kwargs)

    def reconstruct(self, cg):
        return cg.shared(self, lambda: f"{cg.const_name(collections.deque)}(["
                         + ", ".join(cg.expr(v) for v in self.items) + f"], {self.maxlen!r})")


class DequeIterator(LazyIteratorValue):
    """Iterating a deque: its items from the left; any change of the deque while iterating
    (an append, a pop, a rotation) raises RuntimeError, as in Python."""

    __slots__ = ("deque_value", "state", "index", "reverse")
    kind = "deque_iterator"

    def __init__(self, deque_value: DequeValue, reverse: bool = False):
        super().__init__()
        self.deque_value = deque_value
        self.state = deque_value.state
        self.index = 0
        self.reverse = reverse  # reversed(d): from the right

    def python_type(self):
        return type(reversed(collections.deque()) if self.reverse else iter(collections.deque()))

    def _next(self):
        d = self.deque_value
        if d.state != self.state:
            self.exhausted = True
            raise_python(RuntimeError, "deque mutated during iteration")
        if self.index >= len(d.items):
            return None
        self.index += 1
        return d.items[-self.index] if self.reverse else d.items[self.index - 1]

    def peek(self):
        d = self.deque_value
        if d.state != self.state:
            return None
        return d.items[::-1][self.index:] if self.reverse else d.items[self.index:]


_DEQUE_METHODS = {"append", "appendleft", "pop", "popleft", "extend", "extendleft", "rotate",
                  "clear", "copy", "count", "index", "remove", "reverse", "insert"}


def _deque_method(tx, obj, name: str, args, kwargs):
    what = f"deque.{name}"

    d, items = obj, obj.items
    if kwargs:
        raise Unsupported(f"{what}() with keyword arguments (TypeError)")
    if name in ("append", "appendleft"):
        d.append(args[0], left=name == "appendleft")
        return NONE
    if name in ("extend", "extendleft"):
        for v in args[0].iterate(tx):
            d.append(v, left=name == "extendleft")
        return NONE
    if name in ("pop", "popleft"):
        if not items:
            raise Unsupported(f"{what}() on an empty deque (IndexError)")
        return items.pop() if name == "pop" else items.pop(0)
    if name == "rotate":
        n = args[0].as_constant() if args else 1
        if items:
            n %= len(items)
            items[:] = items[-n:] + items[:-n] if n else items
        return NONE
    if name == "clear":
        items.clear()
        return NONE
    if name == "copy":
        return DequeValue(items, d.maxlen)
    if name == "reverse":
        items.reverse()
        return NONE
    if name == "insert":
        if d.maxlen is not None and len(items) >= d.maxlen:
            raise Unsupported("deque.insert() into a full deque (IndexError)")
        items.insert(args[0].as_constant(), args[1])
        return NONE
    # count, index, remove compare items with ==
    if len(args) != 1:
        raise Unsupported(f"{what}() with these arguments")
    target = args[0]
    matches = [i for i, v in enumerate(items) if identity(v, target) or equals(tx, v, target)]
    if name == "count":
        return const(len(matches))
    if not matches:
        raise Unsupported(f"{what}() of a value not in the deque (ValueError)")
    if name == "index":
        return const(matches[0])
    del items[matches[0]]
    return NONE


#: Methods of OrderedDict/defaultdict that plain dicts lack or that keep the subclass.
_ORDERED_DICT_EXTRAS = frozenset({"move_to_end", "popitem", "copy"})
_DEFAULT_DICT_EXTRAS = frozenset({"copy", "popitem"})


class OrderedDictValue(DictValue):
    """A ``collections.OrderedDict`` created in the frame."""

    __slots__ = ()
    fresh = True

    def describe(self):
        return "an OrderedDict"

    def python_type(self):
        return collections.OrderedDict

    def getattr(self, tx, name):
        if name in _ORDERED_DICT_EXTRAS:
            return BoundMethod(self, name)
        return super().getattr(tx, name)

    def call_method(self, tx, name, args, kwargs):
        if name in _ORDERED_DICT_EXTRAS:
            return _dict_extra_method(tx, self, name, args, kwargs)
        return super().call_method(tx, name, args, kwargs)

    def reconstruct(self, cg):
        return cg.shared(self, lambda: f"{cg.const_name(collections.OrderedDict)}([" + ", ".join(
            f"({cg.literal(k)}, {cg.expr(v)})" for k, v in self.items.items()) + "])")


class DefaultDictValue(DictValue):
    """A ``collections.defaultdict`` created in the frame: a missing key calls the factory."""

    __slots__ = ("factory",)
    fresh = True

    def __init__(self, factory: Value, items: dict):
        super().__init__(items)
        self.factory = factory

    def describe(self):
        return "a defaultdict"

    def python_type(self):
        return collections.defaultdict

    def getitem(self, tx, key):
        k = key.as_constant()
        if k not in self.items:
            if self.factory.is_constant() and self.factory.as_constant() is None:
                raise Unsupported(f"{self.describe()}[{k!r}] raises KeyError")
            self.items[k] = self.factory.call(tx, [], {})
        return self.items[k]

    def getattr(self, tx, name):
        if name == "default_factory":
            return self.factory
        if name in _DEFAULT_DICT_EXTRAS:
            return BoundMethod(self, name)
        return super().getattr(tx, name)

    def call_method(self, tx, name, args, kwargs):
        if name in _DEFAULT_DICT_EXTRAS:
            return _dict_extra_method(tx, self, name, args, kwargs)
        return super().call_method(tx, name, args, kwargs)

    def reconstruct(self, cg):
        return cg.shared(self, lambda: f"{cg.const_name(collections.defaultdict)}({cg.expr(self.factory)}, {{"
                         + ", ".join(f"{cg.literal(k)}: {cg.expr(v)}" for k, v in self.items.items()) + "})")


def _dict_extra_method(tx, obj, name: str, args, kwargs):
    what = f"{obj.python_type().__name__}.{name}"
    d = obj
    if name == "copy":
        if isinstance(d, DefaultDictValue):
            return DefaultDictValue(d.factory, d.items)
        return OrderedDictValue(d.items)
    if name == "popitem":
        last = kwargs.get("last", args[0] if args else const(True)).as_constant()
        if not isinstance(d, OrderedDictValue) and (args or kwargs):
            raise Unsupported("dict.popitem() with arguments (TypeError)")
        if not d.items:
            raise Unsupported(f"{what}() on an empty dict (KeyError)")
        key = next(reversed(d.items)) if last else next(iter(d.items))
        return _pair(key, d.items.pop(key))
    if name == "move_to_end":
        key = args[0].as_constant()
        last = kwargs.get("last", args[1] if len(args) > 1 else const(True)).as_constant()
        if key not in d.items:
            raise Unsupported(f"{what}({key!r}) of a missing key (KeyError)")
        value = d.items.pop(key)
        if last:
            d.items[key] = value
        else:
            d.items = {key: value, **d.items}
        return NONE
    raise Unsupported(f"calling {what}()")


def _pair(key, value: Value) -> Value:
    return TupleValue([const(key), value])


# -- constructors (called through BuiltinValue) --------------------------------------------------

def make_set(tx, args, kwargs):
    if kwargs or len(args) > 1:
        raise Unsupported("set() with these arguments (TypeError)")
    return SetValue(_constants_of(tx, args[0], "a set of") if args else ())


def make_frozenset(tx, args, kwargs):
    if kwargs or len(args) > 1:
        raise Unsupported("frozenset() with these arguments (TypeError)")
    return const(frozenset(_constants_of(tx, args[0], "a frozenset of") if args else ()))


def make_deque(tx, args, kwargs):
    if len(args) > 2 or set(kwargs) - {"iterable", "maxlen"}:
        raise Unsupported("deque() with these arguments (TypeError)")
    iterable = args[0] if args else kwargs.get("iterable")
    maxlen = args[1] if len(args) > 1 else kwargs.get("maxlen", NONE)
    return DequeValue(iterable.iterate(tx) if iterable is not None else [], maxlen.as_constant())


def fill_dict(tx, d: DictValue, args, kwargs, what: str) -> DictValue:
    if len(args) > 1:
        raise Unsupported(f"{what}() with these arguments (TypeError)")
    if args:
        src = args[0]
        if isinstance(src, DictValue):
            d.items.update(src.items)
        else:
            for pair in src.iterate(tx):
                k, v = pair.iterate(tx)
                d.items[_hashable_constant(k, "a key")] = v
    d.items.update(kwargs)
    return d


def make_ordered_dict(tx, args, kwargs):
    return fill_dict(tx, OrderedDictValue({}), args, kwargs, "OrderedDict")


def make_defaultdict(tx, args, kwargs):
    factory = args[0] if args else NONE
    if not (factory.is_constant() and factory.as_constant() is None):
        try:
            callable_type = factory.python_type()
        except Unsupported:
            callable_type = None
        if callable_type is not None and not any("__call__" in vars(k) for k in callable_type.__mro__):
            raise Unsupported("defaultdict() whose first argument is not callable (TypeError)")
    return fill_dict(tx, DefaultDictValue(factory, {}), args[1:], kwargs, "defaultdict")


def _fromkeys(make):
    def handler(tx, args, kwargs):
        """``dict.fromkeys(keys, value=None)``: every key maps to the one value, as in Python."""
        if kwargs or not 1 <= len(args) <= 2:
            raise Unsupported("fromkeys() with these arguments (TypeError)")
        value = args[1] if len(args) > 1 else NONE
        d = make()
        for k in as_iterator(tx, args[0]).iterate(tx):
            d.items[_hashable_constant(k, "a key")] = value
        return d
    return handler


def make_namedtuple(tx, args, kwargs):
    """``collections.namedtuple("P", ["a", "b"])`` inside the function: the class is made once,
    at capture, from the constant arguments, and that class is used on every call (eager makes
    a new class per call). Keeping one class lets a resume function that receives it, or its
    instances, reuse its graph instead of recompiling for every new class."""
    try:
        a = [v.as_constant() for v in args]
        k = {n: v.as_constant() for n, v in kwargs.items()}
    except Unsupported:
        raise Unsupported("collections.namedtuple() with arguments not known at capture time") from None
    k.setdefault("module", tx.f_globals.get("__name__"))
    try:
        cls = collections.namedtuple(*a, **k)
    except (TypeError, ValueError) as e:
        raise Unsupported(f"collections.namedtuple() raises {type(e).__name__}: {e}") from e
    return ClassValue(cls)


CONSTRUCTORS = {
    set: make_set, frozenset: make_frozenset, collections.deque: make_deque,
    collections.OrderedDict: make_ordered_dict, collections.defaultdict: make_defaultdict,
    dict.fromkeys: _fromkeys(lambda: DictValue({})),
    collections.OrderedDict.fromkeys: _fromkeys(lambda: OrderedDictValue({})),
    collections.namedtuple: make_namedtuple,
}
