"""The type protocol as pure functions of classes: what ``type(obj).name`` finds, and whether
that is a data descriptor. Every value kind that looks attributes up by Python's rules uses these
(:mod:`.attributes` follows the whole of ``object.__getattribute__`` with them).

This module imports no other value module (a leaf), so any of them can import it.
"""

from __future__ import annotations

import abc

#: What :func:`class_lookup` returns, and instance-attribute lookups, for "not there".
MISSING = object()

#: Py_TPFLAGS_HEAPTYPE: set in ``cls.__flags__`` for a class written in Python (whose instances'
#: ``__class__`` can be assigned), clear for builtin types.
HEAPTYPE = 1 << 9


def class_lookup(cls: type, name: str):
    """What ``type(obj).name`` finds for an instance: the first class in the MRO defining it."""
    for klass in cls.__mro__:
        d = vars(klass)
        if name in d:
            return d[name]
    return MISSING


def is_data_descriptor(attr) -> bool:
    return attr is not MISSING and (hasattr(type(attr), "__set__") or hasattr(type(attr), "__delete__"))


#: Metaclass methods that change what calling the class does, or what reading its attributes
#: gives. A metaclass (a subclass of ``type`` or ``ABCMeta``) that defines none of them creates
#: instances as ``type`` does: transformers' ``ModelOutput`` has one that only wraps ``__init__``
#: when a class is made (``__setattr__`` on the class).
_METACLASS_HOOKS = ("__call__", "__getattribute__", "__getattr__")


def metaclass_problem(cls: type) -> str | None:
    """Why ``cls``'s metaclass makes creating its instances differ from ``type``'s way, or None."""
    meta = type(cls)
    for klass in meta.__mro__:
        if klass in (type, abc.ABCMeta, object):
            continue
        for name in _METACLASS_HOOKS:
            if name in vars(klass):
                return f"its metaclass {meta.__name__} defines {name}"
    if issubclass(meta, abc.ABCMeta) and cls.__abstractmethods__:
        return ("it is abstract (TypeError: can't instantiate abstract class with "
                f"{', '.join(sorted(cls.__abstractmethods__))})")
    return None
