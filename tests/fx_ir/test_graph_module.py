import operator
import types

import pytest
import torch

from framejit.fx_ir import Graph, GraphModule


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)
        self.layers = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU())


def linear_graph() -> Graph:
    """x @ linear.weight.T + linear.bias via get_attr, then layers.0 via call_module."""
    g = Graph()
    x = g.placeholder("x")
    w = g.get_attr("linear.weight")
    b = g.get_attr("linear.bias")
    t = g.call_method("t", (w,))
    mm = g.call_function(torch.matmul, (x, t))
    add = g.call_function(operator.add, (mm, b))
    layer = g.call_module("layers.0", (add,))
    g.output(layer)
    return g


def test_module_root_parameters_and_submodules():
    torch.manual_seed(0)
    net = Net()
    gm = GraphModule(net, linear_graph())
    x = torch.randn(2, 4)
    expected = net.layers[0](net.linear(x))
    torch.testing.assert_close(gm(x), expected)
    torch.testing.assert_close(gm.forward(x), expected)
    assert "linear_weight = self.linear.weight" in gm.code
    assert "layers_0 = getattr(self.layers, '0')(add);  add = None" in gm.code
    # forward_fn binds the very parameter objects (no copies), so in-place updates are seen.
    assert gm.forward_fn.__globals__["linear_weight"] is net.linear.weight
    with torch.no_grad():
        net.linear.weight.zero_()
    torch.testing.assert_close(gm(x), net.layers[0](net.linear(x)))


def test_gradients_flow_to_parameters():
    torch.manual_seed(0)
    net = Net()
    gm = GraphModule(net, linear_graph())
    gm(torch.randn(2, 4)).sum().backward()
    assert net.linear.weight.grad is not None and net.layers[0].weight.grad is not None


def test_dict_root_with_qualified_and_top_level_keys():
    torch.manual_seed(0)
    net = Net()
    qualified = {
        "linear.weight": net.linear.weight,
        "linear.bias": net.linear.bias,
        "layers.0": net.layers[0],
    }
    top_level = {"linear": net.linear, "layers": net.layers}
    x = torch.randn(2, 4)
    expected = net.layers[0](net.linear(x))
    for root in (qualified, top_level):
        gm = GraphModule(root, linear_graph())
        torch.testing.assert_close(gm(x), expected)
        torch.testing.assert_close(gm.forward(x), expected)


def test_missing_attribute_error_names_it():
    with pytest.raises(AttributeError, match=r"'linear.weight'.*root does not provide"):
        GraphModule({"linear.bias": torch.zeros(3)}, linear_graph())


def test_forward_fn_is_a_plain_function_of_the_inputs():
    g = Graph()
    x = g.placeholder("x")
    y = g.placeholder("y")
    g.output(g.call_function(torch.add, (x, y)))
    gm = GraphModule({}, g)
    fn = gm.forward_fn
    assert type(fn) is types.FunctionType
    assert fn.__code__.co_varnames[: fn.__code__.co_argcount] == ("x", "y")
    assert fn.__qualname__ == "GraphModule.forward"
    torch.testing.assert_close(fn(torch.ones(2), torch.ones(2)), torch.full((2,), 2.0))


def test_recompile_after_editing_the_graph():
    g = Graph()
    x = g.placeholder("x")
    relu = g.call_function(torch.relu, (x,))
    out = g.output(relu)
    gm = GraphModule({}, g, class_name="Edited")
    x_val = torch.tensor([-1.0, 2.0])
    torch.testing.assert_close(gm(x_val), torch.tensor([0.0, 2.0]))
    with g.inserting_before(out):
        neg = g.call_function(torch.neg, (relu,))
    relu.replace_all_uses_with(neg)
    g.lint()
    torch.testing.assert_close(gm(x_val), torch.tensor([0.0, 2.0]))  # old code until recompile
    gm.recompile()
    torch.testing.assert_close(gm(x_val), torch.tensor([0.0, -2.0]))
    assert "neg = torch.neg(relu)" in gm.code
    assert repr(gm).startswith("Edited(\ndef forward(x):")


def test_each_compile_gets_its_own_file_name():
    g = Graph()
    g.output(g.call_function(torch.relu, (g.placeholder("x"),)))
    a, b = GraphModule({}, g), GraphModule({}, g)
    names = {a.forward_fn.__code__.co_filename, b.forward_fn.__code__.co_filename}
    assert len(names) == 2 and all(n.startswith("<framejit-graph-") for n in names)


def test_a_dead_function_s_file_name_is_used_again():
    # CPython keeps every file name it compiles under for good (about 60 bytes each): numbers
    # that only grew left that much behind for each graph of each dropped wrapper.
    import gc
    import linecache

    gc.collect()  # (earlier tests' dead functions give their numbers back now, not below)
    g = Graph()
    g.output(g.call_function(torch.relu, (g.placeholder("x"),)))
    first = GraphModule({}, g)
    name = first.forward_fn.__code__.co_filename
    del first
    gc.collect()
    assert name not in linecache.cache
    g2 = Graph()
    g2.output(g2.call_function(torch.neg, (g2.placeholder("x"),)))
    # The smallest free number goes first, and the collection may have freed smaller ones than
    # first's: it comes back within a few. Live functions never share a name.
    live = [GraphModule({}, g2) for _ in range(50)]
    names = [m.forward_fn.__code__.co_filename for m in live]
    assert name in names and len(set(names)) == len(names)
    assert "torch.neg" in "".join(linecache.getlines(name))
    again = live[names.index(name)]
    torch.testing.assert_close(again.forward_fn(torch.tensor([1.0, -2.0])), torch.tensor([-1.0, 2.0]))
