"""Fixtures for the capture tests: a clean framejit per test, live statistics, a recording
backend, and ``check``, which runs a function compiled and eagerly and compares everything."""

import copy

import pytest
import torch

import framejit
from framejit.testing import RecordingBackend, assert_close_to_eager, capture_stats, fresh_state

#: Every test starts and ends with no cache entries and zeroed statistics.
fresh_framejit = pytest.fixture(autouse=True)(fresh_state)


@pytest.fixture
def stats():
    """framejit's capture statistics, read live (valid across framejit.reset())."""
    return capture_stats()


@pytest.fixture
def recorder():
    return RecordingBackend()


class Checker:
    """``check(fn, *args)``: compile ``fn``, call it on ``args`` and on a deep copy eagerly, and
    assert equal results, equal argument mutations, one graph, no fallback; then call it again on
    fresh inputs of the same kind and assert that nothing is recaptured."""

    def __init__(self, stats):
        self.stats = stats

    def __call__(self, fn, *args, backend=None, graphs=1, **compile_kwargs):
        """``backend`` defaults to a fresh RecordingBackend (the graphs go through torch.fx),
        whose graph count is checked too; the backend is available as ``check.backend``."""
        if backend is None:
            backend = RecordingBackend()
        self.backend = backend
        modules = {id(m): m for m in _modules_in(args)}
        originals = copy.deepcopy(args, dict(modules))
        eager_args = copy.deepcopy(args)
        expected = fn(*eager_args)
        compiled = framejit.compile(fn, backend=backend, **compile_kwargs)
        actual = compiled(*args)
        s = self.stats
        assert s.eager_frames == 0, f"fell back: {s.fallback_reasons}"
        assert s.captured == 1
        assert s.graphs == graphs
        if isinstance(backend, RecordingBackend):
            assert backend.graph_count == graphs
        assert_close_to_eager(actual, expected)
        # Mutations of the inputs must be exactly those eager made.
        assert_close_to_eager(list(args), list(eager_args), path="arguments after the call")

        # Same kind, other values; modules are the same objects (a new module is a new kind).
        again = _perturbed(copy.deepcopy(originals, dict(modules)))
        again_eager = copy.deepcopy(again)
        assert_close_to_eager(compiled(*again), fn(*again_eager))
        assert_close_to_eager(list(again), list(again_eager), path="arguments after the 2nd call")
        assert s.captured == 1, f"recaptured: {s.recompile_reasons}"
        assert s.recompiles == 0
        if isinstance(backend, RecordingBackend):
            assert backend.graph_count == graphs
        return actual


def _modules_in(obj):
    if isinstance(obj, torch.nn.Module):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for x in obj:
            yield from _modules_in(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from _modules_in(x)


def _perturbed(obj):
    """Floating tensors get new values of the same metadata (in place, so requires_grad leaves
    stay leaves); everything else is kept."""
    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point():
            with torch.no_grad():
                obj.mul_(1.5).add_(0.25)
        return obj
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_perturbed(x) for x in obj)
    if isinstance(obj, list):
        return [_perturbed(x) for x in obj]
    if isinstance(obj, dict):
        return {k: _perturbed(v) for k, v in obj.items()}
    return obj


@pytest.fixture
def check(stats):
    return Checker(stats)
