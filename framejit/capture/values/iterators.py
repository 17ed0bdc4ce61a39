"""Iterators whose items are computed only when asked for: generators (see ``generators.py``),
``map``, ``filter``, and ``zip``/``enumerate``/``itertools.chain`` over such iterators.

Python runs these lazily, and the order matters whenever producing an item has an effect the
consumer can see (a generator that reads a list the loop appends to, a ``map`` whose function
mutates state, ``any()`` that stops at the first true item). Each lazy iterator therefore
computes one item per ``next()``, exactly when Python would.

They subclass :class:`IteratorValue` so that ``GET_ITER``/``FOR_ITER`` and ``next()`` treat them
like any iterator. Their remaining items are known in advance only when they only rearrange
iterators of known items (``enumerate(zip(xs, ys))``): then ``items`` and ``reconstruct`` give
them (a graph break can hand the loop over); otherwise both raise :class:`Unsupported`.
"""

from __future__ import annotations

import itertools

from ...errors import Unsupported
from .base import Value
from .constants import const
from .containers import IteratorValue, TupleValue
from .exceptions import raise_python
from .pyops import sequence_contains

#: Items one lazy iterator may produce during a capture before it is taken as endless.
MAX_ITEMS = 10_000


def remaining(it: IteratorValue) -> list[Value] | None:
    """The items ``it`` has left, when they are known without running anything."""
    if isinstance(it, LazyIteratorValue):
        return it.peek()
    return it.items[it.pos:]


def as_iterator(tx, v: Value) -> IteratorValue:
    """``iter(v)``: iterators are themselves; lists and dicts give live iterators; anything
    else iterable is snapshotted into one."""
    return v.make_iterator(tx)


class LazyIteratorValue(IteratorValue):
    """Base of iterators that compute each item in ``_next()`` (None when exhausted)."""

    __slots__ = ("produced", "exhausted")
    kind = "iterator"

    def __init__(self):
        Value.__init__(self, None)
        self.pos = 0
        self.produced = 0
        self.exhausted = False

    @property
    def items(self):
        rest = [] if self.exhausted else self.peek()
        if rest is None:
            raise Unsupported(f"keeping {self.describe()} across a graph break",
                              "its remaining items are computed lazily and cannot be rebuilt")
        return rest

    def peek(self) -> list[Value] | None:
        """The remaining items if they are known without running anything, else None."""
        return None

    def describe(self):
        return f"a {self.kind} object"

    def python_type(self):
        return type(iter(()))

    def _next(self) -> Value | None:
        raise NotImplementedError

    def next(self) -> Value | None:
        if self.exhausted:
            return None
        v = self._next()
        if v is None:
            self.exhausted = True
            return None
        self.produced += 1
        if self.produced > MAX_ITEMS:
            raise Unsupported(f"{self.describe()} producing more than {MAX_ITEMS} items during capture "
                              "(does it ever end?)",
                              "loops are unrolled while capturing; iterate over a bounded range")
        return v

    def iterate(self, tx):
        out = []
        while True:
            v = self.next()
            if v is None:
                return out
            out.append(v)

    def reconstruct(self, cg):
        if not self.exhausted and self.peek() is None:
            raise Unsupported(f"returning {self.describe()} from the compiled function",
                              "return a list of its items instead")
        return super().reconstruct(cg)  # iter([...remaining items])


class MapIterator(LazyIteratorValue):
    """``map(fn, *iterables)``: calls ``fn`` once per item, when the item is asked for."""

    __slots__ = ("tx", "fn", "sources")
    kind = "map"

    def __init__(self, tx, fn: Value, sources: list[IteratorValue]):
        super().__init__()
        self.tx = tx
        self.fn = fn
        self.sources = sources

    def python_type(self):
        return map

    def _next(self):
        args = []
        for it in self.sources:
            v = it.next()
            if v is None:
                return None
            args.append(v)
        return self.fn.call(self.tx, args, {})


class FilterIterator(LazyIteratorValue):
    """``filter(fn, iterable)``; ``fn`` None keeps the truthy items."""

    __slots__ = ("tx", "fn", "source")
    kind = "filter"

    def __init__(self, tx, fn: Value | None, source: IteratorValue):
        super().__init__()
        self.tx = tx
        self.fn = fn
        self.source = source

    def python_type(self):
        return filter

    def _next(self):
        while True:
            v = self.source.next()
            if v is None:
                return None
            keep = v if self.fn is None else self.fn.call(self.tx, [v], {})
            if keep.truthy(self.tx):
                return v


class ZipIterator(LazyIteratorValue):
    """``zip(*iterables)`` over iterators: pulls from each in turn and stops at the first that
    is exhausted (having taken an item from the ones before it, as Python does)."""

    __slots__ = ("sources", "strict")
    kind = "zip"

    def __init__(self, sources: list[IteratorValue], strict: bool = False):
        super().__init__()
        self.sources = sources
        self.strict = strict

    def python_type(self):
        return zip

    def _next(self):
        if not self.sources:
            return None
        items = []
        for i, it in enumerate(self.sources):
            v = it.next()
            if v is None:
                if self.strict:
                    self._check_strict(i)
                return None
            items.append(v)
        return TupleValue(items)

    def peek(self):
        rests = [remaining(it) for it in self.sources]
        if not rests or any(r is None for r in rests):
            return None
        if self.strict and len({len(r) for r in rests}) > 1:
            return None
        return [TupleValue(list(items)) for items in zip(*rests)]

    def _check_strict(self, i: int):
        if i > 0 or any(it.next() is not None for it in self.sources[1:]):
            raise Unsupported("zip(strict=True) over iterables of different lengths (ValueError)")


class EnumerateIterator(LazyIteratorValue):
    __slots__ = ("source", "count")
    kind = "enumerate"

    def __init__(self, source: IteratorValue, start: int):
        super().__init__()
        self.source = source
        self.count = start

    def python_type(self):
        return enumerate

    def peek(self):
        rest = remaining(self.source)
        if rest is None:
            return None
        return [TupleValue([const(self.count + i), v]) for i, v in enumerate(rest)]

    def _next(self):
        v = self.source.next()
        if v is None:
            return None
        item = TupleValue([const(self.count), v])
        self.count += 1
        return item


class ChainIterator(LazyIteratorValue):
    """``itertools.chain(*iterables)`` and ``chain.from_iterable``: each iterable is opened when
    the previous one is exhausted."""

    __slots__ = ("tx", "sources", "current")
    kind = "itertools.chain"

    def __init__(self, tx, sources: IteratorValue):
        super().__init__()
        self.tx = tx
        self.sources = sources
        self.current: IteratorValue | None = None

    def python_type(self):
        return itertools.chain

    def _next(self):
        while True:
            if self.current is None:
                src = self.sources.next()
                if src is None:
                    return None
                self.current = as_iterator(self.tx, src)
            v = self.current.next()
            if v is not None:
                return v
            self.current = None


class SliceIterator(LazyIteratorValue):
    """``itertools.islice(iterable, [start,] stop[, step])`` with constant bounds; it skips and
    consumes items of the source exactly as CPython's islice does."""

    __slots__ = ("source", "stop", "step", "count", "wanted")
    kind = "itertools.islice"

    def __init__(self, source: IteratorValue, start: int, stop: int | None, step: int):
        super().__init__()
        self.source = source
        self.stop = stop
        self.step = step
        self.count = 0
        self.wanted = start

    def python_type(self):
        return itertools.islice

    def _pull(self):
        v = self.source.next() if self.source is not None else None
        if v is None:
            self.source = None
        return v

    def _next(self):
        while self.count < self.wanted:
            if self._pull() is None:
                return None
            self.count += 1
        if self.stop is not None and self.count >= self.stop:
            self.source = None
            return None
        v = self._pull()
        if v is None:
            return None
        self.count += 1
        self.wanted += self.step
        if self.stop is not None and self.wanted > self.stop:
            self.wanted = self.stop
        return v


class CountIterator(LazyIteratorValue):
    """``itertools.count(start, step)`` over constants: endless, so only a consumer that stops
    (``zip`` with a finite iterable, ``islice``, a ``break``) can capture it."""

    __slots__ = ("value", "step")
    kind = "itertools.count"

    def __init__(self, start, step):
        super().__init__()
        self.value = start
        self.step = step

    def python_type(self):
        return itertools.count

    def _next(self):
        v = self.value
        self.value = v + self.step
        return const(v)


class RepeatIterator(LazyIteratorValue):
    """``itertools.repeat(obj[, times])``: the same value, ``times`` times or endlessly."""

    __slots__ = ("value", "remaining")
    kind = "itertools.repeat"

    def __init__(self, value: Value, times: int | None):
        super().__init__()
        self.value = value
        self.remaining = times

    def python_type(self):
        return itertools.repeat

    def peek(self):
        return None if self.remaining is None else [self.value] * max(0, self.remaining)

    def _next(self):
        if self.remaining is not None:
            if self.remaining <= 0:
                return None
            self.remaining -= 1
        return self.value


class ListIterator(LazyIteratorValue):
    """``iter(lst)`` (and ``reversed(lst)``): reads the list by index at each step, as Python's
    list iterator does, so a loop sees the list's changes made while it runs (``pop``,
    ``reverse``, ``append``)."""

    __slots__ = ("seq", "index", "step")
    kind = "list_iterator"

    def __init__(self, seq, reverse: bool = False):
        super().__init__()
        self.seq = seq
        self.step = -1 if reverse else 1
        self.index = len(seq.items) - 1 if reverse else 0

    def python_type(self):
        return type(iter([])) if self.step == 1 else type(reversed([]))

    def _next(self):
        items = self.seq.items
        if 0 <= self.index < len(items):
            v = items[self.index]
            self.index += self.step
            return v
        return None

    def peek(self):
        items = self.seq.items
        if self.step == 1:
            return list(items[self.index:])
        return list(reversed(items[:self.index + 1])) if self.index >= 0 else []


class DictIterator(LazyIteratorValue):
    """Iterating a dict or one of its views (``reverse``: ``reversed(d)``): keys in insertion
    order, values read live. A change of the dict's size while iterating raises RuntimeError,
    as in Python. Keys replaced at the same size (a key popped and another, or the same, put
    back) are not captured: what Python's iterator does next depends on the dict's internal
    table (it may go on over the new key, skip it, or raise), so that frame runs as Python."""

    __slots__ = ("dict_value", "view", "keys", "order", "size", "index", "reverse")
    kind = "dict_iterator"

    def __init__(self, dict_value, view: str = "keys", reverse: bool = False):
        super().__init__()
        self.dict_value = dict_value
        self.view = view
        self.order = list(dict_value.items)
        self.keys = self.order[::-1] if reverse else self.order
        self.size = len(self.keys)
        self.index = 0
        self.reverse = reverse

    def python_type(self):
        view = getattr({}, self.view)()
        return type(reversed(view) if self.reverse else iter(view))

    def _item(self, k):
        d = self.dict_value.items
        if self.view == "keys":
            return const(k)
        if self.view == "values":
            return d[k]
        return TupleValue([const(k), d[k]])

    def _next(self):
        d = self.dict_value.items
        if len(d) != self.size:
            self.exhausted = True  # Python's iterator gives up for good, too
            raise_python(RuntimeError, "dictionary changed size during iteration")
        if list(d) != self.order:
            raise Unsupported(
                "a dict whose keys changed while a loop iterated over it (at the same size)",
                "Python's next item then depends on the dict's internal table; iterate over "
                "list(d) instead, or change the dict after the loop")
        if self.index >= len(self.keys):
            return None
        self.index += 1
        return self._item(self.keys[self.index - 1])

    def peek(self):
        d = self.dict_value.items
        if len(d) != self.size or list(d) != self.order:
            return None
        return [self._item(k) for k in self.keys[self.index:]]


class DictView(Value):
    """``d.keys()``, ``d.values()``, ``d.items()``: live views of the dict (what they hold,
    their length and ``in`` follow later changes of the dict)."""

    __slots__ = ("dict_value", "view")

    def __init__(self, dict_value, view: str):
        super().__init__(None)
        self.dict_value = dict_value
        self.view = view

    def describe(self):
        return f"{self.dict_value.describe()}.{self.view}()"

    def python_type(self):
        return type(getattr({}, self.view)())

    def iterate(self, tx):
        return DictIterator(self.dict_value, self.view).iterate(tx)

    def make_iterator(self, tx):
        return DictIterator(self.dict_value, self.view)

    def length(self, tx):
        return self.dict_value.length(tx)

    def truthy(self, tx):
        return self.dict_value.truthy(tx)

    def contains(self, tx, item):
        if self.view == "keys":
            return self.dict_value.contains(tx, item)
        return sequence_contains(tx, self.iterate(tx), item)

    def reconstruct(self, cg):
        return f"{cg.expr(self.dict_value)}.{self.view}()"


def live_containers(it: Value) -> list[Value]:
    """The lists and dicts an iterator reads live (directly, or through the iterators it
    combines): what must not change behind its back when a graph break hands it over."""
    out: list[Value] = []
    todo = [it]
    while todo:
        v = todo.pop()
        if isinstance(v, ListIterator):
            out.append(v.seq)
        elif isinstance(v, DictIterator):
            out.append(v.dict_value)
        elif isinstance(getattr(v, "set_value", None), Value):  # pycollections.SetIterator
            out.append(v.set_value)
        elif isinstance(getattr(v, "deque_value", None), Value):  # pycollections.DequeIterator
            out.append(v.deque_value)
        for name in ("source", "sources", "current"):
            inner = getattr(v, name, None) if isinstance(v, LazyIteratorValue) else None
            if isinstance(inner, IteratorValue):
                todo.append(inner)
            elif isinstance(inner, list):
                todo.extend(x for x in inner if isinstance(x, IteratorValue))
    return out
