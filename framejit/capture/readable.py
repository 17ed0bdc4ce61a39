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
import builtins
import enum
import itertools
import keyword
import linecache
import operator
import re
import sys
import types
import weakref
from dataclasses import dataclass, field

import torch

from . import compat
from .guards import (
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
    _global_hook_tables,
    _is_literal,
    any_autocast_enabled,
)
from .sources import ConstNames, FreeVarSource, GlobalSource, LocalSource
from .values.copying import state_matches


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


# -- names -----------------------------------------------------------------------------------------


def _ident(text: str) -> str:
    out = "".join(c if c.isalnum() else "_" for c in text)
    while "__" in out:
        out = out.replace("__", "_")
    out = out.strip("_") or "value"
    out = "v_" + out if out[0].isdigit() else out
    return out + "_" if keyword.iskeyword(out) else out


def _short(obj) -> str:
    try:
        r = repr(obj)
    except Exception:
        r = ""
    if not r or len(r) > 60 or "\n" in r:
        r = f"<{type(obj).__name__} object at {id(obj):#x}>"
    return r


def _resolve(path: str):
    parts = path.split(".")
    obj = sys.modules.get(parts[0])
    if obj is None:
        raise LookupError(path)
    for part in parts[1:]:
        obj = getattr(obj, part)
    return obj


def _dotted(obj) -> str | None:
    """A dotted path from a top-level module that reaches ``obj`` (``torch.relu``), or None."""
    if isinstance(obj, types.ModuleType):
        candidates = [obj.__name__]
    elif isinstance(obj, torch.dtype):
        candidates = [str(obj)]
    else:
        module = getattr(obj, "__module__", None)
        name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
        if not isinstance(module, str) or not isinstance(name, str) or "<" in name:
            return None
        candidates = [f"{module}.{name}"]
        if module.startswith("torch") and isinstance(getattr(obj, "__name__", None), str):
            candidates.append(f"torch.{obj.__name__}")  # torch.relu, not torch._C._VariableFunctions
    for path in candidates:
        top = path.split(".")[0]
        if top in ("__main__", "builtins") or top.startswith("_") or top == "framejit":
            continue
        try:
            if _resolve(path) is obj:
                return path
        except Exception:
            continue
    return None


class ReadableNames(ConstNames):
    """Names objects for generated code that a person reads: ``torch.float32`` and
    ``torch.relu`` by their path, builtins by their name, framejit's helpers by theirs, and
    everything else by a hint (``compiled_graph``, ``captured_self``) or its type. ``legend``
    says what each made-up name holds."""

    def __init__(self, reserved=()):
        super().__init__("const")
        self.reserved = set(reserved)
        self.legend: dict[str, str] = {}

    def unique(self, base: str) -> str:
        name = base
        k = 1
        while name in self.reserved or name in self.namespace or name in self.legend \
                or name in vars(builtins):
            name = f"{base}_{k}"
            k += 1
        self.reserved.add(name)
        return name

    def hint(self, obj, base: str, description: str) -> str:
        """Name ``obj`` ``base`` (made unique) unless it has a name already."""
        name = self._by_id.get(id(obj))
        if name is None:
            name = self.unique(base)
            self._bind(obj, name, description)
        return name

    def _bind(self, obj, name: str, description: str | None) -> None:
        self._by_id[id(obj)] = name
        self.namespace[name] = obj
        if description:
            self.legend[name] = description

    def __call__(self, obj) -> str:
        name = self._by_id.get(id(obj))
        if name is not None:
            return name
        expr = self._expr(obj)
        self._by_id[id(obj)] = expr
        return expr

    def _expr(self, obj) -> str:
        if obj is None or type(obj) in (bool, int, str) or _is_literal(obj):
            return repr(obj)
        if type(obj) in (tuple, frozenset) and all(_is_literal(x) for x in obj):
            return repr(obj)
        name = getattr(obj, "__name__", None)
        if isinstance(name, str) and getattr(builtins, name, None) is obj:
            return name
        if isinstance(obj, torch.device):
            self.namespace.setdefault("torch", torch)
            return f"torch.device({str(obj)!r})"
        path = _dotted(obj)
        if path is not None:
            top = path.split(".")[0]
            self.namespace.setdefault(top, sys.modules[top])
            return path
        module = getattr(obj, "__module__", None)
        if isinstance(name, str) and name.isidentifier():
            if isinstance(module, str) and module.startswith("framejit"):
                where = f"{module}.{getattr(obj, '__qualname__', name)}"
                doc = " ".join((getattr(obj, "__doc__", None) or "").strip().split("\n\n")[0].split())
                doc = doc.split(". ")[0].rstrip(".")
                if len(doc) > 100:
                    doc = doc[:97] + "..."
                description = f"framejit's {where}" + (f": {doc}" if doc else "")
            else:
                description = f"{type(obj).__name__} {name} of module {module}"
            fresh = self.unique(name)
            self._bind(obj, fresh, description)
            return fresh
        if isinstance(obj, dict) and isinstance(obj.get("__name__"), str) and "__builtins__" in obj:
            fresh = self.unique(f"globals_of_{_ident(obj['__name__'])}")
            self._bind(obj, fresh, f"the globals of module {obj['__name__']}")
            return fresh
        fresh = self.unique(f"{_ident(type(obj).__name__).lower()}_object")
        self._bind(obj, fresh, f"an object: {_short(obj)}")
        return fresh


def _arg_names(code: types.CodeType) -> dict[str, str]:
    """The generated parameter names of guard and entry functions -> readable ones."""
    out = {}
    for p in compat.guard_param_names(code):
        if p.startswith("___free_"):
            out[p] = f"{p[len('___free_'):]}_cell"
        elif p.startswith("___stack"):
            out[p] = f"carried_{p[len('___stack'):]}"
    return out


def _reserved(code: types.CodeType) -> set:
    names = set(map(compat.py_name, code.co_varnames + code.co_cellvars + code.co_freevars))
    return names | set(_arg_names(code).values()) | {code.co_name}


# -- guards ----------------------------------------------------------------------------------------


def _tensor_words(g: TensorGuard) -> str:
    if len(g.shape) > 1:
        shape = "x".join(map(str, g.shape))
    else:
        shape = f"{g.shape[0]}-element" if g.shape else "0-dim"
    kind = "tensor" if g.typ is torch.Tensor else g.typ.__name__
    dtype = str(g.dtype).replace("torch.", "")
    contiguous = tuple(torch.empty(g.shape, device="meta").stride()) == g.stride
    layout = "contiguous" if contiguous else f"strides {g.stride}"
    grad = ", requires grad" if g.requires_grad else ""
    return f"{_a(shape)} {dtype} {kind} on {g.device}, {layout}{grad}"


_CARRIED = re.compile(r"<value (\d+) carried across a graph break>")


def _path(source) -> str:
    """``source.name()`` with the rendering's names for carried stack values."""
    return _CARRIED.sub(r"carried_\1", source.name())


def _who(source) -> str:
    """A source in the user's words, as the rendering names things."""
    if isinstance(source, GlobalSource):
        return f"global {source.var}"
    if isinstance(source, LocalSource) and source.local.startswith("___stack"):
        k = source.local[len("___stack"):]
        return f"carried_{k} (value {k} of the stack at the graph break)"
    if isinstance(source, FreeVarSource):
        return f"{source.var} (closed over)"
    return _path(source)


def _a(word: str) -> str:
    return f"an {word}" if word[:1].lower() in "aeiou" else f"a {word}"


def _guard_line(guard, v: str, names: ReadableNames, value_of) -> tuple[str, str]:
    """(condition that holds when the guard passes, comment) for one guard."""
    describe = getattr(guard, "describe", None)
    who = _who(guard.source)
    if isinstance(guard, IdGuard):
        path = _dotted(guard.obj)
        if path is not None:
            return f"{v} is {names(guard.obj)}", f"{who} is {path}"
        obj = names.hint(guard.obj, f"captured_{_ident(guard.source.name())}",
                         f"the object {who} was at capture: {_short(guard.obj)}")
        return f"{v} is {obj}", f"{who} is the same {type(guard.obj).__name__} object as at capture"
    if isinstance(guard, TypeGuard):
        return f"type({v}) is {names(guard.typ)}", f"{who} is {_a(guard.typ.__name__)}"
    if isinstance(guard, EqualsGuard):
        value = guard.value
        if value is None or type(value) is bool or isinstance(value, torch.dtype):
            return f"{v} is {names(value)}", f"{who} is {value}"
        if isinstance(value, float) and value != value:
            return f"type({v}) is float and {v} != {v}", f"{who} is NaN"
        return (f"type({v}) is {names(type(value))} and {v} == {names(value)}",
                f"{who} == {_short(value)} ({_a(type(value).__name__)})")
    if isinstance(guard, NotShadowedGuard):
        listed = ", ".join(sorted(guard.names))
        return (f"{names(guard.names)}.isdisjoint({v})",
                f"no global of that module shadows the builtin {listed}")
    if isinstance(guard, LenGuard):
        return (f"type({v}) is {names(guard.typ)} and len({v}) == {guard.length}",
                f"{who} is {_a(guard.typ.__name__)} of {guard.length} item{'s' if guard.length != 1 else ''}")
    if isinstance(guard, DictKeysGuard):
        keys = ", ".join(map(_short, guard.keys))
        return (f"type({v}) is {names(guard.typ)} and tuple({v}) == {names(guard.keys)}",
                f"{who} is {_a(guard.typ.__name__)} with the keys {keys}, in this order")
    if isinstance(guard, StateGuard):
        base = _ident(who)
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
        other = _who(guard.other)
        if guard.same:
            return f"{v} is {w}", f"{who} and {other} are one object"
        return f"{v} is not {w}", f"{who} and {other} are different objects"
    if isinstance(guard, DistinctGuard):
        values = [value_of(s) for s in guard.sources]
        ids = ", ".join(f"id({x})" for x in values)
        listed = ", ".join(_who(s) for s in guard.sources)
        return f"len({{{ids}}}) == {len(values)}", f"{listed} are distinct objects"
    if isinstance(guard, TensorGuard):
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
    g = names.hint(guard, f"guard_{_ident(who)}", f"the {type(guard).__name__} on {who}")
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
    grad, dtype, any_autocast, autocast = guards.global_state
    rows.append((f"torch.is_grad_enabled() is {grad}", f"grad mode is {'on' if grad else 'off'}"))
    rows.append((f"torch.get_default_dtype() is {names(dtype)}", f"the default dtype is {dtype}"))
    ac = names(any_autocast_enabled)
    if any_autocast:
        from .guards import _autocast_detail
        detail = names.hint(autocast, "autocast_at_capture", "(enabled, dtype) for cpu and cuda")
        rows.append((f"{names(_autocast_detail)}() == {detail}", "autocast is on, as at capture"))
    else:
        rows.append((f"{ac}() is False", "autocast is off"))
    names.namespace.setdefault("torch", torch)
    if guards.check_global_hooks:
        tables = " or ".join(f"torch.nn.modules.module.{n}" for n in (
            "_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
            "_global_backward_pre_hooks") if hasattr(torch.nn.modules.module, n))
        assert len(_global_hook_tables()) == tables.count(" or ") + 1
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
    return _rename_params(src, _arg_names(code))


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


# -- the rewritten function ------------------------------------------------------------------------


@dataclass
class Comment:
    text: str
    eol: bool = False  # at the end of the previous line


class _Null:
    """A NULL marker on the value stack (below a callable)."""


NULL = _Null()


def _name(n: str, ctx=None) -> ast.Name:
    return ast.Name(id=n, ctx=ctx or ast.Load())


def _assign(target: str, value: ast.expr) -> ast.Assign:
    return ast.Assign(targets=[_name(target, ast.Store())], value=value, lineno=0)


def _names_in(node) -> set:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


class _Emitter:
    """Source lines from a list of statements (AST nodes and :class:`Comment`)."""

    def __init__(self):
        self.lines: list[str] = []

    def block(self, stmts: list, indent: str) -> None:
        if not [s for s in stmts if not isinstance(s, Comment)]:
            stmts = [*stmts, ast.Pass()]
        for s in stmts:
            if isinstance(s, Comment):
                if s.eol and self.lines:
                    self.lines[-1] += f"  # {s.text}"
                else:
                    self.lines.append(f"{indent}# {s.text}")
            elif isinstance(s, ast.Try):
                self.lines.append(f"{indent}try:")
                self.block(s.body, indent + "    ")
                for h in s.handlers:
                    head = "except"
                    if h.type is not None:
                        head += f" {ast.unparse(h.type)}"
                    if h.name:
                        head += f" as {h.name}"
                    self.lines.append(f"{indent}{head}:")
                    self.block(h.body, indent + "    ")
                if s.orelse:
                    self.lines.append(f"{indent}else:")
                    self.block(s.orelse, indent + "    ")
                if s.finalbody:
                    self.lines.append(f"{indent}finally:")
                    self.block(s.finalbody, indent + "    ")
            elif isinstance(s, ast.If):
                self.lines.append(f"{indent}if {ast.unparse(s.test)}:")
                self.block(s.body, indent + "    ")
                if s.orelse:
                    self.lines.append(f"{indent}else:")
                    self.block(s.orelse, indent + "    ")
            else:
                for line in ast.unparse(ast.fix_missing_locations(s)).splitlines():
                    self.lines.append(indent + line)


_SPECIAL_TEMPS = {"___o": "graph_out", "___err": "error", "___saved": "saved_inputs",
                  "___rng": "random_state", "___ac": "autocast_before", "___grad": "grad_mode_before"}


def _entry_function(info):
    for const in info.trampoline.co_consts:
        if isinstance(const, types.FunctionType) and const.__code__.co_name.startswith("___entry_"):
            return const
    return None


class _EntryRenderer:
    """The rewritten function of one cache entry, from its entry function's source."""

    def __init__(self, info, code: types.CodeType, names: ReadableNames):
        self.info = info
        self.code = code
        self.names = names
        self.brk: FrameBreak | None = info.frame_break
        self.f_globals = info.frame_globals
        self.params = _arg_names(code)
        self.consts: dict[str, ast.expr] = {}
        self.renames: dict[str, str] = dict(self.params)
        self.resume_names: dict = {}

    # names of the entry's constants and temporaries
    def name_objects(self) -> None:
        """Names for the objects the reader meets first (before the guards name them)."""
        names = self.names
        names.hint(types.FunctionType, "FunctionType", "types.FunctionType: a function from a code "
                   "object, globals, name, defaults and closure")
        compiled = self.info.compiled
        if compiled is not None:
            gm = self.info.graph_module
            n_ops = sum(1 for n in gm.graph.nodes if n.op.startswith("call")) if gm is not None else 0
            names.hint(compiled, "compiled_graph",
                       f"the compiled graph ({n_ops} operation{'s' if n_ops != 1 else ''}; graph.txt "
                       "and graph.py show it)")
        if self.f_globals is not None:
            names.hint(self.f_globals, "module_globals",
                       f"the globals of module {self.f_globals.get('__name__')}, where "
                       f"{self.code.co_name} is defined")

    def _name_constants(self, entry) -> None:
        names = self.names
        ns = entry.__globals__ if entry is not None else {}
        for key, obj in ns.items():
            if key.startswith("___k"):
                if getattr(obj, "__qualname__", "").startswith("native_rerun."):
                    names.hint(obj, f"run_{_ident(self.code.co_name)}_as_plain_python",
                               f"runs {self.code.co_name} again as plain Python: what happens when "
                               "the graph raises (framejit/capture/rerun.py)")
                self.consts[key] = ast.parse(names(obj), mode="eval").body

    def _name_loads(self, entry) -> None:
        loads = getattr(entry, "__framejit_loads__", {}) if entry is not None else {}
        self.load_comments: dict[str, str] = {}
        for var, source in loads.items():
            who = _who(source)
            new = self.names.unique(_ident(_path(source)))
            self.renames[var] = new
            self.load_comments[new] = who

    def render(self, fn_name: str) -> tuple[str, dict]:
        entry = _entry_function(self.info)
        self._name_constants(entry)
        self._name_loads(entry)
        tree = ast.parse(self.info.entry_source)
        fn = tree.body[0]
        stmts = self._statements(fn.body)
        args = ", ".join(self.params.get(p, p) for p in compat.guard_param_names(self.code))
        em = _Emitter()
        em.lines.append(f"def {fn_name}({args}):")
        em.lines.append(f'    """{self.code.co_name} as framejit rewrote it (this cache entry)."""')
        em.block(stmts, "    ")
        return "\n".join(em.lines) + "\n", self.resume_names

    # statements of the entry, renamed and commented
    def _statements(self, body: list) -> list:
        out: list = []
        said_inputs = said_effects = False
        for s in body:
            target = None
            if isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name):
                target = s.targets[0].id
            if isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name):
                target = s.targets[0].id
                if target.startswith("___s") and not said_inputs:
                    out.append(Comment("Values from outside the frame, read before the graph runs "
                                       "and before any write below."))
                    said_inputs = True
                if target.startswith("___e") and not said_effects:
                    out.append(Comment("Side effects, replayed after the graph as the function made "
                                       "them: every new value first, then the writes."))
                    said_effects = True
            if isinstance(s, ast.Try):
                out.extend(self._try(s))
                continue
            if isinstance(s, ast.If):
                s.test = self._expr(s.test)
                s.body = self._statements(s.body)
                s.orelse = self._statements(s.orelse)
                out.append(s)
                continue
            if isinstance(s, ast.Return) and self.brk is not None and isinstance(s.value, ast.Tuple):
                out.extend(self._at_break(s.value))
                continue
            if isinstance(s, ast.Raise) and self._is_native_result(s.exc):
                out.append(Comment(f"The graph raised: {self.code.co_name} ran again as plain Python "
                                   "(rerun.py); its result is the result."))
                out.append(ast.Return(value=self._expr(s.exc.args[0])))
                continue
            if isinstance(s, ast.Return) and self._is_rerun(s.value):
                out.append(Comment(f"The graph raised: run {self.code.co_name} again as plain Python "
                                   "(rerun.py), so that what eager raises or returns comes out."))
            out.append(self._stmt(s))
            self._comment_after(target, out)
        return out

    def _try(self, s: ast.Try) -> list:
        s.body = self._statements(s.body)
        for h in s.handlers:
            if h.type is not None:
                h.type = self._expr(h.type)
            if h.name:
                h.name = self._rename(h.name)
            h.body = self._statements(h.body)
        s.orelse = self._statements(s.orelse)
        s.finalbody = self._statements(s.finalbody)
        return [s]

    def _comment_after(self, target: str | None, out: list) -> None:
        if target is not None:
            if target == "___o":
                inputs = [ast.unparse(a) for a in out[-1].value.args] if isinstance(out[-1].value, ast.Call) else []
                out.append(Comment("the compiled graph" + (f"; inputs: {', '.join(inputs)}" if inputs else ""),
                                   eol=True))
            elif target.startswith("___s"):
                new = self.renames.get(target, target)
                out.append(Comment(self.load_comments.get(new, ""), eol=True))

    def _is_native_result(self, node) -> bool:
        from .resume import NativeResult
        return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
            and node.func.id in self.consts and self.names.namespace.get(
                ast.unparse(self.consts[node.func.id])) is NativeResult and len(node.args) == 1

    def _is_rerun(self, node) -> bool:
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in self.consts):
            return False
        return ast.unparse(self.consts[node.func.id]).startswith("run_")

    def _rename(self, n: str) -> str:
        new = self.renames.get(n)
        if new is None:
            if n in _SPECIAL_TEMPS:
                new = self.names.unique(_SPECIAL_TEMPS[n])
            elif n.startswith("___e"):
                new = self.names.unique(f"new_value_{n[4:]}")
            elif n.startswith("___r"):
                new = self.names.unique(f"rebuilt_{n[4:]}")
            else:
                return n
            self.renames[n] = new
        return new

    def _expr(self, node):
        return _Rename(self).visit(node)

    def _stmt(self, s):
        return _Rename(self).visit(s)

    # -- the break -------------------------------------------------------------------------------
    def _at_break(self, values: ast.Tuple) -> list:
        brk = self.brk
        out: list = []
        exprs = [self._expr(e) for e in values.elts]
        n_locals = len(brk.local_names)
        line = _break_line(brk)
        targets: list[tuple[str, ast.expr]] = []
        for local, e in zip(brk.local_names, exprs[:n_locals]):
            name = compat.py_name(local)
            if not (isinstance(e, ast.Name) and e.id == name):
                targets.append((name, e))
        stack: list = []
        stack_values = iter(exprs[n_locals:])
        for slot, marker in enumerate(brk.markers):
            if marker == "NULL":
                stack.append(NULL)
                continue
            e = next(stack_values)
            if marker == "ITER":
                e = ast.Call(func=_name("iter"), args=[e], keywords=[])
            if marker != "ITER" and slot not in brk.exit_slots and self._constant(e):
                stack.append(e)
                continue
            name = self.names.unique(f"stack_{slot}")
            targets.append((name, e))
            stack.append(_name(name))
        if targets:
            out.append(Comment(f"The frame as it is at the graph break (line {line}): its locals, and "
                               "the values the interrupted line was working on (stack_N)."))
            assigned = {t for t, _ in targets}
            if any(_names_in(e) & assigned for _, e in targets):
                out.append(ast.Assign(targets=[ast.Tuple(elts=[_name(t, ast.Store()) for t, _ in targets],
                                                         ctx=ast.Store())],
                                      value=ast.Tuple(elts=[e for _, e in targets], ctx=ast.Load()),
                                      lineno=0))
            else:
                out.extend(_assign(t, e) for t, e in targets)
            for slot in brk.exit_slots:
                out.append(Comment(f"stack_{slot}: the __exit__ of a `with` block around line {line}"))
        out.extend(_NativeRenderer(self, stack, line).render())
        return out

    def _constant(self, e) -> bool:
        """Whether ``e`` names only constants (a literal, ``print``, ``torch.relu``)."""
        if isinstance(e, ast.Constant):
            return True
        local = set(self.renames.values()) | set(map(compat.py_name, self.code.co_varnames))
        return all(n.id not in local and n.id != "graph_out" for n in ast.walk(e) if isinstance(n, ast.Name)) \
            and all(isinstance(n, (ast.Name, ast.Attribute, ast.Load, ast.Constant)) for n in ast.walk(e))

    def _base_name(self) -> str:
        base = self.brk.base
        return base.co_name if base is not None else self.code.co_name

    def resume_name(self, resume) -> str:
        code = resume if isinstance(resume, types.CodeType) else resume.__code__
        line = code.co_name.rsplit("_", 1)[-1]
        for name, obj in self.resume_names.items():
            if obj is resume:
                return name
        again = " (this same resume function: the loop's next turn)" if code is self.code else ""
        name = self.names.hint(resume, _ident(code.co_name),
                               f"the rest of {self._base_name()} from line {line}{again}: the "
                               "original code from there, captured on its first call (its own "
                               "rendering: resume_sources)" + (" (a code object: it needs this frame's closure)"
                                                    if isinstance(resume, types.CodeType) else ""))
        self.resume_names[name] = resume
        return name


class _Rename(ast.NodeTransformer):
    def __init__(self, r: _EntryRenderer):
        self.r = r

    def visit_Name(self, node):
        if node.id in self.r.consts:
            return ast.copy_location(self.r.consts[node.id], node)
        node.id = self.r._rename(node.id)
        return node


def _break_line(brk: FrameBreak) -> int | None:
    for inst in brk.plan.native:
        if inst.lineno:
            return inst.lineno
    return None


class CannotRender(Exception):
    pass


_BINARY = {"ADD": ast.Add, "SUBTRACT": ast.Sub, "MULTIPLY": ast.Mult, "TRUE_DIVIDE": ast.Div,
           "FLOOR_DIVIDE": ast.FloorDiv, "REMAINDER": ast.Mod, "POWER": ast.Pow,
           "MATRIX_MULTIPLY": ast.MatMult, "LSHIFT": ast.LShift, "RSHIFT": ast.RShift,
           "AND": ast.BitAnd, "OR": ast.BitOr, "XOR": ast.BitXor}
_COMPARE = {"LT": ast.Lt, "LE": ast.LtE, "EQ": ast.Eq, "NE": ast.NotEq, "GT": ast.Gt, "GE": ast.GtE}
_UNARY = {"UNARY_NEGATIVE": ast.USub, "UNARY_NOT": ast.Not, "UNARY_INVERT": ast.Invert,
          "UNARY_POSITIVE": ast.UAdd}
_JUMP_TESTS = {"TRUE": lambda c: c, "FALSE": lambda c: ast.UnaryOp(op=ast.Not(), operand=c),
               "NONE": lambda c: ast.Compare(left=c, ops=[ast.Is()], comparators=[ast.Constant(None)]),
               "NOT_NONE": lambda c: ast.Compare(left=c, ops=[ast.IsNot()], comparators=[ast.Constant(None)])}


def _enum_name(arg) -> str:
    return arg.name if isinstance(arg, enum.Enum) else str(arg)


class _NativeRenderer:
    """The instructions a split frame runs natively (the unsupported line), as Python
    statements over a symbolic stack of expressions, then the resume calls."""

    def __init__(self, r: _EntryRenderer, stack: list, line):
        self.r = r
        self.stack = stack
        self.line = line
        self.out: list = []
        self.kw_names: tuple = ()

    def render(self) -> list:
        brk = self.r.brk
        try:
            body, tail = self._run(brk.plan)
        except CannotRender as e:
            listing = "; ".join(f"{i.name} {i.arg!r}" if i.arg is not None else i.name
                                for i in brk.plan.native)
            return [Comment(f"Line {self.line} runs as plain Python here, but framejit cannot show "
                            f"it as Python ({e}): {listing}"),
                    ast.Raise(exc=ast.Call(func=_name("NotImplementedError"), args=[ast.Constant(
                        f"framejit cannot show line {self.line} of {self.r.code.co_name} as Python ({e})")],
                        keywords=[]), cause=None)]
        what = f"Line {self.line}, run as plain Python: the graph break"
        out = [Comment(what)]
        if brk.exit_slots:
            leave = self.r.names(_leave_block())
            err = self.r.names.unique("error")
            handler_body = [Comment("it raised: leave the `with` blocks around it, innermost first, "
                                    "as the exception does in plain Python")]
            for slot in reversed(brk.exit_slots):
                handler_body.append(ast.Expr(value=ast.Call(func=_name(leave), args=[
                    self.stack_expr_of(slot), _name(err)], keywords=[])))
            handler_body.append(ast.Raise(exc=None, cause=None))
            out.append(ast.Try(body=body, handlers=[ast.ExceptHandler(
                type=_name("BaseException"), name=err, body=handler_body)], orelse=[], finalbody=[]))
        else:
            out.extend(body)
        out.extend(tail)
        return out

    def stack_expr_of(self, slot: int):
        return _name(f"stack_{slot}")

    def _push(self, e) -> None:
        self.stack.append(e)

    def _pop(self, n: int = 1) -> list:
        if n > len(self.stack):
            raise CannotRender("a stack framejit cannot follow")
        if n == 0:
            return []
        items = self.stack[-n:]
        del self.stack[-n:]
        return items

    def _pending(self, e) -> bool:
        return e is not NULL and not isinstance(e, (ast.Name, ast.Constant)) and not self.r._constant(e)

    def _flush(self, keep: int) -> None:
        """Give every pending value below the top ``keep`` entries a name: what runs next may
        change what they read."""
        for k in range(len(self.stack) - keep):
            e = self.stack[k]
            if self._pending(e):
                name = self.r.names.unique("value")
                self.out.append(_assign(name, e))
                self.stack[k] = _name(name)

    def _value(self, e):
        if e is NULL:
            raise CannotRender("a NULL marker used as a value")
        return e

    def _run(self, plan) -> tuple[list, list]:
        for inst in plan.native:
            if inst.target is not None:
                return self.out, self._jump(inst, plan)
            self._step(inst)
        if not plan.exits:  # a `raise` leaving the frame
            return self.out, []
        (exit_,) = plan.exits
        # Name what is left on the stack, in order, before the resume call.
        final = []
        for k in range(exit_.depth):
            e = self._value(self.stack[k])
            if self._pending(e):
                name = self.r.names.unique("result")
                self.out.append(_assign(name, e))
                e = _name(name)
            final.append(e)
        return self.out, self._resume_call(0, exit_, final)

    def _resume_call(self, k: int, exit_, final: list) -> list:
        from .resume import resume_params, stack_param

        brk = self.r.brk
        resume = brk.resumes[k]
        name = self.r.resume_name(resume)
        if isinstance(resume, types.CodeType):
            cells = [_name(f"{v}_cell") for v in self.r.code.co_freevars]
            fn = ast.Call(func=_name(self.r.names(types.FunctionType)), args=[
                _name(name), _name(self.r.names(self.r.f_globals)), ast.Constant(None),
                ast.Constant(None), ast.Tuple(elts=cells, ctx=ast.Load())], keywords=[])
        else:
            fn = _name(name)
        by_param = {stack_param(j): (ast.Call(func=_name("list"), args=[e], keywords=[])
                                     if j in exit_.iters else e)
                    for j, e in enumerate(final)}
        args = [by_param.get(p, _name(compat.py_name(p)))
                for p in resume_params(brk.base or self.r.code, exit_.depth, brk.live)]
        line = _line_of(resume)
        return [Comment(f"The rest of {self.r._base_name()}, from line {line}: {name}, captured on its "
                        "first call"),
                ast.Return(value=ast.Call(func=fn, args=args, keywords=[]))]

    def _jump(self, inst, plan) -> list:
        name = inst.name
        kind = name.rsplit("_IF_", 1)[-1]
        keep_on_jump = name in ("JUMP_IF_TRUE_OR_POP", "JUMP_IF_FALSE_OR_POP")
        if keep_on_jump:
            kind = "TRUE" if "TRUE" in name else "FALSE"
        cond = self._value(self._pop()[0])
        if keep_on_jump and not isinstance(cond, ast.Name):
            tmp = self.r.names.unique("condition")
            self.out.append(_assign(tmp, cond))
            cond = _name(tmp)
        below = [self._value(e) for e in self.stack]
        fall, jump = plan.exits
        taken = self._resume_call(1, jump, below + ([cond] if keep_on_jump else []))
        test = _JUMP_TESTS[kind.replace("FORWARD_", "").replace("BACKWARD_", "")](cond)
        return [Comment(f"the condition at line {self.line}, tested as plain Python"),
                ast.If(test=test, body=taken, orelse=[]),
                *self._resume_call(0, fall, below)]

    def _call(self, callee, args: list) -> None:
        kw = self.kw_names
        self.kw_names = ()
        positional = args[:len(args) - len(kw)]
        keywords = [ast.keyword(arg=k, value=v) for k, v in zip(kw, args[len(args) - len(kw):])]
        self._push(ast.Call(func=callee, args=positional, keywords=keywords))

    def _step(self, inst) -> None:
        n, a = inst.name, inst.arg
        names = self.r.names
        if n in ("NOP", "PRECALL", "EXTENDED_ARG", "CACHE"):
            return
        if n == "KW_NAMES":
            self.kw_names = tuple(a)
        elif n in ("LOAD_FAST", "LOAD_FAST_CHECK"):
            self._push(_name(self.r.renames.get(compat.py_name(str(a)), compat.py_name(str(a)))))
        elif n == "LOAD_CONST":
            self._push(ast.parse(names(a), mode="eval").body)
        elif n in ("LOAD_DEREF", "LOAD_CLOSURE"):
            var = getattr(a, "name", a)
            if var not in self.r.code.co_freevars:
                raise CannotRender(f"{n} of a cell variable")
            cell = _name(f"{var}_cell")
            self._push(cell if n == "LOAD_CLOSURE" else ast.Attribute(value=cell, attr="cell_contents",
                                                                       ctx=ast.Load()))
        elif n == "LOAD_GLOBAL":
            push_null, var = a if isinstance(a, tuple) else (False, a)
            if push_null and not compat.PY313:
                self._push(NULL)
            self._push(self._global(var))
            if push_null and compat.PY313:
                self._push(NULL)
        elif n in ("LOAD_ATTR", "LOAD_METHOD"):
            method, attr = a if isinstance(a, tuple) else (n == "LOAD_METHOD", a)
            (obj,) = self._pop()
            value = ast.Attribute(value=self._value(obj), attr=attr, ctx=ast.Load())
            if method:  # a bound method and no self: the same call
                if compat.PY313:
                    self._push(value)
                    self._push(NULL)
                else:
                    self._push(NULL)
                    self._push(value)
            else:
                self._push(value)
        elif n == "PUSH_NULL":
            self._push(NULL)
        elif n == "CALL":
            self._flush(a + 2)
            items = self._pop(a + 2)
            first, second, args = items[0], items[1], items[2:]
            if compat.PY313:
                callee, self_arg = first, second
            elif first is NULL:
                callee, self_arg = second, NULL
            else:
                callee, self_arg = first, second
            args = ([] if self_arg is NULL else [self_arg]) + args
            self._call(self._value(callee), [self._value(x) for x in args])
        elif n == "CALL_FUNCTION_EX":
            count = 3 + (a & 1)
            self._flush(count)
            items = self._pop(count)
            if compat.PY313:
                callee = items[0]
            else:
                if items[0] is not NULL:
                    raise CannotRender("a call with *args on a method")
                callee = items[1]
            star = ast.Starred(value=self._value(items[2]), ctx=ast.Load())
            kwargs = [ast.keyword(arg=None, value=self._value(items[3]))] if a & 1 else []
            self._push(ast.Call(func=self._value(callee), args=[star], keywords=kwargs))
        elif n == "BINARY_OP":
            left, right = self._pop(2)
            op = _enum_name(a)
            if op.startswith("INPLACE_"):
                fn = _name(names(getattr(operator, "i" + {"TRUE_DIVIDE": "truediv",
                                                          "FLOOR_DIVIDE": "floordiv",
                                                          "SUBTRACT": "sub", "MULTIPLY": "mul",
                                                          "REMAINDER": "mod", "MATRIX_MULTIPLY": "matmul",
                                                          "POWER": "pow"}.get(op[8:], op[8:].lower()))))
                self._push(ast.Call(func=fn, args=[left, right], keywords=[]))
            elif op in _BINARY:
                self._push(ast.BinOp(left=self._value(left), op=_BINARY[op](), right=self._value(right)))
            else:
                raise CannotRender(f"the operator {op}")
        elif n == "COMPARE_OP":
            left, right = self._pop(2)
            op = _enum_name(a).split("_")[0]
            if op not in _COMPARE:
                raise CannotRender(f"the comparison {op}")
            self._push(ast.Compare(left=left, ops=[_COMPARE[op]()], comparators=[right]))
        elif n == "IS_OP":
            left, right = self._pop(2)
            self._push(ast.Compare(left=left, ops=[ast.IsNot() if a else ast.Is()], comparators=[right]))
        elif n == "CONTAINS_OP":
            left, right = self._pop(2)
            self._push(ast.Compare(left=left, ops=[ast.NotIn() if a else ast.In()], comparators=[right]))
        elif n == "BINARY_SUBSCR":
            obj, key = self._pop(2)
            self._push(ast.Subscript(value=obj, slice=key, ctx=ast.Load()))
        elif n == "BINARY_SLICE":
            obj, lo, hi = self._pop(3)
            self._push(ast.Subscript(value=obj, slice=ast.Slice(lower=lo, upper=hi), ctx=ast.Load()))
        elif n in _UNARY:
            (x,) = self._pop()
            self._push(ast.UnaryOp(op=_UNARY[n](), operand=x))
        elif n in ("BUILD_TUPLE", "BUILD_LIST"):
            items = [self._value(x) for x in self._pop(a)]
            cls = ast.Tuple if n == "BUILD_TUPLE" else ast.List
            self._push(cls(elts=items, ctx=ast.Load()))
        elif n == "BUILD_SLICE":
            parts = self._pop(a)
            self._push(ast.Call(func=_name("slice"), args=parts, keywords=[]))
        elif n == "BUILD_MAP":
            items = self._pop(2 * a)
            self._push(ast.Dict(keys=items[::2], values=items[1::2]))
        elif n == "BUILD_CONST_KEY_MAP":
            items = self._pop(a + 1)
            keys = items[-1]
            if not isinstance(keys, ast.Constant) and not isinstance(keys, ast.Tuple):
                raise CannotRender("BUILD_CONST_KEY_MAP with keys framejit cannot read")
            key_nodes = [ast.Constant(k) for k in keys.value] if isinstance(keys, ast.Constant) else keys.elts
            self._push(ast.Dict(keys=key_nodes, values=items[:-1]))
        elif n == "FORMAT_VALUE":
            flags = a[0] if isinstance(a, tuple) else int(a)
            spec = self._pop()[0] if flags & 0x04 else None
            (x,) = self._pop()
            conversion = {0: -1, 1: ord("s"), 2: ord("r"), 3: ord("a")}[flags & 0x03]
            spec_node = None
            if spec is not None:
                spec_node = ast.JoinedStr(values=[ast.FormattedValue(value=spec, conversion=-1)])
            self._push(ast.JoinedStr(values=[ast.FormattedValue(value=x, conversion=conversion,
                                                                format_spec=spec_node)]))
        elif n == "BUILD_STRING":
            parts = self._pop(a)
            values = []
            for p in parts:
                if isinstance(p, ast.JoinedStr):
                    values.extend(p.values)
                elif isinstance(p, ast.Constant) and isinstance(p.value, str):
                    values.append(p)
                else:
                    raise CannotRender("a string built from values framejit cannot read")
            self._push(ast.JoinedStr(values=values))
        elif n == "POP_TOP":
            (x,) = self._pop()
            if self._pending(x):
                self.out.append(ast.Expr(value=x))
        elif n == "STORE_ATTR":
            self._flush(2)
            obj, value = self._pop(2)[::-1]
            self.out.append(ast.Assign(targets=[ast.Attribute(value=obj, attr=a, ctx=ast.Store())],
                                       value=value, lineno=0))
        elif n == "DELETE_ATTR":
            self._flush(1)
            (obj,) = self._pop()
            self.out.append(ast.Delete(targets=[ast.Attribute(value=obj, attr=a, ctx=ast.Del())]))
        elif n == "STORE_SUBSCR":
            self._flush(3)
            value, obj, key = self._pop(3)
            self.out.append(ast.Assign(targets=[ast.Subscript(value=obj, slice=key, ctx=ast.Store())],
                                       value=value, lineno=0))
        elif n == "STORE_GLOBAL":
            self._flush(1)
            (value,) = self._pop()
            target = ast.Subscript(value=_name(names(self.r.f_globals)), slice=ast.Constant(a),
                                   ctx=ast.Store())
            self.out.append(ast.Assign(targets=[target], value=value, lineno=0))
        elif n == "RAISE_VARARGS":
            self._flush(a)
            parts = self._pop(a)
            self.out.append(ast.Raise(exc=parts[0], cause=parts[1] if a == 2 else None))
        else:
            raise CannotRender(f"the instruction {n}")

    def _global(self, var: str):
        """A global read as the native code reads it: the module's global, else the builtin."""
        g = self.r.f_globals
        if g is not None and var in g:
            return ast.Subscript(value=_name(self.r.names(g)), slice=ast.Constant(var), ctx=ast.Load())
        builtins_dict = (g or {}).get("__builtins__", builtins)
        builtins_dict = builtins_dict if isinstance(builtins_dict, dict) else vars(builtins_dict)
        if var in builtins_dict and getattr(builtins, var, None) is not builtins_dict[var]:
            raise CannotRender(f"the builtin {var}, replaced in this module's builtins")
        # A builtin, or a name defined nowhere: the plain name reads it, or raises the NameError.
        return _name(var)


def _leave_block():
    from .resume import leave_block
    return leave_block


def _line_of(resume) -> int | str:
    code = resume if isinstance(resume, types.CodeType) else resume.__code__
    tail = code.co_name.rsplit("_at_line_", 1)
    return tail[1] if len(tail) == 2 else code.co_firstlineno


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
        return Rendering(text, text, {})
    names = ReadableNames(_reserved(code))
    fname = _ident(code.co_name)
    guard_fn = names.unique(f"guards_{fname}")
    rewritten_fn = names.unique(f"rewritten_{fname}")
    dispatcher = fname if fname not in names.namespace else names.unique(fname)
    renderer = _EntryRenderer(info, code, names)
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
    source = _header(info, code, names, body) + "\n\n\n" + body
    guards_header = _legend(names, guards_src, code)
    return Rendering(source, guards_header + "\n\n" + guards_src, names.namespace, resume_names)


def _legend(names: ReadableNames, text: str, code) -> str:
    used = {n.id for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Name)}
    lines = [f"{name}: {what}" for name, what in names.legend.items() if name in used]
    params = [f"{new}: {_param_words(old)}" for old, new in _arg_names(code).items() if new in used]
    out = [f"# Names used below that are not {code.co_name}'s own (their objects are in the "
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


def _header(info, code, names, body: str) -> str:
    kind = "a split frame (graph break)" if info.frame_break is not None else "the whole frame"
    top = [f"# {code.co_name} ({code.co_filename}:{code.co_firstlineno}) as framejit runs it: "
           f"one cached version, {kind}.",
           "# It runs as it stands: exec it in a copy of the entry's readable_namespace and call "
           f"the last function with the arguments of {code.co_name}."]
    return "\n".join(top) + "\n" + _legend(names, body, code)


def load(info, follow_resumes: bool = True):
    """The rendering of ``info`` as a function: ``load(info)(*args)`` runs the guards and the
    rewritten function as rendered. With ``follow_resumes``, each resume function it calls runs
    as rendered too (through the cache entries it has when called; as plain Python when it has
    none that fit)."""
    namespace = dict(info.readable_namespace)
    if follow_resumes:
        for name, resume in info.rendering().resume_names.items():
            if isinstance(resume, types.FunctionType):
                # (a resume code object needing this frame's closure stays as it is: it runs
                # as plain Python)
                namespace[name] = _RenderedResume(resume)
    source = info.readable_source
    filename = f"<framejit-readable {next(_load_ids)}>"
    # Registered so that tracebacks and pdb show the rendering's lines.
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), namespace)
    code = info.code_ref()
    return namespace[_dispatcher_name(info, code)]


def _dispatcher_name(info, code) -> str:
    del code  # the last function the source defines
    tree = ast.parse(info.readable_source)
    return [n.name for n in tree.body if isinstance(n, ast.FunctionDef)][-1]


_load_ids = itertools.count()


class _RenderedResume:
    """Stands for a resume function inside a loaded rendering: runs the rendering of the first
    of the resume code's cache entries whose guards hold (as the hook would pick it), or the
    resume function itself as plain Python when there is none."""

    def __init__(self, resume: types.FunctionType):
        self.resume = resume

    def __call__(self, *args):
        from .. import _C

        for entry in _C.get_cache_entries(self.resume.__code__):
            info = entry[3]
            if info.guard_fn(*args):
                return load(info)(*args)
        return self.resume(*args)


def resume_sources(info) -> dict[str, list[str]]:
    """The renderings of the resume functions this entry calls: name -> the readable_source of
    each of their cache entries so far (a resume function is captured on its first call)."""
    from .. import _C

    out = {}
    for name, resume in info.rendering().resume_names.items():
        code = resume if isinstance(resume, types.CodeType) else resume.__code__
        out[name] = [e[3].readable_source for e in _C.get_cache_entries(code)]
    return out
