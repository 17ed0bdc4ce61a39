"""``--isa avx2`` for the CPU benchmarks: measure as on a machine with AVX2 (and FMA, F16C) but
no AVX-512, which most laptops and desktops are, on this one. Imported before torch.

- framejit builds its C kernels with ``-mno-avx512f`` (``FRAMEJIT_CFLAGS``);
- eager torch dispatches to its AVX2 kernels (``ATEN_CPU_CAPABILITY=avx2``, which torch reads
  when it is imported: the script runs itself again with it set);
- Inductor generates AVX2 code (``torch._inductor.config.cpp.simdlen = 256``).

MKL and oneDNN (matmul, convolution) still pick their code by the CPU itself, for all three.
"""

from __future__ import annotations

import os
import sys

CHOICES = ("native", "avx2")


def isa_from_argv(argv: list[str]) -> str:
    for i, arg in enumerate(argv):
        if arg == "--isa" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--isa="):
            return arg.split("=", 1)[1]
    return "native"


def reexec_for_isa() -> None:
    """With ``--isa avx2``, run this script again with the environment set (before torch)."""
    if isa_from_argv(sys.argv[1:]) != "avx2" or os.environ.get("ATEN_CPU_CAPABILITY") == "avx2":
        return
    env = dict(os.environ, ATEN_CPU_CAPABILITY="avx2",
               FRAMEJIT_CFLAGS=f"{os.environ.get('FRAMEJIT_CFLAGS', '')} -mno-avx512f".strip())
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


def configure_inductor(isa: str) -> str:
    """Point Inductor at ``isa``; a line saying what each compiler targets."""
    if isa != "avx2":
        return "isa: native (each compiler's own choice for this CPU)"
    import torch._inductor.config as config

    config.cpp.simdlen = 256
    return (f"isa: avx2 (framejit FRAMEJIT_CFLAGS={os.environ.get('FRAMEJIT_CFLAGS')!r}, eager "
            f"ATEN_CPU_CAPABILITY={os.environ.get('ATEN_CPU_CAPABILITY')}, Inductor simdlen 256)")
