"""Readable Python renderings of a cache entry, in the spirit of depyf: what framejit runs in
place of a function, as Python a person can read and run.

For each cache entry, capture keeps the pieces (the entry function's source and constants, the
guard set, and for a split frame the layout at the break: see :class:`FrameBreak`); nothing is
rendered until someone asks (``CacheEntryInfo.readable_source``, ``guards_source``), so none of
this costs anything on the per-call path or at capture.

``readable_source`` defines three functions:

* ``guards_<f>``: the guard function, one condition per line, each with a comment in the
  user's terms (``x is a 2x3 float32 tensor on cpu``);
* ``rewritten_<f>``: the rewritten function. It reads the graph's inputs from where they live,
  calls the compiled graph, replays the side effects, and, for a frame split at a graph break,
  puts back the frame's locals and stack, runs the unsupported line as plain Python and calls
  the resume function that continues the frame;
* ``<f>``: what the hook does with this entry: the guards, then the rewritten function (a plain
  run of the original code when the guards fail).

Every name the generated code made up (``___k0``, ``___s1``, ``___o``) is replaced by one that
says what it is, and the names that refer to objects (the compiled graph, a module's globals, a
resume function) are listed with a comment at the top. The source runs: ``exec`` it in a copy of
``readable_namespace`` (see :func:`load`). Instructions it cannot show as Python say so and raise
``NotImplementedError`` where they would run, rather than doing something else.
"""

from __future__ import annotations

import ast
import itertools
import linecache
import types
import weakref
from dataclasses import dataclass, field

from ... import _C
from .. import compat
from .code import EntryRenderer
from .guards import render_guards
from .names import ReadableNames, arg_names, ident, reserved

__all__ = ["FrameBreak", "Rendering", "load", "render", "resume_sources"]


@dataclass
class FrameBreak:
    """The layout of a frame split at a graph break, as ``resume.break_code`` builds it: the
    entry returns the values of ``local_names`` then of the non-NULL ``markers`` slots; then
    ``plan.native`` runs and each of ``plan.exits`` calls ``resumes[k]``."""

    local_names: list
    markers: list
    plan: object
    resumes: list
    live: tuple
    #: The original code behind the frame's (itself, or a resume function's original), held
    #: weakly as CacheEntryInfo holds its code: entries live where the collector cannot see.
    base_ref: weakref.ref
    exit_slots: tuple = ()

    @property
    def base(self) -> types.CodeType | None:
        return self.base_ref()


@dataclass
class Rendering:
    source: str
    guards_source: str
    namespace: dict
    resume_names: dict = field(default_factory=dict)  # rendered name -> resume function or code
    #: The function of the source that stands for the whole entry (guards, then rewritten code).
    entry_point: str = ""


# -- the whole rendering ---------------------------------------------------------------------------


def _call_args(code: types.CodeType, renames: dict) -> str:
    """How the dispatcher calls the original function with the frame's argument slots."""
    slots = [renames.get(p, p) for p in map(compat.py_name, compat.arg_slot_names(code))]
    n_pos = code.co_argcount
    n_kw = code.co_kwonlyargcount
    parts = slots[:n_pos]
    k = n_pos + n_kw
    if code.co_flags & compat.CO_VARARGS:
        parts.append(f"*{slots[k]}")
        k += 1
    parts += [f"{name}={name}" for name in slots[n_pos:n_pos + n_kw]]
    if code.co_flags & compat.CO_VARKEYWORDS:
        parts.append(f"**{slots[k]}")
    return ", ".join(parts)


def render(info) -> Rendering:
    """The rendering of one cache entry (``info``: convert_frame.CacheEntryInfo)."""
    code = info.code_ref()
    if code is None:
        text = "# The function's code object no longer exists: nothing to show.\n"
        return Rendering(text, text, {}, entry_point="")
    names = ReadableNames(reserved(code))
    fname = ident(code.co_name)
    guard_fn = names.unique(f"guards_{fname}")
    rewritten_fn = names.unique(f"rewritten_{fname}")
    dispatcher = fname if fname not in names.namespace else names.unique(fname)
    renderer = EntryRenderer(info, code, names)
    renderer.name_objects()
    guards_src = render_guards(info.guards, code, guard_fn, names)
    rewritten_src, resume_names = renderer.render(rewritten_fn)
    params = ", ".join(renderer.params.get(p, p) for p in compat.guard_param_names(code))
    original = names.hint(code, f"{fname}_code", f"the original code of {code.co_name}")
    if info.frame_globals is not None:
        globals_name = names(info.frame_globals)
        cells = [f"{v}_cell" for v in code.co_freevars]
        closure = f"({', '.join(cells)},)" if cells else "None"
        fallback = (f"    # Otherwise the hook tries the other cached versions, or captures again;\n"
                    f"    # here: the original code, as plain Python.\n"
                    f"    plain = {names(types.FunctionType)}({original}, {globals_name}, "
                    f"{code.co_name!r}, None, {closure})\n"
                    f"    return plain({_call_args(code, renderer.params)})\n")
    else:
        fallback = ("    raise NotImplementedError('the guards failed: framejit would try another '\n"
                    "                              'cached version or capture again')\n")
    dispatch_src = (f"def {dispatcher}({params}):\n"
                    f'    """What the hook does on a call of {code.co_name} with this cache entry."""\n'
                    f"    if {guard_fn}({params}):\n"
                    f"        return {rewritten_fn}({params})\n" + fallback)
    body = "\n\n".join([guards_src, rewritten_src, dispatch_src])
    source = _header(info, code, names, body, dispatcher) + "\n\n\n" + body
    guards_header = _legend(names, guards_src, code)
    return Rendering(source, guards_header + "\n\n" + guards_src, names.namespace, resume_names,
                     dispatcher)


def _legend(names: ReadableNames, text: str, code) -> str:
    used = {n.id for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Name)}
    lines = [f"{name}: {what}" for name, what in names.legend.items() if name in used]
    params = [f"{new}: {_param_words(old)}" for old, new in arg_names(code).items() if new in used]
    out = [f"# Names used below that are not {code.co_name}'s own (their objects are in the cache "
           "entry's readable_namespace):"]
    out += [f"#   {line}" for line in lines + params]
    if len(out) == 1:
        out = [f"# Every name below is {code.co_name}'s own, Python's, or torch."]
    return "\n".join(out)


def _param_words(old: str) -> str:
    if old.startswith("___free_"):
        return f"the closure cell of {old[len('___free_'):]} (the hook passes the cells last)"
    k = old[len("___stack"):]
    return f"value {k} of the stack at the graph break, handed over by the caller"


def _header(info, code, names, body: str, entry_point: str) -> str:
    kind = "a split frame (graph break)" if info.frame_break is not None else "the whole frame"
    top = [f"# {code.co_name} ({code.co_filename}:{code.co_firstlineno}) as framejit runs it: "
           f"one cached version, {kind}.",
           "# It runs as it stands: exec it in a copy of the cache entry's readable_namespace "
           f"and call {entry_point}() with the argument slots the hook passes."]
    return "\n".join(top) + "\n" + _legend(names, body, code)


def load(info, follow_resumes: bool = True):
    """The rendering of ``info`` as a function: ``load(info)(*args)`` runs the guards and the
    rewritten function as rendered. With ``follow_resumes``, each resume function it calls runs
    as rendered too (through the cache entries it has when called; as plain Python when it has
    none that fit)."""
    rendering = info.rendering()
    namespace = dict(rendering.namespace)
    if follow_resumes:
        for name, resume in rendering.resume_names.items():
            if isinstance(resume, types.FunctionType):
                # (a resume code object needing this frame's closure stays as it is: it runs
                # as plain Python)
                namespace[name] = _RenderedResume(resume)
    source = rendering.source
    filename = f"<framejit-readable {next(_load_ids)}>"
    # Registered so that tracebacks and pdb show the rendering's lines.
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), namespace)
    return namespace[rendering.entry_point]


_load_ids = itertools.count()


class _RenderedResume:
    """Stands for a resume function inside a loaded rendering: runs the rendering of the first
    of the resume code's cache entries whose guards hold (as the hook would pick it), or the
    resume function itself as plain Python when there is none."""

    def __init__(self, resume: types.FunctionType):
        self.resume = resume

    def __call__(self, *args):
        for entry in _C.get_cache_entries(self.resume.__code__):
            info = entry[3]
            if info.guard_fn(*args):
                return load(info)(*args)
        return self.resume(*args)


def resume_sources(info) -> dict[str, list[str]]:
    """The renderings of the resume functions this entry calls: name -> the readable_source of
    each of their cache entries so far (a resume function is captured on its first call)."""
    out = {}
    for name, resume in info.rendering().resume_names.items():
        code = resume if isinstance(resume, types.CodeType) else resume.__code__
        out[name] = [e[3].readable_source for e in _C.get_cache_entries(code)]
    return out
