"""The device-neutral kernel description: what one fused kernel computes.

A kernel iterates over a box ``sizes`` (one entry per dimension). The dimensions listed in
``reduce_dims`` are reduced; the others are the *outer* dimensions, one per output element of a
reduction. Values live at one of two levels:

* ``FULL``: one value per point of the whole box (loads of the row, the pointwise prologue);
* ``OUTER``: one value per outer point, constant along the reduced dimensions (reduction
  results and the pointwise ops on them).

A pointwise kernel has no reduced dimensions, and every value is ``FULL``.

Every buffer (a kernel argument) is addressed through strides *in the kernel's box*: element
``(i0, i1, ...)`` of the box lives at ``sum(i_d * strides[d])``. Broadcasting is stride 0, a
transposed or sliced input just has other strides. Sizes and strides are :data:`Expr`: an int
now, a :class:`Sym` (a value passed to the kernel at run time) once shapes are dynamic.

The body is an SSA list of :class:`Op`. Example (softmax over the last dimension)::

    kernel softmax_0  sizes [8, 64]  reduce [1]
      in0  f32  strides [64, 1]
      out0 f32  strides [64, 1]
      %0 = load in0                : f32 full
      %1 = reduce max %0           : f32 outer
      %2 = sub %0 %1               : f32 full
      ...
      store out0 %6

A concatenation (``torch.cat``) is computed in place: a ``concat`` op takes, at each point, the
operand whose :class:`Span` along the cat dimension holds the point, and the loads that feed
operand ``k`` carry span ``k``: they read their buffer shifted by the span's start, and only
points inside the span may touch memory (Triton masks the load, C clamps the index). The values
computed from them outside the span are discarded by the ``concat``::

    kernel rotate_half  sizes [64, 16]
      in0  f32  strides [16, 1]            (x[..., 8:], read at i1 - 8)
      in1  f32  strides [16, 1]            (x[..., :8])
      %0 = load in0 [d1 0:8]     : f32 full
      %1 = neg %0                : f32 full
      %2 = load in1 [d1 8:16]    : f32 full
      %3 = concat [d1 0:8] %1 [d1 8:16] %2 : f32 full

Renderers (Triton now, C next) turn a :class:`Kernel` into code; ``reference.py`` evaluates one
with torch and is the oracle the renderers are tested against. This module imports only torch.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import Any

import torch

#: What ``pipeline._unique`` appends to a kernel name already taken in the graph.
_UNIQUE_SUFFIX = re.compile(r"_\d+$")


@dataclass(frozen=True)
class Sym:
    """A size or stride known only at run time.

    ``name`` is either an identifier (``ks0``): an ``int64`` argument of the kernel, or a
    parenthesized product of such arguments and an int (``(7*ks0*ks1)``), made by
    :func:`product`. Either text is a valid expression in C and in Python, so renderers may
    paste ``str(sym)`` into index arithmetic as it is."""

    name: str

    def __str__(self) -> str:
        return self.name

    @property
    def atoms(self) -> tuple[str, ...]:
        """The kernel arguments this size is made of."""
        return tuple(_IDENT.findall(self.name))


Expr = int | Sym

_IDENT = re.compile(r"[A-Za-z_]\w*")

FULL = "full"
OUTER = "outer"

#: Scalar operations: name -> number of operands. Every renderer implements each of them.
UNARY = (
    "neg", "abs", "exp", "log", "log1p", "expm1", "sqrt", "rsqrt", "reciprocal", "sin", "cos",
    "tanh", "sigmoid", "erf", "gelu", "relu", "floor", "ceil", "sign", "not", "isnan",
)
BINARY = (
    "add", "sub", "mul", "truediv", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge",
    "and", "or",
)
#: Reductions; ``argmax``/``argmin`` give int64 indices into the flattened reduced dimensions.
REDUCTIONS = ("sum", "max", "min", "argmax", "argmin")


@dataclass(frozen=True)
class Span:
    """The points ``start <= i[dim] < stop`` of the kernel's box (one input of a concatenation).

    On a ``load``: the buffer's strides address the box shifted by ``start`` along ``dim``
    (point ``i`` reads element ``i[dim] - start`` there), and the load is only valid inside the
    span; renderers must not read memory for the points outside it. On a ``concat``: where the
    operand that follows it is taken."""

    dim: int
    start: Expr
    stop: Expr

    def __str__(self) -> str:
        return f"[d{self.dim} {self.start}:{self.stop}]"


@dataclass(frozen=True)
class Buffer:
    """A tensor argument of the kernel."""

    name: str
    dtype: torch.dtype
    #: Strides in the kernel's box (0 along broadcast dimensions), one per box dimension.
    strides: tuple[Expr, ...]
    is_output: bool = False

    def __str__(self) -> str:
        role = "out" if self.is_output else "in"
        return f"{self.name:<5} {_dt(self.dtype)} {role} strides [{', '.join(map(str, self.strides))}]"


@dataclass(frozen=True)
class Op:
    """One SSA value (or a store).

    ``kind`` is ``load`` (args: buffer name, then the :class:`Span` s it is valid in, at most one
    per dimension: the inputs of the concatenations it feeds), ``concat`` (args: pairs of a
    :class:`Span` and an operand, the spans disjoint and covering their dimension in order:
    the value is the operand whose span holds the point), ``const`` (args: the number, or a :class:`Sym`,
    a run-time size such as the count a mean divides by, as a value of ``dtype``), ``rand`` (args:
    seed buffer name, stream number; uniform in [0, 1), one draw per box point; each rand op of
    a kernel has its own stream number, so two draws are independent), ``cast`` (args: operand),
    ``round`` (args: operand, fp16 or bf16: the fp32 operand rounded to that dtype and back, what
    an explicit conversion to it does; the value stays fp32),
    ``where`` (cond, a, b), a name in :data:`UNARY` or :data:`BINARY`, ``reduce`` (args:
    reduction name, operand) or ``store`` (args: buffer name, operand). Operands are indices of
    earlier ops. ``dtype`` is the compute dtype of the value (fp16/bf16 are computed in fp32).
    """

    kind: str
    args: tuple[Any, ...]
    dtype: torch.dtype
    level: str = FULL

    def format(self, index: int) -> str:
        def show(a: Any) -> str:
            return f"%{a}" if is_operand(a) else str(a)

        if self.kind == "store":
            return f"store {self.args[0]} %{self.args[1]}"
        if self.kind == "rand":
            text = f"rand {self.args[0]} stream {self.args[1]}"
        elif self.kind == "load":
            text = " ".join(["load", *map(str, self.args)])
        elif self.kind == "const":
            number = self.args[0]
            text = f"const {number if isinstance(number, Sym) else repr(number)}"
        elif self.kind == "reduce":
            text = f"reduce {self.args[0]} %{self.args[1]}"
        else:
            text = f"{self.kind} " + " ".join(show(a) for a in self.args)
        return f"%{index} = {text:<28} : {_dt(self.dtype)} {self.level}"


@dataclass
class Kernel:
    """One fused kernel, independent of the device it will run on."""

    name: str
    sizes: tuple[Expr, ...]
    reduce_dims: tuple[int, ...]
    buffers: list[Buffer]
    ops: list[Op] = field(default_factory=list)

    # -- derived facts -----------------------------------------------------------------------
    @property
    def function_stem(self) -> str:
        """The name the renderers give this kernel's function: :attr:`name` without the ``_<n>``
        that makes it unique within its graph (``fj_red_sum_2`` -> ``fj_red_sum``). The same
        kernel in every layer of a model then renders to the same source, which is built once."""
        return _UNIQUE_SUFFIX.sub("", self.name) or self.name

    def may_share_memory(self, inp: Buffer, out: Buffer) -> bool:
        """Whether the launch may pass one tensor as both input ``inp`` and output ``out`` (an
        input dead after the call: see ``launch.donate_dead_inputs``): only when they have the
        same dtype and strides, so that each point of the memory is read, then written, at the
        same index (not an input read shifted, inside a :class:`Span`). Renderers must not
        assume such a pair distinct (no C ``restrict``)."""
        shifted = any(op.kind == "load" and op.args[0] == inp.name and len(op.args) > 1
                      for op in self.ops)
        return (not inp.is_output and out.is_output and inp.dtype == out.dtype
                and tuple(inp.strides) == tuple(out.strides) and not shifted)

    @property
    def outer_dims(self) -> tuple[int, ...]:
        return tuple(d for d in range(len(self.sizes)) if d not in self.reduce_dims)

    @property
    def outer_sizes(self) -> tuple[Expr, ...]:
        return tuple(self.sizes[d] for d in self.outer_dims)

    @property
    def reduce_sizes(self) -> tuple[Expr, ...]:
        return tuple(self.sizes[d] for d in self.reduce_dims)

    @property
    def is_reduction(self) -> bool:
        return bool(self.reduce_dims)

    def buffer(self, name: str) -> Buffer:
        for b in self.buffers:
            if b.name == name:
                return b
        raise KeyError(name)

    @property
    def inputs(self) -> list[Buffer]:
        return [b for b in self.buffers if not b.is_output]

    @property
    def outputs(self) -> list[Buffer]:
        return [b for b in self.buffers if b.is_output]

    def full_closure(self, roots: list[int]) -> list[int]:
        """The FULL ops (in order) that the ops ``roots`` need, stopping at OUTER values: what a
        renderer recomputes in each pass over a row."""
        need: set[int] = set()
        stack = list(roots)
        while stack:
            i = stack.pop()
            op = self.ops[i]
            if i in need or op.level != FULL or op.kind == "reduce":
                continue
            need.add(i)
            if op.kind == "store":
                stack.append(op.args[1])
            elif op.kind not in ("load", "const", "rand"):
                stack.extend(a for a in op.args if is_operand(a))
        return sorted(need)

    @property
    def span_dims(self) -> frozenset[int]:
        """The box dimensions some load or concat takes a :class:`Span` of."""
        return frozenset(a.dim for op in self.ops for a in op.args if isinstance(a, Span))

    def symbols(self) -> list[Sym]:
        """The run-time sizes the kernel takes as arguments (``int64``, after its buffers), in
        a fixed order: first appearance in the sizes, then in the buffers' strides, the
        constants and the spans."""
        seen: dict[str, Sym] = {}
        consts = (op.args[0] for op in self.ops if op.kind == "const")
        bounds = (e for op in self.ops for a in op.args if isinstance(a, Span)
                  for e in (a.start, a.stop))
        for e in (*self.sizes, *(s for b in self.buffers for s in b.strides), *consts, *bounds):
            if isinstance(e, Sym):
                for atom in e.atoms:
                    seen.setdefault(atom, Sym(atom))
        return list(seen.values())

    @property
    def is_dynamic(self) -> bool:
        """Whether some size, stride or constant is known only at run time."""
        return bool(self.symbols())

    def specialize(self, values: dict[str, int]) -> Kernel:
        """This kernel with every :class:`Sym` replaced by its value (``values`` maps each
        argument of :meth:`symbols` to an int): the static kernel of one call."""
        sizes = tuple(evaluate(e, values) for e in self.sizes)
        buffers = [replace(b, strides=tuple(evaluate(e, values) for e in b.strides))
                   for b in self.buffers]
        ops = [replace(op, args=(_number(evaluate(op.args[0], values), op.dtype),))
               if op.kind == "const" and isinstance(op.args[0], Sym)
               else replace(op, args=tuple(_specialize_arg(a, values) for a in op.args))
               for op in self.ops]
        return Kernel(self.name, sizes, self.reduce_dims, buffers, ops)

    def __str__(self) -> str:
        head = f"kernel {self.name}  sizes [{', '.join(map(str, self.sizes))}]"
        if self.reduce_dims:
            head += f"  reduce {list(self.reduce_dims)}"
        lines = [head]
        lines += [f"  {b}" for b in self.buffers]
        lines += [f"  {op.format(i)}" for i, op in enumerate(self.ops)]
        return "\n".join(lines)


def _specialize_arg(a: Any, values: dict[str, int]) -> Any:
    if isinstance(a, Span):
        return Span(a.dim, evaluate(a.start, values), evaluate(a.stop, values))
    return a


def spans_of(op: Op) -> tuple[Span, ...]:
    """The spans a load is valid in (empty for a plain load)."""
    return tuple(a for a in op.args if isinstance(a, Span))


def concat_parts(op: Op) -> list[tuple[Span, int]]:
    """A concat's (span, operand) pairs, in order along the dimension."""
    return list(zip(op.args[0::2], op.args[1::2]))


def is_operand(a: Any) -> bool:
    """Whether an op argument is an operand (the index of an earlier op), not a literal."""
    return isinstance(a, int) and not isinstance(a, bool)


def product(exprs: tuple[Expr, ...] | list[Expr]) -> Expr:
    """The product of sizes: an int, or a :class:`Sym` ``(7*ks0*ks1)`` when some are
    symbolic (a single symbol times 1 stays that symbol)."""
    known = math.prod(e for e in exprs if isinstance(e, int))
    atoms = [a for e in exprs if isinstance(e, Sym) for a in e.atoms]
    factor = [int(t) for e in exprs if isinstance(e, Sym) for t in re.findall(r"\b\d+\b", e.name)]
    known *= math.prod(factor)
    if not atoms or known == 0:
        return known
    if known == 1 and len(atoms) == 1:
        return Sym(atoms[0])
    return Sym("(" + "*".join(([str(known)] if known != 1 else []) + sorted(atoms)) + ")")


def evaluate(e: Expr, values: dict[str, int]) -> int:
    """The value of a size given the values of the kernel's arguments."""
    if isinstance(e, int):
        return e
    return math.prod(int(t) if t.isdigit() else values[t]
                     for t in e.name.strip("()").split("*"))


def expr_text(e: Expr | tuple) -> str:
    """Python text of a size or a tuple of sizes, over the arguments' names."""
    if isinstance(e, tuple):
        return "(" + ", ".join(expr_text(x) for x in e) + ("," if e else "") + ")"
    return str(e)


def _number(value: int, dtype: torch.dtype):
    return float(value) if dtype.is_floating_point else int(value)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a value of ``dtype`` is computed in: fp16/bf16 (and fp8) in fp32."""
    if dtype.is_floating_point and dtype.itemsize < 4:
        return torch.float32
    return dtype


def _dt(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")
