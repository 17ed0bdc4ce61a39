"""The one seam between capture and compilation.

Capture ends with a finished graph and its example inputs; it calls the function that
:func:`make_compiler` built for its ``compile()`` wrapper and never imports passes, kernels or
backends itself. The pipeline for the built-in kernel backends is::

    graph ── passes (normalize, decompose, DCE/CSE/fold) ── fusion groups (networkx)
          ── each group: kernel description ── renderer (Triton) ── compiled kernel
          ── a wrapper: the graph with each group replaced by one kernel launch

Backends:
    ``"eager"``    the graph's generated Python over torch ops;
    ``"default"``  C kernels for CPU tensors, Triton kernels for CUDA tensors; without a C
                   compiler, CPU tensors run eager (one warning says what is missing);
    ``"triton"``   Triton kernels for every tensor; on CPU tensors Triton's interpreter runs them,
                   which is slow and meant for tests;
    ``"c"``        C kernels (compiled with the system C compiler) for CPU tensors, Triton kernels
                   for CUDA tensors;
    any registered name or a callable ``(torch.fx.GraphModule, example_inputs) -> callable``.

Example::

    compile_graph = make_compiler("triton")
    fn = compile_graph(graph_module, [x, w])
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import _C
from . import record as events
from .backends.registry import Backend, compile_graph, lookup_backend, register_backend
from .errors import BackendError
from .fx_ir import GraphModule

CompileFn = Callable[[GraphModule, list], Callable[..., Any]]


def make_compiler(backend: Any) -> CompileFn:
    """The compile pipeline for one ``compile()`` wrapper: ``fn(gm, example_inputs) -> callable``.

    An unknown backend name fails here, at ``compile()`` time. The returned function raises
    :class:`BackendError` (with the backend's exception as its cause) when the backend fails;
    capture then runs the frame as plain Python, or raises under ``fullgraph=True``.
    """
    record = lookup_backend(backend)

    def compile_fn(gm: GraphModule, example_inputs: list) -> Callable[..., Any]:
        t0 = time.perf_counter()
        try:
            compiled = compile_graph(record, gm, example_inputs)
        except Exception as e:
            raise BackendError(
                f"backend {record.name!r} failed to compile a graph ({type(e).__name__}: {e}):"
                f"\n{gm.graph}"
            ) from e
        events.emit(events.GraphCompiled(backend=record.name, graph=gm, compiled=compiled,
                                         seconds=time.perf_counter() - t0))
        return _never_captured(record, compiled)

    compile_fn.backend = record  # type: ignore[attr-defined]
    return compile_fn


def _never_captured(record: Backend, compiled: Callable[..., Any]) -> Callable[..., Any]:
    code = getattr(compiled, "__code__", None)
    if record.native and code is not None:
        # Generated graph code must never be captured itself.
        _C.set_code_mode(code, _C.MODE_SKIP)
        return compiled
    # A user backend may return anything callable; run it with capture off so that nothing it
    # calls is captured again.
    return _C.CompiledFunction(compiled, None)


# -- the built-in kernel backends ---------------------------------------------------------------


def kernel_devices(backend_name: str) -> frozenset[str]:
    """The device types whose tensors get generated kernels under a built-in backend
    (``"default"`` includes CPU only while a C compiler is found)."""
    if backend_name in ("triton", "c"):
        return frozenset({"cuda", "cpu"})
    if backend_name == "default" and _have_c_compiler():
        return frozenset({"cuda", "cpu"})
    return frozenset({"cuda"})


_warned_no_c_compiler = False


def _have_c_compiler() -> bool:
    """Whether C kernels can be built; without a compiler, warns once per process (naming what is
    missing) and the default backend runs CPU tensors eagerly."""
    from .kernels.c_runtime import CCompilerMissing, find_compiler

    try:
        find_compiler()
    except CCompilerMissing as e:
        global _warned_no_c_compiler
        if not _warned_no_c_compiler:
            _warned_no_c_compiler = True
            import warnings

            warnings.warn(f"framejit: {e}. CPU tensors run as eager torch ops under the default "
                          f"backend.", RuntimeWarning, stacklevel=2)
        return False
    return True


def _tensors_on(gm: GraphModule, example_inputs: Sequence[Any], devices: frozenset[str]) -> bool:
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            device = node.meta.get("device", val.device)
            if torch.device(device).type in devices:
                return True
    return any(isinstance(t, torch.Tensor) and t.device.type in devices for t in example_inputs)


def default_backend(gm: GraphModule, example_inputs: list) -> Callable[..., Any]:
    """C kernels for fusion groups on CPU tensors and Triton kernels for those on CUDA tensors;
    a graph with no tensors on those devices runs as the eager backend."""
    devices = kernel_devices("default")
    if not _tensors_on(gm, example_inputs, devices):
        return gm.forward_fn
    from .kernels.c_runtime import CLauncher
    from .kernels.triton_runtime import Launcher
    from .pipeline import compile_with_kernels

    return compile_with_kernels(gm, example_inputs, devices,
                                launcher={"cpu": CLauncher, "cuda": Launcher}, cache=True)


def triton_backend(gm: GraphModule, example_inputs: list) -> Callable[..., Any]:
    """Triton kernels for every fusion group, on any device (the interpreter on CPU)."""
    from .pipeline import compile_with_kernels

    return compile_with_kernels(gm, example_inputs, kernel_devices("triton"))


def c_backend(gm: GraphModule, example_inputs: list) -> Callable[..., Any]:
    """C kernels for fusion groups on CPU tensors, Triton kernels for those on CUDA tensors.
    Without a C compiler it raises (:class:`~framejit.kernels.c_runtime.CCompilerMissing`),
    which capture turns into a plain-Python fallback with a warning naming what is missing."""
    from .kernels.c_runtime import CLauncher
    from .kernels.triton_runtime import Launcher
    from .pipeline import compile_with_kernels

    return compile_with_kernels(gm, example_inputs, kernel_devices("c"),
                                launcher={"cpu": CLauncher, "cuda": Launcher}, cache=True)


register_backend("default", default_backend, replace=True)
register_backend("triton", triton_backend)
register_backend("c", c_backend)
