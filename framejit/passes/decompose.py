"""``decompose(graph)``: composite ops (softmax, layer_norm, gelu, batch_norm, dropout, mean,
var, ...) become the vocabulary's pointwise ops and keepdim reductions.

fp16/bf16 inputs are converted to fp32 first and the result back to the node's dtype at the
end, as eager computes them. Each decomposition follows eager's math; nodes whose value requires
grad keep their composite op (autograd needs it), and any call whose form is unusual (an
implicit softmax dim, batch_norm with cumulative momentum, in-place dropout) is left alone.

Example::

    decompose(graph)   # F.softmax(%x, dim=-1) -> amax, sub, exp, sum, div
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..fx_ir import Graph, Node, cpu_sdpa_choice, on_cpu
from . import normalize as _normalize
from .symbolic import SYMBOLIC
from .util import (
    Builder,
    RuleTable,
    apply_rules,
    is_float_tensor,
    is_number,
    is_tensor,
    normalize_dims,
    val,
)
from .vocabulary import POINTWISE

aten = torch.ops.aten
F = torch.nn.functional

RULES = RuleTable()

# The plain activations are one vocabulary op each; normalize's rules map them.
for _target in (F.relu, F.sigmoid, F.tanh, torch.sigmoid, torch.tanh, torch.relu):
    RULES.add([_target], _normalize.RULES.rules[_target])


def decompose(graph: Graph) -> bool:
    """Decompose composite ops into the vocabulary; returns whether anything changed."""
    return apply_rules(graph, RULES)


def _on_cpu(b: Builder) -> bool:
    """Whether the node being replaced computes on CPU tensors."""
    return on_cpu(b.node)


def _optional_tensor(x: Any) -> bool:
    return x is None or is_tensor(x)


# --------------------------------------------------------------------------------------------
# softmax


def _softmax(b: Builder, input: Any, dim: Any, dtype: Any, log: bool) -> Node | None:
    if not is_float_tensor(input) or type(dim) is not int:
        return None  # dim=None is softmax's deprecated implicit dim: left to torch
    if dtype is not None:
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            return None
        input = b.convert(input, dtype, rounds=True)
    shape = val(input).shape
    if not -len(shape) <= dim < len(shape) or shape[dim] == 0:
        return None
    dims = [dim % len(shape)]
    x = b.upcast(input)
    shifted = b.sub(x, b(aten.amax.default, x, dims, True))
    e = b.unary("exp", shifted)
    total = b.sum(e, dims)
    if log:
        r = b.sub(shifted, b.unary("log", total))
    elif _on_cpu(b):
        # As eager's CPU kernel computes it (exp * (1 / sum)), which also spares a kernel the
        # division per element (a bf16 softmax 1.08x faster); eager's CUDA kernel divides.
        r = b.mul(e, b.unary("reciprocal", total))
    else:
        r = b.div(e, total)
    return b.convert(r, b.out.dtype)


@RULES.register(F.softmax)
def _f_softmax(b, input, dim=None, _stacklevel=3, dtype=None):
    return _softmax(b, input, dim, dtype, log=False)


@RULES.register(torch.softmax, torch.special.softmax, "softmax")
def _torch_softmax(b, input, dim, dtype=None):
    return _softmax(b, input, dim, dtype, log=False)


@RULES.register(F.log_softmax)
def _f_log_softmax(b, input, dim=None, _stacklevel=3, dtype=None):
    return _softmax(b, input, dim, dtype, log=True)


@RULES.register(torch.log_softmax, torch.special.log_softmax, "log_softmax")
def _torch_log_softmax(b, input, dim, dtype=None):
    return _softmax(b, input, dim, dtype, log=True)


# --------------------------------------------------------------------------------------------
# attention


@RULES.register(F.scaled_dot_product_attention, aten.scaled_dot_product_attention.default)
def _sdpa(b, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
          enable_gqa=False):
    """Attention that torch computes by its math path on CPU (a key and value with fewer heads
    than the query, Falcon's multi-query attention; a mask the flash kernel does not take), as
    that path does: the query and the transposed key each scaled by sqrt(scale), a matmul, the
    mask added, a softmax whose fully masked rows are 0 (``_safe_softmax``), a matmul. Eager
    runs that softmax as six separate ops; here it is one kernel. Where torch picks its flash
    kernel the call stays. fp32, no dropout, no causal flag, no grouped-query flag."""
    if not all(is_tensor(t) and val(t).dtype == torch.float32 and val(t).dim() == 4
               for t in (query, key, value)):
        return None
    if dropout_p != 0 or is_causal is not False or enable_gqa is not False:
        return None
    if scale is not None and not (is_number(scale) and scale > 0):
        return None
    if attn_mask is not None and not (is_tensor(attn_mask) and val(attn_mask).dtype in (
            torch.float32, torch.bool)):
        return None
    if not _on_cpu(b) or SYMBOLIC.get():
        return None
    choice = cpu_sdpa_choice(val(query), val(key), val(value),
                             None if attn_mask is None else val(attn_mask), 0.0, False, scale)
    if choice != torch.nn.attention.SDPBackend.MATH.value:
        return None
    factor = math.sqrt(scale if scale is not None else 1.0 / math.sqrt(val(query).shape[-1]))
    scores = b(aten.matmul.default, b.mul(query, factor),
               b.mul(b(aten.transpose.int, key, -2, -1), factor))
    if attn_mask is not None:
        if val(attn_mask).dtype == torch.bool:
            attn_mask = b(aten.where.Scalar, attn_mask, 0.0, float("-inf"))
        scores = b.add(scores, attn_mask)
    last = [val(scores).dim() - 1]
    top = b(aten.amax.default, scores, last, True)
    e = b.unary("exp", b.sub(scores, top))
    weights = b.div(e, b.sum(e, last))
    weights = b(aten.where.ScalarSelf, b(aten.eq.Scalar, top, float("-inf")), 0.0, weights)
    return b(aten.matmul.default, weights, value)


# --------------------------------------------------------------------------------------------
# normalizations


def _trailing_dims(x: Node, normalized_shape: Any) -> list[int] | None:
    """The dims that ``normalized_shape`` names (the last ones), if it matches x's shape."""
    if type(normalized_shape) is int:
        normalized_shape = (normalized_shape,)
    if not isinstance(normalized_shape, (list, tuple)) or not normalized_shape:
        return None
    if not all(type(s) is int for s in normalized_shape):
        return None
    shape = tuple(val(x).shape)
    k = len(normalized_shape)
    if k > len(shape) or shape[len(shape) - k :] != tuple(normalized_shape):
        return None
    if math.prod(normalized_shape) == 0:
        return None
    return list(range(len(shape) - k, len(shape)))


def _affine(b: Builder, r: Node, weight: Any, bias: Any) -> Node:
    if weight is not None:
        r = b.mul(r, b.upcast(weight))
    if bias is not None:
        r = b.add(r, b.upcast(bias))
    return r


def _parameters_in_eager_s_dtypes(b: Builder, input: Node, params: tuple, *, cuda_mixed: bool
                                  ) -> bool:
    """Whether eager's kernel takes these parameters (weights, biases, running statistics) with
    ``input``: each of ``input``'s dtype, or fp32 for an fp16/bf16 input (the mixed mode of the
    CPU kernels, and of CUDA's where ``cuda_mixed``). Eager raises for others (an fp32 input
    with fp16 weights: "mixed dtype (CPU)"), so those ops stay in torch and raise as well."""
    dtype = val(input).dtype
    mixed_ok = dtype in (torch.float16, torch.bfloat16) and (cuda_mixed or _on_cpu(b))
    return all(p is None or val(p).dtype == dtype or mixed_ok and val(p).dtype == torch.float32
               for p in params)


def _centered_moments(b: Builder, x: Node, dims: list[int]) -> tuple[Node, Node, Node, Node]:
    """(x less its mean, the variance, sum(x)/n, its correction c) over ``dims`` (the mean is
    sum(x)/n + c), by the corrected two-pass algorithm: d = x - sum(x)/n leaves the mean's
    rounding in every value (a row of equal values centered to an ulp of them, which a layer
    norm's rsqrt(eps) made 5e-4 where eager's Welford moments give 0), so the pass that sums
    d*d sums d too, and its mean c is taken off: d - c, and the variance sum(d*d)/n - c*c. The
    same passes as before, one more sum in the second."""
    mean = b.mean(x, dims)
    d = b.sub(x, mean)
    c = b.mean(d, dims)
    var = b.sub(b.mean(b.mul(d, d), dims), b.mul(c, c))
    return b.sub(d, c), var, mean, c


def _layer_norm(b: Builder, input, normalized_shape, weight, bias, eps) -> Node | None:
    if not is_float_tensor(input) or type(eps) not in (int, float):
        return None
    if not (_optional_tensor(weight) and _optional_tensor(bias)):
        return None
    if not _parameters_in_eager_s_dtypes(b, input, (weight, bias), cuda_mixed=False):
        return None
    dims = _trailing_dims(input, normalized_shape)
    if dims is None:
        return None
    x = b.upcast(input)
    d, var, _, _ = _centered_moments(b, x, dims)
    r = b.mul(d, b.unary("rsqrt", b.add(var, eps)))
    return b.convert(_affine(b, r, weight, bias), b.out.dtype)


@RULES.register(F.layer_norm)
def _f_layer_norm(b, input, normalized_shape, weight=None, bias=None, eps=1e-5):
    return _layer_norm(b, input, normalized_shape, weight, bias, eps)


@RULES.register(torch.layer_norm)
def _torch_layer_norm(
    b, input, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True
):
    return _layer_norm(b, input, normalized_shape, weight, bias, eps)


@RULES.register(getattr(F, "rms_norm", None), getattr(torch, "rms_norm", None))
def _rms_norm(b, input, normalized_shape, weight=None, eps=None):
    if not is_float_tensor(input) or not (eps is None or type(eps) in (int, float)):
        return None
    if weight is not None and not (is_tensor(weight) and val(weight).dtype == val(input).dtype):
        return None  # eager takes another code path for a weight of another dtype
    dims = _trailing_dims(input, normalized_shape)
    if dims is None:
        return None
    x = b.upcast(input)
    if eps is None:
        # Eager's default is the epsilon of the dtype it computes in (fp32 for fp16/bf16).
        eps = torch.finfo(val(x).dtype).eps
    r = b.mul(x, b.unary("rsqrt", b.add(b.mean(b.mul(x, x), dims), eps)))
    return b.convert(_affine(b, r, weight, None), b.out.dtype)


def _channel_view(b: Builder, t: Node, ndim: int) -> Node:
    """A [C] tensor viewed as [C, 1, ...] so it broadcasts over dim 1 of an ndim input."""
    c = val(t).shape[0]
    return b.view(b.upcast(t), [c] + [1] * (ndim - 2))


def _batch_norm(
    b: Builder, input, running_mean, running_var, weight, bias, training, momentum, eps
) -> Node | None:
    if not is_float_tensor(input) or val(input).dim() < 2:
        return None
    if type(training) is not bool or type(eps) not in (int, float):
        return None
    if type(momentum) not in (int, float):
        return None  # momentum=None is a cumulative average: left to torch
    x_val = val(input)
    channels = x_val.shape[1]
    for t in (running_mean, running_var, weight, bias):
        if t is not None and not (is_tensor(t) and tuple(val(t).shape) == (channels,)):
            return None
    if (running_mean is None) != (running_var is None):
        return None
    if not _parameters_in_eager_s_dtypes(b, input, (running_mean, running_var, weight, bias),
                                         cuda_mixed=True):
        return None
    ndim = x_val.dim()
    x = b.upcast(input)
    if not training:
        if running_mean is None:
            return None
        d = b.sub(x, _channel_view(b, running_mean, ndim))
        r = b.mul(d, b.unary("rsqrt", b.add(_channel_view(b, running_var, ndim), eps)))
    else:
        dims = [0] + list(range(2, ndim))
        n = x_val.numel() // channels if channels else 0
        if n <= 1 or (running_mean is not None and SYMBOLIC.get()):
            # n <= 1: eager raises "Expected more than 1 value per channel"; with symbolic
            # sizes, the running variance's n / (n - 1) is a size: left to torch.
            return None
        d, var, mean, c = _centered_moments(b, x, dims)
        r = b.mul(d, b.unary("rsqrt", b.add(var, eps)))
        if running_mean is not None:
            mean = b.add(mean, c)
            _update_running_stat(b, running_mean, b.view(mean, [channels]), momentum)
            unbiased = b.mul(b.view(var, [channels]), n / (n - 1))
            _update_running_stat(b, running_var, unbiased, momentum)
    if weight is not None:
        r = b.mul(r, _channel_view(b, weight, ndim))
    if bias is not None:
        r = b.add(r, _channel_view(b, bias, ndim))
    return b.convert(r, b.out.dtype)


def _update_running_stat(b: Builder, stat: Node, batch: Node, momentum: float) -> None:
    """stat <- (1 - momentum) * stat + momentum * batch, in place like eager; the copy_ node is
    impure, so DCE keeps it."""
    new = b.add(b.mul(b.upcast(stat), 1 - momentum), b.mul(batch, momentum))
    b(aten.copy_.default, stat, b.convert(new, val(stat).dtype))


@RULES.register(F.batch_norm)
def _f_batch_norm(
    b,
    input,
    running_mean,
    running_var,
    weight=None,
    bias=None,
    training=False,
    momentum=0.1,
    eps=1e-5,
):
    return _batch_norm(b, input, running_mean, running_var, weight, bias, training, momentum, eps)


@RULES.register(torch.batch_norm)
def _torch_batch_norm(
    b, input, weight, bias, running_mean, running_var, training, momentum, eps, cudnn_enabled
):
    return _batch_norm(b, input, running_mean, running_var, weight, bias, training, momentum, eps)


# --------------------------------------------------------------------------------------------
# pooling


def _pair(v: Any) -> tuple[int, int] | None:
    if type(v) is int:
        return (v, v)
    if isinstance(v, (tuple, list)) and len(v) in (1, 2) and all(type(i) is int for i in v):
        return (v[0], v[-1])
    return None


def _max_pool2d(b: Builder, input, kernel_size, stride, padding, dilation, ceil_mode) -> Node | None:
    """Max pooling without padding or dilation as a max over the last two dims of a windowed
    view (``unfold`` twice: a view for any layout, windows may overlap, a remainder is dropped
    as in floor mode). Eager's NCHW CPU kernel is several times slower than the reduction kernel
    this becomes. NaN wins, as in eager."""
    if not is_float_tensor(input) or ceil_mode is not False:
        return None
    k = _pair(kernel_size)
    s = k if stride is None or (isinstance(stride, (tuple, list)) and not stride) else _pair(stride)
    if k is None or s is None or _pair(padding) != (0, 0) or _pair(dilation) != (1, 1):
        return None
    shape = list(val(input).shape)
    nd = len(shape)
    if nd not in (3, 4) or 0 in shape or shape[-2] < k[0] or shape[-1] < k[1] or min(s) < 1:
        return None
    windows = b(aten.unfold.default, b(aten.unfold.default, input, nd - 2, k[0], s[0]),
                nd - 1, k[1], s[1])
    dims = [nd, nd + 1]
    return b.finish_reduction(b(aten.amax.default, windows, dims, True), dims, False)


@RULES.register(F.max_pool2d)
def _f_max_pool2d(b, input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
                  return_indices=False):
    if return_indices is not False:
        return None
    return _max_pool2d(b, input, kernel_size, stride, padding, dilation, ceil_mode)


@RULES.register(torch.max_pool2d)
def _torch_max_pool2d(b, input, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool2d(b, input, kernel_size, stride, padding, dilation, ceil_mode)


# --------------------------------------------------------------------------------------------
# activations and dropout

_SQRT_2_OVER_PI = 0.7978845608028654  # sqrt(2 / pi)


@RULES.register(F.gelu)
def _gelu(b, input, approximate="none"):
    if not is_float_tensor(input):
        return None
    if approximate not in ("none", "tanh"):
        return None
    x = b.upcast(input)
    if approximate == "none":
        # 0.5 * x * (1 + erf(x / sqrt(2))) stays one op: its erf needs only GELU's accuracy
        # (eager's CPU GELU approximates it), which a C kernel computes faster than torch.erf's.
        return b.convert(b.unary("gelu", x), b.out.dtype)
    # 0.5 * x * (1 + tanh(u)) with u = sqrt(2 / pi) * (x + 0.044715 * x^3), computed as the
    # equal x * sigmoid(2u) = x / (1 + exp(-2u)): one exp, cheaper than a tanh, and no
    # cancellation in 1 + tanh(u) for negative u (where eager's value keeps only a few bits).
    # The limits agree with eager's: x for large x, -0 for very negative x, NaN at -inf.
    cube = b.mul(b.mul(x, x), x)
    minus_2u = b.mul(b.add(x, b.mul(cube, 0.044715)), -2 * _SQRT_2_OVER_PI)
    return b.convert(b.div(x, b.add(b.unary("exp", minus_2u), 1.0)), b.out.dtype)


@RULES.register(F.silu)
def _silu(b, input, inplace=False):
    if not is_float_tensor(input) or inplace is not False:
        return None
    x = b.upcast(input)
    # x / (1 + exp(-x)), eager's own formula (CPU and CUDA): one rounding where x * sigmoid(x)
    # has two, and a division where that has a division and a multiply.
    return b.convert(b.div(x, b.add(b.unary("exp", b.unary("neg", x)), 1.0)), b.out.dtype)


def _dropout(b: Builder, input, p, training, inplace) -> Node | None:
    if not is_float_tensor(input) or inplace is not False or type(training) is not bool:
        return None
    if type(p) not in (int, float) or not 0 <= p <= 1:
        return None
    if not training or p == 0:
        return input  # eager returns the input tensor itself
    if p == 1:
        return None
    # Eager: noise = bernoulli(1 - p) / (1 - p) in x's dtype; out = x * noise (so NaN and inf
    # stay NaN where dropped, as in eager). keep = (u >= p) has probability 1 - p.
    keep = b(aten.ge.Scalar, b(aten.rand_like.default, input, dtype=torch.float32), p)
    noise = b.div(b.convert(keep, val(input).dtype), 1 - p)
    return b.mul(input, noise)


@RULES.register(F.dropout)
def _f_dropout(b, input, p=0.5, training=True, inplace=False):
    return _dropout(b, input, p, training, inplace)


@RULES.register(torch.dropout)
def _torch_dropout(b, input, p, train):
    return _dropout(b, input, p, train, False)


# --------------------------------------------------------------------------------------------
# mean, var, std


@RULES.register(torch.mean, "mean")
def _mean(b, input, dim=None, keepdim=False, *, dtype=None):
    if not is_tensor(input) or type(keepdim) is not bool or not b.out.dtype.is_floating_point:
        return None
    dims = normalize_dims(val(input).dim(), dim)
    if dims is None or math.prod(val(input).shape[d] for d in dims) == 0:
        return None
    if dtype is not None:
        if not isinstance(dtype, torch.dtype):
            return None
        if dtype in (torch.float16, torch.bfloat16) and _on_cpu(b):
            # eager's CPU mean sums in fp32 and rounds the mean once (its CUDA kernel converts
            # each element to the dtype first, as for every other dtype)
            dtype = torch.float32
        input = b.convert(input, dtype, rounds=True)
    x = b.upcast(input)
    return b.finish_reduction(b.mean(x, dims), dims, keepdim)


def _parse_var_args(args: tuple, kwargs: dict) -> tuple[Any, float, bool] | None:
    """(dim, correction, keepdim) of any torch.var/std call form, or None."""
    kwargs = dict(kwargs)
    dim = kwargs.pop("dim", None)
    unbiased = kwargs.pop("unbiased", None)
    correction = kwargs.pop("correction", None)
    keepdim = kwargs.pop("keepdim", False)
    if kwargs:
        return None
    rest = list(args)
    if rest and type(rest[0]) is bool:  # var(input, unbiased)
        unbiased = rest.pop(0)
    else:
        if rest:
            dim = rest.pop(0)
        if rest and type(rest[0]) is bool:  # var(input, dim, unbiased, keepdim)
            unbiased = rest.pop(0)
        if rest:
            keepdim = rest.pop(0)
    if rest or type(keepdim) is not bool:
        return None
    if unbiased is not None and correction is not None:
        return None
    if correction is None:
        correction = 0 if unbiased is False else 1
    elif type(correction) not in (int, float):
        return None
    return dim, correction, keepdim


def _var_or_std(b: Builder, input: Any, args: tuple, kwargs: dict, sqrt: bool) -> Node | None:
    parsed = _parse_var_args(args, kwargs)
    if parsed is None or not is_float_tensor(input):
        return None
    dim, correction, keepdim = parsed
    dims = normalize_dims(val(input).dim(), dim)
    if dims is None:
        return None
    n = math.prod(val(input).shape[d] for d in dims)
    if n - correction <= 0 or SYMBOLIC.get():
        return None  # (with symbolic sizes, n is a size: left to torch)
    x = b.upcast(input)
    d = b.sub(x, b.mean(x, dims))
    r = b.div(b.sum(b.mul(d, d), dims), n - correction)
    if sqrt:
        r = b.unary("sqrt", r)
    return b.finish_reduction(r, dims, keepdim)


@RULES.register(torch.var, "var")
def _var(b, input, *args, **kwargs):
    return _var_or_std(b, input, args, kwargs, sqrt=False)


@RULES.register(torch.std, "std")
def _std(b, input, *args, **kwargs):
    return _var_or_std(b, input, args, kwargs, sqrt=True)


# --------------------------------------------------------------------------------------------
# linear and addmm: only when the bias add can fuse with pointwise users

#: Composite ops that decompose into pointwise ops only.
_POINTWISE_COMPOSITES = frozenset({F.gelu, F.silu, F.relu, F.sigmoid, F.tanh})


def _is_pointwise_use(user: Node) -> bool:
    if user.op == "call_function":
        try:
            if user.target in POINTWISE or user.target in _POINTWISE_COMPOSITES:
                return True
        except TypeError:
            return False
    return _normalize.POINTWISE_RULES.lookup(user) is not None


def _only_pointwise_users(node: Node) -> bool:
    return bool(node.users) and all(_is_pointwise_use(u) for u in node.users)


@RULES.register(F.linear)
def _linear(b, input, weight, bias=None):
    if not (is_tensor(input) and is_tensor(weight) and is_tensor(bias)):
        return None  # without a bias there is nothing to fuse
    if val(input).dim() < 1 or val(weight).dim() != 2 or not _only_pointwise_users(b.node):
        return None
    return b.add(b(aten.matmul.default, input, b(aten.t.default, weight)), bias)


@RULES.register(torch.addmm, "addmm")
def _addmm(b, input, mat1, mat2, *, beta=1, alpha=1):
    if not (is_tensor(input) and is_tensor(mat1) and is_tensor(mat2)):
        return None
    if not (is_number(beta) and is_number(alpha) and beta == 1 and alpha == 1):
        return None
    if val(mat1).dim() != 2 or val(mat2).dim() != 2 or not _only_pointwise_users(b.node):
        return None
    return b.add(b(aten.mm.default, mat1, mat2), input)
