"""``with`` blocks: on the grad-mode and autocast context managers the capture models
(values/contexts.py), and on objects whose class defines ``__enter__`` and ``__exit__`` in
Python (user context managers, ``contextlib.contextmanager`` generators), whose methods are
inlined.

A graph break inside a block carries the block's ``__exit__`` across the break (see resume.py):
for a user context manager, its bound ``__exit__``, which the resume function calls where the
block ends. That needs an ``__exit__`` that never swallows an exception (it returns None or
False on every path), since the native code at the break only re-raises; one that may (like
``contextlib.contextmanager``'s) makes the frame run as Python. An exception leaving a block
during capture (``WITH_EXCEPT_START``) is not captured.
"""

from __future__ import annotations

import dis
import types

from ...errors import Unsupported
from ..interpreter import handler
from ..values.base import Value
from ..values.contexts import require_normal_exit


@handler("BEFORE_WITH")
def before_with(tx, inst):
    ctx = tx.pop()
    entered = ctx.enter(tx)
    if entered is not None:
        exit_, value = entered
    else:
        methods = _python_methods(tx, ctx)
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


def _python_methods(tx, ctx: Value):
    try:
        cls = ctx.python_type()
    except Unsupported:
        return None
    from ..values.attributes import guarded_lookup
    enter, exit_ = guarded_lookup(tx, cls, "__enter__"), guarded_lookup(tx, cls, "__exit__")
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
        require_normal_exit(args)
        return tx.inline_function(self.fn, [self.ctx, *args], kwargs)

    def reconstruct(self, cg):
        if not never_suppresses(self.fn):
            raise Unsupported(f"a graph break inside a `with` block on {self.ctx.describe()}, "
                              f"whose {self.fn.__qualname__}() may swallow exceptions",
                              "move the unsupported line out of the block")
        return f"{cg.const_name(types.MethodType)}({cg.const_name(self.fn)}, {cg.expr(self.ctx)})"


def never_suppresses(fn: types.FunctionType) -> bool:
    """Whether ``fn`` (an ``__exit__``) returns None or False on every path: each return is of
    one of those constants, right after loading it (not a jump target)."""
    insts = list(dis.get_instructions(fn.__code__))
    if fn.__code__.co_flags & (0x20 | 0x80 | 0x200):  # a generator or coroutine
        return False
    for i, ins in enumerate(insts):
        if ins.opname == "RETURN_CONST":
            if ins.argval not in (None, False):
                return False
        elif ins.opname == "RETURN_VALUE":
            prev = insts[i - 1] if i else None
            if ins.is_jump_target or prev is None or prev.opname != "LOAD_CONST" \
                    or prev.argval not in (None, False):
                return False
    return True
