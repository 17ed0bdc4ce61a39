"""framejit demo: compile a small GPT and show what happened.

    make demo      (or: .venv/bin/python examples/demo.py)

Prints the captured graph, the guards that decide when it is reused, a recompile with its reason
(through framejit's logs), a graph break, and timings against eager PyTorch and
torch.compile(backend="eager"): medians of repeated runs with their spread, and a note when a
difference is inside that noise. Writes a debug dump and its HTML report, and prints where.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
import timeit
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from models import GPTConfig, TinyGPT  # noqa: E402

import framejit  # noqa: E402


def banner(title: str) -> None:
    print(f"\n=== {title} " + "=" * max(0, 72 - len(title)))


def per_call_ms(fn, *args, number=20, repeat=15) -> list[float]:
    """Milliseconds per call, one figure per repeat (each the mean of ``number`` calls)."""
    fn(*args)
    return [t / number * 1e3 for t in timeit.repeat(lambda: fn(*args), number=number, repeat=repeat)]


def spread(samples: list[float]) -> tuple[float, float, float]:
    """(median, lower quartile, upper quartile)."""
    q = statistics.quantiles(samples, n=4)
    return statistics.median(samples), q[0], q[2]


def compare(name: str, samples: list[float], base: list[float]) -> str:
    """``name``'s median against eager's, and whether the difference is inside the noise: it
    is when the two interquartile ranges overlap."""
    m, lo, hi = spread(samples)
    bm, blo, bhi = spread(base)
    text = f"{name:<34} {m:7.3f} ms  (quartiles {lo:.3f}–{hi:.3f})"
    if base is samples:
        return text
    if lo <= bhi and blo <= hi:
        return text + f"  {m / bm:.2f}x eager: inside the noise, no real difference"
    return text + f"  {m / bm:.2f}x eager"


def main() -> None:
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=256, block_size=32, n_layer=2, n_head=4, n_embd=64)
    model = TinyGPT(cfg).eval()
    idx = torch.randint(0, cfg.vocab_size, (2, 16))
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    dump_dir = os.path.join(here, "build", "demo-dump")

    compiled = framejit.compile(model, options={"dump_dir": dump_dir})
    t0 = time.perf_counter()
    out = compiled(idx)
    first = time.perf_counter() - t0
    expected = model(idx)

    banner("What was captured")
    s = framejit.stats()
    print(f"TinyGPT ({cfg.n_layer} blocks, n_embd={cfg.n_embd}): {s['graphs']} graph, {s['ops']} operations, "
          f"{s['graph_breaks']} graph breaks, {s['fallbacks']} fallbacks, first call {first * 1e3:.1f} ms "
          f"(capture included)")
    print(f"same result as eager: {torch.allclose(out, expected, atol=1e-5)} "
          f"(max abs difference {(out - expected).abs().max().item():.2e})")

    # explain() compiles afresh and reports what happened (it reads framejit's record).
    report = framejit.explain(compiled)(idx)
    banner("The graph (first 12 of its lines)")
    lines = str(report.graphs[0]).splitlines()
    print("\n".join(lines[:12]))
    print(f"... {len(lines) - 12} more lines")

    banner("The guards: the cached graph runs only while these hold")
    guard_lines = report.guards[0].strip().splitlines()
    print("\n".join(guard_lines[:24]))
    print(f"    ... {len(guard_lines) - 24} more lines (module identities, hyperparameters, "
          f"one tensor check per parameter)")

    banner("A recompile, and why (FRAMEJIT_LOGS=recompiles, or framejit.set_logs)")
    framejit.set_logs("recompiles")
    sys.stdout.flush()
    compiled(torch.randint(0, cfg.vocab_size, (2, 24)))   # a longer sequence: new shape
    compiled(torch.randint(0, cfg.vocab_size, (2, 16)))   # the first shape again: cache hit
    sys.stderr.flush()
    framejit.set_logs()
    print(f"  recompiles so far: {framejit.stats()['recompiles']}")

    banner("A graph break, and why")

    def generate_step(logits):
        probs = torch.softmax(logits[:, -1], dim=-1)
        token = int(probs.argmax(-1)[0].item())  # a Python int from a tensor: the graph stops here
        return probs * 2, token

    report = framejit.explain(generate_step)(out)
    print(f"  {report.graph_count} graphs, {report.graph_break_count} graph break:")
    for b in report.breaks:
        print("  " + str(b).replace("\n", "\n  "))

    banner("Timings per call: median of 15 runs of 20 calls, with the quartiles")
    tc = torch.compile(model, backend="eager")
    e = per_call_ms(model, idx)
    f = per_call_ms(compiled, idx)
    t = per_call_ms(tc, idx)
    print("  " + compare("eager", e, e))
    print("  " + compare("framejit", f, e))
    print("  " + compare("torch.compile(backend='eager')", t, e))
    if framejit.stats()["kernels"] == 0:
        print("  framejit generated no kernels here: both compilers run the same torch operations "
              "as eager, only their per-call overhead differs.")

    banner("Debug dump and report")
    from framejit.debug.dump import run_folder
    from framejit.debug.report import write_report

    run = run_folder(dump_dir)
    page = write_report(run)
    print(f"  dump:   {run}")
    print("          (index.md there summarises it; one folder per compiled function)")
    print(f"  report: {page}")
    print(f"          (python -m framejit report {run} writes it again)")


if __name__ == "__main__":
    main()
