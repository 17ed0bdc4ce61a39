"""Cache lookup, the callback on a miss, code modes, owners and error handling."""

import gc
import sys
import weakref

import pytest
from hooktools import Compiler, hooked, tagged


def target(x, y=1):
    return ("orig", x, y)


NEW = tagged(target.__code__, "new")
OTHER = tagged(target.__code__, "other")


def test_guard_miss_calls_the_callback_again(C, hook):
    def is_int(x, y):
        return type(x) is int

    def is_str(x, y):
        return type(x) is str

    compiler = hook.compiler({target.__code__: NEW}, guard=is_int)
    with hooked(C, compiler):
        assert target(1) == ("new", 1, 1)
        assert target(2) == ("new", 2, 1)
        assert C.stats()["hit"] == 1
        compiler.guard = is_str
        compiler.rewrites[target.__code__] = OTHER
        assert target("a") == ("other", "a", 1)  # is_int fails: a second compile
        assert target("b") == ("other", "b", 1)
        assert target(3) == ("new", 3, 1)
    assert len(compiler.calls_for(target.__code__)) == 2
    assert [e[:3] for e in C.get_cache_entries(target.__code__)] == [
        (is_int, NEW, compiler),
        (is_str, OTHER, compiler),
    ]
    s = C.stats()
    assert (s["hit"], s["callback"] >= 2) == (3, True)


def test_guard_exception_is_a_miss(C, hook):
    def bad_guard(x, y):
        raise KeyError("guard failed")

    compiler = hook.compiler({target.__code__: NEW}, guard=bad_guard)
    with hooked(C, compiler):
        assert target(1) == ("new", 1, 1)  # compiled, run without a guard
        assert target(2) == ("new", 2, 1)  # guard raises: miss, compiles again
        assert sys.exc_info() == (None, None, None)
    assert len(compiler.calls_for(target.__code__)) == 2
    assert C.stats()["guard_error"] == 1


def test_guard_keyboard_interrupt_propagates(C, hook):
    def interrupted(x, y):
        raise KeyboardInterrupt

    def attempt(arg):
        try:
            target(arg)
        except KeyboardInterrupt:
            return "interrupted"

    hook.entries(target.__code__).append((interrupted, NEW, None))
    arg = object()
    with hooked(C, lambda code, func, f_locals: None):  # records nothing that holds `arg`
        assert attempt(arg) == "interrupted"
        gc.collect()
        before = (sys.getrefcount(arg), C.datastack_info())
        for _ in range(100):
            assert attempt(arg) == "interrupted"
        gc.collect()
        assert (sys.getrefcount(arg), C.datastack_info()) == before


def test_guard_frames_are_not_hooked(C, hook):
    def helper(v):
        return v is not None

    def guard(x, y):
        return helper(x) and C.get_eval_frame() is compiler

    compiler = hook.compiler({target.__code__: NEW}, guard=guard)
    with hooked(C, compiler):
        target(1)
        assert target(2) == ("new", 2, 1)
    codes = {code for code, _, _ in compiler.calls}
    assert guard.__code__ not in codes and helper.__code__ not in codes


def test_callback_returning_none_runs_the_original(C, hook):
    compiler = hook.compiler({})
    with hooked(C, compiler):
        assert target(1) == ("orig", 1, 1)
        assert target(2, y=3) == ("orig", 2, 3)
    calls = compiler.calls_for(target.__code__)
    assert [(f, loc) for _, f, loc in calls] == [
        (target, {"x": 1, "y": 1}),
        (target, {"x": 2, "y": 3}),
    ]


def test_callback_returning_garbage_raises(C, hook):
    def callback(code, func, f_locals):
        return 42 if code is target.__code__ else None

    with hooked(C, callback):
        with pytest.raises(TypeError, match="must be a code object, not int"):
            target(1)
        assert C.get_eval_frame() is callback


class CompileError(Exception):
    pass


def test_callback_exception_propagates_and_state_is_restored(C, hook):
    def explode(code, func, f_locals):
        if code is target.__code__:
            raise CompileError("fullgraph=True and a graph break")

    def attempt(arg):
        try:
            target(arg)
        except CompileError as e:
            return str(e)

    arg = object()
    with hooked(C, explode):
        assert attempt(arg) == "fullgraph=True and a graph break"
        gc.collect()
        before = (sys.getrefcount(arg), sys.getrefcount(target), C.datastack_info())
        for _ in range(1000):
            assert attempt(arg) == "fullgraph=True and a graph break"
        gc.collect()
        after = (sys.getrefcount(arg), sys.getrefcount(target), C.datastack_info())
        assert C.get_eval_frame() is explode
        assert C.hook_installed()
    assert after == before
    assert target(1) == ("orig", 1, 1)


def test_reentrancy_nothing_is_hooked_inside_the_callback(C, hook):
    seen_inside = []

    def helper(v):
        return v * 2

    def inside(code, func, f_locals):
        seen_inside.append((C.get_eval_frame(), C.hook_installed(), helper(3)))
        target(5)  # would recurse into the callback if it were hooked

    compiler = hook.compiler({target.__code__: NEW}, before=inside)
    with hooked(C, compiler):
        assert target(1) == ("new", 1, 1)
    assert compiler.calls_for(helper.__code__) == []
    assert len(compiler.calls_for(target.__code__)) == 1
    # Only this thread had a callback, so the hook was even uninstalled meanwhile.
    assert seen_inside[0] == (None, False, 6)


def test_run_only_callback(C, hook):
    compiler = hook.compiler({target.__code__: NEW})
    with hooked(C, compiler):
        target(1)
    n_calls = len(compiler.calls)

    def fresh(a):
        return a + 1

    C.reset_stats()
    with hooked(C, False):
        assert C.hook_installed()
        assert target(2) == ("new", 2, 1)  # owners are not compared in run-only mode
        assert fresh(1) == 2  # a miss: the original runs, nobody compiles
    assert len(compiler.calls) == n_calls
    s = C.stats()
    assert (s["hit"], s["callback"]) == (1, 0) and s["miss"] >= 1


def test_skip_mode(C, hook):
    guard_calls = []
    compiler = hook.compiler({target.__code__: NEW}, guard=lambda *a: guard_calls.append(a) or True)
    code = target.__code__
    with hooked(C, compiler):
        target(1)
        C.set_code_mode(code, C.MODE_SKIP)
        assert C.get_code_mode(code) == C.MODE_SKIP == 1
        assert target(2) == ("orig", 2, 1)
        C.set_code_mode(code, C.MODE_DEFAULT)
        assert target(3) == ("new", 3, 1)
    assert len(compiler.calls_for(code)) == 1
    assert guard_calls == [(3, 1)]


def test_run_only_mode(C, hook):
    compiler = hook.compiler({target.__code__: NEW}, guard=lambda x, y: x > 0)
    code = target.__code__
    C.set_code_mode(code, C.MODE_RUN_ONLY)
    assert C.get_code_mode(code) == C.MODE_RUN_ONLY == 2
    with hooked(C, compiler):
        assert target(1) == ("orig", 1, 1)  # miss: no compile in run-only mode
        C.set_code_mode(code, C.MODE_DEFAULT)
        assert target(1) == ("new", 1, 1)
        C.set_code_mode(code, C.MODE_RUN_ONLY)
        assert target(2) == ("new", 2, 1)  # hit
        assert target(-1) == ("orig", -1, 1)  # miss
    assert len(compiler.calls_for(code)) == 1


def test_code_modes_validation(C, hook):
    with pytest.raises(ValueError):
        C.set_code_mode(target.__code__, 7)
    with pytest.raises(TypeError):
        C.set_code_mode(target, 0)
    with pytest.raises(TypeError):
        C.get_cache_entries("not code")
    assert C.get_code_mode(compile("1", "<x>", "eval")) == C.MODE_DEFAULT


def test_owner_matching(C, hook):
    a = hook.compiler({target.__code__: NEW})
    b = hook.compiler({target.__code__: OTHER})
    with hooked(C, a):
        assert target(1)[0] == "new"
    with hooked(C, b):
        assert target(1)[0] == "other"  # a's entry is not b's
        assert target(2)[0] == "other"
    with hooked(C, a):
        assert target(3)[0] == "new"
    assert len(a.calls_for(target.__code__)) == len(b.calls_for(target.__code__)) == 1
    entries = C.get_cache_entries(target.__code__)
    assert [e[2] for e in entries] == [a, b]
    # An entry without owner serves every callback.
    entries.insert(0, (lambda x, y: x == 99, tagged(target.__code__, "anyone"), None))
    with hooked(C, b):
        assert target(99)[0] == "anyone"
    with hooked(C, a):
        assert target(99)[0] == "anyone"


def test_entries_are_the_live_list_and_extra_items_are_ignored(C, hook):
    entries = hook.entries(target.__code__)
    assert entries == [] and C.get_cache_entries(target.__code__) is entries
    entries.append((lambda x, y: True, NEW, None, "extra", {"any": "thing"}))
    with hooked(C, hook.compiler()):
        assert target(1) == ("new", 1, 1)
        entries.clear()
        assert target(1) == ("orig", 1, 1)


def test_malformed_entry_raises(C, hook):
    entries = hook.entries(target.__code__)
    entries.append(("guard", NEW))
    with hooked(C, hook.compiler()):
        with pytest.raises(TypeError, match="cache entry must be a tuple"):
            target(1)


def test_clear_code(C, hook):
    compiler = hook.compiler({target.__code__: NEW})
    with hooked(C, compiler):
        target(1)
    entries = C.get_cache_entries(target.__code__)
    guard = entries[0][0]
    before = sys.getrefcount(guard)
    C.set_code_mode(target.__code__, C.MODE_RUN_ONLY)
    C.clear_code(target.__code__)
    assert sys.getrefcount(guard) == before  # the list still holds it
    assert C.get_code_mode(target.__code__) == C.MODE_DEFAULT
    assert C.get_cache_entries(target.__code__) == []
    del entries
    assert sys.getrefcount(guard) == before - 1
    C.clear_code(target.__code__)  # twice is fine


def test_code_dies_with_its_entries(C, hook):
    # (An entry holding its own code object would be a cycle through co_extra, which the
    # garbage collector cannot see: the Python side must clear_code such codes.)
    code = compile("def f(a):\n    return a\n", "<dying>", "exec").co_consts[0]

    class Guard:
        def __call__(self, a):
            return True

    guard = Guard()
    C.get_cache_entries(code).append((guard, code.replace(), None))
    ref = weakref.ref(guard)
    del guard, code
    gc.collect()
    assert ref() is None


def test_module_and_class_bodies_are_not_hooked(C, hook):
    compiler = hook.compiler()
    src = "class K:\n    a = 1\nvalue = K.a + 1\n"
    module_code = compile(src, "<bodies>", "exec")
    namespace = {}
    with hooked(C, compiler):
        exec(module_code, namespace)
    assert namespace["value"] == 2
    assert [c for c, _, _ in compiler.calls if c.co_filename == "<bodies>"] == []


def test_callback_validation(C, hook):
    with pytest.raises(TypeError, match="None, False or a callable"):
        C.set_eval_frame(True)
    with pytest.raises(TypeError):
        C.set_eval_frame(3)
    assert C.get_eval_frame() is None
    cb = Compiler(C)
    assert C.set_eval_frame(cb) is None
    assert C.get_eval_frame() is cb
    assert C.set_eval_frame(False) is cb
    assert C.set_eval_frame(None) is False


def _make_closure(value):
    def inner(x):
        return ("orig", x, value)

    return inner


def test_guard_receives_closure_cells_after_arguments(C, hook):
    # Guards see the argument slots, then one cell per free variable: two closures sharing one
    # code object are told apart by what their cells hold.
    first, second = _make_closure(10), _make_closure(20)
    seen = []

    def guard(x, cell):
        seen.append((x, cell))
        return cell.cell_contents == 10

    compiler = hook.compiler({first.__code__: tagged(first.__code__, "new")}, guard=guard)
    with hooked(C, compiler):
        assert first(1) == ("new", 1, 10)   # miss, compile, run
        assert first(2) == ("new", 2, 10)   # hit: the guard saw the cell holding 10
        assert second(3) == ("new", 3, 20)  # guard says no: compiled again (same rewrite)
    assert seen[0][0] == 2 and seen[0][1] is first.__closure__[0]
    assert any(cell is second.__closure__[0] for _, cell in seen)
