"""Dynamic shapes on a real model (issue 12): a transformers GPT-2 (small config, random weights)
called with sequence lengths 1 to 48 compiles two graphs, the first static, and matches eager;
the second graph's kernels serve every length."""

import copy
import os
import warnings

import pytest
import torch

import framejit

T = pytest.importorskip("transformers")


def test_gpt2_growing_sequence_is_two_graphs(stats):
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = T.GPT2LMHeadModel(T.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128,
                                               n_positions=64, bos_token_id=0, eos_token_id=0)).eval()
    reference = copy.deepcopy(model)
    compiled = framejit.compile(model)
    ids = torch.randint(0, 128, (1, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kernels = []
        for length in range(1, 49):
            got = compiled(ids[:, :length]).logits
            torch.testing.assert_close(got, reference(ids[:, :length]).logits, rtol=1e-5, atol=1e-5)
            kernels.append(framejit.stats()["kernels"])
    assert stats.graphs == 2
    if os.environ.get("FRAMEJIT_TEST_BACKEND", "native") == "native":  # fx: no kernels
        # The second graph's C kernels take the sequence length at run time: none is built
        # after it.
        assert kernels[1] > kernels[0] > 0 and kernels[-1] == kernels[1]
    assert stats.recompiles == 1
    assert stats.eager_frames == 0 and stats.graph_breaks == 0
    assert stats.recompile_reasons[0][1] == "args[0].shape[1]: 1 → 2"
