"""Reproducers of wrong answers about views, aliasing, module state and autograd state, found by
the fuzzer's aliasing statements (tests/fuzz/aliasing.py): each compares the compiled function
with eager, across calls."""

import pytest
import torch

import framejit

LIN = torch.nn.Linear(1, 1)


def _copy_grad_value_into_input(x):
    x.copy_(LIN(x.unsqueeze(-1)).squeeze(-1))
    return x.requires_grad, x.grad_fn is None, x.is_leaf


def test_input_that_an_in_place_op_gives_history_is_no_leaf(stats):
    """``x.copy_(w * 2)`` into an input that does not require grad gives it a grad_fn (CopyBackwards):
    it is no leaf. ``x.is_leaf`` and ``x.grad_fn is None`` read afterwards in the same graph said
    True, from the input's state on entry."""
    compiled = framejit.compile(_copy_grad_value_into_input)
    for shape in [(3, 4), (3, 4), (5, 2)]:
        x, y = torch.randn(shape), torch.randn(shape)
        y.copy_(x)
        expected = _copy_grad_value_into_input(x)
        assert compiled(y) == expected == (True, False, False)
        assert y.grad_fn is not None
        torch.testing.assert_close(y, x)


def _leaf_made_in_frame(x):
    t = (x + 1).requires_grad_()
    u = t * 2
    return t.is_leaf, t.grad_fn is None, u.is_leaf, u.grad_fn is None


def test_tensor_made_to_require_grad_in_the_frame_is_a_leaf(stats):
    """``t = (x + 1).requires_grad_()`` is a leaf: ``t.is_leaf`` read False, as for any result
    that requires grad; leafness is now read from the example, which runs the ops' autograd."""
    compiled = framejit.compile(_leaf_made_in_frame)
    x = torch.randn(3, 4)
    assert compiled(x) == _leaf_made_in_frame(x) == (True, True, False, False)


def _batch_norm_then_integer_division(bn, y, i):
    out = bn(y.reshape(-1, 1)).reshape(y.shape)
    try:
        i // (i * 0)
    except RuntimeError:
        pass
    return out


def _functional_batch_norm_then_integer_division(bn, y, i):
    out = torch.nn.functional.batch_norm(y.reshape(-1, 1), bn.running_mean, bn.running_var,
                                         training=True, momentum=0.5)
    return out, i // (i * 0)


@pytest.mark.parametrize("fn", [_batch_norm_then_integer_division, _functional_batch_norm_then_integer_division])
def test_running_stats_put_back_when_a_graph_raises(fn):
    """A graph that raised (an integer division by zero) is run again as plain Python, with the
    inputs it writes put back first; BatchNorm's running statistics, written by batch_norm (not
    an in-place op on its first argument), were not put back, so a training BatchNorm updated
    them twice per call (fuzzer program 6010000904)."""
    eager_bn, compiled_bn = torch.nn.BatchNorm1d(1), torch.nn.BatchNorm1d(1)
    compiled = framejit.compile(fn)
    for k in range(1, 4):
        y, i = torch.arange(4.0) * k, torch.ones(3, dtype=torch.long)
        for f, bn in ((fn, eager_bn), (compiled, compiled_bn)):
            try:
                f(bn, y, i)
            except RuntimeError:
                pass
        for name, buffer in eager_bn.named_buffers():
            torch.testing.assert_close(dict(compiled_bn.named_buffers())[name], buffer)


def _out_argument_then_caught_error(x, y, i):
    torch.add(x, y, out=y)
    try:
        i // (i * 0)
    except RuntimeError:
        pass
    return y * 1


def _tuple_out_then_caught_error(x, y, i):
    idx = torch.empty(0, dtype=torch.long)
    torch.max(torch.stack([x, y]), 0, out=(x, idx))
    try:
        i // (i * 0)
    except RuntimeError:
        pass
    return idx


def _foreach_then_caught_error(x, y, i):
    torch._foreach_add_([x, y], 1)
    try:
        i // (i * 0)
    except RuntimeError:
        pass
    return x + y


@pytest.mark.parametrize("fn", [_out_argument_then_caught_error, _tuple_out_then_caught_error,
                                _foreach_then_caught_error])
def test_out_and_foreach_writes_put_back_when_a_graph_raises(fn):
    """The rerun plan took an in-place op's first argument for what it writes: ``out=`` tensors
    (``torch.add(x, y, out=y)`` writes y) and the tensors of a ``_foreach_*_`` list were not put
    back before the frame ran again as plain Python, so they were written twice."""
    compiled = framejit.compile(fn)
    for _ in range(2):
        sides = []
        for f in (fn, compiled):
            x, y, i = torch.arange(3.0), torch.ones(3), torch.ones(2, dtype=torch.long)
            sides.append((f(x, y, i), x, y))
        for got, expected in zip(sides[1], sides[0]):
            torch.testing.assert_close(got, expected)


def _transpose_input_in_place(x):
    x.t_()
    return x.shape[0], x.sum(0)


def _unsqueeze_input_for_a_while(x):
    x.unsqueeze_(0)
    n = x.dim()
    x.squeeze_(0)
    return n, x.sum(0)


@pytest.mark.parametrize("fn", [_transpose_input_in_place, _unsqueeze_input_for_a_while])
@pytest.mark.parametrize("backend", ["eager", "default"])
def test_metadata_written_in_place_on_a_static_input_of_a_dynamic_capture(fn, backend):
    """An input that is not contiguous keeps static sizes in a capture that has symbolic ones
    (here after the first call made x's sizes dynamic). In-place ops on its example ran on a
    fake wrapper of it, so ``x.t_()`` left the example as it was: ``x.shape`` read after it, and
    the kernels compiled for ``x.sum(0)``, had the old sizes (sum over the wrong dimension)."""
    compiled = framejit.compile(fn, backend=backend)
    for make in (lambda: torch.arange(12.0).view(3, 4), lambda: torch.arange(12.0).view(3, 4).t(),
                 lambda: torch.arange(20.0).view(4, 5).t()):
        x, y = make(), make()
        expected, got = fn(x), compiled(y)
        assert got[0] == expected[0]
        torch.testing.assert_close(got[1], expected[1])
        assert (y.shape, y.stride()) == (x.shape, x.stride())


def _input_made_to_require_grad(x):
    x.requires_grad_()
    return x.is_leaf, x.grad_fn is None, x.requires_grad


def test_input_made_to_require_grad_in_the_frame_stays_a_leaf():
    """``x.requires_grad_()`` on an input keeps it a leaf (no grad_fn), unlike an in-place op
    writing a value that requires grad into it (the test above)."""
    compiled = framejit.compile(_input_made_to_require_grad)
    for shape in [(3, 4), (3, 4), (5, 2)]:
        assert compiled(torch.randn(shape)) == _input_made_to_require_grad(torch.randn(shape)) \
            == (True, True, True)


PARAMETER = torch.nn.Parameter(torch.ones(3))
NON_LEAF = PARAMETER * 2


def _constants_leafness(x, p=PARAMETER, q=NON_LEAF):
    return p.is_leaf, p.grad_fn is None, q.is_leaf, x + 1


def test_leafness_of_tensors_reached_without_a_source():
    """A default argument (a constant of the graph) answered ``is_leaf`` as ``not requires_grad``:
    False for a parameter. It is the constant's own now."""
    compiled = framejit.compile(_constants_leafness)
    x = torch.randn(3)
    assert compiled(x)[:3] == _constants_leafness(x)[:3] == (True, True, False)
