"""The Triton launcher's direct path: after the first call, a kernel launches its compiled binary
directly (``CompiledKernel[grid](*args)``) instead of going through ``JITFunction.run``, once that
gave the same bits; an input that is not 16-byte aligned takes Triton's own launch.

A GPU is needed for real binaries (tests/kernels/test_gpu.py checks them there). Here, Triton's
interpreter stands in for both: a fake "binary" runs the interpreted kernel with the block sizes
passed positionally, as Triton's launcher takes them, and counts its launches."""

import pytest
import torch

import framejit
from framejit.kernels import triton_runtime
from framejit.kernels.triton_runtime import Launcher

from .conftest import DEVICE, KernelCompiler

pytestmark = pytest.mark.skipif(DEVICE != "cpu", reason="fakes a binary with Triton's interpreter")


@pytest.fixture(autouse=True)
def no_earlier_check(monkeypatch):
    """Each test starts as a fresh process would: no direct launch checked yet."""
    monkeypatch.setattr(triton_runtime, "_direct_ok", None)

A = torch.ops.aten


class FakeBinary:
    """Stands in for Triton's CompiledKernel: ``binary[grid](*args)`` with every parameter
    positional (block sizes last), as JITFunction.run calls it; ``wrong`` adds 1 to the first
    output after each launch."""

    def __init__(self, jit, first_output: int, wrong: bool):
        self.jit, self.first_output, self.wrong, self.launches = jit, first_output, wrong, 0

    def __getitem__(self, grid):
        assert len(grid) == 3 and grid[1:] == (1, 1)

        def runner(*args):
            self.launches += 1
            names = self.jit.arg_names
            blocks = {name: a for a, name in zip(args, names) if name in ("XBLOCK", "RBLOCK")}
            self.jit.interpreted[grid[:1]](*args[:len(args) - len(blocks)], **blocks)
            if self.wrong:
                args[self.first_output].add_(1.0)

        return runner


class FakeJIT:
    """Triton's interpreted function, with ``warmup`` returning a FakeBinary and its own
    launches (``jit[grid]``, ``jit.run``) counted."""

    def __init__(self, interpreted, first_output: int, wrong: bool):
        self.interpreted, self.slow_launches = interpreted, 0
        self.arg_names = interpreted.arg_names
        self.binary = FakeBinary(self, first_output, wrong)

    def warmup(self, *args, grid, **kwargs):
        return self.binary

    def run(self, *args, grid, warmup, **kwargs):
        self.slow_launches += 1
        return self.interpreted.run(*args, grid=grid, warmup=warmup, **kwargs)

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.slow_launches += 1
            return self.interpreted[grid](*args, **kwargs)

        return launch


def _launcher_class(wrong: bool = False):
    made = []

    class DirectLauncher(Launcher):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.interpret = False  # compile (fake), check, and launch directly
            self.fn = FakeJIT(self.fn, len(self.kernel.inputs), wrong)
            made.append(self)

    return DirectLauncher, made


def _run(fn, *args, wrong=False):
    cls, made = _launcher_class(wrong)
    backend = KernelCompiler({"cpu": cls})
    compiled = framejit.compile(fn, backend=backend.as_backend(), fullgraph=True)
    return compiled, made


def softmax_times_w(x, w):
    m = A.amax.default(x, [-1], True)
    e = A.exp.default(A.sub.Tensor(x, m))
    return A.mul.Tensor(A.div.Tensor(e, A.sum.dim_IntList(e, [-1], True)), w)


def test_calls_after_the_first_launch_the_binary_directly():
    x, w = torch.randn(8, 32), torch.randn(32)
    compiled, made = _run(softmax_times_w, x, w)
    torch.testing.assert_close(compiled(x, w), softmax_times_w(x, w))
    (launcher,) = made
    assert launcher.direct
    before = (launcher.fn.slow_launches, launcher.fn.binary.launches)
    for _ in range(3):
        torch.testing.assert_close(compiled(x, w), softmax_times_w(x, w))
    assert launcher.fn.slow_launches == before[0]
    assert launcher.fn.binary.launches == before[1] + 3


def test_an_unaligned_input_takes_tritons_own_launch():
    x, w = torch.randn(8, 32), torch.randn(32)
    compiled, made = _run(softmax_times_w, x, w)
    compiled(x, w)
    (launcher,) = made
    storage = torch.randn(8 * 32 + 1)
    shifted = storage[1:].view(8, 32)  # 4 bytes past a 16-byte boundary
    assert shifted.data_ptr() % 16 == 4
    slow = launcher.fn.slow_launches
    torch.testing.assert_close(compiled(shifted, w), softmax_times_w(shifted, w))
    assert launcher.fn.slow_launches == slow + 1


def test_a_binary_that_disagrees_on_the_first_call_is_never_launched_directly():
    x, w = torch.randn(8, 32), torch.randn(32)
    compiled, made = _run(softmax_times_w, x, w, wrong=True)
    for _ in range(2):
        torch.testing.assert_close(compiled(x, w), softmax_times_w(x, w))
    (launcher,) = made
    assert not launcher.direct
    assert launcher.fn.binary.launches == 1  # the first call's check only


def test_a_kernel_with_run_time_sizes_launches_directly_at_every_size():
    def fn(x):
        return torch.relu(x * 2).sum(-1)

    cls, made = _launcher_class()
    backend = KernelCompiler({"cpu": cls})
    compiled = framejit.compile(fn, backend=backend.as_backend(), dynamic=True)
    for n in (3, 5, 9):
        x = torch.randn(n, 7)
        torch.testing.assert_close(compiled(x), fn(x))
    (launcher,) = made
    assert launcher.kernel.is_dynamic and launcher.direct
    assert launcher.fn.binary.launches == 1 + 3  # the first call's check, then each call


def test_one_failed_check_keeps_every_later_kernel_on_tritons_launch():
    x, w = torch.randn(8, 32), torch.randn(32)
    compiled, made = _run(softmax_times_w, x, w, wrong=True)
    compiled(x, w)
    other, made_after = _run(lambda x: torch.relu(x * 3), x)
    torch.testing.assert_close(other(x), torch.relu(x * 3))
    (launcher,) = made_after
    assert not launcher.direct and launcher.fn.binary.launches == 0


def test_a_kernel_with_big_outputs_trusts_an_earlier_check(monkeypatch):
    x, w = torch.randn(8, 32), torch.randn(32)
    monkeypatch.setattr(triton_runtime, "DIRECT_CHECK_BYTES", 0)
    compiled, made = _run(softmax_times_w, x, w)
    compiled(x, w)
    (unchecked,) = made
    assert not unchecked.direct  # nothing checked yet: Triton's launch
    monkeypatch.setattr(triton_runtime, "_direct_ok", True)
    other, made_after = _run(lambda x: torch.relu(x * 3), x)
    torch.testing.assert_close(other(x), torch.relu(x * 3))
    (trusted,) = made_after
    assert trusted.direct and trusted.fn.binary.launches == 1  # the call itself, no check
