"""Graph breaks: a frame split at an instruction framejit cannot capture.

When capture meets an unsupported instruction in the frame being compiled (a ``print``, a
``.item()``, an ``if`` on a tensor, a call that fails inside an inlined function), the frame is
rewritten as:

1. call the *entry* function, which runs the graph captured so far and returns the values of the
   frame's changed locals and of its value stack at that point;
2. store those locals and push that stack back;
3. run the unsupported instruction itself as ordinary bytecode (with the few instructions after it
   that finish a pending call, so that no NULL call marker is left on the stack);
4. return ``resume(stack..., locals...)``: a *resume function* made from the original code, which
   pushes the stack back and jumps to the next instruction. The hook captures it on its first
   call like any other function, so the rest of the frame is compiled too.

A conditional jump on a tensor (``if x.sum() > 0:``) runs natively and each of its two successors
gets its own resume function. Resume functions are cached per code location, so a break inside an
unrolled loop reuses the same code object.
"""

from __future__ import annotations

import types
import weakref
from dataclasses import dataclass

from bytecode import Bytecode, FreeVar, Instr, Label, TryBegin, TryEnd

from ..errors import Unsupported
from . import compat
from .assemble import to_code
from .codecheck import check_code
from .interpreter import Inst, decode

NULL = "NULL"
VAL = "VAL"
ITER = "ITER"  # a for loop's iterator: handed over as a list of its remaining items
_MAX_NATIVE = 32  # longest run of native instructions after a break, to finish a pending call


def _effect(inst: Inst) -> tuple[int, list[str]] | None:
    """(values popped, markers pushed) for the instructions allowed in a native run, else None."""
    n, a = inst.name, inst.arg
    if n in ("NOP", "PRECALL", "KW_NAMES", "EXTENDED_ARG", "CACHE"):
        return 0, []
    if n in ("LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_CONST", "LOAD_DEREF", "LOAD_CLOSURE"):
        return 0, [VAL]
    if n == "LOAD_GLOBAL":
        push_null = a[0] if isinstance(a, tuple) else False
        if not push_null:
            return 0, [VAL]
        return 0, ([VAL, NULL] if compat.PY313 else [NULL, VAL])
    if n == "LOAD_ATTR":
        method = a[0] if isinstance(a, tuple) else False
        return 1, ([NULL, VAL] if method else [VAL])
    if n == "LOAD_METHOD":
        return 1, [NULL, VAL]  # (method, self) or (NULL, attribute): either way a call follows
    if n == "PUSH_NULL":
        return 0, [NULL]
    if n == "CALL":
        return a + 2, [VAL]
    if n == "CALL_FUNCTION_EX":
        return 3 + (a & 1), [VAL]
    if n in ("BINARY_OP", "BINARY_SUBSCR", "COMPARE_OP", "IS_OP", "CONTAINS_OP"):
        return 2, [VAL]
    if n == "BINARY_SLICE":
        return 3, [VAL]
    if n.startswith("UNARY_") or n == "CALL_INTRINSIC_1":
        return 1, [VAL]
    if n in ("BUILD_TUPLE", "BUILD_LIST", "BUILD_STRING", "BUILD_SLICE"):
        return a, [VAL]
    if n == "BUILD_MAP":
        return 2 * a, [VAL]
    if n == "BUILD_CONST_KEY_MAP":
        return a + 1, [VAL]
    if n == "FORMAT_VALUE":
        flags = a[0] if isinstance(a, tuple) else int(a)
        return (2 if flags & 0x04 else 1), [VAL]
    if n == "POP_TOP":
        return 1, []
    if n in ("STORE_ATTR", "STORE_GLOBAL", "DELETE_ATTR"):
        return (2 if n == "STORE_ATTR" else 1), []
    if n == "STORE_SUBSCR":
        return 3, []
    return None


_POP_JUMPS = {
    "POP_JUMP_FORWARD_IF_TRUE", "POP_JUMP_BACKWARD_IF_TRUE", "POP_JUMP_IF_TRUE",
    "POP_JUMP_FORWARD_IF_FALSE", "POP_JUMP_BACKWARD_IF_FALSE", "POP_JUMP_IF_FALSE",
    "POP_JUMP_FORWARD_IF_NONE", "POP_JUMP_BACKWARD_IF_NONE", "POP_JUMP_IF_NONE",
    "POP_JUMP_FORWARD_IF_NOT_NONE", "POP_JUMP_BACKWARD_IF_NOT_NONE", "POP_JUMP_IF_NOT_NONE",
}
_OR_POP_JUMPS = {"JUMP_IF_TRUE_OR_POP", "JUMP_IF_FALSE_OR_POP"}


@dataclass
class Exit:
    """Where execution continues after the native instructions: instruction ``target`` of the
    original code, with ``depth`` values on the stack (none of them a NULL marker), of which
    those at ``iters`` are for-loop iterators."""

    target: int
    depth: int
    is_jump: bool
    iters: tuple = ()


@dataclass
class BreakPlan:
    native: list[Inst]   # instructions run as they are, in order
    exits: list[Exit]    # fall-through exit first, then the jump exit if any


def plan_break(insts: list[Inst], index: int, markers: list[str]) -> BreakPlan:
    """Which instructions to run natively from ``index`` and where to resume, or Unsupported."""
    first = insts[index]
    if first.in_try and not only_with_blocks(insts, first):
        target = first.handler[0]
        if compat.is_comprehension_handler([i.name for i in insts[target:target + 64]]):
            raise Unsupported("a graph break inside a list, set or dict comprehension",
                              "write it as a for loop")
        raise Unsupported("a graph break inside a `try` block",
                          "move the unsupported line out of the try block")
    if first.name == "RAISE_VARARGS" and first.arg in (1, 2):
        # An exception leaving the frame: the graph so far runs, then the `raise` itself.
        return BreakPlan([first], [])
    if first.name in _POP_JUMPS or first.name in _OR_POP_JUMPS:
        if NULL in markers[:-1]:
            raise Unsupported("a graph break at a condition inside a pending call")
        depth = len(markers)
        keep_on_jump = first.name in _OR_POP_JUMPS
        iters = _iters(markers, depth - 1)
        return BreakPlan([first], [Exit(index + 1, depth - 1, False, iters),
                                   Exit(first.target, depth if keep_on_jump else depth - 1, True, iters)])
    original = list(markers)
    markers = list(markers)
    lowest = len(markers)  # values below this depth are untouched by the native run
    native: list[Inst] = []
    i = index
    while True:
        inst = insts[i]
        effect = _effect(inst)
        if effect is None or inst.target is not None or (inst.handler != first.handler and i != index):
            raise Unsupported(f"a graph break at {first.name} followed by {inst.name}",
                              "split the expression so the unsupported call stands alone")
        pops, pushes = effect
        if pops > len(markers):
            raise Unsupported("a graph break whose stack framejit cannot follow")
        if pops:
            del markers[-pops:]
        lowest = min(lowest, len(markers))
        markers.extend(pushes)
        native.append(inst)
        i += 1
        if NULL not in markers and inst.name not in ("KW_NAMES", "PRECALL"):
            return BreakPlan(native, [Exit(i, len(markers), False, _iters(original, lowest))])
        if len(native) > _MAX_NATIVE:
            raise Unsupported("a graph break inside a very long expression")


def only_with_blocks(insts: list[Inst], inst: Inst) -> bool:
    """Whether every handler around ``inst`` is a ``with`` block's (none a ``try``): walk from
    the innermost handler out, through each handler's own cleanup region."""
    entry = inst.handler
    seen = 0
    while entry is not None and seen < 64:
        target = entry[0]
        if not (insts[target].name == "PUSH_EXC_INFO" and target + 1 < len(insts)
                and insts[target + 1].name == "WITH_EXCEPT_START"):
            return False
        cleanup = insts[target].handler  # COPY 3; POP_EXCEPT; RERAISE 1
        if cleanup is None:
            return True
        entry = insts[cleanup[0]].handler  # what covers the cleanup: the enclosing block
        seen += 1
    return entry is None


def _iters(markers: list[str], below: int) -> tuple:
    return tuple(k for k in range(below) if markers[k] == ITER)


# -- resume functions -----------------------------------------------------------------------------

_resume_cache: weakref.WeakKeyDictionary[types.CodeType, dict] = weakref.WeakKeyDictionary()
#: resume code -> (a weak reference to the original code, index shift): a resume's body is the
#: original code behind a fixed prefix, so its instruction ``i`` is the original's ``i + shift``.
#: (Held strongly, the original kept itself alive through its resume in _resume_cache: the
#: code of a function made at run time never died.)
_origin: weakref.WeakKeyDictionary[types.CodeType, tuple] = weakref.WeakKeyDictionary()


def origin(code: types.CodeType, index: int) -> tuple[types.CodeType, int]:
    """The original code and instruction index behind ``code``'s instruction ``index``; resumes
    of resumes are made from the original code, so a break in a loop reuses one code object."""
    found = _origin.get(code)
    original = found[0]() if found is not None else None
    if original is None:
        return code, index
    return original, index + found[1]


def stack_param(k: int) -> str:
    return f"___stack{k}"


def resume_params(code: types.CodeType, depth: int, live: tuple[str, ...]) -> list[str]:
    """A resume function's parameters: the original frame's first argument first (zero-argument
    ``super()`` reads the frame's first local), then the stack values, then the other live
    locals."""
    lead = code.co_varnames[0] if code.co_argcount and code.co_varnames[0] in live else None
    rest = [n for n in live if n != lead]
    return ([lead] if lead else []) + [stack_param(k) for k in range(depth)] + rest


def is_internal_name(name: str) -> bool:
    """Locals framejit adds to rewritten and resume code (never the user's)."""
    return name.startswith(("___stack", "___fj_"))


def resume_code(code: types.CodeType, target: int, depth: int, live: tuple[str, ...],
                iters: tuple = ()) -> types.CodeType:
    """A code object that takes ``depth`` stack values and the ``live`` locals as arguments and
    continues ``code`` at instruction ``target``; stack values at ``iters`` arrive as lists and
    are turned back into iterators. Cached per location."""
    per_code = _resume_cache.setdefault(code, {})
    key = (target, depth, live, iters)
    cached = per_code.get(key)
    if cached is not None:
        return cached
    insts = decode(code)
    # Keep the original's exception-table depths (see the note at ``to_code`` below).
    bc = Bytecode.from_code(code, conserve_exception_block_stackdepth=True)
    items = list(bc)
    target_pos = insts[target].pos
    first = insts[target]
    lineno = first.lineno or code.co_firstlineno
    label = Label()
    body: list = []
    if code.co_freevars:
        body.append(Instr("COPY_FREE_VARS", len(code.co_freevars), lineno=lineno))
    body.append(Instr("RESUME", 0, lineno=lineno))
    for k in range(depth):
        body.append(Instr("LOAD_FAST", stack_param(k), lineno=lineno))
        if k in iters:
            body.append(Instr("GET_ITER", lineno=lineno))
    body.append(Instr("JUMP_FORWARD", label, lineno=lineno))
    new_prefix = sum(1 for item in body if isinstance(item, Instr))
    # The jump lands before any try-region or line markers that open at the target instruction.
    label_pos = target_pos
    while label_pos > 0 and not isinstance(items[label_pos - 1], (Instr, Label)):
        label_pos -= 1
    skipped = 0
    prefix_done = False
    for pos, item in enumerate(items):
        if not prefix_done:
            if isinstance(item, Instr) and item.name in ("MAKE_CELL", "COPY_FREE_VARS", "RESUME"):
                skipped += 1
                continue
            prefix_done = isinstance(item, Instr)
        if pos == label_pos:
            body.append(label)
        body.append(item)
    if label not in body:
        raise Unsupported("resuming inside the function's prologue")
    params = resume_params(code, depth, live)
    bc.clear()
    bc.extend(body)
    bc.argnames = params
    bc.argcount = len(params)
    bc.posonlyargcount = 0
    bc.kwonlyargcount = 0
    bc.flags &= ~(compat.CO_VARARGS | compat.CO_VARKEYWORDS)
    bc.name = f"{code.co_name}_resume_at_line_{lineno}"
    if hasattr(bc, "qualname"):
        bc.qualname = f"{getattr(code, 'co_qualname', code.co_name)}_resume_at_line_{lineno}"
    # The body is the original code, entered with the stack the original has at ``target``, so
    # every exception-table entry keeps the original's depth and the original's stack size
    # suffices (the prefix pushes no more than ``depth`` values). The `bytecode` library must not
    # recompute either: its analysis follows the code from the prefix only, never sees the start
    # of a `with` block's region the prefix jumps into, and then leaves that region's depth at a
    # sentinel (32768: the handler runs on a stack it does not expect and crashes the
    # interpreter) or fails ("negative stacksize").
    new = to_code(bc, stacksize=max(code.co_stacksize, depth), compute_exception_stack_depths=False)
    check_code(new)
    per_code[key] = new
    _origin[new] = (weakref.ref(code), skipped - new_prefix)
    return new


# -- the rewritten frame ---------------------------------------------------------------------------

_STATE = "___fj_state"


def _temp(k: int) -> str:
    return f"___fj_s{k}"


_EXC = "___fj_exc"


class NativeResult(BaseException):  # noqa: N818  (a result, not an error)
    """Raised by the entry function of a split frame whose graph failed and which then ran the
    frame again as plain Python: carries that run's return value to the rewritten frame, which
    returns it (see :func:`native_result`)."""

    def __init__(self, value):
        self.value = value


def native_result(exc: BaseException):
    """Used by rewritten frames: the value a :class:`NativeResult` carries; any other exception
    from the entry function goes on."""
    if type(exc) is NativeResult:
        return exc.value
    raise exc


def leave_block(exit_, exc: BaseException) -> None:
    """Used by rewritten frames: a ``with`` block's ``__exit__``, as an exception leaves it."""
    exit_(type(exc), exc, exc.__traceback__)


def _exit_temp(slot: int) -> str:
    return f"___fj_exit{slot}"


def _forward(name: str) -> str:
    # The jump in the rewritten code always goes forward, to its resume call.
    return name.replace("BACKWARD", "FORWARD") if compat.PY311 else name


def break_code(code: types.CodeType, entry, local_names: list[str], markers: list[str],
               plan: BreakPlan, resumes: list, live: tuple[str, ...],
               base: types.CodeType | None = None, exit_slots: tuple = ()) -> types.CodeType:
    """The rewritten frame: run ``entry``, restore locals and stack, run ``plan.native``, then
    return the result of the resume function of the exit taken. ``resumes[k]`` is, for
    ``plan.exits[k]``, either a function (LOAD_CONST) or a code object needing the closure.
    ``exit_slots`` are the stack positions of the ``__exit__``s of the ``with`` blocks the
    break is inside: if the native instructions raise, those run before the exception leaves."""
    bc = Bytecode.from_code(code)
    line = code.co_firstlineno
    body: list = []
    for item in bc:
        if isinstance(item, Instr):
            body.append(Instr(item.name, item.arg, lineno=line))
            if item.name == "RESUME":
                break

    def call(fn_load: list, nargs: int, line: int):
        out = []
        if compat.PY313:
            out += fn_load + [Instr("PUSH_NULL", lineno=line)]
        else:
            out += [Instr("PUSH_NULL", lineno=line)] + fn_load
        return out

    def tail_call(fn_load: list, arg_loads: list, line: int) -> list:
        out = call(fn_load, len(arg_loads), line) + arg_loads
        if compat.PY311:
            out.append(Instr("PRECALL", len(arg_loads), lineno=line))
        out.append(Instr("CALL", len(arg_loads), lineno=line))
        return out

    args = [Instr("LOAD_FAST", n, lineno=line) for n in compat.arg_slot_names(code)]
    args += [Instr("LOAD_CLOSURE", FreeVar(v), lineno=line) for v in code.co_freevars]
    # If the graph raises, the entry function runs the frame again as plain Python and raises
    # its result as a NativeResult: return that (an exception table entry costs nothing else).
    rerun_handler = Label()
    rerun_try = TryBegin(rerun_handler, push_lasti=False)
    body.append(rerun_try)
    body += tail_call([Instr("LOAD_CONST", entry, lineno=line)], args, line)
    body.append(TryEnd(rerun_try))
    body.append(Instr("STORE_FAST", _STATE, lineno=line))
    for j, name in enumerate(local_names):
        body += [Instr("LOAD_FAST", _STATE, lineno=line), Instr("LOAD_CONST", j, lineno=line),
                 Instr("BINARY_SUBSCR", lineno=line), Instr("STORE_FAST", name, lineno=line)]
    idx = len(local_names)
    for slot, m in enumerate(markers):
        if m == NULL:
            body.append(Instr("PUSH_NULL", lineno=line))
        else:
            body += [Instr("LOAD_FAST", _STATE, lineno=line), Instr("LOAD_CONST", idx, lineno=line),
                     Instr("BINARY_SUBSCR", lineno=line)]
            if m == ITER:
                body.append(Instr("GET_ITER", lineno=line))  # the entry returned a list
            if slot in exit_slots:
                body += [Instr("COPY", 1, lineno=line), Instr("STORE_FAST", _exit_temp(slot), lineno=line)]
            idx += 1
    jump_label = Label()
    handler = Label()
    try_begin = TryBegin(handler, push_lasti=False) if exit_slots else None
    if try_begin is not None:
        body.append(try_begin)
    for inst in plan.native:
        iline = inst.lineno or line
        if inst.target is not None:
            body.append(Instr(_forward(inst.name), jump_label, lineno=iline))
        else:
            body.append(Instr(inst.name, inst.arg, lineno=iline))
    if try_begin is not None:
        body.append(TryEnd(try_begin))
    for k, (exit_, resume) in enumerate(zip(plan.exits, resumes)):
        if exit_.is_jump:
            body.append(jump_label)
        eline = plan.native[-1].lineno or line
        for s in reversed(range(exit_.depth)):
            body.append(Instr("STORE_FAST", _temp(s), lineno=eline))
        for s in exit_.iters:
            # What is left of a loop's iterator goes to the resume function as a list.
            body += tail_call([Instr("LOAD_CONST", list, lineno=eline)],
                              [Instr("LOAD_FAST", _temp(s), lineno=eline)], eline)
            body.append(Instr("STORE_FAST", _temp(s), lineno=eline))
        if isinstance(resume, types.CodeType):
            # The resume function needs this frame's closure: build it here.
            fn_load = [Instr("LOAD_CLOSURE", FreeVar(v), lineno=eline) for v in code.co_freevars]
            fn_load += [Instr("BUILD_TUPLE", len(code.co_freevars), lineno=eline),
                        Instr("LOAD_CONST", resume, lineno=eline),
                        Instr("MAKE_FUNCTION", 0x08, lineno=eline)]
        else:
            fn_load = [Instr("LOAD_CONST", resume, lineno=eline)]
        names = resume_params(base or code, exit_.depth, live)
        temps = {stack_param(k): _temp(k) for k in range(exit_.depth)}
        loads = [Instr("LOAD_FAST", temps.get(n, n), lineno=eline) for n in names]
        body += tail_call(fn_load, loads, eline)
        body.append(Instr("RETURN_VALUE", lineno=eline))
    if try_begin is not None:
        # The native instructions raised: leave the `with` blocks (innermost first), each
        # __exit__ seeing the exception, then re-raise it.
        body.append(handler)
        body.append(Instr("STORE_FAST", _EXC, lineno=line))
        for slot in reversed(exit_slots):
            body += tail_call([Instr("LOAD_CONST", leave_block, lineno=line)],
                              [Instr("LOAD_FAST", _exit_temp(slot), lineno=line),
                               Instr("LOAD_FAST", _EXC, lineno=line)], line)
            body.append(Instr("POP_TOP", lineno=line))
        body.append(Instr("LOAD_FAST", _EXC, lineno=line))
        body.append(Instr("RERAISE", 0, lineno=line))
    body.append(rerun_handler)
    body.append(Instr("STORE_FAST", _EXC, lineno=line))
    body += tail_call([Instr("LOAD_CONST", native_result, lineno=line)],
                      [Instr("LOAD_FAST", _EXC, lineno=line)], line)
    body.append(Instr("RETURN_VALUE", lineno=line))
    bc.clear()
    bc.extend(body)
    return to_code(bc)


def resume_function(code: types.CodeType, globals_dict: dict):
    """The function object for a resume code without free variables (made once)."""
    return types.FunctionType(code, globals_dict, code.co_name)
