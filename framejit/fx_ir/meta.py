"""Example values on the meta device: shapes and dtypes without data or compute.

``to_meta(x)`` turns real tensors into meta tensors of the same shape, strides, dtype and
``requires_grad``; ``propagate_meta(gm, *inputs)`` runs every node on such tensors and stores the
result in ``node.meta["val"]``; ``describe(v)`` gives the short text ``f32[4, 32]`` that
``str(graph)`` and generated code print.

Example::

    propagate_meta(gm, torch.randn(4, 16))
    gm.graph.find_nodes(op="output")[0].meta["val"]   # meta tensors of the outputs
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import torch

from .examples import run_on_meta
from .node import Node, map_aggregate

# Abbreviations used wherever a dtype is printed. Newer dtypes are added only when this torch
# has them.
DTYPE_ABBREVIATIONS: dict[torch.dtype, str] = {
    torch.float64: "f64",
    torch.float32: "f32",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.complex128: "c128",
    torch.complex64: "c64",
    torch.complex32: "c32",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.int16: "i16",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.bool: "b8",
}
for _name, _abbr in (
    ("uint16", "u16"),
    ("uint32", "u32"),
    ("uint64", "u64"),
    ("float8_e4m3fn", "f8e4m3fn"),
    ("float8_e5m2", "f8e5m2"),
    ("float8_e4m3fnuz", "f8e4m3fnuz"),
    ("float8_e5m2fnuz", "f8e5m2fnuz"),
):
    if hasattr(torch, _name):
        DTYPE_ABBREVIATIONS[getattr(torch, _name)] = _abbr


class MetaPropagationError(RuntimeError):
    """A node could not run on meta tensors.

    Cause: the op needs real data (``x.item()``, data-dependent output shapes such as
    ``torch.nonzero``) or has no meta implementation. Fix: keep such ops out of the graph, or set
    ``node.meta["val"]`` for the node yourself before propagating.
    """


class _DropFailedMetaRuns(logging.Filter):
    """torch's fake tensors log a traceback at ERROR level when an op's meta function fails,
    then raise; framejit catches that error and falls back, so the log would only alarm."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("failed while attempting to run meta")


_FAKE_LOG = logging.getLogger("torch._subclasses.fake_tensor")


@contextlib.contextmanager
def quiet_failed_meta_runs():
    """While framejit runs ops on fake tensors, and handles their errors itself."""
    quiet = _DropFailedMetaRuns()
    _FAKE_LOG.addFilter(quiet)
    try:
        yield
    finally:
        _FAKE_LOG.removeFilter(quiet)


def has_symbolic_sizes(graph: Any) -> bool:
    """Whether ``graph`` was captured with symbolic sizes: some input tensor's dimensions
    (``meta["dynamic_dims"]``) or input sizes (``meta["symbol"]``) vary from call to call, so
    the ``meta["val"]`` shapes are only the sizes seen at capture."""
    return any(n.op == "placeholder" and ("dynamic_dims" in n.meta or "symbol" in n.meta)
               for n in graph.nodes)


def dtype_abbr(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``f32``; an unknown dtype prints as its name."""
    return DTYPE_ABBREVIATIONS.get(dtype, str(dtype).removeprefix("torch."))


def describe(value: Any) -> str:
    """Short type text: ``f32[4, 32]`` for a tensor, ``(f32[2], i64[])`` for a tuple, the type
    name (``int``, ``bool``) for other values."""
    if isinstance(value, torch.Tensor):
        return f"{dtype_abbr(value.dtype)}[{', '.join(str(s) for s in value.shape)}]"
    if type(value) is tuple:
        items = [describe(v) for v in value]
        return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
    if type(value) is list:
        return f"[{', '.join(describe(v) for v in value)}]"
    if type(value) is dict:
        return "{" + ", ".join(f"{k!r}: {describe(v)}" for k, v in value.items()) + "}"
    if value is None:
        return "None"
    return type(value).__name__


def _tensor_to_meta(t: torch.Tensor) -> torch.Tensor:
    if t.layout is not torch.strided:  # sparse and friends have no strides to copy
        out = torch.empty(t.shape, dtype=t.dtype, layout=t.layout, device="meta")
    else:
        out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
    # requires_grad is only allowed on floating point and complex tensors.
    if t.requires_grad:
        out.requires_grad_(True)
    return out


def to_meta(value: Any) -> Any:
    """Replace every tensor in ``value`` (nested in tuples, lists, dicts) by a meta tensor of the
    same shape, strides, dtype and requires_grad; other leaves are kept."""
    return map_aggregate(value, lambda x: _tensor_to_meta(x) if isinstance(x, torch.Tensor) else x)


def resolve_qualname(root: Any, qualname: str) -> Any:
    """``root`` is a dict (keys are qualified names or top-level names) or any object; walk the
    dotted ``qualname`` from it, e.g. ``"linear.weight"``."""
    if isinstance(root, dict):
        if qualname in root:
            return root[qualname]
        head, _, rest = qualname.partition(".")
        if head not in root or not rest:
            raise AttributeError(
                f"no attribute {qualname!r}: the root dict has keys {sorted(root)!r}"
            )
        obj, atoms = root[head], rest.split(".")
    else:
        obj, atoms = root, qualname.split(".")
    walked = []
    for atom in atoms:
        walked.append(atom)
        if not hasattr(obj, atom):
            raise AttributeError(
                f"no attribute {qualname!r}: {type(obj).__name__} has no {'.'.join(walked)!r}"
            )
        obj = getattr(obj, atom)
    return obj


def _run_module_on_meta(module: torch.nn.Module, args: Any, kwargs: Any) -> Any:
    # A module's own parameters are real tensors, which cannot mix with meta inputs: call it
    # functionally with meta copies of its parameters and buffers instead.
    state = {name: _tensor_to_meta(t) for name, t in module.named_parameters()}
    state.update({name: _tensor_to_meta(t) for name, t in module.named_buffers()})
    return torch.func.functional_call(module, state, tuple(args), dict(kwargs))


# Tensor methods that move a tensor to another device; on meta they keep it on meta.
_DEVICE_MOVES = frozenset({"to", "cuda", "cpu"})


def _call_on_meta(op: str, target: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    """Run one call node on meta values. Device arguments are redirected to meta: a factory
    (``torch.ones(3, device=d)``) allocates nothing and a device move (``x.to("cuda")``,
    ``x.cpu()``) stays on meta, where the real device cannot be reached. A tensor that still
    comes out on a real device (``torch.ones(3)`` with the default device) is converted. Runs
    are memoised (:func:`~framejit.fx_ir.run_on_meta`)."""
    if "device" in kwargs:
        kwargs = {**kwargs, "device": "meta"}
    if op == "call_method":
        obj, *rest = args
        if target in _DEVICE_MOVES and isinstance(obj, torch.Tensor):
            if target == "to":
                rest = ["meta" if isinstance(a, (str, torch.device)) else a for a in rest]
            else:  # .cuda(device=None, non_blocking=False, memory_format=...) and .cpu(...)
                target, rest = "to", ["meta"]
                kwargs = {k: v for k, v in kwargs.items() if k == "memory_format"}
            args = (obj, *rest)
    value = run_on_meta(op, target, args, kwargs)
    return map_aggregate(
        value,
        lambda x: _tensor_to_meta(x)
        if isinstance(x, torch.Tensor) and x.device.type != "meta"
        else x,
    )


def propagate_meta(gm_or_graph: Any, *example_inputs: Any) -> Any:
    """Run every node on meta tensors and store its result in ``node.meta["val"]``.

    ``gm_or_graph`` is a GraphModule (get_attr and call_module targets are resolved on it) or a
    bare Graph (then each get_attr node must already have ``meta["val"]``). Real tensors among
    the inputs and constants are converted with :func:`to_meta`; device arguments of calls are
    redirected to meta (the real devices are for the caller to record, e.g. in
    ``meta["device"]``). Returns the output's meta value.
    """
    graph = getattr(gm_or_graph, "graph", gm_or_graph)
    root = getattr(gm_or_graph, "root", None) if graph is not gm_or_graph else None
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if len(example_inputs) > len(placeholders):
        raise TypeError(
            f"propagate_meta got {len(example_inputs)} inputs but the graph has "
            f"{len(placeholders)} placeholders ({', '.join(p.name for p in placeholders)})"
        )
    position = {node: i for i, node in enumerate(placeholders)}
    env: dict[Node, Any] = {}

    def load_leaf(x: Any) -> Any:
        # Values computed by earlier nodes are used as they are (a fresh meta copy would lose
        # autograd history and make `y.add_(1)` look like an in-place op on a leaf).
        if isinstance(x, Node):
            return env[x]
        return _tensor_to_meta(x) if isinstance(x, torch.Tensor) else x

    def load(a: Any) -> Any:
        return map_aggregate(a, load_leaf)

    result = None
    for node in graph.nodes:
        op = node.op
        try:
            if op == "placeholder":
                index = position[node]
                if index < len(example_inputs):
                    value = to_meta(example_inputs[index])
                elif node.args:
                    value = to_meta(node.args[0])
                else:
                    raise TypeError(f"no example input for placeholder {node.name!r}")
            elif op == "get_attr":
                if root is None:
                    if "val" not in node.meta:
                        raise TypeError(
                            "a bare Graph has no module to load the attribute from; pass the "
                            "GraphModule or set meta['val'] on the get_attr node"
                        )
                    value = node.meta["val"]
                else:
                    value = to_meta(resolve_qualname(root, node.target))
            elif op in ("call_function", "call_method"):
                value = _call_on_meta(op, node.target, load(node.args), load(node.kwargs))
            elif op == "call_module":
                if root is None:
                    raise TypeError("a bare Graph has no module to call; pass the GraphModule")
                module = resolve_qualname(root, node.target)
                value = _run_module_on_meta(module, load(node.args), load(node.kwargs))
            else:  # output
                value = result = load(node.args[0])
        except MetaPropagationError:
            raise
        except Exception as e:
            raise MetaPropagationError(
                f"while propagating meta values, node %{node.name} failed:\n"
                f"    {node.format()}\n"
                f"{type(e).__name__}: {e}"
            ) from e
        env[node] = value
        node.meta["val"] = value
    return result
