"""framejit.testing: the helpers must catch what they are meant to catch."""

import pytest
import torch

import framejit
from framejit.backends import lookup_backend
from framejit.testing import (
    RecordingBackend,
    assert_close_to_eager,
    capture_stats,
    fx_export_backend,
    route_default_backend_through_fx,
)


def test_equal_nested_results_pass():
    t = torch.randn(3)
    assert_close_to_eager((t, [t * 2, {"a": t, "b": 3}], None), (t.clone(), [t * 2, {"a": t, "b": 3}], None))


@pytest.mark.parametrize("dtype, ok, bad", [
    (torch.float32, 1e-6, 1e-3),
    (torch.float64, 1e-9, 1e-5),
    (torch.float16, 5e-4, 1e-1),
    (torch.bfloat16, 5e-3, 2e-1),
])
def test_tolerance_depends_on_dtype(dtype, ok, bad):
    base = torch.ones(4, dtype=dtype)
    assert_close_to_eager(base + ok, base)
    with pytest.raises(AssertionError):
        assert_close_to_eager(base + bad, base)


def test_integer_tensors_compare_exactly():
    a = torch.tensor([1, 2, 3])
    assert_close_to_eager(a, a.clone())
    with pytest.raises(AssertionError):
        assert_close_to_eager(a + 1, a)


@pytest.mark.parametrize("actual, expected, words", [
    (torch.zeros(3), torch.zeros(3, dtype=torch.float64), "dtype"),
    (torch.zeros(3), torch.zeros(1, 3), "shape"),
    (torch.zeros(3, requires_grad=True), torch.zeros(3), "requires_grad"),
    ((torch.zeros(3),), [torch.zeros(3)], "list"),
    ([torch.zeros(3)], [torch.zeros(3), torch.zeros(3)], "length"),
    ({"a": torch.zeros(1)}, {"b": torch.zeros(1)}, "keys"),
    (3, 3.0, "3"),
    (torch.zeros(2), 0.0, "tensor"),
])
def test_mismatches_are_reported(actual, expected, words):
    with pytest.raises(AssertionError, match=words):
        assert_close_to_eager(actual, expected)


def test_error_names_the_path_of_the_difference():
    expected = {"logits": (torch.zeros(2), torch.ones(2))}
    actual = {"logits": (torch.zeros(2), torch.zeros(2))}
    with pytest.raises(AssertionError, match=r"result\['logits'\]\[1\]"):
        assert_close_to_eager(actual, expected)


def test_nan_equals_nan():
    assert_close_to_eager(torch.tensor([float("nan"), 1.0]), torch.tensor([float("nan"), 1.0]))
    assert_close_to_eager(float("nan"), float("nan"))


def test_modules_compare_by_state():
    a = torch.nn.Linear(2, 2)
    b = torch.nn.Linear(2, 2)
    with pytest.raises(AssertionError, match="state_dict"):
        assert_close_to_eager(a, b)
    b.load_state_dict(a.state_dict())
    assert_close_to_eager(a, b)


def test_recording_backend_records_graphs_and_runs_them(stats):
    backend = RecordingBackend()

    def f(x):
        return torch.relu(x) * 2

    compiled = framejit.compile(f, backend=backend)
    x = torch.randn(3)
    assert_close_to_eager(compiled(x), f(x))
    assert backend.graph_count == 1
    assert backend.op_count == 2
    assert backend.targets() == [torch.relu, __import__("operator").mul]
    assert backend.example_inputs[0][0] is x
    backend.clear()
    assert backend.graph_count == 0


def test_capture_stats_view_survives_reset():
    stats = capture_stats()
    framejit.compile(lambda x: x + 1)(torch.randn(2))
    assert stats.captured == 1
    framejit.reset()
    assert stats.captured == 0


def test_default_backend_routed_through_the_torch_fx_export(monkeypatch):
    """FRAMEJIT_TEST_BACKEND=fx: backend="default"/"eager" become the torch.fx pass-through, whose
    graphs are torch.fx GraphModules run by their own code; restore() puts back what was there."""
    before = {name: lookup_backend(name) for name in ("default", "eager")}
    seen = []

    def spy(gm, example_inputs):
        seen.append(type(gm))
        return fx_export_backend(gm, example_inputs)

    monkeypatch.setattr("framejit.testing.fx_export_backend", spy)
    restore = route_default_backend_through_fx()
    try:
        for name in ("default", "eager"):
            assert not lookup_backend(name).native
        x = torch.randn(3)
        assert_close_to_eager(framejit.compile(lambda x: x.sin() * 2)(x), x.sin() * 2)
        assert_close_to_eager(framejit.compile(lambda x: x + 1, backend="eager")(x), x + 1)
    finally:
        restore()
    assert seen and all(issubclass(t, torch.fx.GraphModule) for t in seen) and len(seen) == 2
    assert {name: lookup_backend(name) for name in ("default", "eager")} == before
