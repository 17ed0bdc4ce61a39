"""transformers models built from small configs with random weights (nothing is downloaded):
compiled results must equal eager, and each forward is one graph with no break (issue #3)."""

import copy
import warnings

import pytest
import torch

import framejit
from framejit.testing import declined_kernels

T = pytest.importorskip("transformers")

IDS = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(0))

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
    # Bloom's GELU is a custom autograd.Function; CodeGen builds nn.Softmax in its forward.
    "bloom": (lambda: T.BloomForCausalLM(T.BloomConfig(n_layer=2, hidden_size=64, n_head=4, vocab_size=128)),
              {}, "logits"),
    "codegen": (lambda: T.CodeGenForCausalLM(T.CodeGenConfig(n_layer=2, n_embd=64, n_head=4, vocab_size=128,
                                                            n_positions=64, rotary_dim=8, bos_token_id=0,
                                                            eos_token_id=0)),
                {}, "logits"),
    # BART's config has is_causal, which transformers' merge_with_config_defaults sets for the
    # call and restores (through the config's validating __setattr__), and its decoder cache
    # deep-copies the config and renames keys on the copy (get_text_config).
    "bart": (lambda: T.BartModel(T.BartConfig(encoder_layers=2, decoder_layers=2, d_model=64,
                                              encoder_attention_heads=4, decoder_attention_heads=4,
                                              encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=128)),
             {}, "last_hidden_state"),
    "t5": (lambda: T.T5Model(T.T5Config(num_layers=2, d_model=64, num_heads=4, d_ff=128, d_kv=16,
                                        vocab_size=128)),
           {"decoder_input_ids": IDS}, "last_hidden_state"),
}


def _run(name):
    make, kwargs, key = MODELS[name]
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = make().eval()
    reference = copy.deepcopy(model)
    compiled = framejit.compile(model)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = reference(IDS, **kwargs)
        first = compiled(IDS, **kwargs)
        second = compiled(IDS, **kwargs)
    return expected[key], first[key], second[key]


@pytest.mark.parametrize("name", list(MODELS))
def test_transformers_model_matches_eager(stats, name):
    expected, first, second = _run(name)
    torch.testing.assert_close(first, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(second, expected, rtol=1e-5, atol=1e-5)
    assert stats.graphs >= 1  # the model's tensor code is captured, not all run eagerly


@pytest.mark.parametrize("name", list(MODELS))
def test_transformers_model_is_one_graph(stats, name):
    _run(name)
    assert stats.graph_breaks == 0 and stats.graphs == 1 and stats.eager_frames == 0
    assert stats.recompiles == 0  # the second call reuses the first one's code


# More architectures, each checked once for both (a compiled first and second call equal to
# eager, one graph, no recompile): their forwards differ in the Python around the tensors
# (parallel attention, multi-query heads, ALiBi, relative positions, factorized embeddings).
_SMALL = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
              vocab_size=128)
CORPUS = {
    "gpt_neox": lambda: T.GPTNeoXForCausalLM(T.GPTNeoXConfig(**_SMALL)),
    "opt": lambda: T.OPTForCausalLM(T.OPTConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                                ffn_dim=128, vocab_size=128, word_embed_proj_dim=64)),
    "falcon": lambda: T.FalconForCausalLM(T.FalconConfig(num_hidden_layers=2, hidden_size=64,
                                                         num_attention_heads=4, vocab_size=128)),
    "mistral": lambda: T.MistralForCausalLM(T.MistralConfig(**_SMALL, num_key_value_heads=2)),
    "qwen2": lambda: T.Qwen2ForCausalLM(T.Qwen2Config(**_SMALL, num_key_value_heads=2)),
    "phi": lambda: T.PhiForCausalLM(T.PhiConfig(**_SMALL)),
    "gemma": lambda: T.GemmaForCausalLM(T.GemmaConfig(**_SMALL, num_key_value_heads=2, head_dim=16)),
    "stablelm": lambda: T.StableLmForCausalLM(T.StableLmConfig(**_SMALL, num_key_value_heads=2)),
    "olmo": lambda: T.OlmoForCausalLM(T.OlmoConfig(**_SMALL)),
    "gptj": lambda: T.GPTJForCausalLM(T.GPTJConfig(n_layer=2, n_embd=64, n_head=4, vocab_size=128,
                                                   rotary_dim=8)),
    "gpt_neo": lambda: T.GPTNeoForCausalLM(T.GPTNeoConfig(
        num_layers=2, hidden_size=64, num_heads=4, vocab_size=128,
        attention_types=[[["global", "local"], 1]], window_size=4)),
    "mpt": lambda: T.MptForCausalLM(T.MptConfig(n_layers=2, d_model=64, n_heads=4, vocab_size=128)),
    "roberta": lambda: T.RobertaModel(T.RobertaConfig(**_SMALL)),
    "distilbert": lambda: T.DistilBertModel(T.DistilBertConfig(n_layers=2, dim=64, n_heads=4,
                                                               hidden_dim=128, vocab_size=128)),
    "albert": lambda: T.AlbertModel(T.AlbertConfig(**_SMALL, embedding_size=32)),
    "electra": lambda: T.ElectraModel(T.ElectraConfig(**_SMALL, embedding_size=32)),
    "deberta_v2": lambda: T.DebertaV2Model(T.DebertaV2Config(**_SMALL)),
    "mobilebert": lambda: T.MobileBertModel(T.MobileBertConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
        vocab_size=128, embedding_size=32, intra_bottleneck_size=32, true_hidden_size=32)),
}


@pytest.mark.parametrize("name", list(CORPUS))
def test_more_architectures_are_one_graph_equal_to_eager(stats, name):
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = CORPUS[name]().eval()
    reference = copy.deepcopy(model)
    compiled = framejit.compile(model)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected, first, second = reference(IDS), compiled(IDS), compiled(IDS)
    key = "logits" if "logits" in expected else "last_hidden_state"
    torch.testing.assert_close(first[key], expected[key], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(second[key], expected[key], rtol=1e-5, atol=1e-5)
    assert stats.graph_breaks == 0 and stats.graphs == 1 and stats.eager_frames == 0
    assert stats.recompiles == 0


def test_t5_cache_objects_match_eager():
    """T5's forward builds DynamicCache objects (deep-copying its config on the way) and returns
    them: the rebuilt caches hold the same keys and values as eager's."""
    make, kwargs, _ = MODELS["t5"]
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = make().eval()
    compiled = framejit.compile(model)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = model(IDS, use_cache=True, **kwargs).past_key_values
        got = compiled(IDS, use_cache=True, **kwargs).past_key_values
    assert type(got) is type(expected)
    for cache_name in ("self_attention_cache", "cross_attention_cache"):
        want, have = getattr(expected, cache_name), getattr(got, cache_name)
        assert type(have) is type(want) and len(have.layers) == len(want.layers)
        for a, b in zip(want.layers, have.layers):
            torch.testing.assert_close(b.keys, a.keys)
            torch.testing.assert_close(b.values, a.values)
    assert model.config.is_encoder_decoder  # the config the forward copied is left as it was


@pytest.mark.parametrize("name", ["gpt2", "bert"])
def test_hidden_states_match_eager_on_every_call(name):
    """transformers collects hidden states with forward hooks that append to a collector it
    switches per call (an object its module holds): the compiled hooks kept appending to the
    first call's lists, and later calls returned no hidden states."""
    make, kwargs, _ = MODELS[name]
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = make().eval()
        model.config.output_hidden_states = True
    compiled = framejit.compile(model)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = model(IDS, **kwargs).hidden_states
        for _ in range(3):
            got = compiled(IDS, **kwargs).hidden_states
            assert len(got) == len(expected) == 3
            for a, b in zip(got, expected):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", list(MODELS) + list(CORPUS))
def test_dynamic_sequence_lengths_are_one_graph_with_kernels(stats, name):
    """dynamic=True over three sequence lengths: one graph, no recompile, and fused C kernels
    that serve every length. The models slice buffers by the length (BERT's position ids),
    take max(0, n - k) (MPT), pad slices (MobileBERT), baddbmm (Bloom) and compute
    max(1, s - 1) (BART's shift): each once recompiled per length or lost its kernels."""
    if name in MODELS:
        make, kwargs, _ = MODELS[name]
    else:
        make, kwargs = CORPUS[name], {}
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = make().eval()
    reference = copy.deepcopy(model)
    compiled = framejit.compile(model, dynamic=True, backend="c")
    with declined_kernels() as declined:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for length in (8, 11, 16):
                ids = torch.randint(0, 128, (2, length), generator=torch.Generator().manual_seed(length))
                extra = {k: ids for k in kwargs}
                expected, got = reference(ids, **extra), compiled(ids, **extra)
                key = "logits" if "logits" in expected else "last_hidden_state"
                torch.testing.assert_close(got[key], expected[key], rtol=1e-4, atol=1e-4)
    assert declined == []
    assert stats.graphs == 1 and stats.recompiles == 0 and stats.graph_breaks == 0
    assert not stats.static_retries and stats.kernels > 0
