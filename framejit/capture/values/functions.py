"""Callables: user Python functions (inlined), methods, torch functions (graph nodes or folded),
Python builtins (folded over constants), and functions created inside the frame."""

from __future__ import annotations

import functools
import inspect
import types

import torch

from ...errors import Unsupported
from .base import CellValue, Value
from .constants import const
from .containers import DictValue, ListValue, SequenceValue, TupleValue
from .contexts import AUTOCAST_QUERIES, CONTEXT_FACTORIES, fold_autocast_query
from .exceptions import raise_python
from .modules import create_module
from .tensor import ExampleOnlyAnswer, TensorValue, graph_call
from .torch_queries import torch_query

# Immutable types whose methods are pure, so calls on constants of these types fold.
_IMMUTABLE = (str, int, float, bool, complex, bytes, tuple, frozenset, range, slice, torch.Size,
              torch.dtype, torch.device, type(None), inspect.Signature, inspect.Parameter)


def fold_call_allowed(typ: type, name: str) -> bool:
    return issubclass(typ, _IMMUTABLE)


def _constants(args, kwargs):
    return [a.as_constant() for a in args], {k: v.as_constant() for k, v in kwargs.items()}


def _has_tensor(values) -> bool:
    for v in values:
        if isinstance(v, TensorValue):
            return True
        if isinstance(v, SequenceValue) and _has_tensor(v.items):
            return True
        if isinstance(v, DictValue) and _has_tensor(v.items.values()):
            return True
    return False


class UserFunctionValue(Value):
    """A Python function, inlined into the graph when called."""

    __slots__ = ("fn",)

    def __init__(self, fn: types.FunctionType, source=None):
        super().__init__(source)
        self.fn = fn

    def describe(self):
        return f"the function {self.fn.__qualname__}()"

    def python_type(self):
        return types.FunctionType

    def pinned_object(self):
        return self.fn  # guarded by identity when read from outside

    def call(self, tx, args, kwargs):
        return tx.inline_function(self.fn, args, kwargs, fn_source=self.source)

    def getattr(self, tx, name):
        if name in ("__name__", "__qualname__", "__module__", "__doc__", "__code__"):
            return const(getattr(self.fn, name))
        if name == "__get__":
            return FunctionGetValue(self.fn)
        if name in self.fn.__dict__:
            # An attribute set on the function (``helper.enabled = True``): read and guarded
            # like any attribute of an outside object.
            from ..sources import AttrSource, ObjectSource
            from .builder import wrap
            base = self.source if self.source is not None else ObjectSource(self.fn)
            return wrap(tx, self.fn.__dict__[name], AttrSource(base, name))
        if not hasattr(self.fn, name):
            self._guard_has(tx, name, False)
            raise_python(AttributeError, f"'function' object has no attribute '{name}'")
        raise Unsupported(f"reading .{name} of {self.describe()}")

    def hasattr(self, tx, name):
        """Whether the function has attribute ``name``, guarded (attributes can be set later)."""
        found = hasattr(self.fn, name)
        self._guard_has(tx, name, found)
        return found

    def _guard_has(self, tx, name, found: bool):
        import builtins

        from ..guards import EqualsGuard
        from ..sources import CallSource
        tx.output.guards.add(EqualsGuard(CallSource(builtins.hasattr, (self.fn, name)), found))

    def truthy(self, tx):
        return True  # functions define neither __bool__ nor __len__

    def reconstruct(self, cg):
        if self.source is not None:
            return cg.source_expr(self.source)
        return cg.const_name(self.fn)


class FunctionGetValue(Value):
    """``fn.__get__``: called with an object, it binds ``fn`` to it as a method (what an attribute
    read does; the LR schedulers' wrapper of ``optimizer.step`` binds the step this way)."""

    __slots__ = ("fn",)

    def __init__(self, fn: types.FunctionType):
        super().__init__(None)
        self.fn = fn

    def describe(self):
        return f"{self.fn.__qualname__}.__get__"

    def call(self, tx, args, kwargs):
        if kwargs or not 1 <= len(args) <= 2:
            raise Unsupported(f"calling {self.describe()} with these arguments")
        obj = args[0]
        if obj.is_constant() and obj.as_constant() is None:
            return UserFunctionValue(self.fn)
        return MethodValue(self.fn, obj)


class WeakRefValue(Value):
    """A ``weakref.ref`` from outside: calling it reads its referent, through the source
    ``ref()`` (guarded like any value read from outside, so a dead referent is None there)."""

    __slots__ = ("ref",)

    def __init__(self, ref, source):
        super().__init__(source)
        self.ref = ref

    def describe(self):
        return f"the weak reference {self.source.name()}"

    def call(self, tx, args, kwargs):
        from ..sources import CallResultSource
        from .builder import wrap
        if args or kwargs:
            raise Unsupported(f"calling {self.describe()} with arguments (TypeError)")
        return wrap(tx, self.ref(), CallResultSource(self.source))

    def reconstruct(self, cg):
        return cg.source_expr(self.source)


class NestedFunctionValue(Value):
    """A function created while capturing (a lambda, a nested def, a 3.11 comprehension)."""

    __slots__ = ("code", "globals", "defaults", "kwdefaults", "closure", "qualname")

    def __init__(self, code, globals_dict, defaults, kwdefaults, closure, qualname):
        super().__init__(None)
        self.code = code
        self.globals = globals_dict
        self.defaults = defaults
        self.kwdefaults = kwdefaults
        self.closure = closure
        self.qualname = qualname

    def describe(self):
        return f"the function {self.qualname}()"

    def python_type(self):
        return types.FunctionType

    def truthy(self, tx):
        return True

    def call(self, tx, args, kwargs):
        return tx.inline_code(
            self.code, self.globals, args, kwargs,
            defaults=self.defaults, kwdefaults=self.kwdefaults, closure=self.closure,
        )


class MethodValue(Value):
    """A Python function bound to a symbolic ``self`` (module or object method)."""

    __slots__ = ("fn", "obj")

    def __init__(self, fn, obj: Value, source=None):
        super().__init__(source)
        self.fn = fn
        self.obj = obj

    def describe(self):
        return f"the method {getattr(self.fn, '__qualname__', self.fn)}()"

    def python_type(self):
        return types.MethodType

    def truthy(self, tx):
        return True

    def reconstruct(self, cg):
        if self.source is not None:
            return cg.source_expr(self.source)
        return f"{cg.const_name(types.MethodType)}({cg.const_name(self.fn)}, {cg.expr(self.obj)})"

    def getattr(self, tx, name):
        from .builder import wrap_sourceless

        if name == "__func__":
            return wrap_sourceless(tx, self.fn)
        if name == "__self__":
            return self.obj
        if name in ("__name__", "__qualname__", "__doc__", "__module__"):
            return const(getattr(self.fn, name, None))
        raise Unsupported(f"reading .{name} of {self.describe()}")

    def call(self, tx, args, kwargs):
        fn = self.fn
        if isinstance(fn, types.FunctionType):
            return tx.inline_function(fn, [self.obj, *args], kwargs)
        return call_callable(tx, fn, [self.obj, *args], kwargs)


class PartialValue(Value):
    """A ``functools.partial``: created in the frame, or read from outside (its ``func``,
    ``args`` and ``keywords`` are then wrapped through their sources, so they are guarded)."""

    __slots__ = ("fn", "args", "kwargs")

    def __init__(self, fn: Value, args: list[Value], kwargs: dict[str, Value], source=None):
        super().__init__(source)
        self.fn = fn
        self.args = list(args)
        self.kwargs = dict(kwargs)

    def describe(self):
        return f"functools.partial({self.fn.describe()}, ...)"

    def python_type(self):
        return functools.partial

    def call(self, tx, args, kwargs):
        return self.fn.call(tx, [*self.args, *args], {**self.kwargs, **kwargs})

    def getattr(self, tx, name):
        if name == "func":
            return self.fn
        if name == "args":
            return TupleValue(self.args)
        if name == "keywords":
            return DictValue(self.kwargs)
        raise Unsupported(f"reading .{name} of {self.describe()}")

    def reconstruct(self, cg):
        if self.source is not None:
            return cg.source_expr(self.source)
        parts = [cg.expr(self.fn)] + [cg.expr(a) for a in self.args]
        parts += [f"{k}={cg.expr(v)}" for k, v in self.kwargs.items()]
        return f"{cg.const_name(functools.partial)}({', '.join(parts)})"


# -- torch callables ---------------------------------------------------------------------------

def _compiling_true():
    return True


_TORCH_FOLD = {
    torch.is_grad_enabled, torch.is_inference_mode_enabled, torch.get_default_dtype,
    torch.is_autocast_enabled, torch.is_tensor, torch.is_floating_point, torch.is_complex,
    torch.jit.is_scripting, torch.jit.is_tracing, torch._C._get_tracing_state,
    torch.finfo, torch.iinfo, torch.Size, torch.device, torch.get_default_device,
    torch.promote_types, torch.result_type, torch.can_cast,
}


def _group_by_device_and_dtype(tx, tensorlistlist: Value, with_indices: Value | None = None) -> Value:
    """``torch.utils._foreach_utils._group_tensors_by_device_and_dtype(lists, with_indices)``
    (foreach optimizers, ``clip_grad_norm_``): which tensors go in which group depends only on
    devices and dtypes, which are known. torch's own function is asked, on empty stand-ins, so
    the groups come out in its order."""
    lists = [lst.iterate(tx) for lst in tensorlistlist.iterate(tx)]

    def stand_in(v):
        if v.is_constant() and v.as_constant() is None:
            return None
        if not isinstance(v, TensorValue):
            raise Unsupported("grouping values that are not tensors by device and dtype")
        return torch.empty(0, dtype=v.example.dtype, device=v.device)

    real = torch._C._group_tensors_by_device_and_dtype([[stand_in(v) for v in lst] for lst in lists], True)
    groups = {}
    for key, (_, indices) in real.items():
        grouped = ListValue([ListValue([lst[i] for i in indices]) for lst in lists])
        wanted = with_indices is not None and with_indices.as_constant()
        kept = ListValue([const(i) for i in indices] if wanted else [])
        groups[key] = TupleValue([grouped, kept])
    return DictValue(groups)


_GROUP_BY_DEVICE_AND_DTYPE = {torch._C._group_tensors_by_device_and_dtype}
try:
    from torch.utils._foreach_utils import _group_tensors_by_device_and_dtype as _grouping
    _GROUP_BY_DEVICE_AND_DTYPE.add(_grouping)
except ImportError:  # an older torch
    pass

# Questions about a tensor's type that its example answers (dtype and class are guarded).
_TENSOR_QUERIES = {torch.is_tensor, torch.is_floating_point, torch.is_complex}
_TORCH_FALSE = {torch.overrides.has_torch_function, torch.overrides.has_torch_function_unary,
                torch.overrides.has_torch_function_variadic, torch.jit.is_scripting,
                torch.jit.is_tracing}
if hasattr(torch.compiler, "is_exporting"):
    _TORCH_FALSE.add(torch.compiler.is_exporting)
_TORCH_TRUE = set()
for _name in ("torch.compiler.is_compiling", "torch.compiler.is_dynamo_compiling",
              "torch._dynamo.is_compiling", "torch._utils.is_compiling"):
    try:
        _obj = eval(_name, {"torch": torch})
        _TORCH_TRUE.add(_obj)
    except Exception:
        pass
_DYNAMO_GRAPH_BREAK = getattr(torch._dynamo, "graph_break", None)
_TORCH_STATEFUL = {
    torch.manual_seed: "torch.manual_seed()", torch.seed: "torch.seed()",
    torch.set_rng_state: "torch.set_rng_state()", torch.get_rng_state: "torch.get_rng_state()",
    torch.set_default_dtype: "torch.set_default_dtype()",
    torch.use_deterministic_algorithms: "torch.use_deterministic_algorithms()",
    torch.inference_mode: "with torch.inference_mode():",
}
_FACTORY_NAMES = frozenset({
    "zeros", "ones", "empty", "full", "rand", "randn", "randint", "randperm", "arange", "linspace",
    "logspace", "eye", "tensor", "as_tensor", "scalar_tensor", "empty_strided", "normal", "tril_indices",
    "triu_indices", "bartlett_window", "hann_window", "hamming_window", "blackman_window",
})


# torch's own Python code that is inlined like user code rather than called as an operation: the
# optimizers (their step() is a loop of in-place tensor ops over the parameters and their grads).
_INLINED_TORCH_MODULES = ("torch.optim", "torch.nn.utils.clip_grad")


def _in_modules(mod: str, prefixes) -> bool:
    return any(mod == m or mod.startswith(m + ".") for m in prefixes)


def is_inlined_torch_function(obj) -> bool:
    """A Python function of torch that framejit inlines (see ``_INLINED_TORCH_MODULES``)."""
    mod = getattr(obj, "__module__", None)
    return isinstance(obj, types.FunctionType) and isinstance(mod, str) and _in_modules(mod, _INLINED_TORCH_MODULES)


def _disable_wrapper_files() -> tuple[str, ...]:
    """The files of the wrappers that hide a function from TorchDynamo: ``torch._disable_dynamo``
    (torch/_compile.py) and ``torch._dynamo.disable`` (its eval_frame.py)."""
    import os
    torch_dir = os.path.dirname(torch.__file__)
    return (os.path.join(torch_dir, "_compile.py"), os.path.join(torch_dir, "_dynamo", "eval_frame.py"))


_DISABLE_WRAPPER_FILES = _disable_wrapper_files()


def unwrap_torch_disabled(fn: types.FunctionType) -> types.FunctionType:
    """torch hides some of its own functions from TorchDynamo: ``Optimizer.zero_grad`` is marked
    with ``torch._disable_dynamo``, and the first ``torch.compile`` in a process wraps every
    optimizer's ``_init_group`` in ``torch._dynamo.disable``. In the modules framejit inlines,
    the function under such a wrapper is inlined: running it is what eager does."""
    while fn.__code__.co_filename in _DISABLE_WRAPPER_FILES:
        wrapped = getattr(fn, "__wrapped__", None)
        if not is_inlined_torch_function(wrapped):
            break
        fn = wrapped
    return fn


def is_torch_callable(obj) -> bool:
    if is_inlined_torch_function(obj):
        return False
    mod = getattr(obj, "__module__", None)
    if not isinstance(mod, str):
        # C builtins of torch._C report their module through __self__.
        owner = getattr(obj, "__self__", None)
        mod = getattr(owner, "__name__", None) if isinstance(owner, types.ModuleType) else None
        if not isinstance(mod, str):
            return False
    return _in_modules(mod, ("torch",))


class TorchFunctionValue(Value):
    """A torch function: a graph node when it sees tensors, folded when it is a pure query."""

    __slots__ = ("fn",)

    def __init__(self, fn, source=None):
        super().__init__(source)
        self.fn = fn

    def describe(self):
        return f"{_torch_name(self.fn)}"

    def python_type(self):
        return type(self.fn)

    def call(self, tx, args, kwargs):
        fn = self.fn
        factory = CONTEXT_FACTORIES.get(fn)
        if factory is not None:
            return factory(tx, args, kwargs)
        if isinstance(fn, types.FunctionType):
            from .modules import MODULE_CALLS
            if fn in MODULE_CALLS:  # nn.Module.__call__(m, x): as m(x)
                return tx.inline_function(fn, args, kwargs)
        if fn in _TORCH_STATEFUL:
            raise Unsupported(
                f"{_TORCH_STATEFUL[fn]} inside the compiled function",
                "call it before the compiled function; global torch state is guarded, so the "
                "function recompiles for each state it sees",
            )
        if fn is _DYNAMO_GRAPH_BREAK:
            if tx.f_globals.get("__name__", "").startswith("torch."):
                # torch's own code asks TorchDynamo for a break (the optimizers' step does, for
                # AOTAutograd's sake); framejit's graphs do not need it, and eager ignores it.
                return const(None)
            raise Unsupported("torch._dynamo.graph_break(), a graph break asked for in the code",
                              "remove the call to keep one graph")
        if fn in _TORCH_TRUE:
            return const(True)
        if fn in _TORCH_FALSE:
            return const(False)
        if fn in _GROUP_BY_DEVICE_AND_DTYPE:
            return _group_by_device_and_dtype(tx, *args, **kwargs)
        if fn in _TENSOR_QUERIES and len(args) == 1 and not kwargs and isinstance(args[0], TensorValue):
            return const(fn(args[0].example))
        answer = torch_query(tx, fn, args, kwargs)
        if answer is not None:
            return answer
        if fn in _TORCH_FOLD:
            a, k = _constants(args, kwargs)
            return const(fn(*a, **k))
        if fn in AUTOCAST_QUERIES:
            return fold_autocast_query(tx, fn, args, kwargs)
        if isinstance(fn, type) and issubclass(fn, torch.nn.Module):
            return create_module(tx, fn, args, kwargs)
        all_args = list(args) + list(kwargs.values())
        if _has_tensor(all_args) or getattr(fn, "__name__", "") in _FACTORY_NAMES:
            try:
                return graph_call(tx, "call_function", fn, list(args), dict(kwargs))
            except ExampleOnlyAnswer:
                if not inspect.isfunction(fn):
                    raise
                # A Python helper of torch answering a question about its tensors
                # (``_check_arg_device``): run its code on the tensor values instead.
                return tx.inline_function(fn, list(args), dict(kwargs))
        if inspect.isfunction(fn) and _foldable_module(fn) and all(v.is_constant() for v in all_args):
            # A pure Python helper of torch (mask canonicalisation, argument checks): fold it.
            a, k = _constants(args, kwargs)
            result = fn(*a, **k)
            if isinstance(result, torch.Tensor):
                raise Unsupported(f"{_torch_name(fn)}() with no tensor inputs returning a tensor")
            from .builder import wrap_sourceless
            return wrap_sourceless(tx, result)
        raise Unsupported(f"calling {_torch_name(fn)}() with no tensor arguments")

    def as_constant(self):
        # A torch function or class is a fixed object (e.g. torch.Tensor in isinstance()).
        return self.fn

    def truthy(self, tx):
        t = type(self.fn)
        if not hasattr(t, "__bool__") and not hasattr(t, "__len__"):
            return True  # a fixed object (guarded by identity) whose type makes it always true
        return super().truthy(tx)

    def pinned_object(self):
        return self.fn

    def hasattr(self, tx, name):
        return hasattr(self.fn, name)

    def getattr(self, tx, name):
        from .builder import wrap_sourceless
        try:
            attr = getattr(self.fn, name)
        except AttributeError as e:
            raise_python(AttributeError, str(e))
        return wrap_sourceless(tx, attr)

    def reconstruct(self, cg):
        return cg.const_name(self.fn)


# Python helpers in these torch modules are pure (argument checks, mask canonicalisation,
# fast-path queries), so calls with constant arguments fold. Elsewhere in torch a Python function
# with no tensor arguments may have effects (torch.cuda.set_device, torch.cuda.synchronize):
# those are not folded.
_FOLDABLE_MODULES = ("torch.nn.functional", "torch.nn.modules", "torch.overrides", "torch.jit",
                     "torch._jit_internal", "torch.functional",
                     "torch._utils", "torch.nn.modules.utils", "torch._prims_common",
                     "torch.types", "torch.utils._python_dispatch", "torch.utils._foreach_utils")


def _foldable_module(fn) -> bool:
    return _in_modules(getattr(fn, "__module__", "") or "", _FOLDABLE_MODULES)


def _torch_name(fn) -> str:
    mod = getattr(fn, "__module__", "") or ""
    name = getattr(fn, "__name__", repr(fn))
    if mod in ("torch", "torch._C._VariableFunctions") or mod.startswith("torch._C"):
        # torch.nn.functional re-exports some torch names (Tensor): classes keep "torch".
        in_functional = not isinstance(fn, type) and getattr(torch.nn.functional, name, None) is fn
        mod = "torch.nn.functional" if in_functional else "torch"
    return f"{mod}.{name}"


def call_callable(tx, fn, args, kwargs) -> Value:
    """Call a real (non-symbolic) callable with symbolic arguments."""
    from .builder import wrap_sourceless
    return wrap_sourceless(tx, fn).call(tx, args, kwargs)


__all__ = [
    "UserFunctionValue", "NestedFunctionValue", "MethodValue", "PartialValue", "TorchFunctionValue",
    "CellValue", "fold_call_allowed", "is_torch_callable", "call_callable",
]
