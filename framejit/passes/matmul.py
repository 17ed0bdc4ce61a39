"""``bmm_operands(graph)``: batched matmuls whose operands ``aten::matmul`` would copy get
operands laid out for ``bmm`` instead, by copies our kernels make.

Attention splits one ``linear`` result into heads: ``q = x.view(b, t, h, d).transpose(1, 2)``,
and ``k.transpose(-2, -1)``. ``torch.matmul`` of such 4-D operands folds the batch dimensions
into one with ``reshape``, which cannot view ``(b, h)`` with strides ``(t*h*d, d)`` and copies:
``q`` to a contiguous tensor, and ``k^T`` to a contiguous ``(d, t)`` layout, a transposing copy.
Inductor instead copies ``q`` and ``k`` row by row in one fused kernel and calls ``bmm`` with a
transposed view of ``k``: at 2x4x128x64 (1 thread) ``q @ k^T`` took 213 us through
``torch.matmul`` and 120 us as ``bmm`` plus 17 us of copies.

This pass does the same with graph nodes: an operand whose batch dimensions do not fold into
one is cloned contiguous (a pointwise kernel, fused with its neighbours where the partitioner
can); an operand whose last two dimensions are transposed (``k^T``) is cloned in its
untransposed order and transposed back (a view), so ``bmm`` reads it transposed. The result and
its layout do not change; only which kernels copy what.
"""

from __future__ import annotations

import operator

import torch

from ..fx_ir import Graph, Node, map_arg, run_on_meta

aten = torch.ops.aten

_MATMULS = (operator.matmul, torch.matmul, aten.matmul.default)


def _batch_folds(v: torch.Tensor) -> bool:
    """Whether ``v``'s batch dimensions (all but the last two) view as one."""
    dims = [d for d in range(v.dim() - 2) if v.shape[d] != 1]
    return all(v.stride(a) == v.stride(b) * v.shape[b] for a, b in zip(dims, dims[1:]))


def _operand(v) -> bool:
    return (isinstance(v, torch.Tensor) and v.dim() >= 4 and not v.requires_grad
            and v.dtype in (torch.float32, torch.float16, torch.bfloat16)
            and v.device.type in ("cpu", "meta"))


def _rerun(node: Node):
    args = map_arg(node.args, lambda n: n.meta["val"])
    kwargs = map_arg(node.kwargs, lambda n: n.meta["val"])
    with torch.no_grad():
        return run_on_meta(node.op, node.target, args, kwargs)


def bmm_operands(graph: Graph) -> bool:
    """Give batched matmuls operands that ``bmm`` reads as they are (see the module
    docstring); returns whether the graph changed."""
    changed = False
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in _MATMULS or len(node.args) != 2 \
                or node.kwargs:
            continue
        if torch.device(node.meta.get("device", "cpu")).type != "cpu":
            continue
        a, b = node.args
        if not (isinstance(a, Node) and isinstance(b, Node)):
            continue
        va, vb = a.meta.get("val"), b.meta.get("val")
        if not (_operand(va) and _operand(vb)) or va.shape[:-2] != vb.shape[:-2] \
                or va.dtype != vb.dtype:
            continue
        for index, (arg, v) in enumerate(((a, va), (b, vb))):
            if _batch_folds(v):
                continue
            transposed = v.stride(-2) == 1 and v.stride(-1) != 1
            with graph.inserting_before(node):
                src = arg
                if transposed:
                    src = graph.call_function(aten.transpose.int, (arg, -2, -1))
                    src.meta = {**arg.meta, "val": _rerun(src)}
                copy = graph.call_function(aten.clone.default, (src,),
                                           {"memory_format": torch.contiguous_format})
                copy.meta = {**arg.meta, "val": _rerun(copy)}
                new = copy
                if transposed:
                    new = graph.call_function(aten.transpose.int, (copy, -2, -1))
                    new.meta = {**arg.meta, "val": _rerun(new)}
            node.update_arg(index, new)
            changed = True
    return changed
