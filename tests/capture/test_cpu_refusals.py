"""Operations whose meta kernel takes what PyTorch's CPU kernel refuses, whatever the tensors
hold: a dtype without a CPU kernel, or a Python number the dtype cannot hold. Captured into a
graph they raised only when the graph ran, after the frame's side effects had been put off to
after it; a graph that had also written tensors in place (BatchNorm's running statistics) could
not be run again as plain Python, so the side effects before the error were lost (fuzzer
program 261000000036). They are graph breaks now: the operation raises as plain Python."""

import pytest
import torch

import framejit
from framejit.errors import GraphBreakError

BN = torch.nn.BatchNorm1d(1)
LOG = []


def _refused(kind):
    return {
        "int8 clamp": lambda q, h, i: q.clamp(-100, 200),
        "int8 fill": lambda q, h, i: q.clone().fill_(300),
        "int8 where": lambda q, h, i: torch.where(q > 0, q, 300),
        "int8 full": lambda q, h, i: torch.full((2,), 300, dtype=torch.int8),
        "int8 random": lambda q, h, i: q.clone().random_(0, 300),
        "half clamp": lambda q, h, i: h.clamp(max=1e6),
        "half masked_fill": lambda q, h, i: h.masked_fill(h > 0, 1e6),
        "int softmax": lambda q, h, i: i.softmax(0),
        "int std": lambda q, h, i: i.std(),
        "bool abs": lambda q, h, i: (i > 0).abs(),
        "int gelu": lambda q, h, i: torch.nn.functional.gelu(i),
    }[kind]


REFUSED = ["int8 clamp", "int8 fill", "int8 where", "int8 full", "int8 random", "half clamp",
           "half masked_fill", "int softmax", "int std", "bool abs", "int gelu"]


def _inputs():
    return (torch.tensor([1, -2, 3], dtype=torch.int8), torch.tensor([1.0, -2.0]).half(),
            torch.tensor([1, 2, 3], dtype=torch.int32))


@pytest.mark.parametrize("kind", REFUSED)
def test_side_effects_before_a_refused_operation_happen_as_in_eager(kind, stats):
    op = _refused(kind)

    def f(y, q, h, i, log):
        log.append("before")
        LOG.append("global")
        out = BN(y.reshape(-1, 1)).reshape(y.shape)  # writes the running statistics
        try:
            op(q, h, i)
        except RuntimeError as e:
            log.append(type(e).__name__)
        finally:
            LOG.append("finally")
        return out * 2

    compiled = framejit.compile(f)
    runs = {}
    for name, fn in (("eager", f), ("compiled", compiled)):
        torch.manual_seed(0)
        BN.reset_running_stats()
        LOG.clear()
        log, outs = [], []
        for k in range(1, 4):
            outs.append(fn(torch.arange(4.0) * k, *_inputs(), log))
        runs[name] = (log, list(LOG), outs, BN.running_mean.clone(), BN.running_var.clone(),
                      int(BN.num_batches_tracked))
    (elog, eglobal, eouts, emean, evar, en), (clog, cglobal, couts, cmean, cvar, cn) = \
        runs["eager"], runs["compiled"]
    assert clog == elog and elog[1::2] == [elog[1]] * 3 and elog[1].endswith("Error")
    assert cglobal == eglobal == ["global", "finally"] * 3
    for a, b in zip(couts, eouts):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(cmean, emean)
    torch.testing.assert_close(cvar, evar)
    assert cn == en == 3
    assert stats.graph_breaks + stats.eager_frames >= 1


@pytest.mark.parametrize("kind, words", [
    ("int8 clamp", ["tensor.clamp()", "the number 200", "int8 cannot hold"]),
    ("half clamp", ["tensor.clamp()", "the number 1000000.0", "float16 cannot hold"]),
    ("int8 random", ["tensor.random_()", "the number 300", "int8 cannot hold"]),
    ("int softmax", ["tensor.softmax()", "int32 tensors", "CPU kernel does not take"]),
])
def test_fullgraph_names_the_refused_operation(kind, words):
    op = _refused(kind)

    def f(q, h, i):
        return op(q, h, i)

    with pytest.raises(GraphBreakError) as info:
        framejit.compile(f, fullgraph=True)(*_inputs())
    message = str(info.value)
    for word in words:
        assert word in message, message
    assert "test_cpu_refusals.py" in message and "fix:" in message


def _taken(q, h, i, u):
    return (q.clamp(-100, 100), h.clone().fill_(1000.0), torch.where(q > 0, q, 100),
            u.view(-1, 256).sum(-1), i.float().softmax(0), h.float().softmax(0).half(),
            (i > 0).sum(), torch.full((2,), 120, dtype=torch.int8), q * 300, h + 1e6)


def test_operations_the_cpu_takes_stay_in_one_graph(stats):
    """No false refusals: numbers that fit, sizes beyond a small dtype's range, float32 ops."""
    args = (*_inputs(), torch.arange(512, dtype=torch.int32).to(torch.uint8))
    got = framejit.compile(_taken, fullgraph=True)(*args)
    for a, b in zip(got, _taken(*args)):
        torch.testing.assert_close(a, b)
    assert stats.graphs == 1 and stats.graph_breaks == 0


def test_trying_a_random_operation_leaves_the_random_stream_alone():
    def f(q):
        return q.clone().random_(0, 300)

    torch.manual_seed(3)
    with pytest.raises(GraphBreakError):
        framejit.compile(f, fullgraph=True)(_inputs()[0])
    after = torch.rand(4)
    torch.manual_seed(3)
    torch.testing.assert_close(after, torch.rand(4))
