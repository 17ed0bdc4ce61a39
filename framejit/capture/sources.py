"""Sources: where a value captured from outside the frame came from.

A source is a path from the frame's arguments or globals (``x``, ``self.layer.weight``,
``CONFIG.scale``). It gives three things:

* ``expr(names)``: a Python expression that reloads the value in generated guard and entry code,
  using the fastest access that is still exact (``self._modules['layer']`` rather than the slow
  ``nn.Module.__getattr__``);
* ``name()``: the path in the user's terms, used in recompile reasons and dumps;
* identity: two sources with the same ``key`` are the same path, so a value is wrapped, guarded
  and loaded once.
"""

from __future__ import annotations

from .compat import py_name


class Source:
    __slots__ = ("key",)

    def expr(self, names: ConstNames) -> str:
        raise NotImplementedError

    def name(self) -> str:
        raise NotImplementedError

    def __eq__(self, other):
        return isinstance(other, Source) and self.key == other.key

    def __hash__(self):
        return hash(self.key)

    def __repr__(self):
        return f"<{type(self).__name__} {self.name()}>"


class ConstNames:
    """Interns objects that generated code must reference (globals dicts, classes, guard values)
    as module-level names of the generated source."""

    def __init__(self, prefix: str = "___c"):
        self.prefix = prefix
        self.namespace: dict[str, object] = {}
        self._by_id: dict[int, str] = {}

    def __call__(self, obj: object) -> str:
        name = self._by_id.get(id(obj))
        if name is None:
            name = f"{self.prefix}{len(self._by_id)}"
            self._by_id[id(obj)] = name
            self.namespace[name] = obj
        return name


class ObjectSource(Source):
    """A fixed object reached without a path (a registry a library module holds): guards and
    entry code refer to the object itself, so what is read *from* it is still re-checked."""

    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj
        self.key = ("O", id(obj))

    def expr(self, names):
        return names(self.obj)

    def name(self):
        qualname = getattr(self.obj, "__qualname__", None)  # a class or a function
        if isinstance(qualname, str) and (isinstance(self.obj, type) or hasattr(self.obj, "__code__")):
            return qualname.rpartition("<locals>.")[2]
        return f"the {type(self.obj).__name__} object"


class CallSource(Source):
    """The result of calling a global query function (``torch.is_autocast_cache_enabled()``)
    with constant arguments: guards re-ask it on every call."""

    __slots__ = ("fn", "args")

    def __init__(self, fn, args: tuple):
        self.fn = fn
        self.args = args
        self.key = ("F", id(fn), args)

    def expr(self, names):
        return f"{names(self.fn)}({', '.join(names(a) for a in self.args)})"

    def name(self):
        args = ", ".join(repr(a) for a in self.args)
        return f"{getattr(self.fn, '__module__', '')}.{getattr(self.fn, '__name__', self.fn)}({args})".lstrip(".")


class CallResultSource(Source):
    """``base()``: what a weak reference read from ``base`` refers to."""

    __slots__ = ("base",)

    def __init__(self, base: Source):
        self.base = base
        self.key = ("R", base.key)

    def expr(self, names):
        return f"{self.base.expr(names)}()"

    def name(self):
        return f"{self.base.name()}()"


class LocalSource(Source):
    """An argument of the captured frame, by name."""

    __slots__ = ("local",)

    def __init__(self, local: str):
        self.local = local
        self.key = ("L", local)

    def expr(self, names):
        return py_name(self.local)

    def name(self):
        if self.local.startswith("___stack"):
            # A resume function's parameter: a value kept on the stack across a graph break
            # (a for loop's remaining items, a half-evaluated expression).
            return f"<value {self.local[len('___stack'):]} carried across a graph break>"
        return self.local


class FreeVarSource(Source):
    """A variable the compiled function itself closes over. Guards and the entry function get
    the function's closure cells as extra arguments named ``___free_<var>``."""

    __slots__ = ("var",)

    def __init__(self, var: str):
        self.var = var
        self.key = ("F", var)

    def expr(self, names):
        return f"{free_param(self.var)}.cell_contents"

    def name(self):
        return self.var


def free_param(var: str) -> str:
    return f"___free_{var}"


class GlobalSource(Source):
    """A global of some module, read through that module's globals dict."""

    __slots__ = ("globals_dict", "var")

    def __init__(self, globals_dict: dict, var: str):
        self.globals_dict = globals_dict
        self.var = var
        self.key = ("G", id(globals_dict), var)

    def expr(self, names):
        return f"{names(self.globals_dict)}[{self.var!r}]"

    def name(self):
        return self.var


class AttrSource(Source):
    __slots__ = ("base", "attr")

    def __init__(self, base: Source, attr: str):
        self.base = base
        self.attr = attr
        self.key = ("A", base.key, attr)

    def expr(self, names):
        return f"{self.base.expr(names)}.{self.attr}"

    def name(self):
        return f"{self.base.name()}.{self.attr}"


class _ReadWithoutGetattribute(Source):
    """A read of ``attr`` of the object at ``base`` through ``object.__getattribute__``, which
    the object's own ``__getattribute__`` does not run; the base is an argument of the
    expression, not its prefix (see SourceLoader)."""

    __slots__ = ("base", "attr")
    tag = ""

    def __init__(self, base: Source, attr: str):
        self.base = base
        self.attr = attr
        self.key = (self.tag, base.key, attr)

    def expr(self, names):
        return self.expr_from(self.base.expr(names), names)

    def expr_from(self, base: str, names) -> str:
        raise NotImplementedError


class GenericAttrSource(_ReadWithoutGetattribute):
    """``object.__getattribute__(base, attr)``: the standard lookup of an attribute of an object
    whose class has its own Python ``__getattribute__`` (a transformers config), which capture
    inlined. A guard reads it without running that method again (2 to 5 µs a read for a
    config: two Python frames, and an exception for a missing name)."""

    __slots__ = ()
    tag = "O"

    def expr_from(self, base: str, names) -> str:
        return f"{names(object.__getattribute__)}({base}, {self.attr!r})"

    def name(self):
        return f"{self.base.name()}.{self.attr}"


class InstanceDictHasSource(_ReadWithoutGetattribute):
    """Whether the instance dict of the object at ``base`` holds ``attr`` (guards that an
    attribute found on the class, or nowhere, is not shadowed later): the dict itself, whatever
    the class's own ``__getattribute__`` does."""

    __slots__ = ()
    tag = "D"

    def expr_from(self, base: str, names) -> str:
        return f"{names(object.__getattribute__)}({base}, '__dict__').__contains__({self.attr!r})"

    def name(self):
        return f"{self.attr!r} in {self.base.name()}.__dict__"


class HasAttrSource(Source):
    """``hasattr(obj, attr)`` for the object at ``obj`` (an absence read through a class's own
    ``__getattribute__``). Not a path below ``obj``: loaders render it whole."""

    __slots__ = ("obj", "attr")

    def __init__(self, obj: Source, attr: str):
        self.obj = obj
        self.attr = attr
        self.key = ("H", obj.key, attr)

    def expr(self, names):
        return f"{names(hasattr)}({self.obj.expr(names)}, {self.attr!r})"

    def name(self):
        return f"hasattr({self.obj.name()}, {self.attr!r})"


class ModuleMemberSource(Source):
    """A parameter, buffer or submodule of an ``nn.Module``: read from the module's own dict
    (``m._parameters['weight']``), which is exact and far cheaper than ``m.weight``."""

    __slots__ = ("base", "attr", "table")

    def __init__(self, base: Source, table: str, attr: str):
        self.base = base
        self.table = table  # "_parameters", "_buffers" or "_modules"
        self.attr = attr
        self.key = ("M", base.key, table, attr)

    def expr(self, names):
        return f"{self.base.expr(names)}.{self.table}[{self.attr!r}]"

    def name(self):
        if self.attr.isidentifier():
            return f"{self.base.name()}.{self.attr}"
        return f"{self.base.name()}[{self.attr}]"  # Sequential / ModuleList children


class ItemSource(Source):
    """``base[index]`` for a constant index or key."""

    __slots__ = ("base", "index")

    def __init__(self, base: Source, index):
        self.base = base
        self.index = index
        self.key = ("I", base.key, type(index).__name__, index)

    def expr(self, names):
        return f"{self.base.expr(names)}[{self.index!r}]"

    def name(self):
        return f"{self.base.name()}[{self.index!r}]"


class HasKeySource(Source):
    """Whether the dict at ``base`` holds the constant key ``index`` (``k in d``)."""

    __slots__ = ("base", "index")

    def __init__(self, base: Source, index):
        self.base = base
        self.index = index
        self.key = ("i", base.key, type(index).__name__, index)

    def expr(self, names):
        return f"{self.base.expr(names)}.__contains__({self.index!r})"

    def name(self):
        return f"{self.index!r} in {self.base.name()}"


class SizeSource(Source):
    """``base.shape[dim]``: one size of the tensor at ``base`` (a symbolic size's origin)."""

    __slots__ = ("base", "dim")

    def __init__(self, base: Source, dim: int):
        self.base = base
        self.dim = dim
        self.key = ("S", base.key, dim)

    def expr(self, names):
        return f"{self.base.expr(names)}.shape[{self.dim}]"

    def name(self):
        return f"{self.base.name()}.shape[{self.dim}]"


class StorageOffsetSource(Source):
    """``base.storage_offset()``: where the tensor at ``base`` starts in its storage."""

    __slots__ = ("base",)

    def __init__(self, base: Source):
        self.base = base
        self.key = ("SO", base.key)

    def expr(self, names):
        return f"{self.base.expr(names)}.storage_offset()"

    def name(self):
        return f"{self.base.name()}.storage_offset()"


class _KeyedSource(Source):
    """``base`` with ``index``, itself an object read from a source, as a key."""

    __slots__ = ("base", "index")
    tag = ""

    def __init__(self, base: Source, index: Source):
        self.base = base
        self.index = index
        self.key = (self.tag, base.key, index.key)


class ItemByKeySource(_KeyedSource):
    """``base[k]`` where the key ``k`` is itself an object read from a source (an optimizer's
    ``state[p]``, keyed by a parameter): the item found by the key's identity."""

    tag = "K"

    def expr(self, names):
        return f"{self.base.expr(names)}[{self.index.expr(names)}]"

    def name(self):
        return f"{self.base.name()}[{self.index.name()}]"


class KeyInSource(_KeyedSource):
    """Whether the object at ``index`` is a key of the dict at ``base`` (``k in d``)."""

    tag = "k"

    def expr(self, names):
        return f"{self.base.expr(names)}.__contains__({self.index.expr(names)})"

    def name(self):
        return f"{self.index.name()} in {self.base.name()}"


class ClosureCellSource(Source):
    """The contents of cell ``index`` of a function's closure (a variable it closes over)."""

    __slots__ = ("fn", "index", "var")

    def __init__(self, fn: Source, index: int, var: str):
        self.fn = fn
        self.index = index
        self.var = var
        self.key = ("C", fn.key, index)

    def expr(self, names):
        return f"{self.fn.expr(names)}.__closure__[{self.index}].cell_contents"

    def name(self):
        return f"{self.var} (closed over by {self.fn.name()})"


class SourceLoader:
    """Renders sources for generated code, loading each shared prefix once into a temporary
    (``___v3 = self._modules['h']``) so long module paths are walked once per call.

    With ``snapshot``, every source that is not a plain argument is read into a temporary where
    it is first needed, which in the entry function is before the graph runs and before any
    write is replayed: a value read by the frame is the value *before* its own writes
    (``old = G; G = G + 1; return old``), whatever the order in which the entry refers to it."""

    def __init__(self, names: ConstNames, argnames, lines: list[str], prefix: str = "___v",
                 snapshot: bool = False):
        self.names = names
        self.argnames = set(argnames)
        self.lines = lines
        self.prefix = prefix
        self.snapshot = snapshot
        self.temps: dict = {}
        #: temporary -> the source it holds (names the temporaries in readable renderings)
        self.sources: dict[str, Source] = {}

    def __call__(self, source: Source) -> str:
        var = self.temps.get(source.key)
        if var is not None:
            return var
        base = getattr(source, "base", None)
        full = source.expr(self.names)
        if base is None:
            if not self.snapshot or isinstance(source, (LocalSource, ObjectSource)):
                return full
            expr = full
        elif hasattr(source, "expr_from"):  # the base is an argument, not a prefix
            expr = source.expr_from(self(base), self.names)
        else:
            base_expr = self(base)
            prefix = base.expr(self.names)
            assert full.startswith(prefix)
            expr = base_expr + full[len(prefix):]
        var = f"{self.prefix}{len(self.temps)}"
        self.temps[source.key] = var
        self.sources[var] = source
        self.lines.append(f"{var} = {expr}")
        return var
