"""Statements about aliasing and state, the third half of the Generator (generator.py).

- Views that are kept, mutated, and whose base is read later (``v = t[0]; v.add_(1)``), of locals
  and of the inputs (``x``, ``d['a']``, ``obj.t``, ``lst[0]``), so that a write through a view
  must reach the caller's tensor; views whose shape the scope cannot name (``t[:, 1:]``,
  ``t.diagonal()``) are mutated at once and only returned.
- Writes through indexing: ``t[mask] = n``, ``t[:, 0] += n``, ``t[idx] = ...``,
  ``index_put_``; ``out=`` arguments; metadata changes in place (``v.t_()``, ``x.t_()``).
- Modules of the prelude (prelude.MODULES): calls, mode switches, and parameter and buffer
  writes under ``no_grad``; their state is compared after every call (compare.snapshot).
- Reads of autograd state (``requires_grad``, ``grad_fn is None``) and sizes known only from the
  data (``nonzero``, ``torch.where(mask)``, ``t[mask]``).

Every form is typed by ``infer`` as the others are, so eager accepts almost every program.
"""

from __future__ import annotations

import torch

from .program import Line
from .typed import F32, Num, Ty, infer

# Views with a shape the scope can name: (template, the rank it needs, whether it needs dim 0
# not to be 1). ``{0}`` is the base.
TYPED_VIEWS = [
    ("{0}[0]", 1, True), ("{0}[-1]", 1, True), ("{0}[1]", 1, True), ("{0}[:, 0]", 2, False),
    ("{0}.t()", 2, False), ("{0}.transpose(0, 1)", 2, False), ("{0}.permute(1, 0)", 2, False),
    ("{0}.unsqueeze(0)", 0, False), ("{0}.unsqueeze(-1)", 0, False), ("{0}.narrow(1, 0, 1)", 2, False),
    ("{0}[:, :1]", 2, False), ("{0}[:]", 1, False), ("{0}[...]", 0, False), ("{0}.select(0, -1)", 1, True),
    ("{0}.view({0}.shape)", 0, False), ("{0}.expand({0}.shape)", 0, False), ("{0}.squeeze()", 0, False),
    ("{0}[:{0}.shape[0]]", 1, False), ("{0}.view(*{0}.shape)", 0, False),
    ("{0}.unsqueeze(0).expand(2, *{0}.shape)[1]", 0, False),
]
# Views the scope cannot type: mutated at once, then only returned.
LOOSE_VIEWS = [
    ("{0}[:, 1:]", 2), ("{0}[1:]", 1), ("{0}[::2]", 1), ("{0}[:, ::2]", 2), ("{0}.diagonal()", 2),
    ("{0}.reshape(-1)", 0), ("{0}.flatten()", 0), ("{0}[:-1, 1:]", 2), ("{0}.t()[1:]", 2),
    ("{0}.unflatten(-1, ({0}.shape[-1], 1))", 1),
    # Sizes from the shape (symbolic when the sizes are dynamic).
    ("{0}.narrow(-1, 1, {0}.shape[-1] - 1)", 1), ("{0}.reshape(-1)[:{0}.shape[-1]]", 1),
    ("{0}[{0}.shape[0] // 2:]", 1), ("{0}.reshape({0}.shape[-1], -1)", 2),
    ("{0}.reshape(-1)[1::{0}.shape[-1]]", 1),
]
# Module calls of prelude.MODULES on a float32 value ``{0}``, each keeping its shape; the probe
# stands for the module where the probe cannot call it.
MODULE_CALLS = [
    "GLIN({0}.unsqueeze(-1)).squeeze(-1)", "GLN(torch.stack([{0}, {0} * 2 + 1], -1)).sum(-1)",
    "GBN({0}.reshape(-1, 1)).reshape({0}.shape)", "GDROP({0})", "GCNT({0})",
    "GSEQ({0}.unsqueeze(-1)).squeeze(-1)",
]
MODULE_STATE = [
    "with torch.no_grad():\n    GLIN.weight.mul_(0.5)", "with torch.no_grad():\n    GLIN.bias.add_(0.25)",
    "with torch.no_grad():\n    GCNT.scale.copy_(GCNT.scale * 2)", "GCNT.total.zero_()",
    "GBN.eval()", "GBN.train()", "GBN.train(GCNT.count % 2 == 0)", "GCNT.count += 1",
    "GCNT.flag = not GCNT.flag", "GDROP.train(False)", "GLN.weight.data.mul_(2)",
    "GBN.momentum = 0.5",
]


class Aliasing:
    """Needs the Generator's helpers (``rng``, ``pick``, ``chance``, ``fresh``, ``tensor_expr``,
    ``exact_expr``, ``inplace_candidate``, ``literal``, ``runtime_number``, ``mask``)."""

    def alias_statement(self, s, depth, loop):
        return self.weighted({
            (lambda: self.view_stmt(s)): 4, (lambda: self.index_write(s)): 3,
            (lambda: self.out_arg(s)): 1, (lambda: self.metadata_write(s)): 0.7,
            (lambda: self.module_call(s)): 2.5, (lambda: self.module_state(s)): 1.2,
            (lambda: self.grad_read(s)): 0.8, (lambda: self.data_sized(s)): 1,
        })

    def _base(self, s, want=None):
        """A tensor of the scope, the inputs' parts more often than their share."""
        inputs = [n for n in ("x", "y", "d['a']", "obj.t", "lst[0]", "d['i']", "obj.h", "GT")
                  if n in s.tensors and (want is None or want(s.tensors[n]))]
        if inputs and self.chance(0.5):
            name = self.pick(inputs)
            return name, s.tensors[name]
        return self.var(s, want)

    def view_stmt(self, s):
        base = self._base(s)
        rank = len(base[1].shape)
        name = self.fresh("v")
        if self.chance(0.25):
            # Kept in the caller's dict or object: the caller sees it alias the base.
            name = self.pick(["d['v']", "obj.w"])
        if self.chance(0.7):
            options = [t for t, r, row0 in TYPED_VIEWS if r <= rank and not (row0 and base[1].shape[0] == 1)]
            for _ in range(4):
                template = self.pick(options)
                ty = infer(template, [base], rounds=False)
                if ty is not None and ty.dtype == base[1].dtype:
                    break
            else:
                return Line(f"{name} = {base[0]}[...]")
            s.tensors[name] = ty
            lines = [f"{name} = {template.format(base[0])}"]
            if "expand" not in template and self.chance(0.7):
                for _ in range(4):
                    write = self.inplace_candidate(s, (name, ty))
                    if write:
                        lines.append(write)
                        break
            if self.chance(0.5):  # the base read after the write through its view
                read = self.fresh("t")
                s.tensors[read] = Ty(base[1].shape, base[1].dtype, base[1].err)
                lines.append(f"{read} = {base[0]} * 1" if base[1].dtype != torch.bool else f"{read} = {base[0]}.clone()")
            return Line("\n".join(lines))
        options = [t for t, r in LOOSE_VIEWS if r <= rank]
        if not options:
            return Line(f"{name} = {base[0]}.view({base[0]}.shape)")
        template = self.pick(options)
        integer = not base[1].floating
        number = self.pick(["1", "2", "-1"]) if integer else self.pick(["1", "0.5", "-2", "3"])
        write = self.pick([f"{name}.add_({number})", f"{name}.mul_({number})", f"{name}.zero_()",
                           f"{name}.fill_({number})", f"{name}.copy_({name} * 2)",
                           f"{name}[0] = {number}", f"{name} += {number}"])
        s.returnable.append(name)
        return Line(f"{name} = {template.format(base[0])}\n{write}")

    def index_write(self, s):
        target, ty = self._base(s, lambda t: len(t.shape) >= 1 and t.shape[0] != 1)
        if not ty.shape or ty.shape[0] == 1:
            return Line(f"{target}.zero_()")
        number = self.runtime_number(s) if self.chance(0.3) else self.literal()
        if not ty.floating and isinstance(number.value, float):
            number = Num(self.pick(["1", "2", "-1"]), 1)
        two = len(ty.shape) == 2
        kind = self.rng.randrange(6)
        # (the statement, a probe for infer that evaluates to the target); ``{0}`` is the
        # target, ``{1}`` the value written.
        if kind == 0 and ty.exact:
            index = f"{{0}} {self.pick(['>', '<', '!=', '>='])} 0"
            line, probe = f"{{0}}[{index}] = {{1}}", f"{{0}}.__setitem__({index}, {{1}}) or {{0}}"
            if self.chance(0.4):  # a value of the mask's data-dependent length
                line = f"{{0}}[{index}] = {{0}}[{index}] * 2"
                probe = f"{{0}}.__setitem__({index}, {{0}}[{index}] * 2) or {{0}}"
        elif kind == 1:
            index = self.pick(["[:, 0]", "[:, -1]", "[0, :]", "[-1, -1]", "[..., 0]"] if two else ["[0]", "[-1]"])
            op = self.pick(["+=", "-=", "*="])
            method = {"+=": "add_", "-=": "sub_", "*=": "mul_"}[op]
            line, probe = f"{{0}}{index} {op} {{1}}", f"{{0}}{index}.{method}({{1}}) is None or {{0}}"
        elif kind == 2:
            index = self.pick(["torch.tensor([0, -1])", "torch.tensor([1, 0])", "torch.tensor([0, 0])",
                               "[0, 1]", "torch.tensor([True] + [False] * ({0}.shape[0] - 1))"])
            line, probe = f"{{0}}[{index}] = {{1}}", f"{{0}}.__setitem__({index}, {{1}}) or {{0}}"
        elif kind == 3:
            idx = self.pick(["torch.tensor([0, 1])", "torch.tensor([0, 0])", "torch.tensor([-1])"])
            accumulate = "True" if "0, 0" in idx else self.pick(["True", "False"])
            value = self.pick(["{0}[1] * 2", "{0}[0]", "torch.ones_like({0}[0])"])
            line = f"{{0}}.index_put_(({idx},), {value}, accumulate={accumulate})"
            probe = line
        elif kind == 4 and two:
            index = self.pick(["0, 1", "-1, 0", ":, 1", "1, :"])
            line = f"{{0}}[{index}] = {{1}}"
            probe = f"{{0}}.__setitem__(({index.replace(':', 'slice(None)')}), {{1}}) or {{0}}"
        else:
            row = self.tensor_expr(s, 1)
            line, probe = "{0}[1] = {1}", "{0}.__setitem__(1, {1}) or {0}"
            if ty.floating or not row[1].floating:
                number = row
        out = infer(probe, [(target, ty), number], rounds=kind == 1, inplace_of=ty)
        if out is None or (out.shape, out.dtype) != (ty.shape, ty.dtype):
            return Line(f"{target}[0] = 0")
        value = number.code if isinstance(number, Num) else number[0]
        return Line(line.format(target, value))

    def out_arg(self, s):
        target, ty = self._base(s)
        if self.chance(0.25):
            # A write to each tensor of a list, as optimizers make them.
            other, tother = self._base(s)
            numbers = ["1", "2", "-1"] if not (ty.floating and tother.floating) else ["0.5", "2", "-1"]
            op = self.pick(["_foreach_add_", "_foreach_mul_"])
            return Line(f"torch.{op}([{target}, {other}], {self.pick(numbers)})")
        for _ in range(5):
            a, b = self.tensor_expr(s, 1), self.tensor_expr(s, 1)
            op = self.pick(["torch.add({0}, {1}, out={2})", "torch.mul({0}, {1}, out={2})",
                            "torch.maximum({0}, {1}, out={2})", "torch.sub({0}, {1}, alpha=2, out={2})"])
            out = infer(op.replace(", out={2}", ""), [a, b], rounds=True)
            if out is not None and (out.shape, out.dtype) == (ty.shape, ty.dtype) and out.err <= ty.err:
                return Line(op.format(a[0], b[0], target))
        return Line(f"torch.mul({target}, 1, out={target})")

    def metadata_write(self, s):
        target, ty = self._base(s, lambda t: len(t.shape) == 2)
        if len(ty.shape) != 2:
            return Line(f"{target}.unsqueeze_(0)\n{target}.squeeze_(0)")
        if self.chance(0.5):
            # A local view whose own shape changes; the base is the scope's.
            name = self.fresh("v")
            op, shape = self.pick([(".t_()", (ty.shape[1], ty.shape[0])),
                                   (".unsqueeze_(0)", (1,) + ty.shape),
                                   (".transpose_(0, 1)", (ty.shape[1], ty.shape[0]))])
            s.tensors[name] = Ty(shape, ty.dtype, ty.err)
            return Line(f"{name} = {target}[:]\n{name}{op}")
        # The caller's tensor changes shape for a while, and back.
        read = self.fresh("t")
        s.tensors[read] = Ty((ty.shape[1],) if ty.shape[0] != 1 else (ty.shape[0],), ty.dtype, ty.err)
        if ty.shape[0] == 1:
            return Line(f"{target}.t_()\n{read} = {target}[:, 0].clone()\n{target}.t_()")
        return Line(f"{target}.t_()\n{read} = {target}[:, 0].clone()\n{target}.t_()")

    def module_input(self, s):
        a = self.tensor_expr(s, 1, lambda t: t.exact)
        code = a[0] if a[1].dtype == F32 else f"{a[0]}.float()"
        return code, Ty(a[1].shape, F32)

    def module_expr(self, s, depth=0):
        a = self.module_input(s)
        template = self.pick(MODULE_CALLS)
        if "GBN" in template and not any(d in ("A", "B") for d in a[1].shape):
            template = "GDROP({0})"  # batch norm in training needs more than one value
        return self.make(template, a, probe="({0} * 2 + 1)")

    def module_call(self, s):
        found = self.module_expr(s)
        name = self.fresh("t")
        if found is None:
            s.tensors[name] = s.tensors["x"]
            return Line(f"{name} = GDROP(x)")
        code, ty = found
        if self.chance(0.3):
            code = f"{code}.detach()"
        s.tensors[name] = Ty(ty.shape, ty.dtype, 1)  # not exact: a linear layer's sums reorder
        return Line(f"{name} = {code}")

    def module_state(self, s):
        return Line(self.pick(MODULE_STATE))

    def grad_read(self, s):
        a, ty = self.var(s)
        if ty.floating and self.chance(0.35):
            # A leaf made to require grad (never written in place: eager refuses that), and a
            # result of it that requires grad and that later statements may write.
            leaf, out = self.fresh("r"), self.fresh("t")
            s.returnable.append(leaf)
            s.tensors[out] = infer("({0} * 2)", [(a, ty)], rounds=True) or ty
            return Line(f"{leaf} = {a}.detach().clone().requires_grad_()\n{out} = {leaf} * 2")
        name = self.fresh("n")
        s.ints.append(name)
        return Line(self.pick([f"{name} = int({a}.requires_grad)", f"{name} = int({a}.grad_fn is None)",
                               f"{name} = int({a}.is_leaf) + 2 * int({a}.grad_fn is None)",
                               f"{name} = int({a}.is_contiguous())"]))

    def data_sized(self, s):
        m = self.mask(s, 0)
        kind = self.rng.randrange(5)
        if kind < 3:
            name = self.fresh("n")
            s.ints.append(name)
            return Line(self.pick([f"{name} = {m[0]}.nonzero().shape[0]",
                                   f"{name} = len(torch.where({m[0]})[0])",
                                   f"{name} = int({m[0]}.sum())"]))
        name = self.fresh("t")
        ty = m[1]
        for _ in range(4):
            a = self.exact_expr(s, 1)
            if a[1].shape == ty.shape and a[1].dtype != torch.bool:
                break
        else:
            return Line(f"{name} = torch.where({m[0]})")  # a tuple of index tensors
        total = f"{a[0]}[{m[0]}]"
        if a[1].floating:
            s.tensors[name] = Ty((), a[1].dtype, 1)
            return Line(f"{name} = {total}.sum().reshape(())" if kind == 3 else
                        f"{name} = ({total} * 2).sum()")
        s.tensors[name] = Ty((), torch.int64)
        return Line(f"{name} = {total}.long().sum()")
