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

This module imports nothing from the other value modules at import time (it is a leaf).
"""

from __future__ import annotations

import types

from ...errors import Unsupported

MISSING = object()


def class_lookup(cls: type, name: str):
    """What ``type(obj).name`` finds for an instance: the first class in the MRO defining it."""
    for klass in cls.__mro__:
        d = vars(klass)
        if name in d:
            return d[name]
    return MISSING


def is_data_descriptor(attr) -> bool:
    return attr is not MISSING and (hasattr(type(attr), "__set__") or hasattr(type(attr), "__delete__"))


def generic_getattr(tx, inst, name: str):
    """``object.__getattribute__(inst, name)`` for an instance value ``inst``."""
    from .exceptions import raise_python
    from .instances import bind_class_attribute

    cls = inst.python_type()
    if name == "__class__":
        return inst.class_value(tx)
    static = class_lookup(cls, name)
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
    from .constants import const
    from .exceptions import raise_python

    cls = inst.python_type()
    hook = class_lookup(cls, "__getattr__")
    if hook is MISSING:
        raise_python(AttributeError, f"{cls.__name__!r} object has no attribute {name!r}")
    if isinstance(hook, types.FunctionType):
        return tx.inline_function(hook, [inst, const(name)], {})
    raise Unsupported(f"reading .{name} of {inst.describe()}, whose class defines __getattr__ in C")
