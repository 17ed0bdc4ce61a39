"""Random numbers in C kernels: Philox 4x32-10 keyed by the per-call seed, box point ``i`` taking
word ``i & 3`` of the block for counter ``i >> 2``, filled per tile of a loop (AVX-512 or AVX2 where the
machine has it). The numbers depend only on the seed and the point: not on threads, tiles or the
instruction set. They are uniform in [0, 1) with 24 bits, with no visible dependence between
neighbours or between the four words of one block (bounds a correct generator passes with
overwhelming probability)."""

import pytest
import torch
import torch.nn.functional as F

from framejit.kernels import c_render, c_runtime

from .conftest import run_kernels
from .test_kernels import A


@pytest.fixture(autouse=True)
def c_renderer(renderer, device):
    """``run_kernels`` uses the C renderer in this module."""
    from . import conftest

    if device != "cpu":
        pytest.skip("C kernels run on CPU tensors")
    conftest._current["renderer"] = "c"


def uniform(x):
    """The kernel's random number at each point of ``x`` (times 1, exactly)."""
    return A.mul.Tensor(A.rand_like.default(x, dtype=torch.float32), 1.0)


def draw(fn, *args, seed=7):
    torch.manual_seed(seed)
    got, backend = run_kernels(fn, *args)
    assert len(backend.kernels) == 1
    return got


def with_threads(n, fn, *args, seed=7):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        return draw(fn, *args, seed=seed)
    finally:
        torch.set_num_threads(before)


def chi_square(counts: torch.Tensor) -> float:
    counts = counts.double().flatten()
    expected = counts.sum() / counts.numel()
    return (((counts - expected) ** 2) / expected).sum().item()


def chi_square_bound(cells: int) -> float:
    """Mean plus 8 standard deviations of chi-square with ``cells - 1`` degrees of freedom: a
    uniform sample exceeds it with a probability far below 1e-9."""
    df = cells - 1
    return df + 8 * (2 * df) ** 0.5


# Shapes: one row cut in parts (odd length), rows in parallel, rows whose length is not a
# multiple of 4 (tiles and blocks of four start mid-row), a non-contiguous input.
SHAPES = {
    "one_row": lambda: torch.randn(50001),
    "rows": lambda: torch.randn(300, 257),
    "short_rows": lambda: torch.randn(5000, 7),
    "transposed": lambda: torch.randn(333, 190).t(),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_same_seed_same_numbers_at_one_and_two_threads(shape):
    x = SHAPES[shape]()
    one, two = with_threads(1, uniform, x), with_threads(2, uniform, x)
    assert torch.equal(one, two)
    assert torch.equal(draw(uniform, x), one)


@pytest.mark.parametrize("tile", [4, 8, 100])
def test_numbers_do_not_depend_on_the_tile(monkeypatch, tile):
    x = torch.randn(300, 257)
    want = draw(uniform, x)
    monkeypatch.setattr(c_render, "RAND_TILE", tile)
    torch.manual_seed(7)
    got, backend = run_kernels(uniform, x)
    assert f"fj_t += {tile})" in backend.kernels[0].source
    assert torch.equal(got, want)


@pytest.mark.parametrize("flags", [("-mno-avx512f",), ("-mno-avx512f", "-mno-avx2"),
                                   ("-DFJ_RAND_LANES=8",)],
                         ids=["avx2", "scalar", "avx512_form"])
def test_numbers_do_not_depend_on_the_instruction_set(monkeypatch, flags):
    """The vector fills (AVX-512 where the machine has it, AVX2) and the scalar one give the
    same bits. ``-DFJ_RAND_LANES=8`` builds the AVX-512 form (8 counters a vector, 4 vectors at
    once) on any machine: on one without AVX-512, gcc computes its 64-byte vectors in halves."""
    x = torch.randn(100, 1001)
    want = draw(uniform, x)
    monkeypatch.setattr(c_runtime, "FLAGS", (*c_runtime.FLAGS, *flags))
    c_runtime.clear_memory_cache()  # the same function, built again with the new flags
    before = c_runtime.c_counters["compiles"] + c_runtime.c_counters["disk_hits"]
    try:
        assert torch.equal(draw(uniform, x), want)
    finally:
        c_runtime.clear_memory_cache()
    assert c_runtime.c_counters["compiles"] + c_runtime.c_counters["disk_hits"] > before


def test_the_numbers_are_points_of_one_stream():
    """Point i of a box is point i of the flat stream: a [n, m] box and a [n * m] one draw the
    same numbers (rows start anywhere in a block of four)."""
    x = torch.randn(301, 7)
    assert torch.equal(draw(uniform, x).flatten(), draw(uniform, x.flatten()))


def test_different_seeds_differ():
    x = torch.randn(4096)
    a, b = draw(uniform, x, seed=1), draw(uniform, x, seed=2)
    assert (a == b).float().mean().item() < 0.01


def test_uniform_in_unit_interval_with_24_bits():
    u = draw(uniform, torch.randn(2**20))
    assert u.min().item() >= 0 and u.max().item() < 1
    scaled = u.double() * 2**24
    assert torch.equal(scaled, scaled.floor())
    assert u.max().item() > 1 - 2**-12 and u.min().item() < 2**-12
    counts = torch.bincount((u * 64).long(), minlength=64)
    assert chi_square(counts) < chi_square_bound(64)
    # The low bits are as uniform as the high ones.
    low = torch.bincount((scaled.long() & 63), minlength=64)
    assert chi_square(low) < chi_square_bound(64)


def test_no_dependence_between_neighbours_or_words_of_a_block():
    u = draw(uniform, torch.randn(2**20)).view(-1, 4)  # one block of four per row
    bins = (u * 8).long()
    # Each pair of neighbouring words, within a block (0-1, 1-2, 2-3) and across blocks (3-0).
    pairs = [(bins[:, w], bins[:, w + 1]) for w in range(3)] + [(bins[:-1, 3], bins[1:, 0])]
    for a, b in pairs:
        assert chi_square(torch.bincount(a * 8 + b, minlength=64)) < chi_square_bound(64)
        r = torch.corrcoef(torch.stack([a.double(), b.double()]))[0, 1].item()
        assert abs(r) < 8 / len(a) ** 0.5
    # The four words of a block together (4 bins each: 256 cells).
    quad = (u * 4).long()
    cells = ((quad[:, 0] * 4 + quad[:, 1]) * 4 + quad[:, 2]) * 4 + quad[:, 3]
    assert chi_square(torch.bincount(cells, minlength=256)) < chi_square_bound(256)
    # Neighbouring blocks (counters c and c + 1) with the same word.
    for w in range(4):
        a, b = bins[:-1, w], bins[1:, w]
        assert chi_square(torch.bincount(a * 8 + b, minlength=64)) < chi_square_bound(64)


def dropout_add(x, y, p=0.1):
    return F.dropout(x, p, training=True) + y


def test_dropout_keeps_one_minus_p():
    n, p = 2**22, 0.1
    x = torch.ones(4096, 1024)
    kept = (draw(dropout_add, x, torch.zeros_like(x)) != 0).double()
    # 8 standard deviations of the kept fraction.
    assert abs(kept.mean().item() - (1 - p)) < 8 * (p * (1 - p) / n) ** 0.5
    # Neighbours are kept independently: both kept (1 - p)^2 of the time.
    both = (kept.flatten()[:-1] * kept.flatten()[1:]).mean().item()
    assert abs(both - (1 - p) ** 2) < 8 * ((1 - p) ** 2 * (1 - (1 - p) ** 2) / n) ** 0.5


@pytest.mark.parametrize("threads_", [1, 2])
def test_dropout_add_is_eagers_formula_given_the_mask(threads_):
    p = 0.1
    x, y = torch.randn(512, 333), torch.randn(512, 333)
    ones = torch.ones_like(x)
    mask = with_threads(threads_, dropout_add, ones, torch.zeros_like(x), seed=11) != 0
    got = with_threads(threads_, dropout_add, x, y, seed=11)
    torch.testing.assert_close(got, x * (mask.float() / (1 - p)) + y)
    assert abs(mask.float().mean().item() - (1 - p)) < 0.01
