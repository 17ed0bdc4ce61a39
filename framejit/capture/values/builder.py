"""Turning real Python objects into symbolic values.

``wrap`` is for objects read from outside the frame through a source: it picks the kind of value
and adds the guard that use of the value depends on. ``wrap_sourceless`` is for objects that need
no guard (constants of the code, attributes of library modules, results folded at capture time).
"""

from __future__ import annotations

import builtins
import decimal
import enum
import fractions
import functools
import inspect
import math
import operator
import os
import sys
import sysconfig
import types
import weakref

import torch
from torch import nn

from ...errors import Unsupported
from .. import guards as G
from ..sources import ItemSource, ObjectSource, Source
from .autograd_function import AutogradFunctionApplyValue, is_custom_function_apply
from .base import Value
from .builtins import BuiltinValue, is_known_callable
from .constants import ConstantValue, const
from .containers import DictValue, ListValue, TupleValue
from .contexts import (
    AutocastRestore,
    GradModeRestore,
    wrap_autocast_restore,
    wrap_grad_mode_restore,
)
from .environ import EnvironValue
from .functions import (
    MethodValue,
    PartialValue,
    TorchFunctionValue,
    UserFunctionValue,
    WeakRefValue,
    is_torch_callable,
)
from .modules import ModuleValue
from .numbers import deferred_number, is_carried
from .objects import ClassValue, PythonModuleValue, UserObjectValue
from .torch_queries import BackendFlagsValue, is_backend_flags

_CONSTANT_TYPES = (bool, int, float, str, complex, bytes, type(None), torch.dtype, torch.device,
                   torch.Size, torch.layout, torch.memory_format, type(Ellipsis), range, slice,
                   types.CodeType, inspect.Signature, inspect.Parameter)
_BUILTIN_CALLABLES = {v for v in vars(builtins).values() if callable(v)}
_MODULE_FUNCS = (math, operator)


def _library_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    return tuple(os.path.realpath(p) for p in roots if p)


_LIBRARY_ROOTS = _library_roots()


_library_files: dict[str, bool] = {}


def is_library_module(module: types.ModuleType) -> bool:
    """Modules from the standard library or installed packages: their attributes are not guarded.
    A module without a file is one only if it is built into the interpreter (sys, builtins):
    ``__main__`` has none in the REPL and under ``python -c``, nor has a namespace package or
    a module made at run time, whose globals the user changes (they were taken as fixed, and a
    function reading ``scale`` kept its first value)."""
    f = getattr(module, "__file__", None)
    if f is None:
        origin = getattr(getattr(module, "__spec__", None), "origin", None)
        return module.__name__ in sys.builtin_module_names or origin in ("built-in", "frozen")
    known = _library_files.get(f)
    if known is None:  # realpath is a system call per path component: once per file
        known = _library_files[f] = os.path.realpath(f).startswith(_LIBRARY_ROOTS)
    return known


def from_library(obj) -> bool:
    """Whether a class or function was defined in a library module (see is_library_module):
    by its ``__module__``."""
    module = sys.modules.get(getattr(obj, "__module__", None) or "")
    return module is not None and is_library_module(module)


def _is_value_scalar(obj) -> bool:
    """An immutable number of a library type that is no Python number subclass: numpy's
    scalars (``np.float32``, ``np.int64``, ``np.bool_``), ``Decimal``, ``Fraction``. Taken
    as objects, only their type was guarded, and ``float(m)``, ``int(m)``, ``abs(m)`` or
    ``[...][m]`` kept the first call's value: as constants, their value is guarded too."""
    t = type(obj)
    if t.__module__ == "numpy":
        np = sys.modules.get("numpy")
        return np is not None and isinstance(obj, (np.number, np.bool_))
    return t is decimal.Decimal or t is fractions.Fraction


def _is_constant(obj) -> bool:
    """Whether ``obj`` is a constant: a number, string, ... or a tuple or frozenset of them at any
    depth. Each container looked at once, without recursion (a tuple built as ``t = (t, t)`` in
    a loop holds one tuple 2^k ways; ``t = (t, 1)`` nests thousands deep)."""
    if isinstance(obj, _CONSTANT_TYPES) or _is_value_scalar(obj):
        return True
    if type(obj) not in (tuple, frozenset):
        return False
    seen = {id(obj)}  # (containers of obj: alive while it is)
    pending = [obj]
    while pending:
        for x in pending.pop():
            if isinstance(x, _CONSTANT_TYPES) or _is_value_scalar(x):
                continue
            if type(x) not in (tuple, frozenset):
                return False
            if id(x) not in seen:
                seen.add(id(x))
                pending.append(x)
    return True


_compiled_type: list = []


def _compiled_function_type():
    if not _compiled_type:  # (imported late: framejit._C imports nothing of capture)
        from ... import _C
        _compiled_type.append(_C.CompiledFunction)
    return _compiled_type[0]


def wrap(tx, obj, source: Source) -> Value:
    """A value for ``obj`` read from ``source``, with its guard. One value per source."""
    cache = tx.output.source_values
    v = cache.get(source.key)
    if v is not None:
        return v
    v = _wrap(tx, obj, source)
    if isinstance(v, (UserObjectValue, ListValue, DictValue)):
        # A mutable object reached by two paths (a context manager's bound __exit__ and the
        # local holding it) is one value, so a write through one path is seen through the
        # other; the guard keeps them one object.
        first = tx.output.mutable_values.setdefault(id(obj), (obj, v))[1]
        if first is not v:
            tx.output.guards.add(G.AliasGuard(source, first.source, True))
            v = first
    if isinstance(v, (UserObjectValue, ModuleValue)):
        tx.output.side_effects.note_owner(v)
    elif isinstance(v, DictValue):
        tx.output.side_effects.note_dict(v, obj)
    cache[source.key] = v
    return v


def _is_carried_block_exit(source: Source, method) -> bool:
    from ..resume import is_internal_name
    return method.__func__.__name__ == "__exit__" and is_internal_name(getattr(source, "local", ""))


def _wrap(tx, obj, source: Source) -> Value:
    out = tx.output
    if type(obj) is GradModeRestore:
        return wrap_grad_mode_restore(tx, obj, source)
    if type(obj) is AutocastRestore:
        return wrap_autocast_restore(tx, obj, source)
    if isinstance(obj, torch.Tensor):
        return out.add_input(obj, source)
    if isinstance(obj, nn.Module):
        out.guards.add(G.IdGuard(source, obj))
        return ModuleValue(obj, source)
    if type(obj) in (int, float):
        return deferred_number(out, obj, source, carried=is_carried(tx, source))
    if _is_constant(obj):
        out.guards.add(G.EqualsGuard(source, obj))
        return ConstantValue(obj, source)
    t = type(obj)
    if t in (tuple, list) or (isinstance(obj, tuple) and hasattr(t, "_fields")):
        out.guards.add(G.TypeGuard(source, t))

        def sequence_items():
            out.guards.add(G.LenGuard(source, t, len(obj)))
            return [wrap(tx, x, ItemSource(source, i)) for i, x in enumerate(obj)]

        if t is list:
            return ListValue([], source).defer(sequence_items)
        return TupleValue([], source, cls=None if t is tuple else t).defer(sequence_items)
    if t is dict:
        keys = tuple(obj)
        if not all(isinstance(k, (str, int)) for k in keys):
            raise Unsupported(f"the dict {source.name()} has keys that are not strings or ints")
        out.guards.add(G.TypeGuard(source, t))
        value = DictValue({}, source)
        value.outside = obj  # (its keys read one at a time until all are: see DictValue)

        def dict_items():
            out.guards.add(G.DictKeysGuard(source, t, keys))
            return {k: value.peeked(k) or wrap(tx, obj[k], ItemSource(source, k)) for k in keys}

        return value.defer(dict_items)
    if is_backend_flags(obj):
        out.guards.add(G.IdGuard(source, obj))
        return BackendFlagsValue(obj, source)
    if isinstance(obj, types.ModuleType):
        out.guards.add(G.IdGuard(source, obj))
        return PythonModuleValue(obj, source, trusted=is_library_module(obj))
    if isinstance(obj, enum.Enum):
        out.guards.add(G.IdGuard(source, obj))
        return ConstantValue(obj, source)
    if isinstance(obj, type) and not (is_torch_callable(obj) or obj in _BUILTIN_CALLABLES or is_known_callable(obj)):
        out.guards.add(G.IdGuard(source, obj))
        return ClassValue(obj, source)
    if t is types.MethodType and is_custom_function_apply(obj.__self__, obj.__name__):
        from ..sources import AttrSource
        out.guards.add(G.TypeGuard(source, t))
        out.guards.add(G.IdGuard(AttrSource(source, "__func__"), obj.__func__))
        out.guards.add(G.IdGuard(AttrSource(source, "__self__"), obj.__self__))
        return AutogradFunctionApplyValue(obj.__self__)
    if t is types.MethodType:
        # A bound method (a new object on every attribute read, so never guarded by identity:
        # that guard failed at every call, and each call recompiled): its function is guarded
        # and its object read through ``__self__``. The function may be any callable (a
        # transformers logger's ``warning_once`` is an lru_cache wrapper).
        from ..sources import AttrSource
        out.guards.add(G.TypeGuard(source, t))
        out.guards.add(G.IdGuard(AttrSource(source, "__func__"), obj.__func__))
        owner = wrap(tx, obj.__self__, _SelfSource(source))
        if type(obj.__func__) is types.FunctionType and _is_carried_block_exit(source, obj):
            # A `with` block's __exit__ a resume function received on its stack: the end of
            # that block, left (seeing the exception) if a later break's native code raises.
            from ..ops.blocks import UserContextExit
            return UserContextExit(owner, obj.__func__)
        return MethodValue(obj.__func__, owner, source)
    if callable(obj):
        out.guards.add(G.IdGuard(source, obj))
        return _wrap_callable(tx, obj, source)
    out.guards.add(G.TypeGuard(source, t))
    return UserObjectValue(obj, source)


def _wrap_callable(tx, obj, source) -> Value:
    compiled = _compiled_function_type()
    if isinstance(obj, compiled):
        if obj.callback is None:
            raise Unsupported(f"calling {getattr(obj, '__name__', 'a function')}(), which is marked framejit.disable",
                              "disabled functions run as plain Python, outside any graph")
        return wrap_sourceless(tx, obj.fn)
    if is_torch_callable(obj) and not isinstance(obj, types.MethodType):
        if isinstance(obj, type) and issubclass(obj, nn.Module):
            return ClassValue(obj, source)
        return TorchFunctionValue(obj, source)
    if obj in _BUILTIN_CALLABLES or is_known_callable(obj) \
            or getattr(obj, "__module__", None) in ("math", "_operator", "operator"):
        return BuiltinValue(obj, source)
    if isinstance(obj, types.FunctionType):
        return UserFunctionValue(obj, source)
    if isinstance(obj, types.MethodType) and is_custom_function_apply(obj.__self__, obj.__name__):
        return AutogradFunctionApplyValue(obj.__self__)
    if isinstance(obj, types.MethodType):
        self_value = wrap(tx, obj.__self__, _SelfSource(source)) if source is not None else wrap_sourceless(tx, obj.__self__)
        return MethodValue(obj.__func__, self_value)
    if type(obj) is functools.partial:
        return _wrap_partial(tx, obj, source)
    if type(obj) is weakref.ReferenceType and source is not None:
        return WeakRefValue(obj, source)
    if isinstance(obj, (types.BuiltinFunctionType, types.BuiltinMethodType)):
        raise Unsupported(f"calling the C function {getattr(obj, '__qualname__', obj)}()",
                          "framejit cannot see inside C functions that are not torch operations")
    if source is not None:
        return UserObjectValue(obj, source)
    raise Unsupported(f"calling {obj!r}")


def _wrap_partial(tx, obj: functools.partial, source) -> Value:
    """A partial from outside: its function, arguments and keywords are read (and guarded)
    through ``p.func``, ``p.args`` and ``p.keywords``."""
    from ..sources import AttrSource

    if source is None:
        parts = [wrap_sourceless(tx, x) for x in (obj.func, obj.args, obj.keywords)]
    else:
        parts = [wrap(tx, getattr(obj, name), AttrSource(source, name)) for name in ("func", "args", "keywords")]
    fn, args, keywords = parts
    if not isinstance(keywords, DictValue):
        raise Unsupported("calling a functools.partial whose keywords are not a plain dict")
    return PartialValue(fn, args.iterate(tx), dict(keywords.items), source)


def _SelfSource(source):
    from ..sources import AttrSource
    return AttrSource(source, "__self__")


def borrowed(v, real):
    """A list or dict reached without a source (a default argument, a library's constant): read
    here but never mutated, and returned as the real object."""
    v.real = real
    return v


def wrap_sourceless(tx, obj) -> Value:
    """A value for an object that needs no guard."""
    if obj is os.environ:
        return EnvironValue()
    if isinstance(obj, torch.Tensor):
        return tx.output.add_constant_tensor(obj)
    if _is_constant(obj):
        return ConstantValue(obj)
    if isinstance(obj, (torch.SymInt, torch.SymBool, torch.SymFloat)):
        return const(obj)
    if isinstance(obj, nn.Module):
        raise Unsupported(f"using the {type(obj).__name__} module {obj!r:.40}, which framejit cannot reach from an argument or global")
    t = type(obj)
    if t is tuple:
        items = [wrap_sourceless(tx, x) for x in obj]
        return TupleValue(items)
    if t is list or (t is dict and all(isinstance(k, (str, int)) for k in obj)):
        # A library's list or dict (a registry filled at run time): read through the object
        # and guarded, as an object's attributes are below.
        return wrap(tx, obj, ObjectSource(obj))
    if t is dict:  # keyed by other objects (classes, dtypes): read as it is now
        return borrowed(DictValue({k: wrap_sourceless(tx, v) for k, v in obj.items()}), obj)
    if is_backend_flags(obj):
        return BackendFlagsValue(obj)
    if isinstance(obj, types.ModuleType):
        # (`import config` in the function: the user's module's attributes are guarded)
        if is_library_module(obj):
            return PythonModuleValue(obj, None, trusted=True)
        return PythonModuleValue(obj, ObjectSource(obj), trusted=False)
    if isinstance(obj, enum.Enum):
        return ConstantValue(obj)
    if isinstance(obj, type) and not (is_torch_callable(obj) or obj in _BUILTIN_CALLABLES or is_known_callable(obj)):
        return ClassValue(obj)
    if callable(obj):
        return _wrap_callable(tx, obj, None)
    # An object reached without a path (a library module's global, a library function's default
    # or closure): its state can change between calls (transformers' output collector is
    # switched per call), so what is read from it is read through the object and guarded;
    # taken as fixed, a compiled hook kept appending to the first call's lists.
    return wrap(tx, obj, ObjectSource(obj))
