import operator

import pytest
import torch
import torch.nn.functional as F

import framejit
from framejit.backends.registry import Backend
from framejit.fx_ir import Graph, GraphModule
from framejit.passes import normalize
from framejit.passes.util import Builder, RuleTable, apply_rules
from framejit.passes.vocabulary import VOCABULARY

aten = torch.ops.aten
prims = torch.ops.prims
CONVERT = prims.convert_element_type.default


def make(shape, dtype, layout="contiguous", low=-2.0, high=2.0):
    """A tensor of ``shape`` in ``layout``: contiguous, transposed (last two dims swapped in
    memory) or strided (every other element of a wider tensor)."""
    if layout == "contiguous":
        t = torch.empty(shape)
    elif layout == "transposed":
        t = torch.empty(*shape[:-2], shape[-1], shape[-2]).transpose(-1, -2)
    else:
        t = torch.empty(*shape[:-1], shape[-1] * 2)[..., ::2]
    with torch.no_grad():
        t.uniform_(low, high)
    return t.to(dtype) if dtype != torch.float32 else t


LAYOUTS = ["contiguous", "transposed", "strided"]


# --------------------------------------------------------------------------------------------
# pointwise ops: each form becomes the listed vocabulary calls, in order

BINARY_CASES = {
    "operator.add": (lambda x, y: x + y, [aten.add.Tensor]),
    "add alpha": (lambda x, y: torch.add(x, y, alpha=2), [aten.mul.Tensor, aten.add.Tensor]),
    "add scalar": (lambda x, y: x + 1.5, [aten.add.Tensor]),
    "radd": (lambda x, y: 1.5 + x, [aten.add.Tensor]),
    "method add": (lambda x, y: x.add(y, alpha=0.5), [aten.mul.Tensor, aten.add.Tensor]),
    "sub": (lambda x, y: x - y, [aten.sub.Tensor]),
    "sub alpha": (lambda x, y: torch.sub(x, y, alpha=3), [aten.mul.Tensor, aten.sub.Tensor]),
    "rsub scalar": (lambda x, y: 2.0 - x, [aten.neg.default, aten.add.Tensor]),
    "torch.rsub": (lambda x, y: torch.rsub(x, 3.0), [aten.neg.default, aten.add.Tensor]),
    "torch.rsub tensors": (
        lambda x, y: torch.rsub(x, y, alpha=2),
        [aten.mul.Tensor, aten.sub.Tensor],
    ),
    "mul": (lambda x, y: x * y, [aten.mul.Tensor]),
    "rmul": (lambda x, y: 3 * x, [aten.mul.Tensor]),
    "div": (lambda x, y: x / y, [aten.div.Tensor]),
    "torch.div": (lambda x, y: torch.div(x, 4), [aten.div.Tensor]),
    "rdiv": (lambda x, y: 2.0 / x, [aten.reciprocal.default, aten.mul.Tensor]),
    "pow": (lambda x, y: x**2, [aten.pow.Tensor_Scalar]),
    "pow float": (lambda x, y: torch.pow(x, 0.5), [aten.pow.Tensor_Scalar]),
    "max pair": (lambda x, y: torch.max(x, y), [aten.maximum.default]),
    "min method": (lambda x, y: x.min(y), [aten.minimum.default]),
    "maximum": (lambda x, y: torch.maximum(x, y), [aten.maximum.default]),
    "lt": (lambda x, y: x < y, [aten.lt.Tensor]),
    "le scalar": (lambda x, y: x <= 0.5, [aten.le.Scalar]),
    "scalar lt": (lambda x, y: operator.lt(0.5, x), [aten.gt.Scalar]),
    "eq": (lambda x, y: torch.eq(x, y), [aten.eq.Tensor]),
    "ne method": (lambda x, y: x.ne(0), [aten.ne.Scalar]),
    "greater": (lambda x, y: torch.greater(x, y), [aten.gt.Tensor]),
    "and": (
        lambda x, y: (x > 0) & (y > 0),
        [aten.gt.Scalar, aten.gt.Scalar, aten.logical_and.default],
    ),
    "logical_or": (
        lambda x, y: torch.logical_or(x > 0, y),
        [aten.gt.Scalar, aten.logical_or.default],
    ),
    "invert": (lambda x, y: ~(x > 0), [aten.gt.Scalar, aten.logical_not.default]),
    "where": (lambda x, y: torch.where(x > 0, x, y), [aten.gt.Scalar, aten.where.self]),
    "where number": (
        lambda x, y: torch.where(x > 0, x, 0.0),
        [aten.gt.Scalar, aten.where.ScalarOther],
    ),
    "where number first": (
        lambda x, y: torch.where(x > 0, 1.0, y),
        [aten.gt.Scalar, aten.where.ScalarSelf],
    ),
    "where method": (lambda x, y: x.where(x > 0, y), [aten.gt.Scalar, aten.where.self]),
    "clamp": (lambda x, y: torch.clamp(x, min=-0.5, max=0.5), [aten.clamp.default]),
    "clamp method": (lambda x, y: x.clamp(min=0), [aten.clamp.default]),
    "clip": (lambda x, y: x.clip(max=1.0), [aten.clamp.default]),
    "clamp_min": (lambda x, y: torch.clamp_min(x, 0.1), [aten.clamp.default]),
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", list(BINARY_CASES))
def test_binary_and_friends(rewrite, case, layout, dtype):
    fn, expected = BINARY_CASES[case]
    x = make((4, 6), dtype, layout)
    y = make((6,), dtype)  # broadcasts against x
    result = rewrite(normalize, fn, x, y)
    if dtype in (torch.float16, torch.bfloat16) and expected[0] is aten.mul.Tensor \
            and len(expected) == 2:
        # an alpha: eager computes x + alpha * y in fp32 and rounds once
        convert = torch.ops.prims.convert_element_type.default
        expected = [convert, aten.mul.Tensor, convert, expected[1], convert]
    assert result.targets() == expected


UNARY_NAMES = [
    "neg",
    "abs",
    "exp",
    "log",
    "log1p",
    "expm1",
    "sqrt",
    "rsqrt",
    "reciprocal",
    "sin",
    "cos",
    "tanh",
    "sigmoid",
    "erf",
    "relu",
    "floor",
    "ceil",
    "sign",
    "isnan",
]


@pytest.mark.parametrize("form", ["torch", "method"])
@pytest.mark.parametrize("name", UNARY_NAMES)
def test_unary(rewrite, name, form, dtype):
    op = getattr(torch, name) if form == "torch" else (lambda x: getattr(x, name)())
    # Positive inputs keep log/sqrt finite; the NaN cases are compared too (equal_nan).
    x = make((3, 5), dtype, "transposed", low=0.1, high=3.0)
    result = rewrite(normalize, lambda x: op(x), x)
    assert result.targets() == [getattr(aten, name).default]


@pytest.mark.parametrize(
    "fn, name",
    [
        (lambda x: -x, "neg"),
        (lambda x: abs(x), "abs"),
        (lambda x: F.relu(x), "relu"),
        (lambda x: F.sigmoid(x), "sigmoid"),
        (lambda x: F.tanh(x), "tanh"),
        (lambda x: torch.special.expit(x), "sigmoid"),
        (lambda x: torch.special.erf(x), "erf"),
        (lambda x: torch.logical_not(x > 0), "logical_not"),
    ],
)
def test_unary_aliases(rewrite, fn, name):
    result = rewrite(normalize, fn, make((4, 4), torch.float32))
    assert getattr(aten, name).default in result.targets()
    assert all(t in VOCABULARY for t in result.targets())


@pytest.mark.parametrize(
    "fn, dtype, expected_dtype",
    [
        (lambda x: x + 2.5, torch.int64, torch.float32),
        (lambda x: x + 2, torch.int64, torch.int64),
        (lambda x: x * 1.5, torch.float16, torch.float16),
        (lambda x: x / 2, torch.int32, torch.float32),
        (lambda x: 2.0 / x, torch.int64, torch.float32),
        (lambda x: x + True, torch.bool, torch.bool),
        (lambda x: torch.where(x > 1, 1, 0), torch.int64, torch.int64),
        (lambda x: torch.where(x > 1, 1.0, 0.0), torch.int64, torch.float32),
        (lambda x: x > 1.5, torch.int32, torch.bool),
    ],
)
def test_type_promotion_with_python_numbers(rewrite, fn, dtype, expected_dtype):
    x = torch.arange(12).reshape(3, 4).to(dtype)
    if dtype is torch.bool:
        x = torch.arange(12).reshape(3, 4) % 3 == 0
    result = rewrite(normalize, fn, x)
    assert all(t in VOCABULARY for t in result.targets())
    assert GraphModule(result.root, result.graph)(*result.inputs)[0].dtype == expected_dtype


def test_reversed_sub_of_integers_is_left_to_torch(rewrite):
    # -x wraps for the most negative integer, so s - x stays an eager op.
    result = rewrite(normalize, lambda x: 2 - x, torch.arange(6), expect_change=False)
    assert result.targets() == [operator.sub]


# --------------------------------------------------------------------------------------------
# conversions


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x.to(torch.float16),
        lambda x: x.to(dtype=torch.float16),
        lambda x: x.to("cpu", torch.float16),
        lambda x: x.to(torch.device("cpu"), dtype=torch.float16, non_blocking=True),
        lambda x: x.half(),
        lambda x: x.type(torch.float16),
    ],
)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_dtype_change_becomes_convert(rewrite, fn, layout):
    result = rewrite(normalize, fn, make((4, 6), torch.float32, layout))
    assert result.targets() == [CONVERT]


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x.float(),
        lambda x: x.to(torch.float32),
        lambda x: x.type(torch.float32),
        lambda x: x.to("cpu", torch.float32),
        lambda x: x.to("cpu"),
        lambda x: x.to(torch.device("cpu")),
        lambda x: x.to(device="cpu", non_blocking=True),
        lambda x: x.contiguous(),
    ],
)
def test_identity_conversion_returns_the_input_itself(rewrite, fn):
    x = make((4, 6), torch.float32)
    assert fn(x) is x  # what torch does
    result = rewrite(normalize, lambda x: fn(x) * 2, x)
    assert result.targets() == [aten.mul.Tensor]
    mul = result.graph.find_nodes(op="call_function")[0]
    assert mul.args[0].op == "placeholder"


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x.to(torch.float16, copy=True),
        lambda x: x.to(memory_format=torch.channels_last),
        lambda x: x.to(torch.float16, memory_format=torch.contiguous_format),
        lambda x: x.to(x),
        lambda x: x.float(memory_format=torch.channels_last),
        lambda x: x.clone() + 0,  # only the add is rewritten: clone is in the vocabulary
    ],
)
def test_conversions_that_are_not_pure_dtype_changes_are_left_alone(rewrite, fn):
    x = make((2, 3, 4, 5), torch.float32)
    result = rewrite(normalize, fn, x, expect_change=None)
    assert CONVERT not in result.targets()


def test_contiguous_of_a_transposed_tensor_is_a_contiguous_clone(rewrite, dtype):
    x = make((4, 6), dtype, "transposed")
    result = rewrite(normalize, lambda x: x.contiguous(), x)
    assert result.targets() == [aten.clone.default]
    (clone,) = result.graph.find_nodes(op="call_function")
    assert clone.kwargs == {"memory_format": torch.contiguous_format}
    assert clone.meta["val"].is_contiguous()


@pytest.mark.parametrize("value", [float("-inf"), 0.5, 3, True])
@pytest.mark.parametrize("dtype_", [torch.float32, torch.bfloat16, torch.int32, torch.bool])
def test_masked_fill_with_a_number_is_where_in_the_input_dtype(rewrite, value, dtype_):
    x = (torch.randn(2, 3, 8, 8) * 4).to(dtype_)
    mask = torch.ones(8, 8, dtype=torch.bool).tril().logical_not()
    fn = lambda x, m: x.masked_fill(m, value)  # noqa: E731
    try:
        fn(x, mask)
    except RuntimeError:
        return  # eager refuses (a float into a bool tensor): nothing to compare
    changes = not ((dtype_ == torch.bool and type(value) is not bool)
                   or (not dtype_.is_floating_point and type(value) is float))
    result = rewrite(normalize, fn, x, mask, expect_change=changes)
    if changes:
        assert aten.where.ScalarSelf in result.targets()


@pytest.mark.parametrize("form", ["add", "sub", "rsub", "method"])
@pytest.mark.parametrize("dtypes", [(torch.int64, torch.int8), (torch.float32, torch.int8),
                                    (torch.int32, torch.uint8), (torch.float32, torch.float16)],
                         ids=["i64-i8", "f32-i8", "i32-u8", "f32-f16"])
def test_alpha_multiplies_in_the_result_dtype(rewrite, form, dtypes):
    # alpha * y is computed in the result's dtype, not y's: 3 * int8(100) is 300 added to an
    # int64 tensor, not int8's wrapped 44 (the compiled sum was wrong before).
    fn = {
        "add": lambda x, y: torch.add(x, y, alpha=3),
        "sub": lambda x, y: torch.sub(x, y, alpha=3),
        "rsub": lambda x, y: torch.rsub(y, x, alpha=3),
        "method": lambda x, y: x.add(y, alpha=3),
    }[form]
    x = torch.tensor([1, 2, 3, 4]).to(dtypes[0])
    y = torch.tensor([100, 90, 5, 127]).to(dtypes[1])
    result = rewrite(normalize, fn, x, y)
    assert aten.mul.Tensor in result.targets()


@pytest.mark.parametrize(
    "fn, dtype_",
    [
        (lambda x: x.clamp(max=1000), torch.int8),
        (lambda x: x.clamp(min=-256), torch.uint8),
        (lambda x: torch.clamp(x, -1e5, 1e5), torch.float16),
        (lambda x: x.masked_fill(x > 0, 128), torch.int8),
        (lambda x: x.masked_fill(x > 0, 1e300), torch.float32),
        (lambda x: torch.where(x > 0, x, 1000), torch.int8),
        (lambda x: torch.where(x > 0, -300, x), torch.uint8),
        (lambda x: torch.add(x, x, alpha=300), torch.int8),
        (lambda x: torch.add(x, x, alpha=True), torch.float32),
        (lambda x: torch.sub(x, x, alpha=1e5), torch.float16),
    ],
)
def test_numbers_eager_refuses_are_left_to_torch(targets_of, fn, dtype_, monkeypatch):
    # clamp's bounds, masked_fill's and where's values and alpha are converted to the tensor's
    # dtype with an overflow check, and alpha's kind is checked: eager raises, where a kernel
    # would wrap the number (int8 1000 -> -24) or ignore the check and return a result.
    # Capture makes such a call a graph break (tests/capture/test_cpu_refusals.py) where it
    # sees the number; the pass must still leave the call to torch where it does not (a number
    # that is a symbolic size, or a graph from elsewhere): the check is off here.
    from framejit.capture import examples
    monkeypatch.setattr(examples, "_check_cpu_takes", lambda *args: None)
    x = torch.tensor([3, -2, 5, 1]).to(dtype_)
    with pytest.raises(RuntimeError) as eager:
        fn(x)
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm.graph)
        return gm.forward_fn

    with pytest.raises(RuntimeError):  # the graph raises; the frame then runs as Python
        framejit.compile(fn, backend=Backend("record", record, native=True), fullgraph=True)(x)
    (graph,) = graphs
    normalize(graph)
    refused = {aten.clamp.default, aten.where.ScalarOther, aten.where.ScalarSelf,
               aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor}
    assert refused.isdisjoint(targets_of(graph)), str(graph)
    with pytest.raises(RuntimeError) as compiled:
        framejit.compile(fn)(x)
    assert str(compiled.value) == str(eager.value)


def test_numbers_that_fit_the_dtype_are_still_rewritten(rewrite):
    # The edges of what eager accepts: uint8 takes -255 (it wraps), floats take inf and NaN.
    u8 = torch.tensor([3, 200, 5, 1], dtype=torch.uint8)
    result = rewrite(normalize, lambda x: (x.clamp(max=-255), x.masked_fill(x > 4, -1)), u8)
    assert aten.clamp.default in result.targets() and aten.where.ScalarSelf in result.targets()
    h = torch.tensor([3.0, -2.0, 5.0, 1.0], dtype=torch.float16)
    result = rewrite(normalize, lambda x: (x.clamp(max=float("inf")), torch.where(x > 0, x, 6e4),
                                           torch.add(x, x, alpha=-6e4)), h)
    assert aten.clamp.default in result.targets() and aten.where.ScalarOther in result.targets()


def test_masked_fill_with_a_tensor_value_is_left_to_torch(rewrite):
    x, mask = torch.randn(4, 4), torch.rand(4, 4) > 0.5
    rewrite(normalize, lambda x, m: x.masked_fill(m, torch.tensor(2.0)), x, mask, expect_change=False)


def test_contiguous_of_a_value_from_an_op_is_left_to_torch(rewrite):
    # Only the real tensor knows whether it is contiguous: meta kernels may disagree.
    x = make((4, 6), torch.float32)
    result = rewrite(normalize, lambda x: torch.mm(x, x.t()).contiguous(), x, expect_change=None)
    assert "contiguous" in result.targets()


def test_type_as(rewrite):
    result = rewrite(
        normalize,
        lambda x, y: x.type_as(y),
        make((3, 3), torch.float32),
        make((3, 3), torch.bfloat16),
    )
    assert result.targets() == [CONVERT]


# --------------------------------------------------------------------------------------------
# reductions


REDUCTION_CASES = {
    "sum all": (lambda x: x.sum(), [aten.sum.dim_IntList, aten.squeeze.dims]),
    "sum dim": (lambda x: x.sum(-1), [aten.sum.dim_IntList, aten.squeeze.dims]),
    "sum keepdim": (lambda x: torch.sum(x, (0, 2), keepdim=True), [aten.sum.dim_IntList]),
    "amax": (lambda x: x.amax(-1), [aten.amax.default, aten.squeeze.dims]),
    "amin all": (lambda x: torch.amin(x), [aten.amin.default, aten.squeeze.dims]),
    "amin keepdim": (lambda x: torch.amin(x, (1, 0), True), [aten.amin.default]),
    "max all": (lambda x: x.max(), [aten.amax.default, aten.squeeze.dims]),
    "min all": (lambda x: torch.min(x), [aten.amin.default, aten.squeeze.dims]),
    "argmax": (lambda x: x.argmax(-1), [aten.argmax.default, aten.squeeze.dims]),
    "argmin keepdim": (lambda x: torch.argmin(x, 1, keepdim=True), [aten.argmin.default]),
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", list(REDUCTION_CASES))
def test_reductions(rewrite, case, layout, dtype):
    fn, expected = REDUCTION_CASES[case]
    result = rewrite(normalize, fn, make((3, 4, 6), dtype, layout))
    targets = [t for t in result.targets() if t is not CONVERT]
    assert targets == expected
    for node in result.graph.find_nodes(op="call_function"):
        if node.target in (aten.sum.dim_IntList, aten.amax.default, aten.amin.default):
            dims = node.args[1]
            assert dims == sorted(dims) and all(d >= 0 for d in dims) and node.args[2] is True


def test_half_sums_accumulate_in_fp32(rewrite):
    result = rewrite(normalize, lambda x: x.sum(-1), make((4, 8), torch.float16))
    assert result.targets() == [CONVERT, aten.sum.dim_IntList, CONVERT, aten.squeeze.dims]
    first, summed, back, _ = result.graph.find_nodes(op="call_function")
    assert first.args[1] is torch.float32 and back.args[1] is torch.float16


def test_full_sum_is_zero_dimensional(rewrite):
    result = rewrite(normalize, lambda x: x.sum(), make((3, 4), torch.float32))
    (out,) = result.graph.find_nodes(op="output")
    assert out.args[0][0].meta["val"].shape == torch.Size([])


def test_sum_with_dtype(rewrite):
    result = rewrite(
        normalize, lambda x: torch.sum(x, 1, dtype=torch.float32), torch.arange(12).reshape(3, 4)
    )
    assert result.targets() == [CONVERT, aten.sum.dim_IntList, aten.squeeze.dims]


@pytest.mark.parametrize(
    "fn, x",
    [
        (lambda x: x.sum(-1), torch.arange(12).reshape(3, 4)),  # int64 result: left to torch
        (lambda x: torch.max(x, 1), torch.randn(3, 4)),  # values and indices
        (lambda x: x.argmax(), torch.randn(3, 4)),  # index into the flattened tensor
        (lambda x: x.sum([]), torch.randn(3, 4)),  # legacy: every dim
        (lambda x: x.prod(-1), torch.randn(3, 4)),
    ],
)
def test_reductions_left_alone(rewrite, fn, x):
    captured = rewrite(normalize, fn, x, expect_change=False)
    assert not any(t in VOCABULARY for t in captured.targets())


# --------------------------------------------------------------------------------------------
# what normalize leaves alone


@pytest.mark.parametrize(
    "fn",
    [
        lambda x, y: x.view(-1).transpose(0, 0),
        lambda x, y: x @ y.t(),
        lambda x, y: x.t().t().add_(0),  # in place on a view of an input
        lambda x, y: x // 2,
        lambda x, y: x % 3,
        lambda x, y: torch.div(x, y, rounding_mode="floor"),
        lambda x, y: 2**x,
        lambda x, y: x**y,
        lambda x, y: torch.clamp(x, min=y),
        lambda x, y: torch.add(x, y, out=torch.empty(4, 4)),
    ],
)
def test_left_alone(rewrite, fn):
    x, y = make((4, 4), torch.float32), make((4, 4), torch.float32)
    captured = rewrite(normalize, fn, x, y, expect_change=None)
    changed = [t for t in captured.targets() if t in VOCABULARY and t is not aten.clone.default]
    assert changed == []


def test_in_place_add_on_an_input_is_left_alone(capture_graph):
    def f(x):
        x += 1  # the caller sees x change
        return x * 2

    captured = capture_graph(f, torch.randn(3))
    assert operator.iadd in captured.targets()
    normalize(captured.graph)
    captured.graph.lint()
    assert operator.iadd in captured.targets()


def test_nodes_that_require_grad_are_untouched(capture_graph):
    x = torch.randn(4, 4, requires_grad=True)
    captured = capture_graph(lambda x: (x * 2 + 1).sum(-1), x)
    before = captured.targets()
    assert not normalize(captured.graph)
    assert captured.targets() == before


def test_a_rewrite_of_the_wrong_dtype_is_rolled_back():
    g = Graph()
    x = g.placeholder("x")
    relu = g.call_function(torch.relu, (x,))
    g.output((relu,))
    x.meta.update(val=torch.empty(3, device="meta"), device=torch.device("cpu"))
    relu.meta.update(val=torch.empty(3, device="meta"), device=torch.device("cpu"))
    table = RuleTable()

    @table.register(torch.relu)
    def bad(b: Builder, input):
        b.unary("relu", input)
        return b.convert(input, torch.float16)

    assert not apply_rules(g, table)
    g.lint()
    assert [n.target for n in g.nodes if n.op == "call_function"] == [torch.relu]


# --------------------------------------------------------------------------------------------
# concatenation


def test_a_concatenation_with_empty_inputs_joins_the_others(rewrite):
    # A key/value cache's first update: cat of its empty start with the new keys.
    x, empty = torch.randn(2, 1, 8, 4), torch.empty(2, 1, 0, 4)
    result = rewrite(normalize, lambda x, e: torch.cat([e, x * 2], dim=-2), x, empty)
    assert aten.cat.default not in result.targets() and torch.cat not in result.targets()
    assert aten.clone.default in result.targets()
    result = rewrite(normalize, lambda x, e: torch.cat((e, x, e, x + 1), 2), x, empty)
    assert aten.cat.default in result.targets() and torch.cat not in result.targets()  # two left
    # A transposed input: the copy is laid out as cat lays out its result (contiguous).
    result = rewrite(normalize, lambda x, e: torch.cat([x.transpose(-1, -2), e.transpose(-1, -2)], -1),
                     x, empty)
    assert torch.cat not in result.targets()


def test_a_concatenation_whose_empty_input_decides_the_dtype_stays(rewrite):
    x, empty = torch.randn(3, 4), torch.empty(0, 4, dtype=torch.float64)
    result = rewrite(normalize, lambda x, e: torch.cat([e, x]), x, empty, expect_change=None)
    assert torch.cat in result.targets()


# --------------------------------------------------------------------------------------------
# in-place arithmetic


def test_in_place_add_on_a_matmul_result_nothing_else_reads_is_an_add(rewrite):
    # A parallel block's `attn_out += mlp_out` (Falcon, GPT-J): out of place, the next kernel
    # takes it as a prologue.
    x, w1, w2 = torch.randn(4, 8), torch.randn(8, 8), torch.randn(8, 8)

    def f(x, w1, w2):
        a = x @ w1
        a += x @ w2
        a *= 0.5
        return a

    result = rewrite(normalize, f, x, w1, w2)
    targets = result.targets()
    assert operator.iadd not in targets and operator.imul not in targets
    assert aten.add.Tensor in targets and aten.mul.Tensor in targets


def test_in_place_add_stays_where_the_old_value_is_read_or_the_tensor_is_not_fresh(
        rewrite, capture_graph):
    x, w = torch.randn(4, 8), torch.randn(8, 8)

    def read_again(x, w):
        a = x @ w
        v = a[0]  # a view: it sees the change
        a.add_(1)
        return v * 2

    def not_fresh(x, w):
        a = x.t().t()  # a view of the input, which the caller sees change
        a += 1
        return a @ w

    result = rewrite(normalize, read_again, x, w, expect_change=None)
    assert "add_" in result.targets()
    captured = capture_graph(not_fresh, x, w)
    normalize(captured.graph)
    captured.graph.lint()
    assert operator.iadd in captured.targets()


def test_in_place_add_keeps_the_mutated_tensor_s_dtype(rewrite):
    x, w, c = torch.randn(4, 8), torch.randn(8, 8), torch.randn(4, 8, dtype=torch.float64)

    def f(x, w, c):
        a = x @ w
        a += c  # computed in float64, stored in float32
        return a

    result = rewrite(normalize, f, x, w, c)
    assert operator.iadd not in result.targets()


@pytest.mark.parametrize("fresh, dtype", [("matmul", torch.int64), ("pointwise", torch.int64),
                                          ("pointwise", torch.int8), ("pointwise", torch.uint8)])
def test_in_place_arithmetic_eager_refuses_stays_in_place_and_raises(fresh, dtype):
    # torch's meta kernel of mul_ takes `y *= 1.5` on an integer tensor, where eager raises
    # "result type Float can't be cast to the desired output type Long": rewritten out of place
    # and converted back, it returned truncated products.
    x = torch.tensor([[1, 2], [3, 4]], dtype=dtype)

    def f(x):
        y = x @ x if fresh == "matmul" else x * 2
        y *= 1.5
        return y

    with pytest.raises(RuntimeError, match="can't be cast"):
        f(x)
    graphs = []

    def normalized(gm, example_inputs):
        normalize(gm.graph)
        gm.graph.lint()
        graphs.append(gm.graph)
        return GraphModule(gm.root, gm.graph).forward_fn

    compiled = framejit.compile(f, backend=Backend("normalized", normalized, native=True),
                                fullgraph=True)
    with pytest.raises(RuntimeError, match="can't be cast"):
        compiled(x)
    (graph,) = graphs
    assert operator.imul in [n.target for n in graph.nodes]
    with pytest.raises(RuntimeError, match="can't be cast"):
        framejit.compile(f, backend="c")(x)


@pytest.mark.parametrize("fn", [
    lambda x: x.split(32, dim=2),
    lambda x: x.split(40, -1),
    lambda x: torch.split(x, 7, 1),
    lambda x: torch.split(x, 100, dim=2),
])
def test_a_split_by_size_is_split_with_sizes(rewrite, fn):
    # The same views through torch's C binding (Tensor.split and torch.split are Python
    # functions around it: 9.6 µs a call against 3.5 µs).
    x = torch.randn(2, 8, 96)
    result = rewrite(normalize, fn, x)
    assert "split" not in result.targets() and torch.split not in result.targets()
    assert "split_with_sizes" in result.targets()
    got, want = result.run(), fn(x)
    assert [(t.shape, t.stride(), t.storage_offset()) for t in got] == \
        [(t.shape, t.stride(), t.storage_offset()) for t in want]


def test_a_split_into_sections_stays(rewrite):
    x = torch.randn(2, 8, 96)
    result = rewrite(normalize, lambda x: x.split([32, 64], 2), x, expect_change=None)
    assert "split" in result.targets()
