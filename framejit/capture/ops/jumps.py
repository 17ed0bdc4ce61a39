"""Control flow: branches on values known at capture time, loops unrolled, returns."""

from __future__ import annotations

from ...errors import Unsupported
from ..compat import PY312_PLUS
from ..interpreter import _Return, handler
from ..values.constants import ConstantValue
from ..values.containers import IteratorValue


@handler("RETURN_VALUE")
def return_value(tx, inst):
    raise _Return(tx.pop())


@handler("JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "JUMP", "JUMP_NO_INTERRUPT")
def jump(tx, inst):
    tx.jump(inst)


def _is_none(v) -> bool:
    return isinstance(v, ConstantValue) and v.value is None


@handler("POP_JUMP_FORWARD_IF_TRUE", "POP_JUMP_BACKWARD_IF_TRUE", "POP_JUMP_IF_TRUE")
def pop_jump_if_true(tx, inst):
    if tx.pop().truthy(tx):
        tx.jump(inst)


@handler("POP_JUMP_FORWARD_IF_FALSE", "POP_JUMP_BACKWARD_IF_FALSE", "POP_JUMP_IF_FALSE")
def pop_jump_if_false(tx, inst):
    if not tx.pop().truthy(tx):
        tx.jump(inst)


@handler("POP_JUMP_FORWARD_IF_NONE", "POP_JUMP_BACKWARD_IF_NONE", "POP_JUMP_IF_NONE")
def pop_jump_if_none(tx, inst):
    if _is_none(tx.pop()):
        tx.jump(inst)


@handler("POP_JUMP_FORWARD_IF_NOT_NONE", "POP_JUMP_BACKWARD_IF_NOT_NONE", "POP_JUMP_IF_NOT_NONE")
def pop_jump_if_not_none(tx, inst):
    if not _is_none(tx.pop()):
        tx.jump(inst)


@handler("JUMP_IF_TRUE_OR_POP")
def jump_if_true_or_pop(tx, inst):
    if tx.stack[-1].truthy(tx):
        tx.jump(inst)
    else:
        tx.pop()


@handler("JUMP_IF_FALSE_OR_POP")
def jump_if_false_or_pop(tx, inst):
    if not tx.stack[-1].truthy(tx):
        tx.jump(inst)
    else:
        tx.pop()


@handler("GET_ITER")
def get_iter(tx, inst):
    v = tx.pop()
    tx.push(v.make_iterator(tx))


@handler("FOR_ITER")
def for_iter(tx, inst):
    it = tx.stack[-1]
    if not isinstance(it, IteratorValue):
        raise Unsupported(f"a for loop over {it.describe()}")
    v = it.next()
    if v is not None:
        tx.push(v)
        return
    tx.pop()
    tx.jump(inst)
    if PY312_PLUS and tx.insts[tx.pc].name == "END_FOR":
        tx.pc += 1
