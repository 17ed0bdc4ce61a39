"""What the rewriting passes share: creating nodes with their meta values, a builder that
replaces one node by a small computation, and rule tables keyed by call target.

A *rule* is a function ``rule(b, <the call's own arguments>) -> Node | None``: Python binds the
node's args and kwargs to the rule's parameters, so a rule is written with torch's parameter
names and defaults (``def add(b, input, other, *, alpha=1)``) and a call that does not fit is
simply not rewritten. The rule builds the replacement with ``b`` and returns it, or returns None
to leave the node alone::

    RULES = RuleTable()

    @RULES.register(torch.exp, "exp")
    def exp(b, input):
        return b(aten.exp.default, input) if is_tensor(input) else None

    apply_rules(graph, RULES)
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Iterable
from typing import Any

import torch

from ..fx_ir import Graph, Node, map_arg, run_on_meta, target_name
from .symbolic import SYMBOLIC

aten = torch.ops.aten
prims = torch.ops.prims

HALF_DTYPES = (torch.float16, torch.bfloat16)


# --------------------------------------------------------------------------------------------
# reading operands


def val(x: Any) -> Any:
    """The example value of a node (``meta["val"]``); None for anything else."""
    return x.meta.get("val") if isinstance(x, Node) else None


def is_tensor(x: Any) -> bool:
    """A node whose example value is a dense (strided) tensor."""
    v = val(x)
    return isinstance(v, torch.Tensor) and v.layout is torch.strided


def is_number(x: Any) -> bool:
    """A Python int, float or bool (not a node, not complex, not a numpy scalar)."""
    return type(x) in (int, float, bool)


def is_float_tensor(x: Any) -> bool:
    """A tensor node of a real floating-point dtype."""
    return is_tensor(x) and val(x).dtype.is_floating_point


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype eager computes in: fp32 for fp16/bf16, the dtype itself otherwise."""
    return torch.float32 if dtype in HALF_DTYPES else dtype


_INT64 = torch.iinfo(torch.int64)


def number_fits(value: Any, dtype: torch.dtype) -> bool:
    """Whether eager converts the Python number ``value`` to ``dtype`` without raising "value
    cannot be converted to type ... without overflow".

    Ops that take a number as an argument of the tensor's own dtype (``clamp``'s bounds,
    ``masked_fill``'s and ``where``'s value, ``add``'s ``alpha``) convert it with that check
    (``c10::overflows``), where arithmetic with a number (``x + 1000``) wraps. A kernel would
    wrap too, so a rule leaves a number that does not fit to torch, which raises as eager does.
    Unsigned dtypes take negative ints down to ``-max`` (they wrap, as c10 allows); infinities
    and NaN fit every floating dtype. Complex dtypes are refused (no rule lowers them).
    """
    if type(value) is bool:
        return not dtype.is_complex
    if type(value) is int and not _INT64.min <= value <= _INT64.max:
        return False  # not even a c10::Scalar
    if type(value) not in (int, float) or dtype.is_complex:
        return False
    if dtype.is_floating_point:
        if type(value) is float and (math.isinf(value) or math.isnan(value)):
            return True
        info = torch.finfo(dtype)
        return info.min <= value <= info.max
    if type(value) is float and math.isnan(value):
        return False
    low, high = (0, 1) if dtype == torch.bool else (torch.iinfo(dtype).min, torch.iinfo(dtype).max)
    if low == 0 and type(value) is int and value < 0:
        return -value <= high  # two's-complement wrap of a negative int, as c10 allows
    return low <= value <= high


def normalize_dims(ndim: int, dim: Any, *, empty_means_all: bool = False) -> list[int] | None:
    """``dim`` (None for all, an int, or a list/tuple of ints, possibly negative) as a sorted
    list of distinct non-negative dims; None when it is anything else or out of range.

    An empty list is refused unless ``empty_means_all`` (torch reads ``sum(x, [])`` as every dim
    but the legacy rule is easy to get wrong, so it is left to torch)."""
    if ndim == 0:
        return None
    if dim is None:
        return list(range(ndim))
    if type(dim) is int:
        dims = [dim]
    elif isinstance(dim, (list, tuple)) and all(type(d) is int for d in dim):
        if not dim:
            return list(range(ndim)) if empty_means_all else None
        dims = list(dim)
    else:
        return None
    out = []
    for d in dims:
        if not -ndim <= d < ndim:
            return None
        out.append(d % ndim)
    if len(set(out)) != len(out):
        return None
    return sorted(out)


def same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape and the same strides wherever a stride matters (dims of size > 1)."""
    if a.shape != b.shape:
        return False
    if a.numel() == 0:
        return True
    return all(sa == sb for n, sa, sb in zip(a.shape, a.stride(), b.stride()) if n > 1)



#: Keepdim reductions (the vocabulary's): their example value is contiguous whatever the
#: input's layout, but a kernel computes them into a buffer of our choosing.
KEEPDIM_REDUCTIONS = (aten.amax.default, aten.amin.default, aten.sum.dim_IntList)


def in_input_order(value: Any, source: Any) -> Any:
    """``value`` (a keepdim reduction of ``source``) laid out in ``source``'s dimension order,
    so a reduction of a channels-last tensor (max pooling) stays channels-last and its kernel
    writes in the order it reads."""
    if not isinstance(value, torch.Tensor) or not isinstance(source, torch.Tensor) \
            or value.dim() != source.dim():
        return value
    order = sorted(range(source.dim()), key=lambda d: -source.stride(d))  # outermost first
    strides, step = [0] * value.dim(), 1
    for d in reversed(order):
        strides[d] = step
        step *= value.shape[d]
    if tuple(strides) == value.stride():
        return value
    return torch.empty_strided(value.shape, strides, dtype=value.dtype, device=value.device)


#: Ops whose result's strides are a function of their first argument's (views, and reshapes that
#: view or copy by a rule every device shares), under their torch, method and aten names.
_FOLLOW_THEIR_INPUT = frozenset({
    "view", "view_as", "reshape", "reshape_as", "transpose", "swapaxes", "swapdims", "permute",
    "movedim", "moveaxis", "t", "expand", "expand_as", "squeeze", "unsqueeze", "select", "narrow",
    "slice", "getitem", "flatten", "unflatten", "diagonal", "as_strided", "alias", "detach",
    "contiguous", "_unsafe_view", "unfold",
})


def layout_is_exact(node: Node, known: Any = ()) -> bool:
    """Whether the strides of ``node``'s value at run time are those of its example value.

    True for graph inputs and constants (guarded, real), for nodes in ``known`` (say, kernel
    outputs, allocated as predicted) and for views of those. Any other op's example value comes
    from a meta kernel, which can lay out a result unlike the real kernel (CPU attention on a
    strided query returns (batch, seq, head, dim)-ordered strides where its meta kernel says
    contiguous; capture now gives that op the real kernel's layout, see
    ``capture.examples.cpu_attention_on_meta``, but a run can still pick another kernel):
    decisions that depend on strides must not trust it.
    """
    while True:
        if node.op in ("placeholder", "get_attr") or node in known:
            return True
        if node.op not in ("call_function", "call_method") or not node.args \
                or not isinstance(node.args[0], Node):
            return False
        name = target_name(node).split(".")[0]
        if name not in _FOLLOW_THEIR_INPUT:
            return False
        node = node.args[0]


def rewritable(node: Node) -> bool:
    """Whether a rewriting pass may replace ``node``: a call with a tensor result that does not
    require grad (those keep their composite ops for autograd), no ``out=``, a known device, and
    not kept only for its possible error (``meta["keep"]``)."""
    if node.op not in ("call_function", "call_method"):
        return False
    v = node.meta.get("val")
    if not isinstance(v, torch.Tensor) or v.requires_grad or v.layout is not torch.strided:
        return False
    return "out" not in node.kwargs and "device" in node.meta and not node.meta.get("keep")


# --------------------------------------------------------------------------------------------
# creating nodes


def _short_name(target: Any) -> str:
    # aten.add.Tensor -> "add": the overload name adds nothing to a variable name.
    name = getattr(target, "__name__", None) or type(target).__name__
    return name.split(".")[0]


def emit(
    graph: Graph,
    target: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None = None,
    *,
    like: Node,
) -> Node:
    """``graph.call_function(target, args, kwargs)`` at the current insertion point, with
    ``meta["val"]`` computed by running ``target`` on the meta values of its inputs and
    ``meta["device"]`` (and the user's ``stack``) taken from ``like``, the node being replaced.

    The meta value is computed first (memoised, by fx_ir's :func:`run_on_meta`), so an op that
    refuses its arguments raises (RuntimeError) before anything is added to the graph. It runs
    without autograd: the passes only rewrite nodes that do not require grad.
    """
    kwargs = kwargs or {}
    meta_args = map_arg(args, lambda n: n.meta["val"])
    meta_kwargs = map_arg(kwargs, lambda n: n.meta["val"])
    with torch.no_grad():
        value = run_on_meta("call_function", target, meta_args, meta_kwargs)
    node = graph.call_function(target, args, kwargs, name=_short_name(target))
    node.meta["val"] = value
    node.meta["device"] = like.meta["device"]
    if "stack" in like.meta:
        node.meta["stack"] = like.meta["stack"]
    return node


class Builder:
    """Builds the replacement of one node, just before it, and swaps it in.

    ``b(target, *args, **kwargs)`` emits one node; the methods below are shorthands for the
    vocabulary. :meth:`replace` checks the result and makes it stand for the node;
    :meth:`rollback` erases everything built so far.
    """

    def __init__(self, node: Node) -> None:
        self.node = node
        self.graph = node.graph
        self.created: list[Node] = []

    def __call__(self, target: Any, *args: Any, **kwargs: Any) -> Node:
        with self.graph.inserting_before(self.node):
            new = emit(self.graph, target, args, kwargs, like=self.node)
        self.created.append(new)
        return new

    # -- facts about the node being replaced -------------------------------------------------

    @property
    def out(self) -> torch.Tensor:
        """The meta value of the node being replaced (what the replacement must match)."""
        return self.node.meta["val"]

    # -- shorthands --------------------------------------------------------------------------

    def add(self, a: Any, b: Any) -> Node:
        return self(aten.add.Tensor, a, b)

    def sub(self, a: Any, b: Any) -> Node:
        return self(aten.sub.Tensor, a, b)

    def mul(self, a: Any, b: Any) -> Node:
        return self(aten.mul.Tensor, a, b)

    def div(self, a: Any, b: Any) -> Node:
        return self(aten.div.Tensor, a, b)

    def unary(self, name: str, x: Node) -> Node:
        """``aten.<name>.default(x)``, e.g. ``b.unary("exp", x)``."""
        return self(getattr(aten, name).default, x)

    def convert(self, x: Node, dtype: torch.dtype, *, rounds: bool = False) -> Node:
        """``x`` in ``dtype``: x itself when it already is.

        ``rounds``: the program itself converts here (``x.half()``, ``sum(dtype=...)``), so
        the value must be rounded to ``dtype`` even where a kernel goes on computing with it
        in fp32 (``meta["rounds"]``). Without it, the conversion only gives back the dtype of
        a value the passes computed in fp32 (a decomposed softmax), and kernels round such a
        value on store only, as they do every fp16/bf16 result."""
        if val(x).dtype == dtype:
            return x
        node = self(prims.convert_element_type.default, x, dtype)
        if rounds:
            node.meta["rounds"] = True
        return node

    def upcast(self, x: Node) -> Node:
        """fp16/bf16 to fp32 (what eager computes in); other dtypes unchanged."""
        return self.convert(x, compute_dtype(val(x).dtype))

    def sum(self, x: Node, dims: list[int]) -> Node:
        return self(aten.sum.dim_IntList, x, dims, True)

    def mean(self, x: Node, dims: list[int]) -> Node:
        """The keepdim mean over ``dims``: a sum divided by the count, or, while sizes are
        symbolic (the count is a size), ``aten.mean`` itself, which kernels lower alike."""
        if SYMBOLIC.get():
            return self(aten.mean.dim, x, list(dims), True)
        return self.div(self.sum(x, dims), math.prod(val(x).shape[d] for d in dims))

    def squeeze(self, x: Node, dims: list[int]) -> Node:
        return self(aten.squeeze.dims, x, dims)

    def view(self, x: Node, shape: list[int]) -> Node:
        return self(aten.view.default, x, shape)

    def finish_reduction(self, r: Node, dims: list[int], keepdim: bool) -> Node:
        """A keepdim reduction's result converted to the node's dtype, then squeezed unless the
        user asked for keepdim (the squeeze is a view and comes last, after the compute)."""
        r = self.convert(r, self.out.dtype)
        return r if keepdim else self.squeeze(r, dims)

    def _reduce_in_input_order(self, result: Node, want: torch.Tensor) -> bool:
        """Where ``result`` is a keepdim reduction built here (then converted and squeezed), lay
        the reduction's output out in its input's dimension order when that gives ``want``'s
        layout: max pooling of a channels-last tensor then computes straight into a
        channels-last result, reading in the order it writes, instead of gathering across
        channels into NCHW and copying back. True when done; otherwise nothing changed."""
        if SYMBOLIC.get():
            # symbolic_shapes reruns the reduction on fake tensors, which answer contiguous:
            # a chosen layout would make it decline the graph's kernels
            return False
        chain, n = [], result
        while n in self.created and n.target in (aten.squeeze.dims,
                                                  prims.convert_element_type.default):
            chain.append(n)
            n = n.args[0]
        if n not in self.created or n.target not in KEEPDIM_REDUCTIONS \
                or not isinstance(n.args[0], Node):
            return False
        old = {m: m.meta["val"] for m in [n, *chain]}
        n.meta["val"] = in_input_order(old[n], val(n.args[0]))
        for m in reversed(chain):
            m.meta["val"] = run_on_meta(m.op, m.target, map_arg(m.args, val),
                                        map_arg(m.kwargs, val))
        if same_layout(val(result), want):
            return True
        for m, v in old.items():
            m.meta["val"] = v
        return False

    # -- swapping in ---------------------------------------------------------------------------

    def rollback(self) -> None:
        """Erase every node built so far (newest first); the graph is as it was."""
        for new in reversed(self.created):
            self.graph.erase_node(new)
        self.created.clear()

    def replace(self, result: Node) -> bool:
        """Make ``result`` stand for the node and erase the node; True when done.

        ``result`` must have the node's shape and dtype, otherwise everything built is rolled
        back and False returned. Where its strides differ from the node's (a decomposition whose
        eager op returns a contiguous tensor for a transposed input), a clone into the node's
        memory format is added, so later views and the caller see eager's layout.
        """
        node, want = self.node, self.out
        got = val(result)
        if not isinstance(got, torch.Tensor) or got.shape != want.shape or got.dtype != want.dtype:
            self.rollback()
            return False
        if not same_layout(got, want) and not self._reduce_in_input_order(result, want):
            if want.is_contiguous():
                result = self(aten.clone.default, result, memory_format=torch.contiguous_format)
            elif want.dim() == 4 and want.is_contiguous(memory_format=torch.channels_last):
                result = self(aten.clone.default, result, memory_format=torch.channels_last)
            else:
                self.rollback()
                return False
        node.replace_all_uses_with(result)
        self.graph.erase_node(node)
        # A rule may build a node it ends up not using (dropout in eval returns its input).
        for new in reversed(self.created):
            if not new.users and not new.is_impure():
                self.graph.erase_node(new)
        return True


# --------------------------------------------------------------------------------------------
# rule tables


Rule = Callable[..., "Node | None"]


class RuleTable:
    """Rules by call target: callables for call_function nodes, method names for call_method
    nodes. Registering a method name also registers ``torch.Tensor.<name>`` (the same call in
    function form)."""

    def __init__(self) -> None:
        self.rules: dict[Any, Rule] = {}

    def register(self, *targets: Any) -> Callable[[Rule], Rule]:
        def decorator(fn: Rule) -> Rule:
            self.add(targets, fn)
            return fn

        return decorator

    def add(self, targets: Iterable[Any], fn: Rule) -> None:
        for target in targets:
            if target is None:  # a function this torch does not have
                continue
            self.rules[target] = fn
            if isinstance(target, str) and hasattr(torch.Tensor, target):
                self.rules[getattr(torch.Tensor, target)] = fn

    def lookup(self, node: Node) -> Rule | None:
        if node.op not in ("call_function", "call_method"):
            return None
        if node.op == "call_method" and not isinstance(node.target, str):
            return None
        try:
            return self.rules.get(node.target)
        except TypeError:  # an unhashable callable has no rule
            return None

    def __contains__(self, target: Any) -> bool:
        try:
            return target in self.rules
        except TypeError:
            return False


@functools.cache
def _signature(fn: Rule) -> inspect.Signature:
    return inspect.signature(fn)


def rewrite_node(node: Node, rule: Rule) -> bool:
    """Apply ``rule`` to ``node``; True when the node was replaced."""
    if not rewritable(node):
        return False
    b = Builder(node)
    try:
        bound = _signature(rule).bind(b, *node.args, **node.kwargs)
    except TypeError:  # a call form the rule does not take: leave it to torch
        return False
    try:
        result = rule(*bound.args, **bound.kwargs)
    except RuntimeError:
        # An op refused the meta arguments (an unsupported dtype, a shape aten rejects): the
        # node stays as it was and runs in eager torch.
        b.rollback()
        return False
    if result is None:
        b.rollback()
        return False
    return b.replace(result)


def apply_rules(graph: Graph, table: RuleTable) -> bool:
    """Rewrite every node that has a rule in ``table``, in graph order; True if any changed."""
    changed = False
    for node in list(graph.nodes):
        rule = table.lookup(node)
        if rule is not None and rewrite_node(node, rule):
            changed = True
    return changed
