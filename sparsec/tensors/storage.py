"""Level storage, dtypes and validation: the leaf of the tensor modules (imports no Tensor).

Holds `LevelStorage` (one level's pos/crd arrays), `StorageParts` (everything a `Tensor` is
built from: what the packers and converters return), the dtype and shape helpers every
constructor shares (`value_dtype`, `index_dtype_of`, `choose_index_dtype`, `coerce_values`,
`check_shape`) and the storage invariants of the model in `sparsec.tensors.tensor`:
`_check_structure` (cheap, O(order)) and `_check_contents` (vectorised, O(nnz)), which
`validate_storage` runs together -- the one validation every constructor's storage passes,
however it was built. Everything here works on raw arrays, so `packing`, `random`, `convert`
and `tensor` all import it without a cycle.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..base.errors import DTypeError, FormatError, ShapeError, StorageError
from ..base.values import INTEGRAL
from .formats import Compressed, Dense, Format, LevelFormat, Singleton

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
INDEX_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))
VALUE_DTYPES: tuple[np.dtype, ...] = (
    np.dtype(np.float32),
    np.dtype(np.float64),
    *(np.dtype(name) for name in INTEGRAL),
)
_SUPPORTED = "use float32, float64, an integer type or bool"


# --------------------------------------------------------------------------- storage


@dataclass(frozen=True, slots=True, eq=False)
class LevelStorage:
    """The arrays of one level: ``pos`` (compressed only) and ``crd`` (compressed, singleton)."""

    pos: np.ndarray | None = None
    crd: np.ndarray | None = None

    def arrays(self) -> tuple[np.ndarray, ...]:
        return tuple(a for a in (self.pos, self.crd) if a is not None)


@dataclass(frozen=True, slots=True, eq=False)
class StorageParts:
    """A validated tensor's storage, not yet owned by a `Tensor`: what `packing`, `random`
    and `convert` return, so that only `sparsec.tensors.tensor` builds (and freezes) one.
    The fields are `Tensor`'s constructor arguments, in its order."""

    shape: tuple[int, ...]
    format: Format
    levels: tuple[LevelStorage, ...]
    vals: np.ndarray
    index_dtype: np.dtype
    fill_value: Any = None


# --------------------------------------------------------------------------- dtypes and shapes


def _who(name: str) -> str:
    return f"tensor {name!r}: " if name else ""


def _at_level(name: str, k: int, level: LevelFormat) -> str:
    return f"{f'tensor {name!r} ' if name else ''}level {k} ({level}): "


def _numpy_dtype(spec: Any) -> np.dtype:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(spec, torch.dtype):
        spec = str(spec).removeprefix("torch.")
    try:
        return np.dtype(spec)
    except (TypeError, ValueError):
        raise DTypeError(f"{spec} is not a supported dtype") from None


def _supported_dtype(spec: Any, allowed: tuple[np.dtype, ...], role: str) -> np.dtype | None:
    """``spec`` as one of the ``allowed`` dtypes (from a name, numpy or torch dtype), or
    `DTypeError` naming the ``role``; ``None`` stays ``None``."""
    if spec is None:
        return None
    dt = _numpy_dtype(spec)
    if dt not in allowed:
        names = " or ".join(a.name for a in allowed)
        raise DTypeError(f"{role} dtype {dt} is not supported; use {names}")
    return dt


def value_dtype(spec: Any) -> np.dtype | None:
    """One of `VALUE_DTYPES` from a name, numpy or torch dtype; ``None`` stays ``None``."""
    return _supported_dtype(spec, VALUE_DTYPES, "value")


def index_dtype_of(spec: Any) -> np.dtype | None:
    """int32/int64 from a name, numpy or torch dtype; ``None`` stays ``None``."""
    return _supported_dtype(spec, INDEX_DTYPES, "index")


def choose_index_dtype(
    requested: np.dtype | None, shape: Sequence[int], counts: Sequence[int], name: str = ""
) -> np.dtype:
    """int32 unless a dimension size or a level's position count exceeds 2**31-1 (then int64).

    A requested int32 that cannot hold them raises `DTypeError`.
    """
    big_dim = max(shape, default=0)
    big_count = max(counts, default=0)
    if max(big_dim, big_count) <= INT32_MAX:
        return requested if requested is not None else INDEX_DTYPES[0]
    if requested == np.int32:
        what = f"dimension size {big_dim}" if big_dim > INT32_MAX else f"{big_count} positions"
        raise DTypeError(
            f"{_who(name)}index dtype int32 cannot hold {what} (more than 2**31-1); "
            "use index_dtype='int64' or leave it None"
        )
    return INDEX_DTYPES[1]


def coerce_values(values: Any, requested: np.dtype | None, name: str = "") -> np.ndarray:
    """Values as one of `VALUE_DTYPES` (float32, float64, the integer types and bool, kept as
    they are), or as ``requested``; complex is always refused, float16/bfloat16/other floats
    unless ``requested`` casts them."""
    array = np.asarray(values)
    kind = array.dtype.kind
    if kind == "c" or kind not in "biuf":
        raise DTypeError(f"{_who(name)}{array.dtype} values are not supported; {_SUPPORTED}")
    if requested is not None:
        return array.astype(requested, copy=False)
    if array.dtype in VALUE_DTYPES:
        return array
    raise DTypeError(f"{_who(name)}{array.dtype} values are not supported; {_SUPPORTED}")


def check_shape(shape: Any, name: str = "") -> tuple[int, ...]:
    """A shape as a tuple of non-negative Python ints, or `ShapeError`."""
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (shape,)
    try:
        dims = tuple(shape)
    except TypeError:
        raise ShapeError(f"{_who(name)}shape must be a tuple of ints, not {shape!r}") from None
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 0:
            raise ShapeError(f"{_who(name)}shape {dims} must hold non-negative ints, got {d!r}")
    return tuple(int(d) for d in dims)


def _cast(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``array`` itself (it is read-only, so shareable) when the dtype already matches."""
    return array if array.dtype == dtype else array.astype(dtype)


# ---- torch values


def _is_torch_tensor(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def _torch_numpy(t: Any, requested: np.dtype | None, name: str) -> np.ndarray:
    """A dense torch tensor's values in numpy (bfloat16 only when a cast is requested)."""
    import torch

    t = t.detach().cpu().resolve_conj().resolve_neg()
    if t.dtype == torch.bfloat16:
        if requested is None:
            raise DTypeError(f"{_who(name)}bfloat16 values are not supported; {_SUPPORTED}")
        t = t.to(torch.float64)
    return t.numpy()


# --------------------------------------------------------------------------- validation


def _position_counts(fmt: Format, shape: Sequence[int], levels: Sequence[Any]) -> list[int]:
    """``n_k`` per level (Python ints, so huge dense levels do not overflow)."""
    counts, n = [], 1
    for k, level in enumerate(fmt.levels):
        size = shape[fmt.ordering[k]]
        match level:
            case Dense():
                n *= size
            case Compressed():
                n = len(levels[k].crd) if levels[k].crd is not None else 0
            case Singleton():
                pass
            case _:
                raise FormatError(f"unknown level format {level!r}")
        counts.append(n)
    return counts


def validate_storage(
    shape: tuple[int, ...],
    fmt: Format,
    levels: Sequence[LevelStorage],
    vals: Any,
    index_dtype: np.dtype,
    name: str = "",
) -> None:
    """Every storage invariant (`_check_structure`, then `_check_contents`), or `StorageError`
    (`FormatError`, `DTypeError`) naming the fault. Packed and user-given storage alike pass
    through here before a `Tensor` holds it, so no kernel ever reads a coordinate outside its
    mode's extent or a position outside its array."""
    _check_structure(shape, fmt, levels, vals, index_dtype, name)
    _check_contents(shape, fmt, levels, vals, name)


def _check_structure(
    shape: tuple[int, ...],
    fmt: Format,
    levels: Sequence[LevelStorage],
    vals: Any,
    index_dtype: np.dtype,
    name: str,
) -> None:
    """Cheap O(order) checks: level count, which arrays exist, array types, dims and dtypes."""
    if fmt.order != len(shape):
        raise FormatError(
            f"{_who(name)}format {fmt} has {fmt.order} levels but the shape {shape} has "
            f"order {len(shape)}"
        )
    if len(levels) != fmt.order:
        raise StorageError(f"{_who(name)}{len(levels)} level storages for format {fmt}")
    if index_dtype not in INDEX_DTYPES:
        raise DTypeError(f"{_who(name)}index dtype {index_dtype} is not int32 or int64")
    for k, (level, st) in enumerate(zip(fmt.levels, levels, strict=True)):
        for array_name in ("pos", "crd"):
            array = getattr(st, array_name)
            wanted = array_name in level.arrays
            if wanted != (array is not None):
                verb = "needs a" if wanted else "stores no"
                raise StorageError(f"{_at_level(name, k, level)}{verb} {array_name} array")
            if array is None:
                continue
            if not isinstance(array, np.ndarray):
                raise StorageError(f"{_at_level(name, k, level)}{array_name} is not an array")
            if array.ndim != 1:
                raise StorageError(
                    f"{_at_level(name, k, level)}{array_name} must be 1-d, got shape {array.shape}"
                )
            if array.dtype != index_dtype:
                raise DTypeError(
                    f"{_at_level(name, k, level)}{array_name} has dtype {array.dtype}; all index "
                    f"arrays of the tensor must be {index_dtype}"
                )
            if not array.flags.c_contiguous:
                raise StorageError(f"{_at_level(name, k, level)}{array_name} is not contiguous")
    if not isinstance(vals, np.ndarray):
        raise StorageError(f"{_who(name)}vals is not an array")
    if vals.ndim != 1:
        raise StorageError(f"{_who(name)}vals must be 1-d, got shape {vals.shape}")
    if vals.dtype not in VALUE_DTYPES:
        raise DTypeError(f"{_who(name)}{vals.dtype} values are not supported; {_SUPPORTED}")
    if not vals.flags.c_contiguous:
        raise StorageError(f"{_who(name)}vals is not contiguous")


def _check_contents(
    shape: tuple[int, ...], fmt: Format, levels: Sequence[LevelStorage], vals: np.ndarray, name: str
) -> None:
    """The O(nnz) invariants, level by level: pos shape and monotonicity, crd range and order."""
    n = 1
    for k, (level, st) in enumerate(zip(fmt.levels, levels, strict=True)):
        size = shape[fmt.ordering[k]]
        where = _at_level(name, k, level)
        match level:
            case Dense():
                n *= size
            case Compressed():
                assert st.pos is not None and st.crd is not None
                _check_pos(st.pos, n, len(st.crd), where)
                _check_range(st.crd, size, where)
                _check_segment_order(st.crd, st.pos, level.unique, where)
                n = len(st.crd)
            case Singleton():
                assert st.crd is not None
                if len(st.crd) != n:
                    raise StorageError(
                        f"{where}crd has {len(st.crd)} entries but a singleton level stores one "
                        f"coordinate per parent position ({n})"
                    )
                _check_range(st.crd, size, where)
                _check_chain_order(fmt, levels, k, where)
            case _:
                raise FormatError(f"unknown level format {level!r}")
    if len(vals) != n:
        raise StorageError(
            f"{_who(name)}vals has {len(vals)} entries but the last level has {n} positions"
        )


def _check_pos(pos: np.ndarray, parents: int, n_crd: int, where: str) -> None:
    if len(pos) != parents + 1:
        raise StorageError(
            f"{where}pos has {len(pos)} entries; expected {parents + 1} (one more than the "
            f"{parents} parent positions)"
        )
    if pos[0] != 0:
        raise StorageError(f"{where}pos[0]={pos[0]} (pos must start at 0)")
    falls = np.flatnonzero(pos[1:] < pos[:-1])
    if falls.size:
        i = int(falls[0])
        raise StorageError(
            f"{where}pos[{i}]={pos[i]} > pos[{i + 1}]={pos[i + 1]} (pos must be non-decreasing)"
        )
    if pos[-1] != n_crd:
        raise StorageError(
            f"{where}pos[{parents}]={pos[-1]} but crd has {n_crd} entries "
            "(the last pos must equal len(crd))"
        )


def _check_range(crd: np.ndarray, size: int, where: str) -> None:
    if crd.size and (crd.min() < 0 or crd.max() >= size):
        i = int(np.flatnonzero((crd < 0) | (crd >= size))[0])
        raise StorageError(f"{where}crd[{i}]={crd[i]} is out of range [0, {size})")


def _same_segment(pos: np.ndarray, n: int) -> np.ndarray:
    """For each neighbour pair (q, q+1) of n positions: do both belong to one pos segment?"""
    same = np.ones(max(n - 1, 0), dtype=bool)
    starts = pos[1:-1]
    starts = starts[(starts > 0) & (starts < n)]
    same[starts - 1] = False
    return same


def _check_segment_order(crd: np.ndarray, pos: np.ndarray, unique: bool, where: str) -> None:
    if len(crd) < 2:
        return
    same = _same_segment(pos, len(crd))
    bad = same & ((crd[1:] <= crd[:-1]) if unique else (crd[1:] < crd[:-1]))
    if not bad.any():
        return
    i = int(np.flatnonzero(bad)[0])
    parent = int(np.searchsorted(pos, i, side="right")) - 1
    a, b = crd[i], crd[i + 1]
    if a == b:
        raise StorageError(
            f"{where}duplicate coordinate {a} at crd[{i}] and crd[{i + 1}] under parent position "
            f"{parent} (coordinates must be strictly increasing in a segment)"
        )
    order = "strictly increasing" if unique else "non-decreasing"
    raise StorageError(
        f"{where}crd[{i}]={a} > crd[{i + 1}]={b} under parent position {parent} "
        f"(coordinates must be {order} in a segment)"
    )


def _check_chain_order(fmt: Format, levels: Sequence[LevelStorage], k: int, where: str) -> None:
    """Singleton level k: within a segment of the chain's head (the nearest non-singleton level
    above), coordinate tuples of levels head..k are sorted, strictly at a unique singleton. A
    unique head has one position per chain, so there is nothing to order."""
    head = k - 1
    while isinstance(fmt.levels[head], Singleton):
        head -= 1
    head_pos = levels[head].pos
    if fmt.levels[head].unique or head_pos is None:
        return
    crds = [levels[j].crd for j in range(head, k + 1)]
    crd = crds[-1]
    assert crd is not None and all(c is not None for c in crds)
    if len(crd) < 2:
        return
    ties = _same_segment(head_pos, len(crd))
    for c in crds[:-1]:
        ties &= c[1:] == c[:-1]  # type: ignore[index]
    unique = fmt.levels[k].unique
    bad = ties & ((crd[1:] <= crd[:-1]) if unique else (crd[1:] < crd[:-1]))
    if not bad.any():
        return
    i = int(np.flatnonzero(bad)[0])
    first = tuple(int(c[i]) for c in crds)  # type: ignore[index]
    second = tuple(int(c[i + 1]) for c in crds)  # type: ignore[index]
    if first == second:
        raise StorageError(
            f"{where}duplicate coordinate tuple {first} (levels {head}..{k}) at positions {i} "
            f"and {i + 1}"
        )
    raise StorageError(
        f"{where}coordinate tuples (levels {head}..{k}) out of order: {first} at position {i} "
        f"then {second} (tuples must be lexicographically sorted)"
    )


def check_fill(fill: Any, dtype: np.dtype, name: str = "") -> Any:
    """``fill`` (the value of a tensor's absent entries; None: the reading kernel's absent
    value) as a Python number of ``dtype``'s kind: a real number, for an integral dtype an
    integer of its range (bool: 0 or 1); else `DTypeError`."""
    if fill is None:
        return None
    if isinstance(fill, np.generic):
        fill = fill.item()
    if not isinstance(fill, (bool, int, float)):
        raise DTypeError(f"{_who(name)}fill_value must be a number, not {type(fill).__name__}")
    if dtype.kind in "biu":
        low, high = (0, 1) if dtype.kind == "b" else (np.iinfo(dtype).min, np.iinfo(dtype).max)
        if not float(fill).is_integer() or not low <= fill <= high:
            raise DTypeError(
                f"{_who(name)}fill_value {fill!r} is not a value of {dtype} ({low} to {high})"
            )
        return bool(fill) if dtype.kind == "b" else int(fill)
    return float(fill)


def same_fill(a: Any, b: Any) -> bool:
    """Whether two fill values are the same (NaN is NaN; None only None)."""
    if a is None or b is None:
        return a is b
    return bool(a == b or (a != a and b != b))
