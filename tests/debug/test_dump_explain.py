"""Debug dumps and framejit.explain: what a user reads when something goes wrong."""

import os

import torch

import framejit

SCALE = 2.0


def scaled(x, w):
    return torch.relu(x @ w) * SCALE


def test_dump_writes_every_artifact_and_reasons(tmp_path):
    compiled = framejit.compile(scaled, options={"dump_dir": str(tmp_path)})
    x, w = torch.randn(3, 4), torch.randn(4, 5)
    compiled(x, w)
    compiled(torch.randn(6, 4), w)  # new shape: a second version and a recompile reason
    folder = tmp_path / "scaled"
    assert sorted(os.listdir(folder)) == ["0", "1", "reasons.log"]
    files = sorted(os.listdir(folder / "0"))
    assert files == ["entry.py", "graph.py", "graph.txt", "guards.py", "original_bytecode.txt",
                     "rewritten.py", "rewritten_bytecode.txt"]
    graph_txt = (folder / "0" / "graph.txt").read_text()
    assert "torch.relu" in graph_txt and "f32[3, 5]" in graph_txt
    assert "LOAD_GLOBAL" in (folder / "0" / "original_bytecode.txt").read_text()
    guards = (folder / "0" / "guards.py").read_text()
    assert "x.shape == (3, 4)" in guards and "== 2.0  # global SCALE == 2.0" in guards
    assert "[recompile]" in (folder / "reasons.log").read_text()
    assert "x.shape[0]: 3 → 6" in (folder / "reasons.log").read_text()
    # The dumped graph code runs and gives the compiled result.
    namespace = {}
    exec((folder / "0" / "entry.py").read_text(), namespace)  # readable, valid Python


def test_dump_records_graph_break_reason(tmp_path):
    def noisy(x):
        print("value")
        return x + 1

    framejit.compile(noisy, options={"dump_dir": str(tmp_path)})(torch.randn(2))
    # One folder per function, named by its qualname (the resume function has its own).
    (folder,) = [f for f in tmp_path.iterdir() if f.name.endswith(".noisy")]
    text = (folder / "reasons.log").read_text()
    assert "[graph break]" in text and "print()" in text and "fix:" in text


def test_explain_reports_graphs_guards_and_fallbacks():
    report = framejit.explain(scaled)(torch.randn(3, 4), torch.randn(4, 5))
    assert report.graph_count == 1
    assert report.ops_per_graph == [3]
    assert report.fallback_count == 0
    assert len(report.guards) == 1 and "x.shape != (3, 4)" in report.guards[0]
    text = str(report)
    assert text.startswith("1 graph(s), 3 operation(s), 0 graph break(s), 0 fallback(s)")
    assert "torch.relu" in text

    def with_item(x):
        return x * x.sum().item()

    report = framejit.explain(with_item)(torch.randn(3))
    assert report.graph_count == 2 and report.graph_break_count == 1
    assert report.fallback_count == 0
    assert ".item()" in str(report)
