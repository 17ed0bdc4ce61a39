"""Decoding a code object's instructions quickly, as the ``bytecode`` library would.

The interpreter reads each instruction's name, argument (in the ``bytecode`` library's terms:
a constant, a name, ``CellVar``/``FreeVar``, ``Compare``, ``BinaryOp``, ... ; ``UNSET`` when it
takes none), line number and jump target. ``Bytecode.from_code`` gives all that and much more
(locations, labels, try blocks, a concrete pass then an abstract one) at 0.5-1 ms a code object,
which made decoding about a third of a model's first call (80 code objects for GPT-2).
:func:`instructions` reads ``co_code`` once with the same rules and the library's own tables,
about ten times faster. It answers None where it was not checked (a Python version it does not
know, a library without the tables); the interpreter then uses ``Bytecode.from_code``. What only
a rewrite needs (an instruction's index in the ``Bytecode`` list) is computed by the library
when asked (see ``interpreter.Inst.pos``).

tests/capture/test_decoding.py checks that both ways agree on every code object of several
libraries.
"""

from __future__ import annotations

import dis
import opcode as _opcode
import types
import weakref

from . import compat

try:
    from bytecode import instr as _bi
    from bytecode.concrete import HAS_COMPARE, HAS_CONST, HAS_FREE, HAS_NAME

    _SUPPORTED = compat.PY311 or compat.PY312
    if _SUPPORTED:
        _UNSET = _bi.UNSET
        _Label = _bi.Label
        _CellVar, _FreeVar = _bi.CellVar, _bi.FreeVar
        _Compare, _BinaryOp = _bi.Compare, _bi.BinaryOp
        _Intrinsic1Op, _Intrinsic2Op = _bi.Intrinsic1Op, _bi.Intrinsic2Op
        _HAS_LOCAL = frozenset(_opcode.haslocal)
        _HAS_CONST, _HAS_NAME = frozenset(HAS_CONST), frozenset(HAS_NAME)
        _HAS_FREE, _HAS_COMPARE = frozenset(HAS_FREE), frozenset(HAS_COMPARE)
        _BITFLAG, _BITFLAG2 = frozenset(_bi.BITFLAG_OPCODES), frozenset(_bi.BITFLAG2_OPCODES)
        _INTRINSIC_1, _INTRINSIC_2 = frozenset(_bi.INTRINSIC_1OP), frozenset(_bi.INTRINSIC_2OP)
        _BINARY = frozenset(_bi.BINARY_OPS)
        _FORWARD = frozenset(_bi.HAS_FORWARD_RELATIVE_JUMP)
        _BACKWARD = frozenset(_bi.HAS_BACKWARD_RELATIVE_JUMP)
        _ABSOLUTE = frozenset(_bi.HAS_ABSOLUTE_JUMP)
        _EXTENDED_ARG = _bi.EXTENDEDARG_OPCODE
        _NOP = _bi.NOP_OPCODE
        _CACHE = _bi.CACHE_OPCODE
        _HAS_ARG = frozenset(op for op in range(256) if _bi.opcode_has_argument(op))
        # Opcodes whose arguments this decoder does not convert: the library's newer kinds.
        _OTHER = frozenset(_bi.DUAL_ARG_OPCODES) | frozenset(_bi.FORMAT_VALUE_OPS) \
            | frozenset(_bi.COMMON_CONSTANT_OPS) | frozenset(_bi.SPECIAL_OPS)
        _CACHES = [dis._inline_cache_entries[op] for op in range(256)]  # type: ignore[attr-defined]
        _OPNAME = _opcode.opname
        # One table lookup per instruction instead of a chain of set tests: the kind of its
        # argument (in the order the tests above are made), and of its jump.
        (_K_PLAIN, _K_EXTENDED_ARG, _K_CACHE, _K_OTHER, _K_CONST, _K_LOCAL, _K_NAME, _K_NAME_BIT,
         _K_NAME_BIT2, _K_FREE, _K_COMPARE, _K_INTRINSIC_1, _K_INTRINSIC_2, _K_BINARY) = range(14)

        def _kind_of(op: int) -> int:
            if op == _EXTENDED_ARG:
                return _K_EXTENDED_ARG
            if op == _CACHE:
                return _K_CACHE
            if op in _OTHER:
                return _K_OTHER
            if op in _HAS_CONST:
                return _K_CONST
            if op in _HAS_LOCAL:
                return _K_LOCAL
            if op in _HAS_NAME:
                return _K_NAME_BIT if op in _BITFLAG else _K_NAME_BIT2 if op in _BITFLAG2 else _K_NAME
            if op in _HAS_FREE:
                return _K_FREE
            if op in _HAS_COMPARE:
                return _K_COMPARE
            if op in _INTRINSIC_1:
                return _K_INTRINSIC_1
            if op in _INTRINSIC_2:
                return _K_INTRINSIC_2
            if op in _BINARY:
                return _K_BINARY
            return _K_PLAIN

        _KIND = [_kind_of(op) for op in range(256)]
        _JUMP_KIND = [1 if op in _FORWARD else 2 if op in _BACKWARD else 3 if op in _ABSOLUTE else 0
                      for op in range(256)]
        _HAS_ARG_TABLE = [op in _HAS_ARG for op in range(256)]
        _ENUM_TYPES = {_K_COMPARE: _Compare, _K_INTRINSIC_1: _Intrinsic1Op,
                       _K_INTRINSIC_2: _Intrinsic2Op, _K_BINARY: _BinaryOp}
        _ENUMS: dict[int, dict] = {kind: {} for kind in _ENUM_TYPES}
        _SKIP = [2 + 2 * c for c in _CACHES]  # bytes from an opcode to the next instruction's
except (ImportError, AttributeError, IndexError, KeyError):  # another library or Python
    _SUPPORTED = False


class Row:
    """One decoded instruction as :func:`instructions` gives it by default: ``name``, ``arg``,
    ``lineno``, ``target``; unpacks as ``(name, arg, lineno, target)``."""

    __slots__ = ("name", "arg", "lineno", "target")

    def __init__(self, name, arg, lineno, target, pos, handler, code):
        self.name, self.arg, self.lineno, self.target = name, arg, lineno, target

    def __iter__(self):
        return iter((self.name, self.arg, self.lineno, self.target))


def instructions(code: types.CodeType, make=Row):
    """``(rows, offsets)`` for ``code``: a row per instruction (CACHE entries and EXTENDED_ARG
    prefixes left out), ``make(name, arg, lineno, target, -1, None, weakref.ref(code))`` with ``target``
    None, then set to the index of a jump's target instruction (and its ``arg`` to a label), and
    the byte offset of each instruction's opcode; or None when this decoder does not apply (the
    caller then uses ``Bytecode.from_code``). ``make`` is :class:`Row` or the interpreter's
    instruction class, which it builds directly (a third of decoding was building them)."""
    if not _SUPPORTED:
        return None
    bc = code.co_code
    ref = weakref.ref(code)  # (a row's link to its code: the decoded rows are cached by code)
    lines = code.co_lines()  # (start byte, end byte, line number) ranges, in order
    line_end = -1
    lineno = None
    consts, names, varnames = code.co_consts, code.co_names, code.co_varnames
    cellvars, freevars = code.co_cellvars, code.co_freevars
    cells = None
    rows = []
    offsets = []
    starts: dict[int, int] = {}  # code-unit offset (of a prefix, if any) -> instruction index
    jumps = []  # (row index, target code-unit offset)
    kinds, jump_kinds, has_arg, opname, skip = _KIND, _JUMP_KIND, _HAS_ARG_TABLE, _OPNAME, _SKIP
    n = len(bc)
    i = 0
    ext = None
    start = 0
    while i < n:
        op = bc[i]
        kind = kinds[op]
        unit = i >> 1
        if kind == _K_EXTENDED_ARG:
            if ext is None:
                start = unit
                ext = bc[i + 1]
            else:
                ext = (ext << 8) + bc[i + 1]
            i += 2
            continue
        if ext is None:
            start = unit
            arg = c_arg = bc[i + 1] if has_arg[op] else _UNSET
        else:
            arg = c_arg = _UNSET if op == _NOP else (ext << 8) + bc[i + 1]
            ext = None
        if kind:
            if kind == _K_CACHE:
                i += 2
                continue
            if kind == _K_CONST:
                arg = consts[c_arg]
            elif kind == _K_LOCAL:
                arg = varnames[c_arg]
            elif kind == _K_NAME:
                arg = names[c_arg]
            elif kind == _K_NAME_BIT:
                arg = (bool(c_arg & 1), names[c_arg >> 1])
            elif kind == _K_NAME_BIT2:
                arg = (bool(c_arg & 1), bool(c_arg & 2), names[c_arg >> 2])
            elif kind == _K_FREE:
                if cells is None:
                    cells = list(varnames) + [_CellVar(c) for c in cellvars if c not in varnames]
                if c_arg < len(cells):
                    cell = cells[c_arg]
                    arg = cell if isinstance(cell, _CellVar) else _CellVar(cell)
                else:
                    arg = _FreeVar(freevars[c_arg - len(cells)])
            elif kind >= _K_COMPARE:  # the library's enums (calling an enum class is slow)
                if kind == _K_COMPARE and compat.PY312:
                    c_arg >>= 4
                arg = _ENUMS[kind].get(c_arg)
                if arg is None:
                    arg = _ENUMS[kind][c_arg] = _ENUM_TYPES[kind](c_arg)
            else:  # _K_OTHER
                return None
        jump = jump_kinds[op]
        if jump:
            if jump == 1:
                jumps.append((len(rows), unit + 1 + _CACHES[op] + c_arg))
            elif jump == 2:
                jumps.append((len(rows), unit + 1 + _CACHES[op] - c_arg))
            else:
                jumps.append((len(rows), c_arg))
        if i >= line_end:
            while i >= line_end:
                _, line_end, lineno = next(lines, (None, n + 1, None))
        starts[start] = starts[unit] = len(rows)
        rows.append(make(opname[op], arg, lineno, None, -1, None, ref))
        offsets.append(i)
        i += skip[op]  # the instruction and its inline CACHE entries, which have no row
    for k, target in jumps:
        row = rows[k]
        row.arg = _Label()  # as the library gives (the interpreter reads only the target)
        row.target = starts[target]
    return rows, offsets
