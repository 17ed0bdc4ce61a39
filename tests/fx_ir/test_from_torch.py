"""from_torch_fx: torch.fx graphs (hand-built, exported by to_torch_fx, traced, captured by
TorchDynamo) become framejit graphs that compute the same thing, with meta values and devices."""

import operator

import pytest
import torch
import torch.fx
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from framejit.fx_ir import (
    Graph,
    GraphModule,
    UnsupportedGraphError,
    describe,
    from_torch_fx,
    propagate_meta,
    to_torch_fx,
)
from framejit.testing import assert_close_to_eager


@pytest.fixture
def dynamo():
    """Captures graphs with torch.compile: ``capture(fn, *args)`` returns the torch.fx graphs
    and example inputs Dynamo hands to a backend."""
    import torch._dynamo

    torch._dynamo.reset()
    recorded = []

    def recording_backend(gm, example_inputs):
        recorded.append((gm, list(example_inputs)))
        return gm.forward

    def capture(fn, *args, **options):
        recorded.clear()
        torch.compile(fn, backend=recording_backend, **options)(*args)
        return list(recorded)

    yield capture
    torch._dynamo.reset()


def check_same_graph(ours, fx_gm):
    """Node for node: same ops, names and call targets."""
    theirs = list(fx_gm.graph.nodes)
    assert [(n.op, n.name) for n in ours.graph.nodes] == [(n.op, n.name) for n in theirs]
    for a, b in zip(ours.graph.nodes, theirs):
        if a.op not in ("placeholder", "output"):
            assert a.target == b.target
    ours.graph.lint()


def check_meta(gm, *devices):
    """Every tensor node but the output has a meta val on the meta device and a real device."""
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and node.op != "output":
            assert val.device.type == "meta", node.name
            assert node.meta["device"] in devices, (node.name, node.meta["device"])


# -- round trips through to_torch_fx -------------------------------------------------------------


def test_round_trip_of_a_framejit_graph(mlp, mlp_reference):
    g, attrs = mlp
    x, w = torch.randn(4, 16), torch.randn(16, 8)
    gm = GraphModule(attrs, g)
    propagate_meta(gm, x, w)
    fx_gm = to_torch_fx(gm)
    back = from_torch_fx(fx_gm, [x, w])
    check_same_graph(back, fx_gm)
    for a, b in zip(g.nodes, back.graph.nodes):
        assert describe(a.meta["val"]) == describe(b.meta["val"])
    assert back.root["linear.bias"] is attrs["linear.bias"]
    check_meta(back, torch.device("cpu"))
    expected = mlp_reference(x, w, attrs["linear.bias"])
    assert_close_to_eager(back(x, w), expected)
    assert_close_to_eager(back.forward(x, w), expected)


def test_round_trip_keeps_modules_defaults_and_constants():
    lin = torch.nn.Linear(3, 2)
    g = Graph()
    x = g.placeholder("x")
    k = g.placeholder("k", default=2)
    h = g.call_module("lin", (x,))
    w = g.get_attr("lin.weight")
    sliced = g.call_function(operator.getitem, (h, slice(None, k)))
    full = g.call_function(torch.full, ((1, 2), 0.5), {"device": torch.device("cpu")})
    g.output({"y": g.call_function(torch.add, (sliced, full)), "w": g.call_method("sum", (w,))})
    fx_gm = to_torch_fx(GraphModule({"lin": lin}, g))

    back = from_torch_fx(fx_gm, [torch.randn(4, 3)])  # k takes its default
    check_same_graph(back, fx_gm)
    assert [n.op for n in back.graph.nodes if n.target == "lin"] == ["call_module"]
    assert back.root["lin"] is lin
    # to_torch_fx gave the weight a top-level name (torch.fx would write into `lin` otherwise)
    [weight] = [n for n in back.graph.find_nodes(op="get_attr") if n.meta["val"].dim() == 2]
    assert back.root[weight.target] is lin.weight
    full_node = back.graph.find_nodes(op="call_function", target=torch.full)[0]
    assert full_node.meta["val"].device.type == "meta"  # a factory allocates nothing
    assert full_node.meta["device"] == torch.device("cpu")
    for x in (torch.randn(4, 3), torch.randn(5, 3)):
        assert_close_to_eager(back(x), fx_gm(x))
        assert_close_to_eager(back(x, 3), fx_gm(x, 3))


def test_symbolically_traced_module_keeps_call_module():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)
            self.scale = torch.nn.Parameter(torch.tensor(2.0))

        def forward(self, x):
            return torch.relu(self.lin(x)) * self.scale

    net = Net()
    fx_gm = torch.fx.symbolic_trace(net)
    x = torch.randn(2, 4)
    gm = from_torch_fx(fx_gm, [x])
    check_same_graph(gm, fx_gm)
    assert {n.op for n in gm.graph.nodes} >= {"call_module", "get_attr"}
    assert gm.root["lin"] is net.lin and gm.root["scale"] is net.scale
    assert_close_to_eager(gm(x), net(x))


# -- graphs captured by TorchDynamo --------------------------------------------------------------


def pointwise_softmax_layer_norm(x, y):
    z = torch.sin(x) * y + 1
    z = F.softmax(z, -1)
    return F.layer_norm(z, (z.shape[-1],)), z.sum()


def test_dynamo_graph_of_a_function(dynamo):
    x, y = torch.randn(3, 8), torch.randn(3, 8)
    [(fx_gm, example_inputs)] = dynamo(pointwise_softmax_layer_norm, x, y)
    gm = from_torch_fx(fx_gm, example_inputs)
    check_same_graph(gm, fx_gm)
    check_meta(gm, torch.device("cpu"))
    for node, fx_node in zip(gm.graph.nodes, fx_gm.graph.nodes):
        example = fx_node.meta.get("example_value")
        if isinstance(example, torch.Tensor):
            assert node.meta["val"].shape == example.shape
    for _ in range(2):
        x, y = torch.randn(3, 8), torch.randn(3, 8)
        assert_close_to_eager(gm(x, y), pointwise_softmax_layer_norm(x, y))


def test_dynamo_graph_of_a_module_takes_parameters_as_inputs(dynamo):
    mlp = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
    x = torch.randn(3, 4)
    [(fx_gm, example_inputs)] = dynamo(mlp, x)
    gm = from_torch_fx(fx_gm, example_inputs)
    placeholders = gm.graph.find_nodes(op="placeholder")
    # Dynamo inlines the module: its parameters are graph inputs, not attributes.
    assert len(placeholders) == 5 and not gm.root
    assert sum(p.meta["val"].requires_grad for p in placeholders) == 4
    assert_close_to_eager(gm(*example_inputs), fx_gm(*example_inputs))


def test_dynamo_graph_with_grad_mode_switches_and_buffer_updates(dynamo):
    bn = torch.nn.BatchNorm1d(3)

    def f(x):
        with torch.no_grad():
            y = x * 2
        return bn(x) + y

    x = torch.randn(4, 3, requires_grad=True)
    [(fx_gm, example_inputs)] = dynamo(f, x)
    gm = from_torch_fx(fx_gm, example_inputs)
    assert torch.is_grad_enabled()
    switches = gm.graph.find_nodes(op="call_function", target=torch._C._set_grad_enabled)
    assert len(switches) == 2 and all(n.meta["impure"] for n in switches)
    assert not gm.graph.eliminate_dead_code()  # the switches and bn's buffer update stay
    y = gm.graph.find_nodes(op="call_function", target=operator.mul)[0]
    assert not y.meta["val"].requires_grad
    batches = bn.num_batches_tracked.item()
    out = gm(*example_inputs)
    assert bn.num_batches_tracked.item() == batches + 1
    assert out[0].requires_grad


def test_dynamo_graph_with_a_factory_on_the_input_device(dynamo):
    def causal(x):
        mask = torch.tril(torch.ones(x.shape[-1], x.shape[-1], device=x.device, dtype=torch.bool))
        return x.masked_fill(~mask, float("-inf")).softmax(-1)

    x = torch.randn(2, 5, 5)
    [(fx_gm, example_inputs)] = dynamo(causal, x)
    gm = from_torch_fx(fx_gm, example_inputs)
    check_meta(gm, torch.device("cpu"))
    assert_close_to_eager(gm(x), (causal(x),))


def test_fake_tensor_example_inputs(dynamo):
    mlp = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU())
    [(fx_gm, example_inputs)] = dynamo(mlp, torch.randn(3, 4))
    fakes = [FakeTensorMode().from_tensor(t) for t in example_inputs]
    gm = from_torch_fx(fx_gm, fakes)
    real = from_torch_fx(fx_gm, example_inputs)
    for a, b in zip(gm.graph.nodes, real.graph.nodes):
        assert describe(a.meta["val"]) == describe(b.meta["val"])
        assert a.meta.get("device") == b.meta.get("device")
    assert_close_to_eager(gm(*example_inputs), fx_gm(*example_inputs))


def test_devices_come_from_the_recorded_fake_tensors():
    # A graph whose example values live on CUDA converts on any machine: only metadata is read.
    fx_gm = torch.fx.symbolic_trace(lambda x, w: torch.relu(x @ w).sum(0))
    with FakeTensorMode() as mode:
        x = torch.empty(4, 3, device="cuda")
        w = torch.empty(3, 2, device="cuda")
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    FakeTensorProp(fx_gm, mode).propagate_dont_convert_inputs(x, w)
    gm = from_torch_fx(fx_gm, [x, w])
    check_meta(gm, torch.device("cuda", 0))
    assert describe(gm.graph.output_node.meta["val"]) == "f32[2]"


# -- what is refused -----------------------------------------------------------------------------


def test_dynamic_shapes_are_refused(dynamo):
    graphs = dynamo(lambda x: x * 2, torch.randn(3), dynamic=True)
    [(fx_gm, example_inputs)] = graphs
    with pytest.raises(UnsupportedGraphError, match=r"dynamic shapes.*dynamic=False"):
        from_torch_fx(fx_gm, example_inputs)


def test_autocast_regions_are_refused(dynamo):
    def f(x):
        with torch.autocast("cpu"):
            return x @ x

    [(fx_gm, example_inputs)] = dynamo(f, torch.randn(3, 3))
    with pytest.raises(UnsupportedGraphError, match="autocast"):
        from_torch_fx(fx_gm, example_inputs)
    assert not torch.is_autocast_enabled("cpu")


def test_inputs_that_are_not_tensors_or_constants_are_refused():
    fx_gm = torch.fx.symbolic_trace(lambda x, obj: x)
    with pytest.raises(UnsupportedGraphError, match="input 'obj' is of type object"):
        from_torch_fx(fx_gm, [torch.randn(2), object()])
    with pytest.raises(UnsupportedGraphError, match="sparse|layout"):
        from_torch_fx(fx_gm, [torch.randn(2, 2).to_sparse(), 1])


def test_ops_without_meta_kernels_and_disagreements_are_refused():
    fx_gm = torch.fx.symbolic_trace(lambda x: x.item())
    with pytest.raises(UnsupportedGraphError, match="meta tensors.*item"):
        from_torch_fx(fx_gm, [torch.randn(())])

    fx_gm = torch.fx.symbolic_trace(lambda x: x + 1)
    add = fx_gm.graph.find_nodes(op="call_function", target=operator.add)[0]
    add.meta["example_value"] = torch.empty(2, dtype=torch.float16, device="meta")
    disagreement = r"computes f32\[2\] but the torch.fx graph records f16\[2\]"
    with pytest.raises(UnsupportedGraphError, match=disagreement):
        from_torch_fx(fx_gm, [torch.randn(2)])


def test_a_failure_half_way_restores_grad_mode():
    g = torch.fx.Graph()
    x = g.placeholder("x")
    g.call_function(torch._C._set_grad_enabled, (False,))
    g.output(g.call_method("item", (x,)))
    with pytest.raises(UnsupportedGraphError):
        from_torch_fx(torch.fx.GraphModule({}, g), [torch.randn(())])
    assert torch.is_grad_enabled()
