"""C kernels of strided or short reductions, run across a block of neighbouring outputs.

``x.sum(0)`` of a (4, n) ``x`` or max-pool's 2x2 windows make rows too strided (or contiguous
in too short runs) for a vector loop along the row; the renderer then reduces :data:`~framejit.kernels.c_render.
BLOCK` outputs at once with the row as the outer loop. Each test builds the reduction kernel of
a strided view directly (its box and strides are the view's), at odd sizes, with NaNs and ties,
at one and two threads, static and with run-time sizes, and compares it with eager torch.
"""

import pytest
import torch

from framejit.kernels import c_render
from framejit.kernels.c_runtime import CLauncher
from framejit.kernels.ir import FULL, OUTER, Buffer, Kernel, Op, compute_dtype
from framejit.testing import TOLERANCES

from .symbolic import symbolic_kernel


@pytest.fixture(autouse=True)
def cpu_only(device):
    if device != "cpu":
        pytest.skip("C kernels run on CPU tensors")


_EAGER = {"sum": torch.sum, "max": torch.amax, "min": torch.amin,
          "argmax": torch.argmax, "argmin": torch.argmin}


def reduction(view: torch.Tensor, dims: tuple[int, ...], kind: str, out: torch.Tensor):
    """The launcher of ``kind`` over ``dims`` of ``view`` (its box and strides), written to a
    tensor laid out as ``out`` (strides 0 along ``dims``)."""
    cdt = compute_dtype(view.dtype)
    arg = kind.startswith("arg")
    rdt = torch.int64 if arg else cdt
    strides = list(out.stride())
    for d in dims:
        strides.insert(d, 0)
    buffers = [Buffer("in0", view.dtype, tuple(view.stride())),
               Buffer("out0", out.dtype, tuple(strides), is_output=True)]
    ops = [Op("load", ("in0",), cdt, FULL), Op("reduce", (kind, 0), rdt, OUTER),
           Op("store", ("out0", 1), rdt, OUTER)]
    kernel = Kernel(f"fj_red_{kind}", tuple(view.shape), dims, buffers, ops)
    return kernel, [(tuple(out.shape), tuple(out.stride()), out.dtype)]


def eager(view, dims, kind):
    if kind.startswith("arg"):
        (d,) = dims
        return _EAGER[kind](view, dim=d)
    return _EAGER[kind](view, dim=dims)


def check(view, dims, kind, *, channels_last=False, block=True, rtol=None, atol=None):
    want = eager(view, dims, kind)
    out = torch.empty_like(want, memory_format=torch.channels_last) if channels_last else want
    kernel, outputs = reduction(view, dims, kind, out)
    launcher = CLauncher(kernel, outputs, "cpu", None)
    assert ("A1[j]" in launcher.source) == block, launcher.source
    got = launcher(view)
    assert got.stride() == out.stride()
    if kind.startswith("arg"):
        assert torch.equal(got, want)
    else:
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol, equal_nan=True)
    return launcher


@pytest.mark.parametrize("kind", ["sum", "max", "min", "argmax", "argmin"])
@pytest.mark.parametrize("shape", [(4, 4096), (1, 7), (3, 17), (5, 33), (2, 40000), (7, 5),
                                   (40, 33)])  # rows of up to UNROLL_ROW are unrolled; 40 not
def test_a_reduction_over_dim_0(kind, shape, threads):
    x = torch.randn(shape).round(decimals=1)  # ties: the first index wins
    if shape[1] > 3:
        x[shape[0] // 2, 1] = float("nan")  # NaN wins, and its index
        x[:, 2] = float("nan")  # the first NaN wins
    check(x, (0,), kind, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("channels_last", [False, True], ids=["contiguous", "channels_last"])
@pytest.mark.parametrize("kind", ["max", "min", "sum"])
@pytest.mark.parametrize("shape", [(2, 3, 10, 14), (1, 5, 7, 9), (8, 32, 64, 64)])
def test_max_pool_windows(channels_last, kind, shape, threads):
    """Max-pool as it is decomposed: the max over the last two dims of a windowed view."""
    x = torch.randn(shape)
    x[0, 0, 1, 1] = float("nan")
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    view = x.unfold(2, 2, 2).unfold(3, 2, 2)
    # Channels last, the outputs are contiguous along the channels: too few of 3 for a block.
    block = not channels_last or shape[1] >= 4
    launcher = check(view, (4, 5), kind, channels_last=channels_last, block=block, rtol=1e-5, atol=1e-5)
    if channels_last and shape[1] >= 32 and kind != "sum":
        # All the channels are one block of constant width; the NaN lane is found by its flag.
        assert f"A1[{shape[1]}]" in launcher.source and "N1[j] |=" in launcher.source
    if kind == "max":
        torch.testing.assert_close(
            torch.nn.functional.max_pool2d(x, 2), eager(view, (4, 5), kind), equal_nan=True)


def test_overlapping_windows_of_three():
    view = torch.randn(2, 4, 11, 13).unfold(2, 3, 2).unfold(3, 3, 2)
    check(view, (4, 5), "max")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kind", ["sum", "max", "argmin"])
def test_half_inputs_and_outputs(dtype, kind, threads):
    x = torch.randn(6, 37, dtype=dtype)
    rtol, atol = TOLERANCES[dtype]
    check(x, (0,), kind, rtol=rtol, atol=atol)


def test_long_strided_sums_accumulate_in_fp64():
    """An outer reduction over many rows adds in fp64 (a naive fp32 sum of 20000 0.1s drifts;
    the row loop's vector lanes, which would cut the drift, run across outputs here)."""
    x = torch.full((20000, 19), 0.1)
    launcher = check(x, (0,), "sum", rtol=1e-6, atol=0)
    assert "double A1[19]" in launcher.source  # one block of all 19 outputs
    torch.testing.assert_close(launcher(x), x.double().sum(0).float(), rtol=0, atol=0)


def test_a_row_contiguous_in_memory_keeps_the_row_loop():
    """Long rows along the contiguous dimension vectorize along the row, as before."""
    check(torch.randn(64, 100), (1,), "sum", block=False, rtol=1e-5, atol=1e-5)
    check(torch.randn(33, 8), (1,), "max", block=False)
    check(torch.randn(33, 4), (1,), "max")  # runs of 4: across outputs
    check(torch.randn(5, 3), (0,), "sum", block=False)  # three outputs: too few for a block


@pytest.mark.parametrize("parallel_min", [c_render.PARALLEL_MIN, 64])
def test_run_time_sizes(threads, parallel_min, monkeypatch):
    """The same kernel with run-time sizes, on many sizes (some above the parallel threshold)."""
    monkeypatch.setattr(c_render, "PARALLEL_MIN", parallel_min)
    for kind in ["sum", "max", "argmax"]:
        example = torch.randn(6, 20)
        static, outputs = reduction(example, (0,), kind, eager(example, (0,), kind))
        kernel, _ = symbolic_kernel(static, [0, 1])
        out = [((kernel.sizes[1],), (1,), outputs[0][2])]
        launcher = CLauncher(kernel, out, "cpu", None)
        assert "_blocks(bufs, sizes," in launcher.source
        for shape in [(1, 1), (3, 7), (5, 33), (1, 17), (9, 1), (40, 1000), (40000, 3), (3, 12289)]:
            x = torch.randn(shape)
            x[0, 0] = float("nan")
            got = launcher(x, *shape)
            want = eager(x, (0,), kind)
            if kind == "argmax":
                assert torch.equal(got, want), shape
            else:
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4, equal_nan=True)
