import operator
import textwrap

import pytest
import torch

from framejit.fx_ir import Graph, propagate_meta
from framejit.fx_ir.graph_module import GraphModule


def test_names_are_unique_and_derived_from_targets():
    g = Graph()
    x = g.placeholder("L['x']")
    y = g.placeholder("input")
    a = g.call_function(torch.add, (x, y))
    b = g.call_function(operator.add, (a, 1))
    c = g.call_function(torch.add, (b, 1), name="add_1")  # taken: gets the next free number
    w = g.get_attr("layers.0.weight")
    lam = g.call_function(lambda t: t, (c,))
    m = g.call_method("view", (lam, -1))
    cls = g.placeholder("class")
    assert [n.name for n in (x, y, a, b, c, w, lam, m, cls)] == [
        "L_x",
        "input",
        "add",
        "add_1",
        "add_2",
        "layers_0_weight",
        "lambda_",
        "view",
        "class_",
    ]
    assert x.target == "L['x']"  # the target keeps the name as given


def test_str_golden(mlp):
    g, _ = mlp
    assert str(g) == textwrap.dedent(
        """\
        %x = placeholder()
        %w = placeholder()
        %linear_bias = get_attr[linear.bias]
        %matmul = torch.matmul(%x, %w)
        %add = operator.add(%matmul, %linear_bias)
        %relu = torch.relu(%add)
        %view = %relu.view(2, -1)
        %transpose = %view.transpose(0, 1)
        output (%transpose, %relu)"""
    )


def test_str_golden_with_meta_types(mlp):
    g, attrs = mlp
    gm = GraphModule(attrs, g)
    propagate_meta(gm, torch.randn(4, 16), torch.randn(16, 8))
    with g.inserting_before(g.output_node):
        x = g.find_nodes(op="placeholder")[0]
        split = g.call_function(torch.split, (x, [6, 10]), {"dim": 1})
        first = g.call_function(operator.getitem, (split, 0))
    split.meta["val"] = (torch.empty(4, 6), torch.empty(4, 10, dtype=torch.int64))
    first.meta["val"] = torch.empty(2, 3, dtype=torch.bfloat16)
    assert str(g) == textwrap.dedent(
        """\
        %x : f32[4, 16] = placeholder()
        %w : f32[16, 8] = placeholder()
        %linear_bias : f32[8] = get_attr[linear.bias]
        %matmul : f32[4, 8] = torch.matmul(%x, %w)
        %add : f32[4, 8] = operator.add(%matmul, %linear_bias)
        %relu : f32[4, 8] = torch.relu(%add)
        %view : f32[2, 16] = %relu.view(2, -1)
        %transpose : f32[16, 2] = %view.transpose(0, 1)
        %split : (f32[4, 6], i64[4, 10]) = torch.split(%x, [6, 10], dim=1)
        %getitem : bf16[2, 3] = operator.getitem(%split, 0)
        output (%transpose, %relu)"""
    )


def test_str_prints_constants_readably():
    g = Graph()
    x = g.placeholder("x", default=None)
    y = g.call_function(
        torch.full,
        ((2,), float("-inf")),
        {"dtype": torch.float16, "device": torch.device("cpu"), "layout": torch.strided},
    )
    z = g.call_function(operator.getitem, (x, (slice(None, 2), Ellipsis, None)))
    g.output([y, z])
    assert str(g).splitlines() == [
        "%x = placeholder(default=None)",
        "%full = torch.full((2,), float('-inf'), dtype=torch.float16, "
        "device=torch.device('cpu'), layout=torch.strided)",
        "%getitem = operator.getitem(%x, (slice(None, 2), ..., None))",
        "output [%full, %getitem]",
    ]


def test_len_iteration_and_reversed(mlp):
    g, _ = mlp
    names = [n.name for n in g.nodes]
    assert len(g.nodes) == len(names) == 9
    assert [n.name for n in reversed(g.nodes)] == names[::-1]
    assert g.output_node is list(g.nodes)[-1]


def test_erasing_current_node_while_iterating():
    g = Graph()
    x = g.placeholder("x")
    nodes = [g.call_function(torch.neg, (x,)) for _ in range(4)]
    g.output(x)
    seen = []
    for node in g.nodes:
        seen.append(node.name)
        if node.op == "call_function":
            g.erase_node(node)
    assert seen == ["x", "neg", "neg_1", "neg_2", "neg_3", "output"]
    assert [n.name for n in g.nodes] == ["x", "output"]
    assert len(g.nodes) == 2
    assert list(x.users) == [g.output_node]
    assert all(n not in g.nodes for n in nodes)
    g.lint()


def test_erase_node_with_users_fails_with_hint():
    g = Graph()
    x = g.placeholder("x")
    relu = g.call_function(torch.relu, (x,))
    g.output(relu)
    with pytest.raises(RuntimeError, match=r"still used by %output.*replace_all_uses_with"):
        g.erase_node(relu)


def test_inserting_before_and_after_keep_creation_order():
    g = Graph()
    x = g.placeholder("x")
    relu = g.call_function(torch.relu, (x,))
    out = g.output(relu)
    with g.inserting_after(x):
        a = g.call_function(torch.neg, (x,))
        b = g.call_function(torch.abs, (a,))
    with g.inserting_before(out):
        c = g.call_function(torch.sin, (relu,))
        d = g.call_function(torch.cos, (c,))
    with g.inserting_before():
        y = g.placeholder("y")
    assert list(g.nodes) == [y, x, a, b, relu, c, d, out]
    # Outside the blocks, nodes are appended at the end again.
    tan = g.call_function(torch.tan, (x,))
    assert list(g.nodes)[-1] is tan


def test_prepend_and_append_move_nodes():
    g = Graph()
    x = g.placeholder("x")
    a = g.call_function(torch.neg, (x,))
    b = g.call_function(torch.abs, (x,))
    g.output((a, b))
    a.prepend(b)
    assert [n.name for n in g.nodes] == ["x", "abs", "neg", "output"]
    a.append(b)
    assert [n.name for n in g.nodes] == ["x", "neg", "abs", "output"]
    g.lint()


def test_find_nodes(mlp):
    g, _ = mlp
    assert [n.name for n in g.find_nodes(op="placeholder")] == ["x", "w"]
    assert [n.name for n in g.find_nodes(op="call_function", target=torch.relu)] == ["relu"]
    assert [n.name for n in g.find_nodes(target="view")] == ["view"]
    assert g.find_nodes(op="call_module") == []


def test_dce_removes_dead_pure_nodes_and_keeps_impure_ones():
    g = Graph()
    x = g.placeholder("x")
    unused_param = g.placeholder("unused")
    dead = g.call_function(torch.relu, (x,))
    g.call_function(torch.neg, (dead,))  # dead chain: neg uses relu
    g.call_method("add_", (x, 1))  # in-place: must stay
    g.call_function(operator.setitem, (x, 0, 2.0))
    g.call_function(torch.add, (x, 1), {"out": x})
    flagged = g.call_function(torch.sin, (x,))
    flagged.meta["impure"] = True
    g.get_attr("weight")
    live = g.call_function(torch.cos, (x,))
    g.output(live)
    assert g.eliminate_dead_code() is True
    assert [n.name for n in g.nodes] == [
        "x",
        "unused",
        "add_",
        "setitem",
        "add",
        "sin",
        "cos",
        "output",
    ]
    assert unused_param in g.nodes
    assert g.eliminate_dead_code() is False
    g.lint()


def test_copy_is_independent(mlp):
    g, _ = mlp
    g.find_nodes(op="call_function", target=torch.relu)[0].meta["val"] = "marker"
    c = g.copy()
    assert str(c) == str(g)
    assert all(a is not b for a, b in zip(c.nodes, g.nodes))
    assert c.find_nodes(target=torch.relu)[0].meta["val"] == "marker"
    c.lint()
    relu = c.find_nodes(target=torch.relu)[0]
    relu.replace_all_uses_with(c.find_nodes(op="placeholder")[0])
    assert str(c) != str(g)
