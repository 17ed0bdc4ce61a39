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


def _assert_same_requires_grad(actual, expected):
    flat = actual if isinstance(actual, tuple) else (actual,)
    ref = expected if isinstance(expected, tuple) else (expected,)
    for a, b in zip(flat, ref):
        if isinstance(a, torch.Tensor):
            assert a.requires_grad == b.requires_grad


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
    _assert_same_requires_grad(actual, expected)
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


# -- graph breaks inside grad-mode `with` blocks ----------------------------------------------------
#
# The frame is split inside the block: the graph so far leaves grad mode as the block set it, the
# unsupported line runs natively (an exception there still leaves the block), and the resume
# function's code leaves the block when it ends.

def print_inside_no_grad(x, w):
    y = x @ w
    with torch.no_grad():
        z = y * 2
        print("inside the block")
        z = z + 1
    return y.sum() + z.sum(), z, torch.is_grad_enabled()


def branch_inside_no_grad(x, w):
    y = x @ w
    with torch.no_grad():
        z = y * 2
        if z.sum() > 0:
            z = z + 1
        else:
            z = z - 1
    return y + z


def nested_blocks_with_break(x, w):
    with torch.no_grad():
        a = x @ w
        with torch.enable_grad():
            b = x @ w
            print("nested")
            c = b * 2
        d = a + 1
    return a, b, c, d, torch.is_grad_enabled()


def loop_break_inside_set_grad(x, w):
    out = x
    with torch.set_grad_enabled(False):
        for i in range(3):
            out = out @ w
            print("step", i)
    return out, out.requires_grad


def _grad_cases():
    def leaf():
        return torch.randn(3, 3, requires_grad=True)

    return [
        (print_inside_no_grad, lambda: (torch.randn(2, 3), leaf()), 1),
        (branch_inside_no_grad, lambda: (torch.randn(2, 3), leaf()), 1),
        (nested_blocks_with_break, lambda: (torch.randn(3, 3), leaf()), 1),
        (loop_break_inside_set_grad, lambda: (torch.randn(2, 3), leaf()), 3),
    ]


@pytest.mark.parametrize("fn, make, breaks", _grad_cases(), ids=[c[0].__name__ for c in _grad_cases()])
def test_graph_break_inside_grad_mode_block(stats, fn, make, breaks, capsys):
    args = make()
    expected = fn(*args)
    compiled = framejit.compile(fn)
    actual = compiled(*args)
    assert_close_to_eager(actual, expected)
    _assert_same_requires_grad(actual, expected)
    assert stats.eager_frames == 0, stats.fallback_reasons
    assert stats.graph_breaks == breaks
    assert torch.is_grad_enabled()
    # A second call reuses the split frame and its resume functions.
    captured = stats.captured
    assert_close_to_eager(compiled(*args), expected)
    assert stats.captured == captured
    assert torch.is_grad_enabled()


def test_exception_at_a_break_inside_a_block_leaves_the_block(stats):
    def f(x, text):
        with torch.no_grad():
            y = x * 2
            n = int(text)  # a ValueError for "boom", raised by the natively run line
        return y + n

    compiled = framejit.compile(f)
    x = torch.randn(3, requires_grad=True)
    assert_close_to_eager(compiled(x, "3"), f(x, "3"))
    with pytest.raises(ValueError, match="boom"):
        compiled(x, "boom")
    assert torch.is_grad_enabled()
    assert stats.eager_frames == 0


def test_error_in_resumed_graph_leaves_the_block(stats):
    def f(x, w):
        with torch.no_grad():
            y = x * 2
            print("split here")
            z = y @ w  # fails for a w of the wrong shape, inside the resume function's graph
        return z

    compiled = framejit.compile(f)
    compiled(torch.randn(2, 3), torch.randn(3, 3))
    with pytest.raises(RuntimeError):
        compiled(torch.randn(2, 3), torch.randn(4, 3))
    assert torch.is_grad_enabled()


def test_break_inside_try_inside_a_block_still_runs_the_frame_as_python(stats):
    def f(x):
        with torch.no_grad():
            try:
                print("in try")
                y = x * 2
            finally:
                y = x * 3
        return y

    x = torch.randn(3, requires_grad=True)
    assert_close_to_eager(framejit.compile(f)(x), f(x))
    assert stats.eager_frames == 1
    assert any("print()" in m for _, m in stats.fallback_reasons)
    assert torch.is_grad_enabled()


class Counter:
    """A user context manager whose __exit__ never swallows an exception."""

    def __init__(self):
        self.open = 0
        self.exits = []

    def __enter__(self):
        self.open += 1
        return 2

    def __exit__(self, exc_type, exc, tb):
        self.open -= 1
        self.exits.append(exc_type)


def break_in_user_block(x, c):
    with c as k:
        print("inside")
        y = x * k
    return y + c.open


def break_in_fresh_user_block(x):
    c = Counter()
    with c as k:
        print("inside")
        y = x * k
    return y, c.open, len(c.exits)


def test_break_inside_a_user_context_manager(stats, capsys):
    compiled = framejit.compile(break_in_user_block)
    c, eager_c = Counter(), Counter()
    x = torch.randn(3)
    for _ in range(2):
        assert_close_to_eager(compiled(x, c), break_in_user_block(x, eager_c))
    assert (c.open, c.exits) == (eager_c.open, eager_c.exits) == (0, [None, None])
    assert stats.graph_breaks == 1 and stats.eager_frames == 0 and stats.recompiles == 0
    assert capsys.readouterr().out == "inside\n" * 4

    x = torch.randn(3)
    assert_close_to_eager(framejit.compile(break_in_fresh_user_block)(x), break_in_fresh_user_block(x))
    assert stats.eager_frames == 0


def test_exception_at_a_break_inside_a_user_block_reaches_its_exit(stats):
    def f(x, c):
        with c:
            y = x * 2
            print(1 / 0)
        return y

    c = Counter()
    with pytest.raises(ZeroDivisionError):
        framejit.compile(f)(torch.randn(3), c)
    assert c.open == 0 and c.exits == [ZeroDivisionError]
    assert stats.graph_breaks == 1 and stats.eager_frames == 0


class Swallow(Counter):
    def __exit__(self, exc_type, exc, tb):
        super().__exit__(exc_type, exc, tb)
        return exc_type is ZeroDivisionError


@framejit.disable
def explode():
    raise ZeroDivisionError("from plain Python")


def test_break_inside_a_block_that_may_swallow_exceptions_runs_the_frame_as_python(stats):
    def f(x, c):
        y = x * 3
        with c:
            explode()
            y = x * 2
        return y

    c = Swallow()
    x = torch.randn(3)
    assert_close_to_eager(framejit.compile(f)(x, c), x * 3)  # swallowed, as in eager
    assert c.open == 0 and c.exits == [ZeroDivisionError]
    assert stats.eager_frames == 1
    assert any("may swallow exceptions" in m for _, m in stats.fallback_reasons)


def profiled_block(x):
    with torch.autograd.profiler.record_function("my_block"):
        y = x * 2
    return y + 1


def test_record_function_block_is_captured_and_guarded_on_the_profiler(stats, recorder):
    compiled = framejit.compile(profiled_block, backend=recorder)
    x = torch.randn(3)
    assert_close_to_eager(compiled(x), x * 2 + 1)
    assert recorder.graph_count == 1 and stats.graph_breaks == 0 and stats.eager_frames == 0
    with torch.autograd.profiler.profile() as prof:
        assert_close_to_eager(compiled(x), x * 2 + 1)
    # under a profiler the range must really be recorded: not the cached graph, and the frame
    # runs as Python with the block in the trace
    assert stats.recompiles == 1 and "_profiler_enabled" in stats.recompile_reasons[0][1]
    assert "my_block" in {e.name for e in prof.function_events}


def test_an_exit_that_raises_runs_once():
    # The raise inside the inlined __exit__ breaks the graph at the block's end; the native
    # call of __exit__ ran as if inside the block, whose handler left it a second time.
    log = []

    class Raising:
        def __enter__(self):
            log.append("enter")

        def __exit__(self, typ, val, tb):
            log.append(("exit", typ))
            raise KeyError("from exit")

    def f(x):
        with Raising():
            y = x * 2
        return y + 1

    for fn in (f, framejit.compile(f)):
        log.clear()
        with pytest.raises(KeyError):
            fn(torch.ones(2))
        assert log == ["enter", ("exit", None)]
