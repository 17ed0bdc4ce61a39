"""Dynamic shapes (issue 12): graphs and total time over loops whose sizes change, framejit
against torch.compile(backend="eager") and torch.compile (Inductor), from one run.

* ``10 shapes``: ``f(x)`` on ``(n, 16)`` inputs for n = 2..11 (a small pointwise + reduction);
* ``GPT-2 growing``: a small transformers GPT-2 (random weights) called on sequence lengths
  1..48, as a generation loop without a cache would;
* steady state: time per call at a size seen before, dynamic graph against a static one.

    python benchmarks/dynamic.py [--quick]
"""

from __future__ import annotations

import argparse
import sys
import time
import timeit
import types
import warnings

import torch
import torch._dynamo

import framejit


def f(x):
    return (torch.relu(x) * 2 + x.sum(-1, keepdim=True)).softmax(-1)


def _graphs_framejit() -> int:
    return framejit.stats()["graphs"]


def _graphs_torch() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def run_loop(compiled, inputs) -> float:
    t0 = time.perf_counter()
    with torch.no_grad():
        for args in inputs:
            compiled(*args)
    return time.perf_counter() - t0


def gpt2():
    import transformers as T

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return T.GPT2LMHeadModel(T.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128,
                                              n_positions=64, bos_token_id=0, eos_token_id=0)).eval()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="skip Inductor (slow to compile)")
    opts = ap.parse_args()
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, Python {sys.version.split()[0]}")
    compilers = [("framejit", lambda fn: framejit.compile(fn), _graphs_framejit),
                 ("torch.compile eager", lambda fn: torch.compile(fn, backend="eager"), _graphs_torch)]
    if not opts.quick:
        compilers.append(("torch.compile", lambda fn: torch.compile(fn), _graphs_torch))

    shapes = [(torch.randn(n, 16),) for n in range(2, 12)]
    model = gpt2()
    ids = torch.randint(0, 128, (1, 48))
    growing = [(ids[:, :n],) for n in range(1, 49)]
    print(f"{'loop':<16}{'compiler':<22}{'graphs':>7}{'total s':>10}{'eager s':>10}")
    # Warm the lazy initialisation every compiler shares (fake tensors, sympy, transformers).
    framejit.compile(f, dynamic=True)(torch.randn(3, 16))
    for loop, fn, inputs in (("10 shapes", f, shapes), ("GPT-2 growing", model, growing)):
        run_loop(fn, inputs)
        eager = run_loop(fn, inputs)
        for name, make, graphs in compilers:
            framejit.reset()
            torch._dynamo.reset()
            total = run_loop(make(fn), inputs)
            print(f"{loop:<16}{name:<22}{graphs():>7}{total:>10.3f}{eager:>10.3f}")
    print("  targets: at most 2 graphs in both loops; the growing loop faster in total than torch.compile's")
    print()

    # Steady state: a dynamic graph at a size seen before, against a static one of that size;
    # a tiny input shows the per-call overhead, a bigger one the kernels' own speed.
    for shape, number in (((8, 16), 2000), ((256, 1024), 100)):
        x = torch.randn(*shape)
        framejit.reset()
        # Two copies of f's code: cache entries live on the code object, and each wrapper's
        # calls would otherwise also walk the other wrapper's entries.
        static = framejit.compile(types.FunctionType(f.__code__.replace(), globals()), dynamic=False)
        dynamic = framejit.compile(types.FunctionType(f.__code__.replace(), globals()), dynamic=True)
        static(x)
        dynamic(x)
        s = d = float("inf")
        for _ in range(7):  # interleaved: the machine is shared and noisy
            s = min(s, timeit.timeit(lambda fn=static, a=x: fn(a), number=number) / number * 1e6)
            d = min(d, timeit.timeit(lambda fn=dynamic, a=x: fn(a), number=number) / number * 1e6)
        print(f"steady state per call at {shape} (µs): static {s:.2f}, dynamic {d:.2f} "
              f"({(d / s - 1) * 100:+.1f}%)")
    print("  target: dynamic within 10% of static")


if __name__ == "__main__":
    main()
