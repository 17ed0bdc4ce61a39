"""Example values: running one call on meta tensors, memoised, for capture, passes and
:func:`~framejit.fx_ir.propagate_meta` alike.

A meta kernel sees only metadata, and many of torch's are Python reference implementations
costing 10-500 µs a call (about 1 ms for some aten decompositions), which dominates capture
time: the layers of a model ask the same questions again. :func:`run_on_meta` memoises a call's
result on exactly what it can depend on: the target, the tensors' sizes, strides, storage
offsets and dtypes (requires_grad while grad mode is on), the other arguments (by type and
value), grad mode and the default dtype. A hit gives *fresh* meta tensors of the recorded
metadata, never a tensor another node holds.

Only results that are new memory are memoised: a view (``x.t()``, ``x[1:]``), a result that
shares its input's storage (``x.detach()``, ``x.contiguous()`` of a contiguous ``x``, which
returns ``x`` itself), a result with a storage offset, a call with a non-meta or symbolic
argument, and an in-place call (:func:`~framejit.fx_ir.node.is_inplace`: it may change its
input's metadata) always run. A run's own result is returned as it is, so the views and
aliases eager would give stay so on meta.

Example::

    x = torch.empty(4, 8, device="meta")
    y = run_on_meta("call_function", torch.softmax, (x, -1), {})   # runs the meta kernel
    z = run_on_meta("call_function", torch.softmax, (x, -1), {})   # from the memo
    assert z is not y and z.shape == y.shape and z.stride() == y.stride()
"""

from __future__ import annotations

from typing import Any

import torch

from .node import is_inplace

#: At most this many memoised results; the memo starts afresh when full.
MEMO_LIMIT = 50_000

_memo: dict[Any, Any] = {}

_TENSOR = object()  # key and template tag of a tensor
_CONSTANT = object()  # template tag of a plain result (None, a number, a dtype, a Size)
_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)


class _NotMemoisable(Exception):
    pass


def run_on_meta(op: str, target: Any, args: Any, kwargs: dict[str, Any], *,
                memo: bool = True) -> Any:
    """``target(*args, **kwargs)`` (``op`` "call_function") or ``args[0].<target>(*args[1:],
    **kwargs)`` (``op`` "call_method") on meta values, memoised (see the module docstring).
    ``memo=False`` always runs it (say, for a call the caller knows to mutate or to be
    impure). Errors of the call propagate."""
    key = None
    if memo and not is_inplace(op, target, kwargs):
        grad = torch.is_grad_enabled()
        tensors: list[torch.Tensor] = []
        try:
            key = (op, target, _key(args, grad, tensors), _key(kwargs, grad, tensors), grad,
                   torch.get_default_dtype())
            found = _memo.get(key)
        except (_NotMemoisable, TypeError):  # TypeError: something unhashable
            key = found = None
        if found is not None:
            return _rebuild(found)
    if op == "call_method":
        result = getattr(args[0], target)(*args[1:], **kwargs)
    else:
        result = target(*args, **kwargs)
    if key is not None:
        try:
            storages = {t.untyped_storage()._cdata for t in tensors}
            template = _template(result, storages)
        except _NotMemoisable:
            pass
        else:
            if len(_memo) >= MEMO_LIMIT:
                _memo.clear()
            _memo[key] = template
    return result


def clear_meta_memo() -> None:
    """Forget every memoised result (``framejit.reset()`` does)."""
    _memo.clear()


def fresh_meta(value: Any) -> Any:
    """``value`` with every tensor (meta or fake) replaced by a new meta tensor of the same
    sizes, strides, storage offset, dtype, requires_grad and leafness; tuples, lists, torch's
    named tuples, None, numbers, dtypes and sizes are kept. Raises TypeError for anything else.
    """
    if isinstance(value, torch.Tensor):
        return _new_meta(tuple(value.shape), tuple(value.stride()), value.dtype,
                         value.requires_grad, value.is_leaf, value.storage_offset())
    if isinstance(value, (tuple, list)):
        # tuple and list, and torch.return_types structseqs, which take one sequence
        return type(value)([fresh_meta(x) for x in value])
    if value is None or isinstance(value, (bool, int, float, torch.dtype, torch.Size)):
        return value
    raise TypeError(f"{type(value).__name__} is not an example value")


# -- the memo's key: what a meta kernel's result can depend on ----------------------------------


def _key(v: Any, grad: bool, tensors: list) -> Any:
    if isinstance(v, torch.Tensor):
        if type(v) not in _TENSOR_TYPES or not v.is_meta or v.layout is not torch.strided:
            raise _NotMemoisable  # a real, fake or subclass tensor, or a sparse one
        tensors.append(v)
        return (_TENSOR, type(v), v.shape, v.stride(), v.storage_offset(), v.dtype,
                grad and v.requires_grad)
    if isinstance(v, (tuple, list)):
        return (type(v), tuple(_key(x, grad, tensors) for x in v))
    if isinstance(v, dict):
        return (dict, tuple((k, _key(x, grad, tensors)) for k, x in v.items()))
    return (type(v), v)  # hashed by the memo's lookup: unhashable values raise TypeError there


# -- the memo's values: templates of new-memory results ------------------------------------------


def _template(r: Any, storages: set) -> Any:
    if isinstance(r, torch.Tensor):
        if type(r) is not torch.Tensor or not r.is_meta or r.layout is not torch.strided \
                or r._is_view() or r.storage_offset() != 0 \
                or r.untyped_storage()._cdata in storages:
            raise _NotMemoisable  # shares memory with an input: only a run gives that right
        return (_TENSOR, tuple(r.shape), tuple(r.stride()), r.dtype, r.requires_grad, r.is_leaf)
    if isinstance(r, (tuple, list)):
        return (type(r), tuple(_template(x, storages) for x in r))
    if r is None or isinstance(r, (bool, int, float, torch.dtype, torch.Size)):
        return (_CONSTANT, r)
    raise _NotMemoisable


def _rebuild(t: tuple) -> Any:
    tag = t[0]
    if tag is _TENSOR:
        _, shape, stride, dtype, requires_grad, is_leaf = t
        return _new_meta(shape, stride, dtype, requires_grad, is_leaf)
    if tag is _CONSTANT:
        return t[1]
    items = [_rebuild(x) for x in t[1]]
    if tag is list:
        return items
    if tag is tuple:
        return tuple(items)
    return tag(items)  # torch.return_types structseqs take one sequence


def _new_meta(shape: tuple, stride: tuple, dtype: torch.dtype, requires_grad: bool,
              is_leaf: bool, offset: int = 0) -> torch.Tensor:
    """A new meta tensor. One that requires grad and is no leaf (the result of an op on a
    tensor that requires grad) is made a non-leaf too, so that an in-place op on it works as in
    eager rather than raising "a leaf Variable that requires grad ..."."""
    if not offset:
        m = torch.empty_strided(shape, stride, dtype=dtype, device="meta")
        if not requires_grad:
            return m
        m.requires_grad_(True)
        if is_leaf:
            return m
        with torch.enable_grad():
            m = m.clone()  # keeps the strides of a dense layout
        if m.stride() == stride:
            return m
    # A storage offset, or a non-leaf of a layout clone does not keep: a window on new memory.
    extent = offset if 0 in shape else offset + 1 + sum((n - 1) * s for n, s in zip(shape, stride))
    base = torch.empty(extent, dtype=dtype, device="meta")
    if not requires_grad:
        return base.as_strided(shape, stride, offset)
    if is_leaf:
        return base.as_strided(shape, stride, offset).detach().requires_grad_(True)
    with torch.enable_grad():
        return base.requires_grad_(True).clone().as_strided(shape, stride, offset)


_size_source_type = None


def size_symbol_source(text: str):
    """The source object torch's ShapeEnv wants for a new size symbol (it only names the
    symbol in torch's own logs; framejit keeps its own sources): for capture's symbols and the
    compiler's symbolic propagation alike."""
    global _size_source_type
    if _size_source_type is None:
        import torch._guards as tg

        class FramejitSizeSource(tg.Source):
            def __init__(self, text):
                self.text = text

            @property
            def name(self):  # torch 2.13 reads it as an attribute
                return self.text

            def guard_source(self):
                return tg.GuardSource.LOCAL

            def __hash__(self):
                return hash(self.text)

            def __eq__(self, other):
                return type(other) is type(self) and other.text == self.text

        _size_source_type = FramejitSizeSource
    return _size_source_type(text)
