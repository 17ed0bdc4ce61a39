"""channels_last_convs: CPU convolutions run channels-last, kernels around them follow, results
keep eager's layout; all or nothing."""

import pytest
import torch
from torch import nn

import framejit
from framejit.testing import assert_close_to_eager, built_by_pipeline, declined_kernels


def _compiled(model, x):
    with built_by_pipeline() as built:
        compiled = framejit.compile(model)
        with torch.no_grad():
            got = compiled(x)
            got_again = compiled(x)
    (fn,) = built
    return got, got_again, fn


def _conv_net():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
    ).eval()


def test_convolutions_run_channels_last_and_results_keep_eager_layout():
    model, x = _conv_net(), torch.randn(2, 3, 12, 12)
    got, got_again, fn = _compiled(model, x)
    with torch.no_grad():
        want = model(x)
    assert_close_to_eager(got, want)
    assert_close_to_eager(got_again, want)
    assert got.stride() == want.stride()  # converted back at the output
    # One conversion, of the graph input: the pooling kernel writes channels-last, which the
    # second convolution takes as it is; the last kernel writes eager's layout for the output.
    assert [k.name for k in fn.framejit_kernels if "clone" in k.name] == ["fj_poi_clone"]
    (pool,) = [k for k in fn.framejit_kernels if k.kernel.is_reduction]
    ((_, pool_strides, _),) = pool.outputs
    assert pool_strides[1] == 1
    # The kernels after each convolution read its channels-last result as predicted.
    checked = [k for k in fn.framejit_kernels if k.checked_inputs]
    assert checked and all(k.layout_misses == 0 for k in fn.framejit_kernels)
    assert any(stride[1] == 1 for k in checked for _, stride in k.checked_inputs.values())


def test_a_graph_that_mutates_is_left_as_it_was():
    conv = nn.Conv2d(3, 4, 3).eval()

    def f(x, acc):
        y = torch.relu(conv(x))
        acc.add_(1)
        return y * 2

    x, acc = torch.randn(1, 3, 8, 8), torch.zeros(2)
    with built_by_pipeline() as built, torch.no_grad():
        got = framejit.compile(f)(x, acc)
    with torch.no_grad():
        assert_close_to_eager(got, f(x, torch.zeros(2)))
    assert acc.tolist() == [1.0, 1.0]
    assert not any(n.name.startswith("to_channels_last") for fn in built for n in fn.framejit_graph.nodes)


def _pool_relu(x):
    return torch.nn.functional.max_pool2d(torch.relu(x), 2)


def test_max_pooling_of_a_channels_last_input_writes_channels_last():
    # Eager pools a channels-last input into a channels-last result. The decomposed pooling (a
    # max over a windowed view) computed NCHW, gathering across channels (8x slower than
    # Inductor at 8x64x64x64), and a second kernel copied it back to channels-last.
    x = torch.randn(2, 16, 8, 10).contiguous(memory_format=torch.channels_last)
    x[1, 3, 4, 5] = float("nan")
    with built_by_pipeline() as built:
        got = framejit.compile(_pool_relu, backend="c")(x)
    want = _pool_relu(x)
    assert_close_to_eager(got, want)
    assert got.stride() == want.stride()
    (fn,) = built
    (pool,) = fn.framejit_kernels
    ((_, strides, _),) = pool.outputs
    assert pool.kernel.is_reduction and strides[1] == 1


def test_a_pooling_kernel_that_does_not_compile_keeps_the_layout_later_kernels_read(monkeypatch):
    # The next kernel reads the pooling kernel's output with the strides it predicted; run as
    # torch ops, the pooling must still hand over a channels-last result.
    from framejit.kernels import c_runtime

    build = c_runtime._build

    def no_reductions(names, functions):
        if any("_red_" in n for n in names):
            raise c_runtime.KernelCompileError("cc failed")
        return build(names, functions)

    monkeypatch.setattr(c_runtime, "_build", no_reductions)

    def f(x):
        return torch.nn.functional.max_pool2d(x, 2) * 3 + 1

    x = torch.randn(2, 16, 8, 10).contiguous(memory_format=torch.channels_last)
    with built_by_pipeline() as built, \
            pytest.warns(UserWarning, match="failed to compile on cpu .* run as torch ops instead"):
        got = framejit.compile(f, backend="c")(x)
    want = f(x)
    assert_close_to_eager(got, want)
    assert got.stride() == want.stride()
    (fn,) = built
    assert len(fn.framejit_kernels) == 2  # the pooling (as torch ops) and the epilogue


def test_channels_last_pooling_under_dynamic_shapes_keeps_its_kernels():
    # Kernels for every size check each value's layout on fake tensors, whose pooling answers
    # contiguous: a pooling laid out channels-last made the graph decline all its kernels.
    def f(x):
        return torch.nn.functional.max_pool2d(torch.relu(x.contiguous(memory_format=torch.channels_last)) * 2, 2) + 1

    with declined_kernels() as declined:
        compiled = framejit.compile(f, backend="c", dynamic=True)
        for n in (4, 6, 8):
            x = torch.randn(2, 8, n, n)
            got, want = compiled(x), f(x)
            assert_close_to_eager(got, want)
            assert got.stride() == want.stride()
    assert declined == []


@pytest.mark.parametrize("backend", ["eager", "default"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("form", ["relu", "scale", "bias_view", "transpose_add", "mean",
                                  "weight_only", "conv_transpose", "group_norm", "conv3d"])
def test_a_channels_last_convolution_s_result_keeps_eager_s_layout(form, dtype, backend):
    # A CPU convolution of a channels-last input (or weight) returns channels-last, a group
    # norm too; their meta kernels answer contiguous. The examples took the meta answer, so the
    # graph returned a contiguous result (the layout pass "restored" it, and fp64 kernels wrote
    # it so) where eager returns channels-last: a later .view() then works only when compiled.
    torch.manual_seed(0)
    cl = torch.channels_last
    x = torch.randn(2, 3, 6, 6, dtype=dtype).to(memory_format=cl)
    w, b = torch.randn(8, 3, 3, 3, dtype=dtype), torch.randn(8, dtype=dtype)
    forms = {
        "relu": lambda x: torch.relu(torch.conv2d(x, w, b, padding=1)),
        "scale": lambda x: torch.conv2d(x, w, b, padding=1) * 2,
        "bias_view": lambda x: torch.conv2d(x, w, None, padding=1) + b.view(1, -1, 1, 1),
        "transpose_add": lambda x: (lambda y: y + y.transpose(2, 3))(torch.conv2d(x, w, b)),
        "mean": lambda x: (lambda y: y - y.mean((2, 3), keepdim=True))(torch.conv2d(x, w, b)),
        "weight_only": lambda x: torch.relu(torch.conv2d(x.contiguous(), w.to(memory_format=cl), b)),
        "conv_transpose": lambda x: torch.relu(
            torch.nn.functional.conv_transpose2d(x, w.transpose(0, 1).contiguous())),
        "group_norm": lambda x: torch.nn.functional.group_norm(x * 2, 1) + 1,
        "conv3d": lambda x: torch.relu(torch.nn.functional.conv3d(
            x.unsqueeze(2).contiguous(memory_format=torch.channels_last_3d),
            w.unsqueeze(2), b)),
    }
    fn = forms[form]
    want = fn(x)
    got = framejit.compile(fn, backend=backend, fullgraph=True)(x)
    assert_close_to_eager(got, want)
    assert got.stride() == want.stride()
