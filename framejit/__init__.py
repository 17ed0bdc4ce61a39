"""framejit: a bytecode-capturing graph compiler for PyTorch.

    import framejit

    @framejit.compile
    def f(x, w, b):
        return torch.relu(x @ w + b).sum(-1)

    torch.compile(model, backend="framejit")   # framejit behind TorchDynamo
"""

from . import _C  # noqa: F401  (fails with a clear message on unsupported Pythons)
from .api import CompiledModule, compile, disable, mark_dynamic, mark_static, reset, set_logs, stats
from .backends.registry import list_backends, register_backend
from .debug.explain import ExplainReport, explain
from .dynamo_backend import _register_at_import, register_torch_compile_backend
from .errors import BackendError, FramejitError, GraphBreakError, InternalError

# torch.compile(..., backend="framejit"). framejit's capture imports torch._dynamo anyway, so this
# costs about 4 ms of imports (dynamo_backend, fx_ir.from_torch) and 10 µs of registration
# (python -X importtime, torch 2.13).
_register_at_import()

__all__ = [
    "compile", "disable", "mark_dynamic", "mark_static", "reset", "stats", "set_logs", "explain", "ExplainReport", "register_backend", "list_backends", "CompiledModule",
    "FramejitError", "GraphBreakError", "BackendError", "InternalError",
    "register_torch_compile_backend",
]
__version__ = "0.1.0"
