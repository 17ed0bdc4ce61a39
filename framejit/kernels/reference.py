"""A tiny interpreter of the kernel description in torch: the oracle renderers are tested
against.

``run_reference(kernel, inputs)`` takes one tensor per input buffer (the seed buffer of random
kernels is a 0-d int64 tensor) and returns the output tensors, allocated with ``empty_like``
semantics from ``outputs_like`` (tensors giving each output's shape, strides and dtype).
FULL values are tensors of the box's shape, OUTER values keep size 1 along the reduced
dimensions, so torch's broadcasting lines them up exactly as the kernel's levels do.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .ir import FULL, Kernel, concat_parts, evaluate, spans_of
from .launch import KernelLauncher, layout_fits
from .lowering import reduced_shape


def _gelu(x: torch.Tensor) -> torch.Tensor:
    """Exact GELU, +inf at +inf (the renderers' value, and torch's for fp16 and for one fp32
    value): torch's vectorized fp32 kernel gives NaN there, as eager does for fp32 and bf16
    tensors of two values or more."""
    return torch.where(x == float("inf"), x, torch.nn.functional.gelu(x))


_UNARY = {
    "neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "log": torch.log, "log1p": torch.log1p,
    "expm1": torch.expm1, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt,
    "reciprocal": torch.reciprocal, "sin": torch.sin, "cos": torch.cos, "tanh": torch.tanh,
    "sigmoid": torch.sigmoid, "erf": torch.erf, "gelu": _gelu,
    "relu": torch.relu, "sign": torch.sign,
    "not": torch.logical_not, "isnan": torch.isnan,
}
_BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "truediv": torch.div,
    "maximum": torch.maximum, "minimum": torch.minimum, "eq": torch.eq, "ne": torch.ne,
    "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge, "and": torch.logical_and,
    "or": torch.logical_or,
}


def run_reference(kernel: Kernel, inputs: Sequence[torch.Tensor],
                  outputs_like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    sizes = tuple(int(s) for s in kernel.sizes)
    outer = reduced_shape(sizes, kernel.reduce_dims)
    tensors = {b.name: t for b, t in zip(kernel.inputs, inputs)}
    outs = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
            for t in outputs_like]
    tensors.update({b.name: t for b, t in zip(kernel.outputs, outs)})
    values: list[torch.Tensor] = []

    def view(name: str, level: str, spans=()) -> torch.Tensor:
        buf = kernel.buffer(name)
        shape = list(sizes if level == FULL else outer)
        for s in spans:
            shape[s.dim] = int(s.stop) - int(s.start)
        strides = tuple(int(s) for s in buf.strides)
        return torch.as_strided(tensors[name], shape, strides)

    def spanned_load(op) -> torch.Tensor:
        """A load valid in its spans: the buffer's values there, zero elsewhere (what is
        computed from the zeros is discarded by the concat)."""
        part = view(op.args[0], op.level, spans_of(op)).to(op.dtype)
        shape = list(sizes if op.level == FULL else outer)
        full = torch.zeros(shape, dtype=op.dtype, device=part.device)
        region = full
        for s in spans_of(op):
            region = region.narrow(s.dim, int(s.start), int(s.stop) - int(s.start))
        region.copy_(part)
        return full

    for op in kernel.ops:
        kind, args = op.kind, op.args
        if kind == "load":
            v = spanned_load(op) if spans_of(op) else view(args[0], op.level).to(op.dtype)
        elif kind == "concat":
            v = None
            for span, operand in reversed(concat_parts(op)):
                shape = [1] * len(sizes)
                shape[span.dim] = sizes[span.dim]
                x = values[operand].to(op.dtype)
                index = torch.arange(sizes[span.dim], device=x.device).reshape(shape)
                v = x if v is None else torch.where(index < int(span.stop), x, v)
        elif kind == "const":
            v = torch.tensor(args[0], dtype=op.dtype, device="cpu")
        elif kind == "rand":
            # A stream of its own per rand op (torch's CPU generator keeps a seed's low 32 bits).
            # Drawn on the CPU and moved to where the kernel's outputs live.
            g = torch.Generator().manual_seed((int(tensors[args[0]]) * 1000003 + args[1]) % 2**32)
            v = torch.rand(sizes, generator=g, dtype=torch.float32).to(outs[0].device)
        elif kind == "cast":
            v = values[args[0]].to(op.dtype)
        elif kind == "round":
            v = values[args[0]].to(args[1]).to(op.dtype)
        elif kind == "where":
            v = torch.where(values[args[0]], values[args[1]], values[args[2]]).to(op.dtype)
        elif kind in _UNARY:
            v = _UNARY[kind](values[args[0]])
        elif kind in ("floor", "ceil"):
            x = values[args[0]]
            v = getattr(torch, kind)(x) if x.dtype.is_floating_point else x
        elif kind in _BINARY:
            v = _BINARY[kind](values[args[0]], values[args[1]])
        elif kind == "reduce":
            v = _reduce(args[0], values[args[1]], kernel.reduce_dims, sizes)
        elif kind == "store":
            # A broadcast output (stride 0) is written once per element, not once per point.
            target = view(args[0], op.level)
            value = values[args[1]].expand(target.shape)
            strides = [int(s) for s in kernel.buffer(args[0]).strides]
            for d, st in enumerate(strides):
                if st == 0 and target.shape[d] > 1:
                    target = target.narrow(d, 0, 1)
                    value = value.narrow(d, 0, 1)
            target.copy_(value)
            values.append(values[args[1]])
            continue
        else:
            raise NotImplementedError(f"reference: no rule for op {kind!r}")
        values.append(v.to(op.dtype) if v.dtype != op.dtype else v)
    return outs


def _reduce(kind: str, x: torch.Tensor, dims: tuple[int, ...], sizes) -> torch.Tensor:
    x = x.expand(sizes)
    if kind == "sum":
        return torch.sum(x, dims, keepdim=True)
    if kind == "max":
        return torch.amax(x, dims, keepdim=True)
    if kind == "min":
        return torch.amin(x, dims, keepdim=True)
    (dim,) = dims
    if kind == "argmax":
        return torch.argmax(x, dim, keepdim=True)
    return torch.argmin(x, dim, keepdim=True)


class ReferenceLauncher(KernelLauncher):
    """Runs a kernel with :func:`run_reference` instead of a renderer's code; same calling
    convention as the Triton launcher (``launcher(*inputs, *sizes) -> output(s)``)."""

    language = "reference"

    def __init__(self, kernel: Kernel, outputs: list[tuple], device: torch.device,
                 seed_index: int | None) -> None:
        self.kernel = kernel
        self.outputs = outputs
        self.device = device
        self.seed_index = seed_index
        self.source = str(kernel)

    def __call__(self, *inputs):
        tensors, values = self.bind_sizes(inputs)
        at = lambda sizes: tuple(evaluate(e, values) for e in sizes)  # noqa: E731
        for i, (size, stride) in self.checked_inputs.items():
            if not layout_fits(tensors[i], at(size), at(stride)):
                return self._layout_miss(*inputs)
        args = list(tensors)
        if self.seed_index is not None:
            args.insert(self.seed_index, torch.randint(2**31 - 1, (), dtype=torch.int64))
        like = [torch.empty_strided(at(size), at(stride), dtype=dtype, device=self.device)
                for size, stride, dtype in self.outputs]
        outs = run_reference(self.kernel.specialize(values), args, like)
        return outs[0] if len(outs) == 1 else tuple(outs)
