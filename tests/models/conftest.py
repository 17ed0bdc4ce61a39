import pytest

from framejit.testing import capture_stats, fresh_state

fresh_framejit = pytest.fixture(autouse=True)(fresh_state)


@pytest.fixture
def stats():
    return capture_stats()
