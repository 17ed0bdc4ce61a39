"""Cache entries live as long as the compile() wrapper that made them (issue 9, item 12): the
entries of a dropped wrapper leave the code objects (its targets and its resume functions) with
it, and a live wrapper's entries stay."""

import gc
import tracemalloc

import torch

import framejit
from framejit import _C, record
from framejit.capture import convert_frame as cf
from framejit.capture import resume


def plain(x):
    return x.sin() + 1


def breaking(x):
    y = x.cos()
    print(end="")  # a graph break: a resume function with entries of its own
    return y * 2


def _resume_codes(fn):
    return list(resume._resume_cache.get(fn.__code__, {}).values())


def _entries(code):
    return len(_C.get_cache_entries(code))


def test_dropped_wrappers_leave_no_entries(stats):
    x = torch.ones(3)
    for _ in range(50):
        framejit.compile(plain)(x)
        framejit.compile(breaking)(x)
        assert _entries(plain.__code__) == 0 and _entries(breaking.__code__) == 0
    (rcode,) = _resume_codes(breaking)
    assert _entries(rcode) == 0
    assert stats.captured == 150 and stats.eager_frames == 0


def test_memory_does_not_grow_with_dropped_wrappers(monkeypatch):
    # framejit's own structures, on the native eager backend even in the torch.fx pass of the
    # suite: torch.fx keeps about 2.5 KB per exported GraphModule (its generated source in
    # linecache), which is torch's cache, not an entry of a dropped wrapper.
    from framejit.backends import eager, registry
    for name in ("eager", "default"):
        monkeypatch.setitem(registry._REGISTRY, name, registry.Backend(name, eager.eager, True))
    x = torch.ones(3)

    def round_(n):
        for _ in range(n):
            framejit.compile(plain)(x)
            framejit.compile(breaking)(x)
            # (the statistics and framejit.record's log of events are a log until reset())
            cf.stats.break_reasons.clear()
            record.forget_events()
        gc.collect()

    round_(10)
    objects = len(gc.get_objects())
    tracemalloc.start()
    try:
        round_(3)
        first = tracemalloc.get_traced_memory()[0]
        round_(30)
        second = tracemalloc.get_traced_memory()[0]
        object_growth = len(gc.get_objects()) - objects
        round_(30)
        third = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    # The smaller of two windows: a table that doubles once (weakref.finalize's registry, 18 KB
    # at the size the suite's earlier tests leave it) lands in one window only, whereas what
    # each dropped wrapper left behind would grow both alike.
    growth = min(second - first, third - second)
    # Before: about 14 KB per plain wrapper and 26 KB per breaking one (43 KB per round).
    assert growth < 30 * 1000, f"{growth / 30:.0f} bytes per round of compile() left behind"
    assert object_growth < 33, f"{object_growth} objects more after 33 rounds of dropped wrappers"


def test_live_wrapper_keeps_its_entries(stats):
    x = torch.ones(3)
    keep = framejit.compile(breaking)
    drop = framejit.compile(breaking)
    keep(x)
    drop(x)
    (rcode,) = _resume_codes(breaking)
    assert _entries(breaking.__code__) == 2 and _entries(rcode) == 2
    del drop
    assert _entries(breaking.__code__) == 1 and _entries(rcode) == 1
    (entry,) = _C.get_cache_entries(breaking.__code__)
    assert entry[2] is keep._framejit_context.callback
    captured = stats.captured
    torch.testing.assert_close(keep(x), breaking(x))
    assert stats.captured == captured  # cache hits, nothing recaptured
    for _ in range(20):
        framejit.compile(breaking)(x)
    assert _entries(breaking.__code__) == 1 and _entries(rcode) == 1
    torch.testing.assert_close(keep(x), breaking(x))
    assert stats.captured == captured + 40


def test_dropped_compiled_module_leaves_no_entries():
    lin = torch.nn.Linear(3, 2)
    forward = type(lin).forward.__code__
    model = framejit.compile(lin)
    model(torch.ones(1, 3))
    assert _entries(forward) == 1
    del model
    assert _entries(forward) == 0


def test_recompile_limit_of_a_dropped_wrapper_is_forgotten():
    def f(x):
        return x + 1

    compiled = framejit.compile(f, options={"recompile_limit": 1})
    compiled(torch.ones(2))
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled(torch.ones(3))  # a new shape past the limit: f runs as plain Python from now on
    assert _C.get_code_mode(f.__code__) == _C.MODE_RUN_ONLY
    del compiled
    assert _C.get_code_mode(f.__code__) == _C.MODE_DEFAULT
    again = framejit.compile(f)
    again(torch.ones(3))
    assert _entries(f.__code__) == 1


def test_a_dropped_compiled_model_and_its_parameters_are_freed():
    # framejit.record's log of recent events held the graphs, compiled functions and cache
    # entries it describes: a deleted model lived on, with its parameters, for 512 events.
    import weakref

    x = torch.randn(2, 16)
    alive = []
    for backend in ("default", "eager"):
        for _ in range(3):
            model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU(), torch.nn.LayerNorm(16))
            compiled = framejit.compile(model, backend=backend)
            compiled(x)
            alive.append(weakref.ref(model[0].weight))
            del model, compiled
    gc.collect()
    assert [r() for r in alive] == [None] * len(alive)
    # the log still tells what happened
    assert any(e.kind == "frame_captured" for e in record.events_since(0))


def test_the_code_of_a_dropped_function_with_a_graph_break_is_freed():
    # resume.py's map from a resume function to its original held the original strongly, and
    # the original held the resume (a cycle through two weak-key tables): the code of every
    # function made at run time (exec, notebook cells) that had a graph break stayed forever.
    import weakref

    codes = []
    for k in range(3):
        namespace: dict = {}
        exec(f"def fn(x):\n    y = x * {k}\n    print(end='')\n    return y + 1\n", namespace)
        fn = namespace["fn"]
        compiled = framejit.compile(fn)
        torch.testing.assert_close(compiled(torch.ones(2)), fn(torch.ones(2)))
        assert _resume_codes(fn)
        codes.append(weakref.ref(fn.__code__))
        del namespace, fn, compiled
    gc.collect()
    assert [c() for c in codes] == [None] * 3


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x).relu() * 2


def _call_module(m, x):
    return m(x) + 1


def test_modules_that_a_cache_entry_checks_by_identity_are_freed():
    # A guard that a value is this very object held the object: a module whose forward was
    # compiled in place (m.forward = framejit.compile(m.forward)), whose code's cache entries
    # live with the class, was never freed, and a compiled function kept every module passed
    # to it alive, up to its recompile limit. The guards hold them weakly now.
    import weakref

    x = torch.randn(2, 4)
    for backend in ("default", "eager"):
        framejit.reset()
        m = _Net()
        m.forward = framejit.compile(m.forward, backend=backend)
        torch.testing.assert_close(m(x), m.lin(x).relu() * 2)
        gone = [weakref.ref(m)]
        del m
        f = framejit.compile(_call_module, backend=backend)
        for _ in range(3):
            m = _Net()
            torch.testing.assert_close(f(m, x), _call_module(m, x))
            torch.testing.assert_close(f(m, x), _call_module(m, x))  # the entry still holds
            gone.append(weakref.ref(m))
            del m
        gc.collect()
        assert [r() for r in gone] == [None] * 4
        stats = framejit.stats()
        assert stats["graphs"] == 4 and stats["recompiles"] == 2  # each new module was checked
        reasons = [e.reason for e in record.events_since(0) if e.kind == "recompile"][-2:]
        assert all("the object captured (_Net) is gone" in r for r in reasons), reasons
        # and the entries of the modules gone went: they never pass, nor count toward the limit
        assert len(_C.get_cache_entries(_call_module.__code__)) == 1


def test_a_loop_over_new_modules_never_reaches_the_recompile_limit():
    f = framejit.compile(_call_module, options={"recompile_limit": 3})
    x = torch.randn(2, 4)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the limit's warning
        for _ in range(6):
            m = _Net()
            torch.testing.assert_close(f(m, x), _call_module(m, x))
            del m
            gc.collect()
    assert _entries(_call_module.__code__) == 1


def test_the_code_of_a_dropped_compiled_function_is_freed():
    # The interpreter's table of decoded instructions is keyed weakly by code object, but each
    # instruction held its code strongly: the code of every function made at run time (exec,
    # notebook cells) that was ever captured stayed forever.
    import weakref

    codes = []
    for k in range(3):
        namespace: dict = {}
        exec(f"def fn(x):\n    return (x * {k}).relu() + 1\n", namespace)
        fn = namespace["fn"]
        torch.testing.assert_close(framejit.compile(fn)(torch.ones(2)), fn(torch.ones(2)))
        codes.append(weakref.ref(fn.__code__))
        del namespace, fn
    gc.collect()
    assert [c() for c in codes] == [None] * 3
