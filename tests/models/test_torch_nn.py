"""torch.nn's transformer modules and a nanoGPT-style model: one graph, no break, eager's results."""

import copy
import os
import sys

import pytest
import torch
from torch import nn

import framejit
from framejit.testing import assert_close_to_eager

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
from models import GPTConfig, TinyGPT  # noqa: E402

X = torch.randn(6, 2, 16, generator=torch.Generator().manual_seed(0))

CASES = {
    "TransformerEncoder": (lambda: nn.TransformerEncoder(
        nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0), num_layers=2, enable_nested_tensor=False),
        lambda: (X,)),
    "TransformerDecoderLayer": (lambda: nn.TransformerDecoderLayer(16, 4, 32, dropout=0.0),
                                lambda: (X, X.flip(0))),
    "MultiheadAttention_self": (lambda: nn.MultiheadAttention(16, 4), lambda: (X, X, X)),
    "MultiheadAttention_cross": (lambda: nn.MultiheadAttention(16, 4), lambda: (X, X.flip(0), X.flip(0))),
    "nanoGPT": (lambda: TinyGPT(GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=16)),
                lambda: (torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1)),)),
}


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
@pytest.mark.parametrize("name", list(CASES))
def test_one_graph_equal_to_eager(stats, name, grad):
    make, make_args = CASES[name]
    torch.manual_seed(0)
    model = make().eval()
    reference = copy.deepcopy(model)
    args = make_args()
    with torch.set_grad_enabled(grad):
        compiled = framejit.compile(model)
        assert_close_to_eager(compiled(*args), reference(*args))
        assert_close_to_eager(compiled(*args), reference(*args))
    assert (stats.graphs, stats.graph_breaks, stats.eager_frames, stats.captured) == (1, 0, 0, 1)
