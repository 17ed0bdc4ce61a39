"""The kernel pipeline on graphs with symbolic sizes: one kernel serves every size.

Each program runs through the reference interpreter of the description, the C renderer and the
Triton renderer (its interpreter, on CPU tensors); the renderers' own tests of run-time sizes are
test_c_dynamic.py and test_triton_dynamic.py."""

import operator

import pytest
import torch

import framejit
from framejit.fx_ir import Graph
from framejit.kernels.c_runtime import CLauncher
from framejit.kernels.ir import Sym
from framejit.kernels.reference import ReferenceLauncher
from framejit.kernels.triton_runtime import Launcher
from framejit.passes import run_passes
from framejit.passes.symbolic import NotSizeGeneric, symbolic_shapes
from framejit.testing import assert_close_to_eager

from .conftest import DEVICE, KernelCompiler

LAUNCHERS = {"reference": ReferenceLauncher, "c": CLauncher, "triton": Launcher}


@pytest.fixture(params=sorted(LAUNCHERS))
def launcher(request):
    if request.param == "triton" and DEVICE == "cuda":
        # Compiled for real (`make test-gpu`), Triton kernels take CUDA tensors: the test's
        # tensors are made there.
        with torch.device("cuda"):
            yield LAUNCHERS[request.param]
        return
    yield LAUNCHERS[request.param]

aten = torch.ops.aten


def compiled(fn, launcher, **options):
    backend = KernelCompiler(launcher)
    return framejit.compile(fn, backend=backend.as_backend(), **options), backend


def test_ten_row_counts_take_two_graphs_and_the_second_has_run_time_sizes(launcher):
    def fn(x, w):
        return torch.softmax(x * w, dim=-1) + x.sum(0, keepdim=True)

    cfn, backend = compiled(fn, launcher)
    w = torch.randn(16)
    for n in range(2, 12):
        x = torch.randn(n, 16)
        assert_close_to_eager(cfn(x, w), fn(x, w))
    assert framejit.stats()["graphs"] == 2
    static, dynamic = backend.compiled
    assert all(not k.kernel.symbols() for k in static.framejit_kernels)
    kernels = dynamic.framejit_kernels
    assert len(kernels) == 2 and all(k.kernel.symbols() for k in kernels)
    assert framejit.stats()["kernels"] == 4  # two per graph, none for the sizes after


@pytest.mark.parametrize("shape", [(3, 5), (4, 33), (2, 2)])
def test_reductions_over_a_dynamic_last_dim(shape, launcher):
    def fn(x):
        return (torch.softmax(x, -1), torch.log_softmax(x * 2, -1), x.mean(-1), x.amax(-1),
                x.argmax(-1), (x - x.mean(-1, keepdim=True)).pow(2).sum(-1))

    cfn, backend = compiled(fn, launcher, dynamic=True)
    for sizes in [shape, (shape[0] + 3, shape[1] * 2 + 1)]:
        x = torch.randn(sizes)
        assert_close_to_eager(cfn(x), fn(x))
    assert framejit.stats()["graphs"] == 1
    (only,) = backend.compiled
    assert only.framejit_kernels and all(k.kernel.symbols() for k in only.framejit_kernels)


def test_a_mean_divides_by_the_run_time_count(launcher):
    def fn(x):
        return x.mean(0) * 3

    cfn, backend = compiled(fn, launcher, dynamic=True)
    for n in (4, 9):
        x = torch.randn(n, 6)
        assert_close_to_eager(cfn(x), fn(x))
    (only,) = backend.compiled
    consts = [op.args[0] for k in only.framejit_kernels for op in k.kernel.ops if op.kind == "const"]
    assert any(isinstance(c, Sym) for c in consts), [str(k.kernel) for k in only.framejit_kernels]


def test_mark_dynamic_serves_five_sizes_with_one_graph_and_its_kernels(launcher):
    def fn(x, b):
        return torch.relu(x + b).sum(-1)

    cfn, backend = compiled(fn, launcher)
    b = torch.randn(8)
    for n in (3, 5, 7, 11, 2):
        x = torch.randn(n, 8)
        framejit.mark_dynamic(x, 0)
        assert_close_to_eager(cfn(x, b), fn(x, b))
    assert framejit.stats()["graphs"] == 1
    assert framejit.stats()["kernels"] == len(backend.compiled[0].framejit_kernels) >= 1


def test_kernel_input_from_a_torch_op_is_checked_with_run_time_strides(launcher):
    def fn(x, w):
        return torch.softmax(x @ w, dim=-1) * 2

    cfn, backend = compiled(fn, launcher, dynamic=True)
    w = torch.randn(6, 5)
    for n in (3, 8):
        x = torch.randn(n, 6)
        assert_close_to_eager(cfn(x, w), fn(x, w))
    (only,) = backend.compiled
    (kernel,) = only.framejit_kernels
    assert kernel.checked_inputs, "the matmul's output must be checked"
    (size, stride), = kernel.checked_inputs.values()
    assert any(isinstance(e, Sym) for e in (*size, *stride))
    assert kernel.layout_misses == 0


def test_size_arithmetic_in_views_between_kernels(launcher):
    def fn(x):
        n = x.shape[0]
        y = (x * 2).view(n * 2, -1)
        return torch.softmax(y, dim=-1) + 1

    cfn, _ = compiled(fn, launcher, dynamic=True)
    for n in (2, 5):
        x = torch.randn(n, 8)
        assert_close_to_eager(cfn(x), fn(x))
    assert framejit.stats()["graphs"] == 1


def _placeholder(graph, name, shape, sym_shape):
    node = graph.placeholder(name)
    node.meta["val"] = torch.empty(shape, device="meta")
    node.meta["device"] = torch.device("cpu")
    node.meta["sym_shape"] = sym_shape
    node.meta["dynamic_dims"] = (0,)
    return node


def test_a_graph_fixed_to_the_capture_sizes_is_not_size_generic():
    g = Graph()
    x = _placeholder(g, "x", (5, 4), ("s0", 4))
    v = g.call_function(aten.view.default, (x, [20]))
    v.meta["val"] = torch.empty(20, device="meta")
    v.meta["device"] = torch.device("cpu")
    g.output(v)
    with pytest.raises(NotSizeGeneric, match="some sizes"):
        symbolic_shapes(g, {})


def test_symbolic_sizes_of_each_value_and_where_they_come_from():
    g = Graph()
    x = _placeholder(g, "x", (5, 4), ("s0", 4))
    y = g.call_function(aten.mul.Tensor, (x, 2))
    y.meta["val"] = torch.empty(5, 4, device="meta")
    y.meta["device"] = torch.device("cpu")
    t = g.call_function(aten.t.default, (y,))
    t.meta["val"] = torch.empty(5, 4, device="meta").t()
    t.meta["device"] = torch.device("cpu")
    g.output(t)
    shapes = symbolic_shapes(g, {})
    (s0,) = shapes.binding
    assert shapes.binding[s0] == (x, 0) and shapes.hint[s0] == 5
    assert shapes.shape[t] == (4, s0) and shapes.stride[t] == (1, 4)
    assert shapes.shape[y] == (s0, 4)


def test_passes_keep_a_mean_over_symbolic_sizes():
    g = Graph()
    x = _placeholder(g, "x", (5, 4), ("s0", 4))
    m = g.call_function(torch.mean, (x, 0))
    m.meta["val"] = torch.empty(4, device="meta")
    m.meta["device"] = torch.device("cpu")
    g.output(m)
    static = g.copy()
    run_passes(g, {}, symbolic=True)
    assert aten.mean.dim in {n.target for n in g.nodes}
    run_passes(static, {})
    targets = {n.target for n in static.nodes}
    assert aten.mean.dim not in targets and aten.div.Tensor in targets
    assert operator.mul not in targets


def test_a_graph_that_is_not_size_generic_runs_as_torch_ops_and_says_why(capsys):
    from framejit import record
    from framejit.debug import logs
    from framejit.fx_ir import GraphModule
    from framejit.pipeline import compile_with_kernels

    g = Graph()
    x = _placeholder(g, "x", (5, 4), ("s0", 4))
    v = g.call_function(aten.view.default, (x, [20]))
    v.meta["val"] = torch.empty(20, device="meta")
    v.meta["device"] = torch.device("cpu")
    r = g.call_function(aten.relu.default, (v,))
    r.meta["val"] = torch.empty(20, device="meta")
    r.meta["device"] = torch.device("cpu")
    g.output(r)
    seen = []
    record.subscribe(seen.append)
    logs.set_logs("kernels")
    try:
        fn = compile_with_kernels(GraphModule({}, g), [], ("cpu",), launcher=ReferenceLauncher)
    finally:
        logs.set_logs()
        record.unsubscribe(seen.append)
    assert fn.framejit_kernels == []
    x = torch.randn(5, 4)
    torch.testing.assert_close(fn(x), x.view(20).relu())
    (declined,) = [e for e in seen if isinstance(e, record.KernelsDeclined)]
    assert "symbolic sizes" in declined.reason and "only for some sizes" in declined.reason
    assert "no kernels for a graph: it has symbolic sizes" in capsys.readouterr().err


def test_cats_with_a_dynamic_sequence_length(launcher):
    """A rotary embedding over a dynamic sequence (the cat's dimension is static) and a cat along
    the dynamic dimension (its spans are run-time sizes): one kernel each serves every size."""
    def rotary(q, cos, sin):
        half = q.shape[-1] // 2
        return q * cos + torch.cat((-q[..., half:], q[..., :half]), dim=-1) * sin

    def grow(cache, new):
        return torch.cat((cache.exp(), new * 2), dim=1) + 1

    f, backend_f = compiled(rotary, launcher)
    g, backend_g = compiled(grow, launcher)
    for s in range(3, 8):
        q, cos, sin = torch.randn(2, 3, s, 8), torch.randn(s, 8), torch.randn(s, 8)
        assert_close_to_eager(f(q, cos, sin), rotary(q, cos, sin))
        cache, new = torch.randn(2, s, 4), torch.randn(2, 2, 4)
        assert_close_to_eager(g(cache, new), grow(cache, new))
    kernels = backend_f.kernels + backend_g.kernels
    dynamic = [k.kernel for k in kernels if k.kernel.symbols()]
    assert len(dynamic) == 2
    assert all(sum(op.kind == "concat" for op in k.ops) == 1 for k in dynamic)


def test_a_cat_of_slices_that_are_one_element_in_the_example(launcher):
    # The fuzzer's find: the graph with run-time sizes was built at n = 2, where x[1:] and x[:1]
    # are one element each, and the kernel read them as broadcast scalars (stride 0) at every n.
    def roll(a, b):
        t = a * b - 1
        return torch.cat([-t[..., 1:], t[..., :1]], dim=-1) * 2

    f, backend = compiled(roll, launcher)
    for n in (4, 2, 7, 4, 5, 9):
        a, b = torch.randn(n), torch.randn(n)
        assert_close_to_eager(f(a, b), roll(a, b))
    assert any(k.kernel.symbols() for k in backend.kernels), "no kernel with run-time sizes ran"
