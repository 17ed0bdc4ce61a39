"""Debug dumps: everything about each compiled function, as files a person reads.

With ``FRAMEJIT_DUMP=<dir>`` (or ``options={"dump_dir": <dir>}``) each run of the program writes
one fresh folder ``<dir>/run-<date>-<time>-<pid>/`` (``<dir>/latest`` names the newest), so a
second run never mixes with the first. Inside it:

* ``index.md``: the functions compiled in this run, with links;
* ``record.json``: the same record for programs (``python -m framejit report`` reads it);
* ``<function>/index.md``: its frames, graphs, graph breaks (reason, file:line, the source line),
  recompiles (which guard failed, old → new), guards, kernels and compile-stage timings;
* ``<function>/<frame>/<version>/``, one folder per cached version of the function itself
  (``<frame>`` is its name) and of each of its resume functions (``f_resume_at_line_7``):

  - ``original_bytecode.txt``, ``rewritten_bytecode.txt``: ``dis`` listings with line numbers;
  - ``entry.py``: the Python the rewritten code calls, its ``___kN`` names explained at the top;
  - ``readable.py``: the whole rewritten function as Python (when capture provides it);
  - ``guards.py``: the guard function checked before each call;
  - ``graph.txt`` (one line per node, with shapes and dtypes) and ``graph.py`` (runnable);
  - with a kernel backend: ``wrapper.py`` (the graph as run: torch calls and kernel launches),
    and per kernel ``kernels/<name>.c`` or ``.py`` (its source) and ``kernels/<name>.txt``
    (the operations it fuses and its kernel description).

This module is a reader of framejit.record; nothing in capture calls it.
"""

from __future__ import annotations

import dis
import io
import json
import os
import re
import threading
import time
from dataclasses import dataclass, field

from .. import record
from .summary import frame_stages, graph_data, ms, qualname, root_name, stage_totals

_lock = threading.RLock()
_runs: dict[str, Run] = {}


def _safe(name: str) -> str:
    return re.sub(r"[^\w.-]+", "_", name).strip("_") or "function"


def _dis(code) -> str:
    buf = io.StringIO()
    dis.dis(code, file=buf)
    return buf.getvalue()


def _write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


@dataclass(eq=False)
class Version:
    """One cached version of one frame (the function or a resume function)."""

    frame: str                  # the frame's name: the function's, or its resume function's
    number: int                 # its version among the frame's cache entries
    folder: str                 # relative to the function's folder: "<frame>/<number>"
    event: record.FrameCaptured
    kernels: list = field(default_factory=list)  # KernelCompiled events
    builds: list = field(default_factory=list)   # KernelBuilt events of its kernels


@dataclass
class FunctionDump:
    """Everything dumped about one user function (its resume functions included)."""

    name: str                   # qualified name
    folder: str                 # absolute path
    filename: str = ""
    firstlineno: int = 0
    versions: list = field(default_factory=list)
    breaks: list = field(default_factory=list)
    fallbacks: list = field(default_factory=list)
    recompiles: list = field(default_factory=list)


@dataclass
class Run:
    """The folder of one run of the program, inside one dump_dir."""

    path: str
    started: float
    functions: dict = field(default_factory=dict)   # (qualname, filename) -> FunctionDump
    kernel_owner: dict = field(default_factory=dict)  # kernel name -> Version


def run_folder(dump_dir: str) -> str:
    """This run's folder in ``dump_dir`` (created on first use)."""
    return _run(dump_dir).path


def _run(dump_dir: str) -> Run:
    key = os.path.abspath(dump_dir)
    run = _runs.get(key)
    if run is None:
        os.makedirs(key, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        base = os.path.join(key, f"run-{stamp}-{os.getpid()}")
        path, n = base, 1
        while os.path.exists(path):  # (a fresh folder, even for a second run in one second)
            n += 1
            path = f"{base}-{n}"
        os.makedirs(path)
        _write(os.path.join(key, "latest"), os.path.basename(path) + "\n")
        run = _runs[key] = Run(path, time.time())
    return run


def _function(run: Run, code) -> FunctionDump:
    name = root_name(code)
    key = (name, code.co_filename)
    fn = run.functions.get(key)
    if fn is None:
        folder = _safe(name)
        taken = {os.path.basename(f.folder) for f in run.functions.values()}
        n = 1
        while folder in taken:  # two functions of one name in different files
            n += 1
            folder = f"{_safe(name)}-{n}"
        fn = run.functions[key] = FunctionDump(name, os.path.join(run.path, folder),
                                               code.co_filename, code.co_firstlineno)
        os.makedirs(fn.folder, exist_ok=True)
    if qualname(code) == name:
        fn.firstlineno = code.co_firstlineno
    return fn


def read(event: record.Event) -> None:
    """The reader subscribed to framejit.record."""
    dump_dir = getattr(event, "dump_dir", None)
    if isinstance(event, record.KernelBuilt):
        with _lock:
            for run in _runs.values():
                owners = {run.kernel_owner[n] for n in event.names if n in run.kernel_owner}
                for version in owners:
                    version.builds.append(event)
                if owners:
                    _write_indexes(run)
        return
    if not dump_dir or getattr(event, "code", None) is None:
        return
    with _lock:
        run = _run(dump_dir)
        fn = _function(run, event.code)
        if isinstance(event, record.FrameCaptured):
            _dump_version(run, fn, event)
        elif isinstance(event, record.GraphBreak):
            fn.breaks.append(event)
        elif isinstance(event, record.Fallback):
            fn.fallbacks.append(event)
        elif isinstance(event, record.Recompile):
            frame = qualname(event.code)
            fn.recompiles.append((event, sum(v.frame == frame for v in fn.versions)))
        else:
            return
        _write_indexes(run)


def _dump_version(run: Run, fn: FunctionDump, event: record.FrameCaptured) -> None:
    frame = qualname(event.code)
    # Numbered in this dump, not per compile() wrapper: two wrappers of one function (explain
    # compiles afresh) each have a version 0.
    number = sum(v.frame == frame for v in fn.versions)
    folder = f"{_safe(frame)}/{number}"
    version = Version(frame, number, folder, event,
                      [e for e in event.children if isinstance(e, record.KernelCompiled)])
    fn.versions.append(version)
    for k in version.kernels:
        run.kernel_owner[k.name] = version
    path = os.path.join(fn.folder, folder)
    files = {
        "original_bytecode.txt": f"# {frame} ({event.filename}:{event.firstlineno}), as written\n"
                                 f"{_dis(event.code)}",
        "rewritten_bytecode.txt": f"# {frame} version {number}, as it runs: calls the entry "
                                  f"function (entry.py), then the rest natively\n"
                                  f"{_dis(event.rewritten)}",
        "entry.py": _entry_text(event, number),
        "guards.py": "# Checked before every call; this version runs only when it returns True.\n"
                     + (event.guards_source or event.guard_source),
    }
    if event.readable_source:
        files["readable.py"] = event.readable_source
    if event.graph is not None:
        files["graph.txt"] = (f"# The graph of {frame} version {number}: one line per node, "
                              f"with its type (dtype[shape])\n{event.graph.graph}\n")
        files["graph.py"] = runnable_graph(event.graph, f"{frame} version {number}")
    wrapper = getattr(event.compiled, "framejit_graph", None)
    if callable(wrapper):  # a graph cache hit: the wrapper graph, made from the entry
        wrapper = wrapper()
    if wrapper is not None:
        files["wrapper.py"] = _wrapper_text(wrapper, version)
    for k in version.kernels:
        suffix = ".c" if k.language == "c" else ".py"
        files[f"kernels/{k.name}{suffix}"] = k.source
        group = "\n".join(f"#   {line}" for line in k.group)
        files[f"kernels/{k.name}.txt"] = (f"# kernel {k.name} ({k.language}, {k.device}) fuses these "
                                          f"operations of the graph after the passes:\n{group}\n\n"
                                          f"{k.description}\n")
    for name, text in files.items():
        _write(os.path.join(path, name), text)


def _wrapper_text(wrapper, version: Version) -> str:
    """wrapper.py: the graph as it runs, each kernel launch's name tied to its source file."""
    code = wrapper.python_code("forward", self_arg=False)
    head = [f"# {version.frame} version {version.number} as it runs: torch calls and kernel launches."]
    for name, value in code.globals.items():
        launcher = getattr(value, "fn", None)
        kernel = getattr(launcher, "kernel", None)
        if kernel is not None:
            suffix = ".c" if getattr(launcher, "language", "") == "c" else ".py"
            head.append(f"#   {name} launches kernel {kernel.name} (kernels/{kernel.name}{suffix}, "
                        f"its fused group in kernels/{kernel.name}.txt)")
    return "\n".join(head) + "\n" + code.src


def runnable_graph(gm, title: str) -> str:
    """The graph's generated Python as a script: the imports it needs, ``forward`` and, run as
    ``python graph.py``, a call on random inputs of the captured shapes and dtypes."""
    import types as _types

    import torch

    code = gm.graph.python_code("forward")
    head = [f"# The graph of {title} as runnable Python (`python graph.py` runs it once on",
            "# random inputs of the captured shapes and dtypes).", "import torch"]
    for name, value in code.globals.items():
        if isinstance(value, _types.ModuleType):
            line = f"import {value.__name__}" if name == value.__name__ else \
                f"import {value.__name__} as {name}"
        elif getattr(value, "__module__", None) and getattr(value, "__qualname__", None) \
                and "<" not in value.__qualname__:
            line = f"from {value.__module__} import {value.__qualname__.split('.')[0]}"
            if value.__qualname__ != name:
                line += f"\n{name} = {value.__qualname__}"
        else:
            line = f"# {name}: {type(value).__name__} bound when framejit runs the graph"
        if line not in head:
            head.append(line)
    inputs = []
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            shape = tuple(val.shape)
            if val.dtype.is_floating_point or val.dtype.is_complex:
                inputs.append(f"torch.randn({shape}, dtype={val.dtype})")
            elif val.dtype == torch.bool:
                inputs.append(f"torch.randint(0, 2, {shape}).bool()")
            else:
                inputs.append(f"torch.randint(0, 10, {shape}, dtype={val.dtype})")
        else:
            inputs.append(repr(val) if isinstance(val, (int, float, bool)) else "None")
    main = ["", "", 'if __name__ == "__main__":',
            f"    print(forward(None, {', '.join(inputs)}))"]
    return "\n".join(head) + "\n\n\n" + code.src.rstrip() + "\n" + "\n".join(main) + "\n"


def _entry_text(event: record.FrameCaptured, number: int) -> str:
    """entry.py: the entry function's source, its generated constant names explained."""
    entry = next((c for c in event.rewritten.co_consts
                  if getattr(c, "__name__", "").startswith("___entry_")), None)
    key = []
    if entry is not None:
        for name, value in sorted(entry.__globals__.items()):
            if not name.startswith("___k"):
                continue
            if value is event.compiled or getattr(value, "__wrapped__", None) is event.compiled:
                what = "the compiled graph (graph.py; as run: wrapper.py when kernels were made)"
            elif getattr(value, "__name__", "").startswith("___entry_"):
                what = "another entry function"
            elif callable(value):
                what = f"{getattr(value, '__module__', '') or ''}.{getattr(value, '__qualname__', repr(value))}".lstrip(".")
            else:
                text = repr(value)
                what = text if len(text) < 80 else text[:77] + "..."
            key.append(f"#   {name} = {what}")
    head = [f"# The Python the rewritten {qualname(event.code)} calls first (version {number}):",
            "# it runs the compiled graph and returns what the rest of the rewritten bytecode needs."]
    if key:
        head += ["# Generated names:", *key]
    return "\n".join(head) + "\n" + event.entry_source


# -- the summaries --------------------------------------------------------------------------------


def _place(where) -> str:
    return f"{where.filename}:{where.lineno}" if where is not None else "?"


def _function_index(fn: FunctionDump) -> str:
    versions = fn.versions
    graphs = [v for v in versions if v.event.graph is not None]
    lines = [f"# {fn.name}", "",
             f"`{fn.filename}:{fn.firstlineno}` — {len(versions)} compiled version(s) of its frames, "
             f"{len(graphs)} graph(s), {len(fn.breaks)} graph break(s), "
             f"{len(fn.recompiles)} recompile(s), {len(fn.fallbacks)} frame(s) run as plain Python.",
             "", "## Graphs (in the order they were captured)", ""]
    for i, v in enumerate(versions):
        e = v.event
        what = f"{e.ops} ops" if e.graph is not None else "no graph (no tensor work)"
        kernels = f", {len(v.kernels)} kernel(s)" if v.kernels else ""
        lines.append(f"{i}. `{v.frame}` version {v.number}: {what}{kernels}, compiled in "
                     f"{ms(e.seconds)} — [{v.folder}/]({v.folder}/)"
                     + (f" · [graph.txt]({v.folder}/graph.txt)" if e.graph is not None else ""))
        if e.readable_source:
            lines[-1] += f" · [readable.py]({v.folder}/readable.py)"
        if e.resumes:
            lines.append(f"   - continues in {', '.join('`' + qualname(c) + '`' for c in e.resumes)}")
    lines += ["", "## Graph breaks", ""]
    if not fn.breaks:
        lines.append("None.")
    seen: dict = {}
    for b in fn.breaks:  # each recompile of a frame breaks again at the same place
        seen.setdefault((b.construct, _place(b.where)), []).append(b)
    for same in seen.values():
        b = same[0]
        times = f" ({len(same)} times: once per version)" if len(same) > 1 else ""
        lines.append(f"- **{b.construct}** at `{_place(b.where)}`"
                     + (f" in `{b.where.function}()`" if b.where is not None else "") + times)
        if b.where is not None and b.where.text:
            lines.append(f"  - source: `{b.where.text}`")
        for loc in b.stack:
            lines.append(f"  - called from `{_place(loc)}`: `{loc.text}`")
        if b.hint:
            lines.append(f"  - fix: {b.hint}")
    if fn.fallbacks:
        lines += ["", "## Run as plain Python", ""]
        for f in fn.fallbacks:
            lines.append(f"- `{f.function}`: " + f.message.replace("\n", " "))
    lines += ["", "## Recompiles", ""]
    if not fn.recompiles:
        lines.append("None.")
    for r, number in fn.recompiles:
        lines.append(f"- `{qualname(r.code)}` at {time.strftime('%H:%M:%S', time.localtime(r.time))}: "
                     f"{r.reason}; compiled as version {number}")
    lines += ["", "## Guards", ""]
    for v in versions:
        lines.append(f"- `{v.frame}` version {v.number}: [{v.folder}/guards.py]({v.folder}/guards.py)")
    lines += ["", "## Kernels", ""]
    kernels = [(v, k) for v in versions for k in v.kernels]
    if not kernels:
        lines.append("None (the backend generated no kernels).")
    for v, k in kernels:
        suffix = ".c" if k.language == "c" else ".py"
        lines.append(f"- `{k.name}` ({k.language}, {len(k.group)} fused op(s)) from `{v.frame}` "
                     f"version {v.number}: [source]({v.folder}/kernels/{k.name}{suffix}) · "
                     f"[group]({v.folder}/kernels/{k.name}.txt)")
    lines += ["", "## Compile time per stage", "", "| stage | time |", "|---|---|"]
    totals = stage_totals([v.event for v in versions] + [b for v in versions for b in v.builds])
    for stage, seconds in totals.items():
        lines.append(f"| {stage} | {ms(seconds)} |")
    return "\n".join(lines) + "\n"


def _run_index(run: Run) -> str:
    lines = [f"# framejit dump, run of {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(run.started))}",
             "", "| function | graphs | breaks | recompiles | plain Python | kernels |",
             "|---|---|---|---|---|---|"]
    for fn in run.functions.values():
        folder = os.path.basename(fn.folder)
        lines.append(f"| [{fn.name}]({folder}/index.md) | "
                     f"{sum(v.event.graph is not None for v in fn.versions)} | {len(fn.breaks)} | "
                     f"{len(fn.recompiles)} | {len(fn.fallbacks)} | "
                     f"{sum(len(v.kernels) for v in fn.versions)} |")
    lines += ["", "`record.json` holds the same for programs; "
                  "`python -m framejit report <this folder>` draws it as one HTML page."]
    return "\n".join(lines) + "\n"


def _json(run: Run) -> dict:
    def place(w):
        return None if w is None else {"file": w.filename, "line": w.lineno,
                                       "function": w.function, "text": w.text}

    functions = []
    for fn in run.functions.values():
        versions = []
        for v in fn.versions:
            e = v.event
            fused = getattr(e.compiled, "framejit_fused_graph", None)
            if callable(fused):  # a graph cache hit: the graph after the passes, made again
                fused = fused()
            groups = {}
            for k in v.kernels:
                for line in k.group:
                    groups[line.split(" ", 1)[0].lstrip("%")] = k.name
            drawn = fused if fused is not None and v.kernels else (
                e.graph.graph if e.graph is not None else None)
            versions.append({
                "frame": v.frame, "version": v.number, "folder": v.folder,
                "time": e.time, "seconds": e.seconds, "ops": e.ops,
                "stages": frame_stages(e),
                "graph_text": str(e.graph.graph) if e.graph is not None else None,
                "graph": graph_data(drawn, groups) if drawn is not None else None,
                "graph_after_passes": drawn is fused and fused is not None,
                "guards": e.guards_source or e.guard_source,
                "readable": e.readable_source,
                "resumes": [qualname(c) for c in e.resumes],
                "kernels": [{"name": k.name, "language": k.language, "device": k.device,
                             "source": k.source, "description": k.description, "group": k.group,
                             "seconds": k.seconds} for k in v.kernels],
                "builds": [{"language": b.language, "names": b.names, "seconds": b.seconds,
                            "cached": b.cached} for b in v.builds],
            })
        functions.append({
            "name": fn.name, "folder": os.path.basename(fn.folder), "file": fn.filename,
            "line": fn.firstlineno, "versions": versions,
            "breaks": [{"function": qualname(b.code), "construct": b.construct, "hint": b.hint,
                        "where": place(b.where), "stack": [place(s) for s in b.stack],
                        "message": b.message, "time": b.time} for b in fn.breaks],
            "fallbacks": [{"function": qualname(f.code), "message": f.message, "time": f.time}
                          for f in fn.fallbacks],
            "recompiles": [{"function": qualname(r.code), "reason": r.reason,
                            "version": number, "time": r.time} for r, number in fn.recompiles],
            "stages": stage_totals([v.event for v in fn.versions]
                                   + [b for v in fn.versions for b in v.builds]),
        })
    return {"format": "framejit-dump/1", "started": run.started, "pid": os.getpid(),
            "functions": functions}


def _write_indexes(run: Run) -> None:
    for fn in run.functions.values():
        _write(os.path.join(fn.folder, "index.md"), _function_index(fn))
    _write(os.path.join(run.path, "index.md"), _run_index(run))
    _write(os.path.join(run.path, "record.json"), json.dumps(_json(run), indent=1))


def install() -> None:
    record.subscribe(read)
