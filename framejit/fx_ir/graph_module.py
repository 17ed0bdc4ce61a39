"""A graph compiled to a Python function, with the objects its get_attr/call_module nodes need.

Example::

    gm = GraphModule({"linear.weight": w}, graph)
    gm(x)                 # runs the generated code
    print(gm.code)        # def forward(self, x): ... linear_weight = self.linear.weight ...
    fn = gm.forward_fn    # the same computation as a plain function of the inputs only

The source is compiled under a file name that no live function has (``<framejit-graph-N>``),
registered in ``linecache``, so tracebacks and pdb show the generated lines.
"""

from __future__ import annotations

import heapq
import linecache
import types
import weakref
from collections.abc import Callable
from typing import Any

from .. import diskcache
from .codegen import PythonCode
from .graph import Graph
from .meta import resolve_qualname


class NumberPool:
    """Numbers for generated names (``<framejit-graph-N>``, ``___entry_N``): the smallest one
    free, given back when the function that used it dies. CPython interns the file name and
    the function name of every code object it compiles and never frees them (about 60 bytes
    each, on 3.11 and 3.12), so a counter that only grows left that much behind for every graph
    of every dropped wrapper; reused numbers keep those names as many as the live functions."""

    def __init__(self) -> None:
        self._free: list[int] = []
        self._next = 0

    def take(self) -> int:
        if self._free:
            return heapq.heappop(self._free)
        self._next += 1
        return self._next - 1

    def give_back(self, number: int) -> None:
        heapq.heappush(self._free, number)

    def give_back_when_dead(self, fn: Callable[..., Any], number: int) -> None:
        """Give ``number`` back when ``fn`` dies."""
        weakref.finalize(fn, self.give_back, number)


_file_numbers = NumberPool()


def _forget_file(filename: str, number: int) -> None:
    linecache.cache.pop(filename, None)
    _file_numbers.give_back(number)


def compile_python(code: PythonCode, name_hint: str = "graph") -> Callable[..., Any]:
    """Exec ``code`` under a fresh ``<framejit-{name_hint}-N>`` file name registered in
    linecache and return the function it defines.

    The linecache entry lives as long as the function: it is removed when the function is
    garbage collected, so compiling many graphs does not grow the cache forever.
    """
    number = _file_numbers.take()
    filename = f"<framejit-{name_hint}-{number}>"
    # mtime None marks the entry as not backed by a file: linecache.checkcache keeps it.
    linecache.cache[filename] = (len(code.src), None, code.src.splitlines(True), filename)
    namespace = dict(code.globals)
    exec(diskcache.compiled(code.src, filename), namespace)
    fn = namespace[code.fn_name]
    weakref.finalize(fn, _forget_file, filename, number)
    return fn


class _Attributes:
    """Holds the get_attr/call_module objects of a dict root under their dotted paths, so the
    generated ``self.linear.weight`` resolves."""

    def __repr__(self) -> str:
        return f"<attributes {', '.join(vars(self))}>"


def _attributes_from_dict(root: dict[str, Any], qualnames: list[str]) -> _Attributes:
    owner = _Attributes()
    for qualname in qualnames:
        obj = resolve_qualname(root, qualname)
        *parents, last = qualname.split(".")
        holder: Any = owner
        for atom in parents:
            if not hasattr(holder, atom):
                setattr(holder, atom, _Attributes())
            holder = getattr(holder, atom)
        if isinstance(holder, _Attributes):
            setattr(holder, last, obj)
        # else: the prefix is a real object from the root (a module) that already provides
        # `last`; it is never modified.
    return owner


class GraphModule:
    """A :class:`Graph` plus the objects it references, compiled to Python.

    Args:
        root: where get_attr and call_module targets (dotted names) are looked up: a dict
            (keys are full qualified names like ``"linear.weight"`` or top-level names) or any
            object such as an ``nn.Module``.
        graph: the graph to run.
        class_name: the name used when printing (e.g. the compiled function's name).

    Attributes:
        graph: the graph; call :meth:`recompile` after editing it.
        forward_fn: plain function of the graph inputs only; the objects of get_attr nodes are
            bound as globals at :meth:`recompile` time. A backend returns this for the cheapest
            call path (one Python call into the generated code).
        forward: the ``def forward(self, ...)`` version (attributes loaded through ``self`` on
            every call), bound to the attribute owner.
        code: the source of ``forward``; ``forward_fn_code`` the source of ``forward_fn``.
    """

    def __init__(self, root: Any, graph: Graph, class_name: str = "GraphModule") -> None:
        self.root = root
        self.graph = graph
        self.class_name = class_name
        self._method_code: tuple[str, Callable[..., Any]] | None = None
        # The code is generated and compiled on first use (a backend that builds its own
        # callable from the graph never needs it); the root is checked now.
        self._fast: tuple[Callable[..., Any], str] | None = None
        for node in graph.nodes:
            if node.op in ("get_attr", "call_module"):
                self._resolve(node.target)

    def recompile(self) -> PythonCode:
        """Regenerate and recompile the code after the graph (or a root attribute) changed.
        Returns the generated code of :attr:`forward_fn`."""
        fast = self.graph.python_code("forward", self_arg=False)
        for global_name, qualname in fast.attr_globals.items():
            fast.globals[global_name] = self._resolve(qualname)
        fn = compile_python(fast)
        fn.__qualname__ = f"{self.class_name}.forward"
        self._fast = (fn, fast.src)
        self._method_code = None
        return fast

    @property
    def forward_fn(self) -> Callable[..., Any]:
        if self._fast is None:
            self.recompile()
        return self._fast[0]  # type: ignore[index]

    @property
    def forward_fn_code(self) -> str:
        if self._fast is None:
            self.recompile()
        return self._fast[1]  # type: ignore[index]

    def _resolve(self, qualname: str) -> Any:
        try:
            return resolve_qualname(self.root, qualname)
        except AttributeError as e:
            raise AttributeError(
                f"{self.class_name}: the graph refers to {qualname!r}, which the root does not "
                f"provide ({e}). Pass a root that has it, e.g. {{{qualname!r}: value}}."
            ) from None

    def _method(self) -> tuple[str, Callable[..., Any]]:
        # The `self` version is built on first use only: backends need just forward_fn.
        if self._method_code is None:
            code = self.graph.python_code("forward")
            if isinstance(self.root, dict):
                qualnames = [
                    n.target for n in self.graph.nodes if n.op in ("get_attr", "call_module")
                ]
                owner: Any = _attributes_from_dict(self.root, qualnames)
            else:
                owner = self.root
            fn = compile_python(code)
            fn.__qualname__ = f"{self.class_name}.forward"
            self._method_code = (code.src, types.MethodType(fn, owner))
        return self._method_code

    @property
    def code(self) -> str:
        """Source of :attr:`forward`: ``def forward(self, <inputs>):`` with one line per node."""
        return self._method()[0]

    @property
    def forward(self) -> Callable[..., Any]:
        return self._method()[1]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward_fn(*args, **kwargs)

    def to_torch_fx(self) -> Any:
        """This graph as a ``torch.fx.GraphModule`` (see :func:`to_torch.to_torch_fx`)."""
        from .to_torch import to_torch_fx

        return to_torch_fx(self)

    def __repr__(self) -> str:
        return f"{self.class_name}(\n{self.forward_fn_code})"
