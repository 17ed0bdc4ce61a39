"""Items of a dict from outside that are found by a tensor key: an optimizer keeps its per-parameter
state as ``self.state[p]``, a ``defaultdict(dict)`` keyed by the parameters themselves.

Such a dict is never read as a whole (its keys are not constants that could be guarded). Each item
the frame asks for is read on its own: whether the key is present is guarded, and a present item
is wrapped through ``d[<the key's path>]``, so its tensors become graph inputs like any other.
A missing key of a ``defaultdict`` calls its factory, as ``__missing__`` would, and that write,
like ``d[p] = v``, is recorded and replayed after the graph. Reads after a write see it.

A tensor hashes by identity, so ``k in d`` never compares tensors' values: the guard is exact.
"""

from __future__ import annotations

import collections

from ...errors import Unsupported
from .base import Value
from .constants import const
from .tensor import TensorValue

_KEYED_DICT_TYPES = (dict, collections.defaultdict)


def is_identity_key(tx, d, key: Value) -> bool:
    """Whether ``d[key]`` is an item found by the identity of a tensor from outside."""
    return (type(d.obj) in _KEYED_DICT_TYPES and d.source is not None
            and isinstance(key, TensorValue) and tx.output.real_input(key) is not None)


def _check_not_read_whole(d) -> None:
    if d._storage is not None:
        raise Unsupported(f"indexing {d.describe()} by a tensor after reading all its items",
                          "index it by tensors only, or read it outside the compiled function")


def _present(tx, d, key: TensorValue) -> bool:
    """Whether the key is in the dict at the call, guarded once per capture."""
    from ..guards import EqualsGuard
    from ..sources import KeyInSource
    source = KeyInSource(d.source, key.source)
    known = tx.output.source_values.get(source.key)
    if known is not None:
        return known.as_constant()
    present = dict.__contains__(d.obj, tx.output.real_input(key))
    tx.output.guards.add(EqualsGuard(source, present))
    tx.output.source_values[source.key] = const(present)
    return present


def keyed_contains(tx, d, key: TensorValue) -> bool:
    _check_not_read_whole(d)
    if tx.output.side_effects.load_item(d, key) is not None:
        return True
    return _present(tx, d, key)


def keyed_getitem(tx, d, key: TensorValue) -> Value:
    from ..guards import IdGuard
    from ..sources import AttrSource, ItemByKeySource
    from .builder import wrap, wrap_sourceless

    _check_not_read_whole(d)
    written = tx.output.side_effects.load_item(d, key)
    if written is not None:
        return written
    if _present(tx, d, key):
        return wrap(tx, dict.__getitem__(d.obj, tx.output.real_input(key)), ItemByKeySource(d.source, key.source))
    factory = getattr(d.obj, "default_factory", None)
    if factory is None:
        raise Unsupported(f"{d.describe()}[{key.source.name()}] raises KeyError")
    tx.output.guards.add(IdGuard(AttrSource(d.source, "default_factory"), factory))
    value = wrap_sourceless(tx, factory).call(tx, [], {})
    tx.output.side_effects.store_item(d, key, value)
    return value


def keyed_setitem(tx, d, key: TensorValue, value: Value) -> None:
    _check_not_read_whole(d)
    tx.output.side_effects.store_item(d, key, value)
