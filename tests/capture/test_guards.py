"""Guards and recompiles: what makes a cache entry unusable, what the recompile log says, the
recompile limit, cache separation between wrappers, and reset()."""

import dataclasses
import functools
import logging
import types
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import framejit
from framejit import _C
from framejit.capture.guards import TensorGuard
from framejit.capture.sources import LocalSource
from framejit.testing import RecordingBackend, assert_close_to_eager

SCALE = 2.0


@dataclasses.dataclass
class Settings:
    scale: float = 0.5
    mode: str = "tanh"


SETTINGS = Settings()


def scaled(x):
    return x * SCALE


def configured(x):
    y = x * SETTINGS.scale
    return torch.tanh(y) if SETTINGS.mode == "tanh" else y


def double(x):
    return x * 2 + 1


class TrainAware(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        if self.training:
            return h * 0.5
        return h


def where(fn) -> str:
    code = fn.__code__
    return f"{code.co_qualname} at {code.co_filename}:{code.co_firstlineno}"


def recompile_messages(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "framejit.recompiles"]


@pytest.fixture
def log(caplog):
    caplog.set_level(logging.INFO, logger="framejit.recompiles")
    return caplog


def assert_recompiled_once(stats, backend, log, fn, reason):
    assert stats.recompiles == 1
    assert stats.captured == 2
    assert backend.graph_count == 2
    assert stats.recompile_reasons == [(where(fn), reason)]
    assert recompile_messages(log) == [f"Recompiling {where(fn)}: {reason}"]


# -- one change, one recompile, with the reason -----------------------------------------------------

TENSOR_CHANGES = [
    ("dtype", lambda: torch.randn(4, 3), lambda: torch.randn(4, 3, dtype=torch.float64),
     "x.dtype: torch.float32 → torch.float64"),
    ("shape", lambda: torch.randn(4, 3), lambda: torch.randn(5, 3), "x.shape[0]: 4 → 5"),
    ("ndim", lambda: torch.randn(4, 3), lambda: torch.randn(4, 3, 1), "x.ndim: 2 → 3 (shape [4, 3] → [4, 3, 1])"),
    ("requires_grad", lambda: torch.randn(4, 3), lambda: torch.randn(4, 3, requires_grad=True),
     "x.requires_grad: False → True"),
    ("stride", lambda: torch.randn(3, 3), lambda: torch.randn(3, 3).t(),
     "x.stride(): (3, 1) → (1, 3) (a differently laid out tensor, e.g. a transposed view)"),
]


@pytest.mark.parametrize("name, first, second, reason", TENSOR_CHANGES, ids=[c[0] for c in TENSOR_CHANGES])
def test_tensor_change_recompiles_once_with_reason(stats, log, name, first, second, reason):
    backend = RecordingBackend()
    compiled = framejit.compile(double, backend=backend)
    a = first()
    assert_close_to_eager(compiled(a), double(a))
    a2 = first()
    assert_close_to_eager(compiled(a2), double(a2))  # same kind: no recompile
    assert stats.recompiles == 0 and backend.graph_count == 1

    b = second()
    assert_close_to_eager(compiled(b), double(b))
    assert_recompiled_once(stats, backend, log, double, reason)

    # Both kinds now hit their own entry: nothing new is captured.
    a3, b3 = first(), second()
    assert_close_to_eager(compiled(a3), double(a3))
    assert_close_to_eager(compiled(b3), double(b3))
    assert stats.captured == 2 and backend.graph_count == 2
    assert len(_C.get_cache_entries(double.__code__)) == 2


def test_global_constant_change_recompiles(stats, log):
    global SCALE
    backend = RecordingBackend()
    compiled = framejit.compile(scaled, backend=backend)
    x = torch.randn(3)
    try:
        assert_close_to_eager(compiled(x), x * 2.0)
        SCALE = 3.0
        assert_close_to_eager(compiled(x), x * 3.0)
        assert_recompiled_once(stats, backend, log, scaled, "SCALE: 2.0 → 3.0")
        SCALE = 2.0
        assert_close_to_eager(compiled(x), x * 2.0)  # back to the first entry
        assert stats.captured == 2
    finally:
        SCALE = 2.0


def test_config_attribute_change_recompiles(stats, log):
    backend = RecordingBackend()
    compiled = framejit.compile(configured, backend=backend)
    x = torch.randn(3)
    try:
        assert_close_to_eager(compiled(x), configured(x))
        SETTINGS.scale = 4.0
        assert_close_to_eager(compiled(x), configured(x))
        assert_recompiled_once(stats, backend, log, configured, "SETTINGS.scale: 0.5 → 4.0")
        SETTINGS.mode = "linear"
        assert_close_to_eager(compiled(x), configured(x))  # the branch changes too
        # The newest version's failing guard is named, and the older ones are counted.
        assert stats.recompile_reasons[-1] == (
            where(configured),
            "SETTINGS.mode: 'tanh' → 'linear' (and the older version does not fit either)")
        assert stats.captured == 3
    finally:
        SETTINGS.scale, SETTINGS.mode = 0.5, "tanh"


def test_config_object_replaced_recompiles(stats, log):
    global SETTINGS
    compiled = framejit.compile(configured)
    x = torch.randn(3)
    original = SETTINGS
    try:
        compiled(x)
        SETTINGS = types.SimpleNamespace(scale=0.5, mode="tanh")
        assert_close_to_eager(compiled(x), configured(x))
        assert stats.recompiles == 1
        assert stats.recompile_reasons[0][1] == "type(SETTINGS): Settings → SimpleNamespace"
    finally:
        SETTINGS = original


def test_train_eval_change_recompiles(stats, log):
    backend = RecordingBackend()
    model = TrainAware()
    compiled = framejit.compile(model, backend=backend)
    x = torch.randn(2, 4)
    assert_close_to_eager(compiled(x), model(x))
    model.eval()
    assert_close_to_eager(compiled(x), model(x))
    forward = TrainAware.forward
    assert_recompiled_once(stats, backend, log, forward, "self.training: True → False")
    model.train()
    compiled(x)
    assert stats.captured == 2  # the train-mode entry is reused


def test_grad_mode_change_recompiles(stats, log):
    backend = RecordingBackend()
    compiled = framejit.compile(double, backend=backend)
    x = torch.randn(3, requires_grad=True)
    out = compiled(x)
    assert out.requires_grad
    with torch.no_grad():
        out = compiled(x)
    assert not out.requires_grad
    assert_recompiled_once(stats, backend, log, double, "torch.is_grad_enabled(): True → False")
    compiled(x)
    with torch.no_grad():
        compiled(x)
    assert stats.captured == 2


def test_new_module_instance_recompiles_but_same_instance_does_not(stats):
    def apply(layer, x):
        return F.relu(layer(x))

    compiled = framejit.compile(apply)
    first, second = nn.Linear(4, 4), nn.Linear(4, 4)
    x = torch.randn(2, 4)
    compiled(first, x)
    compiled(first, torch.randn(2, 4))
    assert stats.captured == 1
    assert_close_to_eager(compiled(second, x), apply(second, x))
    assert stats.recompiles == 1
    assert stats.recompile_reasons[0][1].startswith("layer: a different object")


class Notes:
    """A logger-like object whose method is no plain function (transformers' ``warning_once`` is
    an lru_cache wrapper): a call to it is a graph break."""

    def __init__(self):
        self.said = []

    @functools.lru_cache(None)  # noqa: B019 (as transformers does)
    def once(self, message):
        self.said.append(message)


NOTES = Notes()


def test_a_bound_method_read_at_each_call_is_not_guarded_by_identity(stats):
    # ``NOTES.once`` is a new bound method at every read: its function and its object are
    # guarded, not the method object (that guard failed at every call, and each call
    # recompiled). Another object of the class takes the call at the break; another function
    # on the class recompiles.
    global NOTES

    def warn(x):
        y = x * 2
        NOTES.once("deprecated")
        return y + 1

    compiled = framejit.compile(warn)
    x = torch.randn(3)
    for _ in range(4):
        assert_close_to_eager(compiled(x), warn(x))
    assert stats.recompiles == 0 and NOTES.said == ["deprecated"]
    old, NOTES = NOTES, Notes()
    try:
        assert_close_to_eager(compiled(x), x * 2 + 1)  # (its method runs at the break)
        assert NOTES.said == ["deprecated"] and stats.recompiles == 0
        original = Notes.once
        Notes.once = functools.lru_cache(None)(lambda self, message: self.said.append(message.upper()))
        try:
            compiled(x)
            assert stats.recompiles == 1 and NOTES.said == ["deprecated", "DEPRECATED"]
            assert "a different object" in stats.recompile_reasons[-1][1]
        finally:
            Notes.once = original
    finally:
        NOTES = old


OPTIONS = {f"unused_{i}": i for i in range(40)}


def test_a_dict_read_a_key_at_a_time_guards_only_those_keys(stats):
    # A dict from outside asked for a few of its keys (a config's __dict__) guards those keys
    # alone: another key added elsewhere in it recompiles nothing. Changing what was read does.
    # Read for many keys, it is guarded whole.
    def scaled(x):
        scale = OPTIONS.get("scale", 1.0)
        if "shift" in OPTIONS:
            x = x + OPTIONS["shift"]
        return x * scale

    def many(x):
        return x * sum(OPTIONS[f"unused_{i}"] for i in range(12))

    compiled, x = framejit.compile(scaled), torch.randn(3)
    OPTIONS["scale"] = 2.0
    try:
        assert_close_to_eager(compiled(x), scaled(x))
        OPTIONS["unused_new"] = 1  # a key it does not read
        assert_close_to_eager(compiled(x), scaled(x))
        assert stats.recompiles == 0
        OPTIONS["scale"] = 3.0
        assert_close_to_eager(compiled(x), scaled(x))
        assert stats.recompiles == 1
        OPTIONS["shift"] = 0.5  # a key it found absent
        assert_close_to_eager(compiled(x), scaled(x))
        assert stats.recompiles == 2 and "'shift' in OPTIONS" in stats.recompile_reasons[-1][1]
        del OPTIONS["scale"]
        assert_close_to_eager(compiled(x), scaled(x))
        assert stats.recompiles == 3
        whole = framejit.compile(many)
        assert_close_to_eager(whole(x), many(x))
        OPTIONS["unused_other"] = 2
        assert_close_to_eager(whole(x), many(x))
        assert stats.recompiles == 4  # (its keys are guarded whole)
    finally:
        for k in ("scale", "shift", "unused_new", "unused_other"):
            OPTIONS.pop(k, None)


def test_a_dict_s_read_keys_are_guarded_in_one_test_each_way(stats):
    # The keys a dict was found to hold, and those it was found not to hold, are checked by one
    # line each (all of them in it; none of them in it), as each key's guard would: adding any
    # absent key, or deleting any present one, recompiles with that key named.
    def reads(x):
        for name in ("scale", "shift", "bias"):
            if name in OPTIONS:
                x = x * OPTIONS[name]
        return x + OPTIONS.get("offset", 0.0) + OPTIONS.get("unused_3", 0)

    compiled, x = framejit.compile(reads), torch.randn(3)
    OPTIONS["scale"] = 2.0
    try:
        assert_close_to_eager(compiled(x), reads(x))
        ((guard_fn, _, _, _),) = _C.get_cache_entries(reads.__code__)
        source = guard_fn.__framejit_source__
        assert source.count(".__contains__, ") == 2 and ".__contains__('" not in source, source
        for step, key in enumerate(("shift", "bias", "offset"), start=1):
            OPTIONS[key] = 0.5
            assert_close_to_eager(compiled(x), reads(x))
            assert stats.recompiles == step and f"'{key}' in OPTIONS" in stats.recompile_reasons[-1][1]
        del OPTIONS["unused_3"]  # a key it found present
        assert_close_to_eager(compiled(x), reads(x))
        assert stats.recompiles == 4 and "'unused_3' in OPTIONS" in stats.recompile_reasons[-1][1]
    finally:
        for k in ("scale", "shift", "bias", "offset"):
            OPTIONS.pop(k, None)
        OPTIONS["unused_3"] = 3


def test_parameter_values_are_not_baked_in(stats):
    model = nn.Linear(3, 3)
    compiled = framejit.compile(model)
    x = torch.randn(2, 3)
    compiled(x)
    with torch.no_grad():
        model.weight.mul_(2)
    assert_close_to_eager(compiled(x), model(x))
    assert stats.captured == 1


def make_scaler(scale):
    def scaled_by(x):
        return x * scale
    return scaled_by


def test_closures_of_one_code_object_keep_their_own_values(stats):
    # Two closures share one code object (and its cache): the cell contents must be guarded.
    by3, by4 = make_scaler(3.0), make_scaler(4.0)
    c3, c4 = framejit.compile(by3), framejit.compile(by4)
    x = torch.randn(4)
    assert_close_to_eager(c3(x), x * 3.0)
    assert_close_to_eager(c4(x), x * 4.0)
    assert_close_to_eager(c3(x), x * 3.0)
    assert stats.eager_frames == 0
    assert stats.captured == 2


def make_counter_scaled():
    scale = 1.0

    def scaled_by(x):
        return x * scale

    def set_scale(value):
        nonlocal scale
        scale = value

    return scaled_by, set_scale


def test_closure_variable_change_recompiles(stats):
    fn, set_scale = make_counter_scaled()
    compiled = framejit.compile(fn)
    x = torch.randn(4)
    assert_close_to_eager(compiled(x), x * 1.0)
    set_scale(5.0)
    assert_close_to_eager(compiled(x), x * 5.0)
    assert stats.recompiles == 1
    assert "scale" in stats.recompile_reasons[0][1] and "1.0 → 5.0" in stats.recompile_reasons[0][1]


def test_failure_reason_from_the_guard_set():
    compiled = framejit.compile(double)
    compiled(torch.randn(4, 3))
    ((guard_fn, _, _, info),) = _C.get_cache_entries(double.__code__)
    assert info.guards.failure_reason({"x": torch.randn(4, 3)}) is None
    assert info.guards.failure_reason({"x": torch.randn(4, 2)}) == "x.shape[1]: 3 → 2"
    assert info.guards.failure_reason({"x": 1.0}) == "type(x): Tensor → float"
    assert guard_fn(torch.randn(4, 3)) is True
    assert guard_fn(torch.randn(4, 2)) is False
    # a negative view reads negated: a kernel of the graph would read its memory
    assert guard_fn(torch._neg_view(torch.randn(4, 3))) is False
    assert info.guards.failure_reason({"x": torch._neg_view(torch.randn(4, 3))}) == \
        "x.is_neg(): False → True (a negative view)"


def test_the_python_line_of_a_tensor_guard_checks_what_the_one_call_check_does(monkeypatch):
    # Without torch's C++ TensorGuards each tensor's guard is a Python line.
    from framejit.capture import guards

    monkeypatch.setattr(guards, "_TensorGuards", None)
    framejit.reset()
    compiled = framejit.compile(double)
    compiled(torch.randn(4, 3))
    ((guard_fn, _, _, info),) = _C.get_cache_entries(double.__code__)
    assert "x.shape != (4, 3)" in info.guard_fn.__framejit_source__
    assert guard_fn(torch.randn(4, 3)) is True
    for other in (torch.randn(4, 2), torch.randn(3, 4).t(), torch._neg_view(torch.randn(4, 3)),
                  torch.randn(4, 3, dtype=torch.float64), torch.randn(4, 3, requires_grad=True)):
        assert guard_fn(other) is False


# -- devices ----------------------------------------------------------------------------------------

@pytest.mark.gpu
def test_device_change_recompiles(stats, log):
    backend = RecordingBackend()
    compiled = framejit.compile(double, backend=backend)
    x = torch.randn(3)
    compiled(x)
    y = x.cuda()
    assert_close_to_eager(compiled(y), double(y))
    assert_recompiled_once(stats, backend, log, double, "x.device: cpu → cuda:0")


def test_device_guard_without_a_second_device():
    """This machine may have no second device, so the device guard is checked on its own: a guard
    recorded for a tensor on ``cuda:0`` (its recorded device swapped in; nothing runs on CUDA or
    meta) must reject a CPU tensor, in generated code and in the reason."""
    x = torch.randn(3)
    guard = TensorGuard(LocalSource("x"), x)
    assert guard.reason(torch.randn(3)) is None
    guard.device = torch.device("cuda", 0)
    assert guard.reason(torch.randn(3)) == "x.device: cuda:0 → cpu"

    namespace = {}

    def names(obj):
        name = f"___n{len(namespace)}"
        namespace[name] = obj
        return name

    (line,) = guard.code("x", names)
    src = "def check(x):\n    " + line + "\n    return True\n"
    exec(src, namespace)
    assert namespace["check"](torch.randn(3)) is False
    guard.device = torch.device("cpu")
    (line,) = guard.code("x", names)
    exec("def check(x):\n    " + line + "\n    return True\n", namespace)
    assert namespace["check"](torch.randn(3)) is True


# -- the recompile limit ----------------------------------------------------------------------------

def test_recompile_limit_falls_back_with_one_warning(stats, log):
    backend = RecordingBackend()
    # dynamic=False: each size is its own version (automatic dynamic shapes would make one).
    compiled = framejit.compile(double, backend=backend, dynamic=False, options={"recompile_limit": 3})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(1, 7):
            x = torch.randn(n)
            assert_close_to_eager(compiled(x), double(x))
        for n in (1, 2, 3):  # the cached kinds still run their graphs
            x = torch.randn(n)
            assert_close_to_eager(compiled(x), double(x))
    limit_warnings = [w for w in caught if "recompile_limit" in str(w.message)]
    assert len(limit_warnings) == 1
    assert issubclass(limit_warnings[0].category, UserWarning)
    assert "recompile_limit=3" in str(limit_warnings[0].message)
    assert backend.graph_count == 3
    assert stats.captured == 3 and stats.recompiles == 2
    # n = 4 hits the limit; from then on the hook runs the original code without asking again.
    assert stats.eager_frames == 1
    assert _C.get_code_mode(double.__code__) == _C.MODE_RUN_ONLY
    assert len(_C.get_cache_entries(double.__code__)) == 3
    assert all("recompile limit" in message for _, message in stats.fallback_reasons)


def test_default_recompile_limit_is_eight(stats):
    compiled = framejit.compile(double, dynamic=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(1, 11):
            x = torch.randn(n)
            assert_close_to_eager(compiled(x), double(x))
    assert stats.captured == 8
    assert stats.eager_frames == 1  # counted when the limit is hit; later misses run silently
    assert len([w for w in caught if "recompile_limit=8" in str(w.message)]) == 1


# -- cache ownership and reset ----------------------------------------------------------------------

def test_two_wrappers_with_different_backends_keep_separate_caches(stats):
    first, second = RecordingBackend(), RecordingBackend()
    a = framejit.compile(double, backend=first)
    b = framejit.compile(double, backend=second)
    x = torch.randn(3)
    a(x)
    b(x)
    a(torch.randn(3))
    b(torch.randn(3))
    assert first.graph_count == 1 and second.graph_count == 1
    entries = _C.get_cache_entries(double.__code__)
    assert len(entries) == 2
    assert entries[0][2] is not entries[1][2]  # different owners
    assert stats.captured == 2 and stats.recompiles == 0  # a miss for another wrapper is no recompile


def test_reset_forces_recapture(stats):
    backend = RecordingBackend()
    compiled = framejit.compile(double, backend=backend)
    x = torch.randn(3)
    compiled(x)
    assert backend.graph_count == 1
    framejit.reset()
    assert stats.captured == 0  # the statistics start again
    assert _C.get_cache_entries(double.__code__) == []
    assert_close_to_eager(compiled(x), double(x))
    assert backend.graph_count == 2
    assert stats.captured == 1 and stats.recompiles == 0


def test_reset_retries_a_function_that_fell_back(stats):

    def sometimes_prints(x, verbose):
        if verbose:
            try:
                print("hello")  # inside try: cannot be split, the frame runs as Python
            finally:
                pass
        return x + 1

    compiled = framejit.compile(sometimes_prints)
    compiled(torch.randn(2), True)
    assert stats.eager_frames == 1
    compiled(torch.randn(2), False)  # the code was marked "run as Python": no new attempt
    assert stats.captured == 0
    framejit.reset()
    compiled(torch.randn(2), False)
    assert stats.captured == 1


def self_or_cross(q, k):
    if q is k:
        return q * 2
    return q + k


def test_identity_of_two_tensor_inputs_is_guarded(stats, caplog):
    import logging

    compiled = framejit.compile(self_or_cross)
    x, y = torch.randn(3), torch.randn(3)
    assert_close_to_eager(compiled(x, x), x * 2)
    with caplog.at_level(logging.INFO, logger="framejit.recompiles"):
        assert_close_to_eager(compiled(x, y), x + y)
    assert "q and k: now different objects" in caplog.text
    assert_close_to_eager(compiled(y, y), y * 2)  # the first entry again
    assert (stats.captured, stats.graph_breaks) == (2, 0)


def test_self_attention_is_one_graph(stats):
    from torch import nn

    m = nn.MultiheadAttention(16, 4).eval()
    x = torch.randn(5, 2, 16)
    with torch.no_grad():
        out = framejit.compile(m)(x, x, x)
        expected = m(x, x, x)
    assert_close_to_eager(out, expected)
    assert (stats.graphs, stats.graph_breaks, stats.eager_frames) == (1, 0, 0)



DEFAULT_CFG = {"scale": 2.0}
DEFAULT_LIST = [2.0]


class _Settings:
    scale = 2.0


DEFAULT_OBJ = _Settings()


def _helper_with_defaults(x, cfg=DEFAULT_CFG, lst=DEFAULT_LIST, *, obj=DEFAULT_OBJ):
    return x * cfg["scale"] + lst[0] + obj.scale


def _calls_helper_with_defaults(x):
    return _helper_with_defaults(x)


def _nested_function_with_a_default(x):
    def inner(y, cfg=DEFAULT_CFG):
        return y * cfg["scale"]
    return inner(x) + inner(x, {"scale": 1.0})


@pytest.mark.parametrize("fn", [_calls_helper_with_defaults, _nested_function_with_a_default])
def test_mutable_defaults_of_called_functions_are_guarded(fn, stats):
    # A dict, a list and an object given as default values to a function the compiled one
    # calls (or defines): their contents were taken as fixed when captured, so changing
    # DEFAULT_CFG["scale"] afterwards was not seen (wrong answers).
    compiled = framejit.compile(fn)
    x = torch.ones(2)
    try:
        for scale, first, attr in ((2.0, 2.0, 2.0), (3.0, 5.0, 7.0), (3.0, 5.0, 7.0)):
            DEFAULT_CFG["scale"], DEFAULT_LIST[0], DEFAULT_OBJ.scale = scale, first, attr
            torch.testing.assert_close(compiled(x), fn(x))
    finally:
        DEFAULT_CFG["scale"], DEFAULT_LIST[0], DEFAULT_OBJ.scale = 2.0, 2.0, 2.0
    assert stats.graphs == 2 and stats.recompiles == 1


def test_a_nested_function_s_default_made_in_the_frame(stats):
    def f(x):
        def inner(y, w=x * 2, *, bias=x + 1):
            return y * w + bias
        return inner(x)

    x = torch.randn(3)
    torch.testing.assert_close(framejit.compile(f, fullgraph=True)(x), f(x))
    assert stats.graphs == 1


def _follows_changes(fn, table, key, values):
    """Compiled ``fn`` against eager while ``table[key]`` takes ``values`` in turn (put back
    afterwards)."""
    compiled = framejit.compile(fn)
    x = torch.ones(2)
    old = table[key]
    try:
        for value in values:
            table[key] = value
            torch.testing.assert_close(compiled(x), fn(x))
    finally:
        table[key] = old


def _scaled_by(cfg):
    def decorate(fn):
        def inner(self, x):
            return fn(self, x) * cfg["k"]
        return inner
    return decorate


CLOSED_CFG = {"k": 2.0}


class _Decorated:
    @_scaled_by(CLOSED_CFG)
    def run(self, x):
        return x + 1


DECORATED = _Decorated()


class _CallsDecorated(nn.Module):
    def forward(self, x):
        return DECORATED.run(x)


@pytest.mark.parametrize("as_module", [False, True], ids=["function", "module"])
def test_closure_cells_of_a_method_are_guarded(as_module, stats):
    # A method looked up on an object is called without a path to it; its decorator's closure
    # (cfg) was taken as fixed, so changing CLOSED_CFG["k"] afterwards was not seen.
    _follows_changes(_CallsDecorated() if as_module else (lambda x: DECORATED.run(x)),
                     CLOSED_CFG, "k", (2.0, 5.0, 5.0))
    assert stats.recompiles == 1


class _BaseWithTable:
    TABLE = {"k": 2.0}


class _ReadsTableThroughSuper(_BaseWithTable):
    def run(self, x):
        return x * super().TABLE["k"]


def test_a_class_attribute_read_through_super_is_guarded(stats):
    obj = _ReadsTableThroughSuper()
    _follows_changes(lambda x: obj.run(x), _BaseWithTable.TABLE, "k", (2.0, 4.0, 4.0))
    assert stats.recompiles == 1


class _ClassTable(nn.Module):
    TABLE = {"k": 2.0}

    def forward(self, x):
        return x * type(self).TABLE["k"]


def test_a_class_attribute_read_through_type_of_self_is_guarded(stats):
    _follows_changes(_ClassTable(), _ClassTable.TABLE, "k", (2.0, 5.0, 5.0))
    assert stats.recompiles == 1 and stats.eager_frames == 0


@pytest.mark.parametrize("change", ["shape", "stride", "dtype", "requires_grad", "type", "device"])
def test_tensors_are_checked_in_one_call_that_still_catches_each_change(change, stats):
    """The tensor guards of a cache entry are one call to torch's C++ TensorGuards; a change
    to any tensor recompiles, and the log names the tensor and what changed."""
    def f(a, b, c):
        return a + b.sum() + c

    compiled = framejit.compile(f)
    a, b, c = torch.randn(3), torch.randn(2, 4), torch.randn(3)
    compiled(a, b, c)
    ((guard_fn, _, _, _),) = _C.get_cache_entries(f.__code__)
    assert ".shape !=" not in guard_fn.__framejit_source__  # no per-tensor Python line
    other = {
        "shape": lambda: torch.randn(2, 5),
        "stride": lambda: torch.randn(4, 2).t(),
        "dtype": lambda: torch.randn(2, 4, dtype=torch.float64),
        "requires_grad": lambda: torch.randn(2, 4, requires_grad=True),
        "type": lambda: nn.Parameter(torch.randn(2, 4)),
        "device": lambda: torch.randn(2, 4, device="meta"),
    }[change]()
    if change == "device":  # (meta: eager cannot add its sum to a CPU tensor; the guard fails)
        assert not guard_fn(a, other, c) and guard_fn(a, b, c)
        return
    torch.testing.assert_close(compiled(a, other, c), f(a, other, c))
    assert stats.recompiles == 1
    assert "b" in stats.recompile_reasons[-1][1]
    with torch.no_grad():  # grad mode is a guard of its own: recompiles, then no more
        compiled(a, b, c)
        compiled(a, b, c)
    assert stats.recompiles == 2


class _Tied(nn.Module):
    """A weight reached by two paths (an LM head tied to its embedding, T5's shared table)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(8, 4)
        self.head = nn.Linear(4, 8, bias=False)
        self.head.weight = self.embed.weight
        self.norm = nn.LayerNorm(4)

    def forward(self, ids):
        return self.head(self.norm(self.embed(ids)))


def test_a_tied_weight_keeps_the_one_call_tensor_check(stats):
    """torch's TensorGuards fails any call that passes one tensor twice, so a tied weight once
    turned every tensor of the entry back into a Python line (T5's guard took 280 µs a call
    instead of 200): now the tensor is batched at its first path, its second path keeps its
    Python line, and a change at either path, or to any other tensor, is still seen."""
    model = _Tied()
    compiled = framejit.compile(model)
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        torch.testing.assert_close(compiled(ids), model(ids))
        ((guard_fn, _, _, _),) = _C.get_cache_entries(_Tied.forward.__code__)
        assert guard_fn.__framejit_source__.count(".shape !=") == 1  # the tied weight's 2nd path
        model.head.weight = nn.Parameter(torch.randn(8, 4))  # untied, the same metadata
        torch.testing.assert_close(compiled(ids), model(ids))
        assert stats.recompiles == 0
        model.head.weight = nn.Parameter(torch.randn(4, 8).t())  # other strides
        torch.testing.assert_close(compiled(ids), model(ids))
        model.embed.weight = nn.Parameter(torch.randn(8, 4).double())
        model.norm.double()
        model.head.double()
        torch.testing.assert_close(compiled(ids), model(ids))
        assert stats.recompiles == 2
        model.norm.weight.requires_grad_(False)  # an untied tensor: the batched call sees it
        torch.testing.assert_close(compiled(ids), model(ids))
        assert stats.recompiles == 3
