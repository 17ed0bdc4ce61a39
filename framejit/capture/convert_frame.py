"""The callback the C hook calls on a cache miss: decide, capture, cache, or fall back.

Each ``compile()`` wrapper owns one callback; cache entries record it as their owner so that two
wrappers of the same function with different backends or options never share entries, and they
leave the code objects when their wrapper is garbage (:func:`release_with`). Anything that goes
wrong during capture makes the frame run as plain Python with the reason recorded (or, with
``fullgraph=True``, raised as a :class:`GraphBreakError`), except what a signal handler raises
meanwhile (a timeout, say): that propagates out of the call unchanged (:class:`_SignalWatch`).
"""

from __future__ import annotations

import _signal
import contextlib
import logging
import os
import signal
import threading
import time
import traceback
import types
import warnings
import weakref
from dataclasses import dataclass, field

import torch

from .. import _C, record
from ..errors import BackendError, ConstraintViolation, GraphBreakError, InternalError, Unsupported
from ..fx_ir import meta_pack
from . import compat, ops  # noqa: F401  (ops fills the handler table)
from .codecheck import check_code
from .guards import active_modes
from .interpreter import BreakHere, RealCell, Translator, decode
from .ops.blocks import UserContextExit
from .output import OutputGraph, make_trampoline
from .readable import FrameBreak, render, resume_sources
from .rerun import RandomState
from .resume import (
    ITER,
    NULL,
    VAL,
    break_code,
    is_internal_name,
    origin,
    plan_break,
    resume_code,
    resume_function,
)
from .shapes import DynamicShapeError
from .sources import FreeVarSource, free_param
from .values.base import NULL as NULL_VALUE
from .values.builder import _LIBRARY_ROOTS
from .values.containers import IteratorValue, ListValue
from .values.contexts import BLOCK_EXITS, AutocastExit, GradModeExit

log_internal = logging.getLogger("framejit")
log_dynamic = logging.getLogger("framejit.recompiles.dynamic")

_FRAMEJIT_DIR = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))

#: For each code object passed to compile(), the live contexts that compile it: such code is
#: captured by those contexts even when it lives in a library file (nn.Sequential.forward).
_target_contexts: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: Every code object whose per-code state the hook holds (for reset()).
_touched: weakref.WeakSet[types.CodeType] = weakref.WeakSet()


#: The counters of what happened (framejit.record's, reset in place; capture only emits events).
stats = record.stats


@dataclass(eq=False)
class CompileContext:
    """One compile() wrapper: its options, its compile pipeline, callback and target code
    objects. ``compile_graph(gm, example_inputs) -> callable`` comes from the API
    (framejit.compiler); it raises BackendError when the backend fails."""

    options: object
    compile_graph: object
    name: str
    callback: object = None
    targets: set = field(default_factory=set)
    warned_limit: set = field(default_factory=set)
    #: The code objects holding cache entries of this context (see release()).
    entry_codes: weakref.WeakSet = field(default_factory=weakref.WeakSet)
    #: code -> the sizes of its tensor inputs seen so far, by source (automatic dynamic shapes)
    sizes_seen: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary)


@dataclass
class CacheEntryInfo:
    """Everything known about one cache entry (kept in the entry tuple for explain and dumps).

    The original code object is held weakly: the entry lives in that code's co_extra, which the
    garbage collector cannot see, so a strong reference would keep both alive forever."""

    code_ref: weakref.ref
    guards: object
    guard_fn: object
    entry_source: str
    graph_module: object
    compiled: object
    trampoline: types.CodeType
    capture_seconds: float
    #: What the readable rendering needs (capture/readable/): the frame's module globals, and
    #: the layout at the graph break of a split frame.
    frame_globals: dict | None = None
    frame_break: FrameBreak | None = None
    _rendering: object = field(default=None, repr=False)

    def rendering(self):
        """The readable rendering (capture/readable/), made on first use: never at capture."""
        if self._rendering is None:
            self._rendering = render(self)
        return self._rendering

    @property
    def readable_source(self) -> str:
        """The whole rewritten function as runnable Python: guards, graph call, side effects,
        the native line at a break and the resume calls (see capture/readable/)."""
        return self.rendering().source

    @property
    def guards_source(self) -> str:
        """The guard function, one condition per line, each with a comment in the user's terms."""
        return self.rendering().guards_source

    @property
    def readable_namespace(self) -> dict:
        """The objects ``readable_source`` refers to by name (exec the source in a copy)."""
        return self.rendering().namespace

    @property
    def resume_sources(self) -> dict:
        """Resume function name -> the readable_source of each of its cache entries so far."""
        return resume_sources(self)


def register_target(ctx: CompileContext, code: types.CodeType) -> None:
    ctx.targets.add(code)
    _target_contexts.setdefault(code, weakref.WeakSet()).add(ctx)
    _touched.add(code)
    if _C.get_code_mode(code) == _C.MODE_SKIP:
        _C.set_code_mode(code, _C.MODE_DEFAULT)


def make_callback(ctx: CompileContext):
    def callback(code, func, f_locals):
        return convert_frame(ctx, code, func, f_locals)

    ctx.callback = callback
    return callback


def release_with(owner, ctx: CompileContext) -> None:
    """Drop the cache entries of ``ctx`` once ``owner`` (the object that calls with its callback:
    the compile() wrapper) is garbage. Entries live in code objects, which outlive any wrapper
    and which the garbage collector cannot see into: without this, each dropped wrapper of the
    same function would leave its entries (and, through their owner, its whole context) behind,
    and every later call of the function would walk them."""
    finalizer = weakref.finalize(owner, release, ctx)
    finalizer.atexit = False


def release(ctx: CompileContext) -> None:
    """Remove the cache entries ``ctx`` added, from the code objects it compiled (its targets,
    resume functions and any other frame it captured)."""
    callback = ctx.callback
    for code in list(ctx.entry_codes):
        entries = _C.get_cache_entries(code)
        kept = [e for e in entries if e[2] is not callback]
        if len(kept) == len(entries):
            continue
        entries[:] = kept  # in place: the hook may be walking this very list
        if not kept and _C.get_code_mode(code) == _C.MODE_RUN_ONLY:
            # Its recompile limit was this context's: other wrappers may compile the code again.
            _C.set_code_mode(code, _C.MODE_DEFAULT)
    ctx.entry_codes.clear()


def _skip_roots() -> tuple[str, ...]:
    """Files whose frames are never captured unless compile() targets them: the standard library,
    torch itself, framejit, and tools. Third-party model code (transformers, timm, ...) is
    captured like the user's own."""
    import importlib.util
    import sysconfig

    paths = sysconfig.get_paths()
    roots = [paths.get("stdlib"), paths.get("platstdlib"), _FRAMEJIT_DIR]
    files = []
    for package in ("torch", "numpy", "triton", "bytecode", "networkx", "pytest", "_pytest",
                    "pluggy", "typing_extensions", "tqdm", "IPython", "sympy", "functorch"):
        spec = importlib.util.find_spec(package)
        if spec is None:
            continue
        if spec.submodule_search_locations:
            roots.extend(spec.submodule_search_locations)
        elif spec.origin:
            files.append(spec.origin)  # a one-file module (typing_extensions.py)
    # The standard library lives above site-packages: only its own files count.
    return tuple(os.path.realpath(r) + os.sep for r in roots if r) + tuple(os.path.realpath(f) for f in files)


_SKIP_ROOTS = _skip_roots()
_SITE_PACKAGES = tuple(os.path.realpath(p) for p in _LIBRARY_ROOTS if "site-packages" in p)


_library_files: dict[str, bool] = {}


def _is_library_file(filename: str) -> bool:
    known = _library_files.get(filename)
    if known is None:
        known = _is_library_path(filename)
        # realpath is a system call per path component: once per source file. Generated code
        # ("<framejit-graph-7>", "<string>") is not remembered: its names have no end.
        if not filename.startswith("<"):
            _library_files[filename] = known
    return known


def _is_library_path(filename: str) -> bool:
    if filename.startswith("<frozen"):
        return True
    path = os.path.realpath(filename)
    if not path.startswith(_SKIP_ROOTS):
        return False
    # stdlib's root contains site-packages: a third-party package there is not "stdlib".
    if path.startswith(_SITE_PACKAGES):
        return path.startswith(tuple(r for r in _SKIP_ROOTS if r.startswith(_SITE_PACKAGES)))
    return True


def where(code: types.CodeType) -> str:
    return f"{code.co_qualname if hasattr(code, 'co_qualname') else code.co_name} at {code.co_filename}:{code.co_firstlineno}"


#: Methods Python calls implicitly on every attribute access or print: as frames of their own
#: they hold no tensor work worth a graph, and each new key would recompile them. (Calls to them
#: from captured code are inlined as usual.)
_NEVER_TOP_FRAMES = frozenset({"__getattribute__", "__getattr__", "__setattr__", "__delattr__",
                               "__repr__", "__str__", "__format__", "__hash__"})


def convert_frame(ctx: CompileContext, code, func, f_locals):
    """The callback's work: cached code for the frame, or None to run it as it is. Errors of
    framejit's own fall back; an exception raised by a signal handler while framejit works
    propagates, even when framejit code on the way turned it into a fallback or swallowed it."""
    watch = _SignalWatch()
    with watch:
        try:
            result = _convert_frame(ctx, code, func, f_locals, watch)
        except BaseException:
            if watch.raised is None:
                raise
            result = None
    exc = watch.raised
    if exc is not None:
        watch.raised = None
        try:
            raise exc
        finally:
            del exc
    return result


class _SignalWatch:
    """Python-level signal handlers run between any two bytecodes, so one may raise (a SIGALRM
    timeout, say) in the middle of capture, where framejit's own ``try`` blocks turn errors into
    fallbacks. While framejit works on the main thread (the only one that runs handlers), each
    handler is wrapped so that what it raises is remembered in ``raised``; the handlers are put
    back afterwards, except one that was replaced meanwhile."""

    __slots__ = ("installed", "raised")

    def __init__(self):
        self.installed: list = []
        self.raised: BaseException | None = None

    def __enter__(self):
        return self

    def start(self):
        """Wrap the handlers (about 0.1 ms: done only when capture is about to run)."""
        if self.installed or threading.current_thread() is not threading.main_thread():
            return
        for sig in _SIGNALS:
            handler = _signal.getsignal(sig)  # (signal.getsignal also makes an enum of an int)
            # (SIGINT's default handler raises KeyboardInterrupt, which no fallback catches.)
            if callable(handler) and handler is not signal.default_int_handler:
                wrapper = self._wrap(handler)
                try:
                    signal.signal(sig, wrapper)
                except (ValueError, OSError):  # not the main interpreter, say
                    continue
                self.installed.append((sig, handler, wrapper))

    def _wrap(self, handler):
        def framejit_signal_watch(signum, frame):
            try:
                return handler(signum, frame)
            except BaseException as e:
                if self.raised is None:
                    self.raised = e
                raise
        return framejit_signal_watch

    def __exit__(self, *exc_info):
        for sig, handler, wrapper in self.installed:
            if signal.getsignal(sig) is wrapper:
                signal.signal(sig, handler)
        self.installed.clear()
        return False


_SIGNALS = tuple(sorted(set(signal.valid_signals()) - {getattr(signal, "SIGKILL", None),
                                                        getattr(signal, "SIGSTOP", None)}))


def _convert_frame(ctx: CompileContext, code, func, f_locals, watch: _SignalWatch):
    if code.co_name in _NEVER_TOP_FRAMES and code not in ctx.targets:
        _C.set_code_mode(code, _C.MODE_SKIP)
        _touched.add(code)
        return None
    if code not in ctx.targets and _is_library_file(code.co_filename):
        # Library code runs as it is. Mark it so the hook stops asking, unless some live
        # compile() wrapper targets it (its code mode is shared by every wrapper).
        if not _target_contexts.get(code):
            _C.set_code_mode(code, _C.MODE_SKIP)
            _touched.add(code)
        return None
    _touched.add(code)
    modes = active_modes()
    if modes is not None:
        # This call runs as plain Python, inside the mode; calls outside it compile as usual.
        record.emit(record.Fallback(
            function=where(code), code=code, dump_dir=ctx.options.dump_dir,
            message=f"{modes} is active: the function runs as plain Python inside it, so that "
                    f"the mode sees every torch call (call it outside the mode to compile it)"))
        return None
    watch.start()
    record.emit(record.FrameOffered(function=where(code), code=code))
    entries = _C.get_cache_entries(code)
    # An entry whose object checked by identity is gone (a module passed in and dropped) never
    # passes again: it goes, and no longer counts toward the recompile limit.
    gone = [(e, why) for e in entries if (why := e[3].guards.dead()) is not None]
    if gone:
        entries[:] = [e for e in entries if all(e is not g for g, _ in gone)]  # (in place)
    mine = [e for e in entries if e[2] is ctx.callback]
    gone = [why for e, why in gone if e[2] is ctx.callback]
    if gone and not mine:
        record.emit(record.Recompile(function=where(code), code=code, reason=gone[-1],
                                     versions=len(gone), dump_dir=ctx.options.dump_dir))
    if mine:
        scope = dict(f_locals)
        for var, cell in zip(code.co_freevars, func.__closure__ or ()):
            scope[free_param(var)] = cell
        reason = _miss_reason(mine, scope)
        if len(mine) >= ctx.options.recompile_limit:
            if code not in ctx.warned_limit:
                ctx.warned_limit.add(code)
                warnings.warn(
                    f"framejit: {where(code)} was recompiled {len(mine)} times (recompile_limit="
                    f"{ctx.options.recompile_limit}); calls that match none of its {len(mine)} cached "
                    f"versions now run as plain Python. Last reason: {reason}. Make inputs of one "
                    f"kind (shapes, dtypes, flags), or raise options={{'recompile_limit': N}}.",
                    stacklevel=2,
                )
            record.emit(record.Fallback(function=where(code), code=code,
                                        message=f"recompile limit reached ({reason})",
                                        dump_dir=ctx.options.dump_dir))
            # From now on the hook runs the cached versions that match and the original code
            # otherwise, without asking again (reset() undoes it).
            _C.set_code_mode(code, _C.MODE_RUN_ONLY)
            return None
        record.emit(record.Recompile(function=where(code), code=code, reason=reason,
                                     versions=len(mine), dump_dir=ctx.options.dump_dir))
    try:
        with record.capturing() as children, _without_saved_tensors_hooks():
            info = capture_frame(ctx, code, func, f_locals, watch)
    except Unsupported as e:
        if watch.raised is not None:
            raise  # not framejit's error: convert_frame raises the handler's exception
        return _fall_back(ctx, code, e)
    except ConstraintViolation as e:
        # The user's mark_dynamic cannot hold: as with torch.compile, always an error.
        e.args = (f"{e.args[0]} (while compiling {where(code)})",)
        raise
    except BackendError as e:
        if ctx.options.fullgraph or watch.raised is not None:
            raise
        warnings.warn(f"framejit: {e}; {where(code)} runs as plain Python", stacklevel=2)
        return _fall_back(ctx, code, Unsupported(f"the backend failed: {e.__cause__!r}"))
    except Exception as e:
        if watch.raised is not None:
            raise
        if ctx.options.fullgraph:
            raise InternalError(f"framejit failed while compiling {where(code)} (a bug in framejit)") from e
        log_internal.warning("framejit: internal error while compiling %s; it runs as plain Python.\n%s",
                             where(code), traceback.format_exc())
        return _fall_back(ctx, code, Unsupported(f"internal error: {type(e).__name__}: {e}"))
    if watch.raised is not None:
        return None  # a handler raised and capture swallowed it: convert_frame raises it
    entries.append((info.guard_fn, info.trampoline, ctx.callback, info))
    ctx.entry_codes.add(code)
    _emit_captured(ctx, code, info, len(mine), children)
    return info.trampoline


@contextlib.contextmanager
def _without_saved_tensors_hooks():
    """The user's saved-tensor hooks (``torch.autograd.graph.saved_tensors_hooks``, a
    non-reentrant checkpoint's) set aside while capture runs example ops: they would see meta
    tensors, and a checkpoint counts what its hooks saw."""
    autograd = torch._C._autograd
    held = []
    while (top := autograd._top_saved_tensors_default_hooks(True)) is not None:
        autograd._pop_saved_tensors_default_hooks()
        held.append(top)
    try:
        yield
    finally:
        for pack, unpack in reversed(held):
            autograd._push_saved_tensors_default_hooks(pack, unpack)


def _emit_captured(ctx, code, info: CacheEntryInfo, version: int, children: list) -> None:
    resumes = [getattr(c, "__code__", c) for c in info.trampoline.co_consts
               if "_resume_at_line_" in getattr(getattr(c, "__code__", c), "co_name", "")]
    record.emit(record.FrameCaptured(
        function=where(code), code=code, filename=code.co_filename,
        firstlineno=code.co_firstlineno, version=version, seconds=info.capture_seconds,
        graph=info.graph_module, compiled=info.compiled, rewritten=info.trampoline,
        entry_source=info.entry_source, guard_source=info.guard_fn.__framejit_source__,
        renderer=info,
        resumes=resumes, broke=bool(resumes), dump_dir=ctx.options.dump_dir,
        children=list(children)))


def _place(loc) -> record.Place | None:
    if loc is None:
        return None
    return record.Place(loc.filename, loc.lineno, loc.function, loc.text.strip())


def _miss_reason(entries, f_locals) -> str:
    """Why the newest cached version does not fit, and how many others do not either."""
    reason = entries[-1][3].guards.failure_reason(f_locals) or "a guard failed"
    others = len(entries) - 1
    if others:
        reason += (" (and the older version does not fit either)" if others == 1
                   else f" (and {others} older versions do not fit either)")
    return reason


def _fall_back(ctx, code, e: Unsupported):
    message = e.describe()
    record.emit(record.Fallback(function=where(code), code=code, message=message,
                                where=_place(e.where), dump_dir=ctx.options.dump_dir))
    if ctx.options.fullgraph:
        raise GraphBreakError(code.co_name, e) from None
    # Capture would fail the same way next time: stop offering this code (reset() undoes it).
    if not mine_entries(code, ctx):
        _C.set_code_mode(code, _C.MODE_SKIP)
    return None


def mine_entries(code, ctx):
    return [e for e in _C.get_cache_entries(code) if e[2] is ctx.callback]


class _RetryStatic(Exception):
    """A capture with symbolic sizes met what it cannot express: capture with static shapes."""


def capture_frame(ctx: CompileContext, code, func, f_locals, watch=None) -> CacheEntryInfo:
    """Capture the frame whole; if that meets something unsupported, capture it again up to that
    instruction and split it there (a graph break). A capture with symbolic sizes that fails for
    their sake is done again with static shapes."""
    t0 = time.perf_counter()
    if code.co_flags & compat.CO_GENERATOR_LIKE:
        raise Unsupported("compiling a generator or coroutine function")
    # The meta results its ops look up on disk are kept together, for the next process.
    with meta_pack(f"{code.co_filename}:{code.co_firstlineno}:{code.co_qualname}"):
        try:
            return _capture_frame(ctx, code, func, f_locals, watch, t0, static=False)
        except _RetryStatic as e:
            reason = f"{type(e.__cause__).__name__}: {e.__cause__}"
            stats.static_retries.append((where(code), reason))
            log_dynamic.info("%s is captured with static shapes: symbolic sizes failed (%s)",
                             where(code), reason)
            return _capture_frame(ctx, code, func, f_locals, watch, t0, static=True)


def _capture_frame(ctx, code, func, f_locals, watch, t0, static) -> CacheEntryInfo:
    try:
        return _capture(ctx, code, func, f_locals, t0, None, static)
    except Unsupported as e:
        index = _break_index(code, e)
        if index is None or (watch is not None and watch.raised is not None):
            raise
        if ctx.options.fullgraph:
            raise
        try:
            info = _capture(ctx, code, func, f_locals, t0, index, static)
        except Unsupported as cannot:
            # The frame runs as Python: say what stopped it, and why it could not be split.
            e.construct = f"{e.construct}; the frame cannot be split there: {cannot.construct}"
            if cannot.hint:
                e.hint = f"{e.hint}; {cannot.hint}" if e.hint else cannot.hint
            raise e from None
        record.emit(record.GraphBreak(
            function=where(code), code=code, construct=e.construct, hint=e.hint,
            where=_place(e.where), stack=[_place(loc) for loc in e.stack],
            message=e.describe(), dump_dir=ctx.options.dump_dir))
        return info


def _break_index(code, e: Unsupported) -> int | None:
    """Where a graph break for ``e`` would go, or None when the frame cannot be split."""
    if e.break_index is None or code.co_cellvars:
        return None
    insts = decode(code)
    index = e.break_index
    # KW_NAMES and PRECALL only prepare the CALL after them: break before them and run all three.
    while index > 0 and insts[index - 1].name in ("PRECALL", "KW_NAMES"):
        index -= 1
    return index


def _capture(ctx, code, func, f_locals, t0, break_at, static=False) -> CacheEntryInfo:
    output = OutputGraph(ctx.options)
    output.size_memory = ctx.sizes_seen.setdefault(code, {})
    output.static_only = static
    output.f_globals = func.__globals__
    builtins_dict = func.__builtins__ if isinstance(func.__builtins__, dict) else vars(func.__builtins__)
    tx = Translator(output, code, func.__globals__, builtins_dict)
    tx.lazy_args = dict(f_locals)
    tx.break_at = break_at
    for var, cell in zip(code.co_freevars, func.__closure__ or ()):
        tx.cells[var] = RealCell(cell, FreeVarSource(var))
    n = len(_C.get_cache_entries(code))
    label = f"{code.co_name} {os.path.basename(code.co_filename)}:{code.co_firstlineno} #{n}"
    rng = RandomState()
    try:
        try:
            ret = tx.run()
        except BreakHere:
            entry, entry_src, gm, compiled, new_code, frame_break = _split_frame(ctx, code, func, tx, label)
        else:
            entry, entry_src, gm, compiled = output.compile_entry([ret], code, ctx.compile_graph, label)
            new_code = make_trampoline(code, entry)
            frame_break = None
    except Exception as e:
        if output.shapes is not None and (isinstance(e, DynamicShapeError) or not isinstance(
                e, (Unsupported, BackendError, ConstraintViolation))):
            raise _RetryStatic() from e
        raise
    finally:
        output.restore_global_state()
        rng.restore()
    check_code(new_code)  # code CPython cannot run safely falls back instead of crashing
    guard_fn = output.guards.build(compat.guard_param_names(code), label)
    _C.set_code_mode(guard_fn.__code__, _C.MODE_SKIP)
    seconds = time.perf_counter() - t0
    return CacheEntryInfo(weakref.ref(code), output.guards, guard_fn, entry_src, gm, compiled,
                          new_code, seconds, func.__globals__, frame_break)


def _split_frame(ctx, code, func, tx, label):
    """The rewritten code of a frame split at ``tx.pc``: graph so far, native instructions,
    then resume functions (see resume.py)."""
    markers = [NULL if v is NULL_VALUE else ITER if isinstance(v, IteratorValue) else VAL
               for v in tx.stack]
    plan = plan_break(tx.insts, tx.pc, markers)
    tx.check_generators(at_break=True)
    order = {name: i for i, name in enumerate(code.co_varnames)}
    local_names = sorted(tx.locals, key=lambda n: order.get(n, len(order)))
    # A resume function's own stack parameters are dead once its prefix has pushed them.
    bound = (set(tx.locals) | set(tx.lazy_args)) - {n for n in order if is_internal_name(n)}
    live = tuple(sorted(bound, key=lambda n: order.get(n, len(order))))
    local_names = [n for n in local_names if n in bound]
    # A loop's iterator on the stack crosses the break as a list of what is left (the resume
    # function turns it back into an iterator); an iterator in a local stays an iterator.
    on_stack = {id(v) for v in tx.stack if isinstance(v, IteratorValue)}
    if any(id(tx.locals[n]) in on_stack for n in local_names):
        raise Unsupported("a graph break while a loop's iterator is also held in a variable")
    _check_loops_hand_over(tx)
    stack = [ListValue(v.items[v.pos:]) if isinstance(v, IteratorValue) else v
             for v in tx.stack if v is not NULL_VALUE]
    # The `with` blocks the native run is inside: not one whose __exit__ the break's own call
    # takes (the block's end, breaking because its __exit__ raises), which would be left again.
    first = tx.insts[tx.pc]
    taken = first.arg + 2 if first.name in ("PRECALL", "CALL") else 0
    exit_slots = tuple(k for k, v in enumerate(tx.stack)
                       if isinstance(v, (*BLOCK_EXITS, UserContextExit))
                       and k < len(tx.stack) - taken)
    # Inside grad-mode or autocast `with` blocks: the graph leaves the state as the blocks set
    # it, and the resume function's code leaves the blocks.
    if any(isinstance(v, GradModeExit) for v in tx.stack):
        tx.output.grad_mode_handover = True
    if any(isinstance(v, AutocastExit) for v in tx.stack):
        tx.output.autocast_handover = True
    values = [tx.locals[n] for n in local_names] + stack
    entry, entry_src, gm, compiled = tx.output.compile_entry(values, code, ctx.compile_graph, label,
                                                             as_tuple=True)
    resumes = []
    for exit_ in plan.exits:
        base, target = origin(code, exit_.target)
        rcode = resume_code(base, target, exit_.depth, live, exit_.iters)
        register_target(ctx, rcode)
        resumes.append(rcode if code.co_freevars else resume_function(rcode, func.__globals__))
    new_code = break_code(code, entry, local_names, markers, plan, resumes, live,
                          base=origin(code, 0)[0], exit_slots=exit_slots)
    frame_break = FrameBreak(local_names, markers, plan, resumes, live,
                             weakref.ref(origin(code, 0)[0]), exit_slots)
    return entry, entry_src, gm, compiled, new_code, frame_break


def _check_loops_hand_over(tx) -> None:
    """A loop over a list, dict or set crosses the break as a list of the items it has left. That is
    only right if nothing can change the list later: refuse when the list is also reachable from
    outside the frame or from a variable (``for t in lst: print(t); lst.pop()``)."""
    from .values.iterators import live_containers

    iterators = [v for v in tx.stack if isinstance(v, IteratorValue)]
    watched = {id(c): c for it in iterators for c in live_containers(it)}
    if not watched:
        return
    # (a resume function's own stack parameters are dead once its prefix has pushed them)
    roots = [v for n, v in tx.locals.items() if not is_internal_name(n)]
    roots += [v for v in tx.stack if not isinstance(v, IteratorValue)]
    reachable = _reachable(roots)
    for c in watched.values():
        # The list of items a loop carried over an earlier break is the resume function's own.
        handed_over = is_internal_name(getattr(c.source, "local", ""))
        if (c.source is not None and not handed_over) or c.borrowed \
                or id(c) in reachable:
            raise Unsupported(f"a graph break inside a loop over {c.describe()}, which the rest of "
                              "the loop could change",
                              "move the unsupported line out of the loop, or loop over a copy "
                              "(`for t in list(lst):`)")


def _reachable(roots) -> set:
    """ids of the values created in the frame that ``roots`` hold, directly or inside containers
    and objects created in the frame."""
    from .values.containers import DictValue, SequenceValue
    from .values.instances import ObjectValue
    from .values.iterators import DictView

    seen: set = set()
    todo = list(roots)
    while todo:
        v = todo.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        if v.source is not None:
            continue  # from outside: its contents were not built here
        if isinstance(v, SequenceValue):
            todo.extend(v.items)
        elif isinstance(v, DictValue):
            todo.extend(v.items.values())
        elif isinstance(v, ObjectValue):
            todo.extend(v.attrs.values())
        elif isinstance(v, DictView):
            todo.append(v.dict_value)
    return seen


def reset() -> None:
    """Drop every cache entry and per-code decision, and the statistics."""
    for code in list(_touched):
        _C.clear_code(code)
    _touched.clear()
    for code, contexts in list(_target_contexts.items()):
        _touched.add(code)
        for ctx in list(contexts):
            ctx.sizes_seen.clear()  # sizes seen before are forgotten too: static first again
    record.reset()
    from .examples import clear_meta_memo
    clear_meta_memo()
