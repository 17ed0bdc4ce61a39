"""From a fusion group of graph nodes to a :class:`~framejit.kernels.ir.Kernel`.

The graph nodes are in the vocabulary that ``framejit.passes`` produce: aten overloads for
pointwise math, casts, ``rand_like``, and keepdim reductions. :func:`classify` says which nodes a
kernel can compute (the partitioner asks it); :func:`lower_group` builds the kernel of one group
and says which graph values it reads and writes.

A concatenation (``torch.cat``) is computed where its value is used, as Inductor does: the
producers of its inputs (``-x[..., d:]`` in a rotary embedding) are lowered once per input, in a
*placement*, the input's slice of the box (a :class:`~framejit.kernels.ir.Span` along the cat
dimension), and a ``concat`` op picks the input whose span holds each point. A group node that
only concatenations use is computed only in their placements, never over the whole box.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from ..fx_ir import Node, on_cpu
from .ir import FULL, OUTER, Buffer, Kernel, Op, Span, Sym, compute_dtype, product

aten = torch.ops.aten
prims = torch.ops.prims

#: aten overload -> scalar op of the description; operands cast to the output's compute dtype.
_ARITHMETIC = {
    aten.add.Tensor: "add", aten.sub.Tensor: "sub", aten.mul.Tensor: "mul",
    aten.div.Tensor: "truediv", aten.maximum.default: "maximum", aten.minimum.default: "minimum",
    aten.neg.default: "neg", aten.abs.default: "abs", aten.exp.default: "exp",
    aten.log.default: "log", aten.log1p.default: "log1p", aten.expm1.default: "expm1",
    aten.sqrt.default: "sqrt", aten.rsqrt.default: "rsqrt", aten.reciprocal.default: "reciprocal",
    aten.sin.default: "sin", aten.cos.default: "cos", aten.tanh.default: "tanh",
    aten.sigmoid.default: "sigmoid", aten.erf.default: "erf", aten.relu.default: "relu",
    aten.gelu.default: "gelu",
    aten.floor.default: "floor", aten.ceil.default: "ceil", aten.sign.default: "sign",
}
#: Ops defined only on floating point values in torch.
_FLOAT_ONLY = {"exp", "log", "log1p", "expm1", "sqrt", "rsqrt", "reciprocal", "sin", "cos",
               "tanh", "sigmoid", "erf", "gelu", "truediv"}
_COMPARISONS = {
    aten.eq.Tensor: "eq", aten.ne.Tensor: "ne", aten.lt.Tensor: "lt", aten.le.Tensor: "le",
    aten.gt.Tensor: "gt", aten.ge.Tensor: "ge", aten.eq.Scalar: "eq", aten.ne.Scalar: "ne",
    aten.lt.Scalar: "lt", aten.le.Scalar: "le", aten.gt.Scalar: "gt", aten.ge.Scalar: "ge",
}
_LOGICAL = {aten.logical_and.default: "and", aten.logical_or.default: "or",
            aten.logical_not.default: "not"}
_REDUCTIONS = {aten.sum.dim_IntList: "sum", aten.amax.default: "max", aten.amin.default: "min",
               aten.argmax.default: "argmax", aten.argmin.default: "argmin",
               aten.mean.dim: "mean"}
_WHERE = {aten.where.self, aten.where.ScalarOther, aten.where.ScalarSelf, aten.where.Scalar}
_OTHERS = {*_WHERE, aten.clamp.default, aten.pow.Tensor_Scalar, aten.isnan.default,
           prims.convert_element_type.default, aten.clone.default, aten.rand_like.default}
#: Exponents of pow that lower to exact products/square roots.
_POW_EXPONENTS = {0, 1, 2, 3, 4, -1, -2, 0.5, -0.5}

SUPPORTED_DTYPES = frozenset({
    torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32,
    torch.int16, torch.int8, torch.uint8, torch.bool,
})

POINTWISE = "pointwise"
REDUCTION = "reduction"
#: A pointwise node whose inputs are smaller than its box along one dimension (``torch.cat``):
#: the partitioner fuses producers of each input, computed over the input's part of the box.
CONCAT = "concat"
_CONCATS = {torch.cat, torch.concat, torch.concatenate, aten.cat.default}


def concat_inputs(node: Node) -> tuple[list, int]:
    """The tensors a concatenation joins and its dimension (as given: maybe negative;
    ``torch.concatenate`` calls it ``axis``)."""
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", node.kwargs.get("axis", 0))
    return list(node.args[0]), dim


def _val(a: Any) -> Any:
    return a.meta.get("val") if isinstance(a, Node) else a


def _scalar_ok(a: Any) -> bool:
    return type(a) in (int, float, bool)


def _tensor_ok(t: Any) -> bool:
    """A value a kernel can produce: autograd does not track it (an output that requires grad
    keeps its torch op, so autograd records it; parameters read under no_grad are fine)."""
    return (isinstance(t, torch.Tensor) and t.dtype in SUPPORTED_DTYPES and not t.requires_grad
            and t.layout == torch.strided)


def reduction_dims(node: Node) -> tuple[int, ...] | None:
    """The (sorted, non-negative) dimensions a reduction node reduces, or None."""
    if node.target not in _REDUCTIONS:
        return None
    x = node.args[0]
    ndim = _val(x).dim()
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if node.target in (aten.argmax.default, aten.argmin.default):
        if not isinstance(dims, int):
            return None
        dims = [dims]
    if not dims:
        return None
    return tuple(sorted({d % ndim for d in dims}))


def classify(node: Node) -> str | None:
    """``"pointwise"``, ``"reduction"`` or None (the node stays a torch call)."""
    if node.op != "call_function":
        return None
    target = node.target
    try:
        known = (target in _ARITHMETIC or target in _COMPARISONS or target in _LOGICAL
                 or target in _REDUCTIONS or target in _OTHERS)
    except TypeError:
        return None
    if not known:
        return _classify_concat(node) if target in _CONCATS else None
    out = node.meta.get("val")
    if not _tensor_ok(out) or out.numel() == 0:
        return None
    for a in (*node.args, *node.kwargs.values()):
        if isinstance(a, Node):
            val = a.meta.get("val")
            if not (isinstance(val, torch.Tensor) and val.dtype in SUPPORTED_DTYPES
                    and val.layout == torch.strided):
                return None
    tensor_args = [a for a in node.args if isinstance(a, Node)]
    if not tensor_args:
        return None
    if target in _REDUCTIONS:
        return _classify_reduction(node)
    if target in _ARITHMETIC:
        name = _ARITHMETIC[target]
        if out.dtype == torch.bool or (name in _FLOAT_ONLY and not out.dtype.is_floating_point):
            return None
        if node.kwargs or not all(isinstance(a, Node) or _scalar_ok(a) for a in node.args):
            return None
        return POINTWISE
    if target in _COMPARISONS or target in _LOGICAL:
        if node.kwargs or not all(isinstance(a, Node) or _scalar_ok(a) for a in node.args):
            return None
        return POINTWISE
    if target in _WHERE:
        if node.kwargs or not isinstance(node.args[0], Node) or node.args[0].meta["val"].dtype != torch.bool:
            return None
        return POINTWISE if all(isinstance(a, Node) or _scalar_ok(a) for a in node.args[1:]) else None
    if target is aten.clamp.default:
        bounds = [*node.args[1:], *node.kwargs.values()]
        if out.dtype == torch.bool or not all(b is None or _scalar_ok(b) for b in bounds):
            return None
        if any(type(b) is float and math.isnan(b) for b in bounds):
            return None  # eager's result is all NaN; the compare-and-select lowering keeps x
        return POINTWISE
    if target is aten.pow.Tensor_Scalar:
        if not out.dtype.is_floating_point or node.args[1] not in _POW_EXPONENTS:
            return None
        return POINTWISE
    if target is aten.isnan.default:
        return POINTWISE
    if target is prims.convert_element_type.default:
        return POINTWISE
    if target is aten.clone.default:
        return POINTWISE if set(node.kwargs) <= {"memory_format"} else None
    if target is aten.rand_like.default:
        if out.dtype != torch.float32 or set(node.kwargs) - {"dtype"}:
            return None
        return POINTWISE
    return None


def _classify_concat(node: Node) -> str | None:
    """``torch.cat`` of two or more non-empty tensors of the output's rank (torch skips the
    legacy empty 1-D inputs; those, ``out=`` and 0-d tensors stay torch calls)."""
    out = node.meta.get("val")
    if not _tensor_ok(out) or out.numel() == 0 or out.dim() == 0:
        return None
    if len(node.kwargs) > 1 or set(node.kwargs) - {"dim", "axis"} or len(node.args) > 2 \
            or not isinstance(node.args[0], (list, tuple)):
        return None
    inputs, dim = concat_inputs(node)
    if len(inputs) < 2 or not isinstance(dim, int) or not -out.dim() <= dim < out.dim():
        return None
    for a in inputs:
        val = _val(a)
        if not (isinstance(a, Node) and isinstance(val, torch.Tensor)
                and val.dtype in SUPPORTED_DTYPES and val.layout == torch.strided
                and val.dim() == out.dim() and val.numel() > 0):
            return None
    return CONCAT


def _classify_reduction(node: Node) -> str | None:
    x = node.args[0]
    xv = _val(x)
    dims = reduction_dims(node)
    if dims is None or xv.dim() == 0:
        return None
    keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
    extra = set(node.kwargs) - {"dim", "keepdim"}
    if not keepdim or extra:
        return None
    if math.prod(xv.shape[d] for d in dims) <= 1:
        return None
    if node.target in (aten.argmax.default, aten.argmin.default) and xv.dtype == torch.bool:
        return None
    out = node.meta["val"]
    if node.target is aten.mean.dim and (out.dtype != compute_dtype(out.dtype)
                                         or not out.dtype.is_floating_point):
        return None
    if node.target is aten.sum.dim_IntList and (out.dtype != compute_dtype(out.dtype)
                                                or xv.dtype == torch.bool):
        # fp16/bf16 sums must come upcast by the passes; bool inputs are left to torch.
        return None
    return REDUCTION


def reduced_shape(sizes: tuple[int, ...], reduce_dims: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(1 if d in reduce_dims else s for d, s in enumerate(sizes))


def box_strides(shape, strides, sizes) -> tuple[int, ...] | None:
    """Strides of a tensor (``shape``, ``strides``) broadcast into the box ``sizes``, or None
    when it does not broadcast."""
    off = len(sizes) - len(shape)
    if off < 0:
        return None
    out = []
    for d, size in enumerate(sizes):
        j = d - off
        if j < 0 or shape[j] == 1:
            out.append(0)
        elif shape[j] == size:
            out.append(int(strides[j]))
        else:
            return None
    return tuple(out)


@dataclass
class LoweredGroup:
    """A kernel and the graph values bound to its buffers."""

    kernel: Kernel
    #: graph nodes read, in the order of the kernel's input buffers (a ``None`` entry is the
    #: per-call random seed, a 0-d int64 tensor the launcher draws).
    inputs: list[Node | None]
    #: graph nodes written, in the order of the kernel's output buffers.
    outputs: list[Node]
    #: With symbolic sizes: each run-time size argument of the kernel (``ks0``) -> its sympy
    #: expression over the graph's symbols, which the caller computes and passes.
    sizes: dict = field(default_factory=dict)

    def layout(self, node: Node) -> tuple[tuple, tuple]:
        """(sizes, strides) of a graph value the kernel reads or writes, as kernel sizes:
        ints, or :class:`~framejit.kernels.ir.Sym` expressions of the run-time sizes."""
        return self._layouts[node]

    _layouts: dict = field(default_factory=dict)


class LoweringError(Exception):
    """The group cannot be expressed as one kernel (the pipeline then keeps its torch ops)."""


def lower_group(nodes: list[Node], sizes: tuple[int, ...], reduce_dims: tuple[int, ...],
                name: str, symbolic=None) -> LoweredGroup:
    """Lower ``nodes`` (topological order) computing over the box ``sizes`` with
    ``reduce_dims`` reduced into one kernel.

    ``symbolic`` (for a graph with symbolic sizes) has ``shape`` and ``stride`` mappings from
    each node to its sizes and strides as sympy expressions (``passes.symbolic``); the kernel
    then takes the sizes that vary as run-time arguments (``LoweredGroup.sizes``)."""
    return _Lowering(nodes, tuple(sizes), tuple(reduce_dims), name, symbolic).run()


class _Lowering:
    def __init__(self, nodes, sizes, reduce_dims, name, symbolic=None):
        self.nodes = nodes
        self.members = set(nodes)
        self.sizes = sizes
        self.reduce_dims = reduce_dims
        self.outer_shape = reduced_shape(sizes, reduce_dims)
        self.symbolic = symbolic
        self.size_args: dict[Any, str] = {}  # sympy expression -> kernel argument name
        self.layouts: dict[Node, tuple] = {}
        self.box = self._symbolic_box() if symbolic is not None else sizes
        self.kernel = Kernel(name, self.box, reduce_dims, [])
        self.value: dict[Node, int] = {}
        self.loads: dict[tuple[Node, str], int] = {}
        self.input_nodes: list[Node | None] = []
        self.input_buffer: dict[Node, str] = {}
        self.seed: str | None = None
        self.streams = 0  # rand ops emitted: each is its own stream under the seed
        # The placement being lowered: the spans of the concatenation inputs it is inside
        # (none: the whole box), and the values computed in each placement.
        self.spans: tuple[Span, ...] = ()
        self.placed_value: dict[tuple[Node, tuple[Span, ...]], int] = {}
        self.span_starts: dict[int, Any] = {}  # dim -> where the current span starts
        self.read_16bit: set[Node] = set()  # fp16/bf16 values that ops of this kernel read

    # -- symbolic sizes -------------------------------------------------------------------------
    def _symbolic_box(self) -> tuple:
        """The box's sizes as kernel sizes: each dimension's expression, read from the group's
        values (and what they read) that span it; they must all agree."""
        found: list = [None] * len(self.sizes)
        for node in (*self.nodes, *(i for n in self.nodes for i in n.all_input_nodes)):
            shape = self.symbolic.shape.get(node)
            if shape is None:
                continue
            off = len(self.sizes) - len(shape)
            hints = tuple(node.meta["val"].shape) if isinstance(_val(node), torch.Tensor) else None
            for j, e in enumerate(shape):
                d = j + off
                if d < 0 or self.sizes[d] == 1 or _hint_one(e):
                    continue
                if hints is not None and len(hints) == len(shape) and hints[j] != self.sizes[d]:
                    continue  # a part of the box: a concatenation's input
                if found[d] is None:
                    found[d] = e
                elif found[d] != e:
                    raise LoweringError(f"dimension {d} of the box is both {found[d]} and {e}")
        return tuple(1 if f is None else self.to_kernel(f) for f in found)

    def to_kernel(self, e) -> Any:
        """A sympy size as a kernel size: an int, a product of run-time size arguments (one per
        symbol), or one argument standing for a whole expression (``s0 - 1``)."""
        if isinstance(e, int):
            return e
        if e.is_Integer:
            return int(e)
        coeff, factors = e.as_coeff_mul()
        atoms = []
        for f in factors:
            base, power = (f.base, f.exp) if f.is_Pow else (f, 1)
            if not (base.is_Symbol and getattr(power, "is_Integer", power == 1) and int(power) > 0):
                atoms = None
                break
            atoms += [self.argument(base)] * int(power)
        if atoms is None or not coeff.is_Integer:
            return Sym(self.argument(e))
        return product([int(coeff), *(Sym(a) for a in atoms)])

    def argument(self, e) -> str:
        name = self.size_args.get(e)
        if name is None:
            name = self.size_args[e] = f"ks{len(self.size_args)}"
        return name

    def box_strides_of(self, node: Node) -> tuple:
        """``node``'s strides in the box, as kernel sizes (the symbolic ``box_strides``)."""
        val = node.meta["val"]
        strides = box_strides(tuple(val.shape), tuple(val.stride()), self.sizes)
        if strides is None:
            raise LoweringError(f"{node.name} of shape {tuple(val.shape)} does not broadcast to {self.sizes}")
        if self.symbolic is None:
            self.layouts[node] = (tuple(val.shape), tuple(val.stride()))
            return strides
        shape, stride = self.symbolic.shape.get(node), self.symbolic.stride.get(node)
        if shape is None:
            raise LoweringError(f"{node.name} has no symbolic sizes")
        off = len(self.sizes) - len(shape)
        out = []
        for d in range(len(self.sizes)):
            j = d - off
            # Broadcast only where the size is 1 for every size: a size that is 1 in the example
            # only (``s0 - 1`` of a slice inside a cat) is read with its stride.
            if j < 0 or shape[j] == 1:
                out.append(0)
                continue
            if self.to_kernel(shape[j]) != self.box[d]:
                raise LoweringError(f"{node.name}'s size {shape[j]} is not the box's {self.box[d]}")
            out.append(self.to_kernel(stride[j]))
        self.layouts[node] = (tuple(self.to_kernel(e) for e in shape),
                              tuple(self.to_kernel(e) for e in stride))
        return tuple(out)

    # -- helpers ------------------------------------------------------------------------------
    def emit(self, kind, args, dtype, level) -> int:
        self.kernel.ops.append(Op(kind, tuple(args), dtype, level))
        return len(self.kernel.ops) - 1

    def level_of(self, node: Node) -> str:
        """OUTER for a value constant along the reduced dims (reduction results, per-row
        values), FULL otherwise; a shape smaller than the box broadcasts into it."""
        shape = tuple(node.meta["val"].shape)
        contiguous = [0 if s == 1 else 1 for s in shape]
        strides = box_strides(shape, contiguous, self.sizes)
        if strides is None:
            raise LoweringError(f"{node.name} of shape {shape} does not broadcast to {self.sizes}")
        if self.reduce_dims and all(strides[d] == 0 for d in self.reduce_dims):
            return OUTER
        return FULL

    def cast(self, index: int, dtype: torch.dtype) -> int:
        op = self.kernel.ops[index]
        if op.dtype == dtype:
            return index
        if op.kind == "const":
            number = op.args[0]
            if not isinstance(number, Sym):
                number = _convert_number(number, dtype)
            return self.emit("const", (number,), dtype, op.level)
        return self.emit("cast", (index,), dtype, op.level)

    def operand(self, a: Any, dtype: torch.dtype, level: str) -> int:
        """The op index of ``a`` (group node, outside tensor or Python number) as ``dtype``."""
        if isinstance(a, Node):
            if a in self.members and self.spans:
                index = self.placed(a)
            elif a in self.members:
                index = self.value[a]
                if level == OUTER and self.kernel.ops[index].level == FULL:
                    raise LoweringError(f"{a.name} is used per row but varies along the row")
            else:
                index = self.load(a, level)
            return self.cast(index, dtype)
        return self.emit("const", (_convert_number(a, dtype),), dtype, level)

    def operand_in(self, a: Any, dtype: torch.dtype, level: str) -> int:
        """``a`` as an operand of an op that eager computes in ``dtype`` and that compares or
        selects its operands (comparisons, where, clamp, maximum): a value that fp16/bf16
        cannot hold exactly (a number, a 0-dim fp32 tensor) is rounded to ``dtype`` first, as
        eager converts it. Arithmetic takes ``operand``: its result is rounded only on store."""
        c = compute_dtype(dtype)
        if not isinstance(a, Node):
            return self.operand(_number_in(a, dtype), c, level)
        index = self.operand(a, c, level)
        if _rounds(_val(a).dtype, dtype):
            index = self.emit("round", (index, dtype), c, level)
        return index

    def load(self, node: Node, level: str) -> int:
        key = (node, level, self.spans)
        if key in self.loads:
            return self.loads[key]
        val = node.meta["val"]
        strides = self.box_strides_of(node)
        if level == OUTER and any(strides[d] != 0 for d in self.reduce_dims):
            raise LoweringError(f"{node.name} varies along the reduced dimensions")
        strides = self.single_span_strides(strides)
        name = self.input_buffer.get(node)
        if name is None:
            name = f"in{len(self.input_nodes)}"
            self.input_buffer[node] = name
            self.input_nodes.append(node)
            self.kernel.buffers.append(Buffer(name, val.dtype, strides))
        elif self.kernel.buffer(name).strides != strides:
            raise LoweringError(f"{node.name} is read with two layouts (inside and outside a cat)")
        index = self.emit("load", (name, *self.spans), compute_dtype(val.dtype), level)
        self.loads[key] = index
        return index

    # -- the walk -------------------------------------------------------------------------------
    def run(self) -> LoweredGroup:
        whole = self.computed_over_the_box()
        outputs = [node for node in self.nodes if any(u not in self.members for u in node.users)]
        self.read_16bit = {node for node in self.nodes if _val(node).dtype in _HALVES
                           and any(u in self.members for u in node.users)}
        for node in self.nodes:
            if node in whole:
                self.value[node] = self.lower_as_stored(node)
        if not outputs:
            raise LoweringError("the group has no outputs")
        for k, node in enumerate(outputs):
            val = node.meta["val"]
            level = self.kernel.ops[self.value[node]].level
            strides = self.box_strides_of(node)
            name = f"out{k}"
            self.kernel.buffers.append(Buffer(name, val.dtype, strides, is_output=True))
            self.emit("store", (name, self.value[node]), compute_dtype(val.dtype), level)
        sizes = {name: e for e, name in self.size_args.items()}
        return LoweredGroup(self.kernel, self.input_nodes, outputs, sizes, self.layouts)

    def computed_over_the_box(self) -> set[Node]:
        """The group's nodes needed over the whole box: outputs, and what such nodes use other
        than as an input of a concatenation (those inputs are computed in their placements)."""
        whole: set[Node] = set()
        for node in reversed(self.nodes):
            for user in node.users:
                if user not in self.members or (user in whole and user.target not in _CONCATS):
                    whole.add(node)
                    break
        return whole

    def single_span_strides(self, strides: tuple) -> tuple:
        """``strides`` with any stride along a span of one element (where the shifted index is
        always 0) set as if the buffer were dense there, so the dimension may still merge with
        the one inside it (``simplify.coalesce``)."""
        strides = list(strides)
        for span in self.spans:
            d = span.dim
            if self.sizes[d] == 1 and d + 1 < len(strides) and strides[d + 1] != 0:
                strides[d] = product([strides[d + 1], self.box[d + 1]])
        return tuple(strides)

    def placed(self, node: Node) -> int:
        """``node`` (a group member) computed in the current placement."""
        key = (node, self.spans)
        if key not in self.placed_value:
            if node.target in _REDUCTIONS or node.target is aten.rand_like.default:
                raise LoweringError(f"{node.name} feeds a cat: only pointwise producers are fused")
            self.placed_value[key] = self.lower_as_stored(node)
        return self.placed_value[key]

    def lower_as_stored(self, node: Node) -> int:
        """``node`` lowered; an fp16/bf16 value that ops of this kernel read is rounded to its
        dtype for them, as eager holds it. Computed in fp32 and rounded only on store, such a
        value was read unrounded: ``(z + 0.1) == 0.1`` of fp16 zeros was False (eager: True),
        ``(a * 1000).float()`` never overflowed to inf, and a stored value read here too
        (``cat([v[:h], v[h:]]).float() - v.float()``) was a bf16 ulp off its stored self."""
        index = self.lower(node)
        dtype = _val(node).dtype
        if node not in self.read_16bit:
            return index
        op = self.kernel.ops[index]
        exact = (self.holds(index, dtype)
                 # a conversion of a value the dtype holds exactly (its input is rounded itself)
                 or node.target in (prims.convert_element_type.default, aten.clone.default)
                 and not _rounds(_val(node.args[0]).dtype, dtype))
        return index if exact else self.emit("round", (index, dtype), op.dtype, op.level)

    def holds(self, index: int, dtype: torch.dtype) -> bool:
        """Whether op ``index``'s value is one that ``dtype`` (fp16/bf16) holds exactly: a load
        of such a buffer, a rounding to it, and what negation, abs, selection and
        concatenation make of such values (a rotary embedding's ``cat([-x2, x1])``)."""
        op = self.kernel.ops[index]
        if op.kind == "round":
            return op.args[1] == dtype
        if op.kind == "load":
            return not _rounds(self.kernel.buffer(op.args[0]).dtype, dtype)
        if op.kind == "const":
            v = op.args[0]
            return isinstance(v, (int, float)) and torch.tensor(v, dtype=dtype).item() == v
        if op.kind in ("neg", "abs"):
            return self.holds(op.args[0], dtype)
        if op.kind == "where":
            return self.holds(op.args[1], dtype) and self.holds(op.args[2], dtype)
        if op.kind in ("maximum", "minimum"):
            return all(self.holds(a, dtype) for a in op.args)
        if op.kind == "concat":
            return all(self.holds(a, dtype) for a in op.args[1::2])
        return False

    @contextlib.contextmanager
    def placement(self, span: Span, size: int, box_size, start):
        """Lower inside ``span`` of the box: a concatenation's input of ``size`` elements along
        it (``box_size`` as a kernel size), starting at ``start`` (an int or, with symbolic
        sizes, a sympy expression)."""
        saved = self.spans, self.sizes, self.box, self.span_starts
        self.spans = tuple(s for s in self.spans if s.dim != span.dim) + (span,)
        self.sizes = self.sizes[:span.dim] + (size,) + self.sizes[span.dim + 1:]
        self.box = self.box[:span.dim] + (box_size,) + self.box[span.dim + 1:]
        self.span_starts = {**self.span_starts, span.dim: start}
        try:
            yield
        finally:
            self.spans, self.sizes, self.box, self.span_starts = saved

    def concat(self, node: Node, dtype: torch.dtype) -> int:
        """A ``concat`` of the inputs, each lowered in its span of the box. With symbolic sizes
        the spans' bounds are kernel sizes too (``s0`` and ``s0 + 4`` become run-time size
        arguments)."""
        if self.reduce_dims:
            raise LoweringError("a cat in a reduction kernel")
        inputs, dim = concat_inputs(node)
        out = node.meta["val"]
        dim = dim % out.dim()
        d = dim + len(self.sizes) - out.dim()
        if d < 0 or self.sizes[d] != out.shape[dim]:
            raise LoweringError(f"{node.name} is broadcast along its cat dimension")
        # Where this cat's output starts along d: inside an outer cat's input, that input's start.
        start = self.span_starts.get(d, 0)
        args: list = []
        for inp in inputs:
            if self.symbolic is None:
                size = int(_val(inp).shape[dim])
            else:
                shape = self.symbolic.shape.get(inp)
                if shape is None:
                    raise LoweringError(f"{inp.name} has no symbolic sizes")
                size = shape[dim]
            stop = start + size
            span = Span(d, self.to_kernel(start), self.to_kernel(stop))
            with self.placement(span, int(_val(inp).shape[dim]), self.to_kernel(size), start):
                args += [span, self.operand(inp, dtype, FULL)]
            start = stop
        return self.emit("concat", args, dtype, FULL)

    def lower(self, node: Node) -> int:
        target, args = node.target, node.args
        out = node.meta["val"]
        level = self.level_of(node)
        c = compute_dtype(out.dtype)
        if target in _ARITHMETIC:
            name = _ARITHMETIC[target]
            cpu = on_cpu(node)
            if name in ("maximum", "minimum") or name in ("add", "sub") and cpu:
                # eager's CPU add and sub convert a number (or a 0-dim fp32 tensor) to a
                # fp16/bf16 result's dtype first; its mul and div do not
                ops = [self.operand_in(a, out.dtype, level) for a in args]
            elif not cpu:
                # eager's CUDA kernels read a tensor of another dtype (a 0-dim fp32 or int64
                # tensor beside fp16 ones) converted to the result's dtype, and take a number
                # as it is (in fp32)
                ops = [self.operand_in(a, out.dtype, level) if isinstance(a, Node)
                       else self.operand(a, c, level) for a in args]
            else:
                ops = [self.operand(a, c, level) for a in args]
            return self.emit(name, ops, c, level)
        if target in _COMPARISONS:
            semantic = torch.result_type(*[_val(a) for a in args])
            ops = [self.operand_in(a, semantic, level) for a in args]
            return self.emit(_COMPARISONS[target], ops, torch.bool, level)
        if target in _LOGICAL:
            ops = [self.operand(a, torch.bool, level) for a in args]
            return self.emit(_LOGICAL[target], ops, torch.bool, level)
        if target in _WHERE:
            cond = self.operand(args[0], torch.bool, level)
            a = self.operand_in(args[1], out.dtype, level)
            b = self.operand_in(args[2], out.dtype, level)
            return self.emit("where", (cond, a, b), c, level)
        if target is aten.clamp.default:
            lo = args[1] if len(args) > 1 else node.kwargs.get("min")
            hi = args[2] if len(args) > 2 else node.kwargs.get("max")
            x = self.operand(args[0], c, level)
            # NaN stays NaN: the comparisons are false for it.
            if lo is not None:
                bound = self.operand_in(lo, out.dtype, level)
                x = self.emit("where", (self.emit("lt", (x, bound), torch.bool, level), bound, x), c, level)
            if hi is not None:
                bound = self.operand_in(hi, out.dtype, level)
                x = self.emit("where", (self.emit("gt", (x, bound), torch.bool, level), bound, x), c, level)
            return x
        if target is aten.pow.Tensor_Scalar:
            x = self.operand(args[0], c, level)
            if args[1] in (0.5, -0.5) and out.dtype == torch.float16 and on_cpu(node):
                # eager's CPU fp16 power is std::pow, not a square root: pow(-0, ±0.5) is
                # +0 / +inf and pow(-inf, ±0.5) is +inf / +0 (sqrt gives -0 and NaN)
                x = self.emit("add", (x, self.emit("const", (0.0,), c, level)), c, level)  # -0: +0
                inf = self.emit("const", (math.inf,), c, level)
                minus_inf = self.emit("const", (-math.inf,), c, level)
                x = self.emit("where", (self.emit("eq", (x, minus_inf), torch.bool, level), inf, x),
                              c, level)
            return self.power(x, args[1], c, level)
        if target is aten.isnan.default:
            x = self.operand(args[0], compute_dtype(_val(args[0]).dtype), level)
            return self.emit("isnan", (x,), torch.bool, level)
        if target is prims.convert_element_type.default or target is aten.clone.default:
            return self.operand(args[0], c, level)  # rounded by lower_as_stored if read here
        if target in _CONCATS:
            return self.concat(node, c)
        if target is aten.rand_like.default:
            if self.seed is None:
                self.seed = f"in{len(self.input_nodes)}"
                self.input_nodes.append(None)
                self.kernel.buffers.append(Buffer(self.seed, torch.int64, (0,) * len(self.sizes)))
            # Each draw of the kernel is its own stream under the kernel's one per-call seed:
            # two dropouts fused into one kernel must not share a mask.
            self.streams += 1
            return self.emit("rand", (self.seed, self.streams - 1), torch.float32, FULL)
        if target in _REDUCTIONS:
            dims = reduction_dims(node)
            if dims != self.reduce_dims:
                raise LoweringError(f"{node.name} reduces {dims}, the kernel {self.reduce_dims}")
            kind = _REDUCTIONS[target]
            x = args[0]
            if kind == "mean":
                total = self.emit("reduce", ("sum", self.operand(x, c, FULL)), c, OUTER)
                count = product([self.box[d] for d in self.reduce_dims])
                count = count if isinstance(count, Sym) else float(count)
                return self.emit("truediv", (total, self.emit("const", (count,), c, OUTER)), c, OUTER)
            if x in self.members and self.kernel.ops[self.value[x]].level != FULL:
                raise LoweringError(f"{node.name} reduces a per-row value")
            if kind in ("argmax", "argmin"):
                src = self.operand(x, compute_dtype(_val(x).dtype), FULL)
                return self.emit("reduce", (kind, src), torch.int64, OUTER)
            src = self.operand(x, c, FULL)
            return self.emit("reduce", (kind, src), c, OUTER)
        raise LoweringError(f"no kernel lowering for {node.format()}")

    def power(self, x: int, n, c, level) -> int:
        if n == 0:
            return self.emit("const", (1.0,), c, level)
        if n in (0.5, -0.5):
            return self.emit("sqrt" if n > 0 else "rsqrt", (x,), c, level)
        result = x
        for _ in range(abs(int(n)) - 1):
            result = self.emit("mul", (result, x), c, level)
        if n < 0:
            result = self.emit("reciprocal", (result,), c, level)
        return result


_HALVES = (torch.float16, torch.bfloat16)


def _rounds(source: torch.dtype, target: torch.dtype) -> bool:
    """Whether converting ``source`` values to ``target`` can change them beyond what computing
    in ``compute_dtype(target)`` does: a conversion to fp16/bf16 from anything but itself and
    the small integers (every int8, uint8 and bool value is exact in both)."""
    return target in (torch.float16, torch.bfloat16) and source not in (
        target, torch.bool, torch.int8, torch.uint8)


def _hint_one(e) -> bool:
    return isinstance(e, int) and e == 1 or getattr(e, "is_Integer", False) and int(e) == 1


def _number_in(a: Any, dtype: torch.dtype) -> Any:
    """A Python number compared with or selected into fp16/bf16 values, as eager has it: in that
    dtype (``x >= 0.1`` holds for ``x = half(0.1)``; ``where(m, x, 0.1)`` holds ``half(0.1)``,
    and stays so where the kernel reads it in fp32); and added or subtracted on CPU tensors,
    where eager's add and sub round it too (its mul and div do not)."""
    if type(a) in (int, float) and dtype in (torch.float16, torch.bfloat16):
        return torch.tensor(a, dtype=dtype).item()
    return a


def _convert_number(value: Any, dtype: torch.dtype) -> Any:
    """``value`` as a constant of ``dtype``; an integer wraps into the dtype's range as eager
    converts it (``u != -1`` compares a uint8 with 255, ``q == 300`` an int8 with 44), so
    that no renderer sees a literal its type cannot hold."""
    if dtype == torch.bool:
        return bool(value)
    if dtype.is_floating_point:
        return float(value)
    info = torch.iinfo(dtype)
    span = info.max - info.min + 1
    return (int(value) - info.min) % span + info.min
