"""framejit.record: the one record every compile path writes and every report reads."""

import warnings

import torch

import framejit
from framejit import record


def affine(x):
    return torch.sin(x) * 2 + 1


def test_events_of_one_compile_and_nothing_on_cache_hits():
    compiled = framejit.compile(affine, backend="eager")
    start = record.mark()
    compiled(torch.ones(3))
    events = record.events_since(start)
    assert [e.kind for e in events] == ["frame_offered", "graph_compiled", "frame_captured"]
    captured = events[-1]
    assert captured.function.startswith("affine at ") and captured.version == 0
    assert captured.ops == 3 and captured.graph is events[1].graph
    assert captured.children == [events[1]]  # the graph compile happened inside this capture
    assert [e.seq for e in events] == sorted(e.seq for e in events)
    assert captured.guard_source.startswith("def ___guard_") and "(x): return False" in captured.guard_source
    # Calls that hit the cache write nothing.
    after = record.mark()
    for _ in range(5):
        compiled(torch.ones(3))
    assert record.events_since(after) == []
    assert framejit.stats()["frames"] == 1 and framejit.stats()["graphs"] == 1


def test_counters_are_reset_in_place():
    stats = record.stats
    framejit.compile(affine, backend="eager")(torch.ones(3))
    assert stats.captured == 1 and stats.ops == 3 and stats.capture_seconds > 0
    framejit.reset()
    assert record.stats is stats and stats.captured == 0 and stats.break_reasons == []
    assert record.events_since(0) == []


def test_a_failing_reader_warns_once_and_changes_nothing():
    calls = []

    def broken(event):
        calls.append(event.kind)
        raise KeyError("oops")

    record.subscribe(broken)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = framejit.compile(affine, backend="eager")(torch.ones(3))
        torch.testing.assert_close(out, affine(torch.ones(3)))
        assert calls == ["frame_offered", "graph_compiled", "frame_captured"]
        (w,) = [w for w in caught if "broken" in str(w.message)]
        assert "KeyError" in str(w.message) and "the program runs on" in str(w.message)
    finally:
        record.unsubscribe(broken)


def test_the_log_keeps_the_newest_events_only():
    framejit.reset()
    for i in range(record.MAX_EVENTS + 10):
        record.emit(record.Stage(name=f"s{i}", seconds=0.0))
    events = record.events_since(0)
    assert len(events) == record.MAX_EVENTS and events[-1].name == f"s{record.MAX_EVENTS + 9}"
