"""Structural checks of a graph (``graph.lint()``), run after every pass in tests.

Each problem names the node, says what is wrong and how to fix it; the error ends with the whole
graph printed, so a failing pass can be diagnosed from the message alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .codegen import RESERVED_NAMES
from .node import OPS, Node, map_arg

if TYPE_CHECKING:
    from .graph import Graph


class GraphLintError(Exception):
    """A graph breaks an invariant of the IR.

    Cause: a pass or the capture built or edited the graph wrongly (a node used before it is
    defined, a node from another graph, ``users`` out of date after mutating args in place, ...).
    Fix: follow the hint printed for each problem. ``problems`` holds ``(node, text)`` pairs and
    ``node`` the first offending node (None for graph-wide problems such as a missing output).
    """

    def __init__(self, message: str, problems: list[tuple[Node | None, str]]) -> None:
        super().__init__(message)
        self.problems = problems
        self.node = problems[0][0] if problems else None


def _inputs_from_args(node: Node) -> dict[Node, None]:
    # Recomputed from args rather than trusting the cached set, to catch in-place mutation.
    found: dict[Node, None] = {}

    def add(n: Node) -> Node:
        found[n] = None
        return n

    map_arg(node.args, add)
    map_arg(node.kwargs, add)
    return found


def _check_target(node: Node) -> str | None:
    op, target = node.op, node.target
    if op not in OPS:
        return f"op {op!r} is not one of {', '.join(OPS)}."
    if op == "call_function" and not callable(target):
        return f"call_function target {target!r} is not callable."
    if op in ("call_method", "get_attr", "call_module", "placeholder") and not isinstance(
        target, str
    ):
        return f"{op} target must be a str, got {target!r}."
    if op == "call_method" and not node.args:
        return "call_method has no args; args[0] must be the object whose method is called."
    if op == "output" and len(node.args) != 1:
        return "output must have exactly one arg (the returned value); wrap several in a tuple."
    if op == "placeholder" and len(node.args) > 1:
        return "placeholder args must be () or (default,)."
    return None


def lint_graph(graph: Graph) -> None:
    """Raise :class:`GraphLintError` listing every problem of ``graph`` (see Graph.lint)."""
    linter = _Linter(graph)
    linter.run()
    if linter.problems:
        raise GraphLintError(_message(graph, linter.problems), linter.problems)


class _Linter:
    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.nodes = list(graph.nodes)
        self.position = {n: i for i, n in enumerate(self.nodes)}
        self.inputs = {n: _inputs_from_args(n) for n in self.nodes}
        self.problems: list[tuple[Node | None, str]] = []

    def report(self, node: Node | None, text: str) -> None:
        self.problems.append((node, f"%{node.name}: {text}" if node is not None else text))

    def run(self) -> None:
        if len(self.nodes) != self.graph._len:
            self.report(
                None,
                f"the graph counts {self.graph._len} nodes but links {len(self.nodes)}; "
                f"only add and remove nodes through the Graph methods.",
            )
        self.check_nodes()
        self.check_placeholders()
        for node in self.nodes:
            self.check_inputs(node)
            self.check_users(node)
        self.check_output()

    def check_nodes(self) -> None:
        seen_names: set[str] = set()
        for node in self.nodes:
            if node.graph is not self.graph:
                self.report(
                    node,
                    "belongs to another graph. Create it in this graph instead "
                    "(graph.node_copy(node, arg_transform)).",
                )
            problem = _check_target(node)
            if problem:
                self.report(node, problem)
            if node.name in seen_names:
                self.report(
                    node,
                    f"another node is also named {node.name!r}; names must be unique "
                    f"(they become variables). Rename one.",
                )
            seen_names.add(node.name)
            if not node.name.isidentifier() or node.name in RESERVED_NAMES:
                self.report(
                    node,
                    f"name {node.name!r} is not usable as a Python variable; "
                    f"create the node with a different name.",
                )

    def check_placeholders(self) -> None:
        # Placeholders are the generated function's parameters: they come first, and those
        # with defaults come last among them.
        first_other: Node | None = None
        first_default: Node | None = None
        for node in self.nodes:
            if node.op != "placeholder":
                first_other = first_other or node
                continue
            if first_other is not None:
                self.report(
                    node,
                    f"placeholder comes after %{first_other.name}; placeholders are "
                    f"the function's parameters and must come first. Move it: "
                    f"{first_other.name}.prepend({node.name}).",
                )
            if node.args:
                first_default = first_default or node
            elif first_default is not None:
                self.report(
                    node,
                    f"placeholder without a default follows %{first_default.name}, "
                    f"which has one; Python needs defaulted parameters last.",
                )

    def check_inputs(self, node: Node) -> None:
        inputs = self.inputs[node]
        if inputs != node._input_nodes:
            self.report(
                node,
                "its args or kwargs were changed in place (e.g. a list inside args "
                "was mutated), so `users` are stale. Assign new values instead: "
                "node.args = (...) / node.kwargs = {...}.",
            )
        for inp in inputs:
            if inp.graph is not self.graph:
                self.report(
                    node,
                    f"uses %{inp.name}, which belongs to another graph. Copy it into "
                    f"this graph (graph.node_copy) and use the copy.",
                )
            elif inp not in self.position:
                self.report(
                    node,
                    f"uses %{inp.name}, which was erased. Replace the use "
                    f"({node.name}.replace_input_with({inp.name}, other)) before "
                    f"erasing it.",
                )
            elif self.position[inp] >= self.position[node]:
                self.report(
                    node,
                    f"uses %{inp.name}, which is defined after it. Move "
                    f"%{node.name} after %{inp.name} ({inp.name}.append({node.name})) "
                    f"or create it inside `with graph.inserting_after({inp.name}):`.",
                )
            if node not in inp.users:
                self.report(
                    inp,
                    f"its users miss %{node.name}, which uses it; set args only "
                    f"through node.args / node.kwargs so users stay right.",
                )

    def check_users(self, node: Node) -> None:
        for user in node.users:
            if user not in self.position:
                self.report(
                    node,
                    f"users lists %{user.name}, which is not in the graph (erased or "
                    f"foreign); erase nodes only with graph.erase_node.",
                )
            elif node not in self.inputs[user]:
                self.report(
                    node,
                    f"users lists %{user.name}, which does not use it; set args only "
                    f"through node.args / node.kwargs so users stay right.",
                )

    def check_output(self) -> None:
        outputs = [n for n in self.nodes if n.op == "output"]
        if not outputs:
            self.report(None, "the graph has no output node; add one with graph.output(value).")
            return
        for extra in outputs[:-1]:
            self.report(
                extra,
                "is an output but not the last one; a graph returns once. Erase the extra "
                "output node (graph.erase_node).",
            )
        last = outputs[-1]
        if self.nodes[-1] is not last:
            after = ", ".join(f"%{n.name}" for n in self.nodes[self.position[last] + 1 :])
            self.report(
                last,
                f"output must be the last node but it is followed by {after}. Create new "
                f"nodes inside `with graph.inserting_before(graph.output_node):`.",
            )


def _message(graph: Graph, problems: list[tuple[Node | None, Any]]) -> str:
    lines = [f"graph lint found {len(problems)} problem{'s' if len(problems) > 1 else ''}:"]
    lines += [f"  - {text}" for _, text in problems]
    try:
        text = str(graph)
    except Exception as e:  # a broken graph may not even print; the problems still matter
        text = f"<graph could not be printed: {type(e).__name__}: {e}>"
    lines += ["graph:", *("    " + line for line in text.splitlines())]
    return "\n".join(lines)
