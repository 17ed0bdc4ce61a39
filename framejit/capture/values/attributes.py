"""Python's attribute lookup, once, for every kind of instance value.

``object.__getattribute__(obj, name)`` looks in this order (CPython's
``_PyObject_GenericGetAttrWithDict``):

1. a *data descriptor* found on the type (a property, a slot, anything with ``__set__`` or
   ``__delete__``);
2. the instance ``__dict__``;
3. anything else found on the type: functions and other non-data descriptors are bound, plain
   class attributes returned as they are;
4. if all of that fails with AttributeError, the class's ``__getattr__``.

:func:`generic_getattr` follows exactly that order for objects created in the frame and for
objects from outside; a value kind supplies only where its instance dict lives
(``instance_attr``), how it reads other class attributes (``class_attribute``) and what its
``__getattr__`` does (``getattr_fallback``). An attribute
found missing raises AttributeError in the captured code, so ``hasattr`` and
``getattr(obj, name, default)`` work through the same path, and for an object from outside its
absence is guarded.

What the class gives is guarded too (:func:`guarded_lookup`): a user class's method, property or
attribute replaced after the capture (``Cls.method = other``) is seen on the next call.
"""

from __future__ import annotations

import types

from ...errors import Unsupported
from .base import Value
from .constants import const
from .exceptions import raise_python
from .lookup import HEAPTYPE, MISSING, is_data_descriptor


def guarded_lookup(tx, cls: type, name: str):
    """What ``type(obj).name`` finds (:func:`.lookup.class_lookup`), guarded when a user class
    (one not defined in a library) holds it: the next call must find the same object in that
    class's dict, and no user class before it in the MRO may define the name. A method, property
    or class attribute replaced after the capture (``Cls.forward = other``) then recompiles;
    before, the captured method kept running. Like a library module's globals, what library
    classes define is taken as fixed, and so is a name found nowhere (a class attribute added
    later that would hide an instance attribute is not seen)."""
    return guarded_find(tx, cls.__mro__, name)[1]


def guarded_find(tx, mro, name: str) -> tuple:
    """(the class of ``mro`` that defines ``name`` first, what it holds), guarded as in
    :func:`guarded_lookup`; (None, MISSING) if none does."""
    before = []
    for klass in mro:
        d = vars(klass)
        if name in d:
            attr = d[name]
            break
        before.append(klass)
    else:
        return None, MISSING
    if not _user_class(klass):
        return klass, attr
    from ..guards import EqualsGuard, IdGuard
    from ..sources import AttrSource, InstanceDictHasSource, ItemSource, ObjectSource

    done = tx.output.class_lookups  # (class, name, whether it holds the name), guarded once
    guards = tx.output.guards
    if (klass, name, True) not in done:
        done.add((klass, name, True))
        guards.add(IdGuard(ItemSource(AttrSource(ObjectSource(klass), "__dict__"), name), attr))
    for other in before:
        if (other, name, False) not in done and _user_class(other):
            done.add((other, name, False))
            guards.add(EqualsGuard(InstanceDictHasSource(ObjectSource(other), name), False))
    return klass, attr


def guard_absent(tx, mro, name: str) -> None:
    """Guard that no user class of ``mro`` defines ``name`` (what :func:`guarded_find` leaves
    unguarded when none does): for ``hasattr(Cls, name)``, whose answer changes when the name
    is defined later."""
    from ..guards import EqualsGuard
    from ..sources import InstanceDictHasSource, ObjectSource

    done = tx.output.class_lookups
    for klass in mro:
        if (klass, name, False) not in done and _user_class(klass):
            done.add((klass, name, False))
            tx.output.guards.add(EqualsGuard(InstanceDictHasSource(ObjectSource(klass), name), False))


def _user_class(klass: type) -> bool:
    from .builder import from_library

    return bool(klass.__flags__ & HEAPTYPE) and not from_library(klass)


def generic_getattr(tx, inst, name: str):
    """``object.__getattribute__(inst, name)`` for an instance value ``inst``."""
    cls = inst.python_type()
    if name == "__class__":
        return inst.class_value(tx)
    static = guarded_lookup(tx, cls, name)
    if is_data_descriptor(static):
        if isinstance(static, property):
            if static.fget is None:
                raise_python(AttributeError, f"property {name!r} of {cls.__name__!r} object has no getter")
            return tx.inline_function(static.fget, [inst], {})
        if isinstance(static, types.MemberDescriptorType):  # a __slots__ entry
            found = inst.instance_attr(tx, name)
            if found is not MISSING:
                return found
            raise_python(AttributeError, f"{cls.__name__!r} object has no attribute {name!r}")
        return inst.class_attribute(tx, name, static)
    found = inst.instance_attr(tx, name)
    if found is not MISSING:
        return found
    if static is not MISSING:
        if isinstance(static, (types.FunctionType, staticmethod, classmethod)):
            return bind_class_attribute(tx, inst.class_value(tx), name, static, inst)
        return inst.class_attribute(tx, name, static)
    return inst.getattr_fallback(tx, name)


def python_getattr_hook(tx, inst, name: str):
    """Step 4 for classes whose ``__getattr__`` is Python code (inlined); AttributeError when
    the class has none."""
    cls = inst.python_type()
    hook = guarded_lookup(tx, cls, "__getattr__")
    if hook is MISSING:
        raise_python(AttributeError, f"{cls.__name__!r} object has no attribute {name!r}")
    if isinstance(hook, types.FunctionType):
        return tx.inline_function(hook, [inst, const(name)], {})
    raise Unsupported(f"reading .{name} of {inst.describe()}, whose class defines __getattr__ in C")


def bind_class_attribute(tx, owner, name: str, attr, inst: Value) -> Value:
    """``inst.name`` where the class attribute ``attr`` (not a data descriptor) was found on
    ``inst``'s class; ``owner`` is the value of that class (ClassValue), for guarded reads."""
    from .builder import wrap_sourceless
    from .functions import MethodValue

    if isinstance(attr, types.FunctionType):
        return MethodValue(attr, inst)
    if isinstance(attr, staticmethod):
        return wrap_sourceless(tx, attr.__func__)
    if isinstance(attr, classmethod):
        return MethodValue(attr.__func__, owner)
    if hasattr(type(attr), "__get__") and not isinstance(attr, type):
        raise Unsupported(f"reading .{name} of {inst.describe()}, a {type(attr).__name__} descriptor")
    return owner.getattr(tx, name)
