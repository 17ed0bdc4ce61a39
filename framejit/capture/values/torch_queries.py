"""torch functions and flags that answer questions about global state (``torch.backends.*``
flags, ``torch.cuda.is_available()``, ``torch.are_deterministic_algorithms_enabled()``), and a
few that only look at their arguments' Python types (``torch.is_tensor([x])``,
``torch.jit.annotate``, ``torch.jit.isinstance``).

A global-state answer is folded into the capture and guarded: the guard asks the same question
on every call (``torch.backends.cuda.matmul.allow_tf32``, ``torch.cuda.is_available()``), so a
flag flipped between calls recompiles instead of reusing a graph built for the old value.
"""

from __future__ import annotations

import enum
import re
import types

import torch

from ...errors import Unsupported
from .base import Value
from .constants import const
from .exceptions import raise_python

# Answers that can be guarded by equality.
_ANSWER_TYPES = (bool, int, float, str, type(None), torch.dtype)


def _optional(path: str):
    try:
        return eval(path, {"torch": torch})
    except Exception:
        return None


#: Global-state questions outside torch.backends.
STATE_QUERIES = {fn for fn in (_optional(p) for p in (
    "torch.are_deterministic_algorithms_enabled", "torch.is_deterministic_algorithms_warn_only_enabled",
    "torch.is_anomaly_enabled", "torch.is_anomaly_check_nan_enabled", "torch.is_warn_always_enabled",
    "torch.get_float32_matmul_precision", "torch.get_num_threads",
    "torch.cuda.is_available", "torch.cuda.device_count", "torch.cuda.is_initialized",
    "torch.distributed.is_available", "torch.distributed.is_initialized",
    "torch.fx._symbolic_trace.is_fx_tracing", "torch.backends.mha.get_fastpath_enabled",
)) if fn is not None}

#: Function names in torch.backends.* that read a flag or a capability (and not the setters:
#: set_fastpath_enabled).
_BACKEND_QUERY = re.compile(r"^(?!set_|enable_|disable_|allow_)(is_|get_|.*_enabled$|.*_allowed$|version$)")


def fold_state_query(tx, fn, args: list[Value], kwargs: dict[str, Value]) -> Value:
    """``fn(*args)`` asked now, with its answer guarded."""
    from ..guards import EqualsGuard
    from ..sources import CallSource

    name = f"{getattr(fn, '__module__', 'torch')}.{getattr(fn, '__name__', fn)}()"
    if kwargs or not all(a.is_constant() for a in args):
        raise Unsupported(f"{name} with arguments not known at capture time")
    a = tuple(v.as_constant() for v in args)
    value = fn(*a)
    if not isinstance(value, _ANSWER_TYPES):
        raise Unsupported(f"{name} returning a {type(value).__name__}")
    tx.output.guards.add(EqualsGuard(CallSource(fn, a), value))
    return const(value)


def is_backend_flags(obj) -> bool:
    """A module of torch.backends, or one of its flag holders (``torch.backends.cuda.matmul``)."""
    if isinstance(obj, types.ModuleType):
        name = obj.__name__
    elif isinstance(obj, (type, enum.Enum)):
        return False
    else:
        name = getattr(type(obj), "__module__", None)
        if not isinstance(name, str):
            return False
    return name == "torch.backends" or name.startswith("torch.backends.")


class BackendFlagsValue(Value):
    """``torch.backends.cudnn``, ``torch.backends.cuda.matmul``: each flag read is guarded on
    its current value; query functions (``is_available()``, ``flash_sdp_enabled()``) fold with
    a guard."""

    __slots__ = ("obj",)

    def __init__(self, obj, source=None):
        super().__init__(source)
        self.obj = obj

    def describe(self):
        return getattr(self.obj, "__name__", None) or f"the {type(self.obj).__name__} object"

    def python_type(self):
        return type(self.obj)

    def as_constant(self):
        return self.obj

    def pinned_object(self):
        return self.obj

    def hasattr(self, tx, name):
        return hasattr(self.obj, name)

    def getattr(self, tx, name):
        from ..guards import EqualsGuard
        from ..sources import AttrSource, ObjectSource
        from .builder import wrap_sourceless

        try:
            value = getattr(self.obj, name)
        except AttributeError as e:
            raise_python(AttributeError, str(e))
        if isinstance(value, _ANSWER_TYPES):
            tx.output.guards.add(EqualsGuard(AttrSource(ObjectSource(self.obj), name), value))
            return const(value)
        if is_backend_flags(value):
            return BackendFlagsValue(value)
        if callable(value) and not isinstance(value, type) and _BACKEND_QUERY.match(name):
            return StateQueryValue(value)
        return wrap_sourceless(tx, value)

    def reconstruct(self, cg):
        return cg.const_name(self.obj)


class StateQueryValue(Value):
    """A function that reads global state (see :func:`fold_state_query`)."""

    __slots__ = ("fn",)

    def __init__(self, fn):
        super().__init__(None)
        self.fn = fn

    def describe(self):
        return f"{getattr(self.fn, '__module__', '')}.{getattr(self.fn, '__name__', '')}()"

    def python_type(self):
        return type(self.fn)

    def call(self, tx, args, kwargs):
        if kwargs or not all(a.is_constant() for a in args):
            # Not a question about global state (cudnn.is_acceptable(tensor)): as before.
            from .builder import wrap_sourceless
            return wrap_sourceless(tx, self.fn).call(tx, args, kwargs)
        return fold_state_query(tx, self.fn, args, kwargs)

    def reconstruct(self, cg):
        return cg.const_name(self.fn)


# -- questions about Python types ----------------------------------------------------------------

def _type_question(fn, value: Value):
    """``torch.is_tensor(v)`` / ``torch.is_storage(v)`` of a value that is not a tensor: answered
    by its Python type (None when that is not known)."""
    try:
        t = value.python_type()
    except Unsupported:
        return None
    if fn is torch.is_tensor:
        return issubclass(t, torch.Tensor)
    if fn is torch.is_storage:
        return t in torch._storage_classes
    return None


def _jit_annotate(tx, args, kwargs):
    """``torch.jit.annotate(T, v)`` is ``v`` outside TorchScript."""
    if kwargs or len(args) != 2:
        raise Unsupported("torch.jit.annotate() with these arguments (TypeError)")
    return args[1]


def _jit_isinstance(tx, args, kwargs):
    """``torch.jit.isinstance(v, T)`` for a plain class ``T`` is ``isinstance(v, T)``."""
    if kwargs or len(args) != 2:
        raise Unsupported("torch.jit.isinstance() with these arguments (TypeError)")
    target = args[1].as_constant()
    if not isinstance(target, type):
        raise Unsupported(f"torch.jit.isinstance() with the container type {target!r}")
    return const(issubclass(args[0].python_type(), target))


_PASS_THROUGH = {torch.jit.annotate: _jit_annotate, torch.jit.isinstance: _jit_isinstance}


def torch_query(tx, fn, args: list[Value], kwargs: dict[str, Value]) -> Value | None:
    """The answer of a torch query function ``fn``, or None when ``fn`` is not one."""
    try:
        handler = _PASS_THROUGH.get(fn)
        is_state = fn in STATE_QUERIES
    except TypeError:  # unhashable
        return None
    if handler is not None:
        return handler(tx, args, kwargs)
    if is_state:
        return fold_state_query(tx, fn, args, kwargs)
    if fn in (torch.is_tensor, torch.is_storage) and len(args) == 1 and not kwargs:
        answer = _type_question(fn, args[0])
        if answer is not None:
            return const(answer)
    return None
