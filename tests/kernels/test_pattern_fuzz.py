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


def test_a_result_closer_to_correctly_rounded_ops_is_eager_s_rounding():
    """The classifier's "eager-rounding" by correctly rounded 16-bit ops: a compiled result that
    is the program with each op rounded once, where eager's is an ulp off, is eager's rounding;
    one two ulps off the other way is not."""
    import torch

    from .pattern_fuzz import _CorrectlyRounded, _far, closer_to_rounded

    x = torch.tensor([1.0, 3.0, 7.0, 11.0], dtype=torch.float16)

    def fn(x):
        return torch.exp(x * 0.1) - 1

    with _CorrectlyRounded():
        exact = fn(x)
    ulp = torch.tensor([2.0 ** -10], dtype=torch.float16) * exact.abs()
    eager_like = (exact.double() + ulp.double() * 4).to(torch.float16)
    assert _far(exact, eager_like).sum() == 3  # out of eager's tolerance (not at 0.1: atol)
    assert closer_to_rounded(fn, (x,), exact, eager_like)
    assert not closer_to_rounded(fn, (x,), (exact.double() - ulp.double() * 8).to(torch.float16),
                                 eager_like)
