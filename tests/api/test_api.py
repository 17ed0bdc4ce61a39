"""The public API: compile() in its three forms, on functions, methods and modules; backends;
argument checking; disable; reset."""

import copy
import logging

import pytest
import torch
from torch import nn

import framejit
from framejit.testing import RecordingBackend, assert_close_to_eager


def affine(x, w, b):
    return torch.relu(x @ w + b).sum(-1)


def inputs():
    return torch.randn(4, 8), torch.randn(8, 3), torch.randn(3)


# -- the three forms --------------------------------------------------------------------------------

def test_bare_decorator(stats):
    @framejit.compile
    def f(x, w, b):
        return torch.relu(x @ w + b).sum(-1)

    args = inputs()
    assert_close_to_eager(f(*args), affine(*args))
    assert stats.captured == 1 and stats.graphs == 1
    assert f.__name__ == "f" and f.__wrapped__.__name__ == "f"


def test_decorator_with_arguments(stats):
    backend = RecordingBackend()

    @framejit.compile(backend=backend, fullgraph=True)
    def f(x, w, b):
        return torch.relu(x @ w + b).sum(-1)

    args = inputs()
    assert_close_to_eager(f(*args), affine(*args))
    assert backend.graph_count == 1
    assert stats.captured == 1


def test_function_call_form(stats):
    f = framejit.compile(affine)
    args = inputs()
    assert_close_to_eager(f(*args), affine(*args))
    assert stats.captured == 1
    assert f.__doc__ == affine.__doc__ and f.__name__ == "affine"


def test_keyword_arguments_at_call_time(stats):
    f = framejit.compile(affine)
    x, w, b = inputs()
    assert_close_to_eager(f(x, b=b, w=w), affine(x, w, b))
    assert stats.captured == 1 and stats.eager_frames == 0


# -- argument checking ------------------------------------------------------------------------------

def test_unknown_backend_name_fails_at_compile_time():
    with pytest.raises(ValueError) as info:
        framejit.compile(affine, backend="no-such-backend")
    message = str(info.value)
    assert "no-such-backend" in message
    for name in framejit.list_backends():
        assert name in message
    assert "eager" in message and "default" in message
    with pytest.raises(ValueError):
        framejit.compile(backend="no-such-backend")(affine)


def test_non_callable_raises_type_error():
    with pytest.raises(TypeError, match="int"):
        framejit.compile(42)
    with pytest.raises(TypeError):
        framejit.compile("not a function")


def test_dynamic_takes_none_true_or_false():
    for dynamic in (None, True, False):
        framejit.compile(affine, dynamic=dynamic)
        framejit.compile(dynamic=dynamic)(affine)
    with pytest.raises(TypeError) as info:
        framejit.compile(affine, dynamic="auto")
    assert "dynamic=" in str(info.value) and "'auto'" in str(info.value)


def test_unknown_option_is_refused():
    with pytest.raises(ValueError, match="recompile_limt"):
        framejit.compile(affine, options={"recompile_limt": 2})


# -- user backends ----------------------------------------------------------------------------------

def test_user_backend_gets_fx_graph_module_and_real_inputs(stats):
    seen = []

    def backend(gm, example_inputs):
        seen.append((gm, example_inputs))
        return gm.forward

    f = framejit.compile(affine, backend=backend)
    x, w, b = inputs()
    assert_close_to_eager(f(x, w, b), affine(x, w, b))
    ((gm, example_inputs),) = seen
    assert isinstance(gm, torch.fx.GraphModule)
    assert len(example_inputs) == 3
    assert example_inputs[0] is x and example_inputs[1] is w and example_inputs[2] is b
    assert [n.op for n in gm.graph.nodes] == ["placeholder"] * 3 + ["call_function"] * 3 + ["call_method", "output"]
    # The graph module itself computes the function.
    assert_close_to_eager(gm(x, w, b)[0], affine(x, w, b))


def test_callable_returned_by_backend_is_what_runs(stats):
    calls = []

    def backend(gm, example_inputs):
        def run(*args):
            calls.append(len(args))
            (out,) = gm(*args)
            return (out + 100,)
        return run

    f = framejit.compile(affine, backend=backend)
    args = inputs()
    assert_close_to_eager(f(*args), affine(*args) + 100)
    assert_close_to_eager(f(*args), affine(*args) + 100)
    assert calls == [3, 3]
    assert stats.captured == 1


def test_backend_failure_falls_back_with_warning(stats):
    def broken(gm, example_inputs):
        raise RuntimeError("backend exploded")

    f = framejit.compile(affine, backend=broken)
    args = inputs()
    with pytest.warns(UserWarning, match="backend exploded|failed"):
        out = f(*args)
    assert_close_to_eager(out, affine(*args))
    assert stats.eager_frames == 1


def test_backend_failure_with_fullgraph_raises_backend_error():
    def broken(gm, example_inputs):
        raise RuntimeError("backend exploded")

    f = framejit.compile(affine, backend=broken, fullgraph=True)
    with pytest.raises(framejit.BackendError) as info:
        f(*inputs())
    assert isinstance(info.value.__cause__, RuntimeError)


@pytest.mark.parametrize("name", ["eager", "default"])
def test_builtin_backends_by_name(stats, name):
    f = framejit.compile(affine, backend=name)
    args = inputs()
    assert_close_to_eager(f(*args), affine(*args))
    assert stats.graphs == 1


# -- compile on a module ----------------------------------------------------------------------------

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.bn = nn.BatchNorm1d(16)
        self.drop = nn.Dropout(0.5)
        self.fc2 = nn.Linear(16, 4)
        self.tag = "net"

    def forward(self, x):
        return self.fc2(self.drop(torch.relu(self.bn(self.fc1(x)))))


def test_compiled_module_is_a_module_sharing_state():
    model = Net()
    c = framejit.compile(model)
    assert isinstance(c, framejit.CompiledModule)
    assert isinstance(c, nn.Module)
    assert [n for n, _ in c.named_parameters()] == [n for n, _ in model.named_parameters()]
    assert all(p is q for p, q in zip(c.parameters(), model.parameters()))
    assert list(c.state_dict()) == list(model.state_dict())
    # The same storage, not copies.
    assert all(c.state_dict()[k].data_ptr() == v.data_ptr() for k, v in model.state_dict().items())
    assert [n for n, _ in c.named_buffers()] == [n for n, _ in model.named_buffers()]
    assert c.fc1 is model.fc1
    assert c.tag == "net"


def test_attribute_setting_goes_to_the_original():
    model = Net()
    c = framejit.compile(model)
    c.tag = "renamed"
    assert model.tag == "renamed"
    c.extra = 5
    assert model.extra == 5
    new_fc = nn.Linear(16, 4)
    c.fc2 = new_fc
    assert model.fc2 is new_fc
    del c.extra
    assert not hasattr(model, "extra")


def test_load_state_dict_through_compiled_module(stats):
    model, other = Net().eval(), Net().eval()
    c = framejit.compile(model)
    x = torch.randn(5, 8)
    c(x)
    c.load_state_dict(other.state_dict())
    assert torch.equal(model.fc1.weight, other.fc1.weight)
    assert_close_to_eager(c(x), other(x))
    assert stats.captured == 1  # new parameter values, same kinds: no recompile


def test_train_eval_propagate_and_recompile(stats, caplog):
    caplog.set_level(logging.INFO, logger="framejit.recompiles")
    model = Net()
    reference = copy.deepcopy(model)
    c = framejit.compile(model)
    x = torch.randn(6, 8)

    torch.manual_seed(1)
    train_out = c(x)
    torch.manual_seed(1)
    assert_close_to_eager(train_out, reference(x))  # same dropout mask, same batch statistics

    assert c.eval() is c
    assert model.training is False and all(not m.training for m in model.modules())
    reference.eval()
    eval_out = c(x)
    assert_close_to_eager(eval_out, reference(x))
    assert not torch.allclose(eval_out, train_out)
    assert stats.recompiles == 1
    reason = stats.recompile_reasons[0][1]
    assert reason.endswith(".training: True → False")
    assert any(reason in r.getMessage() for r in caplog.records)

    c.train()
    assert model.training and model.drop.training
    c(x)
    assert stats.captured == 2  # the train entry is reused


def test_children_and_containers_through_compiled_module():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    c = framejit.compile(model)
    assert len(c) == 2
    assert c[0] is model[0]
    assert list(c) == list(model)
    assert "Sequential" in repr(c)


def test_compiled_module_backward_reaches_original_parameters():
    model = nn.Linear(4, 2)
    c = framejit.compile(model)
    c(torch.randn(3, 4)).sum().backward()
    assert model.weight.grad is not None
    assert_close_to_eager(model.bias.grad, torch.full((2,), 3.0))


# -- compiled methods -------------------------------------------------------------------------------

class WithCompiledForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.scale = 3.0

    @framejit.compile
    def forward(self, x):
        return torch.tanh(self.fc(x)) * self.scale


def test_compiled_method_on_module_class(stats):
    a, b = WithCompiledForward(), WithCompiledForward()
    x = torch.randn(2, 4)
    assert_close_to_eager(a(x), torch.tanh(a.fc(x)) * 3.0)
    assert_close_to_eager(a.forward(x), torch.tanh(a.fc(x)) * 3.0)
    assert stats.captured == 1 and stats.eager_frames == 0
    # Another instance is another `self`: its own entry, its own parameters.
    assert_close_to_eager(b(x), torch.tanh(b.fc(x)) * 3.0)
    assert stats.captured == 2


# -- disable ----------------------------------------------------------------------------------------

@framejit.disable
def disabled_double(t):
    return t * 2


@framejit.disable()
def disabled_with_parens(t):
    return t + 1


def test_disable_as_decorator(stats):
    x = torch.randn(3)
    assert_close_to_eager(disabled_double(x), x * 2)
    assert_close_to_eager(disabled_with_parens(x), x + 1)
    assert disabled_double.__name__ == "disabled_double"
    assert stats.frames == 0  # nothing is offered to capture


def test_disabled_function_called_from_compiled_code_runs_as_python(stats):
    def f(x):
        return disabled_double(x) + 1

    x = torch.randn(3)
    assert_close_to_eager(framejit.compile(f)(x), x * 2 + 1)
    # The call is a graph break: it runs as a plain call, the `+ 1` is captured after it.
    assert stats.graph_breaks == 1 and stats.eager_frames == 0
    assert "framejit.disable" in stats.break_reasons[0][1]


# -- reset and statistics ---------------------------------------------------------------------------

def test_reset_clears_caches_and_statistics(stats):
    f = framejit.compile(affine)
    args = inputs()
    f(*args)
    assert stats.captured == 1
    framejit.reset()
    assert stats.captured == 0 and stats.frames == 0 and stats.fallback_reasons == []
    f(*args)
    assert stats.captured == 1


def test_stats_counts_since_reset():
    def f(x):
        y = x + 1
        print("break")
        return y * 2

    framejit.reset()
    assert framejit.stats() == {"frames": 0, "graphs": 0, "graph_breaks": 0, "fallbacks": 0,
                                "recompiles": 0, "ops": 0, "capture_seconds": 0.0,
                                "kernels": 0, "kernel_seconds": 0.0, "kernel_layout_misses": 0,
                                "graph_cache_hits": 0}
    compiled = framejit.compile(f, backend="c")  # C kernels, also under FRAMEJIT_TEST_BACKEND=fx
    compiled(torch.ones(2))
    compiled(torch.ones(3))  # new shape: both frames recompile
    s = framejit.stats()
    assert set(s) == {"frames", "graphs", "graph_breaks", "fallbacks", "recompiles", "ops",
                      "capture_seconds", "kernels", "kernel_seconds", "kernel_layout_misses",
                      "graph_cache_hits"}
    assert all(type(v) is int for k, v in s.items() if not k.endswith("_seconds"))
    # CPU tensors: one C kernel per graph; the second shape makes the dims dynamic, and the
    # symbolic graphs get kernels of their own that take the sizes at run time.
    assert s["kernels"] == 4
    assert s["graph_breaks"] == 2 and s["recompiles"] == 2 and s["fallbacks"] == 0
    assert s["graphs"] == 4 and s["ops"] == 4 and s["frames"] == 4
    assert s["capture_seconds"] > 0
    framejit.reset()
    assert framejit.stats()["graphs"] == 0


def test_a_compiled_module_copies_and_pickles_as_a_compiled_module():
    # copy.deepcopy raised TypeError (the C wrapper cannot be pickled). A copy is the module
    # copied, compiled again with the same backend and options.
    import copy
    import io
    import pickle

    model = framejit.compile(torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU()),
                             backend="eager", options={"recompile_limit": 3})
    x = torch.randn(2, 3)
    want = model(x)
    shallow, deep = copy.copy(model), copy.deepcopy(model)
    unpickled = pickle.loads(pickle.dumps(model))
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    for other in (shallow, deep, unpickled, loaded):
        assert isinstance(other, framejit.api.CompiledModule)
        assert torch.equal(other(x), want)
        ctx = object.__getattribute__(other, "_framejit_context")
        assert ctx is not object.__getattribute__(model, "_framejit_context")
        assert ctx.options.recompile_limit == 3
    assert shallow._orig_mod is model._orig_mod
    assert deep[0].weight is not model[0].weight and torch.equal(deep[0].weight, model[0].weight)
    with torch.no_grad():
        deep[0].weight.zero_()
    assert not torch.equal(deep(x), model(x))  # the copy's own parameters
