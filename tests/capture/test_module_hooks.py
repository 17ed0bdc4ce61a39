"""Hooks of modules whose forward is inlined, and torch functions that must not be folded."""

import logging

import pytest
import torch
from torch import nn

import framejit


def test_hook_registered_after_compile_recompiles_and_runs(stats, caplog):
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    compiled = framejit.compile(model)
    x = torch.randn(2, 4)
    compiled(x)
    handle = model[1].register_forward_hook(lambda mod, inputs, out: out * 100)
    with caplog.at_level(logging.INFO, logger="framejit.recompiles"):
        out = compiled(x)
    torch.testing.assert_close(out, model(x))
    assert stats.recompiles == 1
    assert "self[1] has forward hooks now" in caplog.text
    handle.remove()
    torch.testing.assert_close(compiled(x), model(x))
    assert stats.captured == 2, stats.recompile_reasons  # the first version is valid again


def test_module_with_hooks_runs_as_plain_python_with_reason(stats):
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    calls = []
    model[0].register_forward_pre_hook(lambda mod, inputs: calls.append(1))
    out = framejit.compile(model)(torch.randn(2, 4))
    assert out.shape == (2, 4)
    assert calls == [1]
    assert stats.eager_frames >= 1
    assert any("has hooks registered" in message for _, message in stats.fallback_reasons)


def test_global_module_hook_invalidates_cached_graph(stats):
    model = nn.Sequential(nn.Linear(4, 4))
    compiled = framejit.compile(model)
    x = torch.randn(2, 4)
    compiled(x)
    handle = nn.modules.module.register_module_forward_hook(lambda mod, inputs, out: out + 1)
    try:
        out = compiled(x)
        torch.testing.assert_close(out, model(x))
    finally:
        handle.remove()
    assert stats.recompiles == 1
    assert "global module hook" in stats.recompile_reasons[0][1]


def test_effectful_torch_helpers_are_not_folded(stats):
    def f(x):
        torch.cuda.set_sync_debug_mode(0)  # a Python function with effects, no tensor argument
        return x + 1

    with pytest.raises(framejit.GraphBreakError, match="set_sync_debug_mode"):
        framejit.compile(f, fullgraph=True)(torch.randn(3))
