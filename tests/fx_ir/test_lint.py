import pytest
import torch

from framejit.fx_ir import Graph, GraphLintError


def chain():
    g = Graph()
    x = g.placeholder("x")
    relu = g.call_function(torch.relu, (x,))
    neg = g.call_function(torch.neg, (relu,))
    out = g.output(neg)
    return g, x, relu, neg, out


def lint_error(g: Graph) -> GraphLintError:
    with pytest.raises(GraphLintError) as info:
        g.lint()
    message = str(info.value)
    # Every report ends with the graph itself.
    assert "graph:\n" in message
    assert "    %x = placeholder()" in message
    return info.value


def test_valid_graph_passes(mlp):
    g, _ = mlp
    g.lint()
    chain()[0].lint()


def test_use_before_definition():
    g, x, relu, neg, out = chain()
    relu.prepend(neg)  # neg now comes before the relu it uses
    err = lint_error(g)
    assert err.node is neg
    assert "%neg: uses %relu, which is defined after it" in str(err)
    assert "relu.append(neg)" in str(err)


def test_node_of_another_graph():
    g, x, relu, neg, out = chain()
    relu.graph = Graph()  # simulates a node spliced in from elsewhere
    err = lint_error(g)
    assert err.node is relu
    assert "%relu: belongs to another graph" in str(err)
    assert "graph.node_copy" in str(err)


def test_args_mutated_in_place_leave_users_stale():
    g = Graph()
    x = g.placeholder("x")
    y = g.placeholder("y")
    cat = g.call_function(torch.cat, ([x],))
    g.output(cat)
    cat.args[0].append(y)  # bypasses the args setter
    err = lint_error(g)
    assert "%cat: its args or kwargs were changed in place" in str(err)
    assert "%y: its users miss %cat" in str(err)
    assert "node.args = (...)" in str(err)


def test_users_listing_a_non_user():
    g, x, relu, neg, out = chain()
    x.users[neg] = None
    err = lint_error(g)
    assert err.node is x
    assert "%x: users lists %neg, which does not use it" in str(err)


def test_use_of_erased_node():
    g, x, relu, neg, out = chain()
    relu.users.clear()  # hide the use so erase_node lets it go
    g.erase_node(relu)
    err = lint_error(g)
    assert "%neg: uses %relu, which was erased" in str(err)
    assert "neg.replace_input_with(relu, other)" in str(err)


def test_missing_output():
    g = Graph()
    g.call_function(torch.relu, (g.placeholder("x"),))
    err = lint_error(g)
    assert err.node is None
    assert "no output node; add one with graph.output(value)" in str(err)


def test_two_outputs():
    g, x, relu, neg, out = chain()
    second = g.output(relu)
    err = lint_error(g)
    assert err.node is out and second.name == "output_1"
    assert "%output: is an output but not the last one" in str(err)


def test_node_after_output():
    g, x, relu, neg, out = chain()
    g.call_function(torch.abs, (x,))
    err = lint_error(g)
    assert err.node is out
    assert "output must be the last node but it is followed by %abs" in str(err)
    assert "inserting_before(graph.output_node)" in str(err)


def test_duplicate_and_invalid_names():
    g, x, relu, neg, out = chain()
    neg.name = "relu"
    err = lint_error(g)
    assert "another node is also named 'relu'" in str(err)
    neg.name = "not valid"
    assert "name 'not valid' is not usable as a Python variable" in str(lint_error(g))


def test_placeholder_after_other_nodes():
    g, x, relu, neg, out = chain()
    with g.inserting_after(relu):
        y = g.placeholder("y")
    err = lint_error(g)
    assert err.node is y
    assert "%y: placeholder comes after %relu" in str(err)
    assert "relu.prepend(y)" in str(err)


def test_placeholder_without_default_after_one_with_default():
    g = Graph()
    g.placeholder("x", default=1)
    y = g.placeholder("y")
    g.output(y)
    with pytest.raises(GraphLintError, match="%y: placeholder without a default follows %x"):
        g.lint()


def test_all_problems_are_reported_together():
    g, x, relu, neg, out = chain()
    relu.prepend(neg)
    g.call_function(torch.abs, (x,))
    err = lint_error(g)
    assert str(err).startswith("graph lint found 2 problems:")
    assert len(err.problems) == 2
