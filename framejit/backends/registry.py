"""Named backends and the one call that compiles a graph with any of them.

A backend turns a graph into a callable that takes the graph's inputs. *Native* backends
receive framejit's own :class:`~framejit.fx_ir.GraphModule`; *user* backends receive a
``torch.fx.GraphModule`` and the real example inputs, the same contract as torch.compile's custom
backends, so one written for torch.compile works here unchanged.

Example::

    @register_backend("print_graph", native=False)
    def print_graph(gm: torch.fx.GraphModule, example_inputs):
        gm.graph.print_tabular()
        return gm.forward

    compiled = compile_graph("print_graph", graph_module, [x, w])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..fx_ir import GraphModule, to_torch_fx

BackendFn = Callable[[Any, list[Any]], Callable[..., Any]]


@dataclass(frozen=True)
class Backend:
    """A backend as found by :func:`lookup_backend`.

    ``native`` backends get a framejit GraphModule, the others a torch.fx.GraphModule.
    """

    name: str
    fn: BackendFn
    native: bool


_REGISTRY: dict[str, Backend] = {}
_builtins_loaded = False


def register_backend(
    name: str, fn: BackendFn | None = None, *, native: bool = True, replace: bool = False
) -> Any:
    """Register ``fn`` under ``name``; without ``fn`` it is a decorator.

    A name can be registered once (registering the same function again is a no-op); pass
    ``replace=True`` to swap in a different function on purpose.
    """
    if fn is None:

        def decorator(f: BackendFn) -> BackendFn:
            register_backend(name, f, native=native, replace=replace)
            return f

        return decorator
    if not callable(fn):
        raise TypeError(f"backend {name!r} must be callable, got {type(fn).__name__}")
    existing = _REGISTRY.get(name)
    if existing is not None and existing.fn is not fn and not replace:
        raise ValueError(
            f"a backend named {name!r} is already registered ({_describe(existing.fn)}); "
            f"choose another name or pass replace=True"
        )
    _REGISTRY[name] = Backend(name, fn, native)
    return fn


def _load_builtins() -> None:
    # The built-in backends register themselves on import; importing them here (not at module
    # level) avoids a cycle, since they import this module.
    global _builtins_loaded
    if not _builtins_loaded:
        _builtins_loaded = True
        from . import eager  # noqa: F401


def list_backends() -> list[str]:
    """The names of all registered backends, sorted."""
    _load_builtins()
    return sorted(_REGISTRY)


def lookup_backend(name_or_callable: str | BackendFn | Backend) -> Backend:
    """The :class:`Backend` for a registered name; a callable is a user backend
    (``native=False``) named after the function."""
    if isinstance(name_or_callable, Backend):
        return name_or_callable
    if isinstance(name_or_callable, str):
        _load_builtins()
        backend = _REGISTRY.get(name_or_callable)
        if backend is None:
            raise ValueError(
                f"unknown backend {name_or_callable!r}. Registered backends: "
                f"{', '.join(sorted(_REGISTRY))}. Register one with "
                f"framejit.backends.register_backend(name, fn), or pass a callable "
                f"(torch.fx.GraphModule, example_inputs) -> callable as the backend."
            )
        return backend
    if callable(name_or_callable):
        name = getattr(name_or_callable, "__name__", None) or type(name_or_callable).__name__
        return Backend(name, name_or_callable, native=False)
    raise TypeError(f"backend must be a name or a callable, got {type(name_or_callable).__name__}")


def compile_graph(
    backend: str | BackendFn | Backend, gm: GraphModule, example_inputs: Sequence[Any]
) -> Callable[..., Any]:
    """Compile ``gm`` with ``backend`` and return the callable that runs it.

    Native backends get ``gm`` itself; user backends get ``to_torch_fx(gm)``. Both get
    ``example_inputs`` as a list (the real inputs of the call being compiled). An exception
    raised by the backend propagates unchanged (the caller adds its own context); a return
    value that is not callable raises TypeError naming the backend.
    """
    record = lookup_backend(backend)
    example_inputs = list(example_inputs)
    kept = None
    if record.native:
        graph_module = gm
    else:
        graph_module, kept = _sizes_from_tensors(gm, to_torch_fx(gm))
        if kept is not None:
            example_inputs = [example_inputs[i] for i in kept]
    compiled = record.fn(graph_module, example_inputs)
    if not callable(compiled):
        raise TypeError(
            f"backend {record.name!r} returned {_describe(compiled)}, which is not callable. "
            f"A backend must return a function taking the graph's inputs "
            f"(e.g. `return gm.forward`)."
        )
    if kept is not None:
        return _taking(compiled, kept)
    return compiled


def _sizes_from_tensors(gm: GraphModule, fx_gm: Any) -> tuple[Any, list[int] | None]:
    """A graph captured with symbolic sizes takes each size as an int input, bound from a
    tensor input's size by the caller. A user backend gets instead a graph that reads those
    sizes from its tensor inputs (``x.size(0)``), so it sees which sizes vary and how they relate
    (a backend written for torch.compile expects no int inputs beside the tensors). Returns the
    graph and the positions of the inputs it keeps (None when nothing changed)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    tensors = {n.meta.get("source"): i for i, n in enumerate(placeholders) if "size_of" not in n.meta}
    plan = {}
    for i, n in enumerate(placeholders):
        size_of = n.meta.get("size_of")
        if size_of is not None and size_of[0] in tensors:
            plan[i] = (tensors[size_of[0]], size_of[1])
    if not plan:
        return fx_gm, None
    graph = fx_gm.graph
    fx_placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    anchor = next(n for n in graph.nodes if n.op != "placeholder")
    for i, (t, dim) in plan.items():
        with graph.inserting_before(anchor):
            size = graph.call_method("size", (fx_placeholders[t], dim))
        size.meta.update(fx_placeholders[i].meta)
        fx_placeholders[i].replace_all_uses_with(size)
        graph.erase_node(fx_placeholders[i])
    fx_gm.recompile()
    return fx_gm, [i for i in range(len(placeholders)) if i not in plan]


def _taking(compiled: Callable[..., Any], kept: list[int]) -> Callable[..., Any]:
    """``compiled`` called with the inputs at positions ``kept`` of the graph's inputs."""

    def call(*args):
        return compiled(*[args[i] for i in kept])

    return call


def _describe(obj: Any) -> str:
    text = repr(obj)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(obj).__name__} {text}"
