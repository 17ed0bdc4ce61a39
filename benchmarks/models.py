"""Real models: graphs, graph breaks, first-call capture time and steady-state time per call,
framejit against torch.compile(backend="eager") in the same run, relative to eager PyTorch.

    python benchmarks/models.py [--quick]

The transformers models are built from small configs with random weights (nothing is
downloaded). A training step (forward, loss, backward, SGD step, zero_grad) is included.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
import timeit
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

import torch  # noqa: E402
import torch._dynamo  # noqa: E402
from models import GPTConfig, TinyGPT  # noqa: E402
from torch import nn  # noqa: E402

import framejit  # noqa: E402


def _transformers_cases():
    try:
        import transformers as T
    except ImportError:
        return []
    ids = torch.randint(0, 128, (2, 16))
    return [
        ("GPT-2", lambda: T.GPT2LMHeadModel(T.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128,
                                                         n_positions=64)), (ids,), {}),
        ("BERT", lambda: T.BertModel(T.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                                  intermediate_size=128, vocab_size=128)), (ids,), {}),
        ("Llama", lambda: T.LlamaForCausalLM(T.LlamaConfig(num_hidden_layers=2, hidden_size=64,
                                                           num_attention_heads=4, num_key_value_heads=2,
                                                           intermediate_size=128, vocab_size=128)), (ids,), {}),
        ("T5", lambda: T.T5Model(T.T5Config(num_layers=2, d_model=64, num_heads=4, d_ff=128, d_kv=16,
                                            vocab_size=128)), (ids,), {"decoder_input_ids": ids}),
    ]


def cases():
    x = torch.randn(10, 2, 64)
    return [
        ("nanoGPT", lambda: TinyGPT(GPTConfig()), (torch.randint(0, 256, (2, 16)),), {}),
        ("TransformerEncoder", lambda: nn.TransformerEncoder(
            nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0), num_layers=2, enable_nested_tensor=False),
         (x,), {}),
        ("TransformerDecoderLayer", lambda: nn.TransformerDecoderLayer(64, 4, 128, dropout=0.0), (x, x), {}),
        ("MultiheadAttention", lambda: nn.MultiheadAttention(64, 4), (x, x, x), {}),
        *_transformers_cases(),
    ]


class TrainStep(nn.Module):
    """forward, loss, backward, optimizer step, zero_grad: one call."""

    def __init__(self, optimizer: str = "sgd"):
        super().__init__()
        self.model = TinyGPT(GPTConfig())
        if optimizer == "adam":
            self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        else:
            self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)

    def forward(self, idx, targets):
        logits = self.model(idx)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()
        return loss.detach()


def per_call_ms(fn, args, kwargs, number: int) -> float:
    fn(*args, **kwargs)
    return min(timeit.repeat(lambda: fn(*args, **kwargs), number=number, repeat=5)) / number * 1e3


def first_call_ms(model, args, kwargs, compile_fn) -> float:
    framejit.reset()
    torch._dynamo.reset()
    compiled = compile_fn(model)
    t0 = time.perf_counter()
    compiled(*args, **kwargs)
    return (time.perf_counter() - t0) * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    opts = ap.parse_args()
    number = 5 if opts.quick else 30
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    fj = framejit.compile
    tc = lambda m: torch.compile(m, backend="eager")  # noqa: E731
    print(f"torch {torch.__version__}, Python {sys.version.split()[0]}")
    print(f"{'model':<24}{'graphs':>7}{'breaks':>7}{'eager fr':>9}{'recomp':>8}{'tc graphs':>10}"
          f"{'1st call fj ms':>15}{'tc ms':>9}{'tc/fj':>7}{'fj/eager':>10}{'tc/eager':>10}")
    tokens = (torch.randint(0, 256, (2, 16)), torch.randint(0, 256, (2, 16)))
    all_cases = cases() + [("training step (SGD)", TrainStep, tokens, {}),
                           ("training step (AdamW)", lambda: TrainStep("adam"), tokens, {})]
    for name, make, args, kwargs in all_cases:
        training = name.startswith("training step")
        model = make()
        if not training:
            model.eval()
        with torch.no_grad() if not training else _null():
            f_first = first_call_ms(model, args, kwargs, fj)
            s = framejit.stats()
            graphs, breaks, eager_frames = s["graphs"], s["graph_breaks"], s["fallbacks"]
            t_first = first_call_ms(model, args, kwargs, tc)
            explanation = torch._dynamo.explain(copy.deepcopy(model) if not training else model)(*args, **kwargs)
            tc_graphs = explanation.graph_count
            framejit.reset()
            torch._dynamo.reset()
            e = per_call_ms(model, args, kwargs, number)
            f = per_call_ms(fj(model), args, kwargs, number)
            recompiles = framejit.stats()["recompiles"]
            t = per_call_ms(tc(model), args, kwargs, number)
        print(f"{name:<24}{graphs:>7}{breaks:>7}{eager_frames:>9}{recompiles:>8}{tc_graphs:>10}{f_first:>15.1f}"
              f"{t_first:>9.1f}{t_first / f_first:>7.1f}{f / e:>10.2f}{t / e:>10.2f}")
    print("graphs/breaks/eager fr: framejit's counts on the first call (eager fr = frames run as plain "
          "Python); recomp: framejit's recompiles over all the timed calls; tc graphs: "
          "torch._dynamo.explain's graph count. fj/eager, tc/eager: steady-state time per call "
          "relative to eager (lower is better).")


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    main()
