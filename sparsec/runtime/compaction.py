"""The compaction step of a staged sparse output on the GPU (`sparsec.middle.staging`):
the rows of a ``d...ds`` result (their ``pos``, ``crd`` and ``vals``) turned into the
asked-for format's levels with array operations only (numpy under the emulation, CuPy on
the device, the same code), so it runs where the rows are.

Each entry's row is found by a binary search of ``pos`` (``searchsorted``) and split into
its coordinates at the dense levels; the target's levels are then built from the top
down, each entry carrying its position at the level above (``parent``):

* a dense level: ``parent * N + coordinate``;
* a unique compressed level (DCSR's rows, CSF's levels): a position where the entry's
  (parent, coordinate) differs from the entry before it (flags, a prefix sum for the
  positions, the flagged coordinates as ``crd``, a count per parent prefix-summed as
  ``pos``);
* COO's non-unique level and its singletons: a position per entry;
* a dense block below the last appended level: the entries' values scattered into
  zeroed blocks.

The entries come sorted (rows in order, columns sorted within a row), so every level
comes out canonical, equal array by array to the C target's assembly."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..tensors.formats import Dense, Format, Singleton

#: a level's arrays (``pos``, ``crd``; None where the level stores none)
Level = tuple[Any, Any]


def compact(
    rows: tuple[Any, Any, Any],
    extents: tuple[int, ...],
    lead: int,
    fmt: Format,
    xp: Any,
) -> tuple[list[Level], Any]:
    """The levels and values of ``fmt`` from the staging output's ``rows`` (its last
    level's ``pos``, ``crd`` and the values), whose levels have ``extents``; the first
    ``lead`` staging levels are not the output's (a vector's row of extent one)."""
    pos, crd, vals = rows
    index = crd.dtype
    nnz = len(crd)
    row = xp.searchsorted(pos[1:], xp.arange(nnz, dtype=pos.dtype), side="right")
    coords: list[Any] = []
    stride = math.prod(extents[:-1])
    for n in extents[:-1]:
        stride //= max(n, 1)  # an extent of 0: no entries, no coordinates to find
        coords.append((row // max(stride, 1)) % max(n, 1))
    coords = [*coords[lead:], crd]
    dims = extents[lead:]
    parent = xp.zeros(nnz, dtype=np.int64)
    parents = 1
    levels: list[Level] = []
    for k, level in enumerate(fmt.levels):
        c = coords[k]
        if isinstance(level, Dense):
            parent = parent * dims[k] + c
            parents *= dims[k]
            levels.append((None, None))
            continue
        if isinstance(level, Singleton):
            levels.append((None, c.astype(index)))  # one per parent position: per entry
            continue
        new = xp.ones(nnz, dtype=bool)
        if level.unique and nnz > 1:
            new[1:] = (parent[1:] != parent[:-1]) | (c[1:] != c[:-1])
        counts = (
            xp.bincount(parent[new], minlength=parents)
            if nnz
            else xp.zeros(parents, dtype=np.int64)
        )
        level_pos = xp.zeros(parents + 1, dtype=index)
        level_pos[1:] = xp.cumsum(counts)
        levels.append((level_pos, c[new].astype(index)))
        parent = xp.cumsum(new) - 1
        parents = int(level_pos[-1])
    if isinstance(fmt.levels[-1], Dense) and not fmt.is_dense:
        block = xp.zeros(parents, dtype=vals.dtype)
        block[parent] = vals
        return levels, block
    return levels, vals
