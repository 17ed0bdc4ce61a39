"""FRAMEJIT_LOGS and framejit.set_logs: topics printed to stderr with no logging set-up."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import framejit

PROGRAM = textwrap.dedent("""
    import torch, framejit

    def f(x):
        y = torch.sin(x) + 1
        print("between")
        return y * 2

    c = framejit.compile(f, backend={backend!r})
    c(torch.ones(8))
    c(torch.ones(9))   # a new shape: both frames recompile
""")


def _run(tmp_path, logs: str | None, backend: str = "eager") -> str:
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM.format(backend=backend))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRAMEJIT_")}
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(framejit.__file__))
    if logs is not None:
        env["FRAMEJIT_LOGS"] = logs
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                          check=True)
    assert done.stdout.count("between") == 2
    return done.stderr


def _topics(stderr: str) -> set[str]:
    return {line.split("]")[0][len("[framejit:"):] for line in stderr.splitlines()
            if line.startswith("[framejit:")}


def test_no_logs_by_default(tmp_path):
    assert _run(tmp_path, None) == ""


def test_graph_breaks_and_recompiles(tmp_path):
    err = _run(tmp_path, "graph_breaks,recompiles")
    assert _topics(err) == {"graph_breaks", "recompiles"}
    breaks = [line for line in err.splitlines() if line.startswith("[framejit:graph_breaks]")]
    assert len(breaks) == 2  # once per version of f
    assert "graph break in f at" in breaks[0] and "print()" in breaks[0]
    assert 'print("between")' in err and "prog.py:6" in err and "fix:" in err
    recompiles = [line for line in err.splitlines() if line.startswith("[framejit:recompiles]")]
    assert len(recompiles) == 4  # each frame: the failed guard, then what becomes dynamic
    assert "recompiling f at" in recompiles[0] and "x.shape[0]: 8 → 9" in recompiles[0]
    assert recompiles[1] == "[framejit:recompiles] x.shape[0] is now dynamic: 8 → 9"
    assert "y.shape[0]: 8 → 9" in recompiles[2]
    assert recompiles[3] == "[framejit:recompiles] y.shape[0] is now dynamic: 8 → 9"


def test_all_topics(tmp_path):
    err = _run(tmp_path, "all", backend="c")
    assert _topics(err) == {"graph_breaks", "recompiles", "guards", "graph", "bytecode", "kernels",
                            "perf"}
    assert "[framejit:graph] graph of f at" in err and "torch.sin" in err and "f32[8]" in err
    assert "[framejit:guards] guards of f at" in err and "x.shape == (8,)" in err
    assert "[framejit:bytecode] original bytecode of f at" in err and "LOAD_GLOBAL" in err
    assert "[framejit:bytecode] rewritten bytecode of f at" in err
    assert "[framejit:kernels] kernel fj_poi_sin" in err and "(c, cpu) fuses:" in err
    perf = [line for line in err.splitlines() if line.startswith("[framejit:perf]")]
    assert any("capture" in line and "passes" in line and "kernel codegen" in line for line in perf)
    assert any(line.startswith("[framejit:perf] c kernels fj_poi_sin") for line in perf)


def test_perf_alone_and_unknown_topics(tmp_path):
    err = _run(tmp_path, "perf")
    assert _topics(err) == {"perf"}
    assert err.count("[framejit:perf] compiled f at") == 2
    bad = _run(tmp_path, "graphs")
    assert "FRAMEJIT_LOGS=graphs" in bad and "unknown topic 'graphs'" in bad and "graph_breaks" in bad


def test_set_logs_from_python(capsys):
    def g(x):
        return torch.cos(x) - 1

    framejit.set_logs("graph")
    try:
        framejit.compile(g, backend="eager")(torch.ones(2))
        err = capsys.readouterr().err
        assert "[framejit:graph] graph of " in err and "torch.cos" in err
        framejit.set_logs("all")
        framejit.set_logs()  # off again
        framejit.compile(g, backend="eager")(torch.ones(2))
        assert capsys.readouterr().err == ""
    finally:
        framejit.set_logs()
    with pytest.raises(ValueError, match="unknown topic 'graphs'.*graph_breaks"):
        framejit.set_logs("graphs")
