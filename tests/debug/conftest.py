import pytest

import framejit  # noqa: F401
from framejit.testing import fresh_state

fresh_framejit = pytest.fixture(autouse=True)(fresh_state)
