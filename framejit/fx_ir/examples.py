"""Example values: running one call on meta tensors, memoised, for capture, passes and
:func:`~framejit.fx_ir.propagate_meta` alike.

A meta kernel sees only metadata, and many of torch's are Python reference implementations
costing 10-500 µs a call (about 1 ms for some aten decompositions), which dominates capture
time: the layers of a model ask the same questions again. :func:`run_on_meta` memoises a call's
result on exactly what it can depend on: the target, the tensors' sizes, strides, storage
offsets and dtypes (requires_grad while grad mode is on), the other arguments (by type and
value), grad mode and the default dtype. A hit gives *fresh* meta tensors of the recorded
metadata, never a tensor another node holds.

Only results that are new memory, and hold a tensor, are memoised: a result without one (a
number; None from a call run for its effect, such as ``torch._C._set_grad_enabled``), a view
(``x.t()``, ``x[1:]``), a result that shares its input's storage (``x.detach()``,
``x.contiguous()`` of a contiguous ``x``, which returns ``x`` itself), a result with a storage
offset, a call with a non-meta or symbolic argument, and an in-place call (:func:`~framejit.fx_ir.node.is_inplace`: it may change its
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

from .. import diskcache
from .node import is_inplace

#: At most this many memoised results; the memo starts afresh when full.
MEMO_LIMIT = 50_000

_memo: dict[Any, Any] = {}

_TENSOR = object()  # key and template tag of a tensor
_CONSTANT = object()  # template tag of a plain result (None, a number, a dtype, a Size)
_ABSENT = object()  # a key a pack does not hold
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
        if found is None and key is not None and _disk.enabled:
            found = _disk.lookup(key)
            if found is not None:
                _memo[key] = found
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
            if not _holds_tensor(template):
                # No tensor: nothing a meta kernel was needed for, and maybe a call run for its
                # effect (``torch._C._set_grad_enabled(False)`` returns None), which a memo hit
                # would skip.
                raise _NotMemoisable
        except _NotMemoisable:
            if _disk.enabled:
                _disk.note_unmemoisable(key)
        else:
            if len(_memo) >= MEMO_LIMIT:
                _memo.clear()
            _memo[key] = template
            if _disk.enabled:
                _disk.note(key, template)
    return result


def clear_meta_memo() -> None:
    """Forget every memoised result (``framejit.reset()`` does)."""
    _memo.clear()


def meta_pack(name: str):
    """A context in which this thread's calls keep their disk records together under ``name``
    (a captured function: see :class:`_DiskMemo`), for the next process to read at once."""
    return _disk.packed(name)


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


def _holds_tensor(t: tuple) -> bool:
    if t[0] is _TENSOR:
        return True
    return t[0] is not _CONSTANT and any(_holds_tensor(x) for x in t[1])


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


def call_on_fake(op: str, target: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    """``target(*args, **kwargs)`` (a method call for ``op == "call_method"``) on fake tensors,
    with the workarounds for meta kernels that fail on symbolic sizes or fix them."""
    if op == "call_function" and target in _CONSTANT_PADS and _symbolic(args):
        padded = _constant_pad(target, args, kwargs)
        if padded is not None:
            return padded
    try:
        if op == "call_method":
            return getattr(args[0], target)(*args[1:], **kwargs)
        return target(*args, **kwargs)
    except RuntimeError:
        if not _is_baddbmm(op, target):
            raise
        return _baddbmm_on_symbolic_sizes(op, target, args, kwargs)


_BADDBMM = (torch.baddbmm, torch.Tensor.baddbmm, torch.ops.aten.baddbmm.default)
_CONSTANT_PADS = (torch.nn.functional.pad, torch._C._nn.pad, torch.constant_pad_nd,
                  torch.ops.aten.constant_pad_nd.default)


def _symbolic(args: Any) -> bool:
    return any(isinstance(a, torch.Tensor) and any(isinstance(n, torch.SymInt) for n in a.shape)
               for a in args)


def _constant_pad(target: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    """A constant pad by torch's Python reference: the C++ kernel reads its input's sizes as
    ints, which on symbolic sizes fixes them (a guard ``s == 8``): MobileBERT's embeddings pad
    a slice of the sequence, and compiled once per length. None for other modes."""
    names = ("input", "pad", "mode", "value") if target in _CONSTANT_PADS[:2] else \
        ("input", "pad", "value")
    given = dict(zip(names, args), **kwargs)
    if set(given) - set(names) or given.get("mode", "constant") != "constant":
        return None
    value = given.get("value")
    return torch._refs.constant_pad_nd(given["input"], given["pad"], 0 if value is None else value)



def _is_baddbmm(op: str, target: Any) -> bool:
    return target == "baddbmm" if op == "call_method" else target in _BADDBMM


def _baddbmm_on_symbolic_sizes(op: str, target: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    """baddbmm's meta kernel expands its first argument with sizes it reads as ints, which fails
    on symbolic sizes (torch 2.13): Bloom's ALiBi scores compiled once per sequence length under
    dynamic shapes. The same call with that argument expanded first to the result's sizes (the
    same values: baddbmm broadcasts it)."""
    names = ("input", "batch1", "batch2")
    given = dict(zip(names, args[:3]), **{k: v for k, v in kwargs.items() if k in names})
    rest = {k: v for k, v in kwargs.items() if k not in names}
    x, b1, b2 = given["input"], given["batch1"], given["batch2"]
    x = x.expand(b1.shape[0], b1.shape[1], b2.shape[2])
    if op == "call_method":
        return x.baddbmm(b1, b2, *args[3:], **rest)
    return target(x, b1, b2, *args[3:], **rest)


#: Above this many bytes of inputs, which kernel CPU attention picks is not asked (the stand-ins
#: are allocated, if never touched).
SDPA_CHOICE_BYTES = 1 << 30


def cpu_sdpa_choice(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                    scale=None, enable_gqa=False):
    """The ``torch.nn.attention.SDPBackend`` value ``F.scaled_dot_product_attention`` picks for
    CPU tensors laid out as the meta tensors given (flash, or the math path), or None when it
    cannot be asked (too large, or the call raises)."""
    tensors = [t for t in (query, key, value, attn_mask) if t is not None]
    if not all(isinstance(t, torch.Tensor) and t.layout is torch.strided for t in tensors) \
            or sum(t.untyped_storage().nbytes() for t in tensors) > SDPA_CHOICE_BYTES:
        return None

    def stand_in(t):
        if t is None:
            return None
        real = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu")
        return real.requires_grad_(True) if t.requires_grad else real

    try:
        with torch.no_grad():
            return torch._fused_sdp_choice(
                stand_in(query), stand_in(key), stand_in(value), stand_in(attn_mask), dropout_p,
                is_causal, scale=scale, enable_gqa=enable_gqa)
    except Exception:
        return None


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


# -- the disk memo: the same templates across processes -----------------------------------------
#
# A process's first capture finds the memo empty, and its misses (0.2-4 ms each, the first of an
# op often the dearest: torch builds its Python reference on first use) were about a fifth of
# GPT-2's first call. The templates of memoisable results are therefore also kept on disk, in
# ``$FRAMEJIT_CACHE_DIR/meta`` (default ``~/.cache/framejit/meta``), in a folder per torch build
# (its version, git revision, install folder and the modification times of the files holding
# its meta kernels), one small file per record named by a hash of its key: a miss of the
# in-process memo reads at most one file, however many records there are. New records are
# written when the process exits.
#
# Only calls whose key names everything a meta kernel's result can depend on in every process
# go there: the target is a string (a tensor method), an aten or prims operator, a function of
# torch's own files, a builtin of torch or of ``operator``, or a ``TensorBase`` method, each
# found again under its own name (so a patched or wrapped function, or a user's, never is);
# the arguments are meta tensors (by type, sizes, strides, offset, dtype, requires_grad) and
# plain values (None, bool, int, float, complex, str, dtype, device, layout, memory format,
# Size, slice, Ellipsis) in tuples, lists and dicts. ``FRAMEJIT_META_CACHE=0`` turns it off.

#: The format of a record; part of the file name.
_DISK_FORMAT = 3

_PLAIN_TYPES = {t: t.__name__ for t in (type(None), bool, int, str, complex)}
_TORCH_VALUE_TYPES = {torch.dtype: "dtype", torch.device: "device", torch.layout: "layout",
                      torch.memory_format: "memory_format"}


class _NotOnDisk(Exception):
    pass


def _torch_root() -> str:
    import os

    return os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


def _target_name(target: Any) -> tuple:
    """A name of ``target`` that means the same callable in every process of this torch
    build, or _NotOnDisk."""
    import sys
    import types

    if isinstance(target, str):
        return ("method", target)
    if isinstance(target, torch._ops.OpOverload):
        name = target.name()
        if name.split("::")[0] not in ("aten", "prims"):
            raise _NotOnDisk
        return ("op", name)
    if isinstance(target, types.BuiltinFunctionType):
        module, name = getattr(target, "__module__", None), target.__name__
        if not isinstance(module, str) or not (module == "torch" or module.startswith("torch.")
                                               or module == "_operator"):
            raise _NotOnDisk
        if getattr(sys.modules.get(module), name, None) is not target:
            raise _NotOnDisk
        return ("builtin", module, name)
    if type(target) is types.MethodDescriptorType and target.__objclass__ is torch._C.TensorBase:
        if getattr(torch._C.TensorBase, target.__name__, None) is not target:
            raise _NotOnDisk
        return ("tensorbase", target.__name__)
    if type(target) is types.FunctionType:
        module, qualname = target.__module__, target.__qualname__
        if not isinstance(module, str) or not module.startswith("torch.") or "<" in qualname \
                or not target.__code__.co_filename.startswith(_torch_root()):
            raise _NotOnDisk
        obj: Any = sys.modules.get(module)
        for part in qualname.split("."):
            obj = getattr(obj, part, None)
        if obj is not target:
            raise _NotOnDisk
        return ("function", module, qualname)
    raise _NotOnDisk


def _disk_value(k: Any) -> Any:
    """The in-memory key part ``k`` (see :func:`_key`) in plain values, or _NotOnDisk."""
    if type(k) is not tuple or len(k) < 2:
        raise _NotOnDisk
    tag = k[0]
    if tag is _TENSOR:
        _, kind, shape, stride, offset, dtype, grad = k
        return ("T", kind.__name__, tuple(shape), tuple(stride), offset, str(dtype), grad)
    if tag is tuple or tag is list or tag is torch.Size:
        return (tag.__name__, tuple(_disk_value(x) for x in k[1]))
    if tag is dict:
        return ("dict", tuple((_plain(key), _disk_value(x)) for key, x in k[1]))
    return _plain(k[1])


def _plain(v: Any) -> Any:
    t = type(v)
    if t in _PLAIN_TYPES:
        return (_PLAIN_TYPES[t], v)
    if t is float:
        return ("float", repr(v))  # tells -0.0 from 0.0, and nan is equal to itself
    if t in _TORCH_VALUE_TYPES:
        return (_TORCH_VALUE_TYPES[t], str(v))
    if t is slice:
        return ("slice", _plain(v.start), _plain(v.stop), _plain(v.step))
    if v is Ellipsis:
        return ("ellipsis",)
    raise _NotOnDisk


def _encode(t: tuple) -> tuple:
    """A template (see :func:`_template`) in plain values."""
    tag = t[0]
    if tag is _TENSOR:
        _, shape, stride, dtype, requires_grad, is_leaf = t
        return ("T", shape, stride, str(dtype), requires_grad, is_leaf)
    if tag is _CONSTANT:
        r = t[1]
        if isinstance(r, torch.dtype):
            return ("C", "dtype", str(r))
        if isinstance(r, torch.Size):
            return ("C", "Size", tuple(r))
        if r is None or type(r) in (bool, int, float):
            return ("C", "value", r)
        raise _NotOnDisk
    if tag is tuple or tag is list:
        name = tag.__name__
    elif getattr(tag, "__module__", None) == "torch.return_types":
        name = "torch.return_types." + tag.__name__
    else:
        raise _NotOnDisk
    return ("S", name, tuple(_encode(x) for x in t[1]))


def _dtype(text: str) -> torch.dtype:
    dtype = getattr(torch, text.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype) or str(dtype) != text:
        raise ValueError(text)
    return dtype


def _decode(e: tuple) -> tuple:
    tag = e[0]
    if tag == "T":
        _, shape, stride, dtype, requires_grad, is_leaf = e
        return (_TENSOR, tuple(shape), tuple(stride), _dtype(dtype), bool(requires_grad),
                bool(is_leaf))
    if tag == "C":
        _, kind, r = e
        if kind == "dtype":
            return (_CONSTANT, _dtype(r))
        if kind == "Size":
            return (_CONSTANT, torch.Size(r))
        return (_CONSTANT, r)
    _, name, items = e
    if name == "tuple":
        kind: Any = tuple
    elif name == "list":
        kind = list
    else:
        import torch.return_types as rt

        kind = getattr(rt, name.removeprefix("torch.return_types."))
        if not isinstance(kind, type) or not issubclass(kind, tuple):
            raise ValueError(name)
    return (kind, tuple(_decode(x) for x in items))


#: At most this many records in a pack (see :class:`_DiskMemo`): past it, a pack is rewritten
#: with the last process's records alone.
PACK_LIMIT = 4096


class _DiskMemo:
    """One file per record, named by a hash of its key, in a folder per torch build: a lookup
    reads one small file (or finds none), whatever the number of records.

    A capture also keeps a *pack* (:meth:`packed`): every record its calls looked up, found or
    made, and the keys whose results cannot be memoised (a view), in one file named by the
    captured function. The next process's capture of it reads that one file at its first lookup,
    where GPT-2's ~100 lookups opened a file each, half of them for views that never have a
    record (5-6 ms of its 100 ms first call). A pack holds the same records as the files (keyed
    by the same disk key), so it can only answer as they would; a key it lacks is looked up in
    its file."""

    def __init__(self) -> None:
        import os
        import threading

        self.enabled = os.environ.get("FRAMEJIT_META_CACHE", "1") != "0"
        self.new: dict = {}  # disk key -> encoded template, written when the process exits
        self.read = 0  # records found on disk (for tests)
        self.folder: str | None = None
        self.packs: dict[str, dict] = {}  # pack name -> its records as read (None: no result)
        self.pack_new: dict[str, dict] = {}  # pack name -> records to add to it at exit
        self._current = threading.local()  # .name: this thread's pack
        self._at_exit = False  # save() registered to run at exit

    def _save_at_exit(self) -> None:
        if not self._at_exit:
            import atexit

            atexit.register(self.save)
            self._at_exit = True

    def packed(self, name: str):
        """A context in which this thread's lookups and records go through the pack ``name``
        (nested: the innermost one)."""
        import contextlib

        @contextlib.contextmanager
        def scope():
            before = getattr(self._current, "name", None)
            self._current.name = name
            try:
                yield
            finally:
                self._current.name = before

        return scope()

    def _pack_path(self, name: str) -> str:
        import hashlib
        import os

        digest = hashlib.sha256(name.encode()).hexdigest()[:40]
        return os.path.join(self._folder(), "packs", f"{digest}.marshal")

    def _read_pack(self, name: str) -> dict:
        """The records of pack ``name`` on disk ({} when there is none or it is unreadable)."""
        import marshal

        try:
            with open(self._pack_path(name), "rb") as f:
                stored_name, records = marshal.loads(f.read())
            if stored_name == name and type(records) is dict:
                return records
        except (OSError, EOFError, TypeError, ValueError):
            pass
        return {}

    def _pack(self) -> tuple[dict, dict] | None:
        """This thread's pack: (its records as read, the records to add), or None."""
        name = getattr(self._current, "name", None)
        if name is None:
            return None
        records = self.packs.get(name)
        if records is None:
            records = self.packs[name] = self._read_pack(name)
        added = self.pack_new.get(name)
        if added is None:
            added = self.pack_new[name] = {}
            self._save_at_exit()
        return records, added

    def note_unmemoisable(self, key: tuple) -> None:
        """The result of ``key`` is not memoised (a view, say): its pack says so, and the next
        process's lookup of it opens no file."""
        pack = self._pack()
        if pack is None:
            return
        try:
            disk_key = self._disk_key(key)
        except (_NotOnDisk, TypeError, ValueError, AttributeError):
            return
        if pack[0].get(disk_key, 0) is not None:
            pack[1][disk_key] = None

    def _folder(self) -> str:
        import hashlib
        import os
        import sys

        if self.folder is None:
            base = _torch_root()
            stamps = []
            for rel in ("version.py", "_meta_registrations.py", "_refs/__init__.py",
                        "_decomp/decompositions.py", "_prims_common/__init__.py",
                        "_prims/__init__.py", "nn/functional.py", "functional.py"):
                try:
                    stamps.append(f"{rel}:{os.stat(base + rel).st_mtime_ns}")
                except OSError:
                    stamps.append(f"{rel}:-")
            ident = "\0".join([str(_DISK_FORMAT), sys.version, torch.__version__,
                               str(getattr(torch.version, "git_version", "")), base, *stamps])
            digest = hashlib.sha256(ident.encode()).hexdigest()[:32]
            self.folder = os.path.join(diskcache.root(), "meta", f"examples-{digest}")
        return self.folder

    def _path(self, disk_key: tuple) -> str:
        import hashlib
        import os

        name = hashlib.sha256(repr(disk_key).encode()).hexdigest()[:40]
        return os.path.join(self._folder(), f"{name}.marshal")

    def _disk_key(self, key: tuple) -> tuple:
        op, target, args, kwargs, grad, dtype = key
        return (op, _target_name(target), _disk_value(args), _disk_value(kwargs), grad, str(dtype))

    def lookup(self, key: tuple) -> Any:
        """The template of ``key`` from the disk (its pack's, else its file's), or None."""
        import marshal

        pack = None
        try:
            disk_key = self._disk_key(key)
            pack = self._pack()
            found = _ABSENT if pack is None else pack[0].get(disk_key, _ABSENT)
            if found is None:
                return None  # known to have no record
            if found is _ABSENT:
                with open(self._path(disk_key), "rb") as f:
                    stored_key, found = marshal.loads(f.read())
                if stored_key != disk_key:
                    return None
                if pack is not None:
                    pack[1][disk_key] = found
            template = _decode(found)
        except (_NotOnDisk, OSError, EOFError, TypeError, ValueError, AttributeError):
            return None
        if not _holds_tensor(template):
            return None
        self.read += 1
        return template

    def note(self, key: tuple, template: tuple) -> None:
        """Remember ``template`` for the disk (written when the process exits)."""
        try:
            record = (self._disk_key(key), _encode(template))
        except (_NotOnDisk, TypeError, ValueError, AttributeError):
            return
        if not self.new:
            import os

            self._save_at_exit()
            # Prune now: save() runs at exit, when Python 3.12 starts no thread (the folder
            # holds every torch build's records: other builds' go first).
            diskcache.note_write(os.path.dirname(self._folder()))
        self.new[record[0]] = record[1]
        pack = self._pack()
        if pack is not None:
            pack[1][record[0]] = record[1]

    def save(self) -> None:
        """Write the new records, each to a temporary name, then renamed; then each pack with
        records to add: read again (another process may have written it since), with them
        added (or, past :data:`PACK_LIMIT`, replaced by them)."""
        import marshal
        import os

        new, self.new = self.new, {}
        packs, self.pack_new = self.pack_new, {}
        try:
            if new:
                os.makedirs(self._folder(), exist_ok=True)
            for disk_key, value in new.items():
                path = self._path(disk_key)
                tmp = f"{path}.{os.getpid()}.tmp"
                with open(tmp, "wb") as f:
                    marshal.dump((disk_key, value), f)
                os.replace(tmp, path)
            for name, added in packs.items():
                if not added:
                    continue
                records = self._read_pack(name)
                records.update(added)
                if len(records) > PACK_LIMIT:
                    records = added
                self.packs[name] = records
                path = self._pack_path(name)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                tmp = f"{path}.{os.getpid()}.tmp"
                with open(tmp, "wb") as f:
                    marshal.dump((name, records), f)
                os.replace(tmp, path)
        except (OSError, ValueError):
            pass  # a cache that cannot be written only costs time


_disk = _DiskMemo()
