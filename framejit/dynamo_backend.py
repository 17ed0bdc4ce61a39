"""framejit as a ``torch.compile`` backend: TorchDynamo captures, framejit compiles.

    import torch
    compiled = torch.compile(model, backend="framejit")
    compiled = torch.compile(model, backend="framejit", options={"backend": "triton"})

Each graph Dynamo captures is converted with :func:`framejit.fx_ir.from_torch_fx` and compiled
by one of framejit's own backends (``options={"backend": ...}``, default ``"default"``: Triton
kernels for CUDA tensors, the graph's Python for CPU tensors). When a graph cannot be converted
or compiled (dynamic shapes, an autocast region, a backend error), a
:class:`~framejit.errors.TorchCompileFallbackWarning` says why, once per reason, and the graph
runs as the torch.fx code Dynamo produced: never a wrong answer and never a crash.

The name ``"framejit"`` reaches torch in two ways: the ``torch_dynamo_backends`` entry point in
pyproject.toml (torch imports this module on first use of the name, in any process where
framejit is installed), and :func:`register_torch_compile_backend`, which ``import framejit``
calls (cheap there: framejit's capture imports ``torch._dynamo`` anyway).

Dynamo (torch 2.13) hands the backend real tensors as example inputs and puts FakeTensors in
each node's ``meta["example_value"]``; other callers (and other torch versions) may pass
FakeTensors as example inputs. Either way only their metadata is used; FakeTensors are replaced
by meta tensors before framejit's backend sees them. Parameters and buffers of modules arrive
as graph inputs (Dynamo inlines ``nn.Module`` calls).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from typing import Any

import torch

from .compiler import make_compiler
from .errors import TorchCompileFallbackWarning
from .fx_ir import UnsupportedGraphError, from_torch_fx, to_meta

__all__ = ["framejit_backend", "register_torch_compile_backend"]

#: The options ``torch.compile(..., backend="framejit", options={...})`` understands.
OPTIONS = {"backend": "framejit's own backend for the graph: 'default', 'eager', 'triton', ..."}

_warned: set[str] = set()


def framejit_backend(gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any
                     ) -> Callable[..., Any]:
    """Compile one graph captured by TorchDynamo with framejit (the torch.compile backend
    contract: ``(torch.fx.GraphModule, example_inputs, **kwargs) -> callable``).

    ``kwargs`` are what ``torch.compile`` passes on: ``options`` (a dict; ``"backend"`` picks
    framejit's backend) and ``mode`` (ignored). Returns ``gm.forward`` with a warning when
    framejit cannot take the graph.

    Example::

        torch.compile(fn, backend="framejit")(x)
        torch.compile(fn, backend=framejit_backend)(x)    # without the registered name
    """
    options = dict(kwargs.get("options") or {})
    inner = options.pop("backend", "default")
    for key in options:
        _warn_once(f"torch.compile(backend='framejit'): the option {key!r} is not a framejit "
                   f"option and is ignored (framejit options: {', '.join(OPTIONS)})")
    mode = kwargs.get("mode")
    if mode not in (None, "default"):
        _warn_once(f"torch.compile(mode={mode!r}) has no effect with backend='framejit'")
    try:
        compile_fn = make_compiler(inner)
    except Exception as e:  # an unknown backend name
        _warn_once(f"torch.compile(backend='framejit', options={{'backend': {inner!r}}}): {e} "
                   f"Graphs run as PyTorch code.")
        return gm.forward
    try:
        graph_module = from_torch_fx(gm, example_inputs)
    except UnsupportedGraphError as e:
        _warn_once(f"framejit cannot compile the graph{_where(gm)}: {e}. It runs as PyTorch code.")
        return gm.forward
    except Exception as e:
        _warn_once(f"framejit failed to convert the graph{_where(gm)} "
                   f"({type(e).__name__}: {_first_line(e)}). It runs as PyTorch code; please "
                   f"report this.")
        return gm.forward
    inputs = [to_meta(x) if _is_fake(x) else x for x in example_inputs]
    try:
        return compile_fn(graph_module, inputs)
    except Exception as e:
        cause = e.__cause__ or e
        name = compile_fn.backend.name  # type: ignore[attr-defined]
        _warn_once(f"framejit's backend {name!r} failed on the graph{_where(gm)} "
                   f"({type(cause).__name__}: {_first_line(cause)}). It runs as PyTorch code.")
        return gm.forward


def register_torch_compile_backend(name: str = "framejit") -> None:
    """Make ``torch.compile(..., backend=name)`` use :func:`framejit_backend`.

    Idempotent. Raises ValueError when torch already has a different backend of that name.
    ``import framejit`` calls it with the default name; an installed framejit also declares the
    ``torch_dynamo_backends`` entry point, so the name works without importing framejit.
    """
    from importlib.metadata import EntryPoint

    from torch._dynamo.backends import registry

    # torch's registry keeps loaded backends in _COMPILER_FNS and discovered entry points in
    # _BACKENDS. Its register_backend rejects a name registered before.
    loaded = getattr(registry, "_COMPILER_FNS", {})
    existing = loaded.get(name)
    if existing is framejit_backend:
        return
    if existing is not None:
        raise ValueError(
            f"torch.compile already has a backend named {name!r} ({existing!r}); register "
            f"framejit under another name: framejit.register_torch_compile_backend('other')"
        )
    if isinstance(getattr(registry, "_BACKENDS", {}).get(name), EntryPoint):
        # torch found framejit's entry point and is importing framejit to load it: torch
        # registers the function right after the import and would fail on a second registration.
        return
    registry.register_backend(framejit_backend, name=name)


def _register_at_import() -> None:
    try:
        register_torch_compile_backend()
    except Exception as e:  # a user's own "framejit" backend, or a torch without the registry
        warnings.warn(f"framejit: torch.compile(backend='framejit') is not available: {e}",
                      TorchCompileFallbackWarning, stacklevel=3)


# -- messages ------------------------------------------------------------------------------------


def _warn_once(message: str) -> None:
    if message in _warned:
        return
    _warned.add(message)
    # stacklevel: past this function and the backend, towards Dynamo's call of the backend.
    warnings.warn(message, TorchCompileFallbackWarning, stacklevel=3)


_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>\S+)')


def _where(gm: torch.fx.GraphModule) -> str:
    """``" of f() at model.py:42"``: the user's function and line of the graph's first op, from
    the stack traces Dynamo records; empty when there are none."""
    for node in gm.graph.nodes:
        trace = node.meta.get("stack_trace")
        if isinstance(trace, str):
            frames = list(_FRAME.finditer(trace))
            if frames:
                last = frames[-1]
                return f" of {last['fn']}() at {last['file']}:{last['line']}"
    return ""


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else ""


def _is_fake(x: Any) -> bool:
    if not isinstance(x, torch.Tensor):
        return False
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(x, FakeTensor)
