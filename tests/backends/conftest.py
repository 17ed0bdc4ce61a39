import pytest
import torch

from framejit import compiler
from framejit.backends import eager, registry
from framejit.fx_ir import Graph, GraphModule


@pytest.fixture(autouse=True)
def restore_registry():
    """Backends registered by a test are removed after it. These tests are about the native
    built-ins, so they see them even where FRAMEJIT_TEST_BACKEND=fx routes them through torch.fx."""
    registry.list_backends()  # make sure the built-ins are in the snapshot
    saved = dict(registry._REGISTRY)
    registry.register_backend("eager", eager.eager, replace=True)
    registry.register_backend("default", compiler.default_backend, replace=True)
    yield
    registry._REGISTRY.clear()
    registry._REGISTRY.update(saved)


@pytest.fixture
def small_gm():
    """relu(x @ w) + b with b a get_attr constant."""
    g = Graph()
    x = g.placeholder("x")
    w = g.placeholder("w")
    b = g.get_attr("b")
    mm = g.call_function(torch.matmul, (x, w))
    g.output(g.call_function(torch.add, (g.call_function(torch.relu, (mm,)), b)))
    return GraphModule({"b": torch.randn(3)}, g)
