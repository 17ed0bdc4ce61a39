"""Location tables of generated code: a column of 128 or more (long lines) must not shift the
line numbers CPython reads (framejit.capture.assemble)."""

import traceback

import torch

import framejit
from framejit.capture import assemble

# Line 4 (the f-string, which ends past column 128) starts a location entry one line after the
# previous entry's: the `bytecode` library writes it in the one-line form, which CPython misreads
# for columns of 128 and more (transformers' deprecate_kwarg wrapper has such a line).
_SOURCE = '''
def wide(x, name):
    w = x - 1
    message = f"a message long enough to reach past column 128 of its line, with {name!r} and {x.shape} in it and more text, more and more text, to be sure"
    y = w + 2
    print(message[:0], end="")
    z = y * 2
    if name == "raise":
        raise ValueError("after the break")
    return z
'''


def _wide():
    namespace = {}
    exec(compile(_SOURCE, "<wide>", "exec"), namespace)
    return namespace["wide"]


def _line_per_unit(code) -> list:
    return [line for start, stop, line in code.co_lines() for _ in range(start, stop, 2)]


def _lines_cover(code) -> bool:
    end = 0
    for start, stop, _ in code.co_lines():
        if start != end:
            return False
        end = stop
    return end == len(code.co_code)


def test_the_location_table_is_written_as_cpython_reads_it():
    code = _wide().__code__
    table = assemble.location_table(code)
    again = code.replace(co_linetable=table)
    assert list(again.co_positions()) == list(code.co_positions())
    assert _line_per_unit(again) == _line_per_unit(code)
    assert any(col is not None and col >= 128 for _, _, _, col in code.co_positions())


def test_a_break_after_a_wide_line_resumes_with_right_line_numbers(stats):
    fn = _wide()
    compiled = framejit.compile(fn, backend="eager")
    x = torch.ones(3)
    torch.testing.assert_close(compiled(x, "ok"), fn(x, "ok"))
    assert stats.eager_frames == 0, stats.fallback_reasons
    assert stats.graph_breaks == 1 and stats.graphs == 2
    resumes = [c for c in _generated_codes(fn) if "resume" in c.co_name]
    assert resumes and all(_lines_cover(c) for c in resumes)
    try:
        compiled(x, "raise")
    except ValueError as e:
        frame = traceback.extract_tb(e.__traceback__)[-1]
    assert (frame.filename, frame.lineno) == ("<wide>", 9)
    assert frame.name.startswith("wide")


def _generated_codes(fn):
    from framejit.capture import resume
    return [code for code in resume._origin if code.co_filename == fn.__code__.co_filename]
