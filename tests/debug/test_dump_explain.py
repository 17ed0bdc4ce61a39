"""Debug dumps and framejit.explain: what a user reads when something goes wrong.

The acceptance case: a function with two graph breaks and one recompile, each dump file and each
field of the explain report checked against what happened."""

import inspect
import json
import os
import runpy

import pytest
import torch

import framejit

SCALE = 2.0


def scaled(x, w):
    return torch.relu(x @ w) * SCALE


def two_breaks(x, w):
    h = torch.relu(x @ w)
    print("first")
    h = h + 1
    print("second")
    return h.sum(0) * SCALE


def _line(fn, text: str) -> int:
    lines, start = inspect.getsourcelines(fn)
    (offset,) = [i for i, line in enumerate(lines) if text in line]
    return start + offset


FIRST = _line(two_breaks, 'print("first")')
SECOND = _line(two_breaks, 'print("second")')
RESUME1 = f"two_breaks_resume_at_line_{FIRST}"
RESUME2 = f"two_breaks_resume_at_line_{SECOND}"


def _run_two_breaks(call):
    """Call twice; between the calls SCALE changes, which only the last part reads: one recompile."""
    global SCALE
    x, w = torch.randn(3, 4), torch.randn(4, 5)
    try:
        SCALE = 2.0
        first = call(x, w)
        SCALE = 3.0
        second = call(x, w)
    finally:
        SCALE = 2.0
    expected = (torch.relu(x @ w) + 1).sum(0)
    torch.testing.assert_close(first, expected * 2.0)
    torch.testing.assert_close(second, expected * 3.0)
    return x, w


def _run_folder(dump_dir) -> str:
    latest = (dump_dir / "latest").read_text().strip()
    assert [p.name for p in dump_dir.iterdir() if p.is_dir()] == [latest]
    return dump_dir / latest


def test_dump_of_two_breaks_and_a_recompile(tmp_path, capsys):
    compiled = framejit.compile(two_breaks, backend="eager", options={"dump_dir": str(tmp_path)})
    _run_two_breaks(compiled)
    capsys.readouterr()
    run = _run_folder(tmp_path)
    assert sorted(p.name for p in run.iterdir()) == ["index.md", "record.json", "two_breaks"]
    fn = run / "two_breaks"
    versions = {"two_breaks/0", f"{RESUME1}/0", f"{RESUME2}/0", f"{RESUME2}/1"}
    found = {f"{frame.name}/{v.name}" for frame in fn.iterdir() if frame.is_dir() for v in frame.iterdir()}
    assert found == versions
    for v in versions:
        assert sorted(os.listdir(fn / v)) == ["entry.py", "graph.py", "graph.txt", "guards.py",
                                             "original_bytecode.txt", "readable.py",
                                             "rewritten_bytecode.txt"]
        readable = (fn / v / "readable.py").read_text()
        assert "def rewritten_" in readable and "___k" not in readable

    # The first frame: the matmul and relu, then the break at print("first").
    first = fn / "two_breaks" / "0"
    graph = (first / "graph.txt").read_text()
    assert "torch.relu" in graph and "f32[3, 5]" in graph and "f32[3, 4]" in graph
    original = (first / "original_bytecode.txt").read_text()
    assert f"{FIRST}  " in original and "LOAD_GLOBAL" in original and "'first'" in original
    rewritten = (first / "rewritten_bytecode.txt").read_text()
    assert "___entry_" in rewritten and RESUME1 in rewritten
    entry = (first / "entry.py").read_text()
    assert "= the compiled graph" in entry and "builtins.print" in entry
    assert "x.shape == (3, 4)" in (first / "guards.py").read_text()
    # graph.py is a script: it runs on inputs of the captured shapes.
    out = runpy.run_path(str(first / "graph.py"), run_name="__main__")
    printed = capsys.readouterr().out
    assert printed.startswith("(tensor(")
    x, w = torch.randn(3, 4), torch.randn(4, 5)
    torch.testing.assert_close(out["forward"](None, x, w)[0], torch.relu(x @ w))

    # The last frame: compiled again after SCALE changed; its guards name SCALE.
    last0 = (fn / RESUME2 / "0" / "guards.py").read_text()
    last1 = (fn / RESUME2 / "1" / "guards.py").read_text()
    assert "SCALE'] == 2.0  # global SCALE == 2.0" in last0 and "SCALE'] == 3.0" in last1
    assert "operator.mul" in (fn / RESUME2 / "1" / "graph.txt").read_text() or \
        " * 3.0" in (fn / RESUME2 / "1" / "graph.py").read_text()

    index = (fn / "index.md").read_text()
    assert "4 compiled version(s) of its frames, 4 graph(s), 2 graph break(s), 1 recompile(s)" in index
    graphs = index.split("## Graphs")[1].split("## Graph breaks")[0]
    assert [line.split("`")[1] for line in graphs.splitlines() if line[:1].isdigit()] == \
        ["two_breaks", RESUME1, RESUME2, RESUME2]
    breaks = index.split("## Graph breaks")[1].split("## Recompiles")[0]
    file = __file__
    assert f"**print()** at `{file}:{FIRST}` in `two_breaks()`" in breaks
    assert f"**print()** at `{file}:{SECOND}` in `{RESUME1}()`" in breaks
    assert 'source: `print("first")`' in breaks and 'source: `print("second")`' in breaks
    assert breaks.count("fix: ") == 2
    recompiles = index.split("## Recompiles")[1].split("## Guards")[0]
    assert f"`{RESUME2}` at" in recompiles and "SCALE" in recompiles
    assert "2.0 → 3.0" in recompiles and "compiled as version 1" in recompiles
    guards = index.split("## Guards")[1].split("## Kernels")[0]
    assert f"[{RESUME2}/1/guards.py]({RESUME2}/1/guards.py)" in guards
    assert "None (the backend generated no kernels)" in index
    assert "| capture |" in index and "| passes |" in index

    summary = (run / "index.md").read_text()
    assert "| [two_breaks](two_breaks/index.md) | 4 | 2 | 1 | 0 | 0 |" in summary

    data = json.loads((run / "record.json").read_text())
    (f,) = data["functions"]
    assert f["name"] == "two_breaks" and f["file"] == file
    assert [(v["frame"], v["version"]) for v in f["versions"]] == \
        [("two_breaks", 0), (RESUME1, 0), (RESUME2, 0), (RESUME2, 1)]
    assert [b["where"]["line"] for b in f["breaks"]] == [FIRST, SECOND]
    assert [b["construct"] for b in f["breaks"]] == ["print()", "print()"]
    (r,) = f["recompiles"]
    assert r["function"] == RESUME2 and r["version"] == 1 and "2.0 → 3.0" in r["reason"]
    nodes = f["versions"][0]["graph"]
    assert [n["target"] for n in nodes if n["op"] == "call_function"] == ["operator.matmul", "torch.relu"]
    assert f["versions"][0]["resumes"] == [RESUME1]


def test_each_run_writes_a_fresh_folder(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(
        "import torch, framejit\n"
        "def g(x):\n"
        "    return torch.sin(x) + 1\n"
        "framejit.compile(g, backend='eager')(torch.ones(3))\n")
    dump = tmp_path / "dump"
    env = {**os.environ, "FRAMEJIT_DUMP": str(dump), "PYTHONPATH": _tree()}
    import subprocess
    import sys
    runs = []
    for _ in range(2):
        subprocess.run([sys.executable, str(script)], env=env, check=True, capture_output=True)
        runs.append((dump / "latest").read_text().strip())
    assert runs[0] != runs[1]
    assert sorted(p.name for p in dump.iterdir()) == sorted([*runs, "latest"])
    for name in runs:  # each run holds its own, once
        assert os.listdir(dump / name / "g") == ["g", "index.md"] or \
            sorted(os.listdir(dump / name / "g")) == ["g", "index.md"]
        assert os.listdir(dump / name / "g" / "g") == ["0"]


def _tree() -> str:
    return os.path.dirname(os.path.dirname(framejit.__file__))


def test_explain_of_two_breaks_and_a_recompile():
    global SCALE
    explain = framejit.explain(two_breaks, backend="eager")
    x, w = torch.randn(3, 4), torch.randn(4, 5)
    try:
        before = explain(x, w)
        SCALE = 3.0
        report = explain(x, w)  # each call reports every call so far
        assert explain(x, w).graph_count == 4  # a third call hits the cache: nothing new
    finally:
        SCALE = 2.0
    assert before.graph_count == 3 and before.recompile_count == 0
    assert report.graph_count == 4
    assert [str(g).count("\n") > 0 for g in report.graphs] == [True] * 4
    assert report.ops_per_graph == [2, 1, 2, 2]
    assert [(f.function, f.version) for f in report.frames] == \
        [("two_breaks", 0), (RESUME1, 0), (RESUME2, 0), (RESUME2, 1)]
    assert "torch.relu" in str(report.graphs[0]) and "operator.add" in str(report.graphs[1])
    assert report.graph_break_count == 2
    first, second = report.breaks
    assert (first.reason, first.filename, first.lineno, first.source_line) == \
        ("print()", __file__, FIRST, 'print("first")')
    assert (second.reason, second.lineno, second.source_line, second.function) == \
        ("print()", SECOND, 'print("second")', RESUME1)
    assert first.hint and "print" in first.hint
    assert report.recompile_count == 1
    (r,) = report.recompiles
    assert r.function == RESUME2 and "SCALE" in r.reason and "2.0 → 3.0" in r.reason
    assert len(report.guards) == 4 and "x.shape == (3, 4)" in report.guards[0]
    assert "SCALE'] == 3.0" in report.guards[3]
    assert report.kernels == [[], [], [], []]
    assert report.fallback_count == 0
    assert report.stage_seconds["capture"] > 0 and set(report.stage_seconds) >= {
        "capture", "passes", "kernel codegen", "backend", "kernel compile"}
    assert report.capture_seconds >= report.stage_seconds["capture"]
    text = str(report)
    assert text.startswith("4 graph(s), 7 operation(s), 2 graph break(s), 1 recompile(s), "
                           "0 fallback(s) to plain Python, 0 kernel(s)")
    assert "graph 0: two_breaks v0, 2 op(s): operator.matmul, torch.relu" in text
    assert f"print() at {__file__}:{FIRST}" in text and "SCALE" in text
    assert len(text.splitlines()) <= 25  # one screen
    assert "torch.relu" in report.details() and "def " not in text


def test_explain_reports_graphs_guards_and_fallbacks():
    report = framejit.explain(scaled, backend="eager")(torch.randn(3, 4), torch.randn(4, 5))
    assert report.graph_count == 1
    assert report.ops_per_graph == [3]
    assert report.fallback_count == 0
    assert len(report.guards) == 1 and "x.shape == (3, 4)" in report.guards[0]
    text = str(report)
    assert text.startswith("1 graph(s), 3 operation(s), 0 graph break(s)")
    assert "torch.relu" in text

    def with_item(x):
        return x * x.sum().item()

    report = framejit.explain(with_item, backend="eager")(torch.randn(3))
    assert report.graph_count == 2 and report.graph_break_count == 1
    assert report.fallback_count == 0
    assert report.breaks[0].reason.startswith("x.sum().item()") or ".item()" in report.breaks[0].reason


def test_explain_of_an_already_compiled_function_and_module():
    compiled = framejit.compile(scaled, backend="eager")
    x, w = torch.randn(3, 4), torch.randn(4, 5)
    compiled(x, w)  # cached already: explain compiles afresh, it still sees the graph
    report = framejit.explain(compiled)(x, w)
    assert report.graph_count == 1 and report.ops_per_graph == [3]
    assert framejit.explain(compiled)(x, w).graph_count == 1

    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
    for target in (model, framejit.compile(model, backend="eager")):
        report = framejit.explain(target)(x)
        assert report.graph_count == 1, target
        assert "torch.relu" in str(report) or "relu" in str(report.graphs[0])


def test_explain_keeps_the_backend_of_a_compiled_function():
    compiled = framejit.compile(lambda x: torch.sin(x) * 2, backend="c")
    report = framejit.explain(compiled)(torch.randn(16))
    (kernels,) = report.kernels
    assert [k.language for k in kernels] == ["c"] and "sin" in kernels[0].source
    assert report.stage_seconds["kernel codegen"] > 0
    assert "1 kernel(s)" in str(report) and kernels[0].name in str(report)


def test_dump_of_kernels_with_their_fusion_groups(tmp_path):
    compiled = framejit.compile(scaled, backend="c", options={"dump_dir": str(tmp_path)})
    compiled(torch.randn(3, 4), torch.randn(4, 5))
    version = _run_folder(tmp_path) / "scaled" / "scaled" / "0"
    files = sorted(os.listdir(version))
    assert files == ["entry.py", "graph.py", "graph.txt", "guards.py", "kernels",
                     "original_bytecode.txt", "readable.py", "rewritten_bytecode.txt", "wrapper.py"]
    (source, group) = sorted(os.listdir(version / "kernels"))  # relu * 2.0: one C kernel
    name = source[:-2]
    assert source.endswith(".c") and group == f"{name}.txt"
    text = (version / "kernels" / group).read_text()
    assert "fuses these operations" in text and "relu" in text and "mul" in text
    wrapper = (version / "wrapper.py").read_text()
    assert f"launches kernel {name} (kernels/{name}.c, its fused group in kernels/{name}.txt)" in wrapper
    index = (version.parent.parent / "index.md").read_text()
    assert f"- `{name}` (c, 2 fused op(s)) from `scaled` version 0" in index
    data = json.loads((version.parent.parent.parent / "record.json").read_text())
    (v,) = data["functions"][0]["versions"]
    assert [k["name"] for k in v["kernels"]] == [name] and v["graph_after_passes"]
    assert {n["group"] for n in v["graph"] if n["group"]} == {name}
    assert [b["names"] for b in v["builds"]] == [[name]]  # built at the first call



def test_a_kernel_s_description_and_fused_lines_are_written_when_first_read(monkeypatch):
    # Writing them took 1.7 ms of GPT-2's 21 ms compile, for readers most runs never have.
    from framejit import record
    from framejit.fx_ir import Node
    from framejit.kernels.ir import Kernel

    written = []
    node_format, kernel_str = Node.format, Kernel.__str__
    monkeypatch.setattr(Node, "format", lambda n: written.append(n.name) or node_format(n))
    monkeypatch.setattr(Kernel, "__str__", lambda k: written.append("kernel") or kernel_str(k))
    events = []
    record.subscribe(events.append)
    try:
        framejit.compile(scaled, backend="c")(torch.randn(3, 4), torch.randn(4, 5))
    finally:
        record.unsubscribe(events.append)
    (event,) = [e for e in events if isinstance(e, record.KernelCompiled)]
    assert written == []
    assert len(event.group) == 2 and "relu" in event.group[0] and "mul" in event.group[1]
    assert "relu" in event.description and written.count("kernel") == 1 and len(written) == 3
    assert event.group == event.group and "relu" in event.description and len(written) == 3  # once


def test_dump_and_explain_show_the_readable_renderings_capture_provides(tmp_path, monkeypatch):
    # Capture's cache-entry info may carry a readable rendering of the whole rewritten function
    # and of its guards; the dump writes them, and explain lists those guards.
    from framejit.capture import convert_frame as cf

    monkeypatch.setattr(cf.CacheEntryInfo, "readable_source",
                        property(lambda info: f"# readable {info.entry_source.split('(')[0]}\n"),
                        raising=False)
    monkeypatch.setattr(cf.CacheEntryInfo, "guards_source",
                        property(lambda info: "# one guard per line\n"), raising=False)
    framejit.compile(scaled, backend="eager", options={"dump_dir": str(tmp_path)})(
        torch.randn(3, 4), torch.randn(4, 5))
    version = _run_folder(tmp_path) / "scaled" / "scaled" / "0"
    assert (version / "readable.py").read_text() == "# readable def ___entry_" + \
        (version / "entry.py").read_text().split("def ___entry_")[1].split("(")[0] + "\n"
    assert (version / "guards.py").read_text().endswith("# one guard per line\n")
    index = (version.parent.parent / "index.md").read_text()
    assert "[readable.py](scaled/0/readable.py)" in index
    from framejit.debug.report import write_report
    page = open(write_report(str(tmp_path))).read()
    assert "the rewritten function as Python" in page and "# readable def ___entry_" in page
    report = framejit.explain(scaled, backend="eager")(torch.randn(3, 4), torch.randn(4, 5))
    assert report.guards == ["# one guard per line\n"]


def test_explain_summary_stays_on_one_screen():
    def many(x):
        for i in range(12):
            x = x + i
            print(i)  # twelve breaks inside a loop over a range: twelve more graphs
        return x

    # Each pass round the loop is a new version of the resume function, up to the limit.
    with pytest.warns(UserWarning, match="recompile_limit=8"):
        report = framejit.explain(many, backend="eager")(torch.ones(2))
    assert report.graph_count > 8 and report.graph_break_count > 8 and report.fallback_count == 1
    text = str(report)
    assert len(text.splitlines()) <= 30
    assert "more compiled frame(s): report.frames, report.details()" in text
    assert "more break places, recompiles or fallbacks" in text
