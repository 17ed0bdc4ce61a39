"""Tuples, lists, dicts and iterators whose items are symbolic values.

Containers built in the frame are fully symbolic and may be mutated freely. Containers that came
from outside the frame (with a source) are read-only here: mutating them would be a side effect
the foundation does not replay yet, so it is reported as unsupported.
"""

from __future__ import annotations

import operator

from ...errors import Unsupported
from .base import BoundMethod, Value
from .constants import ConstantValue, const
from .lookup import MISSING


def _all_constant(values) -> bool:
    return all(v.is_constant() for v in values)


class _Deferred:
    """Contents read lazily: a container from outside the frame adds its length/keys guard and
    wraps its items only when something reads them, so a list that is only appended to (a graph
    break) or passed along is not specialised on its length."""

    __slots__ = ()

    @property
    def items(self):
        pending = self._pending
        if pending is not None:
            self._pending = None
            self._items = pending()
            queued = getattr(self, "_queued", None)
            if queued:
                # Calls made before the contents were read apply to them now; from here on the
                # final contents are replayed instead of the calls.
                effects, calls = queued
                self._queued = None
                for method, args in calls:
                    if method == "append":
                        self._items.append(args[0])
                    else:  # extend
                        self._items.extend(args[0].iterate(None))
                effects.contents_read(self)
        return self._items

    def queue_call(self, tx, method: str, args: list) -> bool:
        """Record ``append``/``extend`` on a list from outside without reading it; False when the
        contents are already known (then the caller mutates them and replays them whole)."""
        if self._pending is None or method not in ("append", "extend"):
            return False
        effects = tx.output.side_effects
        queued = getattr(self, "_queued", None)
        if queued is None:
            self._queued = queued = (effects, [])
        if method == "extend":
            args = [ListValue(args[0].iterate(tx))]
        queued[1].append((method, args))
        effects.container_call(self, method, args)
        return True

    @items.setter
    def items(self, value):
        self._pending = None
        self._items = value

    def defer(self, realize) -> _Deferred:
        self._pending = realize
        return self

    # Lists and dicts reached without a source (a default argument, a library's list) keep the
    # real object in ``real``: read here but never mutated, and returned as themselves.
    @property
    def borrowed(self) -> bool:
        return getattr(self, "real", None) is not None

    @property
    def fresh(self) -> bool:
        """Not borrowed (with no source too, it was built in the frame: never an input)."""
        return getattr(self, "real", None) is None


class ItemsProtocol:
    """Iteration, ``len``, truth and ``in`` for values holding an ordered ``items`` list."""

    __slots__ = ()

    def make_iterator(self, tx):
        return IteratorValue(self.iterate(tx))  # over a snapshot of the items

    def iterate(self, tx):
        return list(self.items)

    def length(self, tx):
        return len(self.items)

    def truthy(self, tx):
        return bool(self.items)

    def contains(self, tx, item):
        from .pyops import sequence_contains
        return sequence_contains(tx, self.items, item)


class SequenceValue(_Deferred, ItemsProtocol, Value):
    __slots__ = ("_items", "_pending", "_queued")
    kind = "sequence"

    def __init__(self, items: list[Value], source=None):
        super().__init__(source)
        self.items = list(items)

    def describe(self):
        if self.source is not None:
            return f"the {self.kind} {self.source.name()}"
        return f"a {self.kind}"

    def is_constant(self):
        return _all_constant(self.items)


    # -- operators: ``+``, ``*`` and their in-place forms (comparisons go through ``equals``) ----
    def binary_op(self, tx, fn, other, reflected):
        if fn in (operator.mul, operator.imul):
            return self._repeat(tx, fn, other, reflected)
        if fn in (operator.add, operator.iadd):
            return self._concat(tx, fn, other, reflected)
        return None

    def _new(self, items):
        return ListValue(items) if isinstance(self, ListValue) else TupleValue(items)

    def _repeat(self, tx, fn, other, reflected):
        if not other.is_constant():
            return None
        n = other.as_constant()
        if not hasattr(type(n), "__index__"):
            raise Unsupported(f"a sequence times {n!r} (TypeError: can't multiply sequence by "
                              f"non-int of type '{type(n).__name__}')")
        if fn is operator.imul and not reflected and isinstance(self, ListValue):
            self._check_mutable("*=", tx)
            self.items[:] = self.items * n.__index__()
            return self
        return self._new(self.items * n.__index__())

    def _concat(self, tx, fn, other, reflected):
        mine = issubclass(self.python_type(), tuple)
        if fn is operator.iadd and not reflected and isinstance(self, ListValue):
            # lst += iterable extends the list in place, whatever the iterable
            self._check_mutable("+=", tx)
            self.items.extend(other.iterate(tx))
            return self
        other_seq = _as_sequence(other)
        if other_seq is None:
            return None
        theirs, other_items = other_seq
        if mine != theirs:
            a, b = (other, self) if reflected else (self, other)
            raise Unsupported(f"{_kind_name(a)} + {_kind_name(b)} (TypeError: can only concatenate "
                              f"{_kind_name(a)} (not \"{_kind_name(b)}\") to {_kind_name(a)})")
        items = other_items + self.items if reflected else self.items + other_items
        return TupleValue(items) if mine else ListValue(items)

    def hasattr(self, tx, name):
        # No instance attributes: everything comes from the class (named fields included).
        return name in (getattr(self, "_names", None) or ()) or hasattr(self.python_type(), name)

    def equals(self, tx, other) -> bool | None:
        """``self == other`` against another sequence (None: not decided here)."""
        from .pyops import items_equal
        mine = issubclass(self.python_type(), tuple)
        other_seq = _as_sequence(other)
        if other_seq is None:
            return None
        theirs, other_items = other_seq
        if mine != theirs:
            return False  # a list never equals a tuple
        return items_equal(tx, self.items, other_items)

    def _index(self, key: Value):
        k = key.as_constant()
        if isinstance(k, bool) or not isinstance(k, (int, slice)):
            if hasattr(k, "__index__") and not isinstance(k, bool):
                return int(k)
            raise Unsupported(f"indexing {self.describe()} with {key.describe()}")
        return k

    def getitem(self, tx, key):
        k = self._index(key)
        try:
            item = self.items[k]
        except IndexError:
            from .exceptions import raise_python
            raise_python(IndexError, f"{self.kind} index out of range")
        if isinstance(k, slice):
            return type(self)(item) if not isinstance(self, TupleValue) else TupleValue(item)
        return item


def _seq_index_or_count(name):
    def method(tx, seq, args, kwargs):
        from .pyops import equals, identity
        if len(args) != 1 or kwargs:
            raise Unsupported(f"{seq.describe()}.{name}() with these arguments")
        matches = [i for i, v in enumerate(seq.items) if identity(v, args[0]) or equals(tx, v, args[0])]
        if name == "count":
            return const(len(matches))
        if not matches:
            raise Unsupported(f"{seq.describe()}.index(x) with x not in the sequence (ValueError)")
        return const(matches[0])
    return method


def _tuple_asdict(tx, tup, args, kwargs):
    return DictValue(dict(zip(tup._names or tup.cls._fields, tup.items)))


def _tuple_replace(tx, tup, args, kwargs):
    names = list(tup._names or tup.cls._fields)
    if args or set(kwargs) - set(names):
        raise Unsupported(f"{tup.describe()}._replace() with these arguments (TypeError/ValueError)")
    items = [kwargs.get(n, v) for n, v in zip(names, tup.items)]
    return TupleValue(items, cls=tup.cls, names=tup._names)


#: Methods of lists and tuples with symbolic items: name -> fn(tx, seq, args, kwargs).
SEQUENCE_METHODS = {"index": _seq_index_or_count("index"), "count": _seq_index_or_count("count")}
TUPLE_METHODS = {**SEQUENCE_METHODS, "_asdict": _tuple_asdict, "_replace": _tuple_replace}


def _as_sequence(v: Value):
    """(is it a tuple, its items) for a list or tuple value or constant; None for others."""
    if isinstance(v, SequenceValue):
        return issubclass(v.python_type(), tuple), v.items
    if isinstance(v, ConstantValue) and type(v.value) in (tuple, list):
        return isinstance(v.value, tuple), [const(x) for x in v.value]
    return None


def _kind_name(v: Value) -> str:
    return "tuple" if issubclass(v.python_type(), tuple) else "list"


class TupleValue(SequenceValue):
    kind = "tuple"

    def __init__(self, items, source=None, *, cls: type | None = None, names=None):
        super().__init__(items, source)
        self.cls = cls
        self._names = names

    __slots__ = ("cls", "_names")

    def python_type(self):
        return self.cls or tuple

    def as_constant(self):
        values = tuple(v.as_constant() for v in self.items)
        if self.cls is not None and self.cls is not tuple:
            return self.cls(values) if _is_structseq(self.cls) else self.cls(*values)
        return values

    def call_method(self, tx, name, args, kwargs):
        if name in TUPLE_METHODS:
            return TUPLE_METHODS[name](tx, self, args, kwargs)
        return super().call_method(tx, name, args, kwargs)

    def getattr(self, tx, name):
        names = self._names or getattr(self.cls, "_fields", None) or getattr(self.cls, "__match_args__", None)
        if names and name in names:
            return self.items[list(names).index(name)]
        if name in ("count", "index") or (names and name in ("_asdict", "_replace")):
            return BoundMethod(self, name)
        if self.cls is not None and hasattr(self.cls, "_fields"):
            return _namedtuple_class_attribute(tx, self, name)
        raise Unsupported(f"reading .{name} of {self.describe()}")

    def reconstruct(self, cg):
        if self.source is not None:
            return cg.source_expr(self.source)
        if cg.has_shared(self):
            return cg.shared(self, None)
        if _inline_size(self) > MAX_INLINE:
            # Built in a loop (``t = (t, t)``: 2^k items inline; ``t = (t, 1)``: nested past
            # the parser and recursion): each nested tuple computed once into a local,
            # innermost first, without recursion, as eager holds one object per tuple.
            cg.shared_innermost_first(
                (self,), lambda t: [v for v in t.items if _nested_tuple(v)], lambda t: t._text(cg))
            return cg.shared(self, None)
        return self._text(cg)

    def _text(self, cg) -> str:
        parts = [cg.expr(v) for v in self.items]
        body = "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"
        if self.cls is not None and self.cls is not tuple:
            ctor = cg.const_name(self.cls)
            if _is_structseq(self.cls):
                return f"{ctor}({body})"
            # tuple.__new__ is what a named tuple's own __new__ calls; calling the class would
            # run that Python __new__ in the entry function, where the hook would capture it.
            return f"{cg.const_name(tuple.__new__)}({ctor}, {body})"
        return body


#: A tuple whose expression would hold more items than this, counting nested tuples' items each
#: time they appear, is computed into locals of the entry function (TupleValue.reconstruct).
MAX_INLINE = 64


def _nested_tuple(v) -> bool:
    return type(v) is TupleValue and v.source is None


def _inline_size(tup: TupleValue) -> int:
    """The items of ``tup``'s expression inline, nested tuples' counted each time, up to just
    past MAX_INLINE (without recursion)."""
    size, pending = 0, [tup]
    while pending and size <= MAX_INLINE:
        items = pending.pop().items
        size += len(items)
        pending.extend(v for v in items if _nested_tuple(v))
    return size


def _namedtuple_class_attribute(tx, tup: TupleValue, name: str) -> Value:
    """Methods, properties and class attributes of a named tuple class (``p.norm()``)."""
    from .attributes import bind_class_attribute, guarded_lookup
    from .builder import wrap_sourceless

    attr = guarded_lookup(tx, tup.cls, name)
    if attr is MISSING or vars(tuple).get(name) is attr:
        raise Unsupported(f"reading .{name} of {tup.describe()}")
    if isinstance(attr, property):
        return tx.inline_function(attr.fget, [tup], {})
    return bind_class_attribute(tx, wrap_sourceless(tx, tup.cls), name, attr, tup)


def _is_structseq(cls) -> bool:
    return hasattr(cls, "n_sequence_fields")


class ListValue(SequenceValue):
    __slots__ = ("real",)
    kind = "list"

    def __init__(self, items, source=None):
        super().__init__(items, source)
        #: The real list when this one was reached without a source (a default argument, a
        #: list a library holds): read but never mutated here, and returned as itself.
        self.real = None

    def python_type(self):
        return list

    def make_iterator(self, tx):
        from .iterators import ListIterator
        return ListIterator(self)

    def as_constant(self):
        return [v.as_constant() for v in self.items]

    def is_constant(self):
        return False  # lists are mutable: never folded into a constant

    def _check_mutable(self, what: str, tx=None):
        if self.source is not None and not self.borrowed and tx is not None:
            _ = self.items  # known contents, replayed whole after the graph
            tx.output.side_effects.mutate_container(self)
            return
        if self.source is not None or self.borrowed:
            raise Unsupported(
                f"{what} on {self.describe()}, which comes from outside the compiled function",
                "mutating lists from outside is not captured yet: build a new list instead",
            )

    def setitem(self, tx, key, value):
        self._check_mutable("item assignment", tx)
        k = self._index(key)
        if isinstance(k, slice):
            try:
                self.items[k] = value.iterate(tx)
            except ValueError as e:
                raise Unsupported(f"assigning a slice of {self.describe()} raises ValueError: {e}") from e
            return
        if not -len(self.items) <= k < len(self.items):
            raise Unsupported(f"{self.describe()}[{k}] = ... is out of range (IndexError)")
        self.items[k] = value

    def delitem(self, tx, key):
        self._check_mutable("del", tx)
        k = self._index(key)
        if isinstance(k, int) and not -len(self.items) <= k < len(self.items):
            raise Unsupported(f"del {self.describe()}[{k}] is out of range (IndexError)")
        del self.items[k]

    def getattr(self, tx, name):
        if name in LIST_METHODS:
            return BoundMethod(self, name)
        raise Unsupported(f"reading .{name} of {self.describe()}")

    def call_method(self, tx, name, args, kwargs):
        if name in LIST_METHODS:
            if name in _MUTATING and _mutating_outside(tx, self, name, args):
                return const(None)  # queued as the same call, replayed after the graph
            return LIST_METHODS[name](tx, self, args, kwargs)
        return super().call_method(tx, name, args, kwargs)

    def reconstruct(self, cg):
        if self.source is not None:
            return cg.source_expr(self.source)
        if self.real is not None:
            return cg.const_name(self.real)
        return _rebuild(cg, self)

    def _text(self, cg) -> str:
        return "[" + ", ".join(cg.expr(v) for v in self.items) + "]"


#: A dict from outside is read a key at a time (see DictValue) for up to this many keys, or a
#: quarter of its keys if that is more; then it is read whole.
PEEK_MIN = 4


class DictValue(_Deferred, Value):
    """A dict with constant keys.

    A dict from outside whose contents are not read yet (``outside``: the real dict) answers
    ``d[k]``, ``d.get(k)`` and ``k in d`` for that key alone, guarding only that the key is
    there (and its item) or is not; its keys and items are guarded whole when something reads
    them all (iteration, ``len``, a change). A transformers config's ``__getattribute__`` asks
    its ``__dict__`` for one key at every read: the guards checked all 45 of its items."""

    __slots__ = ("_items", "_pending", "real", "outside", "_peeked")

    def __init__(self, items: dict, source=None):
        super().__init__(source)
        self.items = dict(items)
        self.real = None  # as for ListValue
        self.outside = None
        self._peeked: dict = {}

    def lookup(self, tx, k):
        """The item at constant key ``k``, or MISSING."""
        if self._pending is None or self.outside is None or self.source is None or (
                k not in self._peeked and
                len(self._peeked) >= max(PEEK_MIN, len(self.outside) // 4)):
            # (a guard of all the keys at once is as cheap as several of one key each: a
            # config's attribute_map of 4 keys was asked for 30 names)
            return self.items.get(k, MISSING)
        found = self._peeked.get(k)
        if found is None:
            from ..guards import EqualsGuard
            from ..sources import HasKeySource, ItemSource
            from .builder import wrap

            present = k in self.outside
            tx.output.guards.add(EqualsGuard(HasKeySource(self.source, k), present))
            found = self._peeked[k] = (wrap(tx, self.outside[k], ItemSource(self.source, k))
                                       if present else MISSING)
        return found

    def peeked(self, k):
        """The item already read at key ``k`` alone (the same value once all are read), or None."""
        found = self._peeked.get(k)
        return None if found is MISSING else found

    def describe(self):
        return f"the dict {self.source.name()}" if self.source is not None else "a dict"

    def python_type(self):
        return dict

    def iterate(self, tx):
        return [const(k) for k in self.items]

    def make_iterator(self, tx):
        from .iterators import DictIterator
        return DictIterator(self)

    def length(self, tx):
        return len(self.items)

    def truthy(self, tx):
        return bool(self.items)

    def contains(self, tx, key: Value) -> bool:
        return self.lookup(tx, _key(key)) is not MISSING

    def equals(self, tx, other) -> bool | None:
        from .pyops import equals, identity
        if isinstance(other, DictValue):
            theirs = other.items
        elif isinstance(other, ConstantValue) and type(other.value) is dict:
            theirs = {k: const(v) for k, v in other.value.items()}
        else:
            return None
        mine = self.items
        if mine.keys() != theirs.keys():
            return False
        return all(identity(mine[k], theirs[k]) or equals(tx, mine[k], theirs[k]) for k in mine)

    def hasattr(self, tx, name):
        return hasattr(self.python_type(), name)

    def as_constant(self):
        return {k: v.as_constant() for k, v in self.items.items()}

    def delitem(self, tx, key):
        self._note_mutation(tx, "del")
        k = _key(key)
        if k not in self.items:
            raise Unsupported(f"del {self.describe()}[{k!r}] raises KeyError")
        del self.items[k]

    def getitem(self, tx, key):
        k = _key(key)
        found = self.lookup(tx, k)
        if found is MISSING:
            from .exceptions import raise_python
            raise_python(KeyError, k)
        return found

    def _note_mutation(self, tx, what: str):
        if self.borrowed:
            raise Unsupported(f"{what} on {self.describe()}, which comes from outside the compiled "
                              "function and cannot be written back (a default argument, or a library's object)")
        if self.source is not None:
            _ = self.items
            tx.output.side_effects.mutate_container(self)  # replayed whole after the graph

    def setitem(self, tx, key, value):
        self._note_mutation(tx, "item assignment")
        self.items[_key(key)] = value

    def getattr(self, tx, name):
        if name in DICT_METHODS and not name.startswith("__"):
            return BoundMethod(self, name)
        raise Unsupported(f"reading .{name} of {self.describe()}")

    def call_method(self, tx, name, args, kwargs):
        """``dict.name(self, ...)``, dunders included (what a dict-derived object inherits)."""
        method = DICT_METHODS.get(name)
        if method is None:
            return super().call_method(tx, name, args, kwargs)
        if name in _MUTATING:
            _mutating_outside(tx, self, name, args)
        return method(tx, self, args, kwargs)

    def reconstruct(self, cg):
        if self.source is not None:
            return cg.source_expr(self.source)
        if self.real is not None:
            return cg.const_name(self.real)
        return _rebuild(cg, self)

    def _text(self, cg) -> str:
        return "{" + ", ".join(f"{cg.literal(k)}: {cg.expr(v)}" for k, v in self.items.items()) + "}"


def _rebuild(cg, value) -> str:
    """A list or dict built in the frame, rebuilt once (every reference to it gets the same
    object), with the lists and dicts inside it rebuilt first: nested a thousand deep, it needs
    no recursion."""
    cg.shared_innermost_first((value,), _rebuilt_inside, lambda v: v._text(cg))
    return cg.shared(value, None)


def _rebuilt_inside(value) -> list:
    items = value.items.values() if type(value) is DictValue else value.items
    return [v for v in items
            if type(v) in (ListValue, DictValue) and v.source is None and v.real is None]


def _key(key: Value):
    from .tensor import TensorValue
    if isinstance(key, TensorValue):
        raise Unsupported("using a tensor as a key of a plain dict",
                          "tensor keys are captured for defaultdicts read from outside (an optimizer's "
                          "state); otherwise key the dict by a name or index")
    k = key.as_constant()
    try:
        hash(k)
    except TypeError as e:
        raise Unsupported(f"using the unhashable {type(k).__name__} as a dict key (TypeError)") from e
    return k


class IteratorValue(Value):
    """An iterator over a known list of values (from GET_ITER, iter(), zip(), enumerate()...)."""

    __slots__ = ("items", "pos")
    #: Created during capture: never an input, never identical to another value.
    fresh = True

    def __init__(self, items: list[Value]):
        super().__init__(None)
        self.items = items
        self.pos = 0

    def describe(self):
        return "an iterator"

    def make_iterator(self, tx):
        return self  # iter(it) is it

    def next(self) -> Value | None:
        if self.pos >= len(self.items):
            return None
        v = self.items[self.pos]
        self.pos += 1
        return v

    def iterate(self, tx):
        rest = self.items[self.pos:]
        self.pos = len(self.items)
        return rest

    def length(self, tx):
        raise Unsupported(f"len() of {self.describe()} (TypeError: iterators have no len())")

    def truthy(self, tx):
        return True

    def contains(self, tx, item):
        from .pyops import equals, identity
        while True:  # consumes the iterator up to the match, as Python does
            v = self.next()
            if v is None:
                return False
            if identity(v, item) or equals(tx, v, item):
                return True

    def reconstruct(self, cg):
        # The items not yet consumed, as a real iterator (a for loop split by a graph break).
        return cg.shared(self, lambda: "iter([" + ", ".join(cg.expr(v) for v in self.items[self.pos:]) + "])")


# -- method tables: name -> fn(tx, container, args, kwargs) ----------------------------------------

#: Methods that change the container: on a list or dict from outside, the change is replayed.
_MUTATING = {"append", "extend", "insert", "pop", "reverse", "clear", "update", "setdefault", "popitem",
             "sort", "remove", "__init__"}


def _mutating_outside(tx, obj, name: str, args) -> bool:
    """Before ``obj.name(...)`` changes a list or dict from outside: record the change for
    replay. True when the call itself was queued (a list whose contents were never read)."""
    if obj.source is None and not obj.borrowed:
        return False
    if obj.borrowed:
        raise Unsupported(
            f"calling .{name}() on {obj.describe()}, which comes from outside the compiled "
            "function and cannot be written back (a default argument, or a library's object)",
            "pass the list in as an argument if the compiled function should change it",
        )
    if isinstance(obj, ListValue) and obj.queue_call(tx, name, args):
        return True
    _ = obj.items
    tx.output.side_effects.mutate_container(obj)
    return False


def _none(fn):
    """A method that returns None after ``fn(tx, container, args, kwargs)``."""
    def method(tx, obj, args, kwargs):
        fn(tx, obj, args, kwargs)
        return const(None)
    return method


def _list_pop(tx, lst, args, kwargs):
    items = lst.items
    i = args[0].as_constant() if args else -1
    if not -len(items) <= i < len(items):
        raise Unsupported(f"{lst.describe()}.pop() out of range (IndexError)")
    return items.pop(i)


def _list_sort(tx, lst, args, kwargs):
    from .builtins import sorted_values
    if args:
        raise Unsupported("list.sort() takes keyword arguments only (TypeError)")
    lst.items[:] = sorted_values(tx, lst.items, kwargs)


def _list_remove(tx, lst, args, kwargs):
    from .pyops import equals, identity
    items = lst.items
    for i, v in enumerate(items):
        if identity(v, args[0]) or equals(tx, v, args[0]):
            del items[i]
            return
    raise Unsupported(f"{lst.describe()}.remove(x) with x not in the list (ValueError)")


LIST_METHODS = {
    **SEQUENCE_METHODS,
    "append": _none(lambda tx, lst, args, kw: lst.items.append(args[0])),
    "extend": _none(lambda tx, lst, args, kw: lst.items.extend(args[0].iterate(tx))),
    "insert": _none(lambda tx, lst, args, kw: lst.items.insert(args[0].as_constant(), args[1])),
    "pop": _list_pop,
    "sort": _none(_list_sort),
    "remove": _none(_list_remove),
    "reverse": _none(lambda tx, lst, args, kw: lst.items.reverse()),
    "clear": _none(lambda tx, lst, args, kw: lst.items.clear()),
    "copy": lambda tx, lst, args, kw: ListValue(lst.items),
}


def _dict_view(view):
    def method(tx, d, args, kwargs):
        from .iterators import DictView
        return DictView(d, view)
    return method


def _dict_get(tx, d, args, kwargs):
    found = d.lookup(tx, _key(args[0]))
    return found if found is not MISSING else (args[1] if len(args) > 1 else const(None))


def _dict_popitem(tx, d, args, kwargs):
    if not d.items:
        raise Unsupported(f"{d.describe()}.popitem() on an empty dict (KeyError)")
    k = next(reversed(d.items))
    return TupleValue([const(k), d.items.pop(k)])


def _dict_update(tx, d, args, kwargs):
    if len(args) > 1:
        raise Unsupported(f"dict.update() with {len(args)} positional arguments (TypeError)")
    src = args[0] if args else None
    if isinstance(src, DictValue):
        d.items.update(src.items)
    elif src is not None:
        for pair in src.iterate(tx):
            k, v = pair.iterate(tx)
            d.items[k.as_constant()] = v
    d.items.update(kwargs)


def _dict_pop(tx, d, args, kwargs):
    k = _key(args[0])
    if k in d.items:
        return d.items.pop(k)
    if len(args) > 1:
        return args[1]
    raise Unsupported(f"{d.describe()}.pop(k) with k not in the dict (KeyError)")


def _dict_setdefault(tx, d, args, kwargs):
    return d.items.setdefault(_key(args[0]), args[1] if len(args) > 1 else const(None))


def _positional(fn, n: int):
    """A dict dunder called with exactly ``n`` positional arguments and no keywords."""
    def method(tx, d, args, kwargs):
        if kwargs or len(args) != n:
            raise Unsupported(f"dict method with {len(args)} arguments and keywords {sorted(kwargs)} (TypeError)")
        return fn(tx, d, *args)
    return method


DICT_METHODS = {
    "keys": _dict_view("keys"), "values": _dict_view("values"), "items": _dict_view("items"),
    "get": _dict_get,
    "copy": lambda tx, d, args, kw: DictValue(d.items),
    "clear": _none(lambda tx, d, args, kw: d.items.clear()),
    "popitem": _dict_popitem,
    "update": _none(_dict_update),
    "pop": _dict_pop,
    "setdefault": _dict_setdefault,
    "__contains__": _positional(lambda tx, d, k: const(d.contains(tx, k)), 1),
    "__init__": _none(_dict_update),
    "__getitem__": _positional(lambda tx, d, k: d.getitem(tx, k), 1),
    "__setitem__": _positional(lambda tx, d, k, v: (d.setitem(tx, k, v), const(None))[1], 2),
    "__delitem__": _positional(lambda tx, d, k: (d.delitem(tx, k), const(None))[1], 1),
    "__len__": _positional(lambda tx, d: const(d.length(tx)), 0),
    "__iter__": _positional(lambda tx, d: d.make_iterator(tx), 0),
}
