"""Compiled graphs on disk: a later process that captures the same graph skips the compile.

A captured graph's compile (passes, fusion, lowering, rendering the kernels' C) took 17-20 ms of
GPT-2's first call with warm kernel caches. What it makes is kept in one file: the wrapper graph
(each fusion group replaced by a kernel call), each kernel's description and C source, its
layout checks and donated inputs, the group's torch ops (what runs if an input comes laid out
otherwise), and the recipe of each folded constant. A later compile of the same graph reads it
and builds the same wrapper function around the same kernels.

**The key** covers everything the compile reads: each node's op, name, target, arguments and
metadata (example values as their type, sizes, strides, offset, dtype, device, requires_grad
and which of them share storage), the constants' and example inputs' metadata, the devices, and
the environment: framejit's code (each file's size and modification time) and settings (the
upper-case numbers and switches of the passes' and kernels' modules), torch's and Python's
builds, grad mode and the default dtype, ``CC`` and ``FRAMEJIT_CFLAGS``. Nothing in it depends on
what a process did before (which modules it imported, say): a key that did is a miss. Values of
constants are never in it: a folded constant is computed again from the current constants at
each hit (a graph that folds ``w.t()`` of another model's weights gets its own values).

**Not cached:** graphs with symbolic sizes, graphs with kernels that are not C (CUDA), graphs
whose targets or metadata have no name that holds in another process (a user's function called
in the graph, a module as root): they compile as before. An entry that cannot be read or used
(another format, a folded constant that now comes out another shape) is a miss.

``FRAMEJIT_GRAPH_CACHE=0`` turns it off. The tests do, except those of the cache itself: they
replace functions of the compiler (to make a lowering fail, say) that no key sees.
"""

from __future__ import annotations

import builtins
import functools
import hashlib
import importlib
import marshal
import os
import pickle
import sys
import types
from collections.abc import Callable
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from . import _C, diskcache, record
from .fx_ir import Graph, GraphModule, Node
from .fx_ir.codegen import PinnedModule, PythonCode, pinned_modules
from .fx_ir.examples import _NotOnDisk, _target_name
from .fx_ir.graph_module import compile_python
from .fx_ir.meta import resolve_qualname
from .passes.cleanup import Constant, Folded, evaluate

#: The format of an entry; part of every key.
FORMAT = 1


class Uncacheable(Exception):
    """Something in a graph has no name that means the same in another process."""


def enabled() -> bool:
    return os.environ.get("FRAMEJIT_GRAPH_CACHE", "1") != "0"


# -- the key ------------------------------------------------------------------------------------

_code: str | None = None


def _framejit_code() -> str:
    """framejit's files (path, size, modification time), read once per process."""
    global _code
    if _code is None:
        found: list[tuple] = []

        def walk(folder: str, prefix: str) -> None:
            for entry in os.scandir(folder):
                if entry.is_dir():
                    if entry.name != "__pycache__":
                        walk(entry.path, f"{prefix}{entry.name}/")
                elif entry.name.endswith((".py", ".so")):
                    st = entry.stat()
                    found.append((prefix + entry.name, st.st_size, st.st_mtime_ns))

        walk(os.path.dirname(os.path.abspath(__file__)), "")
        _code = hashlib.sha256(repr(sorted(found)).encode()).hexdigest()
    return _code


def _environment() -> tuple:
    return (FORMAT, _framejit_code(), str(torch.__version__), torch.__file__, sys.version,
            torch.is_grad_enabled(), str(torch.get_default_dtype()),
            os.environ.get("CC", ""), os.environ.get("FRAMEJIT_CFLAGS", ""), _settings())


def _settings() -> tuple:
    """The compile's numbers and switches as they are now (``c_render.PARALLEL_MIN``, say): the
    upper-case globals that hold plain values, of the pipeline and every module of the passes
    and the kernels but the tests' reference interpreter (all of them, imported or not yet: a
    key must not depend on which modules a process happened to import)."""
    if not _modules:
        package = os.path.dirname(os.path.abspath(__file__))
        names = ["framejit.pipeline"] + [
            f"framejit.{sub}.{f[:-3]}" for sub in ("passes", "kernels")
            for f in sorted(os.listdir(os.path.join(package, sub)))
            if f.endswith(".py") and f not in ("__init__.py", "reference.py")]  # (tests')
        _modules[:] = [(name, importlib.import_module(name)) for name in names]
    found = []
    for name, module in _modules:
        for k, v in vars(module).items():
            if k.isupper() and type(v) in _SETTING_TYPES and _marshals((v,)):
                found.append((name, k, v))
    return tuple(found)


_modules: list = []  # (name, module) of the compile's modules
_SETTING_TYPES = frozenset({int, float, bool, str, tuple})


def key_of(gm: GraphModule, example_inputs: list, devices) -> str | None:
    """The cache key of compiling ``gm`` for ``devices``, or None if it cannot have one."""
    if not isinstance(gm.root, dict):
        return None
    enc = _Encoder(for_key=True)
    try:
        parts = (_environment(), tuple(sorted(devices)), enc.graph(gm.graph),
                 tuple((name, enc.value(v)) for name, v in sorted(gm.root.items())),
                 enc.value(list(example_inputs)))
        # marshal's version 0 writes the same bytes for the same values in every process (no
        # references between objects, no interning marks); 4x faster than repr here.
        data = marshal.dumps(parts, 0)
    except Exception:  # noqa: BLE001 - Uncacheable, or anything else: the graph compiles as
        return None  # before, never fails for its cache
    return hashlib.sha256(data).hexdigest()[:40]


# -- encoding graphs and values as plain data ---------------------------------------------------

_VALUE_TYPES = {torch.dtype: "dtype", torch.device: "device", torch.layout: "layout",
                torch.memory_format: "memory_format"}
_PLAIN = (type(None), bool, int, str)


def _lookup(module: str, qualname: str) -> Any:
    obj: Any = sys.modules.get(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    return obj


def _target(target: Any) -> tuple:
    """A name of a call_function target that finds the same callable in another process."""
    if type(target) is _C.CompiledFunction:
        raise Uncacheable("a compiled function")  # (the wrapper's kernels are named apart)
    try:
        return _target_name(target)
    except _NotOnDisk:
        pass
    if type(target) is types.BuiltinFunctionType and target.__module__ == "builtins" \
            and getattr(builtins, target.__name__, None) is target:
        return ("builtin", "builtins", target.__name__)  # getattr, len, ...
    module, qualname = getattr(target, "__module__", None), getattr(target, "__qualname__", "")
    if isinstance(module, str) and (module == "framejit" or module.startswith("framejit.")) \
            and "<" not in qualname and _lookup(module, qualname) is target:
        return ("function", module, qualname)  # framejit's own: its files are in the key
    raise Uncacheable(f"the target {target!r}")


_resolved: dict[tuple, Any] = {}


def _resolve_target(name: tuple) -> Any:
    """The callable ``name`` (see :func:`_target`) stands for in this process."""
    found = _resolved.get(name)
    if found is not None and (name[0] not in ("builtin", "function")
                              or _lookup(name[1], name[2]) is found):  # (not rebound since)
        return found
    kind = name[0]
    if kind == "op":
        namespace, _, rest = name[1].partition("::")
        op, _, overload = rest.partition(".")
        found = getattr(getattr(getattr(torch.ops, namespace), op), overload or "default")
    elif kind == "tensorbase":
        found = getattr(torch._C.TensorBase, name[1])
    elif kind in ("builtin", "function"):
        __import__(name[1])
        found = _lookup(name[1], name[2])
    else:
        raise ValueError(f"unknown target {name!r}")
    if found is None or _target_again(found) != name:
        raise ValueError(f"target {name!r} not found")
    _resolved[name] = found
    return found


def _target_again(found: Any) -> tuple | None:
    try:
        return _target(found)
    except Uncacheable:
        return None


class _Encoder:
    """Plain data (tuples of strings and numbers) for graphs and values. ``for_key``: tensors
    as all their metadata and their storage sharing; otherwise as what rebuilds a meta value."""

    def __init__(self, for_key: bool = False) -> None:
        self.for_key = for_key
        self.nodes: dict[Node, int] = {}
        self.storages: dict[StorageWeakRef, int] = {}
        self.kernels: dict[int, int] = {}  # id(launcher) -> its index (the wrapper's calls)

    def graph(self, graph: Graph, meta: Callable[[Node], dict] | None = None) -> tuple:
        items = []
        for i, node in enumerate(graph.nodes):
            self.nodes[node] = i
            target = node.target
            if node.op == "call_function":
                fn = getattr(target, "fn", None) if type(target) is _C.CompiledFunction else None
                target = ("kernel", self.kernels[id(fn)]) if id(fn) in self.kernels \
                    else _target(target)
            elif node.op == "call_module":
                raise Uncacheable("a call_module node")
            node_meta = node.meta if meta is None else meta(node)
            items.append((node.op, node.name, target, self.value(node.args),
                          self.value(node.kwargs),
                          tuple((k, self.value(v)) for k, v in sorted(node_meta.items()))))
        return tuple(items)

    def value(self, v: Any) -> Any:
        t = type(v)
        if t in _PLAIN:
            return v
        if t is Node:
            index = self.nodes.get(v)
            if index is None:
                raise Uncacheable("a node of another graph")
            return ("n", index)
        if t is float or t is complex:
            return (t.__name__, repr(v))
        if t is tuple or t is list:
            if _marshals(v):  # a user's source lines, say: most of a graph's metadata
                return ("P", v)
            return ("t" if t is tuple else "l", tuple(self.value(x) for x in v))
        if t is dict:
            return ("d", tuple((self.value(k), self.value(x)) for k, x in v.items()))
        if t is slice:
            return ("s", self.value(v.start), self.value(v.stop), self.value(v.step))
        if t in _VALUE_TYPES:
            return (_VALUE_TYPES[t], str(v))
        if t is torch.Size:
            return ("S", tuple(v))
        if v is Ellipsis:
            return ("E",)
        if t is Constant:
            return ("attr", str(v))
        if isinstance(v, torch.Tensor):
            return self.tensor(v)
        if isinstance(v, type):
            module, qualname = v.__module__, v.__qualname__
            if _lookup(module, qualname) is not v:
                raise Uncacheable(f"the class {v!r}")
            return ("type", module, qualname)
        raise Uncacheable(f"a value of type {t.__name__}")

    def global_value(self, v: Any) -> tuple:
        """A global of generated code: a module, a kernel call, a target or a value."""
        if isinstance(v, types.ModuleType):
            if sys.modules.get(v.__name__) is not v:
                raise Uncacheable(f"the module {v!r}")
            return ("module", v.__name__)
        if type(v) is PinnedModule:
            return ("pinned", tuple(sorted(self._pinned(v, v._module.__name__))))
        if type(v) is _C.CompiledFunction and id(v.fn) in self.kernels:
            return ("kernel", self.kernels[id(v.fn)])
        if callable(v) and not isinstance(v, type):
            return ("target", _target(v))
        return ("value", self.value(v))

    def _pinned(self, module: PinnedModule, path: str):
        """(dotted path, target name) of each callable a :class:`PinnedModule` pins."""
        for name, v in vars(module).items():
            if name == "_module":
                continue
            if type(v) is PinnedModule:
                yield from self._pinned(v, f"{path}.{name}")
            else:
                yield f"{path}.{name}", _target(v)

    def tensor(self, v: torch.Tensor) -> tuple:
        if v.layout is not torch.strided or type(v) not in (torch.Tensor, torch.nn.Parameter):
            raise Uncacheable("a tensor that is not a plain strided one")
        if not self.for_key:
            return ("T", tuple(v.shape), v.stride(), str(v.dtype), v.requires_grad)
        storage = StorageWeakRef(v.untyped_storage())
        alias = self.storages.setdefault(storage, len(self.storages))
        return ("T", type(v).__name__, tuple(v.shape), v.stride(), v.storage_offset(),
                str(v.dtype), str(v.device), v.requires_grad, v.is_leaf, v.is_conj(), v.is_neg(),
                alias)


def _marshals(v: tuple | list) -> bool:
    """Whether ``v`` holds only Python's own values (numbers, strings, None, and containers of
    them), which marshal writes and pickle keeps exactly: no node, tensor or torch value."""
    try:
        marshal.dumps(v, 0)
    except ValueError:
        return False
    return True


_DTYPES = {str(d): d for d in (torch.float32, torch.float64, torch.float16, torch.bfloat16,
                               torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8,
                               torch.bool, torch.complex64, torch.complex128)}


def _torch_value(kind: str, text: str) -> Any:
    if kind == "dtype":
        dtype = _DTYPES.get(text) or getattr(torch, text.removeprefix("torch."))
        if not isinstance(dtype, torch.dtype):
            raise ValueError(text)
        return dtype
    if kind == "device":
        return torch.device(text)
    value = getattr(torch, text.removeprefix("torch."))
    if str(value) != text:
        raise ValueError(text)
    return value


def _decode(e: Any, nodes: list) -> Any:
    if type(e) is not tuple:
        return e
    tag = e[0]
    if tag == "n":
        return nodes[e[1]]
    if tag == "P":
        return e[1]
    if tag == "t":
        return tuple(_decode(x, nodes) for x in e[1])
    if tag == "l":
        return [_decode(x, nodes) for x in e[1]]
    if tag == "d":
        return {_decode(k, nodes): _decode(x, nodes) for k, x in e[1]}
    if tag == "float":
        return float(e[1])
    if tag == "complex":
        return complex(e[1])
    if tag == "s":
        return slice(*(_decode(x, nodes) for x in e[1:]))
    if tag in ("dtype", "device", "layout", "memory_format"):
        return _torch_value(tag, e[1])
    if tag == "S":
        return torch.Size(e[1])
    if tag == "E":
        return Ellipsis
    if tag == "attr":
        return Constant(e[1])
    if tag == "T":
        _, shape, stride, dtype, requires_grad = e
        t = torch.empty_strided(shape, stride, dtype=_torch_value("dtype", dtype), device="meta")
        return t.requires_grad_() if requires_grad else t
    if tag == "type":
        __import__(e[1])
        found = _lookup(e[1], e[2])
        if not isinstance(found, type):
            raise ValueError(f"class {e[1]}.{e[2]} not found")
        return found
    raise ValueError(f"unknown tag {tag!r}")


#: The metadata a wrapper graph's nodes keep: ``val`` (generated code reads it) and what a dump
#: shows; other keys are the passes' notes.
_KEPT_META = ("val", "device", "stack")


def _kept_meta(node: Node) -> dict:
    return {k: node.meta[k] for k in _KEPT_META if k in node.meta}


def _graph_of(items: tuple, launchers: list) -> Graph:
    graph = Graph()
    nodes: list[Node] = []
    for op, name, target, args, kwargs, meta in items:
        if op == "call_function":
            target = _C.CompiledFunction(launchers[target[1]], None) if target[0] == "kernel" \
                else _resolve_target(target)
        node = graph.create_node(op, target, _decode(args, nodes), _decode(kwargs, nodes), name=name)
        if node.name != name:
            raise ValueError(f"node {name!r} came back as {node.name!r}")
        node.meta = {k: _decode(v, nodes) for k, v in meta}
        nodes.append(node)
    return graph


# -- storing and loading --------------------------------------------------------------------------


def folder() -> str:
    """The folder of the entries: ``graphs`` under the disk caches' root."""
    return diskcache.folder("graphs")


def _path(key: str) -> str:
    return os.path.join(folder(), f"{key}.pickle")


def store(key: str, fn: Callable[..., Any], constants: dict[str, Any], folded: list[Folded],
          class_name: str) -> None:
    """Keep what compiling a graph made (``fn``, the pipeline's wrapper function with its
    ``framejit_kernels`` and ``framejit_graph``) under ``key``, if it can be kept."""
    from .kernels.c_runtime import CLauncher
    from .pipeline import group_graph, predicted_layouts

    launchers = fn.framejit_kernels  # type: ignore[attr-defined]
    if any(type(launcher) is not CLauncher for launcher in launchers):
        return  # Triton kernels keep their own caches (and autotuning) per launch
    wrapper: Graph = fn.framejit_graph  # type: ignore[attr-defined]
    enc = _Encoder()
    try:
        kernels = []
        for k, launcher in enumerate(launchers):
            enc.kernels[id(launcher)] = k
            group, lowered = launcher.fallback.group, launcher.fallback.lowered
            kernels.append({
                "kernel": launcher.kernel, "outputs": launcher.outputs,
                "device": str(launcher.device), "seed_index": launcher.seed_index,
                "cname": launcher.cname, "function": launcher.function,
                "checked_inputs": launcher.checked_inputs, "donated": launcher.donated,
                "group": [n.format() for n in group.nodes],
                "torch_ops": _later(_Encoder().graph(group_graph(group, lowered), _kept_meta)),
                "layouts": predicted_layouts(lowered),
            })
        recipes = []
        for qualname, op, target, args, kwargs in folded:
            value = constants[qualname]
            recipes.append((qualname, op, target if op == "call_method" else _target(target),
                            enc.value(args), enc.value(kwargs), tuple(value.shape),
                            value.stride(), str(value.dtype), str(value.device)))
        code = wrapper.python_code("forward", self_arg=False)
        entry = {"format": FORMAT, "class_name": class_name, "kernels": kernels,
                 "folded": tuple(recipes), "graph": _later(enc.graph(wrapper, _kept_meta)),
                 "source": code.src, "fn_name": code.fn_name,
                 "globals": tuple((name, enc.global_value(v)) for name, v in code.globals.items()),
                 "attributes": tuple(code.attr_globals.items())}
        data = pickle.dumps(entry, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - what cannot be kept compiles again next time; the
        return  # compile that made it stands
    diskcache.write_atomic(_path(key), data, folder())


def _later(items: tuple) -> bytes:
    """Encoded graphs that only a dump, a test or an input laid out otherwise reads: pickled on
    their own, so that a hit does not unpickle them."""
    return pickle.dumps(items, protocol=pickle.HIGHEST_PROTOCOL)


def load(key: str, gm: GraphModule, fused_graph: Callable[[], Graph]) -> Callable[..., Any] | None:
    """The wrapper function kept under ``key``, built around ``gm``'s constants, or None (no
    entry, or one that cannot be used). Its ``framejit_graph`` (the wrapper graph) and
    ``framejit_fused_graph`` (the graph after the passes, which ``fused_graph`` makes) are
    functions that make them when a dump or a test asks."""
    path = _path(key)
    try:
        with open(path, "rb") as f:
            entry = pickle.loads(f.read())
        if type(entry) is not dict or entry.get("format") != FORMAT:
            return None
        constants = dict(gm.root)
        for qualname, op, target, args, kwargs, shape, stride, dtype, device in entry["folded"]:
            if op != "call_method":
                target = _resolve_target(target)
            value = evaluate(Folded((qualname, op, target, _decode(args, []), _decode(kwargs, []))),
                             constants)
            if not isinstance(value, torch.Tensor) or value.requires_grad \
                    or (tuple(value.shape), value.stride(), str(value.dtype), str(value.device)) \
                    != (shape, stride, dtype, device):
                return None
            constants[qualname] = value
        launchers = [_launcher(k) for k in entry["kernels"]]
        namespace = {name: _global(e, launchers) for name, e in entry["globals"]}
        for name, qualname in entry["attributes"]:
            namespace[name] = resolve_qualname(constants, qualname)
        fn = compile_python(PythonCode(entry["source"], namespace, entry["fn_name"]))
        fn.__qualname__ = f"{entry['class_name']}.forward"
    except Exception:  # noqa: BLE001 - an entry that does not load is a miss, compiled afresh
        return None
    diskcache.note_use(path)
    fn.framejit_kernels = launchers  # type: ignore[attr-defined]
    fn.framejit_graph = functools.cache(  # type: ignore[attr-defined]
        lambda: _graph_of(pickle.loads(entry["graph"]), launchers))
    fn.framejit_fused_graph = fused_graph  # type: ignore[attr-defined]
    for launcher, kept in zip(launchers, entry["kernels"]):
        record.emit(record.KernelCompiled(
            name=launcher.name, language="c", source=launcher.source,
            description=record.Later(lambda k=launcher.kernel: str(k)),
            group=list(kept["group"]), device=str(launcher.device), seconds=0.0))
    return fn


def _global(e: tuple, launchers: list) -> Any:
    kind = e[0]
    if kind == "module":
        return sys.modules[e[1]]
    if kind == "kernel":
        return _C.CompiledFunction(launchers[e[1]], None)
    if kind == "target":
        return _resolve_target(e[1])
    if kind == "pinned":
        called = {path: _resolve_target(name) for path, name in e[1]}
        (module,) = pinned_modules(called).values()
        return module
    return _decode(e[1], [])


def _launcher(kept: dict):
    from .kernels.c_runtime import CLauncher
    from .pipeline import GroupAsTorch, torch_function

    launcher = CLauncher.restored(kept["kernel"], kept["outputs"], torch.device(kept["device"]),
                                  kept["seed_index"], kept["cname"], kept["function"])
    launcher.checked_inputs = kept["checked_inputs"]
    launcher.donated = kept["donated"]
    name, ops, layouts = launcher.kernel.name, kept["torch_ops"], kept["layouts"]
    launcher.fallback = GroupAsTorch(
        lambda: torch_function(_graph_of(pickle.loads(ops), []), name, layouts))
    return launcher
