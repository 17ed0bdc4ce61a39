"""Run one generated program eagerly and compiled, in this process, and compare.

Each side gets its own copy of the module (its own globals and classes) and its own inputs from
``make_inputs``. The sequence, the same on both sides: two calls on the same objects (state may
evolve between them, so call *k* compiled is compared with call *k* eager), then one call on new
inputs of other shapes (which makes the sizes that changed dynamic), and one on inputs of a third
shape (the dynamic graph again, at sizes it was not compiled for). Before the second and the
fourth call, the module's ``perturb()`` changes state the function may read (prelude CONFIG),
and before the second ``perturb_inputs`` changes the inputs of the first. Call ``run_program`` in a
subprocess (see worker.py): a program that crashes the interpreter must not end the campaign.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import linecache
import math
import os
import sys
import types

import torch

import framejit
from framejit.testing import capture_stats

from .compare import aliasing, difference, snapshot

_names = itertools.count()

# The order in which the parts of a call are compared; the first difference found names the
# failure's kind, which the shrinker keeps while it cuts the program down.
PARTS = ("exception", "result", "arguments", "globals", "stdout", "aliasing")


def load(source: str, tag: str) -> types.ModuleType:
    """A fresh module from ``source``, registered in sys.modules (dataclasses look their module
    up there) and in linecache (so that tracebacks and framejit's messages show the lines)."""
    name = f"fuzz_{tag}_{next(_names)}"
    filename = f"<{name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    module = types.ModuleType(name)
    module.__file__ = filename
    sys.modules[name] = module
    exec(compile(source, filename, "exec"), module.__dict__)
    return module


def _globals(module) -> dict:
    return {k: v for k, v in vars(module).items() if k.startswith("G")}


def call_once(module, fn, args) -> dict:
    """Calls ``fn(*args)`` and records what it left behind (see compare.py)."""
    torch.manual_seed(0)
    out = io.StringIO()
    result, error, message = None, None, ""
    with contextlib.redirect_stdout(out):
        try:
            result = fn(*args)
        except Exception as e:  # the user's exceptions are part of the behaviour compared
            error, message = type(e).__name__, f"{type(e).__name__}: {e}"[:300]
    names = ("x", "y", "lst", "d", "obj")
    roots = dict(zip(names, args)) | _globals(module)
    return {
        "exception": error,
        "message": message,
        "result": snapshot(result),
        "arguments": snapshot(dict(zip(names, args))),
        "globals": snapshot(_globals(module)),
        "stdout": out.getvalue(),
        "aliasing": aliasing(result, roots),
    }


def run_side(module, fn) -> list[dict]:
    args = module.make_inputs(0)
    # perturb() (prelude CONFIG) changes state the function reads, from outside, before the
    # second and the fourth call.
    perturb = getattr(module, "perturb", lambda: None)
    records = [call_once(module, fn, args)]
    perturb()
    if hasattr(module, "perturb_inputs"):  # the inputs changed too, as a caller may
        module.perturb_inputs(*args)
    records.append(call_once(module, fn, args))
    records.append(call_once(module, fn, module.make_inputs(1)))
    perturb()
    records.append(call_once(module, fn, module.make_inputs(2)))
    return records


def compare_records(eager: list[dict], compiled: list[dict]) -> list[dict]:
    """One entry ``{"kind", "call", "detail"}`` per part of a call that differs."""
    found = []
    for call, (e, c) in enumerate(zip(eager, compiled), start=1):
        for part in PARTS:
            if part == "exception":
                detail = None if e["exception"] == c["exception"] else \
                    f"eager raised {e['message'] or 'nothing'}; compiled raised {c['message'] or 'nothing'}"
            elif part in ("stdout", "aliasing"):
                same = e[part] == c[part] or (part == "stdout" and _same_printout(e[part], c[part]))
                detail = None if same else f"compiled {c[part]!r} != eager {e[part]!r}"
            else:
                detail = difference(e[part], c[part], part)
            if detail:
                found.append({"kind": part, "call": call, "detail": detail[:600]})
    return found


def _same_printout(eager: str, compiled: str) -> bool:
    """Equal printed lines, but for floats (``print('v', format(t.sum().item(), '.4g'))``) that
    differ by the rounding of a sum: a sum that cancels to 0.0033 from terms near 1 showed
    0.003282 against eager's 0.003283, one fp32 rounding of a different summation order."""
    a, b = eager.split(), compiled.split()
    if len(a) != len(b) or eager.count("\n") != compiled.count("\n"):
        return False
    for x, y in zip(a, b):
        if x == y:
            continue
        try:
            fx, fy = float(x), float(y)
        except ValueError:
            return False
        if not math.isclose(fx, fy, rel_tol=1e-3, abs_tol=1e-5):
            return False
    return True


_VALUES = ": tensor values differ"
#: Relative size of the input perturbation that tells an ill-conditioned program (4 fp32 ulps).
PERTURBATION = 2.0**-21


def _values_only(diffs: list[dict]) -> bool:
    return all(_VALUES in d["detail"] for d in diffs)


def _place(diff: dict) -> tuple:
    """Where a difference of values is: its part, call and path."""
    return diff["kind"], diff["call"], diff["detail"].split(_VALUES)[0]


def _perturb(value, g: torch.Generator, seen: set) -> None:
    """Scales each fp32/fp64 tensor reachable from ``value`` (lists, tuples, dicts, objects'
    attributes) by 1 +- PERTURBATION, element by element, in place."""
    if id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, torch.Tensor):
        if value.dtype in (torch.float32, torch.float64) and value.numel():
            signs = torch.randint(0, 2, value.shape, generator=g).to(value.dtype) * 2 - 1
            with torch.no_grad():
                value.mul_(1 + PERTURBATION * signs)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _perturb(v, g, seen)
    elif isinstance(value, dict):
        for v in value.values():
            _perturb(v, g, seen)
    elif hasattr(value, "__dict__") and not isinstance(value, (type, types.ModuleType)):
        for v in vars(value).values():
            _perturb(v, g, seen)


def _ill_conditioned(diffs: list[dict], eager: list[dict], module) -> bool:
    """Whether eager itself, on inputs a few ulps away, leaves the tolerance at every place the
    compiled run did: a program that iterates a map with a gain above 1 (``x = 3 * sin(x) + c``
    ten times) turns one rounding of another summation order into 1e-4, and such a program
    cannot tell a wrong answer from a right one. A wrong answer in a well-conditioned program
    stays a difference."""
    g = torch.Generator().manual_seed(0)
    make_inputs = module.make_inputs

    def perturbed_inputs(variant):
        args = make_inputs(variant)
        _perturb(args, g, set())
        return args

    module.make_inputs = perturbed_inputs
    try:
        moved = compare_records(eager, run_side(module, module.f))
    except Exception:
        return False
    places = {_place(d) for d in moved if _VALUES in d["detail"]}
    return all(_place(d) in places for d in diffs)


def _reference_backend(gm, example_inputs):
    """The kernel pipeline with every kernel run by the description's reference interpreter:
    what the passes, fusion and lowering do, whatever the renderers do."""
    from framejit.kernels.reference import ReferenceLauncher
    from framejit.pipeline import compile_with_kernels

    return compile_with_kernels(gm, example_inputs, ("cpu", "cuda"), launcher=ReferenceLauncher)


def run_program(source: str) -> dict:
    """``{"status": "ok" | "diff" | "ill-conditioned" | "invalid", "diffs": [...],
    "eager_exceptions": [...], "graphs", "fallbacks"}``. "invalid" means the program itself is
    broken (it does not load or build its inputs): the generator's fault, never framejit's.
    "ill-conditioned": the only differences are tensor values, and eager's own values move as
    far on inputs perturbed by a few ulps (see :func:`_ill_conditioned`); not a failure."""
    framejit.reset()
    try:
        eager_module = load(source, "eager")
        compiled_module = load(source, "compiled")
        eager = run_side(eager_module, eager_module.f)
    except Exception as e:
        return {"status": "invalid", "diffs": [], "error": f"{type(e).__name__}: {e}"[:300]}
    stats = capture_stats()
    backend = os.environ.get("FRAMEJIT_FUZZ_BACKEND", "default")
    if backend == "reference":
        framejit.backends.register_backend("fuzz-reference", _reference_backend, replace=True)
        backend = "fuzz-reference"
    compiled = run_side(compiled_module, framejit.compile(compiled_module.f, backend=backend))
    graphs, fallbacks = stats.graphs, stats.eager_frames
    kernels = framejit.stats()["kernels"]
    diffs = compare_records(eager, compiled)
    modules = [eager_module, compiled_module]
    status = "diff" if diffs else "ok"
    if diffs and _values_only(diffs):
        perturbed_module = load(source, "perturbed")
        modules.append(perturbed_module)
        if _ill_conditioned(diffs, eager, perturbed_module):
            status = "ill-conditioned"
    for module in modules:
        sys.modules.pop(module.__name__, None)
        linecache.cache.pop(module.__file__, None)
    framejit.reset()
    return {
        "status": status,
        "diffs": diffs,
        "eager_exceptions": [r["exception"] for r in eager],
        "graphs": graphs,
        "fallbacks": fallbacks,
        "kernels": kernels,
    }
