"""Python builtins and the library callables the capture understands (``functools.partial``,
``itertools``, ``collections``, ``operator``, ``math``), each as a handler over symbolic values.

Handlers follow Python's semantics, laziness included (``any`` stops at the first true item,
``zip`` and ``enumerate`` over iterators pull one item at a time), and raise
:class:`Unsupported` where Python would raise or where the answer is not known at capture time.
Pure builtins on constants (``round``, ``divmod``, ``math.sqrt``...) fold.
"""

from __future__ import annotations

import builtins
import functools
import inspect
import itertools
import math
import operator
import types

import torch

from ...errors import Unsupported
from .base import UNPINNED, Value
from .constants import NONE, ConstantValue, SymNumberValue, const
from .containers import DictValue, IteratorValue, ListValue, SequenceValue, TupleValue
from .copying import CONSTRUCTORS as COPYING_CONSTRUCTORS
from .exceptions import PythonRaise, is_exception_class, make_exception, raise_python
from .functions import MethodValue, PartialValue, UserFunctionValue
from .instances import CONSTRUCTORS as INSTANCE_CONSTRUCTORS
from .instances import make_super
from .iterators import (
    ChainIterator,
    CountIterator,
    DictIterator,
    DictView,
    EnumerateIterator,
    FilterIterator,
    LazyIteratorValue,
    ListIterator,
    MapIterator,
    RepeatIterator,
    SliceIterator,
    ZipIterator,
    as_iterator,
)
from .modules import ModuleValue
from .pycollections import CONSTRUCTORS as COLLECTION_CONSTRUCTORS
from .pycollections import DequeIterator, DequeValue, fill_dict
from .pyops import apply_operator, binary
from .tensor import TensorValue, graph_call, tensor_min_max

_PRINT_HINT = ("printing and logging run Python at call time; remove them from the compiled "
               "function or call them outside it")


def _constants(args, kwargs):
    return [a.as_constant() for a in args], {k: v.as_constant() for k, v in kwargs.items()}


def class_getitem(cls: type, key: Value) -> Value:
    """``list[Tensor]``, ``dict[str, int]``: a type annotation (``typing.cast`` takes one)."""
    k = key.as_constant()
    try:
        return const(cls[k])
    except TypeError as e:
        raise Unsupported(f"{cls.__name__}[{k!r}] raises TypeError: {e}") from e


class BuiltinValue(Value):
    """A Python builtin, a function of ``math``/``operator``, or a library callable with a
    handler here (``functools.partial``, ``itertools.chain``, ``collections.deque``...)."""

    __slots__ = ("fn",)

    def __init__(self, fn, source=None):
        super().__init__(source)
        self.fn = fn

    def describe(self):
        return f"{getattr(self.fn, '__name__', self.fn)}()"

    def python_type(self):
        return type(self.fn)

    def is_constant(self):
        return True  # a fixed object: int and tuple in isinstance(), list | None in annotations

    def as_constant(self):
        return self.fn

    def pinned_object(self):
        return self.fn

    def truthy(self, tx):
        t = type(self.fn)
        if not hasattr(t, "__bool__") and not hasattr(t, "__len__"):
            return True  # a fixed object (guarded by identity) whose type makes it always true
        return super().truthy(tx)

    def hasattr(self, tx, name):
        return hasattr(self.fn, name)

    def getitem(self, tx, key):
        if not isinstance(self.fn, type):
            return super().getitem(tx, key)
        return class_getitem(self.fn, key)

    def call(self, tx, args, kwargs):
        fn = self.fn
        handler = _BUILTIN_HANDLERS.get(fn)
        if handler is not None:
            return handler(tx, args, kwargs)
        if is_exception_class(fn):
            return make_exception(fn, args, kwargs)
        if fn in _OPERATORS_ON_VALUES:
            if kwargs:
                raise Unsupported(f"operator.{fn.__name__}() with keyword arguments (TypeError)")
            return apply_operator(tx, fn, list(args))
        if all(v.is_constant() for v in args) and all(v.is_constant() for v in kwargs.values()) \
                and fn in _PURE_BUILTINS:
            a, k = _constants(args, kwargs)
            try:
                result = fn(*a, **k)
            except Exception as e:
                raise Unsupported(f"{getattr(fn, '__name__', fn)}() raises {type(e).__name__}: {e}") from e
            from .builder import wrap_sourceless
            return wrap_sourceless(tx, result)
        if fn is builtins.print:
            raise Unsupported("print()", _PRINT_HINT)
        names = ", ".join(a.describe() for a in args)
        raise Unsupported(f"calling {getattr(fn, '__name__', fn)}({names})")

    def getattr(self, tx, name):
        fn = self.fn
        if name in ("__name__", "__qualname__", "__module__", "__doc__") and hasattr(fn, name):
            return const(getattr(fn, name))
        try:
            attr = getattr(fn, name)
        except AttributeError as e:
            raise Unsupported(f"{self.describe()} has no attribute {name!r}") from e
        if is_known_callable(attr):
            return BuiltinValue(attr)
        raise Unsupported(f"reading .{name} of {self.describe()}")

    def reconstruct(self, cg):
        return cg.const_name(self.fn)


_PURE_BUILTINS = {
    abs, all, any, bool, callable, chr, divmod, float, format, frozenset, hash, int, isinstance,
    issubclass, len, max, min, ord, pow, range, repr, round, slice, sorted, str, sum, tuple, type,
    complex, bin, hex, oct, ascii,
} | {getattr(math, n) for n in dir(math) if callable(getattr(math, n)) and not n.startswith("_")}
_OPERATORS_ON_VALUES = {getattr(operator, n) for n in dir(operator)
                        if not n.startswith("_") and callable(getattr(operator, n))} - {
    operator.attrgetter, operator.itemgetter, operator.methodcaller}

#: callable -> handler(tx, args, kwargs). Library callables listed here are wrapped as
#: BuiltinValue (see builder.py), so they are guarded by identity like builtins.
_BUILTIN_HANDLERS: dict = {}


def is_known_callable(obj) -> bool:
    try:
        return obj in _BUILTIN_HANDLERS
    except TypeError:  # unhashable
        return False


def handles(*fns):
    def register(handler):
        for fn in fns:
            _BUILTIN_HANDLERS[fn] = handler
        return handler
    return register


def _arity(name: str, args, kwargs, low: int, high: int, keywords=()):
    if not low <= len(args) <= high or set(kwargs) - set(keywords):
        raise Unsupported(f"{name}() with these arguments (TypeError)")


# -- introspection -----------------------------------------------------------------------------

@handles(len)
def _bi_len(tx, args, kwargs):
    _arity("len", args, kwargs, 1, 1)
    return const(args[0].length(tx))


@handles(isinstance)
def _bi_isinstance(tx, args, kwargs):
    _arity("isinstance", args, kwargs, 2, 2)
    typ = args[0].python_type()
    try:
        return const(issubclass(typ, args[1].as_constant()))
    except TypeError as e:
        raise Unsupported(f"isinstance() raises TypeError: {e}") from e


@handles(issubclass)
def _bi_issubclass(tx, args, kwargs):
    _arity("issubclass", args, kwargs, 2, 2)
    a, b = (v.as_constant() for v in args)
    try:
        return const(issubclass(a, b))
    except TypeError as e:
        raise Unsupported(f"issubclass() raises TypeError: {e}") from e


@handles(type)
def _bi_type(tx, args, kwargs):
    if len(args) != 1 or kwargs:
        raise Unsupported("creating a class with type(name, bases, dict)")
    from .builder import wrap_sourceless
    return wrap_sourceless(tx, args[0].python_type())


@handles(callable)
def _bi_callable(tx, args, kwargs):
    _arity("callable", args, kwargs, 1, 1)
    t = args[0].python_type()
    return const(any("__call__" in vars(k) for k in t.__mro__))


@handles(id)
def _bi_id(tx, args, kwargs):
    """``id(obj)`` of an object that is the same one on every call the guards admit (a class, a
    function, a module, an object from outside under an identity guard); other identities
    (objects the function creates, tensors) differ from call to call."""
    _arity("id", args, kwargs, 1, 1)
    v = args[0]
    if isinstance(v, ConstantValue):
        obj = v.value if isinstance(v.value, _CANONICAL) or v.value in (None, True, False) else None
    else:
        obj = v.pinned_object()
        if obj is None and v.source is not None:
            obj = v.pin(tx)
            if obj is UNPINNED:
                obj = None
    if obj is None:
        raise Unsupported(f"id() of {v.describe()}",
                          "object identities differ between the capture and each run of the "
                          "compiled code; compare objects with `is` instead")
    return const(id(obj))


_CANONICAL = (type, types.FunctionType, types.BuiltinFunctionType, types.ModuleType)


@handles(inspect.signature)
def _inspect_signature(tx, args, kwargs):
    """``inspect.signature(f)`` of a function or method whose code is known: a constant."""
    if len(args) != 1:
        raise Unsupported("inspect.signature() with these arguments")
    f = args[0]
    options = {k: v.as_constant() for k, v in kwargs.items()}
    if isinstance(f, UserFunctionValue):
        real = f.fn
    elif isinstance(f, MethodValue) and isinstance(f.fn, types.FunctionType):
        real = types.MethodType(f.fn, object())  # the signature of the bound method
    elif f.is_constant() and callable(f.as_constant()):
        real = f.as_constant()
    else:
        raise Unsupported(f"inspect.signature() of {f.describe()}")
    try:
        return const(inspect.signature(real, **options))
    except (TypeError, ValueError) as e:
        raise Unsupported(f"inspect.signature() of {f.describe()} raises {type(e).__name__}: {e}") from e


@handles(getattr)
def _bi_getattr(tx, args, kwargs):
    _arity("getattr", args, kwargs, 2, 3)
    name = args[1].as_constant()
    if len(args) > 2:
        return _read_or_missing(tx, args[0], name, lambda value: value, lambda: args[2])
    return args[0].getattr(tx, name)


def _read_or_missing(tx, v: Value, name: str, found, missing):
    """``found(v.name)``, or ``missing()`` when reading it raises AttributeError (a property
    whose getter raises it included), as ``getattr(v, name, default)`` and ``hasattr`` do."""
    try:
        known = has_attr(tx, v, name)
    except Unsupported:
        known = None  # only reading it tells (a property)
    if known is False:
        return missing()
    try:
        value = v.getattr(tx, name)
    except PythonRaise as r:
        if known is None and issubclass(r.exc.cls, AttributeError):
            return missing()
        raise
    return found(value)


def has_attr(tx, v: Value, name: str) -> bool:
    return v.hasattr(tx, name)


@handles(hasattr)
def _bi_hasattr(tx, args, kwargs):
    _arity("hasattr", args, kwargs, 2, 2)
    v, name = args[0], args[1].as_constant()
    try:
        return const(has_attr(tx, v, name))
    except Unsupported:
        return _read_or_missing(tx, v, name, lambda value: const(True), lambda: const(False))


@handles(setattr)
def _bi_setattr(tx, args, kwargs):
    _arity("setattr", args, kwargs, 3, 3)
    args[0].setattr(tx, args[1].as_constant(), args[2])
    return NONE


@handles(delattr)
def _bi_delattr(tx, args, kwargs):
    _arity("delattr", args, kwargs, 2, 2)
    deleter = getattr(args[0], "delattr", None)
    if deleter is None:
        raise Unsupported(f"delattr() on {args[0].describe()}")
    deleter(tx, args[1].as_constant())
    return NONE


@handles(super)
def _bi_super(tx, args, kwargs):
    return make_super(tx, args, kwargs)


@handles(print)
def _bi_print(tx, args, kwargs):
    raise Unsupported("print()", _PRINT_HINT)


# -- iteration ---------------------------------------------------------------------------------

@handles(iter)
def _bi_iter(tx, args, kwargs):
    if len(args) != 1 or kwargs:
        raise Unsupported("iter() with a sentinel")
    return as_iterator(tx, args[0])


@handles(next)
def _bi_next(tx, args, kwargs):
    _arity("next", args, kwargs, 1, 2)
    it = args[0]
    if not isinstance(it, IteratorValue):
        raise Unsupported(f"next() on {it.describe()} (TypeError: not an iterator)")
    v = it.next()
    if v is None:
        if len(args) > 1:
            return args[1]
        raise_python(StopIteration)
    return v


def _is_lazy_source(v: Value) -> bool:
    """Iterators are consumed item by item (another consumer may share them); lists and dicts
    are read live, item by item, as Python's iterators over them do."""
    return isinstance(v, (IteratorValue, ListValue, DictValue, DictView))


@handles(enumerate)
def _bi_enumerate(tx, args, kwargs):
    _arity("enumerate", args, kwargs, 1, 2, ("start",))
    start = (args[1] if len(args) > 1 else kwargs.get("start", const(0))).as_constant()
    if _is_lazy_source(args[0]):
        return EnumerateIterator(as_iterator(tx, args[0]), start)
    return IteratorValue([TupleValue([const(i + start), v]) for i, v in enumerate(args[0].iterate(tx))])


@handles(zip)
def _bi_zip(tx, args, kwargs):
    _arity("zip", args, kwargs, 0, 1 << 30, ("strict",))
    strict = kwargs.get("strict", const(False)).as_constant()
    if any(_is_lazy_source(a) for a in args):
        return ZipIterator([as_iterator(tx, a) for a in args], strict)
    seqs = [a.iterate(tx) for a in args]
    if strict and len({len(s) for s in seqs}) > 1:
        raise Unsupported("zip(strict=True) over iterables of different lengths (ValueError)")
    return IteratorValue([TupleValue(list(items)) for items in zip(*seqs)])


@handles(map)
def _bi_map(tx, args, kwargs):
    if len(args) < 2 or kwargs:
        raise Unsupported("map() with these arguments (TypeError)")
    return MapIterator(tx, args[0], [as_iterator(tx, a) for a in args[1:]])


@handles(filter)
def _bi_filter(tx, args, kwargs):
    _arity("filter", args, kwargs, 2, 2)
    fn = args[0]
    if fn.is_constant() and fn.as_constant() is None:
        fn = None
    return FilterIterator(tx, fn, as_iterator(tx, args[1]))


_REVERSIBLE_CONSTANTS = (tuple, list, str, bytes, range, torch.Size)


@handles(reversed)
def _bi_reversed(tx, args, kwargs):
    _arity("reversed", args, kwargs, 1, 1)

    v = args[0]
    ok = isinstance(v, (SequenceValue, DictValue, DequeValue)) \
        or (isinstance(v, ConstantValue) and isinstance(v.value, _REVERSIBLE_CONSTANTS)) \
        or (isinstance(v, ModuleValue) and isinstance(v.module, (torch.nn.Sequential, torch.nn.ModuleList)))
    if not ok:
        raise Unsupported(f"reversed() of {v.describe()}")
    if isinstance(v, ListValue):
        return ListIterator(v, reverse=True)
    if isinstance(v, DictValue):
        return DictIterator(v, reverse=True)
    if isinstance(v, DequeValue):
        return DequeIterator(v, reverse=True)
    return IteratorValue(list(reversed(v.iterate(tx))))


def _any_all(want: bool):
    def handler(tx, args, kwargs):
        _arity("any" if want else "all", args, kwargs, 1, 1)
        it = as_iterator(tx, args[0])
        while True:  # stops at the first deciding item, as Python does
            v = it.next()
            if v is None:
                return const(not want)
            if v.truthy(tx) is want:
                return const(want)
    return handler


_BUILTIN_HANDLERS[any] = _any_all(True)
_BUILTIN_HANDLERS[all] = _any_all(False)


@handles(sum)
def _bi_sum(tx, args, kwargs):
    _arity("sum", args, kwargs, 1, 2, ("start",))

    acc = kwargs.get("start", args[1] if len(args) > 1 else const(0))
    if acc.is_constant() and isinstance(acc.as_constant(), (str, bytes, bytearray)):
        raise Unsupported("sum() of strings (TypeError)")
    it = as_iterator(tx, args[0])
    while True:
        v = it.next()
        if v is None:
            return acc
        acc = binary(tx, operator.add, acc, v)


def _sort_keys(tx, items: list[Value], key: Value | None, what: str) -> list:
    keys = items if key is None else [key.call(tx, [v], {}) for v in items]
    out = []
    for k in keys:
        if not k.is_constant():
            raise Unsupported(f"{what} comparing {k.describe()}",
                              "the comparison would read tensor values; sort by Python values "
                              "(a name, an index) with key=")
        out.append(k.as_constant())
    return out


def _key_arg(kwargs) -> Value | None:
    key = kwargs.get("key")
    if key is None or (key.is_constant() and key.as_constant() is None):
        return None
    return key


def sorted_values(tx, items: list[Value], kwargs: dict[str, Value]) -> list[Value]:
    """``sorted(items, key=..., reverse=...)``, also ``list.sort``: Python's own sort over the
    keys, which must be known at capture time."""
    if set(kwargs) - {"key", "reverse"}:
        raise Unsupported("sorting with arguments other than key= and reverse= (TypeError)")
    keys = _sort_keys(tx, items, _key_arg(kwargs), "sorting")
    reverse = kwargs.get("reverse", const(False)).as_constant()
    try:
        order = sorted(range(len(items)), key=keys.__getitem__, reverse=reverse)
    except TypeError as e:
        raise Unsupported(f"sorting raises TypeError: {e}") from e
    return [items[i] for i in order]


@handles(sorted)
def _bi_sorted(tx, args, kwargs):
    _arity("sorted", args, kwargs, 1, 1, ("key", "reverse"))
    return ListValue(sorted_values(tx, as_iterator(tx, args[0]).iterate(tx), kwargs))


def _min_max(op):
    def handler(tx, args, kwargs):
        _arity(op.__name__, args, kwargs, 1, 1 << 30, ("key", "default"))
        if len(args) == 1:
            items = as_iterator(tx, args[0]).iterate(tx)
        else:
            if "default" in kwargs:
                raise Unsupported(f"{op.__name__}() with several arguments and default= (TypeError)")
            items = list(args)
        if not items:
            if "default" in kwargs:
                return kwargs["default"]
            raise Unsupported(f"{op.__name__}() of an empty sequence (ValueError)")
        key = _key_arg(kwargs)
        if key is None and _sizes_and_ints(items):
            # max(0, n - k) of symbolic sizes (MPT's ALiBi slice) stays a size: Max(0, s - k)
            sym = torch.sym_max if op is max else torch.sym_min
            return const(functools.reduce(sym, [v.held() for v in items]))
        key_values = items if key is None else [key.call(tx, [v], {}) for v in items]
        if any(isinstance(k, TensorValue) for k in key_values):
            return tensor_min_max(tx, op, items, key_values)
        keys = _sort_keys(tx, key_values, None, f"{op.__name__}()")
        try:
            best = op(range(len(items)), key=keys.__getitem__)
        except TypeError as e:
            raise Unsupported(f"{op.__name__}() raises TypeError: {e}") from e
        return items[best]
    return handler


def _sizes_and_ints(items) -> bool:
    """Ints and at least one symbolic size."""
    return any(isinstance(v, SymNumberValue) for v in items) and all(
        isinstance(v, SymNumberValue) or (type(v) is ConstantValue and type(v.value) is int)
        for v in items)


_BUILTIN_HANDLERS[min] = _min_max(min)
_BUILTIN_HANDLERS[max] = _min_max(max)


# -- constructors ------------------------------------------------------------------------------

@handles(list)
def _bi_list(tx, args, kwargs):
    _arity("list", args, kwargs, 0, 1)
    return ListValue(args[0].iterate(tx) if args else [])


@handles(tuple)
def _bi_tuple(tx, args, kwargs):
    _arity("tuple", args, kwargs, 0, 1)
    if not args:
        return const(())
    items = args[0].iterate(tx)
    if all(isinstance(v, ConstantValue) for v in items):
        return const(tuple(v.as_constant() for v in items))
    return TupleValue(items)


@handles(dict)
def _bi_dict(tx, args, kwargs):
    return fill_dict(tx, DictValue({}), args, kwargs, "dict")


@handles(bool)
def _bi_bool(tx, args, kwargs):
    _arity("bool", args, kwargs, 0, 1)
    return const(args[0].truthy(tx)) if args else const(False)


def _carried(tx, fn, args, kwargs) -> Value | None:
    """``int(v)``, ``abs(v)``, ``round(v)`` of a number carried across a graph break."""
    return args[0].unary_op(tx, fn) if len(args) == 1 and not kwargs else None


def _numeric_cast(fn):
    def handler(tx, args, kwargs):
        kept = _carried(tx, fn, args, kwargs)
        if kept is not None:
            return kept
        if args and isinstance(args[0], TensorValue):
            raise Unsupported(f"{fn.__name__}() of a tensor (reads its value into Python)",
                              "keep the value as a tensor, or move this line outside the compiled function")
        a, k = _constants(args, kwargs)
        try:
            return const(fn(*a, **k))
        except (TypeError, ValueError, OverflowError) as e:
            raise Unsupported(f"{fn.__name__}() raises {type(e).__name__}: {e}") from e
    return handler


_BUILTIN_HANDLERS[int] = _numeric_cast(int)
_BUILTIN_HANDLERS[float] = _numeric_cast(float)


@handles(abs)
def _bi_abs(tx, args, kwargs):
    _arity("abs", args, kwargs, 1, 1)
    kept = _carried(tx, abs, args, kwargs)
    if kept is not None:
        return kept
    if isinstance(args[0], TensorValue):
        return graph_call(tx, "call_function", torch.abs, [args[0]], {})
    return const(abs(args[0].as_constant()))


@handles(round)
def _bi_round(tx, args, kwargs):
    kept = _carried(tx, round, args, kwargs)
    if kept is not None:
        return kept
    if not all(v.is_constant() for v in (*args, *kwargs.values())):
        raise Unsupported(f"calling round({', '.join(a.describe() for a in args)})")
    a, k = _constants(args, kwargs)
    try:
        return const(round(*a, **k))
    except Exception as e:
        raise Unsupported(f"round() raises {type(e).__name__}: {e}") from e


# -- functools, itertools, operator ------------------------------------------------------------

@handles(functools.partial)
def _partial(tx, args, kwargs):
    if not args:
        raise Unsupported("functools.partial() without a function (TypeError)")
    fn, rest = args[0], list(args[1:])
    if isinstance(fn, PartialValue):  # partial(partial(f, a), b) is partial(f, a, b)
        return PartialValue(fn.fn, fn.args + rest, {**fn.kwargs, **kwargs})
    return PartialValue(fn, rest, dict(kwargs))


@handles(functools.reduce)
def _reduce(tx, args, kwargs):
    _arity("functools.reduce", args, kwargs, 2, 3)
    fn, it = args[0], as_iterator(tx, args[1])
    acc = args[2] if len(args) > 2 else it.next()
    if acc is None:
        raise Unsupported("functools.reduce() of an empty iterable with no initial value (TypeError)")
    while True:
        v = it.next()
        if v is None:
            return acc
        acc = fn.call(tx, [acc, v], {})


def _pool(tx, v: Value) -> list[Value]:
    return as_iterator(tx, v).iterate(tx)


@handles(itertools.product)
def _product(tx, args, kwargs):
    _arity("itertools.product", args, kwargs, 0, 1 << 30, ("repeat",))
    repeat = kwargs.get("repeat", const(1)).as_constant()
    pools = [_pool(tx, a) for a in args] * repeat  # product reads its inputs first, as Python's does
    return IteratorValue([TupleValue(list(combo)) for combo in itertools.product(*pools)])


def _combinatorics(which):
    def handler(tx, args, kwargs):
        _arity(f"itertools.{which.__name__}", args, kwargs, 1, 2, ("r",))
        pool = _pool(tx, args[0])
        r = (args[1] if len(args) > 1 else kwargs.get("r", NONE)).as_constant()
        if which is itertools.combinations and r is None:
            raise Unsupported("itertools.combinations() without r (TypeError)")
        picks = which(range(len(pool)), r) if r is not None else which(range(len(pool)))
        return IteratorValue([TupleValue([pool[i] for i in pick]) for pick in picks])
    return handler


_BUILTIN_HANDLERS[itertools.combinations] = _combinatorics(itertools.combinations)
_BUILTIN_HANDLERS[itertools.permutations] = _combinatorics(itertools.permutations)


@handles(itertools.chain)
def _chain(tx, args, kwargs):
    _arity("itertools.chain", args, kwargs, 0, 1 << 30)
    if not any(_is_lazy_source(a) for a in args):
        return IteratorValue([v for a in args for v in a.iterate(tx)])
    return ChainIterator(tx, IteratorValue(list(args)))


@handles(itertools.chain.from_iterable)
def _chain_from_iterable(tx, args, kwargs):
    _arity("itertools.chain.from_iterable", args, kwargs, 1, 1)
    return ChainIterator(tx, as_iterator(tx, args[0]))


@handles(itertools.repeat)
def _repeat(tx, args, kwargs):
    _arity("itertools.repeat", args, kwargs, 1, 2, ("times",))
    times = args[1] if len(args) > 1 else kwargs.get("times")
    if times is None:
        return RepeatIterator(args[0], None)
    return IteratorValue([args[0]] * max(0, times.as_constant()))


@handles(itertools.count)
def _count(tx, args, kwargs):
    _arity("itertools.count", args, kwargs, 0, 2, ("start", "step"))
    start = (args[0] if args else kwargs.get("start", const(0))).as_constant()
    step = (args[1] if len(args) > 1 else kwargs.get("step", const(1))).as_constant()
    return CountIterator(start, step)


@handles(itertools.islice)
def _islice(tx, args, kwargs):
    _arity("itertools.islice", args, kwargs, 2, 4)
    bounds = [a.as_constant() for a in args[1:]]
    try:
        s = slice(*bounds)
        itertools.islice((), s.start, s.stop, s.step)  # Python's own argument checks
    except (TypeError, ValueError) as e:
        raise Unsupported(f"itertools.islice() raises {type(e).__name__}: {e}") from e
    return SliceIterator(as_iterator(tx, args[0]), s.start or 0, s.stop, s.step or 1)


@handles(itertools.zip_longest)
def _zip_longest(tx, args, kwargs):
    _arity("itertools.zip_longest", args, kwargs, 0, 1 << 30, ("fillvalue",))
    if any(isinstance(a, LazyIteratorValue) for a in args):
        raise Unsupported("itertools.zip_longest() over generators")
    fill = kwargs.get("fillvalue", NONE)
    seqs = [a.iterate(tx) for a in args]
    return IteratorValue([TupleValue(list(items)) for items in itertools.zip_longest(*seqs, fillvalue=fill)])


class ItemGetterValue(Value):
    """``operator.itemgetter(*keys)`` / ``operator.attrgetter(*names)``."""

    __slots__ = ("keys", "attr")

    def __init__(self, keys: list[Value], attr: bool):
        super().__init__(None)
        self.keys = keys
        self.attr = attr

    def describe(self):
        return "operator.attrgetter()" if self.attr else "operator.itemgetter()"

    def python_type(self):
        return operator.attrgetter if self.attr else operator.itemgetter

    def _get(self, tx, obj, key: Value):
        if not self.attr:
            return obj.getitem(tx, key)
        for part in key.as_constant().split("."):
            obj = obj.getattr(tx, part)
        return obj

    def call(self, tx, args, kwargs):
        _arity(self.describe()[:-2], args, kwargs, 1, 1)
        values = [self._get(tx, args[0], k) for k in self.keys]
        return values[0] if len(values) == 1 else TupleValue(values)


def _getter(attr: bool):
    def handler(tx, args, kwargs):
        if not args or kwargs:
            raise Unsupported("operator.itemgetter()/attrgetter() without keys (TypeError)")
        return ItemGetterValue(list(args), attr=attr)
    return handler


_BUILTIN_HANDLERS[operator.itemgetter] = _getter(False)
_BUILTIN_HANDLERS[operator.attrgetter] = _getter(True)


def _register_library_constructors():
    _BUILTIN_HANDLERS.update(COLLECTION_CONSTRUCTORS)
    _BUILTIN_HANDLERS.update(INSTANCE_CONSTRUCTORS)
    _BUILTIN_HANDLERS.update(COPYING_CONSTRUCTORS)


_register_library_constructors()

__all__ = ["BuiltinValue", "is_known_callable", "has_attr"]


def _text_of(fn):
    def handler(tx, args, kwargs):
        """``str(torch.Tensor)``, ``repr(torch.float32)``: the text of a constant, class,
        function or module folds; other objects would run their own __str__/__repr__."""
        if not args:
            return const(fn())
        if len(args) != 1 or kwargs:
            raise Unsupported(f"{fn.__name__}() with more than one argument")
        value = args[0]
        if isinstance(value, TensorValue):
            raise Unsupported(f"{fn.__name__}() of a tensor (reads its values into Python)",
                              "format tensors outside the compiled function")
        try:
            obj = value.as_constant()
        except Unsupported:
            raise Unsupported(f"{fn.__name__}() of {value.describe()}") from None
        if not _is_fixed(obj):
            raise Unsupported(f"{fn.__name__}() of {value.describe()}, which runs its own "
                              f"__{'str' if fn is str else 'repr'}__")
        return const(fn(obj))

    return handler


def _is_fixed(obj) -> bool:
    """Objects whose text cannot change while guards hold."""
    if isinstance(obj, tuple):
        return all(_is_fixed(x) for x in obj)
    return isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType, types.ModuleType,
                            str, int, float, bool, complex, bytes, type(None), torch.dtype,
                            torch.device, torch.Size, range, slice))


_BUILTIN_HANDLERS[str] = _text_of(str)
_BUILTIN_HANDLERS[repr] = _text_of(repr)
