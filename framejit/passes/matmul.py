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

from ..fx_ir import Graph, Node, map_arg, on_cpu, run_on_meta

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
        if not on_cpu(node):
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


# -- output rows that cuBLAS can address aligned ---------------------------------------------------

_LINEARS = (torch.nn.functional.linear, torch._C._nn.linear, aten.linear.default)
_MMS = (aten.mm.default, torch.mm) + _MATMULS
_ADDMMS = (aten.addmm.default, torch.addmm)

#: Matmuls smaller than this many output elements keep their shape: padding them costs more
#: than a slow kernel would.
ALIGN_MIN_OUTPUT = 1 << 20


def aligned_matmul_outputs(graph: Graph, device_type: str = "cuda") -> bool:
    """CUDA matmuls whose output rows are not a whole number of 16 bytes get a weight padded
    to such rows, and their result is sliced back and copied contiguous; returns whether the
    graph changed.

    cuBLAS then runs an unaligned ("align1") kernel: on an H200 GPT-2's language-model head
    (4096 x 768 @ 768 x 50257, bf16) took 3.36 ms of a 4.1 ms forward pass in eager torch and
    in framejit alike, in an sm_75 CUTLASS kernel. Inductor pads the same product and runs it
    in 0.45 ms. The padding copies the weight each call (77 MB there, about 40 us) and the copy
    back is a pointwise kernel that fuses with the result's users; the result keeps eager's
    layout. Only without gradients: in training the graph keeps its torch ops as they are.
    ``device_type``: the device whose matmuls are changed (tests use "cpu")."""
    changed = False
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if torch.device(node.meta.get("device", "cpu")).type != device_type:
            continue
        out = node.meta.get("val")
        if not isinstance(out, torch.Tensor) or out.requires_grad or out.dim() < 1 \
                or out.dtype not in (torch.float16, torch.bfloat16, torch.float32) \
                or any(not isinstance(s, int) for s in out.shape) or out.numel() < ALIGN_MIN_OUTPUT:
            continue
        align = 16 // out.dtype.itemsize
        n = out.shape[-1]
        if n % align == 0 or not out.is_contiguous():
            continue
        pad = -n % align
        padded = _padded_matmul(graph, node, pad)
        if padded is None:
            continue
        with graph.inserting_after(padded):
            view = graph.call_function(aten.slice.Tensor, (padded, -1, 0, n))
            view.meta = {**node.meta, "val": _rerun(view)}
        with graph.inserting_after(view):
            copy = graph.call_function(aten.clone.default, (view,),
                                       {"memory_format": torch.contiguous_format})
            copy.meta = {**node.meta, "val": _rerun(copy)}
        node.replace_all_uses_with(copy)
        graph.erase_node(node)
        changed = True
    return changed


def _padded_matmul(graph: Graph, node: Node, pad: int) -> Node | None:
    """A copy of matmul ``node`` whose weight (and bias) has ``pad`` more output columns of
    zeros, inserted before it; None for a form it does not know."""
    args = list(node.args)
    if node.target in _LINEARS:
        if len(args) < 2 or len(args) > 3 or set(node.kwargs) - {"bias"}:
            return None
        bias = args[2] if len(args) == 3 else node.kwargs.get("bias")
        weight = args[1]
        if not _weight(weight, 2) or (bias is not None and not _weight(bias, 1)):
            return None
        with graph.inserting_before(node):
            new_args = [args[0], _pad(graph, weight, [0, 0, 0, pad])]
            if bias is not None:
                new_args.append(_pad(graph, bias, [0, pad]))
            new = graph.call_function(node.target, tuple(new_args))
    elif node.target in _MMS or node.target in _ADDMMS:
        addmm = node.target in _ADDMMS
        operands = args[1:] if addmm else args
        if node.kwargs or len(operands) != 2 or not _weight(operands[1], 2):
            return None
        if addmm and not _weight(args[0], 1):
            return None  # a bias of another shape (a full matrix, say) keeps the node as it is
        with graph.inserting_before(node):
            rhs = _pad(graph, operands[1], [0, pad])
            new_args = ((_pad(graph, args[0], [0, pad]), args[1], rhs) if addmm
                        else (args[0], rhs))
            new = graph.call_function(node.target, new_args)
    else:
        return None
    new.meta = {**node.meta, "val": _rerun(new)}
    return new


def _weight(arg, dim: int) -> bool:
    """Whether ``arg`` is a node of a ``dim``-dimensional tensor (a parameter may require grad:
    the matmul's result does not, so the graph runs without autograd)."""
    v = arg.meta.get("val") if isinstance(arg, Node) else None
    return isinstance(v, torch.Tensor) and v.dim() == dim


def _pad(graph: Graph, arg: Node, pad: list[int]) -> Node:
    new = graph.call_function(aten.constant_pad_nd.default, (arg, pad, 0.0))
    new.meta = {**arg.meta, "val": _rerun(new)}
    return new
