"""Timing helpers shared by benchmarks/kernels.py and the CUDA mode of benchmarks/models.py.

On CUDA, times come from device events (``triton.testing.do_bench``, median, L2 flushed between
repeats); on the CPU, from ``time.perf_counter`` (median of repeats). Every figure is taken after
warm-up, so compilation and lazy initialisation stay out of it; first calls are timed separately
by :func:`first_call_s`.
"""

from __future__ import annotations

import gc
import os
import random
import statistics
import tempfile
import time

import torch


def keep_freed_memory() -> str:
    """Make glibc's allocator keep the memory a process frees (no trimming, and blocks below
    32 MiB from the heap rather than fresh mappings), so that a call does not fault in its
    outputs' pages afresh; returns a line saying what the allocator does. Every compiler and
    eager torch run under the same allocator. glibc's default thresholds adapt to the history
    of frees: the same script measured eager's and framejit's layer norm anywhere from 5.5 to
    30 GB/s from one run to the next (page faults of a 16 MB output, some 4 ms a call on this
    VM), and the CNN's ratio moved by 5%. ``FRAMEJIT_BENCH_MALLOC=system`` keeps the defaults."""
    if os.environ.get("FRAMEJIT_BENCH_MALLOC") == "system":
        return "allocator: glibc defaults (FRAMEJIT_BENCH_MALLOC=system)"
    try:
        import ctypes
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return "allocator: the system's (no glibc mallopt)"
    m_trim_threshold, m_mmap_threshold = -1, -3
    if mallopt(m_trim_threshold, 2**31 - 1) and mallopt(m_mmap_threshold, 32 << 20):
        return ("allocator: glibc keeps freed memory (no trim; mmap from 32 MiB), as for every "
                "function timed; FRAMEJIT_BENCH_MALLOC=system for its defaults")
    return "allocator: glibc defaults (mallopt refused)"


def synchronize(device: torch.device | str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def time_ms(fn, device: torch.device | str, *, quick: bool = False) -> float:
    """Median milliseconds per ``fn()`` after warm-up."""
    if torch.device(device).type == "cuda":
        return _cuda_ms(fn, warmup=10 if quick else 25, rep=40 if quick else 200)
    return _cpu_ms(fn, repeat=5 if quick else 15)


def _cuda_ms(fn, warmup: int, rep: int) -> float:
    try:
        from triton.testing import do_bench
    except ImportError:
        return _cuda_event_ms(fn, warmup, rep)
    return float(do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def _cuda_event_ms(fn, warmup_ms: int, rep_ms: int) -> float:
    """do_bench's method without triton: events around each call, median (no L2 flush)."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        fn()
    end.record()
    torch.cuda.synchronize()
    estimate = max(start.elapsed_time(end) / 5, 1e-3)
    for _ in range(max(1, int(warmup_ms / estimate))):
        fn()
    times = []
    for _ in range(max(5, int(rep_ms / estimate))):
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _cpu_ms(fn, repeat: int) -> float:
    fn()
    t0 = time.perf_counter()
    fn()
    once = time.perf_counter() - t0
    number = max(1, int(0.02 / max(once, 1e-7)))  # about 20 ms per repeat
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        times.append((time.perf_counter() - t0) / number)
    return statistics.median(times) * 1e3


def cpu_clock():
    """(clock, name) for CPU timings: with one torch thread every op runs on the calling thread,
    so its CPU time (``time.thread_time``) measures the work without the time other processes
    hold the core (a shared machine); with more threads, wall time (``time.perf_counter``)."""
    if torch.get_num_threads() == 1:
        return time.thread_time, "thread CPU time"
    return time.perf_counter, "wall time"


def interleaved_cpu_ms(fns: dict, *, rounds: int = 15, target_s: float = 0.02) -> dict:
    """Median milliseconds per call of each of ``fns`` (name -> zero-argument callable), timed in
    interleaved rounds (each round times every function once, for about ``target_s``), so that
    a noisy machine slows all of them alike and their ratios stay meaningful. The clock is
    :func:`cpu_clock`'s.

    Each round takes the functions in its own order (a fixed-seed shuffle), and calls each once
    untimed before its timed calls: what runs just before a function changes its time. At 2
    threads the CNN timed right after eager torch took about 2 ms (20%) longer, whichever
    compiler it was (eager frees 35 MB a call, which the allocator hands back to the system and
    the next function faults in again); a fixed order eager, framejit, Inductor had charged
    that to framejit in every run, and a shuffle still charged it to whichever followed eager
    in more of the rounds the median fell on. A function's timed calls now follow its own."""
    clock, _ = cpu_clock()
    number = {}
    for name, fn in fns.items():
        fn()
        t0 = time.perf_counter()
        fn()
        number[name] = max(1, int(target_s / max(time.perf_counter() - t0, 1e-7)))
    times: dict = {name: [] for name in fns}
    order = list(fns)
    shuffle = random.Random(0).shuffle
    for _ in range(rounds):
        shuffle(order)
        for name in order:
            fn = fns[name]
            fn()  # untimed: the timed calls follow this function's own call
            t0 = clock()
            for _ in range(number[name]):
                fn()
            times[name].append((clock() - t0) / number[name])
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def first_call_s(fn, args, kwargs=None, device: torch.device | str = "cpu"):
    """(seconds, result) of the first call of a freshly compiled ``fn``: capture, compilation
    and tuning included, the device synchronized before the clock stops. The garbage of what
    ran before (another compiler's first call, say) is collected first, untimed: otherwise a
    full collection of it (0.1-0.3 s after Inductor compiled a model) lands in whichever first
    call happens to come next."""
    gc.collect()
    synchronize(device)
    t0 = time.perf_counter()
    out = fn(*args, **(kwargs or {}))
    synchronize(device)
    return time.perf_counter() - t0, out


def copy_gbps(device: torch.device | str, numel: int) -> float:
    """Device copy bandwidth: GB/s of ``dst.copy_(src)`` on fp32, bytes read + bytes written."""
    src = torch.randn(numel, device=device)
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), device)
    return 2 * src.nbytes / ms / 1e6


def use_fresh_caches() -> str:
    """Point Triton's, Inductor's and framejit's disk caches at a new empty folder, so first
    calls are cold compiles for both compilers. Call before anything is compiled; returns the
    folder."""
    root = tempfile.mkdtemp(prefix="framejit-bench-")
    os.environ["TRITON_CACHE_DIR"] = os.path.join(root, "triton")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(root, "inductor")
    os.environ["FRAMEJIT_CACHE_DIR"] = os.path.join(root, "framejit")
    return root


def gbps(nbytes: int, ms: float | None) -> float | None:
    return None if ms is None or ms <= 0 else nbytes / ms / 1e6


def fmt_rate(value: float | None, width: int) -> str:
    """A GB/s figure with about three significant digits (CPU checks give small ones)."""
    if value is None:
        return f"{'-':>{width}}"
    spec = ".0f" if value >= 100 else ".1f" if value >= 10 else ".2f"
    return f"{value:>{width}{spec}}"


def fmt(value: float | None, spec: str, width: int) -> str:
    """``value`` formatted to ``width`` columns, or a dash when it is missing."""
    return f"{'-':>{width}}" if value is None else f"{value:>{width}{spec}}"
