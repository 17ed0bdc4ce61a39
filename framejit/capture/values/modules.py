"""``nn.Module`` instances: parameters and buffers become graph inputs read from the module's own
tables, submodules are guarded by identity, ``forward`` is inlined, and containers
(``Sequential``, ``ModuleList``, ``ModuleDict``) iterate over their children."""

from __future__ import annotations

import types

from torch import nn

from ...errors import Unsupported
from ..guards import DictKeysGuard, EqualsGuard, NoHooksGuard
from ..sources import AttrSource, HasAttrSource, ModuleMemberSource
from .attributes import guarded_find, guarded_lookup, python_getattr_hook
from .base import BoundMethod, Value
from .constants import const
from .containers import IteratorValue, ListValue, TupleValue
from .exceptions import raise_python
from .lookup import MISSING, class_lookup


def _has_hooks(mod: nn.Module) -> bool:
    from torch.nn.modules import module as m

    return bool(
        mod._forward_hooks or mod._forward_pre_hooks or getattr(mod, "_backward_hooks", None)
        or getattr(mod, "_backward_pre_hooks", None)
        or m._global_forward_hooks or m._global_forward_pre_hooks or m._global_backward_hooks
        or getattr(m, "_global_backward_pre_hooks", None)
    )


class ModuleValue(Value):
    __slots__ = ("module",)

    def __init__(self, module: nn.Module, source):
        super().__init__(source)
        self.module = module

    def describe(self):
        return f"the module {self.source.name()} ({type(self.module).__name__})"

    def python_type(self):
        return type(self.module)

    def as_constant(self):
        return self.module

    def _member(self, tx, table: str, name: str):
        from .builder import wrap

        return wrap(tx, self.module.__dict__[table][name], ModuleMemberSource(self.source, table, name))

    def getattr(self, tx, name):
        from .builder import _is_constant, from_library, wrap, wrap_sourceless

        written = tx.output.side_effects.load_attr(self, name)
        if written is not None:
            return written
        # Python's order (see attributes.py): data descriptors of the class, the instance dict, the
        # class's other attributes, then Module.__getattr__ (parameters, buffers, submodules).
        # A method named like a submodule is therefore the method, as in eager.
        mod = self.module
        klass, attr = guarded_find(tx, type(mod).__mro__, name)
        if isinstance(attr, property):
            return tx.inline_function(attr.fget, [self], {})
        d = mod.__dict__
        if name in d:
            reassigned = self._reassigned_buffers(tx) if name == "_buffers" else None
            if reassigned:
                raise Unsupported(f"reading the buffers of {self.describe()} (its _buffers dict, "
                                  f"buffers(), named_buffers()) after assigning "
                                  f"{', '.join(reassigned)} in the function",
                                  "read the buffer as an attribute (self.name)")
            return wrap(tx, d[name], AttrSource(self.source, name))
        if attr is not MISSING:
            if isinstance(attr, types.FunctionType):
                if is_builtin_container_method(mod, name):
                    return BoundMethod(self, name)
                from .functions import MethodValue
                return MethodValue(attr, self)
            if isinstance(attr, staticmethod):
                return wrap_sourceless(tx, attr.__func__)
            if isinstance(attr, classmethod):
                from .functions import MethodValue
                return MethodValue(attr.__func__, wrap_sourceless(tx, type(mod)))
            if self.source is not None and not hasattr(type(attr), "__get__") \
                    and not _is_constant(attr) and not from_library(klass):
                # A user class's dict, list or object (``TABLE = {...}`` in the class body):
                # read through the module and guarded, as the instance's attributes are (what
                # it held was taken as fixed).
                return wrap(tx, attr, AttrSource(self.source, name))
            value = wrap_sourceless(tx, getattr(mod, name))
            if name == "__dict__":  # the storage of the attributes this capture reads and writes
                tx.output.side_effects.note_dict(value, mod.__dict__)
            return value
        if type(mod).__getattr__ is not nn.Module.__getattr__:
            return python_getattr_hook(tx, self, name)
        for table in ("_parameters", "_buffers", "_modules"):
            if name in d.get(table, ()):
                return self._member(tx, table, name)
        raise Unsupported(f"{self.describe()} has no attribute {name!r}")

    def hasattr(self, tx, name):
        """Whether the module has attribute ``name``: written earlier in the function, defined
        by its class (guarded as a read is), or else held by the instance or its parameter,
        buffer and submodule tables, guarded either way (``m.tmp = ...`` or a buffer registered
        after the capture recompiles, as a deletion does)."""
        if tx.output.side_effects.load_attr(self, name) is not None:
            return True
        mod = self.module
        _, attr = guarded_find(tx, type(mod).__mro__, name)
        if attr is not MISSING:
            if isinstance(attr, property) or type(mod).__getattribute__ is not object.__getattribute__:
                raise Unsupported(f"hasattr() on {self.describe()}")  # only reading it tells
            return True
        if type(mod).__getattr__ is not nn.Module.__getattr__:
            raise Unsupported(f"hasattr() on {self.describe()}")  # the class's own __getattr__
        found = hasattr(mod, name)  # the instance dict, then nn.Module's tables
        if self.source is not None:
            tx.output.guards.add(EqualsGuard(HasAttrSource(self.source, name), found))
        return found

    def call_method(self, tx, name, args, kwargs):
        if is_builtin_container_method(self.module, name):
            return _module_helper_method(tx, self, name, args, kwargs)
        return super().call_method(tx, name, args, kwargs)

    def setattr(self, tx, name, value):
        """``self.step = ...``, ``self.cache = t``: recorded and replayed after the graph."""
        mod = self.module
        if type(mod).__setattr__ is not nn.Module.__setattr__:
            return super().setattr(tx, name, value)
        if name in mod._parameters or name in mod._modules or isinstance(value, ModuleValue) \
                or issubclass(value.python_type(), (nn.Parameter, nn.Module)):
            raise Unsupported(f"assigning .{name} on {self.describe()} (a parameter or submodule)",
                              "assign parameters and submodules outside the compiled function")
        static = guarded_lookup(tx, type(mod), name)
        if static is not MISSING and hasattr(type(static), "__set__"):
            raise Unsupported(f"assigning .{name} on {self.describe()}, a property or descriptor")
        if name in mod._buffers and AttrSource(self.source, "_buffers").key in tx.output.source_values:
            # The write is recorded as an attribute (replayed through nn.Module.__setattr__);
            # the _buffers dict the frame already holds would not see it.
            raise Unsupported(f"assigning the buffer .{name} of {self.describe()} after reading "
                              "its buffers (_buffers, buffers(), named_buffers())",
                              "read the buffer as an attribute (self.name)")
        tx.output.side_effects.store_attr(self, name, value)

    def _reassigned_buffers(self, tx) -> list[str]:
        """The buffers of the module this capture assigned (``self.b = self.b + 1``)."""
        effects = tx.output.side_effects
        return [n for n in self.module._buffers if effects.load_attr(self, n) is not None]

    def pinned_object(self):
        return self.module

    def _user_dunder(self, tx, name: str):
        """``name`` (``__getitem__``, ``__len__``...) when the module's class defines it in Python
        outside torch.nn (torch's containers are handled here directly)."""
        fn = guarded_lookup(tx, type(self.module), name)
        if isinstance(fn, types.FunctionType) and not (fn.__module__ or "").startswith("torch.nn."):
            return fn
        return None

    def contains(self, tx, item):
        fn = self._user_dunder(tx, "__contains__")
        if fn is not None:
            return tx.inline_function(fn, [self, item], {}).truthy(tx)
        if isinstance(self.module, nn.ModuleDict):
            return item.as_constant() in self._table_keys(tx, "_modules")
        if isinstance(self.module, nn.ParameterDict):
            return item.as_constant() in self._table_keys(tx, "_keys")
        return super().contains(tx, item)

    def call(self, tx, args, kwargs):
        """``module(*args)``: its class's own ``__call__`` where it defines one in Python (it
        was skipped: forward ran without what the override adds), else :meth:`call_forward`."""
        call = guarded_lookup(tx, type(self.module), "__call__")
        if isinstance(call, types.FunctionType) and call not in MODULE_CALLS:
            return tx.inline_function(call, [self, *args], kwargs)
        return self.call_forward(tx, args, kwargs)

    def call_forward(self, tx, args, kwargs):
        """What ``nn.Module.__call__`` does: the forward inlined, for a module without hooks."""
        mod = self.module
        if _has_hooks(mod):
            raise Unsupported(f"calling {self.describe()}, which has hooks registered",
                              "framejit does not run module hooks inside a graph yet; remove the hooks "
                              "or compile the module's parts without them")
        forward = mod.__dict__.get("forward")
        tx.output.guards.add(NoHooksGuard(self.source, own_forward=forward is not None, typ=type(mod)))
        if forward is not None:
            from .builder import wrap
            return wrap(tx, forward, AttrSource(self.source, "forward")).call(tx, args, kwargs)
        static = guarded_lookup(tx, type(mod), "forward")
        if isinstance(static, staticmethod) and isinstance(static.__func__, types.FunctionType):
            return tx.inline_function(static.__func__, list(args), kwargs)  # no self
        fn = static
        if not isinstance(fn, types.FunctionType):
            raise Unsupported(f"{self.describe()} has no Python forward()")
        return tx.inline_function(fn, [self, *args], kwargs)

    def _children(self, tx) -> list[Value]:
        return [self._member(tx, "_modules", k) for k in self._table_keys(tx, "_modules")]

    def _table_keys(self, tx, table: str) -> list:
        """The keys of the module's table ``table`` (``_modules``, ``_parameters``, a
        ParameterDict's ``_keys``), guarded: a layer appended to a ModuleList after the capture
        (or a key added to a ModuleDict) recompiles, where the loop over it had kept its length."""
        d = self.module.__dict__[table]
        keys = tuple(d)
        if self.source is not None:
            tx.output.guards.add(DictKeysGuard(AttrSource(self.source, table), type(d), keys))
        return list(keys)

    def make_iterator(self, tx):
        return IteratorValue(self.iterate(tx))  # over a snapshot of the items

    def iterate(self, tx):
        mod = self.module
        fn = self._user_dunder(tx, "__iter__")
        if fn is not None:
            return tx.inline_function(fn, [self], {}).iterate(tx)
        if isinstance(mod, nn.ParameterDict):
            return [const(k) for k in self._table_keys(tx, "_keys")]
        if isinstance(mod, (nn.Sequential, nn.ModuleList)):
            return self._children(tx)
        if isinstance(mod, nn.ModuleDict):
            return [const(k) for k in self._table_keys(tx, "_modules")]
        if isinstance(mod, (nn.ParameterList,)):
            return [self._member(tx, "_parameters", k) for k in self._table_keys(tx, "_parameters")]
        raise Unsupported(f"iterating over {self.describe()}")

    def length(self, tx):
        fn = self._user_dunder(tx, "__len__")
        if fn is not None:
            return tx.inline_function(fn, [self], {}).as_constant()
        mod = self.module
        if isinstance(mod, (nn.Sequential, nn.ModuleList, nn.ModuleDict)):
            return len(self._table_keys(tx, "_modules"))
        if isinstance(mod, nn.ParameterDict):
            return len(self._table_keys(tx, "_keys"))
        if isinstance(mod, nn.ParameterList):
            return len(self._table_keys(tx, "_parameters"))
        return len(mod)

    def getitem(self, tx, key):
        mod = self.module
        fn = self._user_dunder(tx, "__getitem__")
        if fn is not None:
            return tx.inline_function(fn, [self, key], {})
        k = key.as_constant()
        if isinstance(mod, nn.ParameterDict) and isinstance(k, str):
            if k not in self._table_keys(tx, "_keys"):
                raise_python(KeyError, k)
            return self.getattr(tx, k)  # a parameter, a buffer or a plain attribute
        if isinstance(mod, nn.ModuleDict):
            return self._member(tx, "_modules", k)
        if isinstance(mod, (nn.Sequential, nn.ModuleList)) and isinstance(k, int):
            keys = self._table_keys(tx, "_modules")
            try:
                return self._member(tx, "_modules", keys[k])
            except IndexError as e:
                raise Unsupported(f"{self.describe()}[{k}] is out of range") from e
        if isinstance(mod, nn.ModuleList) and isinstance(k, slice):
            return ListValue(self._children(tx)[k])
        if isinstance(mod, nn.ParameterList) and isinstance(k, int):
            return self._member(tx, "_parameters", self._table_keys(tx, "_parameters")[k])
        raise Unsupported(f"indexing {self.describe()} with {key.describe()}")

    def call_named(self, tx, name: str):
        """``children()``, ``named_children()``, ``modules()``-style helpers used in forwards."""
        mod = self.module
        if name == "children":
            return ListValue(self._children(tx))
        if name == "named_children":
            return ListValue([TupleValue([const(k), self._member(tx, "_modules", k)])
                              for k in self._table_keys(tx, "_modules")])
        if name in ("keys",) and isinstance(mod, nn.ModuleDict):
            return ListValue([const(k) for k in self._table_keys(tx, "_modules")])
        if name in ("values",) and isinstance(mod, nn.ModuleDict):
            return ListValue(self._children(tx))
        if name in ("items",) and isinstance(mod, nn.ModuleDict):
            return ListValue([TupleValue([const(k), self._member(tx, "_modules", k)])
                              for k in self._table_keys(tx, "_modules")])
        if isinstance(mod, nn.ParameterDict) and name in ("keys", "values", "items"):
            keys = self._table_keys(tx, "_keys")
            if name == "keys":
                return ListValue([const(k) for k in keys])
            values = [self.getattr(tx, k) for k in keys]
            if name == "values":
                return ListValue(values)
            return ListValue([TupleValue([const(k), v]) for k, v in zip(keys, values)])
        return None


_CONTAINER_METHODS = {"children", "named_children", "keys", "values", "items"}

#: ``nn.Module.__call__`` and what it calls: reached as functions (``super().__call__(x)`` in a
#: module's own ``__call__``), they run the module's forward as a call of the module does.
MODULE_CALLS = frozenset({vars(nn.Module)["__call__"], nn.Module._call_impl})


def is_builtin_container_method(mod: nn.Module, name: str) -> bool:
    fn = class_lookup(type(mod), name)
    return name in _CONTAINER_METHODS and getattr(fn, "__module__", "").startswith("torch.nn")


def _module_helper_method(tx, obj, name: str, args, kwargs):
    what = f"{obj.describe()}.{name}"
    if args or kwargs:
        raise Unsupported(f"calling {what}() with arguments")
    return obj.call_named(tx, name)



# -- modules created in the function ----------------------------------------------------------

def create_module(tx, cls: type, args: list[Value], kwargs: dict[str, Value]) -> ModuleValue:
    """``nn.Softmax(dim=-1)(w)``: a torch.nn module with neither parameters nor buffers, built
    from constant arguments, is a fixed function of its arguments. It is built once, now, and
    its forward inlined. Modules with state (random initial weights) cannot be captured so."""
    name = f"creating the module {cls.__name__}() inside the compiled function"
    hint = "create modules in __init__, outside the compiled function"
    if not (getattr(cls, "__module__", "") or "").startswith("torch.nn."):
        raise Unsupported(name, hint)
    if "device" in kwargs or "dtype" in kwargs:
        # Parameters (whose initialisation would draw from a device's random stream).
        raise Unsupported(f"{name}, which has parameters or buffers", hint)
    try:
        a = [v.as_constant() for v in args]
        k = {n: v.as_constant() for n, v in kwargs.items()}
    except Unsupported:
        raise Unsupported(f"{name}, from arguments not known at capture time", hint) from None
    import torch
    with torch.random.fork_rng(devices=[]):  # building it must not move the user's random stream
        try:
            mod = cls(*a, **k)
        except Exception as e:
            raise Unsupported(f"{name} ({type(e).__name__}: {e})", hint) from e
    if any(m._parameters or m._buffers for m in mod.modules()):
        raise Unsupported(f"{name}, which has parameters or buffers", hint)
    from ..sources import ObjectSource
    return CreatedModuleValue(mod, ObjectSource(mod))


class CreatedModuleValue(ModuleValue):
    """A stateless module built in the function (see :func:`create_module`). Returned, or kept
    across a graph break, it is that one object on every call (so the resume function's identity
    guard holds), where eager builds a new one; no state of it can change unnoticed: writes to
    it are not captured and what forward reads of it is guarded."""

    __slots__ = ()

    def describe(self):
        return f"the module {type(self.module).__name__}() created in the function"

    def setattr(self, tx, name, value):
        raise Unsupported(f"assigning .{name} on {self.describe()}",
                          "create the module in __init__, outside the compiled function")

