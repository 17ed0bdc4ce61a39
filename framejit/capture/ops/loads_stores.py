"""Loads and stores: locals, globals, constants, attributes, cells, and stack shuffles."""

from __future__ import annotations

from ...errors import Unsupported
from ..compat import PY312_PLUS
from ..interpreter import RealCell, handler
from ..sources import GlobalSource
from ..values.base import NULL, CellValue
from ..values.builder import wrap, wrap_sourceless
from ..values.constants import ConstantValue


@handler("NOP", "RESUME", "PRECALL", "CACHE", "EXTENDED_ARG", "COPY_FREE_VARS", "END_FOR_NOP")
def nop(tx, inst):
    pass


@handler("LOAD_FAST", "LOAD_FAST_CHECK")
def load_fast(tx, inst):
    tx.push(tx.load_local(inst.arg))


@handler("LOAD_FAST_AND_CLEAR")
def load_fast_and_clear(tx, inst):
    # 3.12 inlined comprehensions save the outer value (or NULL) and restore it afterwards.
    v = tx.locals.pop(inst.arg, None)
    if v is None and inst.arg in tx.lazy_args:
        v = tx.load_local(inst.arg)
        tx.locals.pop(inst.arg)
    tx.push(v if v is not None else NULL)


@handler("STORE_FAST")
def store_fast(tx, inst):
    v = tx.pop()
    tx.lazy_args.pop(inst.arg, None)
    if v is NULL:
        tx.locals.pop(inst.arg, None)
    else:
        tx.locals[inst.arg] = v


@handler("DELETE_FAST")
def delete_fast(tx, inst):
    tx.lazy_args.pop(inst.arg, None)
    tx.locals.pop(inst.arg, None)


@handler("LOAD_CONST")
def load_const(tx, inst):
    v = inst.arg
    tx.push(ConstantValue(v) if hasattr(v, "co_code") else wrap_sourceless(tx, v))


@handler("RETURN_CONST")
def return_const(tx, inst):
    from ..interpreter import _Return
    raise _Return(wrap_sourceless(tx, inst.arg))


@handler("LOAD_GLOBAL")
def load_global(tx, inst):
    push_null, name = inst.arg if isinstance(inst.arg, tuple) else (False, inst.arg)
    if push_null and not _NULL_AFTER:
        tx.push(NULL)
    tx.push(load_global_value(tx, name))
    if push_null and _NULL_AFTER:
        tx.push(NULL)


_NULL_AFTER = False  # 3.13 pushes NULL after the callable; 3.11/3.12 below it


def load_global_value(tx, name: str):
    g = tx.f_globals
    written = tx.output.side_effects.load_global(g, name)
    if written is not None:
        return written
    if name in g:
        if _is_library_globals(g):
            # Globals of torch and other installed libraries are taken as fixed, like their
            # module attributes: guarding them would cost every call and never fire.
            return wrap_sourceless(tx, g[name])
        return wrap(tx, g[name], GlobalSource(g, name))
    b = tx.f_builtins
    if name in b:
        if not _is_library_globals(g):
            tx.output.note_builtin(g, name)  # a global of that name defined later shadows it
        return wrap_sourceless(tx, b[name])
    raise Unsupported(f"name {name!r} is not defined (NameError)")


_library_globals: dict[int, tuple] = {}  # id(globals) -> (library?, the dict if so)


def _is_library_globals(g: dict) -> bool:
    key = id(g)
    known = _library_globals.get(key)
    # A library's dict is kept with its answer: a user's dict made later at the address of a
    # freed one must not be taken for it (its globals would go unguarded).
    if known is None or (known[0] and known[1] is not g):
        import sys

        from ..values.builder import is_library_module
        module = sys.modules.get(g.get("__name__", ""))
        library = module is not None and vars(module) is g and is_library_module(module)
        known = _library_globals[key] = (library, g if library else None)
    return known[0]


@handler("STORE_GLOBAL")
def store_global(tx, inst):
    value = tx.pop()
    if _is_library_globals(tx.f_globals):
        raise Unsupported(f"assigning the global {inst.arg} of a library module")
    tx.output.side_effects.store_global(tx.f_globals, inst.arg, value)  # replayed after the graph


@handler("LOAD_NAME")
def load_name(tx, inst):
    tx.push(load_global_value(tx, inst.arg))


@handler("LOAD_ATTR")
def load_attr(tx, inst):
    arg = inst.arg
    method = False
    if isinstance(arg, tuple):
        method, arg = arg
    obj = tx.pop()
    v = obj.getattr(tx, arg)
    if method:
        tx.push(NULL)
    tx.push(v)


@handler("LOAD_METHOD")
def load_method(tx, inst):
    obj = tx.pop()
    tx.push(NULL)
    tx.push(obj.getattr(tx, inst.arg))


@handler("STORE_ATTR")
def store_attr(tx, inst):
    obj = tx.pop()
    value = tx.pop()
    obj.setattr(tx, inst.arg, value)


@handler("DELETE_ATTR")
def delete_attr(tx, inst):
    tx.pop().delattr(tx, inst.arg)


@handler("MAKE_CELL")
def make_cell(tx, inst):
    name = inst.arg.name
    initial = None
    if name in tx.locals or name in tx.lazy_args:
        initial = tx.load_local(name)
        tx.locals.pop(name, None)
    tx.cells[name] = CellValue(initial)


@handler("LOAD_CLOSURE")
def load_closure(tx, inst):
    tx.push(_cell(tx, inst.arg.name))


def _cell(tx, name):
    cell = tx.cells.get(name)
    if cell is None:
        raise Unsupported(f"reading the closure variable {name!r} of the compiled function itself",
                          "pass the value as an argument instead")
    return cell


@handler("LOAD_DEREF", "LOAD_CLASSDEREF")
def load_deref(tx, inst):
    cell = _cell(tx, inst.arg.name)
    if isinstance(cell, RealCell):
        if cell.cell_source is not None:
            written = tx.output.side_effects.load_cell(cell.cell_source)
            if written is not None:
                tx.push(written)
                return
        try:
            contents = cell.cell.cell_contents
        except ValueError as e:
            raise Unsupported(f"closure variable {inst.arg.name!r} referenced before assignment") from e
        if cell.cell_source is not None:
            tx.push(wrap(tx, contents, cell.cell_source))
        else:
            tx.push(wrap_sourceless(tx, contents))
        return
    if cell.contents is None:
        raise Unsupported(f"closure variable {inst.arg.name!r} referenced before assignment")
    tx.push(cell.contents)


@handler("STORE_DEREF")
def store_deref(tx, inst):
    cell = _cell(tx, inst.arg.name)
    value = tx.pop()
    if isinstance(cell, RealCell):
        if cell.cell_source is None:
            raise Unsupported(f"assigning the nonlocal variable {inst.arg.name!r} of a function "
                              "framejit cannot reach from the compiled frame")
        tx.output.side_effects.store_cell(cell.cell_source, value)  # replayed after the graph
        return
    cell.contents = value


@handler("POP_TOP")
def pop_top(tx, inst):
    tx.pop()


@handler("PUSH_NULL")
def push_null(tx, inst):
    tx.push(NULL)


@handler("COPY")
def copy(tx, inst):
    tx.push(tx.stack[-inst.arg])


@handler("SWAP")
def swap(tx, inst):
    s = tx.stack
    s[-1], s[-inst.arg] = s[-inst.arg], s[-1]


@handler("END_FOR")
def end_for(tx, inst):
    # Reached only by falling through (FOR_ITER jumps past it); pops iterator and value.
    tx.pop()
    if not PY312_PLUS:
        return
    tx.pop()


@handler("IMPORT_NAME")
def import_name(tx, inst):
    # Importing a module that is already imported has no effect but the lookup: capture that.
    # A first import runs module code, which is not captured (the frame is split or eager).
    import importlib
    import sys

    fromlist = tx.pop().as_constant()
    level = tx.pop().as_constant()
    name = inst.arg
    if level != 0:
        package = tx.f_globals.get("__package__") or ""
        try:
            name = importlib.util.resolve_name("." * level + inst.arg, package)
        except (ImportError, ValueError) as e:
            raise Unsupported(f"a relative import ({'.' * level}{inst.arg})") from e
    module = sys.modules.get(name)
    if module is None:
        raise Unsupported(f"importing {name}, which is not imported yet", "import it at module level")
    if not fromlist:
        top = sys.modules.get(name.partition(".")[0])
        if top is None:
            raise Unsupported(f"importing {name}")
        module = top if level == 0 else module
    tx.push(wrap_sourceless(tx, module))


@handler("IMPORT_FROM")
def import_from(tx, inst):
    module = tx.stack[-1]
    tx.push(module.getattr(tx, inst.arg))
