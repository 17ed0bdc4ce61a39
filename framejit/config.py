"""Every setting in one place. Environment variables are ``FRAMEJIT_<NAME>``.

Settings are read once per ``compile()`` into an immutable :class:`Options`, which is passed down
explicitly; nothing below the API reads this module's globals during capture.
"""

from __future__ import annotations

import dataclasses
import os


def _env_int(name: str, default: int) -> int:
    v = os.environ.get("FRAMEJIT_" + name)
    return int(v) if v else default


def _env_str(name: str, default: str | None) -> str | None:
    return os.environ.get("FRAMEJIT_" + name, default)


@dataclasses.dataclass(frozen=True)
class Options:
    #: Cache entries per code object before the frame only runs what it has (then eagerly).
    recompile_limit: int = 8
    #: Folder for debug dumps (bytecode, graphs, guards, reasons); None = no dumps.
    dump_dir: str | None = None
    #: Raise instead of falling back when the function cannot be captured whole.
    fullgraph: bool = False
    #: Symbolic sizes: None = static first, then symbolic where sizes change; True = every
    #: input dimension symbolic; False = always static (see framejit.compile).
    dynamic: bool | None = None
    #: Inline depth limit for nested Python calls.
    max_inline_depth: int = 64
    #: Check every captured graph with Graph.lint() before it is compiled (on in the test suite).
    lint: bool = False


#: Log topics (``FRAMEJIT_LOGS=graph_breaks,recompiles`` or ``all``; framejit.set_logs()).
LOG_TOPICS = ("graph_breaks", "recompiles", "guards", "graph", "bytecode", "kernels", "perf")


def env_logs() -> str:
    """``FRAMEJIT_LOGS``: the log topics to print to stderr from the start (empty: none)."""
    return _env_str("LOGS", "") or ""


def env_dump() -> str | None:
    """``FRAMEJIT_DUMP``: the dump folder of every compile() without a dump_dir option."""
    return _env_str("DUMP", None)


_KNOWN = {f.name for f in dataclasses.fields(Options)}


def make_options(*, fullgraph: bool, dynamic, overrides: dict | None) -> Options:
    values = {
        "recompile_limit": _env_int("RECOMPILE_LIMIT", Options.recompile_limit),
        "dump_dir": env_dump(),
        "lint": _env_int("LINT", 0) == 1,
        "fullgraph": fullgraph,
        "dynamic": dynamic,
    }
    for key, value in (overrides or {}).items():
        if key not in _KNOWN:
            raise ValueError(
                f"framejit.compile(options=...): unknown option {key!r}; "
                f"known options are {sorted(_KNOWN)}"
            )
        values[key] = value
    return Options(**values)
