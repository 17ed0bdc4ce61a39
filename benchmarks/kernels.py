"""Bandwidth of fused patterns: framejit against eager torch and Inductor, next to the device's
copy bandwidth measured in the same run.

    python benchmarks/kernels.py [--quick] [--dtype fp16,bf16,fp32] [--shape 8192x4096]
                                 [--warm-caches] [--no-inductor] [--csv FILE]

Each pattern (softmax, layer norm, RMSNorm, GELU+bias, SwiGLU, residual+LN, dropout+add, rotary, ...)
runs on an M×N input, reducing over the last dimension. GB/s = the unique bytes the pattern
must move (every input read once, every output written once) over the median time per call.
framejit runs with backend="default" (generated Triton kernels on CUDA tensors), Inductor is
``torch.compile(fn)`` (mode=None). "% copy" is framejit's GB/s over a large fp32
device-to-device copy (bytes read + written), the practical ceiling. "kernels" is framejit's
count of compiled kernels for the pattern: 1 means fully fused, 0 that nothing was lowered and
the pattern ran as torch ops.

First calls (capture + compile + tuning, synchronized) are cold: Triton's, Inductor's and
framejit's disk caches start empty for the run (``--warm-caches`` keeps the usual ones). Both
compilers are warmed up once on an unrelated function first, so imports are not counted.

Without CUDA the script says so and runs a tiny CPU check instead (256×512 fp32): framejit's
backend="default" then runs eager torch, so the figures only show that the code path works.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
import traceback
import warnings
from dataclasses import dataclass, field

from cpu_isa import CHOICES, configure_inductor, reexec_for_isa

reexec_for_isa()

import torch  # noqa: E402
import torch._dynamo  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from timing import (  # noqa: E402
    copy_gbps,
    cpu_clock,
    first_call_s,
    fmt,
    fmt_rate,
    gbps,
    interleaved_cpu_ms,
    keep_freed_memory,
    time_ms,
    use_fresh_caches,
)

import framejit  # noqa: E402

DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="smaller shape (4096x4096), bf16 and fp32 only, shorter timing")
    ap.add_argument("--dtype", default=None,
                    help="comma-separated list of fp16, bf16, fp32 (default: all three; --quick: bf16,fp32)")
    ap.add_argument("--shape", default=None, help="MxN (default 8192x4096; --quick 4096x4096)")
    ap.add_argument("--pattern", default=None, help="comma-separated pattern names (default: all)")
    ap.add_argument("--backend", default="default",
                    help="framejit backend (default 'default'; 'triton' on CPU needs TRITON_INTERPRET=1 "
                         "and a tiny --shape)")
    ap.add_argument("--device", default=None, choices=["cuda", "cpu"],
                    help="cpu: CPU tensors at realistic sizes (default 4096x1024 fp32), for "
                         "backend='c' (C kernels); default: cuda when available")
    ap.add_argument("--threads", type=int, default=1, help="torch threads with --device cpu")
    ap.add_argument("--isa", choices=CHOICES, default="native",
                    help="--device cpu: avx2 measures as on a CPU without AVX-512 (see cpu_isa.py)")
    ap.add_argument("--warm-caches", action="store_true",
                    help="keep the usual Triton/Inductor/framejit disk caches (first calls may be warm)")
    ap.add_argument("--no-inductor", action="store_true", help="skip torch.compile")
    ap.add_argument("--csv", default=None, help="also write the rows to this CSV file")
    ap.add_argument("--fp-fusion", action="store_true",
                    help="compile framejit's Triton kernels with FMA contraction (Triton's default "
                         "before 3.10; framejit turns it off, see triton_render.OPTIONS), to "
                         "measure what that costs")
    return ap.parse_args(argv)


EPS = 1e-5
P_DROP = 0.1


# -- the patterns --------------------------------------------------------------------------------


def softmax(x):
    return torch.softmax(x, dim=-1)


def log_softmax(x):
    return torch.log_softmax(x, dim=-1)


def layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, EPS)


def rms_norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


def gelu_tanh_bias(x, b):
    return F.gelu(x + b, approximate="tanh")


def gelu_bias(x, b):
    return F.gelu(x + b)


def swiglu(a, b):
    return F.silu(a) * b


def residual_layer_norm(x, r, w, b):
    h = x + r
    return h, F.layer_norm(h, (h.shape[-1],), w, b, EPS)


def dropout_add(x, y):
    return F.dropout(x, P_DROP, training=True) + y


def center(x):
    return x - x.mean(-1, keepdim=True)


def add(x, y):
    return x + y


def rotary(x, cos, sin):
    """A rotary embedding's ``x * cos + rotate_half(x) * sin`` (the cat fused in)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


@dataclass
class Pattern:
    name: str
    fn: object
    #: the shape of each input: "x" is M×N, "w" is N (a weight or bias)
    inputs: tuple
    random: bool = False


PATTERNS = [
    Pattern("softmax", softmax, ("x",)),
    Pattern("log_softmax", log_softmax, ("x",)),
    Pattern("layer_norm", layer_norm, ("x", "w", "w")),
    Pattern("rms_norm", rms_norm, ("x", "w")),
    Pattern("gelu_tanh+bias", gelu_tanh_bias, ("x", "w")),
    Pattern("gelu+bias", gelu_bias, ("x", "w")),
    Pattern("swiglu", swiglu, ("x", "x")),
    Pattern("residual+ln", residual_layer_norm, ("x", "x", "w", "w")),
    Pattern("dropout+add", dropout_add, ("x", "x"), random=True),
    Pattern("x-mean", center, ("x",)),
    Pattern("add", add, ("x", "x")),
    Pattern("rotary", rotary, ("x", "w", "w")),
]


def make_inputs(pattern: Pattern, m: int, n: int, dtype: torch.dtype, device) -> list:
    return [torch.randn((m, n) if kind == "x" else (n,), dtype=dtype, device=device)
            for kind in pattern.inputs]


def as_tuple(out) -> tuple:
    return out if isinstance(out, tuple) else (out,)


def unique_bytes(args, outs) -> int:
    return sum(t.nbytes for t in args) + sum(t.nbytes for t in as_tuple(outs))


# -- checking results ----------------------------------------------------------------------------

#: ‖out − ref‖ / ‖ref‖ against a float64 reference above which a result is flagged.
TOLERANCE = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 3e-2}


def rel_error(out, ref) -> float:
    errs = []
    for o, r in zip(as_tuple(out), as_tuple(ref)):
        o, r = o.double(), r.double()
        errs.append(float(torch.linalg.vector_norm(o - r) / torch.linalg.vector_norm(r)))
    return max(errs)


def check(pattern: Pattern, args, out) -> str:
    """'ok', or what is wrong with framejit's result ``out``."""
    if any(not torch.isfinite(o).all() for o in as_tuple(out)):
        return "NON-FINITE"
    if pattern.random:
        return check_dropout_add(*args, out)
    ref = pattern.fn(*[a.double() for a in args])
    err = rel_error(out, ref)
    return "ok" if err <= TOLERANCE[args[0].dtype] else f"err {err:.1e}"


def check_dropout_add(x, y, out) -> str:
    """Every element is either y (dropped) or x/(1-p) + y (kept), and about p of them drop."""
    d = out.double() - y.double()
    kept_value = x.double() / (1 - P_DROP)
    eps = torch.finfo(x.dtype).eps
    atol = 4 * eps * (y.double().abs() + kept_value.abs() + 1)
    kept = (d - kept_value).abs() <= atol
    dropped = d.abs() <= atol
    if not bool((kept | dropped).all()):
        return f"bad values ({int((~(kept | dropped)).sum())})"
    clear = kept_value.abs() > 2 * atol  # elements where kept and dropped cannot be confused
    frac = float(dropped[clear].double().mean())
    return "ok" if abs(frac - P_DROP) < 0.01 else f"drop frac {frac:.3f}"


# -- measuring -----------------------------------------------------------------------------------


@dataclass
class Row:
    pattern: str
    dtype: str
    nbytes: int
    fj_ms: float | None = None
    eager_ms: float | None = None
    ind_ms: float | None = None
    fj_first_s: float | None = None
    ind_first_s: float | None = None
    kernels: int | None = None
    breaks: int | None = None
    check: str = "-"
    errors: list = field(default_factory=list)
    #: CPU: the copy bandwidth measured interleaved with this row's timings (GB/s)
    copy_gbps: float | None = None


def measure(pattern: Pattern, dtype_name: str, m: int, n: int, device, opts, copy=None) -> Row:
    """One pattern at one dtype. On the CPU, ``copy`` (a zero-argument copy of ``copy[1]`` bytes
    read + written) is timed in the same interleaved rounds as the three contenders, so the
    row's "% copy" compares figures taken under the same load."""
    dtype = getattr(torch, DTYPES[dtype_name])
    torch.manual_seed(0)
    args = make_inputs(pattern, m, n, dtype, device)
    quick = opts.quick
    eager_out = pattern.fn(*args)
    row = Row(pattern.name, dtype_name, unique_bytes(args, eager_out))
    del eager_out
    fns = {"eager": lambda: pattern.fn(*args)}

    try:
        framejit.reset()
        compiled = framejit.compile(pattern.fn, backend=opts.backend)
        row.fj_first_s, out = first_call_s(compiled, args, device=device)
        s = framejit.stats()
        row.kernels, row.breaks = s["kernels"], s["graph_breaks"]
        row.check = check(pattern, args, out)
        if s["fallbacks"]:
            row.check += f" ({s['fallbacks']} frame(s) ran as Python)"
        del out
        compiled(*args)  # a failure in steady state is reported here, not in the timing loop
        fns["fj"] = lambda: compiled(*args)
    except Exception as e:  # report and go on: one failing pattern must not hide the others
        row.errors.append(f"framejit: {type(e).__name__}: {e}")
        row.check = "FAILED"

    if not opts.no_inductor:
        try:
            torch._dynamo.reset()
            inductor = torch.compile(pattern.fn, mode=None)
            row.ind_first_s, _ = first_call_s(inductor, args, device=device)
            fns["ind"] = lambda: inductor(*args)
        except Exception as e:
            row.errors.append(f"inductor: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")

    if device.type == "cpu" and copy is not None:
        fns["copy"] = copy[0]
        times = interleaved_cpu_ms(fns, rounds=7 if quick else 15)
        row.copy_gbps = copy[1] / times.pop("copy") / 1e6
    else:
        times = {name: time_ms(fn, device, quick=quick) for name, fn in fns.items()}
    row.eager_ms, row.fj_ms, row.ind_ms = times["eager"], times.get("fj"), times.get("ind")
    return row


def warm_up(device, opts) -> None:
    """Import and initialise both compilers once, on a function none of the patterns share."""
    def warm(x):
        return (x * 3).relu()

    x = torch.randn(64, 64, device=device)
    try:
        framejit.compile(warm, backend=opts.backend)(x)
    except Exception:
        traceback.print_exc()
    if not opts.no_inductor:
        try:
            torch.compile(warm)(x)
        except Exception as e:
            print(f"note: torch.compile fails here ({type(e).__name__}: {e}); Inductor columns stay empty")
            opts.no_inductor = True
    framejit.reset()
    torch._dynamo.reset()


# -- printing ------------------------------------------------------------------------------------


def table_line(r: Row, copy: float) -> str:
    """One row of the bandwidth table (also printed as each row is measured, so that a run
    stopped part-way still shows what it measured)."""
    fj, ea, ind = gbps(r.nbytes, r.fj_ms), gbps(r.nbytes, r.eager_ms), gbps(r.nbytes, r.ind_ms)
    ratio = fj / ind if fj and ind else None
    pct = 100 * fj / (r.copy_gbps or copy) if fj else None
    kernels = "-" if r.kernels is None else str(r.kernels)
    if r.breaks:
        kernels += f" ({r.breaks} br)"
    return (f"{r.pattern:<16}{r.dtype:>6}{r.nbytes / 1e6:>8.1f}{fmt_rate(fj, 10)}{fmt_rate(ea, 9)}"
            f"{fmt_rate(ind, 10)}{fmt_rate(r.copy_gbps or copy, 8)}{fmt(ratio, '.2f', 8)}"
            f"{fmt(pct, '.0f', 10)}{kernels:>9}  {r.check}")


def print_tables(rows: list[Row], copy: float) -> None:
    print()
    print(f"{'pattern':<16}{'dtype':>6}{'MB':>8}{'framejit':>10}{'eager':>9}{'inductor':>10}"
          f"{'copy':>8}{'fj/ind':>8}{'fj %copy':>10}{'kernels':>9}  check")
    for r in rows:
        print(table_line(r, copy))
    print("GB/s = unique bytes (inputs read once + outputs written once) / median time per call; "
          "fj/ind > 1: framejit faster; % copy: of the fp32 copy bandwidth (CPU: the copy timed in "
          "the same interleaved rounds as the row, column 'copy').")
    print()
    print("First call: capture + compile + tuning (s; caches cold unless --warm-caches)")
    print(f"{'pattern':<16}{'dtype':>6}{'framejit':>10}{'inductor':>10}{'ind/fj':>8}")
    for r in rows:
        ratio = r.ind_first_s / r.fj_first_s if r.ind_first_s and r.fj_first_s else None
        print(f"{r.pattern:<16}{r.dtype:>6}{fmt(r.fj_first_s, '.3f', 10)}{fmt(r.ind_first_s, '.3f', 10)}"
              f"{fmt(ratio, '.1f', 8)}")
    errors = [(r, e) for r in rows for e in r.errors]
    if errors:
        print()
        print("Failures:")
        for r, e in errors:
            print(f"  {r.pattern} {r.dtype}: {e.splitlines()[0][:300]}")


def write_csv(path: str, rows: list[Row], copy: float, device_name: str) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["device", "pattern", "dtype", "bytes", "framejit_ms", "eager_ms", "inductor_ms",
                    "framejit_gbps", "eager_gbps", "inductor_gbps", "copy_gbps", "framejit_first_s",
                    "inductor_first_s", "kernels", "graph_breaks", "check"])
        for r in rows:
            w.writerow([device_name, r.pattern, r.dtype, r.nbytes, r.fj_ms, r.eager_ms, r.ind_ms,
                        gbps(r.nbytes, r.fj_ms), gbps(r.nbytes, r.eager_ms), gbps(r.nbytes, r.ind_ms),
                        copy, r.fj_first_s, r.ind_first_s, r.kernels, r.breaks, r.check])


def parse_shape(text: str) -> tuple[int, int]:
    m, n = text.lower().split("x")
    return int(m), int(n)


def main(opts) -> int:
    warnings.filterwarnings("ignore")
    cuda = torch.cuda.is_available() and opts.device != "cpu"
    if opts.device == "cpu":
        # CPU kernels (backend="c"): realistic sizes, the thread count asked for.
        device = torch.device("cpu")
        device_name = f"cpu, {opts.threads} thread(s)"
        m, n = parse_shape(opts.shape or "4096x1024")
        dtypes = (opts.dtype or "fp32").split(",")
        copy_numel = 1 << 24
        torch.set_num_threads(opts.threads)
        print(keep_freed_memory())
        print(configure_inductor(opts.isa))
    elif cuda:
        device = torch.device("cuda")
        device_name = torch.cuda.get_device_name()
        m, n = parse_shape(opts.shape or ("4096x4096" if opts.quick else "8192x4096"))
        dtypes = (opts.dtype or ("bf16,fp32" if opts.quick else "fp16,bf16,fp32")).split(",")
        copy_numel = (1 << 26) if opts.quick else (1 << 28)
    else:
        print("CUDA is not available: running a tiny CPU check instead. framejit's backend='default' "
              "runs eager torch on CPU tensors, so these figures only show that the code path works; "
              "they say nothing about generated kernels.")
        device = torch.device("cpu")
        device_name = "cpu"
        m, n = parse_shape(opts.shape or "256x512")
        dtypes = (opts.dtype or "fp32").split(",")
        copy_numel = 1 << 22
        opts.quick = True
        # One thread: with the machine's other jobs, waking a pool of threads for each small op
        # costs milliseconds and swamps the figures.
        torch.set_num_threads(1)
    for d in dtypes:
        if d not in DTYPES:
            print(f"unknown dtype {d!r}; expected one of {', '.join(DTYPES)}")
            return 2
    names = opts.pattern.split(",") if opts.pattern else [p.name for p in PATTERNS]
    patterns = [p for p in PATTERNS if p.name in names]
    if len(patterns) != len(names):
        print(f"unknown pattern in {names}; expected some of {', '.join(p.name for p in PATTERNS)}")
        return 2

    import triton

    print(f"torch {torch.__version__}, triton {triton.__version__}, Python {sys.version.split()[0]}, "
          f"device {device_name}")
    # Lazily read by all three compilers: empty caches make every first call a cold compile.
    caches = "usual" if opts.warm_caches else "fresh, " + use_fresh_caches()
    if opts.fp_fusion:
        from framejit.kernels import triton_render

        triton_render.OPTIONS.clear()  # (the same dict the launchers read)
    print(f"shape {m}x{n}, dtypes {', '.join(dtypes)}, framejit backend={opts.backend!r}, caches: {caches}"
          f"{', Triton FMA contraction on' if opts.fp_fusion else ''}")
    copy = copy_gbps(device, copy_numel)
    print(f"copy bandwidth (fp32, {4 * copy_numel / 2**20:.0f} MiB, read + write): {copy:.0f} GB/s")
    copy_timed = None
    if device.type == "cpu":
        src = torch.randn(copy_numel)
        dst = torch.empty_like(src)
        copy_timed = (lambda: dst.copy_(src), 2 * src.nbytes)
        print(f"CPU timings: interleaved rounds of framejit, eager, Inductor and the copy, "
              f"by {cpu_clock()[1]}")
    t0 = time.perf_counter()
    warm_up(device, opts)
    rows = []
    for pattern in patterns:
        for dtype_name in dtypes:
            try:
                row = measure(pattern, dtype_name, m, n, device, opts, copy_timed)
            except Exception as e:  # the eager run itself failed (out of memory, say)
                row = Row(pattern.name, dtype_name, 0, check="FAILED",
                          errors=[f"eager: {type(e).__name__}: {e}"])
            rows.append(row)
            print(f"{table_line(row, copy)}  [{time.perf_counter() - t0:.0f} s; first call fj "
                  f"{fmt(row.fj_first_s, '.2f', 0)} s, ind {fmt(row.ind_first_s, '.2f', 0)} s]", flush=True)
            for e in row.errors:
                print(f"    {e.splitlines()[0][:300]}", flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    print_tables(rows, copy)
    if opts.csv:
        write_csv(opts.csv, rows, copy, device_name)
        print(f"rows written to {opts.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main(parse_args()))
