"""The hook in its surroundings: generators, threads, tracing, reference counts, installation,
CompiledFunction, and a real library running through it."""

import asyncio
import functools
import gc
import inspect
import os
import sys
import threading
import weakref

import pytest
from hooktools import Compiler, expect_path, for_path, hooked, tagged


def target(x, y=1):
    return ("orig", x, y)


# ---- generators and coroutines pass through -------------------------------------------------


def helper(v):
    return ("orig", v)


def gen(n, log):
    try:
        for i in range(n):
            yield helper(i)
    finally:
        log.append("finally")


async def coro(x):
    await asyncio.sleep(0)
    return helper(x)


async def agen(n):
    for i in range(n):
        yield helper(i)


def test_generators_and_coroutines_pass_through(C, hook):
    new_helper = tagged(helper.__code__, "new")
    rewrites = {c.__code__: target.__code__ for c in (gen, coro, agen)}
    rewrites[helper.__code__] = new_helper
    compiler = hook.compiler(rewrites)
    log = []
    with hooked(C, compiler):
        assert list(gen(3, log)) == [("new", 0), ("new", 1), ("new", 2)]
        g = gen(5, log)
        assert next(g) == ("new", 0)
        with pytest.raises(KeyError):
            g.throw(KeyError("thrown"))
        g2 = gen(5, log)
        next(g2)
        g2.close()
        assert asyncio.run(coro(7)) == ("new", 7)

        async def drain():
            return [v async for v in agen(2)]

        assert asyncio.run(drain()) == [("new", 0), ("new", 1)]
    assert log == ["finally"] * 3
    called = {code for code, _, _ in compiler.calls}
    assert not called & {gen.__code__, coro.__code__, agen.__code__}
    assert helper.__code__ in called


# ---- threads --------------------------------------------------------------------------------


def shared(x):
    return ("orig", x)


def test_four_threads_each_with_its_own_callback(C, hook):
    compilers = [
        hook.compiler({shared.__code__: tagged(shared.__code__, f"t{i}")}) for i in range(3)
    ]
    barrier = threading.Barrier(4)
    results, errors = {}, []

    def work(i):
        try:
            barrier.wait()
            results[i] = {shared(k)[0] for k in range(3000)}
        except BaseException as e:  # reported below
            errors.append(e)

    def thread_main(i):
        if i < 3:
            C.CompiledFunction(work, compilers[i])(i)
        else:
            work(i)  # no callback in this thread

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        threads = [threading.Thread(target=thread_main, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == []
    assert results == {0: {"t0"}, 1: {"t1"}, 2: {"t2"}, 3: {"orig"}}
    for compiler in compilers:
        assert len(compiler.calls_for(shared.__code__)) == 1
    owners = [entry[2] for entry in C.get_cache_entries(shared.__code__)]
    assert len(owners) == 3 and set(owners) == set(compilers)
    assert C.active_threads() == 0 and not C.hook_installed()


def test_hook_installed_only_while_a_thread_has_a_callback(C, hook):
    assert not C.hook_installed()
    ready, release = threading.Event(), threading.Event()

    def other():
        C.set_eval_frame(False)
        ready.set()
        release.wait()
        C.set_eval_frame(None)

    t = threading.Thread(target=other)
    t.start()
    ready.wait()
    assert C.hook_installed() and C.active_threads() == 1
    assert C.get_eval_frame() is None  # per thread
    with hooked(C, Compiler(C)):
        assert C.active_threads() == 2
    assert C.hook_installed()
    release.set()
    t.join()
    assert not C.hook_installed() and C.active_threads() == 0


def test_thread_exiting_with_a_callback_gives_back_its_count(C, hook):
    t = threading.Thread(target=C.set_eval_frame, args=(Compiler(C),))
    t.start()
    t.join()
    gc.collect()
    assert C.active_threads() == 0
    assert not C.hook_installed()


# ---- tracing --------------------------------------------------------------------------------


def traced(x):
    y = x + 1
    return ("orig", y)


def test_settrace_sees_the_new_code(C, hook, path):
    new_code = for_path(tagged(traced.__code__, "new"), path)
    compiler = hook.compiler({traced.__code__: new_code})
    events = []

    def tracer(frame, event, arg):
        if frame.f_code is new_code:
            events.append((event, frame.f_lineno - new_code.co_firstlineno))
        return tracer

    with hooked(C, compiler):
        sys.settrace(tracer)
        try:
            results = [traced(1), traced(2)]
        finally:
            sys.settrace(None)
    assert results == [("new", 2), ("new", 3)]
    assert events.count(("call", 0)) == 2
    assert events.count(("line", 1)) == events.count(("line", 2)) == 2
    assert events.count(("return", 2)) == 2
    assert tracer.__code__ not in {code for code, _, _ in compiler.calls}
    expect_path(C, path)


# ---- reference counts -----------------------------------------------------------------------


def counted(a, b, *rest, k=None, **kw):
    return ("orig", a)


def test_reference_counts_are_balanced(C, hook, path):
    new_code = for_path(tagged(counted.__code__, "new"), path)
    compiler = hook.compiler({counted.__code__: new_code})
    a, b, r, k, v = object(), object(), object(), object(), object()

    def snapshot():
        gc.collect()
        return [sys.getrefcount(o) for o in (a, b, r, k, v, counted, new_code)]

    with hooked(C, compiler):
        counted(a, b, r, k=k, z=v)  # compile
        before, stack = snapshot(), C.datastack_info()
        for _ in range(10_000):
            assert counted(a, b, r, k=k, z=v)[0] == "new"
        after = snapshot()
        assert C.datastack_info() == stack
    assert after == before
    assert C.stats()["hit"] == 10_000
    expect_path(C, path)


def test_reference_counts_when_the_new_code_raises(C, hook, path):
    def failing(a, b, *rest, k=None, **kw):
        raise ValueError("nope")

    new_code = for_path(failing.__code__, path)
    compiler = hook.compiler({counted.__code__: new_code})
    a, k = object(), object()

    def attempt():
        try:
            counted(a, 2, 3, k=k, z=4)
        except ValueError:
            pass

    with hooked(C, compiler):
        attempt()
        gc.collect()
        before = (
            sys.getrefcount(a),
            sys.getrefcount(k),
            sys.getrefcount(counted),
            C.datastack_info(),
        )
        for _ in range(2000):
            attempt()
        gc.collect()
        after = (
            sys.getrefcount(a),
            sys.getrefcount(k),
            sys.getrefcount(counted),
            C.datastack_info(),
        )
    assert after == before
    expect_path(C, path)


# ---- CompiledFunction -----------------------------------------------------------------------


def plain(a, b=2):
    """Plain docstring."""
    return ("orig", a, b, sys.modules["framejit._C"].get_eval_frame())


def test_compiled_function_sets_and_restores_the_callback(C, hook):
    cb = Compiler(C)
    wrapped = C.CompiledFunction(plain, cb)
    assert wrapped.fn is plain and wrapped.callback is cb
    assert wrapped(1) == ("orig", 1, 2, cb)
    assert wrapped(1, b=3)[2] == 3
    assert C.get_eval_frame() is None and not C.hook_installed()

    def raising():
        assert C.get_eval_frame() is cb
        raise LookupError("inside")

    with pytest.raises(LookupError):
        C.CompiledFunction(raising, cb)()
    assert C.get_eval_frame() is None and not C.hook_installed()
    # Nested wrappers restore the outer callback; False and None work as callbacks too.
    inner = C.CompiledFunction(C.get_eval_frame, False)
    outer = C.CompiledFunction(lambda: (inner(), C.get_eval_frame()), cb)
    assert outer() == (False, cb)
    assert C.CompiledFunction(C.get_eval_frame, None)() is None


def test_compiled_function_binds_like_a_function(C, hook):
    cb = Compiler(C)

    def method(self, x):
        return (self, x, C.get_eval_frame())

    class K:
        m = C.CompiledFunction(method, cb)

    k = K()
    assert k.m(5) == (k, 5, cb)
    assert K.m is K.__dict__["m"]
    assert K.m(k, 6) == (k, 6, cb)
    bound = k.m
    assert bound.__self__ is k and bound.__func__ is K.__dict__["m"]
    assert C.get_eval_frame() is None


def test_compiled_function_with_update_wrapper(C, hook):
    wrapped = functools.update_wrapper(C.CompiledFunction(plain, Compiler(C)), plain)
    assert wrapped.__wrapped__ is plain
    assert wrapped.__name__ == "plain" and wrapped.__qualname__ == "plain"
    assert wrapped.__doc__ == "Plain docstring."
    assert wrapped.__module__ == plain.__module__
    assert str(inspect.signature(wrapped)) == "(a, b=2)"
    wrapped.extra = 1
    assert wrapped.__dict__["extra"] == 1
    assert "CompiledFunction" in repr(wrapped)
    ref = weakref.ref(wrapped)
    del wrapped
    gc.collect()
    assert ref() is None


def test_compiled_function_argument_checks(C, hook):
    with pytest.raises(TypeError, match="fn must be callable"):
        C.CompiledFunction(1, None)
    with pytest.raises(TypeError, match="None, False or a callable"):
        C.CompiledFunction(plain, True)
    with pytest.raises(AttributeError):
        C.CompiledFunction(plain, None).fn = plain


def test_compiled_function_runs_cached_code(C, hook, path):
    new_code = for_path(tagged(target.__code__, "new"), path)
    compiler = Compiler(C, {target.__code__: new_code})
    hook.compilers.append(compiler)
    compiled = C.CompiledFunction(target, compiler)
    assert [compiled(i) for i in range(3)] == [("new", i, 1) for i in range(3)]
    assert target(1) == ("orig", 1, 1)
    expect_path(C, path)


# ---- a real library through the hook --------------------------------------------------------


def _workload():
    import dataclasses
    import difflib
    import json
    import textwrap

    @dataclasses.dataclass
    class Point:
        x: int
        y: int = 0

        def norm(self):
            return abs(self.x) + abs(self.y)

    data = {"points": [dataclasses.asdict(Point(i, -i)) for i in range(20)], "name": "w" * 30}
    text = json.dumps(data, indent=1, sort_keys=True)
    back = json.loads(text)
    wrapped = textwrap.fill(" ".join(str(p) for p in back["points"]), width=40)
    diff = list(
        difflib.unified_diff(text.splitlines()[:30], wrapped.splitlines()[:30], lineterm="")
    )
    return back, wrapped, diff, sum(Point(**p).norm() for p in back["points"])


class CopyEverything:
    """Rewrites every function it sees to an identical copy of its code."""

    def __init__(self, C, path):
        self.C = C
        self.path = path
        self.codes = set()

    def __call__(self, code, func, f_locals):
        new_code = for_path(code.replace(), self.path)
        self.C.get_cache_entries(code).append((lambda *a: True, new_code, self))
        self.codes.add(code)
        return new_code


@pytest.mark.parametrize("mode", ["pass_through", "rewrite"])
def test_library_workload_through_the_hook(C, hook, path, mode):
    expected = _workload()
    callback = CopyEverything(C, path) if mode == "rewrite" else Compiler(C)
    with hooked(C, callback):
        first = _workload()
        second = _workload()
    if mode == "rewrite":
        hook.codes.extend(callback.codes)
        assert len(callback.codes) > 20
        s = C.stats()
        assert s["hit"] > 100
        expect_path(C, path)
    assert first == expected and second == expected


def test_coexists_with_another_frame_hook(C, hook, tmp_path):
    # A second copy of the extension is a second, independent PEP 523 hook (as torch's own
    # would be).  Whichever is installed last runs; removing it puts the other one back.
    import importlib.util
    import shutil

    filename = os.path.basename(C.__file__)  # _C.cpython-3XX-...so; the folders may hold dots
    copy = tmp_path / ("other" + filename[filename.index(".") :])
    shutil.copy(C.__file__, copy)
    spec = importlib.util.spec_from_file_location("other_hook._C", copy)
    other = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(other)

    ours = hook.compiler({target.__code__: tagged(target.__code__, "ours")})
    theirs = Compiler(other, {target.__code__: tagged(target.__code__, "theirs")})
    try:
        with hooked(C, ours):
            assert target(1)[0] == "ours"
            with hooked(other, theirs):
                assert other.hook_installed() and not C.hook_installed()
                assert target(1)[0] == "theirs"
            assert C.hook_installed() and not other.hook_installed()
            assert target(2)[0] == "ours"
        with hooked(other, theirs):
            with hooked(C, ours):
                assert C.hook_installed()
                assert target(3)[0] == "ours"
            assert other.hook_installed()
            assert target(4)[0] == "theirs"
        assert not other.hook_installed() and not C.hook_installed()
    finally:
        other.clear_code(target.__code__)
