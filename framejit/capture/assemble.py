"""Code objects from `bytecode` instructions, with location tables CPython reads correctly.

The `bytecode` library (0.16 to 0.19 at least) writes a location whose columns reach 128..255,
on a line one or two after the previous entry's, in the table's "one-line" form, which stores
each column in one byte. CPython writes that form only for columns below 128: its ``co_lines()``
(the line numbers of tracebacks, warnings and ``sys.settrace``) finds the next entry by the top
bit of each byte, so a column of 128 or more reads as the start of an entry, every later line
shifts, and the table runs past the code. transformers' ``deprecate_kwarg`` wrapper, whose
f-string reaches column 185, made every resume function of a break under it fail
:func:`~framejit.capture.codecheck.check_code`. :func:`to_code` writes such a table again the
way CPython's compiler does (``Objects/locations.md``).
"""

from __future__ import annotations

import types

#: Location-table entry kinds (the 4 bits after the header's top bit).
_ONE_LINE = 10      # 10, 11, 12: the line 0, 1 or 2 after the previous entry's; columns < 128
_NO_COLUMNS = 13
_LONG = 14
_NONE = 15
#: Columns the one-line form stores (one byte each, below the top bit that starts an entry).
_ONE_LINE_COLUMNS = 128


def to_code(bc, **kwargs) -> types.CodeType:
    """``bc.to_code(**kwargs)``, with the location table rewritten where the library's would
    be misread (a column of 128 or more)."""
    code = bc.to_code(**kwargs)
    if any((col is not None and col >= _ONE_LINE_COLUMNS)
           or (end_col is not None and end_col >= _ONE_LINE_COLUMNS)
           for _, _, col, end_col in code.co_positions()):
        code = code.replace(co_linetable=location_table(code))
    return code


def location_table(code: types.CodeType) -> bytes:
    """The location table of ``code``'s positions (``co_positions()``, one per code unit), in
    the forms CPython's compiler chooses: at most 8 code units an entry, equal neighbours
    grouped."""
    positions = list(code.co_positions())
    out = bytearray()
    line = code.co_firstlineno
    i = 0
    while i < len(positions):
        pos = positions[i]
        n = 1
        while n < 8 and i + n < len(positions) and positions[i + n] == pos:
            n += 1
        line = _entry(out, pos, n, line)
        i += n
    return bytes(out)


def _entry(out: bytearray, pos, units: int, prev_line: int) -> int:
    """Appends one entry for ``units`` code units at ``pos``; returns the line later entries
    count from."""
    line, end_line, col, end_col = pos

    def header(kind: int) -> None:
        out.append(0x80 | (kind << 3) | (units - 1))

    if line is None:
        header(_NONE)
        return prev_line
    delta = line - prev_line
    one_line = end_line is None or end_line == line
    if col is None or end_col is None:
        if one_line:
            header(_NO_COLUMNS)
            out += _svarint(delta)
            return line
    elif one_line:
        if delta == 0 and col < 80 and 0 <= end_col - col < 16:
            header(col // 8)                                    # the short forms, 0..9
            out.append(((col % 8) << 4) | (end_col - col))
            return line
        if 0 <= delta < 3 and col < _ONE_LINE_COLUMNS and end_col < _ONE_LINE_COLUMNS:
            header(_ONE_LINE + delta)
            out += bytes((col, end_col))
            return line
    header(_LONG)
    out += _svarint(delta)
    out += _varint((end_line if end_line is not None else line) - line)
    out += _varint(col + 1 if col is not None else 0)
    out += _varint(end_col + 1 if end_col is not None else 0)
    return line


def _varint(value: int) -> bytes:
    """6 bits a byte, low bits first; bit 6 says another byte follows."""
    out = bytearray()
    while True:
        byte = value & 0x3F
        value >>= 6
        if value:
            out.append(byte | 0x40)
        else:
            out.append(byte)
            return bytes(out)


def _svarint(value: int) -> bytes:
    return _varint((-value << 1) | 1 if value < 0 else value << 1)
