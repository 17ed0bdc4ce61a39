"""What the entry function does when its graph raises: run the frame again as plain Python.

The graph runs before anything else the frame does becomes visible (side effects are replayed
after it), so when it raises, running the frame's own code from the start gives exactly what
eager gives: the user's ``try`` catches the error, context managers' ``__exit__`` run, and every
side effect before the failing operation happens. That is only true if the failed graph left
nothing behind:

* a graph that only computes new tensors leaves nothing: it is run again at once;
* a graph that changes tensors from outside in place (``x.add_(1)``, BatchNorm's running stats)
  or draws random numbers has changed the world before it raised. For graphs that may raise at
  run time (:func:`may_raise`: operations whose errors depend on values, such as an integer
  division by a tensor holding a zero, or an in-place
  operation that may read the memory it writes), the entry function saves those tensors (and
  the random generators' state) before the graph and puts them back before running the frame
  again. Other such graphs are not expected to raise; if one does, the error goes on as it is.
"""

from __future__ import annotations

import types
from dataclasses import dataclass

import torch

from .. import _C
from ..fx_ir import VIEW_NAMES, is_inplace, target_name
from . import compat

#: Operations whose errors depend on the values of their inputs (not checked on meta examples).
_VALUE_CHECKED = frozenset({
    "cholesky", "linalg_cholesky", "cholesky_ex", "inverse", "linalg_inv", "inv", "solve",
    "linalg_solve", "cholesky_solve", "cholesky_inverse", "lu", "lu_factor", "linalg_lu_factor",
    "det", "logdet", "slogdet", "matrix_power", "pinverse", "eig", "eigh", "svd", "lstsq",
    "index_select", "gather", "scatter", "scatter_", "scatter_add", "scatter_add_", "scatter_reduce",
    "index_add", "index_add_", "index_copy", "index_copy_", "index_fill", "index_fill_",
    "index_put", "index_put_", "take", "take_along_dim", "embedding", "embedding_bag",
    "one_hot", "multinomial", "bincount", "repeat_interleave", "_assert", "_assert_async",
    "masked_select", "nonzero", "searchsorted", "bucketize", "cross_entropy", "nll_loss",
})
#: Divisions, which raise for an integer divisor holding a zero (a float one gives inf or NaN).
_DIVISIONS = frozenset({
    "floordiv", "__floordiv__", "__rfloordiv__", "ifloordiv", "__ifloordiv__", "floor_divide",
    "floor_divide_", "mod", "__mod__", "__rmod__", "imod", "__imod__", "remainder", "remainder_",
    "fmod", "fmod_", "div", "div_", "divide", "divide_",
})
#: Indexing, which raises for an index tensor holding an index out of range.
_INDEXING = frozenset({"getitem", "__getitem__", "setitem", "__setitem__"})


@dataclass
class RerunPlan:
    """How to run a frame again after its graph raised: ``saved`` are the graph inputs
    (placeholders) it changes in place, to copy before the graph and put back after a failure;
    ``random`` says whether to put the random generators back too."""

    saved: list
    random: bool


def _is_inplace(node) -> bool:
    """Whether ``node`` writes into a tensor argument (its first, or ``out=``)."""
    if "out" in node.kwargs:
        return True
    first = node.args[0] if node.args else None
    if isinstance(first, (tuple, list)) and first:  # torch._foreach_add_([a, b], 1)
        first = first[0]
    if not isinstance(getattr(first, "meta", {}).get("val"), torch.Tensor):
        return False  # `n += 1` on a number carried in as an input is no write
    return is_inplace(node.op, node.target, node.kwargs)


def root(node):
    """The node whose memory ``node``'s value may share: through views and in-place results
    back to an input or to the operation that allocated it."""
    while node.op in ("call_function", "call_method") and node.args \
            and (target_name(node) in VIEW_NAMES or _is_inplace(node)) and hasattr(node.args[0], "op"):
        node = node.args[0]
    return node


#: Functions that write tensors besides their first argument: the normalizations' running
#: statistics (written when training), by name and position. ``torch.batch_norm`` is what
#: ``F.batch_norm`` calls; the names cover the functions however they are captured.
_RUNNING_STATS = {
    "batch_norm": {"running_mean": 1, "running_var": 2},
    "instance_norm": {"running_mean": 1, "running_var": 2},
}
_TORCH_BATCH_NORM = {"running_mean": 3, "running_var": 4}


def _other_writes(node):
    """The arguments other than the first that ``node`` may write in place (BatchNorm's running
    statistics), as nodes."""
    if node.op != "call_function":
        return []
    positions = _TORCH_BATCH_NORM if node.target is torch.batch_norm else _RUNNING_STATS.get(target_name(node))
    if not positions:
        return []
    found = []
    for keyword, index in positions.items():
        arg = node.kwargs.get(keyword, node.args[index] if len(node.args) > index else None)
        if hasattr(arg, "op"):
            found.append(arg)
    return found


def _written(node) -> list:
    """The nodes an in-place ``node`` writes: its ``out=`` tensors (``torch.add(x, y, out=y)``
    writes y, not x), else its first argument (each tensor of a ``_foreach_*_`` list)."""
    out = node.kwargs.get("out")
    if out is not None:
        return [o for o in (out if isinstance(out, (tuple, list)) else (out,)) if hasattr(o, "op")]
    first = node.args[0] if node.args else None
    if isinstance(first, (tuple, list)):  # torch._foreach_add_([a, b], 1)
        return [t for t in first if hasattr(t, "op")]
    return [first] if hasattr(first, "op") else []


def _tensor_args(node):
    for a in list(node.args[1:]) + list(node.kwargs.values()):
        if hasattr(a, "op"):
            yield a


def _indexes_by_tensor(node) -> bool:
    index = node.args[1] if len(node.args) > 1 else None
    items = index if isinstance(index, (tuple, list)) else (index,)
    return any(isinstance(getattr(i, "meta", {}).get("val"), torch.Tensor) for i in items)


def _divides_integers(node) -> bool:
    """An integer division (its result is an integer tensor: ``torch.div`` without a rounding
    mode gives floats and never raises)."""
    out = node.meta.get("val")
    return target_name(node) in _DIVISIONS and isinstance(out, torch.Tensor) and not (
        out.dtype.is_floating_point or out.dtype.is_complex or out.dtype == torch.bool)


def may_raise(graph, same_memory) -> bool:
    """Whether the graph may raise when it runs although its example run did not: an
    operation whose errors depend on values, or an in-place operation reading memory it may
    also write (``x.sub_(x[1])`` raises when the real tensors overlap; ``same_memory(a, b)``
    says whether two inputs share memory in this call)."""
    for node in graph.nodes:
        if node.op not in ("call_function", "call_method"):
            continue
        name = target_name(node)
        if name in _VALUE_CHECKED or (name in _INDEXING and _indexes_by_tensor(node)) \
                or _divides_integers(node):
            return True
        if _is_inplace(node):
            if "out" in node.kwargs:
                reads = [a for a in node.args if hasattr(a, "op")]
                reads += [v for k, v in node.kwargs.items() if k != "out" and hasattr(v, "op")]
            else:
                reads = list(_tensor_args(node))
            for written in map(root, _written(node)):
                if any(root(a) is written or same_memory(root(a), written) for a in reads):
                    return True
    return False


def plan(graph, is_state_switch, same_memory) -> RerunPlan | None:
    """How to run the frame again if ``graph`` raises; None where that cannot be exact."""
    saved: dict = {}
    random = False
    for node in graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        if node.op == "call_function" and is_state_switch(node.target):
            continue  # put back by the entry function's own handlers
        writes = _other_writes(node)
        if node.meta.get("impure") or node.is_impure():
            if node.op == "call_module":
                return None
            if _is_inplace(node) and _written(node):
                writes += _written(node)
            else:
                random = True  # a random draw (or another effect): put the generators back
        for arg in writes:
            written = root(arg)
            if written.op == "placeholder":
                saved[written] = None
            elif written.op == "get_attr":
                return None
            # else: a tensor the graph made itself changes, which nobody outside sees
    if (saved or random) and not may_raise(graph, same_memory):
        return None  # not expected to raise; saving on every call would cost for nothing
    return RerunPlan(list(saved), random)


def raised_by_signal_handler(exc: BaseException) -> bool:
    """Whether ``exc`` came from a Python signal handler (a SIGALRM timeout) that ran while the
    graph did: that is the caller's exception, not the graph's, and must go on as it is."""
    import signal

    handlers = set()
    for sig in signal.valid_signals():
        try:
            code = getattr(signal.getsignal(sig), "__code__", None)
        except (ValueError, OSError):
            continue
        if code is not None:
            handlers.add(code)
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code in handlers:
            return True
        tb = tb.tb_next
    return False


def save_inputs(*tensors):
    """Used by entry functions: copies of the inputs a graph changes in place."""
    with torch.no_grad():
        return [t.detach().clone() for t in tensors]


def restore_inputs(saved, tensors) -> None:
    """Used by entry functions after a failed graph: the inputs as they were before it."""
    with torch.no_grad():
        for s, t in zip(saved, tensors):
            t.copy_(s)


class RandomState:
    """The random generators' state, to put back later: before a capture (nothing capture runs
    may move the user's random stream) and before a graph that may be run again."""

    def __init__(self):
        self.cpu = torch.random.get_rng_state()
        self.cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None

    def restore(self):
        torch.random.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)


def native_rerun(code: types.CodeType, f_globals: dict):
    """``rerun(*argument_slots, *closure_cells)``: call a function of ``code`` with capture off,
    rebuilding the call from the frame's argument slots (positional, keyword-only, ``*args``,
    ``**kwargs``) as the trampoline passes them."""
    nargs, nkw = code.co_argcount, code.co_kwonlyargcount
    kwnames = code.co_varnames[nargs:nargs + nkw]
    varargs = bool(code.co_flags & compat.CO_VARARGS)
    varkw = bool(code.co_flags & compat.CO_VARKEYWORDS)
    nslots = compat.arg_slot_count(code)

    def rerun(*slots):
        fn = types.FunctionType(code, f_globals, code.co_name, None, tuple(slots[nslots:]) or None)
        args = list(slots[:nargs])
        kwargs = dict(zip(kwnames, slots[nargs:nargs + nkw]))
        i = nargs + nkw
        if varargs:
            args.extend(slots[i])
            i += 1
        if varkw:
            kwargs.update(slots[i])
        return _C.CompiledFunction(fn, None)(*args, **kwargs)

    return rerun
