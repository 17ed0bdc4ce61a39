"""Symbolic sizes of a graph captured with dynamic shapes, after the passes.

Capture marks which input dimensions are symbols (``meta["sym_shape"]`` on each placeholder:
``("s0", 16)``; equal names are one symbol) and which inputs are sizes (``meta["symbol"]``).
Every other ``meta["val"]`` holds the sizes seen at capture (the *hints*), which is what the
passes and the fusion partitioner read. Kernels that serve every size need more: the size and
strides of each value as expressions of the symbols. :func:`symbolic_shapes` computes them by
running the graph once more on fake tensors whose dynamic sizes are ``torch.SymInt`` s.

The graph is *size-generic* only if nothing in it was decided by the hints. Propagation catches
what the passes or capture may have fixed to the hints: a view to literal sizes makes torch's
symbolic reasoning record a guard (``s0 == 5``), and any recorded guard, or a result whose
sizes at the hints differ from its ``meta["val"]``, makes :func:`symbolic_shapes` decline
(:class:`NotSizeGeneric`, with the reason); the compiler then runs the graph's torch ops. The
passes themselves never fold a size into a number while :data:`SYMBOLIC` is set (see
``Builder.mean``).
"""

from __future__ import annotations

import contextlib
import contextvars
import operator
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch
import torch.utils._sympy.functions as _sym_fns

from ..fx_ir import Graph, Node, call_on_fake, quiet_failed_meta_runs
from ..fx_ir.examples import size_symbol_source
from ..fx_ir.node import map_aggregate

#: Set while the passes run on a graph with symbolic sizes: they must not turn a size into a
#: constant (a mean divides by an ``aten.mean`` of the reduced elements, not by their count).
SYMBOLIC: contextvars.ContextVar[bool] = contextvars.ContextVar("framejit_symbolic", default=False)


class NotSizeGeneric(Exception):
    """The graph depends on the sizes seen at capture beyond its symbols' guards."""


@dataclass
class SymbolicShapes:
    """Per node: sizes and strides as sympy expressions (ints where static); per symbol: where
    its value is read at run time (a placeholder of the size, or an input tensor's dimension)."""

    shape: dict[Node, tuple]
    stride: dict[Node, tuple]
    #: symbol -> (node, None) for a size placeholder, (tensor placeholder, dim) otherwise
    binding: dict[sympy.Symbol, tuple[Node, int | None]]
    #: symbol -> its value at capture
    hint: dict[sympy.Symbol, int]
    #: relations between the capture's size symbols (named as in ``meta["sym_shape"]``) that
    #: the graph needs beyond the capture's own guards (``s0 >= 8`` for a slice of 8): the
    #: caller checks them on every call
    relations: list = field(default_factory=list)


def symbolic_shapes(graph: Graph, constants: dict[str, Any] | None,
                    allow_relations: bool = False) -> SymbolicShapes:
    """Sizes and strides of every tensor node of ``graph`` as expressions of its symbols.
    Raises :class:`NotSizeGeneric` when the graph is not valid for every size its guards
    allow, unless ``allow_relations`` (the caller adds the relations it needs, ``relations``,
    to its guards)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

    env = ShapeEnv(duck_shape=False, specialize_zero_one=True)
    mode = FakeTensorMode(shape_env=env, allow_non_fake_inputs=True)
    symbols: dict[str, torch.SymInt] = {}
    binding: dict = {}
    hints: dict = {}

    def make_symbol(name: str, hint: int, where: tuple):
        found = symbols.get(name)
        if found is None:
            expr = env.create_symbol(hint, size_symbol_source(name), DimDynamic.DYNAMIC)
            found = symbols[name] = env.create_symintnode(expr, hint=hint)
            binding[expr] = where
            hints[expr] = hint
        elif where[1] is None:
            binding[found.node.expr] = where  # a size input is the cheapest binding
        return found

    values: dict[Node, Any] = {}

    def load(a):
        return map_aggregate(a, lambda x: values[x] if isinstance(x, Node) else x)

    shape: dict[Node, tuple] = {}
    stride: dict[Node, tuple] = {}
    for node in graph.nodes:
        val = node.meta.get("val")
        if node.op == "placeholder":
            if "symbol" in node.meta:
                value = make_symbol(node.meta["symbol"], int(val), (node, None))
            elif "sym_shape" in node.meta and isinstance(val, torch.Tensor):
                sizes = [make_symbol(n, int(h), (node, d)) if isinstance(n, str) else int(n)
                         for d, (n, h) in enumerate(zip(node.meta["sym_shape"], val.shape))]
                strides, step = [], 1
                for n in reversed(sizes):  # a dynamic input is guarded contiguous
                    strides.append(step)
                    step = step * n
                with mode:
                    value = torch.empty_strided(sizes, strides[::-1], dtype=val.dtype,
                                                device=node.meta.get("device", "cpu"))
            elif isinstance(val, torch.Tensor):
                value = _fake_like(mode, val, node.meta.get("device"))
            else:
                value = val
        elif node.op == "get_attr":
            real = constants.get(node.target) if constants else None
            source = real if isinstance(real, torch.Tensor) else val
            value = _fake_like(mode, source, node.meta.get("device")) \
                if isinstance(source, torch.Tensor) else source
        elif node.op in ("call_function", "call_method"):
            args, kwargs = load(node.args), load(node.kwargs)
            try:
                with mode, quiet_failed_meta_runs(), \
                        torch.no_grad() if not _grad(node) else contextlib.nullcontext():
                    value = call_on_fake(node.op, node.target, args, kwargs)
            except Exception as e:
                raise NotSizeGeneric(f"{node.format()} does not run on symbolic sizes "
                                     f"({type(e).__name__}: {e})") from e
        elif node.op == "output":
            continue
        else:
            raise NotSizeGeneric(f"{node.op} nodes are not supported with symbolic sizes")
        values[node] = value
        if isinstance(value, torch.Tensor):
            shape[node] = tuple(_expr(n) for n in value.shape)
            stride[node] = tuple(_expr(n) for n in value.stride())
            if isinstance(val, torch.Tensor):
                at = {s: h for s, h in hints.items()}
                if tuple(_at(e, at) for e in shape[node]) != tuple(val.shape):
                    raise NotSizeGeneric(f"%{node.name}: sizes {shape[node]} are not "
                                         f"{tuple(val.shape)} at the capture's sizes")
                if val.numel() > 1 and any(
                        n != 1 and _at(e, at) != st
                        for e, st, n in zip(stride[node], val.stride(), val.shape)):
                    raise NotSizeGeneric(f"%{node.name}: strides {stride[node]} are not "
                                         f"{val.stride()} at the capture's sizes")
    relations = []
    if env.guards:
        named = {si.node.expr: sympy.Symbol(name) for name, si in symbols.items()}
        relations = [g.expr.xreplace(named) for g in env.guards]
        if not allow_relations or any(not r.free_symbols <= set(named.values()) for r in relations):
            raise NotSizeGeneric("the graph holds only for some sizes: "
                                 + ", ".join(str(g.expr) for g in env.guards[:3]))
    return SymbolicShapes(shape, stride, binding, hints, relations)


def _expr(n) -> Any:
    if isinstance(n, torch.SymInt):
        expr = n.node.expr
        return int(expr) if expr.is_number else expr
    return int(n)


def _at(e, hints) -> int:
    return e if isinstance(e, int) else int(e.xreplace(hints))


def _grad(node: Node) -> bool:
    val = node.meta.get("val")
    return isinstance(val, torch.Tensor) and val.requires_grad


def _fake_like(mode, t: torch.Tensor, device) -> torch.Tensor:
    with mode:
        fake = torch.empty_strided(tuple(t.shape), t.stride(), dtype=t.dtype,
                                   device=device if device is not None else t.device)
    return fake.requires_grad_(True) if t.requires_grad else fake


# -- sizes as graph nodes ------------------------------------------------------------------------

#: Size expressions of any number of terms, and the two-argument function that folds them.
_FOLDS = ((sympy.Add, operator.add), (sympy.Mul, operator.mul),
          ((sympy.Max, _sym_fns.Max), max), ((sympy.Min, _sym_fns.Min), min))


def _fold_of(expr) -> Any:
    return next((fn for kinds, fn in _FOLDS if isinstance(expr, kinds)), None)


def size_node(expr, shapes: SymbolicShapes, graph: Graph, made: dict,
              node_of=lambda n: n) -> Node | int:
    """A node of ``graph`` (appended at its insertion point) computing the size ``expr`` from
    the inputs' sizes; ``node_of`` maps the captured graph's nodes to ``graph``'s, ``made``
    memoises. Raises NotSizeGeneric for an expression it cannot build."""
    if isinstance(expr, int) or expr.is_Integer:
        return int(expr)
    found = made.get(expr)
    if found is not None:
        return found
    if isinstance(expr, sympy.Symbol):
        node, dim = shapes.binding[expr]
        if dim is None:
            made[expr] = node_of(node)
            return made[expr]
        shape = made.get(("shape", node))
        if shape is None:  # one read of the tensor's shape, then an index per size
            shape = made[("shape", node)] = graph.call_function(getattr, (node_of(node), "shape"))
            shape.meta["val"] = torch.Size(node.meta["val"].shape)
        result = graph.call_function(operator.getitem, (shape, dim))
    elif (fn := _fold_of(expr)) is not None:  # s0 * s1 + 2, BART's max(1, s - 1)
        terms = [size_node(a, shapes, graph, made, node_of) for a in expr.args]
        result = terms[0]
        for t in terms[1:]:
            result = graph.call_function(fn, (result, t))
    elif isinstance(expr, _sym_fns.FloorDiv):  # x[:, ::2]: (w + 1) // 2
        a, b = (size_node(e, shapes, graph, made, node_of) for e in expr.args)
        result = graph.call_function(operator.floordiv, (a, b))
    elif isinstance(expr, sympy.Pow) and expr.exp.is_Integer and int(expr.exp) > 0:
        base = size_node(expr.base, shapes, graph, made, node_of)
        result = base
        for _ in range(int(expr.exp) - 1):
            result = graph.call_function(operator.mul, (result, base))
    else:
        raise NotSizeGeneric(f"no graph arithmetic for the size {expr}")
    if isinstance(result, Node):
        result.meta["val"] = int(expr.xreplace(shapes.hint))
    made[expr] = result
    return result
