"""One operation of a graph.

A ``Node`` records *what* to compute (``op``, ``target``, ``args``, ``kwargs``) and keeps the
def-use edges of the graph up to date: every node listed anywhere inside ``args``/``kwargs`` has
this node in its ``users``. The graph owns the order of nodes (a doubly linked list through
``_prev``/``_next``), so inserting or erasing a node is O(1) and iteration survives erasing the
node being visited.

Example::

    g = Graph()
    x = g.placeholder("x")
    y = g.call_function(torch.relu, (x,))
    assert list(x.users) == [y] and y.all_input_nodes == [x]
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from .graph import Graph

# The six operations of torch.fx, with the same meaning:
#   placeholder    a function input; target is its name, args is () or (default,)
#   get_attr       loads a qualified attribute ("linear.weight") of the owning module
#   call_function  target(*args, **kwargs) for a Python callable
#   call_method    getattr(args[0], target)(*args[1:], **kwargs), target a method name
#   call_module    the submodule at qualified name target, called with args/kwargs
#   output         args[0] is the (nested) value the graph returns
OPS = ("placeholder", "get_attr", "call_function", "call_method", "call_module", "output")

# Python's in-place operators write into their first argument: ``a += b`` on a tensor becomes
# operator.iadd, ``a[i] = v`` operator.setitem; as tensor methods, ``__iadd__``, ``__setitem__``.
INPLACE_OPERATORS: frozenset[Any] = frozenset(
    {
        operator.setitem,
        operator.iadd,
        operator.isub,
        operator.imul,
        operator.itruediv,
        operator.ifloordiv,
        operator.imod,
        operator.ipow,
        operator.imatmul,
        operator.iand,
        operator.ior,
        operator.ixor,
        operator.ilshift,
        operator.irshift,
    }
)
_INPLACE_DUNDERS = frozenset(
    {"__setitem__"}
    | {f"__i{op}__" for op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow")}
    | {f"__i{op}__" for op in ("matmul", "and", "or", "xor", "lshift", "rshift")}
)

# Functions that have an effect beyond their result: the in-place operators, delitem (mutates
# its container), assertions and the random generator's state.
_SIDE_EFFECT_FUNCTIONS: frozenset[Any] = INPLACE_OPERATORS | frozenset(
    {
        operator.delitem,
        torch.Tensor.__setitem__,
        torch.Tensor.__delitem__,
        torch._assert,
        torch.manual_seed,
        torch.seed,
        torch.set_rng_state,
    }
)

# Random functions draw from the global generator: removing an unused one would shift every
# later random number, so the compiled program would no longer match eager mode bit for bit.
_RANDOM_FUNCTIONS: frozenset[Any] = frozenset(
    {
        torch.rand,
        torch.randn,
        torch.randint,
        torch.rand_like,
        torch.randn_like,
        torch.randint_like,
        torch.randperm,
        torch.bernoulli,
        torch.multinomial,
        torch.normal,
        torch.poisson,
        torch.dropout,
        torch.feature_dropout,
        torch.alpha_dropout,
        torch.feature_alpha_dropout,
        torch.nn.functional.dropout,
        torch.nn.functional.dropout1d,
        torch.nn.functional.dropout2d,
        torch.nn.functional.dropout3d,
        torch.nn.functional.alpha_dropout,
        torch.nn.functional.feature_alpha_dropout,
        torch.nn.functional.rrelu,
    }
)

# Tensor methods that mutate or draw random numbers although their name has no trailing "_".
_SIDE_EFFECT_METHODS = _INPLACE_DUNDERS | frozenset(
    {"__delitem__", "bernoulli", "multinomial", "record_stream"}
)


def _is_inplace_name(name: str) -> bool:
    """``add_``, ``copy_``, ``relu_`` mutate their first argument; dunders such as ``__add__`` do
    not."""
    return name.endswith("_") and not name.endswith("__")


#: Operations whose result may share memory with their first argument, by name: views (for
#: an aten overload, its packet's name: ``split`` for ``aten.split.Tensor``) and the
#: conversions that return their input when there is nothing to convert.
VIEW_NAMES = frozenset({
    "view", "view_as", "reshape", "reshape_as", "flatten", "unflatten", "squeeze", "unsqueeze",
    "transpose", "t", "T", "mT", "H", "mH", "permute", "expand", "expand_as", "narrow", "select",
    "slice", "getitem", "__getitem__", "unbind", "split", "chunk", "tensor_split", "diagonal",
    "as_strided", "detach", "alias", "contiguous", "to", "type", "type_as", "float", "double",
    "half", "bfloat16", "int", "long", "bool", "movedim", "moveaxis", "swapaxes", "swapdims",
    "unfold", "real", "imag", "view_as_real", "view_as_complex", "data", "getattr",
    "split_with_sizes", "hsplit", "vsplit", "dsplit", "squeeze_", "unsqueeze_", "transpose_",
    "t_", "requires_grad_",
})

#: The ops of VIEW_NAMES whose result is always a view of their first argument, starting at an
#: offset from that argument's start that its layout and the other arguments decide (so not
#: reshape, which may copy, nor as_strided, whose offset counts from the storage's start).
OFFSET_VIEW_NAMES = frozenset({
    "view", "view_as", "narrow", "select", "slice", "getitem", "__getitem__", "transpose", "t",
    "permute", "squeeze", "unsqueeze", "expand", "expand_as", "unbind", "split", "chunk",
    "tensor_split", "split_with_sizes", "movedim", "moveaxis", "swapaxes", "swapdims",
    "diagonal", "unfold", "detach", "alias", "unflatten", "real", "imag",
})


def name_of(target: Any) -> str:
    """A call target's name: a method's name itself, else the target's ``__name__``
    (``split.Tensor`` for an aten overload); "" for neither."""
    return target if isinstance(target, str) else getattr(target, "__name__", "")


def target_name(node: Node) -> str:
    """The name of what ``node`` calls (:func:`name_of` its target)."""
    return name_of(node.target)


def on_cpu(node: Node) -> bool:
    """Whether ``node`` computes on CPU tensors (its meta values carry no device: capture and the
    passes note it in ``meta["device"]``), where some eager kernels differ from CUDA's."""
    return torch.device(node.meta.get("device", "cpu")).type == "cpu"


def is_inplace(op: str, target: Any, kwargs: Any = None) -> bool:
    """Whether a ``call_function``/``call_method`` writes into its first argument or ``out=``.

    The one in-place rule of framejit: a name ending in a single ``_`` (``x.add_(y)``,
    ``torch.relu_``, ``torch.Tensor.copy_``), Python's in-place operators (``operator.iadd``,
    ``operator.setitem``, ``x.__iadd__``), an aten/prims overload whose schema writes its first
    argument (``aten.add_.Tensor``), and any call with ``out=`` or ``inplace=True`` in
    ``kwargs``. ``add`` and ``__add__`` are not in-place; neither are random draws (see
    :meth:`Node.is_impure`)::

        is_inplace("call_method", "add_")                    # True
        is_inplace("call_function", operator.iadd)           # True
        is_inplace("call_function", torch.add, {"out": z})   # True
        is_inplace("call_function", torch.add)               # False
    """
    if kwargs and ("out" in kwargs or kwargs.get("inplace") is True):
        return True
    if op == "call_method":
        return isinstance(target, str) and (_is_inplace_name(target) or target in _INPLACE_DUNDERS)
    if op != "call_function":
        return False
    if isinstance(target, torch._ops.OpOverload):
        return _overload_writes_its_first(target)
    try:
        if target in INPLACE_OPERATORS:
            return True
    except TypeError:  # an unhashable callable is simply not in the table
        pass
    name = getattr(target, "__name__", "")
    return isinstance(name, str) and (_is_inplace_name(name) or name in _INPLACE_DUNDERS)


class Node:
    """A single operation in a :class:`~framejit.fx_ir.Graph`.

    Create nodes through the graph (``graph.call_function(...)``), never directly: the graph
    assigns the unique name and links the node into its order.

    Attributes:
        graph:  the owning graph.
        name:   unique, a valid Python identifier; also the variable in generated code.
        op:     one of :data:`OPS`.
        target: the callable (call_function), method name (call_method), qualified attribute
                name (get_attr, call_module), input name (placeholder) or "output".
        users:  the nodes that use this one, in the order they started to (dict used as an
                ordered set; values are always None).
        meta:   free-form facts about the node; passes store results here, e.g. ``meta["val"]``
                is an example value (usually a meta tensor) and ``meta["impure"]`` overrides
                :meth:`is_impure`.
    """

    __slots__ = (
        "graph",
        "name",
        "op",
        "target",
        "_args",
        "_kwargs",
        "_input_nodes",
        "users",
        "meta",
        "_prev",
        "_next",
        "_erased",
    )

    def __init__(
        self,
        graph: Graph,
        name: str,
        op: str,
        target: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        if op not in OPS:
            raise ValueError(f"unknown node op {op!r}; expected one of {', '.join(OPS)}")
        if op in ("call_method", "get_attr", "call_module") and not isinstance(target, str):
            raise TypeError(f"{op} node {name!r} needs a str target, got {target!r}")
        if op == "call_function" and not callable(target):
            raise TypeError(f"call_function node {name!r} needs a callable target, got {target!r}")
        self.graph = graph
        self.name = name
        self.op = op
        self.target = target
        self.users: dict[Node, None] = {}
        self.meta: dict[str, Any] = {}
        self._args: tuple[Any, ...] = ()
        self._kwargs: dict[str, Any] = {}
        self._input_nodes: dict[Node, None] = {}
        # A node points at itself until the graph links it in.
        self._prev: Node = self
        self._next: Node = self
        self._erased = False
        self._set_args_kwargs(tuple(args), dict(kwargs))

    # ----------------------------------------------------------------------------------------
    # args / kwargs: every assignment goes through _set_args_kwargs so `users` stays right.

    @property
    def args(self) -> tuple[Any, ...]:
        """Positional arguments; Nodes may be nested in tuples, lists, dicts and slices.

        Assign a new tuple to change them (``node.args = (a, 1)``); mutating a list inside
        ``args`` in place bypasses the bookkeeping of ``users`` (``graph.lint()`` reports it).
        """
        return self._args

    @args.setter
    def args(self, value: tuple[Any, ...]) -> None:
        self._set_args_kwargs(tuple(value), self._kwargs)

    @property
    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments; same rules as :attr:`args`."""
        return self._kwargs

    @kwargs.setter
    def kwargs(self, value: dict[str, Any]) -> None:
        self._set_args_kwargs(self._args, dict(value))

    def update_arg(self, index: int, value: Any) -> None:
        """Replace positional argument ``index``."""
        args = list(self._args)
        args[index] = value
        self.args = tuple(args)

    def update_kwarg(self, key: str, value: Any) -> None:
        """Set keyword argument ``key``."""
        self.kwargs = {**self._kwargs, key: value}

    def _set_args_kwargs(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        new_inputs: dict[Node, None] = {}
        _collect_nodes(args, new_inputs)
        _collect_nodes(kwargs, new_inputs)
        for n in new_inputs:
            if n.graph is not self.graph:
                raise ValueError(
                    f"node {self.name!r} cannot use {n.name!r}: it belongs to another graph. "
                    f"Copy it into this graph first (graph.node_copy) and use the copy."
                )
            if n._erased:
                raise ValueError(
                    f"node {self.name!r} cannot use {n.name!r}: that node was erased from "
                    f"the graph."
                )
        for old in self._input_nodes:
            if old not in new_inputs:
                old.users.pop(self, None)
        for new in new_inputs:
            new.users.setdefault(self, None)
        self._args = args
        self._kwargs = kwargs
        self._input_nodes = new_inputs

    @property
    def all_input_nodes(self) -> list[Node]:
        """Every distinct node used by ``args`` and ``kwargs``, in order of first appearance."""
        return list(self._input_nodes)

    # ----------------------------------------------------------------------------------------
    # rewriting uses

    def replace_all_uses_with(
        self,
        replace_with: Node,
        delete_user_cb: Callable[[Node], bool] | None = None,
    ) -> list[Node]:
        """Make every user of this node use ``replace_with`` instead; returns those users.

        ``replace_with`` itself is skipped when it is a user (the common ``y = f(x);
        x.replace_all_uses_with(y)`` would otherwise make ``y`` use itself).
        ``delete_user_cb(user)`` returning False keeps that user unchanged.
        """
        changed = []
        for user in list(self.users):
            if user is replace_with:
                continue
            if delete_user_cb is not None and not delete_user_cb(user):
                continue
            user.replace_input_with(self, replace_with)
            changed.append(user)
        return changed

    def replace_input_with(self, old: Node, new: Any) -> None:
        """Replace every occurrence of node ``old`` in this node's args and kwargs by ``new``."""

        def swap(n: Node) -> Any:
            return new if n is old else n

        self._set_args_kwargs(map_arg(self._args, swap), map_arg(self._kwargs, swap))

    # ----------------------------------------------------------------------------------------
    # position in the graph

    @property
    def next(self) -> Node:
        """The following node (the graph's sentinel after the last node)."""
        return self._next

    @property
    def prev(self) -> Node:
        """The preceding node (the graph's sentinel before the first node)."""
        return self._prev

    def prepend(self, other: Node) -> None:
        """Move ``other`` to just before this node."""
        if other is self:
            return
        other._unlink()
        p = self._prev
        p._next, other._prev, other._next, self._prev = other, p, self, other

    def append(self, other: Node) -> None:
        """Move ``other`` to just after this node."""
        self._next.prepend(other)

    def _unlink(self) -> None:
        # The node keeps its own _prev/_next, so an iterator standing on it can still step on.
        p, n = self._prev, self._next
        p._next, n._prev = n, p

    # ----------------------------------------------------------------------------------------
    # facts

    def is_impure(self) -> bool:
        """Whether removing this node (when nothing uses it) would change the program.

        True for placeholders and the output (they make up the function's signature), for
        modules (they may update buffers, e.g. BatchNorm's running stats), for in-place and
        otherwise side-effecting calls (a name ending in a single ``_`` such as ``add_``,
        setitem, ``a += b``, an ``out=`` argument, an aten overload whose schema writes to an
        argument such as ``aten.copy_.default``), and for random ops (dropping one would change
        later random numbers; for aten overloads, those tagged ``nondeterministic_seeded``). ``meta["impure"]`` set to True or False overrides the rules.
        """
        if "impure" in self.meta:
            return bool(self.meta["impure"])
        if self.op in ("placeholder", "output", "call_module"):
            return True
        if self.op not in ("call_function", "call_method"):
            return False
        if is_inplace(self.op, self.target, self._kwargs):
            return True
        if self.op == "call_method":
            return self.target in _SIDE_EFFECT_METHODS
        if isinstance(self.target, torch._ops.OpOverload):
            return _overload_is_impure(self.target)
        try:
            if self.target in _SIDE_EFFECT_FUNCTIONS or self.target in _RANDOM_FUNCTIONS:
                return True
        except TypeError:  # an unhashable callable is simply not in the tables
            pass
        return False

    def format(self) -> str:
        """This node as one line of ``str(graph)``, e.g. ``%add : f32[4] = operator.add(%x, 1)``."""
        from .printing import format_node

        return format_node(self)

    def __repr__(self) -> str:
        return self.name


@functools.cache
def _overload_writes_its_first(target: torch._ops.OpOverload) -> bool:
    """Whether an aten/prims overload's schema writes its first argument (kept per overload,
    as :func:`_overload_is_impure`)."""
    arguments = target._schema.arguments
    alias = arguments[0].alias_info if arguments else None
    return alias is not None and alias.is_write


@functools.cache
def _overload_is_impure(target: torch._ops.OpOverload) -> bool:
    """aten/prims overloads say it in their schema and tags: ``copy_`` and ``out=`` variants
    write to an argument, ``rand_like`` draws from the generator. (Asked for every node in
    every pass: the answer per overload is kept.)"""
    return target._schema.is_mutable or torch.Tag.nondeterministic_seeded in target.tags


# --------------------------------------------------------------------------------------------
# walking nested arguments


def map_aggregate(a: Any, fn: Callable[[Any], Any]) -> Any:
    """Apply ``fn`` to every leaf of ``a``, rebuilding tuples, lists, dicts and slices.

    A container whose leaves all map to themselves is returned as is, so constants such as
    ``torch.Size`` or named tuples keep their type.
    """
    kind = type(a)
    if kind in _LEAF_TYPES:  # the common leaves, at one set lookup instead of four tests
        return fn(a)
    if kind is tuple or isinstance(a, tuple):
        items = [map_aggregate(x, fn) for x in a]
        if all(x is y for x, y in zip(items, a)):
            return a
        if kind is tuple:
            return tuple(items)
        if hasattr(a, "_fields"):  # a named tuple takes its fields positionally
            return kind(*items)
        try:
            return kind(items)
        except TypeError:  # e.g. torch.Size cannot hold a Node: fall back to a plain tuple
            return tuple(items)
    if kind is list or isinstance(a, list):
        return [map_aggregate(x, fn) for x in a]
    if kind is dict or isinstance(a, dict):
        return {k: map_aggregate(v, fn) for k, v in a.items()}
    if kind is slice:
        start, stop, step = (map_aggregate(x, fn) for x in (a.start, a.stop, a.step))
        if start is a.start and stop is a.stop and step is a.step:
            return a
        return slice(start, stop, step)
    return fn(a)


#: Types that are never containers (exact types: a subclass of one is tested as usual).
_LEAF_TYPES = frozenset({Node, int, float, bool, str, type(None), torch.dtype, torch.device,
                         torch.memory_format, torch.layout})


def _collect_nodes(a: Any, found: dict) -> None:
    """Add every Node inside ``a`` (as :func:`map_arg` walks it) to ``found``, in order: what
    a node's inputs are, without rebuilding its arguments."""
    if isinstance(a, Node):
        found[a] = None
    elif isinstance(a, (tuple, list)):
        for x in a:
            _collect_nodes(x, found)
    elif isinstance(a, dict):
        for x in a.values():
            _collect_nodes(x, found)
    elif type(a) is slice:
        for x in (a.start, a.stop, a.step):
            _collect_nodes(x, found)


def map_arg(a: Any, fn: Callable[[Node], Any]) -> Any:
    """Apply ``fn`` to every Node inside ``a``; other leaves are kept."""
    return map_aggregate(a, lambda x: fn(x) if isinstance(x, Node) else x)
