import pytest
import torch

import framejit


@pytest.fixture(autouse=True)
def fresh_framejit():
    framejit.reset()
    torch.manual_seed(0)
    yield
    framejit.reset()
