"""CPU attention's example strides.

On CPU tensors ``F.scaled_dot_product_attention`` picks the flash kernel when it can, whose
result is laid out like its query: for transformers' ``linear(x).view(b, s, h, d).transpose(1,
2)`` query, (batch, seq, head, dim)-ordered strides, where the meta kernel (which always picks
the math backend) says contiguous. Capture's example value must carry the real strides, or the
kernel reading the result (the clone after ``transpose(1, 2)``) misses its layout on every call
and runs as torch ops."""

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F

import framejit
from framejit.testing import assert_close_to_eager

T = pytest.importorskip("transformers")

IDS = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(0))

#: Small configs with random weights, as in test_transformers.py.
MODELS = {
    "gpt2": (lambda: T.GPT2LMHeadModel(T.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128,
                                                    n_positions=64, bos_token_id=0, eos_token_id=0)),
             {}, "logits"),
    "bert": (lambda: T.BertModel(T.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                              intermediate_size=128, vocab_size=128)),
             {}, "last_hidden_state"),
    "llama": (lambda: T.LlamaForCausalLM(T.LlamaConfig(num_hidden_layers=2, hidden_size=64,
                                                       num_attention_heads=4, num_key_value_heads=2,
                                                       intermediate_size=128, vocab_size=128)),
              {}, "logits"),
    "t5": (lambda: T.T5Model(T.T5Config(num_layers=2, d_model=64, num_heads=4, d_ff=128, d_kv=16,
                                        vocab_size=128)),
           {"decoder_input_ids": IDS}, "last_hidden_state"),
}


def _dense_strides_agree(shape, a, b) -> bool:
    return all(n == 1 or x == y for n, x, y in zip(shape, a, b))


@pytest.fixture
def kernel_functions(monkeypatch):
    """The compiled functions the kernel pipeline makes, in order."""
    import framejit.pipeline as pipeline

    made = []
    real = pipeline.compile_with_kernels

    def recording(*args, **kwargs):
        fn = real(*args, **kwargs)
        made.append(fn)
        return fn

    monkeypatch.setattr(pipeline, "compile_with_kernels", recording)
    return made


@pytest.fixture
def attention_examples(monkeypatch):
    """The example value of each attention node, recorded by a backend that runs the captured
    graph as torch ops."""
    from framejit.backends import registry

    seen = []

    def backend(gm, example_inputs):
        seen.extend(n.meta["val"] for n in gm.graph.nodes if "attention" in str(n.target))
        return gm.forward_fn

    monkeypatch.setitem(registry._REGISTRY, "test_attention_examples",
                        registry.Backend("test_attention_examples", backend, True))
    return seen


def _qkv(layout, heads=4, kv_heads=4, seq=8, dim=16, batch=2):
    x = torch.randn(batch, seq, (heads + 2 * kv_heads) * dim)
    if layout == "linear":  # transformers: split a fused projection, view, transpose
        q, k, v = x.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=2)
        return (q.view(batch, seq, heads, dim).transpose(1, 2),
                k.view(batch, seq, kv_heads, dim).transpose(1, 2),
                v.view(batch, seq, kv_heads, dim).transpose(1, 2))
    q = torch.randn(batch, heads, seq, dim)
    return q, torch.randn(batch, kv_heads, seq, dim), torch.randn(batch, kv_heads, seq, dim)


CASES = {
    "plain": {},
    "causal": {"is_causal": True},
    "bool_mask": {"attn_mask": torch.ones(8, 8, dtype=torch.bool).tril()},
    "float_mask": {"attn_mask": torch.zeros(2, 1, 8, 8)},
    "scale": {"scale": 0.5},
}


@pytest.mark.parametrize("layout", ["linear", "contiguous"])
@pytest.mark.parametrize("case", list(CASES))
def test_the_example_of_cpu_attention_has_the_real_strides(attention_examples, layout, case):
    kwargs = CASES[case]

    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, **kwargs) * 2

    q, k, v = _qkv(layout)
    expected = F.scaled_dot_product_attention(q, k, v, **kwargs)
    got = framejit.compile(attend, backend="test_attention_examples", fullgraph=True)(q, k, v)
    assert_close_to_eager(got, expected * 2)
    (example,) = attention_examples
    assert example.shape == expected.shape
    assert _dense_strides_agree(expected.shape, example.stride(), expected.stride()), \
        (example.stride(), expected.stride())


def test_grouped_query_attention_example_has_the_real_strides(attention_examples):
    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    q, k, v = _qkv("linear", heads=4, kv_heads=2)
    expected = attend(q, k, v)
    assert_close_to_eager(framejit.compile(attend, backend="test_attention_examples")(q, k, v),
                          expected)
    (example,) = attention_examples
    assert _dense_strides_agree(expected.shape, example.stride(), expected.stride())


def test_attention_with_grad_has_the_real_strides(attention_examples):
    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    q, k, v = (t.detach().requires_grad_(True) for t in _qkv("contiguous"))
    q = q.transpose(1, 2).contiguous().transpose(1, 2)  # a (batch, seq, head, dim) layout
    expected = attend(q, k, v)
    got = framejit.compile(attend, backend="test_attention_examples")(q, k, v)
    assert_close_to_eager(got, expected)
    (example,) = attention_examples
    assert example.requires_grad
    assert _dense_strides_agree(expected.shape, example.stride(), expected.stride())


def _model_layout_misses(name, kernel_functions, calls=3):
    make, kwargs, key = MODELS[name]
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = make().eval()
    reference = copy.deepcopy(model)
    compiled = framejit.compile(model, backend="c")  # also under FRAMEJIT_TEST_BACKEND=fx
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = reference(IDS, **kwargs)[key]
        for _ in range(calls):
            torch.testing.assert_close(compiled(IDS, **kwargs)[key], expected, rtol=1e-5,
                                       atol=1e-5)
    kernels = [k for fn in kernel_functions for k in fn.framejit_kernels]
    assert kernels, "the model ran no kernels"
    return {k.name: k.layout_misses for k in kernels if k.layout_misses}


def test_gpt2_kernels_never_miss_their_layout(kernel_functions):
    # GPT-2 (2 layers, width 64, 4 heads) on CPU: the clone after attention used to miss on
    # every call, so that group ran as torch ops.
    assert _model_layout_misses("gpt2", kernel_functions) == {}


@pytest.mark.parametrize("name", ["bert", "llama", "t5"])
def test_transformers_kernels_never_miss_their_layout(kernel_functions, name):
    assert _model_layout_misses(name, kernel_functions) == {}
