"""Tuples, lists, dicts and iterators whose items are symbolic values.

Containers built in the frame are fully symbolic and may be mutated freely. Containers that came
from outside the frame (with a source) are read-only here: mutating them would be a side effect
the foundation does not replay yet, so it is reported as unsupported.
"""

from __future__ import annotations

from ...errors import Unsupported
from .base import ConstantValue, Value, const


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
        return self._items

    @items.setter
    def items(self, value):
        self._pending = None
        self._items = value

    def defer(self, realize) -> "_Deferred":
        self._pending = realize
        return self


class SequenceValue(_Deferred, Value):
    __slots__ = ("_items", "_pending")
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

    def iterate(self, tx):
        return list(self.items)

    def length(self, tx):
        return len(self.items)

    def truthy(self, tx):
        return bool(self.items)

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
        except IndexError as e:
            raise Unsupported(f"{self.describe()}[{k}] is out of range") from e
        if isinstance(k, slice):
            return type(self)(item) if not isinstance(self, TupleValue) else TupleValue(item)
        return item


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

    def getattr(self, tx, name):
        names = self._names or getattr(self.cls, "_fields", None) or getattr(self.cls, "__match_args__", None)
        if names and name in names:
            return self.items[list(names).index(name)]
        if name in ("count", "index"):
            return BoundMethod(self, name)
        raise Unsupported(f"reading .{name} of {self.describe()}")

    def reconstruct(self, cg):
        if self.source is not None:
            return cg.source_expr(self.source)
        parts = [cg.expr(v) for v in self.items]
        body = "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"
        if self.cls is not None and self.cls is not tuple:
            ctor = cg.const_name(self.cls)
            return f"{ctor}({body})" if _is_structseq(self.cls) else f"{ctor}(*{body})"
        return body


def _is_structseq(cls) -> bool:
    return hasattr(cls, "n_sequence_fields")


class ListValue(SequenceValue):
    __slots__ = ()
    kind = "list"

    def python_type(self):
        return list

    def as_constant(self):
        return [v.as_constant() for v in self.items]

    def is_constant(self):
        return False  # lists are mutable: never folded into a constant

    def _check_mutable(self, what: str):
        if self.source is not None:
            raise Unsupported(
                f"{what} on {self.describe()}, which comes from outside the compiled function",
                "mutating lists from outside is not captured yet: build a new list instead",
            )

    def setitem(self, tx, key, value):
        self._check_mutable("item assignment")
        self.items[self._index(key)] = value

    def getattr(self, tx, name):
        if name in _LIST_METHODS:
            return BoundMethod(self, name)
        raise Unsupported(f"reading .{name} of {self.describe()}")

    def reconstruct(self, cg):
        if self.source is not None:
            return cg.source_expr(self.source)
        return cg.shared(self, lambda: "[" + ", ".join(cg.expr(v) for v in self.items) + "]")


_LIST_METHODS = {"append", "extend", "insert", "pop", "index", "count", "reverse", "copy", "clear"}
_MUTATING = {"append", "extend", "insert", "pop", "reverse", "clear", "update", "setdefault", "popitem"}


class DictValue(_Deferred, Value):
    """A dict with constant keys."""

    __slots__ = ("_items", "_pending")

    def __init__(self, items: dict, source=None):
        super().__init__(source)
        self.items = dict(items)

    def describe(self):
        return f"the dict {self.source.name()}" if self.source is not None else "a dict"

    def python_type(self):
        return dict

    def iterate(self, tx):
        return [const(k) for k in self.items]

    def length(self, tx):
        return len(self.items)

    def truthy(self, tx):
        return bool(self.items)

    def contains(self, key: Value) -> bool:
        return key.as_constant() in self.items

    def getitem(self, tx, key):
        k = key.as_constant()
        if k not in self.items:
            raise Unsupported(f"{self.describe()}[{k!r}] raises KeyError")
        return self.items[k]

    def setitem(self, tx, key, value):
        if self.source is not None:
            raise Unsupported(f"item assignment on {self.describe()}, which comes from outside the compiled function")
        self.items[key.as_constant()] = value

    def getattr(self, tx, name):
        if name in ("keys", "values", "items", "get", "update", "pop", "setdefault", "copy", "__contains__"):
            return BoundMethod(self, name)
        raise Unsupported(f"reading .{name} of {self.describe()}")

    def reconstruct(self, cg):
        if self.source is not None:
            return cg.source_expr(self.source)
        return cg.shared(self, lambda: "{" + ", ".join(
            f"{cg.literal(k)}: {cg.expr(v)}" for k, v in self.items.items()) + "}")


class IteratorValue(Value):
    """An iterator over a known list of values (from GET_ITER, iter(), zip(), enumerate()...)."""

    __slots__ = ("items", "pos")

    def __init__(self, items: list[Value]):
        super().__init__(None)
        self.items = items
        self.pos = 0

    def describe(self):
        return "an iterator"

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

    def reconstruct(self, cg):
        # The items not yet consumed, as a real iterator (a for loop split by a graph break).
        return cg.shared(self, lambda: "iter([" + ", ".join(cg.expr(v) for v in self.items[self.pos:]) + "])")


class BoundMethod(Value):
    """A method of a symbolic container (``lst.append``, ``d.items``...)."""

    __slots__ = ("obj", "name")

    def __init__(self, obj: Value, name: str):
        super().__init__(None)
        self.obj = obj
        self.name = name

    def describe(self):
        return f"{self.obj.describe()}.{self.name}"

    def reconstruct(self, cg):
        return f"{cg.expr(self.obj)}.{self.name}"

    def call(self, tx, args, kwargs):
        obj, name = self.obj, self.name
        if name in _MUTATING and obj.source is not None:
            raise Unsupported(
                f"calling .{name}() on {obj.describe()}, which comes from outside the compiled function",
                "mutating containers from outside is not captured yet",
            )
        if isinstance(obj, ListValue):
            items = obj.items
            if name == "append":
                items.append(args[0])
                return const(None)
            if name == "extend":
                items.extend(args[0].iterate(tx))
                return const(None)
            if name == "insert":
                items.insert(args[0].as_constant(), args[1])
                return const(None)
            if name == "pop":
                return items.pop(args[0].as_constant() if args else -1)
            if name == "reverse":
                items.reverse()
                return const(None)
            if name == "clear":
                items.clear()
                return const(None)
            if name == "copy":
                return ListValue(items)
        if isinstance(obj, SequenceValue) and name in ("index", "count"):
            consts = [v.as_constant() for v in obj.items]
            return const(getattr(consts, name)(*[a.as_constant() for a in args]))
        if isinstance(obj, DictValue):
            d = obj.items
            if name == "keys":
                return ListValue([const(k) for k in d])
            if name == "values":
                return ListValue(list(d.values()))
            if name == "items":
                return ListValue([TupleValue([const(k), v]) for k, v in d.items()])
            if name == "get":
                k = args[0].as_constant()
                return d[k] if k in d else (args[1] if len(args) > 1 else const(None))
            if name == "__contains__":
                return const(args[0].as_constant() in d)
            if name == "copy":
                return DictValue(d)
            if name == "update":
                src = args[0] if args else None
                if isinstance(src, DictValue):
                    d.update(src.items)
                elif src is not None:
                    for pair in src.iterate(tx):
                        k, v = pair.iterate(tx)
                        d[k.as_constant()] = v
                for k, v in kwargs.items():
                    d[k] = v
                return const(None)
            if name == "pop":
                k = args[0].as_constant()
                if k in d:
                    return d.pop(k)
                if len(args) > 1:
                    return args[1]
            if name == "setdefault":
                k = args[0].as_constant()
                return d.setdefault(k, args[1] if len(args) > 1 else const(None))
        raise Unsupported(f"calling {self.describe()}()")


def is_constant_like(v: Value) -> bool:
    return isinstance(v, ConstantValue) or (isinstance(v, TupleValue) and v.is_constant())
