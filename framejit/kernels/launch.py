"""What every kernel launcher shares, whatever renders its kernel (Triton, C).

A launcher is called ``launcher(*inputs, *sizes)`` and returns the output tensor, or a tuple of
them. ``sizes`` are the values of the kernel's run-time sizes (``kernel.symbols()``, in order),
Python ints; a kernel with static sizes takes none.
Its first call builds (compiles, tunes) the kernel, then a generated launch function specialised
to it (:func:`launch_function`): allocate the outputs, draw the random seed if the kernel has
one, call the kernel, return. A kernel that cannot be built on its device runs as its group's
torch ops from then on (``fallback``, set by the pipeline), with one warning.
"""

from __future__ import annotations

import operator
import warnings
from collections.abc import Callable
from typing import Any

import torch

from .. import diskcache, record
from .ir import Kernel, evaluate, expr_text


def cache_dir(kind: str) -> str:
    """The disk cache folder of one kind of kernel (``triton``, ``c``):
    ``$FRAMEJIT_CACHE_DIR/<kind>``, by default under ``~/.cache/framejit``."""
    return diskcache.folder(kind)


class KernelLauncher:
    """Base of the launchers: ``kernel``, ``outputs`` ((sizes, strides, dtype) per output; sizes
    and strides may be :class:`~framejit.kernels.ir.Sym` expressions of the kernel's run-time
    sizes), ``device`` and ``seed_index`` (position of the per-call seed among the kernel's
    inputs)."""

    #: The group's torch ops (set by the pipeline): what runs if the kernel cannot be built, or
    #: when an input's strides are not those the kernel was built for.
    fallback: Callable[..., Any] | None = None
    #: Input position -> (sizes, strides) predicted at compile time, for the inputs whose real
    #: strides the pipeline cannot vouch for (outputs of torch ops, whose example values come
    #: from meta kernels that may lay out a result differently from the real kernel). Each call
    #: checks them; an input laid out otherwise runs the group's torch ops (set by the pipeline).
    checked_inputs: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}
    #: Calls that ran ``fallback`` because an input's strides differed from the prediction.
    layout_misses = 0
    #: Output index -> input index: outputs written over an input that dies at this call
    #: (set by :func:`donate_dead_inputs`; without grad only).
    donated: dict[int, int] = {}
    #: How ``repr`` names the kernel's language.
    language = "kernel"
    _fast: Callable[..., Any] | None = None
    kernel: Kernel
    outputs: list[tuple]
    device: torch.device
    seed_index: int | None

    @property
    def name(self) -> str:
        return self.kernel.name

    def __repr__(self) -> str:
        return f"<{self.language} kernel {self.kernel.name}>"

    def __call__(self, *inputs: torch.Tensor):
        if self._fast is None:
            return self._first_call(inputs)
        return self._fast(*inputs)

    def _first_call(self, inputs: tuple):
        raise NotImplementedError

    def _use_fallback(self, error: BaseException, inputs: tuple):
        """Run the group's torch ops from now on (the kernel could not be built)."""
        if self.fallback is None:
            raise error
        warnings.warn(f"framejit: kernel {self.name} failed to compile on {self.device} "
                      f"({type(error).__name__}: {error}); its operations run as torch ops instead",
                      stacklevel=3)
        n, fallback = self.tensor_count, self.fallback
        self._fast = fallback if not self.kernel.symbols() else lambda *a: fallback(*a[:n])
        return fallback(*inputs[:n])

    def _set_fast(self, call: str, namespace: dict[str, Any], prelude: tuple[str, ...] = ()) -> None:
        self._fast = launch_function(self, call, namespace, prelude)

    def _layout_miss(self, *inputs):
        """An input is not laid out as the kernel expects: run the group's torch ops (the
        first time, say so in the record: ``stats()["kernel_layout_misses"]``, the kernels
        log)."""
        if self.fallback is None:
            raise RuntimeError(f"kernel {self.name}: an input's strides differ from those it was "
                               f"compiled for and it has no fallback")
        if not self.layout_misses:
            self._record_miss(inputs)
        self.layout_misses += 1
        return self.fallback(*inputs[:self.tensor_count])

    def _record_miss(self, inputs: tuple) -> None:
        _, values = self.bind_sizes(inputs)
        found = []
        for i, (size, stride) in sorted(self.checked_inputs.items()):
            t = inputs[i]
            want = tuple(int(evaluate(s, values)) for s in stride)
            if not layout_fits(t, tuple(int(evaluate(s, values)) for s in size), want):
                found.append(f"input {i} has strides {tuple(t.stride())}, compiled for {want}")
        record.emit(record.KernelLayoutMiss(
            name=self.name, reason="; ".join(found) or "an input's layout differs"))

    @property
    def tensor_count(self) -> int:
        """How many of the call's arguments are tensors (the run-time sizes follow them)."""
        return len(self.kernel.inputs) - (self.seed_index is not None)

    def bind_sizes(self, args: tuple) -> tuple[tuple, dict[str, int]]:
        """A call's arguments split into its tensors and the values of the run-time sizes."""
        n = self.tensor_count
        return args[:n], {s.name: int(v) for s, v in zip(self.kernel.symbols(), args[n:])}


def layout_fits(t: torch.Tensor, size: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """Whether ``t`` (of sizes ``size``) addresses its elements as ``stride`` does: strides of
    dimensions of size 1, and all strides of an empty tensor, never matter."""
    if t.numel() == 0:
        return True
    return all(n == 1 or a == b for n, a, b in zip(size, t.stride(), stride))


def _cpu_allocator():
    """torch's C++ allocation of a CPU tensor of given sizes, strides and dtype, which
    Inductor's generated wrappers call (about 1.0 µs where ``torch.empty_strided`` takes 2.4:
    no argument parsing, no default device or dtype to look up); None where torch lacks it."""
    try:
        from torch._C._dynamo.guards import _empty_strided_cpu
    except ImportError:
        return None
    try:
        t = _empty_strided_cpu((2, 3), (1, 2), torch.float16)
    except Exception:  # (a private API: any trouble, and torch.empty_strided it is)
        return None
    ok = (t.device.type == "cpu" and t.dtype == torch.float16 and t.shape == (2, 3)
          and t.stride() == (1, 2) and not t.requires_grad)
    return _empty_strided_cpu if ok else None


_EMPTY_STRIDED_CPU = _cpu_allocator()


def launch_function(launcher: KernelLauncher, call: str, namespace: dict[str, Any],
                    prelude: tuple[str, ...] = ()):
    """The generated launch function of ``launcher``: ``call`` is the kernel call with
    ``{args}`` where the inputs (and seed) and outputs go and ``{syms}`` where the run-time
    sizes go (``", ks0, ks1"``, empty for a static kernel); ``call`` may also use the run-time
    sizes by name (a grid, say). ``namespace`` binds its other names. ``prelude``: lines run
    after the layout checks, before anything is allocated (the inputs are ``a0``, ``a1``, ...,
    the run-time sizes by name)."""
    kernel = launcher.kernel
    params = [f"a{i}" for i in range(launcher.tensor_count)]
    syms = [s.name for s in kernel.symbols()]
    namespace = {**namespace, "_empty": torch.empty_strided, "_randint": torch.randint,
                 "_i64": torch.int64, "_dev": launcher.device, "_fits": layout_fits,
                 "_miss": launcher._layout_miss}
    lines = [f"def launch_{kernel.name}({', '.join(params + syms)}):"]
    for i, (size, stride) in sorted(launcher.checked_inputs.items()):
        # One tuple comparison per call; the careful check only when it differs.
        size, stride = expr_text(tuple(size)), expr_text(tuple(stride))
        lines.append(f"    if a{i}.stride() != {stride} and not _fits(a{i}, {size}, {stride}):")
        lines.append(f"        return _miss({', '.join(params + syms)})")
    lines += [f"    {line}" for line in prelude]
    outs = []
    if launcher.donated:
        namespace["_grad"] = torch.is_grad_enabled
        lines.append("    fresh = _grad()")
    cpu_empty = _EMPTY_STRIDED_CPU if torch.device(launcher.device).type == "cpu" else None
    if cpu_empty is not None:
        namespace["_empty_cpu"] = cpu_empty
    for k, (size, stride, dtype) in enumerate(launcher.outputs):
        namespace[f"_dt{k}"] = dtype
        if cpu_empty is not None:
            empty = f"_empty_cpu({expr_text(tuple(size))}, {expr_text(tuple(stride))}, _dt{k})"
        else:
            empty = (f"_empty({expr_text(tuple(size))}, {expr_text(tuple(stride))}, "
                     f"dtype=_dt{k}, device=_dev)")
        if k in launcher.donated:
            empty = f"{empty} if fresh else a{launcher.donated[k]}"
        lines.append(f"    o{k} = {empty}")
        outs.append(f"o{k}")
    args = list(params)
    if launcher.seed_index is not None:
        args.insert(launcher.seed_index, "_randint(2147483647, (), dtype=_i64, device=_dev)")
    lines.append("    " + call.format(args=", ".join(args + outs),
                                        syms="".join(f", {s}" for s in syms)))
    lines.append(f"    return {outs[0] if len(outs) == 1 else '(' + ', '.join(outs) + ',)'}")
    exec(diskcache.compiled("\n".join(lines) + "\n", f"<framejit-launch {kernel.name}>"), namespace)
    return namespace[f"launch_{kernel.name}"]


#: Torch ops whose result is a tensor of its own (fresh storage that nothing else refers to):
#: a kernel that is the only user of such a value may write its output over it.
_FRESH = frozenset({
    "mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "embedding", "convolution", "conv2d",
})


def _fresh_name(target: Any) -> str:
    name = getattr(target, "__name__", "") if not isinstance(target, str) else ""
    return name.split(".")[0]


def donate_dead_inputs(kernel_calls: dict) -> None:
    """Outputs written over dead inputs, as Inductor reuses buffers: for each C kernel call of
    the wrapper graph (``kernel_calls``: call node -> launcher), an input that is a fresh tensor (a
    matmul's result, another kernel's output), used by this call alone and laid out as an
    output, becomes that output (``launcher.donated``: output index -> input index). The
    kernel reads each element of it at the index it writes, and only before writing it (stores
    come last in a row, and each point reads its own row), so computing in place gives the same
    bits; a relu of a matmul's result then writes to memory still in cache instead of to a
    fresh allocation (4x faster for T5's FFN). With grad enabled outputs are always fresh (an
    autograd graph may hold the input)."""
    for call, launcher in kernel_calls.items():
        if getattr(launcher, "language", "") != "c" or launcher.kernel.symbols():
            continue
        kernel = launcher.kernel
        if "(fj_scratch)" in launcher.source:
            # An output row holds a value until the row's last loop (c_render.output_scratch):
            # a later loop may still read an input given as that output.
            continue
        inputs = [b for b in kernel.buffers if not b.is_output]
        outputs = [b for b in kernel.buffers if b.is_output]
        tensor_inputs = [i for i in range(len(inputs)) if i != launcher.seed_index]
        donated: dict[int, int] = {}
        for position, arg in enumerate(call.args[:len(tensor_inputs)]):
            if not _donor(arg, call, kernel_calls) or call.args.count(arg) != 1:
                continue
            val = arg.meta.get("val")
            buffer = inputs[tensor_inputs[position]]
            for k, (size, stride, dtype) in enumerate(launcher.outputs):
                if k in donated or dtype != val.dtype or tuple(val.shape) != tuple(size) \
                        or tuple(val.stride()) != tuple(stride) \
                        or not kernel.may_share_memory(buffer, outputs[k]):
                    continue
                donated[k] = position
                break
        launcher.donated = donated


def _dense(val: torch.Tensor) -> bool:
    """Whether ``val`` covers its storage span exactly once (some order of its dimensions is
    contiguous)."""
    step = 1
    for stride, size in sorted((st, s) for s, st in zip(val.shape, val.stride()) if s != 1):
        if stride != step:
            return False
        step *= size
    return True


def _donor(arg, call, kernel_calls) -> bool:
    """Whether ``arg`` (a node of the wrapper graph) is a fresh, dense tensor that ``call``
    alone uses."""
    if not hasattr(arg, "op") or arg.op != "call_function" or set(arg.users) != {call}:
        return False
    val = arg.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.requires_grad or val.numel() == 0 \
            or any(not isinstance(s, int) for s in (*val.shape, *val.stride())) \
            or not _dense(val):
        return False
    source = arg
    if arg.target is operator.getitem and arg.args and hasattr(arg.args[0], "op"):
        source = arg.args[0]
    if source in kernel_calls:
        return True
    # (a matmul with ``out=`` returns the caller's tensor)
    return source is arg and _fresh_name(arg.target) in _FRESH and not arg.is_impure()
