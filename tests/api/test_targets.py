"""Library code (nn.Linear.forward) is captured only by the compile() wrappers that target it."""

import gc

import torch
from torch import nn

import framejit
from framejit import _C


def test_library_forward_is_captured_only_by_its_own_wrapper(stats):
    linear = nn.Linear(3, 3)
    compiled_linear = framejit.compile(linear)
    compiled_linear(torch.randn(2, 3))
    assert len(_C.get_cache_entries(nn.Linear.forward.__code__)) == 1

    def falls_back(x):
        try:
            print(end="")  # inside try: cannot be split, so this frame runs as plain Python
        finally:
            pass
        return linear(x)

    framejit.compile(falls_back)(torch.randn(2, 3))
    # The nested Linear.forward frame belongs to no target of falls_back's wrapper: it runs as
    # it is, although another wrapper compiles the same code object.
    assert len(_C.get_cache_entries(nn.Linear.forward.__code__)) == 1
    assert stats.captured == 1

    del compiled_linear
    framejit.reset()
    gc.collect()
    framejit.compile(falls_back)(torch.randn(2, 3))
    assert _C.get_cache_entries(nn.Linear.forward.__code__) == []
    assert _C.get_code_mode(nn.Linear.forward.__code__) == _C.MODE_SKIP  # no live wrapper targets it


def test_wrapper_keeps_working_after_reset(stats):
    model = framejit.compile(nn.Sequential(nn.Linear(3, 3)))
    x = torch.randn(2, 3)
    model(x)
    framejit.reset()
    model(x)
    assert stats.captured == 1 and stats.eager_frames == 0
