"""Registers the ``fuzz`` marker (pyproject.toml is shared; the marker is this folder's own), so
that ``pytest -m "not fuzz"`` can leave the fuzzer's sample out."""


def pytest_configure(config):
    config.addinivalue_line("markers", "fuzz: the differential fuzzer's fixed-seed sample (slow)")
