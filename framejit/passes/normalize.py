"""``normalize(graph)``: torch-level pointwise ops, reductions and conversions become calls of
the aten vocabulary (:mod:`framejit.passes.vocabulary`).

Every spelling of one operation maps to one overload: ``operator.add(x, y)``, ``torch.add(x,
y)``, ``x.add(y)``, ``x.__radd__(2)`` all become ``aten.add.Tensor``; ``x.sum(-1)`` becomes
``aten.sum.dim_IntList(x, [1], True)`` followed by ``aten.squeeze.dims``. The rewrite keeps
eager's semantics exactly (type promotion with Python numbers, ``alpha=``, reversed operands,
identity conversions returning the input itself); a call whose operands are not plain tensor
nodes and Python numbers, or whose form is unusual, is left alone and runs in eager torch.

Example::

    changed = normalize(graph)   # %add = operator.add(%x, 1.0) -> aten.add.Tensor(%x, 1.0)
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from ..fx_ir import Graph, Node, on_cpu
from .util import (
    Builder,
    RuleTable,
    apply_rules,
    compute_dtype,
    is_float_tensor,
    is_number,
    is_tensor,
    layout_is_exact,
    normalize_dims,
    number_fits,
    val,
)
from .vocabulary import VOCABULARY

aten = torch.ops.aten
F = torch.nn.functional

#: Every rule of this pass.
RULES = RuleTable()
#: The rules whose result is a pointwise op of the vocabulary (decompose asks whether the users
#: of a linear are all pointwise).
POINTWISE_RULES = RuleTable()


def _pointwise(*targets: Any):
    def decorator(fn):
        RULES.add(targets, fn)
        POINTWISE_RULES.add(targets, fn)
        return fn

    return decorator


def normalize(graph: Graph) -> bool:
    """Rewrite torch-level pointwise ops, reductions and conversions into the vocabulary, and
    splits into ``split_with_sizes``; returns whether anything changed."""
    changed = _resolve_negative_views(graph)
    changed = apply_rules(graph, RULES) or changed
    return _splits_with_sizes(graph) or changed


_IMAG = (torch.imag, "imag", aten.imag.default)


def _resolve_negative_views(graph: Graph) -> bool:
    """The imaginary part of a complex tensor, and an input with torch's negative bit, read
    through ``resolve_neg()``: of a conjugate (``z.conj().imag``, ``z.imag`` of a conjugated
    input) it is a view that reads negated (so is ``torch._neg_view(x)``), and a kernel reads
    the memory itself (the bit exists at run time only: meta values do not carry
    it). ``resolve_neg()`` returns the tensor itself where the bit is not set. A use by the
    graph's output keeps the view, as in eager."""
    changed = False
    for node in list(graph.nodes):
        if node.op == "placeholder":
            if not node.meta.get("negative"):
                continue  # an input with the bit (its guard requires it)
        elif node.op not in ("call_function", "call_method") or not node.args:
            continue
        else:
            imag = node.target in _IMAG if node.target != getattr else node.args[1:] == ("imag",)
            base = val(node.args[0]) if isinstance(node.args[0], Node) else None
            if not imag or not isinstance(base, torch.Tensor) or not base.is_complex():
                continue
        users = [u for u in node.users if u.op != "output"
                 and not (u.op == "call_method" and u.target == "resolve_neg")]
        if not users:
            continue
        with graph.inserting_after(node):
            resolved = graph.call_method("resolve_neg", (node,), name=f"{node.name}_resolved")
        resolved.meta = dict(node.meta)
        for user in users:
            user.replace_input_with(node, resolved)
        changed = True
    return changed


def _splits_with_sizes(graph: Graph) -> bool:
    """``x.split(n, dim)`` and ``torch.split(x, n, dim)`` of a static size as
    ``x.split_with_sizes([n, n, ...], dim)``: the same views, by torch's C binding where
    ``Tensor.split`` and ``torch.split`` are Python functions that call it (9.6 µs a call
    against 3.5 µs; two a GPT-2 block)."""
    changed = False
    for node in graph.nodes:
        if not (node.op == "call_method" and node.target == "split"
                or node.op == "call_function" and node.target is torch.split):
            continue
        try:
            x, size, dim = _split_args(*node.args, **node.kwargs)
        except TypeError:
            continue
        if not is_tensor(x) or type(size) is not int or size <= 0 or type(dim) is not int \
                or val(x).requires_grad:
            continue  # (a graph that computes gradients keeps its ops as written)
        shape = val(x).shape
        if not -len(shape) <= dim < len(shape) or type(shape[dim]) is not int:
            continue
        n = shape[dim]
        sizes = [size] * (n // size) + ([n % size] if n % size else [])
        if not sizes:
            continue  # a 0-size dimension: torch.split's one empty piece
        node.op, node.target = "call_method", "split_with_sizes"
        node.args, node.kwargs = (x, sizes, dim), {}
        changed = True
    return changed


def _split_args(tensor, split_size_or_sections, dim=0):
    return tensor, split_size_or_sections, dim


def _operands(*xs: Any) -> bool:
    """Each a tensor node or a Python number, and at least one a tensor node."""
    return all(is_tensor(x) or is_number(x) for x in xs) and any(is_tensor(x) for x in xs)


# --------------------------------------------------------------------------------------------
# arithmetic


def _scaled(b: Builder, c: Any, alpha: Any) -> Node | None:
    """``alpha * c`` for add/sub/rsub's ``alpha=``, as eager computes it: in the result's dtype,
    not ``c``'s own (an int8 ``c`` added to an int64 tensor is multiplied in int64, where int8
    would wrap), ``c`` itself for an ``alpha`` of 1. None where eager raises (a bool ``alpha``
    for a non-bool result, a float one for an integer result, one out of the result dtype's
    range), so that torch raises it, or where ``c`` is a number (Python would compute the
    product, not torch)."""
    out = b.out.dtype
    if not is_number(alpha) or type(alpha) is bool or out == torch.bool or out.is_complex:
        return c if type(alpha) is int and alpha == 1 else None
    if type(alpha) is float and not out.is_floating_point:
        return None
    if alpha == 1:
        return c
    if not is_tensor(c) or not number_fits(alpha, out):
        return None
    return b.mul(b.convert(c, out), alpha)


def _scaled_in_fp32(b: Builder, op: Any, a: Any, c: Any, alpha: Any) -> Node | None:
    """``a <op> alpha * c`` (add or sub) for a fp16/bf16 result, as eager computes it: the
    operands in the result's dtype, then ``a + alpha * c`` in fp32, rounded once. Eager's CPU
    kernel takes ``alpha`` in the result's dtype too, as it converts every number that add
    reads; its CUDA kernel takes it as given."""
    out = b.out.dtype
    if type(alpha) is bool or not number_fits(alpha, out):
        return None
    if on_cpu(b.node):
        alpha = torch.tensor(alpha, dtype=out).item()
        if is_number(a):
            a = torch.tensor(a, dtype=out).item()

    def wide(x):
        return b.convert(b.convert(x, out, rounds=True), torch.float32)

    scaled = b.mul(wide(c), alpha)
    if is_tensor(a):
        result = b(op, wide(a), scaled)
    elif op is aten.add.Tensor:
        result = b.add(scaled, a)
    else:
        result = b.add(b.unary("neg", scaled), a)  # s - x == (-x) + s exactly
    return b.convert(result, out, rounds=True)


def _arith(b: Builder, op: Any, a: Any, c: Any, alpha: Any = 1) -> Node | None:
    """``a <op> alpha * c`` with a tensor first. ``op`` is add/sub/mul/div .Tensor."""
    if not _operands(a, c) or not is_number(alpha):
        return None
    if alpha != 1 and is_tensor(c) and b.out.dtype in (torch.float16, torch.bfloat16):
        return _scaled_in_fp32(b, op, a, c, alpha)
    c = _scaled(b, c, alpha)
    if c is None:
        return None
    if is_tensor(a):
        return b(op, a, c)
    # A number first: put the tensor first without changing a single bit of the result.
    if op in (aten.add.Tensor, aten.mul.Tensor):
        return b(op, c, a)  # IEEE addition and multiplication commute exactly
    if op is aten.sub.Tensor:
        # s - x == (-x) + s exactly for floats; integer negation can wrap, so ints stay in torch.
        if not is_float_tensor(c):
            return None
        return b.add(b.unary("neg", c), a)
    if op is aten.div.Tensor:
        # What eager's Tensor.__rtruediv__ itself computes: x.reciprocal() * s.
        return b.mul(b.unary("reciprocal", c), a)
    return None


@_pointwise(operator.add, torch.add, "add", "__add__")
def _add(b, input, other, *, alpha=1):
    return _arith(b, aten.add.Tensor, input, other, alpha)


@_pointwise("__radd__")
def _radd(b, input, other):
    return _arith(b, aten.add.Tensor, other, input)


@_pointwise(operator.sub, torch.sub, torch.subtract, "sub", "subtract", "__sub__")
def _sub(b, input, other, *, alpha=1):
    return _arith(b, aten.sub.Tensor, input, other, alpha)


@_pointwise("__rsub__")
def _rsub_method(b, input, other):
    return _arith(b, aten.sub.Tensor, other, input)


@_pointwise(torch.rsub)
def _rsub(b, input, other, *, alpha=1):
    # torch.rsub(x, y, alpha) == y - alpha * x
    if not is_number(alpha) or not _operands(input, other):
        return None
    if alpha != 1 and is_tensor(input) and b.out.dtype in (torch.float16, torch.bfloat16):
        return _scaled_in_fp32(b, aten.sub.Tensor, other, input, alpha)
    input = _scaled(b, input, alpha)
    if input is None:
        return None
    return _arith(b, aten.sub.Tensor, other, input)


@_pointwise(operator.mul, torch.mul, torch.multiply, "mul", "multiply", "__mul__", "__rmul__")
def _mul(b, input, other):
    return _arith(b, aten.mul.Tensor, input, other)


@_pointwise(operator.truediv, torch.true_divide, "true_divide", "__truediv__", "__div__")
def _truediv(b, input, other):
    return _arith(b, aten.div.Tensor, input, other)


@_pointwise(torch.div, torch.divide, "div", "divide")
def _div(b, input, other, *, rounding_mode=None):
    if rounding_mode is not None:
        return None  # floor/trunc division stays in torch
    return _arith(b, aten.div.Tensor, input, other)


@_pointwise("__rtruediv__", "__rdiv__")
def _rtruediv(b, input, other):
    return _arith(b, aten.div.Tensor, other, input)


@_pointwise(operator.pow, torch.pow, "pow", "__pow__")
def _pow(b, input, exponent):
    if is_tensor(input) and type(exponent) in (int, float):
        return b(aten.pow.Tensor_Scalar, input, exponent)
    return None  # a tensor exponent or a number base stays in torch


@_pointwise(torch.maximum, "maximum")
def _maximum(b, input, other):
    return b(aten.maximum.default, input, other) if is_tensor(input) and is_tensor(other) else None


@_pointwise(torch.minimum, "minimum")
def _minimum(b, input, other):
    return b(aten.minimum.default, input, other) if is_tensor(input) and is_tensor(other) else None


def _max_or_min(b: Builder, input: Any, args: tuple, kwargs: dict, pairwise: Any, full: Any):
    """torch.max/min: no other argument is a full reduction; one tensor is pairwise; a dim
    (values and indices) stays in torch."""
    if not is_tensor(input):
        return None
    if not args and not kwargs:
        dims = normalize_dims(val(input).dim(), None)
        if dims is None:
            return None
        return b.finish_reduction(b(full, input, dims, True), dims, keepdim=False)
    other = args[0] if len(args) == 1 and not kwargs else kwargs.get("other")
    if is_tensor(other) and len(args) + len(kwargs) == 1:
        return b(pairwise, input, other)
    return None


@RULES.register(torch.max, "max")
def _max(b, input, *args, **kwargs):
    return _max_or_min(b, input, args, kwargs, aten.maximum.default, aten.amax.default)


@RULES.register(torch.min, "min")
def _min(b, input, *args, **kwargs):
    return _max_or_min(b, input, args, kwargs, aten.minimum.default, aten.amin.default)


# --------------------------------------------------------------------------------------------
# comparisons and logic

_SWAPPED = {"eq": "eq", "ne": "ne", "lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}


def _comparison(name: str):
    def compare(b, input, other):
        if not _operands(input, other):
            return None
        if is_tensor(input) and is_tensor(other):
            return b(getattr(aten, name).Tensor, input, other)
        if is_tensor(input):
            return b(getattr(aten, name).Scalar, input, other)
        # `2 < x` is `x > 2`: exact, comparisons have no rounding.
        return b(getattr(aten, _SWAPPED[name]).Scalar, other, input)

    compare.__name__ = f"_{name}"
    return compare


_COMPARISON_ALIASES = {
    "eq": (),
    "ne": ("not_equal",),
    "lt": ("less",),
    "le": ("less_equal",),
    "gt": ("greater",),
    "ge": ("greater_equal",),
}
for _name, _aliases in _COMPARISON_ALIASES.items():
    _targets: list[Any] = [getattr(operator, _name), getattr(torch, _name), _name, f"__{_name}__"]
    for _alias in _aliases:
        _targets += [getattr(torch, _alias), _alias]
    _pointwise(*_targets)(_comparison(_name))


def _both_tensors(input: Any, other: Any) -> bool:
    return is_tensor(input) and is_tensor(other)


def _both_bool(input: Any, other: Any) -> bool:
    return _both_tensors(input, other) and val(input).dtype == val(other).dtype == torch.bool


@_pointwise(torch.logical_and, "logical_and")
def _logical_and(b, input, other):
    return b(aten.logical_and.default, input, other) if _both_tensors(input, other) else None


@_pointwise(torch.logical_or, "logical_or")
def _logical_or(b, input, other):
    return b(aten.logical_or.default, input, other) if _both_tensors(input, other) else None


@_pointwise(operator.and_, "__and__")
def _bool_and(b, input, other):
    # `a & b` on bool tensors is logical and; on integers it is bitwise and stays in torch.
    return b(aten.logical_and.default, input, other) if _both_bool(input, other) else None


@_pointwise(operator.or_, "__or__")
def _bool_or(b, input, other):
    return b(aten.logical_or.default, input, other) if _both_bool(input, other) else None


@_pointwise(operator.invert, torch.bitwise_not, "bitwise_not", "__invert__")
def _bool_not(b, input):
    if is_tensor(input) and val(input).dtype == torch.bool:
        return b.unary("logical_not", input)
    return None


# --------------------------------------------------------------------------------------------
# unary functions

_UNARY_ALIASES: dict[str, tuple[Any, ...]] = {
    "neg": (operator.neg, torch.negative, "negative", "__neg__"),
    "abs": (operator.abs, torch.absolute, "absolute", "__abs__"),
    "exp": (),
    "log": (),
    "log1p": (torch.special.log1p,),
    "expm1": (torch.special.expm1,),
    "sqrt": (),
    "rsqrt": (),
    "reciprocal": (),
    "sin": (),
    "cos": (),
    "tanh": (F.tanh,),
    "sigmoid": (F.sigmoid, torch.special.expit),
    "erf": (torch.special.erf,),
    "relu": (),
    "floor": (),
    "ceil": (),
    "sign": (),
    "logical_not": (),
    "isnan": (),
}


def _unary(name: str):
    def unary(b, input):
        return b.unary(name, input) if is_tensor(input) else None

    unary.__name__ = f"_{name}"
    return unary


for _name, _aliases in _UNARY_ALIASES.items():
    _pointwise(getattr(torch, _name), _name, *_aliases)(_unary(_name))


@_pointwise(F.relu)
def _f_relu(b, input, inplace=False):
    return b.unary("relu", input) if is_tensor(input) and inplace is False else None


# --------------------------------------------------------------------------------------------
# where and clamp


@_pointwise(torch.where)
def _where(b, condition, input, other):
    if not (is_tensor(condition) and val(condition).dtype == torch.bool):
        return None
    if not (is_tensor(input) or is_number(input)) or not (is_tensor(other) or is_number(other)):
        return None
    # A number is converted to the result's dtype as eager checks it (int8 and 1000 raises).
    if any(is_number(v) and not number_fits(v, b.out.dtype) for v in (input, other)):
        return None
    # aten's where.self takes tensors only; the other overloads take the numbers.
    if is_tensor(input) and is_tensor(other):
        return b(aten.where.self, condition, input, other)
    if is_tensor(input):
        return b(aten.where.ScalarOther, condition, input, other)
    if is_tensor(other):
        return b(aten.where.ScalarSelf, condition, input, other)
    return b(aten.where.Scalar, condition, input, other)


@_pointwise("where")
def _where_method(b, input, condition, other):
    return _where(b, condition, input, other)


@_pointwise(torch.masked_fill, "masked_fill")
def _masked_fill(b, input, mask, value):
    # where(mask, value, input) in input's dtype: a float value into an integer tensor would
    # promote, so integer and bool tensors take only numbers of their own kind.
    if not (is_tensor(input) and is_tensor(mask) and val(mask).dtype == torch.bool):
        return None
    dtype = val(input).dtype
    if type(value) not in (int, float, bool) or val(input).dim() < val(mask).dim():
        return None
    if dtype == torch.bool and type(value) is not bool:
        return None
    if not (dtype.is_floating_point or dtype.is_complex) and type(value) is float:
        return None
    if not number_fits(value, dtype):
        return None  # eager raises: the value does not fit the tensor's dtype
    return b.convert(b(aten.where.ScalarSelf, mask, value, input), dtype)


def _bound(x: Any) -> bool:
    return x is None or type(x) in (int, float)


@_pointwise(torch.clamp, torch.clip, "clamp", "clip")
def _clamp(b, input, min=None, max=None):  # noqa: A002 - torch's parameter names
    if not is_tensor(input) or not _bound(min) or not _bound(max) or (min is None and max is None):
        return None  # tensor bounds stay in torch
    if not all(bound is None or number_fits(bound, b.out.dtype) for bound in (min, max)):
        return None  # eager raises: a bound does not fit the result's dtype
    return b(aten.clamp.default, input, min, max)


@_pointwise(torch.clamp_min, "clamp_min")
def _clamp_min(b, input, min):  # noqa: A002
    return _clamp(b, input, min, None)


@_pointwise(torch.clamp_max, "clamp_max")
def _clamp_max(b, input, max):  # noqa: A002
    return _clamp(b, input, None, max)


# --------------------------------------------------------------------------------------------
# conversions and copies


def _to_dtype(b: Builder, input: Any, dtype: Any) -> Node | None:
    """A pure dtype change. Torch returns the input itself when the dtype already matches."""
    if not is_tensor(input) or not isinstance(dtype, torch.dtype):
        return None
    return b.convert(input, dtype, rounds=True)


def _dtype_method(dtype: torch.dtype):
    def convert(b, input, memory_format=torch.preserve_format):
        if memory_format is not torch.preserve_format:
            return None
        return _to_dtype(b, input, dtype)

    convert.__name__ = f"_to_{dtype}".replace("torch.", "")
    return convert


for _method, _dtype in {
    "float": torch.float32,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "double": torch.float64,
    "long": torch.int64,
    "int": torch.int32,
    "short": torch.int16,
    "bool": torch.bool,
}.items():
    _pointwise(_method)(_dtype_method(_dtype))


@_pointwise("to")
def _to(b, input, *args, **kwargs):
    """``x.to(dtype)``, ``x.to(device, dtype)``, ``x.to(dtype=..)``: only a dtype change on the
    same device without copy=True or a memory format; everything else stays in torch."""
    device = kwargs.pop("device", None)
    dtype = kwargs.pop("dtype", None)
    non_blocking = kwargs.pop("non_blocking", False)
    copy = kwargs.pop("copy", False)
    memory_format = kwargs.pop("memory_format", torch.preserve_format)
    if kwargs:
        return None
    rest = list(args)
    if rest and isinstance(rest[0], (str, torch.device)):
        if device is not None:
            return None
        device = rest.pop(0)
    if rest and isinstance(rest[0], torch.dtype):
        if dtype is not None:
            return None
        dtype = rest.pop(0)
    if rest and type(rest[0]) is bool:
        non_blocking = rest.pop(0)
    if rest and type(rest[0]) is bool:
        copy = rest.pop(0)
    if rest or type(non_blocking) is not bool or copy is not False:
        return None
    if memory_format is not torch.preserve_format:
        return None
    if device is not None:
        try:
            if torch.device(device) != b.node.meta["device"]:
                return None
        except (RuntimeError, TypeError):
            return None
        if dtype is None and is_tensor(input):
            return input  # x.to(its own device) is x itself
    return _to_dtype(b, input, dtype)


@_pointwise("type")
def _type(b, input, dtype=None, non_blocking=False):
    # x.type(torch.float16); a type string ("torch.cuda.HalfTensor") may change the device.
    return _to_dtype(b, input, dtype) if isinstance(dtype, torch.dtype) else None


@_pointwise("type_as")
def _type_as(b, input, other):
    # x.type_as(y) is x.type(y.type()): the type string carries y's device.
    if not (is_tensor(input) and is_tensor(other)):
        return None
    if other.meta.get("device") != b.node.meta["device"]:
        return None
    return _to_dtype(b, input, val(other).dtype)


@_pointwise("contiguous")
def _contiguous(b, input, memory_format=torch.contiguous_format):
    if not is_tensor(input) or memory_format is not torch.contiguous_format:
        return None
    if val(input).is_contiguous():
        if not layout_is_exact(input):
            return None  # only the real tensor knows: torch decides at run time
        return input  # torch returns the tensor itself
    return b(aten.clone.default, input, memory_format=torch.contiguous_format)


@_pointwise(torch.clone, "clone")
def _clone(b, input, *, memory_format=torch.preserve_format):
    if not is_tensor(input) or not isinstance(memory_format, torch.memory_format):
        return None
    return b(aten.clone.default, input, memory_format=memory_format)


# --------------------------------------------------------------------------------------------
# reductions


@RULES.register(torch.sum, "sum")
def _sum(b, input, dim=None, keepdim=False, *, dtype=None):
    if not is_tensor(input) or type(keepdim) is not bool:
        return None
    dims = normalize_dims(val(input).dim(), dim)
    if dims is None or not b.out.dtype.is_floating_point:
        return None  # integer and bool sums (int64 results) stay in torch
    if dtype is not None:
        if not isinstance(dtype, torch.dtype):
            return None
        input = b.convert(input, dtype, rounds=True)
    # fp16/bf16 sums accumulate in fp32, like eager.
    x = b.convert(input, compute_dtype(b.out.dtype))
    return b.finish_reduction(b.sum(x, dims), dims, keepdim)


def _extremum(op: Any):
    def reduce(b, input, dim=(), keepdim=False):
        if not is_tensor(input) or type(keepdim) is not bool:
            return None
        dims = normalize_dims(val(input).dim(), dim, empty_means_all=True)
        if dims is None:
            return None
        return b.finish_reduction(b(op, input, dims, True), dims, keepdim)

    return reduce


RULES.register(torch.amax, "amax")(_extremum(aten.amax.default))
RULES.register(torch.amin, "amin")(_extremum(aten.amin.default))


def _arg_extremum(op: Any):
    def reduce(b, input, dim=None, keepdim=False):
        # Without a dim torch returns the index into the flattened tensor: left to torch.
        if not is_tensor(input) or type(dim) is not int or type(keepdim) is not bool:
            return None
        dims = normalize_dims(val(input).dim(), dim)
        if dims is None:
            return None
        r = b(op, input, dims[0], True)
        return r if keepdim else b.squeeze(r, dims)

    return reduce


RULES.register(torch.argmax, "argmax")(_arg_extremum(aten.argmax.default))
RULES.register(torch.argmin, "argmin")(_arg_extremum(aten.argmin.default))


# --------------------------------------------------------------------------------------------
# concatenation


@RULES.register(torch.cat, torch.concat, torch.concatenate, aten.cat.default)
def _cat(b, tensors, dim=0, *, axis=None):
    """A concatenation with empty inputs joins the others alone; one left is a copy of it. A
    key/value cache's first update concatenates its empty start with the new keys
    (``torch.cat([empty, k], dim=-2)`` in every transformers decoder layer), which stayed a torch
    call: the kernels take no empty inputs. The copy is a pointwise clone the kernel computing
    the keys writes. Where an empty input decides the result's dtype, nothing changes (the
    replacement's dtype would differ)."""
    if axis is not None:
        dim = axis
    if not isinstance(tensors, (list, tuple)) or type(dim) is not int \
            or not all(is_tensor(t) for t in tensors):
        return None
    kept = [t for t in tensors if val(t).numel() > 0]
    if len(kept) == len(tensors) or not kept:
        return None
    if len(kept) > 1:
        return b(aten.cat.default, kept, dim)
    out = b.out
    fmt = torch.contiguous_format if out.is_contiguous() else torch.preserve_format
    return b(aten.clone.default, kept[0], memory_format=fmt)


# --------------------------------------------------------------------------------------------
# in-place arithmetic on a result nothing else reads

#: Ops whose result is new memory that only the graph holds (a view of it never exists unless
#: the graph makes one, which would be a user of the node).
_FRESH_RESULTS = frozenset({
    aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default,
    aten.matmul.default, torch.matmul, torch.mm, torch.bmm, torch.addmm,
    torch.nn.functional.linear, torch.conv2d, torch.nn.functional.conv2d,
    operator.matmul, "matmul", "mm", "bmm", "__matmul__",
})

_INPLACE_ARITH = {
    operator.iadd: aten.add.Tensor, "add_": aten.add.Tensor, "__iadd__": aten.add.Tensor,
    operator.isub: aten.sub.Tensor, "sub_": aten.sub.Tensor, "__isub__": aten.sub.Tensor,
    operator.imul: aten.mul.Tensor, "mul_": aten.mul.Tensor, "__imul__": aten.mul.Tensor,
    operator.itruediv: aten.div.Tensor, "div_": aten.div.Tensor, "__itruediv__": aten.div.Tensor,
}


def _only_read_here(x: Any, node: Node) -> bool:
    """``x`` is new memory (a matmul's or convolution's result, or one of the vocabulary's
    pointwise ops and reductions) that ``node`` alone uses."""
    if not isinstance(x, Node) or x.op not in ("call_function", "call_method") \
            or set(x.users) != {node} or x.is_impure():
        return False  # (an op with ``out=`` returns the caller's tensor)
    try:
        return x.target in _FRESH_RESULTS or (x.target in VOCABULARY and not x.is_impure())
    except TypeError:  # an unhashable target
        return False


@RULES.register(*_INPLACE_ARITH)
def _inplace_on_a_dead_result(b, input, other, *, alpha=1):
    """``a += c`` where ``a`` is a matmul's result read nowhere else (a parallel block's
    ``attn_out += mlp_out``, Falcon, GPT-J): no one can see ``a`` change, so it is ``a + c``
    in ``a``'s dtype, a pointwise op the next kernel takes as a prologue. An in-place op stays
    one otherwise."""
    if not _operands(input, other) or not is_tensor(input) or not _only_read_here(input, b.node):
        return None
    # Eager refuses a result it cannot cast back (an int64 `y *= 1.5`), where torch's meta
    # kernel of mul_ does not: the op stays, so that it raises as eager does.
    dtype = val(input).dtype
    if not torch.can_cast(torch.result_type(val(input), val(other) if is_tensor(other) else other),
                          dtype):
        return None
    r = _arith(b, _INPLACE_ARITH[b.node.target], input, other, alpha)
    return None if r is None else b.convert(r, dtype)
