"""Example values: an operation's result computed without its data, in one place.

Capture records each torch operation as a graph node and needs the result's metadata (shape,
dtype, strides, requires_grad) to go on: :func:`example_result` computes it, by one of three
ways chosen here:

* with symbolic sizes (the capture has a ``shapes.ShapeContext``): on that context's fake
  tensors, whose dynamic sizes are SymInts; results stay fake, so the sizes they carry stay
  expressions of the inputs' sizes;
* under autocast: on fake tensors that report their real device, so that torch's own autocast
  rules pick the dtypes as in eager; results become plain meta tensors;
* otherwise: on meta tensors, by fx_ir's memoised :func:`~framejit.fx_ir.run_on_meta` (many
  meta kernels are Python reference implementations costing 10-500 µs a call).

Real tensors become examples through fx_ir's one real→meta conversion (:func:`meta_from_real`).
"""

from __future__ import annotations

import math
import re
import warnings

import torch

from ..errors import Unsupported
from ..fx_ir import (
    VIEW_NAMES,
    call_on_fake,
    clear_meta_memo,  # noqa: F401  (the one memo's clear, for framejit.reset())
    cpu_sdpa_choice,
    fresh_meta,
    map_aggregate,
    name_of,
    quiet_failed_meta_runs,
    run_on_meta,
    to_meta,
)
from .guards import any_autocast_enabled
from .shapes import DynamicShapeError


def example_result(tx, kind, target, args, kwargs, convert, meta_args: list, meta_kwargs: dict,
                   devices: list, *, inplace: bool, run_example=None):
    """The example result of ``target(*args, **kwargs)`` (``args`` are values, ``meta_args``
    their examples, ``convert(v, fn)`` maps a value's tensors through ``fn``). ``run_example``,
    when given, computes it instead (on fake tensors)."""
    made_on = meta_kwargs.get("device")  # a factory's device, before its example moves to meta
    if "device" in meta_kwargs or (not devices and kind == "call_function" and _is_factory(target)):
        # A factory function, or a device argument: build its example on meta. Never run it for
        # real: that would allocate, and a random one would move the user's random stream.
        meta_kwargs["device"] = "meta"
    meta_target = target
    if kind == "call_method" and target in ("to", "cuda", "cpu"):
        # A device move: examples stay on meta (the node's device is recorded separately).
        meta_target = "to"
        if target != "to":
            meta_args = meta_args[:1]
            meta_kwargs = {k: v for k, v in meta_kwargs.items() if k in ("non_blocking", "memory_format")}
        else:
            meta_args = [meta_args[0]] + ["meta" if isinstance(a, (str, torch.device)) else a
                                          for a in meta_args[1:]]
    if not _autocast_applies(devices):
        _check_dtypes_agree(kind, target, meta_args)
    shapes = tx.output.shapes
    try:
        if run_example is not None:
            result = run_example(convert)
        elif shapes is not None and (not inplace or _holds_fake(meta_args, meta_kwargs)):
            # Symbolic sizes: every example runs on the capture's fake tensors. Not an in-place
            # op on static examples alone (an input that is not contiguous has no symbolic
            # sizes): on a fake wrapper of the example it would change the wrapper, and
            # ``x.t_()`` would leave x's example as it was; it runs on the examples below.
            result = run_on_fake(tx, kind, target, args, kwargs, convert)
            if inplace and not _same_metadata(meta_args[0] if meta_args else None, result):
                # A static example written in place with fake arguments, which changes its
                # metadata (requires_grad, from a fake that requires grad): the example cannot
                # follow.
                raise Unsupported(f"{readable_call(kind, target)} changing the shape, strides or "
                                  "requires_grad of a tensor whose sizes are static, with "
                                  "arguments whose sizes are dynamic")
        elif not inplace and _autocast_applies(devices):
            result = _run_under_autocast(tx, kind, target, args, kwargs, convert)
        elif not inplace and _layout_by_device(kind, target, meta_args, devices):
            result = run_on_fake(tx, kind, target, args, kwargs, convert)
        else:
            meta_target, meta_args, meta_kwargs = cpu_attention_on_meta(
                kind, meta_target, meta_args, meta_kwargs, devices)
            result = _run_on_meta_retrying_foreach(kind, meta_target, args, meta_args, meta_kwargs,
                                                   cacheable=not inplace)
    except Unsupported:
        raise
    except Exception as e:
        if shapes is not None:
            raise DynamicShapeError(f"{readable_call(kind, target)} failed on symbolic sizes "
                                    f"({type(e).__name__}: {_first_line(e)})") from e
        raise Unsupported(
            f"{readable_call(kind, target)} failed while framejit ran it on example inputs "
            f"({type(e).__name__}: {_first_line(e)})",
            "this usually means the call also fails in plain PyTorch; run the function without "
            "framejit to see the error",
        ) from e
    if not _autocast_applies(devices):
        _check_cpu_takes(kind, meta_target, meta_args, meta_kwargs, result,
                         [*devices, made_on] if made_on is not None else devices)
    return result


#: Ops whose result's layout depends on the device's kernel, which meta tensors forget: a CPU
#: or CUDA convolution of a channels-last input (or weight) returns channels-last, as does a
#: CPU group norm; their meta kernels answer contiguous. Fake tensors report the device, and
#: torch's layout rules then give eager's strides.
_LAYOUT_BY_DEVICE = frozenset({
    "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
    "convolution", "_convolution", "group_norm",
})


def _layout_by_device(kind, target, meta_args, devices) -> bool:
    """Whether this call's example must run on fake tensors for eager's layout: an op of
    ``_LAYOUT_BY_DEVICE`` with a tensor that is not contiguous (on contiguous tensors the
    meta kernels agree with the devices')."""
    if kind != "call_function" or not devices or name_of(target) not in _LAYOUT_BY_DEVICE:
        return False
    return any(isinstance(a, torch.Tensor) and not a.is_contiguous() for a in meta_args)


def _same_metadata(example, result) -> bool:
    """Whether the in-place result ``result`` has the metadata of the example it wrote (always
    so for a fake example: the op changed that one)."""
    from torch._subclasses.fake_tensor import FakeTensor

    if not isinstance(example, torch.Tensor) or isinstance(example, FakeTensor) \
            or not isinstance(result, torch.Tensor):
        return True
    return (tuple(example.shape), example.stride(), example.requires_grad) == \
        (tuple(result.shape), result.stride(), result.requires_grad)


def _holds_fake(*values) -> bool:
    """Whether a fake tensor (an example with symbolic sizes) is among ``values``."""
    from torch._subclasses.fake_tensor import FakeTensor

    found = []
    map_aggregate(values, lambda v: found.append(v) if isinstance(v, FakeTensor) else v)
    return bool(found)


def _run_on_meta_retrying_foreach(kind, target, args, meta_args, meta_kwargs, cacheable):
    """``torch._foreach_addcdiv_(xs, as, bs, scalars)`` with ``scalars`` a 1-d CPU tensor (Adam's
    step sizes while compiling) reads its numbers, which a meta tensor has not. If the example run
    fails so, it is run again with a list of that many numbers in the tensor's place: the
    results' metadata do not depend on the numbers."""
    try:
        return run_on_meta(kind, target, meta_args, meta_kwargs, memo=cacheable)
    except RuntimeError as e:
        if not (getattr(target, "__name__", "").startswith("_foreach_") and "scalars" in str(e)):
            raise
        retry = list(meta_args)
        for i, a in enumerate(args[1:], 1):
            example = getattr(a, "example", None)  # a tensor value's
            if isinstance(example, torch.Tensor) and example.dim() == 1 and a.device.type == "cpu":
                retry[i] = [1.0] * a.example.shape[0]
        return run_on_meta(kind, target, retry, meta_kwargs, memo=cacheable)


# -- CPU attention ------------------------------------------------------------------------------
#
# ``F.scaled_dot_product_attention`` picks a backend at run time. On meta tensors it always
# picks the math one, whose result is contiguous; on CPU tensors it picks the flash kernel when
# it can, whose result is laid out like its query: (batch, seq, head, dim)-ordered strides for
# the usual ``linear(x).view(b, s, h, d).transpose(1, 2)`` query. The example must carry the
# real strides, or every kernel reading the result finds an unexpected layout at run time and
# runs as torch ops. So for CPU tensors the choice is asked of torch itself, on uninitialised
# CPU tensors of the examples' metadata, and a flash choice takes the flash kernel's meta
# result (``empty_like(query)``, as the real kernel allocates). Kernels still check the
# strides of such inputs at run time: a different choice then (say, under an ``sdpa_kernel``
# block) costs speed, never correctness.

_SDPA_TARGETS = (torch.nn.functional.scaled_dot_product_attention,
                 torch.ops.aten.scaled_dot_product_attention,
                 torch.ops.aten.scaled_dot_product_attention.default)
_SDPA_PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
                "enable_gqa")
_SDPA_DEFAULTS = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None,
                  "enable_gqa": False}


def cpu_flash_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                        scale=None, enable_gqa=False):
    """What ``F.scaled_dot_product_attention`` computes when it picks the CPU flash kernel
    (its result only; the kernel's meta function reads ``query`` alone for it, so a grouped
    ``key``/``value`` needs no expanding)."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)[0]


def cpu_attention_on_meta(kind, target, meta_args, meta_kwargs, devices):
    """``(target, meta_args, meta_kwargs)`` to run on meta for the example of this call: for
    scaled-dot-product attention on CPU tensors for which torch picks the flash kernel, that
    kernel's; otherwise unchanged."""
    if kind != "call_function" or not devices or any(d.type != "cpu" for d in devices):
        return target, meta_args, meta_kwargs
    if not any(target is t for t in _SDPA_TARGETS):
        return target, meta_args, meta_kwargs
    if len(meta_args) > len(_SDPA_PARAMS) or not set(meta_kwargs) <= set(_SDPA_PARAMS):
        return target, meta_args, meta_kwargs
    bound = {**_SDPA_DEFAULTS, **dict(zip(_SDPA_PARAMS, meta_args)), **meta_kwargs}
    if any(p not in bound for p in ("query", "key", "value")):
        return target, meta_args, meta_kwargs
    tensors = [bound[p] for p in ("query", "key", "value", "attn_mask") if bound[p] is not None]
    if not all(isinstance(t, torch.Tensor) and type(t) is torch.Tensor and t.is_meta
               for t in tensors):
        return target, meta_args, meta_kwargs
    choice = cpu_sdpa_choice(*(bound[p] for p in _SDPA_PARAMS))
    if choice != torch.nn.attention.SDPBackend.FLASH_ATTENTION.value:
        return target, meta_args, meta_kwargs
    return cpu_flash_attention, [], bound


# -- under autocast ------------------------------------------------------------------------------
#
# Autocast picks an op's dtypes by the device of its inputs, which meta tensors forget. Under an
# autocast block (the frame's or the caller's), ops on tensors of an autocast device run instead
# on fake tensors, which are meta tensors that report their real device: torch's own autocast
# rules then apply exactly as in eager. The result is turned back into plain meta tensors.

def _autocast_applies(devices) -> bool:
    if not any_autocast_enabled():
        return False
    return any(d.type in ("cpu", "cuda") and torch.is_autocast_enabled(d.type) for d in devices)


def _run_under_autocast(tx, kind, target, args, kwargs, convert):
    return run_on_fake(tx, kind, target, args, kwargs, convert, "under autocast ")


def run_on_fake(tx, kind, target, args, kwargs, convert, what=""):
    """Run ``target`` on fake tensors (meta tensors that report their real device); the result
    as plain meta tensors."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    shapes = tx.output.shapes
    mode = tx.output.fake_mode
    if mode is None:
        mode = tx.output.fake_mode = FakeTensorMode(allow_non_fake_inputs=False)

    def fake(t):
        if not isinstance(t.example, torch.Tensor):
            return t.example  # a number input
        if shapes is not None:
            return shapes.fake_of(t.example, t.device)
        return FakeTensor(mode, t.example, t.device)

    fake_args = [convert(a, fake) for a in args]
    fake_kwargs = {k: convert(v, fake) for k, v in kwargs.items()}
    with mode, quiet_failed_meta_runs():
        result = call_on_fake(kind, target, fake_args, fake_kwargs)
    if shapes is not None:
        return result  # fake tensors with symbolic sizes stay the examples
    try:
        return fresh_meta(result)
    except TypeError:
        raise Unsupported(f"{readable_call(kind, target)} {what}returned a "
                          f"{type(result).__name__}, which framejit cannot track") from None


#: Products whose real kernels require one dtype for all their tensors, which their meta kernels
#: do not check (``x.double() @ y`` raises in eager, not on meta).
_SAME_DTYPE_PRODUCTS = frozenset({
    "matmul", "__matmul__", "__rmatmul__", "mm", "bmm", "mv", "dot", "vdot", "inner", "outer",
    "addmm", "addmv", "addbmm", "baddbmm", "addr", "linear", "bilinear", "einsum", "tensordot",
    "chain_matmul", "multi_dot", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
    "conv_transpose2d", "conv_transpose3d",
})


def _check_dtypes_agree(kind, target, meta_args) -> None:
    name = name_of(target)
    if name not in _SAME_DTYPE_PRODUCTS:
        return
    tensors = [a for a in meta_args if isinstance(a, torch.Tensor)]
    for a in meta_args:
        if isinstance(a, (list, tuple)):
            tensors += [x for x in a if isinstance(x, torch.Tensor)]
    if len({t.dtype for t in tensors}) > 1:
        dtypes = ", ".join(str(t.dtype).replace("torch.", "") for t in tensors)
        raise Unsupported(f"{readable_call(kind, target)} of tensors of different dtypes ({dtypes}), "
                          "which raises RuntimeError in PyTorch",
                          "convert the operands to one dtype")


def _out_of_range(x, dtype: torch.dtype) -> bool:
    """Whether PyTorch refuses to convert the Python number ``x`` to ``dtype`` ("value cannot
    be converted to type int8_t without overflow"): NaN, infinities and numbers beyond the range
    of an integer dtype; finite numbers beyond the largest of a floating one."""
    if dtype.is_complex or dtype in (torch.bool, torch.float64):
        return False
    if dtype.is_floating_point:
        return math.isfinite(x) and abs(x) > torch.finfo(dtype).max
    try:
        info = torch.iinfo(dtype)
    except TypeError:
        return False  # a quantized or bit dtype
    return not math.isfinite(x) or not info.min <= x <= info.max


#: dtypes every CPU kernel takes; an operation on other dtypes is tried on real tensors once.
_WIDE_DTYPES = frozenset({torch.float32, torch.float64, torch.complex64, torch.complex128})
#: PyTorch's errors for a dtype a kernel does not take ("not implemented for 'Int'", "std and
#: var only support floating point and complex dtypes", "Boolean inputs not supported"), and for a
#: number a dtype cannot hold (the first of ``_NUMBER_ERROR``'s).
_NUMBER_ERROR = re.compile(r"cannot be converted to type|\b(from|to)( - 1)? is out of bounds for")
_DTYPE_ERROR = re.compile(_NUMBER_ERROR.pattern + r"|not implemented for '|dtype|\b[Bb]ool|integral"
                          r"|floating point")
#: signature of a call -> the error PyTorch's CPU kernel raised for it, or None.
_cpu_checks: dict = {}


def _check_cpu_takes(kind, target, meta_args, meta_kwargs, result, devices) -> None:
    """Raise Unsupported for an operation PyTorch's CPU kernel refuses whatever the tensors
    hold, although its meta kernel takes it: a dtype it has no kernel for
    (``int_tensor.softmax(0)``, ``bool_tensor.abs()``), or a Python number the dtype cannot hold
    (``int8_tensor.clamp(-100, 200)``, ``half_tensor.fill_(1e6)``). The graph would raise only
    when it runs, after the frame's side effects were put off (capture/rerun.py); as a graph
    break the operation runs as plain Python and raises as in eager.

    Only calls on CPU tensors of other dtypes than float32/64, or with a number beyond a dtype's
    range, are tried: once per signature, on real tensors of one element (:func:`_cpu_error`).
    """
    if kind not in ("call_function", "call_method") or name_of(target) in VIEW_NAMES \
            or any(str(d) != "cpu" for d in devices):
        return
    dtypes = set()
    for v in (*meta_args, *meta_kwargs.values(), result):
        for t in (v if isinstance(v, (tuple, list)) else (v,)):
            if isinstance(t, torch.Tensor):
                dtypes.add(t.dtype)
    if isinstance(meta_kwargs.get("dtype"), torch.dtype):
        dtypes.add(meta_kwargs["dtype"])
    numbers = [a for a in (*meta_args, *meta_kwargs.values())
               if isinstance(a, (int, float)) and not isinstance(a, bool)]
    too_big = next(((x, d) for x in numbers for d in dtypes if _out_of_range(x, d)), None)
    if too_big is None and dtypes <= _WIDE_DTYPES:
        return
    try:
        key = (kind, target, _signature(meta_args), _signature(meta_kwargs))
    except _Symbolic:
        return  # a symbolic size or number: a real run would fix its value
    try:
        hash(key)
    except TypeError:
        key = None
    if key is not None and key in _cpu_checks:
        error = _cpu_checks[key]
    else:
        error = _cpu_error(kind, target, meta_args, meta_kwargs)
        if key is not None:
            if len(_cpu_checks) >= 10_000:
                _cpu_checks.clear()
            _cpu_checks[key] = error
    if error is None or not _DTYPE_ERROR.search(str(error)):
        return  # runs, or fails for a reason of its tensors' one-element sizes
    if too_big is not None and _NUMBER_ERROR.search(str(error)):
        number, dtype = too_big
        raise Unsupported(
            f"{readable_call(kind, target)} with the number {number!r}, which "
            f"{_dtype_name(dtype)} cannot hold: PyTorch raises {type(error).__name__} "
            f"({_first_line(error)})",
            "use a number within the range of the tensor's dtype, or convert the tensor to a "
            "wider dtype first")
    names = ", ".join(sorted(_dtype_name(d) for d in dtypes))
    raise Unsupported(
        f"{readable_call(kind, target)} on {names} tensors, which PyTorch's CPU kernel does not "
        f"take: it raises {type(error).__name__} ({_first_line(error)})",
        "convert the tensors to a dtype the operation takes (say `.float()`) first")


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


class _Symbolic(Exception):
    pass


def _signature(v):
    """What a one-element run of a call depends on: dtypes and (cut) sizes of its tensors, and
    its other arguments (raises _Symbolic for a symbolic number)."""
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise _Symbolic
    if isinstance(v, torch.Tensor):
        return (torch.Tensor, v.dtype, tuple(_small_sizes(v)))
    if isinstance(v, (tuple, list)):
        return (type(v), tuple(_signature(x) for x in v))
    if isinstance(v, dict):
        return (dict, tuple((k, _signature(x)) for k, x in v.items()))
    return (type(v), v)


def _small_sizes(t: torch.Tensor) -> list:
    return [d if isinstance(d, int) and d <= 1 else 1 for d in t.shape]


def _cpu_error(kind, target, meta_args, meta_kwargs):
    """The error ``target`` raises on real CPU tensors of the examples' dtypes with every size
    cut to at most 1 (None if it runs, or if that call would make a large tensor)."""
    def one_element(v, device):
        if isinstance(v, (tuple, list)):
            return type(v)(one_element(x, device) for x in v)
        if isinstance(v, torch.Tensor):
            return torch.zeros(_small_sizes(v), dtype=v.dtype, device=device)
        return v

    def call(device):
        args = [one_element(a, device) for a in meta_args]
        kwargs = {k: one_element(v, device) for k, v in meta_kwargs.items()}
        if "device" in kwargs:
            kwargs["device"] = device
        if kind == "call_method":
            return getattr(args[0], target)(*args[1:], **kwargs)
        return target(*args, **kwargs)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            sizes = call("meta")  # a factory keeps its sizes: never allocate a large tensor
        except Exception:
            return None
        found = []
        map_aggregate(sizes, lambda v: found.append(v.numel()) if isinstance(v, torch.Tensor) else v)
        if sum(found) > 4096:
            return None
        rng = torch.random.get_rng_state()  # a random factory must not move the user's stream
        try:
            call("cpu")
        except Exception as e:
            return e.with_traceback(None)  # kept in the memo: no frames held
        finally:
            torch.random.set_rng_state(rng)
    return None


def _is_factory(target) -> bool:
    from .values.functions import _FACTORY_NAMES

    return getattr(target, "__name__", "") in _FACTORY_NAMES




def readable_call(kind, target) -> str:
    if kind == "call_method":
        return f"tensor.{target}()"
    mod = getattr(target, "__module__", None) or ""
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", repr(target))
    if mod.startswith("torch"):
        if mod == "torch.nn.functional":
            return f"torch.nn.functional.{name}()"
        if mod.startswith("torch._C") or mod == "torch":
            return f"torch.{name}()"
        return f"{mod}.{name}()"
    if mod in ("_operator", "operator"):
        return f"operator.{name}"
    return f"{name}()"


def _first_line(e: Exception) -> str:
    s = str(e).strip().splitlines()
    return s[0] if s else ""




def meta_from_real(t: torch.Tensor) -> torch.Tensor:
    """The example of a real tensor: a meta tensor of the same metadata."""
    return to_meta(t)
