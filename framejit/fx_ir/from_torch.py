"""Conversion from ``torch.fx``: the graphs TorchDynamo hands to a ``torch.compile`` backend (or
any torch.fx graph) become framejit graphs, with ``meta["val"]`` and ``meta["device"]`` filled.

The conversion is node for node: same ops, targets, args, kwargs and node names. The objects of
get_attr and call_module nodes are resolved on the torch.fx module and put into the root dict of
the result under their qualified names; call_module nodes stay call_module nodes. Then meta
values come from :func:`~framejit.fx_ir.propagate_meta` on meta copies of the example inputs,
so real tensors and FakeTensors are both fine (only their shapes, strides, dtypes, devices and
``requires_grad`` are read).

What the torch.fx graph records is used as a check and for devices, never as the values
themselves: where a node has ``meta["example_value"]`` (Dynamo's FakeTensor) or ``meta["val"]``
(make_fx's and export's), its shape and dtype must agree with the propagated value, and its
device becomes ``meta["device"]``. Nodes torch.fx considers impure
(``torch._C._set_grad_enabled(False)``, which has no users) get ``meta["impure"] = True`` so that
framejit's dead code elimination keeps them.

Graphs that cannot be represented raise :class:`UnsupportedGraphError` (a ValueError) before
anything runs: dynamic shapes (SymInt inputs or symbolic sizes), inputs that are neither tensors
nor plain Python constants, tensor subclasses and non-strided tensors, and autocast regions.

Example::

    def my_backend(fx_gm, example_inputs):        # a torch.compile backend
        gm = from_torch_fx(fx_gm, example_inputs)
        return gm.forward_fn
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.fx

from .graph import Graph
from .graph_module import GraphModule
from .meta import MetaPropagationError, describe, propagate_meta, resolve_qualname, to_meta
from .node import Node, map_aggregate

# Python values a placeholder may take besides tensors: they run as they are.
_PLAIN_CONSTANTS = (bool, int, float, complex, str, type(None))
# Meta keys copied from the torch.fx node: framejit's own (to_torch_fx exports them) and Dynamo's
# debugging information. Everything else (FakeTensors, Dynamo's graph arguments holding the real
# example inputs) stays behind.
_COPIED_META = ("impure", "keep", "stack", "stack_trace", "nn_module_stack", "source_fn_stack")


class UnsupportedGraphError(ValueError):
    """A torch.fx graph that :func:`from_torch_fx` cannot convert.

    Cause: the message names the input or node: dynamic shapes (a SymInt input, a size that is a
    symbol), an input that is not a tensor or a plain Python constant, a tensor subclass or a
    sparse tensor, an autocast region, or an operation that cannot run on meta tensors.
    Fix: compile with ``dynamic=False`` (``torch.compile(fn, dynamic=False)``) for dynamic
    shapes; otherwise keep that operation out of the compiled region. The torch.compile backend
    (``backend="framejit"``) catches this error and runs the graph as torch.fx code instead.
    """


def from_torch_fx(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> GraphModule:
    """Convert ``gm`` to a framejit :class:`GraphModule` computing the same function.

    ``example_inputs`` are the values of the placeholders in order (real tensors or
    FakeTensors; fewer are allowed when the remaining placeholders have defaults). Raises
    :class:`UnsupportedGraphError` for graphs framejit cannot represent.
    """
    return _Importer(gm, list(example_inputs)).run()


def _autocast_functions() -> frozenset[Any]:
    """The calls Dynamo records for ``with torch.autocast(...)``. Propagating meta values would
    run them for real (changing the process's autocast state) and autocast does not apply to
    meta tensors, so such graphs are refused."""
    module = getattr(torch.amp, "autocast_mode", None)
    names = ("_enter_autocast", "_exit_autocast")
    return frozenset(f for f in (getattr(module, n, None) for n in names) if f is not None)


def _leaves(value: Any) -> Iterator[Any]:
    """The leaves of ``value`` through tuples, lists and dicts, in order."""
    if isinstance(value, (tuple, list)):
        for item in value:
            yield from _leaves(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _leaves(item)
    else:
        yield value


def _tensors(value: Any) -> list[torch.Tensor]:
    return [x for x in _leaves(value) if isinstance(x, torch.Tensor)]


_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


def _symbolic_text(value: Any) -> str | None:
    """How ``value`` is symbolic (``"has the symbolic shape (s0, 4)"``), or None if it is not."""
    for leaf in _leaves(value):
        if isinstance(leaf, _SYMBOLIC):
            return f"is the symbolic value {leaf}"
        if isinstance(leaf, torch.Tensor):
            sizes = tuple(leaf.shape)
            if any(isinstance(s, _SYMBOLIC) for s in sizes):
                return f"has the symbolic shape ({', '.join(str(s) for s in sizes)})"
            if leaf.layout is torch.strided and any(isinstance(s, _SYMBOLIC) for s in leaf.stride()):
                return "has symbolic strides"
    return None


def _dynamic_shapes(what: str, symbolic: str) -> UnsupportedGraphError:
    return UnsupportedGraphError(
        f"{what} {symbolic} (dynamic shapes, which framejit does not support yet); compile "
        f"with torch.compile(..., dynamic=False)"
    )


def _recorded(fx_node: torch.fx.Node) -> Any:
    """The example value torch recorded for ``fx_node`` (Dynamo's key first), or None."""
    meta = fx_node.meta
    return meta["example_value"] if "example_value" in meta else meta.get("val")


def _is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


def _check_tensor(t: torch.Tensor, what: str) -> None:
    if type(t) not in (torch.Tensor, torch.nn.Parameter) and not _is_fake(t):
        raise UnsupportedGraphError(
            f"{what} is a {type(t).__name__}, a tensor subclass, which is not supported"
        )
    if t.layout is not torch.strided:
        raise UnsupportedGraphError(f"{what} has layout {t.layout}: only dense tensors are supported")


class _Importer:
    def __init__(self, fx_gm: torch.fx.GraphModule, example_inputs: list[Any]) -> None:
        self.fx_gm = fx_gm
        self.example_inputs = example_inputs
        self.graph = Graph()
        self.root: dict[str, Any] = {}
        self.env: dict[torch.fx.Node, Node] = {}
        self.pairs: list[tuple[torch.fx.Node, Node]] = []

    def run(self) -> GraphModule:
        self.check_inputs()
        autocast = _autocast_functions()
        for fx_node in self.fx_gm.graph.nodes:
            if fx_node.op == "call_function" and fx_node.target in autocast:
                raise UnsupportedGraphError(
                    f"the graph has an autocast region (%{fx_node.name}); framejit does not "
                    f"support torch.autocast inside a compiled region yet"
                )
            self.env[fx_node] = node = self.convert(fx_node)
            self.pairs.append((fx_node, node))
        gm = GraphModule(self.root, self.graph, class_name=type(self.fx_gm).__name__)
        self.propagate(gm)
        self.check_and_place()
        return gm

    # -- inputs ------------------------------------------------------------------------------------

    def check_inputs(self) -> None:
        placeholders = [n for n in self.fx_gm.graph.nodes if n.op == "placeholder"]
        if len(self.example_inputs) > len(placeholders):
            raise UnsupportedGraphError(
                f"{len(self.example_inputs)} example inputs for a graph with "
                f"{len(placeholders)} inputs"
            )
        for node, value in zip(placeholders, self.example_inputs):
            what = f"input {node.name!r}"
            symbolic = _symbolic_text(value) or _symbolic_text(_recorded(node))
            if symbolic is not None:
                raise _dynamic_shapes(f"the graph {what}", symbolic)
            if isinstance(value, torch.Tensor):
                _check_tensor(value, what)
            elif not isinstance(value, _PLAIN_CONSTANTS):
                raise UnsupportedGraphError(
                    f"{what} is of type {type(value).__name__}; graph inputs must be tensors "
                    f"or plain Python numbers, strings or None"
                )

    # -- nodes ------------------------------------------------------------------------------------

    def arg(self, a: Any) -> Any:
        """``a`` with torch.fx nodes replaced by ours; torch.fx's immutable lists and dicts
        become plain ones."""
        return map_aggregate(a, lambda x: self.env[x] if isinstance(x, torch.fx.Node) else x)

    def convert(self, fx_node: torch.fx.Node) -> Node:
        op, target, name = fx_node.op, fx_node.target, fx_node.name
        symbolic = _symbolic_text(_recorded(fx_node))
        if symbolic is not None:
            raise _dynamic_shapes(f"%{name} ({fx_node.format_node()})", symbolic)
        if op == "placeholder":
            if fx_node.args:
                node = self.graph.placeholder(name, default=fx_node.args[0])
            else:
                node = self.graph.placeholder(name)
        elif op in ("get_attr", "call_module"):
            self.root[target] = self.resolve(target, fx_node)
            if op == "get_attr":
                node = self.graph.get_attr(target, name=name)
            else:
                node = self.graph.call_module(
                    target, self.arg(fx_node.args), self.arg(fx_node.kwargs), name=name
                )
        elif op == "call_function":
            node = self.graph.call_function(
                target, self.arg(fx_node.args), self.arg(fx_node.kwargs), name=name
            )
        elif op == "call_method":
            node = self.graph.call_method(
                target, self.arg(fx_node.args), self.arg(fx_node.kwargs), name=name
            )
        elif op == "output":
            node = self.graph.output(self.arg(fx_node.args[0]))
        else:
            raise UnsupportedGraphError(f"%{name} has the unknown op {op!r}")
        for key in _COPIED_META:
            if key in fx_node.meta:
                node.meta[key] = fx_node.meta[key]
        if op.startswith("call") and "impure" not in node.meta and _fx_impure(fx_node):
            node.meta["impure"] = True
        return node

    def resolve(self, qualname: str, fx_node: torch.fx.Node) -> Any:
        try:
            value = resolve_qualname(self.fx_gm, qualname)
        except AttributeError as e:
            raise UnsupportedGraphError(f"%{fx_node.name}: {e}") from None
        if isinstance(value, torch.Tensor):
            _check_tensor(value, f"attribute {qualname!r}")
        return value

    # -- meta values and devices -------------------------------------------------------------------

    def propagate(self, gm: GraphModule) -> None:
        # FakeTensors and real tensors alike: only their metadata goes in.
        inputs = [to_meta(x) if isinstance(x, torch.Tensor) else x for x in self.example_inputs]
        grad_enabled = torch.is_grad_enabled()
        try:
            propagate_meta(gm, *inputs)
        except MetaPropagationError as e:
            raise UnsupportedGraphError(
                f"an operation could not run on meta tensors: {e}"
            ) from e
        finally:
            # A graph may switch grad mode (torch._C._set_grad_enabled nodes) and fail before
            # it switches back.
            torch.set_grad_enabled(grad_enabled)

    def check_and_place(self) -> None:
        """Compare with the recorded example values and record each tensor node's device."""
        inputs = iter(self.example_inputs)
        for fx_node, node in self.pairs:
            example_input = next(inputs, None) if fx_node.op == "placeholder" else None
            val = node.meta.get("val")
            ours = _tensors(val)
            if not ours or fx_node.op == "output":
                continue
            recorded = _tensors(_recorded(fx_node))
            if recorded:
                self.compare(fx_node, val, ours, recorded)
            node.meta["device"] = self.device(fx_node, node, recorded, example_input)

    @staticmethod
    def compare(fx_node: torch.fx.Node, val: Any, ours: list[torch.Tensor],
                recorded: list[torch.Tensor]) -> None:
        same = len(ours) == len(recorded) and all(
            a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape) for a, b in zip(ours, recorded)
        )
        if not same:
            theirs = ", ".join(describe(t) for t in recorded)
            raise UnsupportedGraphError(
                f"%{fx_node.name} ({fx_node.format_node()}): framejit computes {describe(val)} "
                f"but the torch.fx graph records {theirs}"
            )

    def device(self, fx_node: torch.fx.Node, node: Node, recorded: list[torch.Tensor],
               example_input: Any) -> torch.device:
        given = fx_node.meta.get("device")
        if isinstance(given, torch.device):
            return given
        for t in recorded:
            if t.device.type != "meta":
                return t.device
        if node.op == "placeholder":
            tensors = _tensors(example_input) or _tensors(node.args)
            return tensors[0].device if tensors else torch.device("cpu")
        if node.op == "get_attr":
            return _tensors(self.root[node.target])[0].device
        if node.op == "call_module":
            module = self.root[node.target]
            for t in module.parameters() if isinstance(module, torch.nn.Module) else ():
                return t.device
        return _infer_call_device(node)


def _fx_impure(fx_node: torch.fx.Node) -> bool:
    try:
        return bool(fx_node.is_impure())
    except Exception:  # a torch without is_impure, or a module it cannot inspect
        return False


def _infer_call_device(node: Node) -> torch.device:
    """The device of a call node's result when nothing recorded it: an explicit device argument
    (``device=``, ``x.to("cuda")``, ``x.cpu()``), else the device of its tensor inputs (an
    accelerator before the CPU, whose 0-dim tensors mix with any device), else the default."""
    device = node.kwargs.get("device")
    if device is not None:
        return torch.device(device)
    if node.op == "call_method" and node.target in ("to", "cuda", "cpu"):
        if node.target == "cpu":
            return torch.device("cpu")
        if node.target == "cuda":
            index = node.args[1] if len(node.args) > 1 else None
            return torch.device("cuda", index) if isinstance(index, int) else torch.device("cuda")
        for a in node.args[1:]:
            if isinstance(a, (str, torch.device)):
                return torch.device(a)
    devices = [n.meta["device"] for n in node.all_input_nodes if "device" in n.meta]
    for d in devices:
        if d.type != "cpu":
            return d
    return devices[0] if devices else torch.get_default_device()
