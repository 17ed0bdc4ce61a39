"""``channels_last_convs(graph)``: CPU convolutions in channels-last layout.

oneDNN's CPU convolution is up to 6x faster on an NHWC (channels-last) input than on NCHW
(3 -> 32 channels at 64x64: 4.0 ms against 0.6 ms at one thread), and its result is then
channels-last too. Inductor turns convolution graphs channels-last for this reason. This pass
converts the input of each 4-D fp32 CPU convolution to channels-last (once: a convolution's
channels-last result feeds the next one as it is), recomputes the example values of everything
after it (pointwise kernels then read and write channels-last), and converts a graph output
back to the layout eager returns.

The pass is all or nothing: if any later op cannot be re-run on its new example values, or
would change shape or dtype, or the graph mutates anything, the graph is left as it was.
"""

from __future__ import annotations

from typing import Any

import torch

from ..fx_ir import Graph, Node, map_arg, on_cpu, run_on_meta
from .util import KEEPDIM_REDUCTIONS, in_input_order

aten = torch.ops.aten
F = torch.nn.functional

_CONVS = (torch.conv2d, F.conv2d, aten.convolution.default, aten.conv2d.default)


def _is_conv(node: Node) -> bool:
    if node.op != "call_function" or node.target not in _CONVS or not node.args:
        return False
    x, v = node.args[0], node.meta.get("val")
    if not isinstance(x, Node) or not isinstance(v, torch.Tensor):
        return False
    xv = x.meta.get("val")
    return (isinstance(xv, torch.Tensor) and xv.dim() == 4 and xv.dtype == torch.float32
            and v.dim() == 4 and not v.requires_grad and xv.device.type in ("cpu", "meta")
            and on_cpu(node))


def _cl(t: torch.Tensor) -> bool:
    return t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last)


def channels_last_convs(graph: Graph) -> bool:
    """Run 4-D fp32 CPU convolutions channels-last; returns whether the graph changed."""
    nodes = list(graph.nodes)
    convs = [n for n in nodes if _is_conv(n)]
    if not convs:
        return False
    if any(n.is_impure() for n in nodes if n.op not in ("placeholder", "output")):
        return False
    old = {n: n.meta.get("val") for n in nodes}
    created: list[Node] = []
    try:
        first = nodes.index(convs[0])
        for node in nodes[first:]:
            if node.op == "output":
                _restore_outputs(graph, node, old, created)
                continue
            if node in convs:
                x = node.args[0]
                if not _cl(x.meta["val"]):
                    with graph.inserting_before(node):
                        to_cl = graph.call_function(aten.clone.default, (x,),
                                                    {"memory_format": torch.channels_last},
                                                    name="to_channels_last")
                    created.append(to_cl)
                    to_cl.meta = {**x.meta, "val": _rerun(to_cl)}
                    node.update_arg(0, to_cl)
            if node.op in ("call_function", "call_method"):
                value = _rerun(node)
                if node in convs:
                    # The meta kernel answers NCHW; oneDNN returns a channels-last input's
                    # result channels-last (kernels check this input's strides at run time).
                    value = value.contiguous(memory_format=torch.channels_last)
                elif node.target in KEEPDIM_REDUCTIONS and isinstance(node.args[0], Node):
                    value = in_input_order(value, node.args[0].meta["val"])
                if not _same_kind(value, old[node]):
                    raise ValueError(f"{node.name} changed kind")
                node.meta["val"] = value
    except Exception:
        _undo(graph, old, created)
        return False
    return True


def _same_kind(a: Any, b: Any) -> bool:
    """Non-tensor (or tuple) example values: equal shapes and dtypes all through."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)) and len(a) == len(b):
        return all(_same_kind(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and not isinstance(a, torch.Tensor)


def _rerun(node: Node) -> Any:
    args = map_arg(node.args, lambda n: n.meta["val"])
    kwargs = map_arg(node.kwargs, lambda n: n.meta["val"])
    with torch.no_grad():
        return run_on_meta(node.op, node.target, args, kwargs)


def _restore_outputs(graph: Graph, output: Node, old: dict, created: list) -> None:
    """Graph outputs whose layout changed go back to eager's (contiguous NCHW)."""
    def back(n: Any) -> Any:
        if not isinstance(n, Node):
            return n
        new, before = n.meta.get("val"), old.get(n)
        if not isinstance(new, torch.Tensor) or not isinstance(before, torch.Tensor) \
                or new.stride() == before.stride() or before.numel() <= 1:
            return n
        if not before.is_contiguous():
            raise ValueError("an output's layout cannot be restored")
        with graph.inserting_before(output):
            c = graph.call_function(aten.clone.default, (n,),
                                    {"memory_format": torch.contiguous_format}, name="to_nchw")
        created.append(c)
        c.meta = {**n.meta, "val": _rerun(c)}
        return c

    output.args = map_arg(output.args, back)


def _undo(graph: Graph, old: dict, created: list) -> None:
    for node in reversed(created):
        node.replace_all_uses_with(node.args[0])
        graph.erase_node(node)
    for node, value in old.items():
        if value is not None:
            node.meta["val"] = value
