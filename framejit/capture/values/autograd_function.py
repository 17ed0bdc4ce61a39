"""``MyFunction.apply(...)`` of a custom ``torch.autograd.Function`` (Bloom's GELU, fused
kernels with a hand-written backward).

The call is one node of the graph whose target is the class's own ``apply``: when the graph runs,
torch runs the user's ``forward`` on the real inputs and records the user's ``backward`` for
autograd, exactly as eager does, so gradients are eager's. Its example result comes from running
``apply`` on fake tensors (meta tensors that report their real device), as autocast does, so
``forward`` also runs once at capture: Python side effects in it (a counter, a print) happen
once more than in eager. A ``forward`` that fake tensors cannot run (it reads values, calls
numpy) makes the call a graph break, and it runs as plain Python. The class is guarded by
identity wherever it was read from (a global, an attribute).

Only classes whose ``forward`` and ``backward`` are plain Python static methods and that keep
torch's ``apply`` are taken; anything else is inlined or breaks as before.
"""

from __future__ import annotations

import inspect
import types

import torch

from ...errors import Unsupported
from ..examples import run_on_fake
from .base import Value
from .functions import _has_tensor
from .tensor import graph_call

_FUNCTION_APPLY = inspect.getattr_static(torch.autograd.Function, "apply")


def is_custom_function_apply(cls, name: str) -> bool:
    """``cls.apply`` is torch's ``Function.apply`` on a user subclass with Python forward and
    backward static methods."""
    if name != "apply" or not isinstance(cls, type) or not issubclass(cls, torch.autograd.Function):
        return False
    if inspect.getattr_static(cls, "apply", None) is not _FUNCTION_APPLY:
        return False
    for method in ("forward", "backward"):
        static = inspect.getattr_static(cls, method, None)
        if not (isinstance(static, staticmethod) and isinstance(static.__func__, types.FunctionType)):
            return False
    return True


def _uncaptured_apply(cls: type):
    """``cls.apply`` as the graph calls it: with capture off (as for ``framejit.disable``), so
    the user's forward and whatever it calls run as plain Python, not as frames of their own.
    (One per capture: a cache keyed by the class would keep the class alive.)"""
    from ... import _C
    fn = _C.CompiledFunction(cls.apply, None)
    # Named after the class; not in a torch module, so graph printers reference it as a global.
    fn.__name__ = fn.__qualname__ = f"{cls.__name__}_apply"
    fn.__module__ = __name__
    return fn


class AutogradFunctionApplyValue(Value):
    """``cls.apply`` of a custom autograd Function, before it is called."""

    __slots__ = ("cls",)

    def __init__(self, cls: type):
        super().__init__(None)
        self.cls = cls

    def describe(self):
        return f"{self.cls.__qualname__}.apply()"

    def python_type(self):
        return types.MethodType

    def call(self, tx, args, kwargs):
        if not _has_tensor([*args, *kwargs.values()]):
            raise Unsupported(f"calling {self.describe()} with no tensor arguments")
        apply = _uncaptured_apply(self.cls)

        def run_example(convert):
            return run_on_fake(tx, "call_function", apply, args, kwargs, convert)

        try:
            # impure: forward is user code that runs once per call in eager, even if unused.
            return graph_call(tx, "call_function", apply, list(args), dict(kwargs), impure=True,
                              run_example=run_example)
        except Unsupported as e:
            if e.__cause__ is None:
                raise
            raise Unsupported(
                f"calling {self.describe()}, whose forward cannot run on fake tensors "
                f"({type(e.__cause__).__name__}: {e.__cause__})".splitlines()[0],
                "its forward reads tensor values or calls something other than torch operations; "
                "the call runs as plain Python",
            ) from e.__cause__

    def reconstruct(self, cg):
        return f"{cg.const_name(self.cls)}.apply"
