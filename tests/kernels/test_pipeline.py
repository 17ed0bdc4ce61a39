"""The whole kernel pipeline on code as users write it (torch functions, nn.Modules): the
passes decompose, the partitioner groups, kernels run (Triton's interpreter on CPU tensors, and
the C kernels: the ``renderer`` fixture runs each test through both), and the results match
eager."""

import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import framejit
from framejit.testing import assert_close_to_eager

from .conftest import kernel_backend_name, run_kernels

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def rms_norm(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


PATTERNS = {
    "softmax": (lambda x: F.softmax(x, dim=-1), lambda d, dev: [torch.randn(6, 50, device=dev, dtype=d) * 4]),
    "log_softmax": (lambda x: F.log_softmax(x, dim=-1), lambda d, dev: [torch.randn(6, 50, device=dev, dtype=d)]),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (48,), w, b),
                   lambda d, dev: [torch.randn(2, 5, 48, device=dev, dtype=d) + 3,
                                   torch.randn(48, device=dev, dtype=d), torch.randn(48, device=dev, dtype=d)]),
    "rms_norm": (rms_norm, lambda d, dev: [torch.randn(7, 40, device=dev, dtype=d), torch.randn(40, device=dev, dtype=d)]),
    "gelu_bias": (lambda x, b: F.gelu(x + b, approximate="tanh"),
                  lambda d, dev: [torch.randn(9, 33, device=dev, dtype=d) * 3, torch.randn(33, device=dev, dtype=d)]),
    "gelu_exact": (lambda x, b: F.gelu(x + b),
                   lambda d, dev: [torch.randn(9, 33, device=dev, dtype=d) * 3, torch.randn(33, device=dev, dtype=d)]),
    "swiglu": (lambda a, b: F.silu(a) * b,
               lambda d, dev: [torch.randn(9, 33, device=dev, dtype=d) * 3, torch.randn(9, 33, device=dev, dtype=d)]),
    "residual_norm": (lambda x, r, w, b: (lambda h: (h, F.layer_norm(h, (64,), w, b)))(x + r),
                      lambda d, dev: [torch.randn(4, 64, device=dev, dtype=d), torch.randn(4, 64, device=dev, dtype=d),
                                      torch.randn(64, device=dev, dtype=d), torch.randn(64, device=dev, dtype=d)]),
    "centered": (lambda x: x - x.mean(-1, keepdim=True), lambda d, dev: [torch.randn(8, 30, device=dev, dtype=d) + 10]),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_each_pattern_is_one_kernel_and_matches_eager(name, dtype, device):
    fn, make = PATTERNS[name]
    args = make(dtype, device)
    got, backend = run_kernels(fn, *args)
    assert len(backend.kernels) == 1, [str(k.kernel) for k in backend.kernels]
    # Each fp16/bf16 value the program computes is rounded as eager rounds it (the composite
    # ops compute in fp32 inside): eager's results, within the dtype's tolerance.
    assert_close_to_eager(got, fn(*args))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16],
                         ids=["fp32", "fp16", "bf16"])
def test_layer_norm_of_a_row_of_equal_values_is_its_bias(dtype, device):
    # x - sum(x)/n left the mean's rounding in each value of a row of equal values, and
    # rsqrt(eps) made it 5e-4 where eager gives exactly the bias; the corrected two-pass form
    # takes the mean of x - mean off again. Rows of 24 and 1000, through the renderer and the
    # reference interpreter; and a training batch norm's constant channel (eager itself is
    # 4e-4 off there: ours is the bias exactly, within eager's error of it).
    def ln(x, w, b):
        return F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)

    for n in (24, 1000):
        x = torch.randn(6, n, device=device).to(dtype)
        x[1], x[4] = 37.123, -0.3
        w = torch.randn(n, device=device).to(dtype)
        b = torch.randn(n, device=device).to(dtype)
        for reference in (False, True):
            got, _ = run_kernels(ln, x, w, b, reference=reference)
            assert torch.equal(got[1], b) and torch.equal(got[4], b), (n, reference)
            assert_close_to_eager(got, ln(x, w, b))
    x = torch.randn(4, 3, 5, 5, device=device).to(dtype)
    x[:, 1] = 37.123
    w, b = torch.randn(3, device=device).to(dtype), torch.randn(3, device=device).to(dtype)

    def bn(x, w, b):
        return F.batch_norm(x, None, None, w, b, True, 0.1, 1e-5)

    got, backend = run_kernels(bn, x, w, b)
    assert backend.kernels
    assert torch.equal(got[:, 1], b[1].expand(4, 5, 5))
    assert_close_to_eager(got, bn(x, w, b), atol=1e-3 if dtype == torch.float32 else None)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("form", ["to", "method", "sum_dtype", "softmax_dtype", "from_int"])
@pytest.mark.parametrize("reference", [False, True], ids=["renderer", "reference"])
def test_a_conversion_the_program_asks_for_rounds_inside_a_kernel(form, dtype, reference, device):
    # fp16/bf16 values are fp32 inside a kernel, but a conversion the program wrote is rounded
    # where the kernel reads it: x.half().float() * 2 was x * 2 unrounded, and 70000 stayed
    # finite where eager's fp16 gives inf; sum(dtype=torch.float16) summed unrounded elements.
    fns = {
        "to": lambda x: x.to(dtype).float() * 2,
        "method": lambda x: (x.half() if dtype == torch.float16 else x.bfloat16()).double() + 1,
        "sum_dtype": lambda x: x.sum(-1, dtype=dtype),
        "softmax_dtype": lambda x: F.softmax(x, -1, dtype=dtype),
        "from_int": lambda x: (x * 1000).long().to(dtype).float() - 1,
    }
    x = torch.randn(6, 40, device=device) * 30 + 1.001
    x[0, :4] = torch.tensor([7e4, -7e4, 65519.0, 3.0e38])
    fn = fns[form]
    got, backend = run_kernels(fn, x, reference=reference)
    expected = fn(x)
    assert len(backend.kernels) == 1, [str(k.kernel) for k in backend.kernels]
    if form in ("to", "method", "from_int"):
        assert torch.equal(got, expected)  # every step exact but the conversion itself
    else:
        assert_close_to_eager(got, expected)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("form", ["eq_number", "eq_tensor", "float", "isinf", "div", "sub_self",
                                  "to_int", "softmax", "sum"])
@pytest.mark.parametrize("reference", [False, True], ids=["renderer", "reference"])
def test_an_fp16_value_read_inside_a_kernel_is_held_in_its_dtype(form, dtype, reference, device):
    # Eager rounds every fp16/bf16 result, and the next op reads the rounded value. A kernel
    # computed in fp32 and rounded only on store: (z + 0.1) == 0.1 was False for fp16 zeros,
    # (a / 3) == y for y = a / 3 computed eagerly was False for two thirds of the values, and
    # a * 1000 never overflowed to inf (.float(), == inf, / 1000, softmax), and 50 * 1000 was
    # 50000 where fp16 holds 49984 (.to(int32)).
    fns = {
        "eq_number": lambda a, y: (a * 0 + 0.1) == 0.1,
        "eq_tensor": lambda a, y: (a / 3) == y,
        "float": lambda a, y: (a * 1000).float(),
        "isinf": lambda a, y: ((a * 1000).abs() == float("inf")) | (a + y > 1),
        "div": lambda a, y: (a * 1000) / 1000,
        "sub_self": lambda a, y: (a * 1000) - (a * 1000) + y,
        "to_int": lambda a, y: torch.where((a * 1000).abs() < 1e6, a * 1000, 0).to(torch.int32),
        "softmax": lambda a, y: (a * 1000).softmax(-1),
        "sum": lambda a, y: (a * 1000).sum(-1, keepdim=True) + y,
    }
    a = (torch.randn(4, 40, device=device) * 3).to(dtype)
    a[0, :5] = torch.tensor([1.0, 50.0, 70.0, 100.0, -100.0]).to(dtype)
    if dtype == torch.bfloat16:
        a[0, 2:5] = torch.tensor([3e35, 4e35, -5e35]).to(dtype)  # a * 1000 overflows bf16 too
    y = a / 3
    fn = fns[form]
    got, backend = run_kernels(fn, a, y, reference=reference)
    assert len(backend.kernels) == 1, [str(k.kernel) for k in backend.kernels]
    expected = fn(a, y)
    if form in ("softmax", "sum"):
        assert_close_to_eager(got, expected)
        assert torch.equal(got.isnan(), expected.isnan())
    else:
        torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("form", ["add", "sub", "rsub", "add_0dim", "add_alpha", "sub_alpha",
                                  "rsub_alpha", "mul", "mul_0dim", "div_0dim", "div", "sqrt_pow",
                                  "rsqrt_pow"])
@pytest.mark.parametrize("reference", [False, True], ids=["renderer", "reference"])
def test_numbers_in_16_bit_arithmetic_are_taken_as_eager_s_kernels_take_them(form, dtype,
                                                                            reference, device):
    # Eager's CPU add and sub convert a number (and alpha=) to the fp16/bf16 result's dtype
    # before adding in fp32; its mul and div take it as given. x + 0.2123 was a unit of the last
    # place off in a sixth of the values, torch.add(x, y, alpha=s) in a tenth. Eager's fp16
    # power is std::pow: pow(-0, 0.5) is +0 and pow(-inf, 0.5) is +inf. Its CUDA kernels take a
    # number as given, and a 0-dim tensor of another dtype on the GPU converted to the result's.
    s = 0.2123456789
    fns = {
        "add": lambda x, y: x + s,
        "sub": lambda x, y: (x - s).exp(),
        "rsub": lambda x, y: s - x,
        "add_0dim": lambda x, y: x + torch.tensor(s, device=x.device),
        "add_alpha": lambda x, y: torch.add(x, y, alpha=s),
        "sub_alpha": lambda x, y: torch.sub(x, y, alpha=3) * 2,
        "rsub_alpha": lambda x, y: torch.rsub(y, 2.3, alpha=0.77),
        "mul": lambda x, y: x * s + y,
        "mul_0dim": lambda x, y: x * torch.tensor(s, device=x.device) + y,
        "div_0dim": lambda x, y: x / torch.tensor(s, device=x.device, dtype=torch.float64),
        "div": lambda x, y: x / s - y,
        "sqrt_pow": lambda x, y: (x * 1) ** 0.5,
        "rsqrt_pow": lambda x, y: (x * 1) ** -0.5,
    }
    torch.manual_seed(0)
    x, y = (torch.randn(4, 256, device=device) * 3).to(dtype), torch.randn(256, device=device).to(dtype)
    x[0, :4] = torch.tensor([-0.0, float("-inf"), float("inf"), 0.0])
    fn = fns[form]
    got, backend = run_kernels(fn, x, y, reference=reference)
    assert len(backend.kernels) == 1, [str(k.kernel) for k in backend.kernels]
    torch.testing.assert_close(got, fn(x, y), rtol=0, atol=0, equal_nan=True)
    if "pow" in form:  # the zeros' signs (a NaN's sign means nothing)
        want = fn(x, y)
        assert torch.equal(got.signbit() & ~got.isnan(), want.signbit() & ~want.isnan())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_values_the_dtype_holds_exactly_are_not_rounded_again(dtype, device):
    # A rotary embedding: x * cos and cat([-x2, x1]) * sin are rounded as eager rounds them;
    # -x2 and the cat of loaded values are already values of the dtype (rounding them again
    # made the bf16 pattern 1.6x slower).
    def rotary(x, cos, sin):
        h = x.shape[-1] // 2
        return x * cos + torch.cat([-x[..., h:], x[..., :h]], -1) * sin

    x, c, s = (torch.randn(*shape, device=device).to(dtype) for shape in ((6, 32), (32,), (32,)))
    got, backend = run_kernels(rotary, x, c, s)
    (kernel,) = backend.kernels
    assert sum(op.kind == "round" for op in kernel.kernel.ops) == 2, str(kernel.kernel)
    torch.testing.assert_close(got, rotary(x, c, s), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("form", ["ge", "le", "eq", "int_number", "ne_scalar_first", "where",
                                  "masked_fill", "clamp_max", "clamp_min", "ge_tensor",
                                  "where_tensor", "maximum_tensor", "clamp_tensor"])
@pytest.mark.parametrize("reference", [False, True], ids=["renderer", "reference"])
def test_a_number_meets_fp16_values_in_their_dtype(form, dtype, reference, device):
    # Eager converts a Python number, or a 0-dim fp32 tensor, to an fp16/bf16 tensor's dtype
    # before comparing with it or selecting it: x >= 0.1 is True for x = half(0.1), and
    # where(m, x, 0.1) holds half(0.1). A kernel compared with the fp32 0.1 (False) and kept
    # 0.1 exact where .float() read it.
    fns = {
        "ge": lambda x, s: (x >= 0.1).float() + x.float(),
        "le": lambda x, s: (x <= 0.3).float() + x.float(),
        "eq": lambda x, s: torch.where(x == 0.1, 1.0, 2.0) + x.float(),
        "int_number": lambda x, s: (x < 2049).float() + x.float(),  # 2049 is 2048 in fp16
        "ne_scalar_first": lambda x, s: (0.3 != x).float() + x.float(),
        "where": lambda x, s: torch.where(x > 0.2, x, 0.1).float() * 3,
        "masked_fill": lambda x, s: x.masked_fill(x > 0.2, 0.3).float() * 3,
        "clamp_max": lambda x, s: x.clamp(max=0.1).float() * 3,
        "clamp_min": lambda x, s: (x.clamp(min=0.3) <= 0.3).float() + x.clamp(0.1, 0.3).float(),
        "ge_tensor": lambda x, s: (x >= s).float() + x.float(),
        "where_tensor": lambda x, s: torch.where(x > 0.2, x, s).float() * 3,
        "maximum_tensor": lambda x, s: torch.maximum(x, s).float() * 3,
        "clamp_tensor": lambda x, s: (x.clamp(min=s) <= s).float(),
    }
    x = (torch.randn(4, 40, device=device) * 0.3).to(dtype)
    x[0, :5] = torch.tensor([0.1, 0.3, -0.1, 0.2, 2048.0]).to(dtype)
    s = torch.tensor(0.1, device=device)
    fn = fns[form]
    got, backend = run_kernels(fn, x, s, reference=reference)
    assert len(backend.kernels) == 1, [str(k.kernel) for k in backend.kernels]
    assert torch.equal(got, fn(x, s))  # no fp16 rounding skipped: every step is exact


def test_dropout_add_in_training_is_one_kernel(device):
    x = torch.randn(64, 64, device=device) + 5
    r = torch.randn(64, 64, device=device)

    def f(x, r):
        return F.dropout(x, p=0.25, training=True) + r

    torch.manual_seed(3)
    a, backend = run_kernels(f, x, r)
    assert len(backend.kernels) == 1
    torch.manual_seed(3)
    b, _ = run_kernels(f, x, r)
    assert torch.equal(a, b)
    kept = (a - r) != 0
    assert abs(kept.float().mean().item() - 0.75) < 0.05
    torch.testing.assert_close((a - r)[kept], (x / 0.75)[kept])


def test_dropout_in_eval_is_the_identity(device):
    x = torch.randn(8, 8, device=device)
    got, backend = run_kernels(lambda x: F.dropout(x, p=0.5, training=False) * 2, x)
    assert_close_to_eager(got, x * 2)


@pytest.mark.parametrize("layout", ["transposed", "sliced_step", "expanded"])
def test_patterns_on_non_contiguous_inputs(layout, device):
    base = {
        "transposed": torch.randn(48, 10, device=device).t(),
        "sliced_step": torch.randn(20, 96, device=device)[::2, ::2],
        "expanded": torch.randn(1, 48, device=device).expand(10, 48),
    }[layout]
    w = torch.randn(48, device=device)
    b = torch.randn(48, device=device)
    fn = lambda x, w, b: F.gelu(F.layer_norm(x, (48,), w, b)) + F.softmax(x, -1)  # noqa: E731
    got, backend = run_kernels(fn, base, w, b)
    assert_close_to_eager(got, fn(base, w, b))


class Block(nn.Module):
    """A GPT-style block: LN, attention (matmuls + softmax), projection, residual, LN, MLP."""

    def __init__(self, d=64, h=4):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.h = h

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.attn(self.ln1(x)).split(C, dim=2)
        q = q.view(B, T, self.h, C // self.h).transpose(1, 2)
        k = k.view(B, T, self.h, C // self.h).transpose(1, 2)
        v = v.view(B, T, self.h, C // self.h).transpose(1, 2)
        att = F.softmax((q @ k.transpose(-2, -1)) * (1.0 / (k.size(-1) ** 0.5)), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


def test_gpt_block_kernel_count(device):
    """Each normalization is one kernel, each pointwise chain between matmuls one kernel:
    ln1; scale+softmax; the head-merging copy; proj bias + residual + ln2 (one reduction
    kernel with its prologue); fc bias + GELU; fc2 bias + residual. On the CPU also the copies
    of q, k and v that let the attention matmuls run as bmm (passes.matmul): one kernel, as
    the three read views of one projection (horizontal fusion)."""
    block = Block().to(device).eval()
    x = torch.randn(2, 8, 64, device=device)
    with torch.no_grad():
        expected = block(x)
        got, backend = run_kernels(block, x)
    assert_close_to_eager(got, expected, rtol=1e-4, atol=1e-5)
    names = [k.name for k in backend.kernels]
    copies = 1 if torch.device(device).type == "cpu" else 0
    assert len(names) == 6 + copies, "\n\n".join(str(k.kernel) for k in backend.kernels)
    assert sum(name.startswith("fj_poi_clone") for name in names) == 1 + copies
    if copies:
        (qkv,) = [k for k in backend.kernels if len(k.kernel.outputs) == 3]
        assert len(qkv.kernel.inputs) == 3 and qkv.name.startswith("fj_poi_clone")
    assert sum(k.kernel.is_reduction for k in backend.kernels) == 3  # ln1, softmax, ln2


def test_training_groups_stay_torch_ops_and_gradients_are_exact(device):
    block = Block().to(device).train()
    x = torch.randn(2, 8, 64, device=device, requires_grad=True)
    ref = Block().to(device).train()
    ref.load_state_dict(block.state_dict())
    x_ref = x.detach().clone().requires_grad_(True)
    got, backend = run_kernels(block, x)
    got.sum().backward()
    ref(x_ref).sum().backward()
    assert backend.kernels == []  # every group has an input that requires grad
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-4, atol=1e-5)
    for p, q in zip(block.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)


def test_explain_lists_kernels_with_source(device):
    backend = kernel_backend_name()
    report = framejit.explain(lambda x: F.softmax(x * 2, -1), backend=backend)(torch.randn(4, 16, device=device))
    assert report.graph_count == 1 and len(report.kernels[0]) == 1
    (kernel,) = report.kernels[0]
    assert "reduce max" in kernel.description
    assert ("tl.load" if backend == "triton" else "for (int64_t r = 0;") in kernel.source
    assert "kernel(s)" in str(report) and kernel.name in str(report)


def test_dump_writes_kernels_and_wrapper(tmp_path, device):
    backend = kernel_backend_name()
    fn = framejit.compile(lambda x: torch.sigmoid(x) * x, backend=backend,
                          options={"dump_dir": str(tmp_path)})
    fn(torch.randn(10, device=device))
    files = {p.name for p in tmp_path.rglob("*") if p.is_file()}
    assert "wrapper.py" in files
    suffix = ".py" if backend == "triton" else ".c"
    assert any(f.endswith(suffix) and f.startswith("fj_poi") for f in files)
    assert any(f.endswith(".txt") and f.startswith("fj_poi") for f in files)


def test_torch_compile_backend_runs_framejit_kernels(device):
    torch._dynamo.reset()
    fn = torch.compile(lambda x, b: F.gelu(x + b), backend="framejit",
                       options={"backend": kernel_backend_name()})
    x, b = torch.randn(8, 32, device=device), torch.randn(32, device=device)
    assert_close_to_eager(fn(x, b), F.gelu(x + b))
    assert framejit.stats()["kernels"] == 1
    torch._dynamo.reset()


@pytest.mark.triton_only
def test_triton_backend_on_cpu_without_interpreter_falls_back_with_a_warning(monkeypatch):
    from framejit.kernels import triton_runtime

    monkeypatch.setattr(triton_runtime, "interpreter_enabled", lambda: False)
    before = os.environ.get("TRITON_INTERPRET")
    with pytest.warns(UserWarning, match="TRITON_INTERPRET=1"):
        got = framejit.compile(lambda x: torch.exp(x) + 1, backend="triton")(torch.ones(3))
    assert_close_to_eager(got, torch.exp(torch.ones(3)) + 1)
    assert framejit.stats()["fallbacks"] == 1
    assert os.environ.get("TRITON_INTERPRET") == before  # the environment is left alone
