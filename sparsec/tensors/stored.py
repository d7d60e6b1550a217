"""A `Tensor` whose kernel reads 16-bit values (a float16 or bfloat16 kernel).

`Stored` is the tensor itself to every host reader (its ``vals`` are the source's, float32
or float64), and hands kernels the values in 16-bit storage (`sparsec.tensors.halves`): its
``("vals", -1)`` address and its device copy of ``vals`` are those of ``stored``. `stored`
makes one per (tensor, dtype), kept on the tensor while it lives, as derived copies are.

A user's 16-bit tensor (`half_tensor`: ``Tensor.from_torch`` of a half tensor, ``as_tensor``
of numpy float16, ``T.astype("bfloat16")``, a 16-bit kernel's sparse output) is a `Stored`
whose ``vals`` are float32 holding the 16-bit values exactly: its ``dtype`` is numpy's
float16 (float32 for bfloat16, which numpy lacks; ``value_dtype`` names it), it converts
out in its type (``to_dense``: float16; ``to_torch``: torch's float16/bfloat16), pickles as
itself, and a call promotes it as the 16-bit type it holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .buffers import address
from .halves import HALF_TENSOR, from_storage, to_storage, torch_dtype
from .tensor import Tensor


@dataclass(frozen=True, slots=True, eq=False)
class Stored(Tensor):
    #: the values in the kernel's 16-bit storage (read-only)
    stored: np.ndarray = None  # type: ignore[assignment]  # always given by `stored`

    @property
    def value_dtype(self) -> str:
        """The 16-bit dtype ``stored`` holds."""
        return "float16" if self.stored.dtype == np.float16 else "bfloat16"

    @property
    def dtype(self) -> np.dtype:
        """numpy's dtype of the values: float16, or float32 (exact) for bfloat16."""
        return np.dtype(np.float16) if self.value_dtype == "float16" else self.vals.dtype

    def __repr__(self) -> str:
        return Tensor.__repr__(self).replace(f"dtype={self.dtype}", f"dtype={self.value_dtype}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (stored, (self.plain(), self.value_dtype))

    def plain(self) -> Tensor:
        """The same entries as a float32 `Tensor` (for kernels of another value dtype)."""
        return Tensor(self.shape, self.format, self.levels, self.vals, self.index_dtype)

    def to_dense(self) -> np.ndarray:
        return Tensor.to_dense(self).astype(self.dtype, copy=False)

    def to_torch(self) -> Any:
        return Tensor.to_torch(self).to(torch_dtype(self.value_dtype))

    def addresses(self) -> dict[tuple[str, int], int]:
        found = Tensor.addresses(self)
        found[("vals", -1)] = address(self.stored)
        return found

    def device_array(self, field_name: str, level: int, to_device: Any) -> Any:
        if field_name != "vals":
            return Tensor.device_array(self, field_name, level, to_device)
        found = self._device
        if found is None:
            found = {}
            object.__setattr__(self, "_device", found)
        array = found.get(("stored", -1))
        if array is None:
            array = found[("stored", -1)] = to_device(self.stored)
        return array


def stored(t: Tensor, dtype: str) -> Tensor:
    """``t`` with its values in ``dtype``'s 16-bit storage for kernels (one per tensor and
    dtype, kept on ``t``)."""
    if isinstance(t, Stored):
        if t.value_dtype == dtype:
            return t
        t = t.plain()
    found = t._stored
    if found is None:
        found = {}
        object.__setattr__(t, "_stored", found)
    made = found.get(dtype)
    if made is None:
        bits = to_storage(t.vals, dtype)
        bits.flags.writeable = False
        made = found[dtype] = Stored(
            t.shape, t.format, t.levels, t.vals, t.index_dtype, stored=bits
        )
    return made


def half_tensor(t: Tensor, dtype: str, index_dtype: Any = None) -> Tensor:
    """``t`` with its values rounded to the 16-bit ``dtype`` once (to nearest even, from
    float64 directly) and held as such (`Stored`); ``t`` itself when it already is."""
    if isinstance(t, Stored) and t.value_dtype == dtype:
        return (
            t if index_dtype is None else stored(t.plain().astype(index_dtype=index_dtype), dtype)
        )
    values = from_storage(to_storage(t.vals, dtype), dtype)
    base = Tensor(t.shape, t.format, t.levels, values, t.index_dtype)
    return stored(base.astype(index_dtype=index_dtype), dtype)


HALF_TENSOR.append(half_tensor)
