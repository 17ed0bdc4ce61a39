"""What the readers of framejit.record share: the compile stages of a captured frame, the name of
the function a frame belongs to, and a graph as plain data (for record.json and the report)."""

from __future__ import annotations

import re
import types

from .. import record

_RESUME = re.compile(r"_resume_at_line_\d+")

#: The compile stages, in the order they run.
STAGES = ("capture", "graph cache hit", "passes", "kernel codegen", "backend", "kernel compile",
          "kernel cache hits")


def frame_stages(event: record.FrameCaptured) -> dict[str, float]:
    """Seconds per stage of one captured frame: symbolic execution and code generation
    (``capture``), reading a compiled graph from the graph cache, graph passes, kernel code
    generation, and the rest of the backend."""
    compile_s = sum(e.seconds for e in event.children if isinstance(e, record.GraphCompiled))
    passes = sum(e.seconds for e in event.children
                 if isinstance(e, record.Stage) and e.name == "passes")
    cached = sum(e.seconds for e in event.children
                 if isinstance(e, record.Stage) and e.name == "graph cache hit")
    codegen = sum(e.seconds for e in event.children if isinstance(e, record.KernelCompiled))
    return {
        "capture": max(0.0, event.seconds - compile_s),
        "graph cache hit": cached,
        "passes": passes,
        "kernel codegen": codegen,
        "backend": max(0.0, compile_s - passes - codegen - cached),
    }


def stage_totals(events) -> dict[str, float]:
    """Seconds per stage over ``events`` (kernel compiles happen at a kernel's first launch)."""
    totals = dict.fromkeys(STAGES, 0.0)
    for e in events:
        if isinstance(e, record.FrameCaptured):
            for name, s in frame_stages(e).items():
                totals[name] += s
        elif isinstance(e, record.KernelBuilt):
            totals["kernel cache hits" if e.cached else "kernel compile"] += e.seconds
    return totals


def qualname(code: types.CodeType) -> str:
    return getattr(code, "co_qualname", code.co_name)


def frame_name(code: types.CodeType) -> str:
    """``f`` for the function itself, ``f_resume_at_line_7`` for a resume function of it."""
    return qualname(code)


def root_name(code: types.CodeType) -> str:
    """The user's function a frame belongs to: a resume function's name without its suffixes."""
    return _RESUME.sub("", qualname(code))


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def op_name(node) -> str:
    """What a graph node computes, briefly: ``torch.relu``, ``operator.add``, ``.sum``."""
    from ..fx_ir.codegen import display_name

    if node.op == "call_function":
        return display_name(node.target)
    if node.op == "call_method":
        return f".{node.target}"
    return str(node.target)


def graph_data(graph, groups: dict[str, str] | None = None) -> list[dict]:
    """The nodes of a framejit.fx_ir Graph as plain data: name, op, target, type (``f32[3, 4]``),
    inputs (names) and, with ``groups`` (node name → kernel name), the kernel fusing it."""
    from ..fx_ir.meta import describe

    nodes = []
    for n in graph.nodes:
        nodes.append({
            "name": n.name,
            "op": n.op,
            "target": op_name(n),
            "type": describe(n.meta["val"]) if "val" in n.meta else "",
            "inputs": [i.name for i in n.all_input_nodes],
            "group": (groups or {}).get(n.name),
        })
    return nodes
