"""The aten/prims overloads the passes produce: the one vocabulary the fusion partitioner and
the kernel lowering read.

After ``run_passes`` every pointwise, reduction and conversion the passes understood is a call
of one of these overloads, with positional arguments as in the aten schema. Anything else in the
graph (views, matmul, in-place ops, ops the passes do not know) is left as captured and runs in
eager torch.

Example::

    from framejit.passes.vocabulary import POINTWISE, REDUCTIONS
    fusible = [n for n in graph.nodes if n.target in POINTWISE or n.target in REDUCTIONS]
"""

from __future__ import annotations

import torch

aten = torch.ops.aten
prims = torch.ops.prims

#: Arithmetic on two operands. add/sub/mul/div.Tensor take a node or a Python number as the
#: second operand (the tensor always comes first); maximum/minimum and logical_and/or take two
#: tensors; pow.Tensor_Scalar a tensor and a number.
BINARY = frozenset(
    {
        aten.add.Tensor,
        aten.sub.Tensor,
        aten.mul.Tensor,
        aten.div.Tensor,
        aten.maximum.default,
        aten.minimum.default,
        aten.pow.Tensor_Scalar,
        aten.logical_and.default,
        aten.logical_or.default,
    }
)

#: ``.Tensor(a, b)`` for two tensors, ``.Scalar(a, number)`` for a tensor and a number.
COMPARISONS = frozenset(
    getattr(getattr(aten, name), overload)
    for name in ("eq", "ne", "lt", "le", "gt", "ge")
    for overload in ("Tensor", "Scalar")
)

UNARY = frozenset(
    getattr(aten, name).default
    for name in (
        "neg",
        "abs",
        "exp",
        "log",
        "log1p",
        "expm1",
        "sqrt",
        "rsqrt",
        "reciprocal",
        "sin",
        "cos",
        "tanh",
        "sigmoid",
        "erf",
        "gelu",
        "relu",
        "floor",
        "ceil",
        "sign",
        "logical_not",
        "isnan",
    )
)

#: ``where.self(cond, a, b)`` for two tensors; aten's where.self takes no Python numbers, so a
#: number operand uses ``where.ScalarOther(cond, a, number)``, ``where.ScalarSelf(cond, number,
#: b)`` or ``where.Scalar(cond, number, number)``.
WHERE = frozenset(
    {aten.where.self, aten.where.ScalarOther, aten.where.ScalarSelf, aten.where.Scalar}
)

#: ``clamp.default(x, min, max)`` (numbers or None), ``convert_element_type.default(x, dtype)``,
#: ``clone.default(x, memory_format=...)``.
OTHER_POINTWISE = frozenset(
    {aten.clamp.default, prims.convert_element_type.default, aten.clone.default}
)

#: ``rand_like.default(x, dtype=torch.float32)``: uniform in [0, 1), the only random primitive.
RANDOM = frozenset({aten.rand_like.default})

POINTWISE = BINARY | COMPARISONS | UNARY | WHERE | OTHER_POINTWISE | RANDOM

#: Always keepdim=True: ``sum.dim_IntList(x, dims, True)``, ``amax.default(x, dims, True)``,
#: ``amin.default(x, dims, True)`` with ``dims`` a sorted list of non-negative ints;
#: ``argmax.default(x, dim, True)``, ``argmin.default(x, dim, True)`` with one dim;
#: ``mean.dim(x, dims, True)`` only in graphs with symbolic sizes (elsewhere a mean is a sum
#: divided by the count).
REDUCTIONS = frozenset(
    {
        aten.sum.dim_IntList,
        aten.mean.dim,
        aten.amax.default,
        aten.amin.default,
        aten.argmax.default,
        aten.argmin.default,
    }
)

VOCABULARY = POINTWISE | REDUCTIONS

#: Not vocabulary, but emitted by the passes and left to eager torch: ``squeeze.dims`` after a
#: keepdim=False reduction, ``view.default`` to broadcast batch_norm's per-channel tensors,
#: ``t``/``matmul``/``mm`` from decomposed linear/addmm, ``copy_`` for batch_norm's running
#: statistics (impure, kept by DCE); ``unfold`` for max pooling's windows and ``unsqueeze`` for
#: the operands moved into them (``passes.windows``).
EMITTED_SUPPORT = frozenset(
    {
        aten.squeeze.dims,
        aten.unfold.default,
        aten.unsqueeze.default,
        aten.view.default,
        aten.t.default,
        aten.matmul.default,
        aten.mm.default,
        aten.copy_.default,
    }
)

__all__ = [
    "BINARY",
    "COMPARISONS",
    "EMITTED_SUPPORT",
    "OTHER_POINTWISE",
    "POINTWISE",
    "RANDOM",
    "REDUCTIONS",
    "UNARY",
    "VOCABULARY",
    "WHERE",
]
