"""The ``eager`` backend: run the graph's generated Python over torch ops.

It returns the GraphModule's ``forward_fn``: a plain function whose body is one statement per
node, so a call costs one Python call plus the torch ops themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..fx_ir import GraphModule
from .registry import register_backend


@register_backend("eager")
def eager(gm: GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Run the graph as generated Python (no further compilation)."""
    return gm.forward_fn

