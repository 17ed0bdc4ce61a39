"""Reproducers of wrong answers found in outside code and random programs (issue 9, section 1):
each compares the compiled function with eager, across calls and changing inputs."""

import io
from contextlib import redirect_stdout

import pytest
import torch

import framejit

COUNTER = 0
LOG: list = []


def _set_counter(v):
    global COUNTER
    COUNTER = v


# -- 1. a number read from outside, then written back: the read is the value before the write --

def read_then_write(x):
    global COUNTER
    old = COUNTER
    COUNTER = COUNTER + 1
    return x + 1, old


def augmented_then_read(x):
    global COUNTER
    COUNTER += 1
    return x * 2, COUNTER


def write_then_print(x):
    global COUNTER
    COUNTER += 1
    print(COUNTER)
    return x - 1


@pytest.mark.parametrize("fn", [read_then_write, augmented_then_read, write_then_print])
def test_global_number_read_around_its_write(fn, stats):
    compiled = framejit.compile(fn)
    for start in (0, 5, 7):
        x = torch.randn(3)
        _set_counter(start)
        out = io.StringIO()
        with redirect_stdout(out):
            expected = fn(x)
        expected_counter, expected_out = COUNTER, out.getvalue()
        _set_counter(start)
        out = io.StringIO()
        with redirect_stdout(out):
            actual = compiled(x)
        assert COUNTER == expected_counter
        assert out.getvalue() == expected_out
        torch.testing.assert_close(actual, expected)
    assert stats.eager_frames == 0
    assert stats.recompiles == 0


def test_closure_cell_read_then_written(stats):
    def make():
        n = 3

        def f(x):
            nonlocal n
            old = n
            n = n + 2
            return x + old, n
        return f

    eager, compiled = make(), framejit.compile(make())
    for _ in range(3):
        x = torch.ones(2)
        torch.testing.assert_close(compiled(x), eager(x))
    assert stats.eager_frames == 0


def test_attribute_read_then_written(stats):
    class Counter:
        def __init__(self):
            self.step = 0

    def f(x, c):
        old = c.step
        c.step = c.step + 1
        return x * 2, old, c.step

    a, b = Counter(), Counter()
    compiled = framejit.compile(f)
    for _ in range(3):
        x = torch.ones(2)
        assert repr(compiled(x, a)) == repr(f(x, b))
        assert a.step == b.step
    assert stats.eager_frames == 0


# -- 3. exceptions raised by graph operations -------------------------------------------------

def cholesky_or_message(x):
    try:
        return torch.linalg.cholesky(x)
    except RuntimeError:
        return "not PD"


def test_graph_exception_caught_by_user_try(stats):
    compiled = framejit.compile(cholesky_or_message)
    assert compiled(-torch.eye(2)) == "not PD"
    pd = torch.eye(2) * 2
    torch.testing.assert_close(compiled(pd), cholesky_or_message(pd))
    assert compiled(-torch.eye(2)) == "not PD"
    assert stats.eager_frames == 0


def append_then_fail(x, lst):
    lst.append(len(lst))
    LOG.append("global")
    return torch.linalg.cholesky(x)


def test_side_effects_before_a_failing_graph_are_visible():
    compiled = framejit.compile(append_then_fail)
    for _ in range(2):
        got, want = [], []
        LOG.clear()
        with pytest.raises(RuntimeError):
            append_then_fail(-torch.eye(2), want)
        eager_log = list(LOG)
        LOG.clear()
        with pytest.raises(RuntimeError):
            compiled(-torch.eye(2), got)
        assert got == want and LOG == eager_log


def fail_then_print(x, lst):
    lst.append(1)
    y = torch.linalg.cholesky(x)
    print("after")
    return y + 1


def test_failing_graph_before_a_graph_break(stats):
    compiled = framejit.compile(fail_then_print)
    got = []
    out = io.StringIO()
    with redirect_stdout(out), pytest.raises(RuntimeError):
        compiled(-torch.eye(2), got)
    assert got == [1] and out.getvalue() == ""
    with redirect_stdout(out):
        torch.testing.assert_close(compiled(torch.eye(2), got), fail_then_print(torch.eye(2), []))
    assert got == [1, 1]
    assert stats.graph_breaks == 1


def test_failing_graph_with_keyword_and_star_arguments():
    def f(x, *rest, scale=1.0, **extra):
        try:
            return torch.linalg.cholesky(x * scale) + len(rest) + len(extra)
        except RuntimeError:
            return ("caught", rest, scale, sorted(extra))

    compiled = framejit.compile(f)
    assert compiled(-torch.eye(2), 1, 2, scale=2.0, k=3) == ("caught", (1, 2), 2.0, ["k"])
    torch.testing.assert_close(compiled(torch.eye(2), 1, scale=2.0), f(torch.eye(2), 1, scale=2.0))
