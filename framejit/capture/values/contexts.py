"""Context managers captured inside the graph: ``torch.no_grad()``, ``torch.enable_grad()``,
``torch.set_grad_enabled(mode)`` and ``torch.autocast(...)``.

Entering and leaving one records nodes in the graph that switch the state at run time
(``torch._C._set_grad_enabled``, :func:`autocast_enter`/:func:`autocast_exit`), and switches the
state for real while the block is captured, so that the examples computed inside it have the
``requires_grad`` and the dtypes of eager (under autocast, ops run on fake tensors that keep
their device, so torch's own autocast rules pick the dtypes: see tensor.py). The entry function
restores the state if the graph raises part-way. Context managers written in Python are inlined
(ops/blocks.py); others make the ``with`` a graph break.
"""

from __future__ import annotations

import torch

from ...errors import Unsupported
from .base import Value
from .constants import const
from .tensor import graph_call


def require_normal_exit(args) -> None:
    """An ``__exit__`` called at the end of its block (``None, None, None``): an exception
    leaving a block during capture is not captured."""
    if any(not (a.is_constant() and a.as_constant() is None) for a in args):
        raise Unsupported("leaving a `with` block because of an exception")


def _set_grad(tx, enabled: bool) -> None:
    graph_call(tx, "call_function", torch._C._set_grad_enabled, [const(enabled)], {}, impure=True)
    tx.output.set_grad_mode(enabled)


class GradModeContext(Value):
    """The object ``torch.no_grad()`` (and friends) returns, before and while it is entered."""

    __slots__ = ("enabled", "previous", "entered_at_creation")

    def __init__(self, enabled: bool, entered_at_creation: bool = False, previous=None):
        super().__init__(None)
        self.enabled = enabled
        self.entered_at_creation = entered_at_creation
        self.previous = previous

    def describe(self):
        return f"torch.set_grad_enabled({self.enabled})"

    def python_type(self):
        return torch.set_grad_enabled if self.entered_at_creation else (
            torch.no_grad if not self.enabled else torch.enable_grad)

    def enter(self, tx) -> tuple[Value, Value]:
        """(the __exit__ to push, the value ``as`` binds)."""
        if not self.entered_at_creation:
            self.previous = torch.is_grad_enabled()
            _set_grad(tx, self.enabled)
        return GradModeExit(self), const(None)


class GradModeRestore:
    """At run time, the ``__exit__`` of a grad-mode ``with`` block that a graph break splits:
    the rewritten frame passes it to the resume function, whose code leaves the block (on
    success or on an exception) by calling it, as the original ``__exit__`` would have been."""

    __slots__ = ("previous",)

    def __init__(self, previous: bool):
        self.previous = previous

    def __call__(self, *exc_info):
        torch._C._set_grad_enabled(self.previous)
        return None

    def __repr__(self):
        return f"<end of a grad-mode with block: back to {self.previous}>"


class GradModeExit(Value):
    """The ``__exit__`` a grad-mode ``with`` pushes; ``outside`` when the block was entered
    before this frame's capture started (a resume function continuing inside it)."""

    __slots__ = ("ctx", "outside")

    def __init__(self, ctx: GradModeContext, source=None, outside: bool = False):
        super().__init__(source)
        self.ctx = ctx
        self.outside = outside

    def describe(self):
        return "the end of a grad-mode `with` block"

    def call(self, tx, args, kwargs):
        require_normal_exit(args)
        _set_grad(tx, self.ctx.previous)
        if self.outside:
            tx.output.grad_mode_handover = True  # the block was entered by the frame before
        return const(None)

    def reconstruct(self, cg):
        if self.source is not None:
            return cg.source_expr(self.source)
        return f"{cg.const_name(GradModeRestore)}({self.ctx.previous})"


def wrap_grad_mode_restore(tx, obj: GradModeRestore, source) -> Value:
    """A :class:`GradModeRestore` passed to a resume function: the block's end, guarded on the
    mode it restores."""
    from ..guards import EqualsGuard, TypeGuard
    from ..sources import AttrSource
    tx.output.guards.add(TypeGuard(source, GradModeRestore))
    tx.output.guards.add(EqualsGuard(AttrSource(source, "previous"), obj.previous))
    tx.output.outside_grad_exits.append((source, obj.previous))
    ctx = GradModeContext(torch.is_grad_enabled(), previous=obj.previous)
    return GradModeExit(ctx, source, outside=True)


def no_grad(tx, args, kwargs):
    return GradModeContext(False)


def enable_grad(tx, args, kwargs):
    return GradModeContext(True)


def set_grad_enabled(tx, args, kwargs):
    # torch.set_grad_enabled(mode) switches at once (it also works as a plain call), and restores
    # the previous mode when used as a context manager.
    mode = (args[0] if args else kwargs["mode"]).as_constant()
    previous = torch.is_grad_enabled()
    _set_grad(tx, bool(mode))
    return GradModeContext(bool(mode), entered_at_creation=True, previous=previous)


# -- torch.autocast ----------------------------------------------------------------------------------
#
# The graph enters and leaves autocast through the two functions below, which do what
# ``torch.autocast.__enter__``/``__exit__`` do, with every value they need as a constant: the
# block's arguments, and the state before it (known at capture, since the global autocast state
# is guarded).

def autocast_enter(device: str, dtype, enabled: bool, cache_enabled: bool) -> None:
    """Graph node: enter an autocast block (``torch.autocast.__enter__``)."""
    torch.set_autocast_enabled(device, enabled)
    torch.set_autocast_dtype(device, dtype)
    torch.autocast_increment_nesting()
    torch.set_autocast_cache_enabled(cache_enabled)


def autocast_exit(device: str, prev_enabled: bool, prev_dtype, prev_cache_enabled: bool) -> None:
    """Graph node: leave an autocast block (``torch.autocast.__exit__``)."""
    if torch.autocast_decrement_nesting() == 0:
        torch.clear_autocast_cache()
    torch.set_autocast_enabled(device, prev_enabled)
    torch.set_autocast_dtype(device, prev_dtype)
    torch.set_autocast_cache_enabled(prev_cache_enabled)


_AUTOCAST_DEVICES = ("cpu", "cuda")


def _autocast_nesting() -> int:
    """How many autocast blocks are open (torch has no getter: step in and back out)."""
    nesting = torch.autocast_increment_nesting() - 1
    torch.autocast_decrement_nesting()
    return nesting


def autocast_state() -> tuple:
    """This thread's whole autocast state: (enabled, dtype) per device, caching, nesting."""
    nesting = _autocast_nesting()
    return (*(x for d in _AUTOCAST_DEVICES
              for x in (torch.is_autocast_enabled(d), torch.get_autocast_dtype(d))),
            torch.is_autocast_cache_enabled(), nesting)


def restore_autocast_state(state: tuple) -> None:
    """Put back a state from :func:`autocast_state` (after a capture, or a graph that raised
    inside an autocast block)."""
    *per_device, cache_enabled, nesting = state
    for i, d in enumerate(_AUTOCAST_DEVICES):
        torch.set_autocast_enabled(d, per_device[2 * i])
        torch.set_autocast_dtype(d, per_device[2 * i + 1])
    now = _autocast_nesting()
    while now > nesting:
        now = torch.autocast_decrement_nesting()
        if now == 0:
            torch.clear_autocast_cache()
    while now < nesting:
        now = torch.autocast_increment_nesting()
    torch.set_autocast_cache_enabled(cache_enabled)


class AutocastContext(Value):
    """``torch.autocast(device_type, dtype, enabled, cache_enabled)`` (and the older
    ``torch.cpu.amp.autocast``/``torch.cuda.amp.autocast``), before and while it is entered."""

    __slots__ = ("cls", "device", "dtype", "enabled", "cache_enabled", "entered")

    def __init__(self, cls, device: str, dtype, enabled: bool, cache_enabled: bool):
        super().__init__(None)
        self.cls = cls
        self.device = device
        self.dtype = dtype
        self.enabled = enabled
        self.cache_enabled = cache_enabled
        self.entered = False

    def describe(self):
        return f"torch.autocast({self.device!r}, dtype={self.dtype})"

    def python_type(self):
        return self.cls

    def getattr(self, tx, name):
        fields = {"device": self.device, "fast_dtype": self.dtype, "_enabled": self.enabled,
                  "_cache_enabled": self.cache_enabled}
        if name in fields:
            return const(fields[name])
        return super().getattr(tx, name)

    def enter(self, tx) -> tuple[Value, Value]:
        if self.entered:
            raise Unsupported(f"entering {self.describe()} twice at once")
        d = self.device
        previous = (torch.is_autocast_enabled(d), torch.get_autocast_dtype(d),
                    torch.is_autocast_cache_enabled())
        tx.output.note_autocast()
        graph_call(tx, "call_function", autocast_enter,
                   [const(x) for x in (d, self.dtype, self.enabled, self.cache_enabled)], {}, impure=True)
        self.entered = True
        tx.output.autocast_depth += 1
        return AutocastExit(self, previous), self


class AutocastRestore:
    """At run time, the ``__exit__`` of an autocast ``with`` block that a graph break splits
    (as :class:`GradModeRestore` is for grad mode)."""

    __slots__ = ("device", "prev_enabled", "prev_dtype", "prev_cache_enabled")

    def __init__(self, device, prev_enabled, prev_dtype, prev_cache_enabled):
        self.device = device
        self.prev_enabled = prev_enabled
        self.prev_dtype = prev_dtype
        self.prev_cache_enabled = prev_cache_enabled

    def __call__(self, *exc_info):
        autocast_exit(self.device, self.prev_enabled, self.prev_dtype, self.prev_cache_enabled)
        return None

    def __repr__(self):
        return f"<end of an autocast({self.device!r}) block: back to enabled={self.prev_enabled}>"


class AutocastExit(Value):
    """The ``__exit__`` a ``with torch.autocast(...)`` pushes; ``outside`` when the block was
    entered before this frame's capture started (a resume function continuing inside it)."""

    __slots__ = ("ctx", "previous", "outside")

    def __init__(self, ctx: AutocastContext, previous: tuple, source=None, outside: bool = False):
        super().__init__(source)
        self.ctx = ctx
        self.previous = previous  # (enabled, dtype, cache_enabled) before the block
        self.outside = outside

    def describe(self):
        return f"the end of a `with {self.ctx.describe()}` block"

    def call(self, tx, args, kwargs):
        require_normal_exit(args)
        tx.output.note_autocast()
        graph_call(tx, "call_function", autocast_exit,
                   [const(self.ctx.device), *(const(x) for x in self.previous)], {}, impure=True)
        self.ctx.entered = False
        if not self.outside:
            tx.output.autocast_depth -= 1
        if self.outside:
            tx.output.autocast_handover = True  # the block was entered by the frame before
        return const(False)

    def reconstruct(self, cg):
        if self.source is not None:
            return cg.source_expr(self.source)
        enabled, dtype, cache_enabled = self.previous
        return (f"{cg.const_name(AutocastRestore)}({self.ctx.device!r}, {enabled}, "
                f"{cg.const_name(dtype)}, {cache_enabled})")


def wrap_autocast_restore(tx, obj: AutocastRestore, source) -> Value:
    """An :class:`AutocastRestore` passed to a resume function: the block's end, guarded on
    the state it restores."""
    from ..guards import EqualsGuard, TypeGuard
    from ..sources import AttrSource
    tx.output.guards.add(TypeGuard(source, AutocastRestore))
    for name in AutocastRestore.__slots__:
        tx.output.guards.add(EqualsGuard(AttrSource(source, name), getattr(obj, name)))
    tx.output.outside_autocast_exits.append(source)
    d = obj.device
    ctx = AutocastContext(torch.amp.autocast, d, torch.get_autocast_dtype(d),
                          torch.is_autocast_enabled(d), torch.is_autocast_cache_enabled())
    ctx.entered = True
    return AutocastExit(ctx, (obj.prev_enabled, obj.prev_dtype, obj.prev_cache_enabled), source,
                        outside=True)


# -- torch.autograd.profiler.record_function ---------------------------------------------------------

def leave_profiler_range(*exc_info) -> None:
    """At run time, the end of a ``record_function`` block split by a graph break (no profiler
    was running: guarded)."""
    return None


class ProfilerRangeContext(Value):
    """``torch.autograd.profiler.record_function(name)``: a named range in a profiler's trace
    (optimizers wrap ``step()`` in one). With no profiler running, which is guarded, it records
    nothing, so the block is captured as if the ``with`` were not there."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        super().__init__(None)
        self.name = name

    def describe(self):
        return f"torch.autograd.profiler.record_function({self.name!r})"

    def python_type(self):
        return torch.autograd.profiler.record_function

    def enter(self, tx) -> tuple[Value, Value]:
        return ProfilerRangeExit(self), self


class ProfilerRangeExit(Value):
    __slots__ = ("ctx",)

    def __init__(self, ctx):
        super().__init__(None)
        self.ctx = ctx

    def describe(self):
        return f"the end of a `with {self.ctx.describe()}` block"

    def call(self, tx, args, kwargs):
        return const(None)

    def reconstruct(self, cg):
        return cg.const_name(leave_profiler_range)


def record_function(tx, args, kwargs):
    from ..guards import EqualsGuard
    from ..sources import CallSource

    name = (args[0] if args else kwargs.get("name"))
    if name is None or not name.is_constant():
        raise Unsupported("torch.autograd.profiler.record_function() without a constant name")
    if torch.autograd._profiler_enabled():
        raise Unsupported("torch.autograd.profiler.record_function() while a profiler is running",
                          "profile the compiled function from outside, or run it without the profiler")
    tx.output.guards.add(EqualsGuard(CallSource(torch.autograd._profiler_enabled, ()), False))
    return ProfilerRangeContext(str(name.as_constant()))


#: Queries of the autocast state, folded at capture.
AUTOCAST_QUERIES = {fn for fn in (
    torch.get_autocast_dtype, torch.is_autocast_cache_enabled,
    getattr(torch, "get_autocast_cpu_dtype", None), getattr(torch, "get_autocast_gpu_dtype", None),
    getattr(torch, "is_autocast_cpu_enabled", None),
) if fn is not None}


def fold_autocast_query(tx, fn, args, kwargs) -> Value:
    """The answer now; inside a block the frame entered it follows from the block's arguments,
    elsewhere it is guarded (caching and the dtype of a disabled autocast are not part of the
    global state every guard checks)."""
    from ..guards import EqualsGuard
    from ..sources import CallSource

    if kwargs or not all(a.is_constant() for a in args):
        raise Unsupported(f"{fn.__name__}() with these arguments")
    a = tuple(v.as_constant() for v in args)
    value = fn(*a)
    if tx.output.autocast_depth == 0:
        tx.output.guards.add(EqualsGuard(CallSource(fn, a), value))
    return const(value)


def _autocast_factory(cls):
    def make(tx, args, kwargs):
        """Build the real object at capture (its constructor checks the arguments and reads
        the defaults: the default dtype and caching are guarded)."""
        from ..guards import EqualsGuard
        from ..sources import CallSource

        try:
            a = [v.as_constant() for v in args]
            k = {n: v.as_constant() for n, v in kwargs.items()}
        except Unsupported:
            raise Unsupported(f"{cls.__name__}() with arguments that are not constants") from None
        try:
            real = cls(*a, **k)
        except Exception as e:
            raise Unsupported(f"{cls.__name__}() raises {type(e).__name__}: {e}") from e
        if real.device not in _AUTOCAST_DEVICES:
            raise Unsupported(f"autocast on the device {real.device!r}",
                              "framejit captures autocast on cpu and cuda")
        guards = tx.output.guards
        if tx.output.autocast_depth == 0:  # not inside a block this frame entered
            guards.add(EqualsGuard(CallSource(torch.is_autocast_cache_enabled, ()),
                                   torch.is_autocast_cache_enabled()))
            guards.add(EqualsGuard(CallSource(torch.get_autocast_dtype, (real.device,)),
                                   torch.get_autocast_dtype(real.device)))
        return AutocastContext(cls, real.device, real.fast_dtype, bool(real._enabled),
                               bool(real._cache_enabled))
    return make


def _autocast_classes():
    classes = [torch.amp.autocast]
    for mod in ("cpu", "cuda"):
        cls = getattr(getattr(getattr(torch, mod, None), "amp", None), "autocast", None)
        if isinstance(cls, type) and issubclass(cls, torch.amp.autocast):
            classes.append(cls)
    return classes


#: torch callables that build a captured context manager.
CONTEXT_FACTORIES = {
    torch.no_grad: no_grad,
    torch.enable_grad: enable_grad,
    torch.set_grad_enabled: set_grad_enabled,
    **{cls: _autocast_factory(cls) for cls in _autocast_classes()},
    torch.autograd.profiler.record_function: record_function,
}

#: What a `with` on the context managers above pushes as ``__exit__``.
BLOCK_EXITS = (GradModeExit, AutocastExit, ProfilerRangeExit)
