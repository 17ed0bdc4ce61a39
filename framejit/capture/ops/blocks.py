"""``with`` blocks on context managers the capture understands (see values/contexts.py)."""

from __future__ import annotations

from ...errors import Unsupported
from ..interpreter import handler


@handler("BEFORE_WITH")
def before_with(tx, inst):
    ctx = tx.pop()
    enter = getattr(ctx, "enter", None)
    if enter is None:
        raise Unsupported(f"a `with` block on {ctx.describe()}",
                          "only torch.no_grad(), torch.enable_grad() and torch.set_grad_enabled() "
                          "blocks are captured yet; enter other contexts outside the compiled function")
    exit_, value = enter(tx)
    tx.push(exit_)
    tx.push(value)
