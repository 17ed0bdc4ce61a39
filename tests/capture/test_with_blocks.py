"""`with torch.no_grad()` / `enable_grad()` / `set_grad_enabled()` captured inside the graph."""

import pytest
import torch

import framejit
from framejit.testing import assert_close_to_eager


def no_grad_block(x, w):
    with torch.no_grad():
        y = x @ w
    z = (y * x.sum()).relu()
    with torch.enable_grad():
        q = z * 2
    return y + 1, z, q, torch.is_grad_enabled()


def set_grad_block(x):
    with torch.set_grad_enabled(False):
        a = x * 2
    return a, x * 3


def return_inside(x):
    with torch.no_grad():
        return x.view(-1, 7) * 2


@pytest.mark.parametrize("fn, make", [
    (no_grad_block, lambda: (torch.randn(3, 3, requires_grad=True), torch.randn(3, 3, requires_grad=True))),
    (set_grad_block, lambda: (torch.randn(4, requires_grad=True),)),
    (return_inside, lambda: (torch.randn(7, 2, requires_grad=True),)),
])
def test_grad_mode_blocks_are_one_graph_with_eager_requires_grad(stats, fn, make):
    args = make()
    actual = framejit.compile(fn)(*args)
    expected = fn(*args)
    assert_close_to_eager(actual, expected)
    flat = actual if isinstance(actual, tuple) else (actual,)
    ref = expected if isinstance(expected, tuple) else (expected,)
    for a, b in zip(flat, ref):
        if isinstance(a, torch.Tensor):
            assert a.requires_grad == b.requires_grad
    assert (stats.graphs, stats.graph_breaks, stats.eager_frames) == (1, 0, 0)
    assert torch.is_grad_enabled()


def test_error_inside_a_no_grad_graph_restores_grad_mode(stats):
    compiled = framejit.compile(return_inside)
    compiled(torch.randn(7, 2))
    # Same kind of input for the guards, but the entry's graph raises inside the block.
    bad = torch.randn(7, 2)
    compiled_graph_input = bad.as_strided((7, 2), (2, 1))
    assert_close_to_eager(compiled(compiled_graph_input), return_inside(compiled_graph_input))
    with pytest.raises(RuntimeError):
        compiled(torch.randn(3, 3))  # a new shape: recaptured, fails like eager
    assert torch.is_grad_enabled()


def test_grad_mode_change_outliving_the_function_is_not_captured(stats):
    def f(x):
        torch.set_grad_enabled(False)
        return x * 2

    try:
        out = framejit.compile(f)(torch.randn(2, requires_grad=True))
        assert not out.requires_grad
        assert not torch.is_grad_enabled()  # the user's change persists, as in eager
    finally:
        torch.set_grad_enabled(True)
    assert stats.graphs == 0 or stats.graph_breaks + stats.eager_frames >= 1


def test_backward_through_graph_after_no_grad_block(stats):
    def f(x, w):
        with torch.no_grad():
            scale = x.abs().max()
        return ((x @ w) / scale).sum()

    x = torch.randn(3, 3, requires_grad=True)
    w = torch.randn(3, 3, requires_grad=True)
    framejit.compile(f)(x, w).backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    f(x, w).backward()
    assert_close_to_eager((gx, gw), (x.grad, w.grad))
