"""Graph breaks: a frame split at an unsupported instruction, the rest captured in resume
functions. Every case is compared with eager; the counts of graphs, breaks and captures are
asserted, and a second call must reuse everything."""

import copy
import logging

import pytest
import torch
from torch import nn

import framejit
from framejit import _C
from framejit.capture import resume
from framejit.testing import assert_close_to_eager


def run_twice(fn, *args):
    """Compile ``fn``; call it twice on copies of ``args`` and compare both with eager."""
    compiled = framejit.compile(fn)
    first = compiled(*copy.deepcopy(args))
    assert_close_to_eager(first, fn(*copy.deepcopy(args)))
    return compiled


def test_print_splits_into_two_graphs(stats, capsys):
    def f(x, w):
        y = torch.relu(x @ w)
        print("shape", tuple(y.shape))
        return (y * 2).sum(-1)

    x, w = torch.randn(3, 4), torch.randn(4, 5)
    compiled = run_twice(f, x, w)
    assert capsys.readouterr().out == "shape (3, 5)\n" * 2
    assert (stats.graphs, stats.graph_breaks, stats.eager_frames) == (2, 1, 0)
    captured = stats.captured
    assert_close_to_eager(compiled(x, w), f(x, w))
    assert stats.captured == captured


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_if_on_tensor_takes_the_branch_eager_takes(stats, sign):
    def f(x):
        y = x * 2
        if y.sum() > 0:
            y = y + 1
        else:
            y = y - 1
        return y * 3

    x = torch.ones(4) * sign
    compiled = run_twice(f, x)
    assert stats.graph_breaks == 1 and stats.eager_frames == 0
    # The other branch is captured when it is first taken.
    assert_close_to_eager(compiled(-x), f(-x))
    assert stats.graphs == 3  # before the if, and each branch


def test_break_in_loop_reuses_one_resume_function(stats):
    def f(x):
        for _ in range(5):
            x = x + 1
            print(end="")
            x = x * 2
        return x

    compiled = run_twice(f, torch.ones(2))
    assert stats.graph_breaks == 5 and stats.eager_frames == 0
    # One resume code object for the whole loop (cached per code location).
    assert len(resume._resume_cache[f.__code__]) == 1
    captured = stats.captured
    assert_close_to_eager(compiled(torch.ones(2)), f(torch.ones(2)))
    assert stats.captured == captured


def test_break_in_loop_with_live_iterator_keeps_unrolling(stats):
    def f(x):
        total = x
        for k in [1.0, 2.0, 3.0]:
            total = total + k
            scale = total.sum().item()
            total = total / scale
        return total, scale

    run_twice(f, torch.rand(3) + 1)
    assert stats.graph_breaks == 3 and stats.eager_frames == 0


def test_break_with_a_pending_call(stats):
    def f(x):
        return torch.full((2,), x.sum().item()) + x.mean()

    run_twice(f, torch.randn(4))
    assert stats.graph_breaks == 1 and stats.eager_frames == 0


def helper_that_prints(t):
    print(end="")
    return t * 2


def test_break_inside_inlined_call_moves_to_the_call_site(stats, caplog):
    def outer(x):
        y = x + 1
        z = helper_that_prints(y)
        return z - 1

    with caplog.at_level(logging.INFO, logger="framejit.graph_breaks"):
        compiled = run_twice(outer, torch.randn(3))  # (its entries live as long as it does)
    # outer breaks at the call; the helper itself is then compiled as its own frame and breaks
    # at its print.
    assert stats.graph_breaks == 2 and stats.eager_frames == 0
    assert "print()" in caplog.text and "called from" in caplog.text
    assert len(_C.get_cache_entries(helper_that_prints.__code__)) == 1
    del compiled


class Logged(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.seen = []

    def forward(self, x):
        h = torch.relu(self.a(x))
        self.seen.append(tuple(h.shape))
        return self.b(h)


def test_module_forward_with_side_effect_is_one_graph_and_mutates_like_eager(stats):
    model = Logged()
    reference = copy.deepcopy(model)
    compiled = framejit.compile(model)
    x = torch.randn(2, 4)
    for _ in range(2):
        assert_close_to_eager(compiled(x), reference(x))
    assert model.seen == reference.seen == [(2, 4), (2, 4)]
    # The append is replayed after the graph; the list's length is not guarded.
    assert (stats.graphs, stats.graph_breaks, stats.recompiles, stats.eager_frames) == (1, 0, 0, 0)


def test_resume_function_has_readable_name_and_user_lines(stats):
    def f(x):
        y = x * 2
        print(end="")
        return y.unknown_attribute  # raises AttributeError after the break, in the resume

    with pytest.raises(AttributeError) as info:
        framejit.compile(f)(torch.randn(2))
    names = [frame.name for frame in info.traceback]
    assert any(name.startswith("f_resume_at_line_") for name in names)
    assert info.traceback[-1].lineno + 1 == f.__code__.co_firstlineno + 3  # the user's line


def test_fullgraph_still_refuses_to_break(stats):
    def f(x):
        print(end="")
        return x

    with pytest.raises(framejit.GraphBreakError, match=r"print\(\)"):
        framejit.compile(f, fullgraph=True)(torch.randn(2))
    assert stats.graph_breaks == 0


def test_iterator_in_a_local_stays_an_iterator_across_a_break(stats):
    def f(x):
        it = iter([1.0, 2.0, 3.0])
        first = next(it)
        print(end="")  # break: `it` must still be an iterator afterwards
        second = next(it)
        return x * first + second, list(it)

    run_twice(f, torch.randn(3))
    # Correct results; the resume then holds a real iterator, which capture cannot follow yet, so
    # next()/list() on it are further breaks.
    assert stats.graph_breaks >= 1 and stats.eager_frames == 0
    assert "print()" in stats.break_reasons[0][1]


class Shown:
    def __repr__(self):
        return f"Shown({1 + 1})"


def prints_object(x, obj):
    print(obj)  # a break: print runs natively and calls Shown.__repr__ as a frame of its own
    return x + 1


def test_implicit_dunder_frames_are_not_captured_on_their_own(stats, capsys):
    framejit.compile(prints_object)(torch.ones(2), Shown())
    assert capsys.readouterr().out == "Shown(2)\n"
    assert _C.get_cache_entries(Shown.__repr__.__code__) == []
    assert _C.get_code_mode(Shown.__repr__.__code__) == _C.MODE_SKIP
