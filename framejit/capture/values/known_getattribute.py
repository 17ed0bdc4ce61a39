"""Library ``__getattribute__`` methods that capture runs as what they do, without inlining them.

transformers' configs read every attribute through two Python ``__getattribute__`` methods,
chained by ``super()``: ``PreTrainedConfig``'s maps a name through the class's
``attribute_map``, and ``HeterogeneousConfigMixin``'s checks that the config has no per-layer
spec. Inlined, a read took about 0.3 ms of symbolic execution (three frames), and GPT-2's
forward reads its config 34 times: 11 ms of a 120 ms first call (median 119-128 ms before,
106-112 ms after, ``benchmarks/first_call.py``).

A method is taken only when its source is, but for indentation, the one written here: a
library version that changes it is inlined as before. Each step reads what the method reads
(``attribute_map``, the instance dict's ``_heterogeneity_spec``, the attribute itself) through
``object.__getattribute__``, with the guards those reads make when inlined; where a read finds
something else (a per-layer spec, a mapped name that is not a string), the whole read is
inlined instead.
"""

from __future__ import annotations

import functools
import inspect
import linecache
import textwrap
import tokenize
import types
import weakref

from .constants import ConstantValue, const
from .lookup import MISSING


class _Inline(Exception):
    """A step found what it does not do itself: the read is inlined after all."""


def _attribute_map_step(tx, obj, name: str, rest):
    """``PreTrainedConfig.__getattribute__``: ``name`` mapped through ``attribute_map``."""
    if name != "attribute_map":
        from .containers import DictValue

        mapping = rest(tx, obj, "attribute_map")
        if not isinstance(mapping, DictValue):
            raise _Inline
        if mapping.contains(tx, const(name)):
            mapped = mapping.getitem(tx, const(name))
            if type(mapped) is not ConstantValue or type(mapped.value) is not str:
                raise _Inline
            name = mapped.value
    return rest(tx, obj, name)


def _heterogeneity_step(tx, obj, name: str, rest):
    """``HeterogeneousConfigMixin.__getattribute__`` of a config without a per-layer spec."""
    from .containers import DictValue

    instance_dict = obj.generic_getattr(tx, "__dict__")
    if not isinstance(instance_dict, DictValue):
        raise _Inline
    spec = instance_dict.lookup(tx, "_heterogeneity_spec")
    if spec is not MISSING and not (type(spec) is ConstantValue and spec.value is None):
        raise _Inline
    return rest(tx, obj, name)


_KNOWN_SOURCES = {
    '''
    def __getattribute__(self, key):
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)
    ''': _attribute_map_step,
    '''
    def __getattribute__(self, key: str) -> Any:
        # In heterogeneous configs, per-layer attributes are ambiguous on the global config.
        # Callers must read them from a concrete layer unless they explicitly opt into the global value.
        heterogeneity_spec = super().__getattribute__("__dict__").get("_heterogeneity_spec")
        if heterogeneity_spec is not None:
            if key in heterogeneity_spec.per_layer_attributes:
                if not super().__getattribute__("allow_global_per_layer_attribute_access"):
                    raise AmbiguousGlobalPerLayerAttributeError(
                        f"'{key}' is a per-layer attribute and may vary across layers. Access it via the individual layer "
                        f"configs instead (e.g. config.per_layer_config[i].{key}). To read the global config value from "
                        f"config.{key} anyway, set `allow_global_per_layer_attribute_access` to `True` on the config. "
                        f"Warning: only do this if the caller can safely handle heterogeneous configs; code that assumes "
                        f"a homogeneous model may use the global value incorrectly."
                    )

                logger.warning_once(
                    f"Reading global config value for per-layer attribute `{key}` on a heterogeneous config. "
                    "Only do this if the caller can safely handle heterogeneous configs; code that assumes a homogeneous "
                    "model may use the global value incorrectly."
                )

        return super().__getattribute__(key)
    ''': _heterogeneity_step,
}
_STEPS = {textwrap.dedent(source).strip(): step for source, step in _KNOWN_SOURCES.items()}
_found: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # code -> step or None


def _step_of(fn) -> object | None:
    """The step that does what ``fn`` does, or None."""
    if not isinstance(fn, types.FunctionType):
        return None
    code = fn.__code__
    if code in _found:
        return _found[code]
    try:  # (not inspect.getsource, which looks through every module for the file's: 10 ms)
        lines = linecache.getlines(code.co_filename)[code.co_firstlineno - 1:]
        source = textwrap.dedent("".join(inspect.getblock(lines))).strip() if lines else None
    except (SyntaxError, IndexError, ValueError, tokenize.TokenError):  # (what tokenizing raises)
        source = None
    step = _STEPS.get(source)
    _found[code] = step
    return step


def chain(cls: type) -> list | None:
    """The steps of ``cls``'s ``__getattribute__`` methods in the order ``super()`` calls them,
    ending at ``object.__getattribute__``; None unless each of them is a known one."""
    steps = []
    for klass in cls.__mro__:
        fn = vars(klass).get("__getattribute__")
        if fn is None:
            continue
        if klass is object:
            return steps
        step = _step_of(fn)
        if step is None:
            return None
        steps.append(step)
    return None


def read(tx, obj, name: str, steps: list):
    """``obj.name`` through the known ``steps`` (:func:`chain`), each calling the rest of the
    chain as ``super()`` would; None where a step cannot say (the read is then inlined)."""
    rest = lambda tx, obj, name: obj.generic_getattr(tx, name)  # noqa: E731 (object's)
    for step in reversed(steps):
        rest = functools.partial(step, rest=rest)
    try:
        return rest(tx, obj, name)
    except _Inline:
        return None
