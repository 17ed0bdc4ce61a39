"""CPU kernels that write their output over an input the kernel makes dead (a fresh
convolution or matmul result, or another kernel's output, that nothing else reads, laid out
alike: ``launch.donate_dead_inputs``): a CNN's batch norm and ReLU run in place. Everything else
keeps a fresh output, and every result matches eager."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import framejit
from framejit.kernels import c_render
from framejit.kernels.c_runtime import CLauncher
from framejit.testing import assert_close_to_eager

from .conftest import KernelCompiler, run_kernels


@pytest.fixture(autouse=True)
def c_renderer(renderer, device):
    """``run_kernels`` uses the C renderer in this module."""
    from . import conftest

    if device != "cpu":
        pytest.skip("C kernels run on CPU tensors")
    conftest._current["renderer"] = "c"


def _reused(backend) -> list:
    """Per single-output kernel: the input buffer its output is written over when grad is off
    (None: a fresh output)."""
    return [k.kernel.inputs[k.donated[0]].name if len(k.kernel.outputs) == 1 and 0 in k.donated
            else None for k in backend.kernels]


def _conv_bn_relu():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8),
                         nn.ReLU(), nn.Conv2d(8, 4, 3, padding=1), nn.BatchNorm2d(4),
                         nn.ReLU()).eval()


def test_batch_norm_and_relu_run_in_place_of_the_convolution_result(threads):
    model, x = _conv_bn_relu(), torch.randn(2, 3, 10, 10)
    compiled, backend = _compile_c(model)
    with torch.no_grad():
        want = model(x)
        assert_close_to_eager(compiled(x), want)
        # A second call gives the same answer (nothing of the first is kept).
        assert_close_to_eager(compiled(x), want)
    # The first batch norm + ReLU kernel reads its convolution's (channels-last) result and
    # writes over it; the last one writes the graph's output in eager's layout, so a new one.
    assert _reused(backend).count("in0") == 1
    last = next(k for k in backend.kernels if k.name.startswith("fj_poi_sub_mul_add_relu_1"))
    assert not last.donated
    inplace = [k for k in backend.kernels if k.donated]
    for k in inplace:
        assert "restrict in0" not in k.source and "restrict out0" not in k.source


def _compile_c(fn):
    """``fn`` compiled with C kernels, and the backend that keeps what it built."""
    backend = KernelCompiler({"cpu": CLauncher})
    return framejit.compile(fn, backend=backend.as_backend(), fullgraph=True), backend


def test_parameters_changed_between_calls_are_read_again():
    model, x = _conv_bn_relu(), torch.randn(2, 3, 8, 8)
    compiled, backend = _compile_c(model)
    with torch.no_grad():
        assert_close_to_eager(compiled(x), model(x))
        assert any(_reused(backend))
        model[1].running_mean.add_(0.5)
        model[1].weight.mul_(-2.0)
        model[3].weight.mul_(0.5)
        assert_close_to_eager(compiled(x), model(x))


def test_a_result_read_again_later_keeps_its_values():
    torch.manual_seed(0)
    a, b = torch.randn(6, 5), torch.randn(5, 7)

    def f(a, b):
        m = torch.mm(a, b)
        return torch.relu(m * 2.0 + 1.0), m  # m is an output too

    got, backend = run_kernels(f, a, b)
    assert_close_to_eager(got, f(a, b))
    assert not any(_reused(backend))

    def g(a, b):
        m = torch.mm(a, b)
        z = torch.relu(m - 1.0)
        return torch.flip(z, [1]) + m  # a second kernel reads m after the first

    got, backend = run_kernels(g, a, b)
    assert_close_to_eager(got, g(a, b))
    assert len(backend.kernels) == 2 and not any(_reused(backend))


def test_graph_inputs_and_views_are_never_written():
    torch.manual_seed(0)
    x = torch.randn(6, 5)
    keep = x.clone()

    def f(x):
        return torch.relu(x * 3.0)

    got, backend = run_kernels(f, x)
    assert_close_to_eager(got, f(keep))
    assert torch.equal(x, keep) and not any(_reused(backend))

    a, b = torch.randn(6, 4), torch.randn(4, 6)

    def transposed(a, b):
        m = torch.mm(a, b)  # 6x6: the kernel reads it transposed, unlike its output
        return m.t() * 2.0 + 1.0

    got, backend = run_kernels(transposed, a, b)
    assert_close_to_eager(got, transposed(a, b))
    assert not any(_reused(backend))

    def broadcast(a, b):
        m = torch.mm(a, b[:, :1])  # 6x1, broadcast into the 6x6 box
        return m + torch.ones(6, 6)

    got, backend = run_kernels(broadcast, a, b)
    assert_close_to_eager(got, broadcast(a, b))
    assert not any(_reused(backend))


_OUT_FORMS = {
    "mm then relu": lambda a, w, b, buf: torch.mm(a, w, out=buf).relu(),
    "addmm then +=": lambda a, w, b, buf: torch.addmm(b, a, w, out=buf).add_(1).sigmoid(),
    "matmul then +=": lambda a, w, b, buf: _then_iadd(torch.matmul(a, w, out=buf)),
    "mm into a view, then softmax": lambda a, w, b, buf: torch.softmax(
        torch.mm(a, w, out=buf[:, :]), -1),
    "add then exp": lambda a, w, b, buf: torch.add(a, b, out=buf).exp(),
}


def _then_iadd(y):
    y += 1
    return y.relu()


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("form", _OUT_FORMS)
def test_a_result_written_to_the_caller_s_out_tensor_is_not_fresh(form, grad):
    # `torch.mm(a, w, out=buf)` returns the caller's buf: a kernel never writes its output over
    # it, and `y += 1` on it stays in place, so buf ends as in eager.
    fn = _OUT_FORMS[form]
    torch.manual_seed(0)
    a, w, b = torch.randn(3, 4), torch.randn(4, 4), torch.randn(4)
    compiled = framejit.compile(fn, backend="c")
    with torch.set_grad_enabled(grad):
        want_buf, got_buf = torch.zeros(3, 4), torch.zeros(3, 4)
        want = fn(a, w, b, want_buf)
        assert_close_to_eager(compiled(a, w, b, got_buf), want)
    assert torch.equal(got_buf, want_buf)


def test_matmul_results_and_dtype_changes(threads):
    torch.manual_seed(0)
    a, b, bias = torch.randn(3, 7, 16), torch.randn(24, 16), torch.randn(24)

    def f(a, b, bias):
        return torch.tanh(F.linear(a, b, bias)) * 0.5

    got, backend = run_kernels(f, a, b, bias)
    assert_close_to_eager(got, f(a, b, bias))
    assert _reused(backend) == ["in0"]

    def cast(a, b, bias):
        return (F.linear(a, b, bias) * 2.0).to(torch.float64)  # another dtype: a fresh output

    got, backend = run_kernels(cast, a, b, bias)
    assert_close_to_eager(got, cast(a, b, bias))
    assert not any(_reused(backend))


def test_gradients_are_unchanged_when_autograd_needs_the_convolution_result():
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 4, 3, padding=1)
    x = torch.randn(2, 3, 6, 6)

    def f(x):
        return (torch.sigmoid(conv(x)) * 3.0).sum()

    compiled, _ = _compile_c(f)
    compiled(x).backward()
    got = [p.grad.clone() for p in conv.parameters()]
    conv.zero_grad()
    f(x).backward()
    for g, w in zip(got, (p.grad for p in conv.parameters())):
        assert_close_to_eager(g, w)


def test_the_c_function_of_an_in_place_kernel_keeps_restrict_elsewhere():
    from framejit.kernels.ir import Buffer, Kernel, Op

    # in1 broadcasts (another layout than out0's): never passed as the output.
    k = Kernel("fj_poi_add", (64,), (), [
        Buffer("in0", torch.float32, (1,)), Buffer("in1", torch.float32, (0,)),
        Buffer("out0", torch.float32, (1,), is_output=True)])
    k.ops = [Op("load", ("in0",), torch.float32), Op("load", ("in1",), torch.float32),
             Op("add", (0, 1), torch.float32), Op("store", ("out0", 2), torch.float32)]
    source = c_render.render_function(k)
    assert "const float *in0 " in source and "float *out0 " in source
    assert "const float *restrict in1 " in source
