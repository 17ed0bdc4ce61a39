import os

import pytest
import torch

import framejit
from framejit.backends.registry import Backend
from framejit.fx_ir import GraphModule
from framejit.kernels.c_runtime import CLauncher
from framejit.kernels.reference import ReferenceLauncher
from framejit.kernels.triton_runtime import Launcher
from framejit.pipeline import compile_with_kernels
from framejit.testing import fresh_state

fresh_framejit = pytest.fixture(autouse=True)(fresh_state)

#: Kernel tests run on CPU tensors in Triton's interpreter; `make test-gpu` (FRAMEJIT_TEST_GPU=1)
#: runs the same tests on CUDA tensors, compiled for real.
DEVICE = "cuda" if os.environ.get("FRAMEJIT_TEST_GPU") == "1" else "cpu"


#: The test modules whose kernel tests run through every renderer: Triton (the interpreter on
#: CPU tensors) and C (CPU tensors only). A test marked ``triton_only`` runs through Triton alone.
_ALL_RENDERERS = {"test_kernels", "test_pipeline", "test_concat"}


def pytest_configure(config):
    config.addinivalue_line("markers", "triton_only: a kernel test about Triton's code or launcher")
    config.addinivalue_line("markers", "fuzz: a fuzzer's fixed-seed sample (slow)")


def pytest_generate_tests(metafunc):
    if "renderer" not in metafunc.fixturenames:
        return
    module = metafunc.module.__name__.rsplit(".", 1)[-1]
    if module not in _ALL_RENDERERS:
        return
    renderers = ["triton"]
    if DEVICE == "cpu" and metafunc.definition.get_closest_marker("triton_only") is None:
        renderers.append("c")
    metafunc.parametrize("renderer", renderers, indirect=True, ids=[f"{r}_renderer" for r in renderers])


_current = {"renderer": "triton"}


@pytest.fixture(autouse=True)
def renderer(request):
    """The renderer ``run_kernels`` uses in this test: ``"triton"`` or ``"c"``."""
    name = getattr(request, "param", "triton")
    _current["renderer"] = name
    yield name
    _current["renderer"] = "triton"


def kernel_backend_name() -> str:
    """The built-in backend of the current renderer (``backend="triton"`` or ``"c"``)."""
    return _current["renderer"]


@pytest.fixture(params=[1, 2], ids=["1_thread", "2_threads"])
def threads(request):
    """Runs the test with 1 and with 2 torch threads (the kernels' serial and parallel paths)."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


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

    def as_backend(self) -> Backend:
        """This compiler as a native backend to pass to ``framejit.compile`` (not registered by
        name: registrations outlive the test)."""
        return Backend(f"kernels_{id(self)}", self, native=True)


def scalar_form(source: str, macros=("FJ_VEC_TILES", "FJ_VREST", "FJ_BF16_PAIRS")) -> str:
    """A C kernel's source as a compiler without vector tiles takes it: the loops rendered in
    vector tiles or vector code as well (``#if FJ_VEC_TILES ... #else``, see
    c_render.vector_tiles; ``#ifdef FJ_VREST``, ``FJ_BF16_PAIRS``: AVX-512's) only in their
    plain form, for tests
    about the structure of the loop nest; or without the forms that test ``macros`` only.
    Conditionals nested in the left-out forms go with them; others stay as they are."""
    lines: list[str] = []
    tiles: list[bool] = []  # each open conditional: whether it tests FJ_VEC_TILES
    skip: int | None = None  # the depth whose vector form is being left out
    for line in source.splitlines():
        d = line.strip()
        if d.startswith("#if"):
            tiles.append(any(m in d for m in macros))
            if skip is None and tiles[-1]:
                skip = len(tiles)
            if skip is not None:
                continue
        elif d.startswith("#elif") or d == "#else":
            if skip == len(tiles) and d == "#else":
                skip = None
                continue
            if skip is not None or tiles[-1]:
                continue
        elif d == "#endif":
            depth, was_tiles = len(tiles), tiles.pop()
            if skip is not None:
                if skip == depth:
                    skip = None
                continue
            if was_tiles:
                continue
        elif skip is not None:
            continue
        lines.append(line)
    return "\n".join(lines) + "\n"


def run_kernels(fn, *args, reference=False):
    """``fn(*args)`` compiled by the kernel pipeline (the test's renderer, or with
    ``reference=True`` the description's reference interpreter); returns (result,
    KernelCompiler)."""
    if reference:
        launcher = ReferenceLauncher
    elif _current["renderer"] == "c":
        launcher = {"cpu": CLauncher, "cuda": Launcher}
    else:
        launcher = None
    backend = KernelCompiler(launcher)
    result = framejit.compile(fn, backend=backend.as_backend(), fullgraph=True)(*args)
    return result, backend
