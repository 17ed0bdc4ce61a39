"""Tensors during capture: each is a node of the graph with an example value.

Every torch operation is recorded as a graph node and its example result computed once (see
``capture/examples.py``: on meta tensors, or on fake tensors under autocast or with symbolic
sizes), which gives the result's shape, dtype and strides without touching data. Examples may
forget the real device, so each node also records ``meta["device"]``, inferred from its inputs
and device arguments.
"""

from __future__ import annotations

import operator

import torch

from ...errors import Unsupported
from ...fx_ir import OFFSET_VIEW_NAMES, VIEW_NAMES, is_inplace, target_name
from ..examples import example_result
from ..examples import readable_call as _readable
from .base import Value
from .constants import ConstantValue, SymNumberValue, const
from .containers import DictValue, IteratorValue, ListValue, TupleValue
from .numbers import NumberInputValue, as_graph_inputs

# Tensor attributes that are plain Python facts about a tensor of known metadata.
_META_ATTRS = frozenset({
    "shape", "dtype", "ndim", "requires_grad", "layout", "is_sparse", "is_quantized", "is_nested",
    "is_mkldnn",
})
_DEVICE_ATTRS = {
    "is_cuda": lambda d: d.type == "cuda",
    "is_cpu": lambda d: d.type == "cpu",
    "is_mps": lambda d: d.type == "mps",
    "is_xpu": lambda d: d.type == "xpu",
    "is_meta": lambda d: d.type == "meta",
}
# Tensor attributes that are new tensors (views), recorded as ``getattr(x, name)`` nodes.
_TENSOR_ATTRS = frozenset({"T", "mT", "H", "mH", "real", "imag", "data"})
# Methods whose result depends only on metadata: folded to constants.
_META_METHODS = frozenset({
    "size", "dim", "ndimension", "numel", "nelement", "stride", "is_contiguous", "element_size",
    "is_floating_point", "is_complex", "is_signed",
})
# Not here: storage_offset() (answered by _storage_offset: no tensor guard checks an input's
# offset, and x[3:7] and x[0:4] shared one cache entry), is_conj() and is_neg() (the meta
# example does not carry those bits: a call of them breaks the graph).


def _storage_offset(tx, t: TensorValue) -> Value:
    """``t.storage_offset()``: the example's, which counts from the start of the graph input
    ``t`` views, or of the op result it views (offset 0 at run time, as in the example). An
    input's own offset is guarded; a chain through an op that may or may not copy (reshape,
    contiguous) breaks the graph."""
    from .. import guards as G
    from ..sources import StorageOffsetSource

    node = t.node
    offset = t.example.storage_offset()
    while node.op != "placeholder":
        name = target_name(node)
        if name == "as_strided" or node.op not in ("call_function", "call_method") \
                or name not in VIEW_NAMES:
            return const(offset)  # a fresh result (or an absolute offset)
        if name in ("getitem", "__getitem__") and any(
                hasattr(i, "op") or isinstance(i, (list, torch.Tensor))
                for i in (node.args[1] if isinstance(node.args[1], tuple) else (node.args[1],))):
            return const(offset)  # advanced indexing: a copy
        if name not in OFFSET_VIEW_NAMES or not node.args or not hasattr(node.args[0], "op"):
            raise ExampleOnlyAnswer(f"{t._short()}.storage_offset() of the result of "
                                    f"{_readable(node.op, node.target)}, which may be a copy or a "
                                    "view", _DATA_HINT)
        node = node.args[0]
    for source, real, input_node in tx.output.inputs:
        if input_node is node:
            tx.output.guards.add(G.EqualsGuard(StorageOffsetSource(source), real.storage_offset()))
            # in t's elements (x.view(torch.int8) counts bytes)
            start = real.storage_offset() * real.element_size() // t.example.element_size()
            return const(start + offset)
    raise ExampleOnlyAnswer(f"{t._short()}.storage_offset()", _DATA_HINT)


# Methods that read a tensor's data into Python: cannot be in a graph.
_DATA_METHODS = {
    "item": "x.item()",
    "tolist": "x.tolist()",
    "numpy": "x.numpy()",
    "__bool__": "bool(x)",
    "__int__": "int(x)",
    "__float__": "float(x)",
    "__index__": "using a tensor as an index",
    "data_ptr": "x.data_ptr()",
    "backward": "x.backward()",
    "register_hook": "x.register_hook()",
    "retain_grad": "x.retain_grad()",
}
_DATA_HINT = (
    "a tensor's values are only known when the graph runs; keep the computation in tensors "
    "(e.g. torch.where instead of an if), or move this line outside the compiled function"
)


class TensorValue(Value):
    """A tensor: a graph node (placeholder for inputs) with ``meta["val"]`` and ``meta["device"]``."""

    __slots__ = ("node",)

    def __init__(self, node, source=None):
        super().__init__(source)
        self.node = node

    @property
    def example(self) -> torch.Tensor:
        return self.node.meta["val"]

    @property
    def device(self) -> torch.device:
        return self.node.meta["device"]

    def describe(self):
        if self.source is not None:
            return f"the tensor {self.source.name()}"
        return "a tensor"

    def python_type(self):
        return self.node.meta.get("type", torch.Tensor)

    def hasattr(self, tx, name):
        if hasattr(self.python_type(), name):
            return hasattr(self.example, name)  # (a property may raise AttributeError)
        if self.source is None:
            return False  # made in the function, which sets no attribute of its own on it
        # An attribute the caller may set on the tensor (``x.tag = ...``), which the example
        # lacks: its absence is guarded; where the real tensor has it, only reading it tells.
        real = tx.output.real_input(self)
        if real is None or name in getattr(real, "__dict__", {name: None}):
            raise Unsupported(f"hasattr() of {name!r} on {self.describe()}, an attribute set on "
                              "the tensor", "pass the attribute's value as an argument")
        from ..guards import EqualsGuard
        from ..sources import InstanceDictHasSource
        tx.output.guards.add(EqualsGuard(InstanceDictHasSource(self.source, name), False))
        return False

    def getattr(self, tx, name):
        if name in _META_ATTRS:
            return const(getattr(self.example, name))
        if name == "device":
            return const(self.device)
        if name == "is_leaf":
            return const(self._is_leaf(tx))
        if name == "grad_fn" and self._is_leaf(tx):
            return const(None)
        if name in _DEVICE_ATTRS:
            return const(_DEVICE_ATTRS[name](self.device))
        if name in _TENSOR_ATTRS:
            return graph_call(tx, "call_function", getattr, [self, const(name)], {})
        if name == "grad":
            return self._read_grad(tx)
        if name in _DATA_METHODS:
            raise Unsupported(_DATA_METHODS[name].replace("x.", self._short() + "."), _DATA_HINT)
        if callable(getattr(torch.Tensor, name, None)):
            return TensorMethodValue(self, name)
        raise Unsupported(f"reading .{name} of {self.describe()}")

    def _is_leaf(self, tx) -> bool:
        if self.node.op == "get_attr":
            # A constant's example is made fresh (a leaf); the constant itself knows.
            constant = tx.output.constants.get(self.node.target)
            return constant.is_leaf if constant is not None else not self.example.requires_grad
        if self.node.op != "placeholder":
            # The example carries the autograd state of its ops: a result of an op on tensors
            # that require grad is no leaf, one made to require grad (`t.requires_grad_()`) is.
            return not self.example.requires_grad or self.example.is_leaf
        real = tx.output.real_input(self)
        if real is None or not self.example.requires_grad:
            # A tensor that does not require grad is always a leaf (requires_grad is guarded).
            return self.node.meta.get("is_leaf", True)
        if not real.requires_grad:
            # It requires grad since the frame changed it: an in-place op wrote a value that
            # requires grad into it (`x.copy_(w * 2)`, its grad_fn), or `x.requires_grad_()`
            # (a leaf still). Its example ran the same ops with autograd.
            return self.example.is_leaf
        from ..sources import AttrSource
        from .builder import wrap
        return wrap(tx, real.is_leaf, AttrSource(self.source, "is_leaf")).as_constant()  # guarded once

    def _read_grad(self, tx):
        """``p.grad`` of a tensor from outside (an optimizer reading a parameter's gradient): the
        real gradient at the call, guarded (a tensor, or None); after ``p.grad = ...`` in the
        frame, the value written. No backward runs inside a graph, so nothing else changes it."""
        written = tx.output.side_effects.load_attr(self, "grad")
        if written is not None:
            return written
        real = tx.output.real_input(self)
        if real is None:
            raise Unsupported(f"reading .grad of {self.describe()}, a tensor computed in the compiled function",
                              "read gradients of parameters and inputs, or outside the compiled function")
        from ..sources import AttrSource
        from .builder import wrap
        return wrap(tx, real.grad, AttrSource(self.source, "grad"))

    def setattr(self, tx, name, value):
        if name != "grad" or tx.output.real_input(self) is None:
            return super().setattr(tx, name, value)
        if not (value.is_constant() and value.as_constant() is None):
            raise Unsupported(f"assigning a tensor to .grad of {self.describe()}",
                              "assign gradients outside the compiled function; `p.grad = None` is captured")
        tx.output.side_effects.store_attr(self, "grad", value)

    def _short(self) -> str:
        return self.source.name() if self.source is not None else "tensor"

    def truthy(self, tx):
        raise Unsupported(f"using {self.describe()} as a Python bool (`if tensor:`, `and`/`or`, bool())", _DATA_HINT)

    def make_iterator(self, tx):
        return IteratorValue(self.iterate(tx))  # over a snapshot of the items

    def iterate(self, tx):
        if self.example.dim() == 0:
            raise Unsupported("iterating over a 0-d tensor")
        return graph_call(tx, "call_method", "unbind", [self], {}).iterate(tx)

    def length(self, tx):
        if self.example.dim() == 0:
            raise Unsupported("len() of a 0-d tensor")
        return self.example.shape[0]

    def getitem(self, tx, key):
        return graph_call(tx, "call_function", operator.getitem, [self, key], {})

    def setitem(self, tx, key, value):
        graph_call(tx, "call_function", operator.setitem, [self, key, value], {}, impure=True)

    def reconstruct(self, cg):
        return cg.graph_output(self)


class TensorMethodValue(Value):
    """``x.method`` before it is called."""

    __slots__ = ("tensor", "name")

    def __init__(self, tensor: TensorValue, name: str):
        super().__init__(None)
        self.tensor = tensor
        self.name = name

    def describe(self):
        return f"{self.tensor._short()}.{self.name}"

    def call(self, tx, args, kwargs):
        name = self.name
        if name == "storage_offset" and not args and not kwargs:
            return _storage_offset(tx, self.tensor)
        if name in _META_METHODS:
            example = self.tensor.example
            return const(getattr(example, name)(*[a.as_constant() for a in args],
                                                **{k: v.as_constant() for k, v in kwargs.items()}))
        if name == "get_device":
            d = self.tensor.device
            return const(d.index if d.type != "cpu" else -1)
        if name == "type":
            return _tensor_type(tx, self.tensor, args, kwargs)
        if name in _DATA_METHODS:
            raise Unsupported(_DATA_METHODS[name].replace("x.", self.tensor._short() + "."), _DATA_HINT)
        if name in _SCALED_METHODS and _scaled_by_a_tensor(name, args, kwargs):
            return _scaled_by_a_tensor_call(tx, self.tensor, name, args, kwargs)
        return graph_call(tx, "call_method", name, [self.tensor, *args], kwargs)

    def reconstruct(self, cg):
        return f"{cg.expr(self.tensor)}.{self.name}"


#: ``x.addcdiv_(a, b, value=v)`` or ``x.add_(g, alpha=v)`` with a 0-d tensor ``v`` (the optimizers'
#: step size while compiling, or a tensor learning rate): eager reads the tensor's number, which
#: the graph cannot do while capturing. The same sum is built from tensor ops instead,
#: ``x + a / b * v`` and ``x + g * v``, as TorchDynamo does. name -> (keyword, operands, combine)
_SCALED_METHODS = {
    "addcdiv": ("value", 2, torch.div), "addcdiv_": ("value", 2, torch.div),
    "addcmul": ("value", 2, torch.mul), "addcmul_": ("value", 2, torch.mul),
    "add": ("alpha", 1, None), "add_": ("alpha", 1, None),
    "sub": ("alpha", 1, None), "sub_": ("alpha", 1, None),
}


def _scaled_by_a_tensor(name: str, args, kwargs) -> bool:
    keyword, operands, _ = _SCALED_METHODS[name]
    scale = kwargs.get(keyword)
    return (len(args) == operands and len(kwargs) == 1 and isinstance(scale, TensorValue)
            and scale.example.dim() == 0)


def _scaled_by_a_tensor_call(tx, x: TensorValue, name: str, args, kwargs) -> Value:
    keyword, operands, combine = _SCALED_METHODS[name]
    term = args[0] if combine is None else graph_call(tx, "call_function", combine, list(args), {})
    term = graph_call(tx, "call_function", torch.mul, [term, kwargs[keyword]], {})
    base = "sub" if name.startswith("sub") else "add"
    return graph_call(tx, "call_method", base + "_" if name.endswith("_") else base, [x, term], {})


def type_string(dtype: torch.dtype, device: torch.device) -> str:
    """What ``x.type()`` says for a strided tensor of ``dtype`` on ``device`` (the real one, never
    the example's meta device): ``torch.HalfTensor``, ``torch.cuda.HalfTensor``."""
    name = torch.empty(0, dtype=dtype).type()  # torch.HalfTensor: a CPU tensor names no device
    if device.type == "cpu":
        return name
    return name.replace("torch.", f"torch.{device.type}.", 1)


def _tensor_type(tx, t: TensorValue, args, kwargs) -> Value:
    """``x.type()`` (the type string of the real tensor) and ``x.type(T)`` with ``T`` a dtype,
    a type string or a tensor class: the same conversion as ``x.to(device, dtype)``."""
    if t.example.layout != torch.strided:
        raise Unsupported(f"{t._short()}.type() of a {t.example.layout} tensor")
    if not args and not kwargs:
        return const(type_string(t.example.dtype, t.device))
    if len(args) != 1 or set(kwargs) - {"non_blocking"}:
        raise Unsupported(f"{t._short()}.type() with these arguments")
    target = args[0].as_constant()
    if isinstance(target, torch.dtype):
        return graph_call(tx, "call_method", "to", [t, const(target)], kwargs)
    if isinstance(target, type):
        target = getattr(target, "__module__", "") + "." + target.__name__
    if not isinstance(target, str):
        raise Unsupported(f"{t._short()}.type({target!r}) (TypeError)")
    found = _TYPE_NAMES.get(target)
    if found is None:
        raise Unsupported(f"{t._short()}.type({target!r}): not a tensor type name (ValueError)")
    device, dtype = found
    if device == "cpu" or t.device.type != device:
        device = torch.device(device)
    else:
        device = t.device  # torch.cuda.X keeps the tensor's own CUDA device
    return graph_call(tx, "call_method", "to", [t], {"device": const(device), "dtype": const(dtype), **kwargs})


#: Tensor type names (``torch.DoubleTensor``, ``torch.cuda.HalfTensor``) -> (device type, dtype).
_TYPE_NAMES = {
    type_string(dt, torch.device(dev)): (dev, dt)
    for dt in (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.uint8, torch.int8,
               torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64, torch.complex128)
    for dev in ("cpu", "cuda")
}


# -- min()/max() over tensors ---------------------------------------------------------------------

def tensor_min_max(tx, op, items: list[Value], keys: list[Value]) -> Value:
    """``max(a, b)``, ``min(ts, key=lambda t: t.sum())`` with one-element tensor keys: Python
    keeps the first item and replaces it by each later one whose key compares ``<`` (min) or
    ``>`` (max), which reads tensor values. The same choice is made in the graph with
    ``torch.where``, when the choice cannot change the result's type, shape or dtype: the items
    are tensors of one kind, the keys one-element tensors of one kind. (A tensor and a number
    give a tensor or a float depending on the values: that still breaks.)"""
    what = f"{op.__name__}() comparing tensors"

    def kind(v, grad=True):
        e = v.example
        return (tuple(e.shape), e.dtype, v.device, e.requires_grad if grad else None)

    if not all(isinstance(v, TensorValue) for v in items) or len({kind(v) for v in items}) != 1:
        raise Unsupported(f"{what}, over values of different kinds (tensors of other shapes, "
                          f"dtypes or devices, or numbers)",
                          "the result's kind would depend on tensor values; use torch.minimum/"
                          "torch.maximum or torch.where")
    if not all(isinstance(k, TensorValue) and k.example.numel() == 1 for k in keys) \
            or len({kind(k, grad=False) for k in keys}) != 1:
        raise Unsupported(f"{what} that are not one-element tensors of one kind",
                          "compare one-element tensors, or use torch.min/torch.max")
    compare = operator.lt if op is min else operator.gt
    reshape = keys[0].example.dim() != 0  # the condition must not broadcast the items
    best, best_key = items[0], keys[0]
    for item, k in zip(items[1:], keys[1:]):
        cond = graph_call(tx, "call_function", compare, [k, best_key], {})
        if reshape:
            cond = graph_call(tx, "call_method", "reshape", [cond, const(())], {})
        best = graph_call(tx, "call_function", torch.where, [cond, item, best], {})
        best_key = best if keys is items else graph_call(tx, "call_function", torch.where, [cond, k, best_key], {})
    return best


# -- recording operations --------------------------------------------------------------------------

def graph_call(tx, kind: str, target, args: list[Value], kwargs: dict[str, Value], *, impure=False,
               run_example=None) -> Value:
    """Record ``target(*args, **kwargs)`` as a graph node, run it on meta tensors, wrap the result.
    ``run_example(convert)``, when given, computes the example result instead (on fake tensors)."""
    args, kwargs = as_graph_inputs(tx, kind, target, args, kwargs)

    def convert(v, tensor):
        """Arguments as the op sees them: tensors through ``tensor``, containers rebuilt."""
        if isinstance(v, (TensorValue, NumberInputValue)):
            return tensor(v)
        if isinstance(v, (TupleValue, ListValue)):
            seq = [convert(x, tensor) for x in v.items]
            return tuple(seq) if isinstance(v, TupleValue) else seq
        if isinstance(v, DictValue):
            return {k: convert(x, tensor) for k, x in v.items.items()}
        if isinstance(v, SymNumberValue):
            return v.graph_arg()
        if isinstance(v, ConstantValue):
            return v.value
        return _meta_of_other(v)

    def to_meta(v):
        return convert(v, lambda t: t.example)

    def to_arg(v):
        return convert(v, lambda t: t.node)

    devices: list[torch.device] = []

    def collect(v):
        if isinstance(v, TensorValue):
            devices.append(v.device)
        elif isinstance(v, (TupleValue, ListValue)):
            for x in v.items:
                collect(x)
        elif isinstance(v, DictValue):
            for x in v.items.values():
                collect(x)

    for a in args:
        collect(a)
    for a in kwargs.values():
        collect(a)

    meta_args = [to_meta(a) for a in args]
    meta_kwargs = {k: to_meta(v) for k, v in kwargs.items()}
    device = _infer_device(kind, target, meta_args, meta_kwargs, devices)
    inplace = impure or _is_inplace(kind, target, kwargs)
    result = example_result(tx, kind, target, args, kwargs, convert, meta_args, meta_kwargs, devices,
                            inplace=inplace, run_example=run_example)

    graph = tx.output.graph
    node_args = tuple(to_arg(a) for a in args)
    node_kwargs = {k: to_arg(v) for k, v in kwargs.items()}
    if kind == "call_method":
        node = graph.call_method(target, node_args, node_kwargs)
    else:
        node = graph.call_function(target, node_args, node_kwargs)
    if inplace:
        node.meta["impure"] = True
    node.meta["val"] = result
    node.meta["device"] = device
    node.meta["stack"] = tx.user_stack()
    return wrap_op_result(tx, node, result, device)


def wrap_op_result(tx, node, result, device) -> Value:
    if isinstance(result, torch.Tensor):
        return TensorValue(node)
    if isinstance(result, (tuple, list)):
        graph = tx.output.graph
        items: list[Value] = []
        for i, r in enumerate(result):
            if isinstance(r, torch.Tensor):
                item = graph.call_function(operator.getitem, (node, i))
                item.meta["val"] = r
                item.meta["device"] = device
                items.append(TensorValue(item))
            elif isinstance(r, (tuple, list)):
                item = graph.call_function(operator.getitem, (node, i))
                item.meta["val"] = r
                item.meta["device"] = device
                items.append(wrap_op_result(tx, item, r, device))
            else:
                items.append(const(r))
        kind = type(result)
        fields = getattr(kind, "_fields", None) or getattr(kind, "__match_args__", None)
        if isinstance(result, list):
            return ListValue(items)
        # ``x.max(1)`` gives a torch.return_types.max, and so must the compiled function: its
        # caller may read ``.values`` or check the type.
        named = hasattr(kind, "n_sequence_fields") or hasattr(kind, "_fields")
        return TupleValue(items, cls=kind if named else None, names=tuple(fields) if fields else None)
    if result is None or isinstance(result, (torch.dtype, torch.Size)) \
            or (isinstance(result, (bool, int, float, torch.SymInt, torch.SymBool))
                and target_name(node) in _METADATA_QUERIES):
        # An op run for its effect (in-place) or a metadata query; the node stays if impure.
        return const(result)
    if isinstance(result, (bool, int, float)):
        # The example knows shapes and dtypes, not memory or values: is_pinned(), is_shared(),
        # is_inference() would answer for the meta example, not the real tensor.
        tx.output.graph.erase_node(node)
        raise ExampleOnlyAnswer(f"{_readable(node.op, node.target)}, which depends on the real "
                                "tensor's memory or values", _DATA_HINT)
    raise Unsupported(f"{_readable(node.op, node.target)} returned a {type(result).__name__}, which framejit cannot track")


class ExampleOnlyAnswer(Unsupported):
    """A call on tensors returned a Python number that only the real tensors would give (their
    memory, device or values): a Python helper of torch is inlined instead, anything else breaks."""


#: Calls that return a Python number or bool that depends only on shapes, strides and dtypes,
#: which the example has (by function or method name).
_METADATA_QUERIES = frozenset(_META_METHODS | {
    "is_same_size", "can_cast", "is_nonzero_size", "sym_size", "sym_stride",
    "sym_numel", "get_device", "is_tensor",
})


def _meta_of_other(v: Value):
    raise Unsupported(f"passing {v.describe()} to a torch function")


def _is_inplace(kind, target, kwargs) -> bool:
    """fx_ir's in-place rule, reading a constant ``inplace=`` argument by its value."""
    flag = kwargs.get("inplace")
    if flag is not None and flag.is_constant():
        kwargs = {**kwargs, "inplace": flag.as_constant()}
    return is_inplace(kind, target, kwargs)


def _infer_device(kind, target, args, kwargs, devices) -> torch.device:
    dev = kwargs.get("device")
    if dev is not None:
        return torch.device(dev)
    if kind == "call_method":
        if target in ("to", "cuda", "cpu"):
            if target == "cuda":
                return torch.device("cuda", args[1] if len(args) > 1 and isinstance(args[1], int) else None)
            if target == "cpu":
                return torch.device("cpu")
            for a in args[1:]:
                if isinstance(a, (str, torch.device)):
                    return torch.device(a)
    if devices:
        for d in devices:
            if d.type != "cpu":
                return d
        return devices[0]
    return torch.get_default_device()
