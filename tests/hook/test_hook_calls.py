"""Running rewritten code: every argument kind, closures, cells, tracebacks, recursion.

Each test runs three ways (the `path` fixture): SWAP, CALL forced, and CALL because the new
frame is too big to swap in.
"""

import inspect
import sys
import traceback

import pytest
from hooktools import expect_path, for_path, hooked, tagged, with_extra_locals


def kinds(a, b, /, c, d=4, *args, e, f=6, **kw):
    return ("orig", a, b, c, d, args, e, f, kw)


KINDS_CALLS = [
    ((1, 2, 3), {"e": 5}),
    ((1, 2), {"c": 3, "e": 5, "f": 7}),
    ((1, 2, 3, 4, 5, 6), {"e": 1, "z": 9, "a": 10}),  # 'a' is positional-only: it goes to **kw
    ((1, 2, 3, 4), {"e": 0, "f": None}),
]


def test_every_argument_kind(C, hook, path):
    seen = []

    def guard(*argvals):
        seen.append(argvals)
        return True

    new_code = for_path(tagged(kinds.__code__, "new"), path)
    compiler = hook.compiler({kinds.__code__: new_code}, guard=guard)
    with hooked(C, compiler):
        results = [kinds(*args, **kwargs) for args, kwargs in KINDS_CALLS]
    expected = [("new",) + kinds(*args, **kwargs)[1:] for args, kwargs in KINDS_CALLS]
    assert results == expected
    # One compile; the guard then sees the frame's argument slots in order.
    [(code, func, f_locals)] = compiler.calls_for(kinds.__code__)
    assert func is kinds
    assert f_locals == dict(a=1, b=2, c=3, d=4, e=5, f=6, args=(), kw={})
    assert seen == [
        (1, 2, 3, 4, 5, 7, (), {}),
        (1, 2, 3, 4, 1, 6, (5, 6), {"z": 9, "a": 10}),
        (1, 2, 3, 4, 0, None, (), {}),
    ]
    assert C.stats()["hit"] == 3
    expect_path(C, path)


def make_closures():
    scale = 10
    log = []
    count = 0

    def add(a, b=1):
        return ("orig", a * scale + b, log)

    def bump(step):
        nonlocal count
        count += step
        log.append(count)
        return ("orig", count)

    return add, bump, log


def test_closures(C, hook, path):
    add, bump, log = make_closures()
    rewrites = {
        add.__code__: for_path(tagged(add.__code__, "new"), path),
        bump.__code__: for_path(tagged(bump.__code__, "new"), path),
    }
    with hooked(C, hook.compiler(rewrites)):
        assert add(2) == ("new", 21, log)
        assert add(3, b=5) == ("new", 35, log)
        assert [bump(1), bump(2), bump(3)] == [("new", 1), ("new", 3), ("new", 6)]
    # The nonlocal cell is the function's own: the original sees what the new code did.
    assert bump(4) == ("orig", 10)
    assert log == [1, 3, 6, 10]
    expect_path(C, path)


def cell_args(a, b=2, *args, k, **kw):
    # Every argument is captured by `get`, so each is also a cell.
    def get():
        return a, b, args, k, kw

    a = a * 10  # writes through the cell
    return ("orig", get())


def test_arguments_that_are_cells(C, hook, path):
    assert {"a", "b", "args", "k", "kw"} <= set(cell_args.__code__.co_cellvars)
    new_code = for_path(tagged(cell_args.__code__, "new"), path)
    compiler = hook.compiler({cell_args.__code__: new_code})
    with hooked(C, compiler):
        first = cell_args(1, k=3)
        second = cell_args(4, 5, 6, 7, k=8, x=9)
    assert first == ("new", (10, 2, (), 3, {}))
    assert second == ("new", (40, 5, (6, 7), 8, {"x": 9}))
    # The compiler saw plain values, not cells.
    assert compiler.calls_for(cell_args.__code__)[0][2] == {
        "a": 1,
        "b": 2,
        "args": (),
        "k": 3,
        "kw": {},
    }
    expect_path(C, path)


def boom(x):
    return ("orig", x)


def boom_new(x):
    y = x * 2
    return helper_that_raises(y)


def helper_that_raises(y):
    raise ValueError(f"boom {y}")


def test_exception_traceback_points_at_new_code(C, hook, path):
    compiler = hook.compiler({boom.__code__: for_path(boom_new.__code__, path)})
    with hooked(C, compiler):
        for _ in range(2):  # the miss (compile) and the hit
            with pytest.raises(ValueError, match="boom 6") as info:
                boom(3)
            frames = traceback.extract_tb(info.value.__traceback__)
            assert [(f.name, f.filename) for f in frames[-3:]] == [
                ("test_exception_traceback_points_at_new_code", __file__),
                ("boom_new", __file__),
                ("helper_that_raises", __file__),
            ]
            assert frames[-2].lineno == boom_new.__code__.co_firstlineno + 2
            assert frames[-1].lineno == helper_that_raises.__code__.co_firstlineno + 1
    expect_path(C, path)


def whoami():
    return ("orig", sys._getframe(), inspect.currentframe().f_back)


def test_new_code_frame_and_caller(C, hook, path):
    new_code = for_path(tagged(whoami.__code__, "new"), path)
    with hooked(C, hook.compiler({whoami.__code__: new_code})):
        tag, frame, back = whoami()
    assert tag == "new"
    assert frame.f_code is new_code
    assert frame.f_globals is globals()
    assert back is sys._getframe()  # the original frame never shows up
    expect_path(C, path)


def rec(n):
    if n == 0:
        return "orig"
    return rec(n - 1)


def test_recursion_500_deep(C, hook, path):
    # Every level runs the hook, the guard and the new code.  Measured ceilings of hooked
    # recursion (SWAP and CALL alike, as for a pass-through hook): 3.11.7 follows
    # sys.setrecursionlimit (9000 levels ran at a limit of 10000); 3.12.1 stops at 747 levels
    # whatever the limit, because of its C recursion limit (1500 units, 2 per hooked level);
    # 3.13.0 stops at 4997.  500 fits everywhere.
    new_code = for_path(tagged(rec.__code__, "new"), path)
    compiler = hook.compiler({rec.__code__: new_code})
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 3000))
    try:
        before = C.datastack_info()
        with hooked(C, compiler):
            assert rec(500) == "new"
            assert rec(500) == "new"
        assert C.datastack_info() == before
    finally:
        sys.setrecursionlimit(limit)
    assert len(compiler.calls_for(rec.__code__)) == 1
    assert C.stats()["hit"] == 1000 + 1  # 500 levels below the first call, then 501 hits
    expect_path(C, path)


PADDED = """
def padded(a, b, *rest, k=1):
    #PAD
    return ("new", a, b, rest, k)
"""


def plain(a, b, *rest, k=1):
    return ("orig", a, b, rest, k)


@pytest.mark.parametrize("extra", [300, 3000])
def test_many_extra_locals(C, hook, extra):
    # 3000 extra locals never fit in a 16 KiB data-stack chunk, so CALL runs them; 300 may or
    # may not fit, depending on how full the chunk is.
    new = with_extra_locals(PADDED, "padded", extra, {})
    assert new.__code__.co_nlocals >= extra
    with hooked(C, hook.compiler({plain.__code__: new.__code__})):
        results = [plain(i, 2, 3, k=i) for i in range(50)]
    assert results == [("new", i, 2, (3,), i) for i in range(50)]
    s = C.stats()
    assert s["swap"] + s["call"] == 50
    if extra == 3000:
        assert s["call"] == 50


def test_incompatible_new_code_raises(C, hook):
    def one(a):
        return a

    def two(a, b):
        return a

    compiler = hook.compiler({one.__code__: two.__code__})
    with hooked(C, compiler):
        with pytest.raises(RuntimeError, match="co_argcount is 2, the original's is 1"):
            one(1)
        assert C.get_eval_frame() is compiler
    assert one(5) == 5


OPENER = """
def opener(a):
    #PAD
    return ("orig", a)
"""


def descend(depth, fn, C):
    if depth == 0:
        before = C.datastack_info()
        result = fn(1)
        return before, C.datastack_info(), result
    return descend(depth - 1, fn, C)


def small_opener(a):
    return ("new", a)


@pytest.mark.parametrize("how", ["force_call", "grow", "shrink"])
def test_frames_at_data_stack_chunk_boundaries(C, hook, how):
    # Call a hooked function at every depth across a data-stack chunk boundary, so that the
    # original frame is at times the first frame of a fresh chunk (CALL must then free the
    # chunk when disposing of it on 3.12), a growing SWAP at times finds no room, and a
    # shrinking SWAP always fits.
    opener = with_extra_locals(OPENER, "opener", 60, {})
    new_code = tagged(opener.__code__, "new")
    if how == "grow":
        new_code = new_code.replace(co_stacksize=new_code.co_stacksize + 40)
    elif how == "shrink":
        new_code = small_opener.__code__
    C.set_force_call(how == "force_call")
    with hooked(C, hook.compiler({opener.__code__: new_code})):
        for depth in range(200):
            before, after, result = descend(depth, opener, C)
            assert result == ("new", 1)
            assert after == before, depth
    s = C.stats()
    assert (s["call"] > 0) == (how != "shrink")
    assert (s["swap"] > 0) == (how != "force_call")
