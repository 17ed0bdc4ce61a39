"""Debug dumps: everything about each compiled version of a function, as files a person reads.

With ``FRAMEJIT_DUMP=<dir>`` (or ``options={"dump_dir": ...}``) every capture writes, under
``<dir>/<function>/<n>/``:

* ``original_bytecode.txt`` and ``rewritten_bytecode.txt``: ``dis`` of the frame's code and of the
  trampoline that replaces it;
* ``entry.py``: the rewritten code as readable Python (the entry function the trampoline calls);
* ``graph.txt`` (one line per node, with shapes) and ``graph.py`` (the runnable generated code);
* ``rewritten.py``: the whole rewritten function as readable, runnable Python (guards, graph call,
  side effects, the native line at a graph break, resume calls: capture/readable/);
* ``guards.py``: the guard function checked before each call, one commented line per guard;
* with a kernel backend: ``wrapper.py`` (the graph as run: torch calls and kernel launches) and
  per generated kernel ``kernels/<name>.txt`` (its description) and ``kernels/<name>.py``;
and ``<dir>/<function>/reasons.log`` gathers why each recompile and fallback happened.
"""

from __future__ import annotations

import dis
import io
import os
import re


def _folder(dump_dir: str, code) -> str:
    name = re.sub(r"[^\w.-]+", "_", getattr(code, "co_qualname", code.co_name))
    return os.path.join(dump_dir, f"{name}")


def _dis(code) -> str:
    buf = io.StringIO()
    dis.dis(code, file=buf)
    return buf.getvalue()


def dump_entry(dump_dir: str, code, info, label: str) -> str:
    base = _folder(dump_dir, code)
    os.makedirs(base, exist_ok=True)
    n = sum(1 for d in os.listdir(base) if d.isdigit())
    folder = os.path.join(base, str(n))
    os.makedirs(folder, exist_ok=True)
    files = {
        "original_bytecode.txt": f"# {label}\n{_dis(code)}",
        "rewritten_bytecode.txt": _dis(info.trampoline),
        "entry.py": f"# The rewritten {code.co_name}(): the trampoline calls this.\n"
                    f"# ___kN names are constants (the compiled graph, globals dicts).\n"
                    f"{info.entry_source}",
        "guards.py": _rendered(info, "guards_source"),
        "rewritten.py": _rendered(info, "readable_source"),
    }
    if info.graph_module is not None:
        files["graph.txt"] = str(info.graph_module.graph) + "\n"
        files["graph.py"] = info.graph_module.code
    wrapper = getattr(info.compiled, "framejit_graph", None)
    if wrapper is not None:
        files["wrapper.py"] = wrapper.python_code("forward", self_arg=False).src
    for kernel in getattr(info.compiled, "framejit_kernels", ()):
        files[f"kernels/{kernel.name}.txt"] = str(kernel.kernel) + "\n"
        suffix = ".c" if getattr(kernel, "language", "python") == "c" else ".py"
        files[f"kernels/{kernel.name}{suffix}"] = kernel.source
    for name, text in files.items():
        path = os.path.join(folder, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    return folder


def _rendered(info, attr: str) -> str:
    try:
        return getattr(info, attr)
    except Exception as e:  # a rendering bug must not stop the capture that dumps
        return f"# framejit could not render this ({type(e).__name__}: {e})\n"


def dump_reason(dump_dir: str, code, kind: str, message: str) -> None:
    base = _folder(dump_dir, code)
    os.makedirs(base, exist_ok=True)
    with open(os.path.join(base, "reasons.log"), "a") as f:
        f.write(f"[{kind}] {code.co_filename}:{code.co_firstlineno}\n  " + message.replace("\n", "\n  ") + "\n")
