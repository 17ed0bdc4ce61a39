"""``os.environ`` reads (``os.environ.get("FLAG")``, ``"FLAG" in os.environ``,
``os.environ["FLAG"]``): read at capture time and guarded, so a changed variable recompiles.

Library code reads environment flags on hot paths; going through ``Mapping.get`` would need
exceptions inside the capture (its ``try/except KeyError``).
"""

from __future__ import annotations

import os

from ...errors import Unsupported
from ..sources import Source
from .base import Value
from .constants import const


class EnvVarSource(Source):
    """``os.environ.get(name)``: the variable's value, or None when it is not set."""

    __slots__ = ("var",)

    def __init__(self, var: str):
        self.var = var
        self.key = ("ENV", var)

    def expr(self, names):
        return f"{names(os.environ)}.get({self.var!r})"

    def name(self):
        return f"os.environ[{self.var!r}]"


def _read(tx, key: Value):
    from ..guards import EqualsGuard

    name = key.as_constant()
    if not isinstance(name, str):
        raise Unsupported("os.environ with a key that is not a string")
    value = os.environ.get(name)
    tx.output.guards.add(EqualsGuard(EnvVarSource(name), value))
    return name, value


class EnvironValue(Value):
    __slots__ = ()

    def describe(self):
        return "os.environ"

    def python_type(self):
        return type(os.environ)

    def contains(self, tx, item):
        return _read(tx, item)[1] is not None

    def getitem(self, tx, key):
        name, value = _read(tx, key)
        if value is None:
            raise Unsupported(f"os.environ[{name!r}] raises KeyError")
        return const(value)

    def getattr(self, tx, name):
        if name == "get":
            return _EnvironGet()
        raise Unsupported(f"os.environ.{name}")

    def reconstruct(self, cg):
        return cg.const_name(os.environ)


class _EnvironGet(Value):
    __slots__ = ()

    def __init__(self):
        super().__init__(None)

    def describe(self):
        return "os.environ.get"

    def call(self, tx, args, kwargs):
        if not args or len(args) > 2 or kwargs:
            raise Unsupported("os.environ.get() with unusual arguments")
        _, value = _read(tx, args[0])
        if value is None:
            return args[1] if len(args) > 1 else const(None)
        return const(value)
