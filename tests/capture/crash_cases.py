"""Graph breaks inside ``with`` blocks, run by test_crashes.py in a child interpreter (a crash
there is a failed test, not a dead test run).

``python crash_cases.py [name ...]`` runs each case (all by default) and prints one JSON line per
finished case: ``{"case": name, "ok": bool, "detail": str}``. ``name:raw`` runs the case with
resume functions never captured: their own code (the original's, behind a prefix) runs as it is. A case calls its function eagerly
and compiled on the same inputs, several times (captures, then cache hits), and compares results
or exceptions (type and message), the grad mode and autocast state after the call, the events a
user context manager recorded, and that ``traceback.format_exc()`` of a compiled call's
exception works. Then every code object framejit generated for it must pass ``check_code``.
"""

from __future__ import annotations

import json
import sys
import traceback

import torch

import framejit
from framejit import _C
from framejit.capture import convert_frame as cf
from framejit.capture import resume
from framejit.capture.codecheck import check_code
from framejit.testing import assert_close_to_eager, capture_stats

EVENTS: list = []


class Ctx:
    """A context manager written in Python that logs its entry and exit."""

    def __init__(self, name="ctx"):
        self.name = name

    def __enter__(self):
        EVENTS.append(("enter", self.name))
        return self

    def __exit__(self, typ, value, tb):
        EVENTS.append(("exit", self.name, typ.__name__ if typ else None))
        return None


# -- the functions: each graph-breaks inside one or more `with` blocks ------------------------------

def graph_raises_after_break(x):
    """The issue's first form: the resumed graph raises inside the block."""
    with torch.no_grad():
        v = x.sum().item()  # graph break inside the block
        c = torch.linalg.cholesky(-torch.eye(2) * v)  # raises when the graph runs (v > 0)
    return v, c


def raise_in_two_blocks(x):
    """The issue's second form: a data-dependent raise inside two blocks."""
    with Ctx(), torch.no_grad():
        if bool(x.any()):
            raise ValueError("boom")
    z = x + 1
    return z


def break_in_two_blocks(x):
    """The "negative stacksize" form: a plain graph break inside two blocks."""
    with Ctx(), torch.no_grad():
        y = x * 2
        print("break")  # (test_crashes.py reads only the JSON lines)
        y = y + torch.is_grad_enabled()
    return y, torch.is_grad_enabled()


def native_raises(x):
    """The instruction run natively at the break raises inside the block."""
    with torch.no_grad():
        y = x * 2
        v = y.item()  # raises for more than one element
    return v


def native_raises_in_nested(x):
    with Ctx("outer"):
        with torch.enable_grad():
            with torch.no_grad():
                y = x * 2
                v = y.item()
    return v


def user_raises_after_break(x):
    """Python code after the break raises (the resume function's own `raise`)."""
    with Ctx("a"):
        with torch.no_grad():
            y = x + 1
            n = int(y.sum().item())
            if n > 4:
                raise KeyError(f"too big: {n}")
            y = y * n
    return y


def nested_mixture(x):
    with torch.enable_grad():
        with Ctx("outer"):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                a = x @ x.t()
                s = a.float().sum().item()  # break inside three blocks
                b = x @ x.t()
        with torch.no_grad():
            m = float(b.float().mean())  # a second break in a sibling block
            c = torch.linalg.cholesky(-torch.eye(2) * (m * m + 1))  # raises
    return a, b, c, s


def user_exit_when_graph_raises(x):
    """The graph raises inside a user context manager whose methods were inlined: eager calls
    its __exit__ with the exception, and so does the compiled function (it runs the frame
    again as plain Python)."""
    with Ctx():
        v = x.sum().item()
        c = torch.linalg.cholesky(-torch.eye(2) * v)
    return c


def nested_no_raise(x):
    with Ctx("outer"), torch.no_grad():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            a = x @ x.t()
            s = a.float().sum().item()
            b = (x @ x.t()) * s
        with Ctx("inner"):
            c = b.float().relu()
            k = int(c.sum().item() > 0)
            d = c * k
    return a, b, c, d, torch.is_grad_enabled()


def loop_in_block(x):
    total = x * 0
    with Ctx(), torch.no_grad():
        for i in range(3):
            total = total + x * i
            if float(total.sum()) > 100:
                raise RuntimeError("overflow")
    return total


def break_after_inner_block(x):
    with torch.no_grad():
        with Ctx("inner"):
            y = x * 3
        v = y.sum().item()
        w = torch.linalg.cholesky(-torch.eye(2) * abs(v) - torch.eye(2))
    return w


def raise_in_exit_path(x):
    with torch.set_grad_enabled(False):
        with Ctx("a"), Ctx("b"):
            y = x.sin()
            if bool((y > 10).any()):
                return y
            raise IndexError("from the block")


def block_in_loop(x):
    out = []
    for i in range(3):
        with Ctx(f"it{i}"), torch.no_grad():
            y = x * i
            if float(y.sum()) > 5:
                raise OverflowError(f"at {i}")
            out.append(y + torch.is_grad_enabled())
    return out


def autocast_graph_raises(x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a = x @ x.t()
        n = a.float().sum().item()
        c = torch.linalg.cholesky(-torch.eye(2) * n)
    return c


def try_after_block(x):
    with torch.no_grad():
        v = x.sum().item()
        y = x * v
    try:
        z = y.exp()
    except RuntimeError:
        z = y
    return z, torch.is_grad_enabled()


# -- the cases: (function, list of inputs, each input a tuple of arguments) -------------------------

def _t(*values):
    return (torch.tensor(values, dtype=torch.float32),)


CASES = {
    "graph_raises_after_break": (graph_raises_after_break, [_t(1.0, 2.0), _t(3.0, 1.0)]),
    "raise_in_two_blocks": (raise_in_two_blocks, [_t(0.0, 0.0), _t(1.0, 0.0), _t(0.0, 0.0), _t(2.0)]),
    "break_in_two_blocks": (break_in_two_blocks, [_t(1.0, 2.0), _t(3.0, 4.0)]),
    "native_raises": (native_raises, [_t(1.0, 2.0), _t(3.0), _t(5.0, 6.0)]),
    "native_raises_in_nested": (native_raises_in_nested, [_t(1.0, 2.0), _t(3.0), _t(1.0, 2.0)]),
    "user_raises_after_break": (user_raises_after_break, [_t(1.0), _t(1.0, 2.0), _t(0.0), _t(5.0)]),
    "nested_mixture": (nested_mixture, [(torch.ones(2, 3),), (torch.ones(2, 3) * 2,)]),
    "user_exit_when_graph_raises": (user_exit_when_graph_raises, [_t(1.0, 2.0)]),
    "nested_no_raise": (nested_no_raise, [(torch.ones(2, 3),), (-torch.ones(2, 3),)]),
    "loop_in_block": (loop_in_block, [_t(1.0, 2.0), _t(100.0), _t(3.0, 4.0)]),
    "break_after_inner_block": (break_after_inner_block, [_t(1.0, 2.0), _t(-2.0)]),
    "block_in_loop": (block_in_loop, [_t(0.5, 0.5), _t(2.0, 2.0), _t(0.1)]),
    "autocast_graph_raises": (autocast_graph_raises, [(torch.ones(2, 3),)]),
    "try_after_block": (try_after_block, [_t(1.0, 2.0), _t(3.0)]),
    "raise_in_exit_path": (raise_in_exit_path, [_t(1.0, 2.0), _t(3.0)]),
}


def _outcome(fn, args):
    """What one call does: ('ok', result) or ('raised', type name, message, formatted traceback),
    with the events and the global state after it."""
    EVENTS.clear()
    try:
        result = fn(*args)
        out = ("ok", result)
    except Exception as e:  # noqa: BLE001 - the test compares exceptions
        out = ("raised", type(e).__name__, str(e), traceback.format_exc())
    state = (torch.is_grad_enabled(), torch.is_autocast_enabled("cpu"))
    return out, list(EVENTS), state


def run_case(name: str) -> str:
    fn, inputs = CASES[name]
    compiled = framejit.compile(fn)
    for args in inputs:
        expected, events, state = _outcome(fn, args)
        actual, c_events, c_state = _outcome(compiled, args)
        if expected[0] != actual[0]:
            return f"{args}: eager {expected[:3]}, compiled {actual[:3]}"
        if expected[0] == "ok":
            assert_close_to_eager(actual[1], expected[1])
        else:
            if expected[1:3] != actual[1:3]:
                return f"{args}: eager raised {expected[1:3]}, compiled {actual[1:3]}"
            if actual[1] not in actual[3]:
                return f"{args}: the traceback does not end with the exception:\n{actual[3]}"
        if events != c_events:
            return f"{args}: eager events {events}, compiled {c_events}"
        if state != c_state or state != (True, False):
            return f"{args}: global state after the call: eager {state}, compiled {c_state}"
    stats = capture_stats()
    if not stats.graph_breaks:
        return f"no graph break: {stats.fallback_reasons}"
    if any("internal error" in reason for _, reason in stats.fallback_reasons):
        return f"internal error: {stats.fallback_reasons}"
    checked = 0
    codes = [c for per in resume._resume_cache.values() for c in per.values()]
    codes += [entry[1] for code in list(cf._touched) for entry in _C.get_cache_entries(code)]
    for code in codes:
        check_code(code, disassemble=True)
        checked += 1
    return f"ok ({checked} code objects checked)"


def _without_resume_capture(convert_frame):
    def convert(ctx, code, func, f_locals):
        if code in resume._origin:
            return None  # a resume function: run its code as it is
        return convert_frame(ctx, code, func, f_locals)
    return convert


def main(names):
    captured = cf.convert_frame
    for name in names or [n + mode for n in CASES for mode in ("", ":raw")]:
        framejit.reset()
        case, _, mode = name.partition(":")
        cf.convert_frame = _without_resume_capture(captured) if mode == "raw" else captured
        try:
            detail = run_case(case)
            ok = detail.startswith("ok")
        except Exception:  # noqa: BLE001
            ok, detail = False, traceback.format_exc()
        print(json.dumps({"case": name, "ok": ok, "detail": detail}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
