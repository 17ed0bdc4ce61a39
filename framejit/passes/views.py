"""``views_as_reinterprets(wrapper, exact)``: each chain of views in a compiled wrapper graph as
one ``reinterpret(root, sizes, strides, offset)`` of the tensor it views.

A wrapper reaches a kernel's or a matmul's input through views: GPT-2's attention takes
``addmm -> view -> split -> [i] -> view -> transpose`` for each of q, k and v, eight calls of
2-10 µs through torch's Python bindings. Where the root's layout at run time is the one its
example has, every view after it has its example's sizes, strides and offset too, and one call
of torch's C helper ``_reinterpret_tensor`` (the one Inductor's wrappers call for views, about
1 µs) makes it. A view whose example is laid out exactly as its root is the root itself.

Which roots are known (``exact``): graph inputs and parameters (the guards check their sizes
and strides), kernel outputs (allocated as predicted; the caller names them), and the results
of torch ops that always allocate a contiguous result (matmuls, ``linear``, ``contiguous``).

The helper's tensor is not a view for autograd (no ``_base``, a version counter of its own), so
the pass leaves alone any graph that computes with gradients (a view that autograd links to its
base counts) or writes to a tensor it did not compute (an in-place op on an input, ``out=``, a
module call, a kernel that updates a buffer), and any view the graph returns, with the views
it is made from. Graphs with symbolic sizes are not passed to it.
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from ..fx_ir import OFFSET_VIEW_NAMES, VIEW_NAMES, Graph, Node, is_inplace, name_of, target_name

_guards = getattr(torch._C._dynamo, "guards", None)
#: torch's C helper: ``(tensor, sizes, strides, offset_increment)`` -> a tensor of the same
#: storage. None on a torch without it (the pass then does nothing).
REINTERPRET = getattr(_guards, "_reinterpret_tensor", None)

#: Ops whose result is a view of their first argument, laid out by a rule of its layout alone;
#: a reshape counts where the example shows it views (each chain is recomputed and checked).
_VIEWS = OFFSET_VIEW_NAMES | {"reshape", "flatten", "_unsafe_view"}

#: Ops whose result is a fresh tensor, contiguous on every device: torch's matmul kernels
#: allocate their result with empty strides, and linear and contiguous end in one of them or
#: in a contiguous copy.
_CONTIGUOUS_RESULTS = frozenset({
    "addmm", "mm", "bmm", "baddbmm", "matmul", "linear", "contiguous",
})


def _base_name(node: Node) -> str:
    return name_of(node.target).split(".")[0]


def _safe(graph: Graph, fused: Graph | None) -> bool:
    """Whether no node of ``graph`` (or of the kernels' ``fused`` graph) writes to a tensor or
    computes with gradients (an op other than a view whose result requires grad)."""
    for g in (graph, fused):
        if g is None:
            continue
        for node in g.nodes:
            if node.op == "call_module":
                return False
            if node.op not in ("call_function", "call_method"):
                continue  # inputs and parameters may require grad: only computing records
            if is_inplace(node.op, node.target, node.kwargs) and not _writes_a_fresh_result(node):
                return False
            v = node.meta.get("val")
            values = [t for t in (v if isinstance(v, (tuple, list)) else (v,))
                      if isinstance(t, torch.Tensor)]
            if _base_name(node) in _VIEWS:
                # a view of a parameter requires grad under no_grad too: it records only where
                # autograd links it to its base (a grad_fn), as under grad mode
                if any(t.grad_fn is not None for t in values):
                    return False
            elif any(t.requires_grad for t in values):
                return False
    return True


def _writes_a_fresh_result(node: Node) -> bool:
    """Whether the in-place ``node`` writes only to a tensor the graph computed (and no view of
    an input or parameter): T5's ``buckets += ...`` on a result of its own. Nothing outside the
    graph sees such a tensor's version counter."""
    if "out" in node.kwargs or node.kwargs.get("inplace") is True or not node.args:
        return False
    target = node.args[0]
    while isinstance(target, Node):
        if target.op != "call_function" and target.op != "call_method":
            return False  # an input, a parameter, a module's buffer
        if target_name(target).split(".")[0] not in VIEW_NAMES:
            return True
        target = target.args[0] if target.args else None
    return True  # a number: `0 += t` makes a new tensor


def _view_base(node: Node) -> Node | None:
    """The tensor node ``node`` is a view of by an op of ``_VIEWS`` (whose other arguments are
    constants), or None."""
    if node.op not in ("call_function", "call_method") or not node.args:
        return None
    base = node.args[0]
    if not isinstance(base, Node) or _base_name(node) not in _VIEWS:
        return None
    if any(isinstance(a, Node) for a in (*node.args[1:], *node.kwargs.values())):
        return None
    if node.target is operator.getitem and not isinstance(base.meta.get("val"), torch.Tensor):
        # an item of a split's tuple: a view of what the split splits
        return base if type(node.args[1]) is int else None
    return base


def _contiguous_result(node: Node) -> bool:
    v = node.meta.get("val")
    return (node.op in ("call_function", "call_method") and _base_name(node) in _CONTIGUOUS_RESULTS
            and isinstance(v, torch.Tensor) and v.is_contiguous())


def views_as_reinterprets(graph: Graph, exact: set[Node], fused: Graph | None = None) -> bool:
    """Replace the views of ``graph`` whose root is laid out as its example (graph inputs,
    parameters, the nodes of ``exact``, contiguous results of matmuls) by one reinterpret of the
    root each, or by the root itself; returns whether the graph changed. ``fused``: the graph
    the kernels were lowered from, checked for writes as ``graph`` is."""
    if REINTERPRET is None or not _safe(graph, fused):
        return False
    root_of: dict[Node, Node] = {}
    # Each view's value computed again from its root's example (a node's own example may come
    # from before a pass replaced its root, and then is a view of nothing here).
    derived: dict[Node, Any] = {}
    for node in graph.nodes:
        base = _view_base(node)
        if base is None:
            continue
        root = root_of.get(base, base)
        if root is base:
            if not (root.op in ("placeholder", "get_attr") or root in exact
                    or _contiguous_result(root)):
                continue
            if not isinstance(root.meta.get("val"), torch.Tensor):
                continue
            derived[root] = root.meta["val"]
        elif base not in derived:
            continue
        value = _rerun(node, derived[base])
        if value is None or not _matches(value, node.meta.get("val"), derived[root]):
            continue
        derived[node] = value
        root_of[node] = root
    # A split's tuple (its items are replaced) stays as it is, and so do a view the graph
    # returns and the views it is a view of: the caller's tensor is a view of its base for
    # autograd (``_base``, one version counter), as in eager.
    returned: set[Node] = set()
    for node in root_of:
        if any(u.op == "output" for u in node.users):
            while node in root_of and node not in returned:
                returned.add(node)
                node = _view_base(node)
    replaced = [node for node in root_of
                if isinstance(derived[node], torch.Tensor) and node not in returned]
    for node in replaced:
        root = root_of[node]
        v, r = derived[node], derived[root]
        if (v.shape, v.stride(), v.storage_offset()) == (r.shape, r.stride(), r.storage_offset()):
            node.replace_all_uses_with(root)
            continue
        with graph.inserting_before(node):
            new = graph.call_function(
                REINTERPRET, (root, tuple(v.shape), tuple(v.stride()),
                              v.storage_offset() - r.storage_offset()), name=node.name)
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        root_of[new] = root  # erased below if only replaced views read it
    # The views nothing reads any more, users first.
    for node in reversed(list(graph.nodes)):
        if node in root_of and not node.users:
            graph.erase_node(node)
    return bool(replaced)


def _rerun(node: Node, base: Any) -> Any:
    """``node``'s op on ``base`` (a meta value) and its constant arguments; None if it fails."""
    args = (base, *node.args[1:])
    try:
        with torch.no_grad():
            if node.op == "call_method":
                return getattr(base, node.target)(*args[1:], **node.kwargs)
            return node.target(*args, **node.kwargs)
    except Exception:  # noqa: BLE001 - a view torch refuses here stays as it was
        return None


def _matches(value: Any, example: Any, root: torch.Tensor) -> bool:
    """Whether ``value`` (a view recomputed from the root) is a view of ``root`` with the
    shapes and dtypes of the node's ``example``."""
    values = value if isinstance(value, (tuple, list)) else (value,)
    examples = example if isinstance(example, (tuple, list)) else (example,)
    return len(values) == len(examples) and all(
        isinstance(v, torch.Tensor) and isinstance(e, torch.Tensor) and v.shape == e.shape
        and v.dtype == e.dtype == root.dtype and torch._C._is_alias_of(v, root)
        for v, e in zip(values, examples))
