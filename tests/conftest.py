"""Shared by every test folder, including tests/hook, which must run without torch: nothing here
imports torch at module level."""

import os

import pytest

# Every graph captured during the tests is checked with Graph.lint() before it is compiled.
os.environ.setdefault("FRAMEJIT_LINT", "1")

# Compiles are never read from the disk cache of compiled graphs, but in its own tests
# (tests/backends/test_graph_cache.py): tests replace functions of the compiler (to make a
# lowering fail, say) that its keys do not see.
os.environ.setdefault("FRAMEJIT_GRAPH_CACHE", "0")

# Kernel tests run Triton kernels on CPU tensors in Triton's interpreter, which must be chosen
# before triton is imported. On the GPU machine, FRAMEJIT_TEST_GPU=1 keeps real compilation
# (`make test-gpu`); the interpreter tests then run on CUDA tensors compiled for real.
if os.environ.get("FRAMEJIT_TEST_GPU") != "1":
    os.environ.setdefault("TRITON_INTERPRET", "1")

#: FRAMEJIT_TEST_BACKEND=fx runs every graph that would go to the native "default"/"eager"
#: backend through the torch.fx export instead (framejit.testing.fx_export_backend): the graph is
#: converted with to_torch_fx and torch.fx's generated code runs it. `make test` runs
#: tests/capture and tests/models this way too.
TEST_BACKEND = os.environ.get("FRAMEJIT_TEST_BACKEND", "native")

#: FRAMEJIT_TEST_READABLE=1 runs every cache entry's readable rendering in place of its
#: rewritten bytecode (framejit.testing.run_renderings_in_place; tests/debug/test_readable.py
#: runs part of tests/capture this way).
TEST_READABLE = os.environ.get("FRAMEJIT_TEST_READABLE") == "1"


def pytest_configure(config):
    if TEST_BACKEND == "fx":
        from framejit.testing import route_default_backend_through_fx

        route_default_backend_through_fx()
    elif TEST_BACKEND != "native":
        raise pytest.UsageError(f"FRAMEJIT_TEST_BACKEND={TEST_BACKEND!r}: expected 'native' or 'fx'")
    if TEST_READABLE:
        from framejit.testing import run_renderings_in_place

        run_renderings_in_place()


def pytest_report_header(config):
    if TEST_READABLE:
        return "framejit: cache entries run their readable renderings (FRAMEJIT_TEST_READABLE=1)"
    if TEST_BACKEND == "fx":
        return "framejit: backend='default'/'eager' go through the torch.fx export (FRAMEJIT_TEST_BACKEND=fx)"
    return None


def pytest_runtest_setup(item):
    # GPU tests are marked `@pytest.mark.gpu` and skipped on machines without CUDA. torch is
    # imported only when such a test is about to run.
    if item.get_closest_marker("gpu") is not None:
        import torch

        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA device")
