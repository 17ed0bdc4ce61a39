"""Fusion groups: which graph nodes run together as one kernel.

:func:`partition` walks the graph in order and merges each fusible node into the group of a
producer when the two agree on the iteration space:

* pointwise nodes form a chain over the biggest shape ``F`` among them; a smaller node whose
  shape broadcasts to ``F`` (a bias, a per-row scale) is recomputed per point of ``F``;
* a reduction over dims ``R`` of an ``F``-shaped value joins its pointwise prologue, and later
  pointwise nodes whose shape broadcasts to ``F`` (a broadcast epilogue, as in
  ``x - x.mean(-1, keepdim=True)``, or ops on the reduced values) join it too; a second reduction over the same ``R`` (variance after
  the mean) joins as well;

* a concatenation (kind ``"concat"``) is pointwise over its output's shape; a pointwise
  group producing its inputs joins it when nothing else uses that group's values and the
  group's shape broadcasts to each input it feeds (its nodes are then computed over the input's
  part of the box: ``-x[..., d:]`` inside a rotary embedding's ``cat``). A group with a
  concatenation never joins a reduction;

then groups that read the same value, or views of it that no group computes (attention's q, k
and v split from one projection), merge (horizontal fusion: one load, or one launch, for
both), and never
when merging would create a cycle through a node outside both groups (networkx
answers reachability over the graph's DAG). Nodes with side effects (in-place ops, random
calls that stay in torch, ...) are barriers: a group never spans one, so moving a group's
launch to its last node never reorders anything observable.

What can be fused is not decided here: the caller passes ``classify(node)``, which returns
``"pointwise"``, ``"reduction"`` or None, and ``reduce_dims(node)`` for reductions (the kernel
layer knows both; passes do not import it).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import networkx as nx

from ..fx_ir import VIEW_NAMES, Graph, Node, target_name


@dataclass
class FusionGroup:
    """Nodes (in graph order) computed by one kernel over the box ``sizes``."""

    nodes: list[Node]
    sizes: tuple[int, ...]
    reduce_dims: tuple[int, ...] = ()
    epoch: int = 0
    members: set = field(default_factory=set)
    #: Whether a concatenation is among the nodes (its inputs' producers are not box-shaped).
    concat: bool = False

    @property
    def outer_shape(self) -> tuple[int, ...]:
        return tuple(1 if d in self.reduce_dims else s for d, s in enumerate(self.sizes))

    def accepts_shape(self, shape: tuple[int, ...]) -> bool:
        return broadcasts_to(shape, self.sizes)


def broadcasts_to(shape: tuple[int, ...], sizes: tuple[int, ...]) -> bool:
    """Whether a value of ``shape`` broadcasts to ``sizes`` (torch's rules, right-aligned):
    such a value is computed per point of the bigger box (recomputed where it repeats)."""
    if len(shape) > len(sizes):
        return False
    off = len(sizes) - len(shape)
    return all(s == 1 or s == sizes[off + i] for i, s in enumerate(shape))


def _shape(node: Node) -> tuple[int, ...]:
    return tuple(node.meta["val"].shape)


def graph_dag(graph: Graph) -> nx.DiGraph:
    """The def-use DAG of ``graph`` (an edge from each input node to its user)."""
    dag = nx.DiGraph()
    for node in graph.nodes:
        dag.add_node(node)
        for inp in node.all_input_nodes:
            dag.add_edge(inp, node)
    return dag


def _is_barrier(node: Node, kind: str | None) -> bool:
    if kind is not None or node.op not in ("call_function", "call_method", "call_module"):
        return False
    if node.is_impure():
        return True
    schema = getattr(node.target, "_schema", None)
    return bool(schema is not None and schema.is_mutable)


def partition(graph: Graph, classify: Callable[[Node], str | None],
              reduce_dims: Callable[[Node], tuple[int, ...] | None]) -> list[FusionGroup]:
    """The fusion groups of ``graph`` (each with at least one node), in graph order of their
    last node."""
    dag = graph_dag(graph)
    nodes = list(graph.nodes)
    order = {node: i for i, node in enumerate(nodes)}
    group_of: dict[Node, FusionGroup] = {}
    epoch = 0
    for node in graph.nodes:
        kind = classify(node)
        if _is_barrier(node, kind):
            epoch += 1
            continue
        if kind is None:
            continue
        shape = _shape(node)
        if kind == "reduction":
            dims = reduce_dims(node)
            box = _shape(node.all_input_nodes[0])
            group = FusionGroup([node], box, tuple(dims), epoch, {node})
        else:
            group = FusionGroup([node], shape, (), epoch, {node}, concat=kind == "concat")
        group_of[node] = group
        producers = []
        for inp in node.all_input_nodes:
            g = group_of.get(inp)
            if g is not None and g is not group and g not in producers:
                producers.append(g)
        # Try the largest producer group first: it has the most to share.
        for other in sorted(producers, key=lambda g: -len(g.nodes)):
            if kind == "concat":
                merged = _merge_into_concat(other, group, node, dag, order, nodes)
            else:
                merged = _merge(other, group, dag, order, nodes)
            if merged is not None:
                for member in merged.nodes:
                    group_of[member] = merged
                group = merged
    # Horizontal fusion: groups reading the same value (siblings) share its loads, and groups
    # reading views of it (attention's q, k and v, split from one projection and transposed,
    # each copied for its matmul) share a launch.
    for node in graph.nodes:
        readers: list[FusionGroup] = []
        for g in _readers(node, group_of):
            if g not in readers and node not in g.members:
                readers.append(g)
        while len(readers) > 1:
            first = readers.pop(0)
            for other in list(readers):
                merged = _merge(first, other, dag, order, nodes)
                if merged is not None:
                    readers.remove(other)
                    for member in merged.nodes:
                        group_of[member] = merged
                    first = merged
    groups = {id(g): g for g in group_of.values()}.values()
    return sorted(groups, key=lambda g: order[g.nodes[-1]])


def _readers(node: Node, group_of: dict) -> list[FusionGroup]:
    """The groups that read ``node``, directly or through views of it that no group computes
    (in the order met)."""
    found: list[FusionGroup] = []
    pending = list(node.users)
    seen = set()
    while pending:
        user = pending.pop(0)
        if user in seen:
            continue
        seen.add(user)
        g = group_of.get(user)
        if g is not None:
            found.append(g)
        elif user.op in ("call_function", "call_method") \
                and target_name(user).split(".")[0] in VIEW_NAMES \
                and user.args and (user.args[0] is node or user.args[0] in seen):
            pending.extend(user.users)
    return found


def _merge(a: FusionGroup, b: FusionGroup, dag: nx.DiGraph, order,
           nodes: list | None = None) -> FusionGroup | None:
    if a.epoch != b.epoch:
        return None
    if (a.reduce_dims or b.reduce_dims) and (a.concat or b.concat):
        return None
    if a.reduce_dims and b.reduce_dims:
        if a.sizes != b.sizes or a.reduce_dims != b.reduce_dims:
            return None
        sizes, dims = a.sizes, a.reduce_dims
    elif a.reduce_dims or b.reduce_dims:
        red, pw = (a, b) if a.reduce_dims else (b, a)
        if not all(red.accepts_shape(_shape(n)) for n in pw.nodes):
            return None
        sizes, dims = red.sizes, red.reduce_dims
    elif broadcasts_to(a.sizes, b.sizes):
        if _costly_to_recompute(a, b):
            return None
        sizes, dims = b.sizes, ()
    elif broadcasts_to(b.sizes, a.sizes):
        if _costly_to_recompute(b, a):
            return None
        sizes, dims = a.sizes, ()
    else:
        return None
    members = a.members | b.members
    if _creates_cycle(members, dag, order, nodes):
        return None
    nodes = sorted(members, key=order.__getitem__)
    return FusionGroup(nodes, sizes, dims, a.epoch, members, concat=a.concat or b.concat)


def _merge_into_concat(producer: FusionGroup, group: FusionGroup, cat: Node, dag: nx.DiGraph,
                       order, nodes: list | None = None) -> FusionGroup | None:
    """``group`` (holding the concatenation ``cat``) with ``producer``, a pointwise group
    computing some of ``cat``'s inputs and used by nothing else, or None."""
    if producer.epoch != group.epoch or producer.reduce_dims:
        return None
    for n in producer.nodes:
        if any(u not in producer.members and u is not cat for u in n.users):
            return None
    fed = [a for a in cat.args[0] if isinstance(a, Node) and a in producer.members]
    if not fed or not all(broadcasts_to(producer.sizes, _shape(a)) for a in fed):
        return None
    members = producer.members | group.members
    if _creates_cycle(members, dag, order, nodes):
        return None
    merged = sorted(members, key=order.__getitem__)
    return FusionGroup(merged, group.sizes, (), group.epoch, members,
                       concat=True)


#: Ops that cost far more than a load to recompute at every point of a bigger box.
_COSTLY = frozenset({"rsqrt", "sqrt", "div", "reciprocal", "exp", "exp2", "expm1", "log", "log1p",
                     "log2", "tanh", "erf", "gelu", "sigmoid", "pow", "sin", "cos"})


def _costly_to_recompute(small: FusionGroup, big: FusionGroup) -> bool:
    """Whether ``small`` (broadcast to ``big``'s box) computes something expensive on far fewer
    points, such as batch norm's per-channel ``rsqrt(var + eps)``: merged, it would run once per
    point of ``big`` (per element of the activation) instead of once per channel; apart, it is a
    tiny kernel whose result ``big`` loads."""
    if math.prod(big.sizes) < 64 * max(1, math.prod(small.sizes)):
        return False
    return any(getattr(n.target, "__name__", "").split(".")[0] in _COSTLY for n in small.nodes)


def _creates_cycle(members: set, dag: nx.DiGraph, order, nodes: list | None = None) -> bool:
    """Whether a path leaves ``members`` and comes back (so one kernel could not compute them
    all before their users). Only nodes between the group's first and last node can be on
    such a path. ``nodes``: the graph's nodes in order (``order`` is their index), which
    spares a walk over the whole graph per merge."""
    lo = min(order[n] for n in members)
    hi = max(order[n] for n in members)
    if nodes is not None:
        window = [n for n in nodes[lo + 1:hi] if n not in members]
    else:
        window = [n for n in dag.nodes if lo < order[n] < hi and n not in members]
    if not window:
        return False
    sub = dag.subgraph([*window, *members])
    outside_reached = set()
    for n in members:
        for succ in sub.successors(n):
            if succ not in members:
                outside_reached.add(succ)
    if not outside_reached:
        return False
    reach = set()
    for n in outside_reached:
        reach |= nx.descendants(sub, n) | {n}
    return bool(reach & members)


def check_acyclic(graph: Graph, groups: list[FusionGroup]) -> None:
    """Raise AssertionError if contracting each group to one node leaves a cycle (for tests
    and ``lint``)."""
    dag = graph_dag(graph)
    unit = {}
    for i, g in enumerate(groups):
        for n in g.nodes:
            unit[n] = ("group", i)
    quotient = nx.DiGraph()
    for u, v in dag.edges:
        a, b = unit.get(u, u), unit.get(v, v)
        if a != b:
            quotient.add_edge(a, b)
    assert nx.is_directed_acyclic_graph(quotient), "fusion groups form a cycle"
