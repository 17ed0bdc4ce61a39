"""The public API: ``compile``, ``disable``, ``reset``, ``stats``, ``set_logs``."""

from __future__ import annotations

import dataclasses
import functools
import types

import torch

from . import _C, record
from .capture import convert_frame as cf
from .capture.shapes import DYNAMIC_MARK as _DYNAMIC_MARK
from .capture.shapes import STATIC_MARK as _STATIC_MARK
from .compiler import make_compiler
from .config import make_options
from .debug import dump, logs

# The readers of framejit.record that act as events arrive.
logs.install()
dump.install()


def compile(fn_or_module=None, *, backend="default", fullgraph: bool = False, dynamic=None,
            options: dict | None = None):
    """Compile a function or an ``nn.Module`` with framejit.

    Works as ``@framejit.compile``, ``@framejit.compile(backend=...)`` and
    ``framejit.compile(fn_or_module)``::

        @framejit.compile
        def f(x, w, b):
            return torch.relu(x @ w + b).sum(-1)

        model = framejit.compile(torch.nn.Linear(16, 32))

    ``backend`` is a registered name (``"eager"``, ``"default"``) or any callable
    ``(torch.fx.GraphModule, example_inputs) -> callable``, as for torch.compile.
    With ``fullgraph=True``, anything that cannot be captured raises :class:`GraphBreakError`
    instead of running as plain Python.

    ``dynamic`` chooses which input sizes are symbolic: ``None`` (the default) compiles for the
    sizes of the first call, and when a later call differs only in some sizes, compiles once more
    with those dimensions symbolic (logged by the ``framejit.recompiles`` logger); ``True`` makes
    every dimension of every input symbolic from the first call; ``False`` never does. Sizes 0
    and 1 always stay fixed. See also :func:`mark_dynamic` and :func:`mark_static`.
    """
    if fn_or_module is None:
        return functools.partial(compile, backend=backend, fullgraph=fullgraph, dynamic=dynamic,
                                 options=options)
    if dynamic not in (None, True, False):
        raise TypeError(f"framejit.compile(dynamic=...) takes None, True or False, got {dynamic!r}")
    opts = make_options(fullgraph=fullgraph, dynamic=dynamic, overrides=options)
    compile_graph = make_compiler(backend)  # an unknown backend name fails here
    if isinstance(fn_or_module, torch.nn.Module):
        return CompiledModule(fn_or_module, compile_graph, opts, backend)
    if not callable(fn_or_module):
        raise TypeError(f"framejit.compile expects a function or an nn.Module, got {type(fn_or_module).__name__}")
    return _compile_function(fn_or_module, compile_graph, opts)


def recompile_fresh(fn_or_module, backend=None):
    """``fn_or_module`` compiled anew, in a context of its own (no cached versions shared with
    any other wrapper), without dumps. An already compiled function or module keeps its backend
    and other options unless ``backend`` is given (explain() uses this)."""
    ctx = getattr(fn_or_module, "_framejit_context", None)
    if ctx is None:
        return compile(fn_or_module, backend="default" if backend is None else backend,
                       options={"dump_dir": None})
    original = (object.__getattribute__(fn_or_module, "_orig_mod")
                if isinstance(fn_or_module, CompiledModule) else fn_or_module.__wrapped__)
    compile_graph = ctx.compile_graph if backend is None else make_compiler(backend)
    options = dataclasses.replace(ctx.options, dump_dir=None)  # the report is explain's output
    if isinstance(original, torch.nn.Module):
        spec = object.__getattribute__(fn_or_module, "_framejit_backend") if backend is None \
            else backend
        return CompiledModule(original, compile_graph, options, spec)
    return _compile_function(original, compile_graph, options)


def _compile_function(fn, compile_graph, opts):
    code = _code_of(fn)
    ctx = cf.CompileContext(opts, compile_graph, getattr(fn, "__qualname__", repr(fn)))
    callback = cf.make_callback(ctx)
    if code is not None:
        cf.register_target(ctx, code)
    wrapper = _C.CompiledFunction(fn, callback)
    functools.update_wrapper(wrapper, fn)
    wrapper._framejit_context = ctx
    cf.release_with(wrapper, ctx)  # its cache entries go when it goes
    return wrapper


def _code_of(fn):
    if isinstance(fn, types.MethodType):
        fn = fn.__func__
    return getattr(fn, "__code__", None)


class CompiledModule(torch.nn.Module):
    """What ``framejit.compile(module)`` returns: calls run the module with capture on; everything
    else (parameters(), state_dict(), train()/eval(), attributes) is the original module's."""

    def __init__(self, module: torch.nn.Module, compile_graph, options, backend=None):
        # No nn.Module.__init__: every module attribute resolves to the original through
        # __getattr__, so state, parameters and flags are shared, never copied.
        ctx = cf.CompileContext(options, compile_graph, type(module).__qualname__)
        object.__setattr__(self, "_framejit_backend", backend)  # what compile() was given
        callback = cf.make_callback(ctx)
        forward = module.forward
        code = _code_of(forward)
        if code is not None:
            cf.register_target(ctx, code)
        object.__setattr__(self, "_orig_mod", module)
        object.__setattr__(self, "_framejit_context", ctx)
        call = _C.CompiledFunction(module, callback)
        object.__setattr__(self, "_framejit_call", call)
        cf.release_with(call, ctx)  # its cache entries go when it goes

    def __call__(self, *args, **kwargs):
        return self._framejit_call(*args, **kwargs)

    def forward(self, *args, **kwargs):
        return self._framejit_call(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(object.__getattribute__(self, "_orig_mod"), name)

    def __setattr__(self, name, value):
        setattr(self._orig_mod, name, value)

    def __delattr__(self, name):
        delattr(self._orig_mod, name)

    def __getitem__(self, idx):
        return self._orig_mod[idx]

    def __len__(self):
        return len(self._orig_mod)

    def __iter__(self):
        return iter(self._orig_mod)

    def __dir__(self):
        return dir(self._orig_mod)

    def __repr__(self):
        return f"framejit.compile({self._orig_mod!r})"

    # Copies and pickles: the module copied (or pickled), compiled again with the same backend
    # and options, in a context of its own (compiled versions are never shared or saved).
    def __copy__(self):
        ctx = object.__getattribute__(self, "_framejit_context")
        return CompiledModule(self._orig_mod, ctx.compile_graph, ctx.options,
                              object.__getattribute__(self, "_framejit_backend"))

    def __deepcopy__(self, memo):
        import copy

        ctx = object.__getattribute__(self, "_framejit_context")
        return CompiledModule(copy.deepcopy(self._orig_mod, memo), ctx.compile_graph, ctx.options,
                              object.__getattribute__(self, "_framejit_backend"))

    def __reduce_ex__(self, protocol):
        ctx = object.__getattribute__(self, "_framejit_context")
        backend = object.__getattribute__(self, "_framejit_backend")
        if backend is None:
            raise TypeError("this framejit.compile(module) was made without a backend to compile "
                            "with again; pickle its module (or its state_dict()) instead")
        return (_compiled_again, (self._orig_mod, backend, ctx.options))


def _compiled_again(module: torch.nn.Module, backend, options) -> CompiledModule:
    """An unpickled ``framejit.compile(module)``: compiled anew with the same backend and options."""
    return CompiledModule(module, make_compiler(backend), options, backend)


def mark_dynamic(t: torch.Tensor, dim: int, min: int | None = None, max: int | None = None) -> None:
    """Compile with the size of dimension ``dim`` of ``t`` symbolic from the first call, within
    ``[min, max]`` when given (sizes 0 and 1 stay fixed)::

        x = torch.randn(8, 16)
        framejit.mark_dynamic(x, 0)
        f(x)   # one graph for every x.shape[0] >= 2
    """
    dim = _dim_index(t, dim)
    dims = dict(getattr(t, _DYNAMIC_MARK, {}))
    dims[dim] = (min, max)
    setattr(t, _DYNAMIC_MARK, dims)


def mark_static(t: torch.Tensor, dim: int) -> None:
    """Keep the size of dimension ``dim`` of ``t`` fixed, whatever ``dynamic`` says (a new size
    then compiles a new version)."""
    dim = _dim_index(t, dim)
    setattr(t, _STATIC_MARK, frozenset(getattr(t, _STATIC_MARK, frozenset())) | {dim})


def _dim_index(t: torch.Tensor, dim: int) -> int:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"expected a tensor, got {type(t).__name__}")
    if not -t.dim() <= dim < t.dim():
        raise IndexError(f"dimension {dim} is out of range for a tensor of {t.dim()} dimensions")
    return dim % t.dim()


def disable(fn=None):
    """Run ``fn`` as plain Python, never captured, even when called from compiled code::

        @framejit.disable
        def log_stats(x): ...
    """
    if fn is None:
        return disable
    wrapper = _C.CompiledFunction(fn, None)
    functools.update_wrapper(wrapper, fn)
    return wrapper


def reset() -> None:
    """Forget every compiled version of every function (they recompile on their next call)
    and reset :func:`stats`."""
    cf.reset()


def stats() -> dict:
    """What framejit did since the last :func:`reset`, as a dict of counters::

        framejit.reset()
        f(x)
        framejit.stats()
        # {'frames': 1, 'graphs': 1, 'graph_breaks': 0, 'fallbacks': 0, 'recompiles': 0,
        #  'ops': 3, 'capture_seconds': 0.004, 'kernels': 0, 'kernel_seconds': 0.0,
        #  'kernel_layout_misses': 0, 'graph_cache_hits': 0}

    ``frames``: frames offered to capture; ``graphs``: graphs compiled; ``graph_breaks``: frames
    split where something could not be captured; ``fallbacks``: frames that ran as plain Python;
    ``recompiles``: captures after a cached version's guards failed; ``ops``: operations in the
    graphs; ``capture_seconds``: time spent capturing and compiling (kernels included);
    ``kernels``: generated kernels (Triton, C); ``kernel_seconds``: the part of
    ``capture_seconds`` spent rendering, loading and tuning them; ``kernel_layout_misses``:
    kernels called with an input laid out otherwise than they were compiled for, which ran
    such calls as their torch ops (``set_logs("kernels")`` says which and why);
    ``graph_cache_hits``: graphs whose compile was read from the disk cache of compiled graphs
    (``framejit.graph_cache``).
    """
    s = record.stats
    return {
        "frames": s.frames,
        "graphs": s.graphs,
        "graph_breaks": s.graph_breaks,
        "fallbacks": s.eager_frames,
        "recompiles": s.recompiles,
        "ops": s.ops,
        "capture_seconds": s.capture_seconds,
        "kernels": s.kernels,
        "kernel_seconds": s.kernel_seconds,
        "kernel_layout_misses": s.kernel_layout_misses,
        "graph_cache_hits": s.graph_cache_hits,
    }


set_logs = logs.set_logs
