"""A fuzzing campaign: many generated programs, each run eagerly and compiled in worker
subprocesses, a summary, and a shrunk reproducer for each distinct kind of failure.

    python -m tests.fuzz.campaign --seed 1 --count 10000 --jobs 2 [--out fuzz-failures]
    python -m tests.fuzz.campaign --program 10000042      # one program: its source and result
    python -m tests.fuzz.campaign --reduce 10000042       # one failing program, shrunk

``--avoid hasattr,...`` leaves out constructs (generator.FEATURES) behind known failures, to find
others; a campaign that counts must not use it.

Program ``i`` of a campaign with seed ``S`` is generated from seed ``S * 10**7 + i`` (its id),
so any program can be re-created alone from the id that a report gives.
"""

from __future__ import annotations

import argparse
import os
import queue
import re
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from .generator import generate
from .pool import Worker
from .shrink import shrink

FAILED = ("diff", "crash", "timeout", "invalid", "harness-error")


def program_seed(seed: int, index: int) -> int:
    return seed * 10**7 + index


@dataclass
class Summary:
    seed: int
    count: int
    seconds: float = 0.0
    statuses: Counter = field(default_factory=Counter)
    failures: list = field(default_factory=list)  # results with a FAILED status, with "seed"
    graphs: int = 0
    kernels: int = 0
    with_graphs: int = 0  # programs where compiling put something in a graph
    avoid: tuple = ()
    budget: float | None = None  # seconds after which no new program starts

    @property
    def ran(self) -> int:
        return sum(self.statuses.values())

    @property
    def differences(self) -> int:
        return self.statuses["diff"]

    @property
    def crashes(self) -> int:
        return self.statuses["crash"] + self.statuses["timeout"]

    def line(self) -> str:
        count = f"{self.count}" if self.ran >= self.count else \
            f"{self.ran} (of {self.count}: the {self.budget:.0f}s budget ran out)"
        return (f"fuzz: seed={self.seed} count={count} differences={self.differences} "
                f"crashes={self.crashes} (timeouts {self.statuses['timeout']}) "
                f"invalid={self.statuses['invalid'] + self.statuses['harness-error']} "
                f"ill-conditioned={self.statuses['ill-conditioned']} "
                f"programs with graphs={self.with_graphs} graphs={self.graphs} kernels={self.kernels} "
                f"time={self.seconds:.0f}s" + (f" avoid={','.join(self.avoid)}" if self.avoid else ""))


def run_campaign(seed: int, count: int, jobs: int = 2, timeout: float = 120.0,
                 progress: bool = False, avoid: tuple = (), budget: float | None = None) -> Summary:
    """Runs programs 0..count-1 of ``seed`` on ``jobs`` workers, in order. With ``budget``, no
    program starts after that many seconds: a slow machine runs programs 0..k-1, the same ones
    in every run, k by its speed."""
    summary = Summary(seed, count, avoid=tuple(avoid), budget=budget)
    todo: queue.Queue = queue.Queue()
    for index in range(count):
        todo.put(program_seed(seed, index))
    lock = threading.Lock()
    start = time.monotonic()

    def serve() -> None:
        worker = Worker(timeout)
        try:
            while budget is None or time.monotonic() - start < budget:
                try:
                    pseed = todo.get_nowait()
                except queue.Empty:
                    return
                result = worker.run({"id": pseed, "seed": pseed, "avoid": list(avoid)})
                result["seed"] = pseed
                result["avoid"] = list(avoid)
                with lock:
                    _record(summary, result)
                    done = summary.ran
                    if progress and done % 250 == 0:
                        print(f"  {done}/{count} {dict(summary.statuses)} "
                              f"{time.monotonic() - start:.0f}s", file=sys.stderr, flush=True)
        finally:
            worker.close()

    threads = [threading.Thread(target=serve) for _ in range(max(1, jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    summary.seconds = time.monotonic() - start
    summary.failures.sort(key=lambda r: r["seed"])
    return summary


def _record(summary: Summary, result: dict) -> None:
    summary.statuses[result["status"]] += 1
    summary.graphs += result.get("graphs", 0)
    summary.kernels += result.get("kernels", 0)
    summary.with_graphs += bool(result.get("graphs"))
    if result["status"] in FAILED:
        summary.failures.append(result)


def signature(result: dict) -> str:
    """A failure's class for grouping: the status, or the first difference's kind, call and
    message with numbers and names blurred."""
    if result["status"] != "diff":
        return result["status"]
    first = result["diffs"][0]
    detail = re.sub(r"\d+(\.\d+)?(e-?\d+)?", "N", first["detail"])
    detail = re.sub(r"'[^']*'", "'…'", detail)
    return f"{first['kind']}: {detail[:70]}"


def _failure_key(result: dict):
    """What a shrunk program must keep: the status, and for a difference the kind and call of
    the first one, with both exception types when the exceptions differ (a looser test lets the
    shrinker drift from one bug to another that happens to show the same way)."""
    if result["status"] != "diff":
        return (result["status"],)
    first = result["diffs"][0]
    key = ("diff", first["kind"], first["call"])
    if first["kind"] == "exception":
        raised = re.findall(r"raised (\w+)", first["detail"])
        key += tuple(raised)
    return key


def still_fails_like(result: dict, worker: Worker):
    """The shrinker's test: a candidate fails the way ``result`` did (see _failure_key)."""
    key = _failure_key(result)

    def fails(source: str) -> bool:
        again = worker.run({"id": "shrink", "source": source})
        return again["status"] in FAILED and _failure_key(again) == key

    return fails


def reproduce(result: dict, worker: Worker, budget: int = 400) -> str:
    """The shrunk program of a failure, with a header saying how it fails."""
    program = generate(result["seed"], avoid=result.get("avoid", ()))
    small = shrink(program, still_fails_like(result, worker), budget)
    final = worker.run({"id": "final", "source": small.source()})
    lines = [f"# framejit fuzz failure: program {result['seed']} ({signature(result)})",
             f"# shrunk from {program.size()} to {small.size()} statements; status {final['status']}"]
    for d in final.get("diffs", [])[:6]:
        lines.append(f"# call {d['call']}, {d['kind']}: {d['detail']}")
    if final.get("error"):
        lines.append(f"# {final['error']}")
    return "\n".join(lines) + "\n" + small.source()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per program")
    parser.add_argument("--out", default="build/fuzz-failures", help="folder for shrunk reproducers")
    parser.add_argument("--shrink", type=int, default=10,
                        help="shrink at most this many failures, one per distinct class")
    parser.add_argument("--program", type=int, help="run one program by id and print it")
    parser.add_argument("--reduce", type=int, help="shrink one failing program by id and print it")
    parser.add_argument("--avoid", default="", help="comma-separated generator.FEATURES to leave out")
    parser.add_argument("--backend", default="default",
                        help="framejit backend of the compiled side ('triton' runs generated kernels "
                             "on CPU tensors in Triton's interpreter; 'reference' runs the kernel "
                             "descriptions in their reference interpreter)")
    args = parser.parse_args(argv)
    # Workers inherit the environment; the interpreter must be on before they import triton.
    os.environ["FRAMEJIT_FUZZ_BACKEND"] = args.backend
    if args.backend == "triton":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    avoid = tuple(a for a in args.avoid.split(",") if a)

    if args.reduce is not None:
        worker = Worker(args.timeout)
        result = worker.run({"id": args.reduce, "seed": args.reduce, "avoid": list(avoid)})
        result["seed"], result["avoid"] = args.reduce, list(avoid)
        print(reproduce(result, worker) if result["status"] in FAILED else result)
        worker.close()
        return 0

    if args.program is not None:
        worker = Worker(args.timeout)
        print(generate(args.program, avoid=avoid).source())
        print(worker.run({"id": args.program, "seed": args.program, "avoid": list(avoid)}))
        worker.close()
        return 0

    summary = run_campaign(args.seed, args.count, args.jobs, args.timeout, progress=True,
                           avoid=avoid)
    print(summary.line(), flush=True)
    classes: dict[str, list] = {}
    for result in summary.failures:
        classes.setdefault(signature(result), []).append(result)
    for sig, results in sorted(classes.items(), key=lambda kv: -len(kv[1])):
        print(f"  {len(results):5d}  {sig}   e.g. program {results[0]['seed']}")
    if classes and args.shrink:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        worker = Worker(args.timeout)
        for results in list(classes.values())[:args.shrink]:
            # The smallest generated program of a class shrinks fastest.
            smallest = min(results[:20], key=lambda r: generate(r["seed"], avoid=avoid).size())
            path = out / f"seed{args.seed}-program{smallest['seed']}.py"
            path.write_text(reproduce(smallest, worker))
            print(f"  shrunk: {path}", flush=True)
        worker.close()
    return 1 if summary.differences or summary.crashes else 0


if __name__ == "__main__":
    sys.exit(main())
