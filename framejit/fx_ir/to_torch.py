"""Conversion to ``torch.fx``, so any torch backend can consume a framejit graph.

The conversion is node for node: same ops, targets, args and kwargs (with framejit nodes
replaced by the corresponding torch.fx nodes), names kept where torch.fx allows them. The root
``nn.Module`` of the result holds every get_attr and call_module target under its qualified name.
``meta["val"]`` is copied as both ``meta["val"]`` and ``meta["example_value"]`` (the key Dynamo
uses), so backends that read example values find them.

Example::

    fx_gm = to_torch_fx(gm)
    torch.fx.Interpreter(fx_gm).run(x)
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

import torch
import torch.fx

from .meta import resolve_qualname
from .node import Node, map_arg

if TYPE_CHECKING:
    from .graph_module import GraphModule


def to_torch_fx(gm: GraphModule) -> torch.fx.GraphModule:
    """Convert ``gm`` (a framejit GraphModule) to an equivalent ``torch.fx.GraphModule``."""
    fx_graph = torch.fx.Graph()
    env: dict[Node, torch.fx.Node] = {}
    attrs: dict[str, Any] = {}
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            default = node.args[0] if node.args else inspect.Signature.empty
            fx_node = fx_graph.placeholder(node.name, default_value=default)
        elif node.op == "output":
            fx_node = fx_graph.output(map_arg(node.args[0], env.__getitem__))
        else:
            if node.op in ("get_attr", "call_module") and node.target not in attrs:
                attrs[node.target] = resolve_qualname(gm.root, node.target)
            fx_node = fx_graph.create_node(
                node.op,
                node.target,
                map_arg(node.args, env.__getitem__),
                map_arg(node.kwargs, env.__getitem__),
                name=node.name,
            )
        fx_node.meta.update(node.meta)
        if "val" in node.meta:
            fx_node.meta["example_value"] = node.meta["val"]
        env[node] = fx_node
    # torch.fx copies each root[qualname] to that dotted path of the new module.
    return torch.fx.GraphModule(attrs, fx_graph, class_name=gm.class_name)
