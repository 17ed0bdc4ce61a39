"""Compiling a graph's Triton kernels ahead of its first call, in worker processes.

A graph's first call compiles its kernels one after another as it reaches them: about 0.1 s a
compile, two or three for a tuned reduction, so most of a model's first call on a GPU
(GPT-2: 22 kernels, about 35 compiles). Threads barely help: Triton's MLIR passes hold the GIL.
So, as Inductor does, the compiles go to worker processes too:

* Once a CUDA graph's kernels are known (:func:`compile_ahead`), every config of every kernel
  with static sizes is handed to a pool of worker processes, which compile it with Triton's
  own ``JITFunction.warmup`` for the same argument types and sizes, for the parent's GPU
  (``GPUTarget``: the workers never touch CUDA), with the parent's ``TRITON_*`` environment, so
  that Triton's disk cache then holds exactly what the parent's own compile looks for.
* The first call runs as before. Just before it compiles a config (:func:`claim`) it takes
  that config's job back: a job no worker has started is cancelled and compiled here as
  before; a started one is waited for, and the compile here then reads Triton's disk cache
  (a few milliseconds). Nothing is lost where the pool is slow to start, and a worker's
  failure (any error, a timeout) only means the compile is done here.

The workers are fresh Python processes (``python -c``, as Inductor's compile workers), started by
the first CUDA graph and living as long as the process; each takes one job at a time from one
queue. Not multiprocessing's: its spawn and forkserver children import the user's ``__main__``
script again (running a script without a ``__main__`` guard once more in each worker), and a
fork of a process with CUDA and thread pools can deadlock. ``FRAMEJIT_COMPILE_WORKERS`` sets
their number (default: the CPU count, at most 16); 0 turns them off. It is never used under
Triton's interpreter, nor for kernels whose sizes are run-time arguments (their sizes are known
only at their first call)."""

from __future__ import annotations

import atexit
import importlib.util
import os
import pickle
import queue
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from typing import Any

#: The longest the first call waits for a worker's compile before compiling itself.
WAIT_S = 120.0

_lock = threading.Lock()
_pool: _Pool | None = None
_broken = False
#: Job key (kernel source digest, argument dtypes, sizes, config) -> its future.
_jobs: dict[tuple, Future] = {}
#: Compiles handed to the workers, and what became of those the first calls reached: done by a
#: worker (waited for, or already finished), cancelled (no worker had started them), failed.
counts = {"handed": 0, "by_workers": 0, "cancelled": 0, "failed": 0}
#: The errors of the last few failed worker compiles (the first call compiled those itself).
errors: list[str] = []


def workers() -> int:
    """How many worker processes compile ahead (``FRAMEJIT_COMPILE_WORKERS``; 0: none)."""
    value = os.environ.get("FRAMEJIT_COMPILE_WORKERS")
    if value:
        try:
            return max(0, int(value))
        except ValueError:
            return 0
    return min(os.cpu_count() or 1, 16)


def job_key(launcher, config: dict) -> tuple:
    """What identifies one compile of ``launcher``'s kernel: its source, argument types, sizes
    and config."""
    return (launcher.digest, tuple(str(b.dtype) for b in launcher.kernel.buffers),
            tuple(launcher.scalars), tuple(sorted(config.items())))


def compile_ahead(launchers: list) -> int:
    """Hand every config of each static CUDA Triton kernel of ``launchers`` to the worker
    pool (started here the first time); the number of compiles handed over."""
    from .triton_runtime import Launcher

    todo = [la for la in launchers if type(la) is Launcher and la.device.type == "cuda"
            and not la.interpret and not la.kernel.is_dynamic]
    if not todo or workers() < 2:
        return 0
    target = _target()
    pool = _get_pool() if target is not None else None
    if pool is None:
        return 0
    env = _triton_env()
    count = 0
    for la in todo:
        la._set_config(la.configs[0])  # the size arguments: the same for every config
        for config in la.configs:
            key = job_key(la, config)
            with _lock:
                if key in _jobs:
                    continue
                # (A pool given up meanwhile leaves the job pending: the first call cancels it.)
                _jobs[key] = pool.submit(*_job_args(la, config, target, env))
            count += 1
        la.config = la.grid = None  # chosen at the first call
    counts["handed"] += count
    return count


def _job_args(la, config: dict, target=None, env=None) -> tuple:
    """:func:`compile_job`'s arguments for compiling ``config`` of launcher ``la``: the module
    is where the cache folder is now (a kernel loaded earlier may have been written elsewhere)."""
    from .triton_runtime import write_module

    return (write_module(la.source, la.digest), la.kernel.function_stem,
            [b.dtype for b in la.kernel.buffers], la.scalars, la._grid(config), config,
            target if target is not None else _target(), env if env is not None else _triton_env())


def claim(launcher, config: dict) -> None:
    """Before ``launcher`` compiles ``config`` itself: cancel the job if no worker has started
    it, or else wait for it (its result is then in Triton's disk cache)."""
    if not _jobs:
        return
    with _lock:
        future = _jobs.pop(job_key(launcher, config), None)
    if future is None:
        return
    if future.cancel():
        counts["cancelled"] += 1
        return
    try:
        future.result(timeout=WAIT_S)
        counts["by_workers"] += 1
    except Exception as e:  # the worker failed: the compile here says why, if it fails too
        counts["failed"] += 1
        errors[:] = [*errors[-4:], f"{type(e).__name__}: {e}"]


def release(launcher) -> None:
    """Once ``launcher`` has built its config: drop the jobs of the configs it did not compile
    (its best config read from the cache, say), cancelled where no worker has started them, so
    that none stays pending for the life of the process."""
    if not _jobs or getattr(launcher, "scalars", None) is None:
        return
    mine = job_key(launcher, {})[:3]
    with _lock:
        futures = [_jobs.pop(key) for key in [k for k in _jobs if k[:3] == mine]]
    for future in futures:
        future.cancel()


def _target():
    """The GPU the parent compiles for (Triton's ``GPUTarget``), or None."""
    try:
        from triton.runtime import driver
        return driver.active.get_current_target()
    except Exception:
        return None


def _triton_env() -> dict[str, str]:
    """The parent's ``TRITON_*`` environment: part of Triton's cache key (and its cache
    folder), so a worker compiles under exactly it."""
    return {k: v for k, v in os.environ.items() if k.startswith("TRITON_")}


class _Pool:
    """``n`` worker processes fed from one queue, each by a thread of this process that sends
    it a job, waits for its answer and settles the job's future."""

    def __init__(self, n: int) -> None:
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ)
        env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "") if env.get("PYTHONPATH") else root
        self.procs = [subprocess.Popen(
            [sys.executable, "-c", f"from {__name__} import worker_main; worker_main()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
            for _ in range(n)]
        for proc in self.procs:
            threading.Thread(target=self._feed, args=(proc,), daemon=True,
                             name="framejit-compile-worker").start()

    def submit(self, *job) -> Future:
        future: Future = Future()
        self.jobs.put((future, job))
        return future

    def _feed(self, proc) -> None:
        while True:
            item = self.jobs.get()
            if item is None:
                return
            future, job = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                pickle.dump(job, proc.stdin)
                proc.stdin.flush()
                error = pickle.load(proc.stdout)
            except Exception as e:  # the worker died: its jobs are compiled in the process
                future.set_exception(RuntimeError(f"compile worker gone ({e!r})"))
                _give_up()
                return
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(RuntimeError(error))

    def shutdown(self) -> None:
        for _ in self.procs:
            self.jobs.put(None)
        for proc in self.procs:
            try:
                proc.stdin.close()  # the worker ends at the end of its input
            except OSError:
                pass
        deadline = time.monotonic() + 2.0  # a worker in a compile is not waited for longer
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()


def _get_pool() -> _Pool | None:
    global _pool
    with _lock:
        if _pool is None and not _broken:
            try:
                _pool = _Pool(workers())
            except Exception:
                _give_up_locked()
        return _pool


def _give_up() -> None:
    with _lock:
        _give_up_locked()


def _give_up_locked() -> None:
    global _pool, _broken
    _broken = True
    for future in _jobs.values():
        future.cancel()
    _jobs.clear()
    if _pool is not None:
        _pool.shutdown()
    _pool = None


def _forget_in_child() -> None:
    """A forked child (a DataLoader worker) has the pool's pipes but not its threads: it
    starts its own pool if it ever needs one."""
    global _lock, _pool, _broken
    _lock = threading.Lock()
    _pool, _broken = None, False
    _jobs.clear()


os.register_at_fork(after_in_child=_forget_in_child)


@atexit.register
def shutdown() -> None:
    """Stop the workers (the next CUDA graph starts new ones)."""
    global _pool, _broken
    with _lock:
        for future in _jobs.values():
            future.cancel()
        _jobs.clear()
        if _pool is not None:
            _pool.shutdown()
        _pool, _broken = None, False


# -- in the worker ---------------------------------------------------------------------------

_functions: dict[str, Any] = {}
_worker_target = None


class _TargetDriver:
    """Triton's active driver in a worker: the parent's GPU as the target, device 0 and the
    null stream, and nothing else (a compile asks no more; a launch would fail loudly)."""

    def __init__(self, target) -> None:
        self.target = target

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def __getattr__(self, name):
        raise AttributeError(f"framejit's compile worker has no GPU ({name})")


def worker_main() -> None:
    """A worker process: jobs (``compile_job``'s arguments) come pickled on stdin, each answered
    on stdout with None or what went wrong; anything else written to stdout goes to stderr."""
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    jobs = sys.stdin.buffer
    import torch  # noqa: F401  (the jobs' dtypes; imported before the first job arrives)
    import triton  # noqa: F401
    while True:
        try:
            job = pickle.load(jobs)
        except EOFError:
            return
        try:
            compile_job(*job)
            error = None
        except BaseException as e:  # noqa: BLE001  (reported to the parent, which compiles)
            error = f"{type(e).__name__}: {e}"
        pickle.dump(error, answers)
        answers.flush()


def compile_job(path: str, stem: str, dtypes: list, scalars: tuple, grid: tuple, config: dict,
                target, env: dict[str, str]) -> None:
    """In a worker: compile the kernel function ``stem`` of the module at ``path`` for tensors
    of ``dtypes`` (16-byte aligned, as fresh allocations are), ``scalars`` and ``config``."""
    import triton
    from triton.runtime import driver

    for k in [k for k in os.environ if k.startswith("TRITON_") and k not in env]:
        del os.environ[k]
    os.environ.update(env)
    global _worker_target
    if _worker_target != target:
        driver.set_active(_TargetDriver(target))
        _worker_target = target
    fn = _functions.get(path)
    if fn is None:
        # The module's name is part of Triton's cache key: the parent's (triton_runtime.load_kernel).
        name = "framejit_kernel_" + os.path.basename(path)[2:-3]
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        module._jit = triton.jit
        spec.loader.exec_module(module)
        fn = _functions[path] = getattr(module, stem)
    fn.warmup(*dtypes, *scalars, grid=grid, **config)
