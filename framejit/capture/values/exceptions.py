"""Exceptions raised and caught inside the captured code.

Library code uses exceptions for control flow: ``Mapping.get`` catches the ``KeyError`` of
``self[key]``, ``Sequence.__iter__`` stops at the ``IndexError`` of ``self[i]``, ``getattr`` with a
default catches ``AttributeError``. When captured code raises (a ``raise`` statement, or an
operation whose outcome is known, and guarded, to raise), the interpreter unwinds symbolically
through the frames' exception tables to the handler Python would run (``Translator.run``), so
the path taken, with its handler, is what the graph records. An exception no captured frame
handles becomes a graph break before the call that raises: Python then raises it for real.
"""

from __future__ import annotations

from ...errors import Unsupported
from .base import Value
from .constants import NONE, const
from .containers import TupleValue
from .lookup import HEAPTYPE, metaclass_problem


class PythonRaise(Exception):  # noqa: N818 (it is an event, not an error of ours)
    """The captured code raising ``exc`` (an :class:`ExceptionValue`); unwinds to a handler."""

    def __init__(self, exc: ExceptionValue):
        super().__init__(exc.describe())
        self.exc = exc


class ExceptionValue(Value):
    """An exception object created during capture: its class and constructor arguments."""

    __slots__ = ("cls", "args", "cause", "context")
    fresh = True

    def __init__(self, cls: type, args: list[Value]):
        super().__init__(None)
        self.cls = cls
        self.args = list(args)
        self.cause: Value = NONE
        self.context: Value = NONE

    def describe(self):
        try:
            return repr(self.cls(*(a.as_constant() for a in self.args)))
        except Exception:  # arguments that are not known at capture time
            return f"a {self.cls.__name__} exception"

    def python_type(self):
        return self.cls

    def truthy(self, tx):
        return True

    def getattr(self, tx, name):
        if name == "args":
            return TupleValue(list(self.args))
        if name == "__class__":
            from .builder import wrap_sourceless
            return wrap_sourceless(tx, self.cls)
        if name == "__cause__":
            return self.cause
        if name == "__context__":
            return self.context
        raise Unsupported(f"reading .{name} of {self.describe()}")

    def reconstruct(self, cg):
        return cg.shared(self, lambda: f"{cg.const_name(self.cls)}("
                         + "".join(f"{cg.expr(a)}, " for a in self.args) + ")")


def is_exception_class(obj) -> bool:
    return isinstance(obj, type) and issubclass(obj, BaseException)


def make_exception(cls: type, args: list[Value], kwargs: dict[str, Value]) -> ExceptionValue:
    """``cls(*args)`` for an exception class whose construction is the builtin one."""
    if kwargs:
        raise Unsupported(f"{cls.__name__}() with keyword arguments")
    for klass in cls.__mro__:
        if klass is BaseException:
            break
        d = vars(klass)
        if klass.__flags__ & HEAPTYPE and ("__init__" in d or "__new__" in d or "__str__" in d):
            raise Unsupported(f"creating a {cls.__name__} exception, whose class defines its own "
                              "__init__, __new__ or __str__")
    problem = metaclass_problem(cls)
    if problem is not None:
        raise Unsupported(f"creating a {cls.__name__} exception ({problem})")
    return ExceptionValue(cls, args)


def raise_python(cls: type, *args) -> None:
    """Raise ``cls(*args)`` (constant arguments) in the captured code."""
    raise PythonRaise(ExceptionValue(cls, [const(a) for a in args]))


def as_raisable(value: Value) -> ExceptionValue:
    """What ``raise value`` raises: an exception object, or a class instantiated without
    arguments."""
    if isinstance(value, ExceptionValue):
        return value
    if value.is_constant():
        obj = value.as_constant()
        if is_exception_class(obj):
            return make_exception(obj, [], {})
    raise Unsupported(f"raising {value.describe()}",
                      "framejit captures raising exception objects it creates; raise outside "
                      "the compiled function")


def matches(exc: ExceptionValue, spec: Value) -> bool:
    """``except spec:`` on ``exc``: ``spec`` is a class or a tuple of classes."""
    if isinstance(spec, TupleValue):
        return any(matches(exc, s) for s in spec.items)
    target = spec.as_constant()
    if isinstance(target, tuple):
        return any(matches(exc, const(t)) for t in target)
    if not is_exception_class(target):
        raise Unsupported(f"`except {spec.describe()}`, which is not an exception class (TypeError)")
    return issubclass(exc.cls, target)
