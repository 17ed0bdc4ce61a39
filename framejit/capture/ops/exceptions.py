"""``raise``, ``try``/``except``/``finally`` and ``assert``.

A raise unwinds through the exception table (``Translator.run``); these handlers are the
instructions of the handler blocks themselves. The ``with`` statement's exception path
(``WITH_EXCEPT_START``) is not captured: an exception leaving a ``with`` block breaks the graph.
"""

from __future__ import annotations

from ...errors import Unsupported
from ..interpreter import handler
from ..values.builder import wrap_sourceless
from ..values.constants import NONE, const
from ..values.exceptions import ExceptionValue, PythonRaise, as_raisable, matches


@handler("RAISE_VARARGS")
def raise_varargs(tx, inst):
    if inst.arg == 0:
        exc = tx.handled_exception()
        if exc is None:
            raise Unsupported("`raise` with no exception being handled (RuntimeError)")
        raise PythonRaise(exc)
    cause = tx.pop() if inst.arg == 2 else None
    exc = as_raisable(tx.pop())
    if cause is not None:
        exc.cause = cause if cause.is_constant() and cause.as_constant() is None else as_raisable(cause)
    raise PythonRaise(exc)


@handler("RERAISE")
def reraise(tx, inst):
    exc = tx.pop()
    if inst.arg:
        tx.pop()  # the lasti the handler was entered with
    if not isinstance(exc, ExceptionValue):
        raise Unsupported(f"re-raising {exc.describe()}")
    raise PythonRaise(exc)


@handler("PUSH_EXC_INFO")
def push_exc_info(tx, inst):
    exc = tx.pop()
    tx.push(tx.handled if tx.handled is not None else NONE)
    tx.push(exc)
    tx.handled = exc


@handler("POP_EXCEPT")
def pop_except(tx, inst):
    previous = tx.pop()
    tx.handled = None if previous.is_constant() and previous.as_constant() is None else previous


@handler("CHECK_EXC_MATCH")
def check_exc_match(tx, inst):
    spec = tx.pop()
    exc = tx.stack[-1]
    if not isinstance(exc, ExceptionValue):
        raise Unsupported(f"an `except` clause on {exc.describe()}")
    tx.push(const(matches(exc, spec)))


@handler("LOAD_ASSERTION_ERROR")
def load_assertion_error(tx, inst):
    tx.push(wrap_sourceless(tx, AssertionError))
