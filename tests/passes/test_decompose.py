import pytest
import torch
import torch.nn.functional as F

import framejit
from framejit.passes import decompose, normalize
from framejit.passes.vocabulary import EMITTED_SUPPORT, VOCABULARY
from framejit.testing import assert_close_to_eager

aten = torch.ops.aten
prims = torch.ops.prims
CONVERT = prims.convert_element_type.default
CLONE = aten.clone.default


def make(shape, dtype=torch.float32, layout="contiguous", low=-3.0, high=3.0):
    if layout == "contiguous":
        t = torch.empty(shape)
    elif layout == "transposed":
        t = torch.empty(*shape[:-2], shape[-1], shape[-2]).transpose(-1, -2)
    else:
        t = torch.empty(*shape[:-1], shape[-1] * 2)[..., ::2]
    t.uniform_(low, high)
    return t.to(dtype) if dtype != torch.float32 else t


LAYOUTS = ["contiguous", "transposed", "strided"]


def compute_targets(captured):
    """The call targets, without the fp32 conversions and the layout clone around them."""
    return [t for t in captured.targets() if t not in (CONVERT, CLONE)]


def all_vocabulary(captured, allowed=()):
    return all(t in VOCABULARY or t in EMITTED_SUPPORT or t in allowed for t in captured.targets())


# --------------------------------------------------------------------------------------------
# softmax

# On CPU tensors as eager's CPU kernel computes it: exp * (1 / sum)
SOFTMAX = [aten.amax.default, aten.sub.Tensor, aten.exp.default, aten.sum.dim_IntList,
           aten.reciprocal.default, aten.mul.Tensor]  # fmt: skip
LOG_SOFTMAX = [aten.amax.default, aten.sub.Tensor, aten.exp.default, aten.sum.dim_IntList,
               aten.log.default, aten.sub.Tensor]  # fmt: skip


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(
    "fn, expected",
    [
        (lambda x: F.softmax(x, dim=-1), SOFTMAX),
        (lambda x: torch.softmax(x, 0), SOFTMAX),
        (lambda x: x.softmax(1), SOFTMAX),
        (lambda x: torch.special.softmax(x, -1), SOFTMAX),
        (lambda x: F.log_softmax(x, dim=-1), LOG_SOFTMAX),
        (lambda x: x.log_softmax(0), LOG_SOFTMAX),
    ],
)
def test_softmax(rewrite, fn, expected, layout, dtype):
    result = rewrite(decompose, fn, make((5, 7), dtype, layout))
    assert compute_targets(result) == expected
    assert all_vocabulary(result)
    if dtype is not torch.float32:
        targets = result.targets()
        assert targets[0] is CONVERT and CONVERT in targets[-2:]


def test_softmax_of_cuda_tensors_divides_as_eager_s_cuda_kernel(capture_graph):
    captured = capture_graph(lambda x: x.softmax(-1), make((4, 6), torch.float32))
    for node in captured.graph.nodes:
        node.meta["device"] = torch.device("cuda")  # (the meta values carry no device)
    assert decompose(captured.graph)
    assert compute_targets(captured) == SOFTMAX[:4] + [aten.div.Tensor]


def test_softmax_with_dtype(rewrite):
    x = make((4, 6), torch.float16)
    result = rewrite(decompose, lambda x: F.softmax(x, -1, dtype=torch.float32), x)
    assert result.targets()[0] is CONVERT and compute_targets(result) == SOFTMAX
    assert result.graph.find_nodes(op="output")[0].args[0][0].meta["val"].dtype == torch.float32


def test_softmax_of_masked_rows(rewrite):
    x = torch.randn(3, 5)
    x[0, 2:] = float("-inf")
    x[1] = float("-inf")  # every entry masked: NaN in eager and here
    rewrite(decompose, lambda x: F.softmax(x, -1), x)


def test_softmax_without_dim_is_left_alone(rewrite):
    with pytest.warns(UserWarning):
        result = rewrite(decompose, lambda x: F.softmax(x), make((3, 4)), expect_change=False)
    assert result.targets() == [F.softmax]


# --------------------------------------------------------------------------------------------
# normalizations


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("affine", ["none", "weight", "both"])
def test_layer_norm(rewrite, dtype, layout, affine):
    x = make((3, 4, 8), dtype, layout)
    w = make((8,), dtype) if affine != "none" else None
    b = make((8,), dtype) if affine == "both" else None
    result = rewrite(decompose, lambda x, w, b: F.layer_norm(x, (8,), w, b, 1e-5), x, w, b)
    # mean; d = x - mean; c = mean(d); var = mean(d * d) - c * c; (d - c) * rsqrt(var + eps)
    expected = [aten.sum.dim_IntList, aten.div.Tensor, aten.sub.Tensor,
                aten.sum.dim_IntList, aten.div.Tensor, aten.mul.Tensor,
                aten.sum.dim_IntList, aten.div.Tensor, aten.mul.Tensor, aten.sub.Tensor,
                aten.sub.Tensor, aten.add.Tensor, aten.rsqrt.default,
                aten.mul.Tensor]  # fmt: skip
    expected += {"none": [], "weight": [aten.mul.Tensor],
                 "both": [aten.mul.Tensor, aten.add.Tensor]}[affine]  # fmt: skip
    assert compute_targets(result) == expected


def test_layer_norm_over_two_dims_with_mixed_dtypes(rewrite):
    x = make((2, 3, 4, 5), torch.bfloat16)
    w, b = make((4, 5)), make((4, 5))  # fp32 affine parameters on a bf16 input
    result = rewrite(decompose, lambda x, w, b: torch.layer_norm(x, [4, 5], w, b, 1e-6), x, w, b)
    (sum_node, *_) = result.graph.find_nodes(op="call_function", target=aten.sum.dim_IntList)
    assert sum_node.args[1] == [2, 3]


@pytest.mark.parametrize("eps", [None, 1e-6])
@pytest.mark.parametrize("with_weight", [False, True])
def test_rms_norm(rewrite, dtype, eps, with_weight):
    x = make((4, 16), dtype, "transposed", low=-0.01, high=0.01)  # small: eps matters
    w = make((16,), dtype) if with_weight else None
    result = rewrite(decompose, lambda x, w: F.rms_norm(x, (16,), w, eps), x, w)
    expected = [aten.mul.Tensor, aten.sum.dim_IntList, aten.div.Tensor, aten.add.Tensor,
                aten.rsqrt.default, aten.mul.Tensor] + [aten.mul.Tensor] * with_weight  # fmt: skip
    assert compute_targets(result) == expected


@pytest.mark.parametrize("ndim", [2, 4])
def test_batch_norm_inference(rewrite, dtype, ndim):
    shape = (4, 3) if ndim == 2 else (2, 3, 4, 5)
    x = make(shape, dtype)
    rm, rv = make((3,)), make((3,), low=0.5, high=2.0)
    w, b = make((3,)), make((3,))
    result = rewrite(
        decompose, lambda x, rm, rv, w, b: F.batch_norm(x, rm, rv, w, b, False, 0.1, 1e-5),
        x, rm, rv, w, b,
    )  # fmt: skip
    assert F.batch_norm not in result.targets()
    assert aten.view.default in result.targets()
    assert all_vocabulary(result)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("form", ["F", "torch", "tuple_args"])
def test_max_pool2d_over_tiling_windows_is_a_reduction(rewrite, dtype, layout, form):
    x = make((2, 3, 8, 12), dtype, layout)
    x[0, 1, 2, 3] = float("nan")
    x[1, 2, 5, 0] = float("-inf")
    fn = {"F": lambda x: F.max_pool2d(x, 2),
          "torch": lambda x: torch.max_pool2d(x, 2),
          "tuple_args": lambda x: F.max_pool2d(x, (2, 3), (2, 3), 0, (1, 1))}[form]
    result = rewrite(decompose, fn, x)
    assert compute_targets(result) == [aten.unfold.default, aten.unfold.default,
                                       aten.amax.default, aten.squeeze.dims]


@pytest.mark.parametrize("kwargs", [dict(kernel_size=3, stride=2), dict(kernel_size=3), dict(kernel_size=(2, 3)),
                                    dict(kernel_size=3, stride=1)])
def test_max_pool2d_with_overlapping_windows_or_a_remainder(rewrite, kwargs):
    x = make((2, 3, 9, 8))  # kernel 3 leaves a remainder
    x[1, 1, 4, 4] = float("nan")
    result = rewrite(decompose, lambda x: F.max_pool2d(x, **kwargs), x)
    assert aten.amax.default in result.targets()


@pytest.mark.parametrize("kwargs", [dict(kernel_size=3, stride=2, padding=1), dict(kernel_size=2, padding=1),
                                    dict(kernel_size=2, ceil_mode=True), dict(kernel_size=2, dilation=2),
                                    dict(kernel_size=2, return_indices=True)])
def test_max_pool2d_with_padding_dilation_or_indices_is_left_to_torch(rewrite, kwargs):
    x = make((2, 3, 8, 8))
    result = rewrite(decompose, lambda x: F.max_pool2d(x, **kwargs), x, expect_change=False)
    assert F.max_pool2d in result.targets()


def test_torch_batch_norm_argument_order(rewrite):
    x, rm, rv, w, b = make((2, 3, 4)), make((3,)), make((3,), low=0.5), make((3,)), make((3,))
    rewrite(
        decompose,
        lambda x, rm, rv, w, b: torch.batch_norm(x, w, b, rm, rv, False, 0.1, 1e-5, False),
        x, rm, rv, w, b,
    )  # fmt: skip


@pytest.mark.parametrize("running_stats", [True, False])
def test_batch_norm_training_updates_running_stats_like_eager(capture_graph, dtype, running_stats):
    def f(x, rm, rv, w, b):
        return F.batch_norm(x, rm, rv, w, b, True, 0.1, 1e-5)

    def inputs():
        torch.manual_seed(1)
        x = make((4, 3, 5), dtype)
        rm, rv = (make((3,)), make((3,), low=0.5)) if running_stats else (None, None)
        return [x, rm, rv, make((3,)), make((3,))]

    captured = capture_graph(f, *inputs())
    assert decompose(captured.graph)
    captured.graph.lint()
    copies = captured.graph.find_nodes(op="call_function", target=aten.copy_.default)
    assert len(copies) == (2 if running_stats else 0)
    assert all_vocabulary(captured)
    eager_args, graph_args = inputs(), inputs()
    expected = f(*eager_args)
    (actual,) = captured.run(*[a for a in graph_args if a is not None])  # None is no input
    assert_close_to_eager(actual, expected)
    assert_close_to_eager(graph_args, eager_args, path="running stats")
    # DCE keeps the in-place updates although nothing uses them.
    captured.graph.eliminate_dead_code()
    assert len(captured.graph.find_nodes(op="call_function", target=aten.copy_.default)) == len(
        copies
    )


def test_batch_norm_module_in_training(capture_graph):
    bn = torch.nn.BatchNorm2d(3)
    eager_bn = torch.nn.BatchNorm2d(3)
    x = torch.randn(2, 3, 4, 4)
    with torch.no_grad():
        captured = capture_graph(bn, x)
        bn.load_state_dict(eager_bn.state_dict())
        assert decompose(captured.graph)
        captured.graph.lint()
        (out,) = captured.run()
        expected = eager_bn(x)
    assert_close_to_eager(out, expected)
    assert_close_to_eager(bn.state_dict(), eager_bn.state_dict())


# --------------------------------------------------------------------------------------------
# activations


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(
    "fn, expected",
    [
        (lambda x: F.gelu(x), [aten.gelu.default]),
        (lambda x: F.gelu(x, approximate="tanh"),
         [aten.mul.Tensor, aten.mul.Tensor, aten.mul.Tensor, aten.add.Tensor, aten.mul.Tensor,
          aten.exp.default, aten.add.Tensor, aten.div.Tensor]),
        (lambda x: F.silu(x), [aten.neg.default, aten.exp.default, aten.add.Tensor, aten.div.Tensor]),
        (lambda x: F.relu(x), [aten.relu.default]),
        (lambda x: torch.sigmoid(x), [aten.sigmoid.default]),
        (lambda x: F.tanh(x), [aten.tanh.default]),
    ],
)  # fmt: skip
def test_activations(rewrite, fn, expected, layout, dtype):
    result = rewrite(decompose, fn, make((4, 6), dtype, layout))
    assert compute_targets(result) == expected


# --------------------------------------------------------------------------------------------
# dropout


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: F.dropout(x, 0.5, training=False),
        lambda x: F.dropout(x, 0.0, training=True),
        lambda x: torch.dropout(x, 0.3, False),
    ],
)
def test_dropout_that_does_nothing_is_the_input(rewrite, fn):
    x = make((4, 6))
    assert fn(x) is x
    result = rewrite(decompose, lambda x: fn(x) + 1, x)
    (add,) = result.graph.find_nodes(op="call_function")
    assert add.args[0].op == "placeholder"


@pytest.mark.parametrize(
    "fn", [lambda x: F.dropout(x, 0.25), lambda x: torch.dropout(x, 0.25, True)]
)
def test_dropout_in_training(capture_graph, dtype, fn):
    x = make((64, 64), dtype, low=1.0, high=2.0)
    captured = capture_graph(fn, x)
    assert decompose(captured.graph)
    captured.graph.lint()
    assert captured.targets() == [aten.rand_like.default, aten.ge.Scalar, CONVERT,
                                  aten.div.Tensor, aten.mul.Tensor]  # fmt: skip
    (out,) = captured.run()
    assert out.dtype == dtype
    kept = out != 0
    assert 0.65 < kept.float().mean().item() < 0.85  # keeps 75% on average
    scale = torch.tensor(1 / 0.75, dtype=dtype)
    torch.testing.assert_close(out[kept], x[kept] * scale)


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: F.dropout(x, 0.5, training=True, inplace=True),
        lambda x: F.dropout(x, 1.0, training=True),
    ],
)
def test_unusual_dropout_is_left_alone(capture_graph, fn):
    captured = capture_graph(fn, make((4, 4)))
    before = captured.targets()
    assert not decompose(captured.graph)
    assert captured.targets() == before


# --------------------------------------------------------------------------------------------
# mean, var, std


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x.mean(),
        lambda x: x.mean(-1),
        lambda x: torch.mean(x, (0, 2), keepdim=True),
        lambda x: x.var(),
        lambda x: x.var(-1),
        lambda x: torch.var(x, 1, unbiased=False, keepdim=True),
        lambda x: torch.var(x, (0, 2), correction=2),
        lambda x: x.var(False),
        lambda x: torch.var(x, 0, True, True),
        lambda x: x.std(-1, correction=0),
        lambda x: torch.std(x),
        lambda x: torch.std(x, dim=[1, 2], keepdim=True),
    ],
)
def test_mean_var_std(rewrite, fn, layout, dtype):
    result = rewrite(decompose, fn, make((3, 4, 6), dtype, layout))
    assert all_vocabulary(result)


def test_mean_with_dtype(rewrite):
    result = rewrite(
        decompose, lambda x: x.mean(-1, dtype=torch.float32), make((3, 4), torch.float16)
    )
    assert compute_targets(result) == [aten.sum.dim_IntList, aten.div.Tensor, aten.squeeze.dims]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("source", [torch.float32, torch.float64, torch.int32])
def test_a_16_bit_mean_of_a_wider_input_rounds_once_as_eager_s_cpu_mean(rewrite, dtype, source):
    # eager's CPU mean(dtype=fp16/bf16) sums the values in fp32 and rounds the mean, not each
    # value: [2049, 1] in int32 has the fp16 mean 1025 (2049 alone rounds to 2048)
    torch.manual_seed(0)
    x = (torch.randn(16, 64) * 1000).to(source)
    x[0, :2] = torch.tensor([2049, 1])
    fn = lambda x: (x.mean(-1, dtype=dtype), x[0, :2].mean(dtype=dtype))  # noqa: E731
    rewrite(decompose, fn, x)
    got, want = framejit.compile(fn, backend="c")(x), fn(x)
    assert all(torch.equal(g, w) for g, w in zip(got, want)), (got, want)


@pytest.mark.filterwarnings("ignore:var... degrees of freedom:UserWarning")
def test_var_without_enough_elements_is_left_alone(rewrite):
    result = rewrite(
        decompose, lambda x: torch.var(x, 0, correction=2), make((2, 3)), expect_change=False
    )
    assert result.targets() == [torch.var]


# --------------------------------------------------------------------------------------------
# linear and addmm


@pytest.mark.parametrize("shape", [(4, 8), (2, 3, 8)])
def test_linear_with_pointwise_users_is_split(rewrite, dtype, shape):
    x, w, b = make(shape, dtype), make((5, 8), dtype), make((5,), dtype)
    result = rewrite(decompose, lambda x, w, b: F.gelu(F.linear(x, w, b)) * 2, x, w, b)
    assert compute_targets(result)[:3] == [aten.t.default, aten.matmul.default, aten.add.Tensor]


def test_linear_feeding_a_view_or_the_output_is_left_alone(rewrite):
    x, w, b = make((4, 8)), make((6, 8)), make((6,))
    result = rewrite(
        decompose,
        lambda x, w, b: (F.linear(x, w, b).view(-1), F.linear(x, w, b), F.linear(x, w).relu()),
        x, w, b,
        expect_change=False,
    )  # fmt: skip
    assert result.targets().count(F.linear) == 3


def test_linear_users_already_normalized(capture_graph):
    captured = capture_graph(lambda x, w, b: F.linear(x, w, b) + x, make((4, 4)), make((4, 4)),
                             make((4,)))  # fmt: skip
    normalize(captured.graph)
    assert decompose(captured.graph)
    assert F.linear not in captured.targets()


def test_addmm(rewrite):
    a, m, b = make((3, 4)), make((4, 5)), make((5,))
    result = rewrite(decompose, lambda b, a, m: torch.addmm(b, a, m).relu(), b, a, m)
    assert result.targets()[:2] == [aten.mm.default, aten.add.Tensor]
    result = rewrite(
        decompose, lambda b, a, m: torch.addmm(b, a, m, beta=2).relu(), b, a, m,
        expect_change=False,
    )  # fmt: skip
    assert torch.addmm in result.targets()


# --------------------------------------------------------------------------------------------
# autograd


@pytest.mark.parametrize(
    "fn",
    [
        lambda x, w: F.layer_norm(x, (4,), w),
        lambda x, w: F.softmax(x * w, -1),
        lambda x, w: F.gelu(x + w).mean(),
    ],
)
def test_nodes_that_require_grad_keep_their_composite_ops(capture_graph, fn):
    x, w = torch.randn(3, 4), torch.randn(4, requires_grad=True)
    captured = capture_graph(fn, x, w)
    before = captured.targets()
    assert not decompose(captured.graph)
    assert captured.targets() == before


# --------------------------------------------------------------------------------------------
# attention

SDPA = F.scaled_dot_product_attention


def _heads(q_heads, kv_heads, n=12, d=8):
    torch.manual_seed(0)
    return (torch.randn(2, q_heads, n, d), torch.randn(2, kv_heads, n, d),
            torch.randn(2, kv_heads, n, d))


@pytest.mark.parametrize("mask", ["none", "bool", "float", "scale"])
def test_attention_on_torch_s_math_path_is_matmuls_around_a_softmax(rewrite, mask):
    # Falcon's multi-query attention (one key/value head for four query heads) takes torch's
    # math path on CPU, whose softmax runs as six eager ops (where, isneginf, all, ...).
    q, k, v = _heads(4, 1)
    kwargs = {}
    if mask == "bool":
        m = torch.ones(12, 12, dtype=torch.bool).tril()
        m[5] = False  # a row with nothing to attend to: 0 there, as torch's safe softmax
        kwargs["attn_mask"] = m
    elif mask == "float":
        kwargs["attn_mask"] = torch.randn(2, 1, 12, 12)
    elif mask == "scale":
        kwargs["scale"] = 0.3
    result = rewrite(decompose, lambda q, k, v: SDPA(q, k, v, **kwargs), q, k, v,
                     rtol=1e-5, atol=1e-6)
    targets = result.targets()
    assert SDPA not in targets and targets.count(aten.matmul.default) == 2
    assert aten.amax.default in targets and aten.exp.default in targets
    assert all_vocabulary(result, allowed=(aten.matmul.default, aten.transpose.int))


@pytest.mark.parametrize("case", ["flash", "fp16", "dropout", "causal", "gqa"])
def test_attention_torch_runs_with_its_own_kernels_is_left_alone(rewrite, case):
    # Equal heads: torch's CPU flash kernel. Half precision, dropout, the causal and grouped-
    # query flags: left to torch too.
    q, k, v = _heads(4, {"gqa": 2, "dropout": 1}.get(case, 4))
    kwargs = {"causal": {"is_causal": True}, "gqa": {"enable_gqa": True},
              "dropout": {"dropout_p": 0.5}}.get(case, {})
    if case == "fp16":
        q, k, v = q.half(), k.half(), v.half()
    # dropout draws random numbers: compared through a product with 0
    fn = (lambda q, k, v: SDPA(q, k, v, **kwargs) * 0) if case == "dropout" else \
        (lambda q, k, v: SDPA(q, k, v, **kwargs))
    result = rewrite(decompose, fn, q, k, v, expect_change=False)
    assert SDPA in result.targets()


@pytest.mark.parametrize("form", ["layer_norm_fp16_params", "layer_norm_fp64_params",
                                  "batch_norm_fp64_stats", "batch_norm_eval_fp16_weight"])
def test_norms_with_parameters_eager_refuses_stay_in_torch_and_raise(form):
    # Eager's CPU kernels take an fp32 input only with fp32 parameters ("mixed dtype (CPU):
    # expect parameter to have scalar type of Float"); the decompositions computed a result.
    import framejit

    x = torch.randn(2, 3, 8)
    half, double = torch.randn(8).half(), torch.randn(8, dtype=torch.float64)
    forms = {
        "layer_norm_fp16_params": lambda x: F.layer_norm(x, (8,), half, half),
        "layer_norm_fp64_params": lambda x: F.layer_norm(x, (8,), double, None),
        "batch_norm_fp64_stats": lambda x: F.batch_norm(
            x, torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64),
            training=True, momentum=0.3),
        "batch_norm_eval_fp16_weight": lambda x: F.batch_norm(
            x, torch.zeros(3), torch.ones(3), torch.ones(3).half(), None),
    }
    fn = forms[form]
    with pytest.raises(RuntimeError) as eager:
        fn(x)
    with pytest.raises(RuntimeError) as compiled:
        framejit.compile(fn, backend="c")(x)
    assert str(compiled.value) == str(eager.value)


def test_mixed_precision_norms_on_cpu_still_decompose(rewrite):
    # fp32 parameters on a bf16 input: the CPU kernels' mixed mode, which eager takes.
    x = make((2, 3, 8), torch.bfloat16)
    w, b = make((8,)), make((8,))
    result = rewrite(decompose, lambda x, w, b: F.layer_norm(x, (8,), w, b), x, w, b)
    assert aten.rsqrt.default in result.targets()
    rm, rv = torch.zeros(3), torch.ones(3)
    result = rewrite(decompose, lambda x: F.batch_norm(x, rm, rv, w[:3], b[:3]), x)
    assert aten.rsqrt.default in result.targets()
