"""The subprocess that runs programs: ``python -m tests.fuzz.worker`` reads one JSON request per
line on stdin (``{"id", "seed", "avoid"}`` to generate the program here, or ``{"id", "source"}``) and
writes one JSON result per line (runner.run_program's, plus ``id``).

Results go to a private copy of the original stdout; file descriptor 1 itself is pointed at
stderr, so that nothing a program or a C library prints can corrupt the protocol.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    os.environ.setdefault("FRAMEJIT_LINT", "1")  # as in the test suite: lint every graph

    from .generator import generate
    from .runner import run_program

    for line in sys.stdin:
        request = json.loads(line)
        source = request.get("source")
        if source is None:
            source = generate(request["seed"], avoid=request.get("avoid", ())).source()
        try:
            result = run_program(source)
        except BaseException as e:  # the harness itself failed: report, keep serving
            result = {"status": "harness-error", "diffs": [], "error": f"{type(e).__name__}: {e}"[:300]}
        result["id"] = request["id"]
        replies.write(json.dumps(result, default=str) + "\n")


if __name__ == "__main__":
    main()
