"""Kernels with run-time sizes for the renderer tests, made from the static kernels the pipeline
builds: :func:`dynamic_launcher` compiles ``fn`` on example inputs, takes its one kernel and
makes chosen box dimensions run-time sizes (``ks0``, ``ks1``, ... named after the box dimension),
so the same launcher can then be called on inputs of other sizes.
"""

from __future__ import annotations

from dataclasses import replace

from framejit.kernels.ir import Kernel, Sym, evaluate, product

from .conftest import run_kernels


def symbolic_kernel(kernel: Kernel, dims) -> tuple[Kernel, dict[str, int]]:
    """``kernel`` with the sizes of box dimensions ``dims`` made run-time sizes ``ks<d>``; every
    buffer must be dense over the box (each non-zero stride the product of the sizes inside
    it). Returns the kernel and the values of its sizes for the example it was built for."""
    sizes = list(kernel.sizes)
    values = {}
    for d in dims:
        values[f"ks{d}"] = sizes[d]
        sizes[d] = Sym(f"ks{d}")
    buffers = []
    for b in kernel.buffers:
        strides = [int(s) for s in b.strides]
        order = sorted((d for d, s in enumerate(strides) if s != 0), key=lambda d: -strides[d])
        new = list(strides)
        inner: list = []
        for d in reversed(order):
            if strides[d] != evaluate(product(inner), values):
                raise ValueError(f"buffer {b.name} is not dense over the box: {b.strides}")
            new[d] = product(inner)
            inner.append(sizes[d])
        buffers.append(replace(b, strides=tuple(new)))
    return Kernel(kernel.name, tuple(sizes), kernel.reduce_dims, buffers, list(kernel.ops)), values


def dynamic_launcher(fn, args, dims, launcher_class, device="cpu"):
    """The launcher of ``fn``'s single kernel (built on ``args``) with box dimensions ``dims``
    made run-time sizes, built by ``launcher_class``; also returns the box sizes of ``args``.

    Call it as ``launcher(*inputs, *sizes)``: ``inputs`` in the kernel's input order (for the
    functions the tests use, the order of ``fn``'s tensor arguments), ``sizes`` the values of
    ``kernel.symbols()`` in order."""
    _, backend = run_kernels(fn, *args, reference=True)
    (static,) = backend.kernels
    kernel, values = symbolic_kernel(static.kernel, dims)
    outputs = []
    for buf, (size, _stride, dtype) in zip(kernel.outputs, static.outputs):
        # An output broadcasts into the box: its sizes are the box's trailing ones, or 1.
        lead = len(kernel.sizes) - len(size)
        shape = tuple(1 if n == 1 else kernel.sizes[lead + j] for j, n in enumerate(size))
        out_strides = tuple(buf.strides[lead:])
        outputs.append((shape, out_strides, dtype))
    return launcher_class(kernel, outputs, device, static.seed_index), static, values
