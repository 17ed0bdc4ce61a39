import operator

import torch
import torch.fx

from framejit.fx_ir import Graph, GraphModule, propagate_meta, to_torch_fx


def test_converts_node_for_node_and_runs(mlp, mlp_reference):
    g, attrs = mlp
    gm = GraphModule(attrs, g)
    propagate_meta(gm, torch.randn(4, 16), torch.randn(16, 8))
    fx_gm = gm.to_torch_fx()
    assert isinstance(fx_gm, torch.fx.GraphModule)
    ours, theirs = list(g.nodes), list(fx_gm.graph.nodes)
    assert [(n.op, n.name) for n in ours] == [(n.op, n.name) for n in theirs]
    for a, b in zip(ours, theirs):
        if a.op not in ("placeholder", "output"):
            assert a.target == b.target
        assert a.meta["val"] is b.meta["val"] is b.meta["example_value"]
    relu = fx_gm.graph.find_nodes(op="call_function", target=torch.relu)[0]
    assert relu.args[0].name == "add"
    x, w = torch.randn(4, 16), torch.randn(16, 8)
    expected = mlp_reference(x, w, attrs["linear.bias"])
    torch.testing.assert_close(fx_gm(x, w), expected)
    torch.testing.assert_close(torch.fx.Interpreter(fx_gm).run(x, w), expected)
    fx_gm.graph.lint()


def test_module_attributes_are_shared_not_copied():
    lin = torch.nn.Linear(3, 2)
    g = Graph()
    x = g.placeholder("x")
    w = g.get_attr("lin.weight")
    h = g.call_module("lin", (x,))
    g.output(g.call_function(torch.add, (h, g.call_method("sum", (w,)))))
    fx_gm = to_torch_fx(GraphModule({"lin": lin}, g))
    assert fx_gm.lin is lin and fx_gm.lin.weight is lin.weight
    x = torch.randn(4, 3)
    torch.testing.assert_close(fx_gm(x), lin(x) + lin.weight.sum())


def test_constants_and_defaults_survive():
    g = Graph()
    x = g.placeholder("x")
    k = g.placeholder("k", default=2)
    sliced = g.call_function(operator.getitem, (x, (slice(None, k), Ellipsis, None)))
    full = g.call_function(
        torch.full,
        (torch.Size([1, 3, 1]), float("inf")),
        {"dtype": torch.float64, "device": torch.device("cpu")},
    )
    small = g.call_function(torch.minimum, (sliced, full))
    g.output({"small": small, "parts": [sliced]})
    fx_gm = to_torch_fx(GraphModule({}, g))
    x = torch.randn(4, 3)
    out = fx_gm(x)
    torch.testing.assert_close(out["parts"][0], x[:2, ..., None])
    inf = torch.full((1, 3, 1), float("inf"), dtype=torch.float64)
    torch.testing.assert_close(out["small"], torch.minimum(x[:2, ..., None], inf))
    torch.testing.assert_close(fx_gm(x, 3)["parts"][0], x[:3, ..., None])
