import pytest
import torch
import torch.fx

from framejit.backends import compile_graph, list_backends, lookup_backend, register_backend
from framejit.fx_ir import GraphModule


def inputs():
    torch.manual_seed(0)
    return [torch.randn(2, 4), torch.randn(4, 3)]


def reference(gm, x, w):
    return torch.relu(x @ w) + gm.root["b"]


def test_builtin_backends_are_listed():
    assert {"eager", "default", "triton", "c"} <= set(list_backends())
    assert list_backends() == sorted(list_backends())


def test_unknown_name_lists_registered_backends():
    with pytest.raises(ValueError) as info:
        lookup_backend("tensorrt")
    message = str(info.value)
    assert "unknown backend 'tensorrt'" in message
    # Every registered name, sorted (other tests may have registered their own).
    assert f"Registered backends: {', '.join(list_backends())}." in message
    assert {"c", "default", "eager", "triton"} <= set(list_backends())
    assert "register_backend" in message


def test_lookup_records():
    eager = lookup_backend("eager")
    assert (eager.name, eager.native) == ("eager", True)
    assert lookup_backend(eager) is eager

    def my_backend(gm, example_inputs):
        return gm.forward

    user = lookup_backend(my_backend)
    assert (user.name, user.fn, user.native) == ("my_backend", my_backend, False)
    with pytest.raises(TypeError, match="a name or a callable"):
        lookup_backend(42)


def test_user_callable_gets_torch_fx_module_and_real_inputs(small_gm):
    seen = {}

    def my_backend(gm, example_inputs):
        seen["gm"], seen["inputs"] = gm, example_inputs
        return gm.forward

    args = inputs()
    compiled = compile_graph(my_backend, small_gm, args)
    assert isinstance(seen["gm"], torch.fx.GraphModule)
    assert type(seen["inputs"]) is list
    assert all(a is b for a, b in zip(seen["inputs"], args))  # the real tensors, not meta
    assert [n.op for n in seen["gm"].graph.nodes].count("call_function") == 3
    torch.testing.assert_close(compiled(*args), reference(small_gm, *args))


def test_torch_fx_interpreter_as_a_backend(small_gm):
    def interpret(gm, example_inputs):
        return torch.fx.Interpreter(gm).run

    args = inputs()
    torch.testing.assert_close(
        compile_graph(interpret, small_gm, args)(*args), reference(small_gm, *args)
    )


def test_register_as_decorator_native_and_not(small_gm):
    calls = []

    @register_backend("recording_native")
    def recording_native(gm, example_inputs):
        calls.append(type(gm))
        return gm.forward_fn

    @register_backend("recording_user", native=False)
    def recording_user(gm, example_inputs):
        calls.append(type(gm))
        return gm

    assert recording_native.__name__ == "recording_native"  # the decorator returns the function
    assert {"recording_native", "recording_user"} <= set(list_backends())
    args = inputs()
    for name in ("recording_native", "recording_user"):
        torch.testing.assert_close(
            compile_graph(name, small_gm, args)(*args), reference(small_gm, *args)
        )
    assert calls[0] is GraphModule
    assert issubclass(calls[1], torch.fx.GraphModule)
    assert lookup_backend("recording_user").native is False


def test_duplicate_names_are_refused_unless_replaced():
    def a(gm, example_inputs):
        return gm

    def b(gm, example_inputs):
        return gm

    register_backend("dup", a)
    register_backend("dup", a)  # same function again: fine
    with pytest.raises(ValueError, match="'dup' is already registered"):
        register_backend("dup", b)
    register_backend("dup", b, replace=True)
    assert lookup_backend("dup").fn is b
    with pytest.raises(TypeError, match="must be callable"):
        register_backend("not_a_fn", 3)


def test_non_callable_return_names_the_backend(small_gm):
    def returns_graph(gm, example_inputs):
        return gm.graph

    with pytest.raises(TypeError) as info:
        compile_graph(returns_graph, small_gm, inputs())
    assert "backend 'returns_graph' returned Graph" in str(info.value)
    assert "not callable" in str(info.value)


def test_backend_exceptions_propagate(small_gm):
    def broken(gm, example_inputs):
        raise NotImplementedError("no kernels for aten.relu")

    with pytest.raises(NotImplementedError, match="no kernels"):
        compile_graph(broken, small_gm, inputs())
