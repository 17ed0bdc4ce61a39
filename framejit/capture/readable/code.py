"""The rewritten function of a cache entry, rendered from its entry function's source: the
generated names replaced, comments added, and for a split frame the break (locals and stack put
back, the native line, the resume calls: native.py) in place of the entry's return."""

from __future__ import annotations

import ast
import builtins
import types
from typing import TYPE_CHECKING

from .. import compat
from .emit import NULL, Comment, Emitter, assign, name_node, names_in
from .names import ReadableNames, arg_names, ident, path_name, user_words
from .native import NativeRenderer

if TYPE_CHECKING:
    from . import FrameBreak

#: Temporaries of the entry function -> readable names.
_SPECIAL_TEMPS = {"___o": "graph_out", "___err": "error", "___saved": "saved_inputs",
                  "___rng": "random_state", "___ac": "autocast_before", "___grad": "grad_mode_before",
                  "___nerr": "error", "___failed": "number_failed"}


def entry_function(info):
    for const in info.trampoline.co_consts:
        if isinstance(const, types.FunctionType) and const.__code__.co_name.startswith("___entry_"):
            return const
    return None


class EntryRenderer:
    """The rewritten function of one cache entry, from its entry function's source."""

    def __init__(self, info, code: types.CodeType, names: ReadableNames):
        self.info = info
        self.code = code
        self.names = names
        self.brk: FrameBreak | None = info.frame_break
        self.f_globals = info.frame_globals
        self.params = arg_names(code)
        self.consts: dict[str, ast.expr] = {}
        self.renames: dict[str, str] = dict(self.params)
        self.resume_names: dict = {}
        self.load_comments: dict[str, str] = {}  # temporary -> the value it holds, in user terms
        self.rerun_keys: set = set()  # the constants that run the frame again as plain Python

    # names of the entry's constants and temporaries
    def name_objects(self) -> None:
        """Names for the objects the reader meets first (before the guards name them)."""
        names = self.names
        names.hint(types.FunctionType, "FunctionType", "types.FunctionType: a function from a code "
                   "object, globals, name, defaults and closure")
        compiled = self.info.compiled
        if compiled is not None:
            gm = self.info.graph_module
            n_ops = sum(1 for n in gm.graph.nodes if n.op.startswith("call")) if gm is not None else 0
            names.hint(compiled, "compiled_graph",
                       f"the compiled graph ({n_ops} operation{'s' if n_ops != 1 else ''}; graph.txt "
                       "and graph.py show it)")
        if self.f_globals is not None:
            names.hint(self.f_globals, "module_globals",
                       f"the globals of module {self.f_globals.get('__name__')}, where "
                       f"{self.code.co_name} is defined")
            # globals() called here would give the rendering's namespace.
            names.stand_in(builtins.globals, lambda g=self.f_globals: g, "module_globals_of",
                           "what globals() gives in the function: its module's globals")

    def _name_constants(self, entry) -> None:
        names = self.names
        ns = entry.__globals__ if entry is not None else {}
        for key, obj in ns.items():
            if key.startswith("___k"):
                if getattr(obj, "__qualname__", "").startswith("native_rerun."):
                    self.rerun_keys.add(key)
                    names.hint(obj, f"run_{ident(self.code.co_name)}_as_plain_python",
                               f"runs {self.code.co_name} again as plain Python: what happens when "
                               "the graph raises (framejit/capture/rerun.py)")
                self.consts[key] = ast.parse(names(obj), mode="eval").body

    def _name_loads(self, entry) -> None:
        loads = getattr(entry, "__framejit_loads__", {}) if entry is not None else {}
        for var, source in loads.items():
            who = user_words(source)
            new = self.names.unique(ident(path_name(source)))
            self.renames[var] = new
            self.load_comments[new] = who

    def render(self, fn_name: str) -> tuple[str, dict]:
        entry = entry_function(self.info)
        self._name_constants(entry)
        self._name_loads(entry)
        tree = ast.parse(self.info.entry_source)
        fn = tree.body[0]
        stmts = self._statements(fn.body)
        args = ", ".join(self.params.get(p, p) for p in compat.guard_param_names(self.code))
        em = Emitter()
        em.lines.append(f"def {fn_name}({args}):")
        em.lines.append(f'    """{self.code.co_name} as framejit rewrote it (this cache entry)."""')
        em.block(stmts, "    ")
        return "\n".join(em.lines) + "\n", self.resume_names

    # statements of the entry, renamed and commented
    def _statements(self, body: list) -> list:
        out: list = []
        # What each kind of generated temporary is, said before the first of them.
        said = {"___s": "Values from outside the frame, read before the graph runs and before any "
                        "write below.",
                "___r": "Containers the function built (rebuilt_N), made again after the graph.",
                "___n": "Numbers the function writes (new_number_N), computed before the graph "
                        "runs: one that raises (a division by a number now 0) makes the function "
                        "run again as plain Python, which raises it where eager does.",
                "___e": "Side effects, replayed after the graph as the function made them: every "
                        "new value first (new_value_N), then the writes."}
        for s in body:
            target = None
            if isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name):
                target = s.targets[0].id
            if target is not None and target[:4] in said:
                out.append(Comment(said.pop(target[:4])))
            if isinstance(s, ast.Try):
                out.extend(self._try(s))
                continue
            if isinstance(s, ast.If) and isinstance(s.test, ast.Name) and s.test.id == "___failed":
                # the rerun after a number raised (compile_entry's `early` block)
                (stmt,) = s.body
                call = stmt.exc.args[0] if isinstance(stmt, ast.Raise) else stmt.value
                out.append(ast.If(test=self._expr(s.test), orelse=[], body=[
                    Comment(f"A number raised: {self.code.co_name} runs again as plain Python "
                            "(rerun.py); its result is the result."),
                    ast.Return(value=self._expr(call))]))
                continue
            if isinstance(s, ast.If):
                s.test = self._expr(s.test)
                s.body = self._statements(s.body)
                s.orelse = self._statements(s.orelse)
                out.append(s)
                continue
            if isinstance(s, ast.Return) and self.brk is not None and isinstance(s.value, ast.Tuple):
                out.extend(self._at_break(s.value))
                continue
            if isinstance(s, ast.Raise) and self._is_native_result(s.exc):
                out.append(Comment(f"The graph raised: {self.code.co_name} ran again as plain Python "
                                   "(rerun.py); its result is the result."))
                out.append(ast.Return(value=self._expr(s.exc.args[0])))
                continue
            if isinstance(s, ast.Return) and self._is_rerun(s.value):
                out.append(Comment(f"The graph raised: run {self.code.co_name} again as plain Python "
                                   "(rerun.py), so that what eager raises or returns comes out."))
            out.append(self._stmt(s))
            self._comment_after(target, out)
        return out

    def _try(self, s: ast.Try) -> list:
        s.body = self._statements(s.body)
        for h in s.handlers:
            if h.type is not None:
                h.type = self._expr(h.type)
            said = None
            if h.name == "___err":
                said = Comment("The graph raised. An exception a signal handler raised meanwhile (a "
                               "timeout) goes on as it is; any other: see below the try.")
            if h.name:
                h.name = self._rename(h.name)
            h.body = ([said] if said else []) + self._statements(h.body)
        s.orelse = self._statements(s.orelse)
        s.finalbody = self._statements(s.finalbody)
        return [s]

    def _comment_after(self, target: str | None, out: list) -> None:
        if target is not None:
            if target == "___o":
                inputs = [ast.unparse(a) for a in out[-1].value.args] if isinstance(out[-1].value, ast.Call) else []
                outputs = self.renames.get("___o", "graph_out")
                out.append(Comment(f"the compiled graph ({outputs}: its outputs)"
                                   + (f"; inputs: {', '.join(inputs)}" if inputs else ""), eol=True))
            elif target.startswith("___s"):
                new = self.renames.get(target, target)
                out.append(Comment(self.load_comments.get(new, ""), eol=True))

    def _is_native_result(self, node) -> bool:
        from ..resume import NativeResult
        return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
            and node.func.id in self.consts and self.names.namespace.get(
                ast.unparse(self.consts[node.func.id])) is NativeResult and len(node.args) == 1

    def _is_rerun(self, node) -> bool:
        return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
            and node.func.id in self.rerun_keys

    def _rename(self, n: str) -> str:
        new = self.renames.get(n)
        if new is None:
            if n in _SPECIAL_TEMPS:
                new = self.names.unique(_SPECIAL_TEMPS[n])
            elif n.startswith("___e"):
                new = self.names.unique(f"new_value_{n[4:]}")
            elif n.startswith("___n") and n[4:].isdigit():
                new = self.names.unique(f"new_number_{n[4:]}")
            elif n.startswith("___r"):
                new = self.names.unique(f"rebuilt_{n[4:]}")
            else:
                return n
            self.renames[n] = new
        return new

    def _expr(self, node):
        return _Rename(self).visit(node)

    def _stmt(self, s):
        return _Rename(self).visit(s)

    # -- the break -------------------------------------------------------------------------------
    def _at_break(self, values: ast.Tuple) -> list:
        brk = self.brk
        out: list = []
        exprs = [self._expr(e) for e in values.elts]
        n_locals = len(brk.local_names)
        line = break_line(brk)
        targets: list[tuple[str, ast.expr]] = []
        for local, e in zip(brk.local_names, exprs[:n_locals]):
            name = compat.py_name(local)
            if not (isinstance(e, ast.Name) and e.id == name):
                targets.append((name, e))
        stack: list = []
        stack_values = iter(exprs[n_locals:])
        for slot, marker in enumerate(brk.markers):
            if marker == "NULL":
                stack.append(NULL)
                continue
            e = next(stack_values)
            if marker == "ITER":
                e = ast.Call(func=name_node("iter"), args=[e], keywords=[])
            if marker != "ITER" and slot not in brk.exit_slots and self._constant(e):
                stack.append(e)
                continue
            name = self.names.unique(f"stack_{slot}")
            targets.append((name, e))
            stack.append(name_node(name))
        if targets:
            out.append(Comment(f"The frame as it is at the graph break (line {line}): its locals, and "
                               "the values the interrupted line was working on (stack_N)."))
            assigned = {t for t, _ in targets}
            if any(names_in(e) & assigned for _, e in targets):
                out.append(ast.Assign(targets=[ast.Tuple(elts=[name_node(t, ast.Store()) for t, _ in targets],
                                                         ctx=ast.Store())],
                                      value=ast.Tuple(elts=[e for _, e in targets], ctx=ast.Load()),
                                      lineno=0))
            else:
                out.extend(assign(t, e) for t, e in targets)
            for slot in brk.exit_slots:
                out.append(Comment(f"stack_{slot}: the __exit__ of a `with` block around line {line}"))
        out.extend(NativeRenderer(self, stack, line).render())
        return out

    def _constant(self, e) -> bool:
        """Whether ``e`` names only constants (a literal, ``print``, ``torch.relu``)."""
        if isinstance(e, ast.Constant):
            return True
        local = set(self.renames.values()) | set(map(compat.py_name, self.code.co_varnames))
        return all(n.id not in local and n.id != "graph_out" for n in ast.walk(e) if isinstance(n, ast.Name)) \
            and all(isinstance(n, (ast.Name, ast.Attribute, ast.Load, ast.Constant)) for n in ast.walk(e))

    def _base_name(self) -> str:
        base = self.brk.base
        return base.co_name if base is not None else self.code.co_name

    def resume_name(self, resume) -> str:
        code = resume if isinstance(resume, types.CodeType) else resume.__code__
        line = code.co_name.rsplit("_", 1)[-1]
        for name, obj in self.resume_names.items():
            if obj is resume:
                return name
        again = " (this same resume function: the loop's next turn)" if code is self.code else ""
        name = self.names.hint(resume, ident(code.co_name),
                               f"the rest of {self._base_name()} from line {line}{again}: the "
                               "original code from there, captured on its first call (its own "
                               "rendering: resume_sources)" + (" (a code object: it needs this frame's closure)"
                                                    if isinstance(resume, types.CodeType) else ""))
        self.resume_names[name] = resume
        return name


class _Rename(ast.NodeTransformer):
    def __init__(self, r: EntryRenderer):
        self.r = r

    def visit_Name(self, node):
        if node.id in self.r.consts:
            return ast.copy_location(self.r.consts[node.id], node)
        node.id = self.r._rename(node.id)
        return node


def break_line(brk: FrameBreak) -> int | None:
    for inst in brk.plan.native:
        if inst.lineno:
            return inst.lineno
    return None

