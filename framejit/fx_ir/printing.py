"""The readable one-line-per-node form of a graph (``str(graph)``).

::

    %x : f32[4, 16] = placeholder()
    %linear_weight : f32[32, 16] = get_attr[linear.weight]
    %matmul : f32[4, 32] = torch.matmul(%x, %w)
    %view : f32[128] = %matmul.view(-1)
    %getitem : f32[2, 32] = operator.getitem(%split, 0)
    %sum_1 : f32[4] = torch.sum(%relu, dim=1)
    output (%view, %sum_1)

``%name`` is a node, ``: f32[4, 32]`` its ``meta["val"]`` when known. Unlike the generated
Python, the target is always spelled out (``operator.add(%x, %y)``, not ``x + y``), so the text is
a faithful picture of the nodes, ops and targets.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from .codegen import _torch_constant_path, display_name, format_float
from .node import Node

if TYPE_CHECKING:
    from .graph import Graph

_MAX_REPR = 60  # long reprs of odd constants are cut so one node stays one line


def format_arg(a: Any) -> str:
    """One argument as printed in ``str(graph)``."""
    from .meta import describe

    if isinstance(a, Node):
        return f"%{a.name}"
    kind = type(a)
    if kind is float:
        return format_float(a)
    if kind is tuple:
        items = [format_arg(x) for x in a]
        return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
    if kind is list:
        return f"[{', '.join(format_arg(x) for x in a)}]"
    if kind is dict:
        return "{" + ", ".join(f"{format_arg(k)}: {format_arg(v)}" for k, v in a.items()) + "}"
    if kind is slice:
        parts = [a.start, a.stop] + ([a.step] if a.step is not None else [])
        return f"slice({', '.join(format_arg(x) for x in parts)})"
    if a is Ellipsis:
        return "..."
    if isinstance(a, torch.Tensor):
        return f"tensor<{describe(a)}>"
    if kind is torch.device:
        return f"torch.device({str(a)!r})"
    if isinstance(a, (torch.dtype, torch.memory_format, torch.layout)):
        return _torch_constant_path(a) or repr(a)
    if callable(a) and not isinstance(a, torch.nn.Module):
        return display_name(a)
    text = repr(a)
    return text if len(text) <= _MAX_REPR else text[: _MAX_REPR - 3] + "..."


def _call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    parts = [format_arg(a) for a in args]
    parts += [f"{k}={format_arg(v)}" for k, v in kwargs.items()]
    return ", ".join(parts)


def format_node(node: Node) -> str:
    """``%name : type = operation`` for one node (the type only when ``meta["val"]`` is set)."""
    from .meta import describe

    op = node.op
    if op == "output":
        return f"output {format_arg(node.args[0])}"
    if op == "placeholder":
        inside = [repr(node.target)] if node.target != node.name else []
        if node.args:
            inside.append(f"default={format_arg(node.args[0])}")
        rhs = f"placeholder({', '.join(inside)})"
    elif op == "get_attr":
        rhs = f"get_attr[{node.target}]"
    elif op == "call_module":
        rhs = f"call_module[{node.target}]({_call(node.args, node.kwargs)})"
    elif op == "call_method":
        obj = format_arg(node.args[0]) if node.args else "?"
        rhs = f"{obj}.{node.target}({_call(node.args[1:], node.kwargs)})"
    else:
        rhs = f"{display_name(node.target)}({_call(node.args, node.kwargs)})"
    annotation = f" : {describe(node.meta['val'])}" if "val" in node.meta else ""
    return f"%{node.name}{annotation} = {rhs}"


def format_graph(graph: Graph) -> str:
    """Every node of ``graph`` on its own line, in order."""
    return "\n".join(format_node(n) for n in graph.nodes)
