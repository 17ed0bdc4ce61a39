"""Python source generation for a graph.

``generate_python(graph)`` turns a graph into the source of one function, one statement per
node, plus the globals that source needs::

    def forward(self, x, w):
        matmul = torch.matmul(x, w)  # f32[4, 32]
        gelu = torch.nn.functional.gelu(matmul);  matmul = None  # f32[4, 32]
        return gelu

Each intermediate is set to None after its last use (``matmul = None``) so tensors are freed as
early as in eager mode; placeholders are not (the caller still holds them).

Torch functions print by their public path, operators as Python syntax (``x + y``, ``x[0]``),
constants as literals that evaluate back to the same value; anything that has no literal form (a
user function, a tensor constant) becomes a uniquely named global in ``PythonCode.globals``.
"""

from __future__ import annotations

import keyword
import math
import operator
import re
import types
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from .node import Node

if TYPE_CHECKING:
    from .graph import Graph

# Names the generated code itself refers to. A node may never be called this (the graph's
# namespace avoids them), otherwise its local variable would shadow what the code needs.
CODEGEN_NAMES = frozenset({"self", "torch", "operator", "float", "complex", "slice", "getattr"})
RESERVED_NAMES = frozenset(keyword.kwlist) | CODEGEN_NAMES
_NON_IDENTIFIER = re.compile(r"[^0-9a-zA-Z_]+")

# Where the public path of a callable is looked for, in order of preference.
_PATH_NAMESPACES: tuple[tuple[str, Any], ...] = (
    ("torch", torch),
    ("torch.nn.functional", torch.nn.functional),
    ("torch.linalg", torch.linalg),
    ("torch.special", torch.special),
    ("torch.fft", torch.fft),
    ("torch.Tensor", torch.Tensor),
    ("operator", operator),
    ("math", math),
)
_path_index: dict[Any, str] | None = None


def _build_path_index() -> dict[Any, str]:
    # Index objects (not names): torch.linalg.norm.__name__ is "linalg_norm", so a lookup by
    # __name__ would miss it. Public names win over private ones, earlier namespaces over later.
    index: dict[Any, str] = {}
    for want_private in (False, True):
        for prefix, ns in _PATH_NAMESPACES:
            for attr in dir(ns):
                if attr.startswith("_") != want_private or attr.startswith("__"):
                    continue
                obj = getattr(ns, attr, None)
                if obj is None or not callable(obj) or isinstance(obj, type(torch)):
                    continue
                try:
                    index.setdefault(obj, f"{prefix}.{attr}")
                except TypeError:  # unhashable callable objects cannot be indexed
                    pass
    return index


def target_path(target: Any) -> str | None:
    """The public dotted path of a torch/operator/math callable, e.g. ``torch.matmul``,
    ``torch.nn.functional.gelu``, ``torch.Tensor.view``, ``operator.getitem``; None when it has
    none (the caller then binds it as a global)."""
    global _path_index
    if _path_index is None:
        _path_index = _build_path_index()
    try:
        return _path_index.get(target)
    except TypeError:
        return None


def display_name(target: Any) -> str:
    """A readable name for any call target (for printing, not for evaluation)."""
    if isinstance(target, str):
        return target
    path = target_path(target)
    if path is not None:
        return path
    if isinstance(target, torch._ops.OpOverload):
        # aten::add.Tensor -> aten.add.Tensor (how it is written in code: torch.ops.aten...)
        return f"{target.namespace}.{target._schema.name.split('::')[-1]}.{target._overloadname}"
    if isinstance(target, torch._ops.OpOverloadPacket):
        return f"{target._qualified_op_name.replace('::', '.')}"
    module = getattr(target, "__module__", None)
    qualname = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    if qualname is None:
        return repr(target)
    return f"{module}.{qualname}" if module and module != "builtins" else qualname


def _torch_constant_path(value: Any) -> str | None:
    """``torch.float32``, ``torch.contiguous_format``, ``torch.strided``: the constants whose
    str() is their own path. Checked by resolving the path back to the same object."""
    text = str(value)
    if not text.startswith("torch."):
        return None
    obj: Any = torch
    for atom in text.split(".")[1:]:
        obj = getattr(obj, atom, None)
    return text if obj is value else None


def format_float(value: float) -> str:
    if math.isfinite(value):
        return repr(value)
    if math.isnan(value):
        return "float('nan')"
    return "float('inf')" if value > 0 else "float('-inf')"


def attr_path_expr(base: str, qualname: str) -> str:
    """``self.linear.weight``; atoms that are not identifiers (``layers.0``) use getattr."""
    expr = base
    for atom in qualname.split("."):
        if atom.isidentifier() and not keyword.iskeyword(atom):
            expr = f"{expr}.{atom}"
        else:
            expr = f"getattr({expr}, {atom!r})"
    return expr


def sanitize_identifier(text: str) -> str:
    """Turn ``text`` into a readable identifier: ``linear.weight`` -> ``linear_weight``,
    ``L['x']`` -> ``L_x``, ``<lambda>`` -> ``lambda_``; ``add_`` stays ``add_``."""
    name = "_".join(part for part in _NON_IDENTIFIER.split(text) if part) or "_"
    if name[0].isdigit():
        name = "_" + name
    if name in RESERVED_NAMES:
        name = name + "_"
    return name


# Binary and unary operators that print as Python syntax. For tensors operator.add(a, b) is
# exactly a + b, so the readable form runs the same code.
_BINARY_SYMBOLS = {
    operator.add: "+",
    operator.sub: "-",
    operator.mul: "*",
    operator.truediv: "/",
    operator.floordiv: "//",
    operator.mod: "%",
    operator.pow: "**",
    operator.matmul: "@",
    operator.and_: "&",
    operator.or_: "|",
    operator.xor: "^",
    operator.lshift: "<<",
    operator.rshift: ">>",
    operator.eq: "==",
    operator.ne: "!=",
    operator.lt: "<",
    operator.le: "<=",
    operator.gt: ">",
    operator.ge: ">=",
}
# ``1 - t``, ``0.9 ** t``, ``lr / t`` (an optimizer's bias corrections) with a number on the left:
# Python reaches the tensor's reflected method, a Python wrapper costing microseconds per call.
# They print as the torch call that wrapper makes (torch/_tensor.py), the same computation.
_REVERSED_SCALAR_OPS = {
    operator.sub: "torch.rsub({t}, {c})",
    operator.pow: "torch.pow({c}, {t})",
    operator.truediv: "{t}.reciprocal() * {c}",
    operator.floordiv: "torch.floor_divide({c}, {t})",
    operator.mod: "torch.remainder({c}, {t})",
}


def _is_tensor_node(arg) -> bool:
    return isinstance(arg, Node) and isinstance(arg.meta.get("val"), torch.Tensor)


_UNARY_SYMBOLS = {operator.neg: "-", operator.pos: "+", operator.invert: "~"}


def _symbol(table: dict[Any, str], target: Any) -> str | None:
    try:
        return table.get(target)
    except TypeError:  # unhashable callable
        return None


@dataclass
class PythonCode:
    """Generated source of one graph.

    Attributes:
        src: the complete ``def fn_name(...):`` source.
        globals: what ``src`` needs to run (``torch``, ``operator``, bound constants).
        fn_name: the name of the function ``src`` defines.
        lineno_to_node: 1-based line of ``src`` -> name of the node that line computes.
        attr_globals: with ``self_arg=False`` only: global name -> qualified attribute name of
            the owning module that the caller must bind in ``globals`` before running.
    """

    src: str
    globals: dict[str, Any]
    fn_name: str
    lineno_to_node: dict[int, str] = field(default_factory=dict)
    attr_globals: dict[str, str] = field(default_factory=dict)


class _Globals:
    """Allocates unique global names that never collide with a node (a local of the same name
    would shadow the global for the whole function)."""

    def __init__(self, taken: set[str]) -> None:
        self.values: dict[str, Any] = {"torch": torch, "operator": operator}
        self._taken = taken | set(self.values)
        self._by_id: dict[int, str] = {}

    def add(self, hint: str, value: Any) -> str:
        known = self._by_id.get(id(value))
        if known is not None:
            return known
        name = self.reserve(hint)
        self.values[name] = value
        self._by_id[id(value)] = name  # `value` stays alive in self.values, so id() is stable
        return name

    def reserve(self, hint: str) -> str:
        base = sanitize_identifier(hint)
        name, i = base, 0
        while name in self._taken:
            i += 1
            name = f"{base}_{i}"
        self._taken.add(name)
        return name


class _Emitter:
    def __init__(self, graph: Graph, self_arg: bool) -> None:
        self.self_arg = self_arg
        taken = {n.name for n in graph.nodes} | set(RESERVED_NAMES)
        self.globals = _Globals(taken)
        self.attr_globals: dict[str, str] = {}
        self.module_globals: dict[str, str] = {}  # call_module qualname -> its global
        self.called: dict[str, Any] = {}  # dotted path -> the callable the code calls there
        self.shapes: dict[torch.Size, str] = {}  # constant sizes passed to calls -> their global

    # -- expressions ---------------------------------------------------------------------------

    def expr(self, a: Any) -> str:
        """Source that evaluates to ``a`` (Nodes by their variable)."""
        if isinstance(a, Node):
            return a.name
        kind = type(a)
        if a is None or kind is bool or kind is int or kind is str or kind is bytes:
            return repr(a)
        if kind is float:
            return format_float(a)
        if kind is complex:
            return f"complex({format_float(a.real)}, {format_float(a.imag)})"
        if a is Ellipsis:
            return "..."
        if kind is tuple:
            items = [self.expr(x) for x in a]
            return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
        if kind is list:
            return f"[{', '.join(self.expr(x) for x in a)}]"
        if kind is dict:
            return "{" + ", ".join(f"{self.expr(k)}: {self.expr(v)}" for k, v in a.items()) + "}"
        if kind is slice:
            return f"slice({self.expr(a.start)}, {self.expr(a.stop)}, {self.expr(a.step)})"
        if kind is torch.Size:
            return f"torch.Size([{', '.join(self.expr(x) for x in a)}])"
        if kind is torch.device:
            return f"torch.device({str(a)!r})"
        if isinstance(a, tuple) and hasattr(a, "_fields"):  # named tuple: rebuild by type
            cls = self.globals.add(kind.__name__, kind)
            return f"{cls}({', '.join(self.expr(x) for x in a)})"
        if isinstance(a, (torch.dtype, torch.memory_format, torch.layout, torch.qscheme)):
            path = _torch_constant_path(a)
            if path is not None:
                return path
        if callable(a) and not isinstance(a, torch.Tensor):
            return self.callable_expr(a)
        if isinstance(a, torch.Tensor):
            return self.globals.add("tensor_constant", a)
        return self.globals.add(kind.__name__.lower(), a)

    def callable_expr(self, fn: Any) -> str:
        path = target_path(fn)
        if path is not None:
            self.called[path] = fn
            return path
        hint = getattr(fn, "__name__", None) or type(fn).__name__.lower()
        return self.globals.add(hint, fn)

    def operand(self, a: Any) -> str:
        """An operand of infix syntax: parenthesized unless it is a name or a plain number."""
        text = self.expr(a)
        if text.isidentifier() or text.replace(".", "", 1).isdigit():
            return text
        return f"({text})"

    def subscript(self, index: Any) -> str:
        """The inside of ``x[...]``: slices as ``a:b``, tuples without parentheses."""

        def part(a: Any) -> str:
            if type(a) is slice:
                bounds = ["" if b is None else self.expr(b) for b in (a.start, a.stop, a.step)]
                return ":".join(bounds if a.step is not None else bounds[:2])
            return self.expr(a)

        if type(index) is tuple and index:
            parts = [part(x) for x in index]
            return parts[0] + "," if len(parts) == 1 else ", ".join(parts)
        return part(index)

    def arg(self, a: Any, native: bool) -> str:
        """``expr(a)`` for an argument of a call. A constant ``torch.Size`` given to torch's C
        bindings (``native``) is a tuple literal: they read both alike, and a ``torch.Size``
        object costs their argument parser about 5 µs more (``x.view(size)`` with the size a
        model computed: 8 µs, against 3 µs for ``x.view((1, 8, 96))``). To other callees it
        stays a ``torch.Size``, built once as a global named by its sizes (``shape_1x8x96``)."""
        if type(a) is not torch.Size or not all(type(d) is int for d in a):
            return self.expr(a)
        if native:
            return self.expr(tuple(a))
        name = self.shapes.get(a)
        if name is None:
            hint = "shape_" + "x".join(map(str, a)) if a else "shape_scalar"
            name = self.shapes[a] = self.globals.add(hint, a)
        return name

    def call_args(self, args: tuple[Any, ...], kwargs: dict[str, Any], native: bool = False
                  ) -> str:
        """The arguments of a call; ``native``: the callee is one of torch's C bindings."""
        parts = [self.arg(a, native) for a in args]
        odd = {}
        for key, value in kwargs.items():
            if key.isidentifier() and not keyword.iskeyword(key):
                parts.append(f"{key}={self.arg(value, native)}")
            else:
                odd[key] = value
        if odd:
            parts.append(f"**{self.expr(odd)}")
        return ", ".join(parts)

    # -- statements ----------------------------------------------------------------------------

    def node_expr(self, node: Node) -> str | None:
        """The right-hand side computing ``node``; None for nodes without a statement."""
        op, target, args, kwargs = node.op, node.target, node.args, node.kwargs
        if op == "get_attr":
            if self.self_arg:
                return attr_path_expr("self", target)
            # Without `self` the object itself is bound as a global under the node's name,
            # so loading it costs one global lookup and needs no statement.
            self.attr_globals[node.name] = target
            return None
        if op == "call_module":
            if self.self_arg:
                fn = attr_path_expr("self", target)
            else:
                fn = self.module_globals.get(target) or self.globals.reserve(target)
                self.module_globals[target] = fn
                self.attr_globals[fn] = target
            return f"{fn}({self.call_args(args, kwargs)})"
        if op == "call_method":
            obj = self.operand(args[0])
            if obj[0].isdigit():  # `5.bit_length()` does not parse
                obj = f"({obj})"
            call = self.call_args(args[1:], kwargs, native=_is_tensor_node(args[0]))
            if target.isidentifier() and not keyword.iskeyword(target):
                return f"{obj}.{target}({call})"
            return f"getattr({obj}, {target!r})({call})"
        # call_function
        if not kwargs:
            if target is operator.getitem and len(args) == 2:
                return f"{self.operand(args[0])}[{self.subscript(args[1])}]"
            template = _REVERSED_SCALAR_OPS.get(target) if len(args) == 2 else None
            if template is not None and type(args[0]) in (int, float) and _is_tensor_node(args[1]):
                return template.format(c=self.operand(args[0]), t=self.operand(args[1]))
            symbol = _symbol(_BINARY_SYMBOLS, target)
            if symbol is not None and len(args) == 2:
                return f"{self.operand(args[0])} {symbol} {self.operand(args[1])}"
            symbol = _symbol(_UNARY_SYMBOLS, target)
            if symbol is not None and len(args) == 1:
                return f"{symbol}{self.operand(args[0])}"
        return f"{self.callable_expr(target)}({self.call_args(args, kwargs, _native(target))})"


def _native(target: Any) -> bool:
    """Whether ``target`` is one of torch's C bindings (``torch.addmm``, ``torch._C._nn.linear``,
    an aten op), whose argument parser takes a tuple wherever it takes a ``torch.Size``."""
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return True
    return isinstance(target, types.BuiltinFunctionType) and \
        (getattr(target, "__module__", None) or "").split(".")[0] == "torch"


def _last_uses(graph: Graph) -> dict[Node, list[Node]]:
    """node -> the values whose last use is that node, so their variables can be dropped
    right after it and intermediate tensors are freed as early as in eager mode."""
    last_use: dict[Node, Node] = {}
    for node in graph.nodes:
        for inp in node.all_input_nodes:
            last_use[inp] = node
    frees: dict[Node, list[Node]] = {}
    for value, user in last_use.items():
        # Placeholders are still held by the caller and get_attr values by the module: dropping
        # them frees nothing (and a get_attr bound as a global must never become a local).
        if value.op in ("placeholder", "get_attr") or user.op == "output":
            continue
        frees.setdefault(user, []).append(value)
    for node in graph.nodes:
        if not node.users and node.op not in ("placeholder", "get_attr", "output"):
            frees.setdefault(node, []).append(node)
    return frees


def generate_python(
    graph: Graph,
    fn_name: str = "forward",
    *,
    self_arg: bool = True,
    free_dead: bool = True,
    annotate: bool = True,
) -> PythonCode:
    """Generate the source of ``graph`` as one function named ``fn_name``.

    ``self_arg`` adds a leading ``self`` through which get_attr and call_module targets are
    loaded; without it they become globals listed in ``PythonCode.attr_globals``.
    ``free_dead`` sets each intermediate to None after its last use. ``annotate`` ends a line
    with a ``# f32[4, 32]`` comment when the node has ``meta["val"]``.
    """
    from .meta import describe

    emit = _Emitter(graph, self_arg)
    # `def` binds its name in the globals dict: a node of that name (a get_attr bound as a global)
    # would be replaced by the function, so the function then takes another name.
    fn_name = emit.globals.reserve(fn_name)
    frees = _last_uses(graph) if free_dead else {}
    params = ["self"] if self_arg else []
    body: list[tuple[str, Node | None]] = []
    for node in graph.nodes:
        if node.op == "placeholder":
            param = node.name
            if node.args:
                param += f"={emit.expr(node.args[0])}"
            params.append(param)
            continue
        if node.op == "output":
            body.append((f"return {emit.expr(node.args[0])}", node))
            continue
        rhs = emit.node_expr(node)
        if rhs is None:
            continue
        line = f"{node.name} = {rhs}"
        dead = frees.get(node)
        if dead:
            line += f";  {' = '.join(n.name for n in dead)} = None"
        if annotate and "val" in node.meta:
            line += f"  # {describe(node.meta['val'])}"
        body.append((line, node))
    if not body:
        body.append(("pass", None))
    lines = [f"def {fn_name}({', '.join(params)}):"]
    lineno_to_node: dict[int, str] = {}
    for text, node in body:
        lines.append("    " + text)
        if node is not None:
            lineno_to_node[len(lines)] = node.name
    src = "\n".join(lines) + "\n"
    values = emit.globals.values
    for root, pinned in pinned_modules(emit.called).items():
        if root in values:
            values[root] = pinned
    return PythonCode(src, values, fn_name, lineno_to_node, emit.attr_globals)


class PinnedModule:
    """A module as generated code sees it: each callable the code calls by its dotted path
    (``torch.conv2d``, ``torch.nn.functional.gelu``) is the object captured when the code was
    generated; any other attribute comes from the module itself (and is kept after its first
    use). The code used to look the path up at every call: a program that later rebound
    ``torch.conv2d`` to a wrapper (instrumentation, a patch) then had the graph call the wrapper,
    whose own ``torch.conv2d``-free code it never captured, and a wrapper that calls back into
    compiled code recursed without end."""

    def __init__(self, module: Any) -> None:
        object.__setattr__(self, "_module", module)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._module, name)
        object.__setattr__(self, name, value)
        return value

    def __repr__(self) -> str:
        return f"<{self._module.__name__} as the generated code calls it>"


_PINNED_ROOTS = {"torch": torch, "operator": operator, "math": math}


def pinned_modules(called: dict[str, Any]) -> dict[str, PinnedModule]:
    """The root names of ``called``'s paths (``torch``, ``operator``, ``math``) bound to
    :class:`PinnedModule` trees that hold each called object under its path. A path through
    anything but modules (``torch.Tensor.view``) is left to the run-time lookup."""
    roots: dict[str, PinnedModule] = {}
    for path, fn in called.items():
        parts = path.split(".")
        module = _PINNED_ROOTS.get(parts[0])
        if module is None:
            continue
        node = roots.get(parts[0])
        if node is None:
            node = roots[parts[0]] = PinnedModule(module)
        for name in parts[1:-1]:
            child = node.__dict__.get(name)
            if child is None:
                inner = getattr(node._module, name, None)
                if not isinstance(inner, types.ModuleType):
                    break
                child = PinnedModule(inner)
                object.__setattr__(node, name, child)
            node = child
        else:
            object.__setattr__(node, parts[-1], fn)
    return roots
