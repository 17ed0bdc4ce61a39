"""The disk cache of compiled graphs (framejit/graph_cache.py): a later compile of the same
captured graph reads the wrapper and its kernels instead of running the passes, and computes
the same values, with the same code, as the compile it was stored from."""

import json
import os
import warnings

import pytest
import torch

import framejit
from framejit import graph_cache
from framejit.fx_ir import Graph, GraphModule
from framejit.kernels.c_runtime import CLauncher
from framejit.pipeline import compile_with_kernels
from framejit.testing import built_by_pipeline


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """The graph cache on, in a folder of its own."""
    monkeypatch.setenv("FRAMEJIT_GRAPH_CACHE", "1")
    monkeypatch.setattr(graph_cache, "folder", lambda: str(tmp_path))
    return tmp_path


def _entries(folder):
    return [f for f in os.listdir(folder) if f.endswith(".pickle")]


def _compile_twice(fn, *args):
    """``fn`` compiled (and run) twice, forgetting every compiled version in between, as two
    processes would: (results, wrapper functions, graph cache hits) of each."""
    runs = []
    for _ in range(2):
        framejit.reset()
        with built_by_pipeline() as built, torch.no_grad():
            out = framejit.compile(fn)(*args)
        runs.append((out, built, framejit.stats()))
    return runs


def _wrapper_graph(fn):
    """A compiled function's wrapper graph (a function that makes it, after a graph cache hit)."""
    graph = fn.framejit_graph
    return graph() if callable(graph) else graph


def _wrapper_code(built):
    return [(_wrapper_graph(f).python_code("forward").src, f.__code__.co_code,
             [(k.name, k.source, k.checked_inputs, k.donated) for k in f.framejit_kernels])
            for f in built]


def _rms_norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def _block(x, w, b):
    h = torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b)
    s = torch.softmax(h @ h.transpose(-1, -2) / 8.0, -1)
    return torch.nn.functional.gelu(s @ h + b) + torch.arange(x.shape[-1], dtype=x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fn", [_rms_norm, _block])
def test_a_second_compile_of_a_graph_is_read_from_the_cache(cache, fn, dtype):
    torch.manual_seed(0)
    x, w, b = torch.randn(4, 8, 32, dtype=dtype), torch.randn(32, dtype=dtype), torch.randn(32, dtype=dtype)
    args = (x, w) if fn is _rms_norm else (x, w, b)
    (first, built1, stats1), (second, built2, stats2) = _compile_twice(fn, *args)
    assert stats1["graph_cache_hits"] == 0 and stats2["graph_cache_hits"] == 1
    assert stats1["kernels"] == stats2["kernels"] >= 1
    assert len(_entries(cache)) == 1
    # The same code around the same kernels, and the same bits.
    assert _wrapper_code(built1) == _wrapper_code(built2)
    assert torch.equal(first, second)
    torch.testing.assert_close(second, fn(*args), **({} if dtype is torch.float32 else
                                                     dict(rtol=2e-2, atol=2e-2)))
    # What runs if an input comes laid out otherwise: the group's torch ops, from the entry.
    if fn is _rms_norm:
        graph = _wrapper_graph(built2[0])
        inputs = dict(zip([n for n in graph.nodes if n.op == "placeholder"], args))
        (call,) = [n for n in graph.nodes if n.op == "call_function"]
        (launcher,) = built2[0].framejit_kernels
        assert isinstance(launcher, CLauncher) and call.target.fn is launcher
        kernel_args = [inputs[a] for a in call.args]
        torch.testing.assert_close(launcher.fallback(*kernel_args), launcher(*kernel_args),
                                   **({} if dtype is torch.float32 else dict(rtol=1e-2, atol=1e-2)))


def test_other_sizes_dtypes_and_code_are_other_keys(cache, monkeypatch):
    x, w = torch.randn(4, 32), torch.randn(32)
    hits = []
    for args in [(x, w), (x[:3], w), (x.double(), w.double()), (x.t().contiguous().t(), w),
                 (x, w)]:
        framejit.reset()
        framejit.compile(_rms_norm)(*args)
        hits.append(framejit.stats()["graph_cache_hits"])
    assert hits == [0, 0, 0, 0, 1]
    # framejit's own code is part of every key, and so are its settings as they are now.
    from framejit.kernels import c_render

    monkeypatch.setattr(c_render, "PARALLEL_MIN", c_render.PARALLEL_MIN + 1)
    framejit.reset()
    framejit.compile(_rms_norm)(x, w)
    assert framejit.stats()["graph_cache_hits"] == 0
    monkeypatch.setattr(graph_cache, "_code", "another framejit")
    framejit.reset()
    framejit.compile(_rms_norm)(x, w)
    assert framejit.stats()["graph_cache_hits"] == 0


_PROCESS = """
import sys, torch, framejit
if sys.argv[2] == "first":
    import framejit.fx_ir.printing, framejit.kernels.reference  # another history of imports
torch.manual_seed(0)
x, w = torch.randn(6, 40, dtype=torch.bfloat16), torch.randn(40, dtype=torch.bfloat16)
def f(x, w):
    h = x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * w
    return torch.softmax(h, -1) + torch.arange(40.0).to(x.dtype)
with torch.no_grad():
    out = framejit.compile(f)(x, w)
torch.save(out, sys.argv[1])
print(framejit.stats()["graph_cache_hits"])
"""


def test_another_process_reads_the_entry(tmp_path):
    """Two processes with the cache folder in common (the second imported fewer of framejit's
    modules when it computed its key): the second reads the first one's compile, with the same
    bits."""
    import subprocess
    import sys

    env = {**os.environ, "FRAMEJIT_GRAPH_CACHE": "1", "FRAMEJIT_CACHE_DIR": str(tmp_path / "cache")}
    script = tmp_path / "prog.py"
    script.write_text(_PROCESS)
    hits = []
    for n, history in ((1, "first"), (2, "second")):
        done = subprocess.run([sys.executable, str(script), str(tmp_path / f"{n}.pt"), history],
                              env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        hits.append(done.stdout.split()[-1])
    assert hits == ["0", "1"]
    assert torch.equal(torch.load(tmp_path / "1.pt"), torch.load(tmp_path / "2.pt"))


def test_an_entry_that_cannot_be_read_is_a_miss(cache):
    x, w = torch.randn(4, 32), torch.randn(32)
    framejit.compile(_rms_norm)(x, w)
    (entry,) = _entries(cache)
    with open(os.path.join(cache, entry), "wb") as f:
        f.write(b"not an entry")
    framejit.reset()
    got = framejit.compile(_rms_norm)(x, w)
    assert framejit.stats()["graph_cache_hits"] == 0
    torch.testing.assert_close(got, _rms_norm(x, w))
    framejit.reset()
    framejit.compile(_rms_norm)(x, w)  # rewritten by the compile above
    assert framejit.stats()["graph_cache_hits"] == 1


def test_off_under_framejit_graph_cache_0(cache, monkeypatch):
    monkeypatch.setenv("FRAMEJIT_GRAPH_CACHE", "0")
    x, w = torch.randn(4, 32), torch.randn(32)
    for _ in range(2):
        framejit.reset()
        framejit.compile(_rms_norm)(x, w)
        assert framejit.stats()["graph_cache_hits"] == 0
    assert _entries(cache) == []


def _constant_graph(constant):
    """softmax(x * exp(c)) with ``c`` a constant of the graph module (folded: exp(c))."""
    g = Graph()
    x = g.placeholder("x")
    c = g.get_attr("c")
    e = g.call_function(torch.exp, (c,))
    m = g.call_function(torch.mul, (x, e))
    s = g.call_function(torch.softmax, (m, -1))
    g.output(s)
    for node, shape in ((x, (4, 16)), (c, (16,)), (e, (16,)), (m, (4, 16)), (s, (4, 16))):
        node.meta["val"], node.meta["device"] = torch.empty(shape, device="meta"), torch.device("cpu")
    return GraphModule({"c": constant}, g)


def test_folded_constants_come_from_the_current_constants(cache):
    """Two graphs that differ only in a constant's values have one key: the hit computes the
    folded exp(c) from its own constant."""
    x = torch.randn(4, 16)
    results = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        c = torch.randn(16)
        framejit.reset()
        fn = compile_with_kernels(_constant_graph(c), [x], ("cpu",), launcher=CLauncher, cache=True)
        results.append(fn(x))
        torch.testing.assert_close(results[-1], torch.softmax(x * c.exp(), -1))
        assert "_folded_0" in _wrapper_graph(fn).python_code("forward").src
    assert framejit.stats()["graph_cache_hits"] == 1
    assert not torch.equal(results[0], results[1])


def test_graphs_with_targets_that_have_no_name_elsewhere_are_not_kept(cache):
    g = Graph()
    x = g.placeholder("x")
    y = g.call_function(lambda t: t + 1, (x,))
    g.output(y)
    x.meta["val"] = y.meta["val"] = torch.empty(3, device="meta")
    assert graph_cache.key_of(GraphModule({}, g), [torch.empty(3)], ("cpu",)) is None


def test_a_dump_draws_the_fused_graph_of_a_hit(cache, tmp_path_factory):
    """The entry does not keep the graph after the passes: a dump of a hit makes it again, with
    its nodes in the kernel's group."""
    x, w = torch.randn(4, 32), torch.randn(32)
    framejit.compile(_rms_norm)(x, w)
    framejit.reset()
    dump = tmp_path_factory.mktemp("dump")
    framejit.compile(_rms_norm, options={"dump_dir": str(dump)})(x, w)
    assert framejit.stats()["graph_cache_hits"] == 1
    (path,) = [os.path.join(d, "record.json") for d, _, fs in os.walk(dump) if "record.json" in fs]
    with open(path) as f:
        (version,) = json.load(f)["functions"][0]["versions"]
    grouped = [n for n in version["graph"] if n["group"]]
    assert {n["target"] for n in grouped} >= {"aten.pow.Tensor_Scalar", "aten.sum.dim_IntList"}
    assert {n["group"] for n in grouped} == {k["name"] for k in version["kernels"]}


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_models_read_from_the_cache_compute_the_same_bits(cache, name):
    from tests.models.test_transformers import IDS, MODELS

    make, kwargs, key = MODELS[name]
    torch.manual_seed(0)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        model = make().eval()
        expected = model(IDS, **kwargs)[key]
        (first, built1, s1), (second, built2, s2) = _compile_twice(
            lambda ids: model(ids, **kwargs)[key], IDS)
    assert (s1["graph_cache_hits"], s2["graph_cache_hits"]) == (0, 1)
    assert s1["kernels"] == s2["kernels"] > 0 and s2["graphs"] == 1
    assert _wrapper_code(built1) == _wrapper_code(built2)
    assert torch.equal(first, second)
    torch.testing.assert_close(second, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("broken", ["_environment", "_later"])
def test_a_failing_cache_never_fails_the_compile(cache, monkeypatch, broken):
    """An error in the key (or in keeping an entry) is a compile without the cache: the graph
    still gets its kernels and eager's values."""
    def boom(*args, **kwargs):
        raise RuntimeError("a bug in the cache")

    monkeypatch.setattr(graph_cache, broken, boom)
    x, w = torch.randn(4, 32), torch.randn(32)
    framejit.reset()
    got = framejit.compile(_rms_norm)(x, w)
    stats = framejit.stats()
    assert stats["fallbacks"] == 0 and stats["kernels"] == 1 and stats["graph_cache_hits"] == 0
    torch.testing.assert_close(got, _rms_norm(x, w))
    assert _entries(cache) == []
