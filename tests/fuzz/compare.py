"""What a call leaves behind, and how an eager and a compiled call are compared.

A call's record holds snapshots taken at once after it returns (the next call mutates the same
objects): the result, the raised exception's type, the arguments and the module's globals
(``G*``), the printed text, and which objects of the result are, or share storage with, an input,
a global, or another part of the result.
"""

from __future__ import annotations

import dataclasses
import math
import types

import torch

from framejit.testing import TOLERANCES

MAX_DEPTH = 8


def snapshot(value, depth: int = 0):
    """A copy of ``value`` made of tuples, plain numbers and cloned tensors: later mutations of
    the value leave it alone, and objects of the eager and the compiled module (whose classes are
    distinct) compare by class name and attributes."""
    if depth > MAX_DEPTH:
        return ("deep",)
    if isinstance(value, torch.Tensor):
        return ("tensor", value.detach().clone(), value.requires_grad)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return ("float", value)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [snapshot(v, depth + 1) for v in value])
    if isinstance(value, dict):
        return ("dict", [(k, snapshot(v, depth + 1)) for k, v in value.items()])
    if isinstance(value, (type({}.keys()), type({}.values()), type({}.items()))):
        return (type(value).__name__, [snapshot(v, depth + 1) for v in value])
    if isinstance(value, torch.nn.Module):
        # Its state: parameters, buffers, submodules' state and public attributes (the hook
        # tables and other internals are torch's business).
        state = [(f"param {k}", snapshot(v, depth + 1)) for k, v in value._parameters.items()]
        state += [(f"buffer {k}", snapshot(v, depth + 1)) for k, v in value._buffers.items()]
        state += [(f"module {k}", snapshot(v, depth + 1)) for k, v in value._modules.items()]
        state += [(k, snapshot(v, depth + 1)) for k, v in sorted(vars(value).items())
                  if not k.startswith("_")]
        return ("object", type(value).__name__, state)
    if isinstance(value, BaseException):
        return ("exception", type(value).__name__)
    if isinstance(value, (types.FunctionType, types.GeneratorType, types.MethodType)):
        return (type(value).__name__,)
    if dataclasses.is_dataclass(value) or hasattr(value, "__dict__"):
        attrs = sorted(vars(value).items())
        return ("object", type(value).__name__, [(k, snapshot(v, depth + 1)) for k, v in attrs])
    return ("other", type(value).__name__)


def difference(eager, compiled, path: str) -> str | None:
    """The first place where two snapshots differ, as a message, or None."""
    if isinstance(eager, tuple) and eager and eager[0] == "tensor":
        if not (isinstance(compiled, tuple) and compiled and compiled[0] == "tensor"):
            return f"{path}: expected a tensor, got {_short(compiled)}"
        return _tensor_difference(eager, compiled, path)
    if isinstance(eager, tuple) and eager and eager[0] == "float":
        if not (isinstance(compiled, tuple) and compiled and compiled[0] == "float"):
            return f"{path}: expected a float, got {_short(compiled)}"
        a, b = eager[1], compiled[1]
        if (a != a and b != b) or math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-5):
            return None
        return f"{path}: {b!r} != {a!r} (eager)"
    if isinstance(eager, tuple) and eager and isinstance(eager[-1], list):
        if not isinstance(compiled, tuple) or compiled[:-1] != eager[:-1]:
            return f"{path}: {_short(compiled)} is not {_short(eager)} (eager)"
        items_e, items_c = eager[-1], compiled[-1]
        if len(items_e) != len(items_c):
            return f"{path}: length {len(items_c)} != {len(items_e)} (eager)"
        keyed = eager[0] in ("dict", "object")
        for i, (e, c) in enumerate(zip(items_e, items_c)):
            if keyed:
                if e[0] != c[0]:
                    return f"{path}: keys {[k for k, _ in items_c]} != {[k for k, _ in items_e]} (eager)"
                sub = f"{path}.{e[0]}" if eager[0] == "object" else f"{path}[{e[0]!r}]"
                found = difference(e[1], c[1], sub)
            else:
                found = difference(e, c, f"{path}[{i}]")
            if found:
                return found
        return None
    if type(eager) is not type(compiled) or eager != compiled:
        return f"{path}: {_short(compiled)} != {_short(eager)} (eager)"
    return None


def _tensor_difference(eager, compiled, path):
    _, a, grad_a = compiled
    _, e, grad_e = eager
    if (a.dtype, tuple(a.shape), grad_a) != (e.dtype, tuple(e.shape), grad_e):
        return (f"{path}: tensor {a.dtype} {list(a.shape)} requires_grad={grad_a} != "
                f"{e.dtype} {list(e.shape)} requires_grad={grad_e} (eager)")
    rtol, atol = TOLERANCES.get(e.dtype, (0.0, 0.0))
    # Values are compared with a little more slack than one op's tolerance: a program chains
    # up to a few dozen ops, and the compiled code may order a reduction differently.
    if not torch.allclose(a, e, rtol=rtol * 10, atol=atol * 10, equal_nan=True):
        worst = (a.double() - e.double()).abs().nan_to_num(0).max().item() if a.numel() else 0
        return f"{path}: tensor values differ (max abs diff {worst:.3g})"
    return None


def _short(value) -> str:
    if isinstance(value, tuple) and value and value[0] == "tensor":
        return f"tensor{list(value[1].shape)}"
    if isinstance(value, tuple) and value and isinstance(value[0], str):
        return "/".join(str(v) for v in value[:2] if isinstance(v, str))
    return repr(value)[:80]


def _walk(value, path: str, depth: int = 0):
    """(path, object) for each tensor, list, dict and user object reachable from ``value``."""
    if depth > MAX_DEPTH:
        return
    if isinstance(value, torch.Tensor):
        yield path, value
    elif isinstance(value, (list, tuple)):
        if isinstance(value, list):
            yield path, value
        for i, v in enumerate(value):
            yield from _walk(v, f"{path}[{i}]", depth + 1)
    elif isinstance(value, dict):
        yield path, value
        for k, v in value.items():
            yield from _walk(v, f"{path}[{k!r}]", depth + 1)
    elif hasattr(value, "__dict__") and not isinstance(value, (type, types.ModuleType,
                                                                  types.FunctionType)):
        yield path, value
        for k, v in sorted(vars(value).items()):
            yield from _walk(v, f"{path}.{k}", depth + 1)


def _storage(t: torch.Tensor):
    try:
        storage = t.untyped_storage()
    except Exception:  # a tensor without storage can alias nothing
        return None
    return storage.data_ptr() if storage.nbytes() else None


def aliasing(result, roots: dict) -> list[str]:
    """Which parts of ``result`` are (``is``) or share storage with (``view``) a part of
    ``roots`` (the arguments and globals) or an earlier part of the result."""
    known = [(p, v) for name, root in roots.items() for p, v in _walk(root, name)]
    relations = set()
    for out_path, out in _walk(result, "result"):
        for path, other in known:
            if out is other:
                relations.add(f"{out_path} is {path}")
            elif isinstance(out, torch.Tensor) and isinstance(other, torch.Tensor):
                ptr = _storage(out)
                if ptr is not None and ptr == _storage(other):
                    relations.add(f"{out_path} shares storage with {path}")
        known.append((out_path, out))
    return sorted(relations)
