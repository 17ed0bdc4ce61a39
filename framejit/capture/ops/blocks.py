"""``with`` blocks: on the grad-mode context managers the capture models (values/contexts.py),
and on objects whose class defines ``__enter__`` and ``__exit__`` in Python (user context
managers, ``contextlib.contextmanager`` generators), whose methods are inlined.

An exception leaving a block (``WITH_EXCEPT_START``) is not captured, and a graph break inside a
block on a user context manager runs the frame as Python (its ``__exit__`` cannot be carried
across the break); grad-mode blocks can be split (see resume.py).
"""

from __future__ import annotations

import types

from ...errors import Unsupported
from ..interpreter import handler
from ..values.base import Value


@handler("BEFORE_WITH")
def before_with(tx, inst):
    ctx = tx.pop()
    enter = getattr(ctx, "enter", None)
    if enter is not None:
        exit_, value = enter(tx)
    else:
        methods = _python_methods(ctx)
        if methods is None:
            raise Unsupported(f"a `with` block on {ctx.describe()}",
                              "torch.no_grad()/enable_grad()/set_grad_enabled() blocks and context "
                              "managers written in Python are captured; enter this one outside "
                              "the compiled function")
        enter_fn, exit_fn = methods
        value = tx.inline_function(enter_fn, [ctx], {})
        exit_ = UserContextExit(ctx, exit_fn)
    tx.push(exit_)
    tx.push(value)


def _python_methods(ctx: Value):
    try:
        cls = ctx.python_type()
    except Unsupported:
        return None
    from ..values.instances import class_lookup
    enter, exit_ = class_lookup(cls, "__enter__"), class_lookup(cls, "__exit__")
    if isinstance(enter, types.FunctionType) and isinstance(exit_, types.FunctionType):
        return enter, exit_
    return None


class UserContextExit(Value):
    """The ``__exit__`` a ``with`` on a Python context manager pushes."""

    __slots__ = ("ctx", "fn")

    def __init__(self, ctx: Value, fn):
        super().__init__(None)
        self.ctx = ctx
        self.fn = fn

    def describe(self):
        return f"the end of a `with` block on {self.ctx.describe()}"

    def call(self, tx, args, kwargs):
        if any(not (a.is_constant() and a.as_constant() is None) for a in args):
            raise Unsupported("leaving a `with` block because of an exception")
        return tx.inline_function(self.fn, [self.ctx, *args], kwargs)

    def reconstruct(self, cg):
        raise Unsupported(f"a graph break inside a `with` block on {self.ctx.describe()}",
                          "move the unsupported line out of the block")
