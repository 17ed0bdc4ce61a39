"""Names in readable renderings: what each object, temporary and parameter is called, in the
user's terms where there are any (``torch.float32``, ``self.fc.weight``, ``global G``)."""

from __future__ import annotations

import builtins
import keyword
import re
import sys
import types

import torch

from .. import compat
from ..guards import _is_literal, short_repr
from ..sources import ConstNames, FreeVarSource, GlobalSource, LocalSource


def ident(text: str) -> str:
    """``text`` as a Python identifier (``self.fc.weight`` -> ``self_fc_weight``)."""
    out = "".join(c if c.isalnum() else "_" for c in text)
    while "__" in out:
        out = out.replace("__", "_")
    out = out.strip("_") or "value"
    out = "v_" + out if out[0].isdigit() else out
    return out + "_" if keyword.iskeyword(out) else out


def short(obj) -> str:
    try:
        r = short_repr(obj)  # (cut short: a tuple may hold one tuple 2^k ways)
    except Exception:
        r = ""
    if not r or len(r) > 60 or "\n" in r:
        r = f"<{type(obj).__name__} object at {id(obj):#x}>"
    return r


def resolve(path: str):
    parts = path.split(".")
    obj = sys.modules.get(parts[0])
    if obj is None:
        raise LookupError(path)
    for part in parts[1:]:
        obj = getattr(obj, part)
    return obj


def dotted(obj) -> str | None:
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
            if resolve(path) is obj:
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

    def stand_in(self, obj, replacement, base: str, description: str) -> str:
        """Render ``obj`` as a name bound to ``replacement``: what ``obj`` would be in the
        function's own frame, where the rendering's namespace would give something else."""
        name = self.hint(replacement, base, description)
        self._by_id[id(obj)] = name
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
        path = dotted(obj)
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
            fresh = self.unique(f"globals_of_{ident(obj['__name__'])}")
            self._bind(obj, fresh, f"the globals of module {obj['__name__']}")
            return fresh
        fresh = self.unique(f"{ident(type(obj).__name__).lower()}_object")
        self._bind(obj, fresh, f"an object: {short(obj)}")
        return fresh


def arg_names(code: types.CodeType) -> dict[str, str]:
    """The generated parameter names of guard and entry functions -> readable ones."""
    out = {}
    for p in compat.guard_param_names(code):
        if p.startswith("___free_"):
            out[p] = f"{p[len('___free_'):]}_cell"
        elif p.startswith("___stack"):
            out[p] = f"carried_{p[len('___stack'):]}"
    return out


def reserved(code: types.CodeType) -> set:
    names = set(map(compat.py_name, code.co_varnames + code.co_cellvars + code.co_freevars))
    return names | set(arg_names(code).values()) | {code.co_name, ident(code.co_name)}



_CARRIED = re.compile(r"<value (\d+) carried across a graph break>")


def path_name(source) -> str:
    """``source.name()`` with the rendering's names for carried stack values."""
    return _CARRIED.sub(r"carried_\1", source.name())


def user_words(source) -> str:
    """A source in the user's words, as the rendering names things."""
    if isinstance(source, GlobalSource):
        return f"global {source.var}"
    if isinstance(source, LocalSource) and source.local.startswith("___stack"):
        k = source.local[len("___stack"):]
        return f"carried_{k} (value {k} of the stack at the graph break)"
    if isinstance(source, FreeVarSource):
        return f"{source.var} (closed over)"
    return path_name(source)


def a_or_an(word: str) -> str:
    return f"an {word}" if word[:1].lower() in "aeiou" else f"a {word}"


