"""views_as_reinterprets: chains of views in a compiled wrapper as one reinterpret of the tensor
they view, where that tensor's layout is known; nowhere else."""

import operator

import pytest
import torch
import torch.nn.functional as F

import framejit
from framejit.passes.views import REINTERPRET
from framejit.testing import assert_close_to_eager, built_by_pipeline

pytestmark = pytest.mark.skipif(REINTERPRET is None, reason="this torch has no _reinterpret_tensor")

VIEW_METHODS = {"view", "reshape", "transpose", "permute", "split", "split_with_sizes",
                "unsqueeze", "squeeze", "expand", "narrow", "select", "flatten"}


def _compiled(fn, *args, grad=False):
    with built_by_pipeline() as built, torch.set_grad_enabled(grad):
        got = framejit.compile(fn, backend="c", fullgraph=True)(*args)
        want = fn(*args)
    (wrapper,) = built
    graph = wrapper.framejit_graph
    views = [n for n in graph.nodes if n.op == "call_method" and n.target in VIEW_METHODS
             or n.target is operator.getitem and n.args[0].op == "call_method"]
    reinterprets = [n for n in graph.nodes if n.target is REINTERPRET]
    return got, want, views, reinterprets


def attention_heads(x, w, b):
    # GPT-2's attention: one matmul for q, k and v, split, heads viewed out and transposed.
    qkv = torch.addmm(b, x.view(-1, 32), w).view(2, 8, 96)
    q, k, v = qkv.split(32, dim=2)
    q, k, v = (t.view(2, 8, 4, 8).transpose(1, 2) for t in (q, k, v))
    return (q * 2 + k) * v.sigmoid()


def test_a_matmul_s_heads_are_reinterprets_of_its_result():
    x, w, b = torch.randn(2, 8, 32), torch.randn(32, 96), torch.randn(96)
    got, want, views, reinterprets = _compiled(attention_heads, x, w, b)
    assert_close_to_eager(got, want)
    assert not views, [n.format() for n in views]
    # The input's view(-1, 32), then q, k and v: three offsets into the matmul's result.
    assert len(reinterprets) == 4
    assert reinterprets[0].args[0].op == "placeholder"
    heads = reinterprets[1:]
    assert {n.args[0].target for n in heads} == {torch.addmm}
    assert sorted(n.args[3] for n in heads) == [0, 32, 64]


def test_a_view_the_graph_returns_stays_a_view():
    x, w = torch.randn(4, 8), torch.randn(8, 6)

    def f(x, w):
        y = x @ w
        return y.view(2, 12), (y.t() + 1)

    got, want, views, _ = _compiled(f, x, w)
    assert_close_to_eager(got, want)
    assert got[0]._base is not None  # still a view of the matmul's result, as in eager
    assert [n.target for n in views] == ["view"]


@pytest.mark.parametrize("grad", [False, True])
def test_a_returned_view_of_an_input_stays_a_view_of_it_through_its_chain(grad):
    # x.view(2, 12)[0]: the [0] is returned, and the view(2, 12) it is taken from stays too, so
    # the caller's tensor is a view of x for autograd (its _base, one version counter).
    x = torch.randn(4, 6, requires_grad=grad)

    def f(x):
        return x.view(2, 12)[0], x.view(4, 2, 3).transpose(1, 2) * 2

    got, want, views, reinterprets = _compiled(f, x, grad=grad)
    assert_close_to_eager(got, want)
    assert got[0]._base is x and got[0].requires_grad == want[0].requires_grad == grad
    # the returned chain's view stays; the other chain, read by a kernel, is a reinterpret of x
    # where nothing records gradients
    assert [n.target for n in views].count("view") == (2 if grad else 1)
    assert len(reinterprets) == (0 if grad else 1)
    if not grad:
        # a write through the returned view moves x's version, as autograd checks it
        before = x._version
        got[0].add_(1)
        assert x._version > before


def test_views_of_an_input_that_requires_grad_keep_their_gradients():
    # A graph of views only: each links its result to the input for autograd, so none is a
    # reinterpret under grad mode (GPT-2's split_heads alone: view then transpose).
    x = torch.randn(2, 4, 6, requires_grad=True)

    def f(x):
        return x.view(2, 4, 2, 3).transpose(1, 2)

    got, want, views, reinterprets = _compiled(f, x, grad=True)
    assert_close_to_eager(got, want)
    assert views and not reinterprets and got.grad_fn is not None and got._base is x
    (g,) = torch.autograd.grad((got * got).sum(), x)
    (w,) = torch.autograd.grad((want * want).sum(), x)
    assert torch.equal(g, w)


def test_views_of_a_result_of_unknown_layout_stay():
    # Attention on CPU may return another layout than its example's: its views are not known.
    q = torch.randn(2, 4, 8, 16)

    def f(q):
        a = F.scaled_dot_product_attention(q, q, q)
        return a.transpose(1, 2).reshape(2, 8, 64) * 2

    got, want, views, reinterprets = _compiled(f, q)
    assert_close_to_eager(got, want)
    assert "transpose" in [n.target for n in views] and not reinterprets


def test_a_view_that_changes_the_dtype_stays():
    x = torch.randn(4, 8)

    def f(x):
        return (x @ x.t()).view(torch.int32) + 1

    got, want, views, reinterprets = _compiled(f, x)
    assert torch.equal(got, want)
    assert [n.target for n in views] == ["view"]  # x.t() is a reinterpret of x
    assert all(n.meta["val"].dtype == torch.float32 for n in reinterprets)


@pytest.mark.parametrize("form", ["in_place", "grad"])
def test_a_graph_that_writes_or_records_gradients_keeps_its_views(form):
    # The reinterpreted tensor is no view for autograd and has a version counter of its own.
    x, w, b = torch.randn(2, 8, 32), torch.randn(32, 96), torch.randn(96)
    if form == "in_place":
        acc = torch.zeros(3)

        def f(x, w, b):
            acc.add_(1)
            return attention_heads(x, w, b)

        got, want, views, reinterprets = _compiled(f, x, w, b)
    else:
        w.requires_grad_()
        got, want, views, reinterprets = _compiled(attention_heads, x, w, b, grad=True)
    assert_close_to_eager(got, want)
    assert views and not reinterprets


def test_views_of_an_input_that_starts_inside_its_storage():
    # The example of an input starts at offset 0; a reinterpret counts from the real start.
    base = torch.arange(40.0)

    def f(x):
        return x.view(2, 4).t()[1:] * 2 + x.as_strided((2,), (1,), 3)

    compiled = framejit.compile(f, backend="c")
    for x in (base[0:8], base[5:13], base[30:38]):
        assert torch.equal(compiled(x), f(x))


def test_a_graph_that_writes_only_to_its_own_results_still_reinterprets():
    # T5's `buckets += ...` writes to a tensor the graph made: nothing outside sees it.
    x, w, b = torch.randn(2, 8, 32), torch.randn(32, 96), torch.randn(96)

    def f(x, w, b):
        heads = attention_heads(x, w, b)
        y = x * 2
        y += 1
        return heads, y.view(16, 32)

    got, want, views, reinterprets = _compiled(f, x, w, b)
    assert_close_to_eager(got, want)
    assert len(reinterprets) == 4
