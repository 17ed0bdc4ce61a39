"""The fused-kernel fuzzer's fixed sample (tests/kernels/pattern_fuzz.py), part of ``make test``:
random chains of fused patterns on long rows, 16-bit dtypes and odd layouts, where C kernels
must agree with the reference interpreter and run without falling back."""

import pytest

from .pattern_fuzz import generate, run_case

#: About 0.3 s a case with a cold kernel cache on a two-core Zen 3 VM (a C compile or two).
SEEDS = range(20261128_000, 20261128_080)


@pytest.fixture(autouse=True)
def c_renderer(device):
    if device != "cpu":
        pytest.skip("C kernels run on CPU tensors")


@pytest.mark.fuzz
def test_fixed_sample_of_fused_patterns():
    failures = []
    for seed in SEEDS:
        case = generate(seed)
        status, detail = run_case(case)
        if status == "fail":
            failures.append(f"{case.describe()}\n  {detail}")
    assert not failures, (f"{len(failures)} of {len(SEEDS)} cases failed "
                          f"(python -m tests.kernels.pattern_fuzz --seed N reruns one):\n"
                          + "\n".join(failures[:5]))
