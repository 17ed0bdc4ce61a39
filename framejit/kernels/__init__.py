"""Kernels: the device-neutral kernel description of a fusion group, its reference
interpreter, and renderers (Triton now; C next) with their compile cache and launch path.

This package imports only :mod:`framejit.fx_ir` (and torch/triton).
"""

from .ir import BINARY, FULL, OUTER, REDUCTIONS, UNARY, Buffer, Kernel, Op, Sym
from .lowering import LoweredGroup, LoweringError, classify, lower_group, reduction_dims

__all__ = [
    "BINARY", "FULL", "OUTER", "REDUCTIONS", "UNARY", "Buffer", "Kernel", "LoweredGroup",
    "LoweringError", "Op", "Sym", "classify", "lower_group", "reduction_dims",
]
