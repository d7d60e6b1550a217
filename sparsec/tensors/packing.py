"""Packing: mode-order COO entries, dense arrays or raw level arrays -> validated storage.

`pack` sorts the entries into level order, sums duplicates and assembles pos/crd level by
level (`_levels_from_coo`); `from_dense` (and `sparsec.tensors.random`) go through it, `from_arrays`
copies storage given level by level. Both end in `validate_storage`, the one check every
built tensor passes (a packer bug or a shape the format cannot hold is an error, never
storage a kernel would read out of bounds).

Every constructor here returns `StorageParts`; `sparsec.tensors.tensor` wraps them in a
`Tensor` under the same names (imports flow one way: `storage` <- `packing` <- `convert` <-
`tensor`).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ..base.errors import DTypeError, FormatError, InputError, ShapeError, StorageError
from .formats import Compressed, Dense, Format, LevelFormat, Singleton, parse_format
from .storage import (
    INT64_MAX,
    LevelStorage,
    StorageParts,
    _at_level,
    _is_torch_tensor,
    _position_counts,
    _torch_numpy,
    _who,
    check_fill,
    check_shape,
    choose_index_dtype,
    coerce_values,
    index_dtype_of,
    validate_storage,
    value_dtype,
)

# --------------------------------------------------------------------------- packing


def _sort_and_sum(
    coords: list[np.ndarray], values: np.ndarray, level_shape: Sequence[int]
) -> tuple[list[np.ndarray], np.ndarray]:
    """Level-order entries sorted lexicographically with duplicate tuples summed.

    Entries are keyed by their row-major linear index in level order. Unsorted keys are sorted
    together with their entry number (``key * nnz + entry``, one plain sort, several times
    faster than ``argsort``) and the coordinates recomputed from the sorted keys.
    """
    nnz = len(values)
    if nnz < 2:
        return coords, values
    if math.prod(level_shape) * nnz > INT64_MAX:  # keys too wide: sort on the columns
        order = np.lexsort(coords[::-1])
        coords, values = [c[order] for c in coords], values[order]
        new = np.zeros(nnz - 1, dtype=bool)
        for c in coords:
            new |= c[1:] != c[:-1]
    else:
        key = np.zeros(nnz, dtype=np.int64)
        for c, size in zip(coords, level_shape, strict=True):
            key = key * size + c
        if not np.all(key[1:] >= key[:-1]):
            tagged = key * nnz + np.arange(nnz, dtype=np.int64)
            tagged.sort()
            key, order = np.divmod(tagged, nnz)
            values = values[order]
            coords = _unravel(key, level_shape)
        new = key[1:] != key[:-1]
    if not new.all():
        starts = np.flatnonzero(np.concatenate(([True], new)))
        values = np.add.reduceat(values, starts)
        coords = [c[starts] for c in coords]
    return coords, values


def _unravel(key: np.ndarray, level_shape: Sequence[int]) -> list[np.ndarray]:
    """Row-major linear indices back to one coordinate array per level."""
    coords = []
    for size in reversed(level_shape):
        key, c = np.divmod(key, size)
        coords.append(c)
    return coords[::-1]


def _new_positions(parent: np.ndarray, columns: Sequence[np.ndarray]) -> np.ndarray:
    """Mask of sorted entries that start a new (parent position, coordinates...) group."""
    new = np.ones(len(parent), dtype=bool)
    if len(parent):
        new[1:] = parent[1:] != parent[:-1]
        for c in columns:
            new[1:] |= c[1:] != c[:-1]
    return new


def _chain_end(fmt: Format, k: int) -> int:
    """The unique singleton ending the singleton chain below non-unique level k."""
    end = k + 1
    while not fmt.levels[end].unique:
        end += 1
    return end


def _levels_from_coo(
    coords: list[np.ndarray],
    values: np.ndarray,
    shape: tuple[int, ...],
    fmt: Format,
    index_dtype: np.dtype | None,
    name: str,
    *,
    presorted: bool = False,
) -> StorageParts:
    """Build the levels from level-order int64 coordinates (in range) and coerced values.

    ``p`` holds, per entry, its position at the current level; ``n`` the level's position count.
    Unless ``presorted`` (sorted, no duplicate tuples) the entries are sorted and summed first.
    """
    level_shape = [shape[m] for m in fmt.ordering]
    if fmt.order == 0:
        vals = np.array([values.sum()], dtype=values.dtype)
        return StorageParts(shape, fmt, (), vals, choose_index_dtype(index_dtype, (), (), name))
    if not presorted:
        coords, values = _sort_and_sum(coords, values, level_shape)
    p, n = np.zeros(len(values), dtype=np.int64), 1
    storages: list[LevelStorage] = []
    counts: list[int] = []
    for k, (level, c, size) in enumerate(zip(fmt.levels, coords, level_shape, strict=True)):
        match level:
            case Dense():
                p, n = p * size + c, n * size
                storages.append(LevelStorage())
            case Compressed():
                last = k if level.unique else _chain_end(fmt, k)
                new = _new_positions(p, coords[k : last + 1])
                pos = np.zeros(n + 1, dtype=np.int64)
                np.cumsum(np.bincount(p[new], minlength=n), out=pos[1:])
                storages.append(LevelStorage(pos, c[new]))
                p, n = np.cumsum(new) - 1, int(new.sum())
            case Singleton():
                if size == 0 and n > 0:
                    raise FormatError(
                        f"{_who(name)}format {fmt} cannot hold shape {shape}: level {k} "
                        f"(singleton) stores one coordinate for each of the {n} positions of "
                        f"level {k - 1}, but its mode {fmt.ordering[k]} has extent 0, so no "
                        "coordinate exists; use a compressed level there (e.g. 's' for 'q')"
                    )
                clash = np.flatnonzero((p[1:] == p[:-1]) & (c[1:] != c[:-1]))
                if clash.size:
                    i = int(clash[0])
                    raise StorageError(
                        f"{_who(name)}format {fmt} cannot hold this pattern: level {k} "
                        f"(singleton) stores one coordinate per parent position, but parent "
                        f"position {p[i]} needs coordinates {c[i]} and {c[i + 1]}"
                    )
                crd = np.zeros(n, dtype=np.int64)  # parents without entries get coordinate 0
                crd[p] = c
                storages.append(LevelStorage(None, crd))
            case _:
                raise FormatError(f"unknown level format {level!r}")
        counts.append(n)
    idt = choose_index_dtype(index_dtype, shape, counts, name)
    if n == len(values):  # every position holds an entry, in order
        vals = values.copy()
    else:  # dense levels force zeros
        vals = np.zeros(n, dtype=values.dtype)
        vals[p] = values
    levels = tuple(
        LevelStorage(*(None if a is None else a.astype(idt) for a in (st.pos, st.crd)))
        for st in storages
    )
    validate_storage(shape, fmt, levels, vals, idt, name)  # the same check as from_arrays
    return StorageParts(shape, fmt, levels, vals, idt)


def _coords_array(coords: Any, order: int, nnz: int, name: str) -> np.ndarray:
    """Mode-order coordinates as int64 ``(order, nnz)``: from a 2-d array or per-mode arrays."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(coords, torch.Tensor):
        coords = coords.detach().cpu().numpy()
    if order == 0:
        return np.zeros((0, nnz), dtype=np.int64)
    try:
        array = np.asarray(coords)
    except ValueError:
        raise ShapeError(f"{_who(name)}coordinate arrays have different lengths") from None
    if array.size == 0:
        array = array.astype(np.int64)
    if array.ndim == 1 and order == 1:
        array = array.reshape(1, -1)
    if array.dtype.kind not in "iu":
        raise DTypeError(f"{_who(name)}coordinates must be integers, not {array.dtype}")
    if array.shape != (order, nnz):
        raise ShapeError(
            f"{_who(name)}coordinates have shape {array.shape}; expected ({order}, {nnz}) for an "
            f"order-{order} tensor with {nnz} values"
        )
    return array.astype(np.int64, copy=False)


def pack(
    coords: Any,
    values: Any,
    shape: Sequence[int],
    format: str | Format,
    index_dtype: Any = None,
    dtype: Any = None,
    *,
    name: str = "",
) -> StorageParts:
    """Assemble a tensor from mode-order COO entries.

    ``coords`` is ``(order, nnz)`` (or one array per mode). Entries are permuted to level order,
    sorted lexicographically and duplicates summed; explicit zeros are kept. Each level is then
    built from the entries' parent positions: dense ``p*N+i`` (zero-filled), compressed one
    position per distinct (parent, coordinate) -- per distinct tuple of its singleton chain when
    non-unique -- and singleton the parent's position. Raises `StorageError` for out-of-range
    coordinates or a pattern the format cannot hold (two children under a unique singleton's
    parent).
    """
    shape = check_shape(shape, name)
    fmt = parse_format(format, len(shape), name)
    vals = coerce_values(values, value_dtype(dtype), name)
    if vals.ndim != 1:
        raise ShapeError(f"{_who(name)}values must be 1-d, got shape {vals.shape}")
    c = _coords_array(coords, len(shape), len(vals), name)
    for mode, size in enumerate(shape):
        row = c[mode]
        if row.size and (row.min() < 0 or row.max() >= size):
            i = int(np.flatnonzero((row < 0) | (row >= size))[0])
            raise StorageError(
                f"{_who(name)}coordinate {row[i]} of entry {i} is out of range [0, {size}) "
                f"for mode {mode}"
            )
    level_coords = [c[m] for m in fmt.ordering]
    return _levels_from_coo(level_coords, vals, shape, fmt, index_dtype_of(index_dtype), name)


# --------------------------------------------------------------------------- constructors


def from_dense(
    array: Any,
    format: str | Format | None = None,
    *,
    index_dtype: Any = None,
    dtype: Any = None,
    name: str = "",
    fill_value: Any = None,
) -> StorageParts:
    """From a numpy array, torch dense tensor or nested list; entries equal to
    ``fill_value`` (None: zeros, read as the kernel's absent value) are not stored except
    where a dense level forces them, and the tensor's absent entries are ``fill_value``.
    Default format: dense."""
    requested = value_dtype(dtype)
    if _is_torch_tensor(array):
        array = _torch_numpy(array, requested, name)
    elif not isinstance(array, np.ndarray):
        try:
            array = np.asarray(array)
        except (ValueError, TypeError) as err:
            raise InputError(f"{_who(name)}cannot be read as an array: {err}") from None
    values = coerce_values(array, requested, name)
    shape = check_shape(values.shape, name)
    fmt = parse_format("dense" if format is None else format, values.ndim, name)
    idt = index_dtype_of(index_dtype)
    level_major = values.transpose(fmt.ordering)
    if fmt.is_dense:
        counts = list(np.cumprod([1, *level_major.shape], dtype=object)[1:])
        idt = choose_index_dtype(idt, shape, counts, name)
        vals = np.array(level_major, order="C").reshape(-1)
        levels = tuple(LevelStorage() for _ in fmt.levels)
        validate_storage(shape, fmt, levels, vals, idt, name)
        return StorageParts(shape, fmt, levels, vals, idt)
    fill = check_fill(fill_value, values.dtype, name)
    if not fill:
        nonzero = np.nonzero(level_major)  # sorted in level order already
    else:  # the entries that differ from the fill (NaN from a NaN fill too)
        nonzero = np.nonzero(~np.isnan(level_major) if fill != fill else level_major != fill)
    coords = [c.astype(np.int64, copy=False) for c in nonzero]
    parts = _levels_from_coo(coords, level_major[nonzero], shape, fmt, idt, name, presorted=True)
    return replace(parts, fill_value=fill)


def _user_level(entry: Any, level: LevelFormat, where: str) -> tuple[Any, Any]:
    """(pos, crd) from one spelling: None, LevelStorage, {"pos", "crd"}, (pos, crd), or a bare
    crd (singleton levels)."""
    match entry:
        case None:
            return None, None
        case LevelStorage():
            return entry.pos, entry.crd
        case dict():
            extra = set(entry) - {"pos", "crd"}
            if extra:
                raise StorageError(f"{where}unknown storage arrays {sorted(extra)}")
            return entry.get("pos"), entry.get("crd")
        case (first, second) if all(x is None or np.ndim(x) >= 1 for x in entry):
            return first, second
        case _:
            if isinstance(level, Singleton):
                return None, entry
            raise StorageError(
                f"{where}storage must be None, (pos, crd), a dict or a LevelStorage, "
                f"not {type(entry).__name__}"
            )


def from_arrays(
    shape: Sequence[int],
    format: str | Format,
    levels: Sequence[Any],
    vals: Any,
    *,
    name: str = "",
    index_dtype: Any = None,
    dtype: Any = None,
) -> StorageParts:
    """A tensor from raw storage, copied and validated.

    ``levels`` holds one entry per storage level: ``None`` for dense, ``(pos, crd)`` (or a dict
    or `LevelStorage`) for compressed, ``(None, crd)`` or a bare ``crd`` for singleton. Index
    arrays of any integer dtype are converted to the tensor's index dtype (``index_dtype``, or
    int32 unless the shape, position counts or stored values need int64); float or bool index
    arrays raise `DTypeError`. Integer or bool ``vals`` become float64.
    """
    try:
        return _from_arrays(shape, format, levels, vals, name, index_dtype, dtype)
    except (TypeError, ValueError) as err:  # ragged or non-array storage, never a traceback
        raise StorageError(f"{_who(name)}malformed storage arrays: {err}") from None


def _from_arrays(
    shape: Sequence[int],
    format: str | Format,
    levels: Sequence[Any],
    vals: Any,
    name: str,
    index_dtype: Any,
    dtype: Any,
) -> StorageParts:
    shape = check_shape(shape, name)
    fmt = parse_format(format, len(shape), name)
    if not isinstance(levels, (list, tuple)):
        raise StorageError(
            f"{_who(name)}levels must be a list with one entry per storage level, not "
            f"{type(levels).__name__}"
        )
    if len(levels) != fmt.order:
        raise StorageError(
            f"{_who(name)}format {fmt} has {fmt.order} levels but {len(levels)} level storages "
            "were given"
        )
    raw = []
    for k, (entry, level) in enumerate(zip(levels, fmt.levels, strict=True)):
        where = _at_level(name, k, level)
        arrays = []
        for array_name, array in zip(("pos", "crd"), _user_level(entry, level, where), strict=True):
            if array is not None:
                array = np.asarray(array)
                if array.dtype.kind not in "iu":
                    raise DTypeError(
                        f"{where}{array_name} has dtype {array.dtype}; index arrays must be "
                        "integers"
                    )
            arrays.append(array)
        raw.append(LevelStorage(*arrays))
    values = coerce_values(vals, value_dtype(dtype), name)
    idt = index_dtype_of(index_dtype)
    counts = _position_counts(fmt, shape, raw)
    extremes = [
        (k, array_name, int(array.min()), int(array.max()))
        for k, st in enumerate(raw)
        for array_name, array in (("pos", st.pos), ("crd", st.crd))
        if array is not None and array.size
    ]
    if idt is None:
        # stored values beyond int32, even invalid ones, pick int64: validation then names
        # the bad value instead of the conversion failing
        counts.append(max((max(-lo, hi) for *_, lo, hi in extremes), default=0))
    idt = choose_index_dtype(idt, shape, counts, name)
    info = np.iinfo(idt)
    for k, array_name, lo, hi in extremes:
        if lo < info.min or hi > info.max:
            raise DTypeError(
                f"{_at_level(name, k, fmt.levels[k])}{array_name} holds values that do not fit "
                f"{idt}; use index_dtype='int64'"
            )
    storages = [
        LevelStorage(*(None if a is None else np.array(a, dtype=idt, order="C") for a in pair))
        for pair in ((st.pos, st.crd) for st in raw)
    ]
    values = np.array(values, order="C")
    validate_storage(shape, fmt, storages, values, idt, name)
    return StorageParts(shape, fmt, tuple(storages), values, idt)
