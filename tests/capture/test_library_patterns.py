"""Patterns real libraries (transformers) use: config objects with their own __getattribute__,
super().__getattribute__, the frame's own **kwargs mutated, inspecting a function's code,
import statements, torch.compiler queries."""

import torch

import framejit
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
