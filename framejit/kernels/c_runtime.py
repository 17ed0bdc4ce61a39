"""Compiling, caching and calling rendered C kernels (CPU tensors).

* **One shared object per graph**: a :class:`CLauncher` renders its function when it is built
  and joins a pending batch; the first call of any pending launcher compiles the whole batch
  (every kernel the pipeline built for one graph, since a graph is compiled before it runs) as
  one translation unit. A batch that fails is retried kernel by kernel, so one bad kernel only
  costs its own fusion.
* **Cache**: ``<cache>/c/<sha256>.so`` with the key over the translation unit, the compiler's
  version, the CPU (:func:`cpu_identity`) and the flags (``$FRAMEJIT_CACHE_DIR/c`` or
  ``~/.cache/framejit/c``); written to a temporary name and renamed, so concurrent processes
  never see half a file. In a process each function (named after a hash of its body) is
  compiled at most once.
* **Compiler**: ``$CC`` or ``cc``, :data:`FLAGS` and ``$FRAMEJIT_CFLAGS`` (never
  ``-ffast-math``: with gcc < 13 it sets flush-to-zero for the whole process). No compiler: :class:`CCompilerMissing` when the
  launcher is built, which the compiler layer turns into eager torch with one warning.
* **Calls**: ``framejit._claunch.launch(address, nthreads, *tensors, *sizes)`` (a METH_FASTCALL
  function in our own extension) when it is built, ctypes otherwise: the tensors' data pointers
  become the kernel's ``bufs``, the ints (the values of ``kernel.symbols()``, none for a static
  kernel) its ``sizes``. A kernel with run-time sizes is one function for every size: its text,
  and so its name and cache key, holds no value of them.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shlex
import shutil
import subprocess
import threading
import time
from typing import Any

import torch

from .. import diskcache, record
from .c_render import PRELUDE, forget_rendered, named_function
from .ir import Kernel
from .launch import KernelLauncher, cache_dir
from .triton_runtime import KernelCompileError

#: The compiler flags. IEEE-strict: errno kept (pytorch#143978), no contraction (eager rounds
#: a*b+c twice), no fast-math. ``-fno-trapping-math`` (clang's default) changes no value: it
#: lets gcc compute a float op for every vector lane where C computes it under a condition
#: (a select whose arm was sunk into a branch). Without it, on a CPU with no masked vector
#: ops (AVX2), gcc leaves such a loop scalar: an fp32 softmax ran 4x slower.
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c11", "-ffp-contract=off",
         "-fno-trapping-math")


def flags() -> tuple[str, ...]:
    """:data:`FLAGS`, then ``$FRAMEJIT_CFLAGS`` (for example ``-mno-avx512f``, to build kernels as
    a CPU without AVX-512 takes them, or ``-march=x86-64-v3`` for machines other than this
    one): read at each build, so set it before the first compile of a process."""
    return (*FLAGS, *shlex.split(os.environ.get("FRAMEJIT_CFLAGS", "")))


#: Compiles and cache hits, for tests and ``framejit.stats()``-style reporting.
c_counters = {"compiles": 0, "disk_hits": 0}

_functions: dict[str, int] = {}          # function name -> address, loaded in this process
_libraries: list[ctypes.CDLL] = []        # keep every loaded object alive
_pending: dict[str, CLauncher] = {}     # function name -> a launcher waiting for its build
_lock = threading.RLock()
_compilers: dict[str, tuple[list[str], str]] = {}


class CCompilerMissing(RuntimeError):
    """No C compiler: set ``CC`` to one (gcc or clang with OpenMP), install one (``apt-get
    install gcc``), or use ``backend="eager"``."""


def find_compiler() -> tuple[list[str], str]:
    """(command, version line) of the C compiler: ``$CC`` or ``cc``; checked once per
    process for each value of ``CC``."""
    cc = os.environ.get("CC") or "cc"
    found = _compilers.get(cc)
    if found is not None:
        return found
    command = shlex.split(cc)
    path = shutil.which(command[0]) if command else None
    if path is None:
        origin = "$CC" if os.environ.get("CC") else "the default C compiler"
        raise CCompilerMissing(
            f"no C compiler: {command[0] if command else cc!r} ({origin}) is not on PATH; set "
            f"CC to gcc or clang, or install one, to get C kernels for CPU tensors")
    # Run by its full path: for a bare name, subprocess looks it up with os.get_exec_path(),
    # which sets a warnings filter and so resets every "once" record of warnings (the user's
    # warnings.warn() in a loop showed again after a first compile).
    command[0] = path
    try:
        out = subprocess.run([*command, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        raise CCompilerMissing(f"the C compiler {cc!r} does not run: {e}") from e
    text = (out.stdout or out.stderr).strip()
    found = (command, text.splitlines()[0] if text else cc)
    _compilers[cc] = found
    return found


_cpu: str | None = None


def cpu_identity() -> str:
    """This CPU's model and instruction set extensions (from ``/proc/cpuinfo``), part of every
    disk cache key: ``-march=native`` builds for the CPU it runs on, and a cache folder shared
    by machines with other CPUs (a network home, a restored CI cache) must not hand one of
    them code with instructions it lacks (a SIGILL)."""
    global _cpu
    if _cpu is None:
        import platform

        found = {}
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    name, _, value = line.partition(":")
                    name = name.strip()
                    if name in ("vendor_id", "model name", "flags", "Features", "CPU part"):
                        found.setdefault(name, value.strip())
                    elif not line.strip() and found:
                        break  # the first processor's record is enough
        except OSError:
            pass
        _cpu = "; ".join(f"{k}={v}" for k, v in sorted(found.items())) or \
            f"{platform.machine()} {platform.processor()}"
    return _cpu


def _spelled(command: list[str]) -> str:
    """The compiler command as the disk cache's keys spell it: its program's name, not the
    path found on PATH (which machines sharing a cache may not share)."""
    return " ".join([os.path.basename(command[0]), *command[1:]])


_PROBE = """#include <math.h>
#define FJ_LIBMVEC
%s
void probe(const float *restrict a, float *restrict o, const double *restrict b, double *restrict p) {
    #pragma omp simd
    for (int i = 0; i < 64; i++) o[i] = expf(a[i]) + logf(a[i]) + log1pf(a[i]) + expm1f(a[i])
        + sinf(a[i]) + cosf(a[i]) + tanhf(a[i]) + erff(a[i]);
    #pragma omp simd
    for (int i = 0; i < 64; i++) p[i] = exp(b[i]) + log(b[i]) + log1p(b[i]) + expm1(b[i])
        + sin(b[i]) + cos(b[i]) + tanh(b[i]) + erf(b[i]);
}
"""
_extra_flags: dict[str, tuple[str, ...]] = {}


def extra_flags() -> tuple[str, ...]:
    """``-DFJ_LIBMVEC -lmvec`` when glibc's vector math links with this compiler (so exp, tanh,
    erf, ... vectorize); probed once per compiler and remembered on disk."""
    command, version = find_compiler()
    base = flags()
    key = hashlib.sha256("\0".join([version, _spelled(command), cpu_identity(), *base]).encode()).hexdigest()[:24]
    if key in _extra_flags:
        return _extra_flags[key]
    record = os.path.join(cache_dir("c"), f"probe-{key}.txt")
    try:
        with open(record) as f:
            found = tuple(f.read().split())
    except OSError:
        folder = cache_dir("c")
        source = os.path.join(folder, f"probe-{key}.{os.getpid()}.c")
        target = source[:-2] + ".so"
        decls = PRELUDE.split("#ifdef FJ_LIBMVEC")[1].split("#endif")[0]
        with open(source, "w") as f:
            f.write(_PROBE % decls)
        result = subprocess.run([*command, *base, source, "-o", target, "-lm", "-lmvec"],
                                capture_output=True, text=True)
        found = ("-DFJ_LIBMVEC", "-lmvec") if result.returncode == 0 else ()
        for path in (source, target):
            try:
                os.unlink(path)
            except OSError:
                pass
        with open(f"{record}.{os.getpid()}.tmp", "w") as f:
            f.write(" ".join(found))
        os.replace(f"{record}.{os.getpid()}.tmp", record)
    _extra_flags[key] = found
    return found


def _build(names: list[str], functions: dict[str, str]) -> dict[str, int]:
    """Compile (or find in the disk cache) one shared object with ``names``; their addresses."""
    command, version = find_compiler()
    options = (*flags(), *extra_flags())
    bodies = [functions[n] for n in names]
    unit = PRELUDE + "\n" + "\n".join(bodies)
    key = hashlib.sha256("\0".join([unit, version, _spelled(command), cpu_identity(), *options]
                                    ).encode()).hexdigest()[:40]
    folder = cache_dir("c")
    path = os.path.join(folder, f"{key}.so")
    lib = None
    if os.path.exists(path):
        diskcache.note_use(path)
        try:
            lib = ctypes.CDLL(path)
            c_counters["disk_hits"] += 1
        except OSError:
            pass  # pruned (or cut short) since: compiled again
    if lib is None:
        _compile(command, options, unit, folder, path)
        lib = ctypes.CDLL(path)
    _libraries.append(lib)
    return {n: ctypes.cast(getattr(lib, n), ctypes.c_void_p).value for n in names}


def _compile(command: list[str], flags: tuple[str, ...], unit: str, folder: str, path: str):
    """Compile ``unit`` into the shared object ``path`` (written under a temporary name, then
    renamed, so other processes never load half a file)."""
    source = path[:-3] + ".c"
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(f"{source}.{os.getpid()}.tmp", "w") as f:
        f.write(unit)
    os.replace(f"{source}.{os.getpid()}.tmp", source)
    defines = [f for f in flags if not f.startswith("-l")]
    libraries = [f for f in flags if f.startswith("-l")]  # after the source, for the linker
    result = subprocess.run([*command, *defines, source, "-o", tmp, "-lm", *libraries],
                            capture_output=True, text=True)
    if result.returncode != 0:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise KernelCompileError(
            f"{' '.join(command)} failed on {source}:\n{result.stderr[-2000:]}")
    os.replace(tmp, path)
    c_counters["compiles"] += 1
    try:
        written = os.path.getsize(path) + len(unit)
    except OSError:
        written = len(unit)
    diskcache.note_write(folder, written)


def address_of(launcher: CLauncher) -> int:
    """The loaded function of ``launcher``, building its pending batch first."""
    with _lock:
        addr = _functions.get(launcher.cname)
        if addr is not None:
            return addr
        batch = dict(_pending)
        batch.setdefault(launcher.cname, launcher)
        _pending.clear()
        functions = {n: launch.function for n, launch in batch.items() if n not in _functions}
        t0 = time.perf_counter()
        compiles = c_counters["compiles"]
        try:
            try:
                _functions.update(_build(sorted(functions), functions))
            except KernelCompileError:
                if len(functions) == 1:
                    raise
                # One kernel alone: the others get their own try at their first call.
                _functions.update(_build([launcher.cname], functions))
        finally:
            record.emit(record.KernelBuilt(language="c", names=sorted(batch[n].name for n in functions),
                                           seconds=time.perf_counter() - t0,
                                           cached=c_counters["compiles"] == compiles))
        return _functions[launcher.cname]


def clear_memory_cache() -> None:
    """Forget the loaded functions and rendered sources (not the disk cache): the next builds
    read the disk."""
    with _lock:
        _functions.clear()
        _pending.clear()
        forget_rendered()


#: The calling convention of csrc/claunch.c that this module speaks (its ABI_VERSION). A build
#: from an older source (the .so is stale until `make` rebuilds it) is not used: ctypes calls
#: the kernels meanwhile, since the old launch would pass no sizes.
CLAUNCH_ABI = 2


def _find_launch():
    """``framejit._claunch.launch`` when it is built for :data:`CLAUNCH_ABI`, else None."""
    try:
        from .. import _claunch
    except ImportError:
        return None
    if getattr(_claunch, "ABI_VERSION", 1) != CLAUNCH_ABI:
        return None
    helper = getattr(getattr(getattr(torch._C, "_dynamo", None), "guards", None),
                     "_torchinductor_pyobject_tensor_data_ptr", None)
    if helper is not None:
        # torch's helper trusts its argument to be a tensor; _claunch checks it against this type.
        _claunch.set_data_ptr_fn(helper, getattr(torch._C, "TensorBase", torch.Tensor))
    return _claunch.launch


_launch = _find_launch()


_KernelType = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p)
_ctypes_functions: dict[int, Any] = {}


def _ctypes_launch(address: int, nthreads: int, *args: torch.Tensor | int) -> None:
    """The launch without framejit._claunch (not built): several microseconds per call.
    ``args`` are the kernel's tensors, then its run-time sizes (Python ints)."""
    fn = _ctypes_functions.get(address)
    if fn is None:
        fn = _ctypes_functions[address] = _KernelType(address)
    pointers = [a.data_ptr() for a in args if not isinstance(a, int)]
    sizes = [a for a in args if isinstance(a, int)]
    fn((ctypes.c_void_p * len(pointers))(*pointers), nthreads,
       (ctypes.c_int64 * len(sizes))(*sizes) if sizes else None)


class CLauncher(KernelLauncher):
    """Runs one C kernel: ``launcher(*inputs, *sizes) -> output tensor or tuple of them``
    (``sizes``: the values of ``kernel.symbols()``, none for a static kernel); the same contract
    as the Triton :class:`~framejit.kernels.triton_runtime.Launcher`."""

    language = "c"

    def __init__(self, kernel: Kernel, outputs: list[tuple], device: torch.device,
                 seed_index: int | None) -> None:
        if torch.device(device).type != "cpu":
            raise RuntimeError(f"C kernels run on CPU tensors, not {device}")
        find_compiler()
        self._join(kernel, outputs, device, seed_index, *named_function(kernel))

    @classmethod
    def restored(cls, kernel: Kernel, outputs: list[tuple], device: torch.device,
                 seed_index: int | None, cname: str, function: str) -> CLauncher:
        """The launcher of a kernel rendered before (``cname``, ``function``: what
        ``named_function(kernel)`` gave), as the graph cache keeps it."""
        find_compiler()
        self = cls.__new__(cls)
        self._join(kernel, outputs, device, seed_index, cname, function)
        return self

    def _join(self, kernel, outputs, device, seed_index, cname: str, function: str) -> None:
        self.kernel = kernel
        self.device = torch.device(device)
        self.outputs = outputs
        self.seed_index = seed_index
        self.cname, self.function = cname, function
        self.source = self.function
        with _lock:
            if self.cname not in _functions:
                _pending.setdefault(self.cname, self)

    def _first_call(self, inputs: tuple):
        try:
            address = address_of(self)
        except KernelCompileError as e:
            return self._use_fallback(e, inputs)
        self._build_fast(address)
        return self._fast(*inputs)

    def _build_fast(self, address: int) -> None:
        """A launch function for this kernel (see launch.launch_function)."""
        self._set_fast("_launch(_address, _threads(), {args}{syms})", {
            "_threads": torch.get_num_threads, "_launch": _launch or _ctypes_launch,
            "_address": address})
