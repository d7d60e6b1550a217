"""A `Tensor` whose kernel reads 16-bit values (a float16 or bfloat16 kernel).

`Stored` is the tensor itself to every host reader (its ``vals`` are the source's, float32
or float64), and hands kernels the values in 16-bit storage (`sparsec.tensors.halves`): its
``("vals", -1)`` address and its device copy of ``vals`` are those of ``stored``. `stored`
makes one per (tensor, dtype), kept on the tensor while it lives, as derived copies are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .buffers import address
from .halves import to_storage
from .tensor import Tensor


@dataclass(frozen=True, slots=True, eq=False)
class Stored(Tensor):
    #: the values in the kernel's 16-bit storage (read-only)
    stored: np.ndarray = None  # type: ignore[assignment]  # always given by `stored`

    @property
    def value_dtype(self) -> str:
        """The 16-bit dtype ``stored`` holds."""
        return "float16" if self.stored.dtype == np.float16 else "bfloat16"

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
        t = Tensor(t.shape, t.format, t.levels, t.vals, t.index_dtype)
    found = t._stored
    if found is None:
        found = {}
        object.__setattr__(t, "_stored", found)
    made = found.get(dtype)
    if made is None:
        bits = to_storage(t.vals, dtype)
        bits.flags.writeable = False
        made = found[dtype] = Stored(t.shape, t.format, t.levels, t.vals, t.index_dtype, bits)
    return made
