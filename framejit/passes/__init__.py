"""Graph passes that bring a captured graph into the aten vocabulary the fusion partitioner and
the kernel lowering read (:mod:`framejit.passes.vocabulary`), and clean it up.

Each pass is ``pass_(graph) -> bool`` (whether it changed anything), except
``fold_constants(graph, constants)``, which also adds the folded tensors to ``constants`` (the
GraphModule's root dict). ``run_passes`` runs them all in order.

Example::

    gm = GraphModule(root, graph)
    run_passes(gm.graph, gm.root)
    gm.recompile()
"""

from __future__ import annotations

from typing import Any

from ..fx_ir import Graph
from .cleanup import cse, dce, fold_constants
from .decompose import decompose
from .normalize import normalize
from .symbolic import SYMBOLIC
from .windows import pointwise_into_windows


def run_passes(graph: Graph, constants: dict[str, Any], *, lint: bool = False,
               symbolic: bool = False, folded: list | None = None) -> None:
    """normalize, decompose, normalize, dce, cse, pointwise_into_windows, dce, fold_constants,
    dce; with ``lint=True`` the graph is checked (``graph.lint()``) after each pass.
    ``symbolic``: the graph has symbolic sizes, which no pass may turn into numbers (see
    ``passes.symbolic``). ``folded`` gets the recipe of each folded constant
    (:class:`~framejit.passes.cleanup.Folded`)."""
    token = SYMBOLIC.set(symbolic)
    try:
        _run(graph, constants, lint, folded)
    finally:
        SYMBOLIC.reset(token)


def _run(graph: Graph, constants: dict[str, Any], lint: bool, folded: list | None) -> None:
    steps = (
        normalize,
        decompose,
        normalize,
        dce,
        cse,
        pointwise_into_windows,
        dce,
        lambda g: fold_constants(g, constants, folded),
        dce,
    )
    for step in steps:
        step(graph)
        if lint:
            graph.lint()


__all__ = ["cse", "dce", "decompose", "fold_constants", "normalize", "pointwise_into_windows",
           "run_passes"]
