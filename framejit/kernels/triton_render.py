"""The Triton renderer: a :class:`~framejit.kernels.ir.Kernel` as the source of a Triton kernel.

Three shapes of kernel:

* **pointwise**: a 1-D grid over the flattened box, ``XBLOCK`` elements per program;
* **persistent reduction**: ``XBLOCK`` rows per program, the whole reduced extent in registers
  (``RBLOCK`` >= its size), every value computed once;
* **looped reduction**: a loop over the reduced extent in ``RBLOCK`` chunks per reduction, with
  per-lane accumulators combined at the end; FULL values are recomputed (reloaded) in each loop
  that needs them, and a last loop stores the FULL outputs.

Only ``tl.*`` math is emitted (no libdevice), so every kernel also runs under Triton's
interpreter. fp16/bf16 are loaded as fp32 (the description's compute dtypes) and cast on
store. Indices are int32 when every offset fits, int64 otherwise.

**Run-time sizes.** A dynamic kernel (some size or stride a :class:`~framejit.kernels.ir.Sym`)
takes its sizes as ``int64`` arguments after the buffers (``kernel.symbols()``, in order) and
computes ``xnumel``/``rnumel`` from them; its indices are int64. A reduction over a run-time
extent always loops (any ``RBLOCK`` is then correct for every size, so one compiled kernel
serves them all); a static extent may still be persistent. The size arguments are excluded
from Triton's specialization (``do_not_specialize``): no recompile when a size is 1 or a
multiple of 16.
"""

from __future__ import annotations

import math
import re

import torch

from .ir import FULL, OUTER, Kernel, Op, Sym, concat_parts, expr_text, is_operand, product, spans_of

#: The largest reduced extent kept in registers (a persistent reduction).
PERSISTENT_LIMIT = 8192

_TL_DTYPES = {
    torch.float32: "tl.float32", torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16",
    torch.float64: "tl.float64", torch.int64: "tl.int64", torch.int32: "tl.int32",
    torch.int16: "tl.int16", torch.int8: "tl.int8", torch.uint8: "tl.uint8", torch.bool: "tl.int1",
}

_HELPERS = {
    "max": '''
@_jit
def _max_combine(a, b):
    return tl.where((a > b) | (a != a), a, b)
''',
    "min": '''
@_jit
def _min_combine(a, b):
    return tl.where((a < b) | (a != a), a, b)
''',
    # tl.exp is exp2(x * log2(e)): rounding that product to fp32 costs |x| * 2^-24 of the
    # exponent, so its error grows with |x| (15 ulp near 88 on a GPU). Reduce by ln 2 first (its
    # high part has 16 bits, so k * ln2_hi is exact), take exp of the small rest, and scale by
    # 2^k built from exponent bits, in two halves so that 2^128 and subnormal results work.
    # Beyond |x| = 104 fp32's exp is 0 or inf; NaN stays NaN.
    "exp": '''
@_jit
def _exp(x):
    k = tl.floor(x * 1.4426950408889634 + 0.5)
    r = (x - k * 0.693145751953125) - k * 1.428606765330187e-06
    small = tl.abs(x) < 104.0
    k = tl.where(small, k, 0.0).to(tl.int32)
    h = k >> 1
    y = tl.exp(r) * ((h + 127) << 23).to(tl.float32, bitcast=True)
    y = y * ((k - h + 127) << 23).to(tl.float32, bitcast=True)
    return tl.where(small, y, tl.where(x > 0, float("inf"), tl.where(x != x, x, 0.0)))
''',
    # A pointwise kernel's draws: point p is lane p % 4 of Philox block p // 4, as in the C
    # kernels: one Philox (ten rounds) gives four points, where tl.rand(seed, p) runs one for
    # each point and keeps one lane. XBLOCK is a multiple of 4 (see triton_runtime.configs),
    # so a program's points are whole blocks, and a point's number does not depend on XBLOCK.
    "rand": '''
@_jit
def _rand_points(seed, xoffset, XBLOCK: tl.constexpr):
    c = (xoffset // 4 + tl.arange(0, XBLOCK // 4)).to(tl.uint32)
    u0, u1, u2, u3 = tl.rand4x(seed, c)
    return tl.interleave(tl.interleave(u0, u2), tl.interleave(u1, u3))
''',
    "argmax": '''
@_jit
def _argmax_combine(va, ia, vb, ib):
    a_nan = va != va
    b_nan = vb != vb
    better = (va > vb) | (a_nan & ~b_nan)
    same = (va == vb) | (a_nan & b_nan)
    pick = better | (same & (ia < ib))
    return tl.where(pick, va, vb), tl.where(pick, ia, ib)
''',
    "argmin": '''
@_jit
def _argmin_combine(va, ia, vb, ib):
    a_nan = va != va
    b_nan = vb != vb
    better = (va < vb) | (a_nan & ~b_nan)
    same = (va == vb) | (a_nan & b_nan)
    pick = better | (same & (ia < ib))
    return tl.where(pick, va, vb), tl.where(pick, ia, ib)
''',
}

_BIG_INDEX = 2**31 - 1


def tl_dtype(dtype: torch.dtype) -> str:
    try:
        return _TL_DTYPES[dtype]
    except KeyError:
        raise NotImplementedError(f"no Triton type for {dtype}") from None


#: The largest reduced extent kept in registers when the reduced dimension is not the
#: contiguous one (a column sum): such rows are loaded across many cache lines.
OUTER_PERSISTENT_LIMIT = 64


def is_inner_reduction(kernel: Kernel) -> bool:
    """Whether the inputs are contiguous along the (last) reduced dimension, the common case
    (softmax, norms over the last dim); otherwise the reduction runs across rows."""
    last = kernel.reduce_dims[-1]
    strided = [b.strides[last] for b in kernel.inputs if b.strides[last] != 0]
    return not strided or any(s == 1 for s in strided)


def is_persistent(kernel: Kernel) -> bool:
    rnumel = product(kernel.reduce_sizes)
    if not isinstance(rnumel, int):
        return False
    limit = PERSISTENT_LIMIT if is_inner_reduction(kernel) else min(OUTER_PERSISTENT_LIMIT, PERSISTENT_LIMIT)
    return rnumel <= limit


def render(kernel: Kernel, native_bf16: bool = False) -> str:
    """The Python source of a module defining the Triton kernel ``kernel.function_stem``; its
    decorator is the name ``_jit``, bound by the loader (``triton.jit`` or the interpreter).

    ``native_bf16``: round fp32 to bf16 with Triton's own conversion (a GPU's ``cvt.rn``, to
    nearest even), not by hand on the bits; Triton's interpreter truncates in that conversion,
    so the default rounds by hand, six integer operations per value stored."""
    return _Renderer(kernel, native_bf16).source()


#: Triton's compile options for every kernel. ``enable_fp_fusion=False``: no FMA contraction,
#: so each op rounds as eager's separate kernels do. With it, (x*1000) - (x*1000) + y was not y
#: on an H200 (the product contracted into an FMA with the subtraction gives the product's
#: rounding error, and -inf where eager's inf - inf is NaN); in fp16, LLVM first narrowed the
#: rounded product to a 16-bit multiply, so a rounding eager does was skipped. The C renderer
#: compiles with -ffp-contract=off for the same reason, and Triton 3.10 makes it the default.
OPTIONS = {"enable_fp_fusion": False}


def _literal(value, dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return "1" if value else "0"
    if dtype.is_floating_point:
        value = float(value)
        if math.isnan(value):
            return 'float("nan")'
        if math.isinf(value):
            return 'float("inf")' if value > 0 else 'float("-inf")'
        return repr(value)
    return str(int(value))


def _neutral(kind: str, dtype: torch.dtype) -> str:
    if kind == "sum":
        return "0"
    big = "max" in kind
    if dtype.is_floating_point:
        return 'float("-inf")' if big else 'float("inf")'
    info = torch.iinfo(dtype)
    return str(info.min if big else info.max)


#: Names the kernel body defines: a run-time size may not be called so.
_LOCAL = re.compile(r"(?:[xrt]\d+|_acc\d+(?:_i)?|_idx|_best|_|[xr](?:numel|offset|index|mask|base)"
                    r"|XBLOCK|RBLOCK|tl|triton)")


def _check_names(kernel: Kernel) -> None:
    taken = {b.name for b in kernel.buffers}
    for s in kernel.symbols():
        if s.name in taken or _LOCAL.fullmatch(s.name):
            raise ValueError(f"kernel {kernel.name}: run-time size {s.name!r} has the name of a "
                             f"variable of the Triton kernel; name it otherwise (ks0, ks1, ...)")


class _Renderer:
    def __init__(self, kernel: Kernel, native_bf16: bool = False) -> None:
        self.k = kernel
        self.native_bf16 = native_bf16
        self.reduction = kernel.is_reduction
        self.persistent = self.reduction and is_persistent(kernel)
        self.lines: list[str] = []
        self.helpers: set[str] = set()
        self.int64 = self._needs_int64()
        # tl.exp's error (|x| / 2 fp32 ulp at most, 5e-6 relative near 88) is far below half a
        # 16-bit ulp (2.4e-4 in fp16), so a kernel that stores only fp16/bf16 values keeps it;
        # any other store takes the accurate _exp (on an H200 a bf16 softmax with it reached
        # 2096 GB/s at 8192x4096, against 2561 without it at 4096x4096: two runs, two shapes).
        self.exp = ("tl.exp" if all(b.dtype in (torch.float16, torch.bfloat16) for b in kernel.outputs)
                    else "_exp")
        self.symbols = kernel.symbols()
        self.dynamic = kernel.is_dynamic
        # Lane indices of argmax/argmin: a loop over a run-time rnumel counts in int64, and a
        # loop-carried value must keep its type.
        self.index_type = "tl.int64" if self.dynamic else "tl.int32"
        self.big_index = 2**63 - 1 if self.dynamic else _BIG_INDEX
        _check_names(kernel)

    # -- indexing -----------------------------------------------------------------------------
    def _needs_int64(self) -> bool:
        k = self.k
        if any(isinstance(s, Sym) for s in k.sizes):
            return True
        total = math.prod(k.sizes)
        if total >= 2**31:
            return True
        for b in k.buffers:
            if any(isinstance(s, Sym) for s in b.strides):
                return True
            span = sum((size - 1) * abs(st) for size, st in zip(k.sizes, b.strides))
            if span >= 2**31:
                return True
        return False

    def _dims_expr(self, dims, flat: str, prefix: str, strides) -> str:
        """Address contribution of ``dims`` (box dims decomposed from the flat index ``flat``)."""
        sizes = [self.k.sizes[d] for d in dims]
        st = [strides[d] for d in dims]
        if all(s == 0 for s in st):
            return ""
        if len(dims) == 1:
            return flat if st[0] == 1 else f"{flat} * {st[0]}"
        # Contiguous over these dims (row-major, times a common factor): the flat index itself.
        inner = st[-1]
        if isinstance(inner, int) and inner != 0:
            # Symbolic sizes compare by their canonical product text: (ks1*ks2) == (ks1*ks2).
            expect = [product((inner, *sizes[i + 1:])) for i in range(len(sizes))]
            if expect == st:
                return flat if inner == 1 else f"{flat} * {inner}"
        terms = []
        for d, s in zip(dims, st):
            if s == 0:
                continue
            var = f"{prefix}{d}"
            terms.append(var if s == 1 else f"{var} * {s}")
        return " + ".join(terms)

    def _dim_vars(self, dims, flat: str, prefix: str, indent: str) -> None:
        """Define ``{prefix}{d}`` for each box dim ``d`` in ``dims`` from ``flat``."""
        sizes = [self.k.sizes[d] for d in dims]
        for i, d in enumerate(dims):
            below = product(sizes[i + 1:])
            expr = flat if below == 1 else f"({flat} // {below})"
            if i > 0:
                expr = f"{expr} % {sizes[i]}"
            self.lines.append(f"{indent}{prefix}{d} = {expr}")

    def dim_var(self, d: int) -> str:
        """The index along box dimension ``d``: the flat index when it is its level's only
        dimension, else the variable :meth:`define_dims` defines."""
        if d in self.k.reduce_dims:
            return "rindex" if len(self.k.reduce_dims) == 1 else f"r{d}"
        return "xindex" if len(self.k.outer_dims) == 1 else f"x{d}"

    def spanned_address(self, name: str, level: str, spans) -> str:
        """The offset of a load valid in ``spans``: along a span's dimension the buffer is read
        at ``i - start`` (the lanes outside it are masked)."""
        b = self.k.buffer(name)
        start = {s.dim: s.start for s in spans}
        dims = [d for d in range(len(self.k.sizes))
                if level == FULL or d not in self.k.reduce_dims]
        terms = []
        for d in dims:
            st = b.strides[d]
            if st == 0:
                continue
            var = self.dim_var(d)
            if start.get(d, 0) != 0:
                var = f"({var} - {start[d]})"
            terms.append(var if st == 1 else f"{var} * {st}")
        zeros = f"tl.zeros({self.shape(level)}, tl.int32)"
        if not terms:
            return zeros
        # Each term is a block of its dimensions' shape: with a reduction, make it the level's.
        return " + ".join(terms) + (f" + {zeros}" if self.reduction else "")

    def inside(self, span) -> list[str]:
        """The tests of the lanes inside ``span`` (a bound at the box's edge needs none)."""
        var = self.dim_var(span.dim)
        tests = []
        if span.start != 0:
            tests.append(f"({var} >= {span.start})")
        if span.stop != self.k.sizes[span.dim]:
            tests.append(f"({var} < {span.stop})")
        return tests

    def address(self, name: str, level: str) -> str:
        """The offset of buffer ``name``'s element, a block of the level's shape (a pointer of a
        smaller shape would not take the level's mask)."""
        b = self.k.buffer(name)
        outer = self._dims_expr(self.k.outer_dims, "xindex", "x", b.strides)
        if not self.reduction:
            return outer or "tl.zeros([XBLOCK], tl.int32)"
        if level == OUTER:
            return outer or "tl.zeros([XBLOCK, 1], tl.int32)"
        inner = self._dims_expr(self.k.reduce_dims, "rindex", "r", b.strides)
        if outer and inner:
            return f"{outer} + {inner}"
        return f"{outer or inner or '0'} + tl.zeros([XBLOCK, RBLOCK], tl.int32)"

    # -- values -------------------------------------------------------------------------------
    def shape(self, level: str) -> str:
        if not self.reduction:
            return "[XBLOCK]"
        return "[XBLOCK, RBLOCK]" if level == FULL else "[XBLOCK, 1]"

    def mask(self, level: str) -> str:
        if self.reduction and level == FULL:
            return "xmask & rmask"
        return "xmask"

    def expr(self, i: int, op: Op) -> str:
        a = [f"t{x}" if is_operand(x) else x for x in op.args]
        k = op.kind
        dt = tl_dtype(op.dtype)
        if k == "load":
            spans = spans_of(op)
            if spans:
                mask = " & ".join([self.mask(op.level), *(t for s in spans for t in self.inside(s))])
                return (f"tl.load({a[0]} + ({self.spanned_address(op.args[0], op.level, spans)}), "
                        f"mask={mask}, other=0).to({dt})")
            return f"tl.load({a[0]} + ({self.address(op.args[0], op.level)}), mask={self.mask(op.level)}, other=0).to({dt})"
        if k == "concat":
            parts = concat_parts(op)
            text = f"t{parts[-1][1]}"
            for span, operand in reversed(parts[:-1]):
                text = f"tl.where({self.dim_var(span.dim)} < {span.stop}, t{operand}, {text})"
            return text
        if k == "const":
            if isinstance(op.args[0], Sym):  # a run-time size as a value (a mean's count)
                return f"(tl.zeros({self.shape(op.level)}, {dt}) + ({op.args[0]}).to({dt}))"
            return f"tl.full({self.shape(op.level)}, {_literal(op.args[0], op.dtype)}, {dt})"
        if k == "rand":
            # Stream s keys Philox with seed + s * 2^32 (the seed is below 2^31), as in C.
            stream = op.args[1]
            seed = f"tl.load({a[0]}).to(tl.uint32)" if not stream else f"(tl.load({a[0]}).to(tl.uint64) + {stream << 32})"
            if not self.reduction:
                self.helpers.add("rand")
                return f"_rand_points({seed}, xoffset, XBLOCK)"
            return f"tl.rand({seed}, (xindex * rnumel + rindex).to(tl.uint32))"
        if k == "cast":
            if op.dtype == torch.bool:
                return f"{a[0]} != 0"
            if op.dtype == torch.uint8 and self.k.ops[op.args[0]].dtype.is_floating_point:
                # Through int64, as c10 converts (-100.0 -> 156); a GPU's cvt to u8 saturates.
                return f"{a[0]}.to(tl.int64).to({dt})"
            return f"{a[0]}.to({dt})"
        if k == "round":
            x = a[0]
            if op.args[1] == torch.float16 or self.native_bf16:
                return f"{x}.to({tl_dtype(op.args[1])}).to({dt})"
            return _bf16_nearest_even(x)
        if k == "where":
            return f"tl.where({a[0]}, {a[1]}, {a[2]})"
        x = a[0] if a else None
        y = a[1] if len(a) > 1 else None
        is_float = op.dtype.is_floating_point
        exp = "tl.exp" if op.dtype == torch.float64 else self.exp
        if k in ("exp", "sigmoid", "tanh", "expm1") and exp == "_exp":
            self.helpers.add("exp")
        simple = {
            "neg": f"-{x}", "abs": f"tl.abs({x})", "exp": f"{exp}({x})", "log": f"tl.log({x})",
            "sqrt": f"tl.sqrt_rn({x})" if is_float else None,
            "rsqrt": f"1.0 / tl.sqrt_rn({x})", "reciprocal": f"1.0 / {x}",
            "sin": f"tl.sin({x})", "cos": f"tl.cos({x})", "erf": f"tl.erf({x})",
            "gelu": f"{x} * 0.5 * (1.0 + tl.erf({x} * 0.7071067811865476))",
            "sigmoid": f"1.0 / (1.0 + {exp}(-{x}))",
            "relu": f"tl.where({x} < 0, 0, {x})",
            "floor": f"tl.floor({x})" if is_float else x, "ceil": f"tl.ceil({x})" if is_float else x,
            "sign": f"tl.where({x} > 0, 1, tl.where({x} < 0, -1, 0)).to({dt})",  # NaN, -0.0 -> 0
            "not": f"{x} == 0", "isnan": f"{x} != {x}",
            "add": f"{x} + {y}", "sub": f"{x} - {y}", "mul": f"{x} * {y}", "truediv": f"{x} / {y}",
            "eq": f"{x} == {y}", "ne": f"{x} != {y}", "lt": f"{x} < {y}", "le": f"{x} <= {y}",
            "gt": f"{x} > {y}", "ge": f"{x} >= {y}", "and": f"{x} & {y}", "or": f"{x} | {y}",
            "maximum": f"tl.where(({x} > {y}) | ({x} != {x}), {x}, {y})",
            "minimum": f"tl.where(({x} < {y}) | ({x} != {x}), {x}, {y})",
        }
        if k in simple and simple[k] is not None:
            return simple[k]
        if k == "tanh":
            # No tl.tanh under the interpreter: an odd series near 0 (where the exp form
            # cancels), sign * (1 - e) / (1 + e) with e = exp(-2|x|) elsewhere.
            return (f"tl.where(tl.abs({x}) < 0.0625, "
                    f"{x} * (1.0 + {x} * {x} * (-0.3333333333333333 + {x} * {x} * (0.13333333333333333 "
                    f"+ {x} * {x} * -0.05396825396825397))), "
                    f"tl.where({x} < 0, -1.0, 1.0) * (1.0 - {exp}(-2.0 * tl.abs({x}))) "
                    f"/ (1.0 + {exp}(-2.0 * tl.abs({x}))))")
        if k == "log1p":
            return (f"tl.where(1.0 + {x} == 1.0, {x}, tl.where({x} == float(\"inf\"), {x}, "
                    f"tl.log(1.0 + {x}) * ({x} / ((1.0 + {x}) - 1.0))))")
        if k == "expm1":
            e = f"{exp}({x})"
            return (f"tl.where({e} == 1.0, {x}, tl.where({e} - 1.0 == -1.0, -1.0, "
                    f"tl.where({e} == float(\"inf\"), {e}, "
                    f"({e} - 1.0) * ({x} / tl.log({e})))))")
        raise NotImplementedError(f"Triton renderer: no rule for {k!r}")

    # -- reductions -----------------------------------------------------------------------------
    def reduce_persistent(self, i: int, op: Op, indent: str) -> None:
        kind, src = op.args
        s = f"t{src}"
        src_dtype = self.k.ops[src].dtype
        neutral = _neutral(kind, src_dtype)
        masked = f"tl.where(xmask & rmask, {s}, {neutral})"
        if kind == "sum":
            self.lines.append(f"{indent}t{i} = tl.sum({masked}, 1)[:, None]")
        elif kind in ("max", "min"):
            self.helpers.add(kind)
            self.lines.append(f"{indent}t{i} = tl.reduce({masked}, 1, _{kind}_combine)[:, None]")
        else:
            self.helpers.add(kind)
            self.lines.append(f"{indent}_idx = tl.where(xmask & rmask, rindex + tl.zeros([XBLOCK, RBLOCK], {self.index_type}), {self.big_index})")
            self.lines.append(f"{indent}_, _best = tl.reduce(({masked}, _idx), 1, _{kind}_combine)")
            self.lines.append(f"{indent}t{i} = _best[:, None].to(tl.int64)")

    def reduce_loop(self, i: int, op: Op, body: list[int], indent: str) -> None:
        kind, src = op.args
        src_dtype = self.k.ops[src].dtype
        neutral = _neutral(kind, src_dtype)
        acc = f"_acc{i}"
        sdt = tl_dtype(src_dtype)
        self.lines.append(f"{indent}{acc} = tl.full([XBLOCK, RBLOCK], {neutral}, {sdt})")
        if kind in ("argmax", "argmin"):
            self.lines.append(f"{indent}{acc}_i = tl.full([XBLOCK, RBLOCK], {self.big_index}, {self.index_type})")
        self.loop_header(indent)
        inner = indent + "    "
        self.emit_ops(body, inner)
        masked = f"tl.where(xmask & rmask, t{src}, {neutral})"
        if kind == "sum":
            self.lines.append(f"{inner}{acc} = {acc} + {masked}")
        elif kind in ("max", "min"):
            self.helpers.add(kind)
            self.lines.append(f"{inner}{acc} = _{kind}_combine({acc}, {masked})")
        else:
            self.helpers.add(kind)
            idx = f"tl.where(xmask & rmask, rindex + tl.zeros([XBLOCK, RBLOCK], {self.index_type}), {self.big_index})"
            self.lines.append(f"{inner}{acc}, {acc}_i = _{kind}_combine({acc}, {acc}_i, {masked}, {idx})")
        if kind == "sum":
            self.lines.append(f"{indent}t{i} = tl.sum({acc}, 1)[:, None]")
        elif kind in ("max", "min"):
            self.lines.append(f"{indent}t{i} = tl.reduce({acc}, 1, _{kind}_combine)[:, None]")
        else:
            self.lines.append(f"{indent}_, _best = tl.reduce(({acc}, {acc}_i), 1, _{kind}_combine)")
            self.lines.append(f"{indent}t{i} = _best[:, None].to(tl.int64)")

    def loop_header(self, indent: str) -> None:
        self.lines.append(f"{indent}for roffset in range(0, rnumel, RBLOCK):")
        inner = indent + "    "
        self.lines.append(f"{inner}rindex = roffset + rbase")
        self.lines.append(f"{inner}rmask = rindex < rnumel")
        self.define_dims(self.k.reduce_dims, "rindex", "r", inner)

    def define_dims(self, dims, flat, prefix, indent) -> None:
        if len(dims) > 1 and (self._dims_needed(dims) or self.k.span_dims & set(dims)):
            self._dim_vars(dims, flat, prefix, indent)

    def _dims_needed(self, dims) -> bool:
        # Per-dim variables are needed unless every buffer is contiguous (or broadcast) over them.
        for b in self.k.buffers:
            e = self._dims_expr(dims, "F", "v", b.strides)
            if e not in ("", "F") and not e.startswith("F * "):
                return True
        return False

    # -- emission -----------------------------------------------------------------------------
    def emit_op(self, i: int, indent: str) -> None:
        op = self.k.ops[i]
        if op.kind == "store":
            name, src = op.args
            b = self.k.buffer(name)
            value = f"t{src}"
            if op.dtype != b.dtype or self.k.ops[src].dtype != b.dtype:
                if b.dtype == torch.bfloat16 and self.k.ops[src].dtype == torch.float32 \
                        and not self.native_bf16:
                    value = _bf16_nearest_even(value)  # then .to(bf16) is exact, even truncating
                value = f"{value}.to({tl_dtype(b.dtype)})"
            mask = self.mask(op.level)
            self.lines.append(f"{indent}tl.store({name} + ({self.address(name, op.level)}), {value}, mask={mask})")
            return
        if op.kind == "reduce":
            self.reduce_persistent(i, op, indent)
            return
        self.lines.append(f"{indent}t{i} = {self.expr(i, op)}")

    def emit_ops(self, indices, indent: str) -> None:
        for i in indices:
            self.emit_op(i, indent)

    def body(self) -> None:
        ind = "    "
        k = self.k
        if self.dynamic:
            # The extents, from the size arguments (a product is int64: the arguments are).
            self.lines.append(f"{ind}xnumel = {expr_text(product(k.outer_sizes))}")
            if self.reduction:
                self.lines.append(f"{ind}rnumel = {expr_text(product(k.reduce_sizes))}")
        if not self.reduction:
            self.lines.append(f"{ind}xoffset = {self.pid()} * XBLOCK")
            self.lines.append(f"{ind}xindex = xoffset + tl.arange(0, XBLOCK)")
            self.lines.append(f"{ind}xmask = xindex < xnumel")
            self.define_dims(k.outer_dims, "xindex", "x", ind)
            self.emit_ops(range(len(k.ops)), ind)
            return
        self.lines.append(f"{ind}xoffset = {self.pid()} * XBLOCK")
        self.lines.append(f"{ind}xindex = xoffset + tl.arange(0, XBLOCK)[:, None]")
        self.lines.append(f"{ind}xmask = xindex < xnumel")
        self.lines.append(f"{ind}rbase = tl.arange(0, RBLOCK)[None, :]")
        self.define_dims(k.outer_dims, "xindex", "x", ind)
        if self.persistent:
            self.lines.append(f"{ind}rindex = rbase")
            self.lines.append(f"{ind}rmask = rindex < rnumel")
            self.define_dims(k.reduce_dims, "rindex", "r", ind)
            self.emit_ops(range(len(k.ops)), ind)
            return
        done: set[int] = set()
        for i, op in enumerate(k.ops):
            if op.kind != "reduce":
                continue
            # OUTER values computed so far (they only depend on earlier reductions).
            outer_ready = [j for j in range(i) if j not in done and k.ops[j].level == OUTER
                           and k.ops[j].kind != "reduce"]
            self.emit_ops(outer_ready, ind)
            done.update(outer_ready)
            self.reduce_loop(i, op, self.k.full_closure([op.args[1]]), ind)
            done.add(i)
        rest_outer = [j for j, op in enumerate(k.ops) if j not in done and op.level == OUTER]
        self.emit_ops(rest_outer, ind)
        full_stores = [j for j, op in enumerate(k.ops) if op.kind == "store" and op.level == FULL]
        if full_stores:
            self.loop_header(ind)
            self.emit_ops(self.k.full_closure(full_stores), ind + "    ")

    def pid(self) -> str:
        return "tl.program_id(0).to(tl.int64)" if self.int64 else "tl.program_id(0)"

    def source(self) -> str:
        k = self.k
        self.body()
        params = [b.name for b in k.buffers]
        if self.dynamic:
            params += [f"{s.name}: tl.int64" for s in self.symbols]
        else:
            params.append("xnumel")
            if self.reduction:
                params.append("rnumel")
        params.append("XBLOCK: tl.constexpr")
        if self.reduction:
            params.append("RBLOCK: tl.constexpr")
        # (The options are part of the source, so of its hash, which keys cached configs.)
        head = ["import triton", "import triton.language as tl",
                f"# compiled with {OPTIONS} (triton_render.OPTIONS)", ""]
        for name in sorted(self.helpers):
            head.append(_HELPERS[name].strip("\n"))
            head.append("")
        head.append("")
        if self.dynamic:
            names = tuple(s.name for s in self.symbols)
            head.append(f"@_jit(do_not_specialize={names!r})")
        else:
            head.append("@_jit")
        head.append(f"def {k.function_stem}({', '.join(params)}):")
        return "\n".join(head + self.lines) + "\n"


def _bf16_nearest_even(x: str) -> str:
    """fp32 ``x`` rounded to bf16's precision, to nearest even (NaN kept), still fp32: by hand,
    because Triton's interpreter truncates ``.to(tl.bfloat16)`` (the GPU rounds to nearest)."""
    bits = f"{x}.to(tl.uint32, bitcast=True)"
    rounded = f"(({bits} + 0x7FFF + (({bits} >> 16) & 1)) >> 16 << 16).to(tl.float32, bitcast=True)"
    return f"tl.where({x} != {x}, {x}, {rounded})"
