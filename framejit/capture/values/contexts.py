"""Context managers captured inside the graph: ``torch.no_grad()``, ``torch.enable_grad()`` and
``torch.set_grad_enabled(mode)``.

Entering and leaving one records ``torch._C._set_grad_enabled`` nodes in the graph, and switches
grad mode for real while the block is captured, so that the meta results inside it have the
``requires_grad`` of eager. The entry function restores grad mode if the graph raises part-way.
Other context managers are not captured yet: a ``with`` on them makes the frame run as Python.
"""

from __future__ import annotations

import torch

from ...errors import Unsupported
from .base import Value, const
from .tensor import graph_call


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
        if any(not (a.is_constant() and a.as_constant() is None) for a in args):
            raise Unsupported("leaving a `with` block because of an exception")
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


#: torch callables that build a captured context manager.
CONTEXT_FACTORIES = {
    torch.no_grad: no_grad,
    torch.enable_grad: enable_grad,
    torch.set_grad_enabled: set_grad_enabled,
}
