"""One record of what framejit did: every compile path appends a typed event here, and everything
that tells the user about it (``stats()``, logs, dumps, ``explain``, the HTML report) reads it.

    from framejit import record
    record.emit(record.GraphBreak(function="f", filename="m.py", lineno=3, ...))
    record.stats.graph_breaks          # counters derived from the events
    record.events_since(mark)          # the log itself (the newest MAX_EVENTS events)
    record.subscribe(reader)           # reader(event) on every new event (logs, dumps)

This module imports nothing of framejit, so capture, the compiler, passes and kernels can all
write to it without importing each other. Events are emitted only on compile paths (a cache
miss, a graph compile, a kernel build); a call that hits the cache never touches the record.

Events hold references to what they describe (code objects, graphs, compiled functions) so that
a dump or a report can render them; the log keeps only the newest :data:`MAX_EVENTS` of them,
while the counters in :data:`stats` count everything since the last :func:`reset`.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import Any

#: How many events the log keeps (older ones drop off; counters are unaffected).
MAX_EVENTS = 512


# -- the events ---------------------------------------------------------------------------------


@dataclass
class Event:
    """Base of every event: ``seq`` (order of emission in this process) and ``time`` (wall
    clock, seconds since the epoch) are set by :func:`emit`."""

    seq: int = field(default=0, init=False)
    time: float = field(default=0.0, init=False)

    kind = "event"


@dataclass
class Place:
    """Where in the user's source: file, line and the text of that line."""

    filename: str = ""
    lineno: int | None = None
    function: str = ""
    text: str = ""

    def __str__(self) -> str:
        return f"{self.filename}:{self.lineno}"


@dataclass
class FrameOffered(Event):
    """A frame missed the cache and was offered to capture (``stats()['frames']``)."""

    function: str = ""
    code: Any = None

    kind = "frame_offered"


@dataclass
class Recompile(Event):
    """A frame whose cached versions' guards all failed is captured again. ``reason`` names
    the first guard of the newest version that failed, with the old and the new value."""

    function: str = ""
    code: Any = None
    reason: str = ""
    versions: int = 0           # cached versions of the frame before this capture
    dump_dir: str | None = None

    kind = "recompile"


@dataclass
class ShapeDynamic(Event):
    """An input's dimension changed size between calls: its frame is captured again with that
    dimension symbolic (automatic dynamic shapes)."""

    source: str = ""            # the input, in the user's terms (``x``, ``self.cache[0]``)
    dim: int = 0
    before: int = 0
    now: int = 0

    kind = "shape_dynamic"

    @property
    def message(self) -> str:
        return f"{self.source}.shape[{self.dim}] is now dynamic: {self.before} → {self.now}"


@dataclass
class GraphBreak(Event):
    """A frame was split where something could not be captured: the part before runs compiled,
    ``construct`` runs as Python, the rest continues in a resume function."""

    function: str = ""
    code: Any = None
    construct: str = ""         # in the user's words: ``print()``, ``x.item()``
    hint: str = ""
    where: Place | None = None  # the user's line that could not be captured
    stack: list = field(default_factory=list)  # Places of the inlined calls, outermost first
    message: str = ""           # the whole message, as logs print it
    dump_dir: str | None = None

    kind = "graph_break"


@dataclass
class Fallback(Event):
    """A frame runs as plain Python (nothing captured), with the reason."""

    function: str = ""
    code: Any = None
    message: str = ""
    where: Place | None = None
    dump_dir: str | None = None

    kind = "fallback"


@dataclass
class GraphCompiled(Event):
    """A backend turned a captured graph into a callable (emitted by the compiler)."""

    backend: str = ""
    graph: Any = None           # the captured framejit.fx_ir.GraphModule
    compiled: Any = None
    seconds: float = 0.0        # passes, kernel code generation and the backend's own work

    kind = "graph_compiled"


class Later:
    """A field's value made when it is first read: ``Later(fn)`` given for a field declared
    with a :class:`_Deferred` default is ``fn()`` from then on. Writing the readable text of a
    kernel's description and fused graph lines took 1.7 ms of GPT-2's 21 ms compile, for a
    dump, a log or an explain that most runs never ask for."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn


class _Deferred:
    """A dataclass field's default that takes a :class:`Later` value (see there)."""

    def __init__(self, default: Any) -> None:
        self.default = default

    def __set_name__(self, owner, name: str) -> None:
        self.slot = f"_{name}_value"

    def __get__(self, obj, owner=None) -> Any:
        if obj is None:
            return self.default  # what the dataclass takes as the default
        value = obj.__dict__[self.slot]
        if type(value) is Later:
            value = obj.__dict__[self.slot] = value.fn()
        return value

    def __set__(self, obj, value: Any) -> None:
        obj.__dict__[self.slot] = value


@dataclass
class KernelCompiled(Event):
    """A fusion group became a kernel: its source was generated (``seconds``), the compile of
    that source comes later (:class:`KernelBuilt`). ``description`` and ``group`` may be given
    as :class:`Later` values."""

    name: str = ""
    language: str = ""          # "triton" or "c"
    source: str = ""
    description: str = _Deferred("")  # type: ignore[assignment]  # the kernel description
    group: list = _Deferred(())  # type: ignore[assignment]  # the graph lines (one per node) it fuses
    device: str = ""
    seconds: float = 0.0

    kind = "kernel_compiled"


@dataclass
class KernelsDeclined(Event):
    """A graph runs as torch ops under a kernel backend, and why (a graph with symbolic sizes
    that holds only for some sizes, say)."""

    reason: str = ""

    kind = "kernels_declined"


@dataclass
class KernelBuilt(Event):
    """Generated kernels were compiled (C compiler, Triton) or found in the disk cache."""

    language: str = ""
    names: list = field(default_factory=list)
    seconds: float = 0.0
    cached: bool | None = None  # None: the compiler keeps its own cache and does not say

    kind = "kernel_built"


@dataclass
class KernelLayoutMiss(Event):
    """A kernel was called with an input laid out otherwise than it was compiled for (strides
    predicted from meta kernels that a device's real kernel does not follow, say), so that call
    ran as the group's torch ops. Emitted at a kernel's first such call only."""

    name: str = ""
    reason: str = ""

    kind = "kernel_layout_miss"


@dataclass
class Stage(Event):
    """Time spent in one compile stage (``passes``, ...) outside the events above."""

    name: str = ""
    seconds: float = 0.0

    kind = "stage"


@dataclass
class FrameCaptured(Event):
    """A frame was captured into a new cached version: what it became and what it cost.

    ``version`` counts the cached versions of this code before this one; ``children`` are the
    events emitted while it was captured (graph and kernel compiles, stages), so a reader sees
    one frame's work together. ``readable_source`` and ``guards_source`` are the readable
    renderings of the rewritten function and of its guards, when capture provides them."""

    function: str = ""          # the code's qualified name
    code: Any = None            # the original code object
    filename: str = ""
    firstlineno: int = 0
    version: int = 0
    seconds: float = 0.0        # the whole capture, the graph compile included
    graph: Any = None           # the captured GraphModule (None: no tensor work)
    compiled: Any = None        # what the backend returned for it
    rewritten: Any = None       # the code object that runs instead of the original
    entry_source: str = ""      # the Python the rewritten code calls
    guard_source: str = ""      # the guard function checked before each call
    #: Whatever renders the rewritten function (capture's cache-entry info, with attributes
    #: ``readable_source`` and ``guards_source``): rendered when a reader first asks, never at
    #: capture.
    renderer: Any = None
    resumes: list = field(default_factory=list)  # code objects of the resume functions it calls
    broke: bool = False         # split at a graph break
    dump_dir: str | None = None
    children: list = field(default_factory=list)

    kind = "frame_captured"

    def _rendered(self, name: str) -> str | None:
        if self.renderer is None:
            return None
        try:
            return getattr(self.renderer, name, None)
        except Exception as e:  # a rendering that fails must not break the reader
            return f"# framejit could not render this ({type(e).__name__}: {e})\n"

    @property
    def readable_source(self) -> str | None:
        return self._rendered("readable_source")

    @property
    def guards_source(self) -> str | None:
        return self._rendered("guards_source")

    @property
    def ops(self) -> int:
        if self.graph is None:
            return 0
        return sum(1 for n in self.graph.graph.nodes if n.op.startswith("call"))


# -- the counters -------------------------------------------------------------------------------


@dataclass
class Stats:
    """Counters derived from the events since the last :func:`reset` (``framejit.stats()`` reads
    them). The one instance, :data:`stats`, is reset in place, never replaced."""

    frames: int = 0          # frames offered to capture
    captured: int = 0        # frames captured into a cache entry
    graphs: int = 0          # graphs handed to a backend
    ops: int = 0             # graph operations captured
    recompiles: int = 0      # captures after a guard failure
    graph_breaks: int = 0    # frames split at an unsupported instruction
    break_reasons: list = field(default_factory=list)     # (function, message)
    eager_frames: int = 0    # frames that fell back to plain Python
    fallback_reasons: list = field(default_factory=list)   # (function, message)
    recompile_reasons: list = field(default_factory=list)  # (function, message)
    static_retries: list = field(default_factory=list)     # (function, why symbolic sizes failed)
    capture_seconds: float = 0.0
    kernels: int = 0         # kernels generated
    kernel_seconds: float = 0.0  # generating and compiling them
    kernel_layout_misses: int = 0  # kernels that ran as torch ops for an input's layout
    graph_cache_hits: int = 0  # graphs whose compile was read from the graph cache

    def clear(self) -> None:
        for f in fields(self):
            setattr(self, f.name, f.default_factory() if callable(f.default_factory) else f.default)


stats = Stats()


def _count(event: Event) -> None:
    s = stats
    if isinstance(event, FrameOffered):
        s.frames += 1
    elif isinstance(event, FrameCaptured):
        s.captured += 1
        s.capture_seconds += event.seconds
        if event.graph is not None:
            s.graphs += 1
            s.ops += event.ops
    elif isinstance(event, Recompile):
        s.recompiles += 1
        s.recompile_reasons.append((event.function, event.reason))
    elif isinstance(event, GraphBreak):
        s.graph_breaks += 1
        s.break_reasons.append((event.function, event.message))
    elif isinstance(event, Fallback):
        s.eager_frames += 1
        s.fallback_reasons.append((event.function, event.message))
    elif isinstance(event, KernelCompiled):
        s.kernels += 1
        s.kernel_seconds += event.seconds
    elif isinstance(event, KernelBuilt):
        s.kernel_seconds += event.seconds
    elif isinstance(event, KernelLayoutMiss):
        s.kernel_layout_misses += 1
    elif isinstance(event, Stage) and event.name == "graph cache hit":
        s.graph_cache_hits += 1


# -- the log ------------------------------------------------------------------------------------

_events: collections.deque = collections.deque(maxlen=MAX_EVENTS)
_seq = itertools.count(1)
_readers: list[Callable[[Event], None]] = []
_lock = threading.Lock()
_open = threading.local()  # .frames: the collectors of the frames being captured on this thread


#: The fields of events that refer to what a compile made or read (code objects, graphs, what
#: the backend returned, the cache entry): the log holds them weakly.
_HEAVY_FIELDS = ("code", "graph", "compiled", "rewritten", "renderer")


def _as_logged(event: Event) -> Event:
    """``event`` as the log keeps it: its heavy fields weak proxies (a compiled model deleted by
    the user is freed, as in eager, instead of living on in the newest :data:`MAX_EVENTS`
    events with its parameters; a proxy of one that died raises ReferenceError), and its
    children (a capture's events) the logged ones. Readers get the event itself."""
    changes = {}
    for name in _HEAVY_FIELDS:
        value = getattr(event, name, None)
        if value is not None and not isinstance(value, weakref.ProxyTypes):
            try:
                changes[name] = weakref.proxy(value)
            except TypeError:  # not weakly referenceable: kept as it is
                pass
    children = getattr(event, "children", None)
    if children:
        changes["children"] = [_logged.get(id(c), c) for c in children]
    if not changes:
        return event
    logged = dataclasses.replace(event, **changes)
    logged.seq, logged.time = event.seq, event.time
    return logged


#: id(event) -> its logged form, for the children of a FrameCaptured (emitted before it)
_logged: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def emit(event: Event) -> Event:
    """Append ``event`` to the record, count it, and hand it to every reader."""
    with _lock:
        event.seq = next(_seq)
        event.time = time.time()
        logged = _as_logged(event)
        _logged[id(event)] = logged
        _events.append(logged)
        _count(event)
    collectors = getattr(_open, "frames", None)
    if collectors and not isinstance(event, FrameCaptured):
        collectors[-1].append(event)
    for reader in list(_readers):
        try:
            reader(event)
        except Exception as e:  # a log or a dump that fails must not change the program
            _reader_failed(reader, e)
    return event


_failed_readers: set = set()


def _reader_failed(reader, error: Exception) -> None:
    import warnings

    name = getattr(reader, "__module__", "") + "." + getattr(reader, "__qualname__", repr(reader))
    if name not in _failed_readers:
        _failed_readers.add(name)
        warnings.warn(f"framejit: {name} failed on a {type(error).__name__} while recording what "
                      f"happened ({error}); the program runs on, without that reader's output "
                      f"(logs, dump) for this event", RuntimeWarning, stacklevel=3)


@contextmanager
def capturing() -> Iterator[list]:
    """Collect the events emitted on this thread while one frame is captured (the children of
    its :class:`FrameCaptured`)."""
    stack = getattr(_open, "frames", None)
    if stack is None:
        stack = _open.frames = []
    children: list = []
    stack.append(children)
    try:
        yield children
    finally:
        stack.pop()


def mark() -> int:
    """A position in the log: :func:`events_since` returns what came after it."""
    return _events[-1].seq if _events else 0


def events_since(position: int = 0) -> list[Event]:
    with _lock:
        return [e for e in _events if e.seq > position]


def subscribe(reader: Callable[[Event], None]) -> None:
    """Call ``reader(event)`` for every event from now on (once, however often subscribed)."""
    if reader not in _readers:
        _readers.append(reader)


def unsubscribe(reader: Callable[[Event], None]) -> None:
    if reader in _readers:
        _readers.remove(reader)


def forget_events() -> None:
    """Drop the log (the counters stay)."""
    with _lock:
        _events.clear()


def reset() -> None:
    """Drop the log and zero the counters (``framejit.reset()``)."""
    with _lock:
        _events.clear()
        stats.clear()
