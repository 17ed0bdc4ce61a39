"""Simplifications of a kernel description that keep its meaning.

:func:`coalesce` drops size-1 dimensions and merges neighbouring dimensions that every buffer
walks contiguously (``stride[d] == stride[d+1] * size[d+1]``, broadcast dimensions included), so
a kernel over contiguous tensors indexes with one flat index instead of a div/mod per dimension.
A kernel's outer dimensions are first put in its output's memory order.

A dimension that a :class:`~framejit.kernels.ir.Span` (a concatenation) cuts merges with the
dimensions inside it (the span scales by their size: a cat along dim 1 of contiguous
``[2, 3, 5]`` and ``[2, 4, 5]`` is the span ``15:35`` of a ``[2, 35]`` box), never into the one
outside it (a range of ``i1`` is not a range of ``i0 * size1 + i1``).
"""

from __future__ import annotations

from dataclasses import replace

from .ir import Expr, Kernel, Op, Span, evaluate, product


def _magnitude(e: Expr) -> int:
    """A stride's size for ordering dimensions: run-time sizes count as large."""
    return e if isinstance(e, int) else evaluate(e, {a: 1 << 16 for a in e.atoms})


def coalesce(kernel: Kernel) -> Kernel:
    """Run-time sizes (:class:`Sym`) merge as products: ``stride[d] == stride[d+1] * size[d+1]``
    is checked on the expressions, which holds for every size or not at all."""
    sizes = list(kernel.sizes)
    is_reduce = [d in kernel.reduce_dims for d in range(len(sizes))]
    strides = {b.name: list(b.strides) for b in kernel.buffers}
    # Drop size-1 dimensions (any stride), keeping at least one dimension of each kind used.
    keep = [d for d in range(len(sizes)) if sizes[d] != 1]
    for kind in (False, True):
        if any(is_reduce[d] == kind for d in range(len(sizes))) and not any(is_reduce[d] == kind for d in keep):
            keep.append(next(d for d in range(len(sizes)) if is_reduce[d] == kind))
    keep.sort()
    # Each cut dimension's place now and the factor its spans scale by.
    cut = {d: [keep.index(d), 1] for d in kernel.span_dims}
    sizes = [sizes[d] for d in keep]
    is_reduce = [is_reduce[d] for d in keep]
    strides = {n: [st[d] for d in keep] for n, st in strides.items()}
    if not any(op.kind == "rand" for op in kernel.ops):
        # A kernel walks its outer box in the first output's memory order (a channels-last
        # output: channels innermost), so its stores, and loads laid out alike, are contiguous;
        # reduced dimensions keep their places. (Not with a random draw: its stream is numbered
        # by the box's order.)
        out = next((b for b in kernel.buffers if b.is_output), None)
        if out is not None:
            outer = [i for i in range(len(sizes)) if not is_reduce[i]]
            ranked = iter(sorted(outer, key=lambda i: -abs(_magnitude(strides[out.name][i]))))
            order = [i if is_reduce[i] else next(ranked) for i in range(len(sizes))]
            if order != list(range(len(sizes))):
                for place in cut.values():
                    place[0] = order.index(place[0])
                sizes = [sizes[i] for i in order]
                strides = {n: [st[i] for i in order] for n, st in strides.items()}
    d = len(sizes) - 2
    while d >= 0:
        inner_cut = any(place[0] == d + 1 for place in cut.values())
        if not inner_cut and is_reduce[d] == is_reduce[d + 1] and all(
                st[d] == product([st[d + 1], sizes[d + 1]]) for st in strides.values()):
            for place in cut.values():
                if place[0] == d:
                    place[1] = product([place[1], sizes[d + 1]])
                elif place[0] > d + 1:
                    place[0] -= 1
            sizes[d] = product([sizes[d], sizes[d + 1]])
            del sizes[d + 1], is_reduce[d + 1]
            for st in strides.values():
                del st[d]
        d -= 1
    buffers = [replace(b, strides=tuple(strides[b.name])) for b in kernel.buffers]
    reduce_dims = tuple(i for i, r in enumerate(is_reduce) if r)
    ops = [_move_spans(op, cut) for op in kernel.ops] if cut else list(kernel.ops)
    return Kernel(kernel.name, tuple(sizes), reduce_dims, buffers, ops)


def _move_spans(op: Op, cut: dict) -> Op:
    """``op`` with its spans on the coalesced box (``cut``: old dimension -> [new dimension,
    scale])."""
    if not any(isinstance(a, Span) for a in op.args):
        return op

    def move(a):
        if not isinstance(a, Span):
            return a
        dim, scale = cut[a.dim]
        return Span(dim, product([a.start, scale]), product([a.stop, scale]))

    return replace(op, args=tuple(move(a) for a in op.args))
