"""The symbolic value every stack slot and local holds, and the simplest kinds.

Behaviour lives here, on the value classes (``call``, ``getattr``, ``truthy``, ``iterate``,
``getitem``, ``reconstruct``), so an opcode handler stays a few lines and a new kind of value does
not touch every handler. Anything a kind does not support raises :class:`Unsupported` with the
construct named as the user wrote it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...errors import Unsupported

if TYPE_CHECKING:
    from ..interpreter import Translator


#: What :meth:`Value.pin` returns for a value whose object identity cannot be fixed by a guard.
UNPINNED = object()


class Value:
    """A value during capture. ``source`` is set when it came from outside the frame.

    The protocol below is complete: every method has a default that says "this kind does not do
    that" (raising :class:`Unsupported`, or returning None where the caller decides), and a kind
    overrides what it supports. Callers never probe with ``getattr``."""

    __slots__ = ("source",)

    #: Created during this capture: never an input, never identical to another value.
    fresh = False
    #: Read without a path (a default argument, a library's object): read, never written back.
    borrowed = False
    #: The user class of an instance (objects made in the frame or passed in), else None.
    user_class: type | None = None

    def __init__(self, source=None):
        self.source = source

    # -- what it is ------------------------------------------------------------------------------
    def describe(self) -> str:
        """The value in the user's terms, for messages."""
        return f"a {self.python_type().__name__} value"

    def python_type(self) -> type:
        raise Unsupported(f"using {self.describe()} here")

    def is_constant(self) -> bool:
        return False

    def as_constant(self):
        raise Unsupported(
            f"using {self.describe()} where a plain Python value is needed",
            "make this value a Python constant, or compute it outside the compiled function",
        )

    # -- what it does ----------------------------------------------------------------------------
    def getattr(self, tx: Translator, name: str) -> Value:
        raise Unsupported(f"reading .{name} of {self.describe()}")

    def setattr(self, tx: Translator, name: str, value: Value) -> None:
        raise Unsupported(
            f"assigning .{name} on {self.describe()}",
            "attribute writes are not captured yet: move them outside the compiled function",
        )

    def call(self, tx: Translator, args: list[Value], kwargs: dict[str, Value]) -> Value:
        raise Unsupported(f"calling {self.describe()}")

    def truthy(self, tx: Translator) -> bool:
        raise Unsupported(f"using {self.describe()} as a condition")

    def iterate(self, tx: Translator) -> list[Value]:
        raise Unsupported(f"iterating over {self.describe()}")

    def make_iterator(self, tx: Translator) -> Value:
        """``iter(self)``. A kind that overrides :meth:`iterate` overrides this too: most return
        ``IteratorValue(self.iterate(tx))``, an iterator over a snapshot of the items; mutable
        containers give iterators that read them live, as Python's do. (The default cannot build
        the snapshot iterator here: this module imports no other value module.)"""
        raise Unsupported(f"iterating over {self.describe()}")

    def length(self, tx: Translator) -> int:
        return len(self.iterate(tx))

    def getitem(self, tx: Translator, key: Value) -> Value:
        raise Unsupported(f"indexing {self.describe()}")

    def setitem(self, tx: Translator, key: Value, value: Value) -> None:
        raise Unsupported(
            f"assigning an item of {self.describe()}",
            "item assignment into objects from outside the function is not captured yet",
        )

    def delitem(self, tx: Translator, key: Value) -> None:
        raise Unsupported(f"deleting an item of {self.describe()}")

    def contains(self, tx: Translator, item: Value) -> bool:
        """``item in self``."""
        raise Unsupported(f"`in` between {item.describe()} and {self.describe()}")

    def binary_op(self, tx: Translator, fn, other: Value, reflected: bool) -> Value | None:
        """``self <fn> other`` (``other <fn> self`` when ``reflected``) for kinds that define
        their own operators (sets, user classes); None when this kind leaves it to the default
        rules (tensors become graph nodes, constants fold)."""
        return None

    def hasattr(self, tx: Translator, name: str) -> bool:
        """``hasattr(self, name)`` when it is known without reading the attribute; raising
        Unsupported makes ``hasattr`` read it instead (and catch AttributeError)."""
        raise Unsupported(f"hasattr() on {self.describe()}")

    def delattr(self, tx: Translator, name: str) -> None:
        raise Unsupported(f"deleting the attribute .{name} of {self.describe()}",
                          "attribute deletions are captured on objects created in the compiled "
                          "function; delete it outside")

    def equals(self, tx: Translator, other: Value) -> bool | None:
        """``self == other`` decided structurally (containers), or None: not decided here."""
        return None

    def pinned_object(self):
        """The one real object this value is under its guards (a module, a class, a
        function), or None when another call may bring another object."""
        return None

    def pin(self, tx: Translator):
        """Guard the identity of the object behind this value and return it (for an ``is``
        that depends on it), or :data:`UNPINNED` when that cannot be guarded."""
        return UNPINNED

    def enter(self, tx: Translator):
        """``with self:`` for context managers framejit models itself (grad mode, autocast):
        ``(exit value, value bound by as)``; None for the others (their Python ``__enter__``
        and ``__exit__`` are inlined)."""
        return None

    def call_method(self, tx: Translator, name: str, args: list[Value], kwargs: dict[str, Value]) -> Value:
        """``self.name(*args, **kwargs)`` for a method this kind implements itself (its method
        table); what :class:`BoundMethod` calls."""
        raise Unsupported(f"calling {self.describe()}.{name}()")

    def unary_op(self, tx: Translator, fn) -> Value | None:
        """``fn(self)`` for a one-argument operator or builtin (``-v``, ``int(v)``) for kinds that
        keep such results symbolic (numbers carried across a graph break); None for the
        default rules."""
        return None

    def reconstruct(self, cg) -> str:
        """A Python expression that produces this value in the generated entry function."""
        if self.source is not None:
            return cg.source_expr(self.source)
        raise Unsupported(f"returning {self.describe()} from the compiled function")


class BoundMethod(Value):
    """``obj.name`` before it is called, for a method that ``obj``'s kind implements in its
    method table (``lst.append``, ``d.items``, ``gen.send``, ``s.add``): calling it is
    ``obj.call_method(tx, name, ...)``. One class for every kind."""

    __slots__ = ("obj", "name")

    def __init__(self, obj: Value, name: str):
        super().__init__(None)
        self.obj = obj
        self.name = name

    def describe(self):
        return f"{self.obj.describe()}.{self.name}"

    def call(self, tx, args, kwargs):
        return self.obj.call_method(tx, self.name, args, kwargs)

    def reconstruct(self, cg):
        return f"{cg.expr(self.obj)}.{self.name}"


class NullValue(Value):
    """The NULL that CALL's calling convention pushes below a callable."""

    __slots__ = ()

    def describe(self):
        return "NULL"


NULL = NullValue()


class CellValue(Value):
    """A cell created in the captured code (MAKE_CELL) holding a symbolic value."""

    __slots__ = ("contents",)

    def __init__(self, contents: Value | None = None):
        super().__init__(None)
        self.contents = contents

    def describe(self):
        return "a closure cell"
