"""Raw buffers for the C calls: an array's address, and outputs aligned for vector stores."""

from __future__ import annotations

import ctypes
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


def aligned_copy(array: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of ``array`` whose first value sits on a 64-byte boundary, at any
    size: a packed panel's rows then start on cache lines, where numpy's 16-byte alignment
    splits every vector load of a row of 64-byte multiples over two lines."""
    size = array.dtype.itemsize
    raw = np.empty(array.size + ALIGNMENT // size, array.dtype)
    start = (-address(raw) % ALIGNMENT) // size
    out = raw[start : start + array.size].reshape(array.shape)
    np.copyto(out, array)
    return out


def aligned_empty(n: int, dtype: np.dtype) -> np.ndarray:
    """An uninitialised 1-D array of ``n`` values of ``dtype``. From `ALIGN_FROM_BYTES` on,
    its first value sits on a 64-byte boundary: numpy's large allocations are only 16-byte
    aligned, and the kernels' non-temporal output stores need whole vectors on theirs."""
    size = dtype.itemsize
    if n * size < ALIGN_FROM_BYTES:
        return np.empty(n, dtype)
    raw = np.empty(n + ALIGNMENT // size, dtype)
    start = (-address(raw) % ALIGNMENT) // size  # numpy aligns to the value size at least
    return raw[start : start + n]
