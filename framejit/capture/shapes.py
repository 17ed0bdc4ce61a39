"""Dynamic shapes during capture: which sizes are symbolic, their guards, their graph nodes.

A capture with dynamic sizes runs every operation's example on fake tensors whose dynamic sizes
are ``torch.SymInt``s of one ``ShapeEnv`` (torch's symbolic reasoning: each symbol has a hint,
the size seen at capture, and a range; every decision Python takes on a symbol records a guard).
This module owns that state for one capture (:class:`ShapeContext`) and turns it, at the end,
into three things framejit itself decides:

* the *graph nodes* of sizes: each free symbol is a placeholder the entry function binds from an
  input's size (``x.shape[0]``), and a SymInt argument of an operation (``x.view(n * 2, -1)``)
  becomes explicit arithmetic nodes over those placeholders;
* the *guards*: ranges (``2 <= x.shape[0]``), equal sizes sharing a symbol (duck sizing), and
  every relation recorded while capturing, as Python over ints in the generated guard function;
* the *policy* (:func:`dynamic_dims`): static first, and a dimension becomes symbolic once it
  has been seen with two sizes (``dynamic=None``), always (``dynamic=True``), never
  (``dynamic=False``), or as marked by :func:`framejit.mark_dynamic`.

Sizes 0 and 1 are never symbols (broadcasting and emptiness stay decided), so every symbol is at
least 2. Anything this module cannot express makes the caller capture the frame again with
static shapes (:class:`DynamicShapeError`).
"""

from __future__ import annotations

import operator

import sympy
import torch

from .. import record
from ..errors import ConstraintViolation, Unsupported
from ..fx_ir.examples import size_symbol_source
from .guards import Guard
from .sources import ModuleMemberSource, SizeSource, Source

_SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


class DynamicShapeError(Unsupported):
    """Something in a capture with symbolic sizes that framejit cannot express symbolically: the
    frame is captured again with static shapes (never a wrong answer)."""


# -- policy ------------------------------------------------------------------------------------------

#: Attributes ``framejit.mark_dynamic`` / ``mark_static`` set on a tensor.
DYNAMIC_MARK = "_framejit_dynamic_dims"
STATIC_MARK = "_framejit_static_dims"


def dynamic_dims(dynamic, seen: dict | None, tensor: torch.Tensor, source: Source) -> dict:
    """``{dim: (min, max) or None}`` (a range for marked dimensions): the dimensions of ``tensor`` (read from ``source``) to
    capture as symbols. ``seen`` (source key -> sizes, None where a size changed) is the
    frame's memory for automatic dynamic shapes; it is updated here, and a dimension seen
    changing for the first time is logged (``x.shape[0] is now dynamic: 4 → 5``)."""
    if dynamic is False or isinstance(tensor, torch.nn.Parameter) \
            or type(tensor) is not torch.Tensor or tensor.layout != torch.strided:
        return {}
    static = getattr(tensor, STATIC_MARK, ())
    dims = {d: r for d, r in getattr(tensor, DYNAMIC_MARK, {}).items() if d not in static}
    shape = tuple(tensor.shape)
    if dynamic is True:
        if isinstance(source, ModuleMemberSource):
            # A module's buffer (a position-ids table, a mask) keeps its sizes, as parameters
            # do: a symbolic size there only adds relations (a slice of it: s >= n) that keep
            # the graph from serving every input size.
            return dims
        for d in range(len(shape)):
            if d not in static:
                dims.setdefault(d, None)
        return dims
    if seen is None:
        return dims
    old = seen.get(source.key)
    if old is None or len(old) != len(shape):
        seen[source.key] = list(shape)
        return dims
    for d, (before, now) in enumerate(zip(old, shape)):
        if before is not None and before != now and d not in static:
            record.emit(record.ShapeDynamic(source=source.name(), dim=d, before=before, now=now))
            old[d] = None
        if old[d] is None and d not in static:
            dims.setdefault(d, None)
    return dims


# -- one capture's symbols ---------------------------------------------------------------------------

def _size_name(expr):
    """An input size in ``meta["sym_shape"]``: its symbol's name, or its value once fixed."""
    return int(expr) if expr.is_number else str(expr)


class ShapeContext:
    """The symbolic sizes of one capture."""

    def __init__(self):
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        self.env = ShapeEnv(duck_shape=True, specialize_zero_one=True)
        self.mode = FakeTensorMode(shape_env=self.env, allow_non_fake_inputs=False)
        self.env.framejit_shapes = self  # SymInts lead back here (context_of)
        #: symbol -> the size it was first seen as (its binding in guards and entry code)
        self.owners: dict = {}
        #: (size, first size) pairs that share a symbol because they were equal (duck sizing)
        self.duck: list[tuple[SizeSource, SizeSource]] = []
        #: expression -> graph node (or int), while sizes are turned into nodes
        self._nodes: dict = {}
        #: symbols of dimensions the user marked dynamic: fixing one to a size is an error
        self.marked: set = set()

    # -- inputs -------------------------------------------------------------------------------
    def fake_input(self, tensor: torch.Tensor, source: Source, dims: dict):
        """A fake tensor for the input ``tensor`` with ``dims`` symbolic (sizes 0 and 1 stay
        numbers), or None when it cannot have symbolic sizes (not contiguous)."""
        from torch.fx.experimental.symbolic_shapes import DimDynamic

        if not tensor.is_contiguous() or not any(tensor.shape[d] >= 2 for d in dims if d < tensor.dim()):
            return None
        sizes: list = []
        for d, n in enumerate(tensor.shape):
            if d not in dims or n < 2:
                sizes.append(int(n))
                continue
            size_source = SizeSource(source, d)
            bounds = dims[d]
            # Marked dimensions get their own symbol; others share one with an equal size.
            kind = DimDynamic.DUCK if bounds is None else DimDynamic.DYNAMIC
            origin = size_symbol_source(size_source.name())
            expr = self.env.create_symbol(int(n), origin, kind)
            if bounds is not None and bounds != (None, None):
                lo, hi = bounds
                self.env.constrain_symbol_range(expr, compiler_min=max(2, lo if lo is not None else 2),
                                                compiler_max=hi if hi is not None else int(2**63 - 1))
            if bounds is not None:
                self.marked.add(expr)
            first = self.owners.get(expr)
            if first is None:
                self.owners[expr] = size_source
            else:
                self.duck.append((size_source, first))
            sizes.append(self.env.create_symintnode(expr, hint=int(n), source=origin))
        strides: list = []
        step = 1
        for s in reversed(sizes):
            strides.append(step)
            step = step * s
        strides.reverse()
        with self.mode:
            fake = torch.empty_strided(sizes, strides, dtype=tensor.dtype, device=tensor.device)
        if tensor.requires_grad:
            fake.requires_grad_(True)
        return fake

    def fake_of(self, example, device):
        """An example (a static meta tensor, or already fake) as a fake tensor of this capture."""
        from torch._subclasses.fake_tensor import FakeTensor

        if isinstance(example, FakeTensor):
            return example
        return FakeTensor(self.mode, example, device)

    # -- hints ----------------------------------------------------------------------------------
    def hint(self, v):
        """The value ``v`` (a SymInt, or a structure of them) had at capture."""
        if isinstance(v, torch.SymInt):
            expr = v.node.expr
            if expr.is_number:
                return int(expr)
            return int(expr.xreplace(self.env.backed_var_to_val))
        if isinstance(v, (tuple, list, torch.Size)):
            items = [self.hint(x) for x in v]
            return torch.Size(items) if isinstance(v, torch.Size) else type(v)(items)
        return v

    def concrete(self, v):
        """``meta["val"]`` of a finished graph without symbols: meta tensors of the hint sizes
        (what passes and user backends expect), numbers for SymInts."""
        from torch._subclasses.fake_tensor import FakeTensor

        if isinstance(v, FakeTensor):
            m = torch.empty_strided(self.hint(tuple(v.shape)), self.hint(tuple(v.stride())),
                                    dtype=v.dtype, device="meta")
            return m.requires_grad_(True) if v.requires_grad else m
        if isinstance(v, (tuple, list)):
            items = [self.concrete(x) for x in v]
            return tuple(items) if isinstance(v, tuple) else items
        if isinstance(v, _SYM_TYPES):
            return self.hint(v) if isinstance(v, torch.SymInt) else v.node.hint
        return v

    # -- sizes in the graph ---------------------------------------------------------------------
    def finish_graph(self, output) -> None:
        """Turn every SymInt among the graph's arguments into nodes over one placeholder per
        free symbol (bound from an input's size by the entry function), then give every node a
        symbol-free ``meta["val"]``."""
        graph = output.graph
        for node in list(graph.nodes):
            if node.op not in ("call_function", "call_method", "call_module"):
                continue
            if _has_sym((node.args, node.kwargs)):
                with graph.inserting_before(node):
                    node.args = self._map(node.args, output)
                    node.kwargs = self._map(node.kwargs, output)
        for node in graph.nodes:
            if "val" in node.meta:
                val = node.meta["val"]
                if node.op == "placeholder" and isinstance(val, torch.Tensor):
                    # Which input dimension is which symbol (equal names: one symbol): what a
                    # compiler needs to rebuild the symbolic sizes of the whole graph.
                    node.meta["sym_shape"] = tuple(_size_name(self.env.simplify(n.node.expr))
                                                   if isinstance(n, torch.SymInt) else int(n)
                                                   for n in val.shape)
                node.meta["val"] = self.concrete(val)

    def _map(self, v, output):
        if isinstance(v, torch.SymInt):
            return self._node_of(self.env.simplify(v.node.expr), output)
        if isinstance(v, (torch.SymFloat, torch.SymBool)):
            raise DynamicShapeError("a symbolic float or bool as an operation's argument")
        if isinstance(v, torch.Size):
            return tuple(self._map(x, output) for x in v)
        if isinstance(v, (tuple, list)):
            items = [self._map(x, output) for x in v]
            return tuple(items) if isinstance(v, tuple) else items
        if isinstance(v, dict):
            return {k: self._map(x, output) for k, x in v.items()}
        if type(v) is slice:  # x[:, :n]
            return slice(*(self._map(x, output) for x in (v.start, v.stop, v.step)))
        return v

    def _node_of(self, expr, output):
        if expr.is_Integer:
            return int(expr)
        found = self._nodes.get(expr)
        if found is not None:
            return found
        graph = output.graph
        if isinstance(expr, sympy.Symbol):
            node = self._placeholder(expr, output)
        else:
            fn, operands = _arithmetic(expr)
            args = tuple(self._node_of(e, output) if isinstance(e, sympy.Expr) else e for e in operands)
            node = graph.call_function(fn, args)
            node.meta["val"] = int(expr.xreplace(self.env.backed_var_to_val))
        self._nodes[expr] = node
        return node

    def _placeholder(self, symbol, output):
        from .output import _identifier

        source = self.owners.get(symbol)
        if source is None:
            raise DynamicShapeError(f"a size symbol {symbol} with no input size it comes from")
        graph = output.graph
        anchor = next((n for n in graph.nodes if n.op != "placeholder"), None)
        name = _identifier(source.name())
        if anchor is not None:
            with graph.inserting_before(anchor):
                node = graph.placeholder(name)
        else:
            node = graph.placeholder(name)
        hint = int(self.env.backed_var_to_val[symbol])
        node.meta["val"] = hint
        node.meta["source"] = source.name()
        node.meta["symbol"] = str(symbol)
        node.meta["size_of"] = (source.base.name(), source.dim)
        output.inputs.append((source, hint, node))
        return node

    # -- guards ---------------------------------------------------------------------------------
    def guard(self, compiled_relations=()) -> SizeGuard:
        """The guards on sizes this capture depends on (call after :meth:`finish_graph`), and
        ``compiled_relations``, those the compiled graph needs (sympy relations over symbols
        named like this capture's)."""
        env = self.env
        relations: list[tuple] = []
        seen: set = set()

        def add(rel, why=""):
            if rel is sympy.true or rel is True:
                return
            if rel is sympy.false or rel is False:
                raise DynamicShapeError(f"a size relation that cannot hold: {rel}")
            if rel in seen:
                return
            seen.add(rel)
            relations.append((rel, why))

        for later, first in self.duck:
            relations.append((("dup", later, first), "duck sizing: equal sizes at capture share a symbol"))
        for symbol in self.owners:
            value = env.simplify(symbol)
            if value != symbol:
                if symbol in self.marked and value.is_number:
                    name = self.owners[symbol].name()
                    raise ConstraintViolation(
                        f"{name} was marked dynamic (framejit.mark_dynamic) but the code only works "
                        f"for {name} == {value}: a branch on that size, or a view or a number that "
                        f"fixes it, makes it static. Remove the mark_dynamic call for this "
                        f"dimension, or make the code work for every size.")
                add(sympy.Eq(symbol, value, evaluate=False), "specialized")
                continue
            r = env.var_to_range.get(symbol)
            lower = _finite(r.lower) if r is not None else None
            lower = 2 if lower is None else max(lower, 2)
            add(sympy.Le(lower, symbol, evaluate=False), "0/1 specialization" if lower == 2 else "")
            upper = _finite(r.upper) if r is not None else None
            if upper is not None and upper < 2**63 - 1:
                add(sympy.Le(symbol, upper, evaluate=False))
        for g in env.guards:
            add(g.expr)
        by_name = {sympy.Symbol(str(s)): s for s in self.owners}
        for rel in compiled_relations:
            if not rel.free_symbols <= by_name.keys():
                raise DynamicShapeError(f"the compiled graph needs {rel}, over sizes that are not "
                                        "inputs")
            add(rel.xreplace(by_name), "the generated kernels")
        owners = dict(self.owners)
        for rel, _ in relations:
            if isinstance(rel, tuple):
                continue
            for s in rel.free_symbols:
                if s not in owners:
                    raise DynamicShapeError(f"a guard on a size symbol {s} with no input size it comes from")
            render(rel, lambda s: "_")  # raises DynamicShapeError for what cannot be expressed
        return SizeGuard(owners, relations)


# -- the guard ---------------------------------------------------------------------------------------

class SizeGuard(Guard):
    """Every relation between input sizes one cache entry depends on, checked together after
    the tensor guards (which check each tensor's rank): ``2 <= x.shape[0]``,
    ``x.shape[0] == y.shape[0]``, ``8 < x.shape[0]``."""

    order = 90

    def __init__(self, owners: dict, relations: list):
        self.owners = owners  # symbol -> SizeSource
        self.relations = relations
        self.source = None

    def code_with(self, value_of) -> list[str]:
        names = {}
        lines = []
        for i, (symbol, source) in enumerate(self.owners.items()):
            loaded = value_of(source)  # a temporary already, unless the path is a plain name
            if loaded.isidentifier():
                names[symbol] = loaded
            else:
                names[symbol] = f"___z{i}"
                lines.append(f"___z{i} = {loaded}")
        for (rel, _), text in zip(self.relations, self.texts()):
            lines.append(f"# {text}")  # the relation in the user's terms, for dumps and explain
            if isinstance(rel, tuple):
                _, later, first = rel
                lines.append(f"if {value_of(later)} != {value_of(first)}: return False")
            else:
                lines.append(f"if not ({render(rel, names.__getitem__)}): return False")
        return lines

    def texts(self) -> list[str]:
        """The relations in the user's terms, for dumps and tests."""
        out = []
        for rel, why in self.relations:
            if isinstance(rel, tuple):
                text = f"{rel[1].name()} == {rel[2].name()}"
            else:
                text = render(rel, lambda s: self.owners[s].name())
            out.append(f"{text}  # {why}" if why else text)
        return out

    def reason_with(self, read) -> str | None:
        """The first relation that fails for the sizes ``read(source)`` gives."""
        values = {}
        for symbol, source in self.owners.items():
            values[symbol] = read(source)
        for rel, _ in self.relations:
            if isinstance(rel, tuple):
                _, later, first = rel
                a, b = read(later), read(first)
                if a != b:
                    return f"{later.name()} == {first.name()} no longer holds: {a} vs {b}"
                continue
            ok = eval(render(rel, lambda s: f"___v[{list(self.owners).index(s)}]"),
                      {"___v": list(values.values())})
            if ok:
                continue
            name = lambda s: self.owners[s].name()  # noqa: E731
            lhs, rhs = rel.lhs, rel.rhs
            lv = lhs.xreplace(values) if not lhs.is_number else lhs
            rv = rhs.xreplace(values) if not rhs.is_number else rhs
            text = render(rel, name)
            if lhs.is_number:
                return f"{text} no longer holds: {render(rhs, name)} is {rv}"
            if rhs.is_number:
                return f"{text} no longer holds: {render(lhs, name)} is {lv}"
            return f"{text} no longer holds: {lv} vs {rv}"
        return None


# -- sympy expressions as Python ---------------------------------------------------------------------

_RELATIONS = {"<": "<", "<=": "<=", ">": ">", ">=": ">=", "==": "==", "!=": "!="}


def render(expr, name_of) -> str:
    """``expr`` (sizes, relations between them) as a Python expression over ints, each symbol
    given by ``name_of(symbol)``."""
    from torch.utils._sympy import functions as F

    def r(e) -> str:
        if isinstance(e, (int, sympy.Integer)):
            return str(int(e))
        if isinstance(e, sympy.Symbol):
            return name_of(e)
        if isinstance(e, sympy.core.relational.Relational):
            op = _RELATIONS.get(e.rel_op)
            if op is None:
                raise DynamicShapeError(f"a size relation framejit cannot check: {e}")
            return f"{r(e.lhs)} {op} {r(e.rhs)}"
        if isinstance(e, sympy.Add):
            terms = [r(a) for a in e.args]
            return "(" + " + ".join(terms) + ")"
        if isinstance(e, sympy.Mul):
            return "(" + " * ".join(r(a) for a in e.args) + ")"
        if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) >= 0:
            return f"({r(e.base)} ** {int(e.exp)})"
        if isinstance(e, (F.PowByNatural,)):
            return f"({r(e.args[0])} ** {r(e.args[1])})"
        if isinstance(e, F.FloorDiv):
            return f"({r(e.args[0])} // {r(e.args[1])})"
        if isinstance(e, (F.Mod, F.PythonMod, sympy.Mod)):
            return f"({r(e.args[0])} % {r(e.args[1])})"
        if isinstance(e, F.CleanDiv):
            return f"({r(e.args[0])} // {r(e.args[1])})"
        if isinstance(e, (F.Max, sympy.Max)):
            return "max(" + ", ".join(r(a) for a in e.args) + ")"
        if isinstance(e, (F.Min, sympy.Min)):
            return "min(" + ", ".join(r(a) for a in e.args) + ")"
        if isinstance(e, sympy.And):
            return "(" + " and ".join(r(a) for a in e.args) + ")"
        if isinstance(e, sympy.Or):
            return "(" + " or ".join(r(a) for a in e.args) + ")"
        if isinstance(e, sympy.Not):
            return f"(not {r(e.args[0])})"
        raise DynamicShapeError(f"a size expression framejit cannot express: {e}")

    return r(expr)


def _arithmetic(expr):
    """``(fn, operands)`` computing ``expr`` from its parts, for the graph's size nodes."""
    from torch.utils._sympy import functions as F

    if isinstance(expr, sympy.Add):
        first, *rest = expr.args
        return operator.add, (first, rest[0] if len(rest) == 1 else sympy.Add(*rest))
    if isinstance(expr, sympy.Mul):
        first, *rest = expr.args
        return operator.mul, (first, rest[0] if len(rest) == 1 else sympy.Mul(*rest))
    if isinstance(expr, F.FloorDiv) or isinstance(expr, F.CleanDiv):
        return operator.floordiv, expr.args
    if isinstance(expr, (F.Mod, F.PythonMod)):
        return operator.mod, expr.args
    if isinstance(expr, (F.Max, F.Min, sympy.Max, sympy.Min)):  # max(0, n - k)
        first, *rest = expr.args
        kind = type(expr)
        return (max if isinstance(expr, (F.Max, sympy.Max)) else min), (
            first, rest[0] if len(rest) == 1 else kind(*rest))
    if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and int(expr.exp) >= 0:
        return operator.pow, (expr.base, int(expr.exp))
    if isinstance(expr, F.PowByNatural):
        return operator.pow, expr.args
    raise DynamicShapeError(f"a size expression framejit cannot compute in a graph: {expr}")


def _finite(bound) -> int | None:
    """A range bound as an int, or None when it is infinite."""
    try:
        return int(bound) if bool(bound.is_finite) else None
    except (TypeError, AttributeError, ValueError):
        return None


def _has_sym(v) -> bool:
    if isinstance(v, _SYM_TYPES):
        return True
    if isinstance(v, (tuple, list)):
        return any(_has_sym(x) for x in v)
    if isinstance(v, dict):
        return any(_has_sym(x) for x in v.values())
    if type(v) is slice:
        return any(_has_sym(x) for x in (v.start, v.stop, v.step))
    return False



def context_of(v):
    """The ShapeContext a SymInt belongs to."""
    return getattr(v.node.shape_env, "framejit_shapes", None)


def reconstruct_sizes(cg, v) -> str:
    """Entry-function code for a size (or a tuple or torch.Size of sizes) the frame returns or
    stores: the same arithmetic over the inputs' sizes at the call."""
    if isinstance(v, torch.SymInt):
        ctx = context_of(v)
        expr = ctx.env.simplify(v.node.expr)
        if expr.is_Integer:
            return str(int(expr))

        def name_of(symbol):
            source = ctx.owners.get(symbol)
            if source is None:
                raise DynamicShapeError(f"a size symbol {symbol} with no input size it comes from")
            return cg.source_expr(source)

        return render(expr, name_of)
    if isinstance(v, (torch.SymFloat, torch.SymBool)):
        raise DynamicShapeError("a symbolic float or bool kept by the frame")
    if isinstance(v, (tuple, list, torch.Size)):
        items = "".join(reconstruct_sizes(cg, x) + ", " for x in v)
        if isinstance(v, torch.Size):
            return f"{cg.const_name(torch.Size)}(({items}))"
        return f"[{items}]" if isinstance(v, list) else f"({items})"
    return cg.literal(v)
