"""16-bit floating-point values (float16, bfloat16) as kernels store them.

A kernel of value dtype float16 or bfloat16 stores its values in 16 bits and computes in
float32 (`sparsec.backends.printer`). On the host such values live in a *storage* array:
numpy's float16 for float16, and the bit patterns as uint16 for bfloat16 (numpy has no
bfloat16 dtype; the bits stay internal: a bfloat16 result goes back to the caller as a torch
bfloat16 tensor, or as float32, which holds every bfloat16 value exactly). Conversions into
storage round to nearest, ties to even, as CUDA's ``__float2half_rn`` /
``__float2bfloat16_rn`` and torch's casts do; conversions out of it are exact.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..base.values import INTEGRAL_STORAGE

#: the 16-bit value dtypes, by name
HALF = ("float16", "bfloat16")
#: each value dtype's host storage dtype (the array a kernel's ``vals`` parameter points to)
STORAGE: dict[str, np.dtype] = {
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(np.uint16),
    **INTEGRAL_STORAGE,
}


def is_half(dtype: str) -> bool:
    return dtype in HALF


def half_name(dtype: Any) -> str | None:
    """ "float16" or "bfloat16" where ``dtype`` (a name, numpy or torch dtype) names one."""
    if dtype is None:
        return None
    name = str(dtype).removeprefix("torch.")
    if name not in HALF:
        try:
            name = np.dtype(dtype).name
        except TypeError:
            return None
    return name if name in HALF else None


def compute_dtype(dtype: str) -> np.dtype:
    """The dtype a kernel of value dtype ``dtype`` computes in (float32 for half types)."""
    return np.dtype(np.float32) if dtype in HALF else STORAGE[dtype]


def to_storage(values: Any, dtype: str) -> np.ndarray:
    """``values`` (any real array) in ``dtype``'s storage, rounded to nearest even; C-ordered."""
    array = np.asarray(values)
    if array.dtype.kind in "biu" and array.dtype != np.uint16:
        array = array.astype(np.float64)
    if dtype != "bfloat16":
        with np.errstate(over="ignore"):  # beyond the largest half: infinity, as a cast
            return np.ascontiguousarray(array, dtype=STORAGE[dtype])
    if array.dtype == np.uint16:
        raise TypeError("internal: bfloat16 bits passed where values were expected")
    single = _round_to_odd_single(array) if array.dtype == np.float64 else array
    return bfloat16_bits(np.ascontiguousarray(single, dtype=np.float32))


def bfloat16_bits(single: Any) -> Any:
    """C-ordered float32 values (numpy or CuPy: array methods only) as bfloat16 bits
    (uint16), rounded to nearest even; a NaN stays a (quiet) NaN."""
    bits = single.view("uint32")
    near = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    nan = ((bits & 0x7FFFFFFF) > 0x7F800000).astype("uint32")
    return (near * (1 - nan) + ((bits >> 16) | 0x40) * nan).astype("uint16")


def _round_to_odd_single(x: np.ndarray) -> np.ndarray:
    """float64 -> float32 rounded to odd (the truncation, with its last bit set when
    inexact), so that rounding the float32 to bfloat16 then equals rounding ``x`` directly
    (no double rounding at a tie)."""
    with np.errstate(over="ignore", invalid="ignore"):
        near = x.astype(np.float32)
        bits = near.view(np.uint32).copy()
        inexact = (near.astype(np.float64) != x) & ~np.isnan(x)
        over = inexact & (np.abs(near.astype(np.float64)) > np.abs(x))
    bits -= over.astype(np.uint32)
    bits |= inexact.astype(np.uint32)
    return bits.view(np.float32)


def from_storage(array: Any, dtype: str) -> np.ndarray:
    """A storage array's values as float32 (exact)."""
    if dtype != "bfloat16":
        return np.asarray(array).astype(np.float32)
    bits = np.ascontiguousarray(array, dtype=np.uint16).astype(np.uint32) << np.uint32(16)
    return bits.view(np.float32)


def readable(array: Any, dtype: str) -> Any:
    """A storage array (numpy or CuPy) as an array of values: bfloat16 bits become float32
    (exact), other storage is returned as it is."""
    if dtype != "bfloat16":
        return array
    return (array.astype("uint32") << 16).view("float32")


def rounded(values: Any, dtype: str) -> Any:
    """float32 ``values`` (numpy or CuPy) rounded to ``dtype`` (nearest even), as `readable`
    gives a storage array's: float16, or float32 holding bfloat16 values."""
    if dtype == "float16":
        return values.astype("float16")
    return readable(bfloat16_bits(values.astype("float32")), dtype)


def result_dtype(dtype: str) -> np.dtype:
    """The dtype of a kernel's results as `readable` gives them (float32 for bfloat16)."""
    return np.dtype(np.float32) if dtype == "bfloat16" else STORAGE[dtype]


#: the tests' poison (NaN for floats) in an integral type: a value no small-integer
#: computation of theirs produces, so an element a kernel fails to write shows
INTEGRAL_POISON = 0x5A5A5A5A5A5A5A5A


def storage_fill(value: float, dtype: str) -> Any:
    """A scalar to fill a storage array of ``dtype`` with ``value`` (a uint16 for bfloat16;
    in an integral type, an infinity is the type's limit and NaN the tests' poison)."""
    if dtype in INTEGRAL_STORAGE:
        return _integral_fill(value, INTEGRAL_STORAGE[dtype])
    if dtype != "bfloat16":
        return value
    return np.uint16(to_storage(np.float32(value), dtype).reshape(-1)[0])


def compute_fill(value: float, dtype: str) -> Any:
    """``value`` (an identity: 0 or an infinity) in the type a ``dtype`` kernel computes in
    (float for 16-bit types; an integral type's limits for infinities)."""
    return _integral_fill(value, INTEGRAL_STORAGE[dtype]) if dtype in INTEGRAL_STORAGE else value


def _integral_fill(value: float, dt: np.dtype) -> Any:
    if dt.kind == "b":  # bool's limits: -inf is false, +inf true (NaN, the poison: true)
        return bool(value > 0) if np.isinf(value) else bool(value != 0)
    info = np.iinfo(dt)
    if np.isnan(value):
        return dt.type(INTEGRAL_POISON & int(info.max))
    if np.isinf(value):
        return dt.type(info.max if value > 0 else info.min)
    return dt.type(int(value))


def torch_dtype(dtype: str) -> Any:
    """The torch dtype of a value dtype name."""
    import torch

    return getattr(torch, dtype)


def to_torch(array: np.ndarray, dtype: str) -> Any:
    """A storage array as a torch tensor of ``dtype`` (shares the memory)."""
    import torch

    if dtype == "bfloat16":
        return torch.from_numpy(np.ascontiguousarray(array).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(array))


def half_request(dtype: Any, source: Any) -> str | None:
    """The 16-bit dtype ``dtype`` names, or else the one ``source``'s values are in."""
    return half_name(dtype) if dtype is not None else half_name(getattr(source, "dtype", None))


#: makes a 16-bit `Tensor`: `sparsec.tensors.stored.half_tensor`, registered on its import
#: (`tensor` cannot import `stored`, which builds on it)
HALF_TENSOR: list[Callable[..., Any]] = []
