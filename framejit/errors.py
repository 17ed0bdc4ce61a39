"""User-facing exceptions. Each says what happened in the user's terms, where, and what to do."""

from __future__ import annotations


class FramejitError(Exception):
    """Base class of every error framejit raises on purpose."""


class Unsupported(FramejitError):
    """A construct the capture cannot put in a graph (internal; becomes a fallback or a
    :class:`GraphBreakError` under ``fullgraph=True``).

    ``construct`` names it as the user wrote it (``print()``, ``if tensor:``, ``x.item()``);
    ``hint`` says what to do about it. ``where`` is filled by the interpreter with the user's
    file, line and source text of the instruction being captured.
    """

    def __init__(self, construct: str, hint: str = "", *, where: SourceLocation | None = None):
        super().__init__(construct)
        self.construct = construct
        self.hint = hint
        self.where = where
        #: Inlined call frames from the outermost call site to the innermost (for context).
        self.stack: list[SourceLocation] = []
        #: Index of the instruction of the captured (root) frame that was running: where a
        #: graph break would go.
        self.break_index: int | None = None

    def describe(self) -> str:
        lines = [self.construct]
        if self.where is not None:
            lines.append(f"  at {self.where}")
        for loc in reversed(self.stack):
            lines.append(f"  called from {loc}")
        if self.hint:
            lines.append(f"  fix: {self.hint}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.describe()


class SourceLocation:
    """A place in the user's source: file, line, function, and the text of that line."""

    __slots__ = ("filename", "lineno", "function", "text")

    def __init__(self, filename: str, lineno: int | None, function: str, text: str = ""):
        self.filename = filename
        self.lineno = lineno
        self.function = function
        self.text = text

    def __str__(self) -> str:
        s = f"{self.filename}:{self.lineno} in {self.function}()"
        if self.text:
            s += f"\n      {self.text.strip()}"
        return s


class GraphBreakError(FramejitError):
    """Raised with ``fullgraph=True`` when the function cannot be captured as one graph.

    Cause: the function uses a construct framejit cannot put in a graph (printing, reading a
    tensor's value into Python, an unknown C function, ...). The message names it and where.
    Fix: move that construct out of the compiled function, or compile with ``fullgraph=False``
    so that the function runs as ordinary Python instead.
    """

    def __init__(self, function: str, reason: Unsupported):
        self.reason = reason
        super().__init__(
            f"framejit could not capture {function}() as one graph (fullgraph=True):\n"
            + reason.describe()
        )


class BackendError(FramejitError):
    """A backend failed to compile a captured graph.

    Cause: the backend raised, or returned something that is not callable.
    Fix: check the backend (run it on the graph printed below), or use ``backend="eager"``.
    """


class ConstraintViolation(FramejitError):
    """A dimension marked with ``framejit.mark_dynamic`` had to be fixed to one size while
    capturing (as ``torch.compile`` does, this is raised, never a silent fallback)."""


class InternalError(FramejitError):
    """A bug in framejit itself. The frame ran as plain Python; please report it with the dump."""


class TorchCompileFallbackWarning(UserWarning):
    """``torch.compile(..., backend="framejit")`` ran a graph as PyTorch code instead of
    compiling it with framejit.

    Cause: the message says why: the graph uses something framejit cannot convert yet (dynamic
    shapes, an autocast region, a tensor subclass, ...), an option is wrong, or framejit's
    backend failed on it. Results stay correct; only that graph is not optimized by framejit.
    Fix: for dynamic shapes, compile with ``dynamic=False``; for an option, use
    ``options={"backend": "default" | "eager" | "triton"}``; otherwise please report the graph.
    Each distinct reason is reported once per process.
    """
