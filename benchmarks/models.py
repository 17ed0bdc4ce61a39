"""Real models: graphs, graph breaks, first-call capture time and steady-state time per call,
framejit against torch.compile in the same run, relative to eager PyTorch.

    python benchmarks/models.py [--quick] [--device cpu|cuda] [--dtype bf16|fp16|fp32]
    python benchmarks/models.py --device cpu --threads N [--quick]

``--device cpu`` (the default without CUDA): small models on the CPU, framejit against
torch.compile(backend="eager"), i.e. capture cost and per-call overhead. A training step
(forward, loss, backward, SGD step, zero_grad) is included.

``--device cuda`` (the default with CUDA): forward only under torch.no_grad(), at realistic sizes
(a GPT-2-small block and TinyGPT at batch 8, sequence 1024, width 768, 12 heads; GPT-2, BERT,
Llama and T5 at batch 8, sequence 512), eager against framejit backend="default" (Triton
kernels) against torch.compile(backend="inductor"), in bf16 unless --dtype says otherwise.
Without CUDA, ``--device cuda`` says so and runs the same comparison on the CPU at tiny sizes,
to exercise the code path.

``--device cpu --threads N``: forward only under torch.no_grad() on CPU tensors with N threads,
at sizes a CPU serves (batch 2, sequence 128, width 256, 2 layers; a small CNN on 8 64x64 images),
eager against framejit backend="default" (C kernels) against torch.compile(backend="inductor")
(C++), timed interleaved in the same process; first calls with cold caches.

The transformers models are built from configs with random weights (nothing is downloaded).
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import statistics
import sys
import time
import timeit
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

from cpu_isa import CHOICES, configure_inductor, reexec_for_isa  # noqa: E402

reexec_for_isa()

import torch  # noqa: E402
import torch._dynamo  # noqa: E402
from models import Block, GPTConfig, TinyGPT  # noqa: E402
from timing import (  # noqa: E402
    cpu_clock,
    first_call_s,
    fmt,
    interleaved_cpu_ms,
    keep_freed_memory,
    time_ms,
    use_fresh_caches,
)
from torch import nn  # noqa: E402

import framejit  # noqa: E402
from framejit.kernels import triton_pool  # noqa: E402


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
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (and layers on CUDA)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default=None,
                    help="cpu: the capture-overhead comparison; cuda: forward-only against Inductor "
                         "(default: cuda if available, else cpu)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                    help="model dtype for --device cuda (default bf16; fp32 on the CPU fallback)")
    ap.add_argument("--threads", type=int, default=None,
                    help="--device cpu: forward-only against Inductor with this many threads")
    ap.add_argument("--warm-caches", action="store_true",
                    help="--device cuda: keep the usual compile caches (first calls may be warm)")
    ap.add_argument("--stages", action="store_true",
                    help="--threads N: print where each framejit first call spent its time")
    ap.add_argument("--corpus", action="store_true",
                    help="--threads N: also 19 more transformers architectures (GPT-NeoX, OPT, "
                         "Falcon, Mistral, ..., BART)")
    ap.add_argument("--isa", choices=CHOICES, default="native",
                    help="--threads N: avx2 measures as on a CPU without AVX-512 (see cpu_isa.py)")
    ap.add_argument("--model", default=None,
                    help="--threads N: comma-separated model names to run (default: all), e.g. T5,BERT")
    opts = ap.parse_args()
    device = opts.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda":
        run_forward(opts)
    elif opts.threads:
        run_cpu_forward(opts)
    else:
        run_cpu(opts)


def run_cpu(opts):
    """Small models on the CPU: framejit against torch.compile(backend="eager")."""
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


# -- --device cuda: forward only, against Inductor ----------------------------------------------

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _forward_cases(tiny: bool, quick: bool):
    """(name, make model, args builder, kwargs builder); builders take (device, dtype)."""
    if tiny:  # no CUDA: the sizes of the CPU cases, to exercise the code path
        batch, seq, width, heads, layers, tseq = 2, 16, 64, 4, 2, 16
        vocab = {"gpt": 256, "gpt2": 128, "bert": 128, "llama": 128, "t5": 128}
        llama_width, llama_heads, llama_kv, llama_ff = 64, 4, 2, 128
    else:
        batch, seq, width, heads, layers, tseq = 8, 1024, 768, 12, (4 if quick else 12), 512
        vocab = {"gpt": 50304, "gpt2": 50257, "bert": 30522, "llama": 32000, "t5": 32128}
        llama_width, llama_heads, llama_kv, llama_ff = 1024, 16, 4, 2816
    gpt = GPTConfig(vocab_size=vocab["gpt"], block_size=seq, n_layer=layers, n_head=heads,
                    n_embd=width)

    def hidden(device, dtype):
        return (torch.randn(batch, seq, width, device=device, dtype=dtype),)

    def tokens(n_vocab, length):
        return lambda device, dtype: (torch.randint(0, n_vocab, (batch, length), device=device),)

    def no_kwargs(device, dtype):
        return {}

    cases = [
        (f"GPT block ({width})", lambda: Block(gpt), hidden, no_kwargs),
        (f"TinyGPT ({layers}L)", lambda: TinyGPT(gpt), tokens(vocab["gpt"], seq), no_kwargs),
    ]
    try:
        import transformers as T
    except ImportError:
        return cases
    t5_decoder = tokens(vocab["t5"], tseq)
    cases += [
        (f"GPT-2 ({layers}L)", lambda: T.GPT2LMHeadModel(T.GPT2Config(
            n_layer=layers, n_embd=width, n_head=heads, vocab_size=vocab["gpt2"], n_positions=max(tseq, 64))),
         tokens(vocab["gpt2"], tseq), no_kwargs),
        (f"BERT ({layers}L)", lambda: T.BertModel(T.BertConfig(
            num_hidden_layers=layers, hidden_size=width, num_attention_heads=heads,
            intermediate_size=4 * width, vocab_size=vocab["bert"], max_position_embeddings=max(tseq, 64))),
         tokens(vocab["bert"], tseq), no_kwargs),
        (f"Llama ({layers}L)", lambda: T.LlamaForCausalLM(T.LlamaConfig(
            num_hidden_layers=layers, hidden_size=llama_width, num_attention_heads=llama_heads,
            num_key_value_heads=llama_kv, intermediate_size=llama_ff, vocab_size=vocab["llama"],
            max_position_embeddings=max(tseq, 64))),
         tokens(vocab["llama"], tseq), no_kwargs),
        (f"T5 ({layers}L)", lambda: T.T5Model(T.T5Config(
            num_layers=layers, d_model=width, num_heads=heads, d_ff=4 * width, d_kv=width // heads,
            vocab_size=vocab["t5"])),
         tokens(vocab["t5"], tseq), lambda device, dtype: {"decoder_input_ids": t5_decoder(device, dtype)[0]}),
    ]
    return cases


def _first_tensor(out):
    """The main output of a model call (logits or last hidden state)."""
    if isinstance(out, torch.Tensor):
        return out
    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    for item in out:
        found = _first_tensor(item) if isinstance(item, (tuple, list)) or hasattr(item, "to_tuple") else item
        if isinstance(found, torch.Tensor):
            return found
    return None


def _rel_error(out, ref) -> float | None:
    out, ref = _first_tensor(out), _first_tensor(ref)
    if out is None or ref is None or out.shape != ref.shape:
        return None
    out, ref = out.double(), ref.double()
    return float(torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref))


def _forward_row(name, model, args, kwargs, device, quick):
    row = {"name": name, "notes": []}
    call = lambda m: (lambda: m(*args, **kwargs))  # noqa: E731
    reference = model(*args, **kwargs)
    row["eager_ms"] = time_ms(call(model), device, quick=quick)

    try:
        framejit.reset()
        compiled = framejit.compile(model)  # backend="default": Triton kernels on CUDA tensors
        ahead = dict(triton_pool.counts)
        row["fj_first_s"], out = first_call_s(compiled, args, kwargs, device)
        ahead = {k: v - ahead[k] for k, v in triton_pool.counts.items()}
        if ahead["handed"]:  # Triton compiles done ahead by worker processes (kernels/triton_pool)
            row["notes"].append(f"compile workers: {ahead['by_workers']} of {ahead['handed']} "
                                f"compiles built ahead ({ahead['cancelled']} done in the process, "
                                f"{ahead['failed']} failed)")
        s = framejit.stats()
        row.update(graphs=s["graphs"], breaks=s["graph_breaks"], fallbacks=s["fallbacks"],
                   kernels=s["kernels"], kernel_s=s["kernel_seconds"], err=_rel_error(out, reference))
        del out
        row["fj_ms"] = time_ms(call(compiled), device, quick=quick)
        row["recompiles"] = framejit.stats()["recompiles"]
        row["misses"] = framejit.stats()["kernel_layout_misses"]
    except Exception as e:  # report and go on with the other models
        row["notes"].append(f"framejit: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    del reference

    try:
        torch._dynamo.reset()
        inductor = torch.compile(model, backend="inductor")
        row["ind_first_s"], _ = first_call_s(inductor, args, kwargs, device)
        row["ind_ms"] = time_ms(call(inductor), device, quick=quick)
    except Exception as e:
        row["notes"].append(f"inductor: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    return row


def _ratio(a, b):
    return a / b if a and b else None


def _forward_line(r: dict) -> str:
    """One row of the forward table (also printed as each model is measured, so that a run
    stopped part-way still shows what it measured)."""
    g = r.get
    return (f"{r['name']:<18}{fmt(g('eager_ms'), '.2f', 10)}{fmt(g('fj_ms'), '.2f', 9)}"
            f"{fmt(g('ind_ms'), '.2f', 9)}{fmt(_ratio(g('fj_ms'), g('eager_ms')), '.2f', 10)}"
            f"{fmt(_ratio(g('fj_ms'), g('ind_ms')), '.2f', 8)}{fmt(g('fj_first_s'), '.2f', 10)}"
            f"{fmt(g('kernel_s'), '.2f', 8)}"
            f"{fmt(g('ind_first_s'), '.2f', 11)}{fmt(_ratio(g('ind_first_s'), g('fj_first_s')), '.1f', 11)}"
            f"{fmt(g('graphs'), 'd', 8)}{fmt(g('breaks'), 'd', 8)}{fmt(g('kernels'), 'd', 9)}"
            f"{fmt(g('recompiles'), 'd', 8)}{fmt(g('misses'), 'd', 7)}{fmt(g('err'), '.1e', 9)}")


def run_forward(opts):
    """Forward only under no_grad: eager, framejit backend="default", Inductor."""
    cuda = torch.cuda.is_available()
    if cuda:
        device = torch.device("cuda")
        device_name = torch.cuda.get_device_name()
        dtype = DTYPES[opts.dtype or "bf16"]
    else:
        print("CUDA is not available: running the forward-only comparison (eager, framejit "
              "backend='default', Inductor) on the CPU at tiny sizes to exercise the code path. "
              "backend='default' runs eager torch on CPU tensors, so no kernels are generated.")
        device, device_name = torch.device("cpu"), "cpu"
        dtype = DTYPES[opts.dtype or "fp32"]
        opts.quick = True
        torch.set_num_threads(1)  # see benchmarks/kernels.py: thread wake-ups swamp tiny ops
    warnings.filterwarnings("ignore")
    try:
        import transformers

        transformers.logging.set_verbosity_error()  # tiny vocabularies trip config warnings
    except ImportError:
        pass
    caches = "usual" if opts.warm_caches else "fresh, " + use_fresh_caches()
    print(f"torch {torch.__version__}, Python {sys.version.split()[0]}, device {device_name}, "
          f"dtype {str(dtype).removeprefix('torch.')}, caches: {caches}")
    # Import and initialise both compilers once, outside the timed first calls.
    warm = torch.randn(8, 8, device=device)
    for name, compiler in (("framejit", framejit.compile),
                           ("torch.compile", lambda f: torch.compile(f, backend="inductor"))):
        try:
            compiler(lambda x: (x * 2).relu())(warm)
        except Exception as e:  # the per-model rows report it again
            print(f"note: {name} failed on a warm-up function: {type(e).__name__}: {e}")
    framejit.reset()
    torch._dynamo.reset()
    rows = []
    t0 = time.perf_counter()
    for name, make, make_args, make_kwargs in _forward_cases(tiny=not cuda, quick=opts.quick):
        torch.manual_seed(0)
        try:
            model = make().to(device=device, dtype=dtype).eval()
            args, kwargs = make_args(device, dtype), make_kwargs(device, dtype)
            with torch.no_grad():
                row = _forward_row(name, model, args, kwargs, device, opts.quick)
        except Exception as e:  # building or running the model eagerly failed (out of memory, say)
            row = {"name": name, "notes": [f"eager: {type(e).__name__}: {e}"]}
        rows.append(row)
        print(f"{_forward_line(row)}  [{time.perf_counter() - t0:.0f} s]", flush=True)
        for n in row["notes"]:
            print(f"    {n[:300]}", flush=True)
        model = args = kwargs = None
        if cuda:
            torch.cuda.empty_cache()

    print()
    print(f"{'model':<18}{'eager ms':>10}{'fj ms':>9}{'ind ms':>9}{'fj/eager':>10}{'fj/ind':>8}"
          f"{'1st fj s':>10}{'kern s':>8}{'1st ind s':>11}{'ind/fj 1st':>11}{'graphs':>8}{'breaks':>8}{'kernels':>9}"
          f"{'recomp':>8}{'lmiss':>7}{'rel err':>9}")
    for r in rows:
        print(_forward_line(r))
    print("ms: median time per forward call; fj/eager, fj/ind: time ratios (lower: framejit faster); "
          "1st: first call, capture + compile + tuning, synchronized (caches cold unless "
          "--warm-caches); kern s: the part of framejit's first call spent building kernels (Triton's "
          "compiles and tuning on a GPU); ind/fj 1st > 1: framejit compiles faster; graphs/breaks/kernels: framejit's "
          "counts on the first call; recomp: over all timed calls; lmiss: kernels that ran as torch ops "
          "for an input's layout (FRAMEJIT_LOGS=kernels says which); rel err: ‖framejit − eager‖/‖eager‖ "
          "of the main output.")
    notes = [(r["name"], n) for r in rows for n in r["notes"]]
    fallbacks = [r["name"] for r in rows if r.get("fallbacks")]
    if fallbacks:
        print(f"frames that ran as plain Python (framejit fallbacks): {', '.join(fallbacks)}")
    if notes:
        print("Failures:")
        for name, n in notes:
            print(f"  {name}: {n[:300]}")


# -- --device cpu --threads N: forward only, against Inductor ----------------------------------


class SmallCNN(nn.Module):
    """Conv-BN-ReLU stages with pooling, then a linear head: a CNN in eval mode."""

    def __init__(self, width: int = 32, classes: int = 100):
        super().__init__()
        layers, c = [], 3
        for out in (width, width, 2 * width, 2 * width, 4 * width):
            layers += [nn.Conv2d(c, out, 3, padding=1, bias=False), nn.BatchNorm2d(out), nn.ReLU()]
            if out != c and c != 3:
                layers.append(nn.MaxPool2d(2))
            c = out
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(c, classes)

    def forward(self, x):
        x = self.features(x)
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def _cpu_forward_cases():
    """(name, make model, args, kwargs) at CPU serving sizes."""
    batch, seq, width, heads, layers, vocab = 2, 128, 256, 4, 2, 4096
    tokens = lambda: torch.randint(0, vocab, (batch, seq))  # noqa: E731
    cases = [
        ("nanoGPT", lambda: TinyGPT(GPTConfig(vocab_size=vocab, block_size=seq, n_layer=layers,
                                              n_head=heads, n_embd=width)), (tokens(),), {}),
        ("TransformerEncoder", lambda: nn.TransformerEncoder(
            nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True),
            num_layers=layers, enable_nested_tensor=False),
         (torch.randn(batch, seq, width),), {}),
        ("CNN (eval)", SmallCNN, (torch.randn(8, 3, 64, 64),), {}),
    ]
    try:
        import transformers as T
    except ImportError:
        return cases
    cases += [
        ("GPT-2", lambda: T.GPT2LMHeadModel(T.GPT2Config(
            n_layer=layers, n_embd=width, n_head=heads, vocab_size=vocab, n_positions=seq)),
         (tokens(),), {}),
        ("BERT", lambda: T.BertModel(T.BertConfig(
            num_hidden_layers=layers, hidden_size=width, num_attention_heads=heads,
            intermediate_size=4 * width, vocab_size=vocab, max_position_embeddings=seq)),
         (tokens(),), {}),
        ("Llama", lambda: T.LlamaForCausalLM(T.LlamaConfig(
            num_hidden_layers=layers, hidden_size=width, num_attention_heads=heads,
            num_key_value_heads=heads // 2, intermediate_size=688, vocab_size=vocab,
            max_position_embeddings=seq)),
         (tokens(),), {}),
        ("T5", lambda: T.T5Model(T.T5Config(
            num_layers=layers, d_model=width, num_heads=heads, d_ff=4 * width, d_kv=width // heads,
            vocab_size=vocab)),
         (tokens(),), {"decoder_input_ids": tokens()}),
    ]
    return cases


def _cpu_corpus_cases():
    """(name, make model, args, kwargs): more transformers architectures at the same CPU
    serving sizes (``--corpus``)."""
    import transformers as T

    batch, seq, width, heads, layers, vocab = 2, 128, 256, 4, 2, 4096
    tokens = lambda: torch.randint(0, vocab, (batch, seq))  # noqa: E731
    common = dict(num_hidden_layers=layers, hidden_size=width, num_attention_heads=heads,
                  intermediate_size=4 * width, vocab_size=vocab, max_position_embeddings=seq)
    decoders = dict(common, num_key_value_heads=heads // 2)
    one = lambda name, make: (name, make, (tokens(),), {})  # noqa: E731
    return [
        one("GPT-NeoX", lambda: T.GPTNeoXForCausalLM(T.GPTNeoXConfig(**common))),
        one("OPT", lambda: T.OPTForCausalLM(T.OPTConfig(
            num_hidden_layers=layers, hidden_size=width, num_attention_heads=heads, ffn_dim=4 * width,
            vocab_size=vocab, word_embed_proj_dim=width, max_position_embeddings=seq))),
        one("Falcon", lambda: T.FalconForCausalLM(T.FalconConfig(
            num_hidden_layers=layers, hidden_size=width, num_attention_heads=heads, vocab_size=vocab))),
        one("Mistral", lambda: T.MistralForCausalLM(T.MistralConfig(**decoders))),
        one("Qwen2", lambda: T.Qwen2ForCausalLM(T.Qwen2Config(**decoders))),
        one("Phi", lambda: T.PhiForCausalLM(T.PhiConfig(**common))),
        one("Gemma", lambda: T.GemmaForCausalLM(T.GemmaConfig(**decoders, head_dim=width // heads))),
        one("StableLM", lambda: T.StableLmForCausalLM(T.StableLmConfig(**decoders))),
        one("OLMo", lambda: T.OlmoForCausalLM(T.OlmoConfig(**common))),
        one("GPT-J", lambda: T.GPTJForCausalLM(T.GPTJConfig(
            n_layer=layers, n_embd=width, n_head=heads, vocab_size=vocab, rotary_dim=16,
            n_positions=seq))),
        one("GPT-Neo", lambda: T.GPTNeoForCausalLM(T.GPTNeoConfig(
            num_layers=layers, hidden_size=width, num_heads=heads, vocab_size=vocab,
            attention_types=[[["global", "local"], layers // 2]], window_size=32,
            max_position_embeddings=seq))),
        one("MPT", lambda: T.MptForCausalLM(T.MptConfig(
            n_layers=layers, d_model=width, n_heads=heads, vocab_size=vocab, max_seq_len=seq))),
        one("RoBERTa", lambda: T.RobertaModel(T.RobertaConfig(
            **dict(common, max_position_embeddings=seq + 2)))),
        one("DistilBERT", lambda: T.DistilBertModel(T.DistilBertConfig(
            n_layers=layers, dim=width, n_heads=heads, hidden_dim=4 * width, vocab_size=vocab,
            max_position_embeddings=seq))),
        one("ALBERT", lambda: T.AlbertModel(T.AlbertConfig(**common, embedding_size=128))),
        one("ELECTRA", lambda: T.ElectraModel(T.ElectraConfig(**common, embedding_size=128))),
        one("DeBERTa-v2", lambda: T.DebertaV2Model(T.DebertaV2Config(**common))),
        one("MobileBERT", lambda: T.MobileBertModel(T.MobileBertConfig(
            num_hidden_layers=layers, hidden_size=width, num_attention_heads=heads,
            intermediate_size=width, vocab_size=vocab, embedding_size=128,
            intra_bottleneck_size=128, true_hidden_size=128, max_position_embeddings=seq))),
        ("BART", lambda: T.BartModel(T.BartConfig(
            encoder_layers=layers, decoder_layers=layers, d_model=width,
            encoder_attention_heads=heads, decoder_attention_heads=heads,
            encoder_ffn_dim=4 * width, decoder_ffn_dim=4 * width, vocab_size=vocab,
            max_position_embeddings=seq)), (tokens(),), {}),
    ]


def _print_stages(name: str, seconds: float, events: list) -> None:
    """framejit's recorded stages of one first call (capture, passes, kernel builds)."""
    parts = []
    for e in events:
        kind = type(e).__name__
        if kind in ("FrameCaptured", "GraphCompiled", "KernelBuilt", "Stage"):
            label = {"FrameCaptured": "capture+compile", "GraphCompiled": "graph compile",
                     "KernelBuilt": "C load" if getattr(e, "cached", False) else "C build"
                     }.get(kind, getattr(e, "name", kind))
            parts.append(f"{label} {e.seconds * 1e3:.0f} ms")
    print(f"  {name}: first call {seconds * 1e3:.0f} ms: {', '.join(parts)}", flush=True)


def _geomean(values):
    values = [v for v in values if v]
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else None


def run_cpu_forward(opts):
    """Forward only under no_grad on CPU tensors: eager, framejit backend="default" (C kernels),
    Inductor, interleaved, with ``opts.threads`` threads."""
    torch.set_num_threads(opts.threads)
    allocator = keep_freed_memory()
    warnings.filterwarnings("ignore")
    try:
        import transformers

        transformers.logging.set_verbosity_error()
    except ImportError:
        pass
    caches = "usual" if opts.warm_caches else "fresh, " + use_fresh_caches()
    print(f"torch {torch.__version__}, Python {sys.version.split()[0]}, CPU, "
          f"{torch.get_num_threads()} thread(s), fp32, steady state timed by {cpu_clock()[1]}, "
          f"caches: {caches}")
    print(allocator)
    print(configure_inductor(opts.isa))
    warm = torch.randn(8, 8)
    for compiler in (framejit.compile, lambda f: torch.compile(f, backend="inductor")):
        compiler(lambda x: (x * 2).relu())(warm)  # import and initialise both, untimed
    framejit.reset()
    torch._dynamo.reset()
    rows = []
    t0 = time.perf_counter()
    wanted = opts.model.split(",") if opts.model else None
    cases = _cpu_forward_cases() + (_cpu_corpus_cases() if opts.corpus else [])
    for name, make, args, kwargs in cases:
        if wanted and name not in wanted:
            continue
        torch.manual_seed(0)
        model = make().eval()
        row = {"name": name, "notes": []}
        with torch.no_grad():
            reference = model(*args, **kwargs)
            fns = {"eager": lambda m=model, a=args, k=kwargs: m(*a, **k)}
            try:
                framejit.reset()
                compiled = framejit.compile(model)
                events: list = []
                framejit.record.subscribe(events.append)
                try:
                    row["fj_first_s"], out = first_call_s(compiled, args, kwargs)
                finally:
                    framejit.record.unsubscribe(events.append)
                if opts.stages:
                    _print_stages(name, row["fj_first_s"], events)
                s = framejit.stats()
                row.update(graphs=s["graphs"], breaks=s["graph_breaks"], kernels=s["kernels"],
                           err=_rel_error(out, reference))
                fns["fj"] = lambda m=compiled, a=args, k=kwargs: m(*a, **k)
            except Exception as e:
                row["notes"].append(f"framejit: {type(e).__name__}: {e}")
            try:
                torch._dynamo.reset()
                inductor = torch.compile(model, backend="inductor")
                row["ind_first_s"], _ = first_call_s(inductor, args, kwargs)
                fns["ind"] = lambda m=inductor, a=args, k=kwargs: m(*a, **k)
            except Exception as e:
                row["notes"].append(f"inductor: {type(e).__name__}: {str(e).splitlines()[0]}")
            times = interleaved_cpu_ms(fns, rounds=7 if opts.quick else 15)
        row.update(eager_ms=times["eager"], fj_ms=times.get("fj"), ind_ms=times.get("ind"))
        rows.append(row)
        print(f"  {name}: done ({time.perf_counter() - t0:.0f} s)", flush=True)

    print()
    print(f"{'model':<20}{'eager ms':>10}{'fj ms':>9}{'ind ms':>9}{'fj/eager':>10}{'ind/eager':>10}"
          f"{'fj/ind':>8}{'1st fj s':>10}{'1st ind s':>11}{'ind/fj 1st':>11}{'graphs':>8}"
          f"{'kernels':>9}{'rel err':>9}")
    for r in rows:
        g = r.get
        print(f"{r['name']:<20}{fmt(g('eager_ms'), '.2f', 10)}{fmt(g('fj_ms'), '.2f', 9)}"
              f"{fmt(g('ind_ms'), '.2f', 9)}{fmt(_ratio(g('fj_ms'), g('eager_ms')), '.2f', 10)}"
              f"{fmt(_ratio(g('ind_ms'), g('eager_ms')), '.2f', 10)}"
              f"{fmt(_ratio(g('fj_ms'), g('ind_ms')), '.2f', 8)}{fmt(g('fj_first_s'), '.2f', 10)}"
              f"{fmt(g('ind_first_s'), '.2f', 11)}{fmt(_ratio(g('ind_first_s'), g('fj_first_s')), '.1f', 11)}"
              f"{fmt(g('graphs'), 'd', 8)}{fmt(g('kernels'), 'd', 9)}{fmt(g('err'), '.1e', 9)}")
    gm = {k: _geomean([_ratio(r.get(a), r.get(b)) for r in rows])
          for k, (a, b) in {"fj/eager": ("fj_ms", "eager_ms"), "ind/eager": ("ind_ms", "eager_ms"),
                            "fj/ind": ("fj_ms", "ind_ms")}.items()}
    print("geomean: " + ", ".join(f"{k} {fmt(v, '.2f', 0).strip()}" for k, v in gm.items()))
    print("ms: median time per forward call over interleaved rounds (eager, framejit, Inductor "
          "timed in turn); fj/ind < 1: framejit faster than Inductor; 1st: first call with cold "
          "caches (capture + compile); ind/fj 1st > 1: framejit compiles faster; rel err: "
          "‖framejit − eager‖/‖eager‖ of the main output.")
    for r in rows:
        for n in r["notes"]:
            print(f"  {r['name']}: {n[:300]}")


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    main()
