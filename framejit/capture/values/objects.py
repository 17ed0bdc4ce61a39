"""Python objects that are not tensors, modules or containers: user class instances (config
objects, dataclasses), Python modules (``torch``, ``math``, a user's ``config`` module), and
classes."""

from __future__ import annotations

import inspect
import types

from ...errors import Unsupported
from ..sources import (
    AttrSource,
    GenericAttrSource,
    HasAttrSource,
    InstanceDictHasSource,
    ObjectSource,
)
from . import known_getattribute
from .attributes import (
    generic_getattr,
    guard_absent,
    guarded_find,
    guarded_lookup,
    python_getattr_hook,
)
from .autograd_function import AutogradFunctionApplyValue, is_custom_function_apply
from .base import BoundMethod, Value
from .constants import ConstantValue, const
from .containers import DictValue, IteratorValue
from .exceptions import raise_python
from .functions import MethodValue
from .instances import construct, defined_by_dict
from .keyed import is_identity_key, keyed_contains, keyed_getitem, keyed_setitem
from .lookup import MISSING, is_data_descriptor

#: Constants that a read may hand out twice (see UserObjectValue._inlined_getattribute)
_IMMUTABLE = (int, float, bool, str, bytes, complex, type(None))
#: ``__getattribute__`` implementations that are plain instance-dict-then-class lookup
#: (SimpleNamespace re-exports the generic one under its own slot wrapper).
_GENERIC_GETATTRIBUTE = (object.__getattribute__, types.SimpleNamespace.__getattribute__,
                         vars(dict)["__getattribute__"])


#: Immutable objects whose class looks attributes up in C (``__getattribute__`` is not
#: object's): ``X | Y`` and ``list[int]``, whose ``__args__``/``__origin__`` validators read.
_IMMUTABLE_WITH_C_GETATTR = (types.UnionType, types.GenericAlias)


class UserObjectValue(Value):
    """An instance of a user class, guarded by its type; attributes read through its source."""

    __slots__ = ("obj", "_storage")

    def __init__(self, obj, source):
        super().__init__(source)
        self.obj = obj
        self._storage = None

    def dict_storage(self, tx):
        """The items of a dict-derived object, read (and guarded) through its source: a
        read-only dict value."""
        if self._storage is not None:
            return self._storage
        obj = self.obj
        if not isinstance(obj, dict):
            raise Unsupported(f"reading the items of {self.describe()}")
        source = self.source if self.source is not None else ObjectSource(obj)
        for name in ("__getitem__", "__iter__"):
            if isinstance(guarded_lookup(tx, type(obj), name), types.FunctionType):
                raise Unsupported(f"reading the items of {self.describe()}, whose class defines {name}")
        if any(w is self for w in tx.output.side_effects.written_objects()):
            raise Unsupported(f"reading all the items of {self.describe()} after writing one by a tensor key",
                              "read it outside the compiled function")
        keys = tuple(dict.keys(obj))
        if not all(isinstance(k, (str, int)) for k in keys):
            raise Unsupported(f"reading the items of {self.describe()}, whose keys are not strings or ints")
        from ..guards import DictKeysGuard
        from ..sources import ItemSource
        from .builder import borrowed, wrap
        tx.output.guards.add(DictKeysGuard(source, type(obj), keys))
        items = {k: wrap(tx, dict.__getitem__(obj, k), ItemSource(source, k)) for k in keys}
        self._storage = borrowed(DictValue(items), obj)
        return self._storage

    def dict_method(self, tx, name: str) -> Value:
        """The builtin dict method ``name`` of a dict-derived object; its items are read-only
        here (a mutation raises Unsupported)."""
        return BoundMethod(self.dict_storage(tx), name)

    def describe(self):
        where = f" {self.source.name()}" if self.source is not None else ""
        return f"the {type(self.obj).__name__} object{where}"

    def python_type(self):
        return type(self.obj)

    @property
    def user_class(self) -> type:
        return type(self.obj)

    def as_constant(self):
        return self.obj

    def pinned_object(self):
        # Read from outside, only the type is guarded: another call may pass another object.
        return self.obj if self.source is None else None

    def pin(self, tx):
        """Guard the object's identity (for an `is` that depends on it) and return it."""
        if self.source is not None:
            from ..guards import IdGuard
            tx.output.guards.add(IdGuard(self.source, self.obj))
        return self.obj

    def getattr(self, tx, name):
        custom = guarded_lookup(tx, type(self.obj), "__getattribute__")
        if custom not in _GENERIC_GETATTRIBUTE:
            if isinstance(custom, types.FunctionType) and self.source is not None:
                # Inlined (transformers' configs map names through attribute_map): what it
                # reads with object.__getattribute__ is guarded as that, so a guard does not
                # run the method again at every call.
                return self._inlined_getattribute(tx, custom, name)
            # Not the written value directly: the class may read another name (a config's
            # attribute_map), and that is the one written.
            return self._getattr_through_class(tx, name)
        return self.generic_getattr(tx, name)

    def _inlined_getattribute(self, tx, custom, name: str) -> Value:
        """``custom(self, name)`` inlined; a read of the same attribute of the object at the
        same source again takes what the first found, while the frame has written nothing
        since (no side effect recorded) and the first read wrote nothing, computed nothing in
        the graph and found an immutable constant or an object from outside: a transformers
        config's ``__getattribute__`` (two of them, through super()) read GPT-2's config 53
        times, 26 different names, in about 20 ms of its first call. Known library methods
        (:mod:`.known_getattribute`) run as what they do instead of being inlined."""
        out = tx.output
        effects = out.side_effects
        key = (self.source.key, name, custom)
        hit = out.getattribute_memo.get(key)
        if hit is not None and hit[0] == effects.version:
            return hit[1]
        version, nodes = effects.version, len(out.graph.nodes)
        steps = known_getattribute.chain(type(self.obj))
        result = None if steps is None else known_getattribute.read(tx, self, name, steps)
        if result is None:
            result = tx.inline_function(custom, [self, const(name)], {})
        # (not a number read from the object, a DeferredNumber: its .value would fix it by a
        # guard, as a use does)
        if effects.version == version and len(out.graph.nodes) == nodes and (
                type(result) is ConstantValue and type(result.value) in _IMMUTABLE
                or isinstance(result, UserObjectValue) and result.source is not None):
            out.getattribute_memo[key] = (version, result)
        return result

    def _attr_source(self, name: str):
        """The source of attribute ``name`` as ``object.__getattribute__`` finds it."""
        if type(self.obj).__getattribute__ in _GENERIC_GETATTRIBUTE:
            return AttrSource(self.source, name)
        return GenericAttrSource(self.source, name)

    def generic_getattr(self, tx, name):
        """``object.__getattribute__(obj, name)``: the standard lookup, whatever the class
        overrides (what ``super().__getattribute__(name)`` reaches); see :mod:`.attributes`."""
        written = tx.output.side_effects.load_attr(self, name)
        if written is not None:
            return written
        obj = self.obj
        if isinstance(obj, dict) and defined_by_dict(type(obj), name) \
                and self.instance_attr(tx, name) is MISSING:
            return self.dict_method(tx, name)
        return generic_getattr(tx, self, name)

    # the parts of the lookup that differ by kind of instance (see attributes.py)
    def instance_attr(self, tx, name):
        """The attribute in the object's instance dict (or slot), or MISSING; for an object
        read from a source, an absence is guarded, so a later call on an object that has it
        recompiles."""
        from .builder import wrap, wrap_sourceless

        obj = self.obj
        if isinstance(guarded_lookup(tx, type(obj), name), types.MemberDescriptorType):
            if not hasattr(obj, name):
                return MISSING
        else:
            try:
                d = object.__getattribute__(obj, "__dict__")
            except AttributeError:
                return MISSING
            if not isinstance(d, dict):
                return MISSING
            if name not in d:
                if self.source is not None:
                    from ..guards import EqualsGuard
                    tx.output.guards.add(EqualsGuard(InstanceDictHasSource(self.source, name), False))
                return MISSING
        value = object.__getattribute__(obj, name)
        return wrap(tx, value, self._attr_source(name)) if self.source else wrap_sourceless(tx, value)

    def class_value(self, tx):
        return ClassValue(type(self.obj), self._attr_source("__class__") if self.source else None)

    def class_attribute(self, tx, name, static):
        """A class attribute that is not a function, static or class method: read through the
        object (a descriptor's ``__get__`` runs for real), guarded by its value."""
        from .builder import wrap, wrap_sourceless

        value = object.__getattribute__(self.obj, name)
        return wrap(tx, value, self._attr_source(name)) if self.source else wrap_sourceless(tx, value)

    def getattr_fallback(self, tx, name):
        return python_getattr_hook(tx, self, name)

    # ``in``, indexing and ``len`` on objects whose class implements them in Python (mapping
    # registries built on collections.abc): the method is inlined.
    def _python_dunder(self, tx, name: str):
        fn = guarded_lookup(tx, type(self.obj), name)
        return fn if isinstance(fn, types.FunctionType) else None

    def contains(self, tx, item):
        fn = self._python_dunder(tx, "__contains__")
        if fn is None:
            if is_identity_key(tx, self, item):
                return keyed_contains(tx, self, item)
            if type(self.obj) is frozenset:
                # An immutable set (3.12's dataclasses.asdict: type(obj) in _ATOMIC_TYPES): the
                # membership of a constant, or of an object pinned by the guards, is fixed
                # while the set is the same one
                constant = item.is_constant()
                known = item.as_constant() if constant else item.pinned_object()
                if constant or known is not None:
                    try:
                        return known in self.pin(tx)
                    except TypeError as e:  # an unhashable item: Python raises it there
                        raise Unsupported(f"`in` between {item.describe()} and {self.describe()} "
                                          f"raises TypeError: {e}") from e
            if isinstance(self.obj, dict):
                return self.dict_storage(tx).contains(tx, item)
            return super().contains(tx, item)
        return tx.inline_function(fn, [self, item], {}).truthy(tx)

    def getitem(self, tx, key):
        fn = self._python_dunder(tx, "__getitem__")
        if fn is None:
            if is_identity_key(tx, self, key):
                return keyed_getitem(tx, self, key)
            if isinstance(self.obj, dict):
                return self.dict_storage(tx).getitem(tx, key)
            return super().getitem(tx, key)
        return tx.inline_function(fn, [self, key], {})

    def setitem(self, tx, key, value):
        if self._python_dunder(tx, "__setitem__") is None and is_identity_key(tx, self, key):
            return keyed_setitem(tx, self, key, value)
        return super().setitem(tx, key, value)

    def make_iterator(self, tx):
        return IteratorValue(self.iterate(tx))  # over a snapshot of the items

    def iterate(self, tx):
        fn = self._python_dunder(tx, "__iter__")
        if fn is None:
            if isinstance(self.obj, dict):
                return self.dict_storage(tx).iterate(tx)
            return super().iterate(tx)
        return tx.inline_function(fn, [self], {}).iterate(tx)

    def length(self, tx):
        fn = self._python_dunder(tx, "__len__")
        if fn is None:
            if isinstance(self.obj, dict):
                return self.dict_storage(tx).length(tx)
            return super().length(tx)
        return tx.inline_function(fn, [self], {}).as_constant()

    def setattr(self, tx, name, value):
        """An attribute write on an object from outside: recorded and replayed after the graph,
        for plain attributes. A class's own ``__setattr__`` written in Python (a config's
        validation and name mapping) is inlined; the ``object.__setattr__`` it ends in records
        the write (:meth:`object_setattr`)."""
        custom = guarded_lookup(tx, type(self.obj), "__setattr__")
        if custom is object.__setattr__:
            return self.object_setattr(tx, name, value, raw=False)  # replayed as `obj.name = v`
        if isinstance(custom, types.FunctionType):
            tx.inline_function(custom, [self, const(name), value], {})
            return
        return super().setattr(tx, name, value)

    def object_setattr(self, tx, name: str, value, raw: bool = True):
        """``object.__setattr__(obj, name, value)`` into the instance dict, replayed the same way
        (``raw``)."""
        if not isinstance(getattr(self.obj, "__dict__", None), dict) \
                or is_data_descriptor(guarded_lookup(tx, type(self.obj), name)):
            raise Unsupported(f"assigning .{name} on {self.describe()} (a property, slot or "
                              "descriptor, or an object without an instance dict)",
                              "attribute writes are captured for plain attributes; assign it "
                              "outside the compiled function")
        tx.output.side_effects.store_attr(self, name, value, raw=raw)

    def _getattr_through_class(self, tx, name):
        """Attribute reads of a class with its own ``__getattribute__`` (transformers' configs map
        names that way): read the real attribute now, and guard the value read the same way on
        every call, so the answer is only reused while that read still gives it."""
        from .builder import wrap, wrap_sourceless

        if tx.output.side_effects.writes_attrs_of(self):
            # The real object does not hold what this capture wrote yet: look it up by the
            # class's own method, which reads the written values.
            custom = guarded_lookup(tx, type(self.obj), "__getattribute__")
            if not isinstance(custom, types.FunctionType):
                raise Unsupported(f"reading .{name} of {self.describe()} after writing its "
                                  "attributes: its class customises attribute access in C")
            return tx.inline_function(custom, [self, const(name)], {})
        if self.source is None and type(self.obj) not in _IMMUTABLE_WITH_C_GETATTR:
            raise Unsupported(f"reading .{name} of {self.describe()}, whose class customises attribute access")
        if self.source is None:
            # ``int | None`` read from an annotation (``typing.get_args`` in a validator): the
            # object cannot change, so what it gives now it gives on every call.
            value = getattr(self.obj, name)
            if callable(value) and not isinstance(value, type):
                raise Unsupported(f"calling .{name} of {self.describe()}")
            return wrap_sourceless(tx, value)
        try:
            value = getattr(self.obj, name)
        except AttributeError:
            from ..guards import EqualsGuard
            tx.output.guards.add(EqualsGuard(HasAttrSource(self.source, name), False))
            raise_python(AttributeError, f"{type(self.obj).__name__!r} object has no attribute {name!r}")
        if isinstance(value, types.MethodType) and value.__self__ is self.obj \
                and isinstance(value.__func__, types.FunctionType):
            return MethodValue(value.__func__, self)
        if callable(value) and not isinstance(value, type):
            raise Unsupported(f"calling .{name} of {self.describe()}, whose class customises attribute access")
        return wrap(tx, value, AttrSource(self.source, name))

    def call(self, tx, args, kwargs):
        call = guarded_lookup(tx, type(self.obj), "__call__")
        if isinstance(call, types.FunctionType):
            return tx.inline_function(call, [self, *args], kwargs)
        return super().call(tx, args, kwargs)

    def truthy(self, tx):
        # An object is true unless its class says otherwise (__bool__, then __len__).
        for name in ("__bool__", "__len__"):
            method = guarded_lookup(tx, type(self.obj), name)
            if method is MISSING:
                continue
            if isinstance(method, types.FunctionType):
                result = tx.inline_function(method, [self], {}).as_constant()
                return bool(result)
            raise Unsupported(f"using {self.describe()} as a condition (its class defines {name})")
        return True


class PythonModuleValue(Value):
    """A Python module. Attributes of library modules (torch, math, ...) are taken as fixed;
    attributes of the user's own modules are guarded like globals."""

    __slots__ = ("module", "trusted")

    def __init__(self, module: types.ModuleType, source, trusted: bool):
        super().__init__(source)
        self.module = module
        self.trusted = trusted

    def describe(self):
        return f"the module {self.module.__name__}"

    def python_type(self):
        return types.ModuleType

    def as_constant(self):
        return self.module

    def getattr(self, tx, name):
        from .builder import wrap, wrap_sourceless

        written = tx.output.side_effects.load_global(self.module.__dict__, name)
        if written is not None:  # `global G; G = 8` earlier in the function
            return written
        try:
            attr = getattr(self.module, name)
        except AttributeError as e:
            raise Unsupported(f"module {self.module.__name__} has no attribute {name!r}") from e
        if self.trusted or self.source is None:
            return wrap_sourceless(tx, attr)
        return wrap(tx, attr, AttrSource(self.source, name))

    def hasattr(self, tx, name):
        if tx.output.side_effects.load_global(self.module.__dict__, name) is not None:
            return True
        found = hasattr(self.module, name)
        if not self.trusted and self.source is not None:
            # the user's module: a name defined (or deleted) after the capture recompiles
            from ..guards import EqualsGuard
            tx.output.guards.add(EqualsGuard(HasAttrSource(self.source, name), found))
        return found

    def pinned_object(self):
        return self.module


class ClassValue(Value):
    """A user class: usable in ``isinstance``, attribute reads and method lookups."""

    __slots__ = ("cls",)

    def __init__(self, cls: type, source=None):
        super().__init__(source)
        self.cls = cls

    def describe(self):
        return f"the class {self.cls.__qualname__}"

    def python_type(self):
        return type(self.cls)

    def is_constant(self):
        return True

    def as_constant(self):
        return self.cls

    def pinned_object(self):
        return self.cls

    def hasattr(self, tx, name):
        """Whether the class (or its metaclass) defines ``name``; what a user class defines is
        guarded, and so is its absence (``Cls.flag = True`` after the capture recompiles)."""
        _, attr = guarded_find(tx, self.cls.__mro__, name)
        if attr is not MISSING:
            return True
        guard_absent(tx, self.cls.__mro__, name)
        return hasattr(type(self.cls), name)

    def getattr(self, tx, name):
        from .builder import from_library, wrap, wrap_sourceless

        guarded_lookup(tx, self.cls, name)  # (a user class's attribute replaced later recompiles)
        static = inspect.getattr_static(self.cls, name, MISSING)
        if static is MISSING:
            raise Unsupported(f"{self.describe()} has no attribute {name!r}")
        if is_custom_function_apply(self.cls, name):
            return AutogradFunctionApplyValue(self.cls)
        if isinstance(static, classmethod):
            return MethodValue(static.__func__, self)
        if isinstance(static, staticmethod):
            return wrap_sourceless(tx, static.__func__)
        value = getattr(self.cls, name)
        source = self.source
        user = not from_library(self.cls)
        if source is None and user:
            # A user class reached without a path (type(self)): its attributes are read
            # through the class itself and guarded (type(self).TABLE["k"] was taken as fixed).
            source = ObjectSource(self.cls)
        if source is not None and (not callable(value) or (
                user and value is static and not isinstance(value, (types.FunctionType, type)))):
            # (a user class's callable object, as any other: what its __call__ reads of it
            # is guarded)
            return wrap(tx, value, AttrSource(source, name))
        return wrap_sourceless(tx, value)

    def call(self, tx, args, kwargs):
        return construct(tx, self, args, kwargs)

    def reconstruct(self, cg):
        return cg.const_name(self.cls)
