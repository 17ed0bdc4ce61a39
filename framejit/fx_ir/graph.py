"""A graph: an ordered list of nodes computing one function.

Example::

    g = Graph()
    x, w = g.placeholder("x"), g.placeholder("w")
    mm = g.call_function(torch.matmul, (x, w))
    g.output(g.call_function(torch.relu, (mm,)))
    print(g)                      # %x = placeholder() ... output %relu
    print(g.python_code().src)    # def forward(self, x, w): ...

Nodes are created through the graph (it names them and places them at the insertion point,
the end unless inside ``with g.inserting_before(n)`` / ``inserting_after(n)``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from .codegen import PythonCode, generate_python, sanitize_identifier
from .node import Node, map_arg


class _NoDefault:
    """Marks a placeholder without a default value (None is a valid default)."""

    def __repr__(self) -> str:
        return "<no default>"


NO_DEFAULT: Any = _NoDefault()

_NUMBERED = re.compile(r"(.*)_(\d+)")


class NodeList:
    """The nodes of a graph in order; a live view, safe to erase the current node while
    iterating (erased nodes are skipped)."""

    __slots__ = ("_graph", "_reverse")

    def __init__(self, graph: Graph, reverse: bool = False) -> None:
        self._graph = graph
        self._reverse = reverse

    def __len__(self) -> int:
        return self._graph._len

    def __iter__(self) -> Iterator[Node]:
        root = self._graph._root
        step = "_prev" if self._reverse else "_next"
        # An erased node keeps its own links, so stepping off a just-erased node still works.
        cur = getattr(root, step)
        while cur is not root:
            if not cur._erased:
                yield cur
            cur = getattr(cur, step)

    def __reversed__(self) -> Iterator[Node]:
        return iter(NodeList(self._graph, not self._reverse))

    def __contains__(self, node: object) -> bool:
        return isinstance(node, Node) and node.graph is self._graph and not node._erased

    def __repr__(self) -> str:
        return f"[{', '.join(n.name for n in self)}]"


class Graph:
    """An ordered list of :class:`Node` with unique names.

    Build it with :meth:`placeholder`, :meth:`get_attr`, :meth:`call_function`,
    :meth:`call_method`, :meth:`call_module` and :meth:`output`; inspect it with ``str(graph)``,
    :meth:`python_code` and :meth:`lint`.
    """

    def __init__(self) -> None:
        # A sentinel closes the doubly linked list: root._next is the first node, root._prev
        # the last. It is never yielded and owns no name.
        self._root = Node(self, "__root__", "placeholder", "__root__", (), {})
        self._len = 0
        self._used_names: set[str] = set()
        self._name_counters: dict[str, int] = {}
        self._insert: Callable[[Node], None] = self._root.prepend  # append at the end

    # ----------------------------------------------------------------------------------------
    # reading

    @property
    def nodes(self) -> NodeList:
        """The nodes in order (a live view supporting ``len``, ``reversed`` and ``in``)."""
        return NodeList(self)

    @property
    def output_node(self) -> Node | None:
        """The last output node, or None before :meth:`output` was called."""
        for node in reversed(self.nodes):
            if node.op == "output":
                return node
        return None

    def find_nodes(self, *, op: str | None = None, target: Any = None) -> list[Node]:
        """The nodes with this ``op`` and/or ``target`` (compared by identity or equality)."""
        found = []
        for node in self.nodes:
            if op is not None and node.op != op:
                continue
            if target is not None and not _same_target(node.target, target):
                continue
            found.append(node)
        return found

    def __str__(self) -> str:
        from .printing import format_graph

        return format_graph(self)

    def __repr__(self) -> str:
        return f"<Graph with {self._len} nodes>"

    # ----------------------------------------------------------------------------------------
    # building

    def create_node(
        self,
        op: str,
        target: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        name: str | None = None,
    ) -> Node:
        """Create a node at the current insertion point; ``name`` (or one derived from the
        target) is made a unique identifier."""
        unique = self._unique_name(name if name is not None else _default_name(op, target))
        node = Node(self, unique, op, target, tuple(args), dict(kwargs or {}))
        self._insert(node)
        self._len += 1
        return node

    def placeholder(self, name: str, default: Any = NO_DEFAULT) -> Node:
        """A function input. ``target`` keeps ``name`` as given; the node's name is ``name``
        made an identifier. A ``default`` is stored as ``args == (default,)``."""
        args = () if default is NO_DEFAULT else (default,)
        return self.create_node("placeholder", name, args, name=name)

    def get_attr(self, qualname: str, name: str | None = None) -> Node:
        """Load the attribute ``qualname`` (``"linear.weight"``) of the owning module."""
        return self.create_node("get_attr", qualname, name=name)

    def call_function(
        self,
        target: Callable[..., Any],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        name: str | None = None,
    ) -> Node:
        """``target(*args, **kwargs)``."""
        return self.create_node("call_function", target, args, kwargs, name)

    def call_method(
        self,
        method_name: str,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        name: str | None = None,
    ) -> Node:
        """``args[0].method_name(*args[1:], **kwargs)``."""
        if not args:
            raise ValueError(f"call_method({method_name!r}) needs the object as args[0]")
        return self.create_node("call_method", method_name, args, kwargs, name)

    def call_module(
        self,
        qualname: str,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        name: str | None = None,
    ) -> Node:
        """Call the submodule at ``qualname`` of the owning module."""
        return self.create_node("call_module", qualname, args, kwargs, name)

    def output(self, value: Any) -> Node:
        """Return ``value`` (any nesting of nodes and constants) from the graph."""
        return self.create_node("output", "output", (value,), name="output")

    def node_copy(self, node: Node, arg_transform: Callable[[Node], Any] = lambda n: n) -> Node:
        """Copy ``node`` (possibly of another graph) into this graph; ``arg_transform`` maps each
        node in its args to the node to use here. ``meta`` is copied shallowly."""
        args = map_arg(node.args, arg_transform)
        kwargs = map_arg(node.kwargs, arg_transform)
        new = self.create_node(node.op, node.target, args, kwargs, name=node.name)
        new.meta = dict(node.meta)
        return new

    def copy(self) -> Graph:
        """An independent copy with the same node names (meta copied shallowly)."""
        new = Graph()
        env: dict[Node, Node] = {}
        for node in self.nodes:
            env[node] = new.node_copy(node, env.__getitem__)
        return new

    # ----------------------------------------------------------------------------------------
    # editing

    @contextmanager
    def inserting_before(self, node: Node | None = None) -> Iterator[None]:
        """New nodes go before ``node`` (the start of the graph when None), in creation order."""
        anchor = node if node is not None else self._root._next
        previous = self._insert
        self._insert = anchor.prepend
        try:
            yield
        finally:
            self._insert = previous

    @contextmanager
    def inserting_after(self, node: Node | None = None) -> Iterator[None]:
        """New nodes go after ``node`` (the end of the graph when None), in creation order:
        each one after the one created before it."""
        previous = self._insert
        if node is None:
            self._insert = self._root.prepend
        else:
            cursor = [node]

            def insert(new: Node) -> None:
                cursor[0].append(new)
                cursor[0] = new

            self._insert = insert
        try:
            yield
        finally:
            self._insert = previous

    def erase_node(self, node: Node) -> None:
        """Remove ``node``; it must have no users (replace its uses first)."""
        if node.graph is not self:
            raise ValueError(f"cannot erase %{node.name}: it belongs to another graph")
        if node._erased:
            raise ValueError(f"cannot erase %{node.name}: it was already erased")
        if node.users:
            users = ", ".join(f"%{u.name}" for u in node.users)
            raise RuntimeError(
                f"cannot erase %{node.name}: it is still used by {users}. Make them use "
                f"another node first (node.replace_all_uses_with(other)) or erase them first."
            )
        node._unlink()
        node._erased = True
        self._len -= 1
        # Drop the references to its inputs so their `users` no longer list it.
        node._set_args_kwargs(
            map_arg(node.args, lambda _: None), map_arg(node.kwargs, lambda _: None)
        )

    def eliminate_dead_code(self) -> bool:
        """Erase nodes whose result is unused and that have no side effect
        (:meth:`Node.is_impure`) and are not marked ``meta["keep"]`` (an operation the program
        ran for its possible error). Returns whether anything was erased."""
        changed = False
        # Walking backwards, a node's users were already visited (and erased if dead).
        for node in reversed(self.nodes):
            if not node.users and not node.is_impure() and not node.meta.get("keep"):
                self.erase_node(node)
                changed = True
        return changed

    # ----------------------------------------------------------------------------------------
    # checking and code

    def lint(self) -> None:
        """Check the graph's invariants; raise :class:`GraphLintError` describing every problem.

        Checks: node ownership, unique identifier names, valid ops and targets, topological
        order (inputs defined earlier), ``users`` consistent with args both ways, placeholders
        first, exactly one output and it is last.
        """
        from .lint import lint_graph

        lint_graph(self)

    def python_code(self, fn_name: str = "forward", **options: Any) -> PythonCode:
        """Runnable source of this graph as ``def fn_name(self, <placeholders>):``.

        Options (see :func:`~framejit.fx_ir.codegen.generate_python`): ``self_arg``,
        ``free_dead``, ``annotate``.
        """
        return generate_python(self, fn_name, **options)

    # ----------------------------------------------------------------------------------------
    # names

    def _unique_name(self, candidate: str) -> str:
        name = sanitize_identifier(candidate)
        if name in self._used_names:
            match = _NUMBERED.fullmatch(name)
            base = match.group(1) if match else name
            i = self._name_counters.get(base, 0)
            while True:
                i += 1
                name = f"{base}_{i}"
                if name not in self._used_names:
                    break
            self._name_counters[base] = i
        self._used_names.add(name)
        return name


def _default_name(op: str, target: Any) -> str:
    if op == "call_function":
        return getattr(target, "__name__", None) or type(target).__name__
    if op == "output":
        return "output"
    return str(target)  # method name, qualified attribute name, placeholder name


def _same_target(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:  # e.g. comparing tensors raises or is ambiguous
        return False
