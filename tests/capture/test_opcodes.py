"""Every opcode of the running Python either has a handler, exercised by some function of the
round-trip corpora (test_constructs.py, test_python_coverage.py), or breaks cleanly: it raises
Unsupported naming the construct in words, and the frame runs as plain Python.

The opcodes without a handler are written out per Python version (derived from ``dis.opmap``,
never from the handler table), so supporting an opcode, or a Python version adding one, changes
this file on purpose.
"""

import builtins
import dis
import re
import sys

import pytest
import torch
from test_constructs import NOT_IN_CORPUS, corpus_opnames
from torch import nn

import framejit
from framejit.capture import compat, interpreter
from framejit.capture.interpreter import HANDLERS, Inst, Translator, unsupported_opcode
from framejit.errors import Unsupported

ALL_OPNAMES = frozenset(name for name in dis.opmap if not name.startswith("<"))
VERSION = sys.version_info[:2]

# Reached only by code the capture never runs: `except*`, an exception leaving a `with` block
# (raise, try/except/finally are captured), async code, class and module bodies, match statements.
_EXCEPTIONS = {"CHECK_EG_MATCH", "WITH_EXCEPT_START"}
_ASYNC = {"BEFORE_ASYNC_WITH", "END_ASYNC_FOR", "GET_AITER", "GET_ANEXT", "GET_AWAITABLE"}
_MODULE_AND_CLASS = {"DELETE_NAME", "LOAD_BUILD_CLASS", "SETUP_ANNOTATIONS", "STORE_NAME"}
_MATCH = {"GET_LEN", "MATCH_CLASS", "MATCH_KEYS", "MATCH_MAPPING", "MATCH_SEQUENCE"}
# Statements with effects outside the frame not captured yet (deletions; assignments of globals
# are replayed side effects now).
_EFFECTS = {"DELETE_DEREF", "DELETE_GLOBAL"}
_COMMON = _EXCEPTIONS | _ASYNC | _MODULE_AND_CLASS | _MATCH | _EFFECTS
_INSTRUMENTED = {  # 3.12+: monitoring variants, never in a code object's own instructions
    "INSTRUMENTED_CALL", "INSTRUMENTED_CALL_FUNCTION_EX", "INSTRUMENTED_END_FOR",
    "INSTRUMENTED_END_SEND", "INSTRUMENTED_FOR_ITER", "INSTRUMENTED_INSTRUCTION",
    "INSTRUMENTED_JUMP_BACKWARD", "INSTRUMENTED_JUMP_FORWARD", "INSTRUMENTED_LINE",
    "INSTRUMENTED_LOAD_SUPER_ATTR", "INSTRUMENTED_POP_JUMP_IF_FALSE", "INSTRUMENTED_POP_JUMP_IF_NONE",
    "INSTRUMENTED_POP_JUMP_IF_NOT_NONE", "INSTRUMENTED_POP_JUMP_IF_TRUE", "INSTRUMENTED_RESUME",
    "INSTRUMENTED_RETURN_CONST", "INSTRUMENTED_RETURN_VALUE", "INSTRUMENTED_YIELD_VALUE",
}
# 3.12+: pseudo-instructions of the compiler and specialised forms, never in co_code as read.
_PSEUDO_312 = {"POP_BLOCK", "SETUP_CLEANUP", "SETUP_FINALLY", "SETUP_WITH", "STORE_FAST_MAYBE_NULL",
               "LOAD_SUPER_METHOD", "LOAD_ZERO_SUPER_ATTR", "LOAD_ZERO_SUPER_METHOD", "RESERVED",
               "INTERPRETER_EXIT", "JUMP", "JUMP_NO_INTERRUPT", "LOAD_METHOD"}

#: Opcodes without a handler, per Python version.
UNSUPPORTED = {
    (3, 11): frozenset(_COMMON | {
        "ASYNC_GEN_WRAP", "IMPORT_STAR", "PREP_RERAISE_STAR", "PRINT_EXPR",
    }),
    (3, 12): frozenset(_COMMON | _INSTRUMENTED | _PSEUDO_312 | {
        "CALL_INTRINSIC_2", "CLEANUP_THROW", "LOAD_FROM_DICT_OR_DEREF", "LOAD_FROM_DICT_OR_GLOBALS",
        "LOAD_LOCALS",
    }),
    # 3.13 is not captured yet: its new call, format and fused load/store instructions are missing.
    (3, 13): frozenset(_COMMON | _INSTRUMENTED | _PSEUDO_312 | {
        "CALL_INTRINSIC_2", "CLEANUP_THROW", "LOAD_FROM_DICT_OR_DEREF", "LOAD_FROM_DICT_OR_GLOBALS",
        "LOAD_LOCALS", "CALL_KW", "CONVERT_VALUE", "ENTER_EXECUTOR", "EXIT_INIT_CHECK",
        "FORMAT_SIMPLE", "FORMAT_WITH_SPEC", "INSTRUMENTED_CALL_KW", "LOAD_FAST_LOAD_FAST",
        "SET_FUNCTION_ATTRIBUTE", "STORE_FAST_LOAD_FAST", "STORE_FAST_STORE_FAST", "TO_BOOL",
    }),
}

_INTERNAL_NAMES = ("Value", "Translator", "Inst", "HANDLERS", "Unsupported")


def test_opcode_names_come_from_dis():
    assert compat.ALL_OPNAMES == ALL_OPNAMES
    assert set(HANDLERS) <= ALL_OPNAMES, "a handler is registered for an opcode this Python lacks"
    # 3.12+ lists the compiler's pseudo-instructions (JUMP, LOAD_METHOD...) after the one-byte
    # opcodes; no code object holds them, so a handler for one could never run.
    pseudo = {name for name in ALL_OPNAMES if dis.opmap[name] > 255}
    assert compat.PSEUDO_OPNAMES == pseudo
    assert not pseudo & set(HANDLERS), f"handlers for pseudo-instructions: {sorted(pseudo & set(HANDLERS))}"


@pytest.mark.skipif(VERSION not in UNSUPPORTED, reason=f"no opcode table for Python {VERSION}")
def test_every_opcode_is_handled_or_listed_as_unsupported():
    unsupported = ALL_OPNAMES - set(HANDLERS)
    expected = UNSUPPORTED[VERSION]
    assert unsupported == expected, (
        f"now handled (remove from UNSUPPORTED[{VERSION}]): {sorted(expected - unsupported)}; "
        f"without a handler (handle it, or list it): {sorted(unsupported - expected)}"
    )


@pytest.mark.parametrize("name", sorted(ALL_OPNAMES - set(HANDLERS)))
def test_unsupported_opcode_breaks_cleanly(name):
    with pytest.raises(Unsupported) as info:
        unsupported_opcode(None, Inst(name, None, 1))
    construct = info.value.construct
    assert construct == interpreter._OPCODE_WORDS.get(name, f"the Python operation {name}")
    assert not any(word in construct for word in _INTERNAL_NAMES)


def test_every_handled_opcode_has_a_round_trip():
    used = corpus_opnames()
    missing = set(HANDLERS) - used - set(NOT_IN_CORPUS)
    assert not missing, f"handlers with no function in the corpora: {sorted(missing)}"
    # NOT_IN_CORPUS stays true: an opcode that gained a round trip leaves it.
    stale = {name for name in NOT_IN_CORPUS if name in used}
    assert not stale, f"in the corpora now, remove from NOT_IN_CORPUS: {sorted(stale)}"


# -- unsupported constructs end to end: the user's words, under fullgraph=True ---------------------

COUNTER = 0


def defines_class(x):
    class Local:
        pass
    return x + 1


def matches(x):
    match x.shape:
        case (a, b):
            return x * a + b
    return x


class Holder:
    def __init__(self):
        self.tmp = 1


def deletes_attribute(x, holder):
    del holder.tmp
    return x + 1


def raises(x, flag):
    if flag:
        raise ValueError("flag is set")
    return x


@pytest.mark.parametrize("fn, args, words", [
    (defines_class, lambda: (torch.randn(2),), "a class definition"),
    (matches, lambda: (torch.randn(2, 3),), "a match statement"),
    (deletes_attribute, lambda: (torch.randn(2), Holder()), "deleting the attribute .tmp of the Holder object holder"),
    (raises, lambda: (torch.randn(2), True), "raising ValueError('flag is set')"),
], ids=["LOAD_BUILD_CLASS", "MATCH", "DELETE_ATTR", "RAISE_VARARGS"])
def test_unsupported_construct_is_named_in_words(fn, args, words):
    with pytest.raises(framejit.GraphBreakError, match=re.escape(words)) as info:
        framejit.compile(fn, fullgraph=True)(*args())
    assert not any(f"{word}(" in str(info.value) for word in _INTERNAL_NAMES)


# -- 3.12 instructions, driven directly (their handlers are registered only on 3.12+) -----------

def _translator(fn):
    from framejit.capture.output import OutputGraph
    from framejit.config import make_options

    output = OutputGraph(make_options(fullgraph=True, dynamic=None, overrides=None))
    return Translator(output, fn.__code__, fn.__globals__, vars(builtins))


class Parent(nn.Module):
    def forward(self, x):
        return x + 1

    @property
    def size(self):
        return 4


class Child(Parent):
    def forward(self, x):
        return super().forward(x) * 2


def test_load_super_attr_resolves_like_super():
    from framejit.capture.ops.calls import load_super_attr
    from framejit.capture.sources import LocalSource
    from framejit.capture.values.base import NULL
    from framejit.capture.values.builder import wrap, wrap_sourceless
    from framejit.capture.values.functions import MethodValue

    tx = _translator(Child.forward)
    child = Child()
    me = wrap(tx, child, LocalSource("self"))
    for method, two_args in [(True, False), (True, True)]:
        tx.stack[:] = [wrap_sourceless(tx, super), wrap_sourceless(tx, Child), me]
        load_super_attr(tx, Inst("LOAD_SUPER_ATTR", (method, two_args, "forward"), 1))
        null, attr = tx.stack
        assert null is NULL and isinstance(attr, MethodValue)
        assert attr.fn is Parent.forward and attr.obj is me
    tx.stack[:] = [wrap_sourceless(tx, super), wrap_sourceless(tx, Child), me]
    load_super_attr(tx, Inst("LOAD_SUPER_ATTR", (False, False, "size"), 1))
    (size,) = tx.stack
    assert size.as_constant() == 4


def test_send_and_end_send_follow_the_312_stack(monkeypatch):
    from framejit.capture.ops import generators as gen_ops
    from framejit.capture.values.constants import NONE, const
    from framejit.capture.values.containers import IteratorValue

    tx = _translator(Child.forward)
    receiver = IteratorValue([const(1)])
    target = Inst("SEND", None, 1, target=7)
    monkeypatch.setattr(gen_ops, "PY312_PLUS", True)
    tx.stack[:] = [receiver, NONE]
    gen_ops.send(tx, target)  # an item: receiver, item (for the YIELD_VALUE that follows)
    assert tx.stack[0] is receiver and tx.stack[1].as_constant() == 1
    tx.stack[1:] = [NONE]
    tx.pc = 0
    gen_ops.send(tx, target)  # exhausted: receiver, return value, and jump to END_SEND
    assert tx.pc == 7 and tx.stack[0] is receiver and tx.stack[1].as_constant() is None
    gen_ops.end_send(tx, None)
    assert len(tx.stack) == 1 and tx.stack[0].as_constant() is None
