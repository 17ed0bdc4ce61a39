"""pointwise_into_windows: pointwise ops move below the unfold views a reduction reads (max
pooling after batch norm and ReLU), so the pooling kernel computes them; never where work would
be repeated, a value is read again, or a layout could show."""

import pytest
import torch
from torch import nn

import framejit
from framejit.passes import pointwise_into_windows
from framejit.testing import assert_close_to_eager, built_by_pipeline

A = torch.ops.aten


def _pool(v, k=2, s=2):
    """max_pool2d as the passes decompose it: a max over windows of two unfolds."""
    return A.amax.default(A.unfold.default(A.unfold.default(v, 2, k, s), 3, k, s), [4, 5], True)


def _unfold_inputs(captured):
    return [n.args[0] for n in captured.graph.nodes
            if n.op == "call_function" and n.target is A.unfold.default]


def test_batch_norm_and_relu_move_below_the_windows(rewrite, dtype):
    torch.manual_seed(0)
    x = torch.randn(2, 4, 6, 8, dtype=dtype)
    y = torch.randn(2, 4, 6, 8, dtype=dtype)  # full-size operand: unfolded too
    mean, scale = torch.randn(4, 1, 1, dtype=dtype), torch.randn(4, 1, 1, dtype=dtype)
    row = torch.randn(8, dtype=dtype)  # spans the second windowed dimension only
    zero_d = torch.tensor(0.25, dtype=dtype)

    def f(x, y, mean, scale, row, zero_d):
        v = A.relu.default(A.add.Tensor(A.mul.Tensor(A.sub.Tensor(x, mean), scale), y))
        v = A.mul.Tensor(A.add.Tensor(A.mul.Tensor(v, row), zero_d), 2.0)
        return _pool(v)

    captured = rewrite(pointwise_into_windows, f, x, y, mean, scale, row, zero_d)
    # The windows now read the graph's inputs (or views of them); the reduction reads the
    # pointwise ops, which its kernel fuses as its prologue.
    views = (A.unfold.default, A.unsqueeze.default)
    for source in _unfold_inputs(captured):
        assert source.op == "placeholder" or source.target in views
    (amax,) = [n for n in captured.graph.nodes if n.target is A.amax.default]
    assert amax.args[0].target is A.mul.Tensor


def test_three_dimensional_input_and_nan(rewrite):
    x = torch.randn(3, 6, 6)
    x[1, 2, 3] = float("nan")
    b = torch.randn(3, 1, 1)

    def f(x, b):
        v = A.relu.default(A.add.Tensor(x, b))
        return A.amax.default(A.unfold.default(A.unfold.default(v, 1, 2, 2), 2, 3, 3), [3, 4], True)

    rewrite(pointwise_into_windows, f, x, b)


def test_nothing_moves_where_work_or_layout_would_change(rewrite):
    x, b = torch.randn(2, 3, 6, 6), torch.randn(3, 1, 1)

    def read_again(x, b):
        v = A.relu.default(A.add.Tensor(x, b))
        return _pool(v), v

    def overlapping(x, b):
        return _pool(A.relu.default(A.add.Tensor(x, b)), k=3, s=1)

    def not_reduced(x, b):
        v = A.unfold.default(A.relu.default(A.add.Tensor(x, b)), 2, 2, 2)
        return A.mul.Tensor(v, 2.0)

    def random_source(x, b):
        return _pool(A.rand_like.default(x))

    for f in (read_again, overlapping, not_reduced):
        rewrite(pointwise_into_windows, f, x, b, expect_change=False)
    torch.manual_seed(0)
    rewrite(lambda g: pointwise_into_windows(g), random_source, x, b, expect_change=False,
            atol=1.0)


def _cnn():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8),
                         nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 8, 3), nn.BatchNorm2d(8),
                         nn.ReLU(), nn.MaxPool2d(2)).eval()


@pytest.mark.parametrize("nan", [False, True])
def test_conv_batch_norm_relu_pool_is_one_kernel_after_the_convolution(nan):
    model, x = _cnn(), torch.randn(2, 3, 12, 12)
    if nan:
        x[0, 1, 4, 5] = float("nan")
    with built_by_pipeline() as built:
        compiled = framejit.compile(model)
        with torch.no_grad():
            got = compiled(x)
            model[1].running_var.mul_(2.0)  # parameters are read at each call
            again = compiled(x)
    with torch.no_grad():
        model[1].running_var.div_(2.0)
        want = model(x)
        model[1].running_var.mul_(2.0)
        want_again = model(x)
    assert_close_to_eager(got, want)
    assert_close_to_eager(again, want_again)
    (fn,) = built
    # Each pooling kernel computes its batch norm and ReLU: no kernel writes the full-size
    # activations between a convolution and its pooling.
    pools = [k for k in fn.framejit_kernels if k.kernel.is_reduction]
    assert len(pools) == 2
    for k in pools:
        kinds = {op.kind for op in k.kernel.ops}
        assert {"sub", "mul", "add", "relu", "reduce"} <= kinds


def test_run_passes_moves_relu_into_max_pooling(capture_graph):
    from framejit.passes import run_passes
    from framejit.passes.vocabulary import EMITTED_SUPPORT, VOCABULARY

    def f(x, s, b):
        return torch.nn.functional.max_pool2d(torch.relu(x * s + b), 2)

    args = (torch.randn(2, 3, 8, 8), torch.randn(3, 1, 1), torch.randn(3, 1, 1))
    captured = capture_graph(f, *args)
    run_passes(captured.graph, captured.root, lint=True)
    assert all(t in VOCABULARY or t in EMITTED_SUPPORT for t in captured.targets()), str(
        captured.graph)
    (amax,) = [n for n in captured.graph.nodes if n.target is A.amax.default]
    assert amax.args[0].target is A.relu.default
    assert_close_to_eager(captured.run(), (f(*args),))
