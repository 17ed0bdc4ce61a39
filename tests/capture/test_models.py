"""Whole models and realistic functions: each is captured as one graph with no fallback, matches
a deep copy run eagerly (outputs and module state), and is not recaptured on the next call with
inputs of the same kind."""

import copy
import dataclasses
import math
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import framejit
from framejit.testing import RecordingBackend, assert_close_to_eager


def run_both(model, make_input, *, calls=2, backend="default"):
    """Run ``model`` compiled and a deep copy of it eagerly ``calls`` times on the same fresh
    inputs; compare every output, then the modules' state. Returns the compiled module."""
    reference = copy.deepcopy(model)
    compiled = framejit.compile(model, backend=backend)
    for _ in range(calls):
        inputs = make_input()
        expected = reference(*copy.deepcopy(inputs))
        actual = compiled(*inputs)
        assert_close_to_eager(actual, expected)
    assert_close_to_eager(model, reference)
    return compiled


def assert_one_capture(stats):
    assert stats.eager_frames == 0, stats.fallback_reasons
    assert stats.captured == 1, stats.recompile_reasons
    assert stats.graphs == 1
    assert stats.recompiles == 0


# -- the issue's example ----------------------------------------------------------------------------

@framejit.compile
def issue_example(x, w, b):
    return torch.relu(x @ w + b).sum(-1)


def test_issue_example(stats):
    x, w, b = torch.randn(4, 8), torch.randn(8, 3), torch.randn(3)
    assert_close_to_eager(issue_example(x, w, b), torch.relu(x @ w + b).sum(-1))
    x2, w2, b2 = torch.randn(4, 8), torch.randn(8, 3), torch.randn(3)
    assert_close_to_eager(issue_example(x2, w2, b2), torch.relu(x2 @ w2 + b2).sum(-1))
    assert_one_capture(stats)

    (entry,) = framejit._C.get_cache_entries(issue_example.__wrapped__.__code__)
    info = entry[3]
    # Golden graph: the four operations, in order, on the three inputs.
    assert str(info.graph_module.graph).strip().splitlines() == [
        "%x : f32[4, 8] = placeholder()",
        "%w : f32[8, 3] = placeholder()",
        "%b : f32[3] = placeholder()",
        "%matmul : f32[4, 3] = operator.matmul(%x, %w)",
        "%add : f32[4, 3] = operator.add(%matmul, %b)",
        "%relu : f32[4, 3] = torch.relu(%add)",
        "%sum : f32[4] = %relu.sum(-1)",
        "output (%sum,)",
    ]
    assert stats.ops == 4


def test_issue_example_with_recording_backend(stats):
    backend = RecordingBackend()

    def f(x, w, b):
        return torch.relu(x @ w + b).sum(-1)

    compiled = framejit.compile(f, backend=backend)
    x, w, b = torch.randn(4, 8), torch.randn(8, 3), torch.randn(3)
    assert_close_to_eager(compiled(x, w, b), f(x, w, b))
    assert backend.graph_count == 1
    assert isinstance(backend.graphs[0], torch.fx.GraphModule)
    assert [n.op for n in backend.graphs[0].graph.nodes].count("placeholder") == 3
    assert backend.op_count == 4
    assert torch.relu in backend.targets()


# -- models -----------------------------------------------------------------------------------------

class MLP(nn.Module):
    def __init__(self, sizes=(16, 32, 32, 4)):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes, sizes[1:]))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = F.relu(x)
        return x


def test_mlp(stats):
    backend = RecordingBackend()
    run_both(MLP(), lambda: (torch.randn(8, 16),), backend=backend)
    assert_one_capture(stats)
    assert backend.graph_count == 1
    # Parameters are graph inputs (6 of them) after x; 3 linear + 2 relu ops.
    placeholders = [n for n in backend.graphs[0].graph.nodes if n.op == "placeholder"]
    assert len(placeholders) == 7
    assert len(backend.example_inputs[0]) == 7
    assert backend.targets().count(F.relu) == 2


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        x = self.pool(self.relu(self.bn(self.conv(x))))
        return self.fc(x.flatten(1))


def test_cnn_train_mode_updates_batchnorm_stats_like_eager(stats):
    model = SmallCNN().train()
    run_both(model, lambda: (torch.randn(4, 3, 8, 8),), calls=3)
    assert_one_capture(stats)
    # run_both compared state_dicts; check the buffers moved at all, and by three steps.
    assert model.bn.num_batches_tracked.item() == 3
    assert not torch.equal(model.bn.running_mean, torch.zeros(8))
    assert not torch.equal(model.bn.running_var, torch.ones(8))


def test_cnn_eval_mode(stats):
    model = SmallCNN()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-1, 1)
        model.bn.running_var.uniform_(0.5, 2)
    model.eval()
    running_mean = model.bn.running_mean.clone()
    run_both(model, lambda: (torch.randn(4, 3, 8, 8),), calls=2)
    assert_one_capture(stats)
    assert torch.equal(model.bn.running_mean, running_mean)
    assert model.bn.num_batches_tracked.item() == 0


def test_transformer_encoder_layer_eval(stats):
    layer = nn.TransformerEncoderLayer(d_model=16, nhead=4, dim_feedforward=32, dropout=0.0).eval()
    run_both(layer, lambda: (torch.randn(5, 2, 16),))  # (sequence, batch, features)
    assert_one_capture(stats)


def test_transformer_encoder_layer_batch_first_eval(stats):
    # Its fast-path check walks `self.modules()`, whose memo is a set of modules.
    layer = nn.TransformerEncoderLayer(d_model=16, nhead=4, dim_feedforward=32, dropout=0.0,
                                       batch_first=True).eval()
    run_both(layer, lambda: (torch.randn(2, 5, 16),))
    assert_one_capture(stats)


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model, n_head, block_size):
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.register_buffer("mask", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)


class GPTBlock(nn.Module):
    def __init__(self, d_model=32, n_head=4, block_size=16):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_head, block_size)
        self.ln_2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


def test_gpt_block(stats):
    backend = RecordingBackend()
    run_both(GPTBlock(), lambda: (torch.randn(2, 10, 32),), backend=backend)
    assert_one_capture(stats)
    assert backend.graph_count == 1
    targets = backend.targets()
    assert F.softmax in targets and "masked_fill" in targets
    # The causal mask is read from the registered buffer, as a graph input.
    example_shapes = [tuple(t.shape) for t in backend.example_inputs[0]]
    assert (1, 1, 16, 16) in example_shapes


def test_gpt_block_backward_matches_eager(stats):
    model = GPTBlock()
    reference = copy.deepcopy(model)
    compiled = framejit.compile(model)
    x = torch.randn(2, 6, 32)
    compiled(x).pow(2).sum().backward()
    reference(x).pow(2).sum().backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert_close_to_eager(p.grad, q.grad, path=f"{name}.grad", atol=1e-5, rtol=1e-4)
    assert_one_capture(stats)


def test_sequential_via_compile(stats):
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32))
    compiled = run_both(model, lambda: (torch.randn(4, 16),))
    assert isinstance(compiled, framejit.CompiledModule)
    assert_one_capture(stats)


# -- globals and config objects ---------------------------------------------------------------------

@dataclasses.dataclass
class Config:
    hidden: int = 8
    scale: float = 0.5
    activation: str = "gelu"
    use_bias: bool = True


CONFIG = Config()
OPTS = types.SimpleNamespace(eps=1e-3, residual=True, n_steps=2)
TEMPERATURE = 0.7
EPS = 1e-6


class Hyper:
    momentum = 0.9
    kind = "tanh"


def uses_globals(x):
    return torch.softmax(x / TEMPERATURE, dim=-1) + EPS


def uses_config(x, w):
    h = x @ w * CONFIG.scale
    if CONFIG.activation == "gelu":
        h = F.gelu(h)
    else:
        h = torch.relu(h)
    if CONFIG.use_bias:
        h = h + 1.0
    return h[..., : CONFIG.hidden]


def uses_namespace(x):
    for _ in range(OPTS.n_steps):
        y = x * (1 - OPTS.eps)
        x = x + y if OPTS.residual else y
    return x


def uses_class_attributes(x):
    x = x * Hyper.momentum
    return torch.tanh(x) if Hyper.kind == "tanh" else x


@pytest.mark.parametrize("fn, make_args", [
    (uses_globals, lambda: (torch.randn(4, 8),)),
    (uses_config, lambda: (torch.randn(4, 8), torch.randn(8, 16))),
    (uses_namespace, lambda: (torch.randn(4, 8),)),
    (uses_class_attributes, lambda: (torch.randn(4, 8),)),
], ids=["module_globals", "dataclass_config", "simple_namespace", "class_attributes"])
def test_functions_reading_globals_and_configs(check, stats, fn, make_args):
    check(fn, *make_args())
    assert_one_capture(stats)


# -- methods on self, helpers, properties -----------------------------------------------------------

class WithHelpers(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.gain = 2.0

    @property
    def head_dim(self):
        return self.fc.out_features // 2

    def _normalize(self, x, eps=1e-5):
        return x / (x.norm(dim=-1, keepdim=True) + eps)

    def _mix(self, a, b):
        return self._normalize(a) * self.gain + b[..., : self.head_dim].sum(-1, keepdim=True)

    def forward(self, x):
        h = self.fc(x)
        return self._mix(h, x)


def test_module_with_helper_methods_and_property(stats):
    backend = RecordingBackend()
    run_both(WithHelpers(), lambda: (torch.randn(3, 8),), backend=backend)
    assert_one_capture(stats)
    assert backend.graph_count == 1


# -- plain Python calls with *args / **kwargs / defaults --------------------------------------------

def _combine(*tensors, weights=None, bias=0.0, **extra):
    weights = weights or [1.0] * len(tensors)
    out = tensors[0] * weights[0]
    for w, t in zip(weights[1:], tensors[1:]):
        out = out + w * t
    for name in sorted(extra):
        out = out * extra[name]
    return out + bias


def _scaled(x, factor=3.0, *, offset=1.0):
    return x * factor + offset


def calls_helpers(x, y):
    a = _combine(x, y, weights=[0.5, 2.0], bias=1.0, gamma=3.0)
    b = _combine(*[x, y], **{"beta": 2.0})
    return _scaled(a) + _scaled(b, 0.5, offset=-1.0)


def test_function_calling_helpers_with_star_args(check, stats):
    check(calls_helpers, torch.randn(4, 4), torch.randn(4, 4))
    assert_one_capture(stats)
