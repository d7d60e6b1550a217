"""A rowwise sparse output (CSR-like) on the GPU, in two launches of one mapping: each row
counts its entries into its slot of ``pos`` (``sparsec_assemble``), a prefix sum over the
counts (on the device: ``cupy.cumsum``) makes them offsets, the exact ``crd`` and ``vals``
are allocated, and each row appends from its offset (``sparsec_kernel``). The same code
runs with numpy arrays under the CUDA emulation (``target="cuda-emulated"``), so the
device path's logic is what the tests check. Rows come out sorted and unique, as on the C
target. Any other sparse output is computed as rows and compacted (`run`). The result is
a `Tensor`, whose arrays live on the host; on a device it also keeps the device arrays."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ..base.errors import DTypeError
from ..middle.spec import TensorVar
from ..tensors.halves import HALF, compute_dtype, storage_fill
from ..tensors.tensor import LevelStorage, Tensor
from . import compaction
from .binding import INDEX_DTYPES, VALUE_DTYPES
from .inputs import Prepared
from .sparse_out import Arrays, SparseOutput, readable_vals

_INT32_MAX = 2**31 - 1
#: runs one phase ("assemble" or "fill") into the given output arrays
Phase = Callable[[str, Arrays], None]


def run(
    out: SparseOutput,
    final: TensorVar | None,
    prepared: Prepared,
    phase: Phase,
    xp: Any,
    poison: bool,
    workspace: tuple[bool, float, int] | None = None,
) -> Tensor:
    """``out``'s rows by `two_phase`; when the output asked for is ``final`` (a format
    that is not filled row by row: ``out`` is its staging output, `sparsec.middle.staging`)
    compacted into it where the rows are (`compaction`; ``prepared`` binds the staging's
    leading index, `staging.ROW`, for a vector). The result is a `Tensor` (host arrays,
    as every `Tensor`); on a device it keeps the device arrays the launches wrote as its
    device copies (`Tensor.keep_device_arrays`), so a chained CUDA call uploads nothing."""
    pos, crd, vals = two_phase(out, prepared, phase, xp, poison, workspace)
    index_dtype = crd.dtype
    if final is None:
        fmt, shape, values = out.output.format, out.shape(prepared), vals
        made: list[compaction.Level] = [(None, None)] * out.layout.last + [(pos, crd)]
    else:
        extents = tuple(out.extent(prepared, k) for k in range(out.output.order))
        lead = out.output.order - final.order
        made, values = compaction.compact((pos, crd, vals), extents, lead, final.format, xp)
        fmt, shape = final.format, out.shape(prepared)[lead:]
    wide = out.loaded.generated.wide_output
    if xp is np:
        readable = readable_vals(values, prepared.dtype, wide)
        return Tensor(shape, fmt, tuple(LevelStorage(p, c) for p, c in made), readable, index_dtype)
    storage = tuple(
        LevelStorage(None if p is None else p.get(), None if c is None else c.get())
        for p, c in made
    )
    result = Tensor(
        shape, fmt, storage, readable_vals(values.get(), prepared.dtype, wide), index_dtype
    )
    if prepared.dtype in HALF:
        return result  # float32 values on the host: the device's 16-bit ones are not theirs
    # the arrays stay on the device too: a next CUDA call reads them with no upload
    kept: dict[tuple[str, int], Any] = {("vals", -1): values}
    for k, (p, c) in enumerate(made):
        kept.update({(f, k): a for f, a in (("pos", p), ("crd", c)) if a is not None})
    result.keep_device_arrays(kept)
    return result


def two_phase(
    out: SparseOutput,
    prepared: Prepared,
    phase: Phase,
    xp: Any,
    poison: bool,
    workspace: tuple[bool, float, int] | None = None,
) -> tuple[Any, Any, Any]:
    """Count, prefix-sum, allocate exactly, fill; ``xp`` is numpy or cupy (where the
    arrays live). ``workspace``: the kernel has a GPU workspace (whether it takes hash
    tables per row, `Tables`; the semiring's identity; the budget in bytes). Returns the last level's ``pos`` and
    ``crd`` and the values."""
    out_t, layout = out.output, out.layout
    last = layout.last
    assert layout.rowwise and last == out_t.order - 1, layout
    index_dtype = np.dtype(INDEX_DTYPES[prepared.index_dtype])
    rows = math.prod(out.extent(prepared, k) for k in range(last))
    sizes = xp.zeros(max(1, out_t.order), dtype=np.int64)
    counts = xp.zeros(rows + 1, dtype=index_dtype)
    tables = None
    if workspace is not None:
        tables = Tables(rows, xp, compute_dtype(prepared.dtype), *workspace)
    if tables is not None and tables.hashed:
        phase("assemble", {("sizes", -1): sizes, ("pos", last): counts, **tables.tally()})
        bounds = counts[1:].copy()
        counts.fill(0)
        phase("assemble", {("sizes", -1): sizes, ("pos", last): counts, **tables.count(bounds)})
    else:
        dense = tables.dense() if tables is not None else {}
        phase("assemble", {("sizes", -1): sizes, ("pos", last): counts, **dense})
    total = int(counts.sum(dtype=np.int64))
    if index_dtype == np.int32 and max(total, out.extent(prepared, last)) > _INT32_MAX:
        raise DTypeError(
            f"output {out_t.name!r} has {total} entries, more than int32 indices hold; "
            "use index_dtype='int64'"
        )
    fill_tables = tables.fill(counts[1:]) if tables is not None else {}
    xp.cumsum(counts, out=counts)  # each row's count becomes its end offset
    crd = xp.empty(total, dtype=index_dtype)
    wide = out.loaded.generated.wide_output  # 16-bit values added into as float32
    vals = xp.empty(total, dtype=np.float32 if wide else VALUE_DTYPES[prepared.dtype])
    if poison:
        crd.fill(-1)
        vals.fill(np.nan if wide else storage_fill(np.nan, prepared.dtype))
    arrays: Arrays = {("sizes", -1): sizes, ("pos", last): counts, ("crd", last): crd}
    arrays[("vals", -1)] = vals
    phase("fill", {**arrays, **fill_tables})
    return counts, crd, vals


class Tables:
    """A GPU workspace's hash tables per row (`sparsec.lower.workspace.Hash`), taken when a
    dense row per thread would not fit the budget for the whole launch. Each phase lays
    its tables out from the counts before it: the count phase from a tally of each row's
    scatters (a first launch: a bound on its coordinates), the fill from the exact
    counts; a row of n gets the power of two at or above 2n slots. A phase whose tables
    would not fit the budget runs on dense rows (the launch shrunk) instead."""

    def __init__(
        self, rows: int, xp: Any, dtype: Any, hashed: bool, identity: float, budget: int
    ) -> None:
        self.rows, self.xp, self.dtype = rows, xp, np.dtype(dtype)
        self.hashed, self.identity, self.budget = hashed, identity, budget

    def _arrays(self, mode: int, off: Any, keys: Any, vals: Any) -> Arrays:
        xp = self.xp
        arrays: Arrays = {("ws_mode", -1): xp.full(1, mode, dtype=np.int64)}
        arrays[("ws_off", -1)], arrays[("ws_keys", -1)], arrays[("ws_hvals", -1)] = off, keys, vals
        if mode != 0:  # placeholders: no dense rows (`device._workspace` allocates none)
            for role, kind in (("vals", self.dtype), ("seen", np.uint64), ("list", np.int64)):
                arrays[(f"ws_{role}", -1)] = xp.zeros(1, dtype=kind)
        return arrays

    def dense(self) -> Arrays:
        """Mode 0: the dense rows (each row's table empty)."""
        xp = self.xp
        off = xp.zeros(self.rows + 1, dtype=np.int64)
        return self._arrays(0, off, xp.full(1, -1, np.int64), xp.zeros(1, self.dtype))

    def tally(self) -> Arrays:
        """Mode 2: each row counts its scatters."""
        xp = self.xp
        off = xp.zeros(self.rows + 1, dtype=np.int64)
        return self._arrays(2, off, xp.full(1, -1, np.int64), xp.zeros(1, self.dtype))

    def _sized(self, counts: Any, vals: bool) -> Arrays | None:
        xp = self.xp
        n = counts.astype(np.int64)
        caps = xp.where(n > 0, 2 ** xp.ceil(xp.log2(xp.maximum(2 * n, 1))), 0).astype(np.int64)
        off = xp.zeros(self.rows + 1, dtype=np.int64)
        xp.cumsum(caps, out=off[1:])
        slots = int(off[-1])
        if slots * (8 + (self.dtype.itemsize if vals else 0)) > self.budget:
            return None
        keys = xp.full(max(1, slots), -1, dtype=np.int64)
        hvals = xp.full(max(1, slots) if vals else 1, self.identity, dtype=self.dtype)
        return self._arrays(1, off, keys, hvals)

    def count(self, bounds: Any) -> Arrays:
        """Mode 1 for the count phase from each row's bound, else the dense rows."""
        return self._sized(bounds, vals=False) or self.dense()

    def fill(self, counts: Any) -> Arrays:
        """Mode 1 for the fill from each row's exact count, else the dense rows."""
        if not self.hashed:
            return self.dense()
        return self._sized(counts, vals=True) or self.dense()
