"""The symbolic interpreter: runs one frame's instructions over symbolic values.

A :class:`Translator` holds one frame's stack, locals and cells. The root translator is the frame
being captured; each inlined call runs a child translator that shares the root's output graph.
Instructions dispatch through ``HANDLERS`` (filled by the ``ops`` modules, one per opcode family);
an opcode without a handler raises :class:`Unsupported` naming the construct.
"""

from __future__ import annotations

import bisect
import dis
import linecache
import types
import weakref
from collections.abc import Callable

from bytecode import Bytecode, Instr, Label

from ..errors import SourceLocation, Unsupported
from . import compat, decoding
from .guards import IdGuard
from .sources import AttrSource, ClosureCellSource, ItemSource, LocalSource
from .values.base import Value
from .values.builder import _is_constant, wrap, wrap_sourceless
from .values.constants import NONE, ConstantValue, const
from .values.containers import TupleValue
from .values.exceptions import PythonRaise
from .values.functions import unwrap_torch_disabled
from .values.modules import MODULE_CALLS, ModuleValue
from .values.tensor import TensorValue, graph_call

#: opname -> handler(tx, inst). Filled by the modules in ``ops``.
HANDLERS: dict[str, Callable] = {}


def handler(*opnames: str):
    def register(fn):
        for name in opnames:
            if name in compat.CODE_OPNAMES:  # not another version's, nor a pseudo-instruction
                HANDLERS[name] = fn
        return fn
    return register


class Inst:
    """One decoded instruction: ``name``, ``arg`` (jump targets resolved to indices), ``lineno``,
    ``pos`` (its index in the ``bytecode.Bytecode`` list, for rewriting; computed when first
    asked) and ``handler`` (the exception-table entry covering it: handler index, stack depth,
    whether ``lasti`` is pushed; None when no handler covers it)."""

    __slots__ = ("name", "arg", "lineno", "target", "_pos", "_code", "handler")

    def __init__(self, name, arg, lineno, target=None, pos=-1, handler=None, code=None):
        self.name = name
        self.arg = arg
        self.lineno = lineno
        self.target = target
        self._pos = pos
        # A weak reference to the code object whose Bytecode list ``pos`` indexes, until known
        # (weak: _decoded, which holds these, is keyed weakly by that code object).
        self._code = code if code is None or type(code) is weakref.ref else weakref.ref(code)
        self.handler = handler

    @property
    def pos(self) -> int:
        code = self._code() if self._pos < 0 and self._code is not None else None
        if code is not None:
            _fill_positions(code)
        return self._pos

    @pos.setter
    def pos(self, value: int) -> None:
        self._pos = value

    @property
    def in_try(self) -> bool:
        """Whether an exception handler (``try``, ``with``, a cleanup) covers this instruction:
        a graph break cannot go there."""
        return self.handler is not None

    def __repr__(self):
        return f"{self.name} {self.arg!r}"


_decoded: weakref.WeakKeyDictionary[types.CodeType, list[Inst]] = weakref.WeakKeyDictionary()


def decode(code: types.CodeType) -> list[Inst]:
    """``code``'s instructions, decoded once per code object (fast by :mod:`.decoding`; by
    ``Bytecode.from_code`` where that does not apply)."""
    insts = _decoded.get(code)
    if insts is not None:
        return insts
    fast = decoding.instructions(code, Inst)
    if fast is None:
        insts = _decode_with_bytecode(code)
        offsets = None
    else:
        insts, offsets = fast
    _attach_handlers(code, insts, offsets)
    _decoded[code] = insts
    return insts


def _decode_with_bytecode(code: types.CodeType) -> list[Inst]:
    bc = Bytecode.from_code(code)
    insts = []
    labels: dict[Label, int] = {}
    pending: list[tuple[Inst, Label]] = []
    for pos, item in enumerate(bc):
        if isinstance(item, Label):
            labels[item] = len(insts)
        elif isinstance(item, Instr):
            inst = Inst(item.name, item.arg, item.lineno, pos=pos)
            if isinstance(item.arg, Label):
                pending.append((inst, item.arg))
            insts.append(inst)
    for inst, label in pending:
        inst.target = labels[label]
    return insts


def _fill_positions(code: types.CodeType) -> None:
    """Each instruction's index in ``Bytecode.from_code(code)``, which only a rewrite needs."""
    full = _decode_with_bytecode(code)
    insts = _decoded.get(code, ())
    if len(full) != len(insts) or any(a.name != b.name for a, b in zip(full, insts)):
        raise Unsupported(f"the bytecode of {code.co_name}() (its instructions could not be matched up)")
    for a, b in zip(insts, full):
        a._pos = b._pos
        a._code = None


class _HandlerStart:
    """What ``compat.is_generator_body_handler`` reads of an instruction."""

    __slots__ = ("opname", "argrepr")

    def __init__(self, inst: Inst):
        self.opname = inst.name
        self.argrepr = getattr(inst.arg, "name", "")


def _attach_handlers(code: types.CodeType, insts: list[Inst], offsets: list[int] | None = None) -> None:
    """Give each instruction its exception-table entry, read from the code object itself (the
    stack depths are CPython's own; the abstract bytecode does not keep them). ``offsets``: each
    instruction's byte offset, when the decoder knows them.

    The handler 3.12 puts around a generator's whole body is left out: as on 3.11, an exception
    leaving the body leaves the generator's frame, and ``GeneratorValue`` deals with it (a
    StopIteration is a RuntimeError there). Nothing of the generator runs for it, so a ``yield``
    outside any ``try`` is not in one either."""
    entries = dis._parse_exception_table(code)
    if not entries:
        return
    if offsets is None:
        instrs = [i for i in dis.get_instructions(code) if i.opname not in ("EXTENDED_ARG", "CACHE")]
        offsets = [i.offset for i in instrs]
    if len(offsets) != len(insts):
        raise Unsupported(f"the bytecode of {code.co_name}() (its instructions could not be matched up)")
    index = {off: k for k, off in enumerate(offsets)}
    for entry in entries:
        if compat.is_generator_body_handler(_HandlerStart(insts[index[entry.target]])):
            continue
        handler = (index[entry.target], entry.depth, bool(entry.lasti))
        for k in range(bisect.bisect_left(offsets, entry.start), bisect.bisect_left(offsets, entry.end)):
            insts[k].handler = handler


def _star_arg_names(code) -> tuple[str, ...]:
    names = compat.arg_slot_names(code)
    n = code.co_argcount + code.co_kwonlyargcount
    return names[n:]


class BreakHere(Exception):
    """Raised by the root translator when it reaches its ``break_at`` instruction."""

    def __init__(self, tx: Translator):
        self.tx = tx


class _Return(Exception):
    def __init__(self, value: Value):
        self.value = value


class RealCell(Value):
    """A cell of a real closure (a variable an inlined function closes over)."""

    __slots__ = ("cell", "cell_source")

    def __init__(self, cell, cell_source):
        super().__init__(None)
        self.cell = cell
        self.cell_source = cell_source

    def describe(self):
        return "a closure variable"


class Translator:
    def __init__(self, output, code: types.CodeType, f_globals: dict, f_builtins: dict,
                 parent: Translator | None = None):
        self.output = output
        self.code = code
        self.f_globals = f_globals
        self.f_builtins = f_builtins
        self.parent = parent
        self.depth = 0 if parent is None else parent.depth + 1
        self.insts = decode(code)
        self.stack: list[Value] = []
        self.locals: dict[str, Value] = {}
        self.lazy_args: dict[str, object] = {}
        self.cells: dict[str, Value] = {}
        self.kw_names: tuple[str, ...] = ()
        self.pc = 0
        self.current: Inst | None = None
        self.lineno = code.co_firstlineno
        #: Root frame only: stop before this instruction index (a graph break, second pass).
        self.break_at: int | None = None
        #: The exception an ``except`` block of this frame is handling (PUSH_EXC_INFO).
        self.handled: Value | None = None
        #: Root frame only: every generator created during the capture (values/generators.py).
        self.generators: list = []

    # -- stack ----------------------------------------------------------------------------------
    def push(self, v: Value):
        self.stack.append(v)

    def pop(self) -> Value:
        return self.stack.pop()

    def popn(self, n: int) -> list[Value]:
        if n == 0:
            return []
        items = self.stack[-n:]
        del self.stack[-n:]
        return items

    # -- locals ---------------------------------------------------------------------------------
    def load_local(self, name: str) -> Value:
        v = self.locals.get(name)
        if v is None:
            if name in self.lazy_args:
                v = wrap(self, self.lazy_args.pop(name), LocalSource(name))
                if self.parent is None and name in _star_arg_names(self.code):
                    # The compiled frame's own *args tuple and **kwargs dict are made fresh by
                    # each call: mutating them is local to the frame, so it is captured.
                    v.source = None
                self.locals[name] = v
            else:
                raise Unsupported(f"local variable {name!r} referenced before assignment")
        return v

    # -- running --------------------------------------------------------------------------------
    def run(self) -> Value:
        while True:
            try:
                return self._run()
            except PythonRaise as r:
                self._unwind(r)

    def _unwind(self, r: PythonRaise):
        """Continue at the handler covering the instruction that raised, as Python does; an
        exception that leaves the captured frame becomes a graph break before that instruction."""
        inst = self.current
        entry = inst.handler if inst is not None else None
        if entry is None:
            if self.parent is not None:
                raise r
            e = Unsupported(f"raising {r.exc.describe()}",
                            "Python raises it when this line runs; framejit runs it as plain Python")
            e.where = self.location()
            e.break_index = self.pc - 1
            raise e from None
        target, depth, push_lasti = entry
        handled = self.handled_exception()
        if r.exc.context is NONE and handled is not None:
            r.exc.context = handled
        del self.stack[depth:]
        if push_lasti:
            self.push(const(inst.pos))
        self.push(r.exc)
        self.pc = target

    def handled_exception(self) -> Value | None:
        """The exception being handled (``sys.exc_info()``), looking through the calling frames."""
        tx = self
        while tx is not None:
            if tx.handled is not None:
                return tx.handled
            tx = tx.parent
        return None

    def _run(self) -> Value:
        insts = self.insts
        try:
            while True:
                if self.pc == self.break_at:
                    raise BreakHere(self)
                inst = insts[self.pc]
                self.current = inst
                if inst.lineno is not None:
                    self.lineno = inst.lineno
                self.pc += 1
                fn = HANDLERS.get(inst.name)
                if fn is None:
                    unsupported_opcode(self, inst)
                fn(self, inst)
        except _Return as r:
            if self.parent is None:
                self.check_generators(at_break=False)
            return r.value
        except Unsupported as e:
            if e.where is None:
                e.where = self.location()
            if self.parent is None and e.break_index is None:
                e.break_index = self.pc - 1  # the root instruction being run (a call site if inlined)
            raise

    def check_generators(self, at_break: bool):
        """Where the capture ends (a return, or a graph break): a generator left paused inside a
        ``try`` block is closed by Python when it is dropped, which runs its ``except``/``finally``
        blocks at that point; not captured, so the frame runs as plain Python."""
        for gen in self.generators:
            paused = gen.paused_in_try()
            if paused is None:
                continue
            if at_break:
                e = Unsupported(f"a graph break while {paused.describe()} is paused inside a `try` "
                                "block (Python runs its `except`/`finally` blocks when it is closed "
                                "or dropped)", "iterate it to the end before this line")
            else:
                e = Unsupported(f"leaving {paused.describe()} paused inside a `try` block (Python "
                                "closes it when it is dropped, running its `except`/`finally` blocks)",
                                "iterate it to the end, or close it outside the compiled function")
            e.where = self.location()
            raise e

    def jump(self, inst: Inst):
        self.pc = inst.target

    def location(self) -> SourceLocation:
        filename = self.code.co_filename
        text = linecache.getline(filename, self.lineno) if self.lineno else ""
        return SourceLocation(filename, self.lineno, self.code.co_name, text)

    def user_stack(self) -> list[tuple[str, int, str]]:
        frames = []
        tx = self
        while tx is not None:
            frames.append((tx.code.co_filename, tx.lineno, tx.code.co_name))
            tx = tx.parent
        return frames

    # -- calls ----------------------------------------------------------------------------------
    def call(self, fn: Value, args: list[Value], kwargs: dict[str, Value]) -> Value:
        return fn.call(self, args, kwargs)

    def inline_function(self, fn: types.FunctionType, args, kwargs, fn_source=None) -> Value:
        if fn in MODULE_CALLS and args and isinstance(args[0], ModuleValue):
            return args[0].call_forward(self, list(args[1:]), kwargs)
        unwrapped = unwrap_torch_disabled(fn)
        if unwrapped is not fn:
            fn, fn_source = unwrapped, None
        fn_source = _function_source(fn, fn_source)
        if fn_source is not None:
            # A user function's code can be replaced (``helper.__code__ = other.__code__``, as
            # hot reloaders do): the captured body is reused only while it is the same code.
            self.output.guards.add(IdGuard(AttrSource(fn_source, "__code__"), fn.__code__))
        closure = None
        if fn.__closure__:
            closure = []
            for i, (cell, var) in enumerate(zip(fn.__closure__, fn.__code__.co_freevars)):
                src = ClosureCellSource(fn_source, i, var) if fn_source is not None else None
                closure.append(RealCell(cell, src))
        return self.inline_code(fn.__code__, fn.__globals__, args, kwargs, defaults=fn.__defaults__,
                                kwdefaults=fn.__kwdefaults__, closure=closure, name=fn.__qualname__,
                                defaults_source=fn_source)

    def inline_code(self, code, f_globals, args, kwargs, *, defaults=None, kwdefaults=None,
                    closure=None, name=None, defaults_source=None) -> Value:
        if code.co_flags & compat.CO_GENERATOR_LIKE:
            # A generator's body runs lazily, one item per next() (values/generators.py).
            from .values.generators import inline_generator
            return inline_generator(self, code, f_globals, args, kwargs, defaults=defaults,
                                    kwdefaults=kwdefaults, closure=closure, name=name,
                                    defaults_source=defaults_source)
        if self.depth >= self.output.options.max_inline_depth:
            raise Unsupported(f"calls nested more than {self.output.options.max_inline_depth} deep (recursion?)")
        child = Translator(self.output, code, f_globals, self.f_builtins if f_globals is self.f_globals
                           else f_globals.get("__builtins__", self.f_builtins), parent=self)
        if isinstance(child.f_builtins, types.ModuleType):
            child.f_builtins = vars(child.f_builtins)
        bind_arguments(self, child, code, args, kwargs, defaults, kwdefaults, defaults_source)
        for cell_name, cell in zip(code.co_freevars, closure or ()):
            child.cells[cell_name] = cell
        try:
            return child.run()
        except Unsupported as e:
            e.stack.append(self.location())
            raise

    # -- operators ------------------------------------------------------------------------------
    def apply_operator(self, fn, args: list[Value]) -> Value:
        if len(args) == 1:
            r = args[0].unary_op(self, fn)
            if r is not None:
                return r
        if any(isinstance(a, TensorValue) for a in args):
            return graph_call(self, "call_function", fn, list(args), {})
        if all(a.is_constant() for a in args):
            # (held(): arithmetic and concatenation keep symbolic sizes symbolic)
            consts = [a.held() if isinstance(a, ConstantValue) else a.as_constant() for a in args]
            try:
                return wrap_sourceless(self, fn(*consts))
            except Exception as e:
                # 1 / 0, "a" + 1: a graph break there, so that Python raises it
                raise Unsupported(f"{_op_symbol(fn)} on {', '.join(map(repr, consts))} raises "
                                  f"{type(e).__name__}: {e}") from e
        names = " and ".join(a.describe() for a in args)
        raise Unsupported(f"operator {_op_symbol(fn)} on {names}")


def _op_symbol(fn) -> str:
    return getattr(fn, "__name__", repr(fn))


def _function_source(fn, fn_source):
    """Where a called user function is read from, for its closure cells and default values
    (``f.__defaults__``), so that those a caller can change (a dict, a list, an object) are
    guarded: ``def helper(x, cfg=CFG)`` kept ``CFG["scale"]`` as it was when captured, and so
    did a method's decorator closing over ``cfg``. The function itself where it was reached
    without a path (a method looked up on an object). None for a library's function, whose
    closures and defaults are taken as fixed like its module's globals."""
    if fn_source is not None:
        return fn_source
    from .sources import ObjectSource
    from .values.builder import from_library

    return None if from_library(fn) else ObjectSource(fn)


def _default_value(caller: Translator, value, source):
    """A parameter's default: a value made in the frame (a nested function's), a constant, or
    an object read from ``source`` with its guards."""
    if isinstance(value, Value):
        return value  # one object, shared by the calls, as Python shares it
    if source is None or _is_constant(value):
        return wrap_sourceless(caller, value)
    return wrap(caller, value, source)


def bind_arguments(caller: Translator, child: Translator, code, args, kwargs, defaults, kwdefaults,
                   defaults_source=None):
    """Bind symbolic arguments to ``code``'s parameters, like a Python call does. ``defaults``
    and ``kwdefaults`` hold values or real objects; real ones that a caller can change are read
    from ``defaults_source`` (the function: its ``__defaults__`` and ``__kwdefaults__``)."""
    nargs = code.co_argcount
    nkw = code.co_kwonlyargcount
    names = code.co_varnames
    posonly = code.co_posonlyargcount
    params = names[:nargs]
    kwonly = names[nargs:nargs + nkw]
    idx = nargs + nkw
    varargs = names[idx] if code.co_flags & compat.CO_VARARGS else None
    if varargs is not None:
        idx += 1
    varkw = names[idx] if code.co_flags & compat.CO_VARKEYWORDS else None
    fname = code.co_name
    bound: dict[str, Value] = {}
    for name, v in zip(params, args):
        bound[name] = v
    extra = list(args[nargs:])
    if extra:
        if varargs is None:
            raise Unsupported(f"{fname}() takes {nargs} positional arguments but {len(args)} were given")
    kw_extra: dict[str, Value] = {}
    for k, v in kwargs.items():
        if (k in params and params.index(k) >= posonly) or k in kwonly:
            if k in bound:
                raise Unsupported(f"{fname}() got multiple values for argument {k!r}")
            bound[k] = v
        elif varkw is not None:
            kw_extra[k] = v
        else:
            raise Unsupported(f"{fname}() got an unexpected keyword argument {k!r}")
    if defaults:
        first_default = nargs - len(defaults)
        for i in range(first_default, nargs):
            if params[i] not in bound:
                j = i - first_default
                src = defaults_source and ItemSource(AttrSource(defaults_source, "__defaults__"), j)
                bound[params[i]] = _default_value(caller, defaults[j], src)
    for k in kwonly:
        if k not in bound and kwdefaults and k in kwdefaults:
            src = defaults_source and ItemSource(AttrSource(defaults_source, "__kwdefaults__"), k)
            bound[k] = _default_value(caller, kwdefaults[k], src)
    missing = [p for p in params + kwonly if p not in bound]
    if missing:
        raise Unsupported(f"{fname}() missing required arguments {missing}")
    if varargs is not None:
        bound[varargs] = TupleValue(extra)
    if varkw is not None:
        from .values.containers import DictValue
        bound[varkw] = DictValue(kw_extra)
    child.locals.update(bound)


def unsupported_opcode(tx: Translator, inst: Inst):
    words = _OPCODE_WORDS.get(inst.name)
    if words is None:
        words = f"the Python operation {inst.name}"
    raise Unsupported(words, _OPCODE_HINTS.get(inst.name, ""))


_OPCODE_WORDS = {
    "BEFORE_WITH": "a `with` block",
    "BEFORE_ASYNC_WITH": "an `async with` block",
    "RAISE_VARARGS": "raising an exception",
    "RERAISE": "re-raising an exception",
    "PUSH_EXC_INFO": "an `except` handler",
    "IMPORT_NAME": "an import statement",
    "IMPORT_FROM": "an import statement",
    "GET_AWAITABLE": "await",
    "GET_AITER": "async for",
    "GET_ANEXT": "async for",
    "YIELD_VALUE": "yield outside a generator framejit can run",
    "SETUP_ANNOTATIONS": "a variable annotation at module level",
    "STORE_GLOBAL": "assigning a global variable",
    "DELETE_GLOBAL": "deleting a global variable",
    "STORE_ATTR": "assigning an attribute",
    "DELETE_ATTR": "deleting an attribute",
    "LOAD_BUILD_CLASS": "a class definition",
    "MATCH_CLASS": "a match statement",
    "MATCH_MAPPING": "a match statement",
    "MATCH_SEQUENCE": "a match statement",
    "MATCH_KEYS": "a match statement",
    "GET_LEN": "a match statement",
    "CHECK_EXC_MATCH": "an `except` clause",
    "LOAD_ASSERTION_ERROR": "a failing assert",
    "DELETE_DEREF": "deleting a closure variable",
}
_OPCODE_HINTS = {
    "BEFORE_WITH": "`with` blocks (torch.no_grad(), autocast) are captured in a later version; "
                   "for now enter the context outside the compiled function",
    "IMPORT_NAME": "import at module level instead",
    "STORE_GLOBAL": "return the value instead of assigning a global",
    "STORE_ATTR": "return the value and assign it outside the compiled function",
    "RAISE_VARARGS": "move the check outside the compiled function",
}
