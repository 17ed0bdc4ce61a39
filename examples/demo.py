"""framejit demo: compile a small GPT and show what happened.

    make demo      (or: .venv/bin/python examples/demo.py)

Prints the captured graph, the guards that decide when it is reused, the rewritten code, a
recompile with its reason, and timings against eager PyTorch and torch.compile(backend="eager").
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
import timeit
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from models import GPTConfig, TinyGPT  # noqa: E402

import framejit  # noqa: E402


def banner(title: str) -> None:
    print(f"\n=== {title} " + "=" * max(0, 72 - len(title)))


def per_call_ms(fn, *args, number=50) -> float:
    fn(*args)
    return min(timeit.repeat(lambda: fn(*args), number=number, repeat=5)) / number * 1e3


def main() -> None:
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=256, block_size=32, n_layer=2, n_head=4, n_embd=64)
    model = TinyGPT(cfg).eval()
    idx = torch.randint(0, cfg.vocab_size, (2, 16))
    dump_dir = tempfile.mkdtemp(prefix="framejit_dump_")

    compiled = framejit.compile(model, options={"dump_dir": dump_dir})
    t0 = time.perf_counter()
    out = compiled(idx)
    first = time.perf_counter() - t0
    expected = model(idx)
    entries = framejit._C.get_cache_entries(type(model).forward.__code__)
    info = entries[0][3]

    banner("What was captured")
    s = framejit.stats()
    print(f"TinyGPT ({cfg.n_layer} blocks, n_embd={cfg.n_embd}): {s['graphs']} graph, {s['ops']} operations, "
          f"{s['graph_breaks']} graph breaks, {s['fallbacks']} fallbacks, first call {first * 1e3:.1f} ms "
          f"(capture included)")
    print(f"same result as eager: {torch.allclose(out, expected, atol=1e-5)} "
          f"(max abs difference {(out - expected).abs().max().item():.2e})")

    banner("The graph (first 12 of its lines)")
    lines = str(info.graph_module.graph).splitlines()
    print("\n".join(lines[:12]))
    print(f"... {len(lines) - 12} more lines")

    banner("The guards: the cached graph runs only while these hold")
    guard_lines = info.guard_fn.__framejit_source__.strip().splitlines()
    print("\n".join(guard_lines[:24]))
    print(f"    ... {len(guard_lines) - 24} more lines (module identities, hyperparameters, "
          f"one tensor check per parameter)")

    banner("The rewritten forward (the trampoline calls this)")
    entry_lines = info.entry_source.strip().splitlines()
    print("\n".join(entry_lines[:8] + ["    ..."] + entry_lines[-2:]))

    banner("A recompile, and why")
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("  [%(name)s] %(message)s"))
    rlog = logging.getLogger("framejit.recompiles")
    rlog.addHandler(handler)
    rlog.setLevel(logging.INFO)
    compiled(torch.randint(0, cfg.vocab_size, (2, 24)))   # a longer sequence: new shape
    compiled(torch.randint(0, cfg.vocab_size, (2, 16)))   # the first shape again: cache hit
    rlog.removeHandler(handler)
    print(f"  cache entries now: {len(framejit._C.get_cache_entries(type(model).forward.__code__))}; "
          f"recompiles so far: {framejit.stats()['recompiles']}")

    banner("A graph break, and why")

    def generate_step(logits):
        probs = torch.softmax(logits[:, -1], dim=-1)
        token = int(probs.argmax(-1)[0].item())  # a Python int from a tensor: the graph stops here
        return probs * 2, token

    report = framejit.explain(generate_step)(out)
    print(f"  {report.graph_count} graphs, {report.graph_break_count} graph break:")
    for _, message in report.break_reasons:
        print("  " + message.replace("\n", "\n  "))

    banner("Timings per call (ms)")
    tc = torch.compile(model, backend="eager")
    e = per_call_ms(model, idx)
    f = per_call_ms(compiled, idx)
    t = per_call_ms(tc, idx)
    print(f"  eager {e:.3f}   framejit {f:.3f} ({f / e:.2f}x eager)   "
          f"torch.compile(backend='eager') {t:.3f} ({t / e:.2f}x eager)")

    banner("Debug dump")
    print(f"  everything above, per compiled version, is in {dump_dir}:")
    for root, _, files in sorted(os.walk(dump_dir)):
        for name in sorted(files):
            print("   ", os.path.relpath(os.path.join(root, name), dump_dir))


if __name__ == "__main__":
    main()
