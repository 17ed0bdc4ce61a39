import operator

import pytest
import torch

from framejit.fx_ir import Graph, Node, map_aggregate, map_arg


def test_users_follow_nested_args():
    g = Graph()
    x, y, z = g.placeholder("x"), g.placeholder("y"), g.placeholder("z")
    cat = g.call_function(torch.cat, ([x, (y,)],), {"out_like": {"k": slice(z, None)}})
    assert cat.all_input_nodes == [x, y, z]
    for n in (x, y, z):
        assert list(n.users) == [cat]


def test_args_setter_updates_users():
    g = Graph()
    x, y = g.placeholder("x"), g.placeholder("y")
    add = g.call_function(operator.add, (x, x))
    assert list(x.users) == [add] and not y.users
    add.args = (y, 1)
    assert not x.users
    assert list(y.users) == [add]
    add.kwargs = {"alpha": x}
    assert list(x.users) == [add]
    add.update_arg(1, x)
    add.update_kwarg("alpha", 2)
    assert add.args == (y, x) and add.kwargs == {"alpha": 2}
    assert add.all_input_nodes == [y, x]


def test_users_keep_insertion_order():
    g = Graph()
    x = g.placeholder("x")
    a = g.call_function(torch.relu, (x,))
    b = g.call_function(torch.neg, (x,))
    c = g.call_function(torch.abs, (x,))
    assert list(x.users) == [a, b, c]


def test_replace_all_uses_with_keeps_users_right():
    g = Graph()
    x = g.placeholder("x")
    relu = g.call_function(torch.relu, (x,))
    a = g.call_function(torch.neg, (relu,))
    b = g.call_function(torch.cat, ([relu, a],))
    g.output((a, b))
    with g.inserting_after(relu):
        sig = g.call_function(torch.sigmoid, (relu,))
    changed = relu.replace_all_uses_with(sig)
    # sig itself uses relu; it must not start using itself.
    assert changed == [a, b]
    assert list(relu.users) == [sig]
    assert list(sig.users) == [a, b]
    assert a.args == (sig,) and b.args == ([sig, a],)
    g.lint()


def test_replace_all_uses_with_callback_filters():
    g = Graph()
    x, y = g.placeholder("x"), g.placeholder("y")
    a = g.call_function(torch.neg, (x,))
    b = g.call_function(torch.abs, (x,))
    g.output((a, b))
    changed = x.replace_all_uses_with(y, delete_user_cb=lambda user: user is b)
    assert changed == [b]
    assert list(x.users) == [a] and list(y.users) == [b]


def test_replace_input_with():
    g = Graph()
    x, y = g.placeholder("x"), g.placeholder("y")
    a = g.call_function(torch.add, (x, x), {"alpha": x})
    a.replace_input_with(x, y)
    assert a.args == (y, y) and a.kwargs == {"alpha": y}
    assert not x.users and list(y.users) == [a]


def test_node_from_other_graph_is_rejected():
    g1, g2 = Graph(), Graph()
    x = g1.placeholder("x")
    with pytest.raises(ValueError, match="belongs to another graph"):
        g2.call_function(torch.relu, (x,))


def test_repr_is_name():
    g = Graph()
    x = g.placeholder("x")
    assert repr(g.call_function(torch.relu, (x,))) == "relu"
    assert isinstance(x, Node) and "graph" in Node.__slots__


def test_node_rejects_bad_targets():
    g = Graph()
    x = g.placeholder("x")
    with pytest.raises(TypeError, match="callable"):
        g.call_function("relu", (x,))
    with pytest.raises(TypeError, match="str target"):
        g.call_method(torch.relu, (x,))
    with pytest.raises(ValueError, match="unknown node op"):
        g.create_node("call_lambda", torch.relu)


@pytest.mark.parametrize(
    "build, impure",
    [
        (lambda g, x: g.call_function(torch.relu, (x,)), False),
        (lambda g, x: g.call_method("view", (x, -1)), False),
        (lambda g, x: g.call_method("add_", (x, 1)), True),
        (lambda g, x: g.call_method("copy_", (x, x)), True),
        (lambda g, x: g.call_method("__add__", (x, 1)), False),
        (lambda g, x: g.call_method("__iadd__", (x, 1)), True),
        (lambda g, x: g.call_function(torch.relu_, (x,)), True),
        (lambda g, x: g.call_function(torch.Tensor.mul_, (x, 2)), True),
        (lambda g, x: g.call_function(operator.setitem, (x, 0, 1.0)), True),
        (lambda g, x: g.call_function(torch.Tensor.__setitem__, (x, 0, 1.0)), True),
        (lambda g, x: g.call_function(operator.iadd, (x, 1)), True),
        (lambda g, x: g.call_function(torch.add, (x, 1), {"out": x}), True),
        (lambda g, x: g.call_function(torch.rand_like, (x,)), True),
        (lambda g, x: g.call_function(torch.nn.functional.dropout, (x,)), True),
        (lambda g, x: g.call_function(torch.ops.aten.copy_.default, (x, x)), True),
        (lambda g, x: g.call_function(torch.ops.aten.add.out, (x, x), {"out": x}), True),
        (lambda g, x: g.call_function(torch.ops.aten.rand_like.default, (x,)), True),
        (lambda g, x: g.call_function(torch.ops.aten.add.Tensor, (x, 1)), False),
        (lambda g, x: g.call_function(torch.ops.prims.convert_element_type.default, (x, torch.float16)), False),
        (lambda g, x: g.get_attr("weight"), False),
        (lambda g, x: g.call_module("bn", (x,)), True),
        (lambda g, x: x, True),
    ],
)
def test_is_impure(build, impure):
    g = Graph()
    x = g.placeholder("x")
    assert build(g, x).is_impure() is impure


def test_meta_overrides_impurity():
    g = Graph()
    x = g.placeholder("x")
    relu = g.call_function(torch.relu, (x,))
    relu.meta["impure"] = True
    assert relu.is_impure()
    add_ = g.call_method("add_", (x, 1))
    add_.meta["impure"] = False
    assert not add_.is_impure()


def test_map_aggregate_keeps_constant_containers():
    size = torch.Size([2, 3])
    assert map_aggregate(size, lambda v: v) is size
    assert map_aggregate((1, [2, {"a": slice(3, 4)}]), lambda v: None if v is None else v * 10) == (
        10,
        [20, {"a": slice(30, 40)}],
    )
    g = Graph()
    x = g.placeholder("x")
    assert map_arg((x, [x], slice(None, x)), lambda n: n.name) == ("x", ["x"], slice(None, "x"))
