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
