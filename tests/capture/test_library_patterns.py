"""Patterns real libraries (transformers) use: config objects with their own __getattribute__,
super().__getattribute__, the frame's own **kwargs mutated, inspecting a function's code,
import statements, torch.compiler queries."""

import collections
import dataclasses
import typing

import pytest
import torch

import framejit
from framejit import _C
from framejit.testing import assert_close_to_eager


class AliasingConfig:
    """Like transformers' PretrainedConfig: names mapped in __getattribute__."""

    attribute_map = {"hidden": "hidden_size"}

    def __init__(self, hidden_size, use_bias):
        self.hidden_size = hidden_size
        self.use_bias = use_bias

    def __getattribute__(self, key):
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)


def uses_config(x, cfg):
    y = x[..., : cfg.hidden] * 2
    if cfg.use_bias:
        y = y + 1
    return y


def test_config_with_custom_getattribute_is_read_and_guarded(stats, caplog):
    import logging

    cfg = AliasingConfig(3, True)
    compiled = framejit.compile(uses_config)
    x = torch.randn(2, 5)
    assert_close_to_eager(compiled(x, cfg), uses_config(x, cfg))
    assert (stats.graphs, stats.graph_breaks, stats.eager_frames) == (1, 0, 0)
    cfg.use_bias = False
    with caplog.at_level(logging.INFO, logger="framejit.recompiles"):
        assert_close_to_eager(compiled(x, cfg), uses_config(x, cfg))
    assert "cfg.use_bias: True → False" in caplog.text


def reads_config_again_around_a_write(x, cfg):
    a = len(cfg.act) + len(cfg.act)  # the second read: what the first found
    cfg.act = "sigmoid"  # a write: a read after it inlines the method again
    b = len(cfg.act) * 10 + len(cfg.act)
    return x * a + b + len(cfg.names) + (cfg.names is not cfg.names)


class FreshListConfig(AliasingConfig):
    """A config whose __getattribute__ hands out a new list at each read of ``names``."""

    def __init__(self, hidden_size, use_bias):
        super().__init__(hidden_size, use_bias)
        self.act = "relu"

    def __getattribute__(self, key):
        if key == "names":
            return ["a", "b"]
        return super().__getattribute__(key)


def test_a_config_read_again_in_the_frame_takes_the_first_read_s_value(monkeypatch):
    # GPT-2 read its config's attributes through the class's __getattribute__ (two, through
    # super()) 53 times, 26 names, each read inlined again: about 20 ms of a 120 ms first call.
    # A second read of the same name, with nothing written in the frame since, takes the
    # first one's value; a read after a write inlines the method again (and finds the written
    # value), and a read that builds a new object each time is not reused (new lists).
    from framejit.capture import interpreter

    inlined = []
    real = interpreter.Translator.inline_code

    def counting(self, code, *args, **kwargs):
        if code is FreshListConfig.__getattribute__.__code__:
            inlined.append(code)
        return real(self, code, *args, **kwargs)

    monkeypatch.setattr(interpreter.Translator, "inline_code", counting)
    x = torch.randn(2, 8)
    cfg, reference = FreshListConfig(3, True), FreshListConfig(3, True)
    compiled = framejit.compile(reads_config_again_around_a_write, fullgraph=True)
    assert_close_to_eager(compiled(x, cfg), reads_config_again_around_a_write(x, reference))
    assert cfg.act == reference.act == "sigmoid"
    assert len(inlined) == 5  # act before the write, act after it, names three times
    cfg.act = "relu"
    assert_close_to_eager(compiled(x, cfg), reads_config_again_around_a_write(x, FreshListConfig(3, True)))


def reads_a_transformers_config(x, cfg):
    return x * cfg.hidden_size + cfg.n_layer + (1 if cfg.use_cache else 0)


def test_a_transformers_config_is_read_without_inlining_its_getattribute(stats, monkeypatch):
    # transformers' configs read every attribute through two __getattribute__ methods
    # (PreTrainedConfig's attribute_map, HeterogeneousConfigMixin's per-layer check). Capture
    # runs them as what they do (known_getattribute), with the guards their reads make, where
    # their source is the one it knows; a heterogeneous config (a per-layer spec), or a class
    # whose method differs (FreshListConfig, above), has them inlined.
    import warnings

    from framejit.capture import interpreter
    from framejit.capture.values import known_getattribute

    T = pytest.importorskip("transformers")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg, other = (T.GPT2Config(n_layer=2, n_embd=8, n_head=2) for _ in range(2))
    # (fails when transformers changes the methods: compare their source with _KNOWN_SOURCES)
    assert known_getattribute.chain(type(cfg)) is not None
    assert known_getattribute.chain(FreshListConfig) is None
    inlined = []
    real = interpreter.Translator.inline_code
    monkeypatch.setattr(interpreter.Translator, "inline_code",
                        lambda self, code, *a, **k: inlined.append(code.co_name) or real(self, code, *a, **k))
    compiled, x = framejit.compile(reads_a_transformers_config), torch.randn(3)
    assert_close_to_eager(compiled(x, cfg), reads_a_transformers_config(x, cfg))
    assert "__getattribute__" not in inlined and stats.graph_breaks == 0
    assert_close_to_eager(compiled(x, other), reads_a_transformers_config(x, other))
    assert stats.recompiles == 0
    cfg.n_embd = 16  # what hidden_size names
    assert_close_to_eager(compiled(x, cfg), reads_a_transformers_config(x, cfg))
    assert stats.recompiles == 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        other.per_layer_config = {0: {"layer_norm_epsilon": 1e-3}}
    assert_close_to_eager(compiled(x, other), reads_a_transformers_config(x, other))
    assert "__getattribute__" in inlined and stats.recompiles == 2


def uses_config_and_probes(x, cfg):
    y = uses_config(x, cfg)
    return y * 3 if hasattr(cfg, "scale") else y


def test_guards_read_a_config_without_running_its_getattribute(stats):
    """A class's own Python __getattribute__ is inlined: its guards read what it read, with
    object.__getattribute__ (a transformers config's read through the method costs 2 to 5 µs
    in every guard, a missing name most; GPT-2's guard went from 112 to 47 µs), and any change
    to what it depends on still recompiles."""
    import sys

    class Config(AliasingConfig):
        pass

    cfg = Config(3, True)
    compiled = framejit.compile(uses_config_and_probes)
    x = torch.randn(2, 5)
    want = uses_config_and_probes(x, cfg)
    assert_close_to_eager(compiled(x, cfg), want)
    assert (stats.graphs, stats.recompiles, stats.graph_breaks) == (1, 0, 0)
    calls = []
    method = AliasingConfig.__getattribute__.__code__
    sys.setprofile(lambda frame, event, arg: calls.append(1) if event == "call" and frame.f_code is method else None)
    try:
        for _ in range(3):
            got = compiled(x, cfg)
    finally:
        sys.setprofile(None)
    assert calls == []  # neither the guard nor the compiled code ran it
    assert_close_to_eager(got, want)
    changes = [lambda: setattr(cfg, "use_bias", False),  # a value it read
               lambda: setattr(cfg, "hidden_size", 4),  # the name the map leads to
               lambda: setattr(cfg, "scale", 2.0),  # a name that was missing
               lambda: setattr(Config, "attribute_map", {"hidden": "use_bias"})]  # the map
    for n, change in enumerate(changes, 1):
        change()
        assert_close_to_eager(compiled(x, cfg), uses_config_and_probes(x, cfg))
        assert stats.recompiles == n


def pops_kwargs(x, **kwargs):
    scale = kwargs.pop("scale", 1.0)
    kwargs["extra"] = 2.0
    return x * scale + kwargs["extra"], sorted(kwargs)


def test_frames_own_kwargs_can_be_mutated(stats):
    x = torch.randn(3)
    compiled = framejit.compile(pops_kwargs)
    assert_close_to_eager(compiled(x, scale=3.0, other=1), pops_kwargs(x, scale=3.0, other=1))
    assert (stats.graphs, stats.graph_breaks, stats.eager_frames) == (1, 0, 0)


def inspects_code(x, fn):
    names = fn.__code__.co_varnames[: fn.__code__.co_argcount]
    if "bias" in names:
        return x + 1
    return x * 2


def with_bias(x, bias=None):
    return x


def test_reading_a_functions_code_object(stats):
    x = torch.randn(3)
    assert_close_to_eager(framejit.compile(inspects_code)(x, with_bias), inspects_code(x, with_bias))
    assert (stats.graphs, stats.graph_breaks) == (1, 0)


def is_exporting_query(x):
    if torch.compiler.is_exporting():
        return x - 1
    return x + 1


def test_is_exporting_is_false_while_capturing(stats):
    x = torch.randn(2)
    assert_close_to_eager(framejit.compile(is_exporting_query)(x), x + 1)
    assert stats.graph_breaks == 0


class Registry:
    """Like transformers' AttentionInterface: a mapping implemented in Python."""

    _global = {"relu": torch.relu, "tanh": torch.tanh}

    def __init__(self):
        self._local = {}

    def __getitem__(self, key):
        return self._local[key] if key in self._local else self._global[key]

    def __contains__(self, key):
        return key in self._local or key in self._global

    def __len__(self):
        return len(self._local) + len(self._global)


REGISTRY = Registry()


def dispatch(x, impl):
    if impl in REGISTRY and len(REGISTRY) > 1:
        return REGISTRY[impl](x)
    return x


def test_python_mapping_registry_lookup_is_captured(stats):
    x = torch.randn(4)
    assert_close_to_eager(framejit.compile(dispatch)(x, "tanh"), torch.tanh(x))
    assert (stats.graphs, stats.graph_breaks) == (1, 0)


def names_of_types(x):
    text = str(torch.Tensor) + repr(torch.float32) + str(type(x)) + str((1, "a"))
    return x * len(text)


def test_str_of_classes_and_constants_folds(stats):
    x = torch.ones(2)
    assert_close_to_eager(framejit.compile(names_of_types)(x), names_of_types(x))
    assert stats.graph_breaks == 0


class Chunked:
    def step(self, x):
        return x * 3

    def run(self, x):
        fn = self.step.__func__
        return fn(self.step.__self__, x) + len(self.step.__name__)


def uses_method_internals(x, obj):
    return obj.run(x)


def test_method_func_and_self(stats):
    x = torch.ones(2)
    assert_close_to_eager(framejit.compile(uses_method_internals)(x, Chunked()), x * 3 + 4)
    assert stats.graph_breaks == 0


def reads_environment(x):
    import os

    if os.environ.get("FRAMEJIT_TEST_FLAG", "0") == "1" and "FRAMEJIT_TEST_FLAG" in os.environ:
        return x * 2
    return x + 1


def test_environment_variables_are_read_and_guarded(stats, monkeypatch):
    x = torch.ones(2)
    compiled = framejit.compile(reads_environment)
    monkeypatch.delenv("FRAMEJIT_TEST_FLAG", raising=False)
    assert_close_to_eager(compiled(x), x + 1)
    monkeypatch.setenv("FRAMEJIT_TEST_FLAG", "1")
    assert_close_to_eager(compiled(x), x * 2)
    assert (stats.graph_breaks, stats.recompiles) == (0, 1)
    assert "os.environ['FRAMEJIT_TEST_FLAG']: None → '1'" in stats.recompile_reasons[0][1]


class ValidatingConfig(AliasingConfig):
    """Like transformers' configs under huggingface_hub's strict dataclasses: ``__setattr__`` in
    Python checks the value against an annotation (``typing.get_args`` of ``int | None``), maps
    the name, counts the write, and ends in ``super().__setattr__``."""

    checked: dict = {"hidden_size": int | None, "is_causal": bool | None}

    def __init__(self, hidden_size, use_bias):
        object.__setattr__(self, "writes", 0)
        super().__init__(hidden_size, use_bias)

    def __setattr__(self, key, value):
        if key in type(self).attribute_map:
            key = type(self).attribute_map[key]
        expected = type(self).checked.get(key)
        if expected is not None and not isinstance(value, typing.get_args(expected)):
            raise TypeError(f"{key} must be one of {len(typing.get_args(expected))} types")
        object.__setattr__(self, "writes", self.writes + 1)
        super().__setattr__(key, value)


def overrides_config_for_the_call(x, cfg):
    # transformers' merge_with_config_defaults: set a config value for the call, restore it after.
    original = cfg.hidden
    cfg.hidden = 2  # written as hidden_size
    cfg.is_causal = True
    try:
        y = x[..., : cfg.hidden] * (2 if cfg.is_causal else 3)
    finally:
        cfg.hidden = original
    return y + cfg.hidden


def test_config_attribute_writes_through_its_own_setattr_are_one_graph(stats):
    x = torch.randn(2, 5)
    cfg, reference = ValidatingConfig(3, True), ValidatingConfig(3, True)
    compiled = framejit.compile(overrides_config_for_the_call)
    for _ in range(2):
        assert_close_to_eager(compiled(x, cfg), overrides_config_for_the_call(x, reference))
        assert vars(cfg) == vars(reference)
    # Each write ran the class's __setattr__ once (its count), not once more in the replay.
    assert cfg.writes == reference.writes == 2 + 3 * 2
    assert (stats.graphs, stats.graph_breaks, stats.eager_frames) == (1, 0, 0)
    assert stats.captured == 1


def writes_then_reads_an_alias(x, cfg):
    cfg.hidden_size = 2
    return x[..., : cfg.hidden]  # the class maps "hidden" to the name just written


def test_a_name_the_class_maps_reads_the_value_written_in_the_frame():
    # Reading ``cfg.hidden`` after ``cfg.hidden_size = 2`` took the real object's old value (3).
    x = torch.randn(2, 5)
    cfg, reference = AliasingConfig(3, True), AliasingConfig(3, True)
    got = framejit.compile(writes_then_reads_an_alias)(x, cfg)
    assert_close_to_eager(got, writes_then_reads_an_alias(x, reference))
    assert got.shape == (2, 2) and cfg.hidden_size == 2


def rejected_write(x, cfg):
    try:
        cfg.hidden = "wide"
    except TypeError:
        return x * 2, cfg.hidden
    return x, cfg.hidden


def test_a_write_its_setattr_rejects_raises_as_in_eager(stats):
    x = torch.randn(3)
    cfg, reference = ValidatingConfig(3, True), ValidatingConfig(3, True)
    assert_close_to_eager(framejit.compile(rejected_write)(x, cfg), rejected_write(x, reference))
    assert vars(cfg) == vars(reference)
    assert (stats.graphs, stats.graph_breaks) == (1, 0)


def union_members(x, annotation):
    kinds = typing.get_args(annotation)
    return x + len(kinds), typing.get_origin(list[int]) is list


def test_typing_unions_are_read_as_constants(stats):
    x = torch.randn(3)
    compiled = framejit.compile(union_members)
    assert_close_to_eager(compiled(x, int | None), union_members(x, int | None))
    assert (stats.graphs, stats.graph_breaks) == (1, 0)


@dataclasses.dataclass
class OutputLike(collections.OrderedDict):
    """Like transformers' ModelOutput: an OrderedDict dataclass whose __post_init__ and
    __setattr__ go through dataclasses.fields at every write."""

    hidden: torch.Tensor = None
    extra: torch.Tensor | None = None
    scale: float = 2.0

    def __post_init__(self):
        names = [f.name for f in dataclasses.fields(self)]
        for name in names:
            value = self.__dict__.get(name)
            if value is not None:
                self[name] = value

    def __setattr__(self, name, value):
        if name in {f.name for f in dataclasses.fields(self)} and value is not None:
            super().__setitem__(name, value)
        super().__setattr__(name, value)


@dataclasses.dataclass
class Plain:
    a: int = 1
    b: float = 0.5


class PlainChild(Plain):  # not decorated: its fields are its base's, read through the MRO
    pass


def makes_outputs(x, kind):
    out = OutputLike(hidden=x + 1)
    out.extra = x * out.scale
    defaults = [f.default for f in dataclasses.fields(OutputLike)]
    inherited = [f.name for f in dataclasses.fields(kind())]
    return out["hidden"] + out["extra"] * len(out) + defaults[-1] * len(inherited), dataclasses.asdict(kind())


def test_dataclass_fields_are_the_class_s_without_a_guard_on_each(stats, monkeypatch):
    # dataclasses.fields of a dataclass, or of its instance made in the frame, is the class's
    # fields as constants, not inlined: inlined, it guarded each field's name, default and kind
    # (a transformers output sets an attribute through fields() at each write). A subclass
    # without its own fields (read through the MRO), a dict subclass, asdict: as eager.
    from framejit.capture import interpreter

    inlined = []
    real = interpreter.Translator.inline_code
    monkeypatch.setattr(interpreter.Translator, "inline_code",
                        lambda self, code, *a, **k: inlined.append(code.co_name) or real(self, code, *a, **k))
    compiled, x = framejit.compile(makes_outputs, fullgraph=True), torch.randn(3)
    for kind in (Plain, PlainChild):
        got, want = compiled(x, kind), makes_outputs(x, kind)
        assert_close_to_eager(got[0], want[0])
        assert got[1] == want[1]
    assert stats.graph_breaks == 0 and stats.recompiles == 1  # (kind is another class)
    # PlainChild's fields are its base's: inlined, as Python reads them (by fields and asdict)
    assert inlined.count("fields") == 2, inlined
    # Plain's entry guards no field, where PlainChild's (inlined) guards each one's name and kind
    field_guards = [sum("__dataclass_fields__[" in str(getattr(g, "source", "")) for g in entry[3].guards.guards)
                    for entry in _C.get_cache_entries(makes_outputs.__code__)]
    assert len(field_guards) == 2 and min(field_guards) == 0 and max(field_guards) >= 4, field_guards


ATOMIC_TYPES = frozenset({int, float, torch.Tensor})


def classifies(x, n):
    made = Plain()
    y = x + 1 if type(x) in ATOMIC_TYPES else x - 1
    y = y * 2 if type(made) in ATOMIC_TYPES else y * 3
    return y + 5 if type(n) in ATOMIC_TYPES else y - 5


def test_a_class_is_looked_up_in_a_frozenset_of_classes(stats):
    # (Python 3.12's dataclasses.asdict asks type(obj) in _ATOMIC_TYPES.) Membership in an
    # immutable set is fixed by the item; the set, a global, is guarded as globals are.
    global ATOMIC_TYPES
    compiled, x = framejit.compile(classifies, fullgraph=True), torch.randn(3)
    for n in (2, "two"):
        assert_close_to_eager(compiled(x, n), classifies(x, n))
    saved = ATOMIC_TYPES
    try:
        ATOMIC_TYPES = frozenset({str, Plain})
        assert_close_to_eager(compiled(x, "two"), classifies(x, "two"))
    finally:
        ATOMIC_TYPES = saved
    assert stats.graph_breaks == 0 and stats.recompiles == 2
