"""framejit's disk caches: where they live, and how they stay bounded.

Each kind of record has a folder under ``$FRAMEJIT_CACHE_DIR`` (default ``~/.cache/framejit``):
``c`` (shared objects of C kernels and their sources), ``triton`` (kernel modules and tuned
configs), ``meta`` (example values of ops, a folder per torch build), ``py`` (the compiled code
of framejit's generated Python: see :func:`compiled`), ``graphs`` (compiled graphs: see
``framejit.graph_cache``). Every new source, compiler, torch build or venv adds records and none
removes any, so a folder that is never pruned grows without end (6.4 GB and 1.1 million files
after a few hundred test runs here).

:func:`note_write` keeps each folder under ``FRAMEJIT_CACHE_MAX_MB`` (default 1024; 0 = never
prune): a background thread removes the records written or used longest ago until the folder
holds three quarters of its budget (sizes in disk blocks). It runs the first time a process
writes to a folder whose last pruning is a day old (a stamp file remembers when), and whenever
the records written to a folder since its last pruning add up to a quarter of its budget (a
tally file counts them, for all processes): a day of fuzzing or test runs had written 4 GB
between two prunings. A record in use is safe to remove: a loaded shared object stays
mapped, and a record that is gone is a cache miss, rebuilt on the next use.

A leaf: it imports nothing of framejit, so every layer may use it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import marshal
import os
import sys
import threading
import time

#: How often (seconds) a folder is looked over when little is written to it.
PRUNE_EVERY = 24 * 3600
_STAMP = ".pruned"
#: The tally of what was written since the last pruning: a byte per started ``_UNIT`` bytes.
_TALLY = ".written"
_UNIT = 64 * 1024

_lock = threading.Lock()
_seen: set[str] = set()  # folders this process has looked at (or decided not to)
_pruning: set[str] = set()  # folders this process prunes now


def root() -> str:
    """The caches' root folder."""
    return os.environ.get("FRAMEJIT_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "framejit")


def folder(kind: str) -> str:
    """The folder of one kind of record, created if missing."""
    path = os.path.join(root(), kind)
    os.makedirs(path, exist_ok=True)
    return path


def budget_bytes() -> int:
    """Each folder's budget (``FRAMEJIT_CACHE_MAX_MB``, default 1024 MB); 0 = unbounded."""
    try:
        mb = float(os.environ.get("FRAMEJIT_CACHE_MAX_MB", "1024"))
    except ValueError:
        mb = 1024.0
    return max(0, int(mb * 2**20))


def note_use(path: str) -> None:
    """Mark ``path`` as used now, so pruning keeps it over records unused for longer."""
    try:
        os.utime(path)
    except OSError:
        pass


def note_write(path: str, nbytes: int = 0) -> threading.Thread | None:
    """Called after a process writes a record of ``nbytes`` bytes into ``path`` (a folder of
    :func:`folder`): prunes the folder in a background thread (looking over a million records
    takes seconds) when it is due, and returns that thread."""
    first = False
    if path not in _seen:
        with _lock:
            first = path not in _seen
            _seen.add(path)
    budget = budget_bytes()
    if not budget:
        return None
    due = _tally(path, nbytes) * _UNIT > budget // 4
    if first and not due:
        try:
            due = time.time() - os.stat(os.path.join(path, _STAMP)).st_mtime >= PRUNE_EVERY
        except OSError:
            due = True  # never pruned
    return _start_prune(path, budget) if due else None


def _tally(path: str, nbytes: int) -> int:
    """Count a record of ``nbytes`` into the folder's tally; the tally now (in units)."""
    try:
        with open(os.path.join(path, _TALLY), "ab") as f:
            f.write(b"." * (1 + nbytes // _UNIT))  # (appends of a few bytes do not interleave)
            return f.tell()
    except OSError:
        return 0


def _start_prune(path: str, budget: int) -> threading.Thread | None:
    with _lock:
        if path in _pruning:
            return None
        _pruning.add(path)

    def work():
        try:
            prune(path, budget)
        finally:
            with _lock:
                _pruning.discard(path)

    worker = threading.Thread(target=work, daemon=True, name="framejit-cache-prune")
    try:
        os.makedirs(path, exist_ok=True)
        worker.start()  # (Python 3.12 starts no thread once the interpreter shuts down)
        for name in (_STAMP, _TALLY):
            with open(os.path.join(path, name), "w"):
                pass  # pruned now; other processes skip this folder for a day, or a quarter
    except (OSError, RuntimeError):
        pass  # a cache that cannot be pruned only costs disk
    if worker.ident is None:
        with _lock:
            _pruning.discard(path)
        return None
    return worker


def _disk_bytes(st: os.stat_result) -> int:
    """What a file takes on disk: whole blocks (a 300-byte record takes 4 KB on most file
    systems), where the system says."""
    blocks = getattr(st, "st_blocks", None)
    return st.st_size if blocks is None else max(st.st_size, blocks * 512)


def prune(path: str, budget: int) -> int:
    """Remove the records of ``path`` (files, in subfolders too) used longest ago until the
    folder holds at most 3/4 of ``budget`` bytes, when it holds more than ``budget``; then the
    subfolders left empty. Returns the bytes removed."""
    records: list[tuple[float, int, str]] = []
    folders: list[str] = []
    total = 0
    pending = [path]
    while pending:
        here = pending.pop()
        try:
            entries = list(os.scandir(here))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
                    folders.append(entry.path)
                elif entry.name not in (_STAMP, _TALLY):
                    st = entry.stat(follow_symlinks=False)
                    size = _disk_bytes(st)
                    records.append((st.st_mtime, size, entry.path))
                    total += size
            except OSError:
                continue
    if total <= budget:
        return 0
    records.sort()
    target = budget * 3 // 4
    removed = 0
    for _, size, file in records:
        if total - removed <= target:
            break
        try:
            os.unlink(file)
            removed += size
        except OSError:
            pass
    for sub in sorted(folders, key=len, reverse=True):  # deepest first
        try:
            os.rmdir(sub)  # only empty ones go
        except OSError:
            pass
    return removed


def compiled(source: str, filename: str):
    """``compile(source, filename, "exec")``, kept in the folder ``py`` by the source, the file
    name and the Python build (marshal's format and the bytecode change between builds):
    framejit's generated guard functions, entries, graph forwards and kernel launchers, which a
    first call with warm caches compiled again (GPT-2's guard function, 35 KB of source, took
    10 ms, and all its generated code 16 ms of a 142 ms first call). A record that cannot be
    read is compiled again and rewritten; one that loads is marked used (:func:`note_use`)."""
    key = hashlib.sha256("\0".join((sys.version, importlib.util.MAGIC_NUMBER.hex(), filename,
                                     source)).encode()).hexdigest()[:40]
    where = folder("py")
    path = os.path.join(where, key)
    try:
        with open(path, "rb") as f:
            code = marshal.loads(f.read())
        if getattr(code, "co_filename", None) == filename:
            note_use(path)  # (pruning keeps records in use)
            return code
    except (OSError, EOFError, ValueError, TypeError):
        pass
    code = compile(source, filename, "exec")
    write_atomic(path, marshal.dumps(code), where)
    return code


def write_atomic(path: str, data: bytes, budget_folder: str) -> None:
    """Write record ``path`` whole (a reader in another process sees it whole or not at all) and
    count it into ``budget_folder``'s tally (:func:`note_write`); a record that cannot be written
    is left out (a cache miss later)."""
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        note_write(budget_folder, len(data))
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
