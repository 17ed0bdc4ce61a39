"""Helpers for testing code compiled with framejit (and framejit itself).

``RecordingBackend`` is a user backend that keeps every graph it is given::

    backend = RecordingBackend()
    f = framejit.compile(fn, backend=backend)
    f(x)
    assert backend.graph_count == 1
    print(backend.graphs[0].code)

``fx_export_backend`` is the same kind of pass-through without the recording, and
``route_default_backend_through_fx()`` makes ``backend="default"`` and ``"eager"`` use it, so a
whole test suite runs through ``to_torch_fx`` and torch.fx's own generated code (``make test``
does this for tests/capture and tests/models with ``FRAMEJIT_TEST_BACKEND=fx``)::

    restore = route_default_backend_through_fx()
    ...
    restore()

``assert_close_to_eager`` compares a compiled result with the eager one, with tolerances that
depend on the dtype, through nested tuples, lists and dicts::

    assert_close_to_eager(f(x), fn(x))
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.fx

__all__ = [
    "RecordingBackend",
    "assert_close_to_eager",
    "TOLERANCES",
    "capture_stats",
    "fx_export_backend",
    "route_default_backend_through_fx",
    "run_renderings_in_place",
]


class _LiveStats:
    """Reads the counters of ``framejit.record`` (reset in place by ``framejit.reset()``)."""

    def __getattr__(self, name: str) -> Any:
        from . import record

        return getattr(record.stats, name)

    def __repr__(self) -> str:
        from . import record

        return repr(record.stats)


def fresh_state():
    """A pytest fixture body: a clean framejit (no cache entries, zeroed statistics) and a fixed
    seed before a test, and a clean framejit after it. Use it as
    ``fresh_framejit = pytest.fixture(autouse=True)(fresh_state)`` in a conftest."""
    import framejit

    framejit.reset()
    torch.manual_seed(0)
    yield
    framejit.reset()


def capture_stats() -> Any:
    """A live view of framejit's capture statistics (frames, captured, graphs, ops, recompiles,
    eager_frames, fallback_reasons, recompile_reasons)::

        stats = capture_stats()
        f(x)
        assert stats.graphs == 1 and stats.eager_frames == 0
    """
    return _LiveStats()


class RecordingBackend:
    """A user backend ``(torch.fx.GraphModule, example_inputs) -> callable`` that records what it
    receives and runs the graph unchanged (it returns ``gm.forward``).

    ``graphs`` holds each ``torch.fx.GraphModule`` in the order received, ``example_inputs`` the
    matching lists of example inputs.
    """

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []
        self.example_inputs: list[list[Any]] = []
        self.__name__ = "recording"  # the name framejit uses for this backend in messages

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]):
        self.graphs.append(gm)
        self.example_inputs.append(list(example_inputs))
        return gm.forward

    @property
    def graph_count(self) -> int:
        """How many graphs were compiled with this backend."""
        return len(self.graphs)

    @property
    def op_count(self) -> int:
        """Call nodes (call_function, call_method, call_module) over all recorded graphs."""
        return sum(len(self.calls(i)) for i in range(len(self.graphs)))

    def calls(self, index: int = -1) -> list[torch.fx.Node]:
        """The call nodes of graph ``index`` (default: the last one)."""
        return [n for n in self.graphs[index].graph.nodes if n.op.startswith("call")]

    def targets(self, index: int = -1) -> list[Any]:
        """The targets of the call nodes of graph ``index``, in order (functions or method names)."""
        return [n.target for n in self.calls(index)]

    def clear(self) -> None:
        self.graphs.clear()
        self.example_inputs.clear()


def fx_export_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]):
    """A user backend that runs the torch.fx GraphModule it is given unchanged: the code torch.fx
    generated for it (``gm.forward``), after ``gm.graph.lint()``."""
    gm.graph.lint()
    return gm.forward


def route_default_backend_through_fx():
    """Test hook: from now on ``backend="default"`` and ``backend="eager"`` resolve to
    :func:`fx_export_backend` as a user backend, so every graph they get is converted with
    ``to_torch_fx`` and runs torch.fx's generated code instead of framejit's. Returns a function
    that puts back what the two names resolved to before."""
    from .backends import registry

    registry.list_backends()  # the built-ins first, so that they are what is put back
    saved = {name: registry._REGISTRY[name] for name in ("default", "eager")}
    for name in saved:
        registry.register_backend(name, fx_export_backend, native=False, replace=True)

    def restore() -> None:
        registry._REGISTRY.update(saved)

    return restore


def run_renderings_in_place():
    """Test hook: from now on every cache entry runs its readable rendering
    (``CacheEntryInfo.readable_source``, capture/readable/) in place of its rewritten bytecode:
    the hook, having checked the entry's guards, calls the rendered ``rewritten_<f>`` function
    (and resume functions, captured in turn, run theirs). A test suite that passes this way shows
    that the renderings do what the rewritten code does. A rendering that cannot be made raises,
    so the frame falls back loudly (``stats.eager_frames``). Returns a function that undoes it."""
    from . import _C
    from .capture import convert_frame
    from .capture.output import make_trampoline

    capture = convert_frame._capture

    def capture_and_render(ctx, code, func, f_locals, *args, **kwargs):
        info = capture(ctx, code, func, f_locals, *args, **kwargs)
        rendering = info.rendering()
        namespace = dict(rendering.namespace)
        exec(compile(rendering.source, f"<framejit-readable {code.co_name}>", "exec"), namespace)
        (name,) = [n for n in namespace if n.startswith("rewritten_")]
        rewritten = namespace[name]
        _C.set_code_mode(rewritten.__code__, _C.MODE_SKIP)
        info.trampoline = make_trampoline(code, rewritten)
        return info

    convert_frame._capture = capture_and_render

    def restore() -> None:
        convert_frame._capture = capture

    return restore


#: (rtol, atol) per dtype. fp32/fp64 are torch.testing's defaults; the reduced-precision types are
#: looser because compiled code may accumulate in a different order.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.complex128: (1e-7, 1e-7),
    torch.float32: (1.3e-6, 1e-5),
    torch.complex64: (1.3e-6, 1e-5),
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (1.6e-2, 1e-2),
}


def assert_close_to_eager(actual: Any, expected: Any, *, rtol: float | None = None,
                          atol: float | None = None, path: str = "result") -> None:
    """Assert that ``actual`` (a compiled result) matches ``expected`` (the eager result).

    Tensors must agree in type, dtype, shape, device and requires_grad, and in value within the
    tolerances of their dtype (:data:`TOLERANCES`; integer and bool tensors exactly); tuples,
    lists and dicts are compared item by item and must have the same type and length/keys;
    anything else must be ``==``. ``rtol``/``atol`` override the per-dtype defaults. The error
    names the path of the item that differs (``result[1]['logits']``).
    """
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            raise AssertionError(f"{path}: expected a tensor, got {type(actual).__name__}: {actual!r:.80}")
        if type(actual) is not type(expected):
            raise AssertionError(f"{path}: tensor type {type(actual).__name__} != {type(expected).__name__}")
        if actual.dtype != expected.dtype:
            raise AssertionError(f"{path}: dtype {actual.dtype} != {expected.dtype}")
        if actual.shape != expected.shape:
            raise AssertionError(f"{path}: shape {list(actual.shape)} != {list(expected.shape)}")
        if actual.device != expected.device:
            raise AssertionError(f"{path}: device {actual.device} != {expected.device}")
        if actual.requires_grad != expected.requires_grad:
            raise AssertionError(f"{path}: requires_grad {actual.requires_grad} != {expected.requires_grad}")
        default_rtol, default_atol = TOLERANCES.get(expected.dtype, (0.0, 0.0))
        try:
            torch.testing.assert_close(
                actual.detach(), expected.detach(),
                rtol=default_rtol if rtol is None else rtol,
                atol=default_atol if atol is None else atol,
                equal_nan=True,
            )
        except AssertionError as e:
            raise AssertionError(f"{path}: {e}") from None
        return
    if isinstance(expected, torch.nn.Module):
        # A module (e.g. one a compiled function mutated): compare its state.
        if type(actual) is not type(expected):
            raise AssertionError(f"{path}: expected a {type(expected).__name__}, got {type(actual).__name__}")
        assert_close_to_eager(actual.state_dict(), expected.state_dict(), rtol=rtol, atol=atol,
                              path=f"{path}.state_dict()")
        if actual.training != expected.training:
            raise AssertionError(f"{path}.training: {actual.training} != {expected.training}")
        return
    if isinstance(expected, Mapping):
        if type(actual) is not type(expected):
            raise AssertionError(f"{path}: expected a {type(expected).__name__}, got {type(actual).__name__}")
        if list(actual.keys()) != list(expected.keys()):
            raise AssertionError(f"{path}: keys {list(actual.keys())} != {list(expected.keys())}")
        for k in expected:
            assert_close_to_eager(actual[k], expected[k], rtol=rtol, atol=atol, path=f"{path}[{k!r}]")
        return
    if isinstance(expected, Sequence) and not isinstance(expected, (str, bytes)):
        if type(actual) is not type(expected):
            raise AssertionError(f"{path}: expected a {type(expected).__name__}, got {type(actual).__name__}")
        if len(actual) != len(expected):
            raise AssertionError(f"{path}: length {len(actual)} != {len(expected)}")
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_close_to_eager(a, e, rtol=rtol, atol=atol, path=f"{path}[{i}]")
        return
    if type(actual) is type(expected) and isinstance(expected, float) and expected != expected:
        if actual != actual:
            return  # both NaN
    if type(actual) is not type(expected) or actual != expected:
        raise AssertionError(f"{path}: {actual!r} != {expected!r}")


@contextlib.contextmanager
def declined_kernels() -> Iterator[list]:
    """The reasons of the graphs whose kernels were declined inside the block (a graph with
    symbolic sizes that kernels cannot serve for every size runs its torch ops): a list that
    grows as graphs compile."""
    from framejit import record

    reasons: list = []

    def on_event(event) -> None:
        if isinstance(event, record.KernelsDeclined):
            reasons.append(event.reason)

    record.subscribe(on_event)
    try:
        yield reasons
    finally:
        record.unsubscribe(on_event)


@contextlib.contextmanager
def built_by_pipeline() -> Iterator[list]:
    """The functions the kernel pipeline builds inside the block (``framejit_kernels``,
    ``framejit_graph``, ...): a list that grows as graphs are compiled."""
    from framejit import pipeline

    built: list = []
    original = pipeline.compile_with_kernels

    def spy(*args, **kwargs):
        fn = original(*args, **kwargs)
        built.append(fn)
        return fn

    pipeline.compile_with_kernels = spy
    try:
        yield built
    finally:
        pipeline.compile_with_kernels = original
