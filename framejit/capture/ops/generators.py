"""Generator frames: start, ``yield``, and ``yield from`` (``SEND``).

These run only in the translator of a :class:`GeneratorValue`, which resumes it one item at a
time (see ``values/generators.py``). ``CLEANUP_THROW`` (3.12) is reached only by ``throw()``,
which is not captured; the 3.12 handler around a generator's body (``INTRINSIC_STOPITERATION_ERROR``)
is left out of the exception table when the code is decoded, so an exception leaving the body
leaves the generator as on 3.11.
"""

from __future__ import annotations

from ...errors import Unsupported
from ..compat import PY312_PLUS
from ..interpreter import handler
from ..values.constants import NONE
from ..values.containers import IteratorValue
from ..values.generators import GeneratorValue, YieldSignal
from ..values.iterators import as_iterator


@handler("RETURN_GENERATOR")
def return_generator(tx, inst):
    # Python creates the generator here and suspends; the first next() resumes it with None on
    # the stack (popped by the POP_TOP that follows). The translator is only run from next().
    tx.push(NONE)


@handler("YIELD_VALUE")
def yield_value(tx, inst):
    raise YieldSignal(tx.pop())


@handler("GET_YIELD_FROM_ITER")
def get_yield_from_iter(tx, inst):
    tx.push(as_iterator(tx, tx.pop()))


@handler("SEND")
def send(tx, inst):
    # Stack: receiver, value to send. Each item the receiver yields is yielded on by the
    # YIELD_VALUE that follows; when it is exhausted, its return value replaces the sent value
    # (3.12+, where END_SEND then drops the receiver) or the receiver (3.11), and we jump.
    sent = tx.pop()
    receiver = tx.stack[-1]
    if isinstance(receiver, GeneratorValue):
        item = receiver.send(sent)
        result = receiver.result
    else:
        if not isinstance(receiver, IteratorValue) or not (sent.is_constant() and sent.as_constant() is None):
            raise Unsupported(f"`yield from` {receiver.describe()} with a sent value")
        item = receiver.next()
        result = NONE
    if item is not None:
        tx.push(item)
        return
    if PY312_PLUS:
        tx.push(result)
    else:
        tx.stack[-1] = result
    tx.jump(inst)


@handler("END_SEND")
def end_send(tx, inst):
    value = tx.pop()
    tx.pop()  # the receiver
    tx.push(value)
