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
except (ImportError, AttributeError, IndexError, KeyError):  # another library or Python
    _SUPPORTED = False


def instructions(code: types.CodeType):
    """``(rows, offsets)`` for ``code``: a row ``(name, arg, lineno, target)`` per instruction
    (CACHE entries and EXTENDED_ARG prefixes left out; ``target`` the index of a jump's target
    instruction, else None) and the byte offset of each instruction's opcode; or None when this
    decoder does not apply (the caller then uses ``Bytecode.from_code``)."""
    if not _SUPPORTED:
        return None
    bc = code.co_code
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
    n = len(bc)
    i = 0
    ext = None
    start = 0
    while i < n:
        op = bc[i]
        unit = i >> 1
        if op == _EXTENDED_ARG:
            if ext is None:
                start = unit
                ext = bc[i + 1]
            else:
                ext = (ext << 8) + bc[i + 1]
            i += 2
            continue
        if ext is None:
            start = unit
            arg = bc[i + 1] if op in _HAS_ARG else _UNSET
        else:
            arg = _UNSET if op == _NOP else (ext << 8) + bc[i + 1]
            ext = None
        if op == _CACHE:
            i += 2
            continue
        if op in _OTHER:
            return None
        c_arg = arg
        if op in _HAS_CONST:
            arg = consts[c_arg]
        elif op in _HAS_LOCAL:
            arg = varnames[c_arg]
        elif op in _HAS_NAME:
            if op in _BITFLAG:
                arg = (bool(c_arg & 1), names[c_arg >> 1])
            elif op in _BITFLAG2:
                arg = (bool(c_arg & 1), bool(c_arg & 2), names[c_arg >> 2])
            else:
                arg = names[c_arg]
        elif op in _HAS_FREE:
            if cells is None:
                cells = list(varnames) + [_CellVar(c) for c in cellvars if c not in varnames]
            if c_arg < len(cells):
                cell = cells[c_arg]
                arg = cell if isinstance(cell, _CellVar) else _CellVar(cell)
            else:
                arg = _FreeVar(freevars[c_arg - len(cells)])
        elif op in _HAS_COMPARE:
            arg = _Compare((c_arg >> 4) if compat.PY312 else c_arg)
        elif op in _INTRINSIC_1:
            arg = _Intrinsic1Op(c_arg)
        elif op in _INTRINSIC_2:
            arg = _Intrinsic2Op(c_arg)
        elif op in _BINARY:
            arg = _BinaryOp(c_arg)
        after = unit + 1 + _CACHES[op]
        if op in _FORWARD:
            jumps.append((len(rows), after + c_arg))
        elif op in _BACKWARD:
            jumps.append((len(rows), after - c_arg))
        elif op in _ABSOLUTE:
            jumps.append((len(rows), c_arg))
        while i >= line_end:
            _, line_end, lineno = next(lines, (None, n + 1, None))
        starts[start] = starts[unit] = len(rows)
        rows.append([_OPNAME[op], arg, lineno, None])
        offsets.append(i)
        i += 2
    for k, target in jumps:
        rows[k][1] = _Label()  # as the library gives (the interpreter reads only the target)
        rows[k][3] = starts[target]
    return rows, offsets
