"""Calls: CALL with positional, keyword and star arguments, and functions made in the frame."""

from __future__ import annotations

from ...errors import Unsupported
from ..interpreter import handler
from ..values.base import NULL
from ..values.builtins import BuiltinValue
from ..values.containers import DictValue, TupleValue
from ..values.functions import NestedFunctionValue
from ..values.instances import bind_super


@handler("KW_NAMES")
def kw_names(tx, inst):
    tx.kw_names = tuple(inst.arg)


@handler("CALL")
def call(tx, inst):
    argc = inst.arg
    args = tx.popn(argc)
    second = tx.pop()
    first = tx.pop()
    if first is NULL:
        fn = second
    else:
        fn = first
        args = [second, *args]
    names = tx.kw_names
    tx.kw_names = ()
    kwargs = {}
    if names:
        kwargs = dict(zip(names, args[-len(names):]))
        args = args[: -len(names)]
    tx.push(tx.call(fn, args, kwargs))


@handler("CALL_FUNCTION_EX")
def call_function_ex(tx, inst):
    kwargs = {}
    if inst.arg & 1:
        kw = tx.pop()
        if not isinstance(kw, DictValue):
            raise Unsupported(f"calling with **{kw.describe()}")
        kwargs = dict(kw.items)
    args = tx.pop().iterate(tx)
    fn = tx.pop()
    if tx.stack and tx.stack[-1] is NULL:
        tx.pop()
    tx.push(tx.call(fn, list(args), kwargs))


@handler("MAKE_FUNCTION")
def make_function(tx, inst):
    flags = inst.arg
    code_value = tx.pop()
    code = code_value.as_constant()
    closure = tx.pop().items if flags & 0x08 else None
    if flags & 0x04:
        tx.pop()  # annotations
    # The defaults stay values (a global dict keeps its source and guards), shared by the calls.
    kwdefaults = None
    if flags & 0x02:
        kwdefaults = dict(tx.pop().items)
    defaults = None
    if flags & 0x01:
        d = tx.pop()
        defaults = tuple(d.items) if isinstance(d, TupleValue) else d.as_constant()
    tx.push(NestedFunctionValue(code, tx.f_globals, defaults, kwdefaults, closure,
                                getattr(code, "co_qualname", code.co_name)))


@handler("LOAD_SUPER_ATTR")
def load_super_attr(tx, inst):
    # 3.12+: `super().name` and `super(cls, self).name` in one instruction. Stack: the global
    # `super`, the class (the __class__ cell, or the first argument), the object.
    method, two_args, name = inst.arg
    obj = tx.pop()
    cls = tx.pop()
    sup = tx.pop()
    if isinstance(sup, BuiltinValue) and sup.fn is super:
        bound = bind_super(cls.as_constant(), obj)
    else:  # `super` rebound to something else: call it as written
        bound = sup.call(tx, [cls, obj] if two_args else [], {})
    attr = bound.getattr(tx, name)
    if method:
        tx.push(NULL)
    tx.push(attr)


@handler("CALL_INTRINSIC_1")
def call_intrinsic_1(tx, inst):
    kind = int(inst.arg)
    if kind == 5:  # INTRINSIC_UNARY_POSITIVE
        import operator
        tx.push(tx.apply_operator(operator.pos, [tx.pop()]))
    elif kind == 6:  # INTRINSIC_LIST_TO_TUPLE
        items = tx.pop().iterate(tx)
        tx.push(TupleValue(items))
    elif kind == 3:  # INTRINSIC_STOPITERATION_ERROR: decode() leaves its handler out; not reached
        raise Unsupported("a generator raising StopIteration (RuntimeError)")
    else:
        raise Unsupported(f"the Python operation CALL_INTRINSIC_1({kind})")

