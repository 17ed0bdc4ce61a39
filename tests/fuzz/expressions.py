"""Tensor expressions of generated programs, each with its type (typed.py).

Every form writes its code from a template over its operands' code and asks ``infer`` for the
result's type, which also rejects what eager would refuse; a rejected form is drawn again. The
operand dtypes are those of the scope: float32 mostly, and the integer, fp16 and bf16 inputs
(prelude.py), with conversions between them, Python numbers in ops (type promotion), masks,
integer division, powers, and reductions with ``dtype=`` and over dims.
"""

from __future__ import annotations

import torch

from .typed import COL, F32, FULL, HALVES, ONE, ROW, SCALAR, Num, Ty, guard_int, infer

# (template, rounds, discrete); see typed.infer. sin and cos take exact operands only: they turn
# the absolute error of a large operand (eager's fp16 rounding of int8 - fp16 near 100: up to
# 0.03, which a kernel leaves out) into the same absolute error of a result within [-1, 1]
# (program 341000000640: eager 0.038 from the exact cos, the kernel 0.0002).
UNARY = [
    ("torch.relu({})", False, False), ("torch.tanh({})", True, False),
    ("torch.sigmoid({})", True, False), ("{}.abs()", False, False),
    ("{}.clamp(-0.5, 0.5)", False, False), ("torch.sin({})", True, True),
    ("({} ** 2)", True, False), ("{}.neg()", False, False), ("{}.clone()", False, False),
    ("{}.detach()", False, False), ("torch.cos({})", True, True), ("{}.double()", False, False),
    ("({} > 0).float()", False, True), ("{}.t().t()", False, False), ("{}.contiguous()", False, False),
    ("torch.exp({})", True, False), ("({} ** 0.5)", True, False), ("({} ** 3)", True, False),
    ("({} ** -1)", True, False), ("torch.pow({}, 2.0)", True, False), ("{}.clamp(min=-1)", False, False),
    ("torch.clamp({}, max=2)", False, False), ("{}.clamp(0.25, 1.5)", False, False),
    ("(~({} > 0)).long()", False, True), ("({} != 0).to(torch.int8)", False, True),
    ("{}.sign()", False, True), ("torch.floor({})", False, True), ("{}.round()", False, True),
    ("{}.trunc()", False, True),
]

# Dtype conversions and the methods that write them.
CONVERSIONS = {
    torch.float16: [".half()", ".to(torch.float16)"],
    torch.bfloat16: [".bfloat16()", ".to(torch.bfloat16)"],
    torch.float32: [".float()", ".to(torch.float32)"],
    torch.float64: [".double()"],
    torch.int64: [".long()", ".to(torch.int64)"],
    torch.int32: [".int()", ".to(torch.int32)"],
    torch.int8: [".to(torch.int8)", ".char()"],
    torch.uint8: [".to(torch.uint8)", ".byte()"],
}

# Python numbers: exact in fp16 and bf16, and a few that are not (eager rounds them to the
# op's dtype). Divisors are never zero: an integer tensor divided by zero raises.
NUMBERS = ["2", "3", "-1", "0.5", "2.5", "-1.5", "0.25", "0", "1"]
ODD_NUMBERS = ["0.1", "0.3", "-0.7", "1e-3"]
DIVISORS = ["2", "3", "-2", "4", "0.5", "-1.5", "0.75", "0.1", "7"]
EXPONENTS = ["2", "3", "0.5", "-1", "-2", "2.0", "0", "1.5", "-0.5"]
ALPHAS = ["2", "-1", "3", "0.5", "-2.5"]

COMPARE = [">", "<", ">=", "<=", "==", "!="]

REDUCTIONS = [
    # (template, rounds, discrete)
    ("{}.sum()", True, False), ("{}.sum(dim=-1, keepdim=True)", True, False),
    ("{}.sum(0, dtype=torch.float64)", True, False), ("{}.sum(-1, dtype=torch.float32)", True, False),
    ("{}.sum(dtype=torch.float16)", True, False), ("{}.sum(dim=0, dtype=torch.int32)", True, False),
    ("{}.mean(dim=-1, keepdim=True)", True, False), ("{}.mean(0, dtype=torch.float32)", True, False),
    ("{}.mean(dtype=torch.float64)", True, False), ("{}.mean()", True, False),
    ("{}.amax(dim=0)", False, False), ("{}.amin(-1)", False, False),
    ("{}.max(dim=-1).values", False, False), ("{}.min(0)[0]", False, False),
    ("{}.max(dim=-1, keepdim=True)[1]", False, True), ("{}.min(dim=0).indices", False, True),
    ("{}.argmax(dim=0)", False, True), ("torch.argmin({}, -1)", False, True),
    ("{}.argmax(-1, keepdim=True)", False, True), ("{}.max()", False, False), ("{}.argmax()", False, True),
    ("torch.softmax({}, -1)", True, False), ("torch.softmax({}, dim=0, dtype=torch.float32)", True, False),
    ("{}.softmax(-1, dtype=torch.float64)", True, False), ("{}.float().softmax(0)", True, False),
    ("torch.log_softmax({}, -1, dtype=torch.float32)", True, False),
    ("{}.sum(-1, dtype=torch.bfloat16)", True, False),
]


class Expressions:
    """The tensor-expression half of the Generator (generator.py): needs ``rng``, ``pick``,
    ``chance``, ``weighted`` and ``int_expr``/``num_expr``."""

    def make(self, template: str, *operands, rounds: bool = True, discrete: bool = False,
             probe: str | None = None):
        """``(code, Ty)`` of ``template`` over ``operands``, or None (see typed.infer)."""
        ty = infer(template, list(operands), rounds=rounds, discrete=discrete, probe=probe)
        if ty is None:
            return None
        return template.format(*(op.code if isinstance(op, Num) else op[0] for op in operands)), ty

    def literal(self, table=None) -> Num:
        if table is None:
            table = NUMBERS if self.chance(0.8) else ODD_NUMBERS
        code = self.pick(table)
        return Num(code, float(code) if "." in code or "e" in code else int(code))

    def runtime_number(self, s) -> Num:
        """A number known only at run time (a name, ``len(lst)``...); may be zero."""
        code = self.num_expr(s)
        is_float = code in s.floats or code == "GF"
        return Num(code, 1.5 if is_float else 2)

    def var(self, s, want=None):
        names = [n for n, t in s.tensors.items() if want is None or want(t)]
        name = self.pick(names) if names else "x"
        return name, s.tensors[name]

    def exact_expr(self, s, depth: int = 1, want=None):
        """An expression without skipped fp16 roundings (for comparisons, ``.item()``, ...)."""
        return self.tensor_expr(s, depth, lambda t: t.exact and (want is None or want(t)))

    def tensor_expr(self, s, depth: int = 0, want=None) -> tuple[str, Ty]:
        """A tensor expression and its type; with ``want``, one whose type it accepts when
        one is found in a few draws (callers that need it check again)."""
        if depth >= 2:
            return self.var(s, want)
        forms = {self._var: 4, self._unary: 3, self._binary: 4, self._scalar: 2.5,
                 self._reduce: 1.8, self._view: 1.5, self._special: 1, self._matmul: 0.7,
                 self._call: 1.5, self._convert: 1.5, self._select: 1.5, self._module: 0.6}
        for _ in range(8):
            found = self.weighted({(lambda f=f: f(s, depth)): w for f, w in forms.items()})
            if found is not None and (want is None or want(found[1])):
                return found
        return self.var(s, want)

    def _module(self, s, depth):
        """A call of a prelude module (aliasing.MODULE_CALLS); its value is not exact."""
        found = self.module_expr(s, depth)
        return found and (found[0], Ty(found[1].shape, found[1].dtype, 1))

    def _var(self, s, depth):
        return self.var(s)

    def _sub(self, s, depth):
        return self.tensor_expr(s, depth + 1)

    def _unary(self, s, depth):
        template, rounds, discrete = self.pick(UNARY)
        return self.make(template, self._sub(s, depth), rounds=rounds, discrete=discrete)

    def _convert(self, s, depth):
        a = self._sub(s, depth)
        target = self.pick(CONVERSIONS)
        template = guard_int("{0}", a[1], target) + self.pick(CONVERSIONS[target])
        return self.make(template, a, rounds=False, discrete=not target.is_floating_point)

    def _binary(self, s, depth):
        a, b = self._sub(s, depth), self._sub(s, depth)
        kind = self.rng.randrange(10)
        if kind < 5:
            return self.make(f"({{0}} {self.pick(['+', '-', '*', '*', '+', '/'])} {{1}})", a, b)
        if kind == 5:
            return self.make(f"torch.add({{0}}, {{1}}, alpha={self.pick(ALPHAS)})", a, b)
        if kind == 6:
            return self.make(f"{{0}}.sub({{1}}, alpha={self.pick(ALPHAS)})", a, b)
        if kind == 7:
            return self.make(f"torch.{self.pick(['maximum', 'minimum'])}({{0}}, {{1}})", a, b,
                             rounds=False)
        # Integer and float division, the divisor kept away from zero when it is an integer.
        divisor = "({1}.abs() % 5 + 1)" if not b[1].floating else "{1}"
        op = self.pick(["//", "%"]) if self.chance(0.7) else self.pick(["floor_divide", "remainder"])
        template = f"({{0}} {op} {divisor})" if len(op) < 3 else f"torch.{op}({{0}}, {divisor})"
        return self.make(template, a, b, discrete=True)

    def _scalar(self, s, depth):
        a = self._sub(s, depth)
        kind = self.rng.randrange(9)
        if kind < 3:
            n = self.runtime_number(s) if self.chance(0.5) else self.literal()
            return self.make(f"({{0}} {self.pick(['+', '-', '*'])} {{1}})", a, n)
        if kind == 3:
            n = self.runtime_number(s) if self.chance(0.5) else self.literal()
            return self.make(f"({{1}} {self.pick(['-', '*', '+'])} {{0}})", a, n)
        if kind == 4:
            return self.make("({0} / {1})", a, self.literal(DIVISORS))
        if kind == 5:
            op = self.pick(["//", "%"])
            return self.make(f"({{0}} {op} {{1}})", a, self.literal(DIVISORS), discrete=True)
        if kind == 6:
            return self.make("({0} ** {1})", a, self.literal(EXPONENTS))
        if kind == 7:
            return self.make(f"torch.add({{0}}, {{1}}, alpha={self.pick(ALPHAS)})", a, self.literal())
        return self.make(f"({{0}} {self.pick(['*', '+'])} {{1}})", a, self.literal())

    def _reduce(self, s, depth):
        template, rounds, discrete = self.pick(REDUCTIONS)
        return self.make(template, self._sub(s, depth), rounds=rounds, discrete=discrete)

    def _view(self, s, depth):
        a = self._sub(s, depth)
        sa = a[1].shape
        if len(sa) == 2 and self.chance(0.4):
            template = "{0}[:, :1]"
        elif sa and sa[0] != 1 and self.chance(0.5):
            template = f"{{0}}[{self.pick(['0', '-1', '1'])}]"
        elif self.chance(0.5):
            template = "{0}.unsqueeze(0)"
        else:
            template = "{0}.view_as({0})" if a[0].isidentifier() else "{0}.reshape({0}.shape)"
        return self.make(template, a, rounds=False)

    def _special(self, s, depth):
        a, b = self._sub(s, depth), self._sub(s, depth)
        kind = self.rng.randrange(9)
        if kind == 6 and len(a[1].shape) == 2:  # slices bounded by sizes (dynamic: symbols)
            return self.make("torch.cat([{0}[:, max(0, {0}.shape[1] - 1):], "
                             "{0}[:, :max(0, {0}.shape[1] - 1)]], 1)", a, rounds=False)
        if kind == 7 and len(a[1].shape) == 2:  # MobileBERT's shifted copies: padded slices
            return self.make("torch.nn.functional.pad({0}[:, 1:], [0, 1]) + "
                             "torch.constant_pad_nd({0}[:, :-1], [1, 0])", a)
        if kind == 8 and a[1].shape:
            return self.make("{0}[:min({0}.shape[0], 40)] * {1}", a, b)
        if kind == 0:
            return self.make("torch.where({0} > 0, {0}, {1})", a, b, rounds=False, discrete=True)
        if kind == 1:
            return self.make("torch.maximum({0}, {1})", a, b, rounds=False)
        if kind == 3:  # a rotation by cat, as rotary embeddings write it
            return self.make("torch.cat([-{0}[..., 1:], {0}[..., :1]], dim=-1)", a, rounds=False)
        if kind == 4 and a[1].shape == b[1].shape:  # rows of two tensors
            return self.make("torch.cat(({0}[:1], {1}[1:] * 2))", a, b)
        if kind == 5 and len(a[1].shape) == 2:  # a cat then a reduction over it
            return self.make("torch.cat([{0}, {0}.exp()], 1).amax(1, keepdim=True)", a)
        return self.make("torch.stack([{0}, {0} * 2]).sum(0)", a)

    def mask(self, s, depth):
        """A bool tensor: a comparison of exact values (the result jumps with them)."""
        a = self.exact_expr(s, depth + 1)
        other = self.literal() if self.chance(0.6) else self.exact_expr(s, depth + 1)
        template = f"({{0}} {self.pick(COMPARE)} {{1}})"
        if self.infer_mask(template, a, other) is None:
            template, other = "({0} > 0)", Num("0", 0)
        code = template.format(a[0], other.code if isinstance(other, Num) else other[0])
        return code, self.infer_mask(template, a, other)

    @staticmethod
    def infer_mask(template, a, other):
        """The mask's type (dtype bool) by the probe, or None."""
        ty = infer(f"({template}).to(torch.uint8)", [a, other], rounds=False, discrete=True)
        return None if ty is None else Ty(ty.shape, torch.bool)

    def _select(self, s, depth):
        """where / masked_fill / clamp with numbers: type promotion with Python numbers."""
        a = self._sub(s, depth)
        m = self.mask(s, depth)
        kind = self.rng.randrange(6)
        if kind == 0:
            return self.make("torch.where({0}, {1}, {2})", m, a, self._sub(s, depth), rounds=False)
        if kind == 1:
            return self.make("torch.where({0}, {1}, {2})", m, a, self.literal(), rounds=False)
        if kind == 2:
            return self.make("torch.where({0}, {2}, {1})", m, a, self.literal(), rounds=False)
        if kind == 3:
            return self.make("{1}.masked_fill({0}, {2})", m, a, self.literal(), rounds=False)
        if kind == 4:
            return self.make(f"{{0}}.clamp(min={{1}}, max={self.pick(['3', '2.5', '1'])})", a,
                             self.literal(), rounds=False)
        return self.make(f"torch.clamp({{0}}, {self.pick(['min', 'max'])}={{1}})", a, self.literal(),
                         rounds=False)

    def _matmul(self, s, depth):
        full = [(n, t) for n, t in s.tensors.items() if t.shape == FULL]
        rows = [(n, t) for n, t in s.tensors.items() if t.shape == ROW]
        if not (full and rows):
            return self.var(s)
        return self.make("({0} @ {1}).unsqueeze(-1)", self.pick(full), self.pick(rows))

    def _call(self, s, depth):
        a = self._sub(s, depth)
        kind = self.rng.randrange(6)
        if kind == 0:
            return self.make(f"helper({{0}}, {self.int_expr(s)})", a, probe="({0} * 3 - 1)")
        if kind == 1:
            return self.make(self.pick(["obj.scale({0})", "noisy({0})"]), a, probe="({0} * 2 + 1)")
        if kind == 2:
            return self.make(f"sum(scaled({{0}}, {self.rng.randint(1, 3)}))", a, probe="(0 + {0} * 2)")
        if kind == 3:
            return "sum(u * 2 for u in lst)", Ty(ROW)
        if kind == 4:
            return "torch.stack([u.sin() for u in lst]).sum(0)", Ty(ROW)
        if s.pairs:
            p = self.pick(s.pairs)
            return f"{p}.total()", s.pairs[p]
        return self.make("({0} * GT)", a, ("GT", Ty(ONE)))


__all__ = ["COL", "F32", "FULL", "HALVES", "ONE", "ROW", "SCALAR", "Expressions"]
