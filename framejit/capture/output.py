"""The output of one capture: the graph, its inputs, its guards, and the code that runs it.

For a frame captured whole, the rewritten code object is a thin *trampoline* with the frame's own
signature: it passes the frame's argument slots to a generated *entry function*, which loads the
graph's inputs from their sources (``self._modules['fc']._parameters['weight']``), calls the
compiled graph, and rebuilds the frame's return value. The entry function is plain readable Python
(it is what the dumps show as "the rewritten code"); the trampoline exists only because the C hook
runs a code object in the caller's frame.
"""

from __future__ import annotations

import dis
import linecache
import operator
import re
import types

import torch
from bytecode import UNSET, Bytecode, CellVar, FreeVar, Instr

from .. import _C, diskcache
from ..errors import Unsupported
from ..fx_ir import Graph, GraphModule
from ..fx_ir.graph_module import NumberPool
from . import compat
from . import rerun as rerun_mod
from .assemble import to_code
from .examples import meta_from_real
from .guards import GuardSet
from .resume import NativeResult
from .side_effects import SideEffects
from .sources import ConstNames, Source, SourceLoader
from .values.contexts import autocast_enter, autocast_exit, autocast_state, restore_autocast_state
from .values.tensor import TensorValue

_entry_numbers = NumberPool()  # ___entry_N: see NumberPool

#: Graph calls that switch global state, which the entry function puts back if the graph raises.
_STATE_SWITCHES = frozenset({torch._C._set_grad_enabled, autocast_enter, autocast_exit})


class OutputGraph:
    def __init__(self, options):
        self.options = options
        self.graph = Graph()
        self.guards = GuardSet()
        #: (source, real tensor, placeholder) for each graph input, in placeholder order.
        self.inputs: list[tuple[Source, torch.Tensor, object]] = []
        self._real_inputs: dict = {}  # placeholder node -> the real tensor behind it
        #: source key -> the value wrapped for it (one value per source).
        self.source_values: dict = {}
        #: id(object) -> (object, value) for mutable objects from outside (one value each).
        self.mutable_values: dict = {}
        #: (class, name, found) of the class dict entries guarded so far (attributes.guarded_find).
        self.class_lookups: set = set()
        #: id of a tensor from outside used by identity -> the sources it was read from
        self.identity_keys: dict = {}
        #: get_attr name -> constant tensor held by the graph module.
        self.constants: dict[str, torch.Tensor] = {}
        #: Grad mode when capture started; the graph may switch it (``with torch.no_grad()``).
        self.initial_grad_mode = torch.is_grad_enabled()
        self.switches_grad_mode = False
        #: The graph may end in another grad mode because a `with` block spans the frame's
        #: edge: a graph break inside it, or a resume function leaving one its caller entered.
        self.grad_mode_handover = False
        #: (source, mode it restores) of the grad-mode blocks entered before this frame.
        self.outside_grad_exits: list = []
        #: The autocast state when capture started, once the graph enters an autocast block.
        self.initial_autocast: tuple | None = None
        #: How many autocast blocks the frame has entered and not yet left.
        self.autocast_depth = 0
        #: The graph may end with autocast still on: a break inside an autocast block, or a
        #: resume function leaving one its caller entered (sources of those exits).
        self.autocast_handover = False
        self.outside_autocast_exits: list = []
        #: Fake tensors for ops under autocast (created on first use).
        self.fake_mode = None
        #: The symbolic sizes of this capture (shapes.ShapeContext), once an input has one.
        self.shapes = None
        #: The frame's sizes seen so far (automatic dynamic shapes, see shapes.dynamic_dims);
        #: None, or with ``static_only``, keeps every size static.
        self.size_memory: dict | None = None
        self.static_only = False
        #: Writes to the world outside the frame, replayed after the graph.
        self.side_effects = SideEffects()
        #: (source key, name, method) -> (side-effect version, value): what an inlined
        #: ``__getattribute__`` of an outside object found (see UserObjectValue.getattr)
        self.getattribute_memo: dict = {}
        #: id of a globals dict -> (the dict, names the frame read from builtins through it)
        self.builtins_read: dict = {}
        #: The globals of the captured frame's function (to run it again if its graph raises).
        self.f_globals: dict | None = None

    def note_identity_key(self, t: TensorValue, real: torch.Tensor) -> None:
        """A tensor from outside used by identity (a set member, ``named_parameters``' memo):
        which of these are one object is guarded when the capture ends."""
        sources = self.identity_keys.setdefault(id(real), [])
        if all(s.key != t.source.key for s in sources):
            sources.append(t.source)

    def note_builtin(self, globals_dict: dict, name: str) -> None:
        """The frame used the builtin ``name``, not being a global of ``globals_dict``."""
        self.builtins_read.setdefault(id(globals_dict), (globals_dict, set()))[1].add(name)

    def _guard_builtins(self) -> None:
        from .guards import NotShadowedGuard
        from .sources import ObjectSource

        for globals_dict, names in self.builtins_read.values():
            self.guards.add(NotShadowedGuard(ObjectSource(globals_dict), frozenset(names)))

    def _guard_identity_keys(self) -> None:
        from .guards import AliasGuard, DistinctGuard
        groups = list(self.identity_keys.values())
        for sources in groups:
            for other in sources[1:]:
                self.guards.add(AliasGuard(sources[0], other, True))
        if len(groups) > 1:
            self.guards.add(DistinctGuard([sources[0] for sources in groups]))

    def _guard_written_objects_distinct(self) -> None:
        """An object the capture writes to was a different object from every other object of
        its type read from outside; if a later call passes one object for both (``f(a, a)``),
        the recorded writes and reads would no longer line up, so that call recompiles."""
        from .guards import AliasGuard

        written = {id(v): v for v in self.side_effects.written_objects() if v.source is not None}
        if not written:
            return
        others = [v for _, v in self.mutable_values.values() if v.source is not None]
        for w in written.values():
            for v in others:
                if v is not w and v.python_type() is w.python_type():
                    self.guards.add(AliasGuard(w.source, v.source, False))

    def note_autocast(self) -> None:
        """Called before the graph first enters an autocast block (which also switches the
        state for real while capturing)."""
        if self.initial_autocast is None:
            self.initial_autocast = autocast_state()

    def set_grad_mode(self, enabled: bool) -> None:
        """Switch grad mode for real while capturing (so meta results match eager) and note that
        the graph switches it."""
        torch._C._set_grad_enabled(enabled)
        self.switches_grad_mode = True

    def restore_global_state(self) -> None:
        """After capture, successful or not: grad mode as it was."""
        if self.switches_grad_mode:
            torch._C._set_grad_enabled(self.initial_grad_mode)
        if self.initial_autocast is not None:
            restore_autocast_state(self.initial_autocast)

    # -- graph inputs ---------------------------------------------------------------------------
    def _first_non_placeholder(self):
        for n in self.graph.nodes:
            if n.op != "placeholder":
                return n
        return None

    def add_input(self, tensor: torch.Tensor, source: Source) -> TensorValue:
        from .guards import DynamicTensorGuard, TensorGuard

        if type(tensor) is not torch.Tensor and type(tensor) is not torch.nn.Parameter:
            # A subclass's methods and __torch_function__ decide what each torch call on it does
            # and returns; a graph of torch's own ops (and fused kernels) would not.
            raise Unsupported(f"the tensor {source.name()} of the subclass {type(tensor).__qualname__} "
                              "(its methods and __torch_function__ may change what torch calls do)",
                              "pass a plain tensor (x.as_subclass(torch.Tensor)), or compile the "
                              "code that runs on plain tensors")
        name = _identifier(source.name())
        anchor = self._first_non_placeholder()
        if anchor is not None:
            with self.graph.inserting_before(anchor):
                node = self.graph.placeholder(name)
        else:
            node = self.graph.placeholder(name)
        fake = self._symbolic_example(tensor, source)
        if fake is not None:
            node.meta["val"] = fake
            dims = tuple(d for d, n in enumerate(fake.shape) if isinstance(n, torch.SymInt))
            node.meta["dynamic_dims"] = dims
            self.guards.add(DynamicTensorGuard(source, tensor, dims))
        else:
            node.meta["val"] = meta_from_real(tensor)
            self.guards.add(TensorGuard(source, tensor))
        node.meta["device"] = tensor.device
        node.meta["type"] = type(tensor)
        node.meta["source"] = source.name()
        node.meta["is_leaf"] = tensor.is_leaf
        node.meta["negative"] = tensor.is_neg()  # (meta values carry no negative bit)
        self.inputs.append((source, tensor, node))
        self._real_inputs[node] = tensor
        return TensorValue(node, source)

    def _symbolic_example(self, tensor: torch.Tensor, source: Source):
        """A fake example with symbolic sizes for an input whose sizes are dynamic, else None."""
        from .shapes import ShapeContext, dynamic_dims

        if self.static_only:
            return None
        dims = dynamic_dims(self.options.dynamic, self.size_memory, tensor, source)
        if not dims:
            return None
        if self.shapes is None:
            if self.fake_mode is not None:
                return None  # examples already run on fake tensors without symbols (autocast)
            self.shapes = ShapeContext()
            self.fake_mode = self.shapes.mode
        return self.shapes.fake_input(tensor, source, dims)

    def real_input(self, t: TensorValue):
        """The real tensor behind a graph input read from outside (None for other tensors)."""
        if t.source is None or t.node.op != "placeholder":
            return None
        return self._real_inputs.get(t.node)

    def alias(self, a: TensorValue, b: TensorValue) -> bool:
        """``a is b`` for two graph inputs, guarded."""
        from .guards import AliasGuard

        same = self._real_inputs[a.node] is self._real_inputs[b.node]
        self.guards.add(AliasGuard(a.source, b.source, same))
        return same

    def add_constant_tensor(self, tensor: torch.Tensor) -> TensorValue:
        name = f"_tensor_constant{len(self.constants)}"
        self.constants[name] = tensor
        node = self.graph.get_attr(name)
        node.meta["val"] = meta_from_real(tensor)
        node.meta["device"] = tensor.device
        return TensorValue(node)

    # -- finishing ------------------------------------------------------------------------------
    def compile_entry(self, values: list, code: types.CodeType, compile_graph, label: str,
                      as_tuple: bool = False):
        """Build the compiled graph and the entry function. ``compile_graph(gm, example_inputs)``
        is the compile pipeline the API handed over (framejit.compiler): capture ends with the
        finished graph and its example inputs, and never imports passes or backends. The entry returns ``values[0]``, or,
        with ``as_tuple``, the tuple of all ``values`` (a graph break's locals and stack)."""
        argnames = compat.guard_param_names(code)
        lines = []
        cg = EntryCodegen(argnames, lines)
        exprs = [v.reconstruct(cg) for v in values]
        early, replay = self.side_effects.replay_lines(cg)
        if early:
            # Numbers the frame writes, computed before anything happens: if one raises (a
            # division by a number now 0), the frame runs again as plain Python, which raises
            # it after the side effects before it, as eager does.
            lines += ["___failed = False", "try:", *(f"    {line}" for line in early),
                      "except Exception as ___nerr:",
                      f"    if {cg.const_name(rerun_mod.raised_by_signal_handler)}(___nerr): raise",
                      "    ___failed = True",
                      "if ___failed:",
                      f"    {self._run_again(cg, code, argnames, as_tuple)}"]
        self._guard_written_objects_distinct()
        self._guard_identity_keys()
        self._guard_builtins()
        if as_tuple:
            ret = "(" + "".join(e + ", " for e in exprs) + ")"
        else:
            (ret,) = exprs
        graph = self.graph
        if self.switches_grad_mode and torch.is_grad_enabled() != self.initial_grad_mode \
                and not self.grad_mode_handover:
            raise Unsupported("a grad mode change that outlives the compiled function "
                              "(torch.set_grad_enabled() outside a `with`)",
                              "use `with torch.no_grad():` inside, or switch grad mode before the call")
        if self.initial_autocast is not None and autocast_state() != self.initial_autocast \
                and not self.autocast_handover:
            raise Unsupported("an autocast state change that outlives the compiled function",
                              "use `with torch.autocast(...):` inside, or switch autocast before the call")
        # A graph with no output still runs when it holds operations: they may change tensors
        # in place, or raise as they would in eager.
        has_graph = bool(cg.graph_outputs) or any(
            n.op in ("call_function", "call_method", "call_module") for n in graph.nodes)
        gm = compiled = None
        rerun_call = None
        if has_graph:
            graph.output(tuple(cg.graph_outputs))
            if self.shapes is not None:
                self.shapes.finish_graph(self)
            _keep_unused_operations(graph)
            graph.eliminate_dead_code()
            self._prune_unused_inputs()
            if self.options.lint:
                graph.lint()
            gm = GraphModule(self.constants, graph)
            # Kernels for symbolic sizes may need relations between them (a slice of 8 needs
            # s0 >= 8): the compiler hands them back and they join this entry's size guard.
            gm.accepts_size_relations = self.shapes is not None
            example_inputs = [t for _, t, _ in self.inputs]
            compiled = compile_graph(gm, example_inputs)
            call_args = ", ".join(cg.source_expr(src) for src, _, _ in self.inputs)
            call = f"{cg.const_name(compiled)}({call_args})"
            calls: list[str] = []
            if self.initial_autocast is not None:
                # The graph enters autocast blocks: if it raises inside one, leave it.
                # Blocks the caller entered (a resume function inside them) are left too, as
                # the exception would leave them in eager; innermost first.
                calls.append(f"___ac = {cg.const_name(autocast_state)}()")
                outside = sorted(self.outside_autocast_exits, key=_stack_slot, reverse=True)
                exits = "".join(f"{cg.source_expr(src)}, " for src in outside)
                call = (f"{cg.const_name(_call_restoring_autocast)}(___ac, ({exits}), "
                        f"{cg.const_name(compiled)}, {call_args})")
            if self.switches_grad_mode:
                # The graph switches grad mode (and back, unless a `with` block spans a break);
                # if it raises half-way, grad mode is left as the `with` blocks' exits would.
                if self.outside_grad_exits:
                    outermost = min(self.outside_grad_exits, key=lambda e: _stack_slot(e[0]))
                    restore = repr(outermost[1])
                else:
                    calls.append(f"___grad = {cg.const_name(torch.is_grad_enabled)}()")
                    restore = "___grad"
                calls += ["try:", f"    ___o = {call}", "except BaseException:",
                          f"    {cg.const_name(torch._C._set_grad_enabled)}({restore})", "    raise"]
            else:
                calls.append(f"___o = {call}")
            plan = self._rerun_plan(graph)
            if plan is not None:
                # If the graph raises, run the frame again as plain Python (see rerun.py), so
                # the user's `try` and every side effect before the failing operation are as
                # in eager; first put back what the graph changed.
                saved = ", ".join(cg.source_expr(self._source_of(n)) for n in plan.saved)
                undo = []
                if self.switches_grad_mode or self.grad_mode_handover or self.outside_grad_exits:
                    # The plain run starts from the grad mode the frame had on entry (the graph
                    # call's own handler leaves it as the blocks' exits would).
                    lines.append(f"___grad0 = {cg.const_name(torch.is_grad_enabled)}()")
                    undo.append(f"    {cg.const_name(torch._C._set_grad_enabled)}(___grad0)")
                if plan.saved:
                    lines.append(f"___saved = {cg.const_name(rerun_mod.save_inputs)}({saved})")
                    undo.append(f"    {cg.const_name(rerun_mod.restore_inputs)}(___saved, ({saved},))")
                if plan.random:
                    lines.append(f"___rng = {cg.const_name(rerun_mod.RandomState)}()")
                    undo.append("    ___rng.restore()")
                # Run again after the `except` block, so that an error of the plain run is not
                # shown as raised "during handling" of the graph's.
                rerun_call = self._run_again(cg, code, argnames, as_tuple)
                calls = ["try:", *(f"    {line}" for line in calls), "except Exception as ___err:",
                         f"    if {cg.const_name(rerun_mod.raised_by_signal_handler)}(___err): raise",
                         *undo, "else:"]
            lines.extend(calls)
        if self.shapes is not None:
            self.guards.size_guard = self.shapes.guard(
                getattr(compiled, "framejit_size_relations", ()) if gm is not None else ())
        # Rebuilt containers use graph outputs, so they come after the graph call; then the
        # writes to the world outside, in the order the function made them.
        tail = [*cg.post_lines, *replay, f"return {ret}"]
        if rerun_call is not None:
            tail = [f"    {line}" for line in tail] + [rerun_call]
        lines.extend(tail)
        number = _entry_numbers.take()
        fn_name = f"___entry_{number}"
        body = "\n    ".join(lines)
        src = f"def {fn_name}({', '.join(argnames)}):\n    {body}\n"
        filename = f"<framejit-entry {label}>"
        linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
        namespace = dict(cg.names.namespace)
        exec(diskcache.compiled(src, filename), namespace)
        entry = namespace[fn_name]
        _entry_numbers.give_back_when_dead(entry, number)
        entry.__framejit_loads__ = cg.source_expr.sources  # for capture/readable/
        _C.set_code_mode(entry.__code__, _C.MODE_SKIP)
        return entry, src, gm, compiled

    def _run_again(self, cg, code, argnames, as_tuple: bool) -> str:
        """The entry's statement that runs the frame again as plain Python and hands over its
        result: returned, or raised as a NativeResult for a graph break's resume (``as_tuple``)."""
        again = f"{cg.const_name(rerun_mod.native_rerun(code, self.f_globals))}({', '.join(argnames)})"
        return f"raise {cg.const_name(NativeResult)}({again})" if as_tuple else f"return {again}"

    def _rerun_plan(self, graph):
        """How to run the frame again as plain Python if the graph raises (rerun.py), or None:
        not when autocast blocks span the frame's edge (a graph break inside them), nor where
        the failed graph cannot be undone. Grad-mode blocks may: the rerun starts from the
        frame's grad mode on entry."""
        if self.autocast_handover or self.outside_autocast_exits or self.f_globals is None:
            return None
        return rerun_mod.plan(graph, lambda target: target in _STATE_SWITCHES, self._same_memory)

    def _same_memory(self, a, b) -> bool:
        """Whether two graph inputs share memory in the call being captured."""
        ra, rb = self._real_inputs.get(a), self._real_inputs.get(b)
        if ra is None or rb is None or ra.device != rb.device:
            return False
        try:
            return ra.untyped_storage().data_ptr() == rb.untyped_storage().data_ptr()
        except RuntimeError:  # a tensor without storage (sparse, a subclass)
            return False

    def _source_of(self, placeholder):
        return next(src for src, _, node in self.inputs if node is placeholder)

    def _prune_unused_inputs(self):
        alive = set()
        for node in list(self.graph.nodes):
            if node.op == "placeholder":
                if node.users:
                    alive.add(node)
                else:
                    self.graph.erase_node(node)
        self.inputs = [entry for entry in self.inputs if entry[2] in alive]


class EntryCodegen:
    """Renders values as Python expressions of the entry function."""

    def __init__(self, argnames, lines: list[str]):
        self.names = ConstNames("___k")
        self.graph_outputs: list = []
        self._out_index: dict = {}
        self.source_expr = SourceLoader(self.names, argnames, lines, prefix="___s", snapshot=True)
        #: Assignments of rebuilt mutable objects, run after the graph.
        self.post_lines: list[str] = []
        self._shared: dict[int, str] = {}

    def has_shared(self, value) -> bool:
        return id(value) in self._shared

    def shared(self, value, build) -> str:
        """A name for ``value`` rebuilt once by ``build()`` (an expression), so that every place
        that refers to one mutable object (a list on the stack and in a local) gets the same one."""
        name = self._shared.get(id(value))
        if name is None:
            expr = build()
            name = f"___r{len(self._shared)}"
            self._shared[id(value)] = name
            self.post_lines.append(f"{name} = {expr}")
        return name

    def shared_innermost_first(self, roots, below, build) -> None:
        """Each of ``roots``, and each value under them that ``below(value)`` lists, rebuilt
        once into a local by ``build(value)``, the values below first and without recursion:
        then each expression names the locals of what it holds (``shared`` finds them), so a
        value built from itself in a loop stays short however deep it nests."""
        pending = [(value, False) for value in roots]
        while pending:
            value, ready = pending.pop()
            if self.has_shared(value):
                continue
            if ready:
                self.shared(value, lambda v=value: build(v))
            else:
                pending.append((value, True))
                pending.extend((v, False) for v in reversed(below(value)))

    def const_name(self, obj) -> str:
        return self.names(obj)

    def literal(self, value) -> str:
        if value is None or type(value) in (bool, int, str):
            return repr(value)
        if type(value) is float and value == value and value not in (float("inf"), float("-inf")):
            return repr(value)
        return self.names(value)

    def expr(self, value) -> str:
        return value.reconstruct(self)

    def graph_output(self, tv: TensorValue) -> str:
        node = tv.node
        if node.op == "placeholder" and tv.source is not None:
            return self.source_expr(tv.source)
        i = self._out_index.get(node)
        if i is None:
            i = len(self.graph_outputs)
            self.graph_outputs.append(node)
            self._out_index[node] = i
        return f"___o[{i}]"


def make_trampoline(code: types.CodeType, entry) -> types.CodeType:
    """A code object with ``code``'s signature, cells and free variables whose body is
    ``return entry(<argument slots>)``.

    Only the prefix CPython runs before the body (``MAKE_CELL``, ``COPY_FREE_VARS``, up to
    ``RESUME``) is read from ``code``: parsing a whole long ``forward`` with the bytecode library
    cost milliseconds of a first call."""
    lineno = code.co_firstlineno
    prefix = []
    for ins in dis.get_instructions(code):
        if ins.opname == "MAKE_CELL":
            arg = CellVar(ins.argval)
        elif ins.opname in ("COPY_FREE_VARS", "RESUME"):
            arg = ins.arg
        else:  # a generator's RETURN_GENERATOR, POP_TOP
            arg = UNSET if ins.arg is None else ins.arg
        prefix.append(Instr(ins.opname, arg, lineno=lineno))
        if ins.opname == "RESUME":
            break
    bc = Bytecode()
    bc.argcount = code.co_argcount
    bc.posonlyargcount = code.co_posonlyargcount
    bc.kwonlyargcount = code.co_kwonlyargcount
    bc.name = code.co_name
    bc.qualname = code.co_qualname
    bc.filename = code.co_filename
    bc.flags = code.co_flags
    bc.first_lineno = lineno
    bc.argnames = list(compat.arg_slot_names(code))
    bc.cellvars = list(code.co_cellvars)
    bc.freevars = list(code.co_freevars)
    cells = set(code.co_cellvars)
    names = bc.argnames
    body = prefix
    if compat.PY313:
        body += [Instr("LOAD_CONST", entry, lineno=lineno), Instr("PUSH_NULL", lineno=lineno)]
    else:
        body += [Instr("PUSH_NULL", lineno=lineno), Instr("LOAD_CONST", entry, lineno=lineno)]
    for name in names:
        if name in cells:
            body.append(Instr("LOAD_DEREF", CellVar(name), lineno=lineno))
        else:
            body.append(Instr("LOAD_FAST", name, lineno=lineno))
    for name in code.co_freevars:
        body.append(Instr("LOAD_CLOSURE", FreeVar(name), lineno=lineno))
    nargs = len(names) + len(code.co_freevars)
    if compat.PY311:
        body.append(Instr("PRECALL", nargs, lineno=lineno))
    body.append(Instr("CALL", nargs, lineno=lineno))
    body.append(Instr("RETURN_VALUE", lineno=lineno))
    bc.extend(body)
    return to_code(bc)


def _keep_unused_operations(graph) -> None:
    """The program computed these values and never used them, but eager would still raise if
    one of them failed (``c = torch.linalg.cholesky(a)`` with ``c`` unused): keep them. Only
    picking an item of an operation's tuple result is dropped when unused."""
    for node in graph.nodes:
        if node.op in ("call_function", "call_method", "call_module") and not node.users:
            tuple_item = node.target is operator.getitem and node.args \
                and isinstance(getattr(node.args[0], "meta", {}).get("val"), (tuple, list))
            if not tuple_item:
                node.meta["keep"] = True


def _identifier(name: str) -> str:
    s = re.sub(r"\W+", "_", name).strip("_")
    if not s or s[0].isdigit():
        s = "t_" + s
    return s


def _call_restoring_autocast(state, outside_exits, compiled, *args):
    """Used by entry functions: run a graph that enters or leaves autocast blocks; if it
    raises, put the autocast state back as it was before the graph, then leave the blocks the
    caller entered, as the exception would in eager."""
    try:
        return compiled(*args)
    except BaseException:
        restore_autocast_state(state)
        for exit_ in outside_exits:
            exit_()
        raise


def _stack_slot(source) -> int:
    """The stack position a resume function's parameter came from (outer blocks are lower)."""
    local = getattr(source, "local", "")
    return int(local[len("___stack"):]) if local.startswith("___stack") else 1 << 30
