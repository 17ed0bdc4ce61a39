import collections
import gc
import linecache
import math
import operator
import textwrap
import traceback
import weakref

import pytest
import torch

from framejit.fx_ir import Graph, GraphModule, propagate_meta
from framejit.fx_ir.graph_module import compile_python


def test_python_code_golden(mlp):
    g, _ = mlp
    code = g.python_code()
    assert code.src == textwrap.dedent(
        """\
        def forward(self, x, w):
            linear_bias = self.linear.bias
            matmul = torch.matmul(x, w)
            add = matmul + linear_bias;  matmul = None
            relu = torch.relu(add);  add = None
            view = relu.view(2, -1)
            transpose = view.transpose(0, 1);  view = None
            return (transpose, relu)
        """
    )
    # torch as the code calls it: the callables captured, the rest from the module
    assert code.globals["torch"].matmul is torch.matmul and code.globals["torch"].relu is torch.relu
    assert code.globals["torch"].float32 is torch.float32 and code.globals["operator"] is operator
    assert code.lineno_to_node[3] == "matmul" and code.lineno_to_node[8] == "output"


def test_forward_fn_code_golden_binds_attributes_as_globals(mlp):
    g, attrs = mlp
    gm = GraphModule(attrs, g)
    assert gm.forward_fn_code == textwrap.dedent(
        """\
        def forward(x, w):
            matmul = torch.matmul(x, w)
            add = matmul + linear_bias;  matmul = None
            relu = torch.relu(add);  add = None
            view = relu.view(2, -1)
            transpose = view.transpose(0, 1);  view = None
            return (transpose, relu)
        """
    )
    assert gm.forward_fn.__globals__["linear_bias"] is attrs["linear.bias"]


def test_generated_code_matches_eager(mlp, mlp_reference):
    g, attrs = mlp
    gm = GraphModule(attrs, g)
    x, w = torch.randn(4, 16), torch.randn(16, 8)
    expected = mlp_reference(x, w, attrs["linear.bias"])
    for fn in (gm, gm.forward, gm.forward_fn):
        out = fn(x, w)
        assert isinstance(out, tuple) and len(out) == 2
        torch.testing.assert_close(out, expected)


def test_annotations_from_meta(mlp):
    g, attrs = mlp
    gm = GraphModule(attrs, g)
    propagate_meta(gm, torch.randn(4, 16), torch.randn(16, 8))
    src = g.python_code().src
    assert "    relu = torch.relu(add);  add = None  # f32[4, 8]\n" in src
    assert "# " not in g.python_code(annotate=False).src


class Pair(collections.namedtuple("Pair", "a b")):
    pass


@pytest.mark.parametrize(
    "value, text",
    [
        (3, "3"),
        (-7, "-7"),
        (2.5, "2.5"),
        (1e-300, "1e-300"),
        (0.1 + 0.2, "0.30000000000000004"),
        (math.inf, "float('inf')"),
        (-math.inf, "float('-inf')"),
        (True, "True"),
        (None, "None"),
        ("it's", '"it\'s"'),
        (b"\x00b", "b'\\x00b'"),
        (complex(1, -2), "complex(1.0, -2.0)"),
        (Ellipsis, "..."),
        (slice(1, None, -2), "slice(1, None, -2)"),
        (torch.float32, "torch.float32"),
        (torch.bfloat16, "torch.bfloat16"),
        (torch.int64, "torch.int64"),
        (torch.device("cpu"), "torch.device('cpu')"),
        (torch.device("cuda", 1), "torch.device('cuda:1')"),
        (torch.Size([2, 3]), "torch.Size([2, 3])"),
        (torch.contiguous_format, "torch.contiguous_format"),
        (torch.channels_last, "torch.channels_last"),
        (torch.strided, "torch.strided"),
        ((1,), "(1,)"),
        ((), "()"),
        ([1, (2, [3])], "[1, (2, [3])]"),
        ({"a": 1, 2: [None]}, "{'a': 1, 2: [None]}"),
        (torch.relu, "torch.relu"),
        (torch.nn.functional.gelu, "torch.nn.functional.gelu"),
        (torch.linalg.norm, "torch.linalg.norm"),
        (torch.Tensor.add, "torch.Tensor.add"),
        (operator.getitem, "operator.getitem"),
    ],
)
def test_constants_round_trip_as_literals(value, text):
    g = Graph()
    g.output(value)
    gm = GraphModule({}, g)
    assert gm.forward_fn_code == f"def forward():\n    return {text}\n"
    result = gm()
    assert type(result) is type(value)
    assert result == value


def test_nan_round_trips():
    g = Graph()
    g.output(math.nan)
    assert "float('nan')" in g.python_code().src
    assert math.isnan(GraphModule({}, g)())


def test_objects_without_literals_become_unique_globals():
    def helper(t, scale):
        return t * scale

    const = torch.tensor([1.0, 2.0])
    pair = Pair(1, 2)
    g = Graph()
    x = g.placeholder("x")
    # This node is named "helper": the global for the function must not collide with it.
    h = g.call_function(helper, (x, const), name="helper")
    h2 = g.call_function(helper, (h, const))
    g.output((h2, pair, len))
    code = g.python_code()
    assert "helper = helper_2(x, tensor_constant)" in code.src
    assert code.globals["helper_2"] is helper
    assert code.globals["tensor_constant"] is const
    assert code.globals["Pair"] is Pair and code.globals["len"] is len
    out, pair_out, len_out = GraphModule({}, g)(torch.ones(2))
    torch.testing.assert_close(out, torch.tensor([1.0, 4.0]))
    assert pair_out == pair and type(pair_out) is Pair and len_out is len


def test_operators_print_as_python_syntax_and_run():
    g = Graph()
    x = g.placeholder("x")
    y = g.placeholder("y")
    a = g.call_function(operator.add, (x, y))
    b = g.call_function(operator.pow, (-2.0, a))
    c = g.call_function(operator.neg, (b,))
    d = g.call_function(operator.getitem, (c, (slice(None), slice(1, 3))))
    e = g.call_function(operator.getitem, (d, (Ellipsis, None)))
    f = g.call_function(operator.getitem, (e, (0,)))
    row = g.call_function(operator.getitem, (x, slice(None, 1)))
    h = g.call_function(operator.matmul, (f, row))
    i = g.call_function(operator.truediv, (h, 2), {})
    g.output((i, g.call_function(operator.lt, (x, 0.5))))
    src = g.python_code(free_dead=False).src
    for line in [
        "add = x + y",
        "pow = (-2.0) ** add",
        "neg = -pow",
        "getitem = neg[:, 1:3]",
        "getitem_1 = getitem[..., None]",
        "getitem_2 = getitem_1[0,]",
        "getitem_3 = x[:1]",
        "matmul = getitem_2 @ getitem_3",
        "truediv = matmul / 2",
        "lt = x < 0.5",
    ]:
        assert f"    {line}\n" in src
    # Integer-valued floats: (-2.0) ** odd differs from -(2.0 ** odd), so parentheses matter.
    xv, yv = torch.randint(0, 3, (4, 4)).float(), torch.randint(0, 3, (4, 4)).float()
    z = -((-2.0) ** (xv + yv))
    expected = (z[:, 1:3][..., None][0,] @ xv[:1]) / 2
    out, mask = GraphModule({}, g)(xv, yv)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(mask, xv < 0.5)


def test_call_method_kwargs_and_defaults():
    g = Graph()
    x = g.placeholder("x")
    dim = g.placeholder("dim", default=1)
    s = g.call_method("sum", (x,), {"dim": dim, "keepdim": True, "dtype": torch.float64})
    g.output(s)
    src = g.python_code().src
    assert src.startswith("def forward(self, x, dim=1):\n")
    assert "sum = x.sum(dim=dim, keepdim=True, dtype=torch.float64)" in src
    gm = GraphModule({}, g)
    x = torch.randn(3, 4)
    torch.testing.assert_close(gm(x), x.sum(dim=1, keepdim=True, dtype=torch.float64))
    torch.testing.assert_close(gm(x, 0), x.sum(dim=0, keepdim=True, dtype=torch.float64))


def test_a_constant_size_is_a_tuple_for_torch_calls_and_a_size_for_others():
    # torch's C argument parser takes torch.Size about 5 µs slower than a tuple literal
    # (x.view(size) with a size the model computed); a Python callee still gets a torch.Size.
    seen = []

    def python_callee(t, size):
        seen.append(type(size))
        return t.reshape(size)

    g = Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.empty(2, 6)
    size = torch.Size([3, 4])
    v = g.call_method("view", (x, size))
    e = g.call_function(torch.zeros, (size,))
    p = g.call_function(python_callee, (x, size))
    g.output((v, e, p))
    src = g.python_code().src
    assert "x.view((3, 4))" in src and "torch.zeros((3, 4))" in src
    assert "(x, shape_3x4)" in src
    x = torch.randn(2, 6)
    v, e, p = GraphModule({}, g)(x)
    assert torch.equal(v, x.view(3, 4)) and torch.equal(p, v) and e.shape == (3, 4)
    assert seen == [torch.Size]


def test_node_names_never_shadow_names_the_code_needs():
    g = Graph()
    x = g.placeholder("float")  # generated code calls float('inf')
    t = g.placeholder("torch")
    y = g.call_function(torch.clamp, (x,), {"max": math.inf})
    g.output(g.call_function(torch.add, (y, t)))
    assert [n.name for n in g.nodes][:2] == ["float_", "torch_"]
    out = GraphModule({}, g)(torch.tensor([1.0, 5.0]), 1.0)
    torch.testing.assert_close(out, torch.tensor([2.0, 6.0]))


def test_dead_values_are_freed_after_last_use():
    refs = []

    def keep_ref(t):
        refs.append(weakref.ref(t))
        return t + 1

    def ref_alive(_):
        return refs[-1]() is not None

    g = Graph()
    x = g.placeholder("x")
    a = g.call_function(torch.neg, (x,))
    b = g.call_function(keep_ref, (a,), name="b")
    g.output((b, g.call_function(ref_alive, (b,))))
    assert "    b = keep_ref(neg);  neg = None\n" in g.python_code().src
    assert GraphModule({}, g)(torch.ones(2))[1] is False
    # Without freeing, the intermediate stays alive until the function returns.
    code = g.python_code("forward", self_arg=False, free_dead=False)
    assert compile_python(code)(torch.ones(2))[1] is True


def test_traceback_shows_generated_line():
    g = Graph()
    x = g.placeholder("x")
    w = g.placeholder("w")
    r = g.call_function(torch.relu, (x,))
    mm = g.call_function(torch.matmul, (r, w))
    g.output(mm)
    gm = GraphModule({}, g)
    with pytest.raises(RuntimeError) as info:
        gm(torch.randn(2, 3), torch.randn(4, 5))
    text = "".join(traceback.format_exception(info.value))
    assert 'File "<framejit-graph-' in text
    assert "matmul = torch.matmul(relu, w);  relu = None" in text
    frame = info.tb
    while frame.tb_next is not None:
        frame = frame.tb_next
    filename = frame.tb_frame.f_code.co_filename
    assert filename.startswith("<framejit-graph-")
    assert linecache.getline(filename, frame.tb_lineno).strip().startswith("matmul = ")


def test_linecache_entry_dies_with_the_function():
    g = Graph()
    g.output(g.call_function(torch.relu, (g.placeholder("x"),)))
    gm = GraphModule({}, g)
    filename = gm.forward_fn.__code__.co_filename
    assert filename in linecache.cache
    del gm
    gc.collect()
    assert filename not in linecache.cache


def test_number_on_the_left_of_a_tensor_prints_as_the_torch_call():
    # ``1 - t`` would reach Tensor.__rsub__, a Python wrapper; the code calls what it calls.
    g = Graph()
    t = g.placeholder("t")
    outs = [g.call_function(op, (c, t)) for op, c in ((operator.sub, 1), (operator.pow, 0.9),
                                                         (operator.truediv, 0.5), (operator.floordiv, 7),
                                                         (operator.mod, 3.0))]
    g.output(tuple(outs))
    gm = GraphModule({}, g)
    x = torch.rand(5) + 0.5
    propagate_meta(gm, x)
    src = g.python_code().src
    for call in ("torch.rsub(t, 1)", "torch.pow(0.9, t)", "t.reciprocal() * 0.5",
                 "torch.floor_divide(7, t)", "torch.remainder(3.0, t)"):
        assert call in src, src
    expected = (1 - x, 0.9 ** x, 0.5 / x, 7 // x, 3.0 % x)
    for out, want in zip(GraphModule({}, g)(x), expected):
        torch.testing.assert_close(out, want, rtol=0, atol=0)


def test_method_of_an_int_constant_parses():
    g = Graph()
    g.output(g.call_method("bit_length", (5,)))
    assert "(5).bit_length()" in g.python_code().src
    assert GraphModule({}, g)() == 3


def test_a_node_named_like_the_function_is_not_replaced_by_it():
    """forward_fn binds get_attr values as globals named after their nodes; `def forward` must
    not rebind the one called forward."""
    g = Graph()
    x = g.placeholder("x")
    g.output(g.call_function(torch.add, (x, g.get_attr("forward"))))
    gm = GraphModule({"forward": torch.tensor(2.0)}, g)
    assert gm(torch.tensor(1.0)).item() == 3.0
    assert gm.forward(torch.tensor(1.0)).item() == 3.0


def test_generated_code_calls_the_captured_callables_whatever_their_names_hold_later():
    # A graph that called torch.conv2d by its path looked the name up at every call: once the
    # program rebound torch.conv2d to an instrumenting wrapper, the graph called the wrapper,
    # which framejit then compiled into a graph calling torch.conv2d, which called the wrapper:
    # a RecursionError. The code now calls the object it captured.
    import framejit

    conv = torch.conv2d
    calls = []

    def counting_conv(*args, **kwargs):
        calls.append(1)
        return conv(*args, **kwargs)

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).eval()
    x = torch.randn(1, 3, 8, 8)
    compiled = framejit.compile(model, backend="eager")
    with torch.no_grad():
        compiled(x)
        torch.conv2d = counting_conv
        try:
            for _ in range(3):
                got = compiled(x)
        finally:
            torch.conv2d = conv
        want = model(x)  # nn.Conv2d calls F.conv2d, which the rebinding does not touch
    torch.testing.assert_close(got, want)
    assert calls == []


def test_pinned_modules_hold_called_paths_and_fall_back_to_the_module():
    from framejit.fx_ir.codegen import pinned_modules

    relu, gelu = torch.relu, torch.nn.functional.gelu
    roots = pinned_modules({"torch.relu": relu, "torch.nn.functional.gelu": gelu,
                            "torch.Tensor.view": torch.Tensor.view, "operator.add": operator.add})
    t = roots["torch"]
    assert t.relu is relu and t.nn.functional.gelu is gelu
    assert t.float16 is torch.float16 and t.Tensor is torch.Tensor  # the rest: the module's
    assert roots["operator"].add is operator.add
