"""bmm_operands: attention's batched matmuls get operands whose batch dimensions fold (copies
our kernels make, k copied untransposed and read transposed), with eager's results."""

import operator

import pytest
import torch

import framejit
from framejit.passes.matmul import _batch_folds
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
