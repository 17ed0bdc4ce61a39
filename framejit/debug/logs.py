"""Logs by topic, printed to stderr with no logging set-up: a reader of framejit.record.

    FRAMEJIT_LOGS=graph_breaks,recompiles python train.py      # or FRAMEJIT_LOGS=all
    framejit.set_logs("recompiles", "perf")                    # from Python; set_logs() = off

Topics: ``graph_breaks`` (breaks and frames that run as plain Python, with the reason and the
user's line), ``recompiles`` (which guard failed, old → new), ``guards`` (the guard function of
each new version), ``graph`` (each captured graph, one line per node), ``bytecode`` (original and
rewritten bytecode), ``kernels`` (each generated kernel and the operations it fuses), ``perf``
(each compile stage's time). Events happen only when something compiles, so logs cost nothing
on a call that hits the cache, whatever the topics.

Breaks and recompiles also go to the Python loggers ``framejit.graph_breaks`` and
``framejit.recompiles`` at INFO, for programs that configure logging themselves.
"""

from __future__ import annotations

import dis
import io
import logging
import sys

from .. import record
from ..config import LOG_TOPICS, env_logs
from .summary import frame_stages, ms

_log_breaks = logging.getLogger("framejit.graph_breaks")
_log_recompiles = logging.getLogger("framejit.recompiles")
_log_dynamic = logging.getLogger("framejit.recompiles.dynamic")

_topics: frozenset[str] = frozenset()


def parse_topics(spec) -> frozenset[str]:
    """``"a,b"``, ``["a", "b"]`` or ``"all"`` → the set of topics; unknown names raise."""
    if isinstance(spec, str):
        spec = [s for s in spec.replace(" ", "").split(",") if s]
    chosen = set()
    for name in spec:
        if name == "all":
            chosen.update(LOG_TOPICS)
        elif name in LOG_TOPICS:
            chosen.add(name)
        else:
            raise ValueError(f"framejit logs: unknown topic {name!r}; the topics are "
                             f"{', '.join(LOG_TOPICS)} (or all)")
    return frozenset(chosen)


def set_logs(*topics: str) -> None:
    """Print the given topics to stderr from now on; ``set_logs()`` turns every topic off::

        framejit.set_logs("graph_breaks", "recompiles")
        framejit.set_logs("all")
    """
    global _topics
    _topics = parse_topics(list(topics))


def topics() -> frozenset[str]:
    return _topics


def _print(topic: str, text: str) -> None:
    sys.stderr.write(f"[framejit:{topic}] " + text.rstrip("\n").replace("\n", "\n    ") + "\n")
    sys.stderr.flush()


def _dis(code) -> str:
    buf = io.StringIO()
    dis.dis(code, file=buf)
    return buf.getvalue()


def read(event: record.Event) -> None:
    """The reader subscribed to framejit.record."""
    on = _topics
    if isinstance(event, record.GraphBreak):
        _log_breaks.info("Graph break in %s: %s", event.function, event.message)
        if "graph_breaks" in on:
            _print("graph_breaks", f"graph break in {event.function}: {event.message}")
    elif isinstance(event, record.Fallback):
        _log_breaks.info("%s runs as plain Python: %s", event.function, event.message)
        if "graph_breaks" in on:
            _print("graph_breaks", f"{event.function} runs as plain Python: {event.message}")
    elif isinstance(event, record.ShapeDynamic):
        _log_dynamic.info("%s", event.message)
        if "recompiles" in on:
            _print("recompiles", event.message)
    elif isinstance(event, record.Recompile):
        _log_recompiles.info("Recompiling %s: %s", event.function, event.reason)
        if "recompiles" in on:
            _print("recompiles", f"recompiling {event.function}: {event.reason}")
    if not on:
        return
    if isinstance(event, record.FrameCaptured):
        name = f"{event.function} version {event.version}"
        if "bytecode" in on:
            _print("bytecode", f"original bytecode of {name}:\n{_dis(event.code)}")
            _print("bytecode", f"rewritten bytecode of {name}:\n{_dis(event.rewritten)}")
        if "graph" in on:
            text = str(event.graph.graph) if event.graph is not None else "(no graph: no tensor work)"
            _print("graph", f"graph of {name} ({event.ops} ops):\n{text}")
        if "guards" in on:
            _print("guards", f"guards of {name}:\n{event.guards_source or event.guard_source}")
        if "perf" in on:
            stages = ", ".join(f"{k} {ms(v)}" for k, v in frame_stages(event).items() if v)
            _print("perf", f"compiled {name} in {ms(event.seconds)}: {stages}")
    elif isinstance(event, record.KernelCompiled):
        if "kernels" in on:
            group = "\n".join(event.group)
            _print("kernels", f"kernel {event.name} ({event.language}, {event.device}) fuses:\n"
                              f"{group}\n{event.source}")
    elif isinstance(event, record.KernelsDeclined):
        if "kernels" in on:
            _print("kernels", f"no kernels for a graph: {event.reason}")
    elif isinstance(event, record.KernelLayoutMiss):
        if "kernels" in on:
            _print("kernels", f"kernel {event.name} ran as torch ops: {event.reason} (calls "
                              f"with inputs laid out so run its torch ops, slower)")
    elif isinstance(event, record.KernelBuilt):
        if "perf" in on:
            how = "found in the disk cache" if event.cached else "compiled"
            _print("perf", f"{event.language} kernels {', '.join(event.names)} {how} in "
                           f"{ms(event.seconds)}")


def install() -> None:
    """Subscribe the reader, with the topics of ``FRAMEJIT_LOGS`` (once per process)."""
    global _topics
    spec = env_logs()
    if spec:
        try:
            _topics = parse_topics(spec)
        except ValueError as e:
            sys.stderr.write(f"FRAMEJIT_LOGS={spec}: {e}; no logs\n")
    record.subscribe(read)
