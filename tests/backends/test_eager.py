import types

import torch

from framejit.backends import compile_graph, lookup_backend
from framejit.fx_ir.meta import propagate_meta


def test_eager_returns_the_plain_generated_function(small_gm):
    args = [torch.randn(2, 4), torch.randn(4, 3)]
    compiled = compile_graph("eager", small_gm, args)
    assert compiled is small_gm.forward_fn
    assert type(compiled) is types.FunctionType
    assert compiled.__code__.co_filename.startswith("<framejit-graph-")
    torch.testing.assert_close(compiled(*args), torch.relu(args[0] @ args[1]) + small_gm.root["b"])


def test_default_runs_c_kernels_on_cpu_tensors(small_gm):
    assert lookup_backend("default").name == "default"
    args = [torch.randn(2, 4), torch.randn(4, 3)]
    propagate_meta(small_gm, *args)  # example values and devices, as capture leaves them
    for node in small_gm.graph.nodes:
        node.meta["device"] = torch.device("cpu")
    compiled = compile_graph("default", small_gm, args)
    assert [k.language for k in compiled.framejit_kernels] == ["c"]  # relu + add
    torch.testing.assert_close(compiled(*args), torch.relu(args[0] @ args[1]) + small_gm.root["b"])
