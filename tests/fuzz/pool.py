"""Worker subprocesses seen from the campaign: send a program, get its result, and turn a worker
that dies (a segfault, an abort) or hangs into a ``crash`` / ``timeout`` result for exactly the
program it was running; the next request starts a fresh worker."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository: `tests.fuzz` and `framejit` import from here

# A worker is replaced after this many programs, so that whatever one program leaks (caches,
# modules, memory) cannot change how much later programs see.
PROGRAMS_PER_WORKER = 300

# A new worker imports torch and framejit before its first program: on a loaded machine that
# alone can take longer than a program's timeout.
STARTUP_SECONDS = 90.0


class Worker:
    def __init__(self, timeout: float = 120.0):
        self.timeout = timeout
        self.proc: subprocess.Popen | None = None
        self.served = 0
        self.stderr = None

    def _start(self) -> None:
        self.stderr = tempfile.TemporaryFile()
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.fuzz.worker"], cwd=ROOT, env=env, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr)
        self.served = 0

    def run(self, request: dict) -> dict:
        """The result for ``request`` (see worker.py), or a crash/timeout result."""
        if self.proc is None or self.served >= PROGRAMS_PER_WORKER:
            self.close()
            self._start()
        self.served += 1
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            limit = self.timeout + (STARTUP_SECONDS if self.served == 1 else 0.0)
            ready, _, _ = select.select([self.proc.stdout], [], [], limit)
            line = self.proc.stdout.readline() if ready else None
        except (BrokenPipeError, OSError):
            line = ""
        if line:
            return json.loads(line)
        status = "timeout" if line is None else "crash"
        if line is None:
            self.proc.kill()
        code = self.proc.wait()
        detail = f"worker exit status {code}" + (f" (signal {-code})" if code < 0 else "")
        result = {"id": request["id"], "status": status, "diffs": [],
                  "error": f"{detail}; stderr: {self._stderr_tail()}"}
        self.proc = None
        return result

    def _stderr_tail(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read()[-600:].decode(errors="replace")

    def close(self) -> None:
        if self.proc is not None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        if self.stderr is not None:
            self.stderr.close()
            self.stderr = None
