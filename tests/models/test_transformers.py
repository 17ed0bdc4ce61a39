"""transformers models built from small configs with random weights (nothing is downloaded):
compiled results must equal eager. Issue #3 asks for one graph with no break; where that does
not hold yet the one-graph test is a strict xfail naming what still breaks."""

import copy
import warnings

import pytest
import torch

import framejit

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


#: Models that still break, and why (strict: each entry must still fail).
STILL_BREAKING = {
    "t5": "copy.deepcopy of the config inside get_text_config; DynamicCache",
}


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=f"issue #3 in progress: {STILL_BREAKING[n]}"))
    if n in STILL_BREAKING else n for n in MODELS])
def test_transformers_model_is_one_graph(stats, name):
    _run(name)
    assert stats.graph_breaks == 0 and stats.graphs == 1 and stats.eager_frames == 0
