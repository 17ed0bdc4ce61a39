"""Compiling, caching, tuning and launching rendered Triton kernels.

* **Cache by source**: a rendered module is written once to ``<cache>/triton/<hash>.py`` and
  loaded once per process (per device kind: ``triton.jit`` for CUDA tensors, Triton's
  interpreter for CPU tensors). Triton keeps its compiled binaries in its own disk cache.
* **Tuning**: on a GPU, the first launch of a reduction kernel at given sizes compiles two or
  three block/warp configs at once (threads), times them and keeps the fastest, in memory and
  in ``<cache>/triton/<hash>.best.json``; a pointwise kernel has one config, as in Inductor's
  default mode. Each config tried is a compile in the first call, so there are few. Tuning
  draws no random seed: only calls that return results do. Under the interpreter the first
  config is used (timing it says nothing).
* **Launch**: :class:`Launcher` allocates the outputs and calls the kernel; once its config is
  known a call does no other Python work. On a GPU it launches the compiled binary directly
  (``CompiledKernel[grid](*args)``), skipping ``JITFunction.run``'s argument binding and cache
  lookup, once the first call has seen that this gives the same bits; an input that is not
  16-byte aligned takes Triton's own launch (the binary may assume alignment).
* **Run-time sizes**: a dynamic kernel is called ``launcher(*inputs, *sizes)``. Its config is
  chosen (tuned on a GPU) at the first call, for that call's sizes, among configs that are
  correct for every size (its reductions over run-time extents loop, see triton_render); the
  grid is computed per call in the generated launch function from the sizes. One Triton
  function serves every size: its size arguments are not specialized.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from .. import diskcache, record
from . import triton_pool, triton_render
from .ir import Kernel, evaluate, expr_text, product
from .launch import KernelLauncher, cache_dir, launch_function
from .triton_render import OPTIONS, is_persistent, render

_modules: dict[str, Any] = {}
_best: dict[tuple[str, tuple], dict] = {}
_lock = threading.Lock()


def source_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:32]


class KernelCompileError(RuntimeError):
    """A kernel could not be built for its device (no config fits, a compiler error)."""


def compile_errors() -> tuple[type[BaseException], ...]:
    """The exceptions that mean "this kernel cannot be built here" (Triton's compiler errors,
    out of resources), as opposed to errors of running it."""
    errors: list[type[BaseException]] = [KernelCompileError]
    try:
        from triton.compiler.errors import CompilationError
        errors.append(CompilationError)
    except ImportError:
        pass
    try:
        from triton.runtime.errors import OutOfResources
        errors.append(OutOfResources)
    except ImportError:
        pass
    return tuple(errors)


def interpreter_enabled() -> bool:
    """Whether Triton runs kernels in its interpreter (``TRITON_INTERPRET=1`` when triton was
    imported: Triton's own library functions are built for one mode at import time)."""
    import triton

    return bool(triton.knobs.runtime.interpret)


def check_device(device: torch.device) -> None:
    """Raise a RuntimeError saying what to do when kernels cannot run on ``device``."""
    if device.type == "cuda":
        return
    if not interpreter_enabled():
        raise RuntimeError(
            f"Triton kernels for {device.type} tensors run only in Triton's interpreter: set "
            f"TRITON_INTERPRET=1 in the environment before Python starts (it is slow, for tests), "
            f"or use backend='default', which runs {device.type} tensors with torch")


def load_kernel(kernel: Kernel, source: str):
    """The Triton function of ``source`` (cached by source)."""
    fn = _modules.get(source)
    if fn is not None:
        return fn
    import triton

    with _lock:
        fn = _modules.get(source)
        if fn is not None:
            return fn
        digest = source_hash(source)
        path = write_module(source, digest)
        spec = importlib.util.spec_from_file_location(f"framejit_kernel_{digest}", path)
        module = importlib.util.module_from_spec(spec)
        module._jit = triton.jit
        spec.loader.exec_module(module)
        fn = getattr(module, kernel.function_stem)
        _modules[source] = fn
        return fn


def write_module(source: str, digest: str) -> str:
    """The path of the module of ``source`` (its digest given) in the cache, written there if
    it is not (a first load, or the cache folder changed or was cleaned since)."""
    path = module_path(digest)
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(source)
        os.replace(tmp, path)
        diskcache.note_write(os.path.dirname(path), len(source))
    return path


def module_path(digest: str) -> str:
    """Where the module of the kernel source with this digest is written (and loaded from, by
    this process and by compile workers: see triton_pool)."""
    return os.path.join(cache_dir("triton"), f"k_{digest}.py")


def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


#: The smallest ``RBLOCK`` of a reduction over a run-time extent: the first call's rows may be
#: short (one token) and later ones long, and every call loops over the block chosen first.
DYNAMIC_MIN_RBLOCK = 32


def configs(kernel: Kernel, interpret: bool, values: dict[str, int] | None = None) -> list[dict]:
    """Launch configs to try, best guess first. A dynamic kernel's are chosen for the sizes
    ``values`` (of its first call) and are correct for every size: a reduction over a run-time
    extent loops, so any ``RBLOCK`` covers any ``rnumel`` (longer rows than the first call's
    loop over it); a static extent is the same at every call. On a GPU each config carries
    the compile options (:data:`triton_render.OPTIONS`: no FMA contraction)."""
    found = _configs(kernel, interpret, values)
    return found if interpret else [{**c, **OPTIONS} for c in found]


def _configs(kernel: Kernel, interpret: bool, values: dict[str, int] | None = None) -> list[dict]:
    if kernel.is_dynamic:
        # The static kernel of these sizes is persistent whenever the dynamic one is (it has the
        # same static rnumel, and at least as many unit strides), so its persistent configs
        # hold the whole row; its looped configs serve a looped dynamic kernel as they are.
        static = kernel.specialize(values)
        found = _configs(static, interpret)
        if (kernel.is_reduction and not isinstance(product(kernel.reduce_sizes), int)
                and is_persistent(static)):
            # Blocks sized to hold the first call's (short) rows: later rows may be far longer.
            found = [_widen_rblock(c) for c in found]
            found = [c for i, c in enumerate(found) if c not in found[:i]]
        return found
    xnumel = product(kernel.outer_sizes)
    xnumel = xnumel if isinstance(xnumel, int) else 1 << 20
    if not kernel.is_reduction:
        # One config, as Inductor's default mode: blocks of 1024 barely differ from the others
        # on a memory-bound kernel, and every config tried is a compile in the first call.
        # (At least 4: a program's random points are whole Philox blocks of 4, see triton_render.)
        xblock = max(4, min(_next_pow2(xnumel), 8192)) if interpret else min(1024, max(256, _next_pow2(xnumel)))
        return [{"XBLOCK": xblock}] if interpret else [{"XBLOCK": xblock, "num_warps": 4 if xblock >= 512 else 2}]
    rnumel = product(kernel.reduce_sizes)
    if is_persistent(kernel):
        rblock = _next_pow2(rnumel)
        if interpret:
            return [{"XBLOCK": max(1, min(_next_pow2(xnumel), 65536 // rblock)), "RBLOCK": rblock}]
        # At most three: blocks of about 2048, 4096 and 1024 elements; rows of 4096 and more
        # are one row a block, with 8, 16 or 4 warps (a 16-bit softmax of 4096-wide rows,
        # one row a program, ran at half the copy bandwidth on an H200: latency, not bytes).
        out = []
        for elems in (2048, 4096, 1024):
            xblock = max(1, min(elems // rblock, 32, _next_pow2(xnumel)))
            size = xblock * rblock
            warps = 1 if size <= 256 else 2 if size <= 512 else 4 if size <= 2048 else 8
            out.append({"XBLOCK": xblock, "RBLOCK": rblock, "num_warps": warps})
        if rblock >= 4096:
            out += [{"XBLOCK": 1, "RBLOCK": rblock, "num_warps": w} for w in (16, 4)]
        return [c for i, c in enumerate(out) if c not in out[:i]][:3]
    inner = triton_render.is_inner_reduction(kernel)
    if interpret:
        if inner:
            return [{"XBLOCK": 1, "RBLOCK": _next_pow2(triton_render.PERSISTENT_LIMIT)}]
        return [{"XBLOCK": min(_next_pow2(xnumel), 1024), "RBLOCK": 16}]
    if not inner:
        # Across rows: neighbouring outputs are neighbours in memory, so a block spans many
        # outputs (coalesced) and a few reduced rows at a time.
        return [{"XBLOCK": x, "RBLOCK": r, "num_warps": w} for x, r, w in
                ((64, 8, 4), (128, 8, 4), (32, 16, 4))]
    return [{"XBLOCK": 1, "RBLOCK": 2048, "num_warps": 8}, {"XBLOCK": 1, "RBLOCK": 1024, "num_warps": 4},
            {"XBLOCK": 1, "RBLOCK": 4096, "num_warps": 16}]


def _widen_rblock(config: dict) -> dict:
    """``config`` with ``RBLOCK`` at least :data:`DYNAMIC_MIN_RBLOCK`, and no more than 1024
    elements per block where it had fewer."""
    if config["RBLOCK"] >= DYNAMIC_MIN_RBLOCK:
        return config
    elems = max(1024, config["XBLOCK"] * config["RBLOCK"])
    xblock = max(1, min(config["XBLOCK"], elems // DYNAMIC_MIN_RBLOCK))
    return {**config, "XBLOCK": xblock, "RBLOCK": DYNAMIC_MIN_RBLOCK}


class Launcher(KernelLauncher):
    """Runs one kernel: ``launcher(*inputs, *sizes) -> output tensor or tuple of them``
    (``sizes``: the values of ``kernel.symbols()``, none for a static kernel).

    ``outputs``: (sizes, strides, dtype, device) of each output; ``seed_index``: position of the
    random-seed argument among the kernel inputs (drawn per call from the device's generator,
    so ``torch.manual_seed`` makes runs reproducible), or None.
    """

    language = "triton"

    def __init__(self, kernel: Kernel, outputs: list[tuple], device: torch.device,
                 seed_index: int | None) -> None:
        self.kernel = kernel
        self.device = device = torch.device(device)
        check_device(device)
        self.interpret = interpreter_enabled()
        self.source = render(kernel, native_bf16=not self.interpret)
        self.fn = load_kernel(kernel, self.source)
        self.outputs = outputs
        self.seed_index = seed_index
        #: The values of the run-time sizes the config was chosen for (the first call's).
        self.values: dict[str, int] = {}
        if kernel.is_dynamic:
            # Set at the first call, from its sizes (see _bind_first).
            self.xnumel = self.rnumel = None
            self.configs = []
        else:
            self.xnumel = int(product(kernel.outer_sizes))
            self.rnumel = int(product(kernel.reduce_sizes)) if kernel.is_reduction else None
            self.configs = configs(kernel, self.interpret)
        self.config: dict | None = None
        self.grid: tuple | None = None
        #: The compiled binary of the chosen config (Triton's CompiledKernel; None under the
        #: interpreter), and whether calls launch it directly (see _build_fast).
        self.binary = None
        self.direct = False
        self.digest = source_hash(self.source)

    def _bind_first(self, values: dict[str, int]) -> None:
        """A dynamic kernel's first call: the sizes its config is chosen (tuned) for."""
        self.values = values
        self.xnumel = evaluate(product(self.kernel.outer_sizes), values)
        if self.kernel.is_reduction:
            self.rnumel = evaluate(product(self.kernel.reduce_sizes), values)
        self.configs = configs(self.kernel, self.interpret, values)

    def _set_config(self, config: dict) -> None:
        """Use ``config``; ``grid`` and ``scalars`` (the kernel's int arguments) are then those
        of the static sizes, or of a dynamic kernel's first call."""
        self.config = config
        self.grid = self._grid(config)
        if self.kernel.is_dynamic:
            self.scalars = tuple(self.values[s.name] for s in self.kernel.symbols())
        else:
            self.scalars = (self.xnumel,) if self.rnumel is None else (self.xnumel, self.rnumel)

    def _grid(self, config: dict) -> tuple[int]:
        """The launch grid of ``config``: one program per XBLOCK outputs."""
        return (-(-self.xnumel // config["XBLOCK"]),)

    def _allocate(self) -> list[torch.Tensor]:
        at = lambda e: tuple(evaluate(x, self.values) for x in e)  # noqa: E731
        return [torch.empty_strided(at(size), at(stride), dtype=dtype, device=self.device)
                for size, stride, dtype in self.outputs]

    def _trial_args(self, inputs: tuple) -> list:
        """The kernel's arguments for compiling and timing it: a fixed seed, so that tuning
        draws nothing from the user's generator (only the calls that return results do, one
        seed each, so ``torch.manual_seed`` gives the same results whether or not the first
        call tuned)."""
        args = list(inputs)
        if self.seed_index is not None:
            args.insert(self.seed_index, torch.zeros((), dtype=torch.int64, device=self.device))
        return args

    def _build_fast(self) -> None:
        """The launch function specialised to the chosen config (see launch.launch_function).

        Through Triton's ``JITFunction`` a launch binds its arguments, works out their
        specialization and looks the binary up in its cache: tens of microseconds of Python per
        launch. Once the first call has shown that launching the compiled binary directly
        gives the same bits (``_direct_matches``), calls go to the binary
        (``CompiledKernel[grid](*args)``, the call ``JITFunction.run`` ends with), as long as
        every input is 16-byte aligned, as the binary may assume; any other call takes
        Triton's own launch, which compiles for what it is given."""
        config = ", ".join(f"{key}={value!r}" for key, value in self.config.items())
        xblock = self.config["XBLOCK"]
        if self.kernel.is_dynamic:
            # The grid from this call's sizes: one integer expression, no Python loop.
            xnumel = expr_text(product(self.kernel.outer_sizes))
            blocks = f"({xnumel} + {xblock - 1}) // {xblock}"
            slow = launch_function(self, f"_run({{args}}{{syms}}, grid=({blocks},), warmup=False, {config})",
                                   {"_run": self.fn.run})
            direct = f"_binary[({blocks}, 1, 1)]({{args}}{{syms}}, {{tail}})"
            binary = {"_binary": self.binary}
        else:
            scalars = ", ".join(repr(v) for v in self.scalars)
            slow = launch_function(self, f"_run({{args}}, {scalars}, {config})", {"_run": self.fn[self.grid]})
            direct = f"_direct({{args}}, {scalars}, {{tail}})"
            binary = {"_direct": self.binary[(*self.grid, 1, 1)]} if self.direct else {}
        self._slow = slow  # Triton's own launch (benchmarks/gpu_profile.py times both)
        if not self.direct:
            self._fast = slow
            return
        tail = ", ".join(repr(v) for v in self._constexpr_tail())
        params = [f"a{i}" for i in range(self.tensor_count)]
        syms = [s.name for s in self.kernel.symbols()]
        prelude = ()
        if params:
            pointers = " | ".join(f"{a}.data_ptr()" for a in params)
            prelude = (f"if ({pointers}) & 15:", f"    return _slow({', '.join(params + syms)})")
        self._set_fast(direct.replace("{tail}", tail), {**binary, "_slow": slow}, prelude)

    def _first_call(self, inputs: tuple):
        # Triton compiles at the first launch: a kernel this device cannot build runs as the
        # group's torch ops from then on, with a warning (never a wrong answer, never a crash).
        # Only compile errors are caught: anything else (a signal handler's exception, an
        # error of the launch itself) propagates.
        t0 = time.perf_counter()
        tensors, values = self.bind_sizes(inputs)
        try:
            if self.kernel.is_dynamic:
                self._bind_first(values)
            self._tune(tensors)
            self._warmup(tensors)
        except compile_errors() as e:
            return self._use_fallback(e, inputs)
        finally:
            triton_pool.release(self)  # the configs not chosen (a config read from the cache)
            record.emit(record.KernelBuilt(language="triton", names=[self.name],
                                           seconds=time.perf_counter() - t0))
        self._build_fast()
        return self._fast(*inputs)

    def _warmup(self, inputs: tuple) -> None:
        """Compile for these arguments without launching (the interpreter compiles nothing),
        and see whether the binary can be launched directly (``direct``)."""
        if self.interpret:
            return
        outs = self._allocate()
        args = self._trial_args(inputs)
        triton_pool.claim(self, self.config)
        self.binary = self.fn.warmup(*args, *outs, *self.scalars, grid=self.grid, **self.config)
        self.direct = self._direct_matches(args)

    def _constexpr_tail(self) -> tuple | None:
        """The values of the kernel's parameters after its buffers and sizes (its block sizes,
        from the config), in the order of its signature; None if one is not in the config."""
        names = list(getattr(self.fn, "arg_names", ()))
        tail = names[len(self.kernel.buffers) + len(self.scalars):]
        if not tail or any(name not in self.config for name in tail):
            return None
        return tuple(self.config[name] for name in tail)

    def _direct_matches(self, args: list) -> bool:
        """Whether launching the compiled binary directly writes the same bits as Triton's
        own launch, on the first call's arguments (a fixed seed, fresh outputs for each). What
        this checks is Triton's calling convention, one per process: a kernel whose outputs
        are too big to allocate twice more (:data:`DIRECT_CHECK_BYTES`) trusts an earlier
        kernel's check, and any failed check turns direct launches off for every later
        kernel. Any doubt keeps Triton's launch. (The binary's launcher reads Triton's launch
        hooks at each call, as JITFunction.run does, so profilers still see direct launches.)"""
        global _direct_ok
        tail = self._constexpr_tail()
        if _direct_ok is False or self.binary is None or tail is None \
                or not hasattr(self.binary, "__getitem__"):
            return False
        at = lambda e: evaluate(product(e), self.values)  # noqa: E731
        if sum(at(size) * dtype.itemsize for size, _, dtype in self.outputs) > DIRECT_CHECK_BYTES:
            return bool(_direct_ok)
        want, got = self._allocate(), self._allocate()
        self.fn[self.grid](*args, *want, *self.scalars, **self.config)
        try:
            self.binary[(*self.grid, 1, 1)](*args, *got, *self.scalars, *tail)
            same = all(_same_bits(a, b) for a, b in zip(want, got))
        except (TypeError, ValueError, AttributeError, IndexError):  # another calling convention
            same = False
        if _direct_ok is None or not same:
            _direct_ok = same
        return same

    def _tune(self, inputs: tuple) -> None:
        key = (self.digest, (self.xnumel, self.rnumel))
        best = _best.get(key) or (None if self.interpret else _read_best(self.digest, key[1]))
        if best is None:
            if self.interpret or len(self.configs) == 1:
                best = self.configs[0]
            else:
                best = self._benchmark(inputs)
                _write_best(self.digest, key[1], best)
        _best[key] = best
        self._set_config(best)

    def _benchmark(self, inputs: tuple) -> dict:
        from triton.testing import do_bench

        args = self._trial_args(inputs)
        outs = self._allocate()
        timings = []
        for config in self._compile_configs(args, outs):
            self._set_config(config)
            try:
                run = self.fn[self.grid]
                # A few milliseconds each: do_bench clears the L2 cache before every run, which
                # takes longer than most of these kernels, and this time is the first call's.
                ms = do_bench(lambda run=run, config=config: run(*args, *outs, *self.scalars, **config),
                              warmup=1, rep=3)
            except compile_errors():  # a config the device cannot run (out of resources)
                continue
            timings.append((ms, config))
        if not timings:
            raise KernelCompileError(f"no launch config of kernel {self.name} runs on {self.device}")
        return min(timings, key=lambda t: t[0])[1]

    def _compile_configs(self, args: list, outs: list) -> list[dict]:
        """The configs that compile, each compiled for ``args`` and ``outs``: the first alone
        (it sets up Triton's caches of this function), the others at once on threads, which
        overlap where Triton's compiler lets go of the GIL (LLVM's code generation, ptxas: about
        half of a compile, 1.6x faster for four configs on two cores). A config that fails to
        compile is left out; any other error propagates."""
        self._set_config(self.configs[0])  # the size arguments, the same for every config

        def build(config: dict) -> dict | None:
            triton_pool.claim(self, config)
            try:
                self.fn.warmup(*args, *outs, *self.scalars, grid=self._grid(config), **config)
            except compile_errors():
                return None
            return config

        first, rest = self.configs[0], self.configs[1:]
        built = [build(first)]
        if rest:
            with ThreadPoolExecutor(max_workers=min(len(rest), os.cpu_count() or 1)) as pool:
                built += list(pool.map(build, rest))
        return [c for c in built if c is not None]


#: Outputs larger than this (bytes, all of a kernel's together) are not allocated twice more
#: to check a direct launch; the kernel relies on an earlier kernel's check.
DIRECT_CHECK_BYTES = 64 << 20

#: What the checks of direct launches found in this process: None before the first.
_direct_ok: bool | None = None


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` hold the same values, NaN where the other has NaN."""
    if a.is_floating_point():
        return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0))
    return torch.equal(a, b)


def _best_path(digest: str) -> str:
    return os.path.join(cache_dir("triton"), f"k_{digest}.best.json")


def _read_best(digest: str, sizes) -> dict | None:
    try:
        with open(_best_path(digest)) as f:
            return json.load(f).get(repr(sizes))
    except (OSError, ValueError):
        return None


def _write_best(digest: str, sizes, config: dict) -> None:
    path = _best_path(digest)
    try:
        try:
            with open(path) as f:
                table = json.load(f)
        except (OSError, ValueError):
            table = {}
        table[repr(sizes)] = config
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(table, f)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache only costs tuning again
