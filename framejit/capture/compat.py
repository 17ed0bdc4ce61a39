"""Every Python-version difference the capture cares about, computed once at import.

Handlers never test ``sys.version_info`` themselves; they read the flags and opcode sets here.
"""

from __future__ import annotations

import dis
import keyword
import sys

PY311 = sys.version_info[:2] == (3, 11)
PY312 = sys.version_info[:2] == (3, 12)
PY313 = sys.version_info[:2] >= (3, 13)
PY312_PLUS = sys.version_info >= (3, 12)

#: Every opcode this interpreter version has, by name (derived, never hand-written).
ALL_OPNAMES: frozenset[str] = frozenset(name for name in dis.opmap if not name.startswith("<"))

#: The compiler's pseudo-instructions (3.12+: ``JUMP``, ``LOAD_METHOD``, ``SETUP_FINALLY``...).
#: ``dis.opmap`` lists them above the one-byte opcodes, but a code object never holds them: the
#: compiler turns each into real instructions (``JUMP_BACKWARD``, ``LOAD_ATTR`` with its method
#: bit, an exception-table entry). Empty on 3.11, where ``LOAD_METHOD`` is a real instruction.
PSEUDO_OPNAMES: frozenset[str] = frozenset(name for name in ALL_OPNAMES if dis.opmap[name] > 255)

#: The opcodes a code object's instructions can hold: the ones a handler can ever run for.
CODE_OPNAMES: frozenset[str] = ALL_OPNAMES - PSEUDO_OPNAMES


def is_generator_body_handler(instr: dis.Instruction) -> bool:
    """Whether ``instr``, an exception handler's first instruction, is the handler 3.12+ wraps
    around a generator's whole body: ``CALL_INTRINSIC_1 INTRINSIC_STOPITERATION_ERROR;
    RERAISE``, which turns a StopIteration leaving the body into RuntimeError (PEP 479) and lets
    any other exception through. 3.11 does the same in C, with no handler in the code; the
    capture treats an exception leaving a generator's body the same way on both."""
    return PY312_PLUS and instr.opname == "CALL_INTRINSIC_1" and instr.argrepr == "INTRINSIC_STOPITERATION_ERROR"


#: 3.12+: the handler of the ``yield`` in a ``yield from`` loop. Only ``throw()`` and ``close()``
#: reach it, and it passes every exception but StopIteration on (3.11 has no handler there).
YIELD_FROM_HANDLER = "CLEANUP_THROW" if PY312_PLUS else None


def is_comprehension_handler(names: list[str]) -> bool:
    """Whether ``names``, the opnames from an exception handler's first instruction on, are the
    handler 3.12+ gives a list, set or dict comprehension inlined in its function (PEP 709): it
    drops the list being built and puts back the variables the comprehension shadows (``SWAP 2;
    POP_TOP; SWAP n+1``, a ``STORE_FAST`` for each), then re-raises. A handler the user wrote
    starts with PUSH_EXC_INFO."""
    if not PY312_PLUS or names[:3] != ["SWAP", "POP_TOP", "SWAP"]:
        return False
    k = 3
    while k < len(names) and names[k] == "STORE_FAST":
        k += 1
    return k > 3 and names[k:k + 1] == ["RERAISE"]


#: Code flags that mark frames the capture must never replace.
CO_GENERATOR_LIKE = 0x20 | 0x80 | 0x100 | 0x200  # GENERATOR, COROUTINE, ITERABLE_COROUTINE, ASYNC_GENERATOR
CO_VARARGS = 0x04
CO_VARKEYWORDS = 0x08


def arg_slot_count(code) -> int:
    """Number of argument slots at the start of ``co_varnames`` (what the C hook hands to guards)."""
    n = code.co_argcount + code.co_kwonlyargcount
    if code.co_flags & CO_VARARGS:
        n += 1
    if code.co_flags & CO_VARKEYWORDS:
        n += 1
    return n


def arg_slot_names(code) -> tuple[str, ...]:
    return code.co_varnames[: arg_slot_count(code)]


def guard_param_names(code) -> tuple[str, ...]:
    """Parameters of guard and entry functions: the argument slots, then one closure cell per
    free variable (the C hook and the trampoline pass them in this order)."""
    return tuple(map(py_name, arg_slot_names(code))) + tuple(f"___free_{v}" for v in code.co_freevars)


def py_name(local: str) -> str:
    """``local`` as a name generated Python source can use: itself, unless the code object
    holds a name Python source cannot spell (pytest's rewritten asserts make ``@py_assert1``)."""
    if local.isidentifier() and not keyword.iskeyword(local):
        return local
    return "___fj_l_" + "".join(c if c.isalnum() else f"_{ord(c)}_" for c in local)
