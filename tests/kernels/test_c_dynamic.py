"""C kernels whose sizes are known only at run time: one compiled function serves every size.

Each test takes a kernel the pipeline builds, makes some of its box dimensions run-time sizes
(``tests/kernels/symbolic.py``) and calls the C launcher on many sizes: 1, odd sizes that are no
multiple of a vector width, and sizes on both sides of the parallel threshold, at one and two
threads. Results are compared with eager torch, with the reference interpreter, and (where
noted) bit for bit with the static C kernel of the same sizes (where both vectorize alike: a
reduced dimension whose stride is 1 only at run time, ``ks1 == 1``, adds its lanes in another
order than the static kernel's stride-1 loop). The ``thresholds`` fixture runs
each test a second time with tiny :data:`~framejit.kernels.c_render.PARALLEL_MIN` and
:data:`~framejit.kernels.c_render.SUM_CHUNK`, so that small shapes take the parallel paths too.
"""

import sys

import pytest
import torch

from framejit.kernels import c_render, c_runtime
from framejit.kernels.c_runtime import CLauncher
from framejit.kernels.ir import evaluate
from framejit.kernels.reference import ReferenceLauncher
from framejit.testing import TOLERANCES, assert_close_to_eager

from .conftest import scalar_form
from .symbolic import dynamic_launcher
from .test_kernels import A, P, softmax


@pytest.fixture(autouse=True)
def cpu_only(device):
    if device != "cpu":
        pytest.skip("C kernels run on CPU tensors")


#: (PARALLEL_MIN, SUM_CHUNK): the real ones, and tiny ones that small shapes cross.
_THRESHOLDS = {"real_thresholds": (c_render.PARALLEL_MIN, c_render.SUM_CHUNK),
               "tiny_thresholds": (64, 16)}


@pytest.fixture(params=list(_THRESHOLDS))
def thresholds(request, monkeypatch):
    """The renderer's thresholds for the kernels built in this test (read when one renders)."""
    parallel_min, sum_chunk = _THRESHOLDS[request.param]
    monkeypatch.setattr(c_render, "PARALLEL_MIN", parallel_min)
    monkeypatch.setattr(c_render, "SUM_CHUNK", sum_chunk)
    return parallel_min


def sizes_of(launcher, box):
    """The run-time sizes to pass for box sizes ``box`` (``ks<d>`` is box dimension d)."""
    return [box[int(s.name[2:])] for s in launcher.kernel.symbols()]


def static_twin(launcher, box):
    """The static C kernel of ``launcher``'s kernel at box sizes ``box``."""
    values = {s.name: n for s, n in zip(launcher.kernel.symbols(), sizes_of(launcher, box))}
    at = lambda exprs: tuple(evaluate(e, values) for e in exprs)  # noqa: E731
    outputs = [(at(size), at(stride), dtype) for size, stride, dtype in launcher.outputs]
    return CLauncher(launcher.kernel.specialize(values), outputs, "cpu", launcher.seed_index)


def run_sizes(fn, example, dims, boxes, make_inputs, *, twins=(), rtol=None, atol=None):
    """Build ``fn``'s kernel on ``example`` with box dimensions ``dims`` made run-time sizes, then
    call it at each box size of ``boxes`` on ``make_inputs(box)``: the result must match eager
    torch and the reference interpreter, come from the one compiled function, and, at the boxes
    in ``twins``, equal the static kernel's bit for bit. Returns the launcher."""
    launcher, _, _ = dynamic_launcher(fn, example, dims, CLauncher)
    assert launcher.kernel.is_dynamic
    reference = ReferenceLauncher(launcher.kernel, launcher.outputs, "cpu", launcher.seed_index)
    first = None
    for box in boxes:
        inputs = make_inputs(box)
        sizes = sizes_of(launcher, box)
        got = launcher(*inputs, *sizes)
        if first is None:  # the one build: every later size runs the same function
            first = dict(c_runtime.c_counters), launcher._fast.__globals__["_address"]
        assert (dict(c_runtime.c_counters), launcher._fast.__globals__["_address"]) == first
        try:
            assert_close_to_eager(got, fn(*inputs), rtol=rtol, atol=atol)
            expected = reference(*inputs, *sizes)
            for g, e in zip(got if isinstance(got, tuple) else (got,),
                            expected if isinstance(expected, tuple) else (expected,)):
                tol = {} if rtol is None else {"rtol": rtol, "atol": atol}
                torch.testing.assert_close(g, e, equal_nan=True, **tol)
        except AssertionError as e:
            raise AssertionError(f"at box sizes {box}: {e}") from e
    for box in twins:
        inputs = make_inputs(box)
        got = launcher(*inputs, *sizes_of(launcher, box))
        want = static_twin(launcher, box)(*inputs)
        for g, w in zip(got if isinstance(got, tuple) else (got,),
                        want if isinstance(want, tuple) else (want,)):
            assert torch.equal(g, w) or torch.equal(g.isnan(), w.isnan()) and torch.equal(
                g[~g.isnan()], w[~w.isnan()]), f"at box sizes {box}: differs from the static kernel"
    return launcher


#: Box sizes (rows, row length) for 2-D kernels: 1, odd lengths, and both sides of the real
#: parallel threshold (a single long row, many rows).
BOXES_2D = [(1, 1), (3, 7), (5, 33), (1, 17), (9, 1), (2, 129), (40, 1000), (1, 40000), (3, 12289)]


def test_pointwise_with_broadcasting(threads, thresholds):
    def fn(x, b):
        return A.add.Tensor(A.mul.Tensor(x, 2.0), b)

    launcher = run_sizes(fn, (torch.randn(4, 6), torch.randn(6)), [0, 1], BOXES_2D,
                         lambda box: (torch.randn(box), torch.randn(box[1])))
    # The row loop runs to a run-time bound and still carries its simd pragma.
    assert "#pragma omp simd\n" in launcher.source
    assert "r < FJ_MIN(p * fj_per + fj_per, ks1);" in launcher.source


def test_softmax_over_a_dynamic_last_dim(threads, thresholds):
    launcher = run_sizes(softmax, (torch.randn(4, 6),), [0, 1], BOXES_2D,
                         lambda box: (torch.randn(box) * 3,), twins=[(1, 40000), (2, 129)])
    source = scalar_form(launcher.source)  # the loops without vector tiles
    # Three ways to run, chosen at run time: one row cut in parts, rows in parallel, plain.
    assert f"if (ks0 == 1 && ks1 >= {thresholds}) {{" in source
    assert f"}} else if (nthreads > 1 && (ks0*ks1) >= {thresholds}) {{" in source
    assert source.count("#pragma omp parallel num_threads(nthreads)") == 2
    # The loop nest is rendered once, in the function over a range of rows all three call
    # (gcc then vectorizes each loop once); each exp is kept in the output row, whatever the
    # row's length and whether it is cut in parts.
    assert source.count("#pragma omp simd") == 3
    assert source.count(f"{launcher.cname}_rows(bufs, sizes,") == 4
    assert "(fj_scratch)" in source and source.count("fj_expf(") == 1
    assert "_rows_b(" not in source


def test_fp16_softmax_over_a_dynamic_last_dim_keeps_short_rows_exp(threads, thresholds):
    """An fp16 output row cannot hold the fp32 exp: a second copy of the nest, for rows of at
    most ROW_BUFFER, keeps it in a row buffer; longer rows compute it twice."""
    def fn(x):
        return P.convert_element_type.default(softmax(P.convert_element_type.default(x, torch.float32)),
                                              torch.float16)

    boxes = [(1, 1), (3, 7), (40, 1000), (1, 40000), (3, 12289)]
    launcher = run_sizes(fn, (torch.randn(4, 6).half(),), [0, 1], boxes,
                         lambda box: ((torch.randn(box) * 3).half(),))
    source = scalar_form(launcher.source)  # the loops without vector tiles
    # the generic nest's sum of exp, which stores nothing, adds in lanes: its blocks and the rest
    assert source.count("#pragma omp simd") == 7
    assert source.count(f"if (ks1 <= {c_render.ROW_BUFFER}) {launcher.cname}_rows_b(bufs, sizes,") == 2
    generic, capped = source.split(f"void {launcher.cname}_rows_b(")
    assert generic.count("fj_expf(") == 3 and capped.count("fj_expf(") == 1
    assert f"[{c_render.ROW_BUFFER}] __attribute__((aligned(64)))" in capped


def test_softmax_over_dynamic_rows_of_a_static_length_keeps_its_row_buffer(threads, thresholds):
    """Only the number of rows is a run-time size (a batch that changed): the row is as short
    as in the static kernel, so its exp is computed once and kept, with the same bits. With
    tiny thresholds the row is long enough to be cut in parts when it is the only one (its
    parts' numbers are constants: that kernel did not compile before), and keeps its exp in
    the output row."""
    launcher = run_sizes(softmax, (torch.randn(4, 96),), [0], [(1, 96), (7, 96), (900, 96)],
                         lambda box: (torch.randn(box) * 3,), twins=[(7, 96), (900, 96)])
    source = scalar_form(launcher.source)  # the loops without vector tiles
    cut = 96 >= thresholds  # then the exp is kept in the output row (see test_c.py)
    assert ("[96] __attribute__((aligned(64)))" in source) == (not cut)
    assert ("(fj_scratch)" in source) == cut
    assert source.count("fj_expf(") == 1
    assert ("const int64_t fj_per = " in source) == cut
    assert "_rows_b(" not in source


def test_sum_and_amax_over_dim_0(threads, thresholds):
    """An outer reduction: the reduced dimension is the slow one (stride ks1)."""
    def fn(x):
        return A.sum.dim_IntList(x, [0], True), A.amax.default(x, [0], True)

    boxes = [(1, 1), (7, 3), (33, 5), (1, 9), (1000, 40), (40000, 1), (12289, 3)]
    # Sums of thousands of fp32 values round differently from eager's (neither is exact).
    launcher = run_sizes(fn, (torch.randn(6, 4),), [0, 1], boxes, lambda box: (torch.randn(box),),
                         twins=[(1000, 40)], rtol=1e-5, atol=1e-4)
    assert len(launcher.outputs) == 2


def test_layer_norm_over_a_dynamic_last_dim(threads, thresholds):
    """Mean and variance over the row with weight and bias. The kernel takes 1/n as an input:
    a ``mean`` would bake the example's n into the kernel as a constant."""
    def fn(x, inv_n, w, b):
        mean = A.mul.Tensor(A.sum.dim_IntList(x, [-1], True), inv_n)
        d = A.sub.Tensor(x, mean)
        var = A.mul.Tensor(A.sum.dim_IntList(A.mul.Tensor(d, d), [-1], True), inv_n)
        return A.add.Tensor(A.mul.Tensor(A.mul.Tensor(d, A.rsqrt.default(A.add.Tensor(var, 1e-5))), w), b)

    def inputs(box):
        return (torch.randn(box) * 2 + 1, torch.tensor([1.0 / box[1]]), torch.randn(box[1]),
                torch.randn(box[1]))

    run_sizes(fn, inputs((4, 6)), [0, 1], BOXES_2D, inputs, twins=[(1, 40000), (40, 1000)])
    for box in [(3, 7), (40, 1000)]:  # and it is a layer norm
        x, inv_n, w, b = inputs(box)
        launcher, _, _ = dynamic_launcher(fn, inputs((4, 6)), [0, 1], CLauncher)
        torch.testing.assert_close(launcher(x, inv_n, w, b, *box),
                                   torch.nn.functional.layer_norm(x, box[1:], w, b),
                                   rtol=1e-5, atol=1e-5)


def test_fp16_rms_norm_over_a_dynamic_last_dim_runs_as_vector_code(threads, thresholds):
    """An fp16 RMSNorm (its square rounded to fp16, as eager's fp16 pow) over rows of a run-time
    length: its loops as vector code (vector_body) to a run-time bound, the rest of each row
    under a vector one masked vector (AVX-512) or the plain loop; eager's values, the
    reference's, and the static kernel's bits."""
    def fn(x, inv_n, w):
        h = P.convert_element_type.default(x, torch.float32)
        sq = P.convert_element_type.default(
            P.convert_element_type.default(A.mul.Tensor(h, h), torch.float16), torch.float32)
        r = A.rsqrt.default(A.add.Tensor(A.mul.Tensor(A.sum.dim_IntList(sq, [-1], True), inv_n), 1e-6))
        return P.convert_element_type.default(
            A.mul.Tensor(A.mul.Tensor(h, r), P.convert_element_type.default(w, torch.float32)),
            torch.float16)

    def inputs(box):
        x = (torch.randn(box) * 3).half()
        x[0, box[1] // 2] = float("inf")
        return x, torch.tensor([1.0 / box[1]]), torch.randn(box[1]).half()

    launcher = run_sizes(fn, inputs((4, 6)), [0, 1], BOXES_2D, inputs, twins=[(40, 1000), (2, 129)],
                         rtol=4e-3, atol=1e-3)
    if c_render.VECTOR_BODY:
        assert "fj_vldh(" in launcher.source and "fj_vsth(" in launcher.source


def test_argmax_and_argmin_over_a_dynamic_dim(threads, thresholds):
    def fn(x):
        return A.argmax.default(x, -1, True), A.argmin.default(x, -1, True)

    def inputs(box):
        x = torch.randn(box).round(decimals=1)  # ties: the first index wins
        if box[1] > 2:
            x[..., box[1] // 2] = float("nan")  # the first NaN wins
        return (x,)

    run_sizes(fn, inputs((4, 6)), [0, 1], BOXES_2D, inputs, twins=[(1, 40000)])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_and_outputs(dtype, threads, thresholds):
    def fn(x, b):
        wide = P.convert_element_type.default(A.add.Tensor(x, b), torch.float32)
        return P.convert_element_type.default(softmax(wide), dtype)

    rtol, atol = TOLERANCES[dtype]
    run_sizes(fn, (torch.randn(4, 6, dtype=dtype), torch.randn(6, dtype=dtype)), [0, 1], BOXES_2D,
              lambda box: (torch.randn(box, dtype=dtype), torch.randn(box[1], dtype=dtype)),
              twins=[(1, 40000), (2, 129)], rtol=rtol, atol=atol)


#: Box sizes for the 3-D kernels.
BOXES_3D = [(1, 1, 1), (2, 3, 5), (1, 7, 1), (3, 1, 9), (4, 33, 17), (2, 20000, 1), (40, 30, 30)]


def test_3d_reduction_over_the_middle_dim(threads, thresholds):
    """Rows of two dimensions (box dims 0 and 2), one not dense in the input. The row is
    strided, so the sum runs across blocks of outputs along dim 2, whose index is split by
    run-time divisions."""
    def fn(x, w):
        return A.sum.dim_IntList(A.mul.Tensor(x, w), [1], True)

    launcher = run_sizes(fn, (torch.randn(2, 4, 6), torch.randn(6)), [0, 1, 2], BOXES_3D,
                         lambda box: (torch.randn(box), torch.randn(box[2])),
                         twins=[(4, 33, 17), (40, 30, 30)])
    assert "b / ((ks2 + 15) / 16)" in launcher.source


def test_3d_pointwise_with_two_dynamic_dims(threads, thresholds):
    """Two run-time dimensions (the third static), an input broadcast along the first and last."""
    def fn(x, c):
        return A.sigmoid.default(A.sub.Tensor(x, c))

    def inputs(box):
        return torch.randn(box), torch.randn(box[1], 1)

    launcher = run_sizes(fn, (torch.randn(2, 3, 5), torch.randn(3, 1)), [0, 1],
                         [(b, n, 5) for b, n in [(1, 1), (2, 3), (1, 9), (7, 1), (3, 2500), (700, 11)]],
                         inputs)
    assert [s.name for s in launcher.kernel.symbols()] == ["ks0", "ks1"]


def test_random_numbers_match_the_static_kernel():
    """Dropout draws the same numbers at every point as the static kernel of the same sizes."""
    def fn(x):
        keep = A.ge.Scalar(A.rand_like.default(x, dtype=torch.float32), 0.5)
        return A.where.ScalarOther(keep, A.mul.Tensor(x, 2.0), 0.0)

    launcher, _, _ = dynamic_launcher(fn, (torch.randn(24),), [0], CLauncher)
    for box in [(21,), (1,), (40000,)]:
        x = torch.randn(box)
        torch.manual_seed(3)
        got = launcher(x, *box)
        torch.manual_seed(3)
        want = static_twin(launcher, box)(x)
        assert torch.equal(got, want)
    assert abs((got == 0).float().mean().item() - 0.5) < 0.02


def test_a_static_kernel_reads_no_sizes_and_a_dynamic_one_reads_each_once_per_function():
    example = (torch.randn(4, 6),)
    launcher, static, _ = dynamic_launcher(softmax, example, [0, 1], CLauncher)
    source = CLauncher(static.kernel, static.outputs, "cpu", static.seed_index).source
    assert "sizes[" not in source and "ks0" not in source
    assert "const int64_t *sizes) {" in source.splitlines()[0]
    # Once in the kernel (its choice of a way to run) and once in its function over rows.
    assert launcher.source.count("sizes[") == 4
    assert "const int64_t ks0 = sizes[0];" in launcher.source
    assert "const int64_t ks1 = sizes[1];" in launcher.source


def test_the_ctypes_launch_passes_the_sizes(monkeypatch):
    monkeypatch.setattr(c_runtime, "_launch", None)
    launcher, _, _ = dynamic_launcher(softmax, (torch.randn(4, 6),), [0, 1], CLauncher)
    for box in [(3, 7), (1, 1)]:
        x = torch.randn(box)
        assert_close_to_eager(launcher(x, *box), torch.softmax(x, -1))
    assert launcher._fast.__globals__["_launch"] is c_runtime._ctypes_launch


@pytest.mark.skipif(c_runtime._launch is None, reason="framejit._claunch is not built")
def test_launch_rejects_bad_arguments_without_calling_the_kernel():
    launcher, _, _ = dynamic_launcher(softmax, (torch.randn(4, 6),), [0, 1], CLauncher)
    x = torch.randn(3, 7)
    launcher(x, 3, 7)
    address = launcher._fast.__globals__["_address"]
    out = torch.empty(3, 7)
    launch = c_runtime._launch
    with pytest.raises(TypeError, match="argument 2 is a str"):
        launch(address, 1, "x", out, 3, 7)
    with pytest.raises(OverflowError):
        launch(address, 1, x, out, 2**70, 7)
    with pytest.raises(TypeError, match="too many sizes"):
        launch(address, 1, x, out, *([1] * 65))
    with pytest.raises(ValueError, match="null kernel address"):
        launch(0, 1, x, out, 3, 7)
    launch(address, 1, x, out, 3, 7)  # and the right call still works
    assert_close_to_eager(out, torch.softmax(x, -1))
    # No reference is kept or lost, on the good path or the error paths.
    n, refs = 10**9 + 7, (sys.getrefcount(x), sys.getrefcount(out))
    refs_n = sys.getrefcount(n)
    for _ in range(100):
        launch(address, 1, x, out, 3, 7)
        with pytest.raises(TypeError):
            launch(address, 1, x, "out", n, 7)
    assert (sys.getrefcount(x), sys.getrefcount(out), sys.getrefcount(n)) == (*refs, refs_n)


def test_a_launcher_extension_built_from_an_older_source_is_not_used(monkeypatch):
    """A stale framejit/_claunch*.so would call a kernel without its sizes: ctypes runs the
    kernels until `make` rebuilds it."""
    _claunch = pytest.importorskip("framejit._claunch")
    assert c_runtime._find_launch() is _claunch.launch
    monkeypatch.setattr(_claunch, "ABI_VERSION", c_runtime.CLAUNCH_ABI - 1)
    assert c_runtime._find_launch() is None
