"""The type protocol as pure functions of classes: what ``type(obj).name`` finds, and whether
that is a data descriptor. Every value kind that looks attributes up by Python's rules uses these
(:mod:`.attributes` follows the whole of ``object.__getattribute__`` with them).

This module imports no other value module (a leaf), so any of them can import it.
"""

from __future__ import annotations

#: What :func:`class_lookup` returns, and instance-attribute lookups, for "not there".
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
