"""A differential fuzzer of fused kernels: random chains of the patterns kernels fuse (pointwise
ops, row and column reductions, norms, softmax, rotary's cat) over rows of 1 to 8193 elements,
in fp32, fp16 and bf16, on contiguous, transposed, strided, sliced and broadcast inputs, with
NaN, inf and subnormals mixed in, at one and two threads, and on a second row count (the
dynamic kernel).

The program fuzzer (tests/fuzz) draws rows of up to 40 elements; kernels take other paths on
longer rows (sum chunks, row buffers in output rows, rows cut in parts, vector tiles), and
those are what this one reaches.

Two oracles, in order:

- the C kernels against the description's reference interpreter (``ReferenceLauncher``): both
  compute the same fp32 ops, so they agree to fp32 rounding, which finds renderer bugs;
- the compiled result against eager torch (``assert_close_to_eager``), reported rather than
  failed: "ill-conditioned" where eager's own result moves as far on inputs an ulp or two away
  (:func:`ill_conditioned`), "eager-rounding" where the compiled result is no further than
  eager's from the program in float64 (:func:`closer_to_exact`) or from the program with
  correctly rounded 16-bit ops (:func:`closer_to_rounded`), "differs" elsewhere, for a
  person to look at. fp16/bf16 values
  between fused ops stay fp32 where eager rounds each op, so a chain that divides by a
  difference near 0 or compares near a threshold moves by more than a tolerance can allow, and
  sums of terms that cancel lose as much to another summation order.

``python -m tests.kernels.pattern_fuzz --seeds 0:2000`` runs a campaign and prints each
failing and differing case (``--seed N`` one case, verbosely); tests/kernels/test_pattern_fuzz.py runs a
fixed sample.
"""

from __future__ import annotations

import argparse
import random
import sys
import traceback
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import framejit
from framejit.testing import TOLERANCES, assert_close_to_eager

#: Ops of one operand ``{0}``.
POINTWISE = [
    "{0}.exp()", "torch.tanh({0})", "torch.sigmoid({0})", "F.silu({0})", "F.gelu({0})",
    "F.gelu({0}, approximate='tanh')", "torch.relu({0})", "{0}.abs()", "(-{0})",
    "({0}.abs() + 0.5).sqrt()", "({0}.abs() + 1).rsqrt()", "({0}.abs() + 1).log()",
    "torch.erf({0})", "({0} * 1.5)", "({0} + 0.25)", "{0}.clamp(-0.5, 0.7)",
    "torch.where({0} > 0, {0}, {0} * 0.1)", "({0} * {0})", "(1 / (1 + {0}.abs()))",
    "{0}.float()", "{0}.to(torch.bfloat16)", "{0}.to(torch.float16)",
    "torch.maximum({0}, {0} * 0.5)", "{0}.masked_fill({0} > 1, float('-inf'))",
]
#: Ops that reduce ``{0}`` along a dimension and use the result at every point.
ROWWISE = [
    "torch.softmax({0}, -1)", "torch.log_softmax({0}, -1)", "({0} - {0}.mean(-1, keepdim=True))",
    "F.layer_norm({0}, ({0}.shape[-1],), W.to({0}.dtype), B.to({0}.dtype))",
    "F.layer_norm({0}, ({0}.shape[-1],))", "F.rms_norm({0}, ({0}.shape[-1],), W.to({0}.dtype))",
    "({0} * torch.rsqrt({0}.float().pow(2).mean(-1, keepdim=True) + 1e-6).to({0}.dtype))",
    "({0} / ({0}.abs().sum(-1, keepdim=True) + 1))", "({0} - {0}.amax(-1, keepdim=True))",
    "({0} * {0}.var(-1, keepdim=True))", "({0} + {0}.amin(-1, keepdim=True))",
    "({0} - {0}.mean(0, keepdim=True))", "({0} * {0}.sum(0, keepdim=True))", "torch.softmax({0}, 0)",
]
#: Ops of ``{0}`` and another input ``{1}``: the same shape, a row (YB, W), a column (YC).
BINARY = ["({0} + {1})", "({0} * {1})", "({0} - {1})", "torch.maximum({0}, {1})",
          "torch.where({0} > {1}, {0}, {1})"]
OTHERS = ["y", "YB", "YC", "x", "W"]
#: rotate_half's cat, as a rotary embedding uses it.
ROTARY = ("(torch.cat([-{0}[..., {0}.shape[-1] // 2:], {0}[..., :{0}.shape[-1] // 2]], -1) * S"
          " + {0} * C)")
#: A last reduction, sometimes.
REDUCTIONS = ["{0}.sum(-1)", "{0}.mean(-1)", "{0}.amax(-1)", "{0}.sum(0)", "{0}.var(-1)",
              "{0}.sum()", "{0}.float().mean()", "{0}.argmax(-1)", "{0}.std(0)"]
ROW_LENGTHS = [1, 2, 3, 7, 8, 9, 15, 16, 17, 24, 31, 32, 33, 48, 63, 64, 65, 96, 100, 127, 128,
               129, 192, 255, 256, 257, 384, 511, 512, 513, 768, 1000, 1024, 1025, 2047, 2048,
               2049, 4096, 4097, 8193]
ROW_COUNTS = [1, 2, 3, 4, 5, 7, 16, 33, 64]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
LAYOUTS = ["contiguous", "contiguous", "transposed", "step", "slice", "broadcast"]


@dataclass
class Case:
    seed: int
    expr: str
    dtype: torch.dtype
    rows: list[int]  # one call per row count: a second one runs the dynamic kernel
    n: int
    layout: str
    special: bool
    threads: int

    def source(self) -> str:
        return f"def fn(x, y, YB, YC, W, B, S, C):\n    return {self.expr}\n"

    def describe(self) -> str:
        return (f"seed {self.seed}: {self.expr}\n  dtype={self.dtype} rows={self.rows} n={self.n} "
                f"layout={self.layout} special={self.special} threads={self.threads}")


def generate(seed: int) -> Case:
    rng = random.Random(seed)
    expr = "x"
    for _ in range(rng.randint(1, 4)):
        k = rng.random()
        if k < 0.4:
            expr = rng.choice(POINTWISE).format(expr)
        elif k < 0.7:
            expr = rng.choice(ROWWISE).format(expr)
        elif k < 0.85:
            expr = rng.choice(BINARY).format(expr, rng.choice(OTHERS))
        else:
            expr = ROTARY.format(expr)
    if rng.random() < 0.3:
        expr = rng.choice(REDUCTIONS).format(expr)
    n = rng.choice(ROW_LENGTHS)
    if "S + " in expr and n % 2:
        n += 1
    rows = [rng.choice(ROW_COUNTS)]
    if rng.random() < 0.4:
        rows.append(rng.choice(ROW_COUNTS))
    return Case(seed, expr, rng.choice(DTYPES), rows, n, rng.choice(LAYOUTS),
                rng.random() < 0.2, rng.choice([1, 2]))


def inputs(case: Case, rows: int, g: torch.Generator) -> tuple:
    n, dt = case.n, case.dtype

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(dt)

    x = {"contiguous": lambda: randn(rows, n),
         "transposed": lambda: randn(n, rows).t(),
         "step": lambda: randn(rows, 2 * n)[:, ::2],
         "slice": lambda: randn(rows + 1, n + 3)[1:, 2:n + 2],
         "broadcast": lambda: randn(1, n).expand(rows, n)}[case.layout]()
    if case.special and case.layout != "broadcast" and x.numel():
        x = x.clone()
        specials = [float("nan"), float("inf"), float("-inf"), 0.0,
                    1e-40 if dt == torch.float32 else 2.0 ** -24]  # a subnormal
        rng = random.Random(case.seed * 31 + rows)
        for value in specials:
            if rng.random() < 0.5:
                x[rng.randrange(rows), rng.randrange(n)] = value
    return (x, randn(rows, n), randn(1, n), randn(rows, 1), randn(n), randn(n), randn(n), randn(n))


def _reference_backend(gm, example_inputs):
    """The kernel pipeline with the description's reference interpreter as every kernel."""
    from framejit.kernels.reference import ReferenceLauncher
    from framejit.pipeline import compile_with_kernels

    return compile_with_kernels(gm, example_inputs, ("cpu",), launcher=ReferenceLauncher)


def close_to_reference(got, ref) -> bool:
    """Whether the C kernels' result agrees with the reference interpreter's: the same values to
    fp32 rounding (relative to the result's scale), and the same NaN and inf places but for a
    few (an exp or erf an ulp apart can cross a threshold)."""
    if type(got) is not type(ref):
        return False
    if isinstance(got, tuple):
        return len(got) == len(ref) and all(map(close_to_reference, got, ref))
    if got.shape != ref.shape or got.dtype != ref.dtype:
        return False
    if not got.dtype.is_floating_point:
        return (got != ref).sum().item() <= max(2, got.numel() // 1000)
    g, r = got.double(), ref.double()
    allowed = max(2, g.numel() // 1000)
    if (g.isnan() != r.isnan()).sum() > allowed or (g.isfinite() != r.isfinite()).sum() > allowed:
        return False
    both = g.isfinite() & r.isfinite()
    if not both.any():
        return True
    scale = max(1.0, r[both].abs().max().item())
    tolerance = 1e-3 if got.dtype == torch.float32 else 2e-2
    return (g - r)[both].abs().max().item() <= tolerance * scale


#: An ulp of each floating dtype near 1, by which ill_conditioned moves the inputs.
_ULP = {torch.float32: 2.0 ** -23, torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}


def _far(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Where ``a`` is not close to ``b`` by assert_close_to_eager's tolerances for b's dtype."""
    if not b.dtype.is_floating_point:
        return a != b
    rtol, atol = TOLERANCES[b.dtype]
    a, b = a.double(), b.double()
    same = (a == b) | (a.isnan() & b.isnan())
    return ~same & ~((a - b).abs() <= atol + rtol * b.abs())


def ill_conditioned(fn, args, got, want) -> bool:
    """Whether eager itself, on inputs an ulp or two away, moves out of tolerance everywhere the
    compiled result is: eager rounds fp16/bf16 values after each op, and compiled kernels keep
    them fp32 between fused ops, so a program that divides by a difference near 0 or compares
    near a threshold cannot tell a wrong answer from a right one there. A wrong answer in a
    well-conditioned program stays a failure."""
    g = torch.Generator().manual_seed(0)

    def moved(a):
        if not (isinstance(a, torch.Tensor) and a.dtype.is_floating_point):
            return a
        signs = torch.randint(0, 2, a.shape, generator=g).double() * 2 - 1
        return (a.double() * (1 + 2 * _ULP[a.dtype] * signs)).to(a.dtype)

    def as_list(v):
        return list(v) if isinstance(v, tuple) else [v]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runs = [as_list(fn(*map(moved, args))) for _ in range(2)]  # where either moves
    for k, (g_, w) in enumerate(zip(as_list(got), as_list(want))):
        far = _far(g_, w)
        stable = far.clone()
        for run in runs:
            stable &= ~_far(run[k], w)
        # a few places where the random moves happened to cancel
        if stable.sum() > max(2, far.sum() // 100):
            return False
    return True


def closer_to_exact(fn, args, got, want) -> bool:
    """Whether, everywhere ``got`` is out of tolerance of eager's ``want``, it is at least as
    close as ``want`` to the program evaluated in float64 (its inputs widened; an explicit
    conversion in the program still rounds): the difference is eager's rounding of each op's
    fp16/bf16 result, which fused kernels keep fp32 (as Inductor does), not a wrong answer."""
    wide = [a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exact = fn(*wide)
    except Exception:
        return False
    return _no_further(got, want, exact)


def _pairs(got, want, reference):
    return zip(*(v if isinstance(v, tuple) else (v,) for v in (got, want, reference)))


def _no_further(got, want, reference) -> bool:
    """Whether, everywhere ``got`` is out of tolerance of ``want``, it is no further than ``want``
    from ``reference`` (plus an ulp of the result's dtype, for ties in rounding), with its NaN
    and inf places where eager has them."""
    for g_, w, x in _pairs(got, want, reference):
        if not (isinstance(x, torch.Tensor) and x.dtype.is_floating_point):
            return False
        far = _far(g_, w)
        # where the reference overflows the result's dtype, it is inf there too
        rounded = x.to(w.dtype).double()
        g_, w, x = g_.double(), w.double(), x.double()
        ours, theirs = (g_ - x).abs(), (w - x).abs()
        if (far & ~(g_.isfinite() & w.isfinite() & rounded.isfinite())).any():
            return False
        slack = _ULP[want.dtype if isinstance(want, torch.Tensor) else w.dtype] * x.abs()
        if (far & (ours > theirs + slack)).any():
            return False
    return True


class _CorrectlyRounded(torch.overrides.TorchFunctionMode):
    """Each torch op on fp16/bf16 tensors computed in float64 and its result rounded once to
    their dtype: eager as it would be with correctly rounded 16-bit ops."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        low = [a.dtype for a in args if isinstance(a, torch.Tensor)
               and a.dtype in (torch.float16, torch.bfloat16)]
        if not low:
            return func(*args, **kwargs)

        def wide(a):
            return a.double() if isinstance(a, torch.Tensor) and a.dtype == low[0] else a

        def narrow(r):
            return r.to(low[0]) if isinstance(r, torch.Tensor) and r.dtype == torch.float64 else r

        out = func(*map(wide, args), **kwargs)
        return tuple(map(narrow, out)) if isinstance(out, tuple) else narrow(out)


def closer_to_rounded(fn, args, got, want) -> bool:
    """Whether, everywhere ``got`` is out of tolerance of eager's fp16/bf16 ``want``, it is at
    least as close as ``want`` to the program with correctly rounded ops
    (:class:`_CorrectlyRounded`): eager's 16-bit log-softmax, say, is an ulp off the correctly
    rounded value at some places, which a cancellation after it amplifies, while the kernel
    rounds that value correctly."""
    try:
        with warnings.catch_warnings(), _CorrectlyRounded():
            warnings.simplefilter("ignore")
            rounded = fn(*args)
    except Exception:
        return False
    for _, w, r in _pairs(got, want, rounded):
        if not (isinstance(w, torch.Tensor) and w.dtype in (torch.float16, torch.bfloat16)
                and isinstance(r, torch.Tensor) and r.dtype == w.dtype):
            return False
    return _no_further(got, want, rounded)


def run_case(case: Case) -> tuple[str, str]:
    """(status, detail). "fail": the C kernels and the reference interpreter differ, or framejit
    fell back or raised; "differs": both differ from eager where eager is stable (for a person
    to look at); "ill-conditioned": they differ where eager moves as far on nearby inputs;
    "eager-rounding": they differ where they are closer than eager to the float64 result;
    "eager-error": eager raised (so no comparison); "ok"."""
    namespace = {"torch": torch, "F": F}
    exec(compile(case.source(), f"<pattern {case.seed}>", "exec"), namespace)
    fn = namespace["fn"]
    framejit.backends.register_backend("pattern-fuzz-reference", _reference_backend, replace=True)
    before = torch.get_num_threads()
    torch.set_num_threads(case.threads)
    g = torch.Generator().manual_seed(case.seed)
    outcome = ("ok", "")
    try:
        framejit.reset()
        compiled = framejit.compile(fn, backend="c")
        reference = framejit.compile(fn, backend="pattern-fuzz-reference")
        for rows in case.rows:
            args = inputs(case, rows, g)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # eager's own (std of one row)
                    want = fn(*args)
            except Exception as e:
                return "eager-error", f"{type(e).__name__}: {e}"
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                got = compiled(*args)
                ref = reference(*args)
            # framejit's: a frame that ran as plain Python, a kernel that did not compile
            ours = [str(w.message) for w in caught if str(w.message).startswith("framejit")]
            if ours:
                return "fail", f"rows={rows}: {ours[0][:600]}"
            if not close_to_reference(got, ref):
                return "fail", f"rows={rows}: the C kernels and the reference interpreter differ"
            try:
                assert_close_to_eager(got, want)
            except AssertionError as e:
                # For a person to look at, not a failure: the renderers agree, and a sum of
                # terms that cancel (a mean's deviations, exp times a signed value) loses as
                # much to another summation order as a wrong answer would.
                if ill_conditioned(fn, args, got, want):
                    status = "ill-conditioned"
                elif closer_to_exact(fn, args, got, want) or closer_to_rounded(fn, args, got, want):
                    status = "eager-rounding"
                else:
                    status = "differs"
                if outcome[0] != "differs":
                    outcome = (status, f"rows={rows}: {str(e)[:400]}")
    finally:
        torch.set_num_threads(before)
    return outcome


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0:200", help="a range A:B of case seeds")
    parser.add_argument("--seed", type=int, help="one case, described")
    opts = parser.parse_args(argv)
    seeds = [opts.seed] if opts.seed is not None else range(*map(int, opts.seeds.split(":")))
    counts: dict[str, int] = {}
    for seed in seeds:
        case = generate(seed)
        try:
            status, detail = run_case(case)
        except Exception:
            status, detail = "fail", traceback.format_exc(limit=-3)
        counts[status] = counts.get(status, 0) + 1
        if status in ("fail", "differs") or opts.seed is not None:
            print(f"{status}: {case.describe()}\n  {detail}", flush=True)
    print(counts)
    return 1 if counts.get("fail") else 0


if __name__ == "__main__":
    sys.exit(main())
