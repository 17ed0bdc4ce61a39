"""Guards: what must hold for a cache entry to be reused.

Guards are collected while a frame is captured (each value read from outside the frame adds what
its use depends on), then compiled into one Python function of the frame's argument slots. The
C hook calls it on every call, so the generated code is straight-line ``if ...: return False``
tests with shared sub-paths loaded once. When it fails, :meth:`GuardSet.failure_reason` says which
guard failed in the user's terms (``x.shape[0]: 8 → 16``) for the recompile log.
"""

from __future__ import annotations

import linecache
import reprlib
import weakref
from dataclasses import dataclass, field

import torch
from torch.overrides import _get_current_function_mode_stack as _function_mode_stack
from torch.utils._device import DeviceContext as _DeviceContext

from .. import diskcache
from ..fx_ir.graph_module import NumberPool
from .sources import ConstNames, HasKeySource, InstanceDictHasSource, Source, SourceLoader
from .values.lookup import HEAPTYPE

_guard_numbers = NumberPool()  # ___guard_N: see NumberPool

try:  # torch's C++ check of many tensors at once (GuardSet._batched_tensor_check)
    from torch._C._dynamo.guards import TensorGuards as _TensorGuards
except ImportError:
    _TensorGuards = None


#: Whether autocast is on for any device (one C call; also used by the capture's tensor code).
any_autocast_enabled = getattr(torch._C, "_is_any_autocast_enabled", None) or (
    lambda: torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda")
)


def _autocast_detail() -> tuple:
    return (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"),
            torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda"))


def device_modes() -> tuple | None:  # (in the guard of a graph captured in such a context)
    """The devices of the ``torch.device`` contexts on torch's function-mode stack (``with
    torch.device("cuda"):``, ``torch.set_default_device``), outermost first: ``()`` when the
    stack is empty, None when it holds any other mode. Those contexts only give factory calls
    their device, which capture reads (``torch.get_default_device()``): a graph is captured and
    run inside them, and guarded on them."""
    if not torch._C._len_torch_function_stack():
        return ()
    stack = _function_mode_stack()
    if not all(type(mode) is _DeviceContext for mode in stack):
        return None
    return tuple(str(mode.device) for mode in stack)


def active_modes() -> str | None:
    """The innermost user TorchFunctionMode or TorchDispatchMode active now (``with
    FlopCounterMode():``, a ``TorchDispatchMode``), named, or None. Graphs are captured and run
    outside them only: a mode sees (and may change) every torch call, which a graph's fused
    kernels never make. ``torch.device`` contexts are not such modes (see :func:`device_modes`)."""
    if device_modes() is None:
        stack = [m for m in _function_mode_stack() if type(m) is not _DeviceContext]
        return f"the TorchFunctionMode {type(stack[-1]).__name__}" if stack else "a TorchFunctionMode"
    if torch._C._len_torch_dispatch_stack():
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

        stack = _get_current_dispatch_mode_stack()
        return f"the TorchDispatchMode {type(stack[-1]).__name__}" if stack else "a TorchDispatchMode"
    return None


def _global_state() -> tuple:
    """The global torch state a captured graph depends on. Autocast details are read only when
    some autocast is on, so the common case costs one call."""
    any_autocast = bool(any_autocast_enabled())
    return (
        torch.is_grad_enabled(),
        torch.get_default_dtype(),
        any_autocast,
        _autocast_detail() if any_autocast else None,
        device_modes(),
    )


_GLOBAL_STATE_NAMES = (
    "torch.is_grad_enabled()",
    "torch.get_default_dtype()",
    "autocast enabled",
    "autocast (enabled, dtype) for cpu and cuda",
    "the torch.device contexts (with torch.device(...), torch.set_default_device)",
)


class Guard:
    """One check on one source. ``code`` renders the test; ``reason`` explains a failure."""

    source: Source
    #: Cheaper, more discriminating guards first (identity before tensor metadata).
    order = 50

    def code(self, v: str, names: ConstNames) -> list[str]:
        """Lines that ``return False`` when the guard fails; ``v`` names the value."""
        raise NotImplementedError

    def reason(self, value) -> str | None:
        """Why ``value`` fails the guard, or None if it passes."""
        raise NotImplementedError

    def implied_type(self) -> type | None:
        """The type the value must have to pass (its test includes that of a TypeGuard)."""
        return getattr(self, "typ", None)


class IdGuard(Guard):
    """The value is this very object. An object that takes weak references is held weakly (a
    module passed to a compiled function, or whose forward was compiled, would otherwise live
    as long as the cache entry); once it is gone the guard fails, as no live value is it."""

    order = 10

    def __init__(self, source: Source, obj: object):
        self.source = source
        self.typ = type(obj)
        try:
            self.ref = weakref.ref(obj)
        except TypeError:  # (ints, tuples, None, most C objects: held as they are)
            self.ref = lambda obj=obj: obj

    @property
    def obj(self):
        """The object, or None once it is gone."""
        return self.ref()

    def dead(self) -> bool:
        """Whether the object is gone: no value passes the guard any more."""
        return isinstance(self.ref, weakref.ref) and self.ref() is None

    def gone(self) -> str:
        return f"{self.source.name()}: the object captured ({self.typ.__name__}) is gone"

    def code(self, v, names):
        if isinstance(self.ref, weakref.ref):
            return [f"if {v} is not {names(self.ref)}(): return False"]
        return [f"if {v} is not {names(self.obj)}: return False"]

    def implied_type(self):
        # The same object has the same type, but for an instance of a class written in
        # Python, whose __class__ can be assigned: a type test on it stays.
        return None if self.typ.__flags__ & HEAPTYPE else self.typ

    def reason(self, value):
        obj = self.obj
        if value is obj:
            return None
        if self.dead():
            return self.gone()
        return f"{self.source.name()}: a different object ({_short(obj)} → {_short(value)})"


class TypeGuard(Guard):
    order = 20

    def __init__(self, source: Source, typ: type):
        self.source = source
        self.typ = typ

    def code(self, v, names):
        return [f"if type({v}) is not {names(self.typ)}: return False"]

    def reason(self, value):
        if type(value) is self.typ:
            return None
        return f"type({self.source.name()}): {self.typ.__name__} → {type(value).__name__}"

    def implied_type(self):
        return None  # its own test, which a stronger guard on the source may make redundant


_LITERAL_TYPES = (bool, int, float, str, type(None))


def _is_literal(value, budget: int = 64) -> bool:
    """Whether ``repr(value)`` is a short expression of it in the guard's code: a literal, or a
    tuple of them with at most ``budget`` items in all (nested tuples' items counted each time
    they appear). A longer tuple is named instead: one built as ``t = (t, t)`` in a loop holds
    2^k items, which a repr spells out."""
    pending = [value]
    while pending:
        v = pending.pop()
        if type(v) in _LITERAL_TYPES:
            if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
                return False
            continue
        if type(v) is not tuple:
            return False
        budget -= len(v)
        if budget < 0:
            return False
        pending.extend(v)
    return True


def short_repr(value) -> str:
    """``repr(value)`` for messages, cut short in depth and length (reprlib)."""
    return _SHORT.repr(value)


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxtuple, _SHORT.maxlist, _SHORT.maxstring, _SHORT.maxother = 4, 8, 8, 80, 80


class EqualsGuard(Guard):
    """Type and value of an immutable Python value (int, float, str, bool, None, tuples of them,
    dtypes, devices, torch.Size)."""

    order = 20

    def __init__(self, source: Source, value: object):
        self.source = source
        self.value = value

    def code(self, v, names):
        value = self.value
        if value is None or type(value) is bool:
            return [f"if {v} is not {value!r}: return False"]
        if isinstance(value, torch.dtype):
            return [f"if {v} is not {names(value)}: return False"]
        rhs = repr(value) if _is_literal(value) else names(value)
        if isinstance(value, float) and value != value:
            return [f"if type({v}) is not float or {v} == {v}: return False"]
        return [f"if type({v}) is not {names(type(value))} or {v} != {rhs}: return False"]

    def implied_type(self):
        return type(self.value)

    def reason(self, value):
        if type(value) is type(self.value) and (value == self.value or (value != value and self.value != self.value)):
            return None
        return f"{self.source.name()}: {short_repr(self.value)} → {short_repr(value)}"


def _key_presence_sets(guards: list) -> dict:
    """Guards that a dict holds a key, or does not (``k in d``, ``'x' in obj.__dict__``), taken
    together per dict and answer: the first one's id -> the frozenset of keys its test covers,
    the others' ids -> None (written by that test). A transformers config read through its
    ``__getattribute__`` asks its ``__dict__`` for fifty names it does not hold: fifty lines a
    call, where one set test does it."""
    groups: dict = {}
    for g in guards:
        if type(g) is EqualsGuard and type(g.value) is bool \
                and type(g.source) in (HasKeySource, InstanceDictHasSource):
            index = g.source.index if type(g.source) is HasKeySource else g.source.attr
            groups.setdefault((type(g.source), g.source.base.key, g.value), []).append((g, index))
    sets: dict = {}
    for members in groups.values():
        if len(members) < 2:
            continue
        try:
            keys = frozenset(index for _, index in members)
        except TypeError:  # (an unhashable key: its own lines)
            continue
        sets[id(members[0][0])] = keys
        sets.update((id(g), None) for g, _ in members[1:])
    return sets


def _key_set_test(guard: EqualsGuard, keys: frozenset, value_of, names) -> str:
    """One line for :func:`_key_presence_sets`' group that ``guard`` heads: the container's
    ``__contains__`` (the one test each guard made) false for every key, or true for all."""
    source = guard.source
    if type(source) is HasKeySource:
        d = value_of(source.base)
    else:
        d = f"{names(object.__getattribute__)}({value_of(source.base)}, '__dict__')"
    each = f"{names(map)}({d}.__contains__, {names(tuple(keys))})"
    return f"if not {names(all)}({each}): return False" if guard.value else f"if {names(any)}({each}): return False"


class NotShadowedGuard(Guard):
    """None of ``names`` is a global of the module whose globals dict is at ``source``: the
    builtins the frame used by those names are still what the names mean (a global ``len``
    defined later would shadow the builtin). One test for all of them."""

    order = 15

    def __init__(self, source: Source, names: frozenset):
        self.source = source
        self.names = frozenset(names)

    def code(self, v, names):
        return [f"if not {names(self.names)}.isdisjoint({v}): return False"]

    def reason(self, value):
        shadowed = sorted(self.names.intersection(value))
        if not shadowed:
            return None
        return f"the global {', '.join(shadowed)} now shadows the builtin of that name"


class LenGuard(Guard):
    order = 25

    def __init__(self, source: Source, typ: type, length: int):
        self.source = source
        self.typ = typ
        self.length = length

    def code(self, v, names):
        return [f"if type({v}) is not {names(self.typ)} or len({v}) != {self.length}: return False"]

    def reason(self, value):
        if type(value) is not self.typ:
            return f"type({self.source.name()}): {self.typ.__name__} → {type(value).__name__}"
        if len(value) != self.length:
            return f"len({self.source.name()}): {self.length} → {len(value)}"
        return None


class DictKeysGuard(Guard):
    order = 25

    def __init__(self, source: Source, typ: type, keys: tuple):
        self.source = source
        self.typ = typ
        self.keys = keys

    def code(self, v, names):
        return [f"if type({v}) is not {names(self.typ)} or tuple({v}) != {names(self.keys)}: return False"]

    def reason(self, value):
        if type(value) is not self.typ:
            return f"type({self.source.name()}): {self.typ.__name__} → {type(value).__name__}"
        if tuple(value) != self.keys:
            return f"keys of {self.source.name()}: {list(self.keys)} → {list(value)}"
        return None


class StateGuard(Guard):
    """The instance dict of an object holds exactly the plain data it held at capture (what a
    copy of the object made in the frame depends on): same keys in the same order, equal values
    of the same types."""

    order = 30

    def __init__(self, source: Source, state: dict):
        self.source = source
        self.state = state
        self.keys = tuple(state)
        self.types = tuple(map(type, state.values()))
        self.nested = tuple(k for k, v in state.items() if type(v) in (list, tuple, dict, set, frozenset))

    def code(self, v, names):
        from .values.copying import state_matches
        args = ", ".join(names(x) for x in (self.keys, self.state, self.types, self.nested))
        return [f"if not {names(state_matches)}({v}, {args}): return False"]

    def same_state(self, other: StateGuard) -> bool:
        from .values.copying import same_data
        return self.keys == other.keys and same_data(self.state, other.state)

    def reason(self, value):
        from .values.copying import same_data, state_matches
        if state_matches(value, self.keys, self.state, self.types, self.nested):
            return None
        d = getattr(value, "__dict__", None)
        if not isinstance(d, dict):
            return f"{self.source.name()} has no __dict__ now"
        for k in self.keys:
            if k not in d:
                return f"{self.source.name()}.{k}: deleted"
            if not same_data(d[k], self.state[k]):
                return f"{self.source.name()}.{k}: {_short(self.state[k])} → {_short(d[k])}"
        added = [k for k in d if k not in self.state]
        return f"{self.source.name()}: new attributes {added}" if added else f"{self.source.name()}: attribute order changed"


_HOOK_TABLES = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


def _global_hook_tables():
    from torch.nn.modules import module as m

    return tuple(getattr(m, n) for n in ("_global_forward_hooks", "_global_forward_pre_hooks",
                                         "_global_backward_hooks", "_global_backward_pre_hooks")
                 if hasattr(m, n))


class NoHooksGuard(Guard):
    """A module whose forward was inlined has no hooks (hooks of inlined modules would not run),
    and no global module hooks exist. Unless the module had a forward of its own (in its
    instance dict, guarded as an attribute), it has none now either: a forward assigned to the
    object later (``m.block.forward = patched``) runs instead of the class's. With ``typ``, the
    module is still of that class (its identity is guarded, but ``__class__`` can be assigned)."""

    order = 15

    def __init__(self, source: Source, own_forward: bool = False, typ: type | None = None):
        self.source = source
        self.own_forward = own_forward
        self.typ = typ

    def code(self, v, names):
        tests = [f"{v}.{t}" for t in _HOOK_TABLES]
        if not self.own_forward:
            tests.append(f"'forward' in {v}.__dict__")
        if self.typ is not None:
            tests.append(f"type({v}) is not {names(self.typ)}")
        return [f"if {' or '.join(tests)}: return False"]

    def implied_type(self):
        return None  # (its type test is a check of its own; see IdGuard)

    def reason(self, value):
        if self.typ is not None and type(value) is not self.typ:
            return f"type({self.source.name()}): {self.typ.__name__} → {type(value).__name__}"
        for t in _HOOK_TABLES:
            if getattr(value, t, None):
                return f"{self.source.name()} has {t.strip('_').replace('_', ' ')} now"
        if not self.own_forward and "forward" in vars(value):
            return f"{self.source.name()}.forward: assigned to the module object"
        return None


class AliasGuard(Guard):
    """Whether two inputs are one object (``query is key`` in self-attention) stays as it was."""

    order = 35

    def __init__(self, source: Source, other: Source, same: bool):
        self.source = source
        self.other = other
        self.same = same

    def code2(self, v, w):
        return [f"if {v} {'is not' if self.same else 'is'} {w}: return False"]

    def reason2(self, a, b):
        if (a is b) == self.same:
            return None
        now = "the same object" if a is b else "different objects"
        return f"{self.source.name()} and {self.other.name()}: now {now}"


class DistinctGuard(Guard):
    """The objects at ``sources`` are pairwise distinct objects, as at capture (the tensors a
    set held by identity: ``named_parameters`` drops a parameter seen twice)."""

    order = 36

    def __init__(self, sources: list[Source]):
        self.sources = list(sources)
        self.source = max(self.sources, key=_depth)  # checked after every path it reads

    def code_n(self, values: list[str]):
        ids = ", ".join(f"id({v})" for v in values)
        return [f"if len({{{ids}}}) != {len(values)}: return False"]

    def reason_n(self, objs: list):
        seen = {}
        for source, obj in zip(self.sources, objs):
            if id(obj) in seen:
                return f"{seen[id(obj)].name()} and {source.name()}: now the same object"
            seen[id(obj)] = source
        return None


class TensorGuard(Guard):
    """Type, dtype, device, shape, strides and requires_grad of a tensor."""

    order = 30

    def __init__(self, source: Source, t: torch.Tensor):
        self.source = source
        self.typ = type(t)
        self.dtype = t.dtype
        self.device = t.device
        self.shape = tuple(t.shape)
        self.stride = tuple(t.stride())
        self.requires_grad = t.requires_grad
        #: torch's negative bit (``torch._neg_view``, the imaginary part of a conjugate): a
        #: kernel reads memory, so a graph captured for one state must not run the other.
        self.negative = t.is_neg()
        #: The tensor itself until the guard function is built (see _batched_tensor_check).
        self.example = t

    def code(self, v, names):
        return [
            f"if type({v}) is not {names(self.typ)} or {v}.dtype is not {names(self.dtype)}"
            f" or {v}.shape != {self.shape!r} or {v}.stride() != {self.stride!r}"
            f" or {v}.requires_grad is not {self.requires_grad!r}"
            f" or {v}.device != {names(self.device)} or {v}.is_neg() is not {self.negative!r}:"
            " return False"
        ]

    def kind_reason(self, value):
        """What changed in the tensor's type, dtype or device (None: nothing)."""
        n = self.source.name()
        if type(value) is not self.typ:
            return f"type({n}): {self.typ.__name__} → {type(value).__name__}"
        if value.dtype is not self.dtype:
            return f"{n}.dtype: {self.dtype} → {value.dtype}"
        if value.device != self.device:
            return f"{n}.device: {self.device} → {value.device}"
        if value.is_neg() is not self.negative:
            return f"{n}.is_neg(): {self.negative} → {value.is_neg()} (a negative view)"
        return None

    def reason(self, value):
        n = self.source.name()
        if (why := self.kind_reason(value)) is not None:
            return why
        shape = tuple(value.shape)
        if shape != self.shape:
            if len(shape) != len(self.shape):
                return f"{n}.ndim: {len(self.shape)} → {len(shape)} (shape {list(self.shape)} → {list(shape)})"
            dims = [f"{n}.shape[{i}]: {a} → {b}" for i, (a, b) in enumerate(zip(self.shape, shape)) if a != b]
            return ", ".join(dims)
        if tuple(value.stride()) != self.stride:
            return f"{n}.stride(): {self.stride} → {tuple(value.stride())} (a differently laid out tensor, e.g. a transposed view)"
        if value.requires_grad is not self.requires_grad:
            return f"{n}.requires_grad: {self.requires_grad} → {value.requires_grad}"
        return None


class DynamicTensorGuard(TensorGuard):
    """A tensor with symbolic sizes: everything :class:`TensorGuard` checks except the sizes of
    the ``dynamic`` dimensions (relations between sizes are the :class:`SizeGuard`'s), and
    contiguity instead of exact strides (the symbolic strides are the contiguous ones)."""

    def __init__(self, source: Source, t: torch.Tensor, dynamic):
        super().__init__(source, t)
        self.dynamic = frozenset(dynamic)

    def code(self, v, names):
        static = "".join(f" or ___t[{i}] != {n}" for i, n in enumerate(self.shape) if i not in self.dynamic)
        return [
            f"if type({v}) is not {names(self.typ)} or {v}.dtype is not {names(self.dtype)}"
            f" or {v}.requires_grad is not {self.requires_grad!r}"
            f" or {v}.device != {names(self.device)} or not {v}.is_contiguous()"
            f" or {v}.is_neg() is not {self.negative!r}: return False",
            f"___t = {v}.shape",
            f"if len(___t) != {len(self.shape)}{static}: return False",
        ]

    def reason(self, value):
        n = self.source.name()
        if (why := self.kind_reason(value)) is not None:
            return why
        shape = tuple(value.shape)
        if len(shape) != len(self.shape):
            return f"{n}.ndim: {len(self.shape)} → {len(shape)}"
        dims = [f"{n}.shape[{i}]: {a} → {b}" for i, (a, b) in enumerate(zip(self.shape, shape))
                if a != b and i not in self.dynamic]
        if dims:
            return ", ".join(dims)
        if not value.is_contiguous():
            return f"{n} is no longer contiguous (its sizes are dynamic, its strides must follow them)"
        if value.requires_grad is not self.requires_grad:
            return f"{n}.requires_grad: {self.requires_grad} → {value.requires_grad}"
        if value.is_neg() is not self.negative:
            return f"{n}.is_neg(): {self.negative} → {value.is_neg()} (a negative view)"
        return None


@dataclass
class GuardSet:
    """The guards of one cache entry, and the global state captured with them."""

    guards: list[Guard] = field(default_factory=list)
    global_state: tuple = field(default_factory=_global_state)

    #: Set once a module's forward is inlined: global module hooks must then stay absent.
    check_global_hooks: bool = False
    #: The relations between symbolic input sizes (shapes.SizeGuard), checked last.
    size_guard: object = None

    #: Sources that have a NoHooksGuard already (one per module is enough).
    _no_hooks: set = field(default_factory=set, repr=False, compare=False)
    #: The batched tensor check and the ids of the guards it covers (False: not built yet;
    #: (None, ()): none).
    _tensor_check: object = field(default=False, repr=False, compare=False)

    def add(self, guard: Guard) -> None:
        if isinstance(guard, StateGuard) and any(
                type(g) is StateGuard and g.source.key == guard.source.key and g.same_state(guard)
                for g in self.guards):
            return  # the object copied twice (T5's decoder copies its config twice)
        if isinstance(guard, NoHooksGuard):
            if guard.source in self._no_hooks:
                return
            self._no_hooks.add(guard.source)
            self.check_global_hooks = True
        self.guards.append(guard)

    def __len__(self):
        return len(self.guards)

    def dead(self) -> str | None:
        """Why the entry never passes again (an object these guards check by identity is
        gone), or None."""
        for g in self.guards:
            if isinstance(g, IdGuard) and g.dead():
                return g.gone()
        return None

    # -- code generation ------------------------------------------------------------------------

    def python_source(self, argnames: tuple[str, ...], fn_name: str) -> tuple[str, dict]:
        names = ConstNames("___g")
        lines: list[str] = []
        value_of = SourceLoader(names, argnames, lines)

        grad, dtype, any_autocast, autocast, devices = self.global_state
        # No torch function mode, or exactly the torch.device contexts of the capture.
        modes = (f"{names(torch._C._len_torch_function_stack)}()" if not devices
                 else f"{names(device_modes)}() != {names(devices)}")
        lines.append(
            f"if {names(torch.is_grad_enabled)}() is not {grad}"
            f" or {names(torch.get_default_dtype)}() is not {names(dtype)}"
            f" or {names(any_autocast_enabled)}() is not {any_autocast}"
            f" or {modes}"
            f" or {names(torch._C._len_torch_dispatch_stack)}(): return False"
        )
        if any_autocast:
            lines.append(f"if {names(_autocast_detail)}() != {names(autocast)}: return False")
        if self.check_global_hooks:
            tables = " or ".join(names(t) for t in _global_hook_tables())
            lines.append(f"if {tables}: return False")
        # A type test that a stronger guard on the same value repeats (an equality or identity
        # test, a tensor's metadata) is left out, and so is any test written twice: the guard
        # function's source is compiled on every capture, and its size is most of that cost.
        implied = {(g.source, g.implied_type()) for g in self.guards if not isinstance(g, TypeGuard)}
        written: set[str] = set()
        ordered = sorted(self.guards, key=lambda g: (_depth(g.source), g.order))
        check, in_batch = self._batched_tensor_check([g for g in ordered if type(g) is TensorGuard])
        batched: list[str] = []  # the values it checks, loaded where their guards stood, in order
        key_sets = _key_presence_sets(ordered)
        for guard in ordered:
            if isinstance(guard, TypeGuard) and (guard.source, guard.typ) in implied:
                continue
            if check is not None and id(guard) in in_batch:
                batched.append(value_of(guard.source))
                continue
            if id(guard) in key_sets:
                keys = key_sets[id(guard)]
                if keys is not None:
                    lines.append(_key_set_test(guard, keys, value_of, names))
                continue
            if isinstance(guard, AliasGuard):
                tests = guard.code2(value_of(guard.source), value_of(guard.other))
            elif isinstance(guard, DistinctGuard):
                tests = guard.code_n([value_of(s) for s in guard.sources])
            else:
                tests = guard.code(value_of(guard.source), names)
            for test in tests:
                if test not in written:
                    written.add(test)
                    lines.append(test)
        if batched:
            lines.append(f"if not {names(check)}({', '.join(batched)}): return False")
        if self.size_guard is not None:
            lines.extend(self.size_guard.code_with(value_of))
        body = "\n        ".join(lines)
        src = (
            f"def {fn_name}({', '.join(argnames)}):\n"
            f"    try:\n"
            f"        {body}\n"
            f"    except Exception:\n"
            f"        return False\n"
            f"    return True\n"
        )
        return src, names.namespace

    def _batched_tensor_check(self, guards: list[TensorGuard]):
        """One call that checks every tensor of a :class:`TensorGuard` (torch's C++
        ``TensorGuards``, which Dynamo's guards use: type, dtype, device, requires_grad, sizes
        and strides, about 60 ns a tensor where a Python line took 300 ns: a 4-layer GPT-2's 53
        parameters and inputs cost 16 µs a call), and the ids of the guards it covers; (None,
        ()) where torch lacks it or it does not take these tensors (their Python lines are
        written instead). Built once, from the tensors themselves, which are then let go;
        ``guards`` in the order the guard function checks them.

        ``TensorGuards`` fails a call that passes one tensor twice, as Dynamo never does, so a
        tensor reached by two paths (T5's shared embedding, GPT-2's tied LM head) is batched
        at its first path; the guards of its other paths keep their Python lines."""
        if self._tensor_check is not False:
            return self._tensor_check
        self._tensor_check = (None, ())
        complete = all(g.example is not None for g in guards)
        firsts: dict[int, TensorGuard] = {}
        for g in guards:
            firsts.setdefault(id(g.example), g)
        unique = list(firsts.values())
        examples = [g.example for g in unique]
        for g in guards:
            g.example = None
        if not complete or not unique or _TensorGuards is None:
            return self._tensor_check
        try:
            # It records requires_grad as grad mode leaves it: under the grad mode the calls
            # run in (guarded above), whatever capture switched since.
            with torch.set_grad_enabled(self.global_state[0]):
                check = _TensorGuards(*examples, dynamic_dims_sizes=[list(g.shape) for g in unique],
                                      dynamic_dims_strides=[list(g.stride) for g in unique]).check
                if check(*examples):
                    self._tensor_check = (check, frozenset(id(g) for g in unique))
        except Exception:  # (a private API: any trouble, and the Python lines check)
            pass
        return self._tensor_check

    def build(self, argnames: tuple[str, ...], label: str):
        """Compile the guard function (a plain function of the frame's argument slots)."""
        number = _guard_numbers.take()
        fn_name = f"___guard_{number}"
        src, namespace = self.python_source(argnames, fn_name)
        filename = f"<framejit-guard {label}>"
        linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
        exec(diskcache.compiled(src, filename), namespace)
        fn = namespace[fn_name]
        _guard_numbers.give_back_when_dead(fn, number)
        fn.__framejit_source__ = src
        return fn

    # -- explaining failures ---------------------------------------------------------------------

    def failure_reason(self, f_locals: dict) -> str | None:
        """The first guard that ``f_locals`` (argument name → value) fails, in the user's terms."""
        now = _global_state()
        if now != self.global_state:
            for name, old, new in zip(_GLOBAL_STATE_NAMES, self.global_state, now):
                if old != new and new is not None:  # (None: another mode, named below)
                    return f"{name}: {old} → {new}"
        modes = active_modes()
        if modes is not None:
            return f"{modes} is active (graphs run outside torch function and dispatch modes)"
        if self.check_global_hooks and any(_global_hook_tables()):
            return "a global module hook is registered now (register_module_forward_hook ...)"
        names = ConstNames("___g")
        for guard in sorted(self.guards, key=lambda g: (_depth(g.source), g.order)):
            try:
                value = eval(guard.source.expr(names), names.namespace, dict(f_locals))
                if isinstance(guard, AliasGuard):
                    other = eval(guard.other.expr(names), names.namespace, dict(f_locals))
                if isinstance(guard, DistinctGuard):
                    objs = [eval(s.expr(names), names.namespace, dict(f_locals)) for s in guard.sources]
            except Exception as e:  # the path itself no longer exists
                return f"{guard.source.name()} can no longer be read ({type(e).__name__}: {e})"
            if isinstance(guard, DistinctGuard):
                reason = guard.reason_n(objs)
            else:
                reason = guard.reason2(value, other) if isinstance(guard, AliasGuard) else guard.reason(value)
            if reason is not None:
                return reason
        if self.size_guard is not None:
            def read(source):
                return eval(source.expr(names), names.namespace, dict(f_locals))
            try:
                return self.size_guard.reason_with(read)
            except Exception as e:
                return f"an input size can no longer be read ({type(e).__name__}: {e})"
        return None


def _depth(source: Source) -> int:
    depth = 0
    while True:
        base = getattr(source, "base", None) or getattr(source, "fn", None)
        if base is None:
            return depth
        depth += 1
        source = base


def _short(obj) -> str:
    r = repr(obj)
    if len(r) > 60:
        r = f"<{type(obj).__name__} at {id(obj):#x}>"
    return r
