"""What every kernel launcher shares, whatever renders its kernel (Triton, C).

A launcher is called ``launcher(*inputs)`` and returns the output tensor, or a tuple of them.
Its first call builds (compiles, tunes) the kernel, then a generated launch function specialised
to it (:func:`launch_function`): allocate the outputs, draw the random seed if the kernel has
one, call the kernel, return. A kernel that cannot be built on its device runs as its group's
torch ops from then on (``fallback``, set by the pipeline), with one warning.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

import torch

from .ir import Kernel


def cache_dir(kind: str) -> str:
    """The disk cache folder of one kind of kernel (``triton``, ``c``):
    ``$FRAMEJIT_CACHE_DIR/<kind>``, by default under ``~/.cache/framejit``."""
    root = os.environ.get("FRAMEJIT_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "framejit")
    path = os.path.join(root, kind)
    os.makedirs(path, exist_ok=True)
    return path


class KernelLauncher:
    """Base of the launchers: ``kernel``, ``outputs`` ((sizes, strides, dtype) per output),
    ``device`` and ``seed_index`` (position of the per-call seed among the kernel's inputs)."""

    #: The group's torch ops (set by the pipeline): what runs if the kernel cannot be built.
    fallback: Callable[..., Any] | None = None
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
        self._fast = self.fallback
        return self.fallback(*inputs)

    def _set_fast(self, call: str, namespace: dict[str, Any]) -> None:
        self._fast = launch_function(self, call, namespace)


def launch_function(launcher: KernelLauncher, call: str, namespace: dict[str, Any]):
    """The generated launch function of ``launcher``: ``call`` is the kernel call with
    ``{args}`` where the inputs (and seed) and outputs go; ``namespace`` binds its names."""
    kernel = launcher.kernel
    n_in = len(kernel.inputs) - (launcher.seed_index is not None)
    params = [f"a{i}" for i in range(n_in)]
    namespace = {**namespace, "_empty": torch.empty_strided, "_randint": torch.randint,
                 "_i64": torch.int64, "_dev": launcher.device}
    lines = [f"def launch_{kernel.name}({', '.join(params)}):"]
    outs = []
    for k, (size, stride, dtype) in enumerate(launcher.outputs):
        namespace[f"_dt{k}"] = dtype
        lines.append(f"    o{k} = _empty({tuple(size)!r}, {tuple(stride)!r}, dtype=_dt{k}, device=_dev)")
        outs.append(f"o{k}")
    args = list(params)
    if launcher.seed_index is not None:
        args.insert(launcher.seed_index, "_randint(2147483647, (), dtype=_i64, device=_dev)")
    lines.append("    " + call.format(args=", ".join(args + outs)))
    lines.append(f"    return {outs[0] if len(outs) == 1 else '(' + ', '.join(outs) + ',)'}")
    exec(compile("\n".join(lines) + "\n", f"<framejit-launch {kernel.name}>", "exec"), namespace)
    return namespace[f"launch_{kernel.name}"]
