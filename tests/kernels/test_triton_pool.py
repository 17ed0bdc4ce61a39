"""Compiling a CUDA graph's Triton kernels ahead in worker processes (triton_pool): what the
workers leave in Triton's disk cache must be exactly what the parent's own compile looks for,
or the first call compiles everything twice.

No GPU is needed: Triton compiles for a named GPU (an H200's sm_90) without one. Each check runs
in a fresh Python without TRITON_INTERPRET (the test process's Triton is the interpreter's),
with a stand-in driver that names that GPU, as the workers' own does."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

SCRIPT = textwrap.dedent("""
    import json, os, sys
    import torch, torch.nn.functional as F
    import framejit
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver
    from framejit.backends.registry import Backend
    from framejit.kernels import triton_pool
    from framejit.kernels.reference import ReferenceLauncher
    from framejit.kernels import triton_runtime
    from framejit.kernels.triton_runtime import Launcher
    from framejit.pipeline import compile_with_kernels

    driver.set_active(triton_pool._TargetDriver(GPUTarget("cuda", 90, 32)))
    built = []
    def backend(gm, example_inputs):  # the kernels' descriptions, from CPU tensors
        fn = compile_with_kernels(gm, example_inputs, ("cpu",), launcher=ReferenceLauncher)
        built.extend(fn.framejit_kernels)
        return fn
    def f(x, y, w, b):
        return torch.softmax(x, -1), F.layer_norm(y, (y.shape[-1],), w, b) * 2
    x, y = torch.randn(64, 256), torch.randn(64, 256)
    framejit.compile(f, backend=Backend("descriptions", backend, native=True))(x, y, torch.ones(256), torch.zeros(256))
    launchers = [Launcher(k.kernel, k.outputs, torch.device("cuda"), k.seed_index) for k in built]
    for la in launchers:  # loaded, then the cache folder was cleaned (or changed): written again
        os.remove(triton_runtime.module_path(la.digest))
    handed = triton_pool.compile_ahead(launchers)
    for future in list(triton_pool._jobs.values()):
        future.result(timeout=600)
    cache = os.environ["TRITON_CACHE_DIR"]
    before = set(os.listdir(cache))
    for la in launchers:  # what the first call compiles: every config, aligned fresh tensors
        for config in la.configs:
            la._set_config(config)
            triton_pool.claim(la, config)
            la.fn.warmup(*[b.dtype for b in la.kernel.buffers], *la.scalars, grid=la.grid, **config)
    bogus = None
    if triton_pool._pool is not None:  # a job that fails: reported, and the workers go on
        bogus = repr(triton_pool._pool.submit("/no/such/kernel.py", "k", [], (), (1,), {}, None,
                                              {}).exception(timeout=600))
        la = launchers[0]
        la._set_config(la.configs[0])
        key = triton_pool.job_key(la, {"XBLOCK": 3})
        job = triton_pool._jobs[key] = triton_pool._pool.submit(*triton_pool._job_args(la, {"XBLOCK": 3}))
        job.exception(timeout=600)  # a config Triton rejects, done by a worker
        triton_pool.claim(la, {"XBLOCK": 3})  # counted as failed; the parent would compile
    counts = dict(triton_pool.counts)
    la = launchers[-1]
    again = triton_pool.compile_ahead([la])  # then its best config is read from the cache: the
    la._set_config(la.configs[0])            # jobs of the others go once it is built
    triton_pool.release(la)
    print(json.dumps({"again": again, "left": len(triton_pool._jobs),
                      "kernels": len(launchers), "configs": sum(len(la.configs) for la in launchers),
                      "handed": handed, "cached": len(before),
                      "compiled_here": len(set(os.listdir(cache)) - before),
                      "counts": counts, "bogus": bogus}))
""")


def _run(tmp_path, workers: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path / "triton"), FRAMEJIT_CACHE_DIR=str(tmp_path / "fj"),
               FRAMEJIT_COMPILE_WORKERS=str(workers))
    os.makedirs(env["TRITON_CACHE_DIR"])
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=root, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_workers_leave_exactly_what_the_first_call_compiles(tmp_path):
    r = _run(tmp_path, workers=2)
    assert r["kernels"] == 2 and r["configs"] >= 3  # the reductions try more than one config
    assert r["handed"] == r["configs"]
    assert r["cached"] >= r["configs"]
    assert r["compiled_here"] == 0  # every compile of the first call read the workers' binary
    assert r["counts"] == {"handed": r["configs"], "by_workers": r["configs"], "cancelled": 0,
                           "failed": 1}
    assert "no/such/kernel.py" in r["bogus"]
    assert r["again"] >= 2 and r["left"] == 0


def test_without_workers_the_first_call_compiles_each_config(tmp_path):
    r = _run(tmp_path, workers=0)
    assert r["handed"] == 0 and r["compiled_here"] >= r["configs"]


def test_a_forked_child_forgets_the_parents_workers():
    """A fork (a DataLoader worker) inherits the pool's pipes but not the threads that serve
    them: a job it handed over would never be answered, and its first call would wait for it.
    The child starts from no pool and no jobs."""
    from concurrent.futures import Future

    from framejit.kernels import triton_pool

    saved = (triton_pool._pool, triton_pool._broken, dict(triton_pool._jobs), triton_pool._lock)
    try:
        triton_pool._pool, triton_pool._broken = object(), True
        triton_pool._jobs["job"] = Future()
        triton_pool._lock.acquire()  # held by another thread at the fork
        triton_pool._forget_in_child()
        assert triton_pool._pool is None and not triton_pool._broken and not triton_pool._jobs
        assert triton_pool._lock.acquire(blocking=False)
        triton_pool._lock.release()
    finally:
        saved[3].release()
        triton_pool._pool, triton_pool._broken, triton_pool._lock = saved[0], saved[1], saved[3]
        triton_pool._jobs.clear()
        triton_pool._jobs.update(saved[2])
