"""First call of GPT-2 under ``framejit.compile(model)`` with warm kernel caches.

    python benchmarks/first_call.py [--repeat N] [--stages]

The model and sizes are those of ``benchmarks/models.py --device cpu --threads N`` (batch 2,
sequence 128, width 256, 4 heads, 2 layers, vocabulary 4096), forward only under no_grad with
one thread. Each measurement runs in a fresh process, after one untimed compile of a tiny
function (imports and initialisation, as models.py does) and after a first process has filled
the kernel cache: what it times is capture, passes, kernel lookup and the call itself. With
``--stages`` each process also prints framejit's recorded stages. With ``--after-eager`` the
model first runs once in eager mode, untimed, as in models.py (which takes the eager result as
its reference first): then the timed call no longer pays what any first forward in a process
pays (the BLAS library's first matrix products, first allocations: about 5 ms here). The graph
cache (framejit/graph_cache.py) is warm too: the compile of the captured graph is read from
it; ``--no-graph-cache`` times the compile itself (``FRAMEJIT_GRAPH_CACHE=0``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

# This checkout's framejit, whatever the environment has installed.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def measure(stages: bool, after_eager: bool) -> float:
    warnings.filterwarnings("ignore")
    import torch

    import framejit
    from framejit import record

    torch.set_num_threads(1)
    import transformers as T

    T.logging.set_verbosity_error()
    framejit.compile(lambda x: (x * 2).relu())(torch.randn(8, 8))  # initialise, untimed
    framejit.reset()
    batch, seq, width, heads, layers, vocab = 2, 128, 256, 4, 2, 4096
    torch.manual_seed(0)
    model = T.GPT2LMHeadModel(T.GPT2Config(n_layer=layers, n_embd=width, n_head=heads,
                                           vocab_size=vocab, n_positions=seq)).eval()
    ids = torch.randint(0, vocab, (batch, seq))
    events: list = []
    record.subscribe(events.append)
    with torch.no_grad():
        if after_eager:
            model(ids)
        compiled = framejit.compile(model)
        t0 = time.perf_counter()
        compiled(ids)
        seconds = time.perf_counter() - t0
    if stages:
        for e in events:
            if type(e).__name__ in ("Stage", "GraphCompiled", "FrameCaptured", "KernelBuilt"):
                what = getattr(e, "name", "") or getattr(e, "language", "") or ""
                print(f"  {type(e).__name__:14s} {what:8s} {e.seconds * 1e3:7.1f} ms")
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5, help="fresh processes timed")
    ap.add_argument("--stages", action="store_true", help="print recorded stages per process")
    ap.add_argument("--after-eager", action="store_true",
                    help="run the model once in eager mode first, untimed (as models.py does)")
    ap.add_argument("--no-graph-cache", action="store_true",
                    help="compile the captured graph afresh in each process (FRAMEJIT_GRAPH_CACHE=0)")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child process
    opts = ap.parse_args()
    if opts.one:
        print(f"{measure(opts.stages, opts.after_eager) * 1e3:.1f}")
        return
    child = [sys.executable, __file__, "--one"] + (["--stages"] if opts.stages else []) \
        + (["--after-eager"] if opts.after_eager else [])
    env = {**os.environ, "FRAMEJIT_GRAPH_CACHE": "0"} if opts.no_graph_cache else None
    subprocess.run(child, check=True, capture_output=True, env=env)  # fills the caches
    times = []
    for _ in range(opts.repeat):
        out = subprocess.run(child, check=True, capture_output=True, text=True, env=env).stdout
        if opts.stages:
            print(out, end="")
        times.append(float(out.strip().splitlines()[-1]))
    after = (", after an eager call" if opts.after_eager else "") \
        + (", no graph cache" if opts.no_graph_cache else "")
    print(f"GPT-2 first call, warm caches{after}, {opts.repeat} processes: min {min(times):.1f} ms, "
          f"median {statistics.median(times):.1f} ms ({', '.join(f'{t:.0f}' for t in times)})")


if __name__ == "__main__":
    main()
