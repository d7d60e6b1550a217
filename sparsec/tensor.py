"""Tensors: a shape, a format, the per-level storage arrays (pos/crd) and vals.

Storage model (TACO's; the code generator relies on it). Level ``k`` stores mode
``format.ordering[k]`` and has size ``N_k = shape[ordering[k]]``. Positions are counted
level by level from one root position (``n_{-1} = 1``)::

    dense       no arrays          p_k = p_{k-1} * N_k + i_k          n_k = n_{k-1} * N_k
    compressed  pos, crd           children of parent p: positions pos[p] .. pos[p+1]-1,
                                   coordinates crd[...]               n_k = pos[-1] = len(crd)
    singleton   crd (n_{k-1})      p_k = p_{k-1}                      n_k = n_{k-1}

``len(vals) == n_last``; a scalar (order 0) has no levels and one value. Everything is
ordered: a unique compressed level has strictly increasing ``crd`` in each segment, a
non-unique one (COO's ``u``) non-decreasing; the coordinate tuples of a non-unique level and
its singleton chain are lexicographically sorted within a segment and strictly increasing at
the chain's unique end.

Index arrays share one dtype (int32 or int64), ``vals`` is float32 or float64, and every array
is 1-d, C-contiguous and read-only. The public constructors (``from_*``, `pack`, `as_tensor`,
`random`) validate exactly once; ``Tensor(...)`` itself only runs cheap structural checks and
takes ownership of (freezes) the arrays it is given: it is the path for storage that is valid
by construction (the packer, kernel outputs).
"""

from __future__ import annotations

import math
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import DTypeError, FormatError, InputError, ShapeError, StorageError
from .formats import Compressed, Dense, Format, LevelFormat, Singleton, default_sparse, parse_format

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
INDEX_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))
VALUE_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_SUPPORTED = "use float32 or float64"


# --------------------------------------------------------------------------- storage


@dataclass(frozen=True, slots=True, eq=False)
class LevelStorage:
    """The arrays of one level: ``pos`` (compressed only) and ``crd`` (compressed, singleton)."""

    pos: np.ndarray | None = None
    crd: np.ndarray | None = None

    def arrays(self) -> tuple[np.ndarray, ...]:
        return tuple(a for a in (self.pos, self.crd) if a is not None)


@dataclass(frozen=True, slots=True, eq=False)
class Tensor:
    """An immutable tensor in a `Format` (see the module docstring for the storage model).

    ``index_dtype`` defaults to the dtype of the index arrays, or for an all-dense tensor to
    int32 unless the shape needs int64. Equality is identity (arrays are not compared).
    """

    shape: tuple[int, ...]
    format: Format
    levels: tuple[LevelStorage, ...]
    vals: np.ndarray
    index_dtype: np.dtype = None  # type: ignore[assignment]  # resolved in __post_init__
    #: addresses of the (immutable) storage arrays, filled on first use by the kernel runtime
    _addresses: dict[tuple[str, int], int] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", check_shape(self.shape))
        object.__setattr__(self, "levels", tuple(self.levels))
        if self.index_dtype is None:
            given = [a.dtype for st in self.levels for a in st.arrays() if hasattr(a, "dtype")]
            dt = given[0] if given else choose_index_dtype(None, self.shape, ())
            object.__setattr__(self, "index_dtype", np.dtype(dt))
        else:
            object.__setattr__(self, "index_dtype", np.dtype(self.index_dtype))
        _check_structure(self.shape, self.format, self.levels, self.vals, self.index_dtype, "")
        for array in (*(a for st in self.levels for a in st.arrays()), self.vals):
            array.flags.writeable = False

    # ---- properties

    def addresses(self) -> dict[tuple[str, int], int]:
        """``(array, level) -> address`` of each storage array (``("vals", -1)`` for values).

        Computed once: the arrays are read-only and owned by this tensor, so the addresses
        stay valid as long as it lives. Kernel calls use this instead of per-call lookups.
        """
        found = self._addresses
        if found is None:
            found = {("vals", -1): self.vals.ctypes.data}
            for k, st in enumerate(self.levels):
                if st.pos is not None:
                    found[("pos", k)] = st.pos.ctypes.data
                if st.crd is not None:
                    found[("crd", k)] = st.crd.ctypes.data
            object.__setattr__(self, "_addresses", found)
        return found

    @property
    def order(self) -> int:
        return len(self.shape)

    @property
    def nnz(self) -> int:
        """Stored values, including zeros that a dense level forces."""
        return len(self.vals)

    @property
    def dtype(self) -> np.dtype:
        return self.vals.dtype

    @property
    def level_shape(self) -> tuple[int, ...]:
        """``N_k`` per level: the size of the mode each level stores."""
        return tuple(self.shape[m] for m in self.format.ordering)

    def __repr__(self) -> str:
        return (
            f"Tensor(shape={self.shape}, format={self.format}, nnz={self.nnz}, "
            f"dtype={self.dtype}, index_dtype={self.index_dtype})"
        )

    def validate(self, name: str = "") -> Tensor:
        """Check every storage invariant (vectorised); raise `StorageError` naming the fault."""
        _check_structure(self.shape, self.format, self.levels, self.vals, self.index_dtype, name)
        _check_contents(self.shape, self.format, self.levels, self.vals, name)
        return self

    # ---- conversions out

    def coords(self) -> tuple[np.ndarray, np.ndarray]:
        """Stored entries: int64 coordinates ``(order, nnz)`` in mode order, and their values."""
        return self._mode_coords(), self.vals.copy()

    def to_dense(self) -> np.ndarray:
        """A new writable numpy array in mode order with the dtype of ``vals``."""
        if self.format.is_dense:
            level_major = self.vals.reshape(self.level_shape)
            return np.array(level_major.transpose(np.argsort(self.format.ordering)), order="C")
        out = np.zeros(self.shape, dtype=self.dtype)
        out[tuple(self._mode_coords())] = self.vals
        return out

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        if copy is False:
            raise ValueError("a sparsec Tensor is converted to numpy, never viewed (copy=False)")
        dense = self.to_dense()
        return dense if dtype is None else dense.astype(dtype, copy=False)

    def to_scipy(self) -> Any:
        """A scipy sparse array: csr_array for csr, csc_array for csc, coo_array otherwise."""
        import scipy.sparse as sp

        if self.order != 2:
            raise FormatError(
                f"to_scipy needs an order-2 tensor (a matrix); this one has order {self.order}"
            )
        for preset, make in (("csr", sp.csr_array), ("csc", sp.csc_array)):
            if self.format == parse_format(preset, 2):
                st = self.levels[1]
                assert st.pos is not None and st.crd is not None
                return make((self.vals.copy(), st.crd.copy(), st.pos.copy()), shape=self.shape)
        coords = self._mode_coords()
        return sp.coo_array((self.vals.copy(), (coords[0], coords[1])), shape=self.shape)

    def to_torch(self) -> Any:
        """A dense torch tensor for dense formats, sparse CSR for csr, sparse COO otherwise."""
        import torch

        if self.format.is_dense:
            return torch.from_numpy(self.to_dense())
        values = torch.from_numpy(self.vals.copy())
        with warnings.catch_warnings():  # "sparse CSR support is in beta"
            warnings.simplefilter("ignore", UserWarning)
            if self.order == 2 and self.format == parse_format("csr", 2):
                st = self.levels[1]
                assert st.pos is not None and st.crd is not None
                pos, crd = torch.from_numpy(st.pos.copy()), torch.from_numpy(st.crd.copy())
                return torch.sparse_csr_tensor(
                    pos, crd, values, size=self.shape, check_invariants=False
                )
            coords = torch.from_numpy(self._mode_coords())
            coo = torch.sparse_coo_tensor(coords, values, size=self.shape, check_invariants=False)
            return coo.coalesce()

    def to_format(self, format: str | Format) -> Tensor:
        """This tensor in another format; the same object when the format is unchanged.

        A conversion keeps the nonzero values only (plus the zeros the target's dense levels
        force), so zeros stored by a source dense level are not carried over.
        """
        fmt = parse_format(format, self.order)
        if fmt == self.format:
            return self
        coords = self._mode_coords()
        keep = self.vals != 0
        wanted = self.index_dtype if self.index_dtype == np.int64 else None
        return pack(coords[:, keep], self.vals[keep], self.shape, fmt, wanted, self.dtype)

    def astype(self, dtype: Any = None, *, index_dtype: Any = None) -> Tensor:
        """This tensor with other value and/or index dtypes (the same object if unchanged)."""
        vdt = value_dtype(dtype) or self.dtype
        idt = index_dtype_of(index_dtype) or self.index_dtype
        if vdt == self.dtype and idt == self.index_dtype:
            return self
        choose_index_dtype(idt, self.shape, _position_counts(self.format, self.shape, self.levels))
        levels = tuple(
            LevelStorage(*(None if a is None else _cast(a, idt) for a in (st.pos, st.crd)))
            for st in self.levels
        )
        return Tensor(self.shape, self.format, levels, _cast(self.vals, vdt), idt)

    def _mode_coords(self) -> np.ndarray:
        out = np.empty((self.order, self.nnz), dtype=np.int64)
        for k, crd in enumerate(_level_coords(self)):
            out[self.format.ordering[k]] = crd
        return out

    # ---- constructors (thin wrappers, so the classmethods read as the API)

    @classmethod
    def from_dense(
        cls,
        array: Any,
        format: str | Format | None = None,
        *,
        index_dtype: Any = None,
        dtype: Any = None,
        name: str = "",
    ) -> Tensor:
        """From a numpy array, torch dense tensor or nested list; zeros are not stored except
        where a dense level forces them. Default format: dense."""
        return from_dense(array, format, index_dtype=index_dtype, dtype=dtype, name=name)

    @classmethod
    def from_scipy(
        cls,
        matrix: Any,
        format: str | Format | None = None,
        *,
        index_dtype: Any = None,
        dtype: Any = None,
        name: str = "",
    ) -> Tensor:
        """From any scipy sparse matrix/array; default format follows its type (csr, csc, coo)."""
        return from_scipy(matrix, format, index_dtype=index_dtype, dtype=dtype, name=name)

    @classmethod
    def from_torch(
        cls,
        t: Any,
        format: str | Format | None = None,
        *,
        index_dtype: Any = None,
        dtype: Any = None,
        name: str = "",
    ) -> Tensor:
        """From a dense, sparse COO, CSR or CSC torch tensor; default format follows layout."""
        return from_torch(t, format, index_dtype=index_dtype, dtype=dtype, name=name)

    @classmethod
    def from_coo(
        cls,
        coords: Any,
        values: Any,
        shape: Sequence[int],
        format: str | Format = "coo",
        *,
        index_dtype: Any = None,
        dtype: Any = None,
        name: str = "",
    ) -> Tensor:
        """From mode-order coordinates ``(order, nnz)`` (or one array per mode) and values;
        duplicates are summed, explicit zeros kept."""
        return pack(coords, values, shape, format, index_dtype, dtype, name=name)

    @classmethod
    def from_arrays(
        cls,
        shape: Sequence[int],
        format: str | Format,
        levels: Sequence[Any],
        vals: Any,
        *,
        name: str = "",
        index_dtype: Any = None,
        dtype: Any = None,
    ) -> Tensor:
        """From raw storage, validated; see `from_arrays`."""
        return from_arrays(
            shape, format, levels, vals, name=name, index_dtype=index_dtype, dtype=dtype
        )


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


def value_dtype(spec: Any) -> np.dtype | None:
    """float32/float64 from a name, numpy or torch dtype; ``None`` stays ``None``."""
    if spec is None:
        return None
    dt = _numpy_dtype(spec)
    if dt not in VALUE_DTYPES:
        raise DTypeError(f"value dtype {dt} is not supported; {_SUPPORTED}")
    return dt


def index_dtype_of(spec: Any) -> np.dtype | None:
    """int32/int64 from a name, numpy or torch dtype; ``None`` stays ``None``."""
    if spec is None:
        return None
    dt = _numpy_dtype(spec)
    if dt not in INDEX_DTYPES:
        raise DTypeError(f"index dtype {dt} is not supported; use int32 or int64")
    return dt


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
    """Values as float32/float64: integers and bools become float64 (or ``requested``);
    complex is always refused, float16/bfloat16/other floats unless ``requested`` casts them."""
    array = np.asarray(values)
    kind = array.dtype.kind
    if kind == "c" or kind not in "biuf":
        raise DTypeError(f"{_who(name)}{array.dtype} values are not supported; {_SUPPORTED}")
    if requested is not None:
        return array.astype(requested, copy=False)
    if array.dtype in VALUE_DTYPES:
        return array
    if kind in "biu":
        return array.astype(np.float64)
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


# --------------------------------------------------------------------------- reading storage


def _level_coords(t: Tensor) -> list[np.ndarray]:
    """For each level k, the coordinate ``i_k`` of every position of the last level.

    Walks down the levels keeping, per position of the current level, the coordinates of all
    levels above; a dense or compressed level expands each parent position into its children.
    """
    coords: list[np.ndarray] = []
    parent: np.ndarray | None
    n = 1
    for level, st, size in zip(t.format.levels, t.levels, t.level_shape, strict=True):
        match level:
            case Dense():
                parent = np.repeat(np.arange(n, dtype=np.int64), size)
                crd = np.tile(np.arange(size, dtype=np.int64), n)
                n *= size
            case Compressed():
                assert st.pos is not None and st.crd is not None
                parent = np.repeat(np.arange(n, dtype=np.int64), np.diff(st.pos))
                crd, n = st.crd, len(st.crd)
            case Singleton():
                assert st.crd is not None
                parent, crd = None, st.crd
            case _:
                raise FormatError(f"unknown level format {level!r}")
        if parent is not None:
            coords = [c[parent] for c in coords]
        coords.append(crd)
    return coords


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


def _assemble(
    coords: list[np.ndarray],
    values: np.ndarray,
    shape: tuple[int, ...],
    fmt: Format,
    index_dtype: np.dtype | None,
    name: str,
    *,
    presorted: bool = False,
) -> Tensor:
    """Build the levels from level-order int64 coordinates (in range) and coerced values.

    ``p`` holds, per entry, its position at the current level; ``n`` the level's position count.
    Unless ``presorted`` (sorted, no duplicate tuples) the entries are sorted and summed first.
    """
    level_shape = [shape[m] for m in fmt.ordering]
    if fmt.order == 0:
        vals = np.array([values.sum()], dtype=values.dtype)
        return Tensor(shape, fmt, (), vals, choose_index_dtype(index_dtype, (), (), name))
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
    return Tensor(shape, fmt, levels, vals, idt)


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
) -> Tensor:
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
    return _assemble(level_coords, vals, shape, fmt, index_dtype_of(index_dtype), name)


# --------------------------------------------------------------------------- constructors


def from_dense(
    array: Any,
    format: str | Format | None = None,
    *,
    index_dtype: Any = None,
    dtype: Any = None,
    name: str = "",
) -> Tensor:
    """See `Tensor.from_dense`."""
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
        return Tensor(shape, fmt, tuple(LevelStorage() for _ in fmt.levels), vals, idt)
    nonzero = np.nonzero(level_major)  # sorted in level order already
    coords = [c.astype(np.int64, copy=False) for c in nonzero]
    return _assemble(coords, level_major[nonzero], shape, fmt, idt, name, presorted=True)


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
) -> Tensor:
    """A tensor from raw storage, copied and validated.

    ``levels`` holds one entry per storage level: ``None`` for dense, ``(pos, crd)`` (or a dict
    or `LevelStorage`) for compressed, ``(None, crd)`` or a bare ``crd`` for singleton. Index
    arrays of any integer dtype are converted to the tensor's index dtype (``index_dtype``, or
    int32 unless the shape, position counts or stored values need int64); float or bool index
    arrays raise `DTypeError`. Integer or bool ``vals`` become float64.
    """
    shape = check_shape(shape, name)
    fmt = parse_format(format, len(shape), name)
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
    _check_structure(shape, fmt, storages, values, idt, name)
    _check_contents(shape, fmt, storages, values, name)
    return Tensor(shape, fmt, tuple(storages), values, idt)


# ---- scipy


def _is_scipy_sparse(obj: Any) -> bool:
    sparse = sys.modules.get("scipy.sparse")
    return sparse is not None and sparse.issparse(obj)


#: scipy formats whose (indptr, indices) are exactly a preset's level-1 (pos, crd)
_SCIPY_COMPRESSED = ("csr", "csc")


def from_scipy(
    matrix: Any,
    format: str | Format | None = None,
    *,
    index_dtype: Any = None,
    dtype: Any = None,
    name: str = "",
) -> Tensor:
    """See `Tensor.from_scipy`. csr->csr and csc->csc reuse indptr/indices (after summing
    duplicates and sorting indices on a copy when the matrix is not canonical)."""
    if not _is_scipy_sparse(matrix):
        raise InputError(f"{_who(name)}expected a scipy sparse matrix, got {type(matrix).__name__}")
    kind = matrix.format
    fast = kind in _SCIPY_COMPRESSED
    default = kind if fast else "coo"
    fmt = parse_format(default if format is None else format, len(matrix.shape), name)
    requested = value_dtype(dtype)
    if fast and fmt == parse_format(kind, 2):
        if not matrix.has_canonical_format:
            matrix = matrix.copy()
            matrix.sum_duplicates()
        data = coerce_values(matrix.data, requested, name)
        storage = [None, (matrix.indptr, matrix.indices)]
        return from_arrays(matrix.shape, fmt, storage, data, name=name, index_dtype=index_dtype)
    coo = matrix.tocoo()
    coords = np.stack([np.asarray(c) for c in coo.coords])
    data = coerce_values(coo.data, requested, name)
    return pack(coords, data, coo.shape, fmt, index_dtype, name=name)


# ---- torch


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


#: torch layout name -> (preset whose storage matches, compressed-index getter, index getter)
_TORCH_COMPRESSED = {
    "sparse_csr": ("csr", "crow_indices", "col_indices"),
    "sparse_csc": ("csc", "ccol_indices", "row_indices"),
}


def from_torch(
    t: Any,
    format: str | Format | None = None,
    *,
    index_dtype: Any = None,
    dtype: Any = None,
    name: str = "",
) -> Tensor:
    """See `Tensor.from_torch`. Hybrid tensors (dense value dimensions) are refused."""
    import torch

    if not isinstance(t, torch.Tensor):
        raise InputError(f"{_who(name)}expected a torch tensor, got {type(t).__name__}")
    layout = str(t.layout).removeprefix("torch.")
    requested = value_dtype(dtype)
    if layout == "strided":
        return from_dense(t, format, index_dtype=index_dtype, dtype=dtype, name=name)
    if t.dense_dim() > 0:
        raise FormatError(
            f"{_who(name)}hybrid sparse tensors (dense value dimensions) are not supported"
        )
    t = t.detach().cpu()
    if layout in _TORCH_COMPRESSED:
        preset, pos_of, crd_of = _TORCH_COMPRESSED[layout]
        fmt = parse_format(preset if format is None else format, t.dim(), name)
        if fmt == parse_format(preset, 2):
            storage = [None, (getattr(t, pos_of)().numpy(), getattr(t, crd_of)().numpy())]
            data = coerce_values(_torch_numpy(t.values(), requested, name), requested, name)
            try:
                return from_arrays(t.shape, fmt, storage, data, name=name, index_dtype=index_dtype)
            except StorageError:  # unsorted or duplicate indices: fall back to packing
                pass
    else:
        fmt = parse_format("coo" if format is None else format, t.dim(), name)
    coo = t.to_sparse_coo().coalesce()
    data = coerce_values(_torch_numpy(coo.values(), requested, name), requested, name)
    return pack(coo.indices().numpy(), data, tuple(t.shape), fmt, index_dtype, name=name)


# ---- anything


def as_tensor(
    obj: Any,
    format: str | Format | None = None,
    *,
    name: str = "",
    index_dtype: Any = None,
    dtype: Any = None,
) -> Tensor:
    """The `Tensor` for a numpy array, scipy sparse matrix, torch tensor, Tensor, number or
    nested list. A Tensor is converted only if its format or a requested dtype differs."""
    if isinstance(obj, Tensor):
        converted = obj if format is None else obj.to_format(parse_format(format, obj.order, name))
        return converted.astype(dtype, index_dtype=index_dtype)
    kwargs: dict[str, Any] = {"index_dtype": index_dtype, "dtype": dtype, "name": name}
    if _is_scipy_sparse(obj):
        return from_scipy(obj, format, **kwargs)
    if _is_torch_tensor(obj):
        return from_torch(obj, format, **kwargs)
    if isinstance(obj, (np.ndarray, np.generic, int, float, complex, list, tuple)):
        return from_dense(obj, format, **kwargs)
    raise InputError(
        f"tensor {name!r} must be a numpy array, scipy sparse matrix, torch tensor, sparsec "
        f"Tensor or number, not {type(obj).__name__}"
    )


# --------------------------------------------------------------------------- random


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
    """``k`` distinct sorted integers from ``range(total)``, every k-subset equally likely.

    A dense request shuffles the range; a sparse one draws with replacement, keeps the
    distinct values and repeats until there are enough, then keeps a random k of them (the
    set of distinct draws is a uniform subset of its size, by symmetry).
    """
    if k == 0:
        return np.zeros(0, dtype=np.int64)
    if 4 * k >= total:
        return np.sort(rng.choice(total, size=k, replace=False))
    found = np.zeros(0, dtype=np.int64)
    while len(found) < k:
        extra = rng.integers(0, total, size=k - len(found) + k // 16 + 16)
        found = np.sort(np.concatenate([found, extra]))
        found = found[np.concatenate(([True], found[1:] != found[:-1]))]
    if len(found) > k:
        found = found[np.sort(rng.permutation(len(found))[:k])]
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
) -> Tensor:
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
    if integer:
        values = (rng.integers(1, 5, size=nnz) * rng.choice([-1, 1], size=nnz)).astype(vdt)
    else:
        values = rng.uniform(-1.0, 1.0, size=nnz).astype(vdt)
        values[values == 0] = 0.5
    return pack(coords, values, shape, fmt, index_dtype)
