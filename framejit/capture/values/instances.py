"""Objects created during capture: instances of plain user classes (``__init__`` runs
symbolically on an :class:`ObjectValue` whose attributes live in a dict of values), dataclasses,
named tuples, and ``super()``.

A class qualifies when creating and using its instances is ordinary Python that the capture can
replay: metaclass ``type``, ``ABCMeta`` (no abstract methods left) or one that leaves calling the
class and reading its attributes alone (see :func:`metaclass_problem`), no
``__new__`` or ``__del__`` of its own, attribute hooks (``__getattribute__``, ``__setattr__``,
``__delattr__``) only written in Python (they are inlined), and no builtin base other than
``object``. Returned
objects are rebuilt in the entry function with ``object.__new__`` and ``object.__setattr__``.
"""

from __future__ import annotations

import collections
import dataclasses
import operator
import types

import torch

from ...errors import Unsupported
from .attributes import (
    bind_class_attribute,
    generic_getattr,
    guarded_find,
    guarded_lookup,
    python_getattr_hook,
)
from .base import BoundMethod, Value
from .constants import NONE, ConstantValue, const
from .containers import DictValue, IteratorValue, TupleValue
from .exceptions import is_exception_class, make_exception
from .functions import MethodValue, PartialValue
from .lookup import HEAPTYPE, MISSING, class_lookup, is_data_descriptor, metaclass_problem
from .modules import create_module
from .pyops import sequence_contains


def _frozen_dataclass(cls) -> bool:
    params = getattr(cls, "__dataclass_params__", None)
    return params is not None and params.frozen


#: Builtin bases a class created in the frame may have besides ``object``: its instances keep
#: their items in a dict of values (``transformers``' ``ModelOutput`` is an OrderedDict).
_DICT_BASES = (collections.OrderedDict, dict)
#: The standard attribute lookup, as object and dict define it.
_GENERIC_GETATTRIBUTE = (vars(object)["__getattribute__"], vars(dict)["__getattribute__"])


def dict_base(cls: type) -> type | None:
    """The builtin dict class ``cls`` derives from (the first in its MRO), or None."""
    for klass in cls.__mro__:
        if klass in _DICT_BASES:
            return klass
    return None


def plain_class_problem(cls: type, *, allow_dict: bool = True, tx=None) -> str | None:
    """Why instances of ``cls`` cannot be created symbolically, or None when they can (with
    ``tx``, the answer is guarded: a ``__new__`` added to the class later recompiles)."""
    def lookup(name):
        return class_lookup(cls, name) if tx is None else guarded_lookup(tx, cls, name)

    problem = metaclass_problem(cls)
    if problem is not None:
        return problem
    base = dict_base(cls) if allow_dict else None
    for klass in cls.__mro__[:-1]:
        if not klass.__flags__ & HEAPTYPE and not (base is not None and klass in _DICT_BASES):
            return f"it derives from the builtin {klass.__name__}"
    new = lookup("__new__")
    if new is not vars(object)["__new__"] and not (base is not None and new is class_lookup(base, "__new__")):
        return "it defines __new__"
    getattribute = lookup("__getattribute__")
    if getattribute not in _GENERIC_GETATTRIBUTE and not isinstance(getattribute, types.FunctionType):
        return "it customises attribute access (__getattribute__) in C"
    for name in ("__setattr__", "__delattr__"):
        method = lookup(name)
        if method is not vars(object)[name] and not isinstance(method, types.FunctionType):
            return f"it defines {name}"
    if lookup("__del__") is not MISSING:
        return "it defines __del__"
    return None


def is_namedtuple_class(cls) -> bool:
    new = getattr(cls, "__new__", None)
    return (isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_fields")
            and str(getattr(new, "__globals__", {}).get("__name__", "")).startswith("namedtuple_")
            and cls.__init__ is object.__init__)


def construct(tx, cls_value, args: list[Value], kwargs: dict[str, Value]) -> Value:
    """``cls(*args, **kwargs)`` for a user class (``cls_value`` is its ClassValue)."""
    cls = cls_value.cls
    if isinstance(cls, type) and issubclass(cls, torch.nn.Module):
        return create_module(tx, cls, args, kwargs)
    if is_namedtuple_class(cls):
        return construct_namedtuple(tx, cls, args, kwargs)
    if is_exception_class(cls):
        return make_exception(cls, args, kwargs)
    problem = plain_class_problem(cls, tx=tx) if isinstance(cls, type) else "it is not a class"
    if problem is not None:
        raise Unsupported(f"creating a {getattr(cls, '__name__', cls)} object inside the compiled "
                          f"function ({problem})",
                          "create it outside and pass it in; objects of plain Python classes and "
                          "dataclasses are captured")
    base = dict_base(cls)
    obj = ObjectValue(cls_value) if base is None else DictObjectValue(cls_value, base)
    init = guarded_lookup(tx, cls, "__init__")
    if init is object.__init__:
        if args or kwargs:
            raise Unsupported(f"{cls.__name__}() takes no arguments (TypeError)")
    elif base is not None and init is base.__init__:
        obj.storage_call(tx, "__init__", args, kwargs)
    elif isinstance(init, types.FunctionType):
        result = tx.inline_function(init, [obj, *args], kwargs)
        if not (isinstance(result, ConstantValue) and result.value is None):
            raise Unsupported(f"{cls.__name__}.__init__() returning a value (TypeError)")
    else:
        raise Unsupported(f"creating a {cls.__name__} object, whose __init__ is not Python code")
    return obj


def construct_namedtuple(tx, cls, args, kwargs) -> TupleValue:
    from .builder import wrap_sourceless

    fields = cls._fields
    if len(args) > len(fields):
        raise Unsupported(f"{cls.__name__}() takes {len(fields)} arguments but {len(args)} were given (TypeError)")
    bound = dict(zip(fields, args))
    for k, v in kwargs.items():
        if k not in fields or k in bound:
            raise Unsupported(f"{cls.__name__}() got an unexpected or repeated argument {k!r} (TypeError)")
        bound[k] = v
    items = []
    for f in fields:
        if f in bound:
            items.append(bound[f])
        elif f in cls._field_defaults:
            items.append(wrap_sourceless(tx, cls._field_defaults[f]))
        else:
            raise Unsupported(f"{cls.__name__}() missing the argument {f!r} (TypeError)")
    return TupleValue(items, cls=cls)


class ObjectValue(Value):
    """An instance of a plain user class created in the frame (see the module docstring)."""

    __slots__ = ("cls_value", "attrs")
    fresh = True

    def __init__(self, cls_value):
        super().__init__(None)
        self.cls_value = cls_value
        self.attrs: dict[str, Value] = {}

    @property
    def user_class(self) -> type:
        return self.cls_value.cls

    def describe(self):
        return f"the {self.user_class.__name__} object created in the compiled function"

    def python_type(self):
        return self.user_class

    # -- attributes ------------------------------------------------------------------------------
    def getattr(self, tx, name):
        custom = self._dunder(tx, "__getattribute__")
        if custom is not None:
            return tx.inline_function(custom, [self, const(name)], {})
        return self.generic_getattr(tx, name)

    def generic_getattr(self, tx, name):
        """``object.__getattribute__(self, name)`` (what ``super().__getattribute__(name)``
        reaches): see :mod:`.attributes`."""
        if name == "__class__":
            return self.cls_value
        if name == "__dict__" and guarded_lookup(tx, self.user_class, "__dict__") is not MISSING:
            return dict_view(self.attrs)
        return generic_getattr(tx, self, name)

    # the three parts of the lookup that differ by kind of instance (see attributes.py)
    def instance_attr(self, tx, name):
        return self.attrs.get(name, MISSING)

    def class_value(self, tx):
        return self.cls_value

    def class_attribute(self, tx, name, static):
        return bind_class_attribute(tx, self.cls_value, name, static, self)

    def getattr_fallback(self, tx, name):
        return python_getattr_hook(tx, self, name)

    def setattr(self, tx, name, value):
        if _frozen_dataclass(self.user_class):
            raise Unsupported(f"assigning .{name} of the frozen dataclass {self.user_class.__name__} "
                              "(FrozenInstanceError)")
        custom = self._dunder(tx, "__setattr__")
        if custom is not None:
            tx.inline_function(custom, [self, const(name), value], {})
            return
        self.object_setattr(tx, name, value)

    def object_setattr(self, tx, name: str, value: Value):
        """``object.__setattr__(self, name, value)``: through a property's setter or a slot,
        else into the instance dict."""
        cls = self.user_class
        static = guarded_lookup(tx, cls, name)
        if is_data_descriptor(static):
            if isinstance(static, property):
                if static.fset is None:
                    raise Unsupported(f"assigning the read-only property .{name} (AttributeError)")
                tx.inline_function(static.fset, [self, value], {})
                return
            if not isinstance(static, types.MemberDescriptorType):
                raise Unsupported(f"assigning .{name} of {self.describe()}")
        elif guarded_lookup(tx, cls, "__dict__") is MISSING:
            raise Unsupported(f"assigning .{name} of {self.describe()}, whose class has __slots__ "
                              "without it (AttributeError)")
        self.attrs[name] = value

    def delattr(self, tx, name):
        custom = self._dunder(tx, "__delattr__")
        if custom is not None:
            tx.inline_function(custom, [self, const(name)], {})
            return
        self.object_delattr(tx, name)

    def object_delattr(self, tx, name):
        if _frozen_dataclass(self.user_class) or is_data_descriptor(guarded_lookup(tx, self.user_class, name)):
            raise Unsupported(f"deleting .{name} of {self.describe()}")
        if name not in self.attrs:
            raise Unsupported(f"deleting the missing attribute .{name} (AttributeError)")
        del self.attrs[name]

    # -- protocols through the class's Python methods -------------------------------------------
    def _dunder(self, tx, name: str):
        method = guarded_lookup(tx, self.user_class, name)
        return method if isinstance(method, types.FunctionType) else None

    def _call_dunder(self, tx, name: str, args, what: str):
        method = self._dunder(tx, name)
        if method is None:
            raise Unsupported(f"{what} {self.describe()}, whose class has no Python {name}")
        return tx.inline_function(method, [self, *args], {})

    def call(self, tx, args, kwargs):
        method = self._dunder(tx, "__call__")
        if method is None:
            raise Unsupported(f"calling {self.describe()} (TypeError: not callable)")
        return tx.inline_function(method, [self, *args], kwargs)

    def truthy(self, tx):
        if self._dunder(tx, "__bool__") is not None:
            return self._call_dunder(tx, "__bool__", [], "bool() of").as_constant() is True
        if self._dunder(tx, "__len__") is not None:
            return self.length(tx) != 0
        if guarded_lookup(tx, self.user_class, "__bool__") is not MISSING or \
                guarded_lookup(tx, self.user_class, "__len__") is not MISSING:
            raise Unsupported(f"using {self.describe()} as a condition")
        return True

    def length(self, tx):
        n = self._call_dunder(tx, "__len__", [], "len() of").as_constant()
        if not isinstance(n, int) or n < 0:
            raise Unsupported(f"len() of {self.describe()} returning {n!r} (TypeError/ValueError)")
        return n

    def make_iterator(self, tx):
        return IteratorValue(self.iterate(tx))  # over a snapshot of the items

    def iterate(self, tx):
        return self._call_dunder(tx, "__iter__", [], "iterating over").iterate(tx)

    def getitem(self, tx, key):
        return self._call_dunder(tx, "__getitem__", [key], "indexing")

    def setitem(self, tx, key, value):
        self._call_dunder(tx, "__setitem__", [key, value], "assigning an item of")

    def contains(self, tx, item):
        if self._dunder(tx, "__contains__") is not None:
            return self._call_dunder(tx, "__contains__", [item], "`in` on").truthy(tx)
        return sequence_contains(tx, self.iterate(tx), item)

    def binary_op(self, tx, fn, other, reflected):
        names = _DUNDERS.get(fn)
        if names is None:
            return None
        for name in (names[1],) if reflected else (names[0], names[2]):
            if name is None:
                continue
            method = self._dunder(tx, name)
            if method is not None:
                r = tx.inline_function(method, [self, other], {})
                if not (isinstance(r, ConstantValue) and r.value is NotImplemented):
                    return r
        return None

    def reconstruct(self, cg):
        if id(self) in _building:
            raise Unsupported(f"returning {self.describe()}, which refers to itself")
        _building.add(id(self))
        try:
            return cg.shared(self, lambda: f"{cg.const_name(rebuild_object)}({cg.expr(self.cls_value)}, {{"
                             + ", ".join(f"{k!r}: {cg.expr(v)}" for k, v in self.attrs.items()) + "})")
        finally:
            _building.discard(id(self))


_building: set[int] = set()


def dict_view(items: dict) -> Value:
    """A dict value whose items are ``items`` itself: writes through it change the owner."""
    view = DictValue({})
    view.items = items
    return view


def defined_by_dict(cls: type, name: str) -> bool:
    """Whether ``cls.name`` resolves to the builtin dict's (or OrderedDict's) own method."""
    for klass in cls.__mro__:
        if name in vars(klass):
            return klass in _DICT_BASES
    return False


class DictObjectValue(ObjectValue):
    """An instance, created in the frame, of a class deriving from dict or OrderedDict: its
    attributes in ``attrs`` and its items in ``items``. The class's Python methods run as
    written; the dict methods it inherits act on ``items``."""

    __slots__ = ("base", "items")

    def __init__(self, cls_value, base: type):
        super().__init__(cls_value)
        self.base = base
        self.items: dict = {}

    def _inherited(self, name: str) -> bool:
        return defined_by_dict(self.user_class, name)

    def storage_method(self, name: str) -> Value:
        """The builtin dict's method ``name`` acting on this object's items."""
        return BoundMethod(dict_view(self.items), name)

    def storage_call(self, tx, name: str, args, kwargs) -> Value:
        return self.storage_method(name).call(tx, args, kwargs)

    def getattr(self, tx, name):
        if name not in self.attrs and self._inherited(name) and not name.startswith("__"):
            return self.storage_method(name)
        return super().getattr(tx, name)

    def _protocol(self, tx, name: str, args, what: str) -> Value:
        if self._inherited(name):
            return self.storage_call(tx, name, args, {})
        return self._call_dunder(tx, name, args, what)

    def getitem(self, tx, key):
        return self._protocol(tx, "__getitem__", [key], "indexing")

    def setitem(self, tx, key, value):
        self._protocol(tx, "__setitem__", [key, value], "assigning an item of")

    def delitem(self, tx, key):
        self._protocol(tx, "__delitem__", [key], "deleting an item of")

    def contains(self, tx, item):
        return self._protocol(tx, "__contains__", [item], "`in` on").truthy(tx)

    def length(self, tx):
        if self._inherited("__len__"):
            return len(self.items)
        return super().length(tx)

    def truthy(self, tx):
        if self._dunder(tx, "__bool__") is None and self._inherited("__len__"):
            return bool(self.items)
        return super().truthy(tx)

    def iterate(self, tx):
        if self._inherited("__iter__"):
            return [const(k) for k in self.items]
        return super().iterate(tx)

    def reconstruct(self, cg):
        if id(self) in _building:
            raise Unsupported(f"returning {self.describe()}, which refers to itself")
        _building.add(id(self))
        try:
            def build():
                items = ", ".join(f"({cg.literal(k)}, {cg.expr(v)})" for k, v in self.items.items())
                attrs = ", ".join(f"{k!r}: {cg.expr(v)}" for k, v in self.attrs.items())
                return (f"{cg.const_name(rebuild_dict_object)}({cg.expr(self.cls_value)}, "
                        f"{cg.const_name(self.base)}, [{items}], {{{attrs}}})")
            return cg.shared(self, build)
        finally:
            _building.discard(id(self))


def rebuild_dict_object(cls, base, items, attrs: dict):
    """Used by entry functions: a dict-derived object with these items and attributes, built
    without running the class's own __init__ or __setitem__."""
    obj = base.__new__(cls)
    for key, value in items:
        base.__setitem__(obj, key, value)
    for name, value in attrs.items():
        object.__setattr__(obj, name, value)
    return obj


def rebuild_object(cls, attrs: dict):
    """Used by entry functions: an object of ``cls`` with these attributes, without __init__."""
    obj = object.__new__(cls)
    for name, value in attrs.items():
        object.__setattr__(obj, name, value)
    return obj


# operator -> (method, reflected method, in-place method)
_DUNDERS = {
    operator.add: ("__add__", "__radd__", None), operator.sub: ("__sub__", "__rsub__", None),
    operator.mul: ("__mul__", "__rmul__", None), operator.truediv: ("__truediv__", "__rtruediv__", None),
    operator.floordiv: ("__floordiv__", "__rfloordiv__", None), operator.mod: ("__mod__", "__rmod__", None),
    operator.pow: ("__pow__", "__rpow__", None), operator.matmul: ("__matmul__", "__rmatmul__", None),
    operator.and_: ("__and__", "__rand__", None), operator.or_: ("__or__", "__ror__", None),
    operator.xor: ("__xor__", "__rxor__", None),
    operator.iadd: ("__iadd__", "__radd__", "__add__"), operator.isub: ("__isub__", "__rsub__", "__sub__"),
    operator.imul: ("__imul__", "__rmul__", "__mul__"),
    operator.itruediv: ("__itruediv__", "__rtruediv__", "__truediv__"),
    operator.lt: ("__lt__", "__gt__", None), operator.le: ("__le__", "__ge__", None),
    operator.gt: ("__gt__", "__lt__", None), operator.ge: ("__ge__", "__le__", None),
}


# -- super() ----------------------------------------------------------------------------------------

class SuperValue(Value):
    """``super(start, obj)``: attribute lookups start after ``start`` in the MRO of ``obj``'s
    class (or of ``obj`` itself when it is a class, as in a classmethod)."""

    __slots__ = ("start", "obj", "mro_of", "obj_is_class")

    def __init__(self, start: type, obj: Value, mro_of: type, obj_is_class: bool):
        super().__init__(None)
        self.start = start
        self.obj = obj
        self.mro_of = mro_of
        self.obj_is_class = obj_is_class

    def describe(self):
        return f"super({self.start.__name__}, ...)"

    def python_type(self):
        return super

    def getattr(self, tx, name):
        from ..sources import AttrSource, ItemSource, ObjectSource
        from .builder import _is_constant, from_library, wrap, wrap_sourceless

        mro = self.mro_of.__mro__
        klass, attr = guarded_find(tx, mro[mro.index(self.start) + 1:], name)
        if klass is None:
            raise Unsupported(f"super() has no attribute {name!r} (AttributeError)")
        owner = self.obj if self.obj_is_class else (getattr(self.obj, "cls_value", None)
                                                    or wrap_sourceless(tx, self.mro_of))
        if isinstance(attr, types.FunctionType):
            return wrap_sourceless(tx, attr) if self.obj_is_class else MethodValue(attr, self.obj)
        if isinstance(attr, staticmethod):
            return wrap_sourceless(tx, attr.__func__)
        if isinstance(attr, classmethod):
            return MethodValue(attr.__func__, owner)
        if isinstance(attr, property) and not self.obj_is_class and attr.fget is not None:
            return tx.inline_function(attr.fget, [self.obj], {})
        if klass in _DICT_BASES and not self.obj_is_class:
            if isinstance(self.obj, DictObjectValue):
                return self.obj.storage_method(name)
            if hasattr(self.obj, "dict_method"):
                return self.obj.dict_method(tx, name)
        if (attr is object.__init__ or attr is object.__setattr__ or attr is object.__delattr__) \
                and not self.obj_is_class:
            return PartialValue(wrap_sourceless(tx, attr), [self.obj], {})
        if attr is object.__getattribute__ and not self.obj_is_class \
                and hasattr(self.obj, "generic_getattr"):
            return _GenericGetattr(self.obj)
        if hasattr(type(attr), "__get__") and not isinstance(attr, type):
            raise Unsupported(f"super().{name}, a {type(attr).__name__} descriptor")
        if _is_constant(attr) or from_library(klass):
            return wrap_sourceless(tx, attr)
        # A user class's dict, list or object: read from the class's dict and guarded (a
        # class attribute the user changes later).
        return wrap(tx, attr, ItemSource(AttrSource(ObjectSource(klass), "__dict__"), name))


class _GenericGetattr(Value):
    """``super().__getattribute__`` reaching ``object.__getattribute__``: the standard lookup."""

    __slots__ = ("obj",)

    def __init__(self, obj):
        super().__init__(None)
        self.obj = obj

    def describe(self):
        return "object.__getattribute__"

    def call(self, tx, args, kwargs):
        if len(args) != 1 or kwargs:
            raise Unsupported("object.__getattribute__ called with unusual arguments")
        return self.obj.generic_getattr(tx, args[0].as_constant())


def bind_super(start, obj: Value) -> SuperValue:
    if not isinstance(start, type):
        raise Unsupported("super() whose first argument is not a class (TypeError)")
    t = obj.python_type()
    if isinstance(t, type) and issubclass(t, start):
        return SuperValue(start, obj, t, obj_is_class=False)
    real = obj.as_constant() if isinstance(obj, Value) and obj.is_constant() else None
    if isinstance(real, type) and issubclass(real, start):
        return SuperValue(start, obj, real, obj_is_class=True)
    raise Unsupported(f"super({start.__name__}, {obj.describe()}): the object is not an instance "
                      "or subclass of the class (TypeError)")


def make_super(tx, args, kwargs) -> SuperValue:
    """``super()`` (reading ``__class__`` and the first argument of the calling frame, as Python
    does) and ``super(cls, obj)``."""
    if kwargs:
        raise Unsupported("super() with keyword arguments (TypeError)")
    if len(args) == 2:
        return bind_super(args[0].as_constant(), args[1])
    if args:
        raise Unsupported("super() with one argument (an unbound super object)")
    cell = tx.cells.get("__class__")
    code = tx.code
    if cell is None or code.co_argcount == 0:
        raise Unsupported("super() outside a method (RuntimeError: super(): no arguments)")
    start = _cell_contents(tx, cell).as_constant()
    first = code.co_varnames[0]
    if first in code.co_cellvars and first in tx.cells:
        obj = tx.cells[first].contents
        if obj is None:
            raise Unsupported("super() after its first argument was deleted (RuntimeError)")
    else:
        obj = tx.load_local(first)
    return bind_super(start, obj)


def _cell_contents(tx, cell) -> Value:
    from .builder import wrap, wrap_sourceless

    real = getattr(cell, "cell", None)
    if real is None:
        if cell.contents is None:
            raise Unsupported("super() in a class defined inside the compiled function")
        return cell.contents
    try:
        contents = real.cell_contents
    except ValueError as e:
        raise Unsupported("super() before its class was created (RuntimeError)") from e
    source = getattr(cell, "cell_source", None)
    return wrap(tx, contents, source) if source is not None else wrap_sourceless(tx, contents)


# -- object.__setattr__ / __new__ / __init__ as called by dataclasses and user code ---------------

def object_setattr(tx, args, kwargs):
    if kwargs or len(args) != 3:
        raise Unsupported("object.__setattr__() with these arguments (TypeError)")
    target, name, value = args
    setter = getattr(target, "object_setattr", None)
    if setter is None:
        raise Unsupported(f"object.__setattr__() on {target.describe()}",
                          "attribute writes are captured on objects created in the compiled function")
    setter(tx, name.as_constant(), value)
    return NONE


def object_delattr(tx, args, kwargs):
    if kwargs or len(args) != 2:
        raise Unsupported("object.__delattr__() with these arguments (TypeError)")
    target, name = args
    deleter = getattr(target, "object_delattr", None)
    if deleter is None:
        raise Unsupported(f"object.__delattr__() on {target.describe()}")
    deleter(tx, name.as_constant())
    return NONE


def object_new(tx, args, kwargs):
    cls_value = args[0] if args else None
    cls = cls_value.as_constant() if cls_value is not None and cls_value.is_constant() else None
    if not isinstance(cls, type) or kwargs or len(args) != 1 or is_namedtuple_class(cls):
        raise Unsupported("object.__new__() with these arguments")
    problem = plain_class_problem(cls, allow_dict=False)
    if problem is not None:
        raise Unsupported(f"object.__new__({cls.__name__}) ({problem})")
    from .objects import ClassValue
    return ObjectValue(cls_value if isinstance(cls_value, ClassValue) else ClassValue(cls))


def object_init(tx, args, kwargs):
    if len(args) != 1 or kwargs:
        raise Unsupported("object.__init__() with arguments (TypeError)")
    return NONE


def dataclass_fields_replace(tx, args, kwargs):
    """``dataclasses.replace(obj, **changes)`` on a dataclass object created in the frame."""
    if len(args) != 1 or not isinstance(args[0], ObjectValue) or not dataclasses.is_dataclass(args[0].user_class):
        raise Unsupported("dataclasses.replace() on this value")
    obj = args[0]
    cls = obj.user_class
    init_kwargs = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            if f.name in kwargs:
                raise Unsupported(f"dataclasses.replace() of the non-init field {f.name!r} (ValueError)")
            continue
        init_kwargs[f.name] = kwargs[f.name] if f.name in kwargs else obj.getattr(tx, f.name)
    return construct(tx, obj.cls_value, [], init_kwargs)


def dataclass_fields(tx, args, kwargs):
    """``dataclasses.fields(x)`` where ``x`` is a dataclass or an instance of one created in the
    frame: its class's fields, each a constant. The ``@dataclass`` decorator fixes a class's
    fields when it makes the class, so they follow from the class itself, which is guarded
    where it comes from outside (a global, an argument's type). Inlined, ``fields`` read them
    from ``__dataclass_fields__`` with a guard on each field's name, default and kind, checked
    at every call: three dozen for a transformers output, which sets an attribute through
    ``fields`` at each write. Anything else (an object from outside, a class or instance whose
    ``__dataclass_fields__`` could be another's) runs the function's own code."""
    cls = _fields_class(args[0]) if len(args) == 1 and not kwargs else None
    if cls is None:
        return tx.inline_function(dataclasses.fields, args, kwargs)
    return TupleValue([ConstantValue(f) for f in dataclasses.fields(cls)])


#: The usual attribute lookup, as object and dict (a transformers output's base) define it.
_PLAIN_GETATTRIBUTE = (object.__getattribute__, dict.__getattribute__)


def _fields_class(value) -> type | None:
    """The dataclass whose fields ``dataclasses.fields(value)`` reads, where the capture knows
    it exactly: a class, or an instance made in the frame without an instance attribute of
    that name; read by the usual attribute lookup (no ``__getattribute__`` of its own)."""
    from .objects import ClassValue

    if isinstance(value, ObjectValue):
        cls = value.user_class
        if "__dataclass_fields__" in value.attrs or cls.__getattribute__ not in _PLAIN_GETATTRIBUTE:
            return None
    elif isinstance(value, ClassValue):
        cls = value.cls
        if type(cls).__getattribute__ is not type.__getattribute__:
            return None
    else:
        return None
    fields = cls.__dict__.get("__dataclass_fields__")
    # the class's own (as the decorator writes it), a plain dict of Field objects
    if type(fields) is not dict or not all(type(f) is dataclasses.Field for f in fields.values()):
        return None
    return cls


CONSTRUCTORS = {
    object.__setattr__: object_setattr, object.__delattr__: object_delattr, object.__new__: object_new,
    object.__init__: object_init,
    dataclasses.replace: dataclass_fields_replace,
    dataclasses.fields: dataclass_fields,
}

__all__ = ["ObjectValue", "SuperValue", "construct", "make_super", "const"]
