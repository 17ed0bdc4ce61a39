"""Per-call overhead and first-call capture time: eager vs framejit vs torch.compile(backend="eager").

Prints figures side by side from one run, with ratios, because the machines are noisy. Per-call
overhead is (compiled time per call − eager time per call) on tiny tensors, where dispatch and
guard costs dominate. First-call capture time is the wall time of the first call after a reset,
minus one eager call.

    python benchmarks/overhead.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import timeit
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

import torch  # noqa: E402
import torch._dynamo  # noqa: E402
from models import Block, GPTConfig, ops_chain  # noqa: E402

import framejit  # noqa: E402


def per_call_us(fn, args, number: int, repeat: int = 7) -> float:
    fn(*args)
    return min(timeit.repeat(lambda: fn(*args), number=number, repeat=repeat)) / number * 1e6


def ten_ops(x, y):
    z = x + y
    z = torch.relu(z)
    z = z * 2.0
    z = z - y
    z = torch.sigmoid(z)
    z = z.sum(-1, keepdim=True) + z
    z = z.tanh()
    z = z / 3.0
    z = torch.exp(z)
    return z.mean()


def add_one(x):
    return x + 1


def first_call_s(make_fn, args, compiler, reps: int) -> float:
    """Median wall time of the first call of a freshly compiled function, capture included."""
    times = []
    for _ in range(reps):
        framejit.reset()
        torch._dynamo.reset()
        fn = make_fn()
        compiled = compiler(fn)
        t0 = time.perf_counter()
        compiled(*args)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (for smoke tests)")
    opts = ap.parse_args()
    number = 2000 if opts.quick else 20000
    reps = 2 if opts.quick else 5
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)

    # Capture against capture: both with their eager backend (framejit's default would add its
    # C kernels' passes and build, torch.compile's Inductor its own; see benchmarks/models.py).
    fj = lambda f: framejit.compile(f, backend="eager")       # noqa: E731
    fj_default = lambda f: framejit.compile(f)                # noqa: E731
    tc = lambda f: torch.compile(f, backend="eager")          # noqa: E731

    print(f"torch {torch.__version__}, Python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    print()
    print("Per-call time (µs; tiny CPU tensors, so dispatch and guards dominate; both compilers'")
    print("eager backends, and framejit's default backend with its C kernels)")
    print(f"{'function':<16}{'eager':>9}{'framejit':>10}{'fj default':>11}{'torch.compile':>15}"
          f"{'fj overhead':>13}{'tc overhead':>13}{'fj/tc overhead':>16}")
    x, y = torch.randn(4, 4), torch.randn(4, 4)
    rows = []
    # "(dynamic)": every size symbolic (dynamic=True), so the guards check size relations.
    for name, fn, args, dynamic in [("x + 1", add_one, (x,), None), ("10 ops", ten_ops, (x, y), None),
                                    ("x + 1 (dynamic)", add_one, (x,), True)]:
        framejit.reset()
        torch._dynamo.reset()
        e = per_call_us(fn, args, number)
        f = per_call_us(framejit.compile(fn, backend="eager", dynamic=dynamic), args, number)
        d = per_call_us(framejit.compile(fn, dynamic=dynamic), args, number)
        t = per_call_us(torch.compile(fn, backend="eager", dynamic=dynamic), args, number)
        ratio = (f - e) / (t - e)
        rows.append(ratio)
        print(f"{name:<16}{e:>9.2f}{f:>10.2f}{d:>11.2f}{t:>15.2f}{f - e:>13.2f}{t - e:>13.2f}"
              f"{ratio:>16.3f}")
    print("  target: framejit overhead at most 1/5 (0.200) of torch.compile's")
    print()

    print("First call, capture included (ms; median of", reps, "fresh compiles)")
    print(f"{'function':<12}{'eager':>9}{'framejit':>10}{'fj default':>11}{'torch.compile':>15}"
          f"{'tc/fj speedup':>15}")
    # Warm both compilers' imports and lazy initialisation once.
    first_call_s(lambda: add_one, (x,), fj, 1)
    first_call_s(lambda: add_one, (x,), fj_default, 1)
    first_call_s(lambda: add_one, (x,), tc, 1)
    cfg = GPTConfig(n_embd=64, n_head=4, block_size=32)
    block = Block(cfg).eval()
    xb = torch.randn(2, 16, 64)
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    cases = [
        ("50 ops", lambda: ops_chain(50), (a, b)),
        ("GPT block", lambda: block, (xb,)),
    ]
    for name, make, args in cases:
        e = per_call_us(make(), args, 10, repeat=3) / 1e3
        f = first_call_s(make, args, fj, reps) * 1e3
        d = first_call_s(make, args, fj_default, reps) * 1e3
        t = first_call_s(make, args, tc, reps) * 1e3
        print(f"{name:<12}{e:>9.2f}{f:>10.2f}{d:>11.2f}{t:>15.2f}{t / f:>14.1f}x")
    print("  target: framejit's first call at least 5x faster than torch.compile's (eager backends;")
    print("  'fj default' adds the compile and the C kernels' build, read from the graph and kernel")
    print("  caches after the first)")
    print()
    small_models(reps)
    print()
    launch_path(number)


def small_models(reps: int) -> None:
    """Per-call time of transformers models so small that Python work dominates: the guards
    (a model's whole module tree and config), the wrapper and each op's dispatch."""
    try:
        import transformers as T
    except ImportError:
        print("(transformers is not installed: no small-model rows)")
        return
    T.logging.set_verbosity_error()
    width, heads, layers, vocab, seq = 32, 2, 2, 128, 8
    tokens = lambda: torch.randint(0, vocab, (1, seq))  # noqa: E731
    cases = [
        ("GPT-2", lambda: T.GPT2LMHeadModel(T.GPT2Config(
            n_layer=layers, n_embd=width, n_head=heads, vocab_size=vocab, n_positions=seq)), {}),
        ("BERT", lambda: T.BertModel(T.BertConfig(
            num_hidden_layers=layers, hidden_size=width, num_attention_heads=heads,
            intermediate_size=4 * width, vocab_size=vocab, max_position_embeddings=seq)), {}),
        ("Llama", lambda: T.LlamaForCausalLM(T.LlamaConfig(
            num_hidden_layers=layers, hidden_size=width, num_attention_heads=heads,
            num_key_value_heads=1, intermediate_size=64, vocab_size=vocab,
            max_position_embeddings=seq)), {}),
        ("T5", lambda: T.T5Model(T.T5Config(
            num_layers=layers, d_model=width, num_heads=heads, d_ff=4 * width,
            d_kv=width // heads, vocab_size=vocab)), {"decoder_input_ids": tokens()}),
    ]
    print(f"Per-call time of tiny transformers models (µs; width {width}, {layers} layers, "
          f"{seq} tokens, no_grad, {torch.get_num_threads()} threads)")
    print(f"{'model':<8}{'eager':>9}{'fj default':>11}{'tc eager':>10}{'inductor':>10}"
          f"{'fj/inductor':>13}")
    ids = tokens()
    for name, make, kwargs in cases:
        model = make().eval()
        call = lambda m, kw=kwargs: (lambda: m(ids, **kw))  # noqa: E731
        with torch.no_grad():
            framejit.reset()
            torch._dynamo.reset()
            fns = [call(model), call(framejit.compile(model)),
                   call(torch.compile(model, backend="eager")), call(torch.compile(model))]
            for fn in fns:
                fn()
            # Interleaved rounds, the best of each (a noisy machine only ever adds time).
            best = [float("inf")] * len(fns)
            for _ in range(reps):
                for i, fn in enumerate(fns):
                    best[i] = min(best[i], per_call_us(lambda fn=fn: fn(), (), 100, repeat=1))
        e, f, t, i = best
        print(f"{name:<8}{e:>9.0f}{f:>11.0f}{t:>10.0f}{i:>10.0f}{f / i:>13.2f}")
    print("  fj/inductor < 1: framejit's call costs less than torch.compile's (Inductor)")


class _NoLaunch:
    """Stands in for a Triton kernel: ``kernel[grid](...)`` does nothing."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def launch_path(number: int) -> None:
    """framejit's own Python work per kernel launch on a cache hit (allocate the outputs, call
    the kernel), with Triton's launch replaced by a no-op: what the launch path adds on top
    of Triton's launcher. Measured without a GPU, on CPU tensors."""
    from framejit.kernels.ir import Buffer, Kernel, Op
    from framejit.kernels.triton_runtime import Launcher

    f32 = torch.float32
    kernel = Kernel("bench_add", (4, 4), (), [Buffer("in0", f32, (4, 1)), Buffer("in1", f32, (4, 1)),
                                             Buffer("out0", f32, (4, 1), is_output=True)],
                    [Op("load", ("in0",), f32), Op("load", ("in1",), f32), Op("add", (0, 1), f32),
                     Op("store", ("out0", 2), f32)])
    launcher = Launcher(kernel, [((4, 4), (4, 1), f32)], torch.device("cuda"), None)
    launcher.device = torch.device("cpu")
    launcher.fn = _NoLaunch()
    launcher._set_config(launcher.configs[0])
    launcher._build_fast()
    x, y = torch.randn(4, 4), torch.randn(4, 4)
    from framejit.kernels.launch import _EMPTY_STRIDED_CPU as empty  # what a CPU launch uses

    if empty is None:
        alloc = per_call_us(lambda: torch.empty_strided((4, 4), (4, 1), dtype=f32), (), number)
    else:
        alloc = per_call_us(lambda: empty((4, 4), (4, 1), f32), (), number)
    ours = per_call_us(launcher, (x, y), number)
    add = per_call_us(torch.add, (x, y), number)
    print("Kernel launch path (µs per launch; Triton's launch replaced by a no-op, CPU tensors)")
    print(f"{'framejit launch':<28}{ours:>8.2f}")
    print(f"{'  of which output alloc':<28}{alloc:>8.2f}")
    print(f"{'eager torch.add (reference)':<28}{add:>8.2f}")


if __name__ == "__main__":
    main()
