"""Lowering: a concrete statement and a schedule plan to the loop IR of one kernel.

Other stages import from this package, not from its modules."""

from .lowerer import LoweredKernel, RowsOutOfOrder, lower

__all__ = ["LoweredKernel", "RowsOutOfOrder", "lower"]
