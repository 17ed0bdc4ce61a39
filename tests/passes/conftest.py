"""Fixtures for the pass tests: graphs captured by framejit (with the meta values the passes read),
and ``rewrite``, which runs one pass on such a graph and checks the result against eager."""

from dataclasses import dataclass
from typing import Any

import pytest
import torch

import framejit
from framejit.backends.registry import Backend
from framejit.fx_ir import Graph, GraphModule
from framejit.passes.util import same_layout
from framejit.testing import assert_close_to_eager, fresh_state

fresh_framejit = pytest.fixture(autouse=True)(fresh_state)


DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.fixture(params=DTYPES, ids=["f32", "f16", "bf16"])
def dtype(request):
    return request.param


@dataclass
class Captured:
    """One captured graph, the root its get_attr nodes read, and the inputs it was captured on
    (parameters of modules included)."""

    graph: Graph
    root: Any
    inputs: list

    def run(self, *inputs: Any) -> Any:
        """Run the (possibly rewritten) graph on ``inputs`` (default: the captured ones)."""
        return GraphModule(self.root, self.graph)(*(inputs or self.inputs))

    def targets(self) -> list:
        return call_targets(self.graph)


def call_targets(graph: Graph) -> list:
    """The targets of the call nodes in order: callables, or method names for call_method."""
    return [n.target for n in graph.nodes if n.op in ("call_function", "call_method")]


def capture(fn, *args) -> Captured:
    """Capture ``fn`` on ``args`` as one graph (fullgraph) and return it unchanged."""
    recorded = []

    def record(gm, example_inputs):
        recorded.append((gm, example_inputs))
        return gm.forward_fn

    compiled = framejit.compile(
        fn, backend=Backend("passes-test", record, native=True), fullgraph=True
    )
    compiled(*args)
    assert len(recorded) == 1, f"expected one graph, got {len(recorded)}"
    gm, example_inputs = recorded[0]
    return Captured(gm.graph, gm.root, list(example_inputs))


def _outputs(graph: Graph) -> list:
    (out,) = graph.find_nodes(op="output")
    values = out.args[0]
    return list(values) if isinstance(values, (tuple, list)) else [values]


def _as_tuple(x: Any) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


class Rewriter:
    """``rewrite(pass_, fn, *args)``: capture ``fn``, run ``pass_`` on the graph, and check

    * ``graph.lint()`` passes;
    * every graph output keeps its meta shape, dtype and layout (each rewritten node's
      replacement matches the node it replaced: the test functions return what they rewrite);
    * the rewritten graph computes what eager ``fn`` does, within the dtype's tolerances, and
      returns tensors of eager's layout.

    Returns the :class:`Captured` graph after the pass (``.changed`` says what the pass said).
    """

    def __call__(
        self, pass_, fn, *args, expect_change: bool | None = True, rtol=None, atol=None
    ) -> Captured:
        expected = _as_tuple(fn(*args))
        captured = capture(fn, *args)
        before = [n.meta.get("val") for n in _outputs(captured.graph)]
        changed = pass_(captured.graph)
        captured.graph.lint()
        if expect_change is not None:
            assert changed is expect_change, f"pass returned {changed}:\n{captured.graph}"
        after = [n.meta.get("val") for n in _outputs(captured.graph)]
        for i, (old, new) in enumerate(zip(before, after, strict=True)):
            if isinstance(old, torch.Tensor):
                assert new.shape == old.shape, f"output {i}: shape {new.shape} != {old.shape}"
                assert new.dtype == old.dtype, f"output {i}: dtype {new.dtype} != {old.dtype}"
                assert same_layout(new, old), (
                    f"output {i}: strides {new.stride()} != {old.stride()}"
                )
        actual = _as_tuple(captured.run())
        assert_close_to_eager(actual, expected, rtol=rtol, atol=atol)
        for i, (a, e) in enumerate(zip(actual, expected)):
            if isinstance(e, torch.Tensor):
                assert same_layout(a, e), f"result {i}: strides {a.stride()} != {e.stride()}"
        captured.changed = changed
        return captured


@pytest.fixture
def rewrite():
    return Rewriter()


@pytest.fixture
def capture_graph():
    return capture


@pytest.fixture
def targets_of():
    return call_targets
