"""The value dtypes C kernels can store on this machine: asked by code generation and by
each call (`sparsec.runtime.inputs`), since generated code and compiled kernels are cached
across machines' facts."""

from __future__ import annotations

from ..base.errors import DTypeError
from ..tensors.halves import HALF
from .compiler import C_HALF_TYPES
from .machine import c_half_types


def check_c_dtype(dtype: str) -> None:
    """A `DTypeError` where C kernels cannot store ``dtype`` (a 16-bit type the compiler
    lacks, `machine.c_half_types`)."""
    if dtype in HALF and dtype not in c_half_types():
        raise DTypeError(
            f"{dtype} values on the C target need a C compiler with a {dtype} type "
            f"({C_HALF_TYPES[dtype]} with conversions, as in recent GCC and Clang; this "
            f"one has {' and '.join(sorted(c_half_types())) or 'neither'}): cast the inputs "
            "to float32, pass dtype='float32', or use target='cuda-emulated'"
        )
