"""The type of a generated tensor expression, found by running the expression on probe tensors.

A ``Ty`` holds the symbolic shape (dims ``"A"``, ``"B"`` or ``1``), the dtype, and ``err``: how
many fp16/bf16 roundings eager makes that compiled code may leave out. Eager rounds the result of
every fp16/bf16 op; a kernel computes in fp32 and rounds on store and where the program converts
(README, "which conversions round"), as Inductor does. So a value with ``err > 0`` agrees with
eager only up to the tolerance of its dtype, and the generator lets it reach only ops that stay
in its dtype and are continuous (no comparison, conversion, floor or argmax), and so only results
of its dtype, which compare.py compares with that dtype's tolerance.

``infer`` finds the result's dtype and shape, and whether eager accepts the op at all (an
integer tensor's ``mean()``, ``** -1``, a float ``alpha`` on integers, a cast an in-place op
cannot make), by evaluating the expression's template on small probe tensors: ``A`` is 2 and
``B`` is 3, so the probe's shape names the symbolic one.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

FULL = ("A", "B")
ROW = ("B",)
COL = ("A", 1)
ONE = (1,)
SCALAR = ()

F32 = torch.float32
HALVES = (torch.float16, torch.bfloat16)
INTS = (torch.int64, torch.int32, torch.int8, torch.uint8)

# Skipped roundings a value may carry: a short chain of fp16 ops stays within tolerance.
MAX_ERR = 2

_PROBE_SIZE = {"A": 2, "B": 3, 1: 1}
_SIZE_DIM = {2: "A", 3: "B", 1: 1}


@dataclass(frozen=True)
class Ty:
    shape: tuple
    dtype: torch.dtype = F32
    err: int = 0

    @property
    def exact(self) -> bool:
        return self.err == 0

    @property
    def floating(self) -> bool:
        return self.dtype.is_floating_point


@dataclass(frozen=True)
class Num:
    """A Python number in an expression: its source and a value of the same type for the probe
    (the source may be a name or ``len(lst)``, unknown until run time)."""
    code: str
    value: int | float


def probe_tensor(ty: Ty) -> torch.Tensor:
    return torch.ones([_PROBE_SIZE[d] for d in ty.shape], dtype=ty.dtype)


@lru_cache(maxsize=4096)
def _compiled(text: str):
    return compile(text, "<probe>", "eval")


def infer(template: str, operands: list, *, rounds: bool, discrete: bool = False,
          probe: str | None = None, inplace_of: Ty | None = None) -> Ty | None:
    """The type of ``template.format(*operands)``, or None where eager would raise or the
    result could not be compared (see the module docstring).

    ``operands`` are ``(code, Ty)`` pairs and ``Num``s. ``rounds``: the op computes (an fp16
    result of it is one more rounding); ``discrete``: the result jumps with its inputs, so they
    must be exact; ``probe``: a template to evaluate instead (for helpers the probe cannot
    call); ``inplace_of``: the type of the tensor an in-place op writes, which must not gain
    skipped roundings (later code may have read it as exact)."""
    env = {"torch": torch}
    names = []
    for i, op in enumerate(operands):
        name = f"_{i}"
        names.append(name)
        env[name] = op.value if isinstance(op, Num) else probe_tensor(op[1])
    try:
        out = eval(_compiled((probe or template).format(*names)), env)  # noqa: S307
    except Exception:  # eager rejects it: the generator picks something else
        return None
    if not isinstance(out, torch.Tensor) or out.dtype == torch.bool:
        return None
    if any(size not in _SIZE_DIM for size in out.shape):
        return None
    shape = tuple(_SIZE_DIM[size] for size in out.shape)
    types = [op[1] for op in operands if not isinstance(op, Num)]
    err = max((t.err for t in types), default=0)
    if err and (discrete or any(t.err and t.dtype != out.dtype for t in types)):
        return None
    if out.dtype in HALVES:
        # A number selected into fp16 values (where, clamp) is rounded to fp16 as eager does; in
        # arithmetic it may stay fp32 (README), which the op's own rounding covers.
        err += rounds
    if err > MAX_ERR or (inplace_of is not None and err > inplace_of.err):
        return None
    return Ty(shape, out.dtype, err)


def guard_int(code: str, source: Ty, target: torch.dtype) -> str:
    """``code`` made safe to convert to the integer ``target``: a float outside the target's
    range (or NaN) converts as the C compiler pleases, in eager as in a kernel. Negative floats
    to uint8 are defined (c10 goes through int64: -100.0 -> 156) and kept."""
    if source.floating and not target.is_floating_point:
        return f"{code}.nan_to_num().clamp(-100, {200 if target == torch.uint8 else 100})"
    return code
