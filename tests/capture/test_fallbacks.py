"""Constructs that cannot be put in a graph: the frame is split there (a graph break) with the same
results and the reason recorded, or runs as plain Python when it cannot be split; with
``fullgraph=True``, a GraphBreakError names the construct, the user's file:line and source line,
and a fix. Also exceptions, generators and recursion."""

import copy
import inspect
import os

import pytest
import torch
from torch import nn

import framejit
from framejit import _C
from framejit.capture import compat
from framejit.testing import assert_close_to_eager

THIS_FILE = os.path.realpath(__file__)


def line_of(fn, marker="# <- break"):
    """The line number of the line of ``fn`` holding ``marker``."""
    lines, start = inspect.getsourcelines(fn)
    for i, text in enumerate(lines):
        if marker in text:
            return start + i
    raise AssertionError(f"no {marker!r} in {fn.__name__}")


# -- the constructs ---------------------------------------------------------------------------------

def with_print(x):
    y = x * 2
    print("y is ready")  # <- break
    return y + 1


def with_tensor_if(x):
    if x.sum() > 0:  # <- break
        return x * 2
    return x - 1


def with_item(x):
    scale = x.item()  # <- break
    return x * scale


def with_tolist(x):
    values = x.tolist()  # <- break
    return torch.tensor(values) * 2


def with_inference_mode(x, w):
    with torch.inference_mode():  # <- break
        y = x @ w
    return y + 1


@framejit.disable
def disabled_helper(t):
    return t * 3


def with_disabled_call(x):
    y = x + 1
    return disabled_helper(y)  # <- break


class Counter(nn.Module):
    def __init__(self):
        super().__init__()
        self.count = 0
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        self.count = self.count + 1  # <- break
        return self.fc(x)


def counter_forward(module, x):
    return module(x)


# (name, function, make_args, words of the construct in the message, frames run as plain Python:
# the inference_mode block's resume function starts at its `with`, which is not captured yet)
FALLBACKS = [
    ("print", with_print, lambda: (torch.randn(3, 4),), "print()", 0),
    ("tensor_if", with_tensor_if, lambda: (torch.randn(3, 4),), "if tensor:", 0),
    ("item", with_item, lambda: (torch.randn(()),), "x.item()", 0),
    ("tolist", with_tolist, lambda: (torch.randn(3),), "x.tolist()", 0),
    ("inference_mode", with_inference_mode, lambda: (torch.randn(3, 4), torch.randn(4, 2)),
     "with torch.inference_mode()", 1),
    ("disabled_call", with_disabled_call, lambda: (torch.randn(3, 4),), "framejit.disable", 0),
]
_ids = [case[0] for case in FALLBACKS]


@pytest.mark.parametrize("name, fn, make_args, construct, eager_frames", FALLBACKS, ids=_ids)
def test_graph_break_splits_the_frame(stats, capsys, name, fn, make_args, construct, eager_frames):
    args = make_args()
    eager_args = copy.deepcopy(args)
    expected = fn(*eager_args)
    eager_out = capsys.readouterr().out

    compiled = framejit.compile(fn)
    actual = compiled(*args)
    assert_close_to_eager(actual, expected)
    assert_close_to_eager(list(args), list(eager_args))  # same mutations (e.g. self.count)
    assert capsys.readouterr().out == eager_out  # print() really ran, once
    assert stats.graph_breaks == 1
    assert stats.eager_frames == eager_frames
    assert len(_C.get_cache_entries(fn.__code__)) == 1  # the frame itself is compiled, split
    ((where, message),) = stats.break_reasons
    assert fn.__name__ in where
    assert construct in message
    assert f"{THIS_FILE}:{line_of(fn)}" in message

    # Later calls of the same kind reuse everything: no new capture, no new break.
    captured = stats.captured
    expected = fn(*copy.deepcopy(args))
    assert_close_to_eager(compiled(*args), expected)
    assert stats.captured == captured and stats.graph_breaks == 1


def print_inside_try(x):
    y = x * 2
    try:
        print("y is ready")  # <- break
    finally:
        y = y + 1
    return y


def test_break_inside_try_falls_back_to_plain_python(stats, capsys):
    x = torch.randn(3)
    compiled = framejit.compile(print_inside_try)
    assert_close_to_eager(compiled(x), print_inside_try(x))
    assert capsys.readouterr().out == "y is ready\n" * 2
    assert stats.graph_breaks == 0 and stats.eager_frames == 1
    assert _C.get_cache_entries(print_inside_try.__code__) == []
    ((where, message),) = stats.fallback_reasons
    assert "print()" in message and f"{THIS_FILE}:{line_of(print_inside_try)}" in message
    # The decision sticks: the next call runs as plain Python without trying again.
    compiled(x)
    assert stats.eager_frames == 1 and len(stats.fallback_reasons) == 1


@pytest.mark.parametrize("name, fn, make_args, construct, eager_frames", FALLBACKS, ids=_ids)
def test_fullgraph_raises_graph_break_error(stats, name, fn, make_args, construct, eager_frames):
    compiled = framejit.compile(fn, fullgraph=True)
    with pytest.raises(framejit.GraphBreakError) as info:
        compiled(*make_args())
    message = str(info.value)
    assert construct in message
    assert f"{THIS_FILE}:{line_of(fn)}" in message
    # The source line itself is quoted.
    source_line = inspect.getsourcelines(fn)[0][line_of(fn) - inspect.getsourcelines(fn)[1]]
    assert source_line.split("# <- break")[0].strip() in message
    assert "fix" in message
    assert fn.__name__ in message
    # No internal class names leak into the message.
    for internal in ("TensorValue", "ConstantValue", "ModuleValue", "Unsupported"):
        assert internal not in message


def reads_item(t):
    return t.item()  # <- break


def calls_reads_item(x):
    return reads_item(x * 2) + 1  # <- call site


def test_fullgraph_error_names_inlined_call_site():
    with pytest.raises(framejit.GraphBreakError) as info:
        framejit.compile(calls_reads_item, fullgraph=True)(torch.randn(()))
    message = str(info.value)
    assert f"{THIS_FILE}:{line_of(reads_item)}" in message
    assert f"called from {THIS_FILE}:{line_of(calls_reads_item, '# <- call site')}" in message


def test_module_attribute_assignment_is_replayed_without_recompiling(stats):
    model = Counter()
    reference = copy.deepcopy(model)
    compiled = framejit.compile(model)
    x = torch.randn(2, 4)
    for _ in range(3):
        assert_close_to_eager(compiled(x), reference(x))
    assert model.count == 3 == reference.count
    # self.count + 1 is computed when the function runs: one graph, no break, no recompile.
    assert (stats.graphs, stats.graph_breaks, stats.recompiles, stats.eager_frames) == (1, 0, 0, 0)


# -- exceptions -------------------------------------------------------------------------------------

def _raised(fn, *args):
    with pytest.raises(Exception) as info:
        fn(*args)
    return info.value


def gather(x, idx):
    return x[idx] * 2


def test_runtime_error_in_captured_graph_propagates_like_eager(stats):
    compiled = framejit.compile(gather)
    x = torch.randn(5, 3)
    good = torch.tensor([0, 4, 2])
    assert_close_to_eager(compiled(x, good), gather(x, good))
    assert stats.captured == 1

    bad = torch.tensor([0, 7, 2])  # same kind of tensor: the cached graph runs, and raises
    expected = _raised(gather, x, bad)
    actual = _raised(compiled, x, bad)
    assert type(actual) is type(expected)
    assert str(actual) == str(expected)
    assert stats.captured == 1 and stats.eager_frames == 0


def matmul_then_relu(a, b):
    return torch.relu(a @ b)


def test_shape_mismatch_after_capture_propagates_like_eager(stats):
    compiled = framejit.compile(matmul_then_relu)
    compiled(torch.randn(2, 3), torch.randn(3, 4))
    assert stats.captured == 1
    a, b = torch.randn(2, 3), torch.randn(5, 4)
    expected = _raised(matmul_then_relu, a, b)
    actual = _raised(compiled, a, b)
    assert type(actual) is type(expected)
    assert str(actual) == str(expected)


def check_positive(x):
    if (x < 0).any():
        raise ValueError(f"negative input of shape {tuple(x.shape)}")
    return x.sqrt()


def test_exception_in_fallback_frame_propagates_like_eager(stats):
    compiled = framejit.compile(check_positive)
    x = torch.tensor([1.0, -2.0])
    expected = _raised(check_positive, x)
    actual = _raised(compiled, x)
    assert type(actual) is ValueError and str(actual) == str(expected)
    # Breaks at the tensor condition, then the resume function's `raise` runs natively after
    # its (empty) graph: nothing runs wholly eager.
    assert stats.graph_breaks == 2 and stats.eager_frames == 0
    y = torch.tensor([4.0, 9.0])
    assert_close_to_eager(compiled(y), check_positive(y))


def raise_on_flag(x, fail):
    y = x + 1
    if fail:
        raise KeyError("asked to fail")
    return y


def test_raise_statement_in_compiled_function(stats):
    compiled = framejit.compile(raise_on_flag)
    x = torch.randn(3)
    assert_close_to_eager(compiled(x, False), raise_on_flag(x, False))
    expected = _raised(raise_on_flag, x, True)
    actual = _raised(compiled, x, True)
    assert type(actual) is KeyError and str(actual) == str(expected)
    # The raising path is split at the exception's construction (runs natively, then raises);
    # a fresh call of the good kind still hits the first entry.
    assert stats.captured == 2 and stats.graph_breaks == 1
    assert_close_to_eager(compiled(x, False), raise_on_flag(x, False))
    assert stats.captured == 2


# -- generators and recursion -----------------------------------------------------------------------

def powers(x, n):
    for i in range(n):
        yield x ** i


def test_compiled_generator_runs_eagerly(stats):
    compiled = framejit.compile(powers)
    x = torch.randn(3)
    actual = list(compiled(x, 4))
    assert_close_to_eager(actual, list(powers(x, 4)))
    assert stats.captured == 0 and stats.graphs == 0


def item_in_comprehension(x):
    y = x * 2
    return y + sum([t.item() for t in y])


def test_graph_break_inside_a_comprehension_runs_the_frame_as_python(stats):
    x = torch.randn(3)
    assert_close_to_eager(framejit.compile(item_in_comprehension)(x), item_in_comprehension(x))
    assert stats.graphs == 0 and stats.eager_frames >= 1
    reasons = " ".join(message for _, message in stats.fallback_reasons)
    assert "tensor.item()" in reasons
    if compat.PY312_PLUS:
        # Inlined in the function (PEP 709): the handler that puts its variable back is no `try`.
        assert "a graph break inside a list, set or dict comprehension" in reasons
        assert "`try`" not in reasons


CLOSED = []


def in_try_finally(x):
    try:
        yield x
        yield x * 2
    finally:
        CLOSED.append("inner")


def delegates(x):
    yield from in_try_finally(x)


def closes_delegating(x):
    g = delegates(x)
    first = next(g)
    g.close()  # closes in_try_finally() too, which runs its `finally` block
    return first + 1


def test_closing_a_generator_that_delegates_to_one_in_try_runs_its_finally(stats):
    x = torch.randn(3)
    expected = closes_delegating(x)
    assert CLOSED == ["inner"]
    CLOSED.clear()
    assert_close_to_eager(framejit.compile(closes_delegating)(x), expected)
    assert CLOSED == ["inner"]
    assert stats.eager_frames == 1
    (reason,) = [message for _, message in stats.fallback_reasons]
    assert "closing the generator in_try_finally() while it is paused inside a `try` block" in reason


def first_item_only(x):
    it = in_try_finally(x)
    return next(it) + 1  # `it` is dropped on return: Python closes it, which runs its `finally`


def returns_from_the_loop(x):
    for t in in_try_finally(x):
        return t * 2


@framejit.disable
def opaque(t):
    return t * 3


def breaks_after_leaving_the_loop(x):
    for t in in_try_finally(x):
        y = t * 2
        break  # the generator is dropped here, and closed
    return opaque(y) + 1


@pytest.mark.parametrize("fn, words", [
    (first_item_only, "leaving the generator in_try_finally() paused inside a `try` block"),
    (returns_from_the_loop, "leaving the generator in_try_finally() paused inside a `try` block"),
    (breaks_after_leaving_the_loop, "a graph break while the generator in_try_finally() is paused"),
])
def test_generator_left_paused_in_try_runs_the_frame_as_python(stats, fn, words):
    # Its `finally` block runs when Python drops it: the capture cannot replay that.
    x = torch.randn(3)
    CLOSED.clear()
    expected = fn(x)
    assert CLOSED == ["inner"]
    CLOSED.clear()
    assert_close_to_eager(framejit.compile(fn)(x), expected)
    assert CLOSED == ["inner"]
    assert stats.graphs == 0 and stats.eager_frames == 1
    (reason,) = [message for _, message in stats.fallback_reasons]
    assert words in reason


@framejit.compile
def compiled_factorial(x, n):
    if n <= 1:
        return x
    return compiled_factorial(x, n - 1) * n


def eager_factorial(x, n):
    return x if n <= 1 else eager_factorial(x, n - 1) * n


def test_recursion_of_compiled_function(stats):
    x = torch.randn(3)
    assert_close_to_eager(compiled_factorial(x, 5), eager_factorial(x, 5))
    assert stats.eager_frames == 0
    assert stats.captured == 1 and stats.graphs == 1


def test_deep_recursion_of_compiled_function_breaks_at_the_call(stats):
    x = torch.randn(3)
    with pytest.warns(UserWarning, match="recompile_limit=8"):
        assert_close_to_eager(compiled_factorial(x, 100), eager_factorial(x, 100))
    # Inlining stops at the depth limit; the recursive call then runs as a call (a graph break),
    # and deeper frames recompile up to the recompile limit, then run as plain Python.
    assert stats.graph_breaks >= 1
    assert any("nested" in message for _, message in stats.break_reasons)
