"""Random valid programs from a seed: ``generate(seed) -> Program``.

The generated module defines ``f(x, y, lst, d, obj)`` (inputs described in prelude.py) and
``make_inputs(variant)``. The generator keeps a typed scope of the names it can use, with the
symbolic shape of every tensor (dims ``"A"``, ``"B"`` or ``1``), so that almost every program runs
without error in eager mode; the few errors it does make on purpose (a ``raise``, an index out of
range, a shape mismatch inside ``try``) are the same in eager and compiled code and are compared
by exception type.

Statements about views, aliasing, modules and autograd state are in aliasing.py; tensor
expressions in expressions.py.

Names bound inside a nested body (an ``if``, a loop, ``try``, ``with``) are forgotten when the
body ends, because later code cannot know that the body ran; names bound before are only
re-bound with a value of the same kind and shape, so the scope stays true on every path.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from .aliasing import Aliasing
from .expressions import Expressions
from .prelude import ALIASED_INPUTS, LAYOUTS, prelude_nodes
from .program import Block, Line, Program
from .typed import F32, FULL, HALVES, ROW, Num, Ty, guard_int, infer


@dataclass
class Scope:
    # Tensor expressions that can be read, with their types (typed.Ty). Inputs and their parts
    # (``d['a']``, ``obj.t``, ``lst[0]``) are here too, so in-place ops reach them.
    tensors: dict = field(default_factory=dict)
    ints: list = field(default_factory=list)
    floats: list = field(default_factory=list)
    lists: dict = field(default_factory=dict)  # local list of tensors -> element shape
    dicts: list = field(default_factory=list)  # local dicts {'u': tensor, 'v': int}; 'u' FULL
    pairs: dict = field(default_factory=dict)  # Pair -> Ty of .total()
    boxes: list = field(default_factory=list)  # local Box objects; .t is FULL
    views: list = field(default_factory=list)  # d.keys() / d.values() views
    gens: dict = field(default_factory=dict)  # unstarted generator -> shape of what it yields
    returnable: list = field(default_factory=list)  # other names worth returning

    def copy(self) -> Scope:
        return Scope(dict(self.tensors), list(self.ints), list(self.floats), dict(self.lists),
                     list(self.dicts), dict(self.pairs), list(self.boxes), list(self.views),
                     dict(self.gens), list(self.returnable))


INPUT_TENSORS = {"x": Ty(FULL), "y": Ty(ROW), "d['a']": Ty(FULL), "obj.t": Ty(FULL),
                 "lst[0]": Ty(ROW), "lst[-1]": Ty(ROW), "d['i']": Ty(FULL, torch.int64),
                 "d['q']": Ty(ROW, torch.int8), "d['b']": Ty(ROW, torch.bfloat16),
                 "obj.h": Ty(FULL, torch.float16), "obj.u": Ty(FULL, torch.uint8),
                 "obj.i": Ty(ROW, torch.int32), "GT": Ty((1,))}
EXCEPTIONS = ["ValueError", "KeyError", "IndexError", "RuntimeError", "ZeroDivisionError"]


# Constructs that ``avoid`` can leave out. By default nothing is left out: this is for finding
# further kinds of failure while a known one (named here) would otherwise hide them.
FEATURES = {
    "hasattr": "hasattr(obj, ...) on an object whose attributes the function changes",
    "mutate-while-iterating": "appending to lst inside `for u in lst`",
    "global-read-write": "n = G0; G0 = G0 + 1",
    "dict-views": "d.keys()/values()/items() kept in a variable while d changes",
    "graph-exceptions": "a tensor op that raises inside `try`",
    "user-context-managers": "`with` on Ctx / @contextmanager objects",
}


class Generator(Expressions, Aliasing):
    def __init__(self, seed: int, max_statements: int = 14, avoid: frozenset = frozenset()):
        self.avoid = avoid
        self.rng = random.Random(seed)
        self.seed = seed
        self.counter = 0
        self.budget = max_statements
        # Inside ``for ... in lst`` the body must not grow lst (eager would never end).
        self.iterating_lst = 0

    # ---- helpers -------------------------------------------------------------------------

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def pick(self, seq):
        return self.rng.choice(list(seq))

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def weighted(self, table: dict):
        """Calls one of the zero-argument functions in ``{fn: weight}``."""
        fns, weights = zip(*table.items())
        return self.rng.choices(fns, weights)[0]()

    # ---- expressions ---------------------------------------------------------------------

    def int_expr(self, s: Scope) -> str:
        options = [
            lambda: str(self.rng.randint(0, 4)),
            lambda: self.pick(s.ints) if s.ints else "1",
            lambda: self.pick(["len(lst)", "x.shape[0]", "y.shape[-1]", "G0", "obj.n", "d['n']",
                               "len(obj.log)", "GD['calls']", "len(GL)", "obj.double"]),
            lambda: f"int({self.exact_expr(s, 2)[0]}.sum().item() > 0)",
            lambda: f"({self.int_expr(s)} + {self.rng.randint(1, 3)}) % 5",
            lambda: f"{self.pick(s.pairs)}.b" if s.pairs else "2",
            lambda: f"len({self.pick(s.views)})" if s.views else "0",
            lambda: f"len({self.tensor_expr(s, 2)[0]}.tolist())",
        ]
        return self.rng.choices(options, [2, 3, 4, 1, 0.7, 0.5, 0.5, 0.3])[0]()

    def num_expr(self, s: Scope) -> str:
        if s.floats and self.chance(0.3):
            return self.pick(s.floats)
        if self.chance(0.2):
            return "GF"
        return self.int_expr(s)

    def cond(self, s: Scope) -> str:
        a, ta = self.exact_expr(s)
        mean = f"{a}.mean()" if ta.floating else f"{a}.float().mean()"
        n = self.int_expr(s)
        return self.pick([
            self.pick(["True", "False", "2 > 1", "None is None"]),
            f"x.shape[0] > {self.rng.randint(2, 4)}", "x.dim() == 2", f"len(lst) > {self.rng.randint(1, 3)}",
            f"y.numel() == {self.rng.randint(2, 5)}",
            f"G0 > {self.rng.randint(2, 5)}", "G0 % 2 == 0", "len(GL) > 1", "GD['calls'] > 1",
            f"{a}.sum().item() > 0", f"bool(({a} > 0).any())", f"{mean} > 0",
            f"{n} % 2 == 0", f"{n} > 2",
            "obj.n > 2" if "hasattr" in self.avoid else "hasattr(obj, 'extra')", "obj.n > 2", "'k' in d", "len(obj.log) > 1",
            f"isinstance({a}, torch.Tensor)", "len(d) > 2",
        ])

    # ---- statements ----------------------------------------------------------------------

    def body(self, s: Scope, n: int, depth: int, loop: str | None) -> list:
        """``n`` statements in a copy of ``s``; names they bind are dropped afterwards."""
        inner = s.copy()
        out = []
        for _ in range(n):
            if self.budget <= 0:
                break
            self.budget -= 1
            out.append(self.statement(inner, depth, loop))
        return out

    def statement(self, s: Scope, depth: int, loop: str | None):
        deep = depth < 2
        table = {
            self.assign_tensor: 6, self.inplace: 4, self.assign_number: 3, self.containers: 4,
            self.dict_ops: 2, self.objects: 3, self.globals_write: 3, self.print_stmt: 1.5,
            self.comprehension: 1.5, self.closure: 1, self.config_read: 0.8, self.raise_stmt: 0.4,
            self.early_return: 0.3,
            self.alias_statement: 9,
        }
        if deep:
            table.update({self.if_stmt: 3, self.for_stmt: 2.5, self.try_stmt: 2,
                          self.with_stmt: 1.5, self.while_stmt: 0.7})
        if loop:
            table[self.loop_exit] = 1.2 if loop == "for" else 0.6
        return self.weighted({(lambda fn=fn: fn(s, depth, loop)): w for fn, w in table.items()})

    def assign_tensor(self, s, depth, loop):
        code, ty = self.tensor_expr(s)
        name = self.fresh("t")
        s.tensors[name] = ty
        return Line(f"{name} = {code}")

    def inplace(self, s, depth, loop):
        target = self.pick(s.tensors)
        for _ in range(6):
            line = self.inplace_candidate(s, (target, s.tensors[target]))
            if line:
                return Line(line)
        return Line(f"{target}.zero_()")

    def inplace_candidate(self, s, t) -> str | None:
        """An in-place op on ``t`` that eager accepts and that keeps its type (typed.infer's
        ``inplace_of``), or None."""
        target, ty = t
        value = self.tensor_expr(s, 1)
        if not ty.floating and value[1].floating:  # floats copied into integers: keep them in range
            value = (guard_int(value[0], value[1], ty.dtype), value[1])
        number = self.runtime_number(s) if self.chance(0.5) else self.literal()
        kind = self.rng.randrange(8)
        probe, rounds = None, True
        if kind == 0:
            template, operands, probe = "{0} += {1}", [t, value], "{0}.add_({1})"
        elif kind == 1:
            template, operands = f"{{0}}.{self.pick(['add_', 'sub_', 'mul_'])}({{1}})", [t, value]
        elif kind == 2:
            template, operands, rounds = "{0}." + self.pick(
                ["relu_()", "clamp_(-1, 1)", "neg_()", "zero_()", "clamp_(min=0)", "abs_()"]), [t], False
        elif kind == 3 and ty.shape and ty.shape[0] != 1:
            index = self.pick(["0", "-1"])
            template, rounds = f"{{0}}[{index}] = {{1}}", False
            operands = [t, value if self.chance(0.6) else number]
            probe = f"{{0}}.__setitem__({index}, {{1}}) or {{0}}"
        elif kind == 4:
            template, operands = ("{0}.copy_({1})", [t, value]) if self.chance(0.6) else \
                ("{0}.fill_({1})", [t, number])
            rounds = False
        elif kind == 5:
            template, operands = f"{{0}}.{self.pick(['mul_', 'div_', 'add_'])}({{1}})", [t, self.literal()]
        elif kind == 6:
            template, operands, rounds = "{0}.masked_fill_({1}, {2})", [t, self.mask(s, 1), number], False
        else:
            template, operands = f"{{0}}.add_({{1}}, alpha={self.pick(['2', '-1', '0.5'])})", [t, value]
        out = infer(template, operands, rounds=rounds, probe=probe, inplace_of=ty)
        if out is None or (out.shape, out.dtype) != (ty.shape, ty.dtype):
            return None
        return template.format(*(op.code if isinstance(op, Num) else op[0] for op in operands))

    def assign_number(self, s, depth, loop):
        if s.ints and self.chance(0.35):
            return Line(f"{self.pick(s.ints)} += {self.int_expr(s)}")
        if self.chance(0.25):
            name = self.fresh("f")
            a, ta = self.exact_expr(s)
            s.floats.append(name)  # after: `f7 = (x * f7).mean().item()` reads it unbound
            if not ta.floating:  # an integer's item() is an int: the name must hold a float
                return Line(f"{name} = float({a}.{self.pick(['sum', 'amax'])}().item())")
            return Line(f"{name} = {a}.{self.pick(['sum', 'mean', 'amax'])}().item()")
        name = self.fresh("n")
        line = Line(f"{name} = {self.int_expr(s)}")
        s.ints.append(name)
        return line

    def containers(self, s, depth, loop):
        kind = self.rng.randrange(9)
        if kind == 0 or (kind == 1 and not s.lists):
            name = self.fresh("acc")
            code, ty = self.tensor_expr(s)
            s.lists[name] = ty.shape
            return Line(f"{name} = [{code}]" if self.chance(0.5) else f"{name} = []")
        if kind == 1:
            name = self.pick(s.lists)
            for _ in range(4):
                code, ty = self.tensor_expr(s)
                if ty.shape == s.lists[name]:
                    return Line(f"{name}.append({code})")
            return Line(f"{name}.append({name}[-1] * 2)" if self.chance(0.5) else f"{name}.clear()")
        if self.iterating_lst and kind in (2, 5, 7):
            kind = 4
        row = self.row_expr(s)
        if kind == 2:
            return Line(f"lst.append({row})")
        if kind == 3:
            # Guarded, so that lst[0] and lst[-1] stay valid.
            return Block(header="if len(lst) > 1:", body=[Line("lst.pop()")])
        if kind == 4:
            return Line(f"lst[{self.pick(['0', '-1'])}] = {row}")
        if kind == 5:
            return Line(self.pick([f"lst.insert(0, {row})", f"lst.extend([{row}, {row}])",
                                   "lst.reverse()", "lst.sort(key=lambda u: float(u.sum()))"]))
        if kind == 6:
            name = self.fresh("tup")
            a, ta = self.tensor_expr(s)
            n = self.int_expr(s)
            t2, n2 = self.fresh("t"), self.fresh("n")
            s.tensors[t2] = ta
            s.ints.append(n2)
            s.returnable.append(name)
            return Line(f"{name} = ({a}, {n})\n{t2}, {n2} = {name}")
        if kind == 7 and "mutate-while-iterating" not in self.avoid:
            # Mutating the list while iterating it: a bounded growth eager handles.
            return Block(header="for u in lst:", body=[
                Block(header=f"if len(lst) < {self.rng.randint(3, 6)}:",
                      body=[Line(f"lst.append(u * {self.rng.randint(2, 3)})")], keep=True)])
        name = self.fresh("n")
        s.ints.append(name)
        return Line(f"{name} = len(lst) + lst.index(lst[-1])" if self.chance(0.3)
                    else f"{name} = sum(1 for u in lst if u.sum().item() > 0)")

    def row_expr(self, s):
        return self.float32_expr(s, ROW, "(y * {})")

    def full_expr(self, s):
        return self.float32_expr(s, FULL, "(x + {})")

    def float32_expr(self, s, shape, fallback):
        """A float32 expression of ``shape``, for the inputs' tensors (lst's, obj.t) that the
        generator always treats as float32."""
        for _ in range(5):
            code, ty = self.exact_expr(s, 0, lambda t: t.shape == shape)
            if ty.shape == shape and ty.exact:
                return code if ty.dtype == F32 else f"{code}.float()"
        return fallback.format(self.rng.randint(1, 3))

    def dict_ops(self, s, depth, loop):
        kind = self.rng.randrange(8)
        if kind == 0:
            return Line(f"d['n'] += {self.int_expr(s)}")
        if kind == 1:
            return Line(f"d['k'] = {self.tensor_expr(s)[0]}")
        if kind == 2:
            return Line(self.pick(["d.pop('k', None)", "d.setdefault('k', 0)", "d.update(m=1)"]))
        if kind == 3 and "dict-views" not in self.avoid:
            name = self.fresh("kv")
            s.views.append(name)
            return Line(f"{name} = d.{self.pick(['keys', 'values', 'items'])}()")
        if kind == 4 and s.views:
            name = self.fresh("n")
            s.ints.append(name)
            return Line(f"{name} = len(list({self.pick(s.views)}))")
        if kind == 5:
            name = self.fresh("dl")
            s.dicts.append(name)
            return Line(f"{name} = {{'u': {self.full_expr(s)}, 'v': {self.int_expr(s)}}}")
        if kind == 6:
            name = self.fresh("dc")
            s.returnable.append(name)
            a = self.tensor_expr(s)[0]
            return Line(f"{name} = {{str(i): {a} * i for i in range({self.rng.randint(1, 3)})}}")
        if s.dicts:
            dl = self.pick(s.dicts)
            return Line(self.pick([f"{dl}['v'] += 1", f"{dl}['u'] = {dl}['u'] * 2",
                                   f"{dl}['w'] = len({dl})"]))
        return Block(header="for key, value in d.items():",
                     body=[Line("obj.log.append(key)")])

    def objects(self, s, depth, loop):
        kind = self.rng.randrange(10)
        if kind == 0:
            return Line(f"obj.n += {self.int_expr(s)}")
        if kind == 1:
            return Line(f"obj.t = {self.full_expr(s)}")
        if kind == 2:
            return Line(f"obj.extra = {self.int_expr(s)}")
        if kind == 3:
            return Line(f"obj.log.append('{self.fresh('m')}')")
        if kind == 4:
            name = self.fresh("n")
            s.ints.append(name)
            return Line(f"{name} = obj.bump({self.rng.randint(1, 2)})")
        if kind == 5:
            name = self.fresh("b")
            s.boxes.append(name)
            return Line(f"{name} = Box({self.full_expr(s)}, {self.int_expr(s)})")
        if kind == 6:
            name = self.fresh("p")
            code, ty = self.tensor_expr(s, 0, lambda t: t.dtype not in HALVES)
            if ty.dtype in HALVES:  # p.a * 2 would be one more fp16 rounding each time
                code, ty = "x", s.tensors["x"]
            n = self.int_expr(s)  # before the pair is in scope: `p4 = Pair(x, p4.b)` fails
            s.pairs[name] = infer("({0} * 2)", [(code, ty)], rounds=True) or ty
            return Line(f"{name} = Pair({code}, {n})")
        if kind == 7 and s.pairs:
            p = self.pick(s.pairs)
            return Line(self.pick([f"{p}.b += 1", f"{p}.a = {p}.a * 2", f"{p}.b = {p}.b * 3"]))
        if kind == 8 and s.boxes:
            b = self.pick(s.boxes)
            return Line(self.pick([f"{b}.bump()", f"{b}.t = {b}.t + obj.t", f"{b}.log.append('b')"]))
        if "hasattr" in self.avoid:
            return Line("obj.log.append('h')")
        return Block(header="if hasattr(obj, 'extra'):", body=[Line("obj.n += obj.extra")],
                     clauses=[("else:", [Line("obj.extra = 1")])] if self.chance(0.5) else [])

    def globals_write(self, s, depth, loop):
        kind = self.rng.randrange(7)
        if kind == 0:
            return Line("G0 += 1")
        if kind == 1 and "global-read-write" not in self.avoid:
            name = self.fresh("n")
            s.ints.append(name)
            # Reading a global and then writing it back: the read must keep the old value.
            return Line(f"{name} = G0\nG0 = G0 + {self.rng.randint(1, 3)}")
        if kind == 2:
            return Line(f"G0 = {self.int_expr(s)}")
        if kind == 3:
            return Line(f"GL.append({self.int_expr(s)})")
        if kind == 4:
            return Line("GD['calls'] += 1")
        if kind == 5:
            a, ta = self.exact_expr(s, 0)
            return Line(f"GT = {a}.sum().reshape(1)" + ("" if ta.dtype == F32 else ".float()"))
        return Line(f"GF = GF * {self.pick(['0.5', '2.0', '1.5'])}")

    def config_read(self, s, depth, loop):
        """A value read through state that perturb() changes between calls (prelude CONFIG):
        a number kept in GL, or a tensor that takes the place of one in scope (so that more
        of what follows depends on it)."""
        fns = ["cfg_scaled", "TAB.tab_scaled", "TAB.tab_cfg", "TAB.tab_step", "cfg_shifted"]
        if self.chance(0.4):
            if self.chance(0.25):
                return Line("GL.append(TAB.tab_k)")
            return Line(f"GL.append({self.pick(fns)}({self.rng.randint(1, 3)}))")
        code, ty = self.exact_expr(s, 0)
        if ty.dtype != F32:
            code, ty = "x", s.tensors["x"]
        name = code if code in s.tensors and code.isidentifier() else self.fresh("t")
        s.tensors[name] = ty
        return Line(f"{name} = {self.pick(fns)}({code})")

    def print_stmt(self, s, depth, loop):
        a = self.exact_expr(s)[0]
        return Line(self.pick([
            f"print('p', {self.int_expr(s)}, tuple({a}.shape))",
            # Four significant digits: a float32 sum may end differently (README: fp32 sums add
            # in fp64), and round(..., 2) of a large value prints every digit.
            f"print('v', format({a}.sum().item(), '.4g'))",
            "print('lens', len(lst), len(d), len(obj.log))",
            f"print(f\"n={{{self.int_expr(s)}}}\")",
        ]))

    def comprehension(self, s, depth, loop):
        kind = self.rng.randrange(4)
        a, ta = self.tensor_expr(s, 1)
        sa = ta.shape
        if kind == 0:
            name = self.fresh("acc")
            s.lists[name] = sa
            return Line(f"{name} = [{a} * i for i in range({self.rng.randint(1, 3)})]")
        if kind == 1:
            name = self.fresh("acc")
            s.lists[name] = sa
            return Line(f"{name} = list(scaled({a}, {self.rng.randint(1, 3)}))")
        if kind == 2:
            name = self.fresh("g")
            s.gens[name] = sa
            t = self.fresh("t")
            s.tensors[t] = infer("({0} * 1)", [(a, ta)], rounds=True) or ta
            return Line(f"{name} = scaled({a}, 3)\n{t} = next({name})")
        name = self.fresh("t")
        s.tensors[name] = Ty(ROW)
        return Line(f"{name} = sum([u * i for i, u in enumerate(lst)])")

    def closure(self, s, depth, loop):
        a, ta = self.tensor_expr(s, 1)
        fn = self.fresh("h")
        out = self.fresh("t")
        if self.chance(0.3):
            cnt = self.fresh("n")
            s.ints.append(cnt)
            return Line(f"{cnt} = 0\ndef {fn}():\n    nonlocal {cnt}\n    {cnt} += 1\n"
                        f"    return {cnt}\n{fn}()\n{fn}()")
        n = self.int_expr(s)
        b, tb = self.tensor_expr(s, 1)
        ty = self.closure_type((a, ta), (b, tb))
        if ty is None:
            b, tb = a, ta
            ty = self.closure_type((a, ta), (b, tb))
        if ty is None:  # a value the chain of fp16 ops cannot take further
            a, b, ty = "x", "x", s.tensors["x"]
        s.tensors[out] = ty
        if self.chance(0.5):
            return Line(f"{fn} = lambda u: u * {n} + {a}\n{out} = {fn}({b})")
        return Line(f"def {fn}(u):\n    return u * {n} + {a}\n{out} = {fn}({b})")

    @staticmethod
    def closure_type(a, b):
        """The type of ``u * n + a`` for ``u = b``, an op at a time: ``u * n`` is rounded in
        eager when ``b`` is fp16, also where ``a`` then promotes it to float32."""
        scaled = infer("({0} * 2)", [b], rounds=True)
        return scaled and infer("({0} + {1})", [("u * n", scaled), a], rounds=True)

    def raise_stmt(self, s, depth, loop):
        return Block(header=f"if {self.cond(s)}:",
                     body=[Line(f"raise {self.pick(EXCEPTIONS)}('r')")])

    def failing_stmt(self, s):
        """A statement that raises in eager mode, for a ``try`` body, and what it raises."""
        kind = self.pick(EXCEPTIONS)
        if "graph-exceptions" in self.avoid:
            return f"raise {kind}('t')", kind
        return self.pick([
            ("lst[10]", "IndexError"), ("d['missing']", "KeyError"), ("1 // 0", "ZeroDivisionError"),
            ("x + torch.ones(7)", "RuntimeError"),  # raised by a tensor op (inside a graph)
            ("torch.ones(2, 3) @ torch.ones(2, 3)", "RuntimeError"),
            ("d['i'] // (d['i'] * 0)", "RuntimeError"),  # an integer division by zero
            (f"raise {kind}('t')", kind),
        ])

    def early_return(self, s, depth, loop):
        return Block(header=f"if {self.cond(s)}:", body=[Line(self.return_line(s))])

    def loop_exit(self, s, depth, loop):
        word = "break" if loop == "while" or self.chance(0.5) else "continue"
        return Block(header=f"if {self.cond(s)}:", body=[Line(word)])

    def if_stmt(self, s, depth, loop):
        block = Block(header=f"if {self.cond(s)}:",
                      body=self.body(s, self.rng.randint(1, 3), depth + 1, loop))
        if self.chance(0.3):
            block.clauses.append((f"elif {self.cond(s)}:",
                                  self.body(s, self.rng.randint(1, 2), depth + 1, loop)))
        if self.chance(0.5):
            block.clauses.append(("else:", self.body(s, self.rng.randint(1, 2), depth + 1, loop)))
        return block

    def for_stmt(self, s, depth, loop):
        inner = s.copy()
        kind = self.rng.randrange(5)
        if kind == 0:
            i = self.fresh("i")
            inner.ints.append(i)
            header = f"for {i} in range({self.pick(['2', '3', 'len(lst)', 'x.shape[0]', 'G0 % 3'])}):"
        elif kind == 1:
            u = self.fresh("u")
            inner.tensors[u] = Ty(ROW)
            header = f"for {u} in lst:"
        elif kind == 2:
            i, u = self.fresh("i"), self.fresh("u")
            inner.ints.append(i)
            inner.tensors[u] = Ty(ROW)
            header = f"for {i}, {u} in enumerate(lst):"
        elif kind == 3:
            a, ta = self.tensor_expr(s, 1)
            u = self.fresh("u")
            inner.tensors[u] = infer("({0} * 1)", [(a, ta)], rounds=True) or ta
            header = f"for {u} in scaled({a}, {self.rng.randint(1, 3)}):"
        else:
            key = self.fresh("k")
            header = f"for {key} in {self.pick(['d', 'list(d)', 'd.keys()'])}:"
        over_lst = kind in (1, 2)
        self.iterating_lst += over_lst
        block = Block(header=header, body=self.body(inner, self.rng.randint(1, 3), depth + 1, "for"))
        self.iterating_lst -= over_lst
        if self.chance(0.15):
            block.clauses.append(("else:", self.body(s, 1, depth + 1, loop)))
        return block

    def while_stmt(self, s, depth, loop):
        w = self.fresh("w")
        inner = s.copy()
        inner.ints.append(w)
        body = self.body(inner, self.rng.randint(1, 2), depth + 1, "while")
        # The counter is bumped first so that no path can skip it, and the shrinker keeps it.
        return [Line(f"{w} = 0"),
                Block(header=f"while {w} < {self.rng.randint(1, 3)}:",
                      body=[Line(f"{w} += 1", keep=True)] + body)]

    def try_stmt(self, s, depth, loop):
        body = self.body(s, self.rng.randint(1, 2), depth + 1, loop)
        handlers = self.rng.sample(EXCEPTIONS, self.rng.randint(1, 2))
        if self.chance(0.6):
            line, raised = self.failing_stmt(s)
            body.insert(self.rng.randint(0, len(body)), Line(line))
            if raised not in handlers and self.chance(0.75):
                handlers[0] = raised
        block = Block(header="try:", body=body)
        kind = self.rng.randrange(4)
        if kind < 3:
            caught = handlers[0] if len(handlers) == 1 else f"({', '.join(handlers)})"
            block.clauses.append((f"except {caught} as e:",
                                  [Line("obj.log.append(type(e).__name__)")]
                                  + self.body(s, self.rng.randint(0, 1), depth + 1, loop)))
        if kind == 1:
            block.clauses.append(("except Exception:", [Line("obj.log.append('other')")]))
        if kind == 2 and self.chance(0.5):
            block.clauses.append(("else:", self.body(s, 1, depth + 1, loop)))
        if kind >= 2:
            block.clauses.append(("finally:", [Line("GL.append('fin')")]
                                  + self.body(s, self.rng.randint(0, 1), depth + 1, loop)))
        return block

    def with_stmt(self, s, depth, loop):
        kind = self.rng.randrange(5)
        if "user-context-managers" in self.avoid:
            kind = self.pick([0, 3])
        inner = s.copy()
        if kind == 0:
            header = "with torch.no_grad():"
        elif kind == 1:
            header = f"with Ctx(obj.log, '{self.fresh('c')}') as c:"
        elif kind == 2:
            n = self.fresh("n")
            inner.ints.append(n)
            header = f"with tracked(GL, '{self.fresh('c')}') as {n}:"
        elif kind == 3:
            header = "with torch.enable_grad():"
        else:
            header = f"with Ctx(GL, 'g'), tracked(obj.log, '{self.fresh('c')}'):"
        return Block(header=header, body=self.body(inner, self.rng.randint(1, 3), depth + 1, loop))

    # ---- the function --------------------------------------------------------------------

    def return_line(self, s: Scope) -> str:
        pool = list(s.tensors) + s.ints + s.floats + list(s.lists) + s.dicts + list(s.pairs) \
            + s.boxes + s.returnable + [f"list({v})" for v in s.views] + ["lst", "d", "obj", "G0"]
        items = self.rng.sample(pool, min(len(pool), self.rng.randint(1, 4)))
        form = self.rng.randrange(4)
        if form == 0 and len(items) == 1:
            return f"return {items[0]}"
        if form == 1:
            return "return {" + ", ".join(f"'r{i}': {v}" for i, v in enumerate(items)) + "}"
        if form == 2:
            return "return [" + ", ".join(items) + "]"
        return "return (" + ", ".join(items) + ",)"

    def function(self) -> Block:
        s = Scope(tensors=dict(INPUT_TENSORS), ints=["d['n']"])
        body = [Line("global G0, GF, GT")]
        while self.budget > 0:
            self.budget -= 1
            stmt = self.statement(s, 0, None)
            body.extend(stmt if isinstance(stmt, list) else [stmt])
        body.append(Line(self.return_line(s)))
        return Block(header="def f(x, y, lst, d, obj):", body=body, keep=True)


def _flatten(nodes: list) -> list:
    """while_stmt returns two nodes; nested bodies may hold such lists."""
    out = []
    for node in nodes:
        if isinstance(node, list):
            out.extend(_flatten(node))
        else:
            if isinstance(node, Block):
                node.body = _flatten(node.body)
                node.clauses = [(h, _flatten(b)) for h, b in node.clauses]
            out.append(node)
    return out


def generate(seed: int, max_statements: int | None = None, avoid=frozenset()) -> Program:
    """The program of ``seed``; ``avoid`` names FEATURES to leave out."""
    rng = random.Random(seed)
    sizes = []
    while len(sizes) < 2:
        a, b = rng.randint(2, 5), rng.randint(2, 5)
        if a != b and (a, b) not in [sz[:2] for sz in sizes]:
            sizes.append((a, b, rng.randint(1, 3)))
    # A third variant, from its own stream (programs of earlier campaigns stay as they were):
    # the call after the one that makes sizes dynamic runs the dynamic graph at new sizes.
    extra = random.Random(seed * 7 + 3)
    while len(sizes) < 3:
        # Rows up to 40 wide reach the kernels' vector loops as well as their tails.
        a, b = extra.randint(2, 7), extra.randint(2, 7) if extra.random() < 0.6 else extra.randint(8, 40)
        if a != b and (a, b) not in [sz[:2] for sz in sizes]:
            sizes.append((a, b, sizes[1][2]))
    special = extra.random() < 0.3  # inputs holding NaN, inf, zeros and the integers' extremes
    aliased = extra.choice(ALIASED_INPUTS) if extra.random() < 0.3 else ""
    layout = extra.choice(LAYOUTS) if extra.random() < 0.3 else ""
    unknown = set(avoid) - set(FEATURES)
    if unknown:
        raise ValueError(f"unknown features {sorted(unknown)}; known: {sorted(FEATURES)}")
    gen = Generator(seed, max_statements or rng.randint(6, 18), frozenset(avoid))
    f = gen.function()
    nodes = prelude_nodes(sizes, seed % 100_000, special, aliased, layout) + [f]
    return Program(_flatten(nodes), origin=str(seed))
