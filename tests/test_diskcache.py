"""The disk caches stay under their budget: the records used longest ago go first."""

import os
import subprocess
import sys
import threading
import time

import pytest
import torch

import framejit
from framejit import diskcache

K = 4096  # a disk block: records are counted in whole blocks


def _record(path, size, age_days):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(b"x" * size)
    when = time.time() - age_days * 86400
    os.utime(path, (when, when))


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    monkeypatch.setenv("FRAMEJIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(diskcache, "_seen", set())
    return tmp_path


def test_prune_removes_the_oldest_records_down_to_three_quarters_of_the_budget(tmp_path):
    for i in range(10):  # record 0 is the oldest
        _record(str(tmp_path / f"r{i}"), K, age_days=10 - i)
    _record(str(tmp_path / "old-build" / "a"), K, age_days=30)
    assert diskcache.prune(str(tmp_path), budget=8 * K) == 11 * K - 6 * K
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == [f"r{i}" for i in range(4, 10)]  # the old build's folder went with its record


def test_prune_leaves_a_folder_under_its_budget_alone(tmp_path):
    for i in range(4):
        _record(str(tmp_path / f"r{i}"), K, age_days=100)
    assert diskcache.prune(str(tmp_path), budget=4 * K) == 0
    assert len(list(tmp_path.iterdir())) == 4


def test_a_used_record_outlives_older_unused_ones(tmp_path):
    for i in range(4):
        _record(str(tmp_path / f"r{i}"), K, age_days=10 - i)
    diskcache.note_use(str(tmp_path / "r0"))
    diskcache.prune(str(tmp_path), budget=3 * K)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r0", "r3"]


def test_a_folder_is_pruned_once_a_day_and_not_when_the_budget_is_zero(fresh, monkeypatch):
    folder = diskcache.folder("c")
    for i in range(8):
        _record(os.path.join(folder, f"r{i}"), 2**20, age_days=8 - i)
    monkeypatch.setenv("FRAMEJIT_CACHE_MAX_MB", "0")
    assert diskcache.note_write(folder) is None
    assert len(os.listdir(folder)) == 8
    monkeypatch.setenv("FRAMEJIT_CACHE_MAX_MB", "4")
    assert diskcache.note_write(folder) is None  # this process has looked at the folder already
    monkeypatch.setattr(diskcache, "_seen", set())
    diskcache.note_write(folder).join()
    assert sorted(os.listdir(folder)) == [".pruned", ".written", "r5", "r6", "r7"]
    _record(os.path.join(folder, "r8"), 4 * 2**20, age_days=0)
    monkeypatch.setattr(diskcache, "_seen", set())  # another process, the same day
    assert diskcache.note_write(folder) is None
    assert "r5" in os.listdir(folder)


def test_a_folder_written_to_a_quarter_of_its_budget_is_pruned_the_same_day(fresh, monkeypatch):
    # Many processes each writing a little (a fuzzing campaign's workers, a test run): the
    # tally of what they wrote since the last pruning triggers the next.
    monkeypatch.setenv("FRAMEJIT_CACHE_MAX_MB", "8")
    folder = diskcache.folder("c")
    for i in range(12):
        _record(os.path.join(folder, f"r{i}"), 2**20, age_days=12 - i)
    with open(os.path.join(folder, ".pruned"), "w"):
        pass  # pruned a moment ago: the daily rule waits
    assert diskcache.note_write(folder, 2**20) is None  # a first record: an eighth of the budget
    assert len(os.listdir(folder)) == 14
    monkeypatch.setattr(diskcache, "_seen", set())  # another process, the same day
    diskcache.note_write(folder, 2**20).join()  # a quarter now
    assert set(os.listdir(folder)) == {".pruned", ".written", *(f"r{i}" for i in range(6, 12))}
    with open(os.path.join(folder, ".written"), "rb") as f:
        assert f.read() == b""  # counted from zero again
    assert diskcache.note_write(folder, 0) is None


def test_compiling_a_c_kernel_prunes_the_c_cache(fresh, monkeypatch):
    folder = diskcache.folder("c")
    for i in range(6):
        _record(os.path.join(folder, f"stale{i}.so"), 2**20, age_days=30)
    monkeypatch.setenv("FRAMEJIT_CACHE_MAX_MB", "2")

    @framejit.compile(backend="c")
    def f(x):
        return (x * 3.0517 + 1.0).relu()

    x = torch.randn(40)
    torch.testing.assert_close(f(x), (x * 3.0517 + 1.0).relu())
    for worker in threading.enumerate():
        if worker.name == "framejit-cache-prune":
            worker.join()
    left = os.listdir(folder)
    assert sum(name.startswith("stale") for name in left) <= 1
    assert any(name.endswith(".so") and not name.startswith("stale") for name in left)



def test_a_process_prunes_the_meta_cache_as_it_runs_and_exits_quietly(tmp_path):
    # Capture writes its meta records at exit, when Python 3.12 starts no thread: the meta
    # folder is pruned at the first new record instead. Another torch build's old records
    # go; nothing is printed at exit.
    stale = tmp_path / "meta" / "examples-another-build"
    for i in range(4):
        _record(str(stale / f"r{i}.marshal"), 2**20, age_days=40)
    script = (
        "import threading, torch, framejit\n"
        "f = framejit.compile(lambda x: (x * 2).sin() + x.cos().sum(-1, keepdim=True))\n"
        "f(torch.randn(3, 5))\n"
        "for t in threading.enumerate():\n"
        "    if t.name == 'framejit-cache-prune':\n"
        "        t.join()\n")
    env = {**os.environ, "FRAMEJIT_CACHE_DIR": str(tmp_path), "FRAMEJIT_CACHE_MAX_MB": "2"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert len(list(stale.glob("*.marshal"))) <= 1
    assert any((tmp_path / "meta").glob("examples-*/*.marshal"))  # this run's records


def test_generated_python_compiles_once_and_loads_from_disk_after(fresh, monkeypatch):
    # framejit's generated code (guards, entries, graph forwards, launchers) is compiled once;
    # a later request for the same source and file name (another process, a warm cache) loads
    # the code from disk, and marks the record used. A record that cannot be read, or that
    # names another file, is compiled again and rewritten.
    import builtins

    compiles = []
    real_compile = builtins.compile
    monkeypatch.setattr(builtins, "compile", lambda *a, **k: compiles.append(a[1]) or real_compile(*a, **k))
    source = "def f(x):\n    return x * 2 + 1\n"
    first = diskcache.compiled(source, "<framejit-test a>")
    (record,) = [p for p in (fresh / "py").iterdir() if not p.name.startswith(".")]
    os.utime(record, (1e9, 1e9))  # (long unused)
    second = diskcache.compiled(source, "<framejit-test a>")
    assert compiles == ["<framejit-test a>"]
    assert record.stat().st_mtime > 1e9  # used now: pruning keeps it over older records
    namespace = {}
    exec(second, namespace)
    assert namespace["f"](3) == 7 and second.co_filename == "<framejit-test a>"
    assert second.co_code == first.co_code and second is not first
    diskcache.compiled(source, "<framejit-test b>")  # another file name: its own record
    assert compiles == ["<framejit-test a>", "<framejit-test b>"]
    record.write_bytes(b"\x00garbage")
    again = diskcache.compiled(source, "<framejit-test a>")
    assert compiles[-1] == "<framejit-test a>" and again.co_code == first.co_code
    assert diskcache.compiled(source, "<framejit-test a>").co_code == first.co_code
    assert len(compiles) == 3  # the rewritten record loads
