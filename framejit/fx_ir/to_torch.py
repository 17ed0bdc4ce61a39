"""Conversion to ``torch.fx``, so any torch backend can consume a framejit graph.

The conversion is node for node: same ops, targets, args and kwargs (with framejit nodes
replaced by the corresponding torch.fx nodes), names kept where torch.fx allows them. The root
``nn.Module`` of the result holds every get_attr and call_module target. ``meta["val"]`` is
copied as both ``meta["val"]`` and ``meta["example_value"]`` (the key Dynamo uses), so backends
that read example values find them.

torch.fx prints its graph as Python source and runs that, and its printer is less general than
framejit's (codegen.py). Where a node would print as source that does not compile or does not
compute the same thing, the node is rewritten into an equivalent that prints right:

* a constant torch.fx cannot print (a tensor, a code object, ``complex(1, inf)``, an Enum inside a
  dict, an object without a literal) becomes a get_attr of the root, as framejit binds it as a
  global; constants it can print stay inline;
* an augmented assignment (``operator.iadd`` and the other in-place operators), which torch.fx
  prints as the statement ``a += b``: with a constant or an immutable non-tensor ``a`` (``s = 0;
  s += x``) it becomes the binary operator, which is what Python falls back to when ``type(a)``
  has no ``__iadd__``; a constant that does have one is copied first (``copy.copy``), as its
  literal would be evaluated afresh;
* ``operator.setitem`` on a constant container likewise works on a copy, and its result (None)
  is the constant None rather than the container torch.fx would assign;
* ``(-2) ** x``, which torch.fx prints without parentheses (``-2 ** x == -(2 ** x)``), becomes
  the builtin ``pow(-2, x)``;
* a method call on, or attribute read from, a constant (``(1).bit_length()``) gets its object
  from a node;
* a call target torch.fx would print by a path that does not lead back to it, or cannot name at
  all (an object without ``__name__``), is called through ``operator.call``;
* keyword arguments that are not identifiers (``**{"a-b": 1}``) are passed as a dict;
* get_attr/call_module targets that are not plain attribute paths, that collide with an
  attribute of ``nn.Module`` or ``torch.fx.GraphModule`` (``graph``, ``forward``, ``training``)
  or that lie under another target (``lin`` and ``lin.weight``, which torch.fx would write into
  the user's module) get a fresh top-level name;
* a placeholder whose name shadows a builtin or a name of torch.fx's generated code (``input``,
  ``device``, ``inf``) takes the name torch.fx gives its node.

Example::

    fx_gm = to_torch_fx(gm)
    torch.fx.Interpreter(fx_gm).run(x)
"""

from __future__ import annotations

import builtins
import copy
import enum
import inspect
import keyword
import math
import operator
import re
from typing import TYPE_CHECKING, Any

import torch
import torch.fx

from .meta import resolve_qualname
from .node import Node, map_aggregate

if TYPE_CHECKING:
    from .graph_module import GraphModule


def to_torch_fx(gm: GraphModule) -> torch.fx.GraphModule:
    """Convert ``gm`` (a framejit GraphModule) to an equivalent ``torch.fx.GraphModule``."""
    return _Converter(gm).run()


# In-place operators, which torch.fx prints as augmented assignments, and their binary forms.
_INPLACE_BINARY = {
    operator.iadd: (operator.add, "__iadd__"),
    operator.isub: (operator.sub, "__isub__"),
    operator.imul: (operator.mul, "__imul__"),
    operator.itruediv: (operator.truediv, "__itruediv__"),
    operator.ifloordiv: (operator.floordiv, "__ifloordiv__"),
    operator.imod: (operator.mod, "__imod__"),
    operator.ipow: (operator.pow, "__ipow__"),
    operator.imatmul: (operator.matmul, "__imatmul__"),
    operator.iand: (operator.and_, "__iand__"),
    operator.ior: (operator.or_, "__ior__"),
    operator.ixor: (operator.xor, "__ixor__"),
    operator.ilshift: (operator.lshift, "__ilshift__"),
    operator.irshift: (operator.rshift, "__irshift__"),
}
# By identity: a target may be an object that cannot be hashed or compared.
_INPLACE_BY_ID = {id(op): forms for op, forms in _INPLACE_BINARY.items()}
_NUMBERS = (bool, int, float, complex)
# torch.fx's generated code evaluates `inf`, `nan` and `device(...)` as globals.
_FX_EVAL_GLOBALS = {"inf": math.inf, "nan": math.nan, "device": torch.device, "torch": torch}
_FX_CODE_NAMES = frozenset({"self", "inf", "nan", "NoneType", "torch", "device", "fx_pytree",
                            "pytree", "wrap"})
_NOT_IDENTIFIER = re.compile(r"[^0-9a-zA-Z_]+")


def _call_with_keywords(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``fn(*args, **kwargs)``: the call of a node whose keywords torch.fx cannot print."""
    return fn(*args, **kwargs)


def _torch_fx_printer():
    """torch.fx's own helpers that decide how a call target is printed; None if this torch lacks
    them (then every target is taken to print right)."""
    try:
        from torch.fx.graph import _is_from_torch
        from torch.fx.node import _get_qualified_name
    except ImportError:  # pragma: no cover - other torch versions
        return None
    return _get_qualified_name, _is_from_torch


def _target_prints(target: Any) -> bool:
    """Whether torch.fx prints call_function ``target`` as source that evaluates back to it.

    torch.fx names a target by ``__module__`` and ``__name__``; a torch function is printed by
    that path (``torch.nn.functional.relu``), anything else is bound as a global.
    """
    printer = _torch_fx_printer()
    if printer is None:
        return True
    qualified_name, is_from_torch = printer
    try:
        path = qualified_name(target)
        if not is_from_torch(target) or target is torch.device:
            return True
    except Exception:
        return False
    obj: Any = torch
    atoms = path.split(".")
    for atom in atoms[1:]:
        obj = getattr(obj, atom, None)
    return atoms[0] == "torch" and obj is target


def _repr_roundtrips(value: complex) -> bool:
    try:
        back = eval(repr(value), {"__builtins__": {}})  # a complex literal, nothing else
    except Exception:
        return False
    return all(
        math.copysign(1.0, a) == math.copysign(1.0, b) and a == b
        for a, b in ((value.real, back.real), (value.imag, back.imag))
    )


def _prints(value: Any, in_repr: bool = False) -> bool:
    """Whether torch.fx prints the constant ``value`` as source giving an equal value of the
    same type. ``in_repr``: inside a dict or a named tuple, which torch.fx prints with plain
    ``repr()`` (its own printer handles only tuples, lists and slices item by item)."""
    if isinstance(value, torch.fx.Node):
        return True  # printed as its name, also by repr()
    kind = type(value)
    if value is None or value is Ellipsis or kind in (bool, int, str, bytes, float, range):
        return True  # floats: `inf` and `nan` are globals of torch.fx's code
    if kind is complex:
        return math.isfinite(value.real) and math.isfinite(value.imag) and _repr_roundtrips(value)
    if kind in (torch.dtype, torch.layout, torch.memory_format):
        try:
            return eval(repr(value), dict(_FX_EVAL_GLOBALS)) is value
        except Exception:
            return False
    if kind is torch.device or kind is torch.Size:
        return True
    if kind is slice:
        return all(_prints(x, in_repr) for x in (value.start, value.stop, value.step))
    if kind in (tuple, list):
        return all(_prints(x, in_repr) for x in value)
    if kind in (set, frozenset):
        return all(_prints(x, True) for x in value)
    if kind is dict:
        return all(_prints(k, True) and _prints(v, True) for k, v in value.items())
    if in_repr:
        return False
    if isinstance(value, enum.Enum):
        return True  # printed as Class.NAME, the class bound as a global
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return all(_prints(x, True) for x in value)  # Class(items), the class bound as a global
    return isinstance(value, (torch._ops.OpOverload, torch._ops.HigherOrderOperator))


def _contains_node(value: Any) -> bool:
    found = False

    def visit(x: Any) -> Any:
        nonlocal found
        found = found or isinstance(x, Node)
        return x

    map_aggregate(value, visit)
    return found


def _is_tensor_node(arg: Any) -> bool:
    return isinstance(arg, Node) and isinstance(arg.meta.get("val"), torch.Tensor)


def _value_type(arg: Any) -> type | None:
    """The Python type of a node argument: a constant's own, a node's from its example value
    (None when the node has none)."""
    if isinstance(arg, Node):
        return type(arg.meta["val"]) if "val" in arg.meta else None
    return type(arg)


def _starts_with_minus(value: Any) -> bool:
    return type(value) in _NUMBERS and repr(value).startswith("-")


class _Converter:
    def __init__(self, gm: GraphModule) -> None:
        self.gm = gm
        self.graph = torch.fx.Graph()
        self.env: dict[Node, Any] = {}
        self.attrs: dict[str, Any] = {}  # torch.fx target -> object on the new root
        self.constants: dict[int, torch.fx.Node] = {}  # id(lifted constant) -> its get_attr
        self.targets = self._attribute_targets()

    def run(self) -> torch.fx.GraphModule:
        for node in self.gm.graph.nodes:
            fx_node = self.convert(node)
            if isinstance(fx_node, torch.fx.Node):
                fx_node.meta.update(node.meta)
                if "val" in node.meta:
                    fx_node.meta["example_value"] = node.meta["val"]
            self.env[node] = fx_node
        # torch.fx puts each root[target] at that dotted path of the new module.
        return torch.fx.GraphModule(self.attrs, self.graph, class_name=self.gm.class_name)

    # -- attribute targets ---------------------------------------------------------------------

    def _attribute_targets(self) -> dict[str, str]:
        """framejit qualname -> torch.fx target of every get_attr/call_module node."""
        qualnames = sorted(
            {n.target for n in self.gm.graph.nodes if n.op in ("get_attr", "call_module")},
            key=lambda q: q.count("."),
        )
        module_names, root_names = _attribute_names()
        kept: dict[str, str] = {}
        for qualname in qualnames:
            atoms = qualname.split(".")
            if (
                all(a.isidentifier() and not keyword.iskeyword(a) for a in atoms)
                and atoms[0] not in root_names
                and not any(a in module_names for a in atoms[1:])
                # under another target torch.fx would set attributes of the user's object
                and not any(".".join(atoms[:i]) in qualnames for i in range(1, len(atoms)))
            ):
                kept[qualname] = qualname
        taken = {q.split(".")[0] for q in kept} | root_names
        mapping = {}
        for qualname in qualnames:
            target = kept.get(qualname)
            if target is None:
                target = self._fresh_name(qualname, taken)
            mapping[qualname] = target
            self.attrs[target] = resolve_qualname(self.gm.root, qualname)
        self._taken = taken
        return mapping

    @staticmethod
    def _fresh_name(hint: str, taken: set[str]) -> str:
        base = "_".join(p for p in _NOT_IDENTIFIER.split(hint) if p) or "attr"
        if base[0].isdigit() or keyword.iskeyword(base):
            base = "_" + base
        name, i = base, 0
        while name in taken:
            i += 1
            name = f"{base}_{i}"
        taken.add(name)
        return name

    def lift(self, value: Any) -> torch.fx.Node:
        """A get_attr node for the constant ``value`` (one per object)."""
        known = self.constants.get(id(value))
        if known is None:
            target = self._fresh_name("_constant", self._taken)
            self.attrs[target] = value
            known = self.graph.create_node("get_attr", target, name=target)
            self.constants[id(value)] = known
        return known

    # -- arguments -----------------------------------------------------------------------------

    def arg(self, a: Any, in_repr: bool = False) -> Any:
        """``a`` with framejit nodes replaced by torch.fx nodes and constants that torch.fx
        cannot print replaced by get_attr nodes."""
        if isinstance(a, Node):
            return self.env[a]
        kind = type(a)
        if kind in (tuple, list):
            items = [self.arg(x, in_repr) for x in a]
            return tuple(items) if kind is tuple else items
        if kind is dict and all(_prints(k, True) for k in a):
            return {k: self.arg(v, True) for k, v in a.items()}
        if kind is slice:
            return slice(*(self.arg(x, in_repr) for x in (a.start, a.stop, a.step)))
        if isinstance(a, tuple) and hasattr(a, "_fields") and not in_repr:
            items = [self.arg(x, True) for x in a]
            if any(x is not y for x, y in zip(items, a)):
                return kind(*items)
            return a
        if _prints(a, in_repr):
            return a
        if _contains_node(a):  # a dict with keys torch.fx cannot print
            raise TypeError(f"torch.fx cannot print {a!r:.80} and it holds graph values")
        return self.lift(a)

    def materialize(self, a: Any) -> Any:
        """``a`` as a torch.fx node: a constant becomes ``copy.copy(constant)``, evaluated on
        every call as a literal is (a lifted constant is shared, as framejit's global is)."""
        fx_arg = self.arg(a)
        if isinstance(fx_arg, torch.fx.Node):
            return fx_arg
        return self.graph.create_node("call_function", copy.copy, (fx_arg,), name="constant")

    # -- nodes ---------------------------------------------------------------------------------

    def convert(self, node: Node) -> Any:
        op = node.op
        if op == "placeholder":
            default = inspect.Signature.empty
            if node.args:
                default = node.args[0]
                if not _prints(default):
                    raise TypeError(
                        f"placeholder {node.name!r} has the default {default!r:.60}, which "
                        f"torch.fx cannot print; give it a literal default or none"
                    )
            fx_node = self.graph.placeholder(node.name, default_value=default)
            # The parameter takes the node's name, which torch.fx keeps clear of builtins and
            # of the globals of its code (a parameter `device` would hide `device(...)`).
            fx_node.target = fx_node.name
            return fx_node
        if op == "output":
            return self.graph.output(self.arg(node.args[0]))
        if op == "get_attr":
            target = self.targets[node.target]
            return self.graph.create_node("get_attr", target, name=node.name)
        if op == "call_module":
            return self.call(node, "call_module", self.targets[node.target],
                             self.arg(node.args), node.kwargs)
        if op == "call_method":
            this = node.args[0] if node.args else None
            args = self.arg(node.args)
            if node.args and not isinstance(this, Node):
                # torch.fx prints `<repr>.name(...)`: `1.bit_length()` does not parse.
                args = (self.materialize(this), *args[1:])
            return self.call(node, "call_method", node.target, args, node.kwargs)
        return self.call_function(node)

    def call_function(self, node: Node) -> Any:
        target, args = node.target, node.args
        inplace = _INPLACE_BY_ID.get(id(target))
        if inplace is not None and len(args) == 2 and not node.kwargs:
            binary, dunder = inplace
            lhs, kind = args[0], _value_type(args[0])
            if kind is not None and not _is_tensor_node(lhs) and not hasattr(kind, dunder):
                # `a op= b` is `a op b` when type(a) has no in-place method; torch.fx would
                # print the statement `0 += b` or rebind `a` for its later users.
                target = binary
            elif not isinstance(lhs, Node):
                return self.call(node, "call_function", target,
                                 (self.materialize(lhs), self.arg(args[1])), {})
        if target is operator.setitem and len(args) == 3 and not node.kwargs:
            # torch.fx prints `a[i] = v;  setitem = a`: the node's value (None) is not `a`.
            fx_args = (self.materialize(args[0]), *self.arg(args[1:]))
            self.call(node, "call_function", target, fx_args, {})
            return None
        fx_args = self.arg(args)
        if (target is operator.pow or target is operator.getitem) and len(args) == 2 \
                and not node.kwargs and _starts_with_minus(args[0]):
            # torch.fx prints `-2 ** x`, which Python reads as -(2 ** x).
            if target is operator.pow:
                target = builtins.pow
            else:
                fx_args = (self.lift(args[0]), fx_args[1])
        if target is getattr and len(args) == 2 and not isinstance(args[0], Node):
            fx_args = (self.materialize(args[0]), fx_args[1])  # `1.real` does not parse
        return self.call(node, "call_function", target, fx_args, node.kwargs)

    def call(self, node: Node, op: str, target: Any, args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> torch.fx.Node:
        """Create the call node, routing targets and keywords torch.fx cannot print."""
        if op == "call_function" and not _target_prints(target):
            args, target = (self.lift(target), *args), operator.call
        odd = {k for k in kwargs if not k.isidentifier() or keyword.iskeyword(k)}
        if odd:
            if op == "call_method":
                fn = self.graph.create_node("call_function", getattr, (args[0], target))
                args = args[1:]
            elif op == "call_module":
                fn = self.graph.create_node("get_attr", target)
            else:
                fn = self.lift(target)
            args = (fn, tuple(args), self.arg(dict(kwargs)))
            op, target, kwargs = "call_function", _call_with_keywords, {}
        # torch.fx prints each keyword's value as it prints a positional argument.
        fx_kwargs = {k: self.arg(v) for k, v in kwargs.items()}
        return self.graph.create_node(op, target, args, fx_kwargs, name=node.name)


_names_cache: tuple[frozenset[str], frozenset[str]] | None = None


def _attribute_names() -> tuple[frozenset[str], frozenset[str]]:
    """(attributes of an nn.Module, attributes of a torch.fx.GraphModule and names of its
    generated code): a target atom with such a name would replace or hide them."""
    global _names_cache
    if _names_cache is None:
        module = frozenset(dir(torch.nn.Module()))
        root = frozenset(dir(torch.fx.GraphModule(torch.nn.Module(), torch.fx.Graph())))
        _names_cache = (module, root | module | _FX_CODE_NAMES)
    return _names_cache
