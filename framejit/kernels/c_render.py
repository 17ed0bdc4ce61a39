"""The C renderer: a :class:`~framejit.kernels.ir.Kernel` as one plain C11 function.

Every kernel becomes ``void <name>(char **bufs, int64_t nthreads, const int64_t *sizes)``:
``bufs[i]`` is the data pointer of ``kernel.buffers[i]`` (inputs, the random seed, outputs: the
description's order), ``nthreads`` the OpenMP thread count (``torch.get_num_threads()`` at call
time), ``sizes[j]`` the value of the run-time size ``kernel.symbols()[j]`` (read into a local of
the symbol's name, so a :class:`~framejit.kernels.ir.Sym` is pasted into the code as it is; a
static kernel never reads it). No ATen headers: ``<math.h>``, ``<stdint.h>``, ``<string.h>`` and
``<omp.h>``.

The loop nest splits the box in two:

* **rows** (``x``): the outer dimensions of a reduction; for a pointwise kernel every dimension
  but the last. Buffer offsets along them are computed once per row.
* **the row** (``r``): the reduced dimensions; for a pointwise kernel the last dimension. Each
  reduction group is one loop over the row (FULL values it needs recomputed there, as Triton's
  looped kernels do), then the per-row (OUTER) values, then one loop storing the FULL outputs.
  The row loops carry ``#pragma omp simd`` where nothing in them prevents it (sums use an
  OpenMP ``reduction`` clause; max/min/arg reductions stay scalar for their NaN rules).

Short rows of a reduction are latency-bound: a layer norm's row is a sum, its fold across vector
lanes, a divide, the variance's sum and fold, a square root and a divide, each waiting on the one
before. Such rows are taken several at a time, each step (a reduction's loop, then the stores)
for all of them before the next step, so that the processor overlaps their chains; each row
computes what it did alone, with the same bits (:meth:`_Renderer.interleaved_rows`).

A reduction whose row is strided in memory (an outer reduction such as ``x.sum(0)``) or
contiguous only in runs of at most :data:`SHORT_RUN` elements (max-pool's windows), and whose
outputs are contiguous along some outer dimension, runs the other way round: blocks of
neighbouring outputs (:meth:`_Renderer.block_width`), the row the outer loop and the block the
vector loop, accumulators in arrays (max/min keep NaN, arg reductions the first index; float sums
add in fp64).

Parallelism follows Inductor's rule of thumb (no OpenMP below :data:`PARALLEL_MIN` elements):
many rows run in parallel over rows; a single row (a full reduction, a 1-D pointwise kernel) is
cut in fixed parts, so per-part partial results (and so the rounding of a sum) do not depend on
the thread count. Sums of fp32 accumulate in fp32 inside chunks of :data:`SUM_CHUNK` elements and
in fp64 across chunks: a huge ``mean`` keeps its precision (pytorch#154703).

Run-time sizes (a dynamic kernel): the choices above that depend on a size are made by the C code
at run time with the same rules, so a dynamic kernel cuts rows and chunks sums as the static
kernel of the same sizes would (and gives its bits, unless the compiler vectorizes a loop
otherwise: a run-time stride that happens to be 1 still makes a strided loop). The loop nest is
rendered once, in a ``static`` function over a range of rows (``<name>_rows``, kept out of line
so that gcc vectorizes each loop once: three inlined copies took it 6x the static kernel's
compile time), and the kernel calls it in one of the ways its sizes allow: a single row cut in
parts (``xnumel == 1`` and a row of at least :data:`PARALLEL_MIN`; each thread of one parallel
region takes its share of the parts of each loop, a barrier before the parts' results combine),
one range of rows per thread (more than one thread and at least :data:`PARALLEL_MIN` elements),
or all rows on the calling thread. Sums of fp32 always take the chunked loop (one chunk for a
short row: the same result), and the parts of a cut row are computed from the row's length at
run time. Index arithmetic is ``int64_t`` everywhere, and ``#pragma omp simd`` needs no known
trip count.

Concatenations: a load valid in a :class:`~framejit.kernels.ir.Span` clamps its index into the
span (the points outside read some element of the buffer, and the ``concat`` discards what is
computed from it), and a ``concat`` is a select on the index. A pointwise row that concatenations
cut (``rotate_half`` along the last dimension) is instead one loop per piece, each taking its
concats' operand for that piece and loading it contiguously: clamped indices would be gathers.

Numerics match eager torch: no fast-math, no contraction (``-ffp-contract=off``), NaN-first
max/min/relu, ``sign(NaN) = 0``, float-to-int casts truncate, fp16/bf16 loaded to fp32 and
rounded to nearest-even on store (NaN stays NaN). Random numbers are Philox 4x32-10 keyed by the
per-call seed, point ``i`` of the box (its row-major index) taking word ``i & 3`` of the block for
counter ``i >> 2``: a loop that draws fills a small buffer per tile of its points, four numbers
per block and the blocks in vector registers, so the numbers do not depend on the thread count or
on how loops are cut.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import re

import torch

from .. import diskcache
from .ir import (
    FULL,
    OUTER,
    Expr,
    Kernel,
    Op,
    Span,
    Sym,
    concat_parts,
    is_operand,
    product,
    spans_of,
)

#: Kernels over fewer elements than this run on one thread (OpenMP costs a few microseconds).
PARALLEL_MIN = 32768
#: fp32 sums accumulate in fp32 over this many elements, then in fp64.
SUM_CHUNK = 4096
#: A plain loop (not in vector tiles) that sums fp32 values over a row of at least SUM_LANES
#: adds them in SUM_LANES accumulators, a block of SUM_LANES points at a time (see
#: :meth:`_Renderer.plain_loop`): gcc's omp simd sum keeps one vector, so each add waits on
#: the last (an fp32 layer norm over rows of 1024 ran 1.2x faster in lanes; each lane also adds
#: 4x fewer terms than a vector's lane did).
SUM_LANES = 32
#: A single row (full reduction, 1-D kernel) is split into at most this many parts.
MAX_PARTS = 256
#: Reductions whose row is strided in memory, or contiguous for at most SHORT_RUN elements,
#: run across a block of BLOCK neighbouring outputs at once (see :meth:`_Renderer.block_dim`).
BLOCK = 16
SHORT_RUN = 4
#: A static block dimension of at most this many outputs is one block; a longer one is cut in
#: blocks of the widest of :data:`BLOCK_WIDTHS` that divides it. Either way the vector loop has a
#: constant trip count (no masked epilogue) and a block's fixed costs (its index arithmetic,
#: accumulator set-up) are shared by more outputs: max-pool over 64 channels-last channels ran
#: 4 blocks of 16 per window row.
MAX_BLOCK = 64
BLOCK_WIDTHS = (64, 48, 32, 16)
#: Blocks of at least this constant width keep a float max/min's NaNs in flags of their own
#: (see :meth:`_Renderer.block_rows`).
NAN_FLAGS_WIDTH = 32
#: Rows of at most this many elements are unrolled in the block loop.
UNROLL_ROW = 16
#: A static row of at most this many elements keeps the values that a later loop over the row
#: needs and that cost more to recompute than to reload (a softmax's exp, a layer norm's sum of
#: inputs) in a local array, a "row buffer", as Inductor keeps them in its output buffer: the
#: later loop loads them instead of recomputing them (each exp once, not twice).
ROW_BUFFER = 4096
ROW_BUFFER_BYTES = 65536
#: A loop that draws random numbers draws them for this many points at a time into a local
#: buffer (see :meth:`_Renderer.rand_tiles`): 1 KiB of floats, which stays in L1.
RAND_TILE = 256
#: A loop in vector tiles (see :meth:`_Renderer.vector_tiles`) that sums takes tiles of a
#: chunk of the sum (:data:`SUM_CHUNK`), or the whole row of a shorter one: each tile ends the
#: loop's vector reductions (a horizontal sum is some 60 cycles: tiles of 512 points took most
#: of the gain). 16 KiB of floats per array.
VEC_TILE = SUM_CHUNK
#: At most this many exp/sigmoid ops, and fp16 loads and stores, of one loop in vector tiles
#: (the others stay in the loop): 16 KiB of stack each in a loop that sums.
MAX_TILED = 2
MAX_TILED_HALF = 4
#: A loop that stores and reduces nothing takes tiles of this many points: memory-bound
#: pointwise kernels (SwiGLU) ran 1.5x slower in tiles of 4096 points, whose exp loop
#: issued no loads for thousands of cycles; in tiles of 256 the loads keep streaming.
STORE_TILE = 256
#: An fp16 or bf16 input that every row of a static kernel reads alike (a layer norm's weight
#: and bias) is converted to fp32 once per call into a local array when the row is at most this long, and
#: such arrays take at most SHARED_BYTES of stack (see :meth:`_Renderer.shared_half_loads`).
SHARED_ROW = 8192
SHARED_BYTES = 65536
#: A loop that converts fp16 and stores and reduces nothing takes tiles of two AVX-512
#: vectors, kept in registers (see :meth:`_Renderer.vector_tiles`).
REG_TILE = 32
#: A sum of a 16-bit load's squares (an RMSNorm's) adds them as the tile converts the load
#: (fj_h2f_sum_tile_squares); False: the loop stores the squares for fj_sum_tile (for tests).
SQUARE_SUMS = True
#: A static kernel whose outputs take at least this many bytes writes its fp32 and fp16 stores
#: in vector tiles with non-temporal stores (fj_stream_tile, fj_f2h_stream_tile): such outputs
#: (half this machine's 32 MB L3) leave the caches before anything reads them, and a plain
#: store first reads each line from memory, a third of a one-input kernel's traffic (an fp32
#: RMSNorm over 4096x1024 0.8x Inductor's speed before, 1.2-1.4x after; add 1.7-1.9x). bf16
#: stores stay in their plain loops (tiles showed no gain there).
STREAM_BYTES = 16 << 20
#: ...and whose rows start this many bytes apart, or a multiple (a row of whole cache lines):
#: a row that ends mid-line leaves the line to plain stores and the next row's lines to an
#: unaligned head, and a partly written line costs the write-combining buffer a flush. An fp32
#: layer norm over rows of 77, 100 or 200 ran 1.5-2.2x slower streamed, over rows of 1000 1.1x;
#: fp16 over rows of 1000 1.6x (kernels.py, 1 thread). Tests lower it to stream any rows.
STREAM_LINE = 64
#: Loops over fp16 values as explicit vector code (see the renderer's vector_body) where they
#: take only ops it has; False: in vector tiles, as before it (tests of the tiles' paths).
VECTOR_BODY = True
#: Eight interleaved rows' sums fold together after the eighth (fj_fold_rows8, on AVX-512; see
#: vector_body); False: each row's as it ends (tests: the same bits).
DEFER_ROW_SUMS = True
#: The ops a vector tile computes, and the prelude's function that does (see _tile_function).
_TILE_FUNCTIONS = {"exp": "fj_exp_tile", "sigmoid": "fj_sigmoid_tile"}
#: Tile functions that also sum their results in the same pass, as fj_sum_tile adds them.
_TILE_SUM_FUNCTIONS = {"fj_exp_tile": "fj_exp_sum_tile", "fj_round_h_tile": "fj_round_h_sum_tile"}


def _without_sums(pragma: str | None, names: list[str]) -> str | None:
    """``pragma`` without ``names`` in its ``reduction(+:...)`` clause."""
    if pragma is None:
        return None
    def keep(m):
        rest = [n for n in m.group(1).split(", ") if n not in names]
        return f"reduction(+:{', '.join(rest)})" if rest else ""
    return " ".join(re.sub(r"reduction\(\+:([^)]*)\)", keep, pragma).split())


def _tile_function(op: Op) -> str | None:
    """The prelude's tile function that computes ``op`` in vector tiles, if any: exp, sigmoid,
    and rounding to fp16 (vcvtps2ph and back; the integer form vectorizes at about 30
    instructions a vector, and an fp16 residual + layer norm that rounded the residual for the
    norm ran 2.5x slower)."""
    if op.kind == "round":
        return "fj_round_h_tile" if op.args[1] == torch.float16 else None
    return _TILE_FUNCTIONS.get(op.kind)


#: Ops worth keeping rather than recomputing (besides values that need two loads or more). A
#: 16-bit output that its kernel reads too is rounded for it (``round``): a bf16 residual + layer
#: norm that kept the residual unrounded and rounded it again in each loop ran 1.4x slower.
_COSTLY = frozenset({"exp", "log", "log1p", "expm1", "sin", "cos", "tanh", "erf", "gelu", "sqrt",
                     "rsqrt", "sigmoid", "truediv", "reciprocal", "rand", "round"})

#: Reductions over short rows take each step for several rows in turn: as many rows as read
#: and keep INTERLEAVE_BYTES between them, at most INTERLEAVE_ROWS (see
#: :meth:`_Renderer.interleaved_rows`). A bf16 layer norm over rows of 128 ran 1.8x faster.
INTERLEAVE_BYTES = 4096
INTERLEAVE_ROWS = 8
#: fp32 sums over rows of at most this many values read from memory add in vector tiles.
TILED_SUM_ROW = 32
#: A softmax whose rows it would take at least AHEAD_ROWS at a time takes them so, rather than
#: each row's max in the previous row's exp tile (see :meth:`_Renderer.row_ahead`): an fp32
#: softmax over rows of 32 ran 1.4x faster, over rows of 128 as fast.
AHEAD_ROWS = 4
#: A local value's definition in the rendered code, and a name of one.
_DEFINED = re.compile(r"\bconst \w+ t(\d+) = ")
_NAMED = re.compile(r"\bt(\d+)\b")

#: A row cut by concatenations into at most this many pieces runs one loop per piece (see
#: :meth:`_Renderer.row_pieces`); more pieces select per element.
MAX_PIECES = 8

_C_TYPES = {
    torch.float32: "float", torch.float64: "double", torch.int64: "int64_t",
    torch.int32: "int32_t", torch.int16: "int16_t", torch.int8: "int8_t", torch.uint8: "uint8_t",
    torch.bool: "_Bool", torch.float16: "uint16_t", torch.bfloat16: "uint16_t",
}
#: Unsigned twins, for integer arithmetic that wraps as torch's does (signed overflow is UB).
_UNSIGNED = {torch.int64: "uint64_t", torch.int32: "uint32_t"}

PRELUDE = r"""
#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
/* A read of the cache line at p ahead of its loads (none where the compiler has no builtin) */
#if defined(__GNUC__)
#define FJ_PREFETCH(p) __builtin_prefetch((p), 0, 3)
#else
#define FJ_PREFETCH(p) ((void)(p))
#endif

/* glibc's vector math (libmvec): declared here because math.h declares it only under
   -ffast-math, which framejit never uses. The runtime defines FJ_LIBMVEC (and links -lmvec)
   when a probe links. */
#ifdef FJ_LIBMVEC
#define FJ_SIMD_DECL(T, name) _Pragma("omp declare simd notinbranch") T name(T);
FJ_SIMD_DECL(float, expf) FJ_SIMD_DECL(float, logf) FJ_SIMD_DECL(float, log1pf)
FJ_SIMD_DECL(float, expm1f) FJ_SIMD_DECL(float, sinf) FJ_SIMD_DECL(float, cosf)
FJ_SIMD_DECL(float, tanhf) FJ_SIMD_DECL(float, erff)
FJ_SIMD_DECL(double, exp) FJ_SIMD_DECL(double, log) FJ_SIMD_DECL(double, log1p)
FJ_SIMD_DECL(double, expm1) FJ_SIMD_DECL(double, sin) FJ_SIMD_DECL(double, cos)
FJ_SIMD_DECL(double, tanh) FJ_SIMD_DECL(double, erf)
#endif

/* exp for float: range reduction by ln 2 and a degree-6 polynomial, within 0.9 ulp of the
   exact result over all floats, with exp(-inf) = 0, exp(inf) = inf, NaN kept and subnormal
   results. Plain arithmetic, so it vectorizes; libmvec's vector expf falls back to a scalar call
   for every vector that holds a special lane (-inf from a causal mask: 20x slower). With FMA
   hardware the reduction and the polynomial use fmaf (explicit, so -ffp-contract=off keeps
   it): a third fewer instructions (1.6x faster). */
#ifdef __FMA__
#define FJ_MULADD(a, b, c) fmaf(a, b, c)
#else
#define FJ_MULADD(a, b, c) ((a) * (b) + (c))
#endif
static inline float fj_pow2i(int32_t k) {  /* 2^k, -126 <= k <= 127 */
    const uint32_t bits = (uint32_t)(k + 127) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
/* fj_expf's reduction and FMA polynomial, which its AVX-512 form fj_expv shares (the same
   bits): k = round(x / ln 2) by adding 1.5 * 2^23, r = x - k ln 2 in two parts */
#define FJ_EXP_LOG2E 1.44269504088896341f
#define FJ_EXP_ROUND 12582912.0f
#define FJ_EXP_LN2_HI (-0.693359375f)
#define FJ_EXP_LN2_LO 2.12194440e-4f
#define FJ_EXP_P6 1.3814596459e-03f
#define FJ_EXP_P5 8.3687175065e-03f
#define FJ_EXP_P4 4.1668388993e-02f
#define FJ_EXP_P3 1.6666521132e-01f
#define FJ_EXP_P2 4.9999994040e-01f
static inline float fj_expf(float x) {
    /* Below -104 the result is 0: those lanes (a mask's -inf) compute exp(0) instead, since
       arithmetic with subnormal results costs a microcode assist per instruction (2.7x slower
       for a causal softmax), and take 0 at the end. Above 89 (+inf) the lanes compute
       exp(89), which overflows to inf as it should. Every special lane is a select on the
       computed value, never a branch: the order of the selects matters to gcc, which copied
       the consumers of an earlier form (a sigmoid's division) into each arm (PRE). The upper
       clamp comes first and keeps NaN (a compare that is false for NaN), and NaN then flows
       through to the result (its k converts to INT_MIN, whose exponent steps below add 0 to
       p's bits and multiply by 1): no select for NaN lanes, and no mask juggling between the
       two clamps, makes a softmax 19% faster (same bits for every float, checked over all
       2^32). */
    const int tiny = x < -104.0f;
    float c = x > 89.0f ? 89.0f : x;
    c = tiny ? 0.0f : c;
    const float k = FJ_MULADD(c, FJ_EXP_LOG2E, FJ_EXP_ROUND) - FJ_EXP_ROUND;  /* round */
    float r = FJ_MULADD(k, FJ_EXP_LN2_HI, c);
    r = FJ_MULADD(k, FJ_EXP_LN2_LO, r);
#ifdef __FMA__
    /* exp(r) on |r| <= ln2/2 by our own minimax fit of degree 6 (relative error 3e-9), each
       step one fma: within 0.89 ulp over all floats, and 11% faster than Cephes's form below,
       which ends in an fma and an add (1.01 ulp). Without fma this one is 1.17 ulp off. */
    float p = FJ_EXP_P6;
    p = FJ_MULADD(p, r, FJ_EXP_P5);
    p = FJ_MULADD(p, r, FJ_EXP_P4);
    p = FJ_MULADD(p, r, FJ_EXP_P3);
    p = FJ_MULADD(p, r, FJ_EXP_P2);
    p = FJ_MULADD(p, r, 1.0f);
    p = FJ_MULADD(p, r, 1.0f);
#else
    /* Cephes: 1 + r + r^2 P(r), within 0.98 ulp with separate multiplies and adds. */
    float p = 1.9875691500e-4f;
    p = FJ_MULADD(p, r, 1.3981999507e-3f);
    p = FJ_MULADD(p, r, 8.3334519073e-3f);
    p = FJ_MULADD(p, r, 4.1665795894e-2f);
    p = FJ_MULADD(p, r, 1.6666665459e-1f);
    p = FJ_MULADD(p, r, 5.0000001201e-1f);
    p = FJ_MULADD(p, r * r, r) + 1.0f;
#endif
    /* Two steps, since 2^k may be subnormal: p * 2^k1 exactly, by adding k1 to p's exponent
       field (p is in [0.7, 1.5] and -75 <= k1 <= 64), then one rounding multiply by 2^(k-k1). */
    const int32_t ki = (int32_t)k, k1 = ki >> 1;
    uint32_t pb;
    memcpy(&pb, &p, 4);
    pb += (uint32_t)k1 << 23;
    float p1;
    memcpy(&p1, &pb, 4);
    const float y = p1 * fj_pow2i(ki - k1);
    const float y0 = tiny ? 0.0f : y;
#if defined(__x86_64__) || defined(__aarch64__)
    return y0;  /* NaN's k converts to INT_MIN (x86) or 0 (arm64): y0 is NaN */
#else
    return x != x ? x : y0;
#endif
}

/* A plain loop's lanes of a sum (SUM_LANES of them, a power of two) added pairwise: lane j
   and lane j + n/2, then j + n/4, ...: five steps, where adding them in order was a chain of
   32 dependent adds (an fp32 layer norm over rows of 128 took three such chains a row) */
static inline float fj_fold_lanes(float *l, int n) {
    for (int s = n / 2; s > 0; s /= 2)
        for (int j = 0; j < s; j++)
            l[j] += l[j + s];
    return l[0];
}
/* Vector tiles (see the renderer's vector_tiles): fj_expf and its users over FJ_VW floats in a
   register, in AVX-512 (16 floats) or AVX2 with FMA and F16C (8: most x86 laptops and
   desktops). gcc's builtins, so that no unit parses <immintrin.h> for them; other compilers
   take the plain loops. Each ISA defines the vector types, FJ_VFMA, FJ_VMIN (a < b ? a : b, so
   FJ_VMIN(89, x) keeps NaN as the scalar form's clamp does), FJ_VMAX (a > b ? a : b),
   fj_vscale (p * 2^k, k integral) and the fp16 conversions fj_h2fv/fj_f2hv (vcvtph2ps /
   vcvtps2ph: fj_h2f's and fj_f2h's values, but for a NaN's payload bits). */
#if defined(__AVX512F__) && defined(__FMA__) && defined(__GNUC__) && !defined(__clang__) \
    && !defined(FJ_NO_VEC_TILES)
#define FJ_VEC_TILES 1
#define FJ_VW 16
typedef float fj_vf __attribute__((vector_size(64)));
typedef int32_t fj_vi __attribute__((vector_size(64)));
typedef short fj_vh __attribute__((vector_size(32)));
#define FJ_LANE_IDS ((fj_vi){0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15})
#define FJ_VFMA(a, b, c) __builtin_ia32_vfmaddps512_mask((a), (b), (c), (short)-1, 4)
#define FJ_VMIN(a, b) __builtin_ia32_minps512_mask((a), (b), (b), (short)-1, 4)
#define FJ_VMAX(a, b) __builtin_ia32_maxps512_mask((a), (b), (b), (unsigned short)-1, 4)
/* vscalefps: the multiply by 2^k with one rounding, subnormal results and overflow to inf
   itself, where fj_expf's two steps take 8 instructions (the same bits) */
static inline fj_vf fj_vscale(fj_vf p, fj_vf k) {
    return __builtin_ia32_scalefps512_mask(p, k, p, (short)-1, 4);
}
static inline fj_vf fj_h2fv(fj_vh w) {
    return __builtin_ia32_vcvtph2ps512_mask(w, (fj_vf){0}, (short)-1, 4);
}
static inline fj_vh fj_f2hv(fj_vf v) {
    return __builtin_ia32_vcvtps2ph512_mask(v, 0, (fj_vh){0}, (short)-1);
}
/* 16-bit lanes zero-extended to 32 (vpmovzxwd) and 32-bit lanes truncated to 16 (vpmovdw):
   gcc 12 splits __builtin_convertvector's into 256-bit halves and an insert */
#define FJ_WIDEN16(w) __builtin_ia32_pmovzxwd512_mask((w), (fj_vi){0}, (short)-1)
#define FJ_NARROW16(v) __builtin_ia32_pmovdw512_mask((v), (fj_vh){0}, (short)-1)
/* Non-temporal stores of a vector of floats (halfs) to an address aligned to its size */
#define FJ_STREAM(p, v) __builtin_ia32_movntps512((float *)(p), (v))
typedef long long fj_vq __attribute__((vector_size(32)));
#define FJ_STREAM16(p, w) __builtin_ia32_movntdq256((fj_vq *)(p), (fj_vq)(w))
/* The first m < FJ_VW floats at p into a vector (zeros in the other lanes), and back: masked
   loads and stores (a copy through a zeroed vector on the stack is two stores that the
   vector load waits for) */
#define FJ_TAIL_LOAD(p, m) \
    __builtin_ia32_loadups512_mask((p), (fj_vf){0}, (unsigned short)((1u << (m)) - 1))
#define FJ_TAIL_STORE(p, v, m) \
    __builtin_ia32_storeups512_mask((p), (v), (unsigned short)((1u << (m)) - 1))
#if defined(__AVX512BW__) && defined(__AVX512VL__)
/* ... and of m < FJ_VW halfs */
#define FJ_TAIL_LOAD16(p, m) __builtin_ia32_loaddquhi256_mask((const short *)(p), (fj_vh){0}, \
                                                              (unsigned short)((1u << (m)) - 1))
#define FJ_TAIL_STORE16(p, v, m) \
    __builtin_ia32_storedquhi256_mask((short *)(p), (v), (unsigned short)((1u << (m)) - 1))
/* AVX512-BF16's vcvtne2ps2bf16 (two vectors rounded to bf16 as one vector of 32: see
   fj_vstbf2) and AVX512-DQ's subnormal test of a vector's lanes (vfpclassps), where gcc has
   them */
#if defined(__AVX512BF16__) && defined(__AVX512DQ__) && defined(__has_builtin)
#if __has_builtin(__builtin_ia32_cvtne2ps2bf16_v32hi)
#define FJ_CVTNE2(a, b) __builtin_ia32_cvtne2ps2bf16_v32hi((a), (b))
#elif __has_builtin(__builtin_ia32_cvtne2ps2bf16_v32bf)
#define FJ_CVTNE2(a, b) __builtin_ia32_cvtne2ps2bf16_v32bf((a), (b))
#endif
#if defined(FJ_CVTNE2) && __has_builtin(__builtin_ia32_fpclassps512_mask) \
    && !defined(FJ_NO_BF16_PAIRS)
#define FJ_BF16_PAIRS 1
#define FJ_SUBNORMALS(v) __builtin_ia32_fpclassps512_mask((v), 0x20, (unsigned short)-1)
#endif
#endif
#endif
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && defined(__GNUC__) \
    && !defined(__clang__) && !defined(FJ_NO_VEC_TILES)
#define FJ_VEC_TILES 1
#define FJ_VW 8
typedef float fj_vf __attribute__((vector_size(32)));
typedef int32_t fj_vi __attribute__((vector_size(32)));
typedef short fj_vh __attribute__((vector_size(16)));
#define FJ_LANE_IDS ((fj_vi){0, 1, 2, 3, 4, 5, 6, 7})
#define FJ_VFMA(a, b, c) __builtin_ia32_vfmaddps256((a), (b), (c))
#define FJ_VMIN(a, b) __builtin_ia32_minps256((a), (b))
#define FJ_VMAX(a, b) __builtin_ia32_maxps256((a), (b))
/* fj_expf's two steps, lane by lane: p * 2^k1 by adding k1 to p's exponent field, then one
   rounding multiply by 2^(k - k1); a NaN lane's k converts to INT_MIN (vcvttps2dq), which
   keeps it NaN, as in fj_expf */
static inline fj_vf fj_vscale(fj_vf p, fj_vf k) {
    typedef uint32_t fj_vu __attribute__((vector_size(32)));
    const fj_vi ki = __builtin_convertvector(k, fj_vi), k1 = ki >> 1;
    const fj_vu pb = (fj_vu)p + ((fj_vu)k1 << 23);
    return (fj_vf)pb * (fj_vf)((fj_vu)(ki - k1 + 127) << 23);
}
static inline fj_vf fj_h2fv(fj_vh w) {
    return __builtin_ia32_vcvtph2ps256(w);
}
static inline fj_vh fj_f2hv(fj_vf v) {
    return __builtin_ia32_vcvtps2ph256(v, 0);
}
#define FJ_WIDEN16(w) __builtin_ia32_pmovzxwd256((w))
#define FJ_NARROW16(v) __builtin_convertvector((v), fj_vh)
#define FJ_STREAM(p, v) __builtin_ia32_movntps256((float *)(p), (v))
typedef long long fj_vq __attribute__((vector_size(16)));
#define FJ_STREAM16(p, w) __builtin_ia32_movntdq((fj_vq *)(p), (fj_vq)(w))
#define FJ_TAIL_LOAD(p, m) __builtin_ia32_maskloadps256((const fj_vf *)(p), FJ_LANE_IDS < (int)(m))
#define FJ_TAIL_STORE(p, v, m) \
    __builtin_ia32_maskstoreps256((fj_vf *)(p), FJ_LANE_IDS < (int)(m), (v))
#else
#define FJ_VEC_TILES 0
#endif

#if FJ_VEC_TILES
#define FJ_V(c) ((fj_vf){0} + (float)(c))
/* fj_expf's reduction and polynomial, then fj_vscale: the same bits for every float */
static inline fj_vf fj_expv(fj_vf x) {
    const fj_vi tiny = x < FJ_V(-104.0f);
    fj_vf c = FJ_VMIN(FJ_V(89.0f), x);
    c = (fj_vf)((fj_vi)c & ~tiny);
    const fj_vf k = FJ_VFMA(c, FJ_V(FJ_EXP_LOG2E), FJ_V(FJ_EXP_ROUND)) - FJ_EXP_ROUND;
    fj_vf r = FJ_VFMA(k, FJ_V(FJ_EXP_LN2_HI), c);
    r = FJ_VFMA(k, FJ_V(FJ_EXP_LN2_LO), r);
    fj_vf p = FJ_V(FJ_EXP_P6);
    p = FJ_VFMA(p, r, FJ_V(FJ_EXP_P5));
    p = FJ_VFMA(p, r, FJ_V(FJ_EXP_P4));
    p = FJ_VFMA(p, r, FJ_V(FJ_EXP_P3));
    p = FJ_VFMA(p, r, FJ_V(FJ_EXP_P2));
    p = FJ_VFMA(p, r, FJ_V(1.0f));
    p = FJ_VFMA(p, r, FJ_V(1.0f));
    return (fj_vf)((fj_vi)fj_vscale(p, k) & ~tiny);
}
static inline fj_vf fj_sigmoidv(fj_vf x) {
    return FJ_V(1.0f) / (FJ_V(1.0f) + fj_expv(-x));
}
/* e[0..n) = f(e[0..n)), e aligned to 64 bytes; the last n % FJ_VW through a zeroed vector */
#define FJ_TILE_FUNCTION(name, f)                                \
    static inline void name(float *restrict e, int64_t n) {       \
        int64_t i = 0;                                           \
        fj_vf v;                                                 \
        for (; i + FJ_VW <= n; i += FJ_VW) {                     \
            memcpy(&v, e + i, sizeof v);                         \
            v = f(v);                                            \
            memcpy(e + i, &v, sizeof v);                         \
        }                                                        \
        const int64_t m = n - i; /* < FJ_VW: says so to gcc */   \
        if (m > 0 && m < FJ_VW) {                                \
            v = FJ_TAIL_LOAD(e + i, m);                          \
            v = f(v);                                            \
            FJ_TAIL_STORE(e + i, v, m);                          \
        }                                                        \
    }
FJ_TILE_FUNCTION(fj_exp_tile, fj_expv)
FJ_TILE_FUNCTION(fj_sigmoid_tile, fj_sigmoidv)
/* fp32 values rounded to fp16 and back: fj_h2f(fj_f2h(x)), but for a NaN's payload bits */
static inline fj_vf fj_round_hv(fj_vf v) {
    return fj_h2fv(fj_f2hv(v));
}
FJ_TILE_FUNCTION(fj_round_h_tile, fj_round_hv)
/* Eight rows' values at once (interleaved_rows' per-row steps, eight rows a step): 256-bit
   vectors, with AVX's sqrt and F16C's conversions (an AVX-512 build may lack F16C: then the
   rows take the loop); the bits of the scalar forms (fj_round_h1, fj_round_bf, 1 / sqrtf), but
   for a NaN's payload bits. */
#if defined(__F16C__) && defined(__AVX__)
#define FJ_ROWS8 1
typedef float fj_v8f __attribute__((vector_size(32)));
typedef uint32_t fj_v8u __attribute__((vector_size(32)));
#define FJ_V8(c) ((fj_v8f){(c), (c), (c), (c), (c), (c), (c), (c)})
static inline fj_v8f fj_sqrt8(fj_v8f a) {
    return __builtin_ia32_sqrtps256(a);
}
static inline fj_v8f fj_round_h8(fj_v8f a) {
    return __builtin_ia32_vcvtph2ps256(__builtin_ia32_vcvtps2ph256(a, 0));
}
static inline fj_v8f fj_round_bf8(fj_v8f a) {
    fj_v8u u = (fj_v8u)a;
    const fj_v8u nan = (fj_v8u)(a != a);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    return (fj_v8f)((u & ~nan) | (0x7fc00000u & nan));
}
/* ... and the first n <= 8 points of a row at once: vector_body's loads, stores and selects for
   a piece of a row of 8 to 15 points (a concatenation's), whose FJ_VW-wide forms would read past
   it; the lanes past n hold zeros. The same bits as theirs (n is a constant: a load or store of
   8, or of a piece's last n points, is one instruction) */
typedef int32_t fj_v8i __attribute__((vector_size(32)));
typedef unsigned short fj_v8s __attribute__((vector_size(16)));
typedef short fj_v8hi __attribute__((vector_size(16)));
#if defined(__AVX512BW__) && defined(__AVX512VL__)
/* (n < 8: masked loads and stores; elements copied one at a time into a vector on the stack
   and then read as one are a stalled store-to-load forward each: a rotary embedding over rows
   of 24, in pieces of 12 (8 + 4), ran 1.63x slower in fp16, 1.1x in bf16) */
#define FJ_V8MASK(n) ((unsigned char)((1u << (n)) - 1))
static inline fj_v8f fj_v8ld(const float *p, int n) {
    return __builtin_ia32_loadups256_mask(p, (fj_v8f){0}, FJ_V8MASK(n));
}
static inline void fj_v8st(float *p, fj_v8f v, int n) {
    __builtin_ia32_storeups256_mask(p, v, FJ_V8MASK(n));
}
static inline fj_v8s fj_v8ld16(const uint16_t *p, int n) {
    return (fj_v8s)__builtin_ia32_loaddquhi128_mask((const short *)p, (fj_v8hi){0}, FJ_V8MASK(n));
}
static inline void fj_v8st16(uint16_t *p, fj_v8s w, int n) {
    __builtin_ia32_storedquhi128_mask((short *)p, (fj_v8hi)w, FJ_V8MASK(n));
}
#else
static inline fj_v8f fj_v8ld(const float *p, int n) {
    fj_v8f v = {0};
    if (n == 8)
        memcpy(&v, p, sizeof v);
    else
        for (int i = 0; i < n; i++)
            v[i] = p[i];
    return v;
}
static inline void fj_v8st(float *p, fj_v8f v, int n) {
    if (n == 8)
        memcpy(p, &v, sizeof v);
    else
        for (int i = 0; i < n; i++)
            p[i] = v[i];
}
static inline fj_v8s fj_v8ld16(const uint16_t *p, int n) {
    fj_v8s w = {0};
    if (n == 8)
        memcpy(&w, p, sizeof w);
    else
        for (int i = 0; i < n; i++)
            w[i] = p[i];
    return w;
}
static inline void fj_v8st16(uint16_t *p, fj_v8s w, int n) {
    if (n == 8)
        memcpy(p, &w, sizeof w);
    else
        for (int i = 0; i < n; i++)
            p[i] = w[i];
}
#endif
static inline fj_v8f fj_v8ldh(const uint16_t *p, int n) {
    return __builtin_ia32_vcvtph2ps256((fj_v8hi)fj_v8ld16(p, n));
}
static inline void fj_v8sth(uint16_t *p, fj_v8f v, int n) {
    fj_v8st16(p, (fj_v8s)__builtin_ia32_vcvtps2ph256(v, 0), n);
}
static inline fj_v8f fj_v8ldbf(const uint16_t *p, int n) {
    return (fj_v8f)(__builtin_convertvector(fj_v8ld16(p, n), fj_v8u) << 16);
}
static inline void fj_v8stbf(uint16_t *p, fj_v8f v, int n) {
    fj_v8st16(p, __builtin_convertvector((fj_v8u)fj_round_bf8(v) >> 16, fj_v8s), n);
}
static inline fj_v8f fj_v8sel(fj_v8i m, fj_v8f a, fj_v8f b) {
    return (fj_v8f)(((fj_v8i)a & m) | ((fj_v8i)b & ~m));
}
#define fj_v8relu(x) ((fj_v8f)((fj_v8i)(x) & ~((x) < FJ_V8(0.0f))))
#define fj_v8maximum(x, y) fj_v8sel(((x) > (y)) | ((x) != (x)), (x), (y))
#define fj_v8minimum(x, y) fj_v8sel(((x) < (y)) | ((x) != (x)), (x), (y))
#define fj_v8abs(x) ((fj_v8f)((fj_v8i)(x) & 0x7fffffff))
#endif
/* The sum of four vector accumulators, then pairwise across lanes: in registers (through
   memory, a 64-byte store read back as floats does not forward: a 1024-float softmax row took
   35% longer) */
typedef float fj_vf8 __attribute__((vector_size(32)));
typedef float fj_vf4 __attribute__((vector_size(16)));
typedef int32_t fj_vi4 __attribute__((vector_size(16)));
/* The lanes of a added pairwise, halves first: lane i + lane i + FJ_VW/2, then within the
   half, down to one (the adds of shuffles by lane ^ 8, ^ 4, ^ 2, ^ 1). Each step on a vector
   half as wide, where full-width shuffles and adds took two of a 256-bit unit's cycles each on
   AVX-512 (Zen 4): an RMSNorm over 131072 rows of 24, 1 thread, 1.05x faster in fp16, 1.03x
   in bf16. */
static inline float fj_fold_sum(fj_vf a) {
#if FJ_VW == 16
    const fj_vf8 h = (fj_vf8){a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]}
                     + (fj_vf8){a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15]};
#else
    const fj_vf8 h = a;
#endif
    fj_vf4 q = (fj_vf4){h[0], h[1], h[2], h[3]} + (fj_vf4){h[4], h[5], h[6], h[7]};
    q += __builtin_shuffle(q, (fj_vi4){2, 3, 0, 1});
    q += __builtin_shuffle(q, (fj_vi4){1, 0, 3, 2});
    return q[0];
}
static inline float fj_lanes_sum(fj_vf a0, fj_vf a1, fj_vf a2, fj_vf a3) {
    return fj_fold_sum((a0 + a1) + (a2 + a3));
}
#if FJ_VW == 16
/* out[k] = 0.0f + fj_fold_sum(q[k]) for the first n <= 8 of eight rows' vectors of lanes: the
   same adds of the same pairs, the rows side by side (two rows' halves a vector, then four
   rows' quarters, then eight rows' pairs): eight rows' folds in 15 two-vector shuffles and 8
   adds, where each row's own took 4 of each (vector_body's deferred sums, see
   interleaved_rows) */
static inline void fj_fold_rows8(const fj_vf *restrict q, float *restrict out, int64_t n) {
    const fj_vi halves = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
    const fj_vi quarters = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27};
    const fj_vi pairs = {0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29};
    fj_vf h[4], u[2];
    for (int p = 0; p < 4; p++)
        h[p] = __builtin_shuffle(q[2 * p], q[2 * p + 1], halves)
               + __builtin_shuffle(q[2 * p], q[2 * p + 1], halves + 8);
    for (int p = 0; p < 2; p++)
        u[p] = __builtin_shuffle(h[2 * p], h[2 * p + 1], quarters)
               + __builtin_shuffle(h[2 * p], h[2 * p + 1], quarters + 4);
    fj_vf v = __builtin_shuffle(u[0], u[1], pairs) + __builtin_shuffle(u[0], u[1], pairs + 2);
    v += __builtin_shuffle(v, FJ_LANE_IDS ^ 1);
    for (int64_t k = 0; k < n; k++)
        out[k] = 0.0f + v[2 * k];
}
#endif
/* fj_lanes_sum of a row too short for the last two accumulators (always zero): the same value
   (adding a zero changes no sum but the sign of a zero total, which the row's sum, started at
   +0, never keeps) */
static inline float fj_lanes_sump(fj_vf a0, fj_vf a1) {
    return fj_fold_sum(a0 + a1);
}
/* The greatest (least) lane of m, which holds no NaN; and whether any lane of a mask is set:
   the lanes folded in halves, in registers */
#if FJ_VW == 16
#define FJ_FOLD16(m, F) m = F(m, __builtin_shuffle(m, FJ_LANE_IDS ^ 8))
#else
#define FJ_FOLD16(m, F) (void)0
#endif
#define FJ_LANES_FOLD(name, F)                                  \
    static inline float name(fj_vf m) {                         \
        FJ_FOLD16(m, F);                                        \
        m = F(m, __builtin_shuffle(m, FJ_LANE_IDS ^ 4));        \
        m = F(m, __builtin_shuffle(m, FJ_LANE_IDS ^ 2));        \
        m = F(m, __builtin_shuffle(m, FJ_LANE_IDS ^ 1));        \
        return m[0];                                            \
    }
FJ_LANES_FOLD(fj_lanes_max, FJ_VMAX)
FJ_LANES_FOLD(fj_lanes_min, FJ_VMIN)
static inline int fj_lanes_any(fj_vi n) {
#if FJ_VW == 16
    n |= __builtin_shuffle(n, FJ_LANE_IDS ^ 8);
#endif
    n |= __builtin_shuffle(n, FJ_LANE_IDS ^ 4);
    n |= __builtin_shuffle(n, FJ_LANE_IDS ^ 2);
    n |= __builtin_shuffle(n, FJ_LANE_IDS ^ 1);
    return n[0] != 0;
}
/* fj_lanes_sum of a0..a3, and into *sq of q0..q3: the same adds in the same order, the two
   sums' lanes side by side in one vector (the first step adds each one's halves; the rest add
   within the halves), so that a layer norm's two sums over a short row take half the shuffles
   and adds */
static inline float fj_lanes_sum2(fj_vf a0, fj_vf a1, fj_vf a2, fj_vf a3, fj_vf q0, fj_vf q1,
                                  fj_vf q2, fj_vf q3, float *restrict sq) {
    const fj_vi ids = FJ_LANE_IDS, lo = ids + ((ids >= FJ_VW / 2) & (FJ_VW / 2));
    a0 = (a0 + a1) + (a2 + a3);
    q0 = (q0 + q1) + (q2 + q3);
    fj_vf s = __builtin_shuffle(a0, q0, lo) + __builtin_shuffle(a0, q0, lo + FJ_VW / 2);
#if FJ_VW == 16
    s += __builtin_shuffle(s, ids ^ 4);
#endif
    s += __builtin_shuffle(s, ids ^ 2);
    s += __builtin_shuffle(s, ids ^ 1);
    *sq = s[FJ_VW / 2];
    return s[0];
}
/* fj_lanes_sum2 of rows too short for the last two accumulators (as fj_lanes_sump) */
static inline float fj_lanes_sum2p(fj_vf a0, fj_vf a1, fj_vf q0, fj_vf q1, float *restrict sq) {
    const fj_vi ids = FJ_LANE_IDS, lo = ids + ((ids >= FJ_VW / 2) & (FJ_VW / 2));
    a0 = a0 + a1;
    q0 = q0 + q1;
    fj_vf s = __builtin_shuffle(a0, q0, lo) + __builtin_shuffle(a0, q0, lo + FJ_VW / 2);
#if FJ_VW == 16
    s += __builtin_shuffle(s, ids ^ 4);
#endif
    s += __builtin_shuffle(s, ids ^ 2);
    s += __builtin_shuffle(s, ids ^ 1);
    *sq = s[FJ_VW / 2];
    return s[0];
}
/* The sum of e[0..n): blocks of 4 vectors into four accumulators, then a vector at a time into
   the first, the last m < FJ_VW into the second (fj_h2f_sum_tile and fj_exp_sub_tile add
   alike) */
static inline float fj_sum_tile(const float *restrict e, int64_t n) {
    fj_vf a0 = FJ_V(0.0f), a1 = a0, a2 = a0, a3 = a0, v;
    int64_t i = 0;
    for (; i + 4 * FJ_VW <= n; i += 4 * FJ_VW) {
        memcpy(&v, e + i, sizeof v);
        a0 += v;
        memcpy(&v, e + i + FJ_VW, sizeof v);
        a1 += v;
        memcpy(&v, e + i + 2 * FJ_VW, sizeof v);
        a2 += v;
        memcpy(&v, e + i + 3 * FJ_VW, sizeof v);
        a3 += v;
    }
    for (; i + FJ_VW <= n; i += FJ_VW) {
        memcpy(&v, e + i, sizeof v);
        a0 += v;
    }
    const int64_t m = n - i; /* < FJ_VW */
    if (m > 0 && m < FJ_VW)
        a1 += FJ_TAIL_LOAD(e + i, m);
    return fj_lanes_sum(a0, a1, a2, a3);
}
/* The sum of e[0..n) as fj_sum_tile adds it, and into *sq the sum of their squares as
   fj_sum_tile would add them, in one pass (a layer norm's x - mean and its squares, for the
   corrected variance: two passes over the row took the fp16 layer norm 1.15x longer) */
static inline float fj_sum_sq_tile(const float *restrict e, int64_t n, float *restrict sq) {
    fj_vf a0 = FJ_V(0.0f), a1 = a0, a2 = a0, a3 = a0, q0 = a0, q1 = a0, q2 = a0, q3 = a0, v;
    int64_t i = 0;
    for (; i + 4 * FJ_VW <= n; i += 4 * FJ_VW) {
        memcpy(&v, e + i, sizeof v);
        a0 += v;
        q0 += v * v;
        memcpy(&v, e + i + FJ_VW, sizeof v);
        a1 += v;
        q1 += v * v;
        memcpy(&v, e + i + 2 * FJ_VW, sizeof v);
        a2 += v;
        q2 += v * v;
        memcpy(&v, e + i + 3 * FJ_VW, sizeof v);
        a3 += v;
        q3 += v * v;
    }
    for (; i + FJ_VW <= n; i += FJ_VW) {
        memcpy(&v, e + i, sizeof v);
        a0 += v;
        q0 += v * v;
    }
    const int64_t m = n - i; /* < FJ_VW */
    if (m > 0 && m < FJ_VW) {
        v = FJ_TAIL_LOAD(e + i, m);
        a1 += v;
        q1 += v * v;
    }
    return fj_lanes_sum2(a0, a1, a2, a3, q0, q1, q2, q3, sq);
}
/* f over e[0..n) in place (as FJ_TILE_FUNCTION), and the sum of the results as fj_sum_tile
   adds them, in one pass: fj_exp_sum_tile (a log-softmax's sum of exps) and fj_round_h_sum_tile
   (a residual's sum for its norm, rounded to fp16 as its kernel also stores it); the tail's
   masked store read back by a masked load would not forward */
#define FJ_TILE_SUM_FUNCTION(name, f)                                                        \
    static inline fj_vf name##_at(float *restrict e) {                                     \
        fj_vf v;                                                                            \
        memcpy(&v, e, sizeof v);                                                            \
        v = f(v);                                                                           \
        memcpy(e, &v, sizeof v);                                                            \
        return v;                                                                           \
    }                                                                                       \
    static inline float name(float *restrict e, int64_t n) {                               \
        fj_vf a0 = FJ_V(0.0f), a1 = a0, a2 = a0, a3 = a0, v;                                \
        int64_t i = 0;                                                                      \
        for (; i + 4 * FJ_VW <= n; i += 4 * FJ_VW) {                                        \
            a0 += name##_at(e + i);                                                         \
            a1 += name##_at(e + i + FJ_VW);                                                 \
            a2 += name##_at(e + i + 2 * FJ_VW);                                             \
            a3 += name##_at(e + i + 3 * FJ_VW);                                             \
        }                                                                                   \
        for (; i + FJ_VW <= n; i += FJ_VW)                                                  \
            a0 += name##_at(e + i);                                                         \
        const int64_t m = n - i; /* < FJ_VW */                                              \
        if (m > 0 && m < FJ_VW) {                                                           \
            v = f(FJ_TAIL_LOAD(e + i, m));                                                  \
            FJ_TAIL_STORE(e + i, v, m);                                                     \
            a1 += (fj_vf)((fj_vi)v & (FJ_LANE_IDS < (int)m)); /* the stored lanes, zeros */ \
        }                                                                                   \
        return fj_lanes_sum(a0, a1, a2, a3);                                                \
    }
FJ_TILE_SUM_FUNCTION(fj_exp_sum_tile, fj_expv)
FJ_TILE_SUM_FUNCTION(fj_round_h_sum_tile, fj_round_hv)
/* e[i] = exp(x[i] - c) for i < n, the values of fj_exp_tile over the differences, and their
   sum as fj_sum_tile adds them; and the max of next[0..n) into *m, NaNs skipped and flagged
   in *nan, as a max reduction's loop takes it (a softmax's next row: see the renderer's
   row_ahead). One pass for the three. */
static inline fj_vf fj_exp_subv(const float *restrict x, fj_vf c, float *restrict e,
                                const float *restrict next, fj_vf *top, fj_vi *flag) {
    fj_vf v, u;
    memcpy(&v, x, sizeof v);
    v = fj_expv(v - c);
    memcpy(e, &v, sizeof v);
    memcpy(&u, next, sizeof u);
    *top = FJ_VMAX(u, *top);
    *flag |= (fj_vi)(u != u);
    return v;
}
static inline float fj_exp_sub_tile(const float *restrict x, float c, float *restrict e, int64_t n,
                                    const float *restrict next, float *restrict m,
                                    int *restrict nan) {
    const fj_vf cv = FJ_V(c);
    fj_vf a0 = FJ_V(0.0f), a1 = a0, a2 = a0, a3 = a0, v, top = FJ_V(-INFINITY);
    fj_vi flag = (fj_vi){0};
    int64_t i = 0;
    for (; i + 4 * FJ_VW <= n; i += 4 * FJ_VW) {
        a0 += fj_exp_subv(x + i, cv, e + i, next + i, &top, &flag);
        a1 += fj_exp_subv(x + i + FJ_VW, cv, e + i + FJ_VW, next + i + FJ_VW, &top, &flag);
        a2 += fj_exp_subv(x + i + 2 * FJ_VW, cv, e + i + 2 * FJ_VW, next + i + 2 * FJ_VW, &top,
                          &flag);
        a3 += fj_exp_subv(x + i + 3 * FJ_VW, cv, e + i + 3 * FJ_VW, next + i + 3 * FJ_VW, &top,
                          &flag);
    }
    for (; i + FJ_VW <= n; i += FJ_VW)
        a0 += fj_exp_subv(x + i, cv, e + i, next + i, &top, &flag);
    float best = *m;
    int any = *nan;
    const int64_t rest = n - i; /* < FJ_VW: says so to gcc */
    if (rest > 0 && rest < FJ_VW) {
        v = fj_expv(FJ_TAIL_LOAD(x + i, rest) - cv);
        FJ_TAIL_STORE(e + i, v, rest);
        a1 += (fj_vf)((fj_vi)v & (FJ_LANE_IDS < (int)rest));  /* the stored lanes, zeros */
        for (int64_t j = 0; j < rest; j++) {
            best = next[i + j] > best ? next[i + j] : best;
            any |= next[i + j] != next[i + j];
        }
    }
    for (int l = 0; l < FJ_VW; l++) {
        best = top[l] > best ? top[l] : best;
        any |= flag[l] != 0;
    }
    *m = best;
    *nan = any;
    return fj_lanes_sum(a0, a1, a2, a3);
}
#endif

/* GELU, x / 2 * (1 + erf(x / sqrt 2)), with erf(z) = z * P(z^2) / Q(z^2) for |z| < 3.925 and
   sign(z) beyond, where float's erf is +-1. Our own rational fit (relative error 2e-8 in exact
   arithmetic, float coefficients), evaluated in float: within 3.5e-7 of erf, so GELU within
   1e-6 of the exact value. Eager's CPU GELU approximates erf too (Abramowitz-Stegun 7.1.26
   and a vector exp) and is up to 1.2e-6 off. This form has no exp and one division: a GELU
   loop runs in half the time it takes with glibc's vector erff (which torch.erf keeps:
   eager's erf is within 3e-8). Beyond 3.925 (and for +-inf, whose P / Q is NaN) a select on
   |z| takes +-1; NaN stays NaN. The forms matter to gcc 12: clamping z first, or e itself,
   made it track which lanes were clamped with masks (1.2x-1.7x slower), and fminf does not
   vectorize at all. */
static inline float fj_geluf(float x) {
    const float z = x * 0.70710678118654752f;
    const float s = z * z;
    float p = 2.045950396e-06f;
    p = FJ_MULADD(p, s, 2.848359582e-04f);
    p = FJ_MULADD(p, s, 3.772479249e-03f);
    p = FJ_MULADD(p, s, 5.276904255e-02f);
    p = FJ_MULADD(p, s, 1.905929297e-01f);
    p = FJ_MULADD(p, s, 1.128379107e+00f);
    float q = 3.804659355e-05f;
    q = FJ_MULADD(q, s, 1.163829933e-03f);
    q = FJ_MULADD(q, s, 1.498305425e-02f);
    q = FJ_MULADD(q, s, 1.141822487e-01f);
    q = FJ_MULADD(q, s, 5.022413135e-01f);
    q = FJ_MULADD(q, s, 1.0f);
    const float e = fabsf(z) >= 3.925f ? copysignf(1.0f, z) : z * p / q;
    /* e may pass -1 by an ulp or two near z = -3.9: keep GELU of a negative x from turning
       positive. */
    float t = 1.0f + e;
    t = t < 0.0f ? 0.0f : t;
    return x * 0.5f * t;
}

static inline float fj_bf2f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t fj_f2bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if (f != f) return 0x7fc0;
    u += 0x7fffu + ((u >> 16) & 1u);  /* round to nearest even, as c10::BFloat16 */
    return (uint16_t)(u >> 16);
}
/* fj_bf2f(fj_f2bf(f)) in 32-bit lanes: a loop that rounds a bf16 value it goes on computing
   with stays one vector loop (through uint16_t, gcc split GELU+bias's loop and ran 1.6x slower). */
static inline float fj_round_bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    u = f != f ? 0x7fc00000u : u;
    float o;
    memcpy(&o, &u, 4);
    return o;
}
/* fp16 <-> fp32, as torch converts (round to nearest even; NaN stays NaN, with its sign).
   _Float16 conversions vectorize only where the CPU converts vectors natively (AVX512-FP16,
   arm64): gcc 12 on an AVX-512 or AVX2 x86 makes each one a scalar vcvtph2ps, and a loop that
   holds one stays scalar (an fp16 softmax ran 15x slower than bf16's). Elsewhere the
   conversions are integer arithmetic, selects and one exact multiply, which vectorize: the
   same results for all 65536 halfs and all 2^32 floats (fp32 -> fp16 of a NaN gives 0x7e00
   with its sign, as c10::Half does). */
#if defined(__FLT16_MAX__) && (defined(__AVX512FP16__) || defined(__aarch64__)) \
    && !defined(FJ_NO_FLOAT16)
static inline float fj_h2f(uint16_t h) {
    _Float16 v;
    memcpy(&v, &h, 2);
    return (float)v;
}
static inline uint16_t fj_f2h(float f) {
    _Float16 v = (_Float16)f;
    uint16_t h;
    memcpy(&h, &v, 2);
    return h;
}
#else
static inline float fj_h2f(uint16_t h) {
    /* the half's exponent and significand as a float's low bits: a float 2^-112 times the
       half's value (subnormal for a subnormal half); one exact multiply by 2^112 rebiases.
       Inf and NaN (exponent 31) then take exponent 255, keeping their significand. The
       multiply is computed for every lane and used by all: gcc does not vectorize a loop
       where a float op is left under a branch (it will not speculate an op that may trap). */
    const uint32_t em = h & 0x7fffu;
    uint32_t u = em << 13;
    float f;
    memcpy(&f, &u, 4);
    f *= 0x1p112f;
    memcpy(&u, &f, 4);
    u |= (em >= 0x7c00u ? 0x7f800000u : 0u) | ((uint32_t)(h & 0x8000u) << 16);
    memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t fj_f2h(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u;
    x &= 0x7fffffffu;
    /* a normal half: rebias, and round the 13 dropped bits to nearest even */
    const uint32_t normal = (x + 0xc8000fffu + ((x >> 13) & 1u)) >> 13;
    /* a half subnormal (|f| < 2^-14): the significand shifted right by 126 - e (at least 14;
       at most 31, which leaves 0), rounded to nearest even; integer arithmetic throughout (a
       float add left under a branch would keep the loop scalar, as above) */
    const uint32_t e = x >> 23, mant = (x & 0x7fffffu) | 0x800000u;
    const uint32_t s = e > 112u ? 14u : (126u - e > 31u ? 31u : 126u - e);
    const uint32_t q = mant >> s, rem = mant & ((1u << s) - 1u), half = 1u << (s - 1u);
    const uint32_t sub = q + ((rem > half) | ((rem == half) & q));
    uint32_t o = x < 0x38800000u ? sub : normal;
    o = x >= 0x477ff000u ? 0x7c00u : o;  /* rounds to inf */
    o = x > 0x7f800000u ? 0x7e00u : o;   /* NaN */
    return (uint16_t)(sign | o);
}
#endif
/* One value's fp16 rounding and conversion, where it is computed once a row (a norm's mean
   and rsqrt): F16C's vcvtps2ph (round to nearest even) and vcvtph2ps, two instructions where
   fj_f2h's integer form takes about twenty, which vectorize only in a loop. The same values,
   but for a NaN's payload bits (fj_f2h1 of a NaN keeps its sign and is a quiet NaN). */
#if defined(__F16C__) && defined(__GNUC__) && !defined(__clang__) \
    && !(defined(__FLT16_MAX__) && defined(__AVX512FP16__))
typedef float fj_v4f __attribute__((vector_size(16)));
typedef short fj_v8h __attribute__((vector_size(16)));
static inline uint16_t fj_f2h1(float f) {
    return (uint16_t)__builtin_ia32_vcvtps2ph((fj_v4f){f, 0.0f, 0.0f, 0.0f}, 0)[0];
}
static inline float fj_round_h1(float f) {
    return __builtin_ia32_vcvtph2ps(__builtin_ia32_vcvtps2ph((fj_v4f){f, 0.0f, 0.0f, 0.0f}, 0))[0];
}
#else
#define fj_f2h1(f) fj_f2h(f)
#define fj_round_h1(f) fj_h2f(fj_f2h(f))
#endif
#if FJ_VEC_TILES
/* fp16 (bf16) -> fp32 over a tile, a vector at a time (fj_h2fv / fj_bf2fv), the tail as
   FJ_HALF_TAIL takes it: FJ_VW halfs at h converted into f, and returned (fj_h2f_vec); a tile's
   (fj_h2f_tile); a tile's, and the sum of its values as fj_sum_tile adds them, in one pass (an
   fp16 mean's first loop: 8% faster than two passes; fj_h2f_sum_tile); a tile's, and the sum of
   its values' squares as fj_sum_tile adds their products, in one pass (an RMSNorm's first loop,
   which stored the squares and added them in a second pass; fj_h2f_sum_tile_squares). A bf16 tile's full
   vector stores let its readers' vector loads forward from them: gcc's loop stored bf16 rows
   of 16 in two halves, and a softmax over them ran 2x slower in tiles than in plain loops. */
static inline fj_vf fj_bf2fv(fj_vh w) {
    return (fj_vf)(FJ_WIDEN16(w) << 16);
}
/* The last 0 < m < FJ_VW halfs at h converted into f, and as a vector (zeros past m): masked
   vector loads and stores where AVX-512 has them for 16-bit lanes (scalar stores, which a
   vector load of f then waits for, made an fp16 softmax over rows of 24 1.2x slower), else
   one at a time */
#ifdef FJ_TAIL_LOAD16
#define FJ_HALF_TAIL(h2f, convert, h, f, m)                                                   \
    __extension__({                                                                         \
        const fj_vf fj_y = convert(FJ_TAIL_LOAD16((h), (m)));                               \
        FJ_TAIL_STORE((f), fj_y, (m));                                                      \
        fj_y;                                                                               \
    })
#else
#define FJ_HALF_TAIL(h2f, convert, h, f, m)                                                   \
    __extension__({                                                                         \
        for (int64_t fj_j = 0; fj_j < (m); fj_j++) (f)[fj_j] = h2f((h)[fj_j]);              \
        FJ_TAIL_LOAD((f), (m));                                                             \
    })
#endif
/* A tile's values converted into f and summed as fj_sum_tile adds them: term(v) of each vector
   v (the values, or their squares), four accumulators, the tail into the second */
#define FJ_TERM_VALUE(v) (v)
#define FJ_TERM_SQUARE(v) ((v) * (v))
#define FJ_HALF_SUM(h2f, vec, name, convert, term)                                           \
    static inline float name(const uint16_t *restrict h, float *restrict f, int64_t n) {   \
        fj_vf a0 = FJ_V(0.0f), a1 = a0, a2 = a0, a3 = a0, v;                                \
        int64_t i = 0;                                                                      \
        for (; i + 4 * FJ_VW <= n; i += 4 * FJ_VW) {                                        \
            v = vec(h + i, f + i);                                                          \
            a0 += term(v);                                                                  \
            v = vec(h + i + FJ_VW, f + i + FJ_VW);                                          \
            a1 += term(v);                                                                  \
            v = vec(h + i + 2 * FJ_VW, f + i + 2 * FJ_VW);                                  \
            a2 += term(v);                                                                  \
            v = vec(h + i + 3 * FJ_VW, f + i + 3 * FJ_VW);                                  \
            a3 += term(v);                                                                  \
        }                                                                                   \
        for (; i + FJ_VW <= n; i += FJ_VW) {                                                \
            v = vec(h + i, f + i);                                                          \
            a0 += term(v);                                                                  \
        }                                                                                   \
        const int64_t m = n - i; /* < FJ_VW */                                              \
        if (m > 0 && m < FJ_VW) {                                                           \
            v = FJ_HALF_TAIL(h2f, convert, h + i, f + i, m);                                \
            a1 += term(v);                                                                  \
        }                                                                                   \
        return fj_lanes_sum(a0, a1, a2, a3);                                                \
    }
#define FJ_HALF_TILES(h2f, vec, tile, sum_tile, convert)                                      \
    static inline fj_vf vec(const uint16_t *restrict h, float *restrict f) {               \
        fj_vh w;                                                                            \
        memcpy(&w, h, sizeof w);                                                            \
        const fj_vf y = convert(w);                                                         \
        memcpy(f, &y, sizeof y);                                                            \
        return y;                                                                           \
    }                                                                                       \
    static inline void tile(const uint16_t *restrict h, float *restrict f, int64_t n) {    \
        int64_t i = 0;                                                                      \
        for (; i + FJ_VW <= n; i += FJ_VW)                                                  \
            vec(h + i, f + i);                                                              \
        if (i < n) (void)FJ_HALF_TAIL(h2f, convert, h + i, f + i, n - i);                    \
    }                                                                                       \
    FJ_HALF_SUM(h2f, vec, sum_tile, convert, FJ_TERM_VALUE)                                 \
    FJ_HALF_SUM(h2f, vec, sum_tile##_squares, convert, FJ_TERM_SQUARE)
FJ_HALF_TILES(fj_h2f, fj_h2f_vec, fj_h2f_tile, fj_h2f_sum_tile, fj_h2fv)
FJ_HALF_TILES(fj_bf2f, fj_bf2f_vec, fj_bf2f_tile, fj_bf2f_sum_tile, fj_bf2fv)
/* A vector loop's loads and stores (see the renderer's vector_body): FJ_VW floats, halfs
   (converted in the register: vcvtph2ps, vcvtps2ph) or bf16s at p; fj_round_bfv: fj_round_bf
   lane by lane; fj_vst_nt / fj_vsth_nt: a non-temporal store where p is aligned to the vector
   (see fj_stream_tile), else a plain one */
static inline fj_vf fj_vld(const float *p) {
    fj_vf v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline void fj_vst(float *p, fj_vf v) {
    memcpy(p, &v, sizeof v);
}
static inline fj_vf fj_vldh(const uint16_t *p) {
    fj_vh w;
    memcpy(&w, p, sizeof w);
    return fj_h2fv(w);
}
static inline void fj_vsth(uint16_t *p, fj_vf v) {
    const fj_vh w = fj_f2hv(v);
    memcpy(p, &w, sizeof w);
}
static inline fj_vf fj_vldbf(const uint16_t *p) {
    fj_vh w;
    memcpy(&w, p, sizeof w);
    return fj_bf2fv(w);
}
static inline fj_vf fj_round_bfv(fj_vf v) {
    typedef uint32_t fj_vu __attribute__((vector_size(sizeof(fj_vf))));
    fj_vu u = (fj_vu)v;
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    const fj_vi nan = v != v;
    return (fj_vf)(((fj_vi)u & ~nan) | (nan & 0x7fc00000));
}
/* v rounded to bf16, as FJ_VW 16-bit lanes */
static inline fj_vh fj_f2bfv(fj_vf v) {
    typedef uint32_t fj_vu __attribute__((vector_size(sizeof(fj_vf))));
    return FJ_NARROW16((fj_vi)((fj_vu)fj_round_bfv(v) >> 16));
}
static inline void fj_vstbf(uint16_t *p, fj_vf v) {
    const fj_vh w = fj_f2bfv(v);
    memcpy(p, &w, sizeof w);
}
#ifdef FJ_BF16_PAIRS
/* fj_vstbf(p, a) and fj_vstbf(p + FJ_VW, b) in one vcvtne2ps2bf16, where gcc's loops narrow
   two vectors with vpermt2w and fj_vstbf one with vpmovdw (a bf16 RMSNorm's loop that stores
   ran 1.13x faster than gcc's, 1.36x than fj_vstbf's, alone). The instruction takes a
   subnormal input as zero (then each vector takes fj_vstbf) and keeps a NaN's sign and payload
   (its lanes then take 0x7fc0, as c10::BFloat16's conversion gives): the same bits. */
typedef short fj_vh2 __attribute__((vector_size(64)));
static inline void fj_vstbf2(uint16_t *p, fj_vf a, fj_vf b) {
    if (__builtin_expect((FJ_SUBNORMALS(a) | FJ_SUBNORMALS(b)) != 0, 0)) {
        fj_vstbf(p, a);
        fj_vstbf(p + FJ_VW, b);
        return;
    }
    fj_vh2 w = (fj_vh2)FJ_CVTNE2(b, a);
    const fj_vh2 nan = (w & 0x7fff) > 0x7f80;
    w = (w & ~nan) | (nan & 0x7fc0);
    memcpy(p, &w, sizeof w);
}
#endif
/* ... and the first m < FJ_VW of them, the other lanes zeros: masked loads and stores, where
   the ISA has them for 16-bit lanes (AVX-512 BW and VL; vector_body's rest of a row) */
#ifdef FJ_TAIL_LOAD16
#define FJ_VREST 1
static inline fj_vf fj_vldm(const float *p, int m) {
    return FJ_TAIL_LOAD(p, m);
}
static inline void fj_vstm(float *p, fj_vf v, int m) {
    FJ_TAIL_STORE(p, v, m);
}
static inline fj_vf fj_vldhm(const uint16_t *p, int m) {
    return fj_h2fv(FJ_TAIL_LOAD16(p, m));
}
static inline void fj_vsthm(uint16_t *p, fj_vf v, int m) {
    FJ_TAIL_STORE16(p, fj_f2hv(v), m);
}
static inline fj_vf fj_vldbfm(const uint16_t *p, int m) {
    return fj_bf2fv(FJ_TAIL_LOAD16(p, m));
}
static inline void fj_vstbfm(uint16_t *p, fj_vf v, int m) {
    FJ_TAIL_STORE16(p, fj_f2bfv(v), m);
}
#endif
static inline void fj_vst_nt(float *p, fj_vf v) {
    if (((uintptr_t)p & (sizeof(fj_vf) - 1)) == 0)
        FJ_STREAM(p, v);
    else
        fj_vst(p, v);
}
static inline void fj_vsth_nt(uint16_t *p, fj_vf v) {
    const fj_vh w = fj_f2hv(v);
    if (((uintptr_t)p & (sizeof(fj_vh) - 1)) == 0)
        FJ_STREAM16(p, w);
    else
        memcpy(p, &w, sizeof w);
}
/* relu, maximum, minimum (NaN wins) and abs, as the scalar loop computes them */
static inline fj_vf fj_vsel(fj_vi m, fj_vf a, fj_vf b) {
    return (fj_vf)(((fj_vi)a & m) | ((fj_vi)b & ~m));
}
#define fj_vrelu(x) ((fj_vf)((fj_vi)(x) & ~((x) < FJ_V(0.0f))))
#define fj_vmaximum(x, y) fj_vsel(((x) > (y)) | ((x) != (x)), (x), (y))
#define fj_vminimum(x, y) fj_vsel(((x) < (y)) | ((x) != (x)), (x), (y))
#define fj_vabs(x) ((fj_vf)((fj_vi)(x) & 0x7fffffff))
/* fj_geluf over a vector (vector_body's GELU): the same operations lane by lane, fmaf as
   FJ_VFMA, the selects as its branches: the same bits */
static inline fj_vf fj_geluv(fj_vf x) {
    const fj_vf z = x * FJ_V(0.70710678118654752f);
    const fj_vf s = z * z;
    fj_vf p = FJ_V(2.045950396e-06f);
    p = FJ_VFMA(p, s, FJ_V(2.848359582e-04f));
    p = FJ_VFMA(p, s, FJ_V(3.772479249e-03f));
    p = FJ_VFMA(p, s, FJ_V(5.276904255e-02f));
    p = FJ_VFMA(p, s, FJ_V(1.905929297e-01f));
    p = FJ_VFMA(p, s, FJ_V(1.128379107e+00f));
    fj_vf q = FJ_V(3.804659355e-05f);
    q = FJ_VFMA(q, s, FJ_V(1.163829933e-03f));
    q = FJ_VFMA(q, s, FJ_V(1.498305425e-02f));
    q = FJ_VFMA(q, s, FJ_V(1.141822487e-01f));
    q = FJ_VFMA(q, s, FJ_V(5.022413135e-01f));
    q = FJ_VFMA(q, s, FJ_V(1.0f));
    const fj_vf one = (fj_vf)(((fj_vi)z & (int32_t)0x80000000) | (fj_vi)FJ_V(1.0f));
    const fj_vf e = fj_vsel(fj_vabs(z) >= FJ_V(3.925f), one, z * p / q);
    fj_vf t = FJ_V(1.0f) + e;
    t = fj_vsel(t < FJ_V(0.0f), FJ_V(0.0f), t);
    return x * FJ_V(0.5f) * t;
}
static inline void fj_f2h_tile(const float *restrict f, uint16_t *restrict h, int64_t n) {
    int64_t i = 0;
    for (; i + FJ_VW <= n; i += FJ_VW) {
        fj_vf v;
        memcpy(&v, f + i, sizeof v);
        const fj_vh y = fj_f2hv(v);
        memcpy(h + i, &y, sizeof y);
    }
#ifdef FJ_TAIL_LOAD16
    if (i < n)
        FJ_TAIL_STORE16(h + i, fj_f2hv(FJ_TAIL_LOAD(f + i, n - i)), n - i);
#else
    for (; i < n; i++)
        h[i] = fj_f2h(f[i]);
#endif
}
/* fj_f2h_tile and a plain copy of floats, in non-temporal stores (vmovntps, vmovntdq) where
   the destination is aligned to a vector: a kernel whose outputs are far bigger than the caches
   writes them without reading each line first (see the renderer's STREAM_BYTES; an fp32 RMSNorm
   of 16 MB 1.3x faster). The function that streams ends with fj_sfence; the other threads'
   stores are ordered by the locked instructions of OpenMP's closing barrier, which drain
   write-combining buffers (Intel SDM 11.3.1). */
static inline void fj_stream_tile(const float *restrict f, float *restrict d, int64_t n) {
    int64_t i = 0;
    for (; i < n && ((uintptr_t)(d + i) & (sizeof(fj_vf) - 1)); i++)
        d[i] = f[i];
    for (; i + FJ_VW <= n; i += FJ_VW) {
        fj_vf v;
        memcpy(&v, f + i, sizeof v);
        FJ_STREAM(d + i, v);
    }
    for (; i < n; i++)
        d[i] = f[i];
}
static inline void fj_f2h_stream_tile(const float *restrict f, uint16_t *restrict h, int64_t n) {
    int64_t i = 0;
    for (; i < n && ((uintptr_t)(h + i) & (sizeof(fj_vh) - 1)); i++)
        h[i] = fj_f2h(f[i]);
    for (; i + FJ_VW <= n; i += FJ_VW) {
        fj_vf v;
        memcpy(&v, f + i, sizeof v);
        FJ_STREAM16(h + i, fj_f2hv(v));
    }
    for (; i < n; i++)
        h[i] = fj_f2h(f[i]);
}
#define fj_sfence() __builtin_ia32_sfence()
#endif

/* Random numbers: Philox 4x32-10 keyed by the per-call seed. Box point i is word i & 3 of the
   block for counter i >> 2 (one block gives four points), as a float in [0, 1) from its top 24
   bits. A loop that draws fills a local buffer for a tile of its points (fj_rand_fill), and
   its vector loop reads the buffer. With gcc on AVX2 or AVX-512 the fill takes FJ_RAND_LANES
   counters per vector, one per 64-bit lane (vpmuludq multiplies the low halves 32x32 -> 64),
   FJ_RAND_GROUPS vectors at once so that a round's multiplies do not wait on the last round's:
   8 lanes and 4 groups on AVX-512, 4 and 2 on AVX2 (whose 16 registers hold two; four groups
   spilled, dropout+add 0.9x as fast). It is gcc's vector extensions and one builtin, not
   <immintrin.h>, whose parsing took 0.7 of the 1.05 s a dropout's unit took to compile. Every
   path computes the same bits as the scalar one (-DFJ_RAND_LANES=8 runs the AVX-512 form on
   any machine, the multiply as plain vector code). */
#define FJ_PHILOX_M0 0xD2511F53u
#define FJ_PHILOX_M1 0xCD9E8D57u
#define FJ_PHILOX_W0 0x9E3779B9u
#define FJ_PHILOX_W1 0xBB67AE85u
/* The four points of counter c, into u[0..3]. */
static inline void fj_philox(uint64_t c, uint32_t k0, uint32_t k1, float *u) {
    uint32_t c0 = (uint32_t)c, c1 = (uint32_t)(c >> 32), c2 = 0, c3 = 0;
    for (int i = 0; i < 10; i++) {
        const uint64_t p0 = (uint64_t)FJ_PHILOX_M0 * c0, p1 = (uint64_t)FJ_PHILOX_M1 * c2;
        const uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1;
        c3 = (uint32_t)p0;
        c0 = n0;
        c2 = n2;
        k0 += FJ_PHILOX_W0;
        k1 += FJ_PHILOX_W1;
    }
    u[0] = (float)(c0 >> 8) * 0x1p-24f;
    u[1] = (float)(c1 >> 8) * 0x1p-24f;
    u[2] = (float)(c2 >> 8) * 0x1p-24f;
    u[3] = (float)(c3 >> 8) * 0x1p-24f;
}
#if defined(__GNUC__) && !defined(__clang__) && (defined(__AVX2__) || defined(__AVX512F__))
#ifndef FJ_RAND_LANES
#ifdef __AVX512F__
#define FJ_RAND_LANES 8
#else
#define FJ_RAND_LANES 4
#endif
#endif
#define FJ_RAND_GROUPS (FJ_RAND_LANES == 8 ? 4 : 2)
typedef uint64_t fj_rq __attribute__((vector_size(8 * FJ_RAND_LANES)));
typedef long long fj_rll __attribute__((vector_size(8 * FJ_RAND_LANES)));
typedef uint32_t fj_ru __attribute__((vector_size(8 * FJ_RAND_LANES)));
typedef int32_t fj_rd __attribute__((vector_size(8 * FJ_RAND_LANES)));
typedef float fj_rf __attribute__((vector_size(8 * FJ_RAND_LANES)));
/* The low halves of a and b multiplied into 64 bits (vpmuludq; gcc makes the plain form
   AVX-512's 64-bit multiply, vpmullq, three times the cost) */
#if FJ_RAND_LANES == 8 && defined(__AVX512F__)
#define FJ_MULU32(a, b) \
    ((fj_rq)__builtin_ia32_pmuludq512_mask((fj_rd)(a), (fj_rd)(b), (fj_rll){0}, (unsigned char)-1))
#elif FJ_RAND_LANES == 4
#define FJ_MULU32(a, b) ((fj_rq)__builtin_ia32_pmuludq256((fj_rd)(a), (fj_rd)(b)))
#else
#define FJ_MULU32(a, b) (((a) & 0xFFFFFFFFu) * ((b) & 0xFFFFFFFFu))
#endif
#if FJ_RAND_LANES == 8
#define FJ_RAND_LANE_IDS ((fj_rq){0, 1, 2, 3, 4, 5, 6, 7})
#define FJ_RAND_FIRST ((fj_rq){0, 8, 1, 9, 2, 10, 3, 11})
#define FJ_RAND_SECOND ((fj_rq){4, 12, 5, 13, 6, 14, 7, 15})
#else
#define FJ_RAND_LANE_IDS ((fj_rq){0, 1, 2, 3})
#define FJ_RAND_FIRST ((fj_rq){0, 4, 1, 5})
#define FJ_RAND_SECOND ((fj_rq){2, 6, 3, 7})
#endif
/* Words (w0 | w1 << 32, w2 | w3 << 32) of each counter's block, as two points per 64-bit lane
   in point order, to floats in [0, 1) */
static inline void fj_rand_store(const fj_rq *w01, const fj_rq *w23, float *u) {
    const fj_rq first = __builtin_shuffle(*w01, *w23, FJ_RAND_FIRST);
    const fj_rq second = __builtin_shuffle(*w01, *w23, FJ_RAND_SECOND);
    const fj_rf a = __builtin_convertvector((fj_rd)((fj_ru)first >> 8), fj_rf) * 0x1p-24f;
    const fj_rf b = __builtin_convertvector((fj_rd)((fj_ru)second >> 8), fj_rf) * 0x1p-24f;
    memcpy(u, &a, sizeof a);
    memcpy(u + 2 * FJ_RAND_LANES, &b, sizeof b);
}
#endif
/* The points of [lo, hi) under `seed` into u, from point lo & ~3 (u[p - (lo & ~3)] is point p;
   u holds hi - lo + 6 floats or more). */
static inline void fj_rand_fill(int64_t seed, int64_t lo, int64_t hi, float *restrict u) {
    const uint64_t first = (uint64_t)lo >> 2;
    const int64_t n = (int64_t)((((uint64_t)hi + 3) >> 2) - first);
    const uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)((uint64_t)seed >> 32);
    int64_t j = 0;
#ifdef FJ_RAND_LANES
    const fj_rq m0 = (fj_rq){0} + FJ_PHILOX_M0, m1 = (fj_rq){0} + FJ_PHILOX_M1;
    for (; j + FJ_RAND_LANES * FJ_RAND_GROUPS <= n; j += FJ_RAND_LANES * FJ_RAND_GROUPS) {
        /* each word in the low half of its 64-bit lane; the high halves are never read */
        fj_rq c0[FJ_RAND_GROUPS], c1[FJ_RAND_GROUPS], c2[FJ_RAND_GROUPS], c3[FJ_RAND_GROUPS];
        for (int g = 0; g < FJ_RAND_GROUPS; g++) {
            c0[g] = FJ_RAND_LANE_IDS + (first + (uint64_t)(j + FJ_RAND_LANES * g));
            c1[g] = c0[g] >> 32;
            c2[g] = c3[g] = (fj_rq){0};
        }
        uint32_t key0 = k0, key1 = k1;
#pragma GCC unroll 10
        for (int i = 0; i < 10; i++) {
            for (int g = 0; g < FJ_RAND_GROUPS; g++) {
                const fj_rq p0 = FJ_MULU32(c0[g], m0), p1 = FJ_MULU32(c2[g], m1);
                c0[g] = (p1 >> 32) ^ c1[g] ^ key0;
                c2[g] = (p0 >> 32) ^ c3[g] ^ key1;
                c1[g] = p1;
                c3[g] = p0;
            }
            key0 += FJ_PHILOX_W0;
            key1 += FJ_PHILOX_W1;
        }
        for (int g = 0; g < FJ_RAND_GROUPS; g++) {
            const fj_rq w01 = (c0[g] & 0xFFFFFFFFu) | (c1[g] << 32);
            const fj_rq w23 = (c2[g] & 0xFFFFFFFFu) | (c3[g] << 32);
            fj_rand_store(&w01, &w23, u + 4 * (j + FJ_RAND_LANES * g));
        }
    }
#endif
    for (; j < n; j++)
        fj_philox(first + (uint64_t)j, k0, k1, u + 4 * j);
}

/* float -> integer as x86's cvttss2si/cvttsd2si give it: NaN and values out of range take the
   "integer indefinite", the width's minimum (see _c_cast). Plus fj_zero, a zero the compiler
   cannot see: with -fno-trapping-math gcc folds (float)(int)x into truncf(x), which keeps the
   sign of a zero (int(-0.5) back to float gave -0.0, and 5 / it -inf where eager gives +inf) */
__attribute__((visibility("hidden"))) int32_t fj_zero = 0;
static inline int64_t fj_f2i64(float x) {
    return x >= -0x1p63f && x < 0x1p63f ? (int64_t)x + fj_zero : INT64_MIN;
}
static inline int64_t fj_d2i64(double x) {
    return x >= -0x1p63 && x < 0x1p63 ? (int64_t)x + fj_zero : INT64_MIN;
}
static inline int32_t fj_f2i32(float x) {
    return x >= -0x1p31f && x < 0x1p31f ? (int32_t)x + fj_zero : INT32_MIN;
}
static inline int32_t fj_d2i32(double x) {
    return x > -0x1p31 - 1.0 && x < 0x1p31 ? (int32_t)x + fj_zero : INT32_MIN;
}

#define FJ_MIN(a, b) ((a) < (b) ? (a) : (b))
#ifdef _OPENMP
#define FJ_TID() ((int64_t)omp_get_thread_num())
#define FJ_NTH() ((int64_t)omp_get_num_threads())
#else
#define FJ_TID() ((int64_t)0)
#define FJ_NTH() ((int64_t)1)
#endif
"""


def c_type(dtype: torch.dtype) -> str:
    try:
        return _C_TYPES[dtype]
    except KeyError:
        raise NotImplementedError(f"no C type for {dtype}") from None


def local_type(dtype: torch.dtype) -> str:
    """The C type of a kernel's local values (and row buffers) of ``dtype``: ``int`` for bool,
    since gcc 12 vectorizes no loop that holds a ``_Bool`` local (a dropout's mask kept the
    whole loop scalar); its values stay 0 and 1."""
    return "int" if dtype == torch.bool else c_type(dtype)


def _literal(value, dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return "1" if value else "0"
    if dtype.is_floating_point:
        value = float(value)
        if math.isnan(value):
            text = "NAN"
        elif math.isinf(value):
            text = "INFINITY" if value > 0 else "(-INFINITY)"
        else:
            text = repr(value)
        return f"(({c_type(dtype)}){text})"
    value = int(value)
    if value == -(2**63):
        return "(-9223372036854775807LL - 1)"
    return f"(({c_type(dtype)}){value}LL)"


def _float_fn(name: str, dtype: torch.dtype) -> str:
    if name == "exp" and dtype == torch.float32:
        return "fj_expf"
    return name + ("f" if dtype == torch.float32 else "")


#: The name a kernel's function is rendered with before its real name is known.
_UNNAMED = "fj_unnamed_kernel"


def named_function(kernel: Kernel) -> tuple[str, str]:
    """(C name, C function) of ``kernel``, rendered once. The name is the kernel's stem plus a
    hash of its body, so that two different kernels of the same name can share a shared object,
    and the same kernel at two places of a graph (or in two graphs) is one function.

    Kept in memory and in the disk cache (``c/render``) by the description's ``repr`` (all of
    its fields), the renderer's settings (this module's numbers and switches) and the source of
    the renderer: a first call with warm caches rendered every kernel again to find its shared
    object (GPT-2's nine: 5 ms of about 120)."""
    key = hashlib.sha256("\0".join((_renderer_source_hash(), _settings(),
                                     repr(kernel))).encode()).hexdigest()[:40]
    found = _rendered.get(key)
    if found is None:
        found = _read_rendered(key, kernel)
        if found is None:
            body = _Renderer(kernel, _UNNAMED).function()
            name = f"{kernel.function_stem}_{hashlib.sha256(body.encode()).hexdigest()[:12]}"
            found = (name, body.replace(_UNNAMED, name))
            _write_rendered(key, found)
        _rendered[key] = found
    return found


_rendered: dict[str, tuple[str, str]] = {}
_source_hash: list[str] = []


def _renderer_source_hash() -> str:
    """A hash of this module's and the description's source (what renders a function)."""
    if not _source_hash:
        from . import ir
        h = hashlib.sha256()
        for path in (__file__, ir.__file__):
            with open(path, "rb") as f:
                h.update(f.read())
        _source_hash.append(h.hexdigest())
    return _source_hash[0]


def _settings() -> str:
    """This module's numbers and switches as they are now (tests change some)."""
    return repr([(k, v) for k, v in sorted(globals().items())
                 if k.isupper() and type(v) in (int, float, bool, tuple)])


def _read_rendered(key: str, kernel: Kernel) -> tuple[str, str] | None:
    path = os.path.join(diskcache.folder(os.path.join("c", "render")), key)
    try:
        with open(path, encoding="utf-8") as f:
            name, _, function = f.read().partition("\n")
    except OSError:
        return None
    if not name.startswith(kernel.function_stem + "_") or f" {name}(" not in function:
        return None  # (not a record this function wrote)
    diskcache.note_use(path)
    return name, function


def _write_rendered(key: str, found: tuple[str, str]) -> None:
    path = os.path.join(diskcache.folder(os.path.join("c", "render")), key)
    diskcache.write_atomic(path, f"{found[0]}\n{found[1]}".encode(),
                           diskcache.folder("c"))  # (the C cache's budget)


def forget_rendered() -> None:
    """Forget the rendered functions kept in memory (the disk keeps them)."""
    _rendered.clear()


def function_name(kernel: Kernel) -> str:
    """The C name of ``kernel``'s function (see :func:`named_function`)."""
    return named_function(kernel)[0]


def render_function(kernel: Kernel, name: str | None = None) -> str:
    """The C function of ``kernel`` (without the prelude), named ``name`` or
    :func:`function_name`."""
    if name is None:
        return named_function(kernel)[1]
    return _Renderer(kernel, name).function()


def render_c(kernel: Kernel) -> str:
    """A complete translation unit: the prelude and the kernel's function."""
    function = render_function(kernel)
    return PRELUDE + "\n" + function


class _Renderer:
    def __init__(self, kernel: Kernel, name: str) -> None:
        self.k = kernel
        self.name = name
        sizes: list[Expr] = list(kernel.sizes)
        if kernel.is_reduction:
            self.xdims = list(kernel.outer_dims)
            self.rdims = list(kernel.reduce_dims)
        else:
            self.xdims = list(range(len(sizes) - 1))
            self.rdims = [len(sizes) - 1] if sizes else []
        self.sizes = sizes
        self.dynamic = kernel.is_dynamic
        # Ints for a static kernel; a Sym (its C text) where a size is known only at run time.
        self.xnumel = product([sizes[d] for d in self.xdims])
        self.rnumel = product([sizes[d] for d in self.rdims])
        self.numel = product([self.xnumel, self.rnumel])
        self.parallel = not self.dynamic and self.numel >= PARALLEL_MIN
        self.lines: list[str] = []
        self.index = {b.name: i for i, b in enumerate(kernel.buffers)}
        self.invariant = self._row_invariant()
        self.hoisted: set[int] = set()  # invariant ops already defined in the current row
        self.block = self.block_dim()
        # Row buffers (see ROW_BUFFER): ops whose values the current loop reads from their
        # buffer (``avail``) and those it stores to theirs (``fill``).
        self.avail: set[int] = set()
        self.fill: list[int] = []
        # The piece [start, stop) of the row that the current loop covers (row_pieces).
        self.piece: tuple[int, int] | None = None
        # A run-time row length: the length the row buffers are declared for, in the copy of
        # the loop nest that runs rows up to that long (see dynamic_rows); None otherwise.
        self.row_cap: int | None = None
        self.buffers_declared = False
        # Row-buffered ops kept in an output's own row instead (op -> output name): a static row
        # too long for the stack, as eager's and Inductor's softmax keep exp in their output.
        self.scratch: dict[int, str] = {}
        # fp16 roundings and stores one value at a time, with F16C's scalar forms: a row's OUTER
        # values (emit_per_row) and the values past vector_body's last vector
        self.per_row = False
        self.step_ops: list[int] | None = None  # the ops of interleaved_rows' per-row step
        # fp16/bf16 loads read from their fp32 copy h<i>, made once per call (shared_half_loads).
        self.shared: list[int] = self.shared_half_loads()
        # Whether the kernel's fp32 and fp16 stores stream (see STREAM_BYTES).
        self.stream = self.streams()
        # A softmax's row max taken a row ahead (see row_ahead): (max op, its load, exp op,
        # the load's step from one row to the next), or None.
        self.ahead: tuple[int, int, int, str] | None = None
        # Whether the rows being rendered are taken several at a time (interleaved_rows), and
        # eight at a time (vector_body may then defer its sums' folds: see there).
        self.interleaved = False
        self.defer_sums = False

    def row_ahead(self) -> tuple[int, int, int, str] | None:
        """Where a kernel first takes the max of a row it reads from memory (fp32, contiguous)
        and its next loop takes ``exp(x - max)`` of it in vector tiles (a softmax, a log
        softmax): that exp tile (``fj_exp_sub_tile``) also takes the max of the next row, which
        the next row then does not read again. Its loads then overlap the exps (the exp loop
        issues none for hundreds of cycles, and its operands need no pass of their own): an
        fp32 softmax over 1024-float rows ran 1.15x faster on one thread (either change alone
        gained nothing). The tile also adds the exps when the loop sums them. Rows of at most
        one tile (:data:`VEC_TILE`) and one sum chunk, whose first loop keeps nothing in a row
        buffer; the same bits (a max is exact, the sum adds as fj_sum_tile). Returns (max op,
        load op, exp op, the load's step between rows)."""
        k = self.k
        if (self.dynamic or self.block is not None or not k.is_reduction
                or not isinstance(self.xnumel, int) or self.xnumel < 2
                or not isinstance(self.rnumel, int)
                or not 0 < self.rnumel <= min(VEC_TILE, SUM_CHUNK)):
            return None  # (a row of one tile, one chunk: the next row's max is whole)
        groups = self.reduce_groups()
        if len(groups) < 2 or len(groups[0]) != 1:
            return None
        (top,) = groups[0]
        kind, src = k.ops[top].args
        load = k.ops[src]
        if kind != "max" or load.kind != "load" or load.level != FULL or spans_of(load):
            return None
        name = load.args[0]
        buffer = k.buffer(name)
        if buffer.dtype != torch.float32 or self.offset(name, FULL) != f"xo_{name} + r":
            return None
        part = self._part(self.xdims, "x", "x", buffer.strides)
        if part == "x":
            step = "1"
        elif part.startswith("x * ") and part[4:].isdigit():
            step = part[4:]
        else:
            return None
        body = self.closure([k.ops[i].args[1] for i in groups[1]])
        exps = [i for i in body if k.ops[i].kind == "exp" and k.ops[i].dtype == torch.float32
                and k.ops[k.ops[i].args[0]].kind == "sub"
                and tuple(k.ops[k.ops[i].args[0]].args) == (src, top)
                and k.ops[k.ops[i].args[0]].dtype == torch.float32]
        if not exps or exps[0] not in self.vector_tiled(body)[0]:
            return None
        stores = [j for j, op in enumerate(k.ops) if op.kind == "store" and op.level == FULL]
        loops = [[k.ops[i].args[1] for i in group] for group in groups] + ([stores] if stores else [])
        if self.plan_row_buffers(loops)[0][1]:
            return None  # the first loop fills a row buffer: it must run
        return top, src, exps[0], step

    def streams(self) -> bool:
        """Whether the kernel's outputs take :data:`STREAM_BYTES` or more and their rows start
        a multiple of :data:`STREAM_LINE` bytes apart: static sizes, rows (not blocks)."""
        if self.dynamic or self.block is not None:
            return False
        total = 0
        for b in self.k.outputs:
            count = product([s for s, st in zip(self.sizes, b.strides) if st != 0])
            total += count * b.dtype.itemsize
            row_output = any(b.strides[d] != 0 for d in self.rdims)
            if row_output and any(self.sizes[d] != 1 and b.strides[d] * b.dtype.itemsize % STREAM_LINE
                                  for d in self.xdims):
                return False
        return total >= STREAM_BYTES

    def shared_half_loads(self) -> list[int]:
        """The fp16 and bf16 loads that every row reads alike (no stride along the rows: a
        layer norm's weight and bias) in a static kernel of several rows, each at most
        :data:`SHARED_ROW` long: converted once per call into an fp32 array ``h<i>`` that every
        row (and thread) reads, instead of once per row (two of an fp16 layer norm's three
        conversions a row, each a vector tile's pass; a bf16 layer norm ran 1.09x faster)."""
        k = self.k
        if (self.dynamic or self.block is not None or not isinstance(self.rnumel, int)
                or not isinstance(self.xnumel, int) or self.xnumel < 2
                or not 0 < self.rnumel <= SHARED_ROW):
            return []
        found = []
        for i, op in enumerate(k.ops):
            if (op.kind != "load" or op.level != FULL or i in self.invariant or spans_of(op)
                    or k.buffer(op.args[0]).dtype not in (torch.float16, torch.bfloat16)):
                continue
            strides = k.buffer(op.args[0]).strides
            if all(strides[d] == 0 for d in self.xdims):
                found.append(i)
        return found[:SHARED_BYTES // (4 * self.rnumel)]

    def shared_rows(self, indent: str) -> None:
        """Declares and fills the arrays of :meth:`shared_half_loads` (before the row loop)."""
        k = self.k
        for i in self.shared:
            self.lines.append(f"{indent}float h{i}[{self.rnumel}] __attribute__((aligned(64)));")
        inner = indent + "    "
        self.lines.append(f"{indent}{{")
        for name in sorted({k.ops[i].args[0] for i in self.shared}):
            self.lines.append(f"{inner}const int64_t xo_{name} = 0;")
        self.lines.append(f"{inner}#pragma omp simd")
        self.lines.append(f"{inner}for (int64_t r = 0; r < {self.rnumel}; r++) {{")
        self.define_dims(self.rdims, "r", "r", inner + "    ")
        for i in self.shared:
            self.lines.append(f"{inner}    h{i}[r] = {self.expr(k.ops[i])};")
        self.lines.append(f"{inner}}}")
        self.lines.append(f"{indent}}}")

    def _row_invariant(self) -> set[int]:
        """FULL ops whose value is the same at every ``r`` of a row: loads that broadcast over
        the row (a per-channel scale, say), constants, and what only they feed. Computed once
        per row before the row's loops, since gcc keeps a call such as sqrtf (errno) inside a
        loop, which then stays scalar."""
        inv: set[int] = set()
        for i, op in enumerate(self.k.ops):
            if op.level != FULL or op.kind in ("reduce", "store", "rand"):
                continue
            if op.kind == "concat" and op.args[0].dim in self.rdims:
                continue  # it picks by the index along the row
            if op.kind == "load":
                strides = self.k.buffer(op.args[0]).strides
                if all(strides[d] == 0 for d in self.rdims):
                    inv.add(i)
            elif op.kind == "const" or all(a in inv for a in op.args if is_operand(a)):
                inv.add(i)
        return inv

    def hoist(self, body: list[int], indent: str) -> list[int]:
        """Define ``body``'s row-invariant ops here (once per row); returns the rest."""
        for i in body:
            if i in self.invariant and i not in self.hoisted:
                self.emit([i], indent)
                self.hoisted.add(i)
        return [i for i in body if i not in self.invariant]

    # -- addressing -------------------------------------------------------------------------
    def _part(self, dims: list[int], flat: str, prefix: str, strides) -> str:
        """Offset contribution of ``dims`` (decomposed from ``flat``) for ``strides``."""
        st = [strides[d] for d in dims]
        if all(s == 0 for s in st):
            return ""
        sizes = [self.sizes[d] for d in dims]
        inner = st[-1]
        # Dense over ``dims``: one flat index. Run-time strides compare as the products of
        # run-time sizes that ir.product spells in one canonical way.
        if inner != 0 and all(st[i] == product([inner, *sizes[i + 1:]]) for i in range(len(dims))):
            return flat if inner == 1 else f"{flat} * {inner}"
        return " + ".join(f"{prefix}{d}" if s == 1 else f"{prefix}{d} * {s}"
                          for d, s in zip(dims, st) if s != 0)

    def _needs_dim_vars(self, dims: list[int]) -> bool:
        if self.k.span_dims & set(dims):
            return True
        return any(self._part(dims, "F", "v", b.strides) not in ("", "F")
                   and not self._part(dims, "F", "v", b.strides).startswith("F * ")
                   for b in self.k.buffers)

    def define_dims(self, dims: list[int], flat: str, prefix: str, indent: str) -> None:
        if len(dims) < 2 or not self._needs_dim_vars(dims):
            return
        sizes = [self.sizes[d] for d in dims]
        for i, d in enumerate(dims):
            below = product(sizes[i + 1:])
            expr = flat if below == 1 else f"({flat} / {below})"
            if i > 0:
                expr = f"{expr} % {sizes[i]}"
            self.lines.append(f"{indent}const int64_t {prefix}{d} = {expr};")

    def row_offsets(self, indent: str) -> None:
        """``xo_<buf>``: each buffer's offset at the start of row ``x``."""
        self.define_dims(self.xdims, "x", "x", indent)
        for b in self.k.buffers:
            part = self._part(self.xdims, "x", "x", b.strides) if self.xdims else ""
            self.lines.append(f"{indent}const int64_t xo_{b.name} = {part or '0'};")

    def dim_var(self, d: int) -> str:
        """The index along box dimension ``d``: ``x``/``r`` when it is the only dimension of
        its loop, else the variable :meth:`define_dims` defines."""
        if d in self.rdims:
            return "r" if len(self.rdims) == 1 else f"r{d}"
        return "x" if len(self.xdims) == 1 else f"x{d}"

    def spanned_offset(self, name: str, level: str, spans) -> str:
        """The offset of a load valid in ``spans``: along a span's dimension the buffer is read
        at ``i - start``, with ``i`` clamped into the span first, so that the points outside it
        (whose values the concat discards) read an element of the buffer, not past it."""
        b = self.k.buffer(name)
        by_dim = {s.dim: s for s in spans}
        terms = []
        loops = [(self.xdims, "x")] + ([(self.rdims, "r")] if level == FULL else [])
        for dims, flat in loops:
            if not by_dim.keys() & set(dims):
                part = self._part(dims, flat, flat, b.strides) if dims else ""
                terms += [part] if part else []
                continue
            for d in dims:
                st = b.strides[d]
                if st == 0:
                    continue
                var = self.dim_var(d)
                if d in by_dim and self.in_piece(by_dim[d]):
                    var = var if by_dim[d].start == 0 else f"({var} - {by_dim[d].start})"
                elif d in by_dim:
                    var = self.clamped(var, by_dim[d], self.sizes[d])
                terms.append(var if st == 1 else f"{var} * {st}")
        return " + ".join(terms) or "0"

    def in_piece(self, span: Span) -> bool:
        """Whether the current loop covers only points inside ``span`` (a piece of the row)."""
        return (self.piece is not None and span.dim in self.rdims
                and span.start <= self.piece[0] and self.piece[1] <= span.stop)

    def chosen(self, op: Op) -> int | None:
        """The operand of a concat along the row that the current piece takes, or None."""
        for span, operand in concat_parts(op):
            if self.in_piece(span):
                return operand
        return None

    def row_pieces(self) -> list[tuple[int, int]] | None:
        """The pieces a row splits into at the concatenations along it (a pointwise kernel
        concatenating along its last dimension: rotary embeddings), or None. Each piece runs
        its own loop, where every concat is one of its operands and the loads of that operand
        are plain, contiguous ones (clamped indices would make gathers)."""
        if len(self.rdims) != 1 or self.k.is_reduction:
            return None
        bounds = {0, self.rnumel}
        for op in self.k.ops:
            for a in op.args:
                if isinstance(a, Span) and a.dim == self.rdims[0]:
                    if not (isinstance(a.start, int) and isinstance(a.stop, int)):
                        return None
                    bounds |= {a.start, a.stop}
        if len(bounds) == 2 or len(bounds) - 1 > MAX_PIECES or not isinstance(self.rnumel, int):
            return None
        ordered = sorted(bounds)
        return list(zip(ordered, ordered[1:]))

    @staticmethod
    def clamped(var: str, span, size: Expr) -> str:
        """``var - span.start`` with ``var`` clamped into the span."""
        if span.start != 0:
            var = f"({var} < {span.start} ? {span.start} : {var})"
        if span.stop != size:
            last = f"({span.stop} - 1)" if isinstance(span.stop, Sym) else span.stop - 1
            var = f"({var} > {last} ? {last} : {var})"
        return var if span.start == 0 else f"({var} - {span.start})"

    def offset(self, name: str, level: str) -> str:
        b = self.k.buffer(name)
        if level == OUTER:
            return f"xo_{name}"
        part = self._part(self.rdims, "r", "r", b.strides) if self.rdims else ""
        return f"xo_{name} + {part}" if part else f"xo_{name}"

    # -- values -------------------------------------------------------------------------------
    def load_ref(self, op: Op) -> str:
        """The element a load reads, as a C lvalue in its buffer's own type."""
        b = self.k.buffer(op.args[0])
        spans = spans_of(op)
        at = self.spanned_offset(b.name, op.level, spans) if spans else self.offset(b.name, op.level)
        return f"{b.name}[{at}]"

    def expr(self, op: Op) -> str:
        a = [f"t{x}" if is_operand(x) else x for x in op.args]
        k, dt = op.kind, op.dtype
        ct = c_type(dt)
        if k == "load":
            b = self.k.buffer(op.args[0])
            ref = self.load_ref(op)
            if b.dtype == torch.float16:
                return f"fj_h2f({ref})"
            if b.dtype == torch.bfloat16:
                return f"fj_bf2f({ref})"
            return ref if b.dtype == dt else f"({ct}){ref}"
        if k == "const":
            if isinstance(op.args[0], Sym):  # a run-time size as a value (a mean's count)
                return f"(({ct})({op.args[0]}))"
            return _literal(op.args[0], dt)
        if k == "rand":
            return f"fj_u_{op.args[0]}_{op.args[1]}[r - fj_ub]"
        if k == "cast":
            return f"({a[0]} != 0)" if dt == torch.bool else _c_cast(a[0], self.k.ops[op.args[0]].dtype, dt)
        if k == "round":
            if op.args[1] == torch.float16:
                if self.per_row:
                    return f"fj_round_h1((float){a[0]})"
                return f"fj_h2f(fj_f2h((float){a[0]}))"
            return f"fj_round_bf((float){a[0]})"
        if k == "where":
            return f"({a[0]} ? {a[1]} : {a[2]})"
        if k == "concat" and self.chosen(op) is not None:
            return f"t{self.chosen(op)}"
        if k == "concat":
            parts = concat_parts(op)
            text = f"t{parts[-1][1]}"
            for span, operand in reversed(parts[:-1]):
                text = f"({self.dim_var(span.dim)} < {span.stop} ? t{operand} : {text})"
            return text
        x = a[0]
        y = a[1] if len(a) > 1 else None
        is_float = dt.is_floating_point
        if k in ("add", "sub", "mul", "neg") and dt in _UNSIGNED:
            u = _UNSIGNED[dt]
            if k == "neg":
                return f"({ct})(({u})0 - ({u}){x})"
            sym = {"add": "+", "sub": "-", "mul": "*"}[k]
            return f"({ct})(({u}){x} {sym} ({u}){y})"
        one = _literal(1, dt)
        if is_float:
            fn = {name: _float_fn(name, dt) for name in (
                "exp", "log", "log1p", "expm1", "sqrt", "sin", "cos", "tanh", "erf", "floor",
                "ceil", "fabs")}
            math_ops = {
                "exp": f"{fn['exp']}({x})", "log": f"{fn['log']}({x})",
                "log1p": f"{fn['log1p']}({x})", "expm1": f"{fn['expm1']}({x})",
                "sqrt": f"{fn['sqrt']}({x})", "rsqrt": f"({one} / {fn['sqrt']}({x}))",
                "reciprocal": f"({one} / {x})", "sin": f"{fn['sin']}({x})",
                "cos": f"{fn['cos']}({x})", "tanh": f"{fn['tanh']}({x})",
                "erf": f"{fn['erf']}({x})", "floor": f"{fn['floor']}({x})",
                "ceil": f"{fn['ceil']}({x})", "abs": f"{fn['fabs']}({x})",
                "sigmoid": f"({one} / ({one} + {fn['exp']}(-{x})))",
                "gelu": (f"fj_geluf({x})" if dt == torch.float32 else
                         f"({x} * 0.5 * (1.0 + {fn['erf']}({x} * 0.7071067811865476)))"),
            }
            if k in math_ops:
                return math_ops[k]
        simple = {
            "neg": f"({ct})(-{x})", "abs": f"({ct})({x} < 0 ? -{x} : {x})",
            "floor": x, "ceil": x,
            "relu": f"({x} < 0 ? ({ct})0 : {x})",
            "sign": f"({ct})(({x} > 0) - ({x} < 0))",  # NaN and -0.0 -> 0
            "not": f"(!{x})", "isnan": f"({x} != {x})",
            "add": f"({ct})({x} + {y})", "sub": f"({ct})({x} - {y})",
            "mul": f"({ct})({x} * {y})", "truediv": f"({x} / {y})",
            "eq": f"({x} == {y})", "ne": f"({x} != {y})", "lt": f"({x} < {y})",
            "le": f"({x} <= {y})", "gt": f"({x} > {y})", "ge": f"({x} >= {y})",
            "and": f"({x} && {y})", "or": f"({x} || {y})",
            "maximum": f"(({x} > {y} || {x} != {x}) ? {x} : {y})",
            "minimum": f"(({x} < {y} || {x} != {x}) ? {x} : {y})",
        }
        if k in simple:
            return simple[k]
        raise NotImplementedError(f"C renderer: no rule for {k!r}")

    def store(self, op: Op, indent: str) -> None:
        name, src = op.args
        b = self.k.buffer(name)
        v = f"t{src}"
        if b.dtype == torch.float16:
            v = f"fj_f2h{'1' if self.per_row else ''}((float){v})"
        elif b.dtype == torch.bfloat16:
            v = f"fj_f2bf((float){v})"
        elif b.dtype == torch.bool:
            v = f"({v} != 0)"
        elif self.k.ops[src].dtype != b.dtype:
            v = _c_cast(v, self.k.ops[src].dtype, b.dtype)
        self.lines.append(f"{indent}{name}[{self.offset(name, op.level)}] = {v};")

    def closure(self, roots: list[int], stops: set[int] | None = None) -> list[int]:
        """The FULL ops one loop over the row computes for ``roots``: their full closure without
        the row-invariant ops (hoisted) and stopping at the ops read from a row buffer
        (``stops``, by default those of the current loop)."""
        stops = self.avail if stops is None else stops
        if not stops and self.piece is None:
            return [i for i in self.k.full_closure(roots) if i not in self.invariant]
        need: set[int] = set()
        stack = list(roots)
        while stack:
            i = stack.pop()
            op = self.k.ops[i]
            if i in need or op.level != FULL or op.kind == "reduce" or i in self.invariant:
                continue
            need.add(i)
            if i in stops:
                continue
            if op.kind == "store":
                stack.append(op.args[1])
            elif op.kind == "concat" and self.chosen(op) is not None:
                stack.append(self.chosen(op))
            elif op.kind not in ("load", "const", "rand"):
                stack.extend(a for a in op.args if is_operand(a))
        return sorted(need)

    def plan_row_buffers(self, loops: list[list[int]],
                         split: bool | str = False) -> list[tuple[set[int], list[int]]]:
        """For each loop over one row (the roots it needs, in order): the ops it reads from a
        row buffer and the ops it stores to one. A value computed by an earlier loop is kept
        when recomputing it would take a costly op or two loads or more: in a local array for
        a short static row (or a run-time one in :attr:`row_cap`'s copy of the nest), else in
        an output's row (see :meth:`output_scratch`), which also serves a row cut in parts
        (``split``)."""
        k = self.k
        plain = [(set(), []) for _ in loops]
        self.scratch = {}
        length = self.buffer_length
        if self.block is not None or len(loops) < 2 or (isinstance(self.rnumel, int) and self.rnumel <= 0):
            return plain
        buffered: set[int] = set()
        first: dict[int, int] = {}
        bodies: list[list[int]] = []
        for j, roots in enumerate(loops):
            body = self.closure(roots, buffered)
            if j:
                for i in body:
                    if i in first and i not in buffered and k.ops[i].kind != "store":
                        cost = self.closure([i], buffered - {i})
                        loads = sum(1 for c in cost if k.ops[c].kind == "load" or c in buffered)
                        # (a buffered op in the cost is read back, not recomputed: a load)
                        if loads >= 2 or any(k.ops[c].kind in _COSTLY and c not in buffered
                                             or self.half_load(c) for c in cost):
                            buffered.add(i)
                body = self.closure(roots, buffered)
            for i in body:
                first.setdefault(i, j)
            bodies.append(body)
        used = {i for j, body in enumerate(bodies) for i in body
                if i in buffered and first[i] < j}
        # At most ROW_BUFFER elements and ROW_BUFFER_BYTES of stack per row (OpenMP threads
        # have small stacks); a bool is kept as an int (see local_type). A longer row keeps one
        # value in an output row the last loop writes (see output_scratch).
        row_bytes = sum(4 if k.ops[i].dtype == torch.bool else k.ops[i].dtype.itemsize for i in used)
        if not used:
            return plain
        if split or length is None or length > ROW_BUFFER or length * row_bytes > ROW_BUFFER_BYTES:
            out = self.output_scratch(used, bodies[-1])
            if out is None:
                return plain
            self.scratch = {next(iter(used)): out}
        return [({i for i in body if i in used and first[i] < j},
                 [i for i in body if i in used and first[i] == j])
                for j, body in enumerate(bodies)]

    def half_load(self, i: int) -> bool:
        """Whether op ``i`` loads from an fp16 buffer: a conversion that costs more than
        reading back an fp32 row buffer (a long integer sequence, or a vector tile's steps)."""
        op = self.k.ops[i]
        return (op.kind == "load" and self.k.buffer(op.args[0]).dtype == torch.float16
                and i not in self.shared)

    def output_scratch(self, used: set[int], last: list[int]) -> str | None:
        """The output whose row can hold the one buffered value of a row that has no row buffer
        (too long, cut in parts, or of a run-time length), or None: an output of the value's
        dtype that the last loop stores at every point of the row (one row dimension, not
        broadcast along it), where each later loop reads it back at the index it will write.
        A row cut in parts works too: each loop over the parts ends in a barrier before the
        next reads them. Not with concatenations. launch.donate_dead_inputs passes such a
        kernel no input as that output (a later loop may still read the input)."""
        k = self.k
        if len(used) != 1 or len(self.rdims) != 1 or k.span_dims:
            return None
        (i,) = used
        for j in last:
            op = k.ops[j]
            if op.kind != "store" or op.level != FULL:
                continue
            b = k.buffer(op.args[0])
            # Not broadcast along any dimension: rows of other threads never share memory.
            dense = all(stride != 0 for stride, size in zip(b.strides, self.sizes) if size != 1)
            if b.dtype == k.ops[i].dtype and b.dtype.is_floating_point and dense:
                return b.name
        return None

    @property
    def buffer_length(self) -> int | None:
        """The length of a row buffer: the static row length, else :attr:`row_cap`."""
        return self.rnumel if isinstance(self.rnumel, int) else self.row_cap

    def kept(self, i: int) -> str:
        """Where row-buffered op ``i`` is kept at point ``r``: its row buffer, or the output row
        that holds it (:meth:`output_scratch`)."""
        name = self.scratch.get(i)
        return f"{self.row_buffer(i)}[r]" if name is None else f"{name}[{self.offset(name, FULL)}]"

    def row_buffer(self, i: int) -> str:
        """The row buffer of op ``i``: ``b<i>``, or the current row's of ``fj_b<i>`` when
        several rows are taken at once (see :meth:`interleaved_rows`)."""
        return f"fj_b{i}[fj_k]" if self.interleaved else f"b{i}"

    def declare_row_buffers(self, plan, indent: str, rows: int = 1) -> None:
        """Declares the row buffers of ``plan``; for ``rows`` rows at once (see
        :meth:`interleaved_rows`) an array ``fj_b<i>`` of one buffer per row."""
        length = self.buffer_length
        for i, name in self.scratch.items():
            self.lines.append(f"{indent}/* {name}'s row holds t{i} until the last loop (fj_scratch) */")
        for i in [i for _, fill in plan for i in fill if i not in self.scratch]:
            self.buffers_declared = True
            dtype = local_type(self.k.ops[i].dtype)
            if rows == 1:
                self.lines.append(f"{indent}{dtype} b{i}[{length}] __attribute__((aligned(64)));")
            else:  # each row's buffer 64-byte aligned
                self.lines.append(f"{indent}{dtype} fj_b{i}[{rows}][{-(-length // 16) * 16}] "
                                  f"__attribute__((aligned(64)));")

    def emit_per_row(self, indices, indent: str) -> None:
        """:meth:`emit` of a row's OUTER values, computed once a row outside any vector loop:
        their fp16 roundings and stores take F16C's scalar conversions (fj_round_h1, fj_f2h1)
        where the vectorizable integer forms cost about twenty instructions each."""
        self.per_row = True
        try:
            self.emit(indices, indent)
        finally:
            self.per_row = False

    def emit(self, indices, indent: str) -> None:
        for i in indices:
            op = self.k.ops[i]
            if i in self.avail:
                self.lines.append(f"{indent}const {local_type(op.dtype)} t{i} = {self.kept(i)};")
                continue
            if i in self.shared:
                self.lines.append(f"{indent}const float t{i} = h{i}[r];")
                continue
            if op.kind == "store":
                self.store(op, indent)
            elif op.kind != "reduce":
                self.lines.append(f"{indent}const {local_type(op.dtype)} t{i} = {self.expr(op)};")

    # -- structure ------------------------------------------------------------------------------
    def reduce_deps(self) -> list[set[int]]:
        """For each op, the reductions it depends on (itself included for a reduce)."""
        deps: list[set[int]] = []
        for i, op in enumerate(self.k.ops):
            d: set[int] = set()
            if op.kind == "store":
                d |= deps[op.args[1]]
            elif op.kind == "reduce":
                d |= deps[op.args[1]] | {i}
            elif op.kind not in ("load", "const", "rand"):
                for a in op.args:
                    if is_operand(a):
                        d |= deps[a]
            deps.append(d)
        return deps

    def reduce_groups(self) -> list[list[int]]:
        """Reductions in order, consecutive ones sharing a loop when none needs another."""
        deps = self.reduce_deps()
        groups: list[list[int]] = []
        for i, op in enumerate(self.k.ops):
            if op.kind != "reduce":
                continue
            if groups and not (deps[op.args[1]] & set(groups[-1])):
                groups[-1].append(i)
            else:
                groups.append([i])
        return groups

    def acc_type(self, i: int) -> str:
        kind, src = self.k.ops[i].args
        sdt = self.k.ops[src].dtype
        if kind == "sum":
            return "double" if sdt.is_floating_point else _UNSIGNED.get(sdt, "int64_t")
        return c_type(sdt)

    def init_acc(self, group: list[int], lo: str, indent: str) -> None:
        for i in group:
            kind, src = self.k.ops[i].args
            sdt = self.k.ops[src].dtype
            at = self.acc_type(i)
            if kind == "sum":
                self.lines.append(f"{indent}{at} a{i} = 0;")
                continue
            big = "max" in kind
            if sdt.is_floating_point:
                init = "(-INFINITY)" if big else "INFINITY"
            elif sdt == torch.bool:
                init = "0" if big else "1"
            else:
                info = torch.iinfo(sdt)
                init = _literal(info.min if big else info.max, sdt)
            self.lines.append(f"{indent}{at} a{i} = {init};")
            if kind in ("argmax", "argmin"):
                self.lines.append(f"{indent}int64_t a{i}_i = {lo};")

    def reduce_loop(self, group: list[int], lo: str, hi: str, indent: str) -> None:
        """Accumulate ``group`` over ``r`` in [lo, hi) into ``a<i>`` (and ``a<i>_i``)."""
        k = self.k
        body = self.closure([k.ops[i].args[1] for i in group])  # invariants: hoisted
        sums = [i for i in group if k.ops[i].args[0] == "sum"]
        float_sums = [i for i in sums if k.ops[k.ops[i].args[1]].dtype == torch.float32]
        # max/min vectorize as an OpenMP max/min reduction plus a NaN flag (the reduction
        # itself has no NaN rule); arg reductions keep their first-index rule in scalar code.
        simd = all(k.ops[i].args[0] in ("sum", "max", "min") for i in group) and all(
            k.ops[k.ops[i].args[1]].dtype != torch.bool for i in group)
        extrema = [i for i in group if k.ops[i].args[0] in ("max", "min")]
        ind = indent
        # A run-time row always takes the chunked loop: one chunk adds exactly as no chunks.
        if float_sums and (isinstance(self.rnumel, Sym) or self.rnumel > SUM_CHUNK):
            self.lines.append(f"{ind}for (int64_t r0 = {lo}; r0 < {hi}; r0 += {SUM_CHUNK}) {{")
            ind += "    "
            self.lines.append(f"{ind}const int64_t r1 = FJ_MIN(r0 + {SUM_CHUNK}, {hi});")
            lo, hi = "r0", "r1"
        # fp32 sums add in fp32 inside a chunk (vector lanes), chunks add in fp64.
        chunk = {i: (f"c{i}" if i in float_sums else f"a{i}") for i in sums}
        for i in float_sums:
            self.lines.append(f"{ind}float c{i} = 0;")
        for i in extrema:
            if k.ops[k.ops[i].args[1]].dtype.is_floating_point:
                # An int, not a _Bool: gcc finds no vector type for a _Bool reduction and
                # leaves the whole row loop scalar (softmax ran 3x slower).
                self.lines.append(f"{ind}int n{i} = 0;")
        lo, hi, ind_t, close = self.rand_tiles(body, lo, hi, ind)

        def pragma_summing(summed: list[int]) -> str | None:
            if not simd:
                return None
            clauses = []
            if summed:
                clauses.append(f"reduction(+:{', '.join(chunk[i] for i in summed)})")
            for kind in ("max", "min"):
                names = [f"a{i}" for i in extrema if k.ops[i].args[0] == kind]
                if names:
                    clauses.append(f"reduction({kind}:{', '.join(names)})")
            flags = [f"n{i}" for i in extrema if k.ops[k.ops[i].args[1]].dtype.is_floating_point]
            if flags:
                clauses.append(f"reduction(|:{', '.join(flags)})")
            return " ".join(["#pragma omp simd", *clauses])

        steps: dict[int, list[str]] = {}  # each reduction's statements at a point
        for i in group:
            kind, src = k.ops[i].args
            v = f"t{src}"
            if kind == "sum":
                at = self.acc_type(i)
                if at.startswith("uint"):
                    v = f"({at}){v}"
                steps[i] = [f"{chunk[i]} += {v};"]
            elif kind in ("max", "min"):
                cmp = ">" if kind == "max" else "<"
                steps[i] = [f"a{i} = {v} {cmp} a{i} ? {v} : a{i};"]
                if k.ops[src].dtype.is_floating_point:
                    steps[i].append(f"n{i} |= {v} != {v};")
            else:
                cmp = ">" if kind == "argmax" else "<"
                # Strictly better keeps the first index; the first NaN wins and stays.
                steps[i] = [f"if ({v} {cmp} a{i} || ({v} != {v} && a{i} == a{i})) "
                            f"{{ a{i} = {v}; a{i}_i = r; }}"]
        roots = [k.ops[i].args[1] for i in group] + list(self.fill)
        # In vector tiles the fp32 sums add a tile at a time (fj_sum_tile), not in the loop.
        tile_sums = float_sums if simd else []
        tile = (pragma_summing([i for i in sums if i not in tile_sums]),
                [line for i in group if i not in tile_sums for line in steps[i]],
                [(i, k.ops[i].args[1]) for i in tile_sums])
        ahead = self.ahead is not None and group == [self.ahead[0]]
        if ahead:  # the last row's exp tile may have taken this row's max (row_ahead)
            self.lines.append(f"{ind_t}if (fj_nx == x) {{")
            self.lines.append(f"{ind_t}    a{group[0]} = fj_nm;")
            self.lines.append(f"{ind_t}    n{group[0]} = fj_nn;")
            self.lines.append(f"{ind_t}}} else {{")
        # A max/min over a static row that is no whole number of vectors: the whole vectors,
        # then the rest, each a loop of its own (the same result: a max is exact). In one
        # loop, gcc's scalar remainder updated the reduction's lanes in memory, which its
        # vector code then read back: a softmax over rows of 77 ran 1.3x slower. The rest as a
        # `simd` loop of its own still does, so it is a plain loop (fp32 softmax and
        # log-softmax over rows of 77-197 1.04-1.18x faster; bf16 over rows of 77 1.12x), but
        # for a few 16-bit values (bf16 log-softmax over rows of 197: 1.05x slower plain).
        pieces = [(lo, hi, pragma_summing(sums))]
        if (extrema == group and simd and isinstance(self.rnumel, int) and self.rnumel > 16
                and self.rnumel % 16 and (lo, hi) == ("0", str(self.rnumel)) and not ahead):
            whole = str(self.rnumel // 16 * 16)
            halfs = any(b.dtype.itemsize == 2 for b in self.row_inputs())
            plain = self.rnumel % 16 >= 8 or not halfs
            pieces = [("0", whole, pragma_summing(sums)),
                      (whole, hi, None if plain else pragma_summing(sums))]
        for a, b, pragma in pieces:
            self.row_loop(pragma, roots, body, a, b, ind_t + "    " * ahead,
                          [line for i in group for line in steps[i]], fills=self.fill,
                          sums=bool(sums), tile=tile)
        if ahead:
            self.lines.append(f"{ind_t}}}")
        if close:
            self.lines.append(f"{ind}}}")
        for i in float_sums:
            self.lines.append(f"{ind}a{i} += c{i};")
        for i in extrema:
            if k.ops[k.ops[i].args[1]].dtype.is_floating_point:
                self.lines.append(f"{ind}if (n{i}) a{i} = NAN;")
        if ind != indent:
            self.lines.append(f"{indent}}}")

    def combine(self, i: int, other: str, indent: str) -> None:
        """Fold a later part's accumulator ``other`` (``other_i``) into ``a<i>``."""
        kind = self.k.ops[i].args[0]
        if kind == "sum":
            self.lines.append(f"{indent}a{i} += {other};")
        elif kind in ("max", "min"):
            cmp = ">" if kind == "max" else "<"
            self.lines.append(f"{indent}if ({other} {cmp} a{i} || {other} != {other}) a{i} = {other};")
        else:
            cmp = ">" if kind == "argmax" else "<"
            self.lines.append(f"{indent}if ({other} {cmp} a{i} || ({other} != {other} && a{i} == a{i})) "
                              f"{{ a{i} = {other}; a{i}_i = {other}_i; }}")

    def finish(self, group: list[int], indent: str) -> None:
        for i in group:
            op = self.k.ops[i]
            kind = op.args[0]
            value = f"a{i}_i" if kind in ("argmax", "argmin") else f"({c_type(op.dtype)})a{i}"
            self.lines.append(f"{indent}const {local_type(op.dtype)} t{i} = {value};")

    def parts(self) -> tuple[int | str, int | str]:
        """(number of parts, elements per part) of a single row cut for threads: ints, or the
        names of the C locals :meth:`define_parts` computes from a run-time row length."""
        if isinstance(self.rnumel, Sym):
            return "fj_parts", "fj_per"
        per = max(SUM_CHUNK, -(-self.rnumel // MAX_PARTS))
        per = -(-per // SUM_CHUNK) * SUM_CHUNK
        return -(-self.rnumel // per), per

    def define_parts(self, indent: str) -> None:
        """The C locals ``fj_per`` and ``fj_parts`` that a kernel with run-time sizes passes to
        its function over rows when it cuts a single row: :meth:`parts`'s arithmetic on a
        run-time row length, or its numbers for a static one (a run-time number of rows)."""
        if not isinstance(self.rnumel, Sym):
            n, per = self.parts()
            self.lines.append(f"{indent}const int64_t fj_per = {per};")
            self.lines.append(f"{indent}const int64_t fj_parts = {n};")
            return
        r = self.rnumel
        self.lines.append(f"{indent}const int64_t fj_per0 = ({r} + {MAX_PARTS - 1}) / {MAX_PARTS};")
        self.lines.append(f"{indent}const int64_t fj_per = (fj_per0 < {SUM_CHUNK} ? {SUM_CHUNK} : "
                          f"(fj_per0 + {SUM_CHUNK - 1}) / {SUM_CHUNK} * {SUM_CHUNK});")
        self.lines.append(f"{indent}const int64_t fj_parts = ({r} + fj_per - 1) / fj_per;")

    def reduce_group(self, group: list[int], indent: str, split: bool | str) -> None:
        self.hoist(self.k.full_closure([self.k.ops[i].args[1] for i in group]), indent)
        if split == "maybe":
            self.reduce_parts(group, indent)
            return
        if not split:
            self.init_acc(group, "0", indent)
            self.reduce_loop(group, "0", str(self.rnumel), indent)
            self.finish(group, indent)
            return
        n, per = self.parts()
        room = MAX_PARTS if isinstance(n, str) else n
        for i in group:
            self.lines.append(f"{indent}{self.acc_type(i)} p{i}[{room}];")
            if self.k.ops[i].args[0] in ("argmax", "argmin"):
                self.lines.append(f"{indent}int64_t p{i}_i[{room}];")
        self.lines.append(f"{indent}#pragma omp parallel for num_threads(nthreads) if(nthreads > 1) schedule(static)")
        self.lines.append(f"{indent}for (int64_t p = 0; p < {n}; p++) {{")
        inner = indent + "    "
        self.lines.append(f"{inner}const int64_t lo = p * {per}, hi = FJ_MIN(lo + {per}, {self.rnumel});")
        self.init_acc(group, "lo", inner)
        self.reduce_loop(group, "lo", "hi", inner)
        self.store_part(group, "p", inner)
        self.lines.append(f"{indent}}}")
        self.combine_parts(group, "p", n, indent)

    def store_part(self, group: list[int], slots: str, indent: str) -> None:
        """Part ``p``'s accumulators into its slot of the arrays ``<slots><i>``."""
        for i in group:
            self.lines.append(f"{indent}{slots}{i}[p] = a{i};")
            if self.k.ops[i].args[0] in ("argmax", "argmin"):
                self.lines.append(f"{indent}{slots}{i}_i[p] = a{i}_i;")

    def combine_parts(self, group: list[int], slots: str, n: int | str, indent: str) -> None:
        """The results of ``group`` from the ``n`` parts in ``<slots><i>``, combined in part
        order (the same result at any thread count)."""
        inner = indent + "    "
        for i in group:
            self.lines.append(f"{indent}{self.acc_type(i)} a{i} = {slots}{i}[0];")
            if self.k.ops[i].args[0] in ("argmax", "argmin"):
                self.lines.append(f"{indent}int64_t a{i}_i = {slots}{i}_i[0];")
        self.lines.append(f"{indent}for (int64_t p = 1; p < {n}; p++) {{")
        for i in group:
            self.lines.append(f"{inner}const {self.acc_type(i)} q{i} = {slots}{i}[p];")
            if self.k.ops[i].args[0] in ("argmax", "argmin"):
                self.lines.append(f"{inner}const int64_t q{i}_i = {slots}{i}_i[p];")
            self.combine(i, f"q{i}", inner)
        self.lines.append(f"{indent}}}")
        self.finish(group, indent)

    def reduce_parts(self, group: list[int], indent: str) -> None:
        """The row function's reduction: over this thread's parts ``[fj_p0, fj_p1)`` of a row
        cut in ``fj_parts`` parts, or over the whole row as one part (``fj_parts == 0``). Each
        part's result goes to its slot of ``p<i>`` (shared by the threads of a cut row, a
        local slot otherwise); the slots then combine in part order, as the static kernel's."""
        k = self.k
        arg = [i for i in group if k.ops[i].args[0] in ("argmax", "argmin")]
        for i in group:
            self.lines.append(f"{indent}{self.acc_type(i)} *restrict pp{i} = fj_parts ? p{i} : s{i};")
        for i in arg:
            self.lines.append(f"{indent}int64_t *restrict pp{i}_i = fj_parts ? p{i}_i : s{i}_i;")
        inner = indent + "    "
        self.lines.append(f"{indent}for (int64_t p = fj_p0; p < fj_p1; p++) {{")
        self.lines.append(f"{inner}const int64_t lo = p * fj_per, hi = FJ_MIN(lo + fj_per, {self.rnumel});")
        self.init_acc(group, "lo", inner)
        self.reduce_loop(group, "lo", "hi", inner)
        self.store_part(group, "pp", inner)
        self.lines.append(f"{indent}}}")
        self.lines.append(f"{indent}if (fj_parts) {{")
        self.lines.append(f"{inner}#pragma omp barrier")
        self.lines.append(f"{indent}}}")
        self.combine_parts(group, "pp", "fj_parts", indent)

    def store_loop(self, stores: list[int], indent: str, split: bool | str) -> None:
        self.hoist(self.k.full_closure(stores), indent)
        if split == "maybe":
            self.lines.append(f"{indent}for (int64_t p = fj_p0; p < fj_p1; p++) {{")
            self.simd_loop(stores, "p * fj_per", f"FJ_MIN(p * fj_per + fj_per, {self.rnumel})",
                           indent + "    ")
            self.lines.append(f"{indent}}}")
            return
        if not split:
            self.simd_loop(stores, "0", str(self.rnumel), indent)
            return
        # One row cut into parts for threads, each part a simd loop. Not the combined
        # `parallel for simd`: gcc 12 takes its scalar path (a libm call per element, 100x
        # slower for tanh), and with one thread the row needs no parallel region at all.
        n, per = self.parts()
        inner = indent + "    "
        self.lines.append(f"{indent}if (nthreads > 1) {{")
        self.lines.append(f"{inner}#pragma omp parallel for num_threads(nthreads) schedule(static)")
        self.lines.append(f"{inner}for (int64_t p = 0; p < {n}; p++) {{")
        self.simd_loop(stores, f"p * {per}", f"FJ_MIN(p * {per} + {per}, {self.rnumel})",
                       inner + "    ")
        self.lines.append(f"{inner}}}")
        self.lines.append(f"{indent}}} else {{")
        self.simd_loop(stores, "0", str(self.rnumel), inner)
        self.lines.append(f"{indent}}}")

    def simd_loop(self, stores: list[int], lo: str, hi: str, indent: str) -> None:
        pieces = self.row_pieces()
        if pieces is None:
            self.simd_piece(stores, lo, hi, indent)
            return
        for start, stop in pieces:
            self.piece = (start, stop)
            self.simd_piece(stores, str(start) if lo == "0" else f"({lo} > {start} ? {lo} : {start})",
                            str(stop) if hi == str(self.rnumel) else f"FJ_MIN({hi}, {stop})", indent)
            self.piece = None

    def simd_piece(self, stores: list[int], lo: str, hi: str, indent: str) -> None:
        body = self.closure(stores)
        lo, hi, ind, close = self.rand_tiles(body, lo, hi, indent)
        self.row_loop("#pragma omp simd", stores, body, lo, hi, ind, [])
        if close:
            self.lines.append(f"{indent}}}")

    def row_loop(self, pragma: str | None, roots: list[int], body: list[int], lo: str, hi: str,
                 indent: str, tail: list[str], fills=(), sums: bool = False, tile=None) -> None:
        """The loop over ``r`` in [lo, hi) that computes ``body`` (for ``roots``), keeps the
        ops ``fills`` in their row buffers and then runs the statements ``tail``, under
        ``pragma``; ``sums``: the tail adds into a sum. Where the
        body takes exp or sigmoid of fp32 values, or loads or stores fp16, or the loop sums
        fp32 values, the loop is also rendered the vector-tile way (see :meth:`vector_tiles`),
        which the compiler takes where the prelude defines ``FJ_VEC_TILES``. ``tile``: the
        pragma, tail and fp32 sums (op, operand) of a reduction's loop in tiles, where those
        sums add a tile at a time."""
        # bf16 loads convert in the tiles of a loop that sums or takes exp over a row shorter
        # than 64 whose length is no multiple of two vectors (32 floats on AVX-512, 16 on
        # AVX2): gcc's loop stores such a row's last floats in pieces, which the tile's vector
        # loads then wait for (a bf16 softmax over rows of 16 or 48 ran 2.4x faster on AVX-512,
        # of 24 1.3x; 1.5x over rows of 24 on AVX2). Elsewhere its loop is as fast or faster (a
        # bf16 layer norm over rows of 128: 1.2x, of 100 to 1000: up to 1.15x; over rows of 16
        # on AVX2 1.1x). The two widths' choices differ where the length is an odd multiple of
        # 16: then the loop is rendered for each (#if FJ_VW == 16).
        taken = self.vector_body(pragma, body, lo, hi, indent, tail, fills)
        if taken:
            self.lines.append("#else")
            if taken in ("#ifdef FJ_VREST", "#ifdef FJ_BF16_PAIRS"):  # (elsewhere the loop as it was)
                self.scalar_or_tiled_loop(pragma, roots, body, lo, hi, indent, tail, fills, sums, tile)
            else:
                self.plain_loop(pragma, body, lo, hi, indent, tail, fills)
            self.lines.append("#endif")
            return
        self.scalar_or_tiled_loop(pragma, roots, body, lo, hi, indent, tail, fills, sums, tile)

    def scalar_or_tiled_loop(self, pragma: str | None, roots: list[int], body: list[int], lo: str,
                             hi: str, indent: str, tail: list[str], fills, sums: bool,
                             tile) -> None:
        """:meth:`row_loop`'s loop as plain C, and in vector tiles where those take it."""
        if self.piece is not None and lo.isdigit() and hi.isdigit() and int(hi) - int(lo) < 16:
            # A piece of a row (a concatenation's) shorter than a vector tile: its loop, which
            # gcc makes one vector's code, where the tiles took a call per conversion and
            # rounding for a handful of values (an fp16 rotary embedding over rows of 16, in
            # pieces of 8, ran 14x slower than Inductor's)
            self.plain_loop(pragma, body, lo, hi, indent, tail, fills)
            return
        plain = self.vector_tiled(body)
        short_bf16 = bool((tile and tile[2]) or plain[0]) and isinstance(self.rnumel, int) \
            and self.rnumel < 64
        by_width = {w: self.vector_tiled(body, bf16=True) if short_bf16 and self.rnumel % (2 * w)
                    else plain for w in (16, 8)}
        tiles = by_width[16]
        # A loop that only sums takes tiles where it reads no memory (a later loop over a row
        # kept in a row buffer: a layer norm's variance), so that its sums are the bound. A
        # first loop over memory is bound by it: storing the summands and adding them again
        # made an fp32 layer norm 1.5x slower.
        # A bf16 row is the exception: its sums ran 1.1x (rows of 1024) to 1.5x (rows of 128)
        # faster in tiles (gcc folds an omp simd sum's lanes one by one after the loop).
        loads = [i for i in body if self.k.ops[i].kind == "load" and i not in self.avail]
        bf16 = any(self.k.buffer(self.k.ops[i].args[0]).dtype == torch.bfloat16 for i in loads)
        # So is a row of at most TILED_SUM_ROW fp32 values, a whole number of vectors: a layer
        # norm over rows of 16 ran 1.4x faster (over rows of 128 1.1x slower; over rows of 24,
        # whose last 8 values the tile reads back through a partial vector, 2.4x slower).
        short = (isinstance(self.rnumel, int) and self.rnumel <= TILED_SUM_ROW
                 and self.rnumel % 16 == 0)
        tiled = any(tiles) or bool(tile and tile[2] and (bf16 or not loads or short))
        if tiled:
            widths = [(16, "#if FJ_VEC_TILES && FJ_VW == 16"), (8, "#elif FJ_VEC_TILES")]
            if by_width[16] == by_width[8]:
                widths = [(16, "#if FJ_VEC_TILES")]
            for w, test in widths:
                self.lines.append(test)
                self.vector_tiles(by_width[w], *(tile or (pragma, tail, [])), roots, fills, lo, hi,
                                  indent, sums)
            self.lines.append("#else")
        self.plain_loop(pragma, body, lo, hi, indent, tail, fills)
        if tiled:
            self.lines.append("#endif")

    def plain_loop(self, pragma: str | None, body: list[int], lo: str, hi: str, indent: str,
                   tail: list[str], fills) -> None:
        """:meth:`row_loop`'s loop as plain C. Where its tail adds into fp32 sums (``c<i> +=``)
        over a row of at least SUM_LANES (or a run-time one), the row goes in blocks of
        SUM_LANES points, each point adding into its own lane ``c<i>_l[r - fj_l0]``, then the rest
        as one loop; the lanes then add pairwise (fj_fold_lanes) into ``c<i>``. The same at any thread count,
        and alike in the static and the run-time kernel of a row."""
        lanes = [line.split(" += ")[0] for line in tail if re.fullmatch(r"c\d+ \+= [^;]+;", line)]
        # Not where the loop also stores (a row buffer, an output): gcc then keeps the lanes in
        # memory, and each block waits on their store (a residual + layer norm's first loop,
        # which keeps the residual, ran 1.5x slower).
        stores = fills or any(self.k.ops[i].kind == "store" for i in body)
        if lanes and not stores and (isinstance(self.rnumel, Sym) or self.rnumel >= SUM_LANES):
            inner, inner2 = indent + "    ", indent + "        "
            self.lines.append(f"{indent}{{")
            for c in lanes:
                self.lines.append(f"{inner}float {c}_l[{SUM_LANES}] = {{0}};")
            self.lines.append(f"{inner}int64_t fj_l0 = {lo};")
            self.lines.append(f"{inner}for (; fj_l0 + {SUM_LANES} <= {hi}; fj_l0 += {SUM_LANES}) {{")
            in_lanes = [re.sub(r"^(c\d+) \+= ", r"\1_l[r - fj_l0] += ", line) for line in tail]
            self.plain_body(_without_sums(pragma, lanes), body, "fj_l0", f"fj_l0 + {SUM_LANES}",
                            inner2, in_lanes, fills)
            self.lines.append(f"{inner}}}")
            self.plain_body(pragma, body, "fj_l0", hi, inner, tail, fills)
            for c in lanes:
                self.lines.append(f"{inner}{c} += fj_fold_lanes({c}_l, {SUM_LANES});")
            self.lines.append(f"{indent}}}")
            return
        self.plain_body(pragma, body, lo, hi, indent, tail, fills)

    def plain_body(self, pragma: str | None, body: list[int], lo: str, hi: str, indent: str,
                   tail: list[str], fills) -> None:
        if pragma:
            self.lines.append(f"{indent}{pragma}")
        self.lines.append(f"{indent}for (int64_t r = {lo}; r < {hi}; r++) {{")
        self.define_dims(self.rdims, "r", "r", indent + "    ")
        self.emit(body, indent + "    ")
        self.lines.extend(f"{indent}    {self.kept(i)} = t{i};" for i in fills)
        self.lines.extend(f"{indent}    {line}" for line in tail)
        self.lines.append(f"{indent}}}")

    _VECTOR_OPS = {"add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})",
                   "truediv": "({0} / {1})", "neg": "(-{0})", "exp": "fj_expv({0})",
                   "sigmoid": "fj_sigmoidv({0})", "relu": "fj_vrelu({0})",
                   "maximum": "fj_vmaximum({0}, {1})", "minimum": "fj_vminimum({0}, {1})",
                   "abs": "fj_vabs({0})", "gelu": "fj_geluv({0})"}
    _VECTOR_COMPARES = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
    #: vector_body's names: FJ_VW floats a vector, or eight (a short piece of a row)
    _WIDE = {"f": "fj_vf", "i": "fj_vi", "V": "FJ_V", "ld": "fj_vld", "ldh": "fj_vldh",
             "ldbf": "fj_vldbf", "st": "fj_vst", "sth": "fj_vsth", "stbf": "fj_vstbf",
             "round_h": "fj_round_hv", "round_bf": "fj_round_bfv", "sel": "fj_vsel",
             "width": "FJ_VW", "if": "#if FJ_VEC_TILES"}
    _EIGHT = {"f": "fj_v8f", "i": "fj_v8i", "V": "FJ_V8", "ld": "fj_v8ld", "ldh": "fj_v8ldh",
              "ldbf": "fj_v8ldbf", "st": "fj_v8st", "sth": "fj_v8sth", "stbf": "fj_v8stbf",
              "round_h": "fj_round_h8", "round_bf": "fj_round_bf8", "sel": "fj_v8sel",
              "width": "8", "if": "#ifdef FJ_ROWS8"}
    #: ... and the rest of a row under FJ_VW floats: masked loads and stores of fj_rm lanes
    _MASKED = {**_WIDE, "ld": "fj_vldm", "ldh": "fj_vldhm", "ldbf": "fj_vldbfm", "st": "fj_vstm",
               "sth": "fj_vsthm", "stbf": "fj_vstbfm"}
    _EIGHT_OPS = {kind: form.replace("fj_v", "fj_v8") for kind, form in _VECTOR_OPS.items()
                  if kind not in ("exp", "sigmoid", "gelu")}

    def vector_body(self, pragma: str | None, body: list[int], lo: str, hi: str, indent: str,
                    tail: list[str], fills) -> str | None:
        """:meth:`row_loop`'s loop as explicit vector code (gcc's vector extensions, FJ_VW
        floats a step), under the ``#if`` line it returns (``#if FJ_VEC_TILES``; ``#ifdef
        FJ_VREST`` where only AVX-512's form is wanted); None, with nothing rendered, where it
        holds an op it does not take. Each fp16 (bf16) load and store converts in the register
        (vcvtph2ps, vcvtps2ph), where the vector tiles took a pass over an array for each; fp32
        sums add into four vector accumulators, four vectors a step. The rest of the row, under
        a vector, is one vector of masked loads and stores where the ISA has them (AVX-512), else
        the plain loop, its sums added in order (:meth:`plain_rest`): over rows of 77, an fp16
        x - mean ran 2.2x faster masked, an RMSNorm 1.9x, a residual + layer norm 2x, a layer
        norm 1.6x; bf16 softmax and log-softmax 1.6-1.7x. The same bits as the plain loop,
        but for the sums' order and a NaN's payload; a static kernel's and a run-time one's
        alike (but where only AVX-512's form is wanted, for a static row: a run-time kernel
        keeps gcc's loop there, whose sums add in another order).

        A piece of a row (a concatenation's) of 8 to 15 points that loads, rounds or stores fp16
        or bf16 takes eight floats a vector (under ``#ifdef FJ_ROWS8``: AVX and F16C), then its
        last points as a vector of that many: gcc's loop over such a piece converted and rounded
        each fp16 value through fj_f2h's integer form (an fp16 rotary embedding over rows of 16,
        in pieces of 8, ran at 0.08x Inductor's). Longer pieces take FJ_VW floats a vector, a
        concatenation's operand read at ``r - start`` (an fp16 rotary embedding over rows of 77,
        pieces of 38 and 39, went from 0.33x Inductor's speed to 1.75x: it had taken vector
        tiles, a call per conversion). A max or min over a short bf16 row (see below)
        takes a vector of lanes and a NaN flag of lanes, folded after the vectors."""
        k = self.k
        short = lo.isdigit() and hi.isdigit() and int(hi) - int(lo) < 16
        eight = self.piece is not None and short and int(hi) - int(lo) >= 8
        if self.ahead is not None:
            return None
        if short and int(hi) - int(lo) < 8:  # under a vector (AVX2's)
            return None
        n = self._EIGHT if eight else self._WIDE
        vector_ops = self._EIGHT_OPS if eight else self._VECTOR_OPS
        count = ", fj_n" if eight else ""  # eight lanes' loads and stores take their count
        sums, extrema, flags = [], [], []
        for line in tail:
            m = re.fullmatch(r"c(\d+) \+= t(\d+);", line)
            e = re.fullmatch(r"a(\d+) = t(\d+) ([<>]) a\1 \? t\2 : a\1;", line)
            f = re.fullmatch(r"n(\d+) \|= t(\d+) != t\2;", line)
            if m is not None:
                sums.append((int(m.group(1)), int(m.group(2))))
            elif e is not None:
                extrema.append((int(e.group(1)), int(e.group(2)), e.group(3)))
            elif f is not None:
                flags.append((int(f.group(1)), int(f.group(2))))
            else:
                return None
        # (a piece of a row belongs to no reduction; sums and extrema take loops of their own)
        if eight and (sums or extrema or flags) or sums and (extrema or flags):
            return None
        f32 = torch.float32
        inside = set(body)
        half = bf16_load = bf16_work = False
        paired: dict[str, tuple[str, str]] = {}  # a bf16 store's statement: its address, value

        def operand(j, dtype=f32) -> str | None:
            """A value as a vector: fp32 lanes, or a bool's mask (all ones where true)."""
            if not is_operand(j) or k.ops[j].dtype != dtype:
                return None
            if j in inside:
                return f"v{j}"
            return f"{n['V']}(t{j})" if dtype == f32 else f"(({n['i']}){{0}} - (t{j} != 0))"

        def kept_at(i) -> str | None:
            """Where row-buffered op ``i``'s vector at ``r`` starts (None: not contiguous)."""
            if i in self.scratch:
                return self.contiguous_at(self.scratch[i], FULL, "r")
            return f"{self.row_buffer(i)} + r"

        def load_at(op) -> str | None:
            """Where a load's vector at ``r`` starts (None: not contiguous). In a piece, a load
            of a concat's operand reads its buffer at ``r - start``."""
            if not spans_of(op):
                return self.contiguous_at(op.args[0], op.level, "r")
            b = k.buffer(op.args[0])
            d = self.rdims[0]
            if op.level != FULL or b.strides[d] != 1 or not all(
                    self.in_piece(sp) for sp in spans_of(op) if sp.dim == d):
                return None
            return f"{b.name} + {self.spanned_offset(b.name, op.level, spans_of(op))}"

        def render(n: dict[str, str], count: str, stream: bool) -> list[str] | None:
            """The loop body's statements in vocabulary ``n`` (loads and stores taking
            ``count``, non-temporal stores where ``stream``); None where it has an op that
            this form does not take."""
            nonlocal half, bf16_load, bf16_work
            statements: list[str] = []
            for i in body:
                op = k.ops[i]
                if i in self.avail or i in self.shared:
                    at = f"h{i} + r" if i in self.shared else kept_at(i)
                    if op.dtype != f32 or at is None:
                        return None
                    statements.append(f"const {n['f']} v{i} = {n['ld']}({at}{count});")
                    continue
                if op.kind == "store":
                    name, src = op.args
                    dt = k.buffer(name).dtype
                    at = self.contiguous_at(name, op.level, "r")
                    v = operand(src)
                    if at is None or v is None or op.level != FULL:
                        return None
                    nt = "_nt" if stream else ""
                    if dt == f32:
                        fn = n["st"] + nt
                    elif dt == torch.float16:
                        fn = n["sth"] + nt
                    elif dt == torch.bfloat16:
                        fn = n["stbf"]
                    else:
                        return None
                    half |= dt == torch.float16
                    bf16_work |= dt == torch.bfloat16
                    statements.append(f"{fn}({at}, {v}{count});")
                    if fn == self._WIDE["stbf"]:
                        paired[statements[-1]] = (at, v)
                    continue
                if op.dtype == torch.bool:  # a mask, where the plain loop holds 0 or 1
                    if op.kind in self._VECTOR_COMPARES:
                        xs = [operand(a) for a in op.args]
                        value = None if None in xs else f"({xs[0]} {self._VECTOR_COMPARES[op.kind]} {xs[1]})"
                    elif op.kind == "isnan":
                        x = operand(op.args[0])
                        value = None if x is None else f"({x} != {x})"
                    elif op.kind in ("and", "or", "not"):
                        xs = [operand(a, torch.bool) for a in op.args]
                        sym = {"and": "&", "or": "|"}.get(op.kind)
                        value = None if None in xs else f"(~{xs[0]})" if sym is None else \
                            f"({xs[0]} {sym} {xs[1]})"
                    else:
                        value = None
                    if value is None:
                        return None
                    statements.append(f"const {n['i']} v{i} = {value};")
                    continue
                if op.dtype != f32:
                    return None
                if op.kind == "load":
                    dt = k.buffer(op.args[0]).dtype
                    at = load_at(op)
                    fn = {f32: n["ld"], torch.float16: n["ldh"], torch.bfloat16: n["ldbf"]}.get(dt)
                    if at is None or fn is None:
                        return None
                    half |= dt == torch.float16
                    bf16_load |= dt == torch.bfloat16
                    value = f"{fn}({at}{count})"
                elif op.kind == "const":
                    if isinstance(op.args[0], Sym):
                        return None
                    value = f"{n['V']}({_literal(op.args[0], f32)})"
                elif op.kind == "rand":  # the tile's numbers (rand_tiles), contiguous in r
                    value = f"{n['ld']}(fj_u_{op.args[0]}_{op.args[1]} + (r - fj_ub){count})"
                elif op.kind == "concat":  # in a piece of the row: the operand it takes there
                    c = self.chosen(op)
                    value = None if c is None else operand(c)
                    if value is None:
                        return None
                elif op.kind == "round":
                    x = operand(op.args[0])
                    if x is None:
                        return None
                    half |= op.args[1] == torch.float16
                    bf16_work |= op.args[1] == torch.bfloat16
                    value = f"{n['round_h']}({x})" if op.args[1] == torch.float16 else f"{n['round_bf']}({x})"
                elif op.kind == "where":
                    xs = [operand(op.args[0], torch.bool), operand(op.args[1]), operand(op.args[2])]
                    if None in xs:
                        return None
                    value = f"{n['sel']}({xs[0]}, {xs[1]}, {xs[2]})"
                elif op.kind == "cast" and is_operand(op.args[0]) and k.ops[op.args[0]].dtype == torch.bool:
                    c = operand(op.args[0], torch.bool)
                    if c is None:
                        return None
                    value = f"({n['f']})({c} & ({n['i']}){n['V']}(1.0f))"
                elif op.kind in vector_ops:
                    xs = [operand(a) for a in op.args]
                    if None in xs:
                        return None
                    value = vector_ops[op.kind].format(*xs)
                else:
                    return None
                statements.append(f"const {n['f']} v{i} = {value};")
            for i in fills:
                at = kept_at(i)
                if k.ops[i].dtype != f32 or i not in inside or at is None:
                    return None
                statements.append(f"{n['st']}({at}, v{i}{count});")
            return statements

        statements = render(n, count, self.stream and not eight)
        if statements is None:
            return None
        if any(operand(src) is None or src not in inside
               for _, src, *_ in (*sums, *extrema, *flags)):
            return None
        # Where the loop converts fp16 values; or sums bf16 loads, neither rounding to bf16 nor
        # storing bf16 (a bf16 x - mean 1.2x faster, a layer norm 1.09x). gcc vectorizes fp32
        # loops itself, and bf16 ones that store or round as fast or faster: a bf16 RMSNorm ran
        # 1.3x slower in this form (gcc's loop takes two vectors a step and narrows them to one
        # store with vpermt2w, where a vector's vpmovdw store is slow), a residual + layer norm
        # 1.03x slower.
        # Not bf16 rows under 64, which keep their tiles (see row_loop): in this form a bf16
        # x - mean over rows of 24 ran 1.3x slower, its last 8 values in the plain loop.
        long = not isinstance(self.rnumel, int) or self.rnumel >= 64
        # A max or min over bf16 loads, over a row under 64 (gcc's loop converted a bf16 row of
        # 16 in two halves, stored them and read them back as one vector, a stall at each row:
        # a bf16 softmax over rows of 16 1.35x faster, a log-softmax 1.3x); not fp16 rows, nor
        # bf16 rows of 77 or 128, which ran 1.03-1.1x slower in this form.
        short_extrema = extrema and not half and isinstance(self.rnumel, int) and self.rnumel < 64
        wanted = half or bf16_load or bf16_work if eight else \
            (half and not extrema) or bf16_load and not bf16_work and (sums and long or short_extrema)
        # On AVX-512, a static row under 128 values that is no whole number of vectors, in any
        # dtype (bf16 under 96): gcc's loops over it end in a scalar loop, where this form's rest
        # is one masked vector (over 65536 rows of 77: an fp32 layer norm 1.8x faster, an RMSNorm
        # 1.65x, softmax 1.15x; over rows of 24 or 40 fp32 and bf16 norms and softmax 1.3-1.9x;
        # fp16 softmax 1.02-1.14x). Not longer rows, where gcc's loops were as fast or faster
        # (fp32 RMSNorm and x - mean over rows of 200 or 1000 1.1-1.2x; bf16 over rows of 100
        # 1.1x).
        ragged = isinstance(self.rnumel, int) and self.rnumel % 16 != 0 and self.rnumel < 128 \
            and (self.rnumel < 96 or not (bf16_load or bf16_work)) and not eight
        only_masked = ragged and not wanted
        # A loop that stores bf16 takes this form where the CPU has AVX512-BF16 (FJ_BF16_PAIRS:
        # two vectors a step, each store's pair rounded and narrowed by one vcvtne2ps2bf16, see
        # fj_vstbf2; elsewhere gcc's loop, as above). Over 4096 rows of 1024 at 1 thread: add
        # 1.31x faster, x - mean 1.25x, residual + layer norm 1.2x, layer norm 1.15x, softmax and
        # log-softmax 1.08-1.1x, RMSNorm 1.035x; over rows of 77 1.1-1.29x. Not loops that take
        # exp, sigmoid, GELU or random numbers: a SwiGLU ran 1.17x slower, a GELU-tanh 1.08x.
        pairs = bool(paired) and not eight and not any(
            k.ops[i].kind in ("exp", "sigmoid", "gelu", "rand") for i in body)
        if not (wanted or ragged or pairs) or not VECTOR_BODY:
            return None
        # The values past the last whole vector (a run-time row may have some)
        static = lo.isdigit() and hi.isdigit()
        rest = not static or (int(hi) - int(lo)) % 16 != 0
        masked = render(self._MASKED, ", fj_rm", False) if rest and not eight else None
        if only_masked and rest and masked is None:
            return None
        ind, inner = indent + "    ", indent + "        "
        w = n["width"]
        guard = n["if"] if wanted else "#ifdef FJ_VREST" if only_masked else "#ifdef FJ_BF16_PAIRS"
        lines = [guard, f"{indent}{{", f"{ind}int64_t fj_r = {lo};"]

        def accumulate(at: str, into: int, mask: str | None = None) -> list[str]:
            """The sums', maxima's and NaN flags' statements for a vector, at indent ``at``,
            sums into accumulator ``into``; only lanes in ``mask`` (a lane mask) where given."""
            keep = (lambda c: f"{mask} & ({c})") if mask else (lambda c: c)
            kept = (lambda v: f"fj_vsel({mask}, {v}, FJ_V(0.0f))") if mask else (lambda v: v)
            return [f"{at}fj_s{i}_{into} += {kept(f'v{src}')};" for i, src in sums] + [
                f"{at}fj_m{i} = fj_vsel({keep(f'v{src} {cmp} fj_m{i}')}, v{src}, fj_m{i});"
                for i, src, cmp in extrema] + [
                f"{at}fj_n{i} |= {keep(f'v{src} != v{src}')};" for i, src in flags]

        def step(unroll: int, into, pair: bool = False) -> None:
            """A loop of ``unroll`` vectors a step, their sums into accumulators ``into(u)``;
            ``pair``: each two vectors' bf16 stores as one fj_vstbf2 after the second (each
            vector's loads come before any of its stores, as before)."""
            lines.append(f"{ind}for (; fj_r + {unroll} * {w} <= {hi}; fj_r += {unroll} * {w}) {{")
            stores = {line: j for j, line in enumerate(paired)} if pair else {}
            for j in stores.values():
                lines.append(f"{inner}uint16_t *fj_bp{j};")
                lines.append(f"{inner}fj_vf fj_bv{j}_0, fj_bv{j}_1;")
            for u in range(unroll):
                lines.append(f"{inner}{{")
                lines.append(f"{inner}    const int64_t r = fj_r + {u} * {w};")
                lines.extend([f"{inner}    const int fj_n = 8;"] if eight else [])
                for line in statements:
                    if line not in stores:
                        lines.append(f"{inner}    {line}")
                        continue
                    j, (at, v) = stores[line], paired[line]
                    lines.extend([f"{inner}    fj_bp{j} = {at};"] if u % 2 == 0 else [])
                    lines.append(f"{inner}    fj_bv{j}_{u % 2} = {v};")
                lines.extend(accumulate(f"{inner}    ", into(u)))
                lines.append(f"{inner}}}")
                if u % 2:
                    lines.extend(f"{inner}fj_vstbf2(fj_bp{j}, fj_bv{j}_0, fj_bv{j}_1);"
                                 for j in stores.values())
            lines.append(f"{ind}}}")

        if sums:
            for i, _ in sums:
                lines.append(f"{ind}fj_vf fj_s{i}_0 = FJ_V(0.0f), fj_s{i}_1 = fj_s{i}_0, "
                             f"fj_s{i}_2 = fj_s{i}_0, fj_s{i}_3 = fj_s{i}_0;")
            if pairs:  # its bf16 stores paired where the CPU has AVX512-BF16
                lines.append("#ifdef FJ_BF16_PAIRS")
                step(4, lambda u: u, pair=True)
                lines.append("#else")
            step(4, lambda u: u)
            lines.extend(["#endif"] if pairs else [])
        # A max or min: one vector of lanes from a<i> (exact: any order gives it), its NaN flag
        # one of lanes, folded into a<i> and n<i> before the rest
        for i, _, _ in extrema:
            lines.append(f"{ind}fj_vf fj_m{i} = FJ_V(a{i});")
        for i, _ in flags:
            lines.append(f"{ind}fj_vi fj_n{i} = (fj_vi){{0}};")
        if pairs:  # (the same sums as two steps of one: both add into _0)
            lines.append("#ifdef FJ_BF16_PAIRS")
            step(2, lambda u: 0, pair=True)
            lines.append("#endif")
        step(1, lambda u: 0)
        def sum_folds(count: int, suffix: str) -> list[str]:
            """The sums' folds of accumulators _0.._<count - 1> (fj_lanes_sum<suffix>); two sums
            fold side by side in one vector (fj_lanes_sum2<suffix>: each one's adds, in order)."""
            accs = [", ".join(f"fj_s{i}_{a}" for a in range(count)) for i, _ in sums]
            out = []
            for k in range(0, len(sums), 2):
                i = sums[k][0]
                if k + 1 < len(sums):
                    out.append(f"{ind}{{ float fj_q; c{i} += fj_lanes_sum2{suffix}({accs[k]}, "
                               f"{accs[k + 1]}, &fj_q); c{sums[k + 1][0]} += fj_q; }}")
                else:
                    out.append(f"{ind}c{i} += fj_lanes_sum{suffix}({accs[k]});")
            return out

        folds = sum_folds(4, "")
        if sums and static and int(hi) - int(lo) < 4 * 16:
            # A static row under four vectors never reaches the last two accumulators: they are
            # left out of the fold (the same sums; 1.00-1.08x over rows of 16 to 40)
            folds = [f"#if {int(hi) - int(lo)} < 4 * FJ_VW", *sum_folds(2, "p"), "#else", *folds,
                     "#endif"]
        others = [f"{ind}a{i} = fj_lanes_{'max' if cmp == '>' else 'min'}(fj_m{i});"
                  for i, _, cmp in extrema]
        others += [f"{ind}n{i} |= fj_lanes_any(fj_n{i});" for i, _ in flags]
        # Eight rows interleaved (interleaved_rows): on AVX-512 each row leaves its sums' vector
        # of lanes in fj_q<i>[fj_k] and sets fj_d<i>, and the eight rows' lanes fold together
        # after the last (fj_fold_rows8: the same adds, of the same pairs), where the row's sum
        # (c<i>) goes only into the row's value kept for later steps (interleaved_rows checks
        # that, else turns this form off). Not where a plain rest of the row adds to the sum
        # after the fold.
        # Static rows under four vectors (over 131072 rows of 24, 1 thread: layer norm 1.16-1.29x
        # faster, RMSNorm 1.09-1.24x, x - mean 1.13-1.24x; rows of 77 and 128 gained nothing).
        deferred = folds
        if sums and self.interleaved and self.defer_sums and static and int(hi) - int(lo) < 4 * 16 \
                and DEFER_ROW_SUMS:
            deferred = [f"#if FJ_VW == 16 /* fj_defer {' '.join(str(i) for i, _ in sums)} */"]
            deferred += [f"{ind}fj_q{i}[fj_k] = fj_s{i}_0 + fj_s{i}_1;" for i, _ in sums]
            deferred += [f"{ind}fj_d{i} = 1;" for i, _ in sums]
            deferred += ["#else", *folds, "#endif"]
        folds = folds + others
        deferred = deferred + others
        if eight:  # a piece's last points: a vector of that many
            self.lines.extend(lines + folds)
            rest = (int(hi) - int(lo)) % 8
            if rest:
                self.lines.extend([f"{ind}{{", f"{inner}const int64_t r = fj_r;",
                                   f"{inner}const int fj_n = {rest};"])
                self.lines.extend(f"{inner}{line}" for line in statements)
                self.lines.append(f"{ind}}}")
            self.lines.append(f"{indent}}}")
            return lines[0]
        # The rest of the row, under a vector: on AVX-512 (FJ_VREST), one vector of masked loads
        # and stores, its summands, maxima and NaN flags taken in its first fj_rm lanes (a sum
        # adds into its second accumulator, as fj_sum_tile's last values do); else plain_rest.
        if masked is not None:
            if not only_masked:
                lines.append("#ifdef FJ_VREST")
            lines.append(f"{ind}{{" if static else f"{ind}if (fj_r < {hi}) {{")
            lines.append(f"{inner}const int64_t r = fj_r;")
            lines.append(f"{inner}const int fj_rm = (int)({hi} - fj_r);")
            lines.append(f"{inner}const fj_vi fj_in = FJ_LANE_IDS < fj_rm;")
            lines.extend(f"{inner}{line}" for line in masked)
            lines.extend(accumulate(inner, 1, "fj_in"))
            lines.append(f"{ind}}}")
            self.lines.extend(lines + deferred)
            if not only_masked:
                self.lines.append("#else")
                self.lines.extend(folds)
                self.plain_rest(pragma, body, lo, hi, ind, tail, fills, bool(sums), half)
                self.lines.append("#endif")
        else:
            self.lines.extend(lines + (folds if rest else deferred))
            if rest:
                self.plain_rest(pragma, body, lo, hi, ind, tail, fills, bool(sums), half)
        self.lines.append(f"{indent}}}")
        return lines[0]

    def plain_rest(self, pragma: str | None, body: list[int], lo: str, hi: str, indent: str,
                   tail: list[str], fills, sums: bool, half: bool) -> None:
        """:meth:`vector_body`'s rest of a row as the plain loop from ``fj_r`` to ``hi``, where
        the ISA has no masked 16-bit loads and stores (AVX2). It adds in order, without a simd
        reduction: gcc's vector form of it differs between a static kernel and a run-time one
        (another order of the adds). Its fp16 roundings and stores take F16C's scalar
        conversions where it rounds, or is at least 8 values of a static row: an fp16 RMSNorm
        over rows of 77 (13 values past the vectors) ran 2.6x faster, over rows of 100 (4) 1.5x,
        a log-softmax over rows of 77 1.13x; but a layer norm over rows of 100, whose rest only
        stores, 1.06x slower (gcc's integer form in four lanes)."""
        rounds = any(self.k.ops[i].kind == "round" and self.k.ops[i].args[1] == torch.float16
                     for i in body)
        long_rest = lo.isdigit() and hi.isdigit() and (int(hi) - int(lo)) % 16 >= 8
        self.per_row = half and (rounds or long_rest)
        try:
            self.plain_body(None if sums else pragma, body, "fj_r", hi, indent, tail, fills)
        finally:
            self.per_row = False

    def vector_tiled(self, body: list[int], bf16: bool = False) -> tuple[list[int], list[int], list[int]]:
        """What a vector tile computes for ``body``: its fp32 exp, sigmoid and fp16 rounding ops
        (at most :data:`MAX_TILED`; first those whose operand needs no other such op, then those
        whose operand needs only tiled ones; none in a loop that draws random numbers), its
        loads from fp16 buffers and its stores to fp16 buffers (an fp16 dropout+add 2.5x
        faster)."""
        k = self.k
        draws = any(k.ops[i].kind == "rand" for i in body)
        candidates = [i for i in body if _tile_function(k.ops[i]) and i not in self.avail
                      and k.ops[i].dtype == torch.float32 and not draws]
        # An op whose operand needs such ops only where they are tiled too takes a later step
        # of the tile (an fp16 SwiGLU's rounding of silu, whose operand takes exp: 2x faster
        # than the rounding's integer form in the loop).
        inside = {i: set(self.closure([k.ops[i].args[0]])) & set(candidates) for i in candidates}
        tiled = [i for i in candidates if not inside[i]][:MAX_TILED]
        for i in candidates:
            if len(tiled) < MAX_TILED and i not in tiled and inside[i] <= set(tiled):
                tiled.append(i)
        half = [i for i in body if k.ops[i].kind in ("load", "store") and i not in self.avail
                and i not in self.shared
                and k.buffer(k.ops[i].args[0]).dtype in (torch.float16, torch.bfloat16)]
        loads = [i for i in half if k.ops[i].kind == "load"
                 and (bf16 or k.buffer(k.ops[i].args[0]).dtype == torch.float16)]
        stores = [i for i in half if k.ops[i].kind == "store"
                  and k.buffer(k.ops[i].args[0]).dtype == torch.float16]
        if self.stream:
            stores += [i for i in body if k.ops[i].kind == "store" and i not in self.avail
                       and k.buffer(k.ops[i].args[0]).dtype == torch.float32
                       and self.contiguous_start(k.ops[i]) is not None]
        return tiled, loads[:MAX_TILED_HALF], stores[:MAX_TILED_HALF]

    def vector_tiles(self, tiles: tuple[list[int], list[int], list[int]], pragma: str | None,
                     tail: list[str], tile_sums: list[tuple[int, int]], roots: list[int],
                     fills, lo: str, hi: str, indent: str, sums: bool) -> None:
        """The loop of :meth:`row_loop` in tiles of points, each tile in steps:

        - each fp16 load (``loads``) converts its values to fp32 into ``f<i>`` (AVX-512's
          vcvtph2ps, ``fj_h2f_tile``), from its buffer where they are contiguous there, else
          from a copy in ``fj_hb``;
        - where the loop takes exp or sigmoid (``tiled``), a loop stores their operands into
          ``e<i>``, and ``fj_exp_tile`` (``fj_sigmoid_tile``) computes them in place: gcc's
          vector code for the scalar fj_expf takes 8 instructions to scale by 2^k with
          subnormal results, AVX-512's vscalefps one (softmax 1.2x faster);
        - the loop proper reads those arrays, and writes each value bound for an fp16 buffer
          (``stores``) to ``g<i>`` in fp32;
        - each fp16 store converts ``g<i>`` (vcvtps2ph, ``fj_f2h_tile``) and copies it to its
          buffer;
        - each fp32 sum (``tile_sums``) adds its tile's values, which the loop proper stored in
          ``s<i>`` (or an array above already holds), in four vector accumulators
          (``fj_sum_tile``): the loop's one accumulator made a sum wait on each add's latency
          (an fp16 ``x - x.mean(-1)`` 15% slower).

        A value the loop keeps in a row buffer (``b<i>``) is computed there instead of in
        ``e<i>``/``f<i>``. Without AVX512-FP16, gcc makes each fp16 conversion in a loop
        scalar-only code or a long integer sequence: an fp16 add ran at a quarter of
        Inductor's speed. Every step
        but the sums computes the same bits as the plain loop (the sums add in another order).
        A loop that sums takes a tile per chunk of the sum (:data:`VEC_TILE`); others take
        :data:`STORE_TILE` points."""
        k = self.k
        tiled, loads, stores = tiles
        ind = indent + "    "
        inner = ind + "    "
        # A softmax's exp(x - max) takes the next row's max too (see row_ahead).
        ahead = self.ahead[2] if self.ahead and self.ahead[2] in tiled else None
        if ahead is not None:
            # Not where the launch passed the input as an output too (a donated input): the
            # next row could be another thread's, being written.
            src = k.buffer(k.ops[self.ahead[1]].args[0])
            apart = "".join(f" && (const void *){src.name} != (const void *){o.name}"
                            for o in k.outputs if k.may_share_memory(src, o))
            self.lines.append(f"{indent}const int fj_ahead = x + 1 < {self.xnumel}{apart};")
            self.lines.append(f"{indent}fj_nm = (-INFINITY);")
            self.lines.append(f"{indent}fj_nn = 0;")
        # A static row shorter than a tile is one tile of its length.
        size = VEC_TILE if sums else STORE_TILE
        tile = min(size, max(self.rnumel, 1)) if isinstance(self.rnumel, int) else size

        def one_tile() -> None:
            """The steps of one tile (``fj_v`` and ``fj_ve`` defined)."""
            # A value kept in a row buffer for later loops is computed (converted) straight into
            # it: a copy loop from the tile's array, which gcc makes a memcpy call (rep movsb),
            # cost a 1024-float softmax row 200 cycles.
            kept = [i for i in tiled + loads if i in fills and i not in self.scratch]
            # Where each tiled value's tile starts, and its element at r.
            begins = {i: f"{self.row_buffer(i)} + fj_v" if i in kept else f"e{i}" for i in tiled}
            begins.update({i: f"{self.row_buffer(i)} + fj_v" if i in kept else f"f{i}" for i in loads})
            at = {i: self.kept(i) if i in kept else f"{begins[i]}[r - fj_v]" for i in begins}
            # A sum over a value the loop keeps in a row buffer adds from there.
            rowbuf = {i: f"{self.row_buffer(i)} + fj_v" for i in fills if i not in self.scratch}
            summed = {i: begins.get(src, rowbuf.get(src, f"s{i}")) for i, src in tile_sums}
            # A sum of an fp16 load's squares adds them as the load is converted (an RMSNorm's
            # sum; fj_h2f_sum_tile_squares: the same products added in the same order as the
            # loop storing them for fj_sum_tile, which took 1.6x the time).
            squares = {}
            for i, src in tile_sums:
                op = k.ops[src]
                if (SQUARE_SUMS and op.kind == "mul" and op.args[0] == op.args[1] and op.args[0] in loads
                        and op.dtype == torch.float32 and summed[i] == f"s{i}"
                        and op.args[0] not in squares):
                    squares[op.args[0]] = i
                    summed[i] = None
            # A sum of a value's squares beside the sum of the value (a layer norm's corrected
            # variance): both from the value's array in one pass (fj_sum_sq_tile), the squares
            # not stored.
            paired: dict[int, int] = {}
            for j, src in tile_sums:
                op = k.ops[src]
                if (j in paired or summed[j] != f"s{j}" or op.kind != "mul"
                        or op.args[0] != op.args[1] or op.dtype != torch.float32):
                    continue
                i = next((i for i, s in tile_sums if s == op.args[0] and s not in tiled
                          and s not in loads and summed[i] is not None
                          and i not in paired and i not in paired.values()), None)
                if i is not None:
                    paired[i] = j
                    summed[j] = None
            arrays = ([f"e{i}" for i in tiled if i not in kept]
                      + [f"f{i}" for i in loads if i not in kept]
                      + [f"g{i}" for i in stores]
                      + [f"s{i}" for i, src in tile_sums if summed[i] == f"s{i}"])
            for name in arrays:
                self.lines.append(f"{ind}float {name}[{tile}] __attribute__((aligned(64)));")
            if any(self.contiguous_start(k.ops[i]) is None for i in loads + stores):
                self.lines.append(f"{ind}uint16_t fj_hb[{tile}] __attribute__((aligned(64)));")
            read = {i: at[i] for i in loads}
            # A sum of an fp16 load adds its values as they are converted (fj_h2f_sum_tile).
            summing = {}
            for i, src in tile_sums:
                if src in loads and summed[i] == begins[src] and src not in squares:
                    summing.setdefault(src, i)
            for i in loads:
                start = self.contiguous_start(k.ops[i])
                if start is None:
                    self.simd_copy(f"fj_hb[r - fj_v] = {self.load_ref(k.ops[i])};", ind)
                    start = "fj_hb"
                h2f = "fj_h2f" if k.buffer(k.ops[i].args[0]).dtype == torch.float16 else "fj_bf2f"
                if i in summing:
                    self.lines.append(f"{ind}c{summing[i]} += {h2f}_sum_tile({start}, {begins[i]}, "
                                      f"fj_ve - fj_v);")
                elif i in squares:
                    self.lines.append(f"{ind}c{squares[i]} += {h2f}_sum_tile_squares({start}, "
                                      f"{begins[i]}, fj_ve - fj_v);")
                else:
                    self.lines.append(f"{ind}{h2f}_tile({start}, {begins[i]}, fj_ve - fj_v);")
            exp_sum = None  # the sum of the exps, which fj_exp_sub_tile also takes
            if ahead is not None:
                top, src, _, step = self.ahead
                here = f"{k.ops[src].args[0]} + xo_{k.ops[src].args[0]} + fj_v"
                exp_sum = next((i for i, s in tile_sums if s == ahead and summed[i] == begins[ahead]),
                               None)
                into = "(void)" if exp_sum is None else f"c{exp_sum} += "
                # Without a next row, the max of this one (unused): one loop, no test in it (a
                # loop testing for a next row ran 1.2x slower), one copy to compile.
                self.lines.append(f"{ind}{into}fj_exp_sub_tile({here}, t{top}, {begins[ahead]}, "
                                  f"fj_ve - fj_v,")
                self.lines.append(f"{ind}    fj_ahead ? {here} + {step} : {here}, &fj_nm, &fj_nn);")
                read[ahead] = at[ahead]
            fused_sums = set()
            # Each step takes the tiled ops whose operands need only earlier steps' ones.
            left, stepped = [i for i in tiled if i != ahead], set()
            while left:
                others = [i for i in left
                          if not set(self.closure([k.ops[i].args[0]])) & set(left)]
                left = [i for i in left if i not in others]
                self.lines.append(f"{ind}#pragma omp simd")
                self.lines.append(f"{ind}for (int64_t r = fj_v; r < fj_ve; r++) {{")
                self.define_dims(self.rdims, "r", "r", inner)
                self.emit_reading(self.closure([k.ops[i].args[0] for i in others],
                                               self.avail | stepped), read, inner)
                stepped.update(others)
                for i in others:
                    self.lines.append(f"{inner}{at[i]} = t{k.ops[i].args[0]};")
                self.lines.append(f"{ind}}}")
                for i in others:
                    # exp's (fp16 rounding's) values summed as they are: one pass.
                    function = _tile_function(k.ops[i])
                    fused = next((j for j, src in tile_sums if src == i and summed[j] == begins[i]
                                  and j not in summing.values()), None) \
                        if function in _TILE_SUM_FUNCTIONS else None
                    if fused is not None:
                        self.lines.append(f"{ind}c{fused} += {_TILE_SUM_FUNCTIONS[function]}("
                                          f"{begins[i]}, fj_ve - fj_v);")
                        fused_sums.add(fused)
                    else:
                        self.lines.append(f"{ind}{function}({begins[i]}, fj_ve - fj_v);")
                    read[i] = at[i]
            rest = self.closure(roots, self.avail | set(tiled))
            # The loop proper, unless the steps above left it nothing to do (a mean's loop whose
            # values fj_h2f_sum_tile converts into their row buffer and adds).
            if (any(k.ops[i].kind == "store" for i in rest) or tail
                    or any(summed[i] == f"s{i}" for i, _ in tile_sums)
                    or any(i not in kept for i in fills)):
                if pragma:
                    self.lines.append(f"{ind}{pragma}")
                self.lines.append(f"{ind}for (int64_t r = fj_v; r < fj_ve; r++) {{")
                self.define_dims(self.rdims, "r", "r", inner)
                for i in rest:
                    if i in stores:
                        self.lines.append(f"{inner}g{i}[r - fj_v] = (float)t{k.ops[i].args[1]};")
                    else:
                        self.emit_reading([i], read, inner)
                for i, src in tile_sums:
                    if summed[i] == f"s{i}":
                        self.lines.append(f"{inner}s{i}[r - fj_v] = t{src};")
                self.lines.extend(f"{inner}{self.kept(i)} = t{i};" for i in fills if i not in kept)
                self.lines.extend(f"{inner}{line}" for line in tail)
                self.lines.append(f"{ind}}}")
            for i, _ in tile_sums:
                if i in paired:
                    self.lines.append(f"{ind}{{ float fj_q; c{i} += fj_sum_sq_tile({summed[i]}, "
                                      f"fj_ve - fj_v, &fj_q); c{paired[i]} += fj_q; }}")
                elif (i not in summing.values() and i != exp_sum and i not in fused_sums
                        and i not in squares.values() and i not in paired.values()):
                    self.lines.append(f"{ind}c{i} += fj_sum_tile({summed[i]}, fj_ve - fj_v);")
            for i in stores:
                name = k.ops[i].args[0]
                start = self.contiguous_start(k.ops[i])
                if k.buffer(name).dtype == torch.float32:
                    self.lines.append(f"{ind}fj_stream_tile(g{i}, {start}, fj_ve - fj_v);")
                    continue
                convert = "fj_f2h_stream_tile" if self.stream and start else "fj_f2h_tile"
                self.lines.append(f"{ind}{convert}(g{i}, {start or 'fj_hb'}, fj_ve - fj_v);")
                if start is None:
                    self.simd_copy(f"{name}[{self.offset(name, k.ops[i].level)}] = fj_hb[r - fj_v];", ind)

        # A loop that only converts fp16 loads and stores (no exp or sigmoid tile) and stores
        # and reduces nothing takes tiles of REG_TILE points: gcc keeps such a tile's arrays in
        # registers and makes its steps one pass (an fp16 add: vcvtph2ps, vcvtph2ps, vaddps,
        # vcvtps2ph; 1.4x faster), the rest of the row one shorter tile. Not with exp or
        # sigmoid: a bf16 SwiGLU ran 1.3x slower in them than in STORE_TILE tiles (4x in tiles
        # of 16 points, which its 16-bit loads made gcc leave scalar).
        register = (not tiled and not sums and not tail and not tile_sums
                    and "reduction" not in (pragma or "") and tile >= REG_TILE)
        if register:
            tile = REG_TILE
            self.lines.append(f"{indent}{{")
            self.lines.append(f"{ind}int64_t fj_v = {lo};")
            heads = [(f"for (; fj_v + {tile} <= {hi}; fj_v += {tile}) {{", f"fj_v + {tile}")]
            whole = isinstance(self.rnumel, int) and self.rnumel % tile == 0
            if not (whole and lo == "0" and hi == str(self.rnumel)):
                heads.append((f"if (fj_v < {hi}) {{", hi))
            ind, inner, outer = ind + "    ", inner + "    ", ind
        else:
            heads = [(f"for (int64_t fj_v = {lo}; fj_v < {hi}; fj_v += {tile}) {{",
                      f"FJ_MIN(fj_v + {tile}, {hi})")]
            outer = indent
        for head, end in heads:
            self.lines.append(f"{outer}{head}")
            self.lines.append(f"{ind}const int64_t fj_ve = {end};")
            one_tile()
            self.lines.append(f"{outer}}}")
        if register:
            self.lines.append(f"{indent}}}")
        if ahead is not None:
            self.lines.append(f"{indent}fj_nx = fj_ahead ? x + 1 : -1;")

    def contiguous_start(self, op: Op) -> str | None:
        """Where a load's or store's elements for the current tile start in its buffer, when
        they are contiguous there (else None)."""
        if op.kind == "load" and spans_of(op):
            return None
        return self.contiguous_at(op.args[0], op.level, "fj_v")

    def contiguous_at(self, name: str, level: str, at: str) -> str | None:
        """The address of buffer ``name``'s element at point ``at`` of the row, where the row's
        elements are contiguous there (else None)."""
        if self.offset(name, level) != f"xo_{name} + r":
            return None
        return f"{name} + xo_{name} + {at}"

    def simd_copy(self, statement: str, indent: str) -> None:
        """A vector loop over the current tile's points running ``statement``."""
        self.lines.append(f"{indent}#pragma omp simd")
        self.lines.append(f"{indent}for (int64_t r = fj_v; r < fj_ve; r++) {{")
        self.define_dims(self.rdims, "r", "r", indent + "    ")
        self.lines.append(f"{indent}    {statement}")
        self.lines.append(f"{indent}}}")

    def emit_reading(self, indices, read: dict[int, str], indent: str) -> None:
        """:meth:`emit`, but the ops in ``read`` take their value from there."""
        for i in indices:
            if i in read:
                self.lines.append(f"{indent}const {local_type(self.k.ops[i].dtype)} t{i} = {read[i]};")
            else:
                self.emit([i], indent)

    def rand_tiles(self, body: list[int], lo: str, hi: str, indent: str) -> tuple[str, str, str, bool]:
        """Opens a loop over tiles of :data:`RAND_TILE` points of [lo, hi) when ``body`` draws
        random numbers: each tile first fills ``fj_u_<seed>`` with its points' numbers (four per
        Philox block, the block in vector registers; see fj_rand_fill), then the loop over the
        tile reads them at ``r - fj_ub``. Returns (lo, hi, indent) for that loop and whether a
        tile loop was opened (the caller closes it at ``indent``). The numbers depend only on
        the point's index in the box, not on the tiles, parts or threads."""
        draws = sorted({self.k.ops[i].args for i in body
                        if self.k.ops[i].kind == "rand" and i not in self.avail})
        if not draws:
            return lo, hi, indent, False
        ind = indent + "    "
        point = f"x * {self.rnumel}"
        self.lines.append(f"{indent}for (int64_t fj_t = {lo}; fj_t < {hi}; fj_t += {RAND_TILE}) {{")
        self.lines.append(f"{ind}const int64_t fj_te = FJ_MIN(fj_t + {RAND_TILE}, {hi});")
        # The buffer starts at the tile's first point rounded down to a block of four.
        self.lines.append(f"{ind}const int64_t fj_ub = fj_t - (({point} + fj_t) & 3);")
        for seed, stream in draws:
            # Stream s keys Philox with seed + s * 2^32 (the seed is below 2^31).
            key = f"{seed}_seed" if not stream else f"(int64_t)((uint64_t){seed}_seed + ((uint64_t){stream} << 32))"
            self.lines.append(f"{ind}float fj_u_{seed}_{stream}[{RAND_TILE + 8}] __attribute__((aligned(64)));")
            self.lines.append(f"{ind}fj_rand_fill({key}, {point} + fj_t, {point} + fj_te, fj_u_{seed}_{stream});")
        return "fj_t", "fj_te", ind, True

    def row(self, indent: str, plan, steps) -> None:
        """Everything one row ``x`` computes (``plan`` and ``steps``: :meth:`row_steps`)."""
        self.declare_row_buffers(plan, indent)
        for step in steps:
            step(indent)

    def row_steps(self, split: bool | str) -> tuple[list[tuple[set[int], list[int]]], list]:
        """The row buffers' plan and the steps of one row, in order, each a function that emits
        its code at an indent: per reduction group, the per-row (OUTER) values its loop needs
        and the loop; then the per-row values left and the loop that stores the outputs. Values
        that round take a step of their own (:meth:`own_loop`)."""
        k = self.k
        done: set[int] = set()
        groups = self.reduce_groups()
        stores = [j for j, op in enumerate(k.ops) if op.kind == "store" and op.level == FULL]
        loops = [[k.ops[i].args[1] for i in group] for group in groups] + ([stores] if stores else [])
        plan = self.plan_row_buffers(loops, split)
        steps = []
        for group, (avail, fill) in zip(groups, plan):
            first = group[0]
            ready = [j for j in range(first) if j not in done and k.ops[j].level == OUTER
                     and k.ops[j].kind != "reduce"]
            done.update(ready)
            done.update(group)
            if self.own_loop(ready):
                steps.append(functools.partial(self.per_row_step, ready))
                ready = []
            steps.append(functools.partial(self.reduce_step, ready, group, avail, fill, split))
        rest = [j for j, op in enumerate(k.ops) if j not in done and op.level == OUTER]
        if self.own_loop(rest):
            steps.append(functools.partial(self.per_row_step, rest))
            rest = []
        steps.append(functools.partial(self.last_step, rest, stores, plan[-1] if stores else None,
                                       split))
        return plan, steps

    def own_loop(self, ops: list[int]) -> bool:
        """Whether a row's (OUTER) values ``ops`` take a step of their own
        (:meth:`per_row_step`): where they round to fp16 or bf16, as eager's RMSNorm rounds its
        mean, the mean plus eps and rsqrt. In :meth:`interleaved_rows` that step is a loop over
        the step's rows alone, so that the rows' chains of roundings, sqrt and division overlap
        in the processor: a bf16 RMSNorm over rows of 16 ran 1.2x faster, over rows of 128
        1.2x, fp16 1.1x and 1.25x. So do values that take sqrt or rsqrt over rows of at most
        :data:`TILED_SUM_ROW` (an fp32 layer norm over rows of 16 1.1x faster, an RMSNorm
        1.15x, as eight rows' vector code). Other rows' values stay in the step that reads them
        (their own loop made an fp32 layer norm over rows of 128 1.15x slower)."""
        short = isinstance(self.rnumel, int) and self.rnumel <= TILED_SUM_ROW
        return any(self.k.ops[i].kind == "round" or short and self.k.ops[i].kind in ("sqrt", "rsqrt")
                   for i in ops)

    def per_row_step(self, ops: list[int], indent: str) -> None:
        if self.interleaved:
            self.step_ops = ops  # (interleaved_rows may take them as vector code: rows_as_vector)
        self.emit_per_row(ops, indent)

    _ROWS_AS_VECTOR = {"add": "+", "sub": "-", "mul": "*", "truediv": "/"}

    def rows_as_vector(self, ops: list[int], reads: set[int], writes: set[int],
                       indent: str) -> list[str] | None:
        """A per-row step (:meth:`per_row_step`) for eight rows at once, as vector code over
        their arrays ``fj_c<i>``: the lines, or None where an op is not one it takes (fp32
        arithmetic, sqrt, rsqrt, reciprocal, fp16/bf16 rounding; the scalar forms' bits, as
        fj_v8f's functions say). gcc does not vectorize the loop itself: sqrtf may set errno. A
        bf16 RMSNorm over rows of 16 rounds its mean, the mean plus eps and rsqrt: eight rows'
        chains of them took as long as the rest of the rows' work."""
        k = self.k
        f32 = torch.float32
        if any(k.ops[i].dtype != f32 for i in (*reads, *writes)):
            return None
        lines = []
        for i in sorted(reads):
            lines.append(f"{indent}fj_v8f w{i};")
            lines.append(f"{indent}memcpy(&w{i}, fj_c{i}, sizeof w{i});")
        inside = set(reads)
        for i in ops:
            op = k.ops[i]
            if op.dtype != f32:
                return None
            xs = [f"w{a}" if is_operand(a) and a in inside else None for a in op.args]
            if op.kind == "const":
                if isinstance(op.args[0], Sym):
                    return None
                value = f"FJ_V8({_literal(op.args[0], f32)})"
            elif op.kind in self._ROWS_AS_VECTOR and None not in xs:
                value = f"({xs[0]} {self._ROWS_AS_VECTOR[op.kind]} {xs[1]})"
            elif xs and xs[0] is not None and op.kind in ("neg", "sqrt", "rsqrt", "reciprocal", "round"):
                x = xs[0]
                if op.kind == "round":
                    value = f"fj_round_h8({x})" if op.args[1] == torch.float16 else f"fj_round_bf8({x})"
                else:
                    value = {"neg": f"(-{x})", "sqrt": f"fj_sqrt8({x})",
                             "rsqrt": f"(FJ_V8(1.0f) / fj_sqrt8({x}))",
                             "reciprocal": f"(FJ_V8(1.0f) / {x})"}[op.kind]
            else:
                return None
            lines.append(f"{indent}const fj_v8f w{i} = {value};")
            inside.add(i)
        if not writes <= inside:
            return None
        lines.extend(f"{indent}memcpy(fj_c{i}, &w{i}, sizeof w{i});" for i in sorted(writes))
        return lines

    def reduce_step(self, ready: list[int], group: list[int], avail: set[int], fill: list[int],
                    split: bool | str, indent: str) -> None:
        self.emit_per_row(ready, indent)
        self.avail, self.fill = avail, fill
        self.reduce_group(group, indent, split)
        self.avail, self.fill = set(), []

    def last_step(self, rest: list[int], stores: list[int], buffers, split: bool | str,
                  indent: str) -> None:
        self.emit_per_row(rest, indent)
        if stores:
            self.avail, self.fill = buffers
            self.store_loop(stores, indent, split)
            self.avail, self.fill = set(), []

    def row_inputs(self) -> list:
        """The kernel's inputs read along the row (a stride in a row dimension)."""
        return [b for b in self.k.inputs if any(b.strides[d] != 0 for d in self.rdims)]

    def rows_at_once(self, plan) -> int:
        """How many rows :meth:`interleaved_rows` takes a step at once (rows not cut in parts;
        ``plan``: their row buffers): 1 (one row after the other) unless the rows are short
        reductions, each a chain of dependent steps (a layer norm: sum, mean, the variance's
        sum, rsqrt) whose latency bounds the row."""
        k = self.k
        if (self.ahead is not None or not k.is_reduction
                or not isinstance(self.rnumel, int) or self.rnumel <= 0
                or (isinstance(self.xnumel, int) and self.xnumel < 2)):
            return 1
        # What a row reads and keeps: a step of rows that stays in L1 (more rows made fp32
        # layer norms over rows of 1024 and fp32 rows that keep a row buffer slower).
        row_bytes = sum(self.rnumel * b.dtype.itemsize for b in self.row_inputs())
        buffers = [i for _, fill in plan for i in fill if i not in self.scratch]
        row_bytes += 4 * self.rnumel * len(buffers)
        # Two row buffers or more (an fp16 layer norm keeps its converted row and the centred
        # values) take twice the bytes: at 4 KiB an fp16 layer norm over rows of 128 took 2 or
        # 3 rows and ran 1.2x slower than one at a time; at 8 KiB it takes 6 and runs 1.3x
        # faster (rows of 256: 3 rows, 1.5x; of 24: 8 rows, 1.7x).
        budget = INTERLEAVE_BYTES * (2 if len(buffers) > 1 else 1)
        return max(1, min(INTERLEAVE_ROWS, budget // max(row_bytes, 1)))

    def interleaved_rows(self, indent: str, lo: str, hi: str, step: int, plan, steps) -> None:
        """Rows ``x`` in [lo, hi), ``step`` rows at a time, each step of a row (see
        :meth:`row_steps`) taken for those rows in turn before the next step: the rows' chains
        of dependent operations overlap in the processor instead of running one after the
        other. The same operations on the same values as row by row (the same bits). A per-row
        value that a later step reads is kept for each of the rows in an array ``fj_c<i>``.
        ``plan`` and ``steps``: :meth:`row_steps`."""
        inner, body = indent + "    ", indent + "        "
        texts, step_ops = [], []
        self.interleaved, self.defer_sums = True, step == 8
        for emit_step in steps:
            outer, self.lines = self.lines, []
            self.hoisted = set()  # each step defines the invariants it reads
            self.step_ops = None
            emit_step(body)
            texts.append(self.lines)
            step_ops.append(self.step_ops)
            self.lines = outer
        self.interleaved = self.defer_sums = False
        defined = [{int(m) for line in text for m in _DEFINED.findall(line)} for text in texts]
        read = [{int(m) for line in text for m in _NAMED.findall(line)} - d
                for text, d in zip(texts, defined)]
        kept = sorted(set().union(*read))
        deferred = [self.deferred_sums(text, defined[j] & set().union(*read[j + 1:]))
                    for j, text in enumerate(texts)]
        self.lines.append(f"{indent}for (int64_t fj_x = {lo}; fj_x < {hi}; fj_x += {step}) {{")
        whole = lo == "0" and isinstance(self.xnumel, int) and hi == str(self.xnumel) \
            and self.xnumel % step == 0
        count = str(step) if whole else f"FJ_MIN({step}, {hi} - fj_x)"
        for i in kept:
            self.lines.append(f"{inner}{local_type(self.k.ops[i].dtype)} fj_c{i}[{step}];")
        for i in (i for d in deferred for i in d):  # (the last rows' step may have fewer: zeros)
            self.lines.extend(["#if FJ_VW == 16", f"{inner}fj_vf fj_q{i}[8]{'' if whole else ' = {{0}}'};",
                               "#endif", f"{inner}int fj_d{i} = 0;"])
        self.declare_row_buffers(plan, inner, step)
        for j, text in enumerate(texts):
            later = set().union(*read[j + 1:])
            vector = None
            if step_ops[j] is not None and step == 8:
                vector = self.rows_as_vector(step_ops[j], read[j], defined[j] & later, body)
            if vector is not None:  # eight rows at once, else (the last rows) the loop
                self.lines.append("#ifdef FJ_ROWS8")
                self.lines.append(f"{inner}if ({count} == 8) {{")
                self.lines.extend(vector)
                self.lines.append(f"{inner}}} else")
                self.lines.append("#endif")
            self.lines.append(f"{inner}for (int64_t fj_k = 0; fj_k < {count}; fj_k++) {{")
            self.lines.append(f"{body}const int64_t x = fj_x + fj_k;")
            self.row_offsets(body)
            self.lines.extend(f"{body}const {local_type(self.k.ops[i].dtype)} t{i} = fj_c{i}[fj_k];"
                              for i in sorted(read[j]))
            self.lines.extend(text)
            self.lines.extend(f"{body}fj_c{i}[fj_k] = t{i};" for i in sorted(defined[j] & later))
            self.lines.append(f"{inner}}}")
            if deferred[j]:
                self.lines.append("#if FJ_VW == 16")
                self.lines.extend(f"{inner}if (fj_d{i}) fj_fold_rows8(fj_q{i}, fj_c{i}, {count});"
                                  for i in deferred[j])
                self.lines.append("#endif")
        self.lines.append(f"{indent}}}")

    @staticmethod
    def deferred_sums(text: list[str], kept: set[int]) -> list[int]:
        """The sums whose folds ``text`` (a step of interleaved rows) defers (vector_body's
        ``fj_defer`` forms), where each such sum's only use is the row's value kept for later
        steps (``const float t<i> = (float)a<i>;``, t<i> in ``kept``, a<i> = 0 + c<i>): that value
        is then 0 + the fold. A form with any other sum is turned off in ``text`` (``#if 0``)."""
        joined, stripped = "\n".join(text), [line.strip() for line in text]

        def only_kept(i: int) -> bool:
            if i not in kept or len(re.findall(rf"\bt{i}\b", joined)) != 1:
                return False
            if f"const float t{i} = (float)a{i};" not in stripped \
                    or stripped.count(f"a{i} += c{i};") != 1:
                return False
            adds = re.compile(rf"\bc{i} \+=|reduction\(\+:[^)]*\)")
            return all(not re.search(rf"\bc{i}\b", adds.sub("", line))
                       or line in (f"a{i} += c{i};", f"float c{i} = 0;") for line in stripped)

        accepted = []
        for n, line in enumerate(text):
            m = re.fullmatch(r"#if FJ_VW == 16 /\* fj_defer ([\d ]+) \*/", line)
            if m is None:
                continue
            ids = [int(i) for i in m.group(1).split()]
            if all(only_kept(i) for i in ids):
                accepted += ids
            else:
                text[n] = line.replace("#if FJ_VW == 16", "#if 0")
        return accepted

    # -- reductions across a block of outputs ----------------------------------------------
    def block_dim(self) -> int | None:
        """The outer dimension to run a short reduction across, or None.

        A row strided in memory (an outer reduction such as ``x.sum(0)``) or contiguous only in
        runs of a few elements (max-pool's 2x2 windows) makes a poor vector loop along the row.
        Instead each step of the row updates a block of neighbouring outputs at once, their
        accumulators in arrays, which vectorizes along a dimension where every
        output is contiguous. Only for one group of reductions feeding nothing but per-row
        values (no FULL stores, no random numbers)."""
        k = self.k
        if not k.is_reduction or not self.xdims or len(self.reduce_groups()) != 1 or k.span_dims:
            return None
        if any(op.kind == "rand" or (op.kind == "store" and op.level == FULL) for op in k.ops):
            return None
        group = self.reduce_groups()[0]
        body = k.full_closure([k.ops[i].args[1] for i in group])
        for i in body:  # the row's values must not need a per-row value
            op = k.ops[i]
            if op.kind not in ("load", "const") and any(
                    is_operand(a) and k.ops[a].level != FULL for a in op.args):
                return None
        outputs = [b for b in k.buffers if b.is_output]
        dims = [d for d in self.xdims if all(b.strides[d] == 1 for b in outputs)]
        if not dims or (isinstance(self.sizes[dims[-1]], int) and self.sizes[dims[-1]] < 4):
            return None
        loads = [k.buffer(k.ops[i].args[0]) for i in body if k.ops[i].kind == "load"]
        if any(b.strides[d] == 1 and not (isinstance(self.sizes[d], int) and self.sizes[d] <= SHORT_RUN)
               for b in loads for d in self.rdims):
            return None  # a row contiguous in memory: the row loop vectorizes (5x faster at 64)
        return dims[-1]

    def block_width(self) -> int:
        """Outputs per block along :attr:`block`: :data:`BLOCK` for a run-time size, else see
        :data:`MAX_BLOCK`."""
        ni = self.sizes[self.block]
        if not isinstance(ni, int):
            return BLOCK
        if ni <= MAX_BLOCK:
            return ni
        return next((w for w in BLOCK_WIDTHS if ni % w == 0), BLOCK)

    def blocks_per_row(self) -> str:
        """C text of the number of blocks along :attr:`block`."""
        ni, width = self.sizes[self.block], self.block_width()
        return str(-(-ni // width)) if isinstance(ni, int) else f"(({ni} + {width - 1}) / {width})"

    def block_count(self) -> tuple[str, Expr]:
        """(C text of the number of blocks, the number of outputs per block dimension)."""
        ni = self.sizes[self.block]
        rest = product([self.sizes[d] for d in self.xdims if d != self.block])
        per = self.blocks_per_row()
        return (per if rest == 1 else f"{rest} * {per}"), ni

    def acc_init(self, i: int) -> str:
        kind, src = self.k.ops[i].args
        sdt = self.k.ops[src].dtype
        if kind == "sum":
            return "0"
        big = "max" in kind
        if sdt.is_floating_point:
            return "(-INFINITY)" if big else "INFINITY"
        if sdt == torch.bool:
            return "0" if big else "1"
        info = torch.iinfo(sdt)
        return _literal(info.min if big else info.max, sdt)

    def block_rows(self, indent: str, lo: str, hi: str) -> None:
        """Blocks [lo, hi) of :meth:`block_width` outputs along :attr:`block` (``fj_nb`` of them,
        defined by the caller), each reduced with the row as the outer loop and the block as
        the inner (vector) loop."""
        k = self.k
        (group,) = self.reduce_groups()
        _, ni = self.block_count()
        d = self.block
        others = [x for x in self.xdims if x != d]
        body = k.full_closure([k.ops[i].args[1] for i in group])
        arg = [i for i in group if k.ops[i].args[0] in ("argmax", "argmin")]
        ind = indent + "    "
        self.lines.append(f"{indent}for (int64_t b = {lo}; b < {hi}; b++) {{")
        per, width = self.blocks_per_row(), self.block_width()
        if per == "1":
            self.lines.append(f"{ind}const int64_t xq = b, j0 = 0;")
        else:
            self.lines.append(f"{ind}const int64_t xq = b / {per}, j0 = b % {per} * {width};")
        constant = isinstance(ni, int) and ni % width == 0  # every block is full
        if constant:
            self.lines.append(f"{ind}const int64_t jn = {width};")
        else:
            self.lines.append(f"{ind}const int64_t jn = FJ_MIN({width}, {ni} - j0);")
        self.define_dims(others, "xq", "x", ind)
        for b in k.buffers:
            part = self._part(others, "xq", "x", b.strides) if others else ""
            step = b.strides[d]
            base = [p for p in (part, "" if step == 0 else ("j0" if step == 1 else f"j0 * {step}"))
                    if p]
            self.lines.append(f"{ind}const int64_t xb_{b.name} = {' + '.join(base) or '0'};")

        def block_offsets(at: str) -> None:
            for b in k.buffers:
                step = b.strides[d]
                j = "" if step == 0 else (" + j" if step == 1 else f" + j * {step}")
                self.lines.append(f"{at}const int64_t xo_{b.name} = xb_{b.name}{j};")

        # Sums add in their accumulator type: fp64 for floats (more precise than the fp32
        # chunks of the row loop, which have vector lanes to cut the drift; this order has none).
        acc_type = self.acc_type
        # A float max/min over a block of constant width keeps "some NaN seen" in flags of its
        # own: the update is then a plain compare-and-select (vmaxps) that gcc keeps in
        # registers, 2.3x faster for max-pool than one select on (v > a || v != v). Narrower
        # blocks and run-time widths keep that one select: there gcc 12 did not vectorize the
        # flag form at all (13x slower at a width of 16).
        nan_flags = {i for i in group if k.ops[i].args[0] in ("max", "min")
                     and acc_type(i) in ("float", "double") and constant and width >= NAN_FLAGS_WIDTH}
        for i in group:
            self.lines.append(f"{ind}{acc_type(i)} A{i}[{width}];")
            if i in arg:
                self.lines.append(f"{ind}int64_t I{i}[{width}];")
            if i in nan_flags:
                self.lines.append(f"{ind}int N{i}[{width}];")
        self.lines.append(f"{ind}for (int j = 0; j < {width}; j++) {{")
        for i in group:
            self.lines.append(f"{ind}    A{i}[j] = {self.acc_init(i)};")
            if i in arg:
                self.lines.append(f"{ind}    I{i}[j] = 0;")
            if i in nan_flags:
                self.lines.append(f"{ind}    N{i}[j] = 0;")
        self.lines.append(f"{ind}}}")
        # A short static row is unrolled inside the block loop: its loads then sit at constant
        # distances (max-pool's 2x2 window: +0, +1, +64, +65), which gcc vectorizes in full;
        # a row loop around the block loop leaves strided loads with gaps, half of them in a
        # scalar epilogue (2.5x slower).
        unroll = isinstance(self.rnumel, int) and self.rnumel <= UNROLL_ROW
        steps = [str(c) for c in range(self.rnumel)] if unroll else ["r"]
        if not unroll:
            self.lines.append(f"{ind}for (int64_t r = 0; r < {self.rnumel}; r++) {{")
            ind_r = ind + "    "
            self.define_dims(self.rdims, "r", "r", ind_r)
        else:
            ind_r = ind
        self.lines.append(f"{ind_r}#pragma omp simd")
        self.lines.append(f"{ind_r}for (int64_t j = 0; j < jn; j++) {{")
        jin = ind_r + "    "
        block_offsets(jin)
        for step in steps:
            at = jin
            if unroll:
                self.lines.append(f"{jin}{{")
                at = jin + "    "
                self.lines.append(f"{at}const int64_t r = {step};")
                self.define_dims(self.rdims, "r", "r", at)
            self.emit(body, at)
            for i in group:
                kind, src = k.ops[i].args
                v, a = f"t{src}", f"A{i}[j]"
                if kind == "sum":
                    cast = f"({acc_type(i)})" if acc_type(i).startswith("uint") else ""
                    self.lines.append(f"{at}{a} += {cast}{v};")
                elif i in nan_flags:
                    cmp = ">" if kind == "max" else "<"
                    self.lines.append(f"{at}{a} = {v} {cmp} {a} ? {v} : {a};")
                    self.lines.append(f"{at}N{i}[j] |= {v} != {v};")
                elif kind in ("max", "min"):
                    cmp = ">" if kind == "max" else "<"
                    self.lines.append(f"{at}{a} = ({v} {cmp} {a} || {v} != {v}) ? {v} : {a};")
                else:
                    cmp = ">" if kind == "argmax" else "<"
                    self.lines.append(f"{at}const int fj_take{i} = {v} {cmp} {a} || ({v} != {v} && {a} == {a});")
                    self.lines.append(f"{at}I{i}[j] = fj_take{i} ? r : I{i}[j];")
                    self.lines.append(f"{at}{a} = fj_take{i} ? {v} : {a};")
            if unroll:
                self.lines.append(f"{jin}}}")
        self.lines.append(f"{ind_r}}}")
        if not unroll:
            self.lines.append(f"{ind}}}")
        self.lines.append(f"{ind}#pragma omp simd")
        self.lines.append(f"{ind}for (int64_t j = 0; j < jn; j++) {{")
        block_offsets(ind + "    ")
        for i in group:
            op = k.ops[i]
            value = f"I{i}[j]" if i in arg else f"({c_type(op.dtype)})A{i}[j]"
            if i in nan_flags:
                value = f"N{i}[j] ? ({c_type(op.dtype)})NAN : {value}"
            self.lines.append(f"{ind}    const {local_type(op.dtype)} t{i} = {value};")
        self.emit([j for j, op in enumerate(k.ops) if op.level == OUTER and op.kind != "reduce"],
                  ind + "    ")
        self.lines.append(f"{ind}}}")
        self.lines.append(f"{indent}}}")

    def prologue(self, indent: str) -> list[str]:
        """The locals every function of the kernel starts with: buffer pointers, sizes."""
        k = self.k
        out = []
        seeds = {op.args[0] for op in k.ops if op.kind == "rand"}
        # An input and an output the launch may pass as one tensor are not restrict (the loops
        # are vectorized by their omp simd pragmas, which need no restrict).
        shared = {b.name for a in k.inputs for o in k.outputs if k.may_share_memory(a, o)
                  for b in (a, o)}
        for i, b in enumerate(k.buffers):
            if b.name in seeds:
                out.append(f"{indent}const int64_t {b.name}_seed = *(const int64_t *)bufs[{i}];")
                continue
            qual = "" if b.is_output else "const "
            restrict = "" if b.name in shared else "restrict "
            out.append(f"{indent}{qual}{c_type(b.dtype)} *{restrict}{b.name} = "
                       f"({qual}{c_type(b.dtype)} *)bufs[{i}];")
        for i, sym in enumerate(k.symbols()):
            out.append(f"{indent}const int64_t {sym} = sizes[{i}];")
        return out

    def function(self) -> str:
        ind = "    "
        head = f"void {self.name}(char **bufs, int64_t nthreads, const int64_t *sizes) {{"
        if self.dynamic:
            self.lines = []
            if self.block is not None:
                self.dynamic_blocks(ind, head)
            else:
                self.dynamic_rows(ind, head)
        elif self.block is not None:
            self.lines = [head, *self.prologue(ind), f"{ind}(void)nthreads;"]
            nb, _ = self.block_count()
            self.lines.append(f"{ind}const int64_t fj_nb = {nb};")
            if self.parallel:
                self.lines.append(f"{ind}#pragma omp parallel for num_threads(nthreads) if(nthreads > 1) schedule(static)")
            self.block_rows(ind, "0", "fj_nb")
        else:
            self.lines = [head, *self.prologue(ind), f"{ind}(void)nthreads;"]
            if self.shared:
                self.shared_rows(ind)
            split = self.parallel and self.xnumel == 1
            self.ahead = self.row_ahead()
            if self.ahead and not split:
                self.ahead = None  # (rows_at_once takes one row at a time with it)
                if self.rows_at_once(self.row_steps(split)[0]) < AHEAD_ROWS:
                    self.ahead = self.row_ahead()
            carried = ""
            if self.ahead:
                # The next row's max, and which row it is (per thread: each takes its rows in
                # order, and a max taken for another thread's row goes unused).
                self.lines.append(f"{ind}int64_t fj_nx = -1;")
                self.lines.append(f"{ind}float fj_nm = 0;")
                self.lines.append(f"{ind}int fj_nn = 0;")
                carried = " firstprivate(fj_nx, fj_nm, fj_nn)"
            if self.parallel and self.xnumel > 1:
                self.lines.append(f"{ind}#pragma omp parallel for num_threads(nthreads) "
                                  f"if(nthreads > 1) schedule(static){carried}")
            self.rows(ind, split)
            if self.stream:
                self.lines.extend(["#if FJ_VEC_TILES", f"{ind}fj_sfence();", "#endif"])
        self.lines.append("}")
        return "\n".join(self.lines) + "\n"

    def rows(self, indent: str, split: bool | str, lo: str = "0", hi: str | None = None) -> None:
        """The loop over the rows ``x`` in [lo, hi) (its ``parallel for``, if any, already
        emitted)."""
        self.hoisted = set()
        hi = hi or str(self.xnumel)
        plan, steps = self.row_steps(split)
        step = 1 if split else self.rows_at_once(plan)
        if step > 1:
            self.interleaved_rows(indent, lo, hi, step, plan, steps)
            return
        self.lines.append(f"{indent}for (int64_t x = {lo}; x < {hi}; x++) {{")
        self.row_offsets(indent + "    ")
        if not split:
            self.prefetch_next_row(indent + "    ", hi)
        self.row(indent + "    ", plan, steps)
        self.lines.append(f"{indent}}}")

    def prefetch_next_row(self, indent: str, hi: str) -> None:
        """At the start of row ``x``, software prefetches of what row ``x + 1`` reads of each
        input, a cache line at a time, where the row splits into pieces (:meth:`row_pieces`: a
        rotary embedding's halves). Their loops read a row's two halves side by side and then
        the other way round, a pattern the hardware prefetcher did not follow: the loads
        stalled, and a bf16 rotary over 4096x1024 took as long as its cache-resident compute
        plus a copy of its bytes. With the prefetches (benchmarks/kernels.py, Zen 3) bf16 and
        fp16 rotary ran 1.4-1.6x faster at one thread and 1.2-1.5x at two; fp32 and rows of 64
        as fast. Whole-row kernels (softmax, norms, GELU) gained nothing in a C harness: the
        hardware streams rows read whole. Only contiguous rows whose next row is one step of
        ``x`` on (not a transposed view's rows, as HF Llama's q and k)."""
        if self.row_pieces() is None or (isinstance(self.xnumel, int) and self.xnumel < 2):
            return
        (rdim,) = self.rdims
        # What a load reads along the row: its span where it is one piece's operand.
        extents: dict[str, int] = {}
        for op in self.k.ops:
            if op.kind != "load":
                continue
            spans = [a for a in op.args[1:] if isinstance(a, Span) and a.dim == rdim]
            extent = spans[0].stop - spans[0].start if spans else self.rnumel
            extents[op.args[0]] = max(extents.get(op.args[0], 0), extent)
        lines = []
        for b in self.row_inputs():
            at = self._part(self.xdims, "(x + 1)", "fj_x", b.strides)
            if b.strides[rdim] != 1 or not at or "fj_x" in at or b.name not in extents:
                continue
            size = extents[b.name] * b.dtype.itemsize
            lines.append(f"{indent}    for (int64_t fj_b = 0; fj_b < {size}; fj_b += 64) "
                         f"FJ_PREFETCH((const char *)({b.name} + {at}) + fj_b);")
        if lines:
            self.lines.append(f"{indent}if (x + 1 < {hi}) {{")
            self.lines.extend(lines)
            self.lines.append(f"{indent}}}")

    def dynamic_blocks(self, indent: str, head: str) -> None:
        """:meth:`block_rows` with run-time sizes: blocks in a function over a range of them,
        called for one range per thread or for all blocks (no cut rows: rows are short)."""
        rows = f"{self.name}_blocks"
        nb, _ = self.block_count()
        inner = indent + "    "
        self.lines.append(f"static __attribute__((noinline, noclone)) void {rows}(char **bufs, "
                          f"const int64_t *sizes, int64_t b_lo, int64_t b_hi) {{")
        self.lines += self.prologue(indent)
        self.lines.append(f"{indent}const int64_t fj_nb = {nb};")
        self.block_rows(indent, "b_lo", "b_hi")
        self.lines.append("}")
        self.lines.append(head)
        self.lines += self.prologue(indent)[-len(self.k.symbols()):]
        self.lines.append(f"{indent}const int64_t fj_nb = {nb};")
        cond = ["nthreads > 1", "fj_nb > 1"]
        if isinstance(self.numel, Sym):
            cond.append(f"{self.numel} >= {PARALLEL_MIN}")
        elif self.numel < PARALLEL_MIN:
            cond = []
        if cond:
            self.lines.append(f"{indent}if ({' && '.join(cond)}) {{")
            self.lines.append(f"{inner}#pragma omp parallel num_threads(nthreads)")
            self.lines.append(f"{inner}{{")
            self.lines.append(f"{inner}    const int64_t t = FJ_TID(), n = FJ_NTH();")
            self.lines.append(f"{inner}    {rows}(bufs, sizes, fj_nb * t / n, fj_nb * (t + 1) / n);")
            self.lines.append(f"{inner}}}")
            self.lines.append(f"{indent}}} else {{")
            self.lines.append(f"{inner}{rows}(bufs, sizes, 0, fj_nb);")
            self.lines.append(f"{indent}}}")
        else:
            self.lines.append(f"{indent}(void)nthreads;")
            self.lines.append(f"{indent}{rows}(bufs, sizes, 0, fj_nb);")

    def dynamic_rows(self, indent: str, head: str) -> None:
        """A kernel with run-time sizes: the loop nest once, in a function over a range of rows
        (``<name>_rows``), which the kernel calls in one of the ways its sizes allow, chosen at
        run time by the static rule (see the module docstring): a single row cut in parts shared
        by the threads, row ranges one per thread, or all rows on this thread. One copy of the
        nest is one vectorization of each loop for gcc (three copies took it 6x as long as the
        static kernel)."""
        x, r, numel = self.xnumel, self.rnumel, self.numel
        # A single row of at least PARALLEL_MIN is cut in parts (whatever the thread count, so
        # that a sum rounds the same at every thread count).
        split: list[str] | None = []
        for size, test, fits in ((x, "== 1", x == 1), (r, f">= {PARALLEL_MIN}",
                                                        isinstance(r, int) and r >= PARALLEL_MIN)):
            if isinstance(size, Sym):
                split.append(f"{size} {test}")
            elif not fits:
                split = None
                break
        # Otherwise rows run in parallel from PARALLEL_MIN elements and a second thread on.
        parallel: list[str] | None = None
        if x != 1 and (isinstance(numel, Sym) or numel >= PARALLEL_MIN):
            parallel = ["nthreads > 1"] + ([f"{numel} >= {PARALLEL_MIN}"]
                                           if isinstance(numel, Sym) else [])
        inner = indent + "    "
        rows = f"{self.name}_rows"
        # Per-part results of each reduction: shared by the threads of a cut row.
        partials = []
        if split is not None:
            for i in [i for group in self.reduce_groups() for i in group]:
                partials.append((self.acc_type(i), f"p{i}"))
                if self.k.ops[i].args[0] in ("argmax", "argmin"):
                    partials.append(("int64_t", f"p{i}_i"))
        params = "".join(f", {t} *{n}" for t, n in partials)
        self.lines.append(f"static __attribute__((noinline, noclone)) void {rows}(char **bufs, "
                          f"const int64_t *sizes, int64_t x_lo, int64_t x_hi"
                          f"{', int64_t fj_parts, int64_t fj_per' if split is not None else ''}"
                          f"{params}) {{")
        self.lines += self.prologue(indent)
        if split is not None:
            # One part, the whole row, unless the row is cut; then this thread's share.
            self.lines.append(f"{indent}int64_t fj_p0 = 0, fj_p1 = 1;")
            for t, n in partials:
                self.lines.append(f"{indent}{t} s{n[1:]}[1];")
            self.lines.append(f"{indent}if (fj_parts) {{")
            self.lines.append(f"{inner}const int64_t t = FJ_TID(), n = FJ_NTH();")
            self.lines.append(f"{inner}fj_p0 = fj_parts * t / n;")
            self.lines.append(f"{inner}fj_p1 = fj_parts * (t + 1) / n;")
            self.lines.append(f"{indent}}} else {{")
            self.lines.append(f"{inner}fj_per = {r};")
            self.lines.append(f"{indent}}}")
        self.rows(indent, "maybe" if split is not None else False, "x_lo", "x_hi")
        self.lines.append("}")
        # A run-time row length: a second copy of the nest, for rows of at most ROW_BUFFER,
        # with row buffers (a softmax's exp once, not twice: 1.6x faster), if it has any. Such
        # rows are never cut in parts (that takes PARALLEL_MIN).
        capped = None
        if isinstance(r, Sym) and self.block is None and not self.scratch:
            whole, self.lines = self.lines, []
            self.row_cap, self.buffers_declared = ROW_BUFFER, False
            self.lines.append(f"static __attribute__((noinline, noclone)) void {rows}_b(char **bufs, "
                              f"const int64_t *sizes, int64_t x_lo, int64_t x_hi) {{")
            self.lines += self.prologue(indent)
            self.rows(indent, False, "x_lo", "x_hi")
            self.lines.append("}")
            if self.buffers_declared:
                capped = f"{r} <= {ROW_BUFFER}"
                whole += self.lines
            self.lines, self.row_cap = whole, None
        self.lines.append(head)
        self.lines += self.prologue(indent)[-len(self.k.symbols()):] if self.k.symbols() else []
        self.lines.append(f"{indent}(void)nthreads;")
        for t, n in partials:
            self.lines.append(f"{indent}{t} {n}[{MAX_PARTS}];")
        args = "".join(f", {n}" for _, n in partials)

        def call(lo: str, hi: str, cut: bool) -> str:
            more = (", fj_parts, fj_per" if cut else ", 0, 0") if split is not None else ""
            text = f"{rows}(bufs, sizes, {lo}, {hi}{more}{args});"
            if capped and not cut:
                return f"if ({capped}) {rows}_b(bufs, sizes, {lo}, {hi}); else {text}"
            return text

        branches = [(cond, how) for cond, how in ((split, "split"), (parallel, "parallel"),
                                                   ([], "serial")) if cond is not None]
        if not branches[0][0]:  # always the first way: no test
            branches = branches[:1]
        body = inner if len(branches) > 1 else indent
        deeper = body + "    "
        for j, (cond, how) in enumerate(branches):
            if len(branches) > 1:
                if j == 0:
                    self.lines.append(f"{indent}if ({' && '.join(cond)}) {{")
                elif cond:
                    self.lines.append(f"{indent}}} else if ({' && '.join(cond)}) {{")
                else:
                    self.lines.append(f"{indent}}} else {{")
            if how == "split":
                self.define_parts(body)
                self.lines.append(f"{body}if (nthreads > 1) {{")
                self.lines.append(f"{deeper}#pragma omp parallel num_threads(nthreads)")
                self.lines.append(f"{deeper}{call('0', '1', True)}")
                self.lines.append(f"{body}}} else {{")
                self.lines.append(f"{deeper}{call('0', '1', True)}")
                self.lines.append(f"{body}}}")
            elif how == "parallel":
                self.lines.append(f"{body}#pragma omp parallel num_threads(nthreads)")
                self.lines.append(f"{body}{{")
                self.lines.append(f"{deeper}const int64_t t = FJ_TID(), n = FJ_NTH();")
                self.lines.append(f"{deeper}{call(f'{x} * t / n', f'{x} * (t + 1) / n', False)}")
                self.lines.append(f"{body}}}")
            else:
                self.lines.append(f"{body}{call('0', str(x), False)}")
        if len(branches) > 1:
            self.lines.append(f"{indent}}}")


def _c_cast(x: str, source: torch.dtype, target: torch.dtype) -> str:
    """C's conversion of ``x`` from ``source`` to ``target`` as torch makes it. A float goes to
    an integer as x86's conversion gives it (NaN and out of range: the width's minimum), which C
    leaves undefined (gcc folds ``(float)(int64_t)x`` into ``truncf(x)``: inf stayed inf); to
    int16/int8 through int32, as a scalar cast on x86 does; to uint8 through int64, as c10's
    static_cast_with_inter_type does (-100.0 -> 156; a float cast straight to uint8_t is
    undefined for negatives, and gcc's vector loops give 0)."""
    wide = _CONVERTED_THROUGH.get(target) if source.is_floating_point else None
    if wide is None:
        return f"({c_type(target)}){x}"
    value = f"fj_{'d' if source == torch.float64 else 'f'}2i{wide.itemsize * 8}({x})"
    return value if target == wide else f"({c_type(target)}){value}"


#: The integer a float converts to on its way to each integer dtype (see _c_cast).
_CONVERTED_THROUGH = {torch.int64: torch.int64, torch.uint8: torch.int64, torch.int32: torch.int32,
                      torch.int16: torch.int32, torch.int8: torch.int32}
