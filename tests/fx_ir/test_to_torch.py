import builtins
import collections
import copy
import enum
import functools
import inspect
import math
import operator

import pytest
import torch
import torch.fx

from framejit.fx_ir import Graph, GraphModule, propagate_meta, to_torch_fx
from framejit.testing import assert_close_to_eager


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


# -- graphs torch.fx's printer gets wrong --------------------------------------------------------
#
# Each graph below is one that torch.fx would print as source that does not compile, or that
# computes something else, if it were converted node for node. The export must compile, lint and
# give what framejit's own generated code (the eager backend) gives, call after call.


def export_and_compare(g, *inputs, root=None, calls=2):
    """Convert ``g``; check the torch.fx module against framejit's code on ``inputs`` (a copy
    for each run, so in-place ops see the same values). Returns the torch.fx module."""
    gm = GraphModule({} if root is None else root, g)
    fx_gm = to_torch_fx(gm)
    compile(fx_gm.code, "<torch.fx code>", "exec")
    fx_gm.graph.lint()
    for _ in range(calls):
        fx_inputs, our_inputs = copy.deepcopy(inputs), copy.deepcopy(inputs)
        assert_close_to_eager(fx_gm(*fx_inputs), gm(*our_inputs))
        assert_close_to_eager(list(fx_inputs), list(our_inputs), path="inputs after the call")
    return fx_gm


def tensor_input(g, name="x"):
    node = g.placeholder(name)
    node.meta["val"] = torch.empty(3, device="meta")
    return node


def call_targets(fx_gm):
    return [n.target for n in fx_gm.graph.nodes if n.op == "call_function"]


INPLACE_AND_BINARY = [
    (operator.iadd, operator.add), (operator.isub, operator.sub), (operator.imul, operator.mul),
    (operator.itruediv, operator.truediv), (operator.ifloordiv, operator.floordiv),
    (operator.imod, operator.mod), (operator.ipow, operator.pow), (operator.iand, operator.and_),
    (operator.ior, operator.or_), (operator.ixor, operator.xor),
    (operator.ilshift, operator.lshift), (operator.irshift, operator.rshift),
]


@pytest.mark.parametrize("inplace, binary", INPLACE_AND_BINARY, ids=lambda op: op.__name__)
def test_augmented_assignment_of_a_constant(inplace, binary):
    """`s = 3; s += x` records iadd(3, x): torch.fx prints the statement `3 += x` (a SyntaxError).
    Python computes `3 + x` there, int having no __iadd__, and so does the export."""
    g = Graph()
    x = tensor_input(g)
    g.output((g.call_function(inplace, (3, x)),))
    fx_gm = export_and_compare(g, torch.tensor([1, 2, 3]))
    assert call_targets(fx_gm) == [binary]


def test_augmented_assignment_of_a_mutable_constant_works_on_a_fresh_copy():
    """`[1.0] += x` extends the list (list has __iadd__): the export copies the constant, as the
    literal in framejit's code is a new list on every call."""
    g = Graph()
    x = tensor_input(g)
    g.output((g.call_function(operator.iadd, ([1.0], x)),))
    fx_gm = export_and_compare(g, torch.tensor([2.0, 3.0]), calls=3)
    assert len(fx_gm(torch.tensor([2.0, 3.0]))[0]) == 3


def test_augmented_assignment_of_an_immutable_node_keeps_the_old_value():
    """torch.fx prints `size += (5,);  iadd = size`, rebinding `size` for its later users: a
    tuple has no __iadd__, so the export adds instead."""
    g = Graph()
    x = tensor_input(g)
    size = g.call_method("size", (x,))
    size.meta["val"] = torch.Size([3])
    grown = g.call_function(operator.iadd, (size, (5,)))
    g.output((grown, size))
    fx_gm = export_and_compare(g, torch.ones(3))
    assert fx_gm(torch.ones(3)) == (torch.Size([3, 5]), torch.Size([3]))


def test_augmented_assignment_of_a_tensor_stays_in_place():
    g = Graph()
    x = tensor_input(g)
    g.output((g.call_function(operator.imul, (x, 2.0)), x))
    fx_gm = export_and_compare(g, torch.ones(3))
    assert call_targets(fx_gm) == [operator.imul] and "x *= 2.0" in fx_gm.code
    x = torch.ones(3)
    out, same = fx_gm(x)
    assert out is x and same is x and x.tolist() == [2.0, 2.0, 2.0]


def test_setitem_value_is_none_and_a_constant_container_is_copied():
    """torch.fx prints `x[0] = v;  setitem = x`: the node's value would be x instead of None."""
    g = Graph()
    x = tensor_input(g)
    stored = g.call_function(operator.setitem, (x, 0, 5.0))
    listed = g.call_function(operator.setitem, ([0, 0], 1, x))
    g.output((stored, listed, x))
    fx_gm = export_and_compare(g, torch.zeros(3))
    assert fx_gm(torch.zeros(3))[:2] == (None, None)


@pytest.mark.parametrize("base", [-2, -2.5, -math.inf, -0.0])
@pytest.mark.parametrize("op", [operator.pow, operator.ipow], ids=lambda op: op.__name__)
def test_power_of_a_negative_constant(op, base):
    """torch.fx prints `-2 ** x`, which Python reads as -(2 ** x)."""
    g = Graph()
    x = tensor_input(g)
    g.output((g.call_function(op, (base, x)),))
    fx_gm = export_and_compare(g, torch.tensor([1.0, 2.0, 0.5]))
    assert call_targets(fx_gm) == [builtins.pow]


class Color(enum.Enum):
    RED = 1


Inner = collections.namedtuple("Inner", "a")
Outer = collections.namedtuple("Outer", "inner")


class Opaque:
    def __repr__(self):
        return "<an object without a literal>"


def describe(x, value):
    """A user function in a graph: its result shows exactly which value it was given."""
    return x + 1, repr(value)


OPAQUE = Opaque()
UNPRINTABLE = {
    "tensor": torch.tensor([1.0, 2.0]),
    "python type": float,
    "complex with inf": complex(1.0, math.inf),
    "complex -0j": complex(0.0, -0.0),  # repr -0j reads back as complex(-0.0, -0.0)
    "enum in a dict": {"mode": Color.RED},
    "frozenset of enums": frozenset({Color.RED}),
    "nested named tuple": Outer(Inner(1)),
    "code object": describe.__code__,
    "signature": inspect.signature(describe),
    "object": OPAQUE,
    "function": describe,
}


@pytest.mark.parametrize("value", list(UNPRINTABLE.values()), ids=list(UNPRINTABLE))
def test_constants_torch_fx_cannot_print_are_attributes(value):
    """torch.fx prints constants with repr(): `torch.Tensor(size=[2], dtype=float32)`,
    `<class 'float'>`, `(1+infj)`, `{'mode': <Color.RED: 1>}`..."""
    g = Graph()
    x = tensor_input(g)
    out = g.call_function(describe, (x, value))
    g.output(tuple(g.call_function(operator.getitem, (out, i)) for i in (0, 1)))
    fx_gm = export_and_compare(g, torch.ones(2))
    assert fx_gm(torch.ones(2))[1] == repr(value)


def test_unprintable_constants_inside_containers_are_attributes():
    t = torch.tensor([5.0])
    g = Graph()
    x = tensor_input(g)
    cat = g.call_function(torch.cat, ([x, t],))
    full = g.call_function(torch.full, ((2,), 1), {"dtype": float})
    g.output((cat, full, g.call_method("to", (x, float))))
    export_and_compare(g, torch.ones(2))


def test_printable_constants_stay_inline():
    g = Graph()
    x = tensor_input(g)
    add = g.call_function(torch.add, (x, 1.5))
    sliced = g.call_function(operator.getitem, (x, (slice(None, 1), Ellipsis, None)))
    moved = g.call_method("to", (x, torch.device("cpu"), torch.float64))
    contiguous = g.call_method("contiguous", (x,), {"memory_format": torch.contiguous_format})
    stacked = g.call_function(torch.stack, ([x, add],))
    zeros = g.call_function(torch.zeros, (torch.Size([2]),), {"layout": torch.strided})
    g.output((add, sliced, moved, contiguous, stacked, zeros, {"pair": (x, [add])}))
    fx_gm = export_and_compare(g, torch.ones(2, 2))
    assert [n.op for n in fx_gm.graph.nodes].count("get_attr") == 0


def scaled(x, **options):
    return x * options["a-b"] + options["if"]


def test_keywords_that_are_not_identifiers():
    """torch.fx prints `a-b = 2`, `if = 3`."""
    g = Graph()
    x = tensor_input(g)
    g.output((g.call_function(scaled, (x,), {"a-b": 2.0, "if": x}),))
    export_and_compare(g, torch.ones(2))


def test_method_call_and_attribute_of_a_constant():
    """torch.fx prints `5.bit_length()` and `3.real`, which do not parse."""
    g = Graph()
    x = tensor_input(g)
    bits = g.call_method("bit_length", (5,))
    real = g.call_function(getattr, (3, "real"))
    g.output((g.call_function(torch.add, (x, bits)), g.call_function(torch.mul, (x, real))))
    export_and_compare(g, torch.ones(2))


def pretend_torch_function(x):
    return x * 3


pretend_torch_function.__module__ = "torch.nn.functional"  # as functions made inside torch are


class Unhashable:
    """A callable object that cannot be hashed (it defines __eq__ only)."""

    def __eq__(self, other):
        return isinstance(other, Unhashable)

    def __call__(self, x):
        return x - 1


@pytest.mark.parametrize("target, args", [
    (torch.Tensor.__ipow__, (2,)),  # printed as torch._tensor.pow_, which does not exist
    (torch.Tensor.__pow__, (2,)),  # printed as torch._tensor.pow
    (pretend_torch_function, ()),  # printed as torch.nn.functional.pretend_torch_function
    (functools.partial(torch.mul, other=2.0), ()),  # no __name__: torch.fx cannot name it
    (Unhashable(), ()),
], ids=["Tensor.__ipow__", "Tensor.__pow__", "torch-module function", "partial", "unhashable"])
def test_call_targets_torch_fx_cannot_name(target, args):
    g = Graph()
    x = tensor_input(g)
    g.output((g.call_function(target, (x, *args)),))
    export_and_compare(g, torch.tensor([1.0, 2.0]))


class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)
        self.scale = torch.tensor(3.0)  # a plain attribute: neither buffer nor parameter

    def forward(self, x):
        return self.lin(x) * self.scale


def test_attribute_target_under_a_module_target_leaves_the_module_alone():
    """`m` and `m.scale` both targets: torch.fx would register `scale` as a buffer of the user's
    module (which fails: the attribute exists)."""
    m = Scaled()
    g = Graph()
    x = tensor_input(g)
    h = g.call_module("m", (x,))
    g.output((g.call_function(torch.mul, (h, g.get_attr("m.scale"))),))
    fx_gm = export_and_compare(g, torch.ones(1, 2), root={"m": m})
    assert fx_gm.m is m and dict(m.named_buffers()) == {}


@pytest.mark.parametrize(
    "qualname", ["graph", "forward", "training", "code", "layers.0", "cfg.lambda", "a-b"]
)
def test_attribute_targets_torch_fx_cannot_hold(qualname):
    """Names of GraphModule/Module attributes, non-identifier and keyword atoms."""
    value = torch.tensor([2.0, 3.0])
    g = Graph()
    x = tensor_input(g)
    g.output((g.call_function(torch.add, (x, g.get_attr(qualname))),))
    fx_gm = export_and_compare(g, torch.ones(2), root={qualname: value})
    (attr,) = [n for n in fx_gm.graph.nodes if n.op == "get_attr"]
    assert fx_gm.get_buffer(attr.target) is value


@pytest.mark.parametrize("name", ["device", "inf", "nan", "max"])
def test_placeholders_named_like_builtins_and_torch_fx_globals(name):
    """`def forward(self, device)` would hide the `device(...)` that torch.fx prints for a
    torch.device, `inf` and `nan` the floats, `max` the builtin."""
    g = Graph()
    x = tensor_input(g, name)
    moved = g.call_method("to", (x, torch.device("cpu")))
    capped = g.call_function(torch.clamp, (moved,), {"max": math.inf})
    top = g.call_function(max, (2, 3))
    g.output((g.call_function(torch.add, (capped, top)), g.call_function(torch.add, (x, math.nan))))
    fx_gm = export_and_compare(g, torch.ones(2))
    (param,) = [n for n in fx_gm.graph.nodes if n.op == "placeholder"]
    assert param.target == param.name != name
