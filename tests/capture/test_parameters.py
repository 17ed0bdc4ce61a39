"""Walking a module's parameters and submodules inside the compiled function: ``parameters()``,
``named_parameters()``, ``modules()``. Their memos are sets of modules and of parameters, held
by identity: a parameter shared by two layers is seen once, as in eager, and which parameters
are one object is guarded."""

import pytest
import torch
from torch import nn

import framejit
from framejit.testing import assert_close_to_eager


def l2(model):
    def f(x):
        return model(x).sum() + 0.01 * sum(p.pow(2).sum() for p in model.parameters())

    return f


def test_sum_over_parameters_is_one_graph(stats):
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(3, 4)
    assert_close_to_eager(framejit.compile(l2(model))(x), l2(model)(x))
    assert stats.graphs == 1 and stats.graph_breaks == 0 and stats.eager_frames == 0


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4, bias=False)
        self.b = nn.Linear(4, 4, bias=False)

    def forward(self, x):
        return self.b(self.a(x))


def test_a_shared_parameter_is_counted_once_and_tying_later_recompiles(stats):
    model = Tied()
    compiled = framejit.compile(lambda x: [n for n, _ in model.named_parameters()])
    assert compiled(torch.ones(1)) == ["a.weight", "b.weight"]
    model.b.weight = model.a.weight  # tie them: named_parameters() now drops b.weight
    assert compiled(torch.ones(1)) == ["a.weight"]
    assert stats.recompiles == 1
    assert "now the same object" in stats.recompile_reasons[0][1]
    model.b.weight = nn.Parameter(torch.randn(4, 4))  # untie: the first version fits again
    assert compiled(torch.ones(1)) == ["a.weight", "b.weight"]
    assert stats.recompiles == 1


def test_modules_walk_and_a_set_of_modules(stats):
    model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.ReLU(), nn.Linear(2, 2)))

    @framejit.compile
    def f(x):
        seen = {model[0]}
        kinds = [type(m).__name__ for m in model.modules() if m not in seen]
        return model(x), kinds

    out, kinds = f(torch.randn(3, 2))
    assert kinds == ["Sequential", "Sequential", "ReLU", "Linear"]
    assert stats.graph_breaks == 0 and stats.eager_frames == 0


def test_a_set_of_tensors_returned_runs_as_python_and_says_why(stats):
    w = torch.randn(2)

    @framejit.compile
    def f(x):
        return x + 1, {w}

    y, s = f(torch.ones(2))
    assert s == {w}
    assert stats.eager_frames + stats.graph_breaks == 1
    reasons = stats.fallback_reasons + stats.break_reasons
    assert "a set of tensors that outlives the compiled function" in reasons[0][1]


@pytest.mark.parametrize("foreach", [None, True])
def test_clip_grad_norm_matches_eager(foreach, stats):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2).double())
    grads = [torch.randn_like(p) * 10 for p in model.parameters()]

    def clip(_):
        return torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=foreach)

    def set_grads():
        for p, g in zip(model.parameters(), grads):
            p.grad = g.clone()

    set_grads()
    expected_norm = clip(None)
    expected = [p.grad.clone() for p in model.parameters()]
    set_grads()
    norm = framejit.compile(clip)(torch.ones(1))
    assert_close_to_eager(norm, expected_norm)
    for p, want in zip(model.parameters(), expected):
        torch.testing.assert_close(p.grad, want)
    assert stats.graph_breaks == 0 and stats.eager_frames == 0
