"""The instructions a split frame runs natively at a graph break (the unsupported line), as
Python statements over a symbolic stack of expressions, then the calls of the resume functions.
One handler per opcode family, in a table; an instruction without one makes the rendering say
so and raise ``NotImplementedError`` there instead of guessing."""

from __future__ import annotations

import ast
import builtins
import enum
import operator
import types
from typing import TYPE_CHECKING

from .. import compat
from .emit import NULL, Comment, assign, name_node

if TYPE_CHECKING:
    from .code import EntryRenderer


class CannotRender(Exception):
    pass


_BINARY = {"ADD": ast.Add, "SUBTRACT": ast.Sub, "MULTIPLY": ast.Mult, "TRUE_DIVIDE": ast.Div,
           "FLOOR_DIVIDE": ast.FloorDiv, "REMAINDER": ast.Mod, "POWER": ast.Pow,
           "MATRIX_MULTIPLY": ast.MatMult, "LSHIFT": ast.LShift, "RSHIFT": ast.RShift,
           "AND": ast.BitAnd, "OR": ast.BitOr, "XOR": ast.BitXor}
_COMPARE = {"LT": ast.Lt, "LE": ast.LtE, "EQ": ast.Eq, "NE": ast.NotEq, "GT": ast.Gt, "GE": ast.GtE}
_UNARY = {"UNARY_NEGATIVE": ast.USub, "UNARY_NOT": ast.Not, "UNARY_INVERT": ast.Invert,
          "UNARY_POSITIVE": ast.UAdd}
_JUMP_TESTS = {"TRUE": lambda c: c, "FALSE": lambda c: ast.UnaryOp(op=ast.Not(), operand=c),
               "NONE": lambda c: ast.Compare(left=c, ops=[ast.Is()], comparators=[ast.Constant(None)]),
               "NOT_NONE": lambda c: ast.Compare(left=c, ops=[ast.IsNot()], comparators=[ast.Constant(None)])}


def _enum_name(arg) -> str:
    return arg.name if isinstance(arg, enum.Enum) else str(arg)


class NativeRenderer:
    """The instructions a split frame runs natively (the unsupported line), as Python
    statements over a symbolic stack of expressions, then the resume calls."""

    def __init__(self, r: EntryRenderer, stack: list, line):
        self.r = r
        self.stack = stack
        self.line = line
        self.out: list = []
        self.kw_names: tuple = ()
        self.global_reads: set = set()  # ids of the plain names a native LOAD_GLOBAL pushed

    def render(self) -> list:
        brk = self.r.brk
        try:
            body, tail = self._run(brk.plan)
        except CannotRender as e:
            listing = "; ".join(f"{i.name} {i.arg!r}" if i.arg is not None else i.name
                                for i in brk.plan.native)
            return [Comment(f"Line {self.line} runs as plain Python here, but framejit cannot show "
                            f"it as Python ({e}): {listing}"),
                    ast.Raise(exc=ast.Call(func=name_node("NotImplementedError"), args=[ast.Constant(
                        f"framejit cannot show line {self.line} of {self.r.code.co_name} as Python ({e})")],
                        keywords=[]), cause=None)]
        what = (f"Line {self.line}, run as plain Python (the graph break); result: what it leaves "
                "for the rest of the function")
        out = [Comment(what)]
        if brk.exit_slots:
            leave = self.r.names(_leave_block())
            err = self.r.names.unique("error")
            handler_body = [Comment("it raised: leave the `with` blocks around it, innermost first, "
                                    "as the exception does in plain Python")]
            for slot in reversed(brk.exit_slots):
                handler_body.append(ast.Expr(value=ast.Call(func=name_node(leave), args=[
                    self.stack_expr_of(slot), name_node(err)], keywords=[])))
            handler_body.append(ast.Raise(exc=None, cause=None))
            out.append(ast.Try(body=body, handlers=[ast.ExceptHandler(
                type=name_node("BaseException"), name=err, body=handler_body)], orelse=[], finalbody=[]))
        else:
            out.extend(body)
        out.extend(tail)
        return out

    def stack_expr_of(self, slot: int):
        return name_node(f"stack_{slot}")

    def push(self, e) -> None:
        self.stack.append(e)

    def pop(self, n: int = 1) -> list:
        if n > len(self.stack):
            raise CannotRender("a stack framejit cannot follow")
        if n == 0:
            return []
        items = self.stack[-n:]
        del self.stack[-n:]
        return items

    def pending(self, e) -> bool:
        """Whether evaluating ``e`` later could differ from the instruction's doing it now (or
        raise somewhere else): anything but a literal, a variable of the rendered function, or
        one of its constants. A global read natively (``undefined_name``) is pending: its
        NameError must come where the instruction ran."""
        if e is NULL or isinstance(e, ast.Constant):
            return False
        if isinstance(e, ast.Name):
            return id(e) in self.global_reads
        return not self.r._constant(e)

    def flush(self, keep: int) -> None:
        """Give every pending value below the top ``keep`` entries a name: what runs next may
        change what they read."""
        for k in range(len(self.stack) - keep):
            e = self.stack[k]
            if self.pending(e):
                name = self.r.names.unique("value")
                self.out.append(assign(name, e))
                self.stack[k] = name_node(name)

    def value(self, e):
        if e is NULL:
            raise CannotRender("a NULL marker used as a value")
        return e

    def _run(self, plan) -> tuple[list, list]:
        for inst in plan.native:
            if inst.target is not None:
                return self.out, self._jump(inst, plan)
            handler = HANDLERS.get(inst.name)
            if handler is None:
                raise CannotRender(f"the instruction {inst.name}")
            handler(self, inst)
        if not plan.exits:  # a `raise` leaving the frame
            return self.out, []
        (exit_,) = plan.exits
        # Name what is left on the stack, in order, before the resume call.
        final = []
        for k in range(exit_.depth):
            e = self.value(self.stack[k])
            if self.pending(e):
                name = self.r.names.unique("result")
                self.out.append(assign(name, e))
                e = name_node(name)
            final.append(e)
        return self.out, self._resume_call(0, exit_, final)

    def _resume_call(self, k: int, exit_, final: list) -> list:
        from ..resume import resume_params, stack_param

        brk = self.r.brk
        resume = brk.resumes[k]
        name = self.r.resume_name(resume)
        if isinstance(resume, types.CodeType):
            cells = [name_node(f"{v}_cell") for v in self.r.code.co_freevars]
            fn = ast.Call(func=name_node(self.r.names(types.FunctionType)), args=[
                name_node(name), name_node(self.r.names(self.r.f_globals)), ast.Constant(None),
                ast.Constant(None), ast.Tuple(elts=cells, ctx=ast.Load())], keywords=[])
        else:
            fn = name_node(name)
        by_param = {stack_param(j): (ast.Call(func=name_node("list"), args=[e], keywords=[])
                                     if j in exit_.iters else e)
                    for j, e in enumerate(final)}
        args = [by_param.get(p, name_node(compat.py_name(p)))
                for p in resume_params(brk.base or self.r.code, exit_.depth, brk.live)]
        line = _line_of(resume)
        return [Comment(f"The rest of {self.r._base_name()}, from line {line}: {name}, captured on its "
                        "first call"),
                ast.Return(value=ast.Call(func=fn, args=args, keywords=[]))]

    def _jump(self, inst, plan) -> list:
        name = inst.name
        kind = name.rsplit("_IF_", 1)[-1]
        keep_on_jump = name in ("JUMP_IF_TRUE_OR_POP", "JUMP_IF_FALSE_OR_POP")
        if keep_on_jump:
            kind = "TRUE" if "TRUE" in name else "FALSE"
        cond = self.value(self.pop()[0])
        if keep_on_jump and not isinstance(cond, ast.Name):
            tmp = self.r.names.unique("condition")
            self.out.append(assign(tmp, cond))
            cond = name_node(tmp)
        below = [self.value(e) for e in self.stack]
        fall, jump = plan.exits
        taken = self._resume_call(1, jump, below + ([cond] if keep_on_jump else []))
        test = _JUMP_TESTS[kind.replace("FORWARD_", "").replace("BACKWARD_", "")](cond)
        return [Comment(f"the condition at line {self.line}, tested as plain Python"),
                ast.If(test=test, body=taken, orelse=[]),
                *self._resume_call(0, fall, below)]

    def call(self, callee, args: list) -> None:
        kw = self.kw_names
        self.kw_names = ()
        positional = args[:len(args) - len(kw)]
        keywords = [ast.keyword(arg=k, value=v) for k, v in zip(kw, args[len(args) - len(kw):])]
        self.push(ast.Call(func=callee, args=positional, keywords=keywords))

    def global_(self, var: str):
        """A global read as the native code reads it: the module's global, else the builtin."""
        g = self.r.f_globals
        if g is not None and var in g:
            return ast.Subscript(value=name_node(self.r.names(g)), slice=ast.Constant(var), ctx=ast.Load())
        builtins_dict = (g or {}).get("__builtins__", builtins)
        builtins_dict = builtins_dict if isinstance(builtins_dict, dict) else vars(builtins_dict)
        if var in builtins_dict and getattr(builtins, var, None) is not builtins_dict[var]:
            raise CannotRender(f"the builtin {var}, replaced in this module's builtins")
        if var == "globals":  # the stand-in the entry's names give it (code.py)
            return name_node(self.r.names(builtins.globals))
        # A builtin, or a name defined nowhere: the plain name reads it, or raises the NameError.
        node = name_node(var)
        self.global_reads.add(id(node))
        return node


def _leave_block():
    from ..resume import leave_block
    return leave_block


def _line_of(resume) -> int | str:
    code = resume if isinstance(resume, types.CodeType) else resume.__code__
    tail = code.co_name.rsplit("_at_line_", 1)
    return tail[1] if len(tail) == 2 else code.co_firstlineno


# -- one handler per opcode family -----------------------------------------------------------------

#: opname -> handler(renderer, inst): the instructions a native run may hold (resume._effect).
HANDLERS: dict = {}


def handles(*opnames: str):
    def register(fn):
        for name in opnames:
            HANDLERS[name] = fn
        return fn
    return register


@handles("NOP", "PRECALL", "EXTENDED_ARG", "CACHE")
def _nothing(r: NativeRenderer, inst) -> None:
    pass


@handles("KW_NAMES")
def _kw_names(r, inst):
    r.kw_names = tuple(inst.arg)


@handles("LOAD_FAST", "LOAD_FAST_CHECK")
def _load_fast(r, inst):
    local = compat.py_name(str(inst.arg))
    r.push(name_node(r.r.renames.get(local, local)))


@handles("LOAD_CONST")
def _load_const(r, inst):
    r.push(ast.parse(r.r.names(inst.arg), mode="eval").body)


@handles("LOAD_DEREF", "LOAD_CLOSURE")
def _load_cell(r, inst):
    var = getattr(inst.arg, "name", inst.arg)
    if var not in r.r.code.co_freevars:
        raise CannotRender(f"{inst.name} of a cell variable")
    cell = name_node(f"{var}_cell")
    r.push(cell if inst.name == "LOAD_CLOSURE"
           else ast.Attribute(value=cell, attr="cell_contents", ctx=ast.Load()))


def _push_with_null(r, value, with_null: bool) -> None:
    """A callable and the NULL the call convention puts with it (below it; after it on 3.13)."""
    if with_null and not compat.PY313:
        r.push(NULL)
    r.push(value)
    if with_null and compat.PY313:
        r.push(NULL)


@handles("LOAD_GLOBAL")
def _load_global(r, inst):
    with_null, var = inst.arg if isinstance(inst.arg, tuple) else (False, inst.arg)
    _push_with_null(r, r.global_(var), with_null)


@handles("LOAD_ATTR", "LOAD_METHOD")
def _load_attr(r, inst):
    a = inst.arg
    method, attr = a if isinstance(a, tuple) else (inst.name == "LOAD_METHOD", a)
    (obj,) = r.pop()
    # A method load pushes (method, self); as a bound method with no self the call is the same.
    _push_with_null(r, ast.Attribute(value=r.value(obj), attr=attr, ctx=ast.Load()), method)


@handles("PUSH_NULL")
def _push_null(r, inst):
    r.push(NULL)


@handles("CALL")
def _call(r, inst):
    n = inst.arg
    r.flush(n + 2)
    items = r.pop(n + 2)
    first, second, args = items[0], items[1], items[2:]
    if compat.PY313:
        callee, self_arg = first, second
    elif first is NULL:
        callee, self_arg = second, NULL
    else:
        callee, self_arg = first, second
    args = ([] if self_arg is NULL else [self_arg]) + args
    r.call(r.value(callee), [r.value(x) for x in args])


@handles("CALL_FUNCTION_EX")
def _call_ex(r, inst):
    count = 3 + (inst.arg & 1)
    r.flush(count)
    items = r.pop(count)
    if not compat.PY313 and items[0] is not NULL:
        raise CannotRender("a call with *args on a method")
    callee = items[0] if compat.PY313 else items[1]
    star = ast.Starred(value=r.value(items[2]), ctx=ast.Load())
    kwargs = [ast.keyword(arg=None, value=r.value(items[3]))] if inst.arg & 1 else []
    r.push(ast.Call(func=r.value(callee), args=[star], keywords=kwargs))


_INPLACE = {"TRUE_DIVIDE": "itruediv", "FLOOR_DIVIDE": "ifloordiv", "SUBTRACT": "isub",
            "MULTIPLY": "imul", "REMAINDER": "imod", "MATRIX_MULTIPLY": "imatmul", "POWER": "ipow",
            "ADD": "iadd", "LSHIFT": "ilshift", "RSHIFT": "irshift", "AND": "iand", "OR": "ior",
            "XOR": "ixor"}


@handles("BINARY_OP")
def _binary_op(r, inst):
    left, right = (r.value(x) for x in r.pop(2))
    op = _enum_name(inst.arg)
    if op.startswith("INPLACE_") and op[8:] in _INPLACE:
        # `a += b` as an expression: operator.iadd(a, b) calls __iadd__ as the instruction does.
        fn = name_node(r.r.names(getattr(operator, _INPLACE[op[8:]])))
        r.push(ast.Call(func=fn, args=[left, right], keywords=[]))
    elif op in _BINARY:
        r.push(ast.BinOp(left=left, op=_BINARY[op](), right=right))
    else:
        raise CannotRender(f"the operator {op}")


@handles("COMPARE_OP")
def _compare_op(r, inst):
    left, right = r.pop(2)
    op = _enum_name(inst.arg).split("_")[0]
    if op not in _COMPARE:
        raise CannotRender(f"the comparison {op}")
    r.push(ast.Compare(left=left, ops=[_COMPARE[op]()], comparators=[right]))


@handles("IS_OP", "CONTAINS_OP")
def _is_or_in(r, inst):
    left, right = r.pop(2)
    if inst.name == "IS_OP":
        op = ast.IsNot() if inst.arg else ast.Is()
    else:
        op = ast.NotIn() if inst.arg else ast.In()
    r.push(ast.Compare(left=left, ops=[op], comparators=[right]))


@handles("BINARY_SUBSCR")
def _subscr(r, inst):
    obj, key = r.pop(2)
    r.push(ast.Subscript(value=obj, slice=key, ctx=ast.Load()))


@handles("BINARY_SLICE")
def _slice(r, inst):
    obj, lo, hi = r.pop(3)
    r.push(ast.Subscript(value=obj, slice=ast.Slice(lower=lo, upper=hi), ctx=ast.Load()))


@handles(*_UNARY)
def _unary(r, inst):
    (x,) = r.pop()
    r.push(ast.UnaryOp(op=_UNARY[inst.name](), operand=x))


@handles("BUILD_TUPLE", "BUILD_LIST")
def _build_sequence(r, inst):
    items = [r.value(x) for x in r.pop(inst.arg)]
    cls = ast.Tuple if inst.name == "BUILD_TUPLE" else ast.List
    r.push(cls(elts=items, ctx=ast.Load()))


@handles("BUILD_SLICE")
def _build_slice(r, inst):
    r.push(ast.Call(func=name_node("slice"), args=r.pop(inst.arg), keywords=[]))


@handles("BUILD_MAP")
def _build_map(r, inst):
    items = r.pop(2 * inst.arg)
    r.push(ast.Dict(keys=items[::2], values=items[1::2]))


@handles("BUILD_CONST_KEY_MAP")
def _build_const_key_map(r, inst):
    items = r.pop(inst.arg + 1)
    keys = items[-1]
    if isinstance(keys, ast.Constant) and isinstance(keys.value, tuple):
        key_nodes = [ast.Constant(k) for k in keys.value]
    elif isinstance(keys, ast.Tuple):
        key_nodes = keys.elts
    else:
        raise CannotRender("a dict display whose keys framejit cannot read")
    r.push(ast.Dict(keys=key_nodes, values=items[:-1]))


@handles("FORMAT_VALUE")
def _format_value(r, inst):
    flags = inst.arg[0] if isinstance(inst.arg, tuple) else int(inst.arg)
    spec = r.pop()[0] if flags & 0x04 else None
    (x,) = r.pop()
    conversion = {0: -1, 1: ord("s"), 2: ord("r"), 3: ord("a")}[flags & 0x03]
    spec_node = None
    if isinstance(spec, ast.Constant) and isinstance(spec.value, str):
        spec_node = ast.JoinedStr(values=[spec])  # f"{x:.2f}"
    elif spec is not None:
        spec_node = ast.JoinedStr(values=[ast.FormattedValue(value=spec, conversion=-1)])
    r.push(ast.JoinedStr(values=[ast.FormattedValue(value=x, conversion=conversion,
                                                    format_spec=spec_node)]))


@handles("BUILD_STRING")
def _build_string(r, inst):
    values = []
    for part in r.pop(inst.arg):
        if isinstance(part, ast.JoinedStr):
            values.extend(part.values)
        elif isinstance(part, ast.Constant) and isinstance(part.value, str):
            values.append(part)
        else:
            raise CannotRender("a string built from values framejit cannot read")
    r.push(ast.JoinedStr(values=values))


@handles("POP_TOP")
def _pop_top(r, inst):
    (x,) = r.pop()
    if r.pending(x):
        r.out.append(ast.Expr(value=x))


@handles("STORE_ATTR")
def _store_attr(r, inst):
    r.flush(2)
    obj, value = r.pop(2)[::-1]
    r.out.append(ast.Assign(targets=[ast.Attribute(value=obj, attr=inst.arg, ctx=ast.Store())],
                            value=value, lineno=0))


@handles("DELETE_ATTR")
def _delete_attr(r, inst):
    r.flush(1)
    (obj,) = r.pop()
    r.out.append(ast.Delete(targets=[ast.Attribute(value=obj, attr=inst.arg, ctx=ast.Del())]))


@handles("STORE_SUBSCR")
def _store_subscr(r, inst):
    r.flush(3)
    value, obj, key = r.pop(3)
    r.out.append(ast.Assign(targets=[ast.Subscript(value=obj, slice=key, ctx=ast.Store())],
                            value=value, lineno=0))


@handles("STORE_GLOBAL")
def _store_global(r, inst):
    r.flush(1)
    (value,) = r.pop()
    target = ast.Subscript(value=name_node(r.r.names(r.r.f_globals)), slice=ast.Constant(inst.arg),
                           ctx=ast.Store())
    r.out.append(ast.Assign(targets=[target], value=value, lineno=0))


@handles("RAISE_VARARGS")
def _raise(r, inst):
    r.flush(inst.arg)
    parts = r.pop(inst.arg)
    if not parts:
        raise CannotRender("a bare `raise`")
    r.out.append(ast.Raise(exc=parts[0], cause=parts[1] if inst.arg == 2 else None))
