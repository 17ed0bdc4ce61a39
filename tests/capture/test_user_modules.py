"""Globals and module attributes of the user's own modules are guarded, however the module is
reached: a module without a file (``__main__`` in the REPL or under ``python -c``, a module made
at run time) was taken for a built-in library module, and a module imported inside the compiled
function (``import config``) for a fixed one: a compiled function kept the first value of a
global the user changed afterwards."""

import subprocess
import sys
import textwrap
import types

import pytest
import torch

import framejit
from framejit import _C


def test_globals_of_a_module_without_a_file_are_guarded(stats):
    module = types.ModuleType("fj_runtime_module")  # no __file__, as __main__ under python -c
    module.torch = torch
    exec("SCALE = 2.0\ndef f(x):\n    return x * SCALE\n", module.__dict__)
    sys.modules[module.__name__] = module
    try:
        compiled = framejit.compile(module.f)
        x = torch.ones(3)
        for scale in (2.0, 3.0, 3.0, -1.5):
            module.SCALE = scale
            torch.testing.assert_close(compiled(x), x * scale)
        assert stats.recompiles == 2
    finally:
        del sys.modules[module.__name__]


@pytest.fixture
def config_module(tmp_path, monkeypatch):
    (tmp_path / "fj_user_config.py").write_text("SCALE = 2.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import fj_user_config
    yield fj_user_config
    del sys.modules["fj_user_config"]


def _imports_inside(x):
    import fj_user_config
    return x * fj_user_config.SCALE


def _imports_from_inside(x):
    from fj_user_config import SCALE
    return x * SCALE


@pytest.mark.parametrize("fn", [_imports_inside, _imports_from_inside], ids=["import", "from"])
def test_a_user_module_imported_in_the_function_is_guarded(fn, config_module, stats):
    compiled = framejit.compile(fn)
    x = torch.ones(3)
    for scale in (2.0, 3.0, 3.0):
        config_module.SCALE = scale
        torch.testing.assert_close(compiled(x), x * scale)
    assert stats.graphs == 2 and stats.recompiles == 1


def test_library_modules_without_a_file_stay_unguarded(stats):
    def f(x):
        import math
        return x * math.pi + sys.maxsize % 7  # sys: built in, no file

    compiled = framejit.compile(f)
    x = torch.ones(2)
    torch.testing.assert_close(compiled(x), f(x))
    ((guard_fn, _, _, _),) = _C.get_cache_entries(f.__code__)
    guards = guard_fn.__framejit_source__
    assert "maxsize" not in guards and "pi" not in guards, guards
    assert stats.graphs == 1


def test_a_user_module_s_attribute_is_guarded_by_its_value(config_module):
    compiled = framejit.compile(_imports_inside)
    compiled(torch.ones(2))
    ((guard_fn, _, _, _),) = _C.get_cache_entries(_imports_inside.__code__)
    assert "SCALE" in guard_fn.__framejit_source__, guard_fn.__framejit_source__


def test_globals_under_python_dash_c_are_guarded():
    program = textwrap.dedent("""
        import torch, framejit
        scale = 2.0
        f = framejit.compile(lambda x: x * scale)
        x = torch.ones(2)
        first = f(x)
        scale = 3.0
        print(first.tolist(), f(x).tolist())
    """)
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                         timeout=300, check=True).stdout
    assert out.split("\n")[-2] == "[2.0, 2.0] [3.0, 3.0]", out


def test_a_user_dict_at_the_address_of_a_freed_library_dict_is_not_a_library_s():
    # The answer for a globals dict is remembered by its address; a library module's dict freed
    # (a module dropped from sys.modules) and a user's made at the same address took its answer.
    from framejit.capture.ops import loads_stores

    user = {"__name__": "fj_not_a_module", "SCALE": 2.0}
    assert not loads_stores._is_library_globals(user)
    loads_stores._library_globals[id(user)] = (True, {"__name__": "freed"})  # as if stale
    assert not loads_stores._is_library_globals(user)
    import math
    assert loads_stores._is_library_globals(vars(math))


LIBRARY_SOURCE = """
class Collector:
    def __init__(self):
        self.current = None

    def get(self):
        return self.current


COLLECTOR = Collector()


def record(x):
    found = COLLECTOR.get()
    if found is not None:
        found.append(x)
    return x
"""


@pytest.fixture
def fake_library():
    """A module framejit takes for an installed package's (its file is under site-packages)."""
    import os
    import sysconfig

    name = "fj_fake_installed_library"
    module = types.ModuleType(name)
    module.__file__ = os.path.join(sysconfig.get_paths()["purelib"], f"{name}.py")
    sys.modules[name] = module
    exec(compile(LIBRARY_SOURCE, module.__file__, "exec"), module.__dict__)
    yield module
    del sys.modules[name]


def test_what_a_library_s_object_holds_is_guarded(fake_library, stats):
    """transformers switches its output collector per call (an object a library module holds):
    taken as fixed, a compiled hook kept appending to the first call's list."""
    from framejit.capture.values.builder import is_library_module

    assert is_library_module(fake_library)
    compiled = framejit.compile(lambda x: fake_library.record(x * 2) + 1)
    x = torch.ones(2)
    first, second = [], []
    fake_library.COLLECTOR.current = first
    compiled(x)
    fake_library.COLLECTOR.current = second
    compiled(x)
    compiled(x)
    assert len(first) == 1 and len(second) == 2
    fake_library.COLLECTOR.current = None
    torch.testing.assert_close(compiled(x), x * 2 + 1)
    assert len(second) == 2
