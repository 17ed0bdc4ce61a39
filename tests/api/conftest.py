import pytest
import torch

import framejit
from framejit.testing import capture_stats


@pytest.fixture(autouse=True)
def fresh_framejit():
    framejit.reset()
    torch.manual_seed(0)
    yield
    framejit.reset()


@pytest.fixture
def stats():
    return capture_stats()
