"""Graphs captured from real code go through torch.fx's generated code (issue 9): each must be
one graph with no fallback, equal to eager, with a torch.fx user backend as with the native one.

Each function here records a node that torch.fx would print as broken or wrong source if the
export converted node for node (see framejit/fx_ir/to_torch.py); the tests of the conversion
itself, class by class, are in tests/fx_ir/test_to_torch.py.
"""

import copy
import warnings

import pytest
import torch

import framejit
from framejit.testing import RecordingBackend, assert_close_to_eager, fx_export_backend


def accumulate_from_zero(x):
    s = 0
    s += x / 2  # iadd(0, x / 2): torch.fx printed `0 += truediv` (T5, DeBERTa-v2)
    return s


def scale_from_one(x):
    s = 1.0
    s *= x
    s -= 0.5
    s **= 2
    return s


def sum_of_norms(xs):
    total = 0
    for t in xs:
        total += t.norm()
    return total


def negative_base_power(x):
    return (-2) ** x + (-0.5) ** x  # torch.fx printed `-2 ** x`, which is -(2 ** x)


def unbound_tensor_dunder(x):
    return torch.Tensor.__pow__(x, 2)  # torch.fx printed torch._tensor.pow, which is not there


def inputs_named_like_fx_globals(device, inf, nan):
    moved = device.to(torch.device("cpu"))  # torch.fx prints device(type='cpu')
    return moved.clamp(max=float("inf")) + inf * 2 + torch.nan_to_num(nan, nan=float("nan"))


def complex_constant(x):
    return x * complex(1.0, float("inf"))  # torch.fx printed (1+infj)


CASES = {
    "s = 0; s += x / 2": (accumulate_from_zero, lambda: (torch.randn(4),)),
    "s = 1.0; s *= x": (scale_from_one, lambda: (torch.randn(4),)),
    "total += t.norm()": (sum_of_norms, lambda: ([torch.randn(3), torch.randn(2)],)),
    "(-2) ** x": (negative_base_power, lambda: (torch.tensor([1.0, 2.0, 3.0]),)),
    "torch.Tensor.__pow__": (unbound_tensor_dunder, lambda: (torch.randn(3),)),
    "inputs named device, inf, nan": (inputs_named_like_fx_globals,
                                      lambda: (torch.randn(3), torch.randn(3), torch.randn(3))),
    "complex(1, inf)": (complex_constant, lambda: (torch.randn(3),)),
}
BACKENDS = {"torch.fx": fx_export_backend, "native": "eager"}


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("case", list(CASES))
def test_export_is_one_graph_equal_to_eager(stats, case, backend):
    fn, make_args = CASES[case]
    args = make_args()
    compiled = framejit.compile(fn, backend=BACKENDS[backend])
    for _ in range(2):
        assert_close_to_eager(compiled(*copy.deepcopy(args)), fn(*copy.deepcopy(args)))
    assert (stats.graphs, stats.graph_breaks, stats.eager_frames) == (1, 0, 0), stats.fallback_reasons
    assert stats.recompiles == 0


T = pytest.importorskip("transformers")

IDS = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(0))

MODELS = {
    "t5-conditional-generation": (
        lambda: T.T5ForConditionalGeneration(T.T5Config(
            num_layers=2, d_model=64, num_heads=4, d_ff=128, d_kv=16, vocab_size=128,
            decoder_start_token_id=0, pad_token_id=0)),
        {"decoder_input_ids": IDS}, ("logits", "encoder_last_hidden_state")),
    # Relative attention as in the released DeBERTa-v3 checkpoints.
    "deberta-v2": (
        lambda: T.DebertaV2Model(T.DebertaV2Config(
            num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
            vocab_size=128, relative_attention=True, pos_att_type=["p2c", "c2p"],
            position_buckets=16, max_relative_positions=-1, norm_rel_ebd="layer_norm",
            share_att_key=True, position_biased_input=False)),
        {}, ("last_hidden_state",)),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_transformers_model_through_torch_fx_is_one_graph(stats, name):
    """Before the fix these fell back to eager frame by frame (T5ForConditionalGeneration: 18
    graphs, DeBERTa-v2: 14), because every graph holding `0 += ...` failed to compile."""
    make, kwargs, keys = MODELS[name]
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = make().eval()
    reference = copy.deepcopy(model)
    backend = RecordingBackend()
    compiled = framejit.compile(model, backend=backend)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = reference(IDS, **kwargs)
        results = [compiled(IDS, **kwargs) for _ in range(2)]
    assert (stats.graphs, stats.graph_breaks, stats.eager_frames) == (1, 0, 0), stats.fallback_reasons
    assert stats.recompiles == 0 and backend.graph_count == 1
    for result in results:
        for key in keys:
            assert_close_to_eager(result[key], expected[key], path=key)
