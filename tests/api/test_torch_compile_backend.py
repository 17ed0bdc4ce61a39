"""torch.compile(..., backend="framejit"): Dynamo captures, framejit converts and compiles, and
the results (and gradients) are eager's. Graphs framejit cannot take run as torch.fx code with a
warning."""

import os
import subprocess
import sys
import textwrap
import tomllib
import warnings
from pathlib import Path

import pytest
import torch
import torch._dynamo
import torch.nn as nn
import torch.nn.functional as F

import framejit
from framejit import dynamo_backend
from framejit.dynamo_backend import framejit_backend, register_torch_compile_backend
from framejit.errors import TorchCompileFallbackWarning
from framejit.testing import RecordingBackend, assert_close_to_eager

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    register_torch_compile_backend()
    torch._dynamo.reset()
    dynamo_backend._warned.clear()
    with warnings.catch_warnings():
        # A fallback where none is expected fails the test; tests that expect one catch it.
        warnings.simplefilter("error", TorchCompileFallbackWarning)
        yield
    torch._dynamo.reset()


@pytest.fixture
def recording():
    """framejit's inner backend, recording the framejit graphs it gets (as torch.fx)."""
    return RecordingBackend()


def pointwise_softmax_layer_norm(x, y):
    z = torch.sin(x) * y + 1
    z = F.softmax(z, -1)
    return F.layer_norm(z, (z.shape[-1],)) * 2, z.sum()


class Block(nn.Module):
    """A GPT-style block: LayerNorm, causal softmax attention, GELU MLP."""

    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc, self.out = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (
            t.view(B, T, self.heads, C // self.heads).transpose(1, 2)
            for t in self.qkv(self.ln1(x)).split(C, dim=2)
        )
        att = (q @ k.transpose(-2, -1)) * (C // self.heads) ** -0.5
        mask = torch.tril(torch.ones(T, T, device=x.device, dtype=torch.bool))
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


def grads(module_or_tensors):
    params = (
        module_or_tensors.parameters() if isinstance(module_or_tensors, nn.Module) else module_or_tensors
    )
    return [p.grad.clone() for p in params]


# -- same results as eager -----------------------------------------------------------------------


def test_function_goes_through_framejit(recording):
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    compiled = torch.compile(pointwise_softmax_layer_norm, backend="framejit",
                             options={"backend": recording})
    assert_close_to_eager(compiled(x, y), pointwise_softmax_layer_norm(x, y))
    assert recording.graph_count == 1
    assert F.softmax in recording.targets() and F.layer_norm in recording.targets()
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    assert_close_to_eager(compiled(x, y), pointwise_softmax_layer_norm(x, y))
    assert recording.graph_count == 1


@pytest.mark.parametrize("inner", ["default", "eager"])
def test_function_same_as_eager(inner):
    compiled = torch.compile(pointwise_softmax_layer_norm, backend="framejit",
                             options={"backend": inner})
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    assert_close_to_eager(compiled(x, y), pointwise_softmax_layer_norm(x, y))


def test_graph_break_compiles_two_graphs(recording):
    def f(x):
        y = torch.relu(x) * 2
        torch._dynamo.graph_break()
        return F.softmax(y + 1, -1)

    compiled = torch.compile(f, backend="framejit", options={"backend": recording})
    x = torch.randn(3, 5)
    assert_close_to_eager(compiled(x), f(x))
    assert recording.graph_count == 2


@pytest.mark.parametrize("make", [
    lambda: nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8)),
    lambda: Block(),
], ids=["mlp", "gpt_block"])
def test_module_forward_and_backward_same_as_eager(make, recording):
    torch.manual_seed(0)
    model = make()
    x = torch.randn(2, 5, 8) if isinstance(model, nn.Sequential) else torch.randn(2, 5, 16)
    compiled = torch.compile(model, backend="framejit", options={"backend": recording})

    out = compiled(x)
    out.pow(2).sum().backward()
    compiled_grads = grads(model)
    model.zero_grad()
    expected = model(x)
    expected.pow(2).sum().backward()

    assert_close_to_eager(out, expected)
    assert_close_to_eager(compiled_grads, grads(model))
    assert recording.graph_count == 1
    # Dynamo passes the parameters as graph inputs: framejit's graph sees them require grad.
    placeholders = recording.graphs[0].graph.find_nodes(op="placeholder")
    assert sum(p.meta["val"].requires_grad for p in placeholders) == len(list(model.parameters()))


def test_training_grads_of_inputs_same_as_eager():
    def f(x, w):
        h = F.layer_norm(x @ w, (w.shape[1],))
        return F.softmax(h, -1).mul(torch.tanh(h)).sum()

    x = torch.randn(4, 6, requires_grad=True)
    w = torch.randn(6, 3, requires_grad=True)
    out = torch.compile(f, backend="framejit")(x, w)
    out.backward()
    compiled_grads = grads([x, w])
    x.grad = w.grad = None
    expected = f(x, w)
    expected.backward()
    assert_close_to_eager(out, expected)
    assert_close_to_eager(compiled_grads, grads([x, w]))


@pytest.mark.gpu
def test_cuda_block_forward_and_backward_same_as_eager():
    # "default" compiles CUDA graphs with framejit's Triton kernels: they must keep autograd.
    torch.manual_seed(0)
    model = Block().cuda()
    x = torch.randn(2, 5, 16, device="cuda", requires_grad=True)
    out = torch.compile(model, backend="framejit")(x)
    out.pow(2).sum().backward()
    compiled_grads = grads(model) + [x.grad.clone()]
    model.zero_grad()
    x.grad = None
    expected = model(x)
    expected.pow(2).sum().backward()
    assert_close_to_eager(out, expected)
    assert_close_to_eager(compiled_grads, grads(model) + [x.grad])


# -- falling back --------------------------------------------------------------------------------


def test_dynamic_shapes_fall_back_with_one_warning():
    compiled = torch.compile(lambda x: x.cos() * 2, backend="framejit", dynamic=True)
    with pytest.warns(TorchCompileFallbackWarning, match=r"dynamic shapes.*dynamic=False") as w:
        for n in (3, 5):
            x = torch.randn(n)
            assert_close_to_eager(compiled(x), x.cos() * 2)
    assert len(w) == 1


def test_backend_failure_falls_back():
    def broken(gm, example_inputs):
        raise RuntimeError("no kernel for this")

    compiled = torch.compile(lambda x: x + 1, backend="framejit", options={"backend": broken})
    x = torch.randn(3)
    with pytest.warns(TorchCompileFallbackWarning, match="backend 'broken' failed .*no kernel"):
        assert_close_to_eager(compiled(x), x + 1)


def test_bad_options_warn():
    x = torch.randn(3)
    compiled = torch.compile(lambda x: x + 1, backend="framejit", options={"backend": "nope"})
    with pytest.warns(TorchCompileFallbackWarning, match="unknown backend 'nope'"):
        assert_close_to_eager(compiled(x), x + 1)
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: x - 1, backend="framejit", options={"fast": True})
    with pytest.warns(TorchCompileFallbackWarning, match="'fast' is not a framejit option"):
        assert_close_to_eager(compiled(x), x - 1)


def test_fake_tensor_example_inputs():
    from torch._subclasses.fake_tensor import FakeTensorMode

    recorded = RecordingBackend()
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    torch.compile(model, backend=recorded)(torch.randn(2, 4))
    [gm], [example_inputs] = recorded.graphs, recorded.example_inputs
    fakes = [FakeTensorMode().from_tensor(t) for t in example_inputs]

    inner = RecordingBackend()
    compiled = framejit_backend(gm, fakes, options={"backend": inner})
    # Only metadata reached framejit's backend: FakeTensors became meta tensors.
    assert all(t.device.type == "meta" for t in inner.example_inputs[0])
    assert_close_to_eager(compiled(*example_inputs), gm(*example_inputs))


# -- registration --------------------------------------------------------------------------------


def test_registration_is_idempotent_and_guards_the_name():
    register_torch_compile_backend()
    assert torch._dynamo.lookup_backend("framejit") is framejit_backend
    assert framejit.register_torch_compile_backend is register_torch_compile_backend

    def other(gm, example_inputs):
        return gm.forward

    torch._dynamo.register_backend(other, name="framejit_test_other")
    with pytest.raises(ValueError, match="already has a backend named 'framejit_test_other'"):
        register_torch_compile_backend("framejit_test_other")


def test_entry_point_is_declared():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    entry_points = pyproject["project"]["entry-points"]["torch_dynamo_backends"]
    assert entry_points == {"framejit": "framejit.dynamo_backend:framejit_backend"}


def test_entry_point_loads_in_a_fresh_process(tmp_path):
    # An installed framejit, simulated by a dist-info carrying the entry point: torch imports
    # framejit itself on first use of the name, and framejit's import-time registration must
    # not collide with torch's own.
    dist = tmp_path / "framejit_entry-0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: framejit-entry\nVersion: 0.0\n")
    (dist / "entry_points.txt").write_text(
        "[torch_dynamo_backends]\nframejit = framejit.dynamo_backend:framejit_backend\n"
    )
    script = textwrap.dedent("""
        import sys, warnings, torch
        f = torch.compile(lambda x: torch.relu(x) + 1, backend="framejit")
        x = torch.randn(5)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert torch.equal(f(x), torch.relu(x) + 1)
        assert "framejit" in sys.modules
        print([str(w.message) for w in caught if "framejit" in str(w.message)])
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    result = subprocess.run([sys.executable, "-c", script],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]"  # no fallback warning
