"""The guard function as one condition per line, each with a comment in the user's terms."""

from __future__ import annotations

import ast
import types

import torch

from .. import compat
from ..guards import (
    AliasGuard,
    DictKeysGuard,
    DistinctGuard,
    EqualsGuard,
    IdGuard,
    LenGuard,
    NoHooksGuard,
    NotShadowedGuard,
    StateGuard,
    TensorGuard,
    TypeGuard,
    _depth,
    any_autocast_enabled,
)
from ..values.copying import state_matches
from .names import ReadableNames, a_or_an, arg_names, dotted, ident, short, user_words

# -- guards ----------------------------------------------------------------------------------------


def _contiguous_strides(shape) -> tuple:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def _static(g: TensorGuard) -> bool:
    """Whether the guard is on exact sizes (a guard with symbolic sizes renders as its own test)."""
    return all(type(d) is int for d in (*g.shape, *g.stride))


def _tensor_words(g: TensorGuard) -> str:
    if len(g.shape) > 1:
        shape = "x".join(map(str, g.shape))
    else:
        shape = f"{g.shape[0]}-element" if g.shape else "0-dim"
    kind = "tensor" if g.typ is torch.Tensor else g.typ.__name__
    dtype = str(g.dtype).replace("torch.", "")
    contiguous = _contiguous_strides(g.shape) == tuple(g.stride)
    layout = "contiguous" if contiguous else f"strides {g.stride}"
    grad = ", requires grad" if g.requires_grad else ""
    return f"{a_or_an(shape)} {dtype} {kind} on {g.device}, {layout}{grad}"


def _guard_line(guard, v: str, names: ReadableNames, value_of) -> tuple[str, str]:
    """(condition that holds when the guard passes, comment) for one guard."""
    describe = getattr(guard, "describe", None)
    who = user_words(guard.source)
    if isinstance(guard, IdGuard):
        path = dotted(guard.obj)
        if path is not None:
            what = f"the module {path}" if isinstance(guard.obj, types.ModuleType) else path
            return f"{v} is {names(guard.obj)}", f"{who} is {what}"
        obj = names.hint(guard.obj, f"captured_{ident(guard.source.name())}",
                         f"the object {who} was at capture: {short(guard.obj)}")
        return f"{v} is {obj}", f"{who} is the same {type(guard.obj).__name__} object as at capture"
    if isinstance(guard, TypeGuard):
        return f"type({v}) is {names(guard.typ)}", f"{who} is {a_or_an(guard.typ.__name__)}"
    if isinstance(guard, EqualsGuard):
        value = guard.value
        if value is None or type(value) is bool or isinstance(value, torch.dtype):
            return f"{v} is {names(value)}", f"{who} is {value}"
        if isinstance(value, float) and value != value:
            return f"type({v}) is float and {v} != {v}", f"{who} is NaN"
        return (f"type({v}) is {names(type(value))} and {v} == {names(value)}",
                f"{who} == {short(value)} ({a_or_an(type(value).__name__)})")
    if isinstance(guard, NotShadowedGuard):
        listed = ", ".join(sorted(guard.names))
        return (f"{names(guard.names)}.isdisjoint({v})",
                f"no global of that module shadows the builtin {listed}")
    if isinstance(guard, LenGuard):
        return (f"type({v}) is {names(guard.typ)} and len({v}) == {guard.length}",
                f"{who} is {a_or_an(guard.typ.__name__)} of {guard.length} item{'s' if guard.length != 1 else ''}")
    if isinstance(guard, DictKeysGuard):
        keys = ", ".join(map(short, guard.keys))
        return (f"type({v}) is {names(guard.typ)} and tuple({v}) == {names(guard.keys)}",
                f"{who} is {a_or_an(guard.typ.__name__)} with the keys {keys}, in this order")
    if isinstance(guard, StateGuard):
        base = ident(who)
        args = ", ".join([names(guard.keys),
                          names.hint(guard.state, f"{base}_state", f"the plain data of {who} at capture"),
                          names(guard.types), names(guard.nested)])
        attrs = ", ".join(map(str, guard.keys)) or "none"
        return (f"{names(state_matches)}({v}, {args})",
                f"the attributes of {who} ({attrs}) hold the same plain data as at capture")
    if isinstance(guard, NoHooksGuard):
        tables = " or ".join(f"{v}.{t}" for t in ("_forward_hooks", "_forward_pre_hooks",
                                                    "_backward_hooks", "_backward_pre_hooks"))
        return f"not ({tables})", f"{who} has no hooks (its forward was inlined)"
    if isinstance(guard, AliasGuard):
        w = value_of(guard.other)
        other = user_words(guard.other)
        if guard.same:
            return f"{v} is {w}", f"{who} and {other} are one object"
        return f"{v} is not {w}", f"{who} and {other} are different objects"
    if isinstance(guard, DistinctGuard):
        values = [value_of(s) for s in guard.sources]
        ids = ", ".join(f"id({x})" for x in values)
        listed = ", ".join(user_words(s) for s in guard.sources)
        return f"len({{{ids}}}) == {len(values)}", f"{listed} are distinct objects"
    if isinstance(guard, TensorGuard) and _static(guard):
        return (f"type({v}) is {names(guard.typ)} and {v}.dtype is {names(guard.dtype)}"
                f" and {v}.shape == {guard.shape!r} and {v}.stride() == {guard.stride!r}"
                f" and {v}.requires_grad is {guard.requires_grad!r}"
                f" and {v}.device == {names(guard.device)}",
                f"{who} is {_tensor_words(guard)}")
    # A guard kind this file does not know: its own test, negated.
    comment = describe() if callable(describe) else f"{type(guard).__name__} on {who}"
    lines = guard.code(v, names)
    if len(lines) == 1 and lines[0].startswith("if ") and lines[0].endswith(": return False"):
        return f"not ({lines[0][3:-len(': return False')]})", comment
    g = names.hint(guard, f"guard_{ident(who)}", f"the {type(guard).__name__} on {who}")
    return f"{g}.reason({v}) is None", comment


class _PathReader:
    """Guard paths as the full expression each time (``self._modules['fc']._parameters['w']``):
    longer than the guard function's shared temporaries, but each line reads alone."""

    def __init__(self, names):
        self.names = names

    def __call__(self, source) -> str:
        return source.expr(self.names)


def render_guards(guards, code: types.CodeType, fn_name: str, names: ReadableNames) -> str:
    """The guard function as one condition per line (see the module docstring)."""
    rows: list[tuple[str, str]] = []
    grad, dtype, any_autocast, autocast, devices = guards.global_state
    rows.append((f"torch.is_grad_enabled() is {grad}", f"grad mode is {'on' if grad else 'off'}"))
    rows.append((f"torch.get_default_dtype() is {names(dtype)}", f"the default dtype is {dtype}"))
    ac = names(any_autocast_enabled)
    if any_autocast:
        from ..guards import _autocast_detail
        detail = names.hint(autocast, "autocast_at_capture", "(enabled, dtype) for cpu and cuda")
        rows.append((f"{names(_autocast_detail)}() == {detail}", "autocast is on, as at capture"))
    else:
        rows.append((f"{ac}() is False", "autocast is off"))
    names.namespace.setdefault("torch", torch)
    if devices:
        from ..guards import device_modes
        rows.append((f"{names(device_modes)}() == {devices!r}",
                     "inside these torch.device contexts, and no other torch function mode"))
    else:
        rows.append(("not torch._C._len_torch_function_stack()", "no torch function mode"))
    rows.append(("not torch._C._len_torch_dispatch_stack()", "no torch dispatch mode"))
    if guards.check_global_hooks:
        # (the tables guards._global_hook_tables reads, by their path)
        tables = " or ".join(f"torch.nn.modules.module.{n}" for n in (
            "_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
            "_global_backward_pre_hooks") if hasattr(torch.nn.modules.module, n))
        rows.append((f"not ({tables})", "no global module hook is registered"))
    value_of = _PathReader(names)
    for guard in sorted(guards.guards, key=lambda g: (_depth(g.source), g.order)):
        rows.append(_guard_line(guard, value_of(guard.source), names, value_of))
    params = ", ".join(compat.guard_param_names(code))
    body = []
    for k, (cond, comment) in enumerate(rows):
        if " or " in cond and not cond.startswith("not ("):
            cond = f"({cond})"
        body.append(f"            {'and ' if k else ''}{cond}  # {comment}")
    src = (f"def {fn_name}({params}):\n"
           f'    """Whether this cached version of {code.co_name} may run: every condition holds."""\n'
           f"    try:\n"
           f"        return (\n" + "\n".join(body) + "\n"
           "        )\n"
           "    except Exception:  # a path that no longer exists (a deleted attribute, a key)\n"
           "        return False\n")
    return _rename_params(src, arg_names(code))


def _rename_params(src: str, mapping: dict[str, str]) -> str:
    if not mapping:
        return src
    tree = ast.parse(src)
    lines = src.splitlines(True)
    # Replace from the end so earlier offsets stay right.
    spots = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in mapping:
            spots.append((node.lineno, node.col_offset, node.id))
        elif isinstance(node, ast.arg) and node.arg in mapping:
            spots.append((node.lineno, node.col_offset, node.arg))
    for lineno, col, name in sorted(spots, reverse=True):
        line = lines[lineno - 1]
        encoded = line.encode()
        lines[lineno - 1] = (encoded[:col] + mapping[name].encode() + encoded[col + len(name):]).decode()
    return "".join(lines)

