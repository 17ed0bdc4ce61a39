"""Side effects on the world outside the frame: recorded during capture, replayed after the
graph, with the same end state as eager and no recompiles for counters."""

import copy

import pytest
import torch
from torch import nn

import framejit
from framejit.testing import assert_close_to_eager


class Tracker(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)
        self.step = 0
        self.scale = 1.5
        self.cache = None
        self.history = []
        self.stats = {}

    def forward(self, x):
        self.step += 1
        y = self.fc(x)
        self.cache = y.detach()
        self.history.append(self.step)
        self.stats["last"] = y.mean()
        self.scale = self.scale * 0.5  # not used in the graph: not specialised
        return y + self.cache  # reads back what was written


def test_module_state_after_three_calls_equals_eager(stats):
    model = Tracker()
    reference = copy.deepcopy(model)
    compiled = framejit.compile(model)
    x = torch.randn(2, 3)
    for _ in range(3):
        assert_close_to_eager(compiled(x), reference(x))
    assert model.step == reference.step == 3
    assert model.scale == reference.scale == 1.5 * 0.5 ** 3
    assert model.history == reference.history == [1, 2, 3]
    torch.testing.assert_close(model.cache, reference.cache)
    torch.testing.assert_close(model.stats["last"], reference.stats["last"])
    # The counters are computed when the function runs, so they never recompile; the dict's keys
    # are read to write one, so its first write recompiles once.
    assert stats.graph_breaks == 0 and stats.eager_frames == 0
    assert stats.captured == 2 and "keys of self.stats" in stats.recompile_reasons[0][1]


def test_value_used_in_the_graph_is_specialised_and_recompiles_with_reason(stats):
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = 1.0

        def forward(self, x):
            self.scale = self.scale * 2
            return x * self.scale

    model = Scaled()
    compiled = framejit.compile(model)
    x = torch.ones(2)
    assert [compiled(x)[0].item() for _ in range(3)] == [2.0, 4.0, 8.0]
    assert stats.recompiles == 2 and "self.scale: 1.0 → 2.0" in stats.recompile_reasons[0][1]


class Box:
    def __init__(self):
        self.value = 0


TOTAL = 0


def writes_globals_and_objects(x, box, log):
    global TOTAL
    TOTAL = TOTAL + 2
    box.value = box.value + 1
    log.append(x.sum())
    log.extend([x.max(), x.min()])
    return x * 2


def test_globals_objects_and_lists_from_outside(stats):
    global TOTAL
    TOTAL = 0
    box, log = Box(), []
    compiled = framejit.compile(writes_globals_and_objects)
    x = torch.randn(4)
    for _ in range(3):
        compiled(x, box, log)
    assert TOTAL == 6 and box.value == 3 and len(log) == 9
    torch.testing.assert_close(log[-2], x.max())
    assert (stats.captured, stats.recompiles, stats.graph_breaks) == (1, 0, 0)


def make_counter():
    count = 0

    def bump(x):
        nonlocal count
        count = count + 1
        return x * count

    return bump, lambda: count


def test_nonlocal_write(stats):
    bump, read = make_counter()
    compiled = framejit.compile(bump)
    x = torch.ones(2)
    outs = [compiled(x) for _ in range(3)]
    assert read() == 3
    # x * count uses the value in the graph: that specialises, so each new count recompiles.
    assert [o[0].item() for o in outs] == [1.0, 2.0, 3.0]


def reads_back_list(x, items):
    items.append(x)
    return torch.stack(items).sum(0), len(items)


def test_mutated_list_that_is_read_is_replaced_whole(stats):
    items = [torch.ones(2)]
    compiled = framejit.compile(reads_back_list)
    out, n = compiled(torch.full((2,), 2.0), items)
    assert n == 2 and len(items) == 2
    torch.testing.assert_close(out, torch.full((2,), 3.0))
    assert stats.graph_breaks == 0


def side_effect_then_break(x, box):
    box.value = box.value + 10
    print(end="")  # a graph break after the write: the first part replays it
    return x + box.value


def test_side_effect_before_a_graph_break(stats):
    box = Box()
    compiled = framejit.compile(side_effect_then_break)
    x = torch.zeros(2)
    assert_close_to_eager(compiled(x, box), torch.full((2,), 10.0))
    assert box.value == 10 and stats.graph_breaks == 1


class _Box:
    def __init__(self):
        self.v = 1


def _write_one_read_other(x, a, b):
    a.v = a.v + 10
    return x + b.v


def test_one_object_passed_twice_sees_its_own_write(stats):
    """Captured with two objects, then called with one object for both: the write through `a`
    must be seen through `b`, as in eager (the distinct-objects guard fails: a recompile)."""
    compiled = framejit.compile(_write_one_read_other)
    x = torch.zeros(1)
    assert_close_to_eager(compiled(x, _Box(), _Box()), x + 1)
    same = _Box()
    assert_close_to_eager(compiled(x, same, same), x + 11)
    assert same.v == 11
    assert stats.recompiles == 1 and stats.recompile_reasons[0][1] == "a and b: now the same object"
    other = _Box()
    assert_close_to_eager(compiled(x, other, other), x + 11)  # the shared-object version is cached
    assert stats.recompiles == 1


# -- long and self-referencing counters ------------------------------------------------------------

SHARED = {"n": 1}


def test_a_counter_added_to_itself_in_a_loop_compiles_at_once(stats):
    """``n += n`` 40 times: each step's expression names the last one twice. Written out, the
    entry function's would hold 2^40 operands (a fuzzed program's capture never ended); long
    ones are computed into locals. No specialisation: a new value runs the same graph."""
    def f(x):
        for _ in range(40):
            SHARED["n"] += SHARED["n"]
        return x + 1

    compiled = framejit.compile(f)
    for start in (1, 3, -5):
        SHARED["n"] = start
        assert_close_to_eager(compiled(torch.ones(2)), torch.ones(2) + 1)
        assert SHARED["n"] == start * 2 ** 40
    assert (stats.captured, stats.recompiles, stats.eager_frames) == (1, 0, 0), stats


def test_a_counter_bumped_thousands_of_times_in_one_call(stats):
    """``box.value += 1`` 3000 times, then read in a condition and in a return: no expression
    nests past Python's parser (200 parentheses) and nothing recurses per step."""
    def bump(x, box, k):
        for _ in range(k):
            box.value += 1
        return x + 1, box.value

    def bump_and_test(x, box):
        for _ in range(3000):
            box.value += 1
        return x * 2 if box.value > 0 else x

    compiled = framejit.compile(bump)
    for start in (0, 7):
        box = Box()
        box.value = start
        out, value = compiled(torch.ones(2), box, 3000)
        assert value == box.value == start + 3000
    assert (stats.captured, stats.recompiles, stats.eager_frames) == (1, 0, 0), stats
    box = Box()
    assert_close_to_eager(framejit.compile(bump_and_test)(torch.ones(2), box), torch.ones(2) * 2)
    assert box.value == 3000 and stats.eager_frames == 0, stats


def test_tuples_built_from_themselves_in_a_loop(stats):
    """``t = (t, t)`` 30 times holds one tuple 2^30 ways, ``t = (t, 1)`` 1000 times nests past
    the parser: returned, stored in a global and read back by another compiled function, each
    compiles at once and holds one object per tuple, as eager's."""
    def doubled(x):
        t = (x * 2,)
        for _ in range(30):
            t = (t, t)
        SHARED["t"] = (1,)
        for _ in range(30):
            SHARED["t"] = (SHARED["t"], SHARED["t"])
        return t

    def nested(x):
        t = (x * 2,)
        for _ in range(1000):
            t = (t, 1)
        return t

    def reads(x):
        return x + len(SHARED["t"])  # a constant tuple from outside, guarded

    out = framejit.compile(doubled)(torch.ones(2))
    assert out[0] is out[1] and out[0][1] is out[1][0]
    inner = out
    for _ in range(30):
        inner = inner[0]
    assert_close_to_eager(inner[0], torch.ones(2) * 2)
    assert SHARED["t"][0] is SHARED["t"][1]
    out = framejit.compile(nested)(torch.ones(2))
    depth = 0
    while len(out) == 2:
        out, depth = out[0], depth + 1
    assert depth == 1000
    assert_close_to_eager(out[0], torch.ones(2) * 2)
    assert_close_to_eager(framejit.compile(reads)(torch.ones(2)), torch.ones(2) + 2)
    assert stats.eager_frames == 0 and stats.captured == 3, stats


def test_lists_and_dicts_nested_a_thousand_deep_are_rebuilt(stats):
    """``seq = [seq, i]`` and ``d = {"in": d}`` 1000 times, returned: each compiles at once (a
    rebuild that recursed per level overflowed and fell back), and every level is a fresh
    object holding the same one below, as eager's."""
    def nested(x):
        seq, d = [x * 2], {"x": x + 1}
        for i in range(1000):
            seq = [seq, i]
            d = {"in": d, "same": seq}
        return seq, d

    seq, d = framejit.compile(nested)(torch.ones(2))
    assert stats.eager_frames == 0 and stats.graphs == 1, stats
    for i in reversed(range(1000)):
        assert d["same"] is seq and seq[1] == i
        seq, d = seq[0], d["in"]
    assert_close_to_eager(seq[0], torch.ones(2) * 2)
    assert_close_to_eager(d["x"], torch.ones(2) + 1)


@pytest.mark.parametrize("backend", ["eager", "default"])
def test_a_written_number_that_raises_leaves_eager_s_side_effects(backend):
    # The entry function computed every written value before replaying the writes: a division
    # by a number now 0 raised with nothing written, so the counters never moved and every
    # later call raised too (eager: one ZeroDivisionError, then it goes on).
    def run(wrap):
        class Counters:
            pass

        o, log, buf = Counters(), [], torch.zeros(1)
        o.k, o.v = 2, 1e307

        def f(x):
            buf.add_(1)
            log.append("a")
            o.k -= 1
            o.v *= 10.0
            o.r = 10 // o.k  # raises at the second call
            log.append("b")
            return x * 2

        g = wrap(f)
        seen = []
        for _ in range(4):
            try:
                seen.append(g(torch.ones(1)).tolist())
            except ZeroDivisionError:
                seen.append("ZeroDivisionError")
            seen.append((o.k, o.v, getattr(o, "r", None), list(log), buf.item()))
        return seen

    assert run(lambda f: framejit.compile(f, backend=backend)) == run(lambda f: f)
