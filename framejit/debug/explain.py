"""``framejit.explain(fn)(*args)``: what framejit does with a function, as a report object.

    report = framejit.explain(model)(x)
    print(report)            # graphs, kernels, ops, guards, fallbacks with reasons, capture time
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ExplainReport:
    graphs: list = field(default_factory=list)           # framejit.fx_ir.Graph per captured graph
    graph_count: int = 0
    ops_per_graph: list = field(default_factory=list)
    graph_break_count: int = 0
    break_reasons: list = field(default_factory=list)     # (function, message)
    fallback_count: int = 0
    fallback_reasons: list = field(default_factory=list)  # (function, message)
    guards: list = field(default_factory=list)            # guard function source per cache entry
    capture_seconds: float = 0.0
    #: Generated kernels per graph: lists of KernelInfo (name, description, source).
    kernels: list = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"{self.graph_count} graph(s), {sum(self.ops_per_graph)} operation(s), "
                 f"{self.graph_break_count} graph break(s), "
                 f"{self.fallback_count} fallback(s) to plain Python, "
                 f"captured in {self.capture_seconds * 1e3:.1f} ms"]
        for i, g in enumerate(self.graphs):
            kernels = self.kernels[i] if i < len(self.kernels) else []
            lines.append(f"\n--- graph {i} ({self.ops_per_graph[i]} ops, {len(kernels)} kernel(s)) ---")
            lines.append(str(g))
            for k in kernels:
                lines.append(f"\n--- graph {i}: kernel {k.name} ---\n{k.description}\n\n{k.source}")
        for where, message in self.break_reasons:
            lines.append(f"\n--- graph break in {where} ---\n{message}")
        for where, message in self.fallback_reasons:
            lines.append(f"\n--- runs as plain Python: {where} ---\n{message}")
        return "\n".join(lines)


@dataclass
class KernelInfo:
    """One generated kernel: its name, its kernel description and its source."""

    name: str
    description: str
    source: str


def kernels_of(compiled) -> list[KernelInfo]:
    """The generated kernels of a compiled graph (none for the eager and user backends)."""
    return [KernelInfo(k.name, str(k.kernel), k.source)
            for k in getattr(compiled, "framejit_kernels", ())]


def explain(fn_or_module, backend="default"):
    """Compile ``fn_or_module`` afresh with ``backend``, run it once on the given arguments,
    and report: graphs, generated kernels with their source, guards, breaks, fallbacks."""
    from ..api import compile
    from ..capture import convert_frame as cf

    def run(*args, **kwargs) -> ExplainReport:
        compiled = compile(fn_or_module, backend=backend)
        before = cf.stats
        n_fallbacks = len(before.fallback_reasons)
        n_breaks = len(before.break_reasons)
        seconds = before.capture_seconds
        ctx = compiled._framejit_context
        compiled(*args, **kwargs)
        report = ExplainReport()
        stats = cf.stats
        report.fallback_reasons = stats.fallback_reasons[n_fallbacks:]
        report.fallback_count = len(report.fallback_reasons)
        report.break_reasons = stats.break_reasons[n_breaks:]
        report.graph_break_count = len(report.break_reasons)
        report.capture_seconds = stats.capture_seconds - seconds
        from .. import _C
        for code in list(cf._touched):
            for entry in _C.get_cache_entries(code):
                if entry[2] is not ctx.callback:
                    continue
                info = entry[3]
                report.guards.append(info.guard_fn.__framejit_source__)
                if info.graph_module is not None:
                    graph = info.graph_module.graph
                    report.graphs.append(graph)
                    report.kernels.append(kernels_of(info.compiled))
                    report.ops_per_graph.append(sum(1 for n in graph.nodes if n.op.startswith("call")))
        report.graph_count = len(report.graphs)
        return report

    return run
