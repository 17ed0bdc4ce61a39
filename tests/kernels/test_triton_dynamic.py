"""Triton kernels with run-time sizes: one launcher (one Triton function, one config) called on
inputs of many sizes, compared with eager torch and with the description's reference
interpreter. The kernels come from ``dynamic_launcher`` (symbolic.py), which makes chosen box
dimensions of a compiled function's kernel run-time sizes ``ks<d>``; on CPU tensors they run
in Triton's interpreter, so the sizes stay small."""

import json
import os
import subprocess
import sys

import pytest
import torch

from framejit import record
from framejit.kernels.reference import ReferenceLauncher
from framejit.kernels.triton_render import render
from framejit.kernels.triton_runtime import Launcher
from framejit.testing import assert_close_to_eager

from .symbolic import dynamic_launcher


def build(fn, args, dims):
    """The Triton and the reference launcher of ``fn``'s kernel with box dims ``dims`` made
    run-time sizes."""
    triton, _, _ = dynamic_launcher(fn, args, dims, Launcher, device=args[0].device)
    reference, _, _ = dynamic_launcher(fn, args, dims, ReferenceLauncher, device=args[0].device)
    assert triton.kernel.is_dynamic
    return triton, reference


def jit_key(launcher, args) -> list:
    """What Triton's compiled JIT keys its binaries on for a call (the argument types and
    specializations, then the constexprs), computed as ``JITFunction.run`` does: equal keys
    mean one binary. Under the interpreter nothing is compiled, so the key is computed from
    the kernel's Python function."""
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import JITFunction, create_function_from_signature

    fn = launcher.fn
    jit = fn if isinstance(fn, JITFunction) else JITFunction(fn.fn, **fn.kwargs)
    binder = create_function_from_signature(jit.signature, jit.params, BaseBackend)
    _, specialization, options = binder(*args, **launcher.config)
    return [specialization, sorted(options.items())]


def check_sizes(fn, triton, reference, make_args, shapes, *, upcast=False):
    """Call both launchers at each of ``shapes`` (the values of the run-time sizes, in order);
    compare with eager ``fn`` (``upcast``: eager computes in fp32 and rounds once, as the
    kernel does) and with each other; check that one build and one Triton binary serve them."""
    start = record.mark()
    keys = []
    for sizes in shapes:
        args = make_args(*sizes)
        expected = fn(*args)
        if upcast:
            expected = fn(*[a.float() for a in args]).to(expected.dtype)
        got, ref = triton(*args, *sizes), reference(*args, *sizes)
        assert_close_to_eager(got, expected)
        assert_close_to_eager(ref, expected)
        assert_close_to_eager(got, ref)
        outs = [torch.empty_like(got)]
        keys.append(jit_key(triton, [*args, *outs, *sizes]))
        if triton.device.type == "cuda" and len(keys) == 1:
            # One binary per config the first call tuned; later sizes must add none.
            kernel_cache = triton.fn.device_caches[torch.cuda.current_device()][0]
            binaries = len(kernel_cache)
    builds = [e for e in record.events_since(start)
              if isinstance(e, record.KernelBuilt) and e.names == [triton.name]]
    assert len(builds) == 1
    assert all(key == keys[0] for key in keys), "a size argument was specialized"
    if triton.device.type == "cuda":  # compiled for real: Triton's own cache says it
        assert len(kernel_cache) == binaries, "a later size compiled another binary"
    return triton


def randn(*shape, dtype=torch.float32, device="cpu"):
    return torch.randn(*shape, device=device).to(dtype)


# -- pointwise ------------------------------------------------------------------------------

def test_pointwise_with_broadcasting(device):
    def f(x, b):
        return x * 2 + b

    triton, reference = build(f, (randn(4, 8, device=device), randn(8, device=device)), [0, 1])
    check_sizes(f, triton, reference, lambda n, m: (randn(n, m, device=device), randn(m, device=device)),
                [(4, 8), (1, 1), (3, 13), (17, 5), (0, 3), (2, 64)])


def test_the_kernel_takes_its_sizes_as_arguments(device):
    def f(x, b):
        return torch.softmax(x + b, dim=-1)

    triton, _ = build(f, (randn(4, 8, device=device), randn(8, device=device)), [0, 1])
    source = triton.source
    assert "@_jit(do_not_specialize=('ks0', 'ks1'))" in source
    assert (f"def {triton.name}(in0, in1, out0, ks0: tl.int64, ks1: tl.int64, "
            f"XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):") in source
    assert "xnumel = ks0\n" in source and "rnumel = ks1\n" in source
    # A reduction over a run-time extent loops, so its config serves every row length.
    assert "for roffset in range(0, rnumel, RBLOCK):" in source
    assert "tl.program_id(0).to(tl.int64)" in source


# -- reductions -----------------------------------------------------------------------------

def test_softmax_over_a_dynamic_last_dim(device):
    def f(x):
        return torch.softmax(x, dim=-1)

    triton, reference = build(f, (randn(4, 8, device=device),), [0, 1])
    check_sizes(f, triton, reference, lambda n, m: (randn(n, m, device=device),),
                [(4, 8), (3, 40), (1, 1), (5, 3), (2, 9)])
    # The config comes from the first call: longer rows loop over its RBLOCK.
    assert triton.config["RBLOCK"] < 40


def test_softmax_first_called_on_long_rows_then_short_ones(device):
    def f(x):
        return torch.softmax(x * 0.5, dim=-1)

    triton, reference = build(f, (randn(3, 40, device=device),), [0, 1])
    check_sizes(f, triton, reference, lambda n, m: (randn(n, m, device=device),),
                [(3, 40), (4, 8), (1, 1), (2, 67)])


@pytest.mark.parametrize("name", ["sum", "amax"])
def test_reduction_over_dim_0(name, device):
    op = {"sum": torch.sum, "amax": torch.amax}[name]

    def f(x):
        return op(x * 2, 0, keepdim=True)

    triton, reference = build(f, (randn(5, 3, device=device),), [0, 1])
    check_sizes(f, triton, reference, lambda n, m: (randn(n, m, device=device),),
                [(5, 3), (1, 1), (33, 7), (2, 19)])


def test_layer_norm_over_a_dynamic_last_dim(device):
    # The kernel description has no op giving a run-time size as a value, so a mean over a
    # run-time extent would keep the example's 1/n as a constant: 1/n comes in as a tensor.
    # (Arguments in the order the kernel first reads them: its input order.)
    def f(x, inv_n, w, b):
        mean = torch.sum(x, -1, keepdim=True) * inv_n
        d = x - mean
        var = torch.sum(d * d, -1, keepdim=True) * inv_n
        return d * torch.rsqrt(var + 1e-5) * w + b

    def make(n, m):
        return (randn(n, m, device=device), torch.full((1,), 1.0 / m, device=device),
                randn(m, device=device), randn(m, device=device))

    triton, reference = build(f, make(4, 8), [0, 1])
    check_sizes(f, triton, reference, make, [(4, 8), (2, 37), (1, 1), (3, 5)])
    x, inv_n, w, b = make(3, 21)
    assert_close_to_eager(triton(x, inv_n, w, b, 3, 21),
                          torch.nn.functional.layer_norm(x, (21,), w, b), rtol=1e-5, atol=1e-5)


def test_argmax_over_a_dynamic_dim(device):
    def f(x):
        return torch.argmax(x * 1.0, dim=-1, keepdim=True)

    def make(n, m):
        x = randn(n, m, device=device)
        x[0, m // 2] = x[0, m - 1] = 50.0  # a tie: the first index wins
        return (x,)

    triton, reference = build(f, make(4, 8), [0, 1])
    check_sizes(f, triton, reference, make, [(4, 8), (3, 40), (1, 1), (5, 3)])


def test_half_precision_softmax(device):
    def f(x):
        return torch.softmax(x, dim=-1)

    make = lambda n, m: (randn(n, m, dtype=torch.float16, device=device),)  # noqa: E731
    triton, reference = build(f, make(4, 8), [0, 1])
    check_sizes(f, triton, reference, make, [(4, 8), (3, 21), (1, 1)], upcast=True)


def test_dropout_with_run_time_sizes(device):
    def f(x):
        return torch.nn.functional.dropout(x, 0.5) + x

    triton, _, _ = dynamic_launcher(f, (randn(32, device=device),), [0], Launcher, device=device)
    for n in (32, 1, 77, 300):
        x = randn(n, device=device).abs() + 1
        torch.manual_seed(n)
        got = triton(x, n)
        torch.manual_seed(n)
        assert torch.equal(triton(x, n), got)  # the seed comes from torch's generator
        kept = torch.isclose(got, 3 * x)
        assert torch.all(kept | torch.isclose(got, x))
        if n >= 77:
            assert 0.3 < kept.float().mean() < 0.7


# -- 3-D, two dynamic dims ------------------------------------------------------------------

def test_3d_reduction_over_a_static_middle_dim(device):
    # Dims 0 and 2 at run time; the reduced dim keeps its static size (and fits in registers).
    def f(x, y):
        return torch.softmax(x * y, dim=1)

    def make(a, c):
        return randn(a, 5, c, device=device), randn(5, 1, device=device)

    triton, reference = build(f, make(2, 3), [0, 2])
    assert [s.name for s in triton.kernel.symbols()] == ["ks0", "ks2"]
    assert "for roffset" not in triton.source  # persistent: rnumel is static
    check_sizes(f, triton, reference, make, [(2, 3), (1, 1), (3, 7), (1, 10)])


def test_3d_reduction_over_a_dynamic_last_dim(device):
    # y (b, 1) keeps the box 3-D: no two neighbouring dims merge for every operand.
    def f(x, y):
        return torch.sum(x * y, dim=-1, keepdim=True)

    def make(b, c):
        return randn(3, b, c, device=device), randn(b, 1, device=device)

    triton, reference = build(f, make(2, 4), [1, 2])
    assert len(triton.kernel.sizes) == 3
    check_sizes(f, triton, reference, make, [(2, 4), (1, 1), (5, 11), (2, 33)])


# -- Triton's compiler ----------------------------------------------------------------------

_COMPILE = """
import importlib.util, json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

for i, k in enumerate(json.load(open(sys.argv[1]))):
    spec = importlib.util.spec_from_file_location(f"kernel{i}", k["path"])
    module = importlib.util.module_from_spec(spec)
    module._jit = triton.jit
    spec.loader.exec_module(module)
    config = dict(k["config"])
    options = {"num_warps": config.pop("num_warps", 4)}
    if "enable_fp_fusion" in config:
        options["enable_fp_fusion"] = config.pop("enable_fp_fusion")
    sig = {name: "*" + t for name, t in k["buffers"]}
    sig.update({name: "i64" for name in k["sizes"]})
    sig.update({name: "i32" for name in k.get("numels", ())})
    sig.update({name: "constexpr" for name in config})
    constexprs = {(list(sig).index(name),): value for name, value in config.items()}
    src = ASTSource(getattr(module, k["name"]), signature=sig, constexprs=constexprs)
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    assert "ptx" in compiled.asm
    fmas = sum(line.split()[0].startswith("fma") for line in compiled.asm["ptx"].splitlines() if line.split())
    print("compiled", k["name"], "fma", fmas)
"""


def _compile_for_sm90(tmp_path, kernels: list[dict]) -> str:
    """_COMPILE's output for ``kernels``, in a process of its own without the interpreter."""
    listing = tmp_path / "kernels.json"
    listing.write_text(json.dumps(kernels))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    done = subprocess.run([sys.executable, "-c", _COMPILE, str(listing)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_dynamic_kernels_compile_for_a_gpu(tmp_path):
    """Triton's compiler, which checks more than the interpreter (types of loop-carried values,
    the int64 size arguments), takes the kernels: compiled for sm_90 down to PTX, without a GPU,
    in a process of its own (this one runs Triton's interpreter)."""
    pytest.importorskip("triton.backends.nvidia")
    from framejit.kernels.triton_runtime import configs

    types = {torch.float32: "fp32", torch.float16: "fp16", torch.int64: "i64"}

    cases = [
        (lambda x: torch.softmax(x, -1), (torch.randn(4, 8),), [0, 1]),
        (lambda x: torch.argmax(x * 1.0, -1, keepdim=True), (torch.randn(4, 8),), [0, 1]),
        (lambda x: torch.argmax(x * 1.0, -1, keepdim=True), (torch.randn(4, 8),), [0]),
        (lambda x: torch.amax(x * 2, 0, keepdim=True), (torch.randn(5, 3),), [0, 1]),
        (lambda x, y: torch.softmax(x * y, 1), (torch.randn(2, 5, 3), torch.randn(5, 1)), [0, 2]),
        (lambda x, b: x.half() * 2 + b, (torch.randn(4, 8), torch.randn(8)), [0, 1]),
        (lambda x: torch.nn.functional.dropout(x, 0.5) + x, (torch.randn(32),), [0]),
    ]
    kernels = []
    for i, (fn, args, dims) in enumerate(cases):
        launcher, _, values = dynamic_launcher(fn, args, dims, ReferenceLauncher)
        kernel = launcher.kernel
        path = tmp_path / f"kernel{i}.py"
        path.write_text(render(kernel))
        kernels.append({"path": str(path), "name": kernel.name,
                        "buffers": [(b.name, types[b.dtype]) for b in kernel.buffers],
                        "sizes": [s.name for s in kernel.symbols()],
                        "config": configs(kernel, False, values)[0]})
    assert _compile_for_sm90(tmp_path, kernels).count("compiled") == len(cases)


def test_kernels_are_compiled_without_fma_contraction(tmp_path):
    """On an H200, (x*1000) - (x*1000) + y was not y: the product, contracted into an FMA with
    the subtraction, gave its own rounding error (in fp16, LLVM first narrowed the rounded
    product to a 16-bit multiply, so a rounding eager does was skipped too). Kernels are
    compiled with enable_fp_fusion=False; the PTX, built for sm_90 without a GPU, shows it."""
    pytest.importorskip("triton.backends.nvidia")
    from framejit.kernels.triton_runtime import configs

    from .conftest import run_kernels

    types = {torch.float32: "fp32", torch.float16: "fp16"}
    kernels = []
    for i, (dtype, options) in enumerate([(torch.float16, True), (torch.float32, True),
                                          (torch.float16, False), (torch.float32, False)]):
        x, y = torch.randn(4, 40).to(dtype), torch.randn(4, 40).to(dtype)
        _, backend = run_kernels(lambda a, b: (a * 1000) - (a * 1000) + b, x, y, reference=True)
        (launcher,) = backend.kernels
        config = configs(launcher.kernel, False)[0]
        assert config["enable_fp_fusion"] is False
        if not options:  # as before: Triton's default, fusion on
            del config["enable_fp_fusion"]
        path = tmp_path / f"kernel{i}.py"
        path.write_text(render(launcher.kernel))
        kernels.append({"path": str(path), "name": launcher.kernel.name, "config": config,
                        "buffers": [(b.name, types[b.dtype]) for b in launcher.kernel.buffers],
                        "sizes": [], "numels": ["xnumel"]})
    out = _compile_for_sm90(tmp_path, kernels)
    fmas = [int(line.split()[-1]) for line in out.splitlines() if line.startswith("compiled")]
    assert fmas[:2] == [0, 0] and all(fmas[2:]), fmas


def test_a_first_call_tries_few_configs():
    # Each config tried on a GPU is a compile inside the first call: one for a pointwise
    # kernel (as Inductor's default mode), at most three for a reduction. A persistent
    # reduction of 4096-wide rows tries 8, 16 and 4 warps.
    from framejit.kernels.ir import Buffer, Kernel, Op
    from framejit.kernels.triton_runtime import configs

    f32 = torch.float32

    def kernel(n, reduce):
        ops = [Op("load", ("in0",), f32)]
        ops += [Op("reduce", ("sum", 0), f32)] if reduce else [Op("exp", (0,), f32)]
        ops += [Op("store", ("out0", 1), f32)]
        # configs() reads the sizes, the reduced dims and the inputs' strides only.
        return Kernel("k", (1024, n), (1,) if reduce else (),
                      [Buffer("in0", f32, (n, 1)), Buffer("out0", f32, (n, 1), is_output=True)], ops)

    assert len(configs(kernel(4096, reduce=False), interpret=False)) == 1
    for n in (16, 768, 3000, 4096, 8192, 50_000):
        found = configs(kernel(n, reduce=True), interpret=False)
        assert 1 <= len(found) <= 3, (n, found)
        assert len({tuple(sorted(c.items())) for c in found}) == len(found)
    wide = configs(kernel(4096, reduce=True), interpret=False)
    assert sorted(c["num_warps"] for c in wide) == [4, 8, 16] and all(c["XBLOCK"] == 1 for c in wide)
