"""Tuple, list, dict, set and slice literals; subscripts; unpacking; f-strings over known
values."""

from __future__ import annotations

from ...errors import Unsupported
from ..interpreter import handler
from ..values.base import Value
from ..values.constants import ConstantValue, const
from ..values.containers import DictValue, ListValue, TupleValue
from ..values.pycollections import SetValue


@handler("BUILD_TUPLE")
def build_tuple(tx, inst):
    items = tx.popn(inst.arg)
    if all(isinstance(v, ConstantValue) for v in items):
        tx.push(const(tuple(v.held() for v in items)))
    else:
        tx.push(TupleValue(items))


@handler("BUILD_LIST")
def build_list(tx, inst):
    tx.push(ListValue(tx.popn(inst.arg)))


@handler("BUILD_MAP")
def build_map(tx, inst):
    flat = tx.popn(2 * inst.arg)
    tx.push(DictValue({flat[i].as_constant(): flat[i + 1] for i in range(0, len(flat), 2)}))


@handler("BUILD_CONST_KEY_MAP")
def build_const_key_map(tx, inst):
    keys = tx.pop().as_constant()
    values = tx.popn(inst.arg)
    tx.push(DictValue(dict(zip(keys, values))))


@handler("LIST_APPEND")
def list_append(tx, inst):
    v = tx.pop()
    tx.stack[-inst.arg].items.append(v)


@handler("LIST_EXTEND")
def list_extend(tx, inst):
    seq = tx.pop()
    tx.stack[-inst.arg].items.extend(seq.iterate(tx))


@handler("LIST_TO_TUPLE")
def list_to_tuple(tx, inst):
    tx.push(TupleValue(tx.pop().iterate(tx)))


@handler("MAP_ADD")
def map_add(tx, inst):
    v = tx.pop()
    k = tx.pop()
    tx.stack[-inst.arg].items[k.as_constant()] = v


@handler("DICT_UPDATE", "DICT_MERGE")
def dict_update(tx, inst):
    other = tx.pop()
    target = tx.stack[-inst.arg]
    if not isinstance(other, DictValue):
        raise Unsupported(f"unpacking {other.describe()} with **")
    if inst.name == "DICT_MERGE":
        dup = set(target.items) & set(other.items)
        if dup:
            raise Unsupported(f"got multiple values for keyword argument {sorted(dup)[0]!r}")
    target.items.update(other.items)


@handler("BUILD_SET")
def build_set(tx, inst):
    s = SetValue()
    for v in tx.popn(inst.arg):
        s.add(tx, v)
    tx.push(s)


@handler("SET_ADD")
def set_add(tx, inst):
    v = tx.pop()
    tx.stack[-inst.arg].add(tx, v)


@handler("SET_UPDATE")
def set_update(tx, inst):
    v = tx.pop()
    tx.stack[-inst.arg].update(tx, v)


def _slice(parts) -> Value:
    """``slice(*parts)``: what ``BUILD_SLICE`` pushes, and the key of 3.12's ``BINARY_SLICE`` and
    ``STORE_SLICE`` (``x[a:b]`` and ``x[a:b] = v`` without a ``BUILD_SLICE``)."""
    if not all(p.is_constant() for p in parts):
        raise Unsupported("a slice whose bounds are tensors",
                          "slice bounds must be Python ints; use torch.narrow or index_select for tensor bounds")
    # A size bound stays symbolic (``x[:, :n]`` with dynamic shapes slices by the symbol: no
    # recompile per size); any use but a tensor subscript reads the bounds it had (as_constant).
    return const(slice(*[p.held() if isinstance(p, ConstantValue) else p.as_constant()
                         for p in parts]))


@handler("BUILD_SLICE")
def build_slice(tx, inst):
    tx.push(_slice(tx.popn(inst.arg)))


@handler("BINARY_SUBSCR")
def binary_subscr(tx, inst):
    key = tx.pop()
    container = tx.pop()
    tx.push(container.getitem(tx, key))


@handler("STORE_SUBSCR")
def store_subscr(tx, inst):
    key = tx.pop()
    container = tx.pop()
    value = tx.pop()
    container.setitem(tx, key, value)


@handler("DELETE_SUBSCR")
def delete_subscr(tx, inst):
    key = tx.pop()
    container = tx.pop()
    container.delitem(tx, key)


@handler("BINARY_SLICE")
def binary_slice(tx, inst):
    key = _slice(tx.popn(2))
    container = tx.pop()
    tx.push(container.getitem(tx, key))


@handler("STORE_SLICE")
def store_slice(tx, inst):
    key = _slice(tx.popn(2))
    container = tx.pop()
    value = tx.pop()
    container.setitem(tx, key, value)


@handler("UNPACK_SEQUENCE")
def unpack_sequence(tx, inst):
    items = tx.pop().iterate(tx)
    if len(items) != inst.arg:
        raise Unsupported(f"unpacking {len(items)} values into {inst.arg} names (ValueError)")
    for v in reversed(items):
        tx.push(v)


@handler("UNPACK_EX")
def unpack_ex(tx, inst):
    before, after = inst.arg if isinstance(inst.arg, tuple) else (inst.arg & 0xFF, inst.arg >> 8)
    items = tx.pop().iterate(tx)
    if len(items) < before + after:
        raise Unsupported("not enough values to unpack (ValueError)")
    middle = items[before: len(items) - after]
    for v in reversed(items[len(items) - after:]):
        tx.push(v)
    tx.push(ListValue(middle))
    for v in reversed(items[:before]):
        tx.push(v)


@handler("FORMAT_VALUE")
def format_value(tx, inst):
    flags = int(inst.arg) if not isinstance(inst.arg, tuple) else inst.arg[0]
    spec = tx.pop().as_constant() if flags & 0x04 else ""
    value = tx.pop()
    if not value.is_constant():
        raise Unsupported(f"formatting {value.describe()} into a string",
                          "only Python values known at compile time can be formatted inside a graph")
    v = value.as_constant()
    conv = flags & 0x03
    if conv == 1:
        v = str(v)
    elif conv == 2:
        v = repr(v)
    elif conv == 3:
        v = ascii(v)
    tx.push(const(format(v, spec)))


@handler("BUILD_STRING")
def build_string(tx, inst):
    parts = tx.popn(inst.arg)
    tx.push(const("".join(p.as_constant() for p in parts)))
