"""framejit's graph IR: nodes, graphs, generated Python, meta propagation, torch.fx export and
import, example values (meta results, memoised).

Example::

    from framejit.fx_ir import Graph, GraphModule

    g = Graph()
    x = g.placeholder("x")
    g.output(g.call_function(torch.relu, (x,)))
    gm = GraphModule({}, g)
    gm(torch.randn(3))

This package imports nothing else from framejit.
"""

from .codegen import PythonCode
from .examples import (
    call_on_fake,
    clear_meta_memo,
    cpu_sdpa_choice,
    fresh_meta,
    meta_pack,
    run_on_meta,
)
from .from_torch import UnsupportedGraphError, from_torch_fx
from .graph import NO_DEFAULT, Graph
from .graph_module import GraphModule
from .lint import GraphLintError
from .meta import (
    MetaPropagationError,
    describe,
    has_symbolic_sizes,
    propagate_meta,
    quiet_failed_meta_runs,
    to_meta,
)
from .node import (
    OFFSET_VIEW_NAMES,
    OPS,
    VIEW_NAMES,
    Node,
    is_inplace,
    map_aggregate,
    map_arg,
    name_of,
    on_cpu,
    target_name,
)
from .to_torch import to_torch_fx

__all__ = [
    "NO_DEFAULT",
    "OFFSET_VIEW_NAMES",
    "OPS",
    "VIEW_NAMES",
    "Graph",
    "GraphLintError",
    "GraphModule",
    "MetaPropagationError",
    "Node",
    "PythonCode",
    "UnsupportedGraphError",
    "call_on_fake",
    "clear_meta_memo",
    "cpu_sdpa_choice",
    "describe",
    "fresh_meta",
    "meta_pack",
    "has_symbolic_sizes",
    "is_inplace",
    "on_cpu",
    "map_aggregate",
    "map_arg",
    "propagate_meta",
    "quiet_failed_meta_runs",
    "run_on_meta",
    "name_of",
    "target_name",
    "to_meta",
    "from_torch_fx",
    "to_torch_fx",
]
