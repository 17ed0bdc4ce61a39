"""The built-in kernel backends' pipeline (``backend="default"`` on CUDA tensors, ``"triton"``).

    copy of the captured graph
      → passes: normalize, decompose, DCE, CSE, constant folding   (framejit.passes)
      → fusion groups                                               (passes.fusion, networkx)
      → per group: kernel description → coalesce → Triton source → compiled kernel
      → a wrapper graph: each group replaced by one launch of its kernel, every other node a
        torch call (matmuls, views, ops no kernel computes); its generated Python is the
        compiled function.

A group whose lowering fails keeps its torch ops: the result is still correct, only not fused.
The captured graph itself is not changed (explain and dumps show it as captured).
"""

from __future__ import annotations

import heapq
import operator
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from . import _C, graph_cache, record
from .fx_ir import Graph, GraphModule, Node, has_symbolic_sizes
from .kernels import triton_pool
from .kernels.ir import Sym
from .kernels.launch import donate_dead_inputs, layout_fits
from .kernels.lowering import LoweringError, classify, lower_group, reduction_dims
from .kernels.simplify import coalesce
from .kernels.triton_runtime import Launcher
from .passes import fusion, run_passes
from .passes.layout import channels_last_convs
from .passes.matmul import aligned_matmul_outputs, bmm_operands
from .passes.symbolic import NotSizeGeneric, size_node, symbolic_shapes
from .passes.util import layout_is_exact
from .passes.views import views_as_reinterprets


def _device_of(node: Node) -> torch.device | None:
    dev = node.meta.get("device")
    return torch.device(dev) if dev is not None else None


def make_classifier(devices: Iterable[str]) -> Callable[[Node], str | None]:
    """``classify`` restricted to nodes whose tensors all live on one device of ``devices``."""
    allowed = frozenset(devices)

    def classify_on(node: Node) -> str | None:
        kind = classify(node)
        if kind is None:
            return None
        dev = _device_of(node)
        if dev is None or dev.type not in allowed:
            return None
        for inp in node.all_input_nodes:
            if _device_of(inp) != dev:
                return None
        return kind

    return classify_on



def compile_with_kernels(gm: GraphModule, example_inputs: list, devices: Iterable[str],
                         *, lint: bool = False, launcher: type | Mapping[str, type] = Launcher,
                         cache: bool = False) -> Callable[..., Any]:
    """The compiled function of ``gm``: fusion groups on ``devices`` run as generated kernels.

    ``launcher`` builds the callable of each kernel: the Triton :class:`Launcher`, the C
    ``kernels.c_runtime.CLauncher``, ``kernels.reference.ReferenceLauncher`` to run the
    descriptions in torch (tests), or a mapping from device type to one of them
    (``{"cpu": CLauncher, "cuda": Launcher}``). ``cache``: the result may come from, and goes
    to, the disk cache of compiled graphs (:mod:`framejit.graph_cache`; C kernels only)."""
    symbolic = has_symbolic_sizes(gm.graph)
    key = None
    if cache and not symbolic and not lint and graph_cache.enabled():
        t0 = time.perf_counter()
        key = graph_cache.key_of(gm, example_inputs, devices)
        if key is not None:
            fn = graph_cache.load(key, gm, lambda: fused_graph(gm, devices))
            if fn is not None:
                record.emit(record.Stage(name="graph cache hit", seconds=time.perf_counter() - t0))
                return fn
    if isinstance(launcher, Mapping):
        by_device = dict(launcher)
        launcher = lambda kernel, outputs, device, seed_index: by_device[torch.device(device).type](  # noqa: E731
            kernel, outputs, device, seed_index)
    t0 = time.perf_counter()
    folded: list | None = [] if key is not None else None  # (recipes only for an entry)
    graph, constants = _passes(gm, lint, symbolic, folded)
    if not symbolic:
        fn = _compile_groups(gm, graph, constants, devices, launcher, None, t0, lint)
        if key is not None:
            graph_cache.store(key, fn, constants, folded, getattr(gm, "class_name", "GraphModule"))
        return fn
    # Kernels that serve every size need each value's sizes as expressions of the symbols:
    # where one cannot be had, the graph runs its torch ops.
    try:
        shapes = symbolic_shapes(graph, constants,
                                 allow_relations=getattr(gm, "accepts_size_relations", False))
        return _compile_groups(gm, graph, constants, devices, launcher, shapes, t0, lint)
    except NotSizeGeneric as e:
        fn = gm.forward_fn
        fn.framejit_kernels = []  # type: ignore[attr-defined]
        fn.framejit_eager_reason = reason = (  # type: ignore[attr-defined]
            f"it has symbolic sizes and runs as torch ops: {e}")
        record.emit(record.KernelsDeclined(reason=reason))
        return fn


def _passes(gm: GraphModule, lint: bool, symbolic: bool, folded: list | None = None):
    """A copy of ``gm``'s graph after the passes, and the constants (with the folded ones)."""
    graph = gm.graph.copy()
    constants = dict(gm.root) if isinstance(gm.root, dict) else None
    run_passes(graph, constants, lint=lint, symbolic=symbolic, folded=folded)
    return graph, constants


def _layout_passes(graph: Graph, devices: Iterable[str], lint: bool) -> None:
    """The passes of static graphs that choose layouts for the devices' libraries."""
    if "cpu" in devices:
        channels_last_convs(graph)
        bmm_operands(graph)
        if lint:
            graph.lint()
    if aligned_matmul_outputs(graph) and lint:  # CUDA matmuls only
        graph.lint()


def fused_graph(gm: GraphModule, devices: Iterable[str]) -> Graph:
    """The graph a static compile of ``gm`` partitions into fusion groups (what a dump draws
    of a compile that the graph cache answered)."""
    graph, _ = _passes(gm, False, False)
    _layout_passes(graph, devices, False)
    return graph


def _compile_groups(gm, graph, constants, devices, launcher, shapes, t0, lint):
    """The fused graph's groups lowered to kernels, and the wrapper that calls them."""
    if shapes is None:
        _layout_passes(graph, devices, lint)
    groups = fusion.partition(graph, make_classifier(devices), reduction_dims)
    record.emit(record.Stage(name="passes", seconds=time.perf_counter() - t0))
    launches, seconds = [], []
    names: set[str] = set()
    for group in groups:
        t0 = time.perf_counter()
        launch = _lower(group, _unique(_kernel_name(group), names), launcher, shapes)
        if launch is not None:
            launches.append(launch)
            seconds.append(time.perf_counter() - t0)
    triton_pool.compile_ahead([launch for launch, _, _ in launches])  # CUDA graphs only
    new_graph, kernel_calls = _rebuild(graph, launches, shapes)
    if shapes is None:
        views_as_reinterprets(new_graph, _exact_outputs(kernel_calls), graph)
    for launch, s in zip(launches, seconds):  # recorded once all of them are used
        _record_kernel(launch, s)
    if lint:
        new_graph.lint()
    root = constants if constants is not None else gm.root
    wrapper = GraphModule(root, new_graph, class_name=getattr(gm, "class_name", "GraphModule"))
    fn = wrapper.forward_fn
    fn.framejit_kernels = [launcher for launcher, _, _ in launches]  # type: ignore[attr-defined]
    fn.framejit_graph = new_graph  # type: ignore[attr-defined]
    fn.framejit_fused_graph = graph  # after the passes: what the kernels' groups are made of
    if shapes is not None and shapes.relations:
        fn.framejit_size_relations = shapes.relations  # for the capture's size guard
    return fn


def _record_kernel(launch, seconds: float) -> None:
    launcher, _, group = launch
    kernel, names = launcher.kernel, [n.name for n in group.nodes]
    # The graph weakly, as the record holds what a compile made (a dump or a log reads the
    # lines at once; explain while the compiled function lives).
    graph = weakref.ref(group.nodes[0].graph)

    def lines() -> list[str]:
        g = graph()
        by_name = {} if g is None else {n.name: n for n in g.nodes}
        return [by_name[name].format() if name in by_name else f"%{name}" for name in names]

    record.emit(record.KernelCompiled(
        name=launcher.name, language=getattr(launcher, "language", ""), source=launcher.source,
        description=record.Later(lambda: str(kernel)), group=record.Later(lines),
        device=str(getattr(launcher, "device", "")), seconds=seconds))


def _unique(name: str, taken: set[str]) -> str:
    n, candidate = 1, name
    while candidate in taken:
        candidate = f"{name}_{n}"
        n += 1
    taken.add(candidate)
    return candidate


def _kernel_name(group: fusion.FusionGroup) -> str:
    kind = "red" if group.reduce_dims else "poi"
    words = []
    for node in group.nodes:
        word = getattr(node.target, "__name__", str(node.target)).split(".")[0].strip("_")
        if word and word not in words:
            words.append(word)
    return f"fj_{kind}_{'_'.join(words[:4])}"


def _lower(group: fusion.FusionGroup, name: str, make_launcher, shapes=None):
    try:
        lowered = lower_group(group.nodes, group.sizes, group.reduce_dims, name, shapes)
    except LoweringError:
        return None
    kernel = coalesce(lowered.kernel)
    device = _device_of(group.nodes[0])
    outputs = [(*lowered.layout(n), n.meta["val"].dtype) for n in lowered.outputs]
    if shapes is not None:
        arguments = {s.name for s in kernel.symbols()}
        used = {a for size, stride, _ in outputs for e in (*size, *stride) if isinstance(e, Sym)
                for a in e.atoms}
        if not used <= arguments:
            return None  # an output's size the kernel does not take (never seen: be safe)
    seed_index = lowered.inputs.index(None) if None in lowered.inputs else None
    try:
        launch = make_launcher(kernel, outputs, device, seed_index)
    except NotImplementedError:
        return None  # a renderer that cannot express this kernel: the group stays torch ops
    launch.fallback = GroupAsTorch(
        lambda: torch_function(group_graph(group, lowered), lowered.kernel.name,
                               predicted_layouts(lowered)), group, lowered)
    return launch, lowered, group


class GroupAsTorch:
    """The group's own torch ops as a function of the kernel's inputs: what runs if the kernel
    cannot be compiled on this device, or finds an input laid out unlike its prediction. Its
    generated Python is built (``make()``) on the first call: most kernels never need it, and
    building it (codegen and ``compile``) cost about a millisecond a kernel at every first
    call. ``group`` and ``lowered``: what it was made from (None where the graph cache made
    it)."""

    __slots__ = ("make", "group", "lowered", "fn")

    def __init__(self, make: Callable[[], Callable[..., Any]], group=None, lowered=None) -> None:
        self.make, self.group, self.lowered, self.fn = make, group, lowered, None

    def __call__(self, *inputs):
        if self.fn is None:
            self.fn = self.make()
        return self.fn(*inputs)


def _as_predicted(fn: Callable[..., Any], layouts: list) -> Callable[..., Any]:
    """``fn`` (a group's torch ops) with each output copied into the layout the kernel would
    have written where torch's differs: the wrapper's later kernels read a kernel's output
    without checking its strides (a max pooling computed channels-last, where torch's amax
    answers contiguous)."""
    def run(*inputs):
        result = fn(*inputs)
        outs = result if isinstance(result, tuple) else (result,)
        fixed = tuple(t if layout is None or layout_fits(t, *layout) else
                      torch.empty_strided(layout[0], layout[1], dtype=t.dtype,
                                          device=t.device).copy_(t)
                      for t, layout in zip(outs, layouts))
        return fixed if isinstance(result, tuple) else fixed[0]
    return run


def group_graph(group: fusion.FusionGroup, lowered) -> Graph:
    """The group's own torch ops as a graph of the kernel's inputs."""
    sub = Graph()
    env: dict[Node, Node] = {}
    for node in lowered.inputs:
        if node is not None:
            env[node] = sub.placeholder(node.name)
            env[node].meta = dict(node.meta)
    for node in group.nodes:
        env[node] = sub.node_copy(node, env.__getitem__)
    outs = [env[n] for n in lowered.outputs]
    sub.output(outs[0] if len(outs) == 1 else tuple(outs))
    return sub


def predicted_layouts(lowered) -> list:
    """(sizes, strides) of each output as the kernel writes it; None where they are symbolic
    (torch's layout is taken)."""
    layouts = [lowered.layout(n) for n in lowered.outputs]
    return [(tuple(size), tuple(stride)) if all(type(e) is int for e in (*size, *stride))
            else None for size, stride in layouts]


def torch_function(sub: Graph, name: str, layouts: list) -> Callable[..., Any]:
    """The function of a group's graph (:func:`group_graph`), each output in its predicted
    layout."""
    fn = GraphModule({}, sub, class_name=f"{name}_torch").forward_fn
    return _as_predicted(fn, layouts) if any(layouts) else fn


def _topological_by_key(users: dict, indegree: dict, key: dict) -> list:
    """The units in the topological order that always takes the ready unit of the smallest
    ``key`` (distinct keys: one order), as ``networkx.lexicographical_topological_sort``."""
    ready = [(key[u], n, u) for n, (u, d) in enumerate(indegree.items()) if d == 0]
    heapq.heapify(ready)
    tie = len(indegree)
    out = []
    while ready:
        _, _, u = heapq.heappop(ready)
        out.append(u)
        for w in users[u]:
            indegree[w] -= 1
            if indegree[w] == 0:
                tie += 1
                heapq.heappush(ready, (key[w], tie, w))
    if len(out) != len(indegree):
        raise RuntimeError("the fusion groups form a cycle")  # never: partition prevents it
    return out


def _rebuild(graph: Graph, launches: list, shapes=None) -> tuple[Graph, dict]:
    """``graph`` with each lowered group replaced by a call of its launcher, placed where its
    last node was; nodes that used a group value before that point move after it (a
    lexicographic topological order, so nothing moves across an in-place or random op). Also
    returns its kernel calls (call node -> launcher)."""
    unit_of: dict[Node, Any] = {}
    for k, (_, _, group) in enumerate(launches):
        for node in group.nodes:
            unit_of[node] = ("kernel", k)
    key: dict[Any, int] = {}  # unit -> the position of its last node (one unit each)
    users: dict[Any, set] = {}
    indegree: dict[Any, int] = {}
    for i, node in enumerate(graph.nodes):
        u = unit_of.get(node, node)
        key[u] = i
        if u not in indegree:
            indegree[u] = 0
            users[u] = set()
        for inp in node.all_input_nodes:
            v = unit_of.get(inp, inp)
            if v != u and u not in users[v]:
                users[v].add(u)
                indegree[u] += 1
    units = _topological_by_key(users, indegree, key)
    new = Graph()
    env: dict[Node, Node] = {}
    made: dict = {}  # size expression -> node of the new graph computing it
    kernel_calls: dict[Node, Any] = {}
    for u in units:
        if isinstance(u, Node):
            env[u] = new.node_copy(u, env.__getitem__)
            continue
        launcher, lowered, group = launches[u[1]]
        args = tuple(env[n] for n in lowered.inputs if n is not None)
        launcher.checked_inputs = {
            i: lowered.layout(n)
            for i, n in enumerate(n for n in lowered.inputs if n is not None)
            if not layout_is_exact(n, known=unit_of)}
        if launcher.kernel.symbols():
            # The run-time sizes, computed from the inputs' sizes before the launch.
            args += tuple(size_node(lowered.sizes[s.name], shapes, new, made, env.__getitem__)
                          for s in launcher.kernel.symbols())
        # The launch runs with capture off: Triton's Python (and the interpreter's) is never
        # offered to the frame hook.
        call = new.call_function(_C.CompiledFunction(launcher, None), args, name=launcher.name)
        kernel_calls[call] = launcher
        if len(lowered.outputs) == 1:
            (out,) = lowered.outputs
            call.meta = dict(out.meta)
            env[out] = call
        else:
            call.meta["device"] = lowered.outputs[0].meta.get("device")
            for i, out in enumerate(lowered.outputs):
                item = new.call_function(operator.getitem, (call, i), name=out.name)
                item.meta = dict(out.meta)
                env[out] = item
    donate_dead_inputs(kernel_calls)
    return new, kernel_calls


def _exact_outputs(kernel_calls: dict) -> set[Node]:
    """The wrapper's nodes holding kernel outputs allocated as their examples are laid out."""
    exact = set()
    for call, launcher in kernel_calls.items():
        items = [u for u in call.users if u.target is operator.getitem] \
            if len(launcher.outputs) > 1 else [call]
        for node in items:
            k = node.args[1] if node is not call else 0
            v = node.meta.get("val")
            size, stride, _ = launcher.outputs[k]
            if isinstance(v, torch.Tensor) and (tuple(v.shape), v.stride()) == \
                    (tuple(size), tuple(stride)):
                exact.add(node)
    return exact
