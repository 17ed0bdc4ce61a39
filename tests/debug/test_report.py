"""``python -m framejit report``: the HTML page of a dump, opened in a real headless browser."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import framejit
from framejit.debug.report import find_run, highlight, write_report

PROGRAM = textwrap.dedent("""
    import torch, framejit

    def f(x, w):
        h = torch.softmax(x @ w, dim=-1) * 2 + 1
        print("between")
        return torch.relu(h - 1.5).sum(0)

    c = framejit.compile(f, backend="c")
    c(torch.randn(8, 16), torch.randn(16, 32))
    c(torch.randn(4, 16), torch.randn(16, 32))   # a new shape: both frames recompile
""")


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRAMEJIT_")}
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(framejit.__file__))
    return {**env, **extra}


@pytest.fixture(scope="module")
def dump(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dump")
    script = folder / "prog.py"
    script.write_text(PROGRAM)
    subprocess.run([sys.executable, str(script)], env=_env(FRAMEJIT_DUMP=str(folder / "out")),
                   check=True, capture_output=True)
    return folder / "out"


def test_help_lists_the_commands():
    done = subprocess.run([sys.executable, "-m", "framejit", "--help"], env=_env(),
                          capture_output=True, text=True, check=True)
    assert "usage: python -m framejit" in done.stdout and "report" in done.stdout
    bare = subprocess.run([sys.executable, "-m", "framejit"], env=_env(), capture_output=True, text=True)
    assert bare.returncode == 2 and "report" in bare.stdout


def test_report_command_writes_a_self_contained_page(dump, tmp_path):
    done = subprocess.run([sys.executable, "-m", "framejit", "report", str(dump)], env=_env(),
                          capture_output=True, text=True, check=True)
    path = done.stdout.strip()
    assert path == os.path.join(find_run(str(dump)), "report.html")
    page = open(path).read()
    # Offline: nothing loaded from anywhere (the only URL is SVG's namespace name).
    assert "<link" not in page and " src=" not in page
    assert page.replace("http://www.w3.org/2000/svg", "").count("http") == 0
    data = json.load(open(os.path.join(find_run(str(dump)), "record.json")))
    (fn,) = data["functions"]
    assert page.count('<svg class="graph"') == len(fn["versions"]) == 4
    assert page.count('<g class="node" data-group="fj_') == sum(
        len(k["group"]) for v in fn["versions"] for k in v["kernels"])
    assert '<span class="kw">void</span>' in page  # the C source, highlighted
    assert "print()" in page and 'print(&quot;between&quot;)' in page
    assert page.count('<g class="recompile">') == 2 and "x.shape[0]: 8 → 4" in page
    for title in ("Frames and graphs", "Graph breaks", "Recompiles over time", "Guards", "Kernels",
                  "Compile time per stage"):
        assert f"<h3>{title}</h3>" in page
    missing = subprocess.run([sys.executable, "-m", "framejit", "report", str(tmp_path)], env=_env(),
                             capture_output=True, text=True)
    assert missing.returncode == 1 and "holds no framejit dump" in missing.stderr


def test_report_takes_the_dump_folder_its_latest_file_or_a_run(dump, tmp_path):
    run = find_run(str(dump))
    assert os.path.exists(os.path.join(run, "record.json"))
    assert find_run(str(dump / "latest")) == run and find_run(run) == run
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        find_run(str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="holds no framejit dump"):
        find_run(str(tmp_path))


def test_highlight():
    assert highlight('def f(x):  # hi\n    return "s" + 1', "python") == (
        '<span class="kw">def</span> f(x):  <span class="comment"># hi</span>\n'
        '    <span class="kw">return</span> <span class="string">&quot;s&quot;</span> + '
        '<span class="number">1</span>')
    assert highlight("#include <math.h>\nint a = 2; // x", "c").startswith(
        '<span class="pre">#include &lt;math.h&gt;</span>\n<span class="kw">int</span>')


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--virtual-time-budget=3000"]


def _browse(tmp_path, page: str, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / f"profile-{len(os.listdir(tmp_path))}"
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--enable-logging=stderr",
                           *args, f"file://{page}"], capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium (make test installs Debian's chromium)")
def test_page_renders_in_a_browser_without_script_errors(dump, tmp_path):
    page = write_report(str(dump))
    done = _browse(tmp_path, page, "--dump-dom")
    dom = done.stdout
    # The page's own script ran to its end and no error reached the error box or the console.
    assert '<span id="status">ready: 1 function(s)</span>' in dom, dom[-2000:]
    assert '<pre id="script-errors" hidden=""></pre>' in dom
    assert "Uncaught" not in done.stderr
    for section in ('id="summary"', 'class="function"', '<svg class="graph"', '<svg class="timeline"',
                    'class="kernel"', 'class="stages"'):
        assert section in dom
    shot = os.path.join(os.path.dirname(page), "report.png")
    done = _browse(tmp_path, page, "--window-size=1280,2400", f"--screenshot={shot}")
    with open(shot, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(shot) > 20_000  # a drawn page, not a blank one


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium (make test installs Debian's chromium)")
def test_the_browser_check_sees_script_errors(dump, tmp_path):
    # The check above can fail: a page whose script throws shows it in both places.
    broken = tmp_path / "broken.html"
    text = open(write_report(str(dump))).read()
    broken.write_text(text.replace("</body>", "<script>no_such_function();</script></body>"))
    done = _browse(tmp_path, str(broken), "--dump-dom")
    assert "no_such_function is not defined" in done.stdout
    assert "Uncaught ReferenceError" in done.stderr
