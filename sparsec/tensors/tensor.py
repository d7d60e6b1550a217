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
`random`) validate exactly once, all through `validate_storage` (storage built by the packer
as well as storage given by the user); ``Tensor(...)`` itself only runs cheap structural
checks and takes ownership of (freezes) the arrays it is given: it is the path for storage
already validated or valid by construction (kernel outputs).

Modules, in import order: `storage` (LevelStorage, StorageParts, dtypes, validation) <- `packing`
(pack, from_dense, from_arrays) <- `random` <- `convert` (scipy, torch) <- this one. The lower
modules return validated `StorageParts`; this one alone builds a `Tensor` (`_builds_tensor`),
adds `as_tensor` and re-exports the public names (``from sparsec.tensors.tensor import ...``).
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import update_wrapper
from typing import Any, ParamSpec

import numpy as np

from ..base.errors import FormatError
from . import convert, packing
from .buffers import address
from .formats import Compressed, Dense, Format, Singleton, canonical, parse_format
from .halves import HALF_TENSOR, half_name, half_request
from .maps import MAPPED, looks_mapped
from .ops import ArrayOps, check_dense, densify_check
from .random import random as _random_storage
from .storage import (
    INDEX_DTYPES,
    INT32_MAX,
    INT64_MAX,
    VALUE_DTYPES,
    LevelStorage,
    StorageParts,
    _cast,
    _check_structure,
    _position_counts,
    check_fill,
    check_shape,
    choose_index_dtype,
    coerce_values,
    index_dtype_of,
    same_fill,
    validate_storage,
    value_dtype,
)

__all__ = [
    "INDEX_DTYPES",
    "INT32_MAX",
    "INT64_MAX",
    "VALUE_DTYPES",
    "LevelStorage",
    "StorageParts",
    "Tensor",
    "as_tensor",
    "check_shape",
    "choose_index_dtype",
    "coerce_values",
    "from_arrays",
    "from_dense",
    "from_scipy",
    "from_torch",
    "index_dtype_of",
    "pack",
    "random",
    "value_dtype",
]

_P = ParamSpec("_P")


def _own(parts: StorageParts) -> Tensor:
    """The `Tensor` taking ownership of (freezing) storage its producer has validated."""
    return Tensor(
        parts.shape, parts.format, parts.levels, parts.vals, parts.index_dtype, parts.fill_value
    )


def _builds_tensor(make_storage: Callable[_P, StorageParts]) -> Callable[_P, Tensor]:
    """The `Tensor` constructor for a function returning validated `StorageParts`: the same
    parameters, name and docstring, the parts owned by a new `Tensor`."""

    def build(*args: _P.args, **kwargs: _P.kwargs) -> Tensor:
        half = half_request(kwargs.get("dtype"), args[0] if args else None)
        if half is None:
            return _own(make_storage(*args, **kwargs))
        kwargs["dtype"] = "float64"  # exact for 16-bit sources; rounded once below
        return HALF_TENSOR[-1](_own(make_storage(*args, **kwargs)), half)

    update_wrapper(build, make_storage, assigned=("__name__", "__qualname__", "__doc__"))
    signature = inspect.signature(make_storage).replace(return_annotation="Tensor")
    build.__signature__ = signature  # type: ignore[attr-defined]  # help() shows a Tensor
    return build


def _or_mapped(plain: Callable[..., Tensor], kind: str) -> Callable[..., Any]:
    """The constructor ``plain``, which hands a mapped format to `MAPPED`."""

    def build(obj: Any, format: Any = None, **options: Any) -> Any:
        if looks_mapped(format):
            return MAPPED[-1](kind, plain, obj, format, options)
        return plain(obj, format, **options)

    update_wrapper(build, plain, assigned=("__name__", "__qualname__", "__doc__"))
    build.__signature__ = inspect.signature(plain)  # type: ignore[attr-defined]
    return build


@dataclass(frozen=True, slots=True, eq=False)
class Tensor(ArrayOps):
    """An immutable tensor in a `Format` (see the module docstring for the storage model).

    ``index_dtype`` defaults to the dtype of the index arrays, or for an all-dense tensor to
    int32 unless the shape needs int64. Equality is identity (arrays are not compared).
    """

    shape: tuple[int, ...]
    format: Format
    levels: tuple[LevelStorage, ...]
    vals: np.ndarray
    index_dtype: np.dtype = None  # type: ignore[assignment]  # resolved in __post_init__
    #: the value of every absent entry (pydata sparse's and Finch's ``fill_value``), what
    #: `to_dense` writes there; None: the absent value of the kernel reading it (0, or a
    #: semiring's identity), 0 in `to_dense`. A kernel reads a tensor whose fill is another
    #: value as dense (docs/semantics.md, "Fill values")
    fill_value: Any = None
    #: addresses of the (immutable) storage arrays, filled on first use by the kernel runtime
    _addresses: dict[tuple[str, int], int] | None = field(
        default=None, init=False, repr=False, compare=False
    )
    #: device copies of the storage arrays for ``target="cuda"``, made on first use and
    #: kept while the tensor lives (the arrays are immutable)
    _device: dict[tuple[str, int], Any] | None = field(
        default=None, init=False, repr=False, compare=False
    )
    #: derived copies (`derived`) by (pattern of repeated modes, format), made on first use
    #: and kept while the tensor lives; `__reduce__` leaves them out
    _derived: dict[tuple[tuple[int, ...], Format], Tensor] | None = field(
        default=None, init=False, repr=False, compare=False
    )
    #: copies with 16-bit values (`sparsec.tensors.stored`) by value dtype, made on first use
    _stored: dict[str, Tensor] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", check_shape(self.shape))
        if isinstance(self.format, Format):  # else _check_structure reports it
            object.__setattr__(self, "format", canonical(self.format))
        object.__setattr__(self, "levels", tuple(self.levels))
        if self.index_dtype is None:
            given = [a.dtype for st in self.levels for a in st.arrays() if hasattr(a, "dtype")]
            dt = given[0] if given else choose_index_dtype(None, self.shape, ())
            object.__setattr__(self, "index_dtype", np.dtype(dt))
        else:
            object.__setattr__(self, "index_dtype", np.dtype(self.index_dtype))
        _check_structure(self.shape, self.format, self.levels, self.vals, self.index_dtype, "")
        object.__setattr__(self, "fill_value", check_fill(self.fill_value, self.vals.dtype))
        for array in (*(a for st in self.levels for a in st.arrays()), self.vals):
            array.flags.writeable = False

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled and copied as its storage alone: the cached addresses and device copies
        belong to the process (and the arrays) they were taken from. The copy is built by
        the trusted constructor, which freezes its arrays (a pickle brings them back
        writable) and fills the caches anew on first use."""
        fields = (self.shape, self.format, self.levels, self.vals, self.index_dtype)
        return (type(self), (*fields, self.fill_value))

    # ---- properties

    def addresses(self) -> dict[tuple[str, int], int]:
        """``(array, level) -> address`` of each storage array (``("vals", -1)`` for values).

        Computed once: the arrays are read-only and owned by this tensor, so the addresses
        stay valid as long as it lives. Kernel calls use this instead of per-call lookups.
        """
        found = self._addresses
        if found is None:
            found = {("vals", -1): address(self.vals)}
            for k, st in enumerate(self.levels):
                if st.pos is not None:
                    found[("pos", k)] = address(st.pos)
                if st.crd is not None:
                    found[("crd", k)] = address(st.crd)
            object.__setattr__(self, "_addresses", found)
        return found

    def device_array(self, field_name: str, level: int, to_device: Any) -> Any:
        """The storage array ``field_name`` (``pos``, ``crd``; ``vals`` at level -1) on the
        GPU, copied by ``to_device`` once per tensor."""
        found = self._device
        if found is None:
            found = {}
            object.__setattr__(self, "_device", found)
        key = (field_name, level)
        array = found.get(key)
        if array is None:
            host = self.vals if field_name == "vals" else getattr(self.levels[level], field_name)
            array = found[key] = to_device(host)
        return array

    def keep_device_arrays(self, arrays: dict[tuple[str, int], Any]) -> None:
        """Device copies of this tensor's storage arrays that already exist (a sparse
        output computed on the GPU: the arrays the kernel wrote), kept as `device_array`
        would keep its own copies, so the next CUDA call reads them with no upload."""
        found = self._device
        if found is None:
            found = {}
            object.__setattr__(self, "_device", found)
        found.update(arrays)

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
        fill = "" if self.fill_value is None else f", fill_value={self.fill_value!r}"
        return (
            f"Tensor(shape={self.shape}, format={self.format}, nnz={self.nnz}, "
            f"dtype={self.dtype}, index_dtype={self.index_dtype}{fill})"
        )

    def validate(self, name: str = "") -> Tensor:
        """Check every storage invariant (vectorised); raise `StorageError` naming the fault."""
        validate_storage(self.shape, self.format, self.levels, self.vals, self.index_dtype, name)
        return self

    # ---- conversions out

    def coords(self) -> tuple[np.ndarray, np.ndarray]:
        """Stored entries: int64 coordinates ``(order, nnz)`` in mode order, and their values."""
        return self._mode_coords(), self.vals.copy()

    def to_dense(self) -> np.ndarray:
        """A new writable numpy array in mode order with the dtype of ``vals``; an
        `InputError` when it would not fit in memory (`ops.check_dense`)."""
        check_dense(self)
        if self.format.is_dense:
            level_major = self.vals.reshape(self.level_shape)
            return np.array(level_major.transpose(np.argsort(self.format.ordering)), order="C")
        out = np.full(self.shape, self.fill_value or 0, dtype=self.dtype)
        out[tuple(self._mode_coords())] = self.vals
        return out

    def with_fill_value(self, fill_value: Any) -> Tensor:
        """The same stored entries, with ``fill_value`` as every absent entry's value."""
        if same_fill(fill_value, self.fill_value):
            return self
        return Tensor(self.shape, self.format, self.levels, self.vals, self.index_dtype, fill_value)

    def _no_fill(self, into: str) -> None:
        if self.fill_value:
            raise FormatError(
                f"{into} stores absent entries as 0, and this tensor's are {self.fill_value!r}: "
                "call to_dense(), or with_fill_value(0) to read them as 0"
            )

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        if copy is False:
            raise ValueError("a sparsec Tensor is converted to numpy, never viewed (copy=False)")
        densify_check()
        dense = self.to_dense()
        return dense if dtype is None else dense.astype(dtype, copy=False)

    def to_scipy(self) -> Any:
        """A scipy sparse array: csr_array for csr, csc_array for csc, coo_array otherwise."""
        import scipy.sparse as sp

        self._no_fill("a scipy sparse array")
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
        self._no_fill("a torch sparse tensor")
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

        Every stored entry is kept, its explicit zeros too (those a source dense level
        holds included): presence is what semirings, masks and gradient patterns read. The
        target may store more: the zeros its dense levels force, a padded singleton's filler.
        `eliminate_zeros` drops stored zeros explicitly.
        """
        if looks_mapped(format):
            return MAPPED[-1]("as", None, self, format, {"index_dtype": self.index_dtype})
        fmt = parse_format(format, self.order)
        if fmt == self.format:
            return self
        wanted = self.index_dtype if self.index_dtype == np.int64 else None
        coords, vals = self._mode_coords(), self.vals
        if fmt.is_dense and self.fill_value:  # every entry stored: the fill written there
            coords, vals = (
                np.indices(self.shape).reshape(self.order, -1),
                self.to_dense().reshape(-1),
            )
        packed = pack(coords, vals, self.shape, fmt, wanted, self.dtype)
        return packed.with_fill_value(self.fill_value)

    def eliminate_zeros(self) -> Tensor:
        """This tensor without its stored entries equal to its fill value (zeros, scipy's
        name, for the usual fill 0), in the same format; the same object when it stores
        none. Those a dense level forces (or a padded singleton's filler) stay: the format
        stores them wherever it stores a parent."""
        fill = self.fill_value or 0
        keep = ~np.isnan(self.vals) if fill != fill else self.vals != fill
        if keep.all():
            return self
        coords = self._mode_coords()[:, keep]
        wanted = self.index_dtype if self.index_dtype == np.int64 else None
        kept = pack(coords, self.vals[keep], self.shape, self.format, wanted, self.dtype)
        return kept.with_fill_value(self.fill_value)

    def derived(self, indices: tuple[str, ...], format: Format) -> Tensor:
        """This tensor read as ``indices`` and stored in ``format`` (`convert.derive_entries`:
        the diagonal where a variable repeats, else a re-layout), made once per pattern and
        format and kept: the tensor is immutable, so a kernel called with it again reuses
        the copy. Every stored entry is carried over, zeros included: a dense level's
        entries under a stored parent are present to the lattice (a zero times an infinite
        divisor is NaN there), so the copy keeps them, as sparse ones (`derive._same_entries`
        makes such levels compressed in the copy)."""
        key = (tuple(indices.index(v) for v in indices), format)
        cache = self._derived
        if cache is None:
            cache = {}
            object.__setattr__(self, "_derived", cache)
        found = cache.get(key)
        if found is None:
            coords, vals = self._mode_coords(), self.vals
            parts = convert.derive_entries(
                self.shape, coords, vals, indices, format, self.index_dtype
            )
            found = cache[key] = _own(parts)
        return found

    def astype(self, dtype: Any = None, *, index_dtype: Any = None) -> Tensor:
        """This tensor with other value and/or index dtypes (the same object if unchanged);
        float16/bfloat16 round once and stay 16-bit, as a 16-bit tensor does unless told."""
        half = half_name(dtype) if dtype is not None else getattr(self, "value_dtype", None)
        if half is not None:
            return HALF_TENSOR[-1](self, half, index_dtype_of(index_dtype))
        vdt = value_dtype(dtype) or self.vals.dtype
        idt = index_dtype_of(index_dtype) or self.index_dtype
        if vdt == self.vals.dtype and idt == self.index_dtype and type(self) is Tensor:
            return self
        choose_index_dtype(idt, self.shape, _position_counts(self.format, self.shape, self.levels))
        levels = tuple(
            LevelStorage(*(None if a is None else _cast(a, idt) for a in (st.pos, st.crd)))
            for st in self.levels
        )
        fill = self.fill_value
        fill = None if fill is None else np.asarray(fill).astype(vdt).item()  # as the values
        return Tensor(self.shape, self.format, levels, _cast(self.vals, vdt), idt, fill)

    def _mode_coords(self) -> np.ndarray:
        out = np.empty((self.order, self.nnz), dtype=np.int64)
        for k, crd in enumerate(_level_coords(self)):
            out[self.format.ordering[k]] = crd
        return out

    # ---- constructors: the storage builders of `packing` and `convert`, owned by a Tensor

    # a mapped format (bsr, nm) makes a `sparsec.tensors.mapped.MappedTensor`
    from_dense = staticmethod(_or_mapped(_builds_tensor(packing.from_dense), "dense"))
    from_arrays = staticmethod(_builds_tensor(packing.from_arrays))
    from_scipy = staticmethod(_or_mapped(_builds_tensor(convert.from_scipy), "scipy"))
    from_torch = staticmethod(_or_mapped(_builds_tensor(convert.from_torch), "torch"))

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
        fill_value: Any = None,
    ) -> Tensor:
        """From mode-order coordinates ``(order, nnz)`` (or one array per mode) and values;
        duplicates are summed, explicit zeros kept; absent entries are ``fill_value``."""
        if looks_mapped(format):
            options = {"shape": shape, "index_dtype": index_dtype, "dtype": dtype, "name": name}
            return MAPPED[-1]("coo", None, (coords, values), format, options)
        packed = pack(coords, values, shape, format, index_dtype, dtype, name=name)
        return packed.with_fill_value(fill_value)


pack = _builds_tensor(packing.pack)
random = _builds_tensor(_random_storage)
from_dense = Tensor.from_dense
from_arrays = Tensor.from_arrays
from_scipy = Tensor.from_scipy
from_torch = Tensor.from_torch


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
    if looks_mapped(format) or type(obj).__name__ == "MappedTensor":
        options = {"name": name, "index_dtype": index_dtype, "dtype": dtype}
        return MAPPED[-1]("as", None, obj, format, options)
    if isinstance(obj, Tensor):
        converted = obj if format is None else obj.to_format(parse_format(format, obj.order, name))
        return converted.astype(dtype, index_dtype=index_dtype)
    half = half_request(dtype, obj)
    if half is not None:  # exact for 16-bit sources, rounded once by _as_half
        dtype = "float64"
    made = _own(convert.storage_of(obj, format, name, index_dtype=index_dtype, dtype=dtype))
    return made if half is None else HALF_TENSOR[-1](made, half)


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
