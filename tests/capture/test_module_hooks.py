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
    torch.testing.assert_close(out, model(x))  # the hook ran: the hooked call is a graph break
    assert "self[1] has forward hooks now" in caplog.text
    assert stats.graph_breaks >= 1
    assert "___" not in caplog.text  # internal names never reach the user
    handle.remove()
    captured = stats.captured
    torch.testing.assert_close(compiled(x), model(x))
    assert stats.captured == captured  # the first version is valid again: no new capture


def test_call_of_module_with_hooks_is_a_graph_break(stats):
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    calls = []
    model[0].register_forward_pre_hook(lambda mod, inputs: calls.append(1))
    x = torch.randn(2, 4)
    out = framejit.compile(model)(x)
    torch.testing.assert_close(out, model(x))
    assert calls == [1, 1]  # once compiled, once eager
    assert any("has hooks registered" in message for _, message in stats.break_reasons)


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
    assert "global module hook" in stats.recompile_reasons[0][1]


def test_effectful_torch_helpers_are_not_folded(stats):
    def f(x):
        torch.cuda.set_sync_debug_mode(0)  # a Python function with effects, no tensor argument
        return x + 1

    with pytest.raises(framejit.GraphBreakError, match="set_sync_debug_mode"):
        framejit.compile(f, fullgraph=True)(torch.randn(3))
