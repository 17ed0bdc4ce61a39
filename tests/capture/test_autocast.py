"""``with torch.autocast(...)`` captured inside the graph: eager's dtypes, the state restored
after the call (and after an error), breaks inside the block, and autocast entered by the caller."""

import pytest
import torch

import framejit
from framejit.testing import RecordingBackend, assert_close_to_eager

BF16 = torch.bfloat16


def r(*shape):
    return torch.randn(*shape)


def matmul_block(x, w):
    with torch.autocast("cpu", dtype=BF16):
        y = x @ w
        z = torch.softmax(y, -1) + torch.cat([y, y]).sum(0)
        if y.dtype == BF16:  # folded from the captured dtype
            z = z * 2
    return z.float() + 1, y, torch.is_autocast_enabled("cpu")


def nested_blocks(x, w):
    with torch.autocast("cpu", dtype=BF16):
        a = x @ w
        with torch.autocast("cpu", enabled=False):
            b = x @ w  # float32 again
            inner = torch.is_autocast_enabled("cpu")
        c = a @ w
    return a, b, c, inner


def legacy_cpu_amp(x, w):
    with torch.cpu.amp.autocast(dtype=BF16):
        return torch.nn.functional.linear(x, w).relu()


def module_under_autocast(x, lin):
    with torch.autocast(device_type="cpu", dtype=BF16, cache_enabled=False):
        h = lin(x)
    return h, h.float().sum()


def queries_inside(x):
    with torch.autocast("cpu", dtype=BF16) as ac:
        n = torch.is_autocast_enabled("cpu") + (torch.get_autocast_dtype("cpu") is BF16)
        same = ac.fast_dtype is BF16
    return x * n + same


CASES = [
    (matmul_block, lambda: (r(4, 8), r(8, 8))),
    (nested_blocks, lambda: (r(4, 4), r(4, 4))),
    (legacy_cpu_amp, lambda: (r(3, 4), r(5, 4))),
    (module_under_autocast, lambda: (r(3, 4), torch.nn.Linear(4, 6))),
    (queries_inside, lambda: (r(3),)),
]


@pytest.mark.filterwarnings("ignore::FutureWarning")  # torch.cpu.amp.autocast is deprecated
@pytest.mark.parametrize("fn, make_args", CASES, ids=[c[0].__name__ for c in CASES])
def test_autocast_blocks_are_one_graph_with_eager_dtypes(check, fn, make_args):
    check(fn, *make_args())  # compares dtypes too
    assert not torch.is_autocast_enabled("cpu")


def test_autocast_entered_by_the_caller(stats, recorder):
    """Called inside the caller's autocast block, ops get autocast's dtypes (and the answer is
    recaptured when called outside one)."""
    def f(x, w):
        y = x @ w
        return y, y.dtype == BF16

    compiled = framejit.compile(f, backend=recorder)
    x, w = r(3, 4), r(4, 4)
    with torch.autocast("cpu", dtype=BF16):
        got, expected = compiled(x, w), f(x, w)
    assert got[0].dtype == BF16 and got[1] is True
    assert_close_to_eager(got, expected)
    got = compiled(x, w)
    assert got[0].dtype == torch.float32 and got[1] is False
    assert stats.recompiles == 1 and "autocast" in stats.recompile_reasons[0][1]


def matmul_block_in_place(x, w):
    x.mul_(2)  # changes an input: running the frame again would not be what eager does
    return matmul_block(x, w)


@pytest.mark.parametrize("fn", [matmul_block, matmul_block_in_place])
def test_error_in_the_graph_leaves_the_block(fn):
    def failing(gm, example_inputs):
        def run(*args):
            gm(*args)  # enters the block
            raise RuntimeError("kernel failed")
        return run

    compiled = framejit.compile(fn, backend=failing)
    x, w = r(4, 8), r(8, 8)
    if fn is matmul_block:
        # The graph changed nothing outside: the frame runs again as plain Python.
        assert_close_to_eager(compiled(x, w), fn(x, w))
    else:
        with pytest.raises(RuntimeError, match="kernel failed"):
            compiled(x, w)
    assert not torch.is_autocast_enabled("cpu")
    assert torch.get_autocast_dtype("cpu") == BF16  # the default, as before
    # nesting is back to 0: entering and leaving a block again clears the cast cache as eager does
    with torch.autocast("cpu"):
        pass
    assert torch.autocast_increment_nesting() == 1
    torch.autocast_decrement_nesting()


def break_inside(x, w):
    with torch.autocast("cpu", dtype=BF16):
        y = x @ w
        print("inside the block")
        z = (y @ w).relu()
    return z.float() + 1, y, z


def break_in_loop_inside(x, w):
    with torch.autocast("cpu", dtype=BF16):
        for i in range(2):
            x = x @ w
            print("step", i)
    return x, x.float() @ w


@pytest.mark.parametrize("fn, breaks, recompiles, printed", [
    (break_inside, 1, 0, "inside the block\n"),
    # the resume function in the loop sees 1 then 0 items left: one recompile, then cached
    (break_in_loop_inside, 2, 1, "step 0\nstep 1\n"),
])
def test_graph_break_inside_an_autocast_block(stats, capsys, fn, breaks, recompiles, printed):
    backend = RecordingBackend()
    compiled = framejit.compile(fn, backend=backend)
    x, w = r(4, 4), r(4, 4)
    for _ in range(3):
        assert_close_to_eager(compiled(x, w), fn(x, w))
        assert not torch.is_autocast_enabled("cpu")
    assert stats.graph_breaks == breaks and stats.eager_frames == 0
    assert stats.recompiles == recompiles
    assert capsys.readouterr().out == printed * 6


def test_error_at_the_break_leaves_the_block(stats):
    def f(x, w):
        with torch.autocast("cpu", dtype=BF16):
            y = x @ w
            if w.shape[0] == 4:
                print(1 / 0)
            y = y @ w
        return y

    with pytest.raises(ZeroDivisionError):
        framejit.compile(f)(r(4, 4), r(4, 4))
    assert not torch.is_autocast_enabled("cpu")


def test_error_in_the_resumed_graph_leaves_the_block(stats):
    def f(x, w):
        with torch.autocast("cpu", dtype=BF16):
            y = x @ w
            print("between")
            y = y @ w  # fails for a non-square w, after the break
        return y

    compiled = framejit.compile(f)
    compiled(r(2, 3), r(3, 3))
    with pytest.raises(RuntimeError):
        compiled(r(2, 3), r(3, 4))
    assert not torch.is_autocast_enabled("cpu")
    assert torch.autocast_increment_nesting() == 1
    torch.autocast_decrement_nesting()


def test_break_inside_autocast_under_fullgraph_names_the_line():
    with pytest.raises(framejit.GraphBreakError, match=r"print\(\)") as info:
        framejit.compile(break_inside, fullgraph=True)(r(4, 4), r(4, 4))
    assert "test_autocast.py" in str(info.value) and 'print("inside the block")' in str(info.value)
    assert not torch.is_autocast_enabled("cpu")
