"""A check of the code objects framejit generates (rewritten frames, resume functions).

CPython trusts a code object's stack size, exception table and location tables: a handler
entered with a stack it does not expect reads the wrong slots (``WITH_EXCEPT_START`` calls a
value that is not the block's ``__exit__``, ``RERAISE`` takes a user's value as the
instruction offset to report) and the interpreter crashes, typically later, while it prints
the traceback. :func:`check_code` follows the stack depth through every path of the code,
exception edges included, and rejects what CPython would not handle; a capture that produces
such code falls back to plain Python instead of running it.
"""

from __future__ import annotations

import dis
import io
import types
import weakref

from ..errors import InternalError
from . import compat

_NO_FALL_THROUGH = frozenset({
    "JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "JUMP_ABSOLUTE", "JUMP",
    "JUMP_NO_INTERRUPT", "RETURN_VALUE", "RETURN_CONST", "RAISE_VARARGS", "RERAISE",
})
_JUMPS = frozenset(dis.hasjrel) | frozenset(dis.hasjabs)


class BadCode(InternalError):
    """framejit generated a code object CPython cannot run safely (a bug in framejit)."""


def exception_table(code: types.CodeType) -> list[tuple[int, int, int, int, bool]]:
    """(start, end, target, depth, lasti) per entry, offsets in bytes, ``end`` exclusive."""
    table = code.co_exceptiontable
    pos = 0

    def varint() -> int:
        nonlocal pos
        b = table[pos]
        pos += 1
        value = b & 63
        while b & 64:
            b = table[pos]
            pos += 1
            value = (value << 6) | (b & 63)
        return value

    entries = []
    while pos < len(table):
        start = varint() * 2
        end = start + varint() * 2
        target = varint() * 2
        depth_lasti = varint()
        entries.append((start, end, target, depth_lasti >> 1, bool(depth_lasti & 1)))
    return entries


#: Code objects already checked (a resume function's code is checked when it is made, and
#: again as a constant of each rewritten frame that calls it).
_checked: weakref.WeakSet = weakref.WeakSet()


def check_code(code: types.CodeType, *, disassemble: bool = False) -> None:
    """Raise :class:`BadCode` unless ``code`` (and every code object among its constants) has a
    consistent stack depth on every path, exception-table entries whose depths the stack
    always reaches and whose handlers start on instructions, and readable location tables.
    ``disassemble`` also runs ``dis.dis`` on it (for tests: slower)."""
    if code in _checked and not disassemble:
        return
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            check_code(const, disassemble=disassemble)
    try:
        _check(code)
        if disassemble:
            dis.dis(code, file=io.StringIO())
    except BadCode:
        raise
    except Exception as e:  # a table so broken that reading it fails
        raise BadCode(f"{_name(code)}: unreadable code object: {type(e).__name__}: {e}") from e
    _checked.add(code)


def _name(code: types.CodeType) -> str:
    return f"{getattr(code, 'co_qualname', code.co_name)} ({code.co_filename}:{code.co_firstlineno})"


def _check(code: types.CodeType) -> None:
    name = _name(code)
    insts = list(dis.get_instructions(code))
    by_offset = {ins.offset: k for k, ins in enumerate(insts)}
    size = len(code.co_code)
    entries = exception_table(code)
    covering: dict[int, tuple] = {}
    for entry in entries:
        start, end, target, depth, _ = entry
        if not (0 <= start < end <= size) or target not in by_offset:
            raise BadCode(f"{name}: exception-table entry {entry} does not fit the code")
        if depth + 1 + entry[4] > code.co_stacksize:
            raise BadCode(f"{name}: exception-table entry {entry} has a depth beyond the stack size "
                          f"{code.co_stacksize}")
        for off in range(start, end, 2):
            if off in covering:
                raise BadCode(f"{name}: exception-table entries overlap at offset {off}")
            covering[off] = entry

    # Follow the stack depth from the first instruction, through jumps and exception edges.
    levels: dict[int, int] = {}
    # Before 3.13 a generator's frame starts with the sent value on its stack.
    work = [(0, 1 if code.co_flags & compat.CO_GENERATOR_LIKE and not compat.PY313 else 0)]
    while work:
        k, level = work.pop()
        if k >= len(insts):
            raise BadCode(f"{name}: execution runs past the last instruction")
        seen = levels.get(k)
        if seen is not None:
            if seen != level:
                raise BadCode(f"{name}: instruction at offset {insts[k].offset} ({insts[k].opname}) "
                              f"is reached with stack depths {seen} and {level}")
            continue
        levels[k] = level
        ins = insts[k]
        entry = covering.get(ins.offset)
        if entry is not None:
            _, _, target, depth, lasti = entry
            if level < depth:
                raise BadCode(f"{name}: at offset {ins.offset} ({ins.opname}) the stack holds {level} "
                              f"values, below the depth {depth} of its exception handler")
            work.append((by_offset[target], depth + 1 + lasti))
        if ins.opcode in _JUMPS and ins.argval is not None:
            after = level + dis.stack_effect(ins.opcode, ins.arg, jump=True)
            _check_level(name, ins, after, code)
            if ins.argval not in by_offset:
                raise BadCode(f"{name}: jump at offset {ins.offset} lands inside an instruction")
            work.append((by_offset[ins.argval], after))
        if ins.opname in _NO_FALL_THROUGH:
            continue
        after = level + dis.stack_effect(ins.opcode, ins.arg if ins.opcode >= dis.HAVE_ARGUMENT
                                         else None, jump=False)
        _check_level(name, ins, after, code)
        work.append((k + 1, after))

    # Location tables: what tracebacks, warnings and debuggers read.
    for lineno, end_lineno, col, end_col in code.co_positions():
        if lineno is not None and end_lineno is not None and end_lineno < lineno:
            raise BadCode(f"{name}: a position ends (line {end_lineno}) before it starts (line {lineno})")
        for v in (lineno, end_lineno, col, end_col):
            if v is not None and v < 0:
                raise BadCode(f"{name}: a negative position {v}")
    last = 0
    for start, end, _line in code.co_lines():
        if start != last or end < start or end > size:
            raise BadCode(f"{name}: the line table does not cover the code in order ({start}, {end})")
        last = end
    if last != size:
        raise BadCode(f"{name}: the line table covers {last} of {size} bytes")


def _check_level(name: str, ins: dis.Instruction, level: int, code: types.CodeType) -> None:
    if level < 0:
        raise BadCode(f"{name}: the stack underflows at offset {ins.offset} ({ins.opname})")
    if level > code.co_stacksize:
        raise BadCode(f"{name}: the stack grows to {level} at offset {ins.offset} ({ins.opname}), "
                      f"beyond co_stacksize {code.co_stacksize}")
