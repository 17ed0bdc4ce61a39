"""Opcode handlers, one module per family. Importing this package fills ``HANDLERS``."""

from . import blocks, calls, containers, exceptions, generators, jumps, loads_stores, operators  # noqa: F401
