"""Raw buffers for the C calls: an array's address, and outputs aligned for vector stores."""

from __future__ import annotations

import ctypes
import math
from typing import Any

import numpy as np

_char = ctypes.c_char
_addressof = ctypes.addressof


def address(array: Any) -> int:
    """The address of a C-contiguous ndarray's first element, for a ctypes call.

    Through the buffer protocol: cheaper than ``array.ctypes.data``, which builds a helper
    object per call, time that small kernels notice (docs/decisions.md, "A repeated call").
    Read-only and empty arrays export no writable buffer of a byte; they take the
    ``ctypes`` route.
    """
    try:
        return _addressof(_char.from_buffer(array))
    except (TypeError, ValueError, BufferError):
        return int(array.ctypes.data)


#: outputs from this many bytes are allocated on a cache-line boundary (`aligned_empty`);
#: below it the kernels store them plainly (see `sparsec.passes.stream_output.stream_output`), and
#: a call does not pay the few microseconds of the aligned allocation
ALIGN_FROM_BYTES = 1 << 20
ALIGNMENT = 64


def aligned_array(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """An uninitialised C-ordered array whose first value sits on a 64-byte boundary, at any
    size: a packed panel's rows then start on cache lines, where numpy's 16-byte alignment
    splits every vector load of a row of 64-byte multiples over two lines."""
    dtype = np.dtype(dtype)
    n = math.prod(shape)
    raw = np.empty(n + ALIGNMENT // dtype.itemsize, dtype)
    start = (-address(raw) % ALIGNMENT) // dtype.itemsize  # numpy aligns to the value size
    return raw[start : start + n].reshape(shape)


def aligned_copy(array: np.ndarray) -> np.ndarray:
    """A C-ordered copy of ``array`` on a 64-byte boundary (`aligned_array`)."""
    out = aligned_array(array.shape, array.dtype)
    np.copyto(out, array)
    return out


def aligned_empty(n: int, dtype: np.dtype) -> np.ndarray:
    """An uninitialised 1-D array of ``n`` values of ``dtype``. From `ALIGN_FROM_BYTES` on,
    its first value sits on a 64-byte boundary: numpy's large allocations are only 16-byte
    aligned, and the kernels' non-temporal output stores need whole vectors on theirs."""
    if n * dtype.itemsize < ALIGN_FROM_BYTES:
        return np.empty(n, dtype)
    return aligned_array((n,), dtype)
