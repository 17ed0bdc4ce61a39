"""What only a CUDA device shows: real Triton compilation, autotuning and its disk cache, and
the default backend choosing kernels for CUDA tensors. Skipped without CUDA (`make test-gpu`
runs them on the GPU machine)."""

import json
import os

import pytest
import torch

import framejit
from framejit.kernels import triton_runtime
from framejit.testing import assert_close_to_eager

A = torch.ops.aten

pytestmark = pytest.mark.gpu


def softmax(x):
    m = A.amax.default(x, [-1], True)
    e = A.exp.default(A.sub.Tensor(x, m))
    return A.div.Tensor(e, A.sum.dim_IntList(e, [-1], True))


def test_default_backend_runs_kernels_for_cuda_tensors():
    x = torch.randn(64, 1000, device="cuda")
    got = framejit.compile(softmax)(x)
    assert framejit.stats()["kernels"] == 1
    assert_close_to_eager(got, softmax(x))


def test_default_backend_gives_cpu_tensors_c_kernels_beside_cuda_ones():
    from framejit import record

    start = record.mark()
    framejit.compile(softmax)(torch.randn(64, 100))
    framejit.compile(softmax)(torch.randn(64, 100, device="cuda"))
    built = [e.language for e in record.events_since(start) if isinstance(e, record.KernelBuilt)]
    assert built == ["c", "triton"]
    assert framejit.stats()["kernels"] == 2


def test_autotuning_picks_a_config_and_caches_it_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("FRAMEJIT_CACHE_DIR", str(tmp_path))
    triton_runtime._best.clear()
    x = torch.randn(4096, 512, device="cuda")
    compiled = framejit.compile(softmax)
    got = compiled(x)
    assert_close_to_eager(got, softmax(x))
    best = list((tmp_path / "triton").glob("*.best.json"))
    assert len(best) == 1
    table = json.loads(best[0].read_text())
    (config,) = table.values()
    assert "XBLOCK" in config and "num_warps" in config


def test_looped_reduction_on_long_rows():
    x = torch.randn(8, 50_000, device="cuda")
    got = framejit.compile(softmax)(x)
    assert_close_to_eager(got, softmax(x), rtol=1e-4, atol=1e-6)


def test_int64_indexing_for_big_tensors():
    if torch.cuda.get_device_properties(0).total_memory < 40 * 2**30:
        pytest.skip("needs 40 GiB of GPU memory")
    x = torch.ones(2**31 + 64, device="cuda", dtype=torch.int8)
    got = framejit.compile(lambda x: A.add.Tensor(x, 1))(x)
    assert int(got[-1]) == 2 and int(got[0]) == 2
    del x, got


def test_half_precision_patterns_on_gpu():
    for dtype in (torch.float16, torch.bfloat16):
        x = torch.randn(256, 768, device="cuda", dtype=dtype)
        w = torch.randn(768, device="cuda", dtype=dtype)
        b = torch.randn(768, device="cuda", dtype=dtype)
        framejit.reset()
        fn = framejit.compile(lambda x, w, b: torch.nn.functional.layer_norm(x, (768,), w, b))
        got = fn(x, w, b)
        assert_close_to_eager(got, torch.nn.functional.layer_norm(x, (768,), w, b))
        assert os.environ.get("TRITON_INTERPRET", "0") != "1"


def test_a_language_model_head_with_unaligned_rows_is_padded_and_matches_eager():
    # GPT-2's vocabulary (50257) made cuBLAS run an align1 kernel: 3.36 of 4.1 ms on an H200.
    from framejit.testing import built_by_pipeline

    torch.manual_seed(0)
    x = torch.randn(2048, 64, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1001, 64, device="cuda", dtype=torch.bfloat16) / 8
    with built_by_pipeline() as built, torch.no_grad():
        got = framejit.compile(lambda x, w: torch.nn.functional.linear(x, w))(x, w)
    assert_close_to_eager(got, torch.nn.functional.linear(x, w))
    assert got.is_contiguous()
    (compiled,) = built
    targets = [n.target for n in compiled.framejit_graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.constant_pad_nd.default in targets


def test_kernels_launch_their_binaries_directly_and_unaligned_inputs_still_work():
    from framejit.testing import built_by_pipeline

    x = torch.randn(64, 1000, device="cuda")
    with built_by_pipeline() as built:
        f = framejit.compile(softmax)
        assert_close_to_eager(f(x), softmax(x))
    ((launcher,),) = [fn.framejit_kernels for fn in built]
    assert launcher.direct, "the compiled binary did not give Triton's own launch's bits"
    for _ in range(3):
        assert_close_to_eager(f(x), softmax(x))
    shifted = torch.randn(64 * 1000 + 1, device="cuda")[1:].view(64, 1000)
    assert shifted.data_ptr() % 16 == 4
    assert_close_to_eager(f(shifted), softmax(shifted))


def test_a_graph_compiles_its_kernels_ahead_in_worker_processes(monkeypatch, tmp_path):
    """A CUDA graph's kernels are compiled in worker processes while the first call starts;
    each compile the first call reaches is then Triton's disk cache, or cancelled and done
    here (tests/kernels/test_triton_pool.py checks the cache hits without a GPU)."""
    import torch.nn.functional as F

    from framejit.kernels import triton_pool

    monkeypatch.setenv("FRAMEJIT_COMPILE_WORKERS", "2")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setenv("FRAMEJIT_CACHE_DIR", str(tmp_path / "fj"))
    triton_runtime._best.clear()
    before = dict(triton_pool.counts)

    def f(x, y, w, b):
        return softmax(x), F.layer_norm(y, (y.shape[-1],), w, b) * 2

    args = (torch.randn(256, 1000, device="cuda"), torch.randn(256, 768, device="cuda"),
            torch.randn(768, device="cuda"), torch.randn(768, device="cuda"))
    got = framejit.compile(f)(*args)
    assert_close_to_eager(got, f(*args))
    handed = triton_pool.counts["handed"] - before["handed"]
    reached = sum(triton_pool.counts[k] - before[k] for k in ("by_workers", "cancelled", "failed"))
    assert handed >= 2 and reached == handed and not triton_pool._jobs
    assert triton_pool.counts["failed"] == before["failed"], triton_pool.errors
