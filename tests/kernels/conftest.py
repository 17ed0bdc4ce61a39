import os

import pytest
import torch

import framejit
from framejit.backends import register_backend
from framejit.fx_ir import GraphModule
from framejit.kernels.reference import ReferenceLauncher
from framejit.pipeline import compile_with_kernels
from framejit.testing import fresh_state

fresh_framejit = pytest.fixture(autouse=True)(fresh_state)

#: Kernel tests run on CPU tensors in Triton's interpreter; `make test-gpu` (FRAMEJIT_TEST_GPU=1)
#: runs the same tests on CUDA tensors, compiled for real.
DEVICE = "cuda" if os.environ.get("FRAMEJIT_TEST_GPU") == "1" else "cpu"


@pytest.fixture
def device():
    if DEVICE == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    return DEVICE


class KernelCompiler:
    """A native backend that runs the kernel pipeline and keeps what it built."""

    def __init__(self, launcher=None):
        self.launcher = launcher
        self.compiled = []
        self.graphs: list[GraphModule] = []

    def __call__(self, gm, example_inputs):
        kwargs = {} if self.launcher is None else {"launcher": self.launcher}
        fn = compile_with_kernels(gm, example_inputs, ("cpu", "cuda"), lint=True, **kwargs)
        self.graphs.append(gm)
        self.compiled.append(fn)
        return fn

    @property
    def kernels(self):
        return [k for fn in self.compiled for k in fn.framejit_kernels]


_names = iter(range(10**9))


def run_kernels(fn, *args, reference=False):
    """``fn(*args)`` compiled by the kernel pipeline (Triton, or with ``reference=True`` the
    description's reference interpreter); returns (result, KernelCompiler)."""
    backend = KernelCompiler(ReferenceLauncher if reference else None)
    name = f"kernels_{next(_names)}"
    register_backend(name, backend)
    result = framejit.compile(fn, backend=name, fullgraph=True)(*args)
    return result, backend
