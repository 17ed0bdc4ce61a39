"""Helpers for the hook tests: load framejit._C without torch, and a tiny stand-in compiler.

The C extension can be tested on its own (tools/hook_tests.sh builds it for every CPython it
finds): with FRAMEJIT_C_PATH set, that .so file is loaded as `framejit._C` without importing
the `framejit` package, which needs torch.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys

PATHS = ("swap", "force_call", "big_frame")


def load_C():
    module = sys.modules.get("framejit._C")
    if module is not None:
        return module
    path = os.environ.get("FRAMEJIT_C_PATH")
    if not path:
        import framejit._C as module  # the installed package (needs torch)

        return module
    spec = importlib.util.spec_from_file_location("framejit._C", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["framejit._C"] = module
    spec.loader.exec_module(module)
    return module


def always(*args):
    return True


def tagged(code, tag, old="orig"):
    """A copy of `code` whose constant `old` reads `tag`: same signature and frame size."""
    assert old in code.co_consts, f"{code.co_name} has no constant {old!r}"
    consts = tuple(tag if c == old else c for c in code.co_consts)
    return code.replace(co_consts=consts)


def for_path(code, path):
    """The rewritten code as a test path wants it: 'big_frame' makes a frame too large for
    any data-stack chunk, so SWAP cannot fit and CALL must be used."""
    if path == "big_frame":
        return code.replace(co_stacksize=code.co_stacksize + 5000)
    return code


def with_extra_locals(source, name, n, glob):
    """Define function `name` from `source` with `n` extra (never assigned) locals."""
    extra = " = ".join(f"_pad{i}" for i in range(n))
    body = source.replace("#PAD", f"if False:\n        {extra} = None")
    exec(compile(body, "<padded>", "exec"), glob)
    return glob[name]


SELF = object()


class Compiler:
    """A stand-in for framejit's capture, used as a thread's callback.

    On a call for a code object in `rewrites` it appends (guard, new_code, owner) to that
    code's cache entries and returns new_code; for any other code it returns None, so the
    original runs.  `owner` defaults to the compiler itself.
    """

    def __init__(self, C, rewrites=(), guard=always, owner=SELF, before=None):
        self.C = C
        self.rewrites = dict(rewrites)
        self.guard = guard
        self.owner = self if owner is SELF else owner
        self.before = before
        self.calls = []
        self.touched = set()

    def __call__(self, code, func, f_locals):
        self.calls.append((code, func, dict(f_locals)))
        if self.before is not None:
            self.before(code, func, f_locals)
        new_code = self.rewrites.get(code)
        if new_code is None:
            return None
        self.touched.add(code)
        self.C.get_cache_entries(code).append((self.guard, new_code, self.owner))
        return new_code

    def calls_for(self, code):
        return [call for call in self.calls if call[0] is code]


@contextlib.contextmanager
def hooked(C, callback):
    """Run the block with this thread's callback set, restoring the previous one."""
    previous = C.set_eval_frame(callback)
    try:
        yield callback
    finally:
        C.set_eval_frame(previous)


def expect_path(C, path):
    """Assert that the hits of the test went through the path it asked for."""
    s = C.stats()
    assert s["hit"] + s["callback"] > 0, s
    if path == "swap":
        assert s["swap"] > 0 and s["call"] == 0, s
    else:
        assert s["call"] > 0 and s["swap"] == 0, s
