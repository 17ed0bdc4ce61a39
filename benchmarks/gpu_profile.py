"""Where a CUDA forward pass spends its time, for eager torch, framejit and Inductor side by side:
wall time per call, the GPU's busy time per call (the sum of its kernels' times), the number of
kernels launched per call, and the kernels that take the most time. A wall time well above the
GPU time means the host is the bottleneck (launch and Python overhead), not the kernels.

    python benchmarks/gpu_profile.py [--model NAME[,NAME]] [--top N] [--dtype bf16|fp16|fp32]

NAME is a row name of benchmarks/models.py's CUDA forward table, or its start ("GPT-2", "Llama",
"GPT block"); the default profiles the GPT block, GPT-2, BERT and T5. Also prints the host time of one
launch of a tiny fused kernel (ten pointwise ops on a 4x4 tensor), where launch overhead is all
there is. Needs CUDA.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import timeit
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch._dynamo  # noqa: E402
from timing import time_ms  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import framejit  # noqa: E402


def _load(name: str, file: str):
    """A benchmark script as a module of another name (benchmarks/models.py imports the
    examples' ``models`` itself)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, file))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_forward_cases = _load("bench_models", "models.py")._forward_cases
ten_ops = _load("bench_overhead", "overhead.py").ten_ops

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def gpu_profile(fn, calls: int = 5):
    """(GPU ms per call, kernels per call, [(kernel name, ms per call)]) over ``calls`` calls."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    total = sum(e.device_time for e in kernels) / 1e3 / calls
    by_name: dict[str, float] = {}
    for e in kernels:
        by_name[e.name] = by_name.get(e.name, 0.0) + e.device_time / 1e3 / calls
    top = sorted(by_name.items(), key=lambda kv: -kv[1])
    return total, len(kernels) / calls, top


def launch_us(fn, args, number: int = 2000) -> float:
    """Host microseconds per call of ``fn(*args)``, not waiting for the GPU (tiny tensors: the
    GPU keeps up, so this is the launch path's own cost)."""
    fn(*args)
    torch.cuda.synchronize()
    best = min(timeit.repeat(lambda: fn(*args), number=number, repeat=5)) / number * 1e6
    torch.cuda.synchronize()
    return best


def launch_paths(x: torch.Tensor) -> None:
    """Host µs of one launch of a one-kernel function's kernel, through the compiled binary
    (framejit's direct launch) and through Triton's ``JITFunction`` launch."""
    from framejit.testing import built_by_pipeline

    framejit.reset()
    with built_by_pipeline() as built:
        framejit.compile(lambda x: x * 2 + 1)(x)
    (launcher,) = [k for fn in built for k in fn.framejit_kernels]
    if getattr(launcher, "_slow", None) is None:
        print(f"One kernel launch: {launcher!r} is not a Triton kernel; no launch paths to compare")
        return
    direct = launch_us(launcher, (x,)) if launcher.direct else None
    slow = launch_us(launcher._slow, (x,))
    shown = f"{direct:8.1f}" if direct is not None else "     off"
    print(f"One kernel launch (host µs): direct {shown}   through Triton's JITFunction {slow:8.1f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="GPT block,GPT-2,BERT,T5")
    ap.add_argument("--top", type=int, default=6)
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    opts = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs CUDA")
        return 2
    warnings.filterwarnings("ignore")
    try:
        import transformers

        transformers.logging.set_verbosity_error()
    except ImportError:
        pass
    device, dtype = torch.device("cuda"), DTYPES[opts.dtype]

    x, y = torch.randn(4, 4, device=device), torch.randn(4, 4, device=device)
    framejit.reset()
    torch._dynamo.reset()
    fj, ind = framejit.compile(ten_ops), torch.compile(ten_ops)
    print("One launch of ten fused pointwise ops on 4x4 CUDA tensors (host µs per call)")
    print(f"  eager (10 kernels) {launch_us(ten_ops, (x, y)):8.1f}   framejit "
          f"{launch_us(fj, (x, y)):8.1f} ({framejit.stats()['kernels']} kernel)   "
          f"Inductor {launch_us(ind, (x, y)):8.1f}")

    launch_paths(x)

    wanted = [w.strip() for w in opts.model.split(",")]
    for name, make, make_args, make_kwargs in _forward_cases(tiny=False, quick=True):
        if not any(name.startswith(w) for w in wanted):
            continue
        torch.manual_seed(0)
        model = make().to(device=device, dtype=dtype).eval()
        args, kwargs = make_args(device, dtype), make_kwargs(device, dtype)
        framejit.reset()
        torch._dynamo.reset()
        contenders = {"eager": model, "framejit": framejit.compile(model),
                      "Inductor": torch.compile(model)}
        print()
        print(f"{name}, {opts.dtype}: wall ms per call, GPU busy ms per call, kernels per call")
        with torch.no_grad():
            for label, m in contenders.items():
                call = lambda m=m, a=args, k=kwargs: m(*a, **k)  # noqa: E731
                call()
                wall = time_ms(call, device, quick=True)
                gpu, launches, top = gpu_profile(call)
                print(f"  {label:<9} wall {wall:7.3f}  gpu {gpu:7.3f}  kernels {launches:6.1f}")
                for kname, ms in top[:opts.top]:
                    print(f"      {ms:7.3f}  {kname[:110]}")
        model = args = kwargs = contenders = None
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
