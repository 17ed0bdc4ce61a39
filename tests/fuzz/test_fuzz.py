"""The differential fuzzer's fixed-seed sample, part of ``make test``.

Every program of the sample runs eagerly and compiled in worker subprocesses (see campaign.py);
the test asserts that none differs and none crashes. On failure the message lists the classes of
failure and a shrunk reproducer of the first; ``make fuzz`` runs longer campaigns.
"""

import pytest

from .campaign import reproduce, run_campaign, signature
from .pool import Worker

# Sized to take one to two minutes on a two-core machine. Programs with integer, fp16 and bf16
# values cost about 1.6 times the float32-only ones in capture (meta kernels of more ops), so
# the sample was 1250 + 320 of them where it had been 2000 + 500; the aliasing and module
# statements (aliasing.py) cost 1.3 times more again (1.6 through the Triton interpreter):
# 950 + 200. A two-core Zen 3 VM (2.25 GHz, no AVX-512) took 390 + 115 s for them, so each
# sample also has a budget: no program starts after it, and a slower machine runs the first
# programs of the same sequence (the summary line says how many).
SEED = 20261123
COUNT = 950
KERNEL_COUNT = 200
BUDGET = 150.0
KERNEL_BUDGET = 60.0


@pytest.mark.fuzz
def test_fixed_seed_sample():
    _check(run_campaign(SEED, COUNT, jobs=2, budget=BUDGET))


@pytest.mark.fuzz
def test_fixed_seed_sample_through_generated_kernels(monkeypatch):
    """The compiled side runs fusion groups as Triton kernels (the interpreter, on CPU)."""
    monkeypatch.setenv("FRAMEJIT_FUZZ_BACKEND", "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    _check(run_campaign(SEED + 1, KERNEL_COUNT, jobs=2, budget=KERNEL_BUDGET))


def _check(summary):
    print(summary.line())
    assert summary.ran > 0
    assert summary.statuses["invalid"] == 0, "the generator made programs that cannot run"
    assert summary.statuses["harness-error"] == 0, summary.failures[:1]
    if summary.failures:
        classes = {}
        for result in summary.failures:
            classes.setdefault(signature(result), []).append(result["seed"])
        listing = "\n".join(f"  {len(ids)} x {sig} (programs {ids[:3]})" for sig, ids in classes.items())
        worker = Worker()
        try:
            example = reproduce(summary.failures[0], worker, budget=150)
        finally:
            worker.close()
        pytest.fail(f"{summary.line()}\n{listing}\nShrunk reproducer of the first:\n{example}",
                    pytrace=False)


def test_generated_programs_are_valid_and_deterministic():
    """The generator's contract, checked without framejit: the same seed gives the same source,
    and the source compiles."""
    from .generator import generate

    for seed in range(50):
        source = generate(seed).source()
        assert source == generate(seed).source()
        compile(source, f"<program {seed}>", "exec")


def test_shrinker_keeps_the_failure_and_cuts_the_rest():
    """Shrinking against a fake test (``G0 += 1`` present) leaves little besides that line."""
    from .generator import generate
    from .shrink import shrink

    seed = next(s for s in range(500) if "    G0 += 1\n" in generate(s).source())
    program = generate(seed)
    small = shrink(program, lambda source: "    G0 += 1\n" in source)
    assert "G0 += 1" in small.source()
    assert small.size() < program.size()
    assert small.size() <= 4  # make_inputs, f, the line, and f's return


def test_a_crashing_program_is_counted_and_the_next_one_runs():
    """A program that kills its worker (here by SIGSEGV) becomes a ``crash`` result naming the
    signal; the next request gets a fresh worker."""
    worker = Worker(timeout=60)
    try:
        crash = worker.run({"id": "c", "source": "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n"})
        after = worker.run({"id": "n", "seed": 1})
    finally:
        worker.close()
    assert crash["status"] == "crash" and "signal 11" in crash["error"]
    assert after["status"] in ("ok", "diff")


def test_comparison_sees_values_types_and_aliasing():
    import torch

    from .compare import aliasing, difference, snapshot

    x = torch.ones(2, 3)
    assert aliasing(x, {"x": x}) == ["result is x"]
    assert aliasing(x[0], {"x": x}) == ["result shares storage with x"]
    assert aliasing((x + 1, [x]), {"x": x}) == ["result[1][0] is x"]
    assert difference(snapshot([x, 1]), snapshot([x.clone(), 1]), "r") is None
    assert "values differ" in difference(snapshot([x, 1]), snapshot([x + 1e-3, 1]), "r")
    assert difference(snapshot({"a": 1}), snapshot({"a": 2}), "r") == "r['a']: 2 != 1 (eager)"
    assert "float64" in difference(snapshot(x), snapshot(x.double()), "r")


def test_printed_floats_compare_within_a_rounding_and_the_rest_exactly():
    from .runner import _same_printout

    # A sum that cancels (0.0033 from terms near 1): one fp32 rounding shows in the 4th digit.
    assert _same_printout("v 0.003283\nlens 2 3 0\n", "v 0.003282\nlens 2 3 0\n")
    assert not _same_printout("v 0.5\n", "v 0.6\n")
    assert not _same_printout("p 3 (2, 4)\n", "p 3 (2, 5)\n")  # ints and shapes: exact
    assert not _same_printout("lens 2 3 0\n", "lens 2 3 0\nv 1\n")


_ITERATED = """
import torch

def make_inputs(variant):
    g = torch.Generator().manual_seed(variant)
    return torch.randn(64, generator=g), None, [], {}, None

def f(x, y, lst, d, obj):
    for _ in range(12):
        x = 3.0 * torch.sin(x) + 0.5
    return x
"""

_PLAIN = _ITERATED.replace("3.0 * torch.sin(x) + 0.5", "x * 0.5 + 1.0")


def test_a_program_eager_cannot_hold_to_its_tolerance_is_ill_conditioned_not_a_difference():
    # x = 3 sin(x) + 0.5, twelve times: a rounding at the first step grows up to 3^12 times. A
    # difference of values there is "ill-conditioned" (eager on inputs 4 ulps away moves as
    # far); in x * 0.5 + 1 the same difference stays a difference.
    from . import runner

    for source, expected in ((_ITERATED, True), (_PLAIN, False)):
        module = runner.load(source, "test")
        eager = runner.run_side(module, module.f)
        diffs = [{"kind": "result", "call": 1, "detail": "result: tensor values differ (max abs diff 0.01)"}]
        assert runner._ill_conditioned(diffs, eager, runner.load(source, "test")) is expected
        # where eager does not move, a difference is kept
        other = [{"kind": "result", "call": 1, "detail": "result[0]: tensor values differ (max abs diff 1)"}]
        assert runner._ill_conditioned(other, eager, runner.load(source, "test")) is False


def test_a_spent_budget_starts_no_program_and_says_so():
    summary = run_campaign(SEED, 5, jobs=1, budget=0.0)
    assert summary.ran == 0
    assert "count=0 (of 5: the 0s budget ran out)" in summary.line()
