"""``torch.cat`` computed inside kernels: the producers of each input run over the input's part
of the box, a ``concat`` op picks the input per point, and the consumers follow in the same
kernel. Each test runs through Triton (interpreter on CPU) and C (the ``renderer`` fixture),
and the description's reference interpreter, against eager torch."""

import pytest
import torch

from framejit.kernels.ir import Span
from framejit.testing import assert_close_to_eager

from .conftest import kernel_backend_name, run_kernels

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _upcast_eager(fn, args):
    """Eager in fp32, rounded once to the inputs' dtype: what the kernels compute."""
    dtype = next(a.dtype for a in args if a.is_floating_point())
    out = fn(*[a.float() if a.is_floating_point() else a for a in args])
    if isinstance(out, tuple):
        return tuple(o.to(dtype) for o in out)
    return out.to(dtype)


def check(fn, *args, kernels=None, upcast=False):
    """``fn`` compiled (the test's renderer, then the reference interpreter) against eager;
    returns the kernels' descriptions."""
    expected = _upcast_eager(fn, args) if upcast else fn(*args)
    got, backend = run_kernels(fn, *args)
    assert_close_to_eager(got, expected)
    if kernels is not None:
        assert len(backend.kernels) == kernels, [str(k.kernel) for k in backend.kernels]
    if kernel_backend_name() == "triton":  # once per test, not per renderer
        ref, _ = run_kernels(fn, *args, reference=True)
        assert_close_to_eager(ref, expected)
    return [k.kernel for k in backend.kernels]


def _concats(kernels) -> int:
    return sum(op.kind == "concat" for k in kernels for op in k.ops)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cat_along_the_last_dim_fuses_with_producers_and_consumers(dtype, device):
    x = torch.randn(6, 5, device=device, dtype=dtype)
    y = torch.randn(6, 3, device=device, dtype=dtype)
    w = torch.randn(8, device=device, dtype=dtype)

    def f(x, y, w):
        return torch.cat((-x, y * 2), dim=-1) * w + 1

    kernels = check(f, x, y, w, kernels=1, upcast=True)
    assert _concats(kernels) == 1


@pytest.mark.parametrize("dtype", DTYPES)
def test_three_unequal_inputs_along_a_middle_dim(dtype, device):
    a = torch.randn(2, 3, 5, device=device, dtype=dtype)
    b = torch.randn(2, 1, 5, device=device, dtype=dtype)
    c = torch.randn(2, 4, 5, device=device, dtype=dtype)

    def f(a, b, c):
        return torch.cat((a.exp(), b, c + 1), dim=1).sigmoid()

    (kernel,) = check(f, a, b, c, kernels=1, upcast=True)
    # Contiguous: the cat dimension merges with the one inside it, the spans scale by 5.
    assert kernel.sizes == (2, 40)
    spans = [a for op in kernel.ops if op.kind == "concat" for a in op.args if isinstance(a, Span)]
    assert spans == [Span(1, 0, 15), Span(1, 15, 20), Span(1, 20, 40)]


def test_cat_along_the_first_dim_of_1d_tensors_large_enough_for_threads(device, threads):
    a = torch.randn(40000, device=device)
    b = torch.randn(30001, device=device)
    check(lambda a, b: torch.cat((a * 2, b.abs()), 0) - 1, a, b, kernels=1)


def test_non_contiguous_inputs(device):
    x = torch.randn(7, 6, device=device)
    y = torch.randn(4, 6, device=device)
    z = torch.randn(6, 10, device=device)

    def f(x, y, z):
        # transposed and sliced views, a stepped slice, cat of the transposes along dim 1
        return torch.cat((x.t() * 3, y.t()[:, 1:], z[:, ::2] + z[:, 1::2]), dim=1).relu()

    check(f, x, y, z, kernels=1)


def test_inputs_broadcast_and_the_cat_is_broadcast_into_a_bigger_box(device):
    a = torch.randn(4, 5, device=device)
    bias = torch.randn(5, device=device)
    b = torch.randn(4, 1, device=device)
    big = torch.randn(3, 4, 6, device=device)

    def f(a, bias, b, big):
        # a producer broadcasting a bias, a size-1 input, then the cat broadcast over dim 0
        return big * torch.cat((a + bias, b.exp()), dim=-1)

    check(f, a, bias, b, big, kernels=1)


def test_type_promotion_like_torch(device):
    i = torch.arange(12, device=device, dtype=torch.int32).reshape(3, 4)
    h = torch.randn(3, 2, device=device, dtype=torch.float16)
    x = torch.randn(3, 5, device=device)

    def f(i, h, x):
        return torch.cat((i * 2, h, x), dim=1) + 0.5, torch.cat((i, i + 1), dim=0)

    check(f, i, h, x, kernels=2)  # two boxes: [3, 11] and [6, 4]


def test_concat_concatenate_and_bools(device):
    x = torch.randn(3, 4, device=device)
    y = torch.randn(3, 4, device=device)

    def f(x, y):
        return (torch.concat((x, y), 1) * 2, torch.concatenate((x, y), axis=0) + 1,
                torch.cat((x > 0, y < 0), dim=-1) & torch.cat((y > 0, x < 0), dim=-1))

    kernels = check(f, x, y, kernels=2)  # boxes [3, 8] and [6, 4]
    assert _concats(kernels) == 4


def test_nested_cats_along_the_same_and_another_dim(device):
    a = torch.randn(3, 2, device=device)
    b = torch.randn(3, 3, device=device)
    c = torch.randn(2, 5, device=device)
    d = torch.randn(5, 4, device=device)

    def f(a, b, c, d):
        inner = torch.cat((a.neg(), b), dim=1)             # [3, 5]
        rows = torch.cat((inner * 2, c.exp()), dim=0)      # [5, 5], inner in its rows
        return torch.cat((rows + 1, d), dim=1) * 3         # [5, 9]

    check(f, a, b, c, d, kernels=1)


def test_one_value_twice_and_a_producer_used_elsewhere(device):
    x = torch.randn(4, 6, device=device)

    def f(x):
        y = x * 2
        both = torch.cat((x.sin(), x.sin()), dim=-1)
        kept = torch.cat((y, x), dim=0)
        return both + 1, kept - 1, y  # y is returned too: it is not only a cat's input

    check(f, x)


@pytest.mark.parametrize("dtype", DTYPES)
def test_special_values_pass_through(dtype, device):
    x = torch.tensor([[float("nan"), float("inf")], [-float("inf"), -0.0]], device=device, dtype=dtype)
    y = torch.tensor([[1e-40, 3.0], [float("nan"), 0.0]], device=device, dtype=torch.float32)

    def f(x, y):
        return torch.cat((x * 1, y * 1), dim=1)

    check(f, x, y, kernels=1)


def test_a_cat_feeding_a_reduction_is_correct(device):
    x = torch.randn(5, 8, device=device)
    y = torch.randn(5, 3, device=device)

    def f(x, y):
        z = torch.cat((x * 2, y.exp()), dim=-1)
        return torch.softmax(z, dim=-1)

    kernels = check(f, x, y)
    # The cat is computed in its own kernel: reduction kernels take no concat.
    assert all(not k.reduce_dims for k in kernels if any(op.kind == "concat" for op in k.ops))


def test_unsupported_cats_stay_torch_calls(device):
    x = torch.randn(4, 3, device=device)
    empty = torch.randn(4, 0, device=device)
    legacy = torch.randn(0, device=device)

    def f(x, empty, legacy):
        return torch.cat((x * 2, empty), dim=1) + 1, torch.cat((x.flatten(), legacy)) - 1

    kernels = check(f, x, empty, legacy)
    assert _concats(kernels) == 0


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotary(q, k, cos, sin):
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_embedding_of_q_and_k_is_one_kernel(dtype, device):
    q = torch.randn(2, 3, 5, 8, device=device, dtype=dtype)
    k = torch.randn(2, 3, 5, 8, device=device, dtype=dtype)
    cos = torch.randn(5, 8, device=device, dtype=dtype)
    sin = torch.randn(5, 8, device=device, dtype=dtype)
    kernels = check(rotary, q, k, cos, sin, kernels=1, upcast=True)
    assert _concats(kernels) == 2
    if dtype == torch.float32:
        assert_close_to_eager(run_kernels(rotary, q, k, cos, sin)[0], rotary(q, k, cos, sin))


def test_rotary_embedding_as_llama_writes_it(device):
    """HF Llama: q, k from a projection's transposed view, cos/sin of shape [batch, seq, dim]
    unsqueezed into the heads dimension."""
    b, s, h, d = 2, 5, 3, 8
    proj = torch.randn(b, s, 2 * h * d, device=device)
    cos = torch.randn(b, s, d, device=device)
    sin = torch.randn(b, s, d, device=device)

    def f(proj, cos, sin):
        q = proj[..., : h * d].view(b, s, h, d).transpose(1, 2)
        k = proj[..., h * d:].view(b, s, h, d).transpose(1, 2)
        c, s_ = cos.unsqueeze(1), sin.unsqueeze(1)
        return q * c + rotate_half(q) * s_, k * c + rotate_half(k) * s_

    check(f, proj, cos, sin, kernels=1)


def test_c_runs_one_loop_per_piece_of_a_row_cut_by_a_cat(renderer, device):
    """In C, a row the cat cuts in two is two loops, each reading its input contiguously (no
    per-element select or clamped index, which would make gathers)."""
    if renderer != "c":
        pytest.skip("about the C code")
    x = torch.randn(4, 16, device=device)
    cos = torch.randn(16, device=device)
    _, backend = run_kernels(lambda x, c: x * c + rotate_half(x) * c, x, cos)
    (launcher,) = backend.kernels
    assert launcher.source.count("#pragma omp simd") == 2
    assert "r < 8 ?" not in launcher.source and "r > 7 ?" not in launcher.source


def test_c_prefetches_the_next_row_of_a_row_cut_by_a_cat(renderer, device):
    """Each piece's loop reads the row's halves the other way round, which the hardware
    prefetcher does not follow: row x prefetches what row x + 1 reads of each input (the views'
    halves only), and the last row prefetches nothing. Rows read whole do not."""
    if renderer != "c":
        pytest.skip("about the C code")
    x = torch.randn(4, 16, device=device)
    cos = torch.randn(16, device=device)
    _, backend = run_kernels(lambda x, c: x * c + rotate_half(x) * c, x, cos)
    (launcher,) = backend.kernels
    prefetches = [line.strip() for line in launcher.source.splitlines() if "FJ_PREFETCH(" in line]
    assert "if (x + 1 < 4) {" in launcher.source
    # x itself (16 floats a row), and its two halves as the cat's inputs (8 floats each); the
    # broadcast cos is no row input of row x + 1
    assert sorted(p.split(";")[1].strip() for p in prefetches) == \
        ["fj_b < 32", "fj_b < 32", "fj_b < 64"], prefetches
    assert all("(x + 1) * 16" in p for p in prefetches), prefetches
    _, backend = run_kernels(lambda x, c: torch.softmax(x * c, -1), x, cos)
    assert all("FJ_PREFETCH(" not in k.source for k in backend.kernels)


@pytest.mark.parametrize("dtype", DTYPES)
def test_c_runs_a_short_piece_of_a_row_as_its_plain_loop(renderer, device, dtype, monkeypatch):
    """A piece shorter than a vector tile (a rotary embedding over rows of 16: pieces of 8) is
    its plain loop, not vector tiles, which took a call per conversion for a handful of values
    (fp32 over 262144 rows of 16 2.4x faster). fp16 pieces of 32 are vector code, each piece's
    loads at its own offset (an fp16 rotary embedding over rows of 77, pieces of 38 and 39,
    went from 0.33x Inductor's speed to 1.75x); so are pieces of 38 and 39 in any dtype, their
    last values one masked vector on AVX-512 (FJ_VREST). Eager's values. (Outputs stream as big
    ones do: in fp32 tiles are for those stores.)"""
    if renderer != "c":
        pytest.skip("about the C code")
    from framejit.kernels import c_render

    monkeypatch.setattr(c_render, "STREAM_BYTES", 1024)
    monkeypatch.setattr(c_render, "STREAM_LINE", 1)
    for n, tiles in ((16, False), (64, dtype == torch.float32), (77, None)):
        x = torch.randn(37, n, device=device, dtype=dtype)
        x[3, n // 2], x[4, n - 1], x[5, 0] = float("nan"), float("inf"), -0.0  # (pieces' ends)
        cos = torch.randn(n, device=device, dtype=dtype)
        fn = lambda x, c: x * c + rotate_half(x) * c  # noqa: E731
        got, backend = run_kernels(fn, x, cos)
        (launcher,) = backend.kernels
        if tiles is not None:
            assert ("_tile(" in launcher.source) == tiles, launcher.source
        assert ("fj_vsth" in launcher.source) == (dtype == torch.float16 and n > 16), launcher.source
        if n == 77:  # the second piece's loads at r - 39
            assert launcher.source.count("const int fj_rm = ") == 2, launcher.source
            assert "+ (r - 39)" in launcher.source, launcher.source
        assert_close_to_eager(got, fn(x, cos))
