"""What only the C renderer and its runtime do: OpenMP at thread counts 1 and 2, single rows cut
in parts, sums in chunks, fp16/bf16 rounding bit for bit, the disk cache, and what happens
without a C compiler. (Every other kernel test runs through C too: see conftest's
``renderer``.)"""

import math
import re
import subprocess

import pytest
import torch

import framejit
from framejit.kernels import c_render, c_runtime
from framejit.testing import assert_close_to_eager

from .conftest import run_kernels, scalar_form
from .test_kernels import A, P, layer_norm, softmax


@pytest.fixture(autouse=True)
def c_renderer(renderer, device):
    """``run_kernels`` uses the C renderer in this module."""
    from . import conftest

    if device != "cpu":
        pytest.skip("C kernels run on CPU tensors")
    conftest._current["renderer"] = "c"


def test_parallel_kernels_at_one_and_two_threads(threads):
    torch.manual_seed(0)
    x = torch.randn(40, 1000)  # 40k elements: rows in parallel
    w, b = torch.randn(1000), torch.randn(1000)
    flat = torch.randn(50001)  # one row in parts
    got, backend = run_kernels(lambda x, w, b: (layer_norm(x, w, b), softmax(x)), x, w, b)
    assert_close_to_eager(got, (layer_norm(x, w, b), softmax(x)))
    assert all("omp parallel for" in k.source for k in backend.kernels)

    def full(v):
        e = A.mul.Tensor(v, 2.0)
        return (A.sum.dim_IntList(e, [0], True), A.amax.default(e, [0], True),
                A.argmin.default(e, 0, True), A.sub.Tensor(e, 1.0))

    got, backend = run_kernels(full, flat)
    assert_close_to_eager(got, full(flat))
    assert len(backend.kernels) == 1 and "omp parallel for" in backend.kernels[0].source
    # Parts do not depend on the thread count: the sum rounds the same at 1 and 2 threads.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        (alone, *_), _ = run_kernels(full, flat)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(got[0], alone)


def test_dropout_does_not_depend_on_the_thread_count():
    x = torch.randn(200, 200)
    r = torch.randn(200, 200)

    def f(x, r):
        keep = A.ge.Scalar(A.rand_like.default(x, dtype=torch.float32), 0.5)
        return A.add.Tensor(A.where.ScalarOther(keep, A.mul.Tensor(x, 2.0), 0.0), r)

    results = []
    before = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            torch.manual_seed(5)
            results.append(run_kernels(f, x, r)[0])
    finally:
        torch.set_num_threads(before)
    assert torch.equal(results[0], results[1])
    assert abs(((results[0] - r) != 0).float().mean().item() - 0.5) < 0.02


@pytest.mark.parametrize("n", [1, 3, 7, 17, 33, 1023])
def test_sizes_that_are_not_multiples_of_the_vector_width(n):
    x = torch.randn(5, n)

    def f(x):
        return A.sigmoid.default(A.add.Tensor(x, 1.0)), A.sum.dim_IntList(A.exp.default(x), [1], True)

    got, _ = run_kernels(f, x)
    assert_close_to_eager(got, f(x))


def test_row_lengths_around_the_sum_chunk(monkeypatch):
    monkeypatch.setattr(c_render, "SUM_CHUNK", 8)
    for n in (7, 8, 9, 17):
        x = torch.randn(3, n) + 2
        got, backend = run_kernels(lambda x: A.sum.dim_IntList(A.mul.Tensor(x, x), [1], True), x)
        assert_close_to_eager(got, (x * x).sum(1, keepdim=True))
        assert ("r0 += 8" in backend.kernels[0].source) == (n > 8)


def test_zero_size_inputs():
    for shape in [(0, 5), (4, 0), (0,)]:
        x = torch.randn(shape)
        fn = lambda x: torch.softmax(x * 2, -1) + torch.sigmoid(x)  # noqa: E731
        got = framejit.compile(fn, backend="c")(x)
        assert got.shape == fn(x).shape
        assert_close_to_eager(got, fn(x))


def test_huge_sum_keeps_its_precision():
    """fp32 sums add in fp32 inside 4096-element chunks, chunks in fp64: 2**25 + 4 ones sum to
    exactly that (a plain fp32 accumulator stops at 2**24)."""
    ones = torch.ones(1).expand(2**25 + 4)
    got, _ = run_kernels(lambda x: A.sum.dim_IntList(A.mul.Tensor(x, 1.0), [0], True), ones)
    assert got.item() == 2**25 + 4


def test_row_sums_of_a_repeated_value_add_in_lanes():
    """A row mostly of one value (a ReLU's, a mask's) adds its rounding errors the same way at
    each step: fp32 sums over rows of 4096 add in SUM_LANES lanes, each a few terms, where one
    vector's 8 lanes added 512 each (3x and 5x the error below, for a sum and a variance).
    The lanes then add pairwise (fj_fold_lanes: in order, a chain of 32 dependent adds made
    an fp32 layer norm over rows of 128 1.1x slower)."""
    g = torch.Generator().manual_seed(0)
    x = torch.where(torch.rand(4, 4096, generator=g) < 0.7, torch.tensor(0.6523),
                    torch.rand(4, 4096, generator=g))
    for fn, bound in ((lambda x: x.sum(-1), 1e-6), (lambda x: x.var(-1), 2e-6)):
        got, backend = run_kernels(fn, x)
        exact = fn(x.double())
        assert ((got.double() - exact) / exact).abs().max() < bound
        source = backend.kernels[0].source
        assert "fj_fold_lanes(" in source and "fj_j" not in source, source


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_stores_round_exactly_like_torch(dtype):
    finfo = torch.finfo(dtype)
    values = [0.0, -0.0, 1.0, 1.0 + finfo.eps / 2, 1.0 + 1.5 * finfo.eps, finfo.max, finfo.max * 1.5,
              finfo.tiny, finfo.tiny / 3, -finfo.tiny / 7, 65520.0, 65519.99, 1e-8, -1e-8,
              float("inf"), float("-inf"), float("nan"), 3.14159265, -2.71828]
    x = torch.tensor(values + torch.randn(100).mul(1000).tolist(), dtype=torch.float32)
    got, _ = run_kernels(lambda x: P.convert_element_type.default(A.mul.Tensor(x, 1.0), dtype), x)
    expected = x.to(dtype)
    assert torch.equal(got.view(torch.int16)[~expected.isnan()],
                       expected.view(torch.int16)[~expected.isnan()])
    assert torch.equal(got.isnan(), expected.isnan())
    back, _ = run_kernels(lambda h: A.mul.Tensor(P.convert_element_type.default(h, torch.float32), 1.0),
                          expected)
    assert torch.equal(back, expected.float()) or torch.allclose(back, expected.float(), equal_nan=True)


@pytest.mark.parametrize("pairs", ["pairs", "no-pairs"])
@pytest.mark.parametrize("n", [1024, 77])
def test_bf16_stores_in_pairs_round_like_torch(n, pairs, threads, monkeypatch):
    # A loop that stores bf16 (and takes no exp, sigmoid, GELU or random numbers) stores two
    # vectors at once where the CPU has AVX512-BF16 (FJ_BF16_PAIRS, fj_vstbf2). Its
    # vcvtne2ps2bf16 takes subnormal inputs as zeros and keeps a NaN's sign and payload: a pair
    # with a subnormal lane takes the integer form, NaN lanes are replaced. Torch's bits for every
    # class of value, alone in a pair and mixed into one, in each lane position; and a loop that
    # also sums (x - mean: its four-vector steps store in two pairs). "no-pairs": built as for an
    # AVX-512 CPU without AVX512-BF16 (gcc's loops, or single-vector stores).
    if pairs == "no-pairs":
        monkeypatch.setattr(c_runtime, "FLAGS", (*c_runtime.FLAGS, "-DFJ_NO_BF16_PAIRS"))
    c_runtime.clear_memory_cache()
    try:
        _bf16_stores_round_like_torch(n)
    finally:
        c_runtime.clear_memory_cache()


def _bf16_stores_round_like_torch(n):
    finfo = torch.finfo(torch.bfloat16)
    special = [0.0, -0.0, 1.0 + finfo.eps / 2, 1.0 + 1.5 * finfo.eps, finfo.max, finfo.max * 1.0039,
               finfo.tiny, finfo.tiny * 0.99, finfo.tiny / 3, -finfo.tiny / 7, 1e-41, -3e-45,
               float("inf"), float("-inf"), float("nan"), -float("nan")]
    x = torch.randn(64, n, generator=torch.Generator().manual_seed(n)).mul(1000)
    flat = x.view(-1)
    for k, value in enumerate(special):
        flat[k * 131 % flat.numel()] = value  # one in a pair of ordinary values
        flat[(k + 1) * 997 % flat.numel()::613] = value  # spread over lanes and rows
    flat[5 * n:6 * n] = torch.tensor(special).repeat(n // len(special) + 1)[:n]  # a row of them
    bits = flat.view(torch.int32)
    words = [0x7F800001, 0x7FFFFFFF, 0xFFFFFFFF, 0x7FC00001, 0x00000001, 0x807FFFFF, 0x00008000,
             0x00018000]  # NaN payloads; subnormals and a tie to even at the last bits
    bits[7 * n:7 * n + 40] = torch.tensor(words * 5, dtype=torch.int64).to(torch.int32)

    def to_bf16(x):
        return P.convert_element_type.default(A.mul.Tensor(x, 1.0), torch.bfloat16)

    got, backend = run_kernels(to_bf16, x)
    source = "".join(k.source for k in backend.kernels)
    assert "fj_vstbf2(" in source and "#ifdef FJ_BF16_PAIRS" in source, source
    expected = x.to(torch.bfloat16)
    assert torch.equal(got.isnan(), expected.isnan())
    assert torch.equal(got.view(torch.int16)[~expected.isnan()],
                       expected.view(torch.int16)[~expected.isnan()])
    assert (got.view(torch.int16)[expected.isnan()] == 0x7FC0).all()

    h = torch.randn(64, n, generator=torch.Generator().manual_seed(1)).bfloat16()
    h[3, 5], h[9, 40] = float("nan"), 1e-39

    def centered(h):
        return A.sub.Tensor(h, A.mean.dim(h, [-1], True))

    got, backend = run_kernels(centered, h)
    assert "fj_vstbf2(" in "".join(k.source for k in backend.kernels)
    assert_close_to_eager(got, centered(h))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_eight_rows_sums_folded_together_give_each_row_s_bits(dtype, threads, monkeypatch):
    # Short rows taken eight at a time (interleaved_rows) leave their sums' lanes in fj_q<i> on
    # AVX-512, and fj_fold_rows8 folds the eight rows' together: the same pairs added as each
    # row's own fold, so the same bits, in rows of 24 and 40 (rows of 100 and 1000, which keep
    # each row's fold, alike), a row count that leaves a last step of 5 rows, and NaN, inf and
    # zero rows.
    g = torch.Generator().manual_seed(5)

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    def ln(x, w):
        return torch.nn.functional.layer_norm(x, x.shape[-1:], w, w)

    def centered(x, w):
        return x - x.mean(-1, keepdim=True)

    for n in (24, 40, 100, 1000):
        x = torch.randn(37, n, generator=g).mul(3).to(dtype)
        x[3, 1], x[5, 2], x[6] = float("nan"), float("inf"), 0.0
        w = torch.randn(n, generator=g).to(dtype)
        for fn in (rms, ln, centered):
            got, backend = run_kernels(fn, x, w)
            source = "".join(k.source for k in backend.kernels)
            if n <= 40:
                assert "fj_fold_rows8(" in source, source
            monkeypatch.setattr(c_render, "DEFER_ROW_SUMS", False)
            c_runtime.clear_memory_cache()
            try:
                each, backend = run_kernels(fn, x, w)
            finally:
                monkeypatch.setattr(c_render, "DEFER_ROW_SUMS", True)
                c_runtime.clear_memory_cache()
            assert "fj_fold_rows8(" not in "".join(k.source for k in backend.kernels)
            assert torch.equal(got.isnan(), each.isnan())
            assert torch.equal(got[~got.isnan()], each[~each.isnan()]), (fn.__name__, n)
            assert_close_to_eager(got, fn(x, w))
    # A step whose sum is also read in the step itself keeps each row's fold (its t<i> would be
    # 0 until after the step)
    text = ["double a3 = 0;", "float c3 = 0;", "#if FJ_VW == 16 /* fj_defer 3 */",
            "fj_q3[fj_k] = fj_s3_0 + fj_s3_1;", "fj_d3 = 1;", "#else",
            "c3 += fj_lanes_sump(fj_s3_0, fj_s3_1);", "#endif", "a3 += c3;",
            "const float t3 = (float)a3;"]
    assert c_render._Renderer.deferred_sums(list(text), {3}) == [3]
    for extra, kept in ((["const float t4 = t3 * 2.0f;"], {3}), (["const float t4 = c3;"], {3}),
                        ([], set())):
        changed = text + extra
        assert c_render._Renderer.deferred_sums(changed, kept) == []
        assert changed[2] == "#if 0 /* fj_defer 3 */"


@pytest.mark.parametrize("f16c", ["f16c", "no-f16c"])
def test_a_row_s_fp16_values_round_and_store_like_torch(f16c, threads, monkeypatch):
    # A value computed once a row (a sum, then its fp16 rounding: a norm's mean and rsqrt) is
    # rounded and stored by F16C's scalar conversions (fj_round_h1, fj_f2h1); without F16C by
    # the integer forms. Every class of value: ties to even (normal and subnormal), the largest
    # half, values that round to it or to inf, subnormals, +-0, +-inf and NaN. Torch's bits.
    if f16c == "no-f16c":
        monkeypatch.setattr(c_runtime, "FLAGS", (*c_runtime.FLAGS, "-mno-f16c"))
        c_runtime.clear_memory_cache()
    eps = 2.0 ** -10
    values = [0.0, -0.0, 1.0, 1.0 + eps / 2, 1.0 + 1.5 * eps, 1.0 + eps / 2 * 1.0001, 65504.0,
              65519.99, 65520.0, -65520.0, 2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -25, 2.0 ** -26,
              -5 * 2.0 ** -25, 6.1e-5, 6.0e-5, 1e-8, float("inf"), float("-inf"), float("nan"),
              -float("nan")]
    v = torch.tensor(values + torch.randn(200).mul(1000).tolist() + torch.randn(100).tolist())
    x, y = torch.zeros(len(v), 16), torch.zeros(len(v), 16)
    x[:, 5], y[:, 7] = v * 2, v  # each row's sum: its value (x's: twice it)
    h = torch.randn(len(v), 16).half()

    def per_row(x, y, h):  # a row's value stored, and rounded then used by the row
        return (x.sum(-1, keepdim=True) * 0.5).to(torch.float16), h * y.sum(-1, keepdim=True).half()

    try:
        got, backend = run_kernels(per_row, x, y, h)
    finally:
        c_runtime.clear_memory_cache()
    source = "".join(k.source for k in backend.kernels)
    assert "fj_f2h1(" in source and "fj_round_h1(" in source, source
    for a, b in zip(got, per_row(x, y, h)):
        assert torch.equal(a.isnan(), b.isnan())
        assert torch.equal(a.view(torch.int16)[~b.isnan()], b.view(torch.int16)[~b.isnan()])


def test_integer_arithmetic_wraps_like_torch():
    a = torch.tensor([2**31 - 1, -(2**31), 12345, -7], dtype=torch.int32)

    def f(a):
        return A.mul.Tensor(A.add.Tensor(a, 1), 3), A.neg.default(a)

    got, _ = run_kernels(f, a)
    assert all(torch.equal(g, e) for g, e in zip(got, f(a)))


def _kernel_with_cache_in(tmp_path, monkeypatch, scale: float):
    """A one-kernel function of ``scale`` and its input, with the disk cache in ``tmp_path`` and
    the memory of built functions cleared (as in a new process)."""
    monkeypatch.setenv("FRAMEJIT_CACHE_DIR", str(tmp_path))
    fn = lambda x: A.add.Tensor(A.mul.Tensor(x, scale), 0.375)  # noqa: E731
    x = torch.randn(9)
    c_runtime.clear_memory_cache()
    return fn, x


def test_second_compile_of_the_same_source_reads_the_disk_cache(tmp_path, monkeypatch):
    fn, x = _kernel_with_cache_in(tmp_path, monkeypatch, 3.25)
    before = dict(c_runtime.c_counters)
    first, _ = run_kernels(fn, x)
    assert c_runtime.c_counters["compiles"] == before["compiles"] + 1
    assert len(list(tmp_path.glob("c/*.so"))) == 1
    second, _ = run_kernels(fn, x)  # the same process: nothing built, nothing read
    assert c_runtime.c_counters == {**before, "compiles": before["compiles"] + 1}
    c_runtime.clear_memory_cache()  # as a new process
    third, _ = run_kernels(fn, x)
    assert c_runtime.c_counters["compiles"] == before["compiles"] + 1
    assert c_runtime.c_counters["disk_hits"] == before["disk_hits"] + 1
    assert torch.equal(first, second) and torch.equal(first, third)


def test_another_cpu_does_not_read_this_cpu_s_shared_objects(tmp_path, monkeypatch):
    """-march=native builds for the CPU at hand: a cache folder shared with a machine whose CPU
    lacks some of its instructions must not give it those objects (a SIGILL)."""
    fn, x = _kernel_with_cache_in(tmp_path, monkeypatch, 2.75)
    run_kernels(fn, x)
    assert len(list(tmp_path.glob("c/*.so"))) == 1
    monkeypatch.setattr(c_runtime, "_cpu", "vendor_id=AuthenticAMD; flags=fpu sse sse2")
    c_runtime.clear_memory_cache()
    before = dict(c_runtime.c_counters)
    got, _ = run_kernels(fn, x)
    assert c_runtime.c_counters["compiles"] == before["compiles"] + 1
    assert c_runtime.c_counters["disk_hits"] == before["disk_hits"]
    assert len(list(tmp_path.glob("c/*.so"))) == 2
    assert torch.equal(got, fn(x))


def test_a_kernel_s_c_function_is_rendered_once_and_read_from_disk_after(tmp_path, monkeypatch):
    # A kernel's C function is rendered once: the same description again takes it from memory,
    # a new process from the disk cache (c/render), by the description, the renderer's settings
    # and its source. Another setting renders again; a record gone bad is rendered again.
    monkeypatch.setenv("FRAMEJIT_CACHE_DIR", str(tmp_path))
    renders = []
    real = c_render._Renderer.function
    monkeypatch.setattr(c_render._Renderer, "function", lambda self: renders.append(1) or real(self))
    c_runtime.clear_memory_cache()
    fn = lambda x: softmax(A.mul.Tensor(x, 1.25))  # noqa: E731
    x = torch.randn(5, 40)
    first, backend = run_kernels(fn, x)
    records = tmp_path / "c" / "render"
    assert len(renders) == 1 and len(list(records.iterdir())) == 1
    run_kernels(fn, x)  # the same description: from memory
    assert len(renders) == 1
    c_runtime.clear_memory_cache()  # as a new process: from the disk
    second, again = run_kernels(fn, x)
    assert len(renders) == 1 and again.kernels[0].source == backend.kernels[0].source
    assert torch.equal(first, second)
    monkeypatch.setattr(c_render, "INTERLEAVE_ROWS", 1)  # another setting
    run_kernels(fn, x)
    assert len(renders) == 2 and len(list(records.iterdir())) == 2
    for record in records.iterdir():
        record.write_text("garbage")
    c_runtime.clear_memory_cache()
    third, _ = run_kernels(fn, x)
    assert len(renders) == 3 and torch.equal(first, third)


def test_a_shared_object_gone_bad_on_disk_is_compiled_again(tmp_path, monkeypatch):
    # The cache's pruning (or a crash) may take a file another process has just found.
    fn, x = _kernel_with_cache_in(tmp_path, monkeypatch, 2.0625)
    first, _ = run_kernels(fn, x)
    load, refused = c_runtime.ctypes.CDLL, []

    def load_once_refused(path):  # as dlopen in another process, on a file pruned since
        if not refused:
            refused.append(path)
            raise OSError(f"{path}: file too short")
        return load(path)

    monkeypatch.setattr(c_runtime.ctypes, "CDLL", load_once_refused)
    c_runtime.clear_memory_cache()  # as a new process
    before = dict(c_runtime.c_counters)
    second, _ = run_kernels(fn, x)
    assert refused and c_runtime.c_counters == {**before, "compiles": before["compiles"] + 1}
    assert torch.equal(first, second)


def test_framejit_cflags_are_added_to_the_build_and_its_cache_key(tmp_path, monkeypatch):
    # FRAMEJIT_CFLAGS (here a define the unit checks) builds a shared object of its own; a flag
    # the compiler refuses leaves the kernel as torch ops, with a warning naming the compiler's
    # words.
    fn, x = _kernel_with_cache_in(tmp_path, monkeypatch, 1.8125)
    first, _ = run_kernels(fn, x)
    monkeypatch.setenv("FRAMEJIT_CFLAGS", "-DFJ_NO_VEC_TILES -DFJ_CHECK=1")
    assert c_runtime.flags()[-2:] == ("-DFJ_NO_VEC_TILES", "-DFJ_CHECK=1")
    c_runtime.clear_memory_cache()
    second, _ = run_kernels(fn, x)
    assert len(list(tmp_path.glob("c/*.so"))) == 2
    assert torch.equal(first, second)
    monkeypatch.setenv("FRAMEJIT_CFLAGS", "-fno-such-framejit-flag")
    c_runtime.clear_memory_cache()
    with pytest.warns(UserWarning, match="(?s)failed to compile on cpu.*-fno-such-framejit-flag"):
        third, _ = run_kernels(fn, x)
    c_runtime.clear_memory_cache()
    assert_close_to_eager(third, fn(x))


def test_one_shared_object_per_graph(tmp_path, monkeypatch):
    monkeypatch.setenv("FRAMEJIT_CACHE_DIR", str(tmp_path))
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    c_runtime.clear_memory_cache()

    def f(x, w):
        a = A.relu.default(A.add.Tensor(x, 1.5))
        return A.mul.Tensor(A.sigmoid.default(A.mm.default(a, w)), 2.5)

    got, backend = run_kernels(f, x, w)
    assert len(backend.kernels) == 2
    assert_close_to_eager(got, f(x, w))
    assert len(list(tmp_path.glob("c/*.so"))) == 1


def test_without_a_c_compiler_the_graph_runs_as_python_with_a_warning(monkeypatch):
    monkeypatch.setenv("CC", "/nonexistent/framejit-cc")
    with pytest.warns(UserWarning, match="no C compiler: '/nonexistent/framejit-cc'"):
        got = framejit.compile(lambda x: torch.exp(x) + 1, backend="c")(torch.ones(3))
    assert_close_to_eager(got, torch.exp(torch.ones(3)) + 1)
    assert framejit.stats()["fallbacks"] == 1


def test_default_backend_uses_c_kernels_on_cpu():
    framejit.reset()
    x = torch.randn(5, 7)
    got = framejit.compile(lambda x: torch.softmax(x * 2.0, -1) + 1)(x)
    assert_close_to_eager(got, torch.softmax(x * 2.0, -1) + 1)
    assert framejit.stats()["kernels"] >= 1
    assert framejit.stats()["graphs"] == 1


def test_without_a_c_compiler_the_default_backend_runs_eager_with_one_warning(monkeypatch):
    from framejit import compiler

    monkeypatch.setenv("CC", "/nonexistent/framejit-cc")
    monkeypatch.setattr(compiler, "_warned_no_c_compiler", False)
    framejit.reset()
    with pytest.warns(RuntimeWarning, match="no C compiler: '/nonexistent/framejit-cc'.*eager") as record:
        a = framejit.compile(lambda x: torch.exp(x) + 1)(torch.ones(3))
        b = framejit.compile(lambda x: torch.exp(x) * 2)(torch.ones(3))
    assert sum("no C compiler" in str(w.message) for w in record) == 1
    assert_close_to_eager(a, torch.exp(torch.ones(3)) + 1)
    assert_close_to_eager(b, torch.exp(torch.ones(3)) * 2)
    stats = framejit.stats()
    assert (stats["graphs"], stats["fallbacks"], stats["kernels"]) == (2, 0, 0)


def test_a_kernel_that_does_not_compile_runs_as_torch_ops(monkeypatch):
    def broken(names, functions):
        raise c_runtime.KernelCompileError("cc failed")

    monkeypatch.setattr(c_runtime, "_build", broken)
    x = torch.randn(6, 11)
    with pytest.warns(UserWarning, match="failed to compile on cpu .* run as torch ops instead"):
        got, backend = run_kernels(lambda x: softmax(A.mul.Tensor(x, 1.75)), x)
    assert len(backend.kernels) == 1
    assert_close_to_eager(got, torch.softmax(x * 1.75, -1))


def test_ctypes_launch_when_the_launcher_extension_is_missing(monkeypatch):
    monkeypatch.setattr(c_runtime, "_launch", None)
    x = torch.randn(3, 13)
    got, backend = run_kernels(lambda x: A.mul.Tensor(A.sub.Tensor(x, 0.375), x), x)
    assert backend.kernels[0]._fast.__globals__["_launch"] is c_runtime._ctypes_launch
    assert_close_to_eager(got, (x - 0.375) * x)


def test_a_kernel_input_laid_out_unlike_its_example_value_runs_as_torch_ops():
    # CPU attention on a strided query returns (batch, seq, head, dim)-ordered strides where its
    # meta kernel says contiguous (GPT-2 in transformers). The clone after it was a C kernel that
    # read its input with the predicted strides: a wrong answer.
    def attend(x):
        q, k, v = x.split(16, dim=2)
        q, k, v = (t.view(2, 8, 4, 4).transpose(1, 2) for t in (q, k, v))
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return out.transpose(1, 2).contiguous() * 2

    x = torch.randn(2, 8, 48)
    compiled = framejit.compile(attend)
    assert_close_to_eager(compiled(x), attend(x))
    assert_close_to_eager(compiled(x), attend(x))
    assert framejit.stats()["kernels"] >= 1


def test_inputs_from_torch_ops_are_checked_and_graph_inputs_are_not(monkeypatch, capsys):
    from framejit.backends import registry
    from framejit.compiler import default_backend
    from framejit.debug import logs

    seen = []

    def backend(gm, example_inputs):
        # Lie about the layout of the matmul's result, as a meta kernel might.
        (mm,) = [n for n in gm.graph.nodes if n.name == "matmul"]
        mm.meta["val"] = mm.meta["val"].t().contiguous().t()
        fn = default_backend(gm, example_inputs)
        seen.extend(fn.framejit_kernels)
        return fn

    x, w = torch.randn(6, 5), torch.randn(5, 7)
    f = lambda x, w: torch.relu(x @ w) + x.sum()  # noqa: E731
    monkeypatch.setitem(registry._REGISTRY, "test_lying_meta",
                        registry.Backend("test_lying_meta", backend, True))
    logs.set_logs("kernels")
    try:
        compiled = framejit.compile(f, backend="test_lying_meta", fullgraph=True)
        got = compiled(x, w)
        compiled(x, w)
    finally:
        logs.set_logs()
    assert_close_to_eager(got, f(x, w))
    checked = {k.name: dict(k.checked_inputs) for k in seen}
    (relu,) = [k for k in seen if 0 in k.checked_inputs]
    assert relu.checked_inputs[0] == ((6, 7), (1, 6)) and relu.layout_misses == 2, checked
    assert all(not k.checked_inputs for k in seen if k is not relu), checked
    # Said once, with the input and both layouts: slower calls are not silent.
    assert framejit.stats()["kernel_layout_misses"] == 1
    err = capsys.readouterr().err
    assert err.count("ran as torch ops") == 1
    assert "input 0 has strides (7, 1), compiled for (1, 6)" in err


def test_exp_special_lanes_and_subnormal_results_in_a_masked_softmax():
    # A causal mask puts -inf in half the lanes: exp stays within 2 ulp of eager, gives 0 for
    # -inf, inf for overflow, keeps NaN and returns subnormals (its own vectorizable exp).
    x = torch.cat([torch.tensor([float("-inf"), float("inf"), float("nan"), -104.0, -103.9, -100.0,
                                 -95.5, -87.5, -87.3, 0.0, -0.0, 1e-30, 88.7, 88.73, 89.0, 100.0]),
                   torch.linspace(-110, 90, 4000)])
    got, backend = run_kernels(lambda x: A.exp.default(x), x)
    want = torch.exp(x)
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf())
    finite = want.isfinite()
    torch.testing.assert_close(got[finite], want[finite], rtol=2.4e-7, atol=3e-45)
    assert ((got[finite] == 0) == (want[finite] == 0)).float().mean() > 0.999
    t = 64
    scores = torch.randn(2, 4, t, t).masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
    got, backend = run_kernels(lambda s: softmax(s), scores)
    assert_close_to_eager(got, torch.softmax(scores, -1))


def test_the_same_kernel_twice_in_a_graph_is_one_function(tmp_path, monkeypatch):
    """Layer after layer of a model lowers to kernels that differ only in their graph-unique
    names (``fj_red_..._1``): they render to one function, built once."""
    monkeypatch.setenv("FRAMEJIT_CACHE_DIR", str(tmp_path))
    x, w = torch.randn(6, 32), torch.randn(32, 32)
    c_runtime.clear_memory_cache()

    def f(x, w):
        h = A.mm.default(A.relu.default(A.add.Tensor(x, 1.5)), w)
        # h is returned too, so the second kernel does not write over it (test_in_place.py).
        return A.relu.default(A.add.Tensor(h, 1.5)), h

    got, backend = run_kernels(f, x, w)
    assert_close_to_eager(got, f(x, w))
    first, second = backend.kernels
    assert first.name != second.name  # unique in the graph, for dumps and the explain report
    assert first.cname == second.cname and first.function == second.function
    source = next(tmp_path.glob("c/*.c")).read_text()
    assert source.count(f"void {first.cname}(") == 1


def test_the_triton_source_of_a_kernel_does_not_depend_on_its_graph_unique_name():
    import dataclasses

    from framejit.kernels import triton_render

    _, backend = run_kernels(lambda x: A.relu.default(A.add.Tensor(x, 1.5)), torch.randn(6, 32))
    kernel = backend.kernels[0].kernel
    again = dataclasses.replace(kernel, name=kernel.name + "_3")
    assert again.function_stem == kernel.function_stem == kernel.name
    assert triton_render.render(again) == triton_render.render(kernel)
    assert c_render.function_name(again) == c_render.function_name(kernel)
    other = dataclasses.replace(kernel, name="fj_poi_log1p")  # a digit that is no suffix
    assert other.function_stem == "fj_poi_log1p"


@pytest.mark.parametrize("n", [96, c_render.ROW_BUFFER + 8])
def test_rows_keep_costly_values_in_a_row_buffer_or_their_output_row(threads, n):
    # A softmax's exp is computed once per element and kept for the division, and a layer
    # norm's sum of inputs once for its three loops: in a local array (a row buffer) when the
    # row is short, in the output's own row when it is long (as eager's softmax keeps exp).
    # NaN, -inf and +inf rows come out as eager's either way.
    x = torch.randn(6, n)
    x[1, 3] = float("nan")
    x[2, :] = float("-inf")
    x[3, 5] = float("inf")
    x[4, ::2] = float("-inf")
    got, backend = run_kernels(lambda x: softmax(A.mul.Tensor(x, 0.5)), x)
    assert_close_to_eager(got, torch.softmax(x * 0.5, -1))
    (launcher,) = backend.kernels
    short = n <= c_render.ROW_BUFFER
    source = scalar_form(launcher.source)  # the loops without vector tiles
    assert (f"[{n}] __attribute__((aligned(64)))" in source) == short, source
    assert ("(fj_scratch)" in source) == (not short), source
    assert source.count("fj_expf(") == 1, source

    b, r, w, bias = torch.randn(n), torch.randn(6, n), torch.randn(n), torch.randn(n)
    y = torch.randn(6, n)
    got, backend = run_kernels(lambda y, b, r, w, bias: layer_norm(A.add.Tensor(A.add.Tensor(y, b), r), w, bias),
                               y, b, r, w, bias)
    assert_close_to_eager(got, torch.nn.functional.layer_norm(y + b + r, (n,), w, bias))
    (launcher,) = backend.kernels
    # Loads of the three inputs: once, then the buffer or the output row.
    assert scalar_form(launcher.source).count("in2[") == 1, launcher.source


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16],
                         ids=["fp32", "bf16", "fp16"])
def test_short_rows_are_reduced_several_at_a_time_with_the_one_row_bits(threads, monkeypatch, dtype):
    # Reductions over short rows take each step (a sum, then the variance's sum, then the
    # stores) for several rows in turn (interleaved_rows): a layer norm, a log-softmax, a
    # softmax keeping exp in row buffers (one per row), argmax with max, an integer count, an
    # RMSNorm rounding its per-row values (fp16, bf16) in a loop of their own, rows of 128 and of 100, a number of rows that is no multiple of the rows taken at once,
    # and 300 rows of 128 (parallel at two threads); NaN, inf and -inf rows. The same bits as
    # one row at a time, and eager's values.
    def counts(x):
        return (x > 0).sum(-1), x.argmax(-1), x.amax(-1)

    def rms(x, w, b):  # in fp16/bf16 each row's mean, mean + eps and rsqrt round: a loop of their own
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    for rows, n in ((13, 128), (300, 128), (9, 100)):
        x = (torch.randn(rows, n) * 3).to(dtype)
        x[1, 3], x[2, :], x[3, 5], x[4, ::2] = float("nan"), float("-inf"), float("inf"), float("-inf")
        w, b = torch.randn(n).to(dtype), torch.randn(n).to(dtype)
        cases = [(lambda x, w, b: torch.nn.functional.layer_norm(x, x.shape[-1:], w, b), (x, w, b)),
                 (lambda x: torch.log_softmax(x, -1), (x,)),
                 (lambda x: torch.softmax(x * 0.5, -1), (x,)),
                 (counts, (x,)), (rms, (x, w, b))]
        for fn, args in cases:
            got, backend = run_kernels(fn, *args)
            source = "".join(k.source for k in backend.kernels)
            if fn is rms:
                loops = 2 if dtype == torch.float32 else 3
                assert source.count("for (int64_t fj_k = 0;") == loops, source
            with monkeypatch.context() as m:
                m.setattr(c_render, "INTERLEAVE_ROWS", 1)
                one, alone = run_kernels(fn, *args)
            # (an fp32 log-softmax takes the next row's max in its exp tile instead)
            assert ("fj_x += " in source) != ("fj_exp_sub_tile(" in source), source
            assert "fj_x += " not in alone.kernels[0].source
            _assert_same_bits(got, one)
            # (RMSNorm rounds its mean, whose sum adds in another order than eager's: an ulp
            # there is an ulp or two in a few results; see test_kernels_with_big_outputs_...)
            rtol = {torch.float16: 4e-3, torch.bfloat16: 2e-2}.get(dtype) if fn is rms else None
            assert_close_to_eager(got, fn(*args), rtol=rtol)
    # A softmax keeps its exp in one row buffer per row.
    _, backend = run_kernels(lambda x: torch.softmax(x * 0.5, -1), torch.randn(16, 100).bfloat16())
    assert re.search(r"float fj_b\d+\[[2-8]\]\[112\] __attribute__", backend.kernels[0].source)
    # An fp16 layer norm keeps two row buffers per row (its converted row, the centred values).
    x = torch.randn(16, 24).half()
    _, backend = run_kernels(lambda x: torch.nn.functional.layer_norm(x, (24,)), x)
    assert len(re.findall(r"float fj_b\d+\[8\]\[32\] __attribute__", backend.kernels[0].source)) == 2


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_a_row_s_rounded_values_for_eight_rows_at_once_give_the_one_row_bits(threads, monkeypatch, dtype):
    # An RMSNorm over short rows rounds each row's mean, the mean plus eps and rsqrt: eight
    # rows' worth at once as vector code (rows_as_vector), the last rows of 67 in the loop.
    # Rows of zeros (rsqrt of eps), of tiny values (a subnormal mean), of values whose squares
    # overflow fp16, with NaN or inf. The bits of one row at a time, and eager's values.
    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    x = (torch.randn(67, 16) * 3).to(dtype)
    x[1], x[2], x[3] = 0.0, 1e-4, 60000.0
    x[4, 3], x[5, 0], x[6, 7], x[9] = float("nan"), float("inf"), -float("inf"), -0.0
    w = torch.randn(16).to(dtype)
    got, backend = run_kernels(rms, x, w)
    source = backend.kernels[0].source
    assert ("fj_round_h8(" if dtype == torch.float16 else "fj_round_bf8(") in source, source
    assert "fj_sqrt8(" in source
    with monkeypatch.context() as m:
        m.setattr(c_render, "INTERLEAVE_ROWS", 1)
        one, alone = run_kernels(rms, x, w)
    assert "fj_sqrt8(" not in alone.kernels[0].source
    _assert_same_bits(got, one)
    rtol = 4e-3 if dtype == torch.float16 else 2e-2  # (as in the test above)
    assert_close_to_eager(got, rms(x, w), rtol=rtol)


@pytest.mark.parametrize("n", [16, 32])
def test_a_short_row_s_sqrt_for_eight_rows_at_once_gives_the_one_row_bits(threads, monkeypatch, n):
    # fp32 layer norm and RMSNorm over rows of at most TILED_SUM_ROW: each row's variance,
    # plus eps and rsqrt, take a step of their own, eight rows at once as vector code (an fp32
    # layer norm over rows of 16 1.1x faster), the last rows of 67 in the loop. Rows of zeros
    # (rsqrt of eps), tiny values, huge ones, NaN, inf, -0.0. The bits
    # of one row at a time, and eager's values.
    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    def ln(x, w):
        return torch.nn.functional.layer_norm(x, (n,), w, w)

    x = torch.randn(67, n) * 3
    x[1], x[2], x[3] = 0.0, 1e-30, 1.0e18
    x[4, 3], x[5, 0], x[6, 7], x[9] = float("nan"), float("inf"), -float("inf"), -0.0
    w = torch.randn(n)
    for fn in (ln, rms):
        got, backend = run_kernels(fn, x, w)
        source = backend.kernels[0].source
        assert "fj_sqrt8(" in source and "#ifdef FJ_ROWS8" in source, source
        with monkeypatch.context() as m:
            m.setattr(c_render, "INTERLEAVE_ROWS", 1)
            one, alone = run_kernels(fn, x, w)
        assert "fj_sqrt8(" not in alone.kernels[0].source
        _assert_same_bits(got, one)
        assert_close_to_eager(got, fn(x, w))
    # rows of 64 keep their values in the step that reads them
    _, backend = run_kernels(rms, torch.randn(67, 64), torch.randn(64))
    assert "fj_sqrt8(" not in backend.kernels[0].source


@pytest.mark.parametrize("f16c", ["f16c", "no-f16c"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_a_row_s_value_rounded_for_eight_rows_at_once_rounds_like_torch(threads, dtype, f16c,
                                                                        monkeypatch):
    # A row's fp32 sum rounded to fp16 or bf16 in rows_as_vector's code (eight rows at once):
    # ties to even (normal and subnormal), values that round to the largest finite value or to
    # inf, subnormals, +-0, +-inf and NaN. Torch's bits. Built without F16C (an AVX-512 CPU
    # may lack it), the rows take the loop; the kernel still compiles.
    if f16c == "no-f16c":
        monkeypatch.setattr(c_runtime, "FLAGS", (*c_runtime.FLAGS, "-mno-f16c"))
        c_runtime.clear_memory_cache()
    finfo = torch.finfo(dtype)
    ulp = finfo.eps
    values = [0.0, -0.0, 1.0, 1.0 + ulp / 2, 1.0 + 1.5 * ulp, -(1.0 + 2.5 * ulp), finfo.max,
              finfo.max * (1 + ulp / 4), finfo.max * (1 + ulp / 2), finfo.tiny, finfo.tiny / 3,
              finfo.smallest_normal * ulp / 2, finfo.smallest_normal * ulp * 1.5, 1e-30,
              float("inf"), float("-inf"), float("nan")]
    v = torch.tensor(values + torch.randn(300).mul(100).tolist())
    y = torch.zeros(len(v), 16)
    y[:, 5] = v  # each row's sum: its value
    h = torch.randn(len(v), 16).to(dtype)

    def per_row(y, h):
        return h * y.sum(-1, keepdim=True).to(dtype)

    try:
        got, backend = run_kernels(per_row, y, h)
        assert backend.kernels[0].cname in c_runtime._functions  # (built: no torch ops instead)
    finally:
        c_runtime.clear_memory_cache()
    source = backend.kernels[0].source
    assert ("fj_round_h8(" if dtype == torch.float16 else "fj_round_bf8(") in source, source
    expected = per_row(y, h)
    assert torch.equal(got.isnan(), expected.isnan())
    assert torch.equal(got.view(torch.int16)[~expected.isnan()],
                       expected.view(torch.int16)[~expected.isnan()])


def test_a_long_row_recomputes_what_its_output_cannot_hold(threads):
    # An fp16 softmax's exp is fp32, which an fp16 output row cannot hold: a long row
    # computes it twice (the same results).
    n = c_render.ROW_BUFFER + 8
    x = torch.randn(3, n).half()
    got, backend = run_kernels(lambda x: P.convert_element_type.default(
        softmax(P.convert_element_type.default(x, torch.float32)), torch.float16), x)
    assert_close_to_eager(got, torch.softmax(x.float(), -1).half())
    (launcher,) = backend.kernels
    assert "(fj_scratch)" not in launcher.source
    # in the plain loops: the sum's (its blocks of SUM_LANES and the rest) and the store's
    plain = scalar_form(launcher.source)
    assert plain.count("fj_expf(") == 3, launcher.source


def test_a_row_cut_in_parts_keeps_exp_in_its_output_row(threads):
    # One long row, cut in parts shared by the threads: each part's exp goes to the output
    # row and is read back after the barrier that ends the sum.
    x = torch.randn(1, 100003) * 4
    x[0, 7] = float("-inf")
    got, backend = run_kernels(lambda x: softmax(x), x)
    assert_close_to_eager(got, torch.softmax(x, -1))
    (launcher,) = backend.kernels
    assert "(fj_scratch)" in launcher.source and launcher.source.count("fj_expf(") == 1
    x[0, 11] = float("nan")
    got, _ = run_kernels(lambda x: softmax(x), x)
    assert got.isnan().all()


def test_an_output_row_used_as_scratch_is_never_a_dead_input(threads):
    # Without grad a kernel may write its output over a dead input of its layout; not one that
    # keeps a value in its output row, since a later loop could read the input again.
    a, w = torch.randn(4, 64), torch.randn(64, c_render.ROW_BUFFER + 8)
    with torch.no_grad():
        got, backend = run_kernels(lambda a, w: softmax(A.mm.default(a, w)), a, w)
    assert_close_to_eager(got, torch.softmax(a @ w, -1))
    (launcher,) = backend.kernels
    assert "(fj_scratch)" in launcher.source and not launcher.donated


def _ulp_error(got: torch.Tensor, x: torch.Tensor, fn) -> torch.Tensor:
    """|got - fn(x)| in units of the fp32 ulp of the exact (fp64) result."""
    exact = fn(x.double())
    _, e = torch.frexp(exact.float().abs().clamp_min(torch.finfo(torch.float32).tiny))
    ulp = torch.ldexp(torch.ones_like(exact), (e - 24).to(torch.int64))
    return (got.double() - exact).abs() / ulp


def test_exp_is_within_one_ulp_over_a_dense_sample_of_floats():
    # Every 4099th fp32 bit pattern (1M floats, all exponents and signs), plus the rounding
    # boundaries of the range reduction: fj_expf stays within 0.9 ulp of the exact result
    # where it is finite (1 ulp on a CPU without FMA, which takes Cephes's polynomial), and
    # gets NaN, inf and 0 exactly as eager.
    bits = torch.arange(0, 2**32, 4099, dtype=torch.int64)
    bits = torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32)
    x = torch.cat([bits.view(torch.float32), torch.linspace(-104, 89, 100001)])
    got, _ = run_kernels(lambda x: A.exp.default(x), x)
    want = torch.exp(x)
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.isinf(), want.isinf()) and torch.equal(got == 0, want == 0)
    finite = want.isfinite() & (want != 0) & (x > -87.3)  # normal results
    has_fma = " fma " in open("/proc/cpuinfo").read().replace("\n", " ")
    assert _ulp_error(got[finite], x[finite], torch.exp).max() < (0.9 if has_fma else 1.0)
    subnormal = want.isfinite() & (want != 0) & (x <= -87.3)
    assert ((got[subnormal].double() - torch.exp(x[subnormal].double())).abs() <= 1.5e-45).all()



def test_gelu_is_as_close_to_the_exact_value_as_eager_s_own():
    # GELU's erf is a rational fit of ours (fj_geluf), not glibc's erff. Over 1M fp32 bit
    # patterns and a dense sweep of [-12, 12] it stays within 1e-6 of the exact GELU (eager's
    # own CPU GELU is up to 1.2e-6 off), within 2.5e-7 relative for x > 0, never turns a
    # negative x's GELU positive, and keeps eager's NaNs (NaN, -inf). gelu(+inf) is +inf
    # (the exact value; eager's CPU kernel gives NaN).
    bits = torch.arange(0, 2**32, 4099, dtype=torch.int64)
    bits = torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32)
    x = torch.cat([bits.view(torch.float32), torch.linspace(-12, 12, 200001),
                   torch.tensor([float("nan"), float("inf"), float("-inf"), 0.0, -0.0])])
    got, backend = run_kernels(lambda x: torch.nn.functional.gelu(x), x)
    assert "fj_geluf(" in backend.kernels[0].source
    exact = 0.5 * x.double() * torch.special.erfc(-x.double() / math.sqrt(2))
    finite = exact.isfinite()
    assert (got.double() - exact)[finite].abs().max() <= 1e-6
    positive = finite & (x > 1e-30)
    assert ((got.double() - exact) / exact)[positive].abs().max() <= 2.5e-7
    assert not (got[x < 0] > 0).any()
    assert torch.equal(got.isnan(), x.isnan() | (x == float("-inf")))
    assert got[x == float("inf")].item() == float("inf")
    assert torch.equal(got[x == 0].signbit(), x[x == 0].signbit())


def test_tanh_gelu_is_closer_to_the_exact_value_than_eager_s_own():
    # GELU's tanh form is computed as x / (1 + exp(-2u)), which equals 0.5 x (1 + tanh(u)).
    # Where u < 0, eager's 1 + tanh(u) cancels: for x < -3 its result keeps almost no correct
    # bits, ours stays within a few hundred ulps (the rounding of u, magnified by exp). For
    # x > 0 both are within about one ulp, and the special values are eager's: -0 for very
    # negative x, NaN at NaN and -inf, +inf at +inf.
    bits = torch.arange(0, 2**32, 4099, dtype=torch.int64)
    bits = torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32)
    x = torch.cat([bits.view(torch.float32), torch.linspace(-12, 12, 200001),
                   torch.tensor([float("nan"), float("inf"), float("-inf"), 0.0, -0.0])])
    fn = lambda x: torch.nn.functional.gelu(x, approximate="tanh")  # noqa: E731
    got, backend = run_kernels(fn, x)
    assert len(backend.kernels) == 1
    xd = x.double()
    exact = xd * torch.sigmoid(2 * math.sqrt(2 / math.pi) * (xd + 0.044715 * xd**3))
    eager = fn(x)
    ulps = ((got.double() - exact).abs() / (exact.abs() * 2**-23).clamp_min(1e-45))
    eager_ulps = ((eager.double() - exact).abs() / (exact.abs() * 2**-23).clamp_min(1e-45))
    normal = exact.isfinite() & (exact.abs() > 1e-30)
    assert ulps[normal & (x > 0)].max() <= 1.5
    assert ulps[normal & (x < 0) & (x > -3)].max() <= 16
    assert ulps[normal & (x <= -3)].max() <= 256 < eager_ulps[normal & (x <= -3)].max()
    assert torch.equal(got.isnan(), eager.isnan())
    assert torch.equal(got[~got.isnan()].signbit(), eager[~eager.isnan()].signbit())
    assert torch.equal(got[got.isinf()], eager[eager.isinf()])
    assert_close_to_eager(got, eager)


def _mlp(x, w, b, r, lw, lb):
    h = torch.relu(x @ w + b)
    z = torch.nn.functional.layer_norm(h @ w.t() + r, (w.shape[0],), lw, lb)
    return z, torch.nn.functional.gelu(z @ w) * 2, z.sum(-1)


def test_kernels_write_over_dead_matmul_results_without_grad(threads):
    # Each pointwise / row kernel after a matmul writes its output over the matmul's result
    # (dead after it, laid out like the output), as Inductor reuses buffers; z, a graph output
    # that a later matmul and a reduction also read, is never written over. The bits are those
    # of fresh outputs (grad mode on), and both match eager.
    torch.manual_seed(0)
    args = (torch.randn(4, 8, 64), torch.randn(64, 64), torch.randn(64), torch.randn(4, 8, 64),
            torch.randn(64), torch.randn(64))
    with torch.no_grad():
        got, backend = run_kernels(_mlp, *args)
    assert_close_to_eager(got, _mlp(*args))
    donating = {k.name: k.donated for k in backend.kernels if k.donated}
    assert len(donating) == 3 and all(d == {0: 0} for d in donating.values()), donating
    fresh = backend.compiled[0](*args)  # grad enabled: fresh outputs, same kernels
    for a, b in zip(got, fresh):
        assert torch.equal(a, b)
    with torch.no_grad():
        again = backend.compiled[0](*args)
    for a, b in zip(got, again):
        assert torch.equal(a, b)
    x = args[0].clone()
    with torch.no_grad():  # a graph input is never written over
        run_kernels(lambda x: torch.relu(x) + 1, x)
    assert torch.equal(x, args[0])


def test_row_buffers_stay_within_their_stack_budget(monkeypatch):
    # Past ROW_BUFFER_BYTES of buffers per row the kernel keeps the value in its output row,
    # or recomputes it where the output cannot hold it (same results).
    monkeypatch.setattr(c_render, "ROW_BUFFER_BYTES", 4 * 64)
    x = torch.randn(3, 96)
    got, backend = run_kernels(lambda x: softmax(A.mul.Tensor(x, 0.5)), x)
    assert_close_to_eager(got, torch.softmax(x * 0.5, -1))
    (launcher,) = backend.kernels
    source = scalar_form(launcher.source)  # a vector tile's array is not a row buffer
    assert "__attribute__((aligned(64)))" not in source
    assert "(fj_scratch)" in source and source.count("fj_expf(") == 1
    got, backend = run_kernels(lambda x: (softmax(x), A.exp.default(x)), x)
    assert_close_to_eager(got, (torch.softmax(x, -1), x.exp()))
    (launcher,) = backend.kernels
    assert "__attribute__((aligned(64)))" not in scalar_form(launcher.source)


def test_multi_query_attention_softmax_is_one_kernel():
    # One key/value head for four query heads (Falcon): torch's math path, whose safe softmax
    # ran as six eager ops; here one reduction kernel between the two matmuls, with fully
    # masked rows 0 as in eager.
    from framejit.testing import built_by_pipeline

    def attend(q, k, v, mask):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask) * 2

    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 33, 16), torch.randn(2, 1, 33, 16), torch.randn(2, 1, 33, 16)
    mask = torch.ones(33, 33, dtype=torch.bool).tril()
    mask[7] = False
    with built_by_pipeline() as built:
        got = framejit.compile(attend, backend="c")(q, k, v, mask)
    want = attend(q, k, v, mask)
    assert_close_to_eager(got, want)
    assert torch.equal(got[:, :, 7], torch.zeros_like(got[:, :, 7]))
    (fn,) = built
    reductions = [k for k in fn.framejit_kernels if k.kernel.is_reduction]
    assert len(reductions) == 1 and "fj_expf" in reductions[0].source


# -- vector tiles: exp, sigmoid, sums and fp16 in AVX-512 or AVX2 (c_render.vector_tiles) ----------

def _compiler_takes_vector_tiles(tmp_path, check: str = "!FJ_VEC_TILES") -> bool:
    command, _ = c_runtime.find_compiler()
    source = tmp_path / "probe.c"
    source.write_text(c_render.PRELUDE + f"\n#if {check}\n#error no vector tiles\n#endif\n")
    flags = [f for f in c_runtime.FLAGS if f not in ("-shared", "-fPIC")]
    return subprocess.run([*command, *flags, "-fsyntax-only", str(source)],
                          capture_output=True).returncode == 0


@pytest.fixture(params=["tiles", "vector"])
def body(request, monkeypatch):
    """fp16 loops in vector tiles (VECTOR_BODY off), or as explicit vector code where the
    renderer's vector_body takes them."""
    monkeypatch.setattr(c_render, "VECTOR_BODY", request.param == "vector")
    return request.param


@pytest.fixture(params=["native", "avx2"])
def isa(request, monkeypatch, tmp_path):
    """The vector tiles as this machine's compiler takes them ("native": AVX-512 where the CPU
    has it), and as a CPU with AVX2, FMA and F16C but no AVX-512 takes them (most laptops and
    desktops: 8-float tiles), built here with ``-mno-avx512f``."""
    if request.param == "native":
        yield request.param
        return
    monkeypatch.setattr(c_runtime, "FLAGS", (*c_runtime.FLAGS, "-mno-avx512f"))
    if not _compiler_takes_vector_tiles(tmp_path, "!FJ_VEC_TILES || defined(__AVX512F__)"):
        pytest.skip("the C compiler does not target AVX2 with FMA and F16C on this machine")
    c_runtime.clear_memory_cache()  # the same functions, built again with the flag
    yield request.param
    c_runtime.clear_memory_cache()


_TILE_PROGRAM = r"""
#include <stdio.h>
static int same(float a, float b) {
    uint32_t x, y;
    memcpy(&x, &a, 4);
    memcpy(&y, &b, 4);
    return x == y || (a != a && b != b);
}
static float x[2048] __attribute__((aligned(64))), e[2048] __attribute__((aligned(64))),
    s[2048] __attribute__((aligned(64))), d[2048] __attribute__((aligned(64))),
    ed[2048] __attribute__((aligned(64))), es[2048] __attribute__((aligned(64))), we[2048],
    ws[2048];
static unsigned long long bad, count;
/* A layer norm's two sums in one vector (fj_lanes_sum2): each one's own bits, those of
   fj_sum_tile over the values and over their squares (the same adds, each folded alone) */
static float squares[2048] __attribute__((aligned(64)));
static void check_sum_sq(const float *v, int n) {
    float sq;
    for (int i = 0; i < n; i++)
        squares[i] = v[i] * v[i];
    const float a = fj_sum_sq_tile(v, n, &sq), wa = fj_sum_tile(v, n), wsq = fj_sum_tile(squares, n);
    bad += !same(a, wa) + !same(sq, wsq);
    if (!same(a, wa) || !same(sq, wsq))
        printf("sum_sq n=%d: %a %a vs %a %a\n", n, a, sq, wa, wsq);
}
static void check(int n) {  /* x[0..n) through the tiles and through the scalar form */
    memcpy(e, x, sizeof x);
    memcpy(s, x, sizeof x);
    fj_exp_tile(e, n);
    fj_sigmoid_tile(s, n);
    for (int i = 0; i < n; i++) {
        we[i] = fj_expf(x[i]);
        ws[i] = 1.0f / (1.0f + fj_expf(-x[i]));
    }
    for (int i = 0; i < n; i++) {
        bad += !same(e[i], we[i]) + !same(s[i], ws[i]);
        if (bad && bad < 4 && (!same(e[i], we[i]) || !same(s[i], ws[i])))
            printf("x=%a: exp %a vs %a, sigmoid %a vs %a\n", x[i], e[i], we[i], s[i], ws[i]);
    }
    /* a softmax's tile: exp(x - c) as fj_exp_tile of the differences, their sum as
       fj_sum_tile adds it, and the max of a row (here x itself) as a max loop takes it */
    const float c = 0.75f;
    for (int i = 0; i < n; i++)
        es[i] = d[i] = x[i] - c;
    fj_exp_tile(d, n);
    /* a log-softmax's: fj_exp_sum_tile, fj_exp_tile's values and fj_sum_tile's sum */
    const float fused = fj_exp_sum_tile(es, n);
    float m = -INFINITY, wm = -INFINITY;
    int nan = 0, wnan = 0;
    const float sum = fj_exp_sub_tile(x, c, ed, n, x, &m, &nan);
    for (int i = 0; i < n; i++) {
        wm = x[i] > wm ? x[i] : wm;
        wnan |= x[i] != x[i];
        bad += !same(ed[i], d[i]) + !same(es[i], d[i]);
    }
    /* (a max of -0.0 and 0.0 may take either, as the plain loop's vector reduction) */
    bad += !same(sum, fj_sum_tile(d, n)) + !same(fused, fj_sum_tile(d, n)) + (m != wm)
        + (nan != wnan);
    check_sum_sq(x, n < 64 ? n : 64);
    count += n;
}
int main(void) {
    /* every 7th bit pattern, in tiles of 2045 (a tail of 13 lanes) */
    for (uint64_t b = 0; b < (1ull << 32); b += 7 * 2045) {
        for (int i = 0; i < 2045; i++) {
            const uint32_t u = (uint32_t)(b + 7 * (uint64_t)i);
            memcpy(&x[i], &u, 4);
        }
        check(2045);
    }
    /* the edges: subnormal results, the clamps, overflow, specials; each tail length */
    const float edges[] = {-INFINITY, INFINITY, NAN, -NAN, 0.0f, -0.0f, -104.0f, -103.99999f,
        -104.00001f, -87.336548f, -87.33655f, -88.0f, -95.5f, -100.25f, 88.376f, 88.3763f,
        88.72283f, 88.722839f, 89.0f, 89.00001f, 1e-45f, -1e-45f, 0x1p-126f, 1e30f, -1e30f};
    const int m = (int)(sizeof edges / sizeof edges[0]);
    for (int n = 1; n <= 48; n++) {
        for (int i = 0; i < n; i++)
            x[i] = edges[(i * 7 + n) % m] + (i % 3 == 2 ? 0.001f * (float)i : 0.0f);
        check(n);
    }
    /* rows of like magnitudes and either sign, where each order of the adds rounds its own
       way; and rows of -0.0 (the sum of -0.0s is +0.0, as fj_lanes_sum's first adds make it) */
    uint32_t state = 12345;
    for (int t = 0; t < 200000; t++) {
        const int n = 1 + t % 100;
        for (int i = 0; i < n; i++) {
            state = state * 1664525u + 1013904223u;
            x[i] = ((float)(state >> 8) / 16777216.0f - 0.5f) * (t % 7 == 0 ? 1e-20f : 3.0f);
            if (t % 11 == 0)
                x[i] = -0.0f;
        }
        check_sum_sq(x, n);
    }
    printf("%llu %llu\n", bad, count);
    return 0;
}
"""


def test_vector_tiles_compute_the_scalar_form_s_bits(tmp_path, isa):
    # The vector tiles (AVX-512's vscalefps, or AVX2's two-step scaling) and the plain loop
    # (gcc's vector code for fj_expf) give the same bits for exp and sigmoid, at every 7th fp32 bit pattern (613M floats) and at
    # the edges of the range (subnormal results, the clamps, inf, NaN), with every tail length;
    # a softmax's fj_exp_sub_tile gives fj_exp_tile's exps, fj_sum_tile's sum and a max loop's
    # max and NaN flag; fj_exp_sum_tile gives fj_exp_tile's exps and fj_sum_tile's sum; a layer
    # norm's fj_sum_sq_tile gives each of its two sums' own bits, added in one vector.
    if not _compiler_takes_vector_tiles(tmp_path):
        pytest.skip("the C compiler takes no vector tiles on this machine: exp and sigmoid "
                    "stay in their loops (the tile form is not compiled)")
    command, _ = c_runtime.find_compiler()
    source, program = tmp_path / "tiles.c", tmp_path / "tiles"
    source.write_text(c_render.PRELUDE + _TILE_PROGRAM)
    flags = [f for f in c_runtime.FLAGS if f not in ("-shared", "-fPIC")]
    subprocess.run([*command, *flags, str(source), "-o", str(program), "-lm"], check=True)
    out = subprocess.run([str(program)], capture_output=True, text=True, check=True).stdout
    bad, count = map(int, out.split()[-2:])
    assert count > 600_000_000 and bad == 0, out


def _tiles_and_plain(fn, args, monkeypatch, seed=None):
    """``fn(*args)`` through C kernels as this machine's compiler takes them, and with the
    vector tiles turned off: (tiled result, plain result, kernel sources). ``seed``: each run
    draws its random numbers under it."""
    if seed is not None:
        torch.manual_seed(seed)
    got, backend = run_kernels(fn, *args)
    source = "".join(k.source for k in backend.kernels)
    with monkeypatch.context() as m:
        m.setattr(c_runtime, "FLAGS", (*c_runtime.FLAGS, "-DFJ_NO_VEC_TILES"))
        c_runtime.clear_memory_cache()
        if seed is not None:
            torch.manual_seed(seed)
        plain, _ = run_kernels(fn, *args)
    c_runtime.clear_memory_cache()
    return got, plain, source


def _assert_same_bits(got, plain, sums=False, atol=1e-30):
    """The same values, NaN where NaN; with ``sums``, the results of sums that add in another
    order in the tiles (four accumulators): within rounding instead (and ``atol``: a log-softmax
    value near 0 is x - max minus the log of a sum, off by an ulp of that log)."""
    pairs = zip(got if isinstance(got, tuple) else (got,),
                plain if isinstance(plain, tuple) else (plain,))
    for a, b in pairs:
        assert torch.equal(a.isnan(), b.isnan())
        if sums:
            rtol = 1e-5 if a.dtype == torch.float32 else 2e-3
            torch.testing.assert_close(a, b, rtol=rtol, atol=atol, equal_nan=True)
        else:
            assert torch.equal(a.nan_to_num(), b.nan_to_num())


def test_exp_and_sigmoid_in_vector_tiles_give_the_plain_loop_s_bits(tmp_path, isa, threads, monkeypatch):
    # Softmax over rows longer than a tile (two whole tiles and a tail), with -inf, NaN and
    # values whose exp is subnormal; log-softmax; SiLU over an odd length; a short row. Each
    # kernel is compiled twice: as this machine's compiler takes it, and with the vector tiles
    # turned off. Same bits (but for the sums' rounding: the tiles add in four accumulators),
    # and eager's values.
    if not _compiler_takes_vector_tiles(tmp_path):
        pytest.skip("the C compiler takes no vector tiles on this machine")
    n = 2 * c_render.VEC_TILE + 904
    x = torch.randn(3, n) * 4
    x[0, 5], x[1, 2 * c_render.VEC_TILE + 3], x[2, 100] = float("-inf"), float("nan"), -95.0
    x[2, 101] = 0.0
    short = torch.randn(5, 37) * 3
    cases = [(lambda x: softmax(x), x, lambda: torch.softmax(x, -1), True),
             (lambda x: torch.log_softmax(x, -1), x, lambda: torch.log_softmax(x, -1), True),
             (lambda x: torch.nn.functional.silu(x), x[:, :1001],
              lambda: torch.nn.functional.silu(x[:, :1001]), False),
             (lambda x: softmax(x), short, lambda: torch.softmax(short, -1), True)]
    for fn, arg, eager, sums in cases:
        got, plain, source = _tiles_and_plain(fn, (arg,), monkeypatch)
        assert any(f"{name}(" in source for name in ("fj_exp_tile", "fj_sigmoid_tile",
                                                     "fj_exp_sub_tile", "fj_exp_sum_tile")), source
        assert any(f"{name}(" in source for name in ("fj_sum_tile", "fj_exp_sub_tile",
                                                     "fj_exp_sum_tile")) == sums
        _assert_same_bits(got, plain, sums)
        assert_close_to_eager(got, eager())


def test_softmax_takes_the_next_row_s_max_in_its_exp_tile(tmp_path, isa, threads, monkeypatch):
    # Softmax and log-softmax over rows of one tile or less (a multiple of 64 points, a tail
    # past 16): each row's exp tile also takes the next row's max, which that row then does
    # not read again. Rows short enough to be taken several at a time (7, 32) are taken so
    # instead. Rows of NaN, -inf and +inf, a NaN only in a row after a plain one, -0.0; the
    # same bits as the plain loops (sums within rounding) and eager's values, also where the
    # output is written over the input (a dead matmul result: the tiles then read no row
    # ahead).
    if not _compiler_takes_vector_tiles(tmp_path):
        pytest.skip("the C compiler takes no vector tiles on this machine")
    for n in (1024, 1000, 32, 7):
        x = torch.randn(9, n) * 4
        x[1], x[2, 0], x[3, n // 2], x[4] = float("-inf"), float("nan"), float("inf"), -0.0
        x[5, :] = float("nan")
        for fn, atol in ((softmax, 1e-30), (lambda x: torch.log_softmax(x, -1), 3e-7)):
            got, plain, source = _tiles_and_plain(fn, (x,), monkeypatch)
            ahead = n >= 1000
            assert ("fj_exp_sub_tile(" in source and "if (fj_nx == x)" in source) == ahead, source
            assert ("fj_x += " in source) != ahead, source
            _assert_same_bits(got, plain, sums=True, atol=atol)
            assert_close_to_eager(got, fn(x))
    a, w = torch.randn(6, 32), torch.randn(32, 1000)

    def scores(a, w):
        return torch.softmax(a @ w, -1)

    with torch.no_grad():
        got, backend = run_kernels(scores, a, w)
    (kernel,) = backend.kernels
    assert kernel.donated and "fj_exp_sub_tile(" in kernel.source
    fresh, _ = run_kernels(scores, a, w)  # grad mode: a fresh output, read ahead
    _assert_same_bits(got, fresh, sums=False)
    assert_close_to_eager(got, scores(a, w))


def test_a_tiled_op_that_needs_another_takes_a_later_step_of_the_tile(tmp_path, isa, threads,
                                                                     monkeypatch):
    # An fp16 SwiGLU rounds silu's value to fp16 (eager's silu returns fp16) before the
    # multiply; that rounding's operand takes exp. The tile takes exp, then the rounding
    # (fj_round_h_tile), each in its own step, where the rounding was the integer form inside
    # the loop. NaN, inf, values that overflow fp16 after the multiply, subnormal results, and
    # lengths with a tail: the plain loop's bits and eager's values.
    monkeypatch.setattr(c_render, "VECTOR_BODY", False)  # the tiles' path, not vector code
    if not _compiler_takes_vector_tiles(tmp_path):
        pytest.skip("the C compiler takes no vector tiles on this machine")

    def swiglu(a, b):
        return torch.nn.functional.silu(a) * b

    for n in (c_render.STORE_TILE * 2 + 37, 1000):
        a = (torch.randn(3, n) * 6).half()
        b = (torch.randn(3, n) * 4).half()
        a[0, 3], a[1, 7], a[2, 11], b[0, 5] = float("nan"), float("inf"), float("-inf"), 60000.0
        a[0, 5], a[1, 1], b[1, 1] = 30.0, -1e-4, 1e-3
        got, plain, source = _tiles_and_plain(swiglu, (a, b), monkeypatch)
        body = source[source.index("#if FJ_VEC_TILES"):]
        assert "fj_exp_tile(" in body and "fj_round_h_tile(" in body, source
        assert body.index("fj_exp_tile(") < body.index("fj_round_h_tile("), source
        _assert_same_bits(got, plain)
        assert_close_to_eager(got, swiglu(a, b))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16],
                         ids=["fp32", "bf16", "fp16"])
def test_kernels_with_big_outputs_stream_their_stores(tmp_path, isa, threads, monkeypatch, dtype,
                                                      body):
    # With STREAM_BYTES lowered to 1, every static kernel writes its fp32/fp16 outputs
    # through non-temporal stores (bf16 ones through plain stores): an RMSNorm, a residual +
    # layer norm (two outputs), an add, over rows of 1000, 77 (rows start unaligned: a head of
    # plain stores) and 3, and rows enough for the threads to share (the other threads'
    # stores). NaN, inf, -0.0 and values that round to inf in bf16/fp16. The plain loop's
    # bits (sums within rounding) and eager's values; the functions end with sfence. The
    # layer norm's variance also takes its two sums in one pass (fj_sum_sq_tile).
    if not _compiler_takes_vector_tiles(tmp_path):
        pytest.skip("the C compiler takes no vector tiles on this machine")
    monkeypatch.setattr(c_render, "STREAM_BYTES", 1)
    monkeypatch.setattr(c_render, "STREAM_LINE", 1)

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w

    def residual_ln(x, r, w):
        h = x + r
        return h, torch.nn.functional.layer_norm(h, (h.shape[-1],), w, None, 1e-5)

    def add(x, r):
        return x + r

    stream = {torch.float32: "fj_stream_tile(", torch.float16: "fj_f2h_stream_tile(",
              torch.bfloat16: None}[dtype]
    for rows, n in ((5, 1000), (5, 77), (5, 3), (2 * c_render.PARALLEL_MIN // 1000, 1000)):
        x = torch.randn(rows, n).to(dtype)
        r = torch.randn(rows, n).to(dtype)
        w = torch.randn(n).to(dtype)
        x[0, 1], x[1, 0], x[2, n - 1], r[3, 0] = float("nan"), float("inf"), -0.0, float("-inf")
        big = 3.3e38 if dtype == torch.bfloat16 else 6.5e4 if dtype == torch.float16 else 3e38
        x[4, :] = big
        r[4, :] = big
        for fn, args, sums in ((rms, (x, w), True), (residual_ln, (x, r, w), True),
                               (add, (x, r), False)):
            got, plain, source = _tiles_and_plain(fn, args, monkeypatch)
            if fn is residual_ln:  # the variance's two sums in one pass over x - mean
                assert "fj_sum_sq_tile(" in source, source
            # fp16 loops as vector code stream each whole vector (fj_vsth_nt): not rows under
            # a vector (the add's loop takes all 15 points)
            vector = body == "vector" and dtype == torch.float16 and (n >= 8 or fn is add)
            if stream is None:  # bf16 stores keep their plain loops
                assert "stream_tile(" not in source, source
            else:
                assert (stream if not vector else "fj_vsth_nt(") in source, source
                assert "fj_sfence();" in source, source
            # (a layer norm takes off the mean c of x - mean: summed in another order, c moves by
            # an ulp of it, and its outputs near 0 by some 1e-8)
            _assert_same_bits(got, plain, sums=sums, atol=1e-6 if fn is residual_ln else 1e-30)
            # (an fp16 RMSNorm's mean, rounded to fp16, can land an ulp from eager's, whose sum
            # adds in another order: two ulps in its products)
            rtol = 4e-3 if fn is rms and dtype == torch.float16 else None
            assert_close_to_eager(got, fn(*args), rtol=rtol)


def test_only_outputs_of_stream_bytes_or_more_stream():
    # The threshold as shipped: an fp32 add of two 4096x1024 tensors (16 MiB out) streams, one
    # of 1024x1024 does not.
    def add(x, y):
        return x + y

    for rows, streams in ((4096, True), (1024, False)):
        x = torch.randn(rows, 1024)
        _, backend = run_kernels(add, x, x)
        (kernel,) = backend.kernels
        assert ("fj_stream_tile(" in kernel.source) == streams, rows


@pytest.mark.parametrize("n", [77, 100, 1000, 1024])
def test_only_rows_of_whole_cache_lines_stream(n):
    # A layer norm's output of 16 MiB or more streams where each row is whole 64-byte lines
    # (1024 floats), not where rows end mid-line (77, 100, 1000 floats: streamed, they ran
    # 1.1-2.2x slower). Its bits are the plain stores' either way (eager's values).
    def ln(x, w):
        return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, None, 1e-5)

    x = torch.randn(-(-c_render.STREAM_BYTES // (4 * n)), n)
    w = torch.randn(n)
    got, backend = run_kernels(ln, x, w)
    (kernel,) = backend.kernels
    assert ("_nt(" in kernel.source or "stream_tile(" in kernel.source) == (n == 1024), n
    assert_close_to_eager(got, ln(x, w))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16],
                         ids=["fp32", "bf16", "fp16"])
def test_rows_of_no_whole_number_of_vectors(tmp_path, isa, threads, monkeypatch, dtype):
    # Softmax and log-softmax over rows of 24, 77 and 100: the max runs the whole vectors and
    # the rest as two loops (NaN and inf in the rest), the tiles read and write their partial last vector masked. NaN,
    # inf and -inf rows; the plain loop's bits (sums within rounding), and eager's values.
    if not _compiler_takes_vector_tiles(tmp_path):
        pytest.skip("the C compiler takes no vector tiles on this machine")
    for n in (24, 77, 100):
        x = (torch.randn(11, n) * 4).to(dtype)
        x[1], x[2, 0], x[3, n - 1], x[4, n - 2] = float("-inf"), float("nan"), float("inf"), float("nan")
        for fn, atol in ((lambda x: torch.softmax(x * 0.5, -1), 1e-30),
                         (lambda x: torch.log_softmax(x, -1), 1e-5)):
            got, plain, source = _tiles_and_plain(fn, (x,), monkeypatch)
            # (the rest a plain loop, but for fewer than 8 16-bit values)
            simd_rest = dtype != torch.float32 and n % 16 < 8
            assert scalar_form(source).count("reduction(max:") == 1 + simd_rest, source
            assert f"for (int64_t r = {n // 16 * 16}; r < {n}; r++)" in source, source
            _assert_same_bits(got, plain, sums=True, atol=atol)
            assert_close_to_eager(got, fn(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16],
                         ids=["fp32", "fp16", "bf16"])
def test_the_rest_of_a_row_under_a_vector_is_one_masked_vector(tmp_path, isa, threads,
                                                                monkeypatch, dtype):
    # vector_body's loops over rows of 9, 40, 77 and 100 values: on AVX-512 the values past the
    # last whole vector are one vector of masked loads and stores, their sums and maxima over
    # its first lanes only (elsewhere the plain loop, or gcc's loops where only AVX-512's form
    # is wanted: rows under 128 values, bf16 under 96). Rows far below zero (a zero lane would
    # be the max), NaN, inf and -inf in those last values, a row of -0.0. The plain loop's bits
    # (sums within rounding) and eager's values. A layer norm's two sums fold side by side.
    if not _compiler_takes_vector_tiles(tmp_path):
        pytest.skip("the C compiler takes no vector tiles on this machine")

    def center(x):
        return x - x.mean(-1, keepdim=True)

    def rms(x, w):
        h = x.float()
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).to(x.dtype)

    def ln(x, w):
        return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, w)

    def ln_fp32(x, w):
        return ln(x.float(), w.float()).to(x.dtype)

    def softmax(x, w):
        return torch.softmax(x.float() * 0.5, -1).to(x.dtype)

    for n in (9, 40, 77, 100):
        x = (torch.randn(12, n) * 3).to(dtype)
        x[1] = -x[1].abs() - 300  # (a max of 0 instead would leave exp's sum 0)
        x[2, n - 1], x[3, n - 2], x[4, n - 1], x[5, n - 1] = (float("nan"), float("inf"),
                                                              float("-inf"), 5e4)
        x[6] = -0.0
        x[7, n - 1] = -x[7].abs().max() - 9  # the least value, last
        w = torch.randn(n).to(dtype)
        for fn, args, eager in ((center, (x,), center), (rms, (x, w), rms), (ln, (x, w), ln_fp32),
                                (softmax, (x, w), softmax)):
            got, plain, source = _tiles_and_plain(fn, args, monkeypatch)
            assert "const int fj_rm = " in source and "#ifdef FJ_VREST" in source, source
            if fn is center:
                load = {torch.float32: "fj_vldm(", torch.float16: "fj_vldhm("}.get(dtype, "fj_vldbfm(")
                assert load in source, source
            if fn is ln and (dtype != torch.bfloat16 or n < 96):  # (its two sums fold as one)
                assert "fj_lanes_sum2(" in source, source
            # (x - mean over a row near -300: the mean summed in another order moves by an ulp)
            _assert_same_bits(got, plain, sums=True, atol=1e-4)
            # (an fp16 RMSNorm's mean, rounded to fp16, can land an ulp from eager's)
            assert_close_to_eager(got, eager(*args), rtol=4e-3 if fn is rms else None,
                                  atol=1e-4 if dtype == torch.float32 else None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16],
                         ids=["fp32", "fp16", "bf16"])
def test_gelu_in_vector_code_gives_the_scalar_form_s_bits(tmp_path, isa, threads, monkeypatch,
                                                          dtype):
    # GELU (exact, erf) + bias over rows of 77 and 1024 as vector code (fj_geluv: fj_geluf's
    # operations lane by lane; fp32 and bf16 only over rows of 77, on AVX-512). Its branches'
    # edges: |z| at 3.925 and either side, values near -3.9 where 1 + erf passes below 0, NaN,
    # +-inf, -0.0, subnormals. The plain loop's bits and eager's values (but for +-inf, where
    # eager's CPU GELU gives NaN: ours gives inf and NaN, as the scalar form).
    if not _compiler_takes_vector_tiles(tmp_path):
        pytest.skip("the C compiler takes no vector tiles on this machine")

    def gelu_bias(x, b):
        return torch.nn.functional.gelu(x + b)

    edge = 3.925 * 2 ** 0.5
    special = torch.tensor([edge, -edge, edge * (1 - 1e-6), -edge * (1 + 1e-6), -5.5, -5.3,
                            -0.0, 1e-40, float("nan"), 6.0, -6.0, 0.5])
    for n in (77, 1024):
        x = torch.randn(6, n) * 3
        x[0, :12] = special
        x[1, n - 12:] = special  # (in the masked rest)
        x = x.to(dtype)
        b = torch.zeros(n, dtype=dtype)
        got, plain, source = _tiles_and_plain(gelu_bias, (x, b), monkeypatch)
        assert ("fj_geluv(" in source) == (dtype == torch.float16 or n == 77), source
        _assert_same_bits(got, plain)
        assert_close_to_eager(got, gelu_bias(x, b))
    inf = torch.tensor([[float("inf"), float("-inf")] * 8], dtype=dtype)
    got, plain, _ = _tiles_and_plain(gelu_bias, (inf, torch.zeros(16, dtype=dtype)), monkeypatch)
    _assert_same_bits(got, plain)
    assert got[0, 0].item() == float("inf") and got[0, 1].isnan()


def test_fp16_in_vector_tiles_gives_the_plain_loop_s_bits(tmp_path, isa, threads, monkeypatch,
                                                         body):
    # fp16 loads and stores converted a tile at a time (vcvtph2ps/vcvtps2ph): contiguous ones
    # in place, strided and broadcast ones through a copy; a reduction whose fp16 input is
    # kept in a row buffer; a row of pieces (rotate_half); rows past a tile with a tail; NaN,
    # inf, fp16 subnormals and values that round to inf. Same bits as the plain loop (NaN as
    # NaN; sums within rounding), and eager's values.
    if not _compiler_takes_vector_tiles(tmp_path):
        pytest.skip("the C compiler takes no vector tiles on this machine")
    x = (torch.randn(6, 700) * 3).half()
    x[0, :6] = torch.tensor([float("nan"), float("inf"), -float("inf"), 6e-8, -3e-6, 65504.0])
    y = (torch.randn(700, 6) * 3).half().t()  # strided along the row
    w = torch.randn(700).half()
    long = (torch.randn(2, 2 * c_render.VEC_TILE + 77) * 2).half()

    def rotary(x):
        a, b = x[..., :350], x[..., 350:]
        return x * 0.5 + torch.cat([-b, a], -1) * 2.0

    # The last field: whether vector code takes the fp16 loops (not a strided load: it keeps
    # its tiles; a row of pieces does, each piece's loads at its own offset).
    cases = [(lambda x, y: x + y, (x, y), lambda: x + y, False, False),
             (lambda x, w: (x.float() * 300.0 + w).half(), (x, w),
              lambda: (x.float() * 300.0 + w).half(), False, True),
             (lambda x: x - x.mean(-1, keepdim=True), (x,), lambda: x - x.mean(-1, keepdim=True),
              True, True),
             (lambda x: torch.softmax(x, -1), (long,), lambda: torch.softmax(long, -1), True, True),
             (lambda x, w: torch.nn.functional.layer_norm(x, (700,), w, w), (x, w),
              lambda: torch.nn.functional.layer_norm(x.float(), (700,), w.float(), w.float()).half(),
              True, True),
             (rotary, (x,), lambda: rotary(x), False, True)]
    for fn, args, eager, sums, vector in cases:
        got, plain, source = _tiles_and_plain(fn, args, monkeypatch)
        vector = vector and body == "vector"
        assert ("fj_vsth(" in source) == vector, source
        if not vector:
            assert ("fj_h2f_tile(" in source or "fj_h2f_sum_tile(" in source), source
            assert "fj_f2h_tile(" in source, source
            assert any(f"{name}(" in source for name in ("fj_sum_tile", "fj_h2f_sum_tile",
                                                         "fj_exp_sum_tile")) == sums
        _assert_same_bits(got, plain, sums)
        assert_close_to_eager(got, eager())


def test_fp16_loops_as_vector_code_give_the_plain_loop_s_bits(tmp_path, isa, threads, monkeypatch):
    # fp16 loops as explicit vector code (vector_body): loads and stores convert in the
    # register, sums add into four vector accumulators, and the rest of the row under a vector
    # is the plain loop. An RMSNorm rounding each step as eager does, a residual + layer norm
    # (two outputs), SwiGLU (exp and a rounding of its result), relu, maximum and minimum (NaN
    # wins), abs, a division, bf16 rounding and stores, comparisons and where; rows of 1000 (a tail of 8), 64 (whole blocks of four vectors),
    # 77 and 3 (only the plain rest); and bf16 loops that sum loads (x - mean, a layer norm).
    # NaN, inf, -0.0, fp16 subnormals and values that round to inf. The plain loop's bits (sums
    # within rounding) and eager's values.
    if not _compiler_takes_vector_tiles(tmp_path):
        pytest.skip("the C compiler takes no vector tiles on this machine")

    def rms(x, y, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    def residual_ln(x, y, w):
        h = x + y
        return h, torch.nn.functional.layer_norm(h, (h.shape[-1],), w, w, 1e-5)

    def swiglu(x, y, w):
        return torch.nn.functional.silu(x) * y

    def masked(x, y, w):  # comparisons, not/and/or, isnan, where, a mask as a number
        m = ((x > y) & ~torch.isnan(y)) | (x == 0) | (y <= -2.0)
        return torch.where(m, x * w, y), m.to(x.dtype) * 2 + (x != y).to(x.dtype)

    def mixed(x, y, w):  # bf16 rounding and stores beside fp16 loads
        return (x.float() * y.to(torch.bfloat16).float()).to(torch.bfloat16)

    def pointwise(x, y, w):  # (each op's NaN its own output's)
        return torch.maximum(torch.relu(x), y), torch.minimum(x, y).abs() / w - y

    for n in (1000, 64, 77, 3):
        x = (torch.randn(6, n) * 3).half()
        y = (torch.randn(6, n) * 3).half()
        w = torch.randn(n).half()
        x[0, : min(n, 6)] = torch.tensor([float("nan"), float("inf"), -float("inf"), 6e-8, -0.0,
                                          65504.0])[: min(n, 6)]
        y[1, n - 1], y[2, 0], y[2, n // 2] = float("nan"), -0.0, float("nan")
        y[4, : min(n, 4)] = -2.0  # masked's threshold, exactly
        x[4, 1 % n] = y[4, 1 % n]
        x[3, :] = 60000.0  # squares and sums that overflow fp16
        for fn, sums in ((rms, True), (residual_ln, True), (swiglu, False), (pointwise, False),
                         (mixed, False), (masked, False)):
            got, plain, source = _tiles_and_plain(fn, (x, y, w), monkeypatch)
            # (a row of 3 is under a vector; SwiGLU's loop takes all 18 points, but pointwise's
            # reads w broadcast over them: its tiles copy it)
            assert ("fj_vldh(" in source) == (n >= 8 or fn in (swiglu, mixed)), source
            if fn is masked and n >= 8:
                assert "fj_vsel(" in source and "const fj_vi " in source, source
            _assert_same_bits(got, plain, sums=sums, atol=1e-6 if fn is residual_ln else 1e-30)
            rtol = 4e-3 if fn is rms else None  # (see test_kernels_with_big_outputs_stream...)
            expected = fn(x, y, w)
            if fn is residual_ln:  # eager's fp16 layer norm of the row of 60000s gives 2 * w
                h = x + y
                expected = h, torch.nn.functional.layer_norm(h.float(), (n,), w.float(), w.float(),
                                                             1e-5).half()
            assert_close_to_eager(got, expected, rtol=rtol)
        # bf16: loops that sum loads and neither round to bf16 nor store bf16 (x - mean's and a
        # layer norm's sums); their stores only where the CPU has AVX512-BF16 (FJ_BF16_PAIRS)
        xb, wb = x.bfloat16(), w.bfloat16()
        big = xb.clone()
        big[5, :] = 3.0e38  # a sum that overflows fp32: inf, and x - inf, as eager's
        # (eager's bf16 layer norm of the row of 60000s is off as its fp16 one is: in fp32)
        ln_fp32 = torch.nn.functional.layer_norm(xb.float(), (n,), wb.float(), wb.float()).bfloat16()
        for fn, args, expected in (
                (lambda x, w: x - x.mean(-1, keepdim=True), (big, wb), big - big.mean(-1, keepdim=True)),
                (lambda x, w: torch.nn.functional.layer_norm(x, x.shape[-1:], w, w), (xb, wb), ln_fp32)):
            got, plain, source = _tiles_and_plain(fn, args, monkeypatch)
            assert ("fj_vldbf(" in source) == (n >= 8), source
            # (and rows under 96 values and no whole number of vectors on AVX-512: 77)
            others = scalar_form(source, ("FJ_VREST", "FJ_BF16_PAIRS"))
            assert ("fj_vstbf(" in source) == ("fj_vstbf2(" in source) == (n >= 8), source
            assert "fj_vstbf(" not in others and "fj_round_bfv(" not in others, source
            _assert_same_bits(got, plain, sums=True, atol=1e-6)
            assert_close_to_eager(got, expected)


@pytest.mark.parametrize("vector_body", [True, False])
def test_fp16_loops_that_draw_random_numbers_convert_in_vector_code(tmp_path, isa, threads,
                                                                    monkeypatch, vector_body):
    # Dropout+add in fp16: the loop over each tile of random numbers is vector code that reads
    # the tile's numbers, converts its fp16 loads and stores in the register and rounds with
    # F16C (3.1x faster than the tiles below, which were 2.5x faster than the plain loop's
    # integer forms); with VECTOR_BODY off, it converts in vector tiles. Rows of 700 (tiles
    # with a tail), NaN and inf. The plain loop's bits, and eager's formula given the mask.
    monkeypatch.setattr(c_render, "VECTOR_BODY", vector_body)
    if not _compiler_takes_vector_tiles(tmp_path):
        pytest.skip("the C compiler takes no vector tiles on this machine")
    x, y = (torch.randn(60, 700) * 3).half(), torch.randn(60, 700).half()
    x[0, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    x[1, :4] = torch.tensor([65504.0, -65504.0, 6.0e-8, -6.0e-8])  # rounds to inf, to subnormals

    def dropout_add(x, y):
        return torch.nn.functional.dropout(x, 0.25, training=True) + y

    got, plain, source = _tiles_and_plain(dropout_add, (x, y), monkeypatch, seed=5)
    assert "fj_rand_fill(" in source
    if vector_body:
        assert "fj_vld(fj_u_" in source and "fj_round_hv(" in source and "fj_vldh(" in source, source
    else:
        assert "fj_h2f_tile(" in source and "fj_f2h_tile(" in source, source
    _assert_same_bits(got, plain)
    torch.manual_seed(5)
    mask, _ = run_kernels(dropout_add, torch.ones_like(x), torch.zeros_like(y))
    # Eager's ops, each rounded to fp16: the scale 1 / 0.75, the dropout, the add.
    assert_close_to_eager(got, x * ((mask != 0).half() / 0.75) + y)
    assert abs((mask != 0).float().mean().item() - 0.75) < 0.02


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_short_half_pieces_of_a_row_convert_eight_at_a_time(tmp_path, isa, threads, monkeypatch,
                                                            dtype):
    # A rotary embedding over rows of 16 (pieces of 8) and of 24 (pieces of 12: a vector of 8,
    # then one of the last 4), and a relu and a select beside it: each piece loads, rounds and stores
    # fp16 (bf16) eight values a vector (fp16 over 262144 rows of 16: 0.73 -> 18.5 GB/s, where
    # each value rounded through fj_f2h's integer form). NaN, ±inf, values that round to inf,
    # subnormals and -0.0. The plain loop's bits, and eager's values.
    if not _compiler_takes_vector_tiles(tmp_path, "!defined(FJ_ROWS8)"):
        pytest.skip("the C compiler takes no eight-float vectors on this machine")
    big, tiny = (60000.0, 3e-8) if dtype == torch.float16 else (3e38, 1e-40)

    def rotary(x, cos, sin):
        half = x.shape[-1] // 2
        y = x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin
        return y, torch.where(x > 0, torch.relu(x * sin), x * 0.5)

    for n in (16, 24):
        x = (torch.randn(37, n) * 3).to(dtype)
        x[0, :5] = torch.tensor([float("nan"), float("inf"), -float("inf"), big, -0.0])
        x[1, n // 2:n // 2 + 3] = torch.tensor([tiny, -tiny, -big])
        cos, sin = torch.randn(n).to(dtype), torch.randn(n).to(dtype)
        cos[3], sin[n - 2] = 4.0, tiny
        got, plain, source = _tiles_and_plain(rotary, (x, cos, sin), monkeypatch)
        load = "fj_v8ldh(" if dtype == torch.float16 else "fj_v8ldbf("
        assert source.count(load) >= 4 and "fj_v8sel(" in source and "fj_v8relu(" in source, source
        assert ("const int fj_n = 4;" in source) == (n == 24), source
        _assert_same_bits(got, plain)
        assert_close_to_eager(got, rotary(x, cos, sin))


@pytest.mark.parametrize("n", [16, 24, 48])
def test_a_short_bf16_row_s_max_and_min_fold_one_vector_of_lanes(tmp_path, isa, threads,
                                                                    monkeypatch, n):
    # A max or min over a bf16 row under 64 values is vector code: a vector of lanes, a NaN
    # flag of lanes, folded in halves (gcc's loop stored a converted row of 16 in two halves
    # and read it back whole: a bf16 softmax over rows of 16 or 48 1.35x faster). Rows of 24:
    # the last 8 values in the loop on AVX-512. NaN (in the vector and in the rest), ±inf,
    # rows of -inf, of zeros and -0.0. The plain loop's bits, and eager's values.
    if not _compiler_takes_vector_tiles(tmp_path):
        pytest.skip("the C compiler takes no vector tiles on this machine")
    x = (torch.randn(37, n) * 3).bfloat16()
    x[0, 5], x[1], x[2, 3], x[3] = float("nan"), -float("inf"), float("inf"), 0.0
    x[3, ::2], x[4, n - 1], x[5, :n // 2] = -0.0, float("nan"), -float("inf")
    cases = [(lambda x: x.amax(-1), False), (lambda x: x.amin(-1), False),
             (lambda x: x - x.amax(-1, keepdim=True), False),
             (lambda x: torch.softmax(x, -1), True), (lambda x: torch.log_softmax(x, -1), True)]
    for fn, sums in cases:
        got, plain, source = _tiles_and_plain(fn, (x,), monkeypatch)
        assert "fj_lanes_max(" in source or "fj_lanes_min(" in source, source
        _assert_same_bits(got, plain, sums=sums)
        assert_close_to_eager(got, fn(x))
    # Not fp16 rows, nor bf16 rows of 64 or more (as fast or faster in gcc's loop); but for
    # rows under 128 values that are no whole number of vectors, on AVX-512 (FJ_VREST)
    for y in (x.half(), torch.randn(5, 128).bfloat16()):
        _, _, source = _tiles_and_plain(lambda x: torch.softmax(x, -1), (y,), monkeypatch)
        assert "fj_lanes_max(" not in scalar_form(source, ("FJ_VREST",)), source
        assert ("fj_lanes_max(" in source) == (y.shape[-1] == 24), source


def test_an_fp16_row_s_last_values_past_the_vectors_round_with_f16c(tmp_path, isa, threads,
                                                                     monkeypatch):
    # The values of a row past its last whole vector, in a loop that rounds fp16 or over 8 or
    # more of them, round and store with F16C's scalar conversions (fj_round_h1, fj_f2h1), not
    # fj_f2h's integer form (an fp16 RMSNorm over rows of 77 2.6x faster). RMSNorm over rows of
    # 77 and 100, a layer norm over rows of 40, with NaN, inf, a value that rounds to inf,
    # subnormals and -0.0 among the last values. The plain loop's bits, and eager's values.
    if not _compiler_takes_vector_tiles(tmp_path):
        pytest.skip("the C compiler takes no vector tiles on this machine")

    def rms_norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    def layer_norm(x, w):
        return torch.nn.functional.layer_norm(x, x.shape[-1:], w, w)

    for fn, n in ((rms_norm, 77), (rms_norm, 100), (layer_norm, 40)):
        g = torch.Generator().manual_seed(n)
        # eager's values, on random rows; and, on rows of small integers (RMSNorm's sums of
        # squares are then exact in any order), the plain loop's bits everywhere
        for integers in (False, True):
            x = torch.randint(-8, 9, (19, n), generator=g).half() if integers else \
                (torch.randn(19, n, generator=g) * 3).half()
            w = (torch.randn(n, generator=g) * 2).half()
            x[0, n - 1], x[1, n - 2], x[2, n - 3], x[3, n - 1] = float("nan"), float("inf"), 6e-8, -0.0
            x[4], x[4, n - 1], w[n - 1] = 0.0, 8.0, 12000.0  # row 4 rounds to inf there
            got, plain, source = _tiles_and_plain(fn, (x, w), monkeypatch)
            assert "fj_f2h1((float)" in source and "for (int64_t r = fj_r; r <" in source, source
            _assert_same_bits(got, plain, sums=fn is layer_norm or not integers)
            assert got[4, n - 1].isinf()
            if not integers and fn is layer_norm:
                assert_close_to_eager(got, fn(x, w))
            elif not integers:
                # eager's fp16 RMSNorm is up to 3 ulps off the float64 result here (ours 1)
                exact = fn(x.double(), w.double()).half()
                torch.testing.assert_close(got, exact, rtol=2e-3, atol=1e-3, equal_nan=True)

def test_bf16_row_sums_add_in_vector_tiles(tmp_path, isa, threads, monkeypatch):
    # A sum over bf16 values read from memory adds a tile at a time (fj_sum_tile), where an fp32
    # one stays a plain loop but over rows of 16 or 32: rows of 128 (a layer norm 1.5x
    # faster) and of 1000 (a tail), NaN and inf. The plain loop's values within rounding, and
    # eager's.
    monkeypatch.setattr(c_render, "VECTOR_BODY", False)  # the tiles' path, not vector code
    if not _compiler_takes_vector_tiles(tmp_path):
        pytest.skip("the C compiler takes no vector tiles on this machine")
    for n in (128, 1000):
        x = (torch.randn(5, n) * 3).bfloat16()
        x[1, 3], x[2, 0] = float("nan"), float("inf")
        w = torch.randn(n).bfloat16()
        cases = [(lambda x: x - x.mean(-1, keepdim=True), (x,)),
                 (lambda x, w: torch.nn.functional.layer_norm(x, x.shape[-1:], w, w), (x, w)),
                 (lambda x: x * torch.rsqrt((x.float() ** 2).mean(-1, keepdim=True) + 1e-6), (x,))]
        for fn, args in cases:
            got, plain, source = _tiles_and_plain(fn, args, monkeypatch)
            assert "fj_sum_tile(" in source or "fj_bf2f_sum_tile(" in source, source
            _assert_same_bits(got, plain, sums=True)
            assert_close_to_eager(got, fn(*args))
    got, plain, source = _tiles_and_plain(lambda x: x - x.mean(-1, keepdim=True),
                                          (torch.randn(5, 128),), monkeypatch)
    assert "fj_sum_tile(" not in source, source
    # fp32 rows of 16 or 32 values do (a layer norm over rows of 16 1.4x faster), not rows of
    # 20 or 24 (a tail).
    for n in (16, 20, 24, 32):
        x = torch.randn(9, n) * 3
        x[1, 3], x[2, 0] = float("nan"), float("inf")
        got, plain, source = _tiles_and_plain(
            lambda x: torch.nn.functional.layer_norm(x, x.shape[-1:]), (x,), monkeypatch)
        assert ("fj_sum_tile(" in source) == (n % 16 == 0), source
        _assert_same_bits(got, plain, sums=True, atol=1e-6)
        assert_close_to_eager(got, torch.nn.functional.layer_norm(x, x.shape[-1:]))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_sums_of_half_squares_add_as_the_tile_converts(tmp_path, isa, threads, monkeypatch, dtype):
    # An RMSNorm over fp16 rows (and bf16 rows that convert in tiles) sums its squares as each
    # tile converts the row (fj_h2f_sum_tile_squares / fj_bf2f_sum_tile_squares): rows of 1024,
    # of 1000 (a tail), of 24 (short rows), NaN and inf. The same bits as the loop that stored
    # the squares for fj_sum_tile (SQUARE_SUMS off), the plain loop's values within rounding,
    # and eager's.
    monkeypatch.setattr(c_render, "VECTOR_BODY", False)  # the tiles' path, not vector code
    if not _compiler_takes_vector_tiles(tmp_path):
        pytest.skip("the C compiler takes no vector tiles on this machine")
    name = "fj_h2f_sum_tile_squares(" if dtype == torch.float16 else "fj_bf2f_sum_tile_squares("

    def rms_norm(x, w):  # as transformers' Llama writes it: the squares in fp32
        h = x.float()
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w

    for n in (1024, 1000, 24):
        x = (torch.randn(7, n) * 3).to(dtype)
        x[1, 3], x[2, 0], x[3, 5] = float("nan"), float("inf"), -float("inf")
        w = torch.randn(n).to(dtype)
        got, plain, source = _tiles_and_plain(rms_norm, (x, w), monkeypatch)
        # (bf16 rows convert in tiles only where short and no whole number of vectors: over
        # rows of 1024 a bf16 RMSNorm ran as fast through gcc's loop)
        assert (name in source) == (dtype == torch.float16 or n == 24), source
        _assert_same_bits(got, plain, sums=True)
        assert_close_to_eager(got, rms_norm(x, w))
        monkeypatch.setattr(c_render, "SQUARE_SUMS", False)
        c_runtime.clear_memory_cache()
        two_passes, backend = run_kernels(rms_norm, x, w)
        monkeypatch.setattr(c_render, "SQUARE_SUMS", True)
        c_runtime.clear_memory_cache()
        assert name not in "".join(k.source for k in backend.kernels)
        assert torch.equal(got.nan_to_num(), two_passes.nan_to_num())
        assert torch.equal(got.isnan(), two_passes.isnan())


def test_bf16_loads_of_short_rows_convert_in_vector_tiles(tmp_path, isa, threads, monkeypatch):
    # A loop that sums or takes exp over bf16 rows shorter than 64 and no multiple of 32 (8,
    # 16, 24, 48) converts its bf16 loads a vector at a time into its tile (fj_bf2f_tile,
    # fj_bf2f_sum_tile; 2.4x faster over rows of 16), where rows of 32 and 128 keep gcc's
    # loop. NaN, inf and -inf; the plain loop's values (sums within rounding), and eager's.
    if not _compiler_takes_vector_tiles(tmp_path):
        pytest.skip("the C compiler takes no vector tiles on this machine")
    for n in (8, 16, 24, 48, 32, 128):
        x = (torch.randn(40, n) * 3).bfloat16()
        x[1, 3], x[2, 0], x[3, :] = float("nan"), float("inf"), float("-inf")
        w = torch.randn(n).bfloat16()
        cases = [(lambda x: torch.softmax(x, -1), (x,)),
                 (lambda x: torch.log_softmax(x, -1), (x,)),
                 (lambda x: x - x.mean(-1, keepdim=True), (x,)),
                 (lambda x, w: torch.nn.functional.layer_norm(x, x.shape[-1:], w, w), (x, w))]
        for fn, args in cases:
            got, plain, source = _tiles_and_plain(fn, args, monkeypatch)
            assert ("fj_bf2f_tile(" in source or "fj_bf2f_sum_tile(" in source) == (n % 32 != 0), source
            # (a bf16 x - mean near 0 may round one ulp apart: its mean adds in another order)
            _assert_same_bits(got, plain, sums=True, atol=1e-5)
            assert_close_to_eager(got, fn(*args))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_half_inputs_every_row_reads_alike_are_converted_once_per_call(threads, isa, monkeypatch,
                                                                       dtype):
    # A weight and bias broadcast along the rows (over two outer dimensions), a pointwise
    # scale, and a weight over a two-dimensional row: each is converted once into an fp32
    # array h<i> before the row loop. An input that varies along the rows is not. The same
    # values as the per-row conversions (the vector tiles on or off), and eager's.
    x = (torch.randn(3, 5, 96) * 3).to(dtype)
    x[0, 0, :3] = torch.tensor([float("nan"), float("inf"), -3e-6])
    w, b = torch.randn(96).to(dtype), torch.randn(96).to(dtype)
    w[5] = float("inf")
    x2, w2 = torch.randn(6, 8, 12).to(dtype), torch.randn(8, 12).to(dtype)
    convert = "fj_h2f(" if dtype == torch.float16 else "fj_bf2f("
    cases = [(lambda x, w, b: torch.nn.functional.layer_norm(x, (96,), w, b), (x, w, b), 2,
              lambda: torch.nn.functional.layer_norm(x.float(), (96,), w.float(),
                                                     b.float()).to(dtype)),
             (lambda x, w: x * w + 1.0, (x, w), 1, lambda: (x.float() * w.float() + 1.0).to(dtype)),
             (lambda x, w: torch.nn.functional.layer_norm(x, (8, 12), w), (x2, w2), 1,
              lambda: torch.nn.functional.layer_norm(x2.float(), (8, 12), w2.float()).to(dtype)),
             (lambda x, y: x * y, (x, x.flip(0)), 0, lambda: x * x.flip(0))]
    for fn, args, shared, eager in cases:
        got, plain, source = _tiles_and_plain(fn, args, monkeypatch)
        body = scalar_form(source)
        arrays = re.findall(r"float (h\d+)\[\d+\] __attribute__", body)
        assert len(arrays) == shared, source
        for name in arrays:  # filled before the row loop, read in it
            rows = re.search(r"for \(int64_t (fj_)?x = 0;", body).start()
            assert body.index(f"{name}[r] = {convert}") < rows, source
            assert f"= {name}[r];" in body, source
        _assert_same_bits(got, plain, sums="reduction(+" in source)
        assert_close_to_eager(got, eager())


def test_fp16_pointwise_loops_take_tiles_kept_in_registers(tmp_path, isa, monkeypatch):
    # A loop that only converts fp16 (an add over rows of 700: 21 tiles of 32 and one of 28)
    # takes tiles of REG_TILE points; one that takes a sigmoid keeps STORE_TILE tiles. The
    # plain loop's bits either way.
    monkeypatch.setattr(c_render, "VECTOR_BODY", False)  # the tiles' path, not vector code
    if not _compiler_takes_vector_tiles(tmp_path):
        pytest.skip("the C compiler takes no vector tiles on this machine")
    x, y = (torch.randn(6, 700) * 3).half(), (torch.randn(6, 700) * 3).half()
    reg, store = c_render.REG_TILE, c_render.STORE_TILE
    for fn, tile in ((lambda x, y: x + y, reg),
                     (lambda x, y: torch.nn.functional.silu(x) * y, store)):
        got, plain, source = _tiles_and_plain(fn, (x, y), monkeypatch)
        assert f"float f0[{tile}]" in source, source
        assert (f"fj_v + {reg} <= " in source) == (tile == reg), source
        _assert_same_bits(got, plain)
        assert_close_to_eager(got, fn(x, y))


def test_kernels_built_for_a_cpu_without_avx512_match_the_tiles(monkeypatch):
    # A machine without AVX-512 (most laptops) compiles 8-float AVX2 tiles (16-float here):
    # softmax and log-softmax (their row-ahead tile), fp16 and bf16 layer norms (weights
    # converted once), an fp16 add and rotary (register tiles), GELU, SwiGLU in bf16. Each
    # kernel built with -mno-avx512f gives this machine's values (sums within rounding) and
    # eager's.
    x = torch.randn(6, 1000) * 4
    x[1, 3] = float("nan")
    h = (torch.randn(6, 1000) * 3).half()
    b16 = torch.randn(6, 1000).bfloat16()
    w, b = torch.randn(1000), torch.randn(1000)

    def rotary(x):
        a, c = x[..., :500], x[..., 500:]
        return x * 0.5 + torch.cat([-c, a], -1) * 2.0

    cases = [(softmax, (x,)), (lambda x: torch.log_softmax(x, -1), (x,)),
             (lambda x, w, b: torch.nn.functional.layer_norm(x, (1000,), w, b),
              (h, w.half(), b.half())),
             (lambda x, w, b: torch.nn.functional.layer_norm(x, (1000,), w, b),
              (b16, w.bfloat16(), b.bfloat16())),
             (lambda x, y: x + y, (h, h.flip(0))), (rotary, (h,)),
             (lambda x, w: torch.nn.functional.gelu(x + w), (x, w)),
             (lambda x, y: torch.nn.functional.silu(x) * y, (b16, b16.flip(0)))]
    for fn, args in cases:
        here, _ = run_kernels(fn, *args)
        with monkeypatch.context() as m:
            m.setattr(c_runtime, "FLAGS", (*c_runtime.FLAGS, "-mno-avx512f"))
            c_runtime.clear_memory_cache()  # the same functions, built again with the flag
            built = c_runtime.c_counters["compiles"] + c_runtime.c_counters["disk_hits"]
            plain, _ = run_kernels(fn, *args)
            assert c_runtime.c_counters["compiles"] + c_runtime.c_counters["disk_hits"] > built
        c_runtime.clear_memory_cache()
        _assert_same_bits(plain, here, sums=True)
        assert_close_to_eager(plain, fn(*args))


@pytest.mark.parametrize("source", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_floats_out_of_an_integer_s_range_convert_as_eager_s(source):
    # C leaves a float out of an integer's range (NaN, inf, 1e30) undefined, and gcc folded
    # (float)(int64_t)x into truncf(x): inf.long().float() stayed inf where eager gives
    # -9.2e18. Each conversion takes x86's value, as eager's: NaN and out of range give the
    # width's minimum; int16/int8 the low bits of int32's; uint8 the low bits of int64's.
    # Back to a float, an integer zero is +0.0: gcc folded the round trip into truncf(x), and
    # 1 / int(-0.5) gave -inf where eager gives +inf (fuzzer program 381000000962).
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 1e30, -1e30, 3e9, -3e9,
                      2.0**31, -2.0**31, 2.0**63, -2.0**63, 1e19, -100.7, 2.5, -0.0, 70000.3,
                      -0.5, -0.99, 0.5],
                     dtype=source).repeat(70)  # vector loops, and their tails
    for target in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        fns = [lambda x, t=target: (x * 1.0).to(t), lambda x, t=target: (x * 1.0).to(t).to(source) + 1,
               lambda x, t=target: 1.0 / (x * 1.0).to(t).to(source)]
        for fn in fns:
            got, backend = run_kernels(fn, x)
            assert len(backend.kernels) == 1
            assert torch.equal(got, fn(x)), (target, got, fn(x))


def test_fp16_conversions_give_torch_s_bits_for_every_half_and_a_dense_sample_of_floats():
    # fp16 -> fp32 for all 65536 halfs, and fp32 -> fp16 for every 4099th fp32 bit pattern
    # plus the rounding edges of fp16's range (its subnormals, the largest finite, the ties),
    # through C kernels (integer arithmetic on x86 without AVX512-FP16): torch's bits, NaN
    # kept (as a NaN of the same sign).
    halfs = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.float16)
    got, backend = run_kernels(lambda h: P.convert_element_type.default(h, torch.float32) * 1.0, halfs)
    assert len(backend.kernels) == 1
    want = halfs.float()
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got[~want.isnan()].view(torch.int32), want[~want.isnan()].view(torch.int32))
    bits = torch.arange(0, 2**32, 4099, dtype=torch.int64)
    bits = torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32)
    edges = torch.cat([torch.linspace(-7e-5, 7e-5, 100001), torch.linspace(65000, 65600, 20001),
                       halfs.float() + halfs.float().abs() * 2**-11,  # ties between halfs
                       halfs.float() * (1 + 2**-12)])
    floats = torch.cat([bits.view(torch.float32), edges, -edges])
    got, backend = run_kernels(lambda x: P.convert_element_type.default(x * 1.0, torch.float16), floats)
    assert len(backend.kernels) == 1
    want = floats.half()
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got[~want.isnan()].view(torch.int16), want[~want.isnan()].view(torch.int16))
    assert torch.equal(got[want.isnan()].signbit(), floats[want.isnan()].signbit())


def test_finding_the_compiler_keeps_the_warnings_shown_once(monkeypatch):
    # subprocess looked a bare "cc" up with os.get_exec_path(), which sets a warnings filter:
    # that resets Python's once-per-location records, and a warning in the user's loop showed
    # again after the first compile.
    import warnings

    monkeypatch.setattr(c_runtime, "_compilers", {})

    def warn():
        warnings.warn("framejit-test: shown once per location", UserWarning, stacklevel=1)

    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("default")
        warn()
        c_runtime.find_compiler()
        warn()
    assert [str(w.message) for w in shown].count("framejit-test: shown once per location") == 1
