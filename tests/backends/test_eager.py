import types

import torch

from framejit.backends import compile_graph, lookup_backend


def test_eager_returns_the_plain_generated_function(small_gm):
    args = [torch.randn(2, 4), torch.randn(4, 3)]
    compiled = compile_graph("eager", small_gm, args)
    assert compiled is small_gm.forward_fn
    assert type(compiled) is types.FunctionType
    assert compiled.__code__.co_filename.startswith("<framejit-graph-")
    torch.testing.assert_close(compiled(*args), torch.relu(args[0] @ args[1]) + small_gm.root["b"])


def test_default_is_eager_on_cpu_tensors(small_gm):
    assert lookup_backend("default").name == "default"
    args = [torch.randn(2, 4), torch.randn(4, 3)]
    assert compile_graph("default", small_gm, args) is small_gm.forward_fn
