"""A whole training step compiled: forward, loss, backward, optimizer step, zero_grad. The
backward (and the optimizer's Python) are graph breaks; parameters after three steps must equal
eager's."""

import copy
import os
import sys

import torch
from torch import nn

import framejit
from framejit.testing import assert_close_to_eager

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
from models import GPTConfig, TinyGPT  # noqa: E402


def make_step(model, opt):
    def step(idx, targets):
        logits = model(idx)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach()

    return step


def test_training_step_matches_eager_after_three_steps(stats):
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=64, block_size=16, n_layer=1, n_head=2, n_embd=32)
    model = TinyGPT(cfg)
    reference = copy.deepcopy(model)
    compiled_step = framejit.compile(make_step(model, torch.optim.SGD(model.parameters(), lr=0.1)))
    eager_step = make_step(reference, torch.optim.SGD(reference.parameters(), lr=0.1))
    for _ in range(3):
        idx = torch.randint(0, cfg.vocab_size, (2, 8))
        targets = torch.randint(0, cfg.vocab_size, (2, 8))
        assert_close_to_eager(compiled_step(idx, targets), eager_step(idx, targets))
    for (name, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
        torch.testing.assert_close(p, q, msg=f"parameter {name} differs after 3 steps")
        assert p.grad is None and q.grad is None  # zero_grad(set_to_none=True) ran
    assert stats.graphs >= 1 and stats.graph_breaks >= 1
    assert any("backward" in message for _, message in stats.break_reasons)


def test_adam_step_matches_eager(stats):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 1))
    reference = copy.deepcopy(model)
    compiled_step = framejit.compile(make_step_mse(model, torch.optim.Adam(model.parameters(), lr=1e-2)))
    eager_step = make_step_mse(reference, torch.optim.Adam(reference.parameters(), lr=1e-2))
    for _ in range(3):
        x, y = torch.randn(4, 8), torch.randn(4, 1)
        assert_close_to_eager(compiled_step(x, y), eager_step(x, y))
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q)


def make_step_mse(model, opt):
    def step(x, y):
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach()

    return step
