"""Fixtures for the hook tests. Imports nothing from torch (see hooktools.load_C)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # hooktools, whatever pytest's import mode

from hooktools import PATHS, Compiler, load_C  # noqa: E402


@pytest.fixture(scope="session")
def C():
    return load_C()


class Hook:
    """Per-test access to the hook: makes compilers and clears every cache it touched."""

    def __init__(self, C):
        self.C = C
        self.compilers = []
        self.codes = []

    def compiler(self, rewrites=(), **kwargs):
        compiler = Compiler(self.C, rewrites, **kwargs)
        self.compilers.append(compiler)
        return compiler

    def entries(self, code):
        self.codes.append(code)
        return self.C.get_cache_entries(code)

    def cleanup(self):
        for compiler in self.compilers:
            self.codes.extend(compiler.touched)
            self.codes.extend(compiler.rewrites)
        for code in self.codes:
            self.C.clear_code(code)


@pytest.fixture
def hook(C):
    """A clean hook state for the test, checked again afterwards."""
    C.set_eval_frame(None)
    C.set_force_call(False)
    C.reset_stats()
    h = Hook(C)
    yield h
    h.cleanup()
    C.set_force_call(False)
    leaked = C.set_eval_frame(None)
    assert leaked is None, f"the test left this thread's callback set to {leaked!r}"
    assert C.active_threads() == 0
    assert not C.hook_installed()


@pytest.fixture(params=PATHS)
def path(request, C, hook):
    """Run the test through SWAP, through CALL forced, and through CALL because the new frame
    cannot fit (see hooktools.for_path)."""
    C.set_force_call(request.param == "force_call")
    return request.param
