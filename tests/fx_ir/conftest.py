"""Graphs built by hand, shared by the fx_ir tests."""

import operator

import pytest
import torch

from framejit.fx_ir import Graph


def build_mlp() -> tuple[Graph, dict[str, torch.Tensor]]:
    """x @ w + b -> relu -> view -> transpose, returning two values; b comes from get_attr."""
    g = Graph()
    x = g.placeholder("x")
    w = g.placeholder("w")
    b = g.get_attr("linear.bias")
    mm = g.call_function(torch.matmul, (x, w))
    add = g.call_function(operator.add, (mm, b))
    relu = g.call_function(torch.relu, (add,))
    view = g.call_method("view", (relu, 2, -1))
    t = g.call_method("transpose", (view, 0, 1))
    g.output((t, relu))
    return g, {"linear.bias": torch.randn(8)}


def mlp_eager(x, w, bias):
    relu = torch.relu(torch.matmul(x, w) + bias)
    return relu.view(2, -1).transpose(0, 1), relu


@pytest.fixture
def mlp():
    torch.manual_seed(0)
    return build_mlp()


@pytest.fixture
def mlp_reference():
    """The eager computation of build_mlp's graph: (x, w, bias) -> outputs."""
    return mlp_eager
