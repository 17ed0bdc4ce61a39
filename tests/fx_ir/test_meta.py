import operator

import pytest
import torch

from framejit.fx_ir import (
    Graph,
    GraphModule,
    MetaPropagationError,
    describe,
    propagate_meta,
    to_meta,
)
from framejit.fx_ir.meta import DTYPE_ABBREVIATIONS


def test_to_meta_keeps_shape_strides_dtype_requires_grad():
    t = torch.randn(4, 6, dtype=torch.float64).t()  # non-contiguous
    p = torch.nn.Parameter(torch.randn(3))
    i = torch.arange(5)
    out = to_meta({"t": t, "rest": [p, (i, 7, "s")]})
    mt, (mp, (mi, seven, s)) = out["t"], out["rest"]
    for meta, real in ((mt, t), (mp, p), (mi, i)):
        assert meta.device.type == "meta"
        assert meta.shape == real.shape
        assert meta.stride() == real.stride()
        assert meta.dtype == real.dtype
        assert meta.requires_grad == real.requires_grad
    assert mt.stride() == (1, 6) and mp.requires_grad and not mi.requires_grad
    assert (seven, s) == (7, "s")


@pytest.mark.parametrize(
    "value, text",
    [
        (torch.empty(4, 32), "f32[4, 32]"),
        (torch.empty(8, dtype=torch.int64), "i64[8]"),
        (torch.empty(2, 3, dtype=torch.bfloat16), "bf16[2, 3]"),
        (torch.empty((), dtype=torch.bool), "b8[]"),
        (torch.empty(1, dtype=torch.complex64, device="meta"), "c64[1]"),
        ((torch.empty(2), torch.empty(3)), "(f32[2], f32[3])"),
        ((torch.empty(2),), "(f32[2],)"),
        ([torch.empty(1, dtype=torch.float16), 3], "[f16[1], int]"),
        (None, "None"),
        (2.0, "float"),
    ],
)
def test_describe(value, text):
    assert describe(value) == text


def test_dtype_table_covers_common_dtypes():
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.uint8):
        assert dtype in DTYPE_ABBREVIATIONS
    assert len(set(DTYPE_ABBREVIATIONS.values())) == len(DTYPE_ABBREVIATIONS)


def test_propagate_meta_shapes_and_dtypes(mlp):
    g, attrs = mlp
    with g.inserting_before(g.output_node):
        relu = g.find_nodes(target=torch.relu)[0]
        half = g.call_method("to", (relu, torch.float16))
        arg = g.call_function(torch.argmax, (half,), {"dim": 1})
        parts = g.call_function(torch.split, (relu, [3, 5]), {"dim": 1})
        second = g.call_function(operator.getitem, (parts, 1))
        total = g.call_function(torch.sum, (second,))
    g.output_node.args = ((g.output_node.args[0], arg, total),)
    gm = GraphModule(attrs, g)
    out = propagate_meta(gm, torch.randn(4, 16), torch.randn(16, 8))
    vals = {n.name: n.meta["val"] for n in g.nodes}
    assert describe(vals["matmul"]) == "f32[4, 8]"
    assert describe(vals["linear_bias"]) == "f32[8]"
    assert describe(vals["view"]) == "f32[2, 16]"
    assert describe(vals["transpose"]) == "f32[16, 2]"
    assert vals["transpose"].stride() == (1, 16)
    assert describe(vals["to"]) == "f16[4, 8]"
    assert describe(vals["argmax"]) == "i64[4]"
    assert describe(vals["split"]) == "(f32[4, 3], f32[4, 5])"
    assert describe(vals["getitem"]) == "f32[4, 5]"
    assert describe(vals["sum"]) == "f32[]"
    assert all(v.device.type == "meta" for v in vals.values() if isinstance(v, torch.Tensor))
    assert describe(out) == "((f32[16, 2], f32[4, 8]), i64[4], f32[])"
    # Same shapes as running the real code.
    real = gm(torch.randn(4, 16), torch.randn(16, 8))
    assert describe(real) == describe(out)


def test_propagate_meta_tracks_requires_grad_and_in_place_ops():
    g = Graph()
    x = g.placeholder("x")
    y = g.call_function(torch.mul, (x, 2))
    y_ = g.call_method("add_", (y, 1))  # in-place on a non-leaf: fine in eager, fine here
    g.output(y_)
    propagate_meta(GraphModule({}, g), torch.randn(3, requires_grad=True))
    assert y.meta["val"].requires_grad and y_.meta["val"].requires_grad


def test_propagate_meta_call_module_and_defaults():
    lin = torch.nn.Linear(5, 2)
    g = Graph()
    x = g.placeholder("x")
    scale = g.placeholder("scale", default=torch.ones(2, dtype=torch.float64))
    h = g.call_module("lin", (x,))
    g.output(g.call_function(torch.mul, (h, scale)))
    propagate_meta(GraphModule({"lin": lin}, g), torch.randn(7, 5))
    assert describe(h.meta["val"]) == "f32[7, 2]"
    assert describe(g.output_node.meta["val"]) == "f64[7, 2]"


def test_propagate_meta_keeps_factories_and_device_moves_on_meta():
    g = Graph()
    x = g.placeholder("x")
    ones = g.call_function(torch.ones, (2, 3), {"device": torch.device("cpu")})
    arange = g.call_function(torch.arange, (3,))  # default device: converted afterwards
    moved = g.call_method("to", (x, "cuda", torch.float16))
    back = g.call_method("cpu", (moved,))
    g.output((ones, arange, moved, back))
    propagate_meta(GraphModule({}, g), torch.randn(2, 3))
    for node, text in ((ones, "f32[2, 3]"), (arange, "i64[3]"), (moved, "f16[2, 3]"),
                       (back, "f16[2, 3]")):
        assert node.meta["val"].device.type == "meta" and describe(node.meta["val"]) == text


def test_propagate_meta_on_bare_graph():
    g = Graph()
    x = g.placeholder("x")
    w = g.get_attr("w")
    g.output(g.call_function(torch.matmul, (x, w)))
    with pytest.raises(MetaPropagationError, match="pass the GraphModule"):
        propagate_meta(g, torch.randn(2, 3))
    w.meta["val"] = torch.empty(3, 4, device="meta")
    assert describe(propagate_meta(g, torch.randn(2, 3))) == "f32[2, 4]"


def test_propagate_meta_error_names_the_node():
    g = Graph()
    x = g.placeholder("x")
    item = g.call_method("item", (x,))
    g.output(item)
    with pytest.raises(MetaPropagationError) as info:
        propagate_meta(g, torch.randn(()))
    assert "node %item failed" in str(info.value)
    assert "%item = %x.item()" in str(info.value)
    assert info.value.__cause__ is not None


def test_propagate_meta_rejects_extra_inputs():
    g = Graph()
    g.output(g.placeholder("x"))
    with pytest.raises(TypeError, match="got 2 inputs but the graph has 1 placeholders"):
        propagate_meta(g, torch.randn(1), torch.randn(1))
