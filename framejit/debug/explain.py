"""``framejit.explain(fn)(*args)``: what framejit does with a function, as a report object.

    report = framejit.explain(model)(x)
    print(report)            # one screen: graphs, breaks, recompiles, kernels, stage times
    report.graphs[0]         # the first graph that runs, as framejit.fx_ir.Graph

``fn`` may be a plain function, a function or module already wrapped by ``framejit.compile``
(it is compiled afresh with the same backend and options, so the report never depends on what
was cached before), or an ``nn.Module``. Each call of the returned function runs ``fn`` once more
on the same fresh compile, and returns the report of every call so far: a second call with new
shapes shows the recompile. That compile writes no dump (the report is its output). The report
is a reader of framejit.record.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import record
from .summary import ms, op_name, qualname, stage_totals

#: At most this many graphs (and of breaks, recompiles, fallbacks each) in the printed summary.
_MAX_LINES = 8


@dataclass
class KernelInfo:
    """One generated kernel: its name, its kernel description and its source, with the
    language (``c``, ``triton``) and the graph operations it fuses."""

    name: str
    description: str
    source: str
    language: str = ""
    group: list = field(default_factory=list)


@dataclass
class BreakInfo:
    """One graph break: ``reason`` in the user's words, where (``filename``, ``lineno`` and the
    ``source_line``), and ``hint``: what to do about it."""

    function: str
    reason: str
    filename: str
    lineno: int | None
    source_line: str
    hint: str
    message: str

    def __str__(self) -> str:
        text = f"{self.reason} at {self.filename}:{self.lineno}"
        if self.source_line:
            text += f"\n      {self.source_line}"
        if self.hint:
            text += f"\n    fix: {self.hint}"
        return text


@dataclass
class RecompileInfo:
    """One recompile: the frame, and which guard of its newest version failed (old → new)."""

    function: str
    reason: str


@dataclass
class FrameInfo:
    """One compiled version of a frame (the function, or one of its resume functions)."""

    function: str
    version: int
    graph: object                # framejit.fx_ir.Graph, or None without tensor work
    ops: int
    guards: str
    kernels: list
    seconds: float


@dataclass
class ExplainReport:
    #: Each captured graph (framejit.fx_ir.Graph), in the order they first ran.
    graphs: list = field(default_factory=list)
    graph_count: int = 0
    ops_per_graph: list = field(default_factory=list)
    graph_break_count: int = 0
    breaks: list = field(default_factory=list)            # BreakInfo per graph break
    break_reasons: list = field(default_factory=list)     # (function, message)
    fallback_count: int = 0
    fallback_reasons: list = field(default_factory=list)  # (function, message)
    recompile_count: int = 0
    recompiles: list = field(default_factory=list)        # RecompileInfo
    guards: list = field(default_factory=list)            # guard function source per version
    frames: list = field(default_factory=list)            # FrameInfo per compiled version
    capture_seconds: float = 0.0
    #: Seconds per compile stage: capture, passes, kernel codegen, backend, kernel compile, ...
    stage_seconds: dict = field(default_factory=dict)
    #: Generated kernels per graph: lists of KernelInfo.
    kernels: list = field(default_factory=list)

    @classmethod
    def from_events(cls, events) -> ExplainReport:
        report = cls()
        for e in events:
            if isinstance(e, record.FrameCaptured):
                kernels = [KernelInfo(k.name, k.description, k.source, k.language, list(k.group))
                           for k in e.children if isinstance(k, record.KernelCompiled)]
                guards = e.guards_source or e.guard_source
                graph = e.graph.graph if e.graph is not None else None
                report.frames.append(FrameInfo(qualname(e.code), e.version, graph, e.ops, guards,
                                               kernels, e.seconds))
                report.guards.append(guards)
                report.capture_seconds += e.seconds
                if graph is not None:
                    report.graphs.append(graph)
                    report.ops_per_graph.append(e.ops)
                    report.kernels.append(kernels)
            elif isinstance(e, record.GraphBreak):
                w = e.where
                report.breaks.append(BreakInfo(
                    qualname(e.code), e.construct, w.filename if w else "", w.lineno if w else None,
                    w.text if w else "", e.hint, e.message))
                report.break_reasons.append((e.function, e.message))
            elif isinstance(e, record.Fallback):
                report.fallback_reasons.append((e.function, e.message))
            elif isinstance(e, record.Recompile):
                report.recompiles.append(RecompileInfo(qualname(e.code), e.reason))
        report.graph_count = len(report.graphs)
        report.graph_break_count = len(report.breaks)
        report.fallback_count = len(report.fallback_reasons)
        report.recompile_count = len(report.recompiles)
        report.stage_seconds = stage_totals(events)
        return report

    def __str__(self) -> str:
        n_kernels = sum(len(k) for k in self.kernels)
        lines = [f"{self.graph_count} graph(s), {sum(self.ops_per_graph)} operation(s), "
                 f"{self.graph_break_count} graph break(s), {self.recompile_count} recompile(s), "
                 f"{self.fallback_count} fallback(s) to plain Python, {n_kernels} kernel(s), "
                 f"captured in {ms(self.capture_seconds)}"]
        k = 0
        shown_frames = self.frames if len(self.frames) <= _MAX_LINES else self.frames[:_MAX_LINES - 1]
        for f in shown_frames:
            if f.graph is None:
                lines.append(f"  {f.function} v{f.version}: no graph (no tensor work)")
                continue
            ops = [op_name(n) for n in f.graph.nodes if n.op.startswith("call")]
            shown = ", ".join(ops[:6]) + (f", ... ({len(ops) - 6} more)" if len(ops) > 6 else "")
            kern = f"; kernels: {', '.join(x.name for x in f.kernels)}" if f.kernels else ""
            lines.append(f"  graph {k}: {f.function} v{f.version}, {f.ops} op(s): {shown}{kern}")
            k += 1
        if len(shown_frames) < len(self.frames):
            lines.append(f"  ... {len(self.frames) - len(shown_frames)} more compiled frame(s): "
                         f"report.frames, report.details()")
        # Each place breaks once per version of its frame: one entry per place.
        places: dict = {}
        for b in self.breaks:
            places.setdefault((b.reason, b.filename, b.lineno), []).append(b)
        for i, same in enumerate(list(places.values())[:3]):
            times = f" ({len(same)} times)" if len(same) > 1 else ""
            lines.append(f"graph break {i}{times}: " + str(same[0]).replace("\n", "\n  "))
        for r in self.recompiles[:4]:
            lines.append(f"recompile of {r.function}: {r.reason}")
        for where, message in self.fallback_reasons[:3]:
            lines.append(f"runs as plain Python: {where}: {message.splitlines()[0]}")
        hidden = (max(0, len(places) - 3) + max(0, len(self.recompiles) - 4)
                  + max(0, len(self.fallback_reasons) - 3))
        if hidden:
            lines.append(f"... {hidden} more break places, recompiles or fallbacks: report.breaks, "
                         f"report.recompiles, report.fallback_reasons")
        stages = ", ".join(f"{name} {ms(s)}" for name, s in self.stage_seconds.items() if s)
        if stages:
            lines.append(f"compile time: {stages}")
        return "\n".join(lines)

    def details(self) -> str:
        """Everything: the summary, then each graph and each kernel in full."""
        lines = [str(self)]
        for i, g in enumerate(self.graphs):
            lines.append(f"\n--- graph {i} ({self.ops_per_graph[i]} ops) ---\n{g}")
            for kern in self.kernels[i]:
                lines.append(f"\n--- graph {i}: kernel {kern.name} ---\n{kern.description}\n\n{kern.source}")
        for b in self.breaks:
            lines.append(f"\n--- graph break in {b.function} ---\n{b.message}")
        return "\n".join(lines)


def kernels_of(compiled) -> list[KernelInfo]:
    """The generated kernels of a compiled graph (none for the eager and user backends)."""
    return [KernelInfo(k.name, str(k.kernel), k.source, getattr(k, "language", ""))
            for k in getattr(compiled, "framejit_kernels", ())]


def explain(fn_or_module, backend=None):
    """A function that runs ``fn_or_module`` compiled afresh (with ``backend``, by default the
    one it was compiled with, else ``"default"``) and returns an :class:`ExplainReport`::

        report = framejit.explain(f)(x)
        assert report.graph_count == 1
        print(report)
    """
    from ..api import recompile_fresh

    compiled = None
    events: list = []

    def run(*args, **kwargs) -> ExplainReport:
        nonlocal compiled
        if compiled is None:
            compiled = recompile_fresh(fn_or_module, backend)
        # Collected as they come (the record's own log keeps only the newest events).
        record.subscribe(events.append)
        try:
            compiled(*args, **kwargs)
        finally:
            record.unsubscribe(events.append)
        return ExplainReport.from_events(events)

    return run
