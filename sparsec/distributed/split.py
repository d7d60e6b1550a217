"""Cutting a sparse tensor into parts along one mode, and joining parts back (numpy only).

A part holds the entries whose coordinate on the split mode lies in ``[lo, hi)``, with that
coordinate shifted by ``lo`` (its extent on the split mode is ``hi - lo``; the other modes keep
their full extent). Parts are balanced by nonzeros: the cut positions are ``nnz * p / P`` in
the entries sorted by the split coordinate, moved to the nearest slice boundary unless the
slice there holds more than ``nnz / P`` entries, in which case that slice is split by position
and the two parts share it (their ranges overlap by that one slice).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..tensors.formats import Compressed, Dense, Format, Singleton
from ..tensors.storage import LevelStorage
from ..tensors.tensor import Tensor


@dataclass(frozen=True, slots=True)
class Cut:
    """One part: entries ``[start, end)`` of the sorted order, split coordinates ``[lo, hi)``."""

    start: int
    end: int
    lo: int
    hi: int

    @property
    def nnz(self) -> int:
        return self.end - self.start


def cuts(keys: np.ndarray, extent: int, parts: int, split_heavy: bool = True) -> list[Cut]:
    """Balanced cuts of entries whose split coordinates ``keys`` are sorted ascending.

    Ranges cover ``[0, extent)`` in order; consecutive ranges share a slice only where it was
    split by position. Parts with an empty range are dropped (more parts than slices)."""
    starts = np.searchsorted(keys, np.arange(extent + 1), side="left")
    return _cuts(starts, extent, parts, split_heavy)


def cuts_from_counts(counts: np.ndarray, parts: int, split_heavy: bool = True) -> list[Cut]:
    """The same cuts from a histogram of entries per slice (files: no sort). A part's
    entries are then positions ``[start, end)`` of the entries ordered by slice (and within
    a slice in a fixed order, e.g. the file's), which is how a split slice is shared."""
    starts = np.concatenate([[0], np.cumsum(np.asarray(counts, dtype=np.int64))])
    return _cuts(starts, len(counts), parts, split_heavy)


def _cuts(starts: np.ndarray, extent: int, parts: int, split_heavy: bool) -> list[Cut]:
    """Cuts given ``starts[s]``, the position of slice s's first entry (``starts[extent]``:
    the number of entries)."""
    nnz = int(starts[-1]) if len(starts) else 0
    parts = max(1, int(parts))
    positions = [0]
    bounds = [0]
    shared = [False]
    for p in range(1, parts):
        target = (nnz * p) // parts
        if target >= nnz:
            pos, s = nnz, extent
            split = False
        else:
            s = int(np.searchsorted(starts, target, side="right")) - 1  # target's slice
            lo_s, hi_s = int(starts[s]), int(starts[s + 1])
            split = split_heavy and hi_s - lo_s > nnz / parts and lo_s < target < hi_s
            if split:
                pos = target
            elif target - lo_s <= hi_s - target:
                pos = lo_s
            else:
                pos, s = hi_s, s + 1
        if pos < positions[-1] or s < bounds[-1]:
            pos, s, split = positions[-1], bounds[-1], False
        positions.append(pos)
        bounds.append(s)
        shared.append(split)
    positions.append(nnz)
    bounds.append(extent)
    shared.append(False)
    found: list[Cut] = []
    for p in range(parts):
        lo, hi = bounds[p], bounds[p + 1] + (1 if shared[p + 1] else 0)
        if hi > lo:
            found.append(Cut(positions[p], positions[p + 1], lo, hi))
        elif found and positions[p + 1] > positions[p]:  # pragma: no cover - ranges are monotone
            raise AssertionError("entries in an empty range")
    return found


def sort_by(coords: np.ndarray, mode: int) -> np.ndarray:
    """The stable order of entries by their coordinate on ``mode``."""
    keys = coords[mode]
    if len(keys) < 2 or bool(np.all(keys[1:] >= keys[:-1])):
        return np.arange(len(keys))
    return np.argsort(keys, kind="stable")


def make_part(
    coords: np.ndarray,
    vals: np.ndarray,
    shape: Sequence[int],
    mode: int,
    lo: int,
    hi: int,
    format: Format,
    index_dtype: np.dtype,
) -> Tensor:
    """The part tensor for entries already selected: coordinates on ``mode`` shifted by ``lo``."""
    local = np.array(coords, dtype=np.int64, copy=True)
    local[mode] -= lo
    part_shape = list(shape)
    part_shape[mode] = hi - lo
    return Tensor.from_coo(local, vals, tuple(part_shape), format, index_dtype=index_dtype)


def cut(t: Tensor, axes: Sequence[int], lo: int, hi: int) -> Tensor:
    """The entries of ``t`` whose coordinates on every mode of ``axes`` lie in ``[lo, hi)``,
    shifted by ``lo`` on those modes (each of extent ``hi - lo``); stored zeros kept."""
    c, v = t.coords()
    keep = np.ones(len(v), dtype=bool)
    for ax in axes:
        keep &= (c[ax] >= lo) & (c[ax] < hi)
    local = np.array(c[:, keep], dtype=np.int64, copy=True)
    shape = list(t.shape)
    for ax in axes:
        local[ax] -= lo
        shape[ax] = hi - lo
    vals = np.asarray(v[keep], dtype=t.dtype)
    return Tensor.from_coo(local, vals, tuple(shape), t.format, index_dtype=t.index_dtype)


def select(
    pieces: Sequence[tuple[np.ndarray, np.ndarray]], mode: int, lo: int, hi: int
) -> tuple[np.ndarray, np.ndarray]:
    """Entries of global-coordinate pieces ``(coords, vals)`` with ``lo <= coords[mode] < hi``."""
    cs, vs = [], []
    for c, v in pieces:
        keep = (c[mode] >= lo) & (c[mode] < hi)
        cs.append(c[:, keep])
        vs.append(v[keep])
    order = len(pieces[0][0]) if pieces else 0
    if not cs:
        return np.zeros((order, 0), np.int64), np.zeros(0)
    return np.concatenate(cs, axis=1), np.concatenate(vs)


def global_coords(part: Tensor, mode: int, lo: int) -> tuple[np.ndarray, np.ndarray]:
    """A part's entries with the split coordinate shifted back to the whole tensor's."""
    c, v = part.coords()
    c[mode] += lo
    return c, v


def join(
    parts: Sequence[Tensor], ranges: Sequence[tuple[int, int]], mode: int, shape: Sequence[int]
) -> Tensor:
    """The whole tensor from its parts: by shifting ``pos`` where ``mode`` is the format's
    first level and the ranges do not overlap, else by re-packing the coordinates."""
    first = parts[0]
    fmt = first.format
    disjoint = all(a[1] <= b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    if fmt.ordering[0] == mode and disjoint and not fmt.is_dense:
        return _join_levels(parts, ranges, fmt, tuple(shape))
    pieces = [global_coords(p, mode, r[0]) for p, r in zip(parts, ranges, strict=True)]
    c = np.concatenate([x[0] for x in pieces], axis=1)
    v = np.concatenate([x[1] for x in pieces])
    return Tensor.from_coo(c, v, tuple(shape), fmt, index_dtype=first.index_dtype)


def _join_levels(
    parts: Sequence[Tensor], ranges: Sequence[tuple[int, int]], fmt: Format, shape: tuple[int, ...]
) -> Tensor:
    idt = parts[0].index_dtype
    levels: list[LevelStorage] = []
    covered = ranges[0][0] == 0 and ranges[-1][1] == shape[fmt.ordering[0]]
    contiguous = all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    if isinstance(fmt.levels[0], Dense) and not (covered and contiguous):
        raise AssertionError("dense first level: parts must cover the mode")  # pragma: no cover
    for k, level in enumerate(fmt.levels):
        stores = [p.levels[k] for p in parts]
        if isinstance(level, Dense):
            levels.append(LevelStorage())
            continue
        crd = [np.asarray(s.crd, np.int64) for s in stores]
        if k == 0:  # the split mode itself: coordinates shift by each part's start
            crd = [c + r[0] for c, r in zip(crd, ranges, strict=True)]
        crd_all = np.concatenate(crd).astype(idt) if crd else np.zeros(0, idt)
        if isinstance(level, Singleton):
            levels.append(LevelStorage(crd=crd_all))
            continue
        assert isinstance(level, Compressed)
        if k == 0:
            pos = np.array([0, len(crd_all)], dtype=idt)
        else:
            ends = [np.asarray(s.pos, np.int64) for s in stores]
            offsets: np.ndarray = np.cumsum(np.array([0] + [int(e[-1]) for e in ends]))
            heads = [e[:-1] + off for e, off in zip(ends, offsets, strict=False)]
            pos = np.concatenate([*heads, [offsets[-1]]]).astype(idt)
        levels.append(LevelStorage(pos=pos, crd=crd_all))
    vals = np.concatenate([p.vals for p in parts])
    return Tensor(shape, fmt, tuple(levels), vals, idt)
