"""Backends: graph -> callable. ``eager`` runs generated Python; user backends follow
torch.compile's contract ``(torch.fx.GraphModule, example_inputs) -> callable``.

This package imports only :mod:`framejit.fx_ir`.
"""

from . import eager  # noqa: F401  (registers "eager"; framejit.compiler adds "default", "triton")
from .registry import (
    Backend,
    compile_graph,
    list_backends,
    lookup_backend,
    register_backend,
)

__all__ = [
    "Backend",
    "compile_graph",
    "list_backends",
    "lookup_backend",
    "register_backend",
]
