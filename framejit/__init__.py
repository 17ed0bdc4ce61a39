"""framejit: a bytecode-capturing graph compiler for PyTorch.

    import framejit

    @framejit.compile
    def f(x, w, b):
        return torch.relu(x @ w + b).sum(-1)
"""

from . import _C  # noqa: F401  (fails with a clear message on unsupported Pythons)
from .api import CompiledModule, compile, disable, reset, stats
from .backends.registry import list_backends, register_backend
from .debug.explain import ExplainReport, explain
from .errors import BackendError, FramejitError, GraphBreakError, InternalError

__all__ = [
    "compile", "disable", "reset", "stats", "explain", "ExplainReport", "register_backend", "list_backends", "CompiledModule",
    "FramejitError", "GraphBreakError", "BackendError", "InternalError",
]
__version__ = "0.1.0"
