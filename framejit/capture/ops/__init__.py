"""Opcode handlers, one module per family. Importing this package fills ``HANDLERS``."""

from . import calls, containers, jumps, loads_stores, operators  # noqa: F401
