"""bmm_operands: attention's batched matmuls get operands whose batch dimensions fold (copies
our kernels make, k copied untransposed and read transposed), with eager's results."""

import operator

import pytest
import torch

import framejit
from framejit.passes.matmul import _batch_folds, aligned_matmul_outputs
from framejit.testing import assert_close_to_eager, built_by_pipeline


def _compiled(fn, *args):
    with built_by_pipeline() as built, torch.no_grad():
        got = framejit.compile(fn)(*args)
    (compiled,) = built
    return got, compiled


def _attention(x, w):
    b, t, c = x.shape
    q, k, v = (x @ w).split(c, dim=2)
    q = q.view(b, t, 4, c // 4).transpose(1, 2)
    k = k.view(b, t, 4, c // 4).transpose(1, 2)
    v = v.view(b, t, 4, c // 4).transpose(1, 2)
    att = torch.softmax((q @ k.transpose(-2, -1)) * 0.25, dim=-1)
    return (att @ v).transpose(1, 2).reshape(b, t, c)


@pytest.mark.parametrize("threads", [1, 2])
def test_attention_matmuls_get_operands_that_fold_and_match_eager(threads):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(0)
        x, w = torch.randn(2, 16, 32), torch.randn(32, 96)
        got, compiled = _compiled(_attention, x, w)
    finally:
        torch.set_num_threads(before)
    assert_close_to_eager(got, _attention(x, w))
    matmuls = [n for n in compiled.framejit_graph.nodes
               if n.op == "call_function" and n.target is operator.matmul
               and n.meta["val"].dim() == 4]
    assert len(matmuls) == 2
    for node in matmuls:
        for arg in node.args:
            assert _batch_folds(arg.meta["val"]), node.format()
    # q @ k^T: k copied in its own row order, then read through a transposed view.
    ((_, kt),) = [n.args for n in matmuls if n.args[1].meta["val"].shape[-1] == 16]
    assert kt.meta["val"].stride()[-2:] == (1, 8)
    # q, k and v copied (by one kernel: they are views of one projection).
    copies = [k for k in compiled.framejit_kernels if "clone" in k.name]
    assert sum(len(k.kernel.outputs) for k in copies) >= 3


def test_operands_that_already_fold_are_left_alone():
    torch.manual_seed(0)
    a, b = torch.randn(2, 3, 8, 5), torch.randn(2, 3, 5, 4)
    got, compiled = _compiled(lambda a, b: (a * 2) @ b.transpose(-2, -1).transpose(-2, -1), a, b)
    assert_close_to_eager(got, (a * 2) @ b)
    assert not [n for n in compiled.framejit_graph.nodes if n.op == "call_function"
                and getattr(n.target, "__name__", "") == "clone.default"]


# -- aligned_matmul_outputs (a CUDA pass, run here on CPU graphs) ---------------------------------

def _aligned(graph):
    return aligned_matmul_outputs(graph, device_type="cpu")


@pytest.mark.parametrize("form", ["linear", "linear_bias", "matmul_t", "addmm"])
def test_matmuls_with_unaligned_output_rows_get_padded_weights_and_eager_results(rewrite, dtype, form):
    # 1025 columns: rows of 2050 bytes in 16-bit (cuBLAS's align1 kernels on a GPU).
    torch.manual_seed(0)
    x = torch.randn(1024, 64).to(dtype)
    w, b = torch.randn(1025, 64).to(dtype) / 8, torch.randn(1025).to(dtype)
    fns = {
        "linear": lambda x, w, b: torch.nn.functional.linear(x, w) * 2,
        "linear_bias": lambda x, w, b: torch.nn.functional.linear(x, w, b),
        "matmul_t": lambda x, w, b: x @ w.t(),
        "addmm": lambda x, w, b: torch.addmm(b, x, w.t()),
    }
    captured = rewrite(_aligned, fns[form], x, w, b)
    targets = captured.targets()
    assert torch.ops.aten.constant_pad_nd.default in targets
    padded = [n for n in captured.graph.nodes if n.op == "call_function"
              and n.target is torch.ops.aten.slice.Tensor]
    (slice_,) = padded
    # 1025 rounded up to whole 16-byte rows: 8 elements in 16-bit, 4 in fp32.
    assert slice_.args[0].meta["val"].shape[-1] == (1032 if dtype.itemsize == 2 else 1028)


def test_aligned_small_or_grad_matmuls_are_left_alone(rewrite, capture_graph):
    torch.manual_seed(0)
    x, w = torch.randn(64, 64), torch.randn(1025, 64)  # 65600 output elements: too small
    rewrite(_aligned, lambda x, w: x @ w.t(), x, w, expect_change=False)
    x = torch.randn(1024, 64)
    rewrite(_aligned, lambda x, w: x @ w.t(), x, torch.randn(1024, 64), expect_change=False)  # aligned
    with torch.enable_grad():
        wg = torch.randn(1025, 64, requires_grad=True)
        captured = capture_graph(lambda x, w: x @ w.t(), x, wg)
        assert not _aligned(captured.graph)


def test_a_language_model_head_in_inference_is_padded(rewrite):
    # nn.Linear's weight requires grad even under no_grad: the result does not, and that is
    # what decides (GPT-2's head is such a parameter).
    head = torch.nn.Linear(64, 1025, bias=False)
    x = torch.randn(1024, 64)
    with torch.no_grad():
        captured = rewrite(_aligned, head, x)
    assert torch.ops.aten.constant_pad_nd.default in captured.targets()


def test_padded_matmuls_run_through_the_kernel_pipeline(monkeypatch):
    # The whole pipeline on CPU tensors with the pass turned on for them: the pad, the matmul,
    # the slice and the copy back (fused with the GELU after it) give eager's result and layout.
    from framejit import pipeline

    monkeypatch.setattr(pipeline, "aligned_matmul_outputs", _aligned)
    torch.manual_seed(0)
    x, w, b = torch.randn(1024, 64), torch.randn(1025, 64) / 8, torch.randn(1025)

    def fn(x, w, b):
        return torch.nn.functional.gelu(torch.nn.functional.linear(x, w, b)) + 1

    got, compiled = _compiled(fn, x, w, b)
    assert_close_to_eager(got, fn(x, w, b))
    assert got.stride() == (1025, 1)
    targets = [n.target for n in compiled.framejit_graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.constant_pad_nd.default in targets
    # the slice of the padded result: a reinterpret of the matmul's result where torch has one
    from framejit.passes.views import REINTERPRET
    assert (REINTERPRET or torch.ops.aten.slice.Tensor) in targets
    (kernel,) = compiled.framejit_kernels  # the copy back, the bias and the GELU: one kernel
    assert "clone" in kernel.name and "gelu" in kernel.name
