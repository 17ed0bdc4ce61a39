"""Cleanup passes: dead code elimination, common subexpression elimination, constant folding.

All three respect side effects: impure nodes (in-place ops, ``copy_``, ``out=``, random ops)
are never removed, merged or folded, and no pure node is merged or folded when that could let a
mutation or a returned tensor be seen through a shared result. Aliasing is read from the meta
values: tensors that share a storage there share memory at run time.

Example::

    dce(graph); cse(graph); fold_constants(graph, gm.root)
"""

from __future__ import annotations

import math
import operator
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from ..fx_ir import Graph, Node, map_aggregate, target_name, to_meta
from ..fx_ir.meta import resolve_qualname
from ..fx_ir.node import _RANDOM_FUNCTIONS, _is_inplace_name

#: Folding stops at results larger than this (they would be stored in the constants).
MAX_FOLDED_NUMEL = 1 << 20

_RANDOM_METHODS = frozenset(
    {
        "bernoulli",
        "multinomial",
        "random_",
        "uniform_",
        "normal_",
        "exponential_",
        "geometric_",
        "cauchy_",
        "log_normal_",
        "bernoulli_",
    }
)


def dce(graph: Graph) -> bool:
    """Erase unused nodes without side effects (``graph.eliminate_dead_code``)."""
    return graph.eliminate_dead_code()


# --------------------------------------------------------------------------------------------
# facts


_SEEDED_OPS: dict = {}


def is_random(node: Node) -> bool:
    """Whether the node draws from a random generator."""
    target = node.target
    if node.op == "call_method":
        return target in _RANDOM_METHODS
    if node.op != "call_function":
        return False
    if isinstance(target, torch._ops.OpOverload):
        seeded = _SEEDED_OPS.get(target)
        if seeded is None:  # an operator's tags are fixed when it is registered
            seeded = _SEEDED_OPS[target] = torch.Tag.nondeterministic_seeded in target.tags
        return seeded
    try:
        return target in _RANDOM_FUNCTIONS
    except TypeError:
        return False


def _mutates(node: Node) -> bool:
    """Whether the node may write to tensors (impure and not merely a functional random op)."""
    if node.op in ("placeholder", "output", "get_attr") or not node.is_impure():
        return False
    if node.op == "call_module":
        return True
    if is_random(node):
        name = target_name(node)
        if isinstance(node.target, torch._ops.OpOverload):
            return node.target._schema.is_mutable
        return bool(node.kwargs.get("inplace")) or name.endswith("_")
    return True


def _storages(value: Any) -> set[StorageWeakRef]:
    """The storages of every tensor in a (nested) meta value."""
    found: set[StorageWeakRef] = set()

    def add(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.layout is torch.strided:
            found.add(StorageWeakRef(x.untyped_storage()))
        return x

    map_aggregate(value, add)
    return found


#: Results that never share memory with an operand (torch-level functions and methods as
#: captured; aten overloads say so in their schema). Anything not listed may be a view.
_FRESH_FUNCTIONS = frozenset({
    operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv,
    operator.mod, operator.pow, operator.matmul, operator.neg, operator.pos, operator.abs,
    operator.invert, operator.and_, operator.or_, operator.xor, operator.lt, operator.le,
    operator.gt, operator.ge, operator.eq, operator.ne,
    torch.add, torch.sub, torch.mul, torch.div, torch.exp, torch.log, torch.sqrt, torch.rsqrt,
    torch.tanh, torch.sigmoid, torch.relu, torch.abs, torch.neg, torch.sin, torch.cos,
    torch.matmul, torch.bmm, torch.mm, torch.sum, torch.mean, torch.softmax, torch.where,
    torch.maximum, torch.minimum, torch.clamp, torch.erf, torch.pow, torch.cat, torch.stack,
    torch.nn.functional.relu, torch.nn.functional.gelu, torch.nn.functional.silu,
    torch.nn.functional.softmax, torch.nn.functional.log_softmax, torch.nn.functional.layer_norm,
    torch.nn.functional.linear, torch.nn.functional.sigmoid, torch.nn.functional.tanh,
})
_FRESH_METHODS = frozenset({
    "add", "sub", "mul", "div", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "abs",
    "neg", "sin", "cos", "pow", "sum", "mean", "amax", "amin", "softmax", "log_softmax",
    "matmul", "clone", "__add__", "__sub__", "__mul__", "__truediv__", "__neg__",
})


def may_alias_operand(node: Node) -> bool:
    """Whether the node's result may share memory with one of its tensor operands (a view,
    ``detach``, ``.to`` of the same dtype, ...). Conservative: unknown calls may."""
    target = node.target
    if node.op == "call_method":
        return target not in _FRESH_METHODS
    if node.op != "call_function":
        return node.op == "call_module"
    if isinstance(target, torch._ops.OpOverload):
        return any(r.alias_info is not None for r in target._schema.returns)
    try:
        return target not in _FRESH_FUNCTIONS
    except TypeError:
        return True


class _AliasClasses:
    """Nodes grouped by the memory their results may share, from the graph's structure (a
    result that may alias an operand joins the operand's class). The meta values' storages
    cannot be trusted alone: capture reuses meta results of repeated identical ops."""

    def __init__(self, graph: Graph) -> None:
        self.parent: dict[Node, Node] = {}
        for node in graph.nodes:
            if node.op in ("call_function", "call_method", "call_module") and may_alias_operand(node):
                for inp in node.all_input_nodes:
                    self.union(node, inp)

    def find(self, node: Node) -> Node:
        root = node
        while self.parent.get(root, root) is not root:
            root = self.parent[root]
        while node is not root:
            self.parent[node], node = root, self.parent.get(node, node)
        return root

    def union(self, a: Node, b: Node) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra is not rb:
            self.parent[ra] = rb


class _Memory:
    """Which storages the graph writes to (mutated) or returns (escaping), and which get_attr
    targets it writes to. Both the meta values' storages and the graph's structure
    (:class:`_AliasClasses`) are consulted; either one saying "shared" is enough."""

    def __init__(self, graph: Graph) -> None:
        self.mutated: set[StorageWeakRef] = set()
        self.escaping: set[StorageWeakRef] = set()
        self.mutated_attrs: set[str] = set()
        self.writes = False  # whether any node may write to a tensor
        self.unknown = False  # a write whose target has no meta value: anything may change
        self.classes = _AliasClasses(graph)
        self.mutated_classes: set[Node] = set()
        self.escaping_classes: set[Node] = set()
        external: set[StorageWeakRef] = set()
        external_nodes: list[Node] = []
        for node in graph.nodes:
            if node.op in ("placeholder", "get_attr"):
                external |= _storages(node.meta.get("val"))
                external_nodes.append(node)
            elif node.op == "output":
                self.escaping |= _storages(map_aggregate(node.args, _meta_of))
                self.escaping_classes |= {self.classes.find(n) for n in node.all_input_nodes}
            elif _mutates(node):
                self.writes = True
                self.mutated |= _storages(node.meta.get("val"))
                self.mutated_classes.add(self.classes.find(node))
                for inp in node.all_input_nodes:
                    if "val" not in inp.meta:
                        self.unknown = True
                    self.mutated |= _storages(inp.meta.get("val"))
                    self.mutated_classes.add(self.classes.find(inp))
        external_classes = {self.classes.find(n) for n in external_nodes}
        if self.mutated & external or self.mutated_classes & external_classes:
            # Inputs and attributes are distinct tensors in the meta values, but at run time one
            # may be a view of another: a write to one of them may change any of them.
            self.mutated |= external
            self.mutated_classes |= external_classes
        if self.writes:
            for node in graph.nodes:
                if node.op == "get_attr" and (_storages(node.meta.get("val")) & self.mutated
                                              or self.classes.find(node) in self.mutated_classes):
                    self.mutated_attrs.add(node.target)

    def written(self, node: Node) -> bool:
        """Whether the node's result may be written to by the graph (unknown without a meta
        value, unless the graph writes nothing)."""
        if not self.writes:
            return False
        if self.unknown or "val" not in node.meta:
            return True
        return (bool(_storages(node.meta["val"]) & self.mutated)
                or self.classes.find(node) in self.mutated_classes)

    def reads_written(self, node: Node) -> bool:
        """Whether the node reads memory the graph may write to."""
        return self.writes and any(self.written(inp) for inp in node.all_input_nodes)

    def escapes(self, node: Node) -> bool:
        """Whether the node's result (or a view of it) is returned."""
        if any(user.op == "output" for user in node.users):
            return True
        return (bool(_storages(node.meta.get("val")) & self.escaping)
                or self.classes.find(node) in self.escaping_classes)

    def now_escapes(self, node: Node) -> None:
        """``node`` takes over the uses of a returned twin: it is returned from now on."""
        self.escaping |= _storages(node.meta.get("val"))
        self.escaping_classes.add(self.classes.find(node))


def _meta_of(x: Any) -> Any:
    return x.meta.get("val") if isinstance(x, Node) else x


def _pure_call(node: Node) -> bool:
    if node.op not in ("call_function", "call_method"):
        return False
    if node.is_impure() or is_random(node) or "out" in node.kwargs:
        return False
    # In place even if meta["impure"] says otherwise.
    return not _is_inplace_name(target_name(node))


# --------------------------------------------------------------------------------------------
# CSE


def _key(a: Any) -> Any:
    """A hashable key that is equal only for arguments that mean the same: 1, 1.0 and True
    differ, 0.0 and -0.0 differ, NaN equals NaN, unknown objects compare by identity."""
    if isinstance(a, Node):
        return ("node", a)
    kind = type(a)
    if kind is float:
        return ("float", a.hex())
    if kind is complex:
        return ("complex", a.real.hex(), a.imag.hex())
    if kind in (int, bool, str) or a is None or a is Ellipsis:
        return (kind.__name__, a)
    if kind in (torch.dtype, torch.device, torch.memory_format, torch.layout):
        return (kind.__name__, a)
    if kind in (tuple, list, torch.Size):
        return (kind.__name__, tuple(_key(x) for x in a))
    if kind is dict:
        return ("dict", tuple((_key(k), _key(v)) for k, v in a.items()))
    if kind is slice:
        return ("slice", _key(a.start), _key(a.stop), _key(a.step))
    return ("object", id(a))


def _node_key(node: Node) -> Any:
    kwargs = dict(sorted(node.kwargs.items()))  # keyword order does not change the call
    return (node.op, node.target, _key(node.args), _key(kwargs))


def cse(graph: Graph) -> bool:
    """Merge pure call nodes with the same op, target, args and kwargs into the first one.

    Never merged: placeholders, get_attr, impure, random and in-place nodes; a node whose result
    is written to in place later (directly or through a view); two nodes whose results are both
    returned (the caller would get one tensor twice). A node reading memory that the graph
    writes to is merged only with a twin between the same two writes.
    """
    memory = _Memory(graph)
    seen: dict[Any, Node] = {}
    epoch = 0
    changed = False
    for node in list(graph.nodes):
        if _mutates(node):
            epoch += 1
            continue
        if not _pure_call(node) or memory.written(node):
            continue
        key = _node_key(node)
        if memory.reads_written(node):
            key = (key, epoch)
        try:
            first = seen.setdefault(key, node)
        except TypeError:  # an argument that cannot be hashed: no merging
            continue
        if first is node:
            continue
        if memory.escapes(node):
            if memory.escapes(first):
                continue
            # From now on the first node is returned too.
            memory.now_escapes(first)
        if node.meta.get("rounds"):
            # A conversion the program asked for (see Builder.convert) rounds for every user.
            first.meta["rounds"] = True
        node.replace_all_uses_with(first)
        graph.erase_node(node)
        changed = True
    return changed


# --------------------------------------------------------------------------------------------
# constant folding

_CONSTANT_LEAVES = (
    int,
    float,
    bool,
    complex,
    str,
    type(None),
    torch.dtype,
    torch.device,
    torch.memory_format,
    torch.layout,
)


def _constant_args(node: Node) -> bool:
    """Every leaf of args/kwargs is a get_attr node or a plain Python constant."""
    ok = True

    def check(x: Any) -> Any:
        nonlocal ok
        if isinstance(x, Node):
            ok = ok and x.op == "get_attr"
        elif not isinstance(x, _CONSTANT_LEAVES) and x is not Ellipsis:
            ok = False
        return x

    map_aggregate(node.args, check)
    map_aggregate(node.kwargs, check)
    return ok


def _unique_qualname(constants: dict[str, Any]) -> str:
    i = 0
    while f"_folded_{i}" in constants:
        i += 1
    return f"_folded_{i}"


class Constant(str):
    """In a :class:`Folded` recipe's arguments: the constant of this qualified name."""

    __slots__ = ()


class Folded(tuple):
    """How a folded constant was computed: ``(qualname, op, target, args, kwargs)``, with each
    input constant in ``args``/``kwargs`` as its :class:`Constant` name. :func:`evaluate` computes
    it again from the constants of another compile of the same graph (a graph cache hit)."""

    __slots__ = ()


def evaluate(recipe: Folded, constants: dict[str, Any]) -> Any:
    """The value of a folded constant's ``recipe`` over ``constants``."""
    _, op, target, args, kwargs = recipe

    def load(x: Any) -> Any:
        return resolve_qualname(constants, x) if type(x) is Constant else x

    args = map_aggregate(args, load)
    kwargs = map_aggregate(kwargs, load)
    if op == "call_method":
        obj, *rest = args
        return getattr(obj, target)(*rest, **kwargs)
    return target(*args, **kwargs)


def _recipe(qualname: str, node: Node) -> Folded:
    def name(x: Any) -> Any:
        return Constant(x.target) if isinstance(x, Node) else x

    return Folded((qualname, node.op, node.target, map_aggregate(node.args, name),
                   map_aggregate(node.kwargs, name)))


def fold_constants(graph: Graph, constants: dict[str, Any],
                   recipes: list[Folded] | None = None) -> bool:
    """Evaluate pure, non-random call nodes whose inputs are all get_attr constants or Python
    constants, once now; each becomes a get_attr of a new entry of ``constants`` (the
    GraphModule's root dict), and its :class:`Folded` recipe is appended to ``recipes``.

    Skipped: results that require grad or have more than :data:`MAX_FOLDED_NUMEL` elements,
    results the graph returns or writes to (a stored constant would be shared between calls),
    inputs the graph writes to, and anything that fails to evaluate.
    """
    memory = _Memory(graph)
    changed = False
    for node in list(graph.nodes):
        if not _pure_call(node) or node.meta.get("keep") or not node.users:
            continue
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor) or value.requires_grad:
            continue
        if math.prod(value.shape) > MAX_FOLDED_NUMEL or not _constant_args(node):
            continue
        if memory.written(node) or memory.escapes(node):
            continue
        if any(inp.target in memory.mutated_attrs for inp in node.all_input_nodes):
            continue
        qualname = _unique_qualname(constants)
        recipe = _recipe(qualname, node)
        try:
            result = evaluate(recipe, constants)
        except Exception:  # noqa: BLE001 - whatever fails now fails (or not) at run time instead
            continue
        if not isinstance(result, torch.Tensor) or result.requires_grad:
            continue
        if result.shape != value.shape or result.dtype != value.dtype:
            continue
        constants[qualname] = result
        if recipes is not None:
            recipes.append(recipe)
        with graph.inserting_before(node):
            folded = graph.get_attr(qualname)
        folded.meta["val"] = to_meta(result)
        folded.meta["device"] = result.device
        node.replace_all_uses_with(folded)
        graph.erase_node(node)
        changed = True
    return changed
