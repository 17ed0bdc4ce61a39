"""Shared by every test folder, including tests/hook, which must run without torch: nothing here
imports torch at module level."""

import os

import pytest

# Every graph captured during the tests is checked with Graph.lint() before it is compiled.
os.environ.setdefault("FRAMEJIT_LINT", "1")


def pytest_runtest_setup(item):
    # GPU tests are marked `@pytest.mark.gpu` and skipped on machines without CUDA. torch is
    # imported only when such a test is about to run.
    if item.get_closest_marker("gpu") is not None:
        import torch

        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA device")
