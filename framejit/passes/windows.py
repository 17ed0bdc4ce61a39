"""``pointwise_into_windows(graph)``: a reduction over windows (max pooling, decomposed into
``unfold`` views and ``amax``) computes the pointwise ops before the windowing itself.

A CNN's ``max_pool2d(relu(batch_norm(conv)))`` is ``amax(unfold(unfold(relu(...))))``: the
pointwise ops write a full-size tensor that the pooling kernel reads back, because a kernel
cannot read a value it computes through a view. Windows are views, so they commute with
pointwise ops: ``unfold(f(a, b)) == f(unfold(a), unfold(b))``, where an operand broadcast along
the windowed dimension gains a trailing size-1 dimension instead. After the rewrite the
pointwise ops read windows of the convolution's result and the reduction fuses them as its
prologue: one kernel reads the convolution's result and writes the pooled one.

Only where nothing is computed twice or lost: each pointwise node moved has the windows as its
only use, the windows do not overlap (step >= size), and the windows are only reduced (a
reduction does not see its input's layout).
"""

from __future__ import annotations

from typing import Any

import torch

from ..fx_ir import Graph, Node
from .symbolic import SYMBOLIC
from .util import emit
from .vocabulary import BINARY, COMPARISONS, REDUCTIONS, UNARY, WHERE

aten = torch.ops.aten
prims = torch.ops.prims

#: Pointwise ops whose meaning does not depend on their operands' shapes or layout.
_ELEMENTWISE = BINARY | COMPARISONS | UNARY | WHERE | {aten.clamp.default,
                                                       prims.convert_element_type.default}


def pointwise_into_windows(graph: Graph) -> bool:
    """Move single-use pointwise ops below the ``unfold`` views a reduction reads; returns
    whether the graph changed."""
    if SYMBOLIC.get():
        return False
    changed, erased = False, set()
    for node in list(graph.nodes):
        if node in erased or not _is_unfold(node) or _is_unfold(node.args[0]):
            continue
        chain = _window_chain(node)
        if chain is None:
            continue
        created: list[Node] = []
        try:
            new = _sink(graph, node.args[0], [(n.args[1], n.args[2], n.args[3]) for n in chain],
                        created)
        except (RuntimeError, TypeError, ValueError, IndexError):
            for c in reversed(created):
                graph.erase_node(c)
            continue
        last = chain[-1]
        if new is None or new.meta["val"].shape != last.meta["val"].shape \
                or new.meta["val"].dtype != last.meta["val"].dtype:
            for c in reversed(created):
                graph.erase_node(c)
            continue
        last.replace_all_uses_with(new)
        for n in reversed(chain):  # the pointwise nodes moved are now unused: dce erases them
            graph.erase_node(n)
            erased.add(n)
        changed = True
    return changed


def _is_unfold(node: Any) -> bool:
    return isinstance(node, Node) and node.op == "call_function" \
        and node.target is aten.unfold.default and len(node.args) == 4 and not node.kwargs


def _window_chain(first: Node) -> list[Node] | None:
    """``first`` and the unfolds stacked on it, when each feeds only the next, the last is
    only reduced, the windows do not overlap, and ``first`` reads a single-use pointwise op."""
    chain = [first]
    while len(chain[-1].users) == 1 and _is_unfold(next(iter(chain[-1].users))):
        chain.append(next(iter(chain[-1].users)))
    if any(len(n.users) != 1 for n in chain[:-1]) or not chain[-1].users:
        return None
    if not all(u.op == "call_function" and u.target in REDUCTIONS and u.args[0] is chain[-1]
               for u in chain[-1].users):
        return None
    for n in chain:
        size, step = n.args[2], n.args[3]
        if type(size) is not int or type(step) is not int or step < size or size < 1:
            return None
    source = first.args[0]
    if not _movable(source, first):
        return None
    return chain


def _movable(node: Any, user: Node) -> bool:
    return (isinstance(node, Node) and node.op == "call_function" and node.target in _ELEMENTWISE
            and set(node.users) == {user} and isinstance(node.meta.get("val"), torch.Tensor)
            and not node.meta["val"].requires_grad)


def _sink(graph: Graph, node: Node, windows: list, created: list) -> Node:
    """``node``'s op recomputed on its operands' windows (its own windows), built just before
    ``node``."""
    shape = tuple(node.meta["val"].shape)
    args = []
    for a in node.args:
        if isinstance(a, Node) and isinstance(a.meta.get("val"), torch.Tensor):
            if _movable(a, node) and tuple(a.meta["val"].shape) == shape:
                args.append(_sink(graph, a, windows, created))
            else:
                args.append(_windowed(graph, a, shape, windows, node, created))
        elif isinstance(a, Node):
            raise ValueError(f"{a.name} is not a tensor")
        else:
            args.append(a)
    return _emit(graph, node.target, tuple(args), dict(node.kwargs), node, created)


def _windowed(graph: Graph, x: Node, shape: tuple, windows: list, at: Node,
              created: list) -> Node:
    """The operand ``x`` (broadcast to ``shape``) under the same windows: unfolded along a
    dimension it spans, a trailing size-1 dimension where it broadcasts."""
    rank = len(shape)
    for dim, size, step in windows:
        cur = x.meta["val"]
        d = dim - (rank - cur.dim())
        if d < 0 or cur.shape[d] == 1:
            x = _emit(graph, aten.unsqueeze.default, (x, -1), {}, at, created)
        elif cur.shape[d] == shape[dim]:
            x = _emit(graph, aten.unfold.default, (x, d, size, step), {}, at, created)
        else:
            raise ValueError(f"{x.name} does not broadcast to {shape}")
        shape = (*shape[:dim], (shape[dim] - size) // step + 1, *shape[dim + 1:], size)
        rank += 1
    return x


def _emit(graph: Graph, target, args, kwargs, at: Node, created: list) -> Node:
    with graph.inserting_before(at):
        new = emit(graph, target, args, kwargs, like=at)
    created.append(new)
    return new
