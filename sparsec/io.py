"""Tensor files: ``sparsec.io.load`` / ``save`` (FROSTT ``.tns``, Matrix Market ``.mtx``).

The readers and writers live in `sparsec.tensors.io`; this module is the public name."""

from .tensors.io import load, load_mtx, load_tns, save, save_mtx, save_tns

__all__ = ["load", "load_mtx", "load_tns", "save", "save_mtx", "save_tns"]
