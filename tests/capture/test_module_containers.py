"""Module containers that change after the capture: a layer appended to a ModuleList or a
Sequential, a key added to a ModuleDict or a ParameterDict, a parameter appended to a
ParameterList. Their keys are guarded; before, a loop over them kept the length it had when
captured (a wrong answer)."""

import pytest
import torch
from torch import nn

import framejit


class _Containers(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4)])
        self.named = nn.ModuleDict({"a": nn.Linear(4, 4)})
        self.seq = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
        self.plist = nn.ParameterList([nn.Parameter(torch.ones(4))])
        self.pdict = nn.ParameterDict({"a": nn.Parameter(torch.ones(4))})

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        for _, m in self.named.items():
            x = m(x)
        x = self.seq(x) + self.seq[-1](x)
        for p in self.plist:
            x = x * p
        for k in self.pdict:
            x = x + self.pdict[k]
        if "b" in self.named:
            x = x * 2
        return x + len(self.layers) + len(self.pdict) + len(self.plist)


CHANGES = {
    "ModuleList.append": lambda m: m.layers.append(nn.Linear(4, 4)),
    "ModuleDict key added": lambda m: m.named.update({"b": nn.Linear(4, 4)}),
    "Sequential.append": lambda m: m.seq.append(nn.Tanh()),
    "ParameterList.append": lambda m: m.plist.append(nn.Parameter(torch.full((4,), 2.0))),
    "ParameterDict key added": lambda m: m.pdict.update({"b": nn.Parameter(torch.full((4,), 2.0))}),
    "ModuleList item replaced": lambda m: m.layers.__setitem__(0, nn.Identity()),
    "Sequential item deleted": lambda m: m.seq.__delitem__(0),
}


@pytest.mark.parametrize("change", CHANGES, ids=list(CHANGES))
def test_a_container_changed_after_the_capture_recompiles(change, stats):
    torch.manual_seed(0)
    model = _Containers()
    compiled = framejit.compile(model)
    x = torch.randn(2, 4)
    torch.testing.assert_close(compiled(x), model(x))
    CHANGES[change](model)
    torch.testing.assert_close(compiled(x), model(x))
    assert stats.recompiles == 1
    torch.testing.assert_close(compiled(x), model(x))
    assert stats.recompiles == 1
