"""A whole training step compiled: forward, loss, backward, optimizer step, zero_grad.

The only graph break is at ``loss.backward()``. The optimizer's ``step()`` and ``zero_grad()``
(torch's own Python) are inlined into the resume function's graph: parameters are read with their
``.grad``, updated in place, and the per-parameter state (``opt.state[p]``, a dict keyed by the
parameters) is read and created like any other outside object. Parameters, gradients and
optimizer state after three steps must equal eager's."""

import collections
import copy
import os
import sys
import typing

import pytest
import torch
from torch import nn

import framejit
from framejit.testing import assert_close_to_eager

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
from models import GPTConfig, TinyGPT  # noqa: E402


def make_step(model, opt, set_to_none=True):
    def step(idx, targets):
        logits = model(idx)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=set_to_none)
        return loss.detach()

    return step


def make_step_mse(model, opt):
    def step(x, y):
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach()

    return step


def only_break_is_backward(stats):
    assert stats.graph_breaks == 1, stats.break_reasons
    assert "backward" in stats.break_reasons[0][1]
    assert stats.eager_frames == 0, stats.fallback_reasons


def train_gpt_three_steps(set_to_none=True):
    """A TinyGPT trained three SGD steps compiled and three eagerly: (model, reference)."""
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=64, block_size=16, n_layer=1, n_head=2, n_embd=32)
    model = TinyGPT(cfg)
    reference = copy.deepcopy(model)
    compiled_step = framejit.compile(make_step(model, torch.optim.SGD(model.parameters(), lr=0.1), set_to_none))
    eager_step = make_step(reference, torch.optim.SGD(reference.parameters(), lr=0.1), set_to_none)
    for _ in range(3):
        idx = torch.randint(0, cfg.vocab_size, (2, 8))
        targets = torch.randint(0, cfg.vocab_size, (2, 8))
        assert_close_to_eager(compiled_step(idx, targets), eager_step(idx, targets))
    for (name, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
        torch.testing.assert_close(p, q, msg=f"parameter {name} differs after 3 steps")
    return model, reference


def test_training_step_breaks_only_at_backward_and_matches_eager_after_three_steps(stats):
    model, reference = train_gpt_three_steps()
    for p, q in zip(model.parameters(), reference.parameters()):
        assert p.grad is None and q.grad is None  # zero_grad(set_to_none=True) ran
    # One graph before backward(), one for the step and zero_grad after it; no recompile.
    assert stats.graphs == 2
    only_break_is_backward(stats)
    assert stats.recompiles == 0, stats.recompile_reasons


def test_zero_grad_keeping_the_gradients_zeroes_them_in_place(stats):
    model, reference = train_gpt_three_steps(set_to_none=False)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
        assert not p.grad.requires_grad and float(p.grad.abs().sum()) == 0.0
    only_break_is_backward(stats)


OPTIMIZERS = {
    "sgd-momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    "sgd-nesterov-decay": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-2),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-2),
    "adamw-amsgrad": lambda p: torch.optim.AdamW(p, lr=1e-2, amsgrad=True),
    "rmsprop": lambda p: torch.optim.RMSprop(p, lr=1e-2, momentum=0.5),
    "adagrad": lambda p: torch.optim.Adagrad(p, lr=1e-2),
    "sgd-foreach": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, foreach=True),
    "adam-foreach": lambda p: torch.optim.Adam(p, lr=1e-2, foreach=True),
    "adamw-foreach-amsgrad": lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=True, amsgrad=True),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizers_with_state_match_eager(name, stats):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 1))
    reference = copy.deepcopy(model)
    opt, ref_opt = OPTIMIZERS[name](model.parameters()), OPTIMIZERS[name](reference.parameters())
    compiled_step = framejit.compile(make_step_mse(model, opt))
    eager_step = make_step_mse(reference, ref_opt)
    for _ in range(3):
        x, y = torch.randn(4, 8), torch.randn(4, 1)
        assert_close_to_eager(compiled_step(x, y), eager_step(x, y))
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q)
        # The state the compiled steps created and updated is eager's.
        mine, theirs = opt.state[p], ref_opt.state[q]
        assert mine.keys() == theirs.keys()
        for key in theirs:
            torch.testing.assert_close(mine[key], theirs[key], msg=f"state[{key!r}]")
    only_break_is_backward(stats)
    # Optimizers that keep state create it on the first step: the second call sees it and
    # recompiles once, saying so. Adagrad creates its state in __init__.
    expected = 0 if name == "adagrad" else 1
    assert stats.recompiles == expected, stats.recompile_reasons
    if expected:
        assert "in opt.state: False → True" in stats.recompile_reasons[0][1]


def test_lr_scheduler_wrapping_step_is_inlined(stats):
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    reference = copy.deepcopy(model)

    def make(m):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10)  # wraps opt.step (weakref, __get__)
        return make_step_mse(m, opt), sched, opt

    (compiled_step, _, opt), (eager_step, _, _) = make(model), make(reference)
    compiled_step = framejit.compile(compiled_step)
    for _ in range(3):
        x, y = torch.randn(3, 4), torch.randn(3, 2)
        assert_close_to_eager(compiled_step(x, y), eager_step(x, y))
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q)
    assert opt._opt_called is True  # the wrapper's write on the optimizer was replayed
    only_break_is_backward(stats)
    assert stats.recompiles == 0


def test_gradient_clipping_between_backward_and_step(stats):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    reference = copy.deepcopy(model)

    def make(m):
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)

        def step(x, y):
            loss = ((m(x) - y) ** 2).mean()
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5)
            opt.step()
            opt.zero_grad()
            return loss.detach(), norm

        return step

    compiled_step, eager_step = framejit.compile(make(model)), make(reference)
    for _ in range(3):
        x, y = torch.randn(4, 8), torch.randn(4, 1) * 10
        assert_close_to_eager(compiled_step(x, y), eager_step(x, y))
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q)
    only_break_is_backward(stats)


def test_optimizers_patched_by_torch_compile_are_still_inlined(stats):
    # The first torch.compile in a process wraps every optimizer's _init_group in
    # torch._dynamo.disable; framejit inlines the function under the wrapper.
    torch.compile(lambda x: x + 1, backend="eager")(torch.ones(2))
    assert torch.optim.Adam._init_group.__code__.co_filename.endswith("eval_frame.py")
    framejit.reset()
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    reference = copy.deepcopy(model)
    compiled_step = framejit.compile(make_step_mse(model, torch.optim.Adam(model.parameters(), lr=1e-2)))
    eager_step = make_step_mse(reference, torch.optim.Adam(reference.parameters(), lr=1e-2))
    for _ in range(3):
        x, y = torch.randn(3, 4), torch.randn(3, 2)
        assert_close_to_eager(compiled_step(x, y), eager_step(x, y))
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q)
    only_break_is_backward(stats)


def test_a_tensor_learning_rate_changed_by_a_scheduler_does_not_recompile(stats):
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    reference = copy.deepcopy(model)

    def make(m):
        opt = torch.optim.SGD(m.parameters(), lr=torch.tensor(0.1))
        return make_step_mse(m, opt), torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)

    (compiled_step, sched), (eager_step, ref_sched) = make(model), make(reference)
    compiled_step = framejit.compile(compiled_step)
    for _ in range(4):
        x, y = torch.randn(3, 4), torch.randn(3, 2)
        assert_close_to_eager(compiled_step(x, y), eager_step(x, y))
        sched.step()
        ref_sched.step()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q)
    only_break_is_backward(stats)
    assert stats.recompiles == 0, stats.recompile_reasons


def test_a_float_learning_rate_changed_by_a_scheduler_recompiles_and_says_so(stats):
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    compiled_step = framejit.compile(make_step_mse(model, opt))
    for _ in range(2):
        compiled_step(torch.randn(3, 4), torch.randn(3, 2))
        sched.step()
    assert stats.recompiles == 1
    assert "['lr']: 0.1 → 0.05" in stats.recompile_reasons[0][1]


# -- the pieces, in user code ---------------------------------------------------------------------

def test_reading_grad_of_an_input_is_guarded(stats):
    w = torch.randn(3, requires_grad=True)
    w.grad = torch.ones(3)

    @framejit.compile
    def f(w, x):
        if w.grad is None:
            return x - 1
        return x + w.grad * 2

    x = torch.randn(3)
    assert_close_to_eager(f(w, x), x + 2)
    w.grad = torch.full((3,), 3.0)
    assert_close_to_eager(f(w, x), x + 6)  # same guards: the new gradient is a graph input
    assert stats.recompiles == 0
    w.grad = None
    assert_close_to_eager(f(w, x), x - 1)
    assert stats.recompiles == 1
    assert "w.grad" in stats.recompile_reasons[0][1]
    assert stats.graph_breaks == 0


def test_setting_grad_to_none_is_replayed_and_seen_by_later_reads(stats):
    w = torch.randn(3, requires_grad=True)

    @framejit.compile
    def f(w, x):
        y = x * w.grad
        w.grad = None
        return y, w.grad is None

    w.grad = torch.full((3,), 2.0)
    y, cleared = f(w, torch.ones(3))
    assert_close_to_eager(y, torch.full((3,), 2.0))
    assert cleared is True and w.grad is None
    assert stats.graph_breaks == 0


def test_reading_grad_of_a_computed_tensor_breaks(stats):
    @framejit.compile
    def f(x):
        y = x * 2
        return y.grad

    assert f(torch.ones(2, requires_grad=True)) is None
    assert stats.graph_breaks == 1
    assert "computed in the compiled function" in stats.break_reasons[0][1]


def test_dict_keyed_by_a_tensor_from_outside(stats):
    state = collections.defaultdict(dict)
    w = torch.randn(2)

    @framejit.compile
    def f(w, x):
        s = state[w]
        if "total" not in s:
            s["total"] = torch.zeros(())
        s["total"] += x.sum()
        return s["total"] * 1

    outs = [float(f(w, torch.ones(2))) for _ in range(3)]
    assert outs == [2.0, 4.0, 6.0]
    assert list(state) == [w] and float(state[w]["total"]) == 6.0
    assert stats.graph_breaks == 0
    # First call: no item for w, so the defaultdict made one (replayed); second: it is there.
    assert stats.recompiles == 1 and "w in state: False → True" in stats.recompile_reasons[0][1]
    other = torch.randn(2)
    assert float(f(other, torch.ones(2))) == 2.0 and other in state  # another key: a new item
    assert stats.recompiles == 1  # the first version's guards fit again


def test_missing_tensor_key_without_a_default_runs_the_frame_as_python(stats):
    class Holder:
        def __init__(self):
            self.table = collections.defaultdict(None)  # no default: a missing key raises

    holder = Holder()

    @framejit.compile
    def f(w):
        try:
            return holder.table[w]
        except KeyError:
            return w + 1

    w = torch.ones(2)
    assert_close_to_eager(f(w), w + 1)
    assert stats.eager_frames == 1
    assert "holder.table[w] raises KeyError" in stats.fallback_reasons[0][1]


def test_tensor_key_of_a_plain_dict_says_what_is_supported(stats):
    table = {}

    @framejit.compile
    def f(w):
        return table.get(w, w + 1) * 2

    w = torch.ones(2)
    assert_close_to_eager(f(w), (w + 1) * 2)
    assert stats.graph_breaks + stats.eager_frames == 1
    reasons = stats.break_reasons + stats.fallback_reasons
    assert "using a tensor as a key of a plain dict" in reasons[0][1]


def test_scaling_by_a_0d_tensor_matches_eager(stats):
    def f(p, a, b, step):
        p = p.clone()
        p.addcdiv_(a, b, value=-step)
        p.sub_(a, alpha=step)
        return p.addcmul(a, b, value=step).add(b, alpha=step)

    args = (torch.randn(5), torch.randn(5), torch.rand(5) + 1, torch.tensor(0.25))
    assert_close_to_eager(framejit.compile(f)(*args), f(*args))
    assert stats.graph_breaks == 0


def test_type_annotations_and_typing_cast(stats):
    @framejit.compile
    def f(x):
        xs = typing.cast(list[torch.Tensor], [x, x * 2])
        kinds = dict[str, int]
        return xs[0] + xs[1], kinds

    y, kinds = f(torch.ones(2))
    assert_close_to_eager(y, torch.full((2,), 3.0))
    assert kinds == dict[str, int]
    assert stats.graph_breaks == 0


def test_dynamo_graph_break_in_user_code_still_breaks(stats):
    @framejit.compile
    def f(x):
        x = x + 1
        torch._dynamo.graph_break()
        return x * 2

    assert_close_to_eager(f(torch.ones(2)), torch.full((2,), 4.0))
    assert stats.graph_breaks == 1
    assert "torch._dynamo.graph_break()" in stats.break_reasons[0][1]
