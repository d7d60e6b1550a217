"""Random tensors: reproducible sparse test data with exactly the requested nonzero count.

`random` draws distinct cells (`_sample_cells`, in memory proportional to the entries, never
to the dense size), leaves some coordinates of modes 0 and 1 empty so kernels meet empty
segments, and packs the entries through `sparsec.tensors.packing.pack`. It returns
`StorageParts`; `sparsec.tensors.tensor.random` is the `Tensor`-returning constructor.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..base.errors import InputError
from .formats import Format, default_sparse, parse_format
from .packing import pack
from .storage import INT64_MAX, StorageParts, check_shape, value_dtype


def _skip(reduced: np.ndarray, excluded: np.ndarray) -> np.ndarray:
    """Map 0..N-|E|-1 onto the coordinates 0..N-1 not in the sorted set ``excluded``."""
    shifted = excluded - np.arange(len(excluded))
    return reduced + np.searchsorted(shifted, reduced, side="right")


def _sample_cells(rng: np.random.Generator, dims: Sequence[int], k: int) -> np.ndarray:
    """``k`` distinct cells of a ``dims`` grid, uniformly, as coordinates ``(len(dims), k)``."""
    if not dims:
        return np.zeros((0, k), dtype=np.int64)
    total = math.prod(dims)
    if total <= INT64_MAX:
        flat = _sample_distinct(rng, total, k)
        return np.array(np.unravel_index(flat, dims), dtype=np.int64).reshape(len(dims), k)
    # a grid too large for flat indices: draw coordinate tuples and keep the distinct ones
    found = np.zeros((len(dims), 0), dtype=np.int64)
    while found.shape[1] < k:
        extra = np.stack([rng.integers(0, d, size=k) for d in dims])
        found = np.unique(np.concatenate([found, extra], axis=1), axis=1)
    return found[:, np.sort(rng.permutation(found.shape[1])[:k])]


def _sample_distinct(rng: np.random.Generator, total: int, k: int) -> np.ndarray:
    """``k`` distinct sorted integers from ``range(total)``, every k-subset equally likely,
    in memory proportional to ``k`` (never one int64 per value of the range: for a random
    sparse tensor, that is the size of the dense tensor).

    Values are drawn with replacement until ``k`` distinct ones are found, then a random
    ``k`` of them kept (the set of distinct draws is a uniform subset of its size, by
    symmetry). The draws are marked in a bitmap of the range when it is no larger than
    the result (``total <= 8k``), else sorted and deduplicated. Beyond half the range the
    sample is the range without a sample of the ``total - k`` values left out, so a fresh
    draw is always new with probability at least one half.
    """
    if k == 0:
        return np.zeros(0, dtype=np.int64)
    if 2 * k > total:
        keep = np.ones(total, dtype=bool)
        keep[_sample_distinct(rng, total, total - k)] = False
        return np.flatnonzero(keep)

    def more(found: int) -> np.ndarray:
        # a draw is new with probability (total - found) / total: ask for that many more
        # (and a tenth), so one or two rounds suffice
        wanted = (k - found) * total / (total - found)
        return rng.integers(0, total, size=int(1.1 * wanted) + 16)

    if total <= 8 * k:
        mask, count = np.zeros(total, dtype=bool), 0
        while count < k:
            mask[more(count)] = True
            count = int(np.count_nonzero(mask))
        found = np.flatnonzero(mask)
    else:
        found = np.zeros(0, dtype=np.int64)
        while len(found) < k:
            found = np.sort(np.concatenate([found, more(len(found))]))
            found = found[np.concatenate(([True], found[1:] != found[:-1]))]
    if len(found) > k:  # drop a uniform sample of the surplus (a few percent)
        found = np.delete(found, rng.choice(len(found), size=len(found) - k, replace=False))
    return found


def random(
    shape: Sequence[int],
    density: float,
    format: str | Format | None = None,
    *,
    seed: int | None = 0,
    dtype: Any = "float64",
    index_dtype: Any = None,
    integer: bool = False,
    empty_fraction: float = 0.2,
) -> StorageParts:
    """A reproducible random tensor with exactly ``round(density * size)`` nonzeros.

    Values are uniform in [-1, 1) without exact zeros, or nonzero integers in [-4, 4]. When a
    mode 0 has more than 2 coordinates, ``empty_fraction`` of them (at least one, at most
    2**20) hold no entries, and likewise one coordinate of mode 1 (an empty column), so kernels
    see empty segments -- as long as the nonzeros still fit in the remaining cells (density 1
    gives a full tensor). Default format: `default_sparse`.
    """
    shape = check_shape(shape)
    if not 0 <= density <= 1:
        raise InputError(f"density must be in [0, 1], got {density}")
    if seed is not None and (
        isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0
    ):
        raise InputError(f"seed must be None or a non-negative integer, not {seed!r}")
    rng = np.random.default_rng(seed)
    fmt = parse_format(default_sparse(len(shape)) if format is None else format, len(shape))
    vdt = value_dtype(dtype) or np.dtype(np.float64)
    nnz = round(density * math.prod(shape))
    wanted = [0] * len(shape)  # empty coordinates per mode: a fraction of mode 0, one of mode 1
    if empty_fraction > 0 and len(shape) >= 1 and shape[0] > 2:
        wanted[0] = min(max(1, round(empty_fraction * shape[0])), shape[0] - 1, 2**20)
    if empty_fraction > 0 and len(shape) >= 2 and shape[1] > 2:
        wanted[1] = 1
    for empties in (wanted, [min(e, 1) for e in wanted], [0] * len(shape)):
        if nnz <= math.prod(d - e for d, e in zip(shape, empties, strict=True)):
            break  # fewer empty slices when the nonzeros would not fit
    excluded = [
        np.sort(rng.choice(d, size=e, replace=False)) if e else np.zeros(0, dtype=np.int64)
        for d, e in zip(shape, empties, strict=True)
    ]
    reduced = _sample_cells(rng, [d - e for d, e in zip(shape, empties, strict=True)], nnz)
    coords = (
        np.stack([_skip(r, ex) for r, ex in zip(reduced, excluded, strict=True)])
        if shape
        else reduced
    )
    if integer or vdt.kind in "biu":  # an integral dtype's values are integers
        values = (rng.integers(1, 5, size=nnz) * rng.choice([-1, 1], size=nnz)).astype(vdt)
    else:
        values = rng.uniform(-1.0, 1.0, size=nnz).astype(vdt)
        values[values == 0] = 0.5
    return pack(coords, values, shape, fmt, index_dtype)
