"""Callables: user Python functions (inlined), methods, torch functions (graph nodes or folded),
Python builtins (folded over constants), and functions created inside the frame."""

from __future__ import annotations

import builtins
import inspect
import math
import operator
import types

import torch

from ...errors import Unsupported
from .base import CellValue, ConstantValue, Value, const
from .containers import DictValue, IteratorValue, ListValue, SequenceValue, TupleValue
from .tensor import TensorValue, graph_call

# Immutable types whose methods are pure, so calls on constants of these types fold.
_IMMUTABLE = (str, int, float, bool, complex, bytes, tuple, frozenset, range, slice, torch.Size,
              torch.dtype, torch.device, type(None))


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

    def call(self, tx, args, kwargs):
        return tx.inline_function(self.fn, args, kwargs, fn_source=self.source)

    def getattr(self, tx, name):
        if name in ("__name__", "__qualname__", "__module__", "__doc__"):
            return const(getattr(self.fn, name))
        raise Unsupported(f"reading .{name} of {self.describe()}")

    def reconstruct(self, cg):
        if self.source is not None:
            return cg.source_expr(self.source)
        return cg.const_name(self.fn)


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

    def reconstruct(self, cg):
        if self.source is not None:
            return cg.source_expr(self.source)
        return f"{cg.const_name(types.MethodType)}({cg.const_name(self.fn)}, {cg.expr(self.obj)})"

    def call(self, tx, args, kwargs):
        fn = self.fn
        if isinstance(fn, types.FunctionType):
            return tx.inline_function(fn, [self.obj, *args], kwargs)
        return call_callable(tx, fn, [self.obj, *args], kwargs)


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
_TORCH_FALSE = {torch.overrides.has_torch_function, torch.overrides.has_torch_function_unary,
                torch.overrides.has_torch_function_variadic, torch.jit.is_scripting,
                torch.jit.is_tracing}
_TORCH_TRUE = set()
for _name in ("torch.compiler.is_compiling", "torch.compiler.is_dynamo_compiling",
              "torch._dynamo.is_compiling", "torch._utils.is_compiling"):
    try:
        _obj = eval(_name, {"torch": torch})
        _TORCH_TRUE.add(_obj)
    except Exception:
        pass
_TORCH_STATEFUL = {
    torch.manual_seed: "torch.manual_seed()", torch.seed: "torch.seed()",
    torch.set_rng_state: "torch.set_rng_state()", torch.get_rng_state: "torch.get_rng_state()",
    torch.set_grad_enabled: "torch.set_grad_enabled()", torch.no_grad: "with torch.no_grad():",
    torch.enable_grad: "with torch.enable_grad():", torch.set_default_dtype: "torch.set_default_dtype()",
    torch.use_deterministic_algorithms: "torch.use_deterministic_algorithms()",
    torch.inference_mode: "with torch.inference_mode():", torch.autocast: "with torch.autocast(...):",
}
_FACTORY_NAMES = frozenset({
    "zeros", "ones", "empty", "full", "rand", "randn", "randint", "randperm", "arange", "linspace",
    "logspace", "eye", "tensor", "as_tensor", "scalar_tensor", "empty_strided", "normal", "tril_indices",
    "triu_indices", "bartlett_window", "hann_window", "hamming_window", "blackman_window",
})


def is_torch_callable(obj) -> bool:
    mod = getattr(obj, "__module__", None)
    if not isinstance(mod, str):
        # C builtins of torch._C report their module through __self__.
        owner = getattr(obj, "__self__", None)
        mod = getattr(owner, "__name__", None) if isinstance(owner, types.ModuleType) else None
        if not isinstance(mod, str):
            return False
    return mod == "torch" or mod.startswith("torch.") or mod.startswith("torch._")


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
        if fn in _TORCH_STATEFUL:
            raise Unsupported(
                f"{_TORCH_STATEFUL[fn]} inside the compiled function",
                "call it before the compiled function; global torch state is guarded, so the "
                "function recompiles for each state it sees",
            )
        if fn in _TORCH_TRUE:
            return const(True)
        if fn in _TORCH_FALSE:
            return const(False)
        if fn in _TORCH_FOLD:
            a, k = _constants(args, kwargs)
            return const(fn(*a, **k))
        if isinstance(fn, type) and issubclass(fn, torch.nn.Module):
            raise Unsupported(f"creating a {fn.__name__} module inside the compiled function",
                              "create modules in __init__, outside the compiled function")
        all_args = list(args) + list(kwargs.values())
        if _has_tensor(all_args) or getattr(fn, "__name__", "") in _FACTORY_NAMES:
            return graph_call(tx, "call_function", fn, list(args), dict(kwargs))
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

    def getattr(self, tx, name):
        from .builder import wrap_sourceless
        return wrap_sourceless(tx, getattr(self.fn, name))

    def reconstruct(self, cg):
        return cg.const_name(self.fn)


# Python helpers in these torch modules are pure (argument checks, mask canonicalisation,
# fast-path queries), so calls with constant arguments fold. Elsewhere in torch a Python function
# with no tensor arguments may have effects (torch.cuda.set_device, torch.cuda.synchronize):
# those are not folded.
_FOLDABLE_MODULES = ("torch.nn.functional", "torch.nn.modules", "torch.overrides", "torch.jit",
                     "torch._jit_internal", "torch.backends.mha", "torch.functional",
                     "torch._utils", "torch.nn.modules.utils", "torch._prims_common",
                     "torch.types", "torch.utils._python_dispatch")


def _foldable_module(fn) -> bool:
    mod = getattr(fn, "__module__", "") or ""
    return any(mod == m or mod.startswith(m + ".") for m in _FOLDABLE_MODULES)


def _torch_name(fn) -> str:
    mod = getattr(fn, "__module__", "") or ""
    name = getattr(fn, "__name__", repr(fn))
    if mod in ("torch", "torch._C._VariableFunctions") or mod.startswith("torch._C"):
        # torch.nn.functional re-exports some torch names (Tensor): classes keep "torch".
        in_functional = not isinstance(fn, type) and getattr(torch.nn.functional, name, None) is fn
        mod = "torch.nn.functional" if in_functional else "torch"
    return f"{mod}.{name}"


# -- Python builtins -----------------------------------------------------------------------------

_PRINT_HINT = ("printing and logging run Python at call time; remove them from the compiled "
               "function or call them outside it")


class BuiltinValue(Value):
    """A Python builtin or a function of ``math``/``operator``."""

    __slots__ = ("fn",)

    def __init__(self, fn, source=None):
        super().__init__(source)
        self.fn = fn

    def describe(self):
        return f"{getattr(self.fn, '__name__', self.fn)}()"

    def python_type(self):
        return type(self.fn)

    def as_constant(self):
        # A builtin is a fixed object (e.g. int and tuple in isinstance()).
        return self.fn

    def call(self, tx, args, kwargs):
        fn = self.fn
        handler = _BUILTIN_HANDLERS.get(fn)
        if handler is not None:
            return handler(tx, args, kwargs)
        if fn in _OPERATORS_ON_VALUES:
            return tx.apply_operator(fn, args)
        if all(v.is_constant() for v in args) and all(v.is_constant() for v in kwargs.values()) \
                and fn in _PURE_BUILTINS:
            a, k = _constants(args, kwargs)
            return const(fn(*a, **k))
        if fn is builtins.print:
            raise Unsupported("print()", _PRINT_HINT)
        names = ", ".join(a.describe() for a in args)
        raise Unsupported(f"calling {getattr(fn, '__name__', fn)}({names})")

    def reconstruct(self, cg):
        return cg.const_name(self.fn)


_PURE_BUILTINS = {
    abs, all, any, bool, callable, chr, divmod, float, format, frozenset, hash, int, isinstance,
    issubclass, len, max, min, ord, pow, range, repr, round, slice, sorted, str, sum, tuple, type,
    complex, bin, hex, oct,
} | {getattr(math, n) for n in dir(math) if callable(getattr(math, n)) and not n.startswith("_")}
_OPERATORS_ON_VALUES = {getattr(operator, n) for n in dir(operator)
                        if not n.startswith("_") and callable(getattr(operator, n))} - {
    operator.attrgetter, operator.itemgetter, operator.methodcaller}


def _bi_len(tx, args, kwargs):
    return const(args[0].length(tx))


def _bi_isinstance(tx, args, kwargs):
    typ = args[0].python_type()
    return const(issubclass(typ, args[1].as_constant()))


def _bi_type(tx, args, kwargs):
    if len(args) != 1:
        raise Unsupported("creating a class with type(name, bases, dict)")
    return const(args[0].python_type())


def _bi_getattr(tx, args, kwargs):
    name = args[1].as_constant()
    if len(args) > 2:
        if not _has_attr(tx, args[0], name):
            return args[2]
    return args[0].getattr(tx, name)


def _has_attr(tx, v: Value, name: str) -> bool:
    probe = getattr(v, "hasattr", None)
    if probe is not None:
        return probe(tx, name)
    if isinstance(v, ConstantValue):
        return hasattr(v.value, name)
    if isinstance(v, TensorValue):
        return hasattr(v.example, name)
    raise Unsupported(f"hasattr() on {v.describe()}")


def _bi_hasattr(tx, args, kwargs):
    return const(_has_attr(tx, args[0], args[1].as_constant()))


def _bi_iter(tx, args, kwargs):
    if isinstance(args[0], IteratorValue):
        return args[0]
    return IteratorValue(args[0].iterate(tx))


def _bi_next(tx, args, kwargs):
    it = args[0]
    if not isinstance(it, IteratorValue):
        raise Unsupported(f"next() on {it.describe()}")
    v = it.next()
    if v is None:
        if len(args) > 1:
            return args[1]
        raise Unsupported("next() on an exhausted iterator (StopIteration)")
    return v


def _bi_enumerate(tx, args, kwargs):
    start = (args[1] if len(args) > 1 else kwargs.get("start", const(0))).as_constant()
    return IteratorValue([TupleValue([const(i + start), v]) for i, v in enumerate(args[0].iterate(tx))])


def _bi_zip(tx, args, kwargs):
    seqs = [a.iterate(tx) for a in args]
    return IteratorValue([TupleValue(list(items)) for items in zip(*seqs)])


def _bi_reversed(tx, args, kwargs):
    return IteratorValue(list(reversed(args[0].iterate(tx))))


def _bi_list(tx, args, kwargs):
    return ListValue(args[0].iterate(tx) if args else [])


def _bi_tuple(tx, args, kwargs):
    if not args:
        return const(())
    items = args[0].iterate(tx)
    if all(v.is_constant() for v in items):
        return const(tuple(v.as_constant() for v in items))
    return TupleValue(items)


def _bi_dict(tx, args, kwargs):
    d = DictValue({})
    if args:
        if isinstance(args[0], DictValue):
            d.items.update(args[0].items)
        else:
            for pair in args[0].iterate(tx):
                k, v = pair.iterate(tx)
                d.items[k.as_constant()] = v
    d.items.update(kwargs)
    return d


def _bi_bool(tx, args, kwargs):
    return const(args[0].truthy(tx)) if args else const(False)


def _numeric_cast(fn):
    def handler(tx, args, kwargs):
        if args and isinstance(args[0], TensorValue):
            raise Unsupported(f"{fn.__name__}() of a tensor (reads its value into Python)",
                              "keep the value as a tensor, or move this line outside the compiled function")
        a, k = _constants(args, kwargs)
        return const(fn(*a, **k))
    return handler


def _reduce_values(op):
    def handler(tx, args, kwargs):
        items = args[0].iterate(tx) if len(args) == 1 else list(args)
        if all(v.is_constant() for v in items) and all(v.is_constant() for v in kwargs.values()):
            a = [v.as_constant() for v in items]
            k = {n: v.as_constant() for n, v in kwargs.items()}
            return const(op(a, **k))
        if op is sum:
            acc = kwargs.get("start", args[1] if len(args) > 1 else const(0))
            for v in items:
                acc = tx.apply_operator(operator.add, [acc, v])
            return acc
        raise Unsupported(f"{op.__name__}() over tensors (compares tensor values in Python)",
                          "use torch.max/torch.min/torch.any/torch.all on tensors")
    return handler


def _bi_abs(tx, args, kwargs):
    if isinstance(args[0], TensorValue):
        return graph_call(tx, "call_function", torch.abs, [args[0]], {})
    return const(abs(args[0].as_constant()))


def _bi_sorted(tx, args, kwargs):
    items = args[0].iterate(tx)
    if not all(v.is_constant() for v in items) or kwargs:
        raise Unsupported("sorted() of values that are not plain constants")
    return ListValue([const(x) for x in sorted(v.as_constant() for v in items)])


def _bi_print(tx, args, kwargs):
    raise Unsupported("print()", _PRINT_HINT)


_BUILTIN_HANDLERS = {
    len: _bi_len, isinstance: _bi_isinstance, type: _bi_type, getattr: _bi_getattr,
    hasattr: _bi_hasattr, iter: _bi_iter, next: _bi_next, enumerate: _bi_enumerate, zip: _bi_zip,
    reversed: _bi_reversed, list: _bi_list, tuple: _bi_tuple, dict: _bi_dict, bool: _bi_bool,
    int: _numeric_cast(int), float: _numeric_cast(float), sum: _reduce_values(sum),
    min: _reduce_values(min), max: _reduce_values(max), any: _reduce_values(any),
    all: _reduce_values(all), abs: _bi_abs, sorted: _bi_sorted, print: _bi_print,
}


def call_callable(tx, fn, args, kwargs) -> Value:
    """Call a real (non-symbolic) callable with symbolic arguments."""
    from .builder import wrap_sourceless
    return wrap_sourceless(tx, fn).call(tx, args, kwargs)


__all__ = [
    "UserFunctionValue", "NestedFunctionValue", "MethodValue", "TorchFunctionValue", "BuiltinValue",
    "CellValue", "fold_call_allowed", "is_torch_callable", "call_callable",
]
