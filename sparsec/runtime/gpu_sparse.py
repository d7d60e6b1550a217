"""A rowwise sparse output (CSR-like) on the GPU, in two launches of one mapping: each row
counts its entries into its slot of ``pos`` (``sparsec_assemble``), a prefix sum over the
counts (on the device: ``cupy.cumsum``) makes them offsets, the exact ``crd`` and ``vals``
are allocated, and each row appends from its offset (``sparsec_kernel``). The same code
runs with numpy arrays under the CUDA emulation (``target="cuda-emulated"``), so the
device path's logic is what the tests check. The result is a host `Tensor`: rows come out
sorted and unique, as on the C target."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import DTypeError
from ..tensors.halves import storage_fill
from ..tensors.tensor import LevelStorage, Tensor
from .binding import INDEX_DTYPES, VALUE_DTYPES
from .inputs import Prepared
from .sparse_out import Arrays, SparseOutput, readable_vals

_INT32_MAX = 2**31 - 1
#: runs one phase ("assemble" or "fill") into the given output arrays
Phase = Callable[[str, Arrays], None]


def two_phase(out: SparseOutput, prepared: Prepared, phase: Phase, xp: Any, poison: bool) -> Tensor:
    """Count, prefix-sum, allocate exactly, fill; ``xp`` is numpy or cupy (where the
    arrays live)."""
    out_t, layout = out.output, out.layout
    last = layout.last
    assert layout.rowwise and last == out_t.order - 1, layout
    index_dtype = np.dtype(INDEX_DTYPES[prepared.index_dtype])
    rows = math.prod(out.extent(prepared, k) for k in range(last))
    sizes = xp.zeros(max(1, out_t.order), dtype=np.int64)
    counts = xp.zeros(rows + 1, dtype=index_dtype)
    phase("assemble", {("sizes", -1): sizes, ("pos", last): counts})
    total = int(counts.sum(dtype=np.int64))
    if index_dtype == np.int32 and max(total, out.extent(prepared, last)) > _INT32_MAX:
        raise DTypeError(
            f"output {out_t.name!r} has {total} entries, more than int32 indices hold; "
            "use index_dtype='int64'"
        )
    xp.cumsum(counts, out=counts)  # each row's count becomes its end offset
    crd = xp.empty(total, dtype=index_dtype)
    wide = out.loaded.generated.wide_output  # 16-bit values added into as float32
    vals = xp.empty(total, dtype=np.float32 if wide else VALUE_DTYPES[prepared.dtype])
    if poison:
        crd.fill(-1)
        vals.fill(np.nan if wide else storage_fill(np.nan, prepared.dtype))
    arrays: Arrays = {("sizes", -1): sizes, ("pos", last): counts, ("crd", last): crd}
    arrays[("vals", -1)] = vals
    phase("fill", arrays)
    host = (lambda a: a) if xp is np else (lambda a: a.get())
    levels = [LevelStorage() for _ in range(last)]
    levels.append(LevelStorage(host(counts), host(crd)))
    vals = readable_vals(host(vals), prepared.dtype, wide)
    return Tensor(out.shape(prepared), out_t.format, tuple(levels), vals, index_dtype)
