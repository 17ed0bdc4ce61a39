"""Side effects on the world outside the frame, recorded during capture and replayed after the
graph runs, so the compiled function leaves everything as eager would.

Recorded: attribute writes on modules and objects that came from outside (``self.step += 1``,
``self.cache = t``), writes of globals and of variables closed over (``nonlocal``), and
mutations of lists and dicts from outside (``self.history.append(x)``), and items of outside dicts
keyed by tensors (an optimizer creating ``self.state[p]``). Reads after a write in
the same capture see the written value. The entry function replays them in order, after the
graph: every new value is computed first, then the writes happen, so a write never changes what a
later replayed value reads.

In-place tensor operations are not side effects here: they are graph operations and run in
program order inside the graph.
"""

from __future__ import annotations

from ..errors import Unsupported
from .sources import Source


class SideEffects:
    def __init__(self):
        #: (owner key, name) -> (owner value, name, new value); owner key is a source key.
        self._attrs: dict = {}
        #: (id of globals dict, name) -> (globals dict, name, new value)
        self._globals: dict = {}
        #: cell source key -> (cell source, new value)
        self._cells: dict = {}
        #: id of container value -> container value (its final contents are replayed)
        self._containers: dict = {}
        #: (owner key, item key's source key) -> (owner value, key value, new value): items of
        #: outside dicts found by an object key (an optimizer's ``state[p] = {}``)
        self._items: dict = {}
        #: calls on containers whose contents were never read: (container, method, args)
        self._calls: dict = {}
        self._call_count = 0
        self._order: list = []  # keys in the order the first write happened
        self._raw_attrs: set = set()  # attribute writes replayed by object.__setattr__
        #: id of an outside object's instance dict -> [the dict, the object's value or None,
        #: the dict's own value or None] (see note_owner); a module's globals dict held as a
        #: value (``globals()``) is here too, with no owner
        self._instance_dicts: dict = {}
        #: Counts the writes recorded: a value read before is still what the frame would read
        #: while it is unchanged (see UserObjectValue.getattr).
        self.version = 0

    def __bool__(self) -> bool:
        return bool(self._order)

    # -- recording --------------------------------------------------------------------------------
    def store_attr(self, owner, name: str, value, raw: bool = False) -> None:
        """``owner.name = value``; ``raw``: written by ``object.__setattr__`` (from inside a
        class's own ``__setattr__``), which the replay calls too, so the class's method does not
        run a second time."""
        held = self._instance_dicts.get(_instance_dict_id(owner))
        if held is not None and held[2] is not None:
            raise Unsupported(f"assigning .{name} on {owner.describe()} while the function also "
                              "holds its __dict__", "read the attribute instead of __dict__")
        key = ("attr", _owner_source(owner).key, name)
        self._remember(key)
        self._attrs[key] = (owner, name, value)
        if raw:
            self._raw_attrs.add(key)
        else:
            self._raw_attrs.discard(key)

    def writes_attrs_of(self, owner) -> bool:
        """Whether an attribute of ``owner`` was written in this capture."""
        source = _owner_source(owner)
        return source is not None and any(k[1] == source.key for k in self._attrs)

    def load_attr(self, owner, name: str):
        source = _owner_source(owner)
        if source is None:
            return None
        entry = self._attrs.get(("attr", source.key, name))
        return entry[2] if entry is not None else None

    def store_item(self, owner, key, value) -> None:
        k = ("item", owner.source.key, key.source.key)
        self._remember(k)
        self._items[k] = (owner, key, value)

    def load_item(self, owner, key):
        entry = self._items.get(("item", owner.source.key, key.source.key))
        return entry[2] if entry is not None else None

    def touches(self, source: Source) -> bool:
        """Whether a write recorded so far changes the object at ``source`` or something it
        holds (an attribute written, a list or dict reached through it mutated)."""
        return any(_reaches(_owner_source(v), source) for v in self.written_objects())

    def written_objects(self) -> list:
        """The values from outside whose attributes or contents this capture changes."""
        out = []
        for key in self._order:
            if key[0] == "attr":
                out.append(self._attrs[key][0])
            elif key[0] == "item":
                out.append(self._items[key][0])
            elif key[0] == "container":
                out.append(self._containers[key])
            elif key[0] == "call":
                out.append(self._calls[key][0])
        return out

    def store_global(self, globals_dict: dict, name: str, value) -> None:
        if self._held_dict(globals_dict) is not None:
            raise Unsupported(f"assigning the global {name} while the function also holds its "
                              "module's globals() dict", "assign it with `global` only")
        key = ("global", id(globals_dict), name)
        self._remember(key)
        self._globals[key] = (globals_dict, name, value)

    def load_global(self, globals_dict: dict, name: str):
        held = self._held_dict(globals_dict)
        if held is not None and ("container", id(held)) in self._containers:
            raise Unsupported(f"reading the global {name} after the function changed its module's "
                              "globals() dict", "assign it with `global` instead")
        entry = self._globals.get(("global", id(globals_dict), name))
        return entry[2] if entry is not None else None

    def store_cell(self, cell_source: Source, value) -> None:
        key = ("cell", cell_source.key)
        self._remember(key)
        self._cells[key] = (cell_source, value)

    def load_cell(self, cell_source: Source):
        entry = self._cells.get(("cell", cell_source.key))
        return entry[1] if entry is not None else None

    # -- an object's attributes and its __dict__: one storage, two values ----------------------
    #
    # ``o.a = 5`` is recorded on o's value, ``o.__dict__["a"] = 5`` on the dict's: a read through
    # the other one would see the real object's old data. Once both are held in a capture,
    # neither may have been written or be written.

    def note_owner(self, owner) -> None:
        """An outside object (its value ``owner``) is read in the frame."""
        key = _instance_dict_id(owner)
        if key is not None:
            entry = self._instance_dicts.setdefault(key, [_instance_dict(owner), None, None])
            entry[1] = owner
            self._check_instance_dict(entry)

    def note_dict(self, value, d: dict) -> None:
        """A dict from outside (its value ``value``) is read in the frame. A module's globals
        dict is the storage of its globals, as an instance dict is of attributes: the two
        paths must not both be used to write and read."""
        if any(k[1] == id(d) for k in self._globals):  # d is a globals dict written to
            raise Unsupported("reading a module's globals() dict after assigning one of its "
                              "globals in the function", "read the global by its name")
        entry = self._instance_dicts.setdefault(id(d), [d, None, None])
        entry[2] = value
        self._check_instance_dict(entry)

    def _held_dict(self, d: dict):
        """The value the frame holds for the dict ``d``, or None."""
        entry = self._instance_dicts.get(id(d))
        return entry[2] if entry is not None else None

    def _check_instance_dict(self, entry) -> None:
        _, owner, value = entry
        if owner is None or value is None:
            return
        if self.writes_attrs_of(owner) or ("container", id(value)) in self._containers:
            raise Unsupported(f"reading both the attributes and the __dict__ of {owner.describe()} "
                              "after writing one of them", "read the attributes only")

    def mutate_container(self, container) -> None:
        for _, owner, value in self._instance_dicts.values():
            if value is container and owner is not None:
                raise Unsupported(f"changing the __dict__ of {owner.describe()} while the "
                                  "function also reads its attributes", "assign the attribute instead")
        key = ("container", id(container))
        self._remember(key)
        self._containers[key] = container

    def container_call(self, container, method: str, args: list) -> None:
        """``lst.append(v)`` on a list from outside whose contents were never read: replayed as
        the same call, so nothing about the list's current contents is guarded."""
        self._call_count += 1  # never reused: queued calls of another container may be dropped
        key = ("call", id(container), self._call_count)
        self._remember(key)
        self._calls[key] = (container, method, args)

    def contents_read(self, container) -> None:
        """The container's contents are now known (and guarded): queued calls were applied to
        them, so replay the final contents instead."""
        for key in [k for k in self._calls if k[1] == id(container)]:
            del self._calls[key]
            self._order.remove(key)
        self.mutate_container(container)

    def _remember(self, key) -> None:
        self.version += 1
        if key not in self._order:
            self._order.append(key)

    # -- replay -----------------------------------------------------------------------------------
    def replay_lines(self, cg) -> tuple[list[str], list[str]]:
        """Python lines for the entry function: the numbers it writes, computed before the
        graph call (arithmetic on the inputs' numbers, which may raise: ``o.a / o.b`` with
        ``o.b`` now 0); then, after the graph call, the other values and the writes."""
        early: list[str] = []
        values: list[str] = []
        writes: list[str] = []
        for key in self._order:
            kind = key[0]
            k = len(values) + len(early)
            if kind in _ASSIGNMENTS:
                record = getattr(self, _ASSIGNMENTS[kind])[key]
                expr = cg.expr(record[-1])
                number = _is_number(record[-1]) and "___o" not in expr
                temp = f"___n{k}" if number else f"___e{k}"
                (early if number else values).append(f"{temp} = {expr}")
                if key in self._raw_attrs:
                    owner, name, _ = record
                    writes.append(f"{cg.const_name(object.__setattr__)}("
                                  f"{cg.source_expr(_owner_source(owner))}, {name!r}, {temp})")
                else:
                    writes.append(f"{_target(cg, kind, record)} = {temp}")
            elif kind == "call":
                container, method, args = self._calls[key]
                values.append(f"___e{k} = ({', '.join(cg.expr(a) for a in args)},)")
                writes.append(f"{cg.source_expr(container.source)}.{method}(*___e{k})")
            else:
                container = self._containers[key]
                target = cg.source_expr(container.source)
                if hasattr(container.items, "keys"):
                    body = ", ".join(f"{cg.literal(n)}: {cg.expr(v)}" for n, v in container.items.items())
                    values.append(f"___e{k} = {{{body}}}")
                    writes.append(f"{target}.clear(); {target}.update(___e{k})")
                else:
                    body = ", ".join(cg.expr(v) for v in container.items)
                    values.append(f"___e{k} = [{body}]")
                    writes.append(f"{target}[:] = ___e{k}")
        return early, values + writes


def _is_number(value) -> bool:
    try:
        return value.python_type() in (int, float, bool)
    except Exception:  # noqa: BLE001 - a value that cannot say its type is no number here
        return False


#: kinds of recorded writes that are one assignment -> the table holding them (value last)
_ASSIGNMENTS = {"attr": "_attrs", "item": "_items", "global": "_globals", "cell": "_cells"}


def _target(cg, kind: str, record: tuple) -> str:
    """Where a recorded assignment writes, as an expression of the entry function."""
    if kind == "attr":
        owner, name, _ = record
        return f"{cg.source_expr(_owner_source(owner))}.{name}"
    if kind == "item":
        owner, item_key, _ = record
        return f"{cg.source_expr(owner.source)}[{cg.source_expr(item_key.source)}]"
    if kind == "global":
        globals_dict, name, _ = record
        return f"{cg.const_name(globals_dict)}[{name!r}]"
    source, _ = record
    return source.expr(cg.names)


def _reaches(path, source: Source) -> bool:
    """Whether ``path`` is ``source`` or goes through it."""
    while path is not None:
        if path.key == source.key:
            return True
        path = getattr(path, "base", None)
    return False


def _instance_dict(owner):
    obj = getattr(owner, "obj", None)
    if obj is None:
        obj = getattr(owner, "module", None)
    try:
        d = object.__getattribute__(obj, "__dict__")
    except (AttributeError, TypeError):
        return None
    return d if type(d) is dict else None


def _instance_dict_id(owner):
    d = _instance_dict(owner)
    return id(d) if d is not None else None


def _owner_source(owner):
    """Where an attribute write goes: the owner's path, or, for an object reached without one
    (a library module's object), the object itself."""
    if owner.source is not None:
        return owner.source
    obj = getattr(owner, "obj", None)
    if obj is None:
        return None
    from .sources import ObjectSource
    return ObjectSource(obj)
