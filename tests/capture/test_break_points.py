"""The break points users hit (logging, numpy, manual_seed) and random ops: results and random
streams equal to eager under the same seed."""

import logging

import numpy as np
import torch
from torch import nn

import framejit
from framejit.testing import assert_close_to_eager

log = logging.getLogger("test_break_points")


def with_logging(x):
    y = x * 2
    log.warning("y has %d elements", y.numel())
    return y + 1


def test_logging_call_runs_once_and_splits(stats, caplog):
    x = torch.randn(3)
    with caplog.at_level(logging.WARNING, logger="test_break_points"):
        out = framejit.compile(with_logging)(x)
    assert_close_to_eager(out, x * 2 + 1)
    assert [r.getMessage() for r in caplog.records if r.name == "test_break_points"] == ["y has 3 elements"]
    assert stats.eager_frames == 0


def with_numpy(x):
    y = torch.relu(x)
    m = np.mean(y.numpy())
    return y * float(m)


def test_numpy_call_is_a_break(stats):
    x = torch.randn(4)
    assert_close_to_eager(framejit.compile(with_numpy)(x), with_numpy(x))
    assert stats.graph_breaks >= 1 and stats.eager_frames == 0


def random_ops(x):
    y = nn.functional.dropout(x, p=0.5, training=True)
    noise = torch.randn_like(x)
    return y + noise, torch.rand(2)


def test_random_ops_match_eager_under_the_same_seed(stats):
    # The eager backend draws from torch's generator in eager's order. Generated kernels draw
    # dropout masks from their own counter-based generator (as Inductor's do): see below.
    x = torch.ones(16)
    compiled = framejit.compile(random_ops, backend="eager")
    for seed in (0, 1):
        torch.manual_seed(seed)
        actual = compiled(x)
        torch.manual_seed(seed)
        expected = random_ops(x)
        assert_close_to_eager(actual, expected)
    assert (stats.graphs, stats.graph_breaks) == (1, 0)


def test_dropout_through_kernels_is_reproducible_under_the_same_seed(stats):
    x = torch.ones(4096)
    compiled = framejit.compile(lambda x: nn.functional.dropout(x, p=0.5, training=True) + 1,
                                backend="c")  # also under FRAMEJIT_TEST_BACKEND=fx
    runs = []
    for seed in (0, 0, 1):
        torch.manual_seed(seed)
        runs.append(compiled(x))
    torch.testing.assert_close(runs[0], runs[1], rtol=0, atol=0)
    assert not torch.equal(runs[0], runs[2])
    assert ((runs[0] == 1) | (runs[0] == 3)).all()  # dropped, or kept and scaled by 1/(1-p)
    assert 0.45 < (runs[0] == 3).float().mean().item() < 0.55
    assert (stats.graphs, stats.graph_breaks) == (1, 0) and framejit.stats()["kernels"] == 1


def seeds_inside(x):
    torch.manual_seed(1234)
    return x + torch.randn(3)


def test_manual_seed_inside_the_function(stats):
    x = torch.zeros(3)
    a = framejit.compile(seeds_inside)(x)
    torch.manual_seed(0)  # the function reseeds: its result does not depend on the outer state
    b = framejit.compile(seeds_inside)(x)
    assert_close_to_eager(a, seeds_inside(x))
    assert_close_to_eager(b, a)
    assert stats.graph_breaks >= 1
