"""The fusion partitioner: groups by iteration space, never a cycle, never across a side effect."""

import operator
import random

import torch

from framejit.fx_ir import Graph, GraphModule, propagate_meta
from framejit.kernels.lowering import classify, reduction_dims
from framejit.passes.fusion import check_acyclic, partition
from framejit.pipeline import compile_with_kernels

A = torch.ops.aten


def build(fn, *inputs):
    """A graph of ``fn`` over placeholders (fn gets the graph and the placeholder nodes)."""
    g = Graph()
    xs = [g.placeholder(f"x{i}") for i in range(len(inputs))]
    out = fn(g, *xs)
    g.output(out if isinstance(out, tuple) else (out,))
    propagate_meta(GraphModule({}, g), *inputs)
    for n in g.nodes:
        n.meta["device"] = torch.device("cpu")
    return g


def groups_of(g):
    groups = partition(g, classify, reduction_dims)
    check_acyclic(g, groups)
    return [[n.name for n in grp.nodes] for grp in groups]


def call(g, target, *args):
    return g.call_function(target, args)


def test_a_pointwise_chain_is_one_group():
    g = build(lambda g, x: call(g, A.relu.default, call(g, A.add.Tensor, call(g, A.exp.default, x), 1.0)),
              torch.randn(4, 4))
    assert len(groups_of(g)) == 1


def test_a_library_op_splits_chains_and_no_group_closes_a_cycle():
    def fn(g, x, w):
        a = call(g, A.exp.default, x)
        b = call(g, A.mul.Tensor, a, 2.0)
        mm = call(g, A.mm.default, a, w)        # stays in torch
        return call(g, A.add.Tensor, b, mm)     # needs b (group) and mm (after the group)

    g = build(fn, torch.randn(4, 4), torch.randn(4, 4))
    groups = groups_of(g)
    # {exp, mul} then {add} after the matmul: merging add into the first group would need
    # the matmul's result inside the kernel that feeds the matmul.
    assert len(groups) == 2
    assert len(groups[0]) == 2 and len(groups[1]) == 1


def test_a_reduction_takes_its_prologue_and_broadcast_epilogue():
    def fn(g, x):
        e = call(g, A.exp.default, x)
        s = call(g, A.sum.dim_IntList, e, [1], True)
        return call(g, A.div.Tensor, e, s)

    g = build(fn, torch.randn(4, 9))
    assert len(groups_of(g)) == 1


def test_reductions_over_different_dims_are_separate_kernels():
    def fn(g, x):
        a = call(g, A.sum.dim_IntList, x, [0], True)
        b = call(g, A.sum.dim_IntList, x, [1], True)
        return call(g, A.add.Tensor, a, b)

    g = build(fn, torch.randn(4, 9))
    assert len(groups_of(g)) >= 2


def test_side_effects_are_barriers():
    def fn(g, x, y):
        a = call(g, A.exp.default, x)
        call(g, A.copy_.default, y, a)           # in place: a barrier
        return call(g, A.add.Tensor, a, y)       # reads y after the write

    g = build(fn, torch.randn(3), torch.randn(3))
    groups = groups_of(g)
    assert len(groups) == 2


def test_siblings_reading_one_input_share_a_kernel():
    def fn(g, x):
        return call(g, A.exp.default, x), call(g, A.neg.default, x)

    g = build(fn, torch.randn(5, 5))
    assert len(groups_of(g)) == 1


def test_siblings_reading_views_of_one_value_share_a_kernel():
    # q, k and v of an attention: split from one projection, transposed, each copied. One
    # kernel for the three copies; not across an in-place op, whose order they keep.
    def qkv(g, x):
        parts = call(g, A.split.Tensor, x, 4, -1)
        views = [call(g, A.transpose.int, call(g, operator.getitem, parts, i), 0, 1)
                 for i in range(3)]
        return tuple(call(g, A.clone.default, v) for v in views)

    g = build(qkv, torch.randn(6, 12))
    assert groups_of(g) == [["clone_default", "clone_default_1", "clone_default_2"]]

    def with_write(g, x, y):
        a = call(g, A.exp.default, call(g, A.transpose.int, x, 0, 1))
        call(g, A.copy_.default, y, a)           # in place: a barrier
        return a, call(g, A.neg.default, call(g, A.t.default, x))

    g = build(with_write, torch.randn(3, 4), torch.randn(4, 3))
    assert len(groups_of(g)) == 2


def test_random_graphs_never_produce_cyclic_groups():
    rng = random.Random(0)
    unary = [A.exp.default, A.neg.default, A.relu.default]
    for _ in range(40):
        def fn(g, x, w):
            values = [x]
            for _ in range(12):
                r = rng.random()
                a = rng.choice(values)
                if r < 0.15:
                    values.append(call(g, A.mm.default, a, w))
                elif r < 0.3:
                    s = call(g, A.sum.dim_IntList, a, [1], True)
                    values.append(call(g, A.sub.Tensor, a, s))  # keeps every value 6x6
                elif r < 0.6:
                    values.append(call(g, rng.choice(unary), a))
                else:
                    values.append(call(g, A.add.Tensor, a, rng.choice(values)))
            return tuple(values[1:])

        inputs = [torch.randn(6, 6), torch.randn(6, 6)]
        g = build(fn, *inputs)
        groups_of(g)  # check_acyclic raises on a cycle
        # ... and the graph with each group as one kernel computes what the graph computes.
        gm = GraphModule({}, g)
        compiled = compile_with_kernels(gm, inputs, ["cpu"], lint=True)
        for got, want in zip(compiled(*inputs), gm(*inputs)):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_a_cat_takes_producers_used_only_by_it_and_its_consumers():
    def fn(g, x, y, w):
        n = call(g, A.neg.default, x)                         # only the cat uses it: joins
        e = call(g, A.exp.default, y)                         # also returned: stays apart
        c = call(g, A.cat.default, [n, e], -1)
        return call(g, A.mul.Tensor, c, w), e

    g = build(fn, torch.randn(3, 2), torch.randn(3, 4), torch.randn(6))
    assert groups_of(g) == [["exp_default"], ["neg_default", "cat_default", "mul_Tensor"]]


def test_a_group_with_a_cat_never_joins_a_reduction():
    def fn(g, x, y):
        c = call(g, A.cat.default, [call(g, A.neg.default, x), y], 1)
        return call(g, A.sum.dim_IntList, call(g, A.exp.default, c), [1], True)

    g = build(fn, torch.randn(3, 2), torch.randn(3, 4))
    assert groups_of(g) == [["neg_default", "cat_default", "exp_default"], ["sum_dim_IntList"]]
