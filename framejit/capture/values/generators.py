"""Generators: calling a generator function (a generator expression, a ``def`` with ``yield``)
creates a :class:`GeneratorValue` holding a suspended translator of its code; each ``next()``
runs that translator until its next ``yield`` (the ``YIELD_VALUE`` handler raises
:class:`YieldSignal`, which stops the run) or its ``return``.

So a generator runs exactly as lazily as in Python: ``any(t.requires_grad for t in ts)`` stops
at the first true item, and a generator body that reads state the consumer changes between
items sees each change. Coroutines and async generators are not captured.
"""

from __future__ import annotations

import types

from ...errors import Unsupported
from .. import compat
from .base import BoundMethod, Value
from .constants import NONE, const
from .exceptions import PythonRaise
from .iterators import LazyIteratorValue

_CO_GENERATOR = 0x20


class YieldSignal(Exception):
    """Raised by ``YIELD_VALUE`` to suspend the generator's translator with ``value``."""

    def __init__(self, value: Value):
        self.value = value


def inline_generator(tx, code, f_globals, args, kwargs, *, defaults=None, kwdefaults=None,
                     closure=None, name=None, defaults_source=None) -> Value:
    """Calling a generator function: bind the arguments now (errors in the call happen at the
    call, as in Python) and return the suspended generator; its body runs when iterated."""
    from ..interpreter import Translator, bind_arguments

    name = name or code.co_name
    if code.co_flags & compat.CO_GENERATOR_LIKE != _CO_GENERATOR:
        raise Unsupported(f"calling the coroutine or async generator function {name}()",
                          "coroutines and async generators are not captured; await them outside "
                          "the compiled function")
    limit = tx.output.options.max_inline_depth
    if tx.depth >= limit:
        raise Unsupported(f"calls nested more than {limit} deep (recursion?)")
    # (The same set-up as Translator.inline_code, without running the frame.)
    builtins = tx.f_builtins if f_globals is tx.f_globals else f_globals.get("__builtins__", tx.f_builtins)
    frame = Translator(tx.output, code, f_globals, builtins, parent=tx)
    if isinstance(frame.f_builtins, types.ModuleType):
        frame.f_builtins = vars(frame.f_builtins)
    bind_arguments(tx, frame, code, args, kwargs, defaults, kwdefaults, defaults_source)
    for cell_name, cell in zip(code.co_freevars, closure or ()):
        frame.cells[cell_name] = cell
    gen = GeneratorValue(frame, name)
    root = tx
    while root.parent is not None:
        root = root.parent
    root.generators.append(gen)  # checked when the capture ends (Translator.check_generators)
    return gen


_CREATED, _SUSPENDED, _RUNNING, _DONE = "created", "suspended", "running", "done"


class GeneratorValue(LazyIteratorValue):
    """A generator object created during capture; ``frame`` is its suspended translator."""

    __slots__ = ("frame", "name", "state", "result", "sent")
    kind = "generator"

    def __init__(self, frame, name: str):
        super().__init__()
        self.frame = frame
        self.name = name
        self.state = _CREATED
        #: The generator's return value once it has finished (the value of ``yield from``).
        self.result: Value = NONE
        self.sent: Value = NONE

    def describe(self):
        return f"the generator {self.name}()"

    def python_type(self):
        return types.GeneratorType

    def truthy(self, tx):
        return True

    def send(self, value: Value) -> Value | None:
        """``gen.send(value)``: the next yielded value, or None once the generator returned."""
        self.sent = value
        return self.next()

    def _next(self):
        sent, self.sent = self.sent, NONE
        return self.resume(sent)

    def resume(self, sent: Value) -> Value | None:
        if self.state == _DONE:
            return None
        if self.state == _RUNNING:
            raise Unsupported(f"{self.describe()} resuming itself (ValueError: generator already executing)")
        if self.state == _SUSPENDED:
            self.frame.push(sent)  # the value of the `yield` expression
        elif not (sent.is_constant() and sent.as_constant() is None):
            raise Unsupported("sending a value to a just-started generator (TypeError)")
        self.state = _RUNNING
        try:
            result = self.frame.run()
        except YieldSignal as y:
            self.state = _SUSPENDED
            return y.value
        except PythonRaise as r:
            self.state = _DONE
            if issubclass(r.exc.cls, StopIteration):
                raise Unsupported(f"{self.describe()} raising StopIteration (RuntimeError: "
                                  "generator raised StopIteration)") from None
            raise
        except Unsupported as e:
            self.state = _DONE
            parent = self.frame.parent
            if parent is not None:
                e.stack.append(parent.location())
            raise
        except BaseException:
            self.state = _DONE
            raise
        self.state = _DONE
        self.result = result
        return None

    def call_method(self, tx, name, args, kwargs):
        if name in ("send", "__next__", "close"):
            return _generator_method(tx, self, name, args, kwargs)
        return super().call_method(tx, name, args, kwargs)

    def _delegate(self) -> GeneratorValue | None:
        """The generator a ``yield from`` this one is paused in delegates to."""
        frame = self.frame
        if self.state != _SUSPENDED or frame.insts[frame.pc - 2].name != "SEND":
            return None
        receiver = frame.stack[-1]
        return receiver if isinstance(receiver, GeneratorValue) else None

    def paused_in_try(self) -> GeneratorValue | None:
        """The generator, this one or one its ``yield from`` delegates to, paused inside a
        ``try`` block, whose ``except``/``finally`` blocks would run when this one is closed
        (by ``close()``, or by Python when it is dropped); None if closing runs no code."""
        if self.state != _SUSPENDED:
            return None
        frame = self.frame
        entry = frame.insts[frame.pc - 1].handler
        if entry is not None and frame.insts[entry[0]].name == compat.YIELD_FROM_HANDLER:
            entry = frame.insts[entry[0]].handler  # what covers the `yield from` statement
        if entry is not None:  # GeneratorExit would run the handlers around the `yield`
            return self
        delegate = self._delegate()
        return delegate.paused_in_try() if delegate is not None else None

    def close(self):
        """``gen.close()``: GeneratorExit at the paused ``yield``, after closing the generator a
        ``yield from`` there delegates to, as Python does. Captured when that runs none of their
        code: no ``try`` around either ``yield``."""
        paused = self.paused_in_try()
        if paused is not None:
            raise Unsupported(f"closing {paused.describe()} while it is paused inside a `try` block",
                              "closing runs its `except`/`finally` blocks, which is not captured")
        delegate = self._delegate()
        if delegate is not None:
            delegate.close()
        self.state = _DONE
        self.exhausted = True

    def getattr(self, tx, name):
        if name in ("send", "__next__", "close"):
            return BoundMethod(self, name)
        if name == "__name__":
            return const(self.name)
        raise Unsupported(f"reading .{name} of {self.describe()}")


def _generator_method(tx, obj, name: str, args, kwargs):
    what = f"{obj.describe()}.{name}"
    gen = obj
    if kwargs or len(args) != (1 if name == "send" else 0):
        raise Unsupported(f"calling {what}() with these arguments (TypeError)")
    if name == "close":
        gen.close()
        return NONE
    v = gen.send(args[0]) if name == "send" else gen.next()
    if v is None:
        raise Unsupported(f"{what}() on a finished generator (StopIteration)")
    return v


