"""The differential fuzzer's fixed-seed sample, part of ``make test``.

Every program of the sample runs eagerly and compiled in worker subprocesses (see campaign.py);
the test asserts that none differs and none crashes. On failure the message lists the classes of
failure and a shrunk reproducer of the first; ``make fuzz`` runs longer campaigns.
"""

import pytest

from .campaign import reproduce, run_campaign, signature
from .pool import Worker

# Sized to take one to two minutes on a two-core machine.
SEED = 20261123
COUNT = 2000


@pytest.mark.fuzz
def test_fixed_seed_sample():
    summary = run_campaign(SEED, COUNT, jobs=2)
    print(summary.line())
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
