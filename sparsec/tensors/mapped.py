"""Tensors in a mapped format (`maps.MappedFormat`: BSR, N:M, a spelled-out map).

A `MappedTensor` is a shape in dimensions, its `MappedFormat`, and ``inner``: the ordinary
`Tensor` over its levels (the level space: ``bsr(4,4)`` of a 64 x 32 matrix is a 16 x 8 x 4 x
4 tensor in ``dsdd``). Kernels read ``inner`` (`sparsec.middle.demap`); everything a user
sees -- shape, entries, `to_dense`, the scipy and torch conversions -- is in dimensions.

Packing from entries (`pack_mapped`) sums duplicates in dimension space, then computes each
level's coordinate from its expression; a slot level numbers the entries of each parent in
order of the levels below it, and a parent with more entries than the slot's width is
refused (three entries in a group of a 2:4 tensor). Stored entries, explicit zeros included,
stay entries; a block's cells that hold no entry are stored zeros (the dense levels force
them), and a group of an N:M tensor with fewer than N entries is padded (coordinate 0 of the
group, value 0: harmless to ``+`` and ``*``, refused under other semirings as every padded
singleton is).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..base.errors import FormatError, InputError, StorageError
from . import packing
from .convert import _is_scipy_sparse
from .formats import Format, parse_format
from .maps import MAPPED, MappedFormat, looks_mapped, parse_mapped
from .ops import ArrayOps
from .storage import StorageParts, _is_torch_tensor, check_shape, coerce_values, value_dtype
from .tensor import Tensor, as_tensor


@dataclass(frozen=True, slots=True, eq=False)
class MappedTensor(ArrayOps):
    """An immutable tensor whose format maps dimensions to levels (see the module). Its
    operators (``@ + - * .T .sum``) are `Tensor`'s (`sparsec.api.array`), each a kernel
    over the format."""

    shape: tuple[int, ...]
    format: MappedFormat
    #: the level-space tensor kernels read (a `sparsec.Tensor`)
    inner: Any

    @property
    def order(self) -> int:
        return len(self.shape)

    @property
    def nnz(self) -> int:
        """Stored values (a block's forced zeros and an N:M tensor's padding included)."""
        return self.inner.nnz

    @property
    def dtype(self) -> np.dtype:
        return self.inner.dtype

    @property
    def index_dtype(self) -> np.dtype:
        return self.inner.index_dtype

    @property
    def vals(self) -> np.ndarray:
        return self.inner.vals

    def __repr__(self) -> str:
        return (
            f"MappedTensor(shape={self.shape}, format={self.format}, nnz={self.nnz}, "
            f"dtype={self.dtype})"
        )

    def coords(self) -> tuple[np.ndarray, np.ndarray]:
        """Stored entries: int64 dimension coordinates ``(order, nnz)`` and their values
        (an N:M tensor's padding included, as stored zeros)."""
        level_coords, vals = self.inner.coords()
        return self.format.dim_coords(list(level_coords)), vals

    def to_dense(self) -> np.ndarray:
        coords, vals = self.coords()
        out = np.zeros(self.shape, dtype=self.dtype)
        np.add.at(out, tuple(coords), vals)  # padding adds zeros
        return out

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        if copy is False:
            raise ValueError("a sparsec tensor is converted to numpy, never viewed (copy=False)")
        dense = self.to_dense()
        return dense if dtype is None else dense.astype(dtype, copy=False)

    def blocksize(self) -> tuple[int, int] | None:
        """(R, C) when this is a ``bsr(R,C)`` matrix, else None."""
        if self.format.name.startswith("bsr("):
            blocks = self.format.blocks()
            return blocks[0], blocks[1]
        return None

    def to_scipy(self) -> Any:
        """A scipy ``bsr_array`` for bsr (the same blocks), a ``csr_array`` otherwise."""
        import scipy.sparse as sp

        block = self.blocksize()
        if block is not None:
            st = self.inner.levels[1]
            data = self.inner.vals.reshape(-1, *block).copy()
            return sp.bsr_array((data, st.crd.copy(), st.pos.copy()), shape=self.shape)
        if self.order != 2:
            raise FormatError(f"to_scipy needs a matrix; this tensor has order {self.order}")
        coords, vals = self.coords()
        return sp.coo_array((vals, (coords[0], coords[1])), shape=self.shape).tocsr()

    def to_torch(self) -> Any:
        """A torch ``sparse_bsr`` tensor for bsr (the same blocks), sparse COO otherwise."""
        import torch

        block = self.blocksize()
        with warnings.catch_warnings():  # "sparse BSR support is in beta"
            warnings.simplefilter("ignore", UserWarning)
            if block is not None:
                st = self.inner.levels[1]
                values = torch.from_numpy(self.inner.vals.reshape(-1, *block).copy())
                pos, crd = torch.from_numpy(st.pos.copy()), torch.from_numpy(st.crd.copy())
                return torch.sparse_bsr_tensor(pos, crd, values, size=self.shape)
            coords, vals = self.coords()
            coo = torch.sparse_coo_tensor(
                torch.from_numpy(coords), torch.from_numpy(vals), size=self.shape
            )
            return coo.coalesce()

    def to_format(self, format: str | Format | MappedFormat) -> Any:
        """This tensor in another format (mapped or not); the same object when unchanged."""
        if looks_mapped(format):
            fmt = parse_mapped(format, self.order)  # type: ignore[arg-type]
            if fmt == self.format:
                return self
        coords, vals = self.coords()
        return pack_any(coords, vals, self.shape, format, self.index_dtype, self.dtype)

    def astype(self, dtype: Any = None, *, index_dtype: Any = None) -> MappedTensor:
        inner = self.inner.astype(dtype, index_dtype=index_dtype)
        return self if inner is self.inner else MappedTensor(self.shape, self.format, inner)


def _own(parts: StorageParts) -> Tensor:
    return Tensor(parts.shape, parts.format, parts.levels, parts.vals, parts.index_dtype)


def pack_any(
    coords: Any,
    vals: Any,
    shape: Sequence[int],
    format: Any,
    index_dtype: Any = None,
    dtype: Any = None,
    name: str = "",
) -> Any:
    """A `MappedTensor` for a mapped format, else a `Tensor` (from dimension coordinates)."""
    if looks_mapped(format):
        fmt = parse_mapped(format, len(shape), name)
        if isinstance(fmt, MappedFormat):
            return pack_mapped(coords, vals, shape, fmt, index_dtype, dtype, name)
        format = fmt
    return _own(packing.pack(coords, vals, shape, format, index_dtype, dtype, name=name))


def pack_mapped(
    coords: Any,
    values: Any,
    shape: Sequence[int],
    fmt: MappedFormat,
    index_dtype: Any = None,
    dtype: Any = None,
    name: str = "",
) -> MappedTensor:
    """From dimension-order entries (`pack_any`'s arguments); see the module for the rules."""
    shape = check_shape(shape, name)
    fmt.check_shape(shape, name)
    vals = coerce_values(values, value_dtype(dtype), name)
    c = packing._coords_array(coords, len(shape), len(vals), name)
    for mode, size in enumerate(shape):  # range first: a level's coordinate would hide it
        row = c[mode]
        if row.size and (row.min() < 0 or row.max() >= size):
            raise StorageError(
                f"{_who(name)}a coordinate of mode {mode} is out of range [0, {size})"
            )
    if len(vals):  # sum duplicates in dimension space, in row-major order of dimensions
        key = np.ravel_multi_index(tuple(c), shape)
        unique, inverse = np.unique(key, return_inverse=True)
        summed = np.zeros(len(unique), dtype=vals.dtype)
        np.add.at(summed, inverse, vals)
        c = np.stack(np.unravel_index(unique, shape)).astype(np.int64)
        vals = summed
    level = fmt.level_coords(c)
    for k in fmt.slots():
        level[k] = _slot_numbers(level, k, fmt.exprs[k].block, fmt, name)
    level_shape = fmt.level_shape(shape)
    parts = packing.pack(
        np.stack([c for c in level if c is not None]),
        vals,
        level_shape,
        fmt.inner,
        index_dtype,
        None,
        name=name,
    )
    return MappedTensor(tuple(shape), fmt, _own(parts))


def _slot_numbers(level: list[Any], k: int, width: int, fmt: MappedFormat, name: str) -> Any:
    """Slot level ``k``'s coordinates: each entry's rank among the entries with the same
    coordinates above ``k``, in order of the levels below it."""
    n = len(level[0]) if level else 0
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    above = [level[j] for j in range(k)]
    below = [level[j] for j in range(k + 1, len(level))]
    order = np.lexsort(tuple(reversed(above + below)))
    keys = np.stack([a[order] for a in above]) if above else np.zeros((1, n), dtype=np.int64)
    new = np.ones(n, dtype=bool)
    new[1:] = (keys[:, 1:] != keys[:, :-1]).any(axis=0)
    starts = np.flatnonzero(new)
    rank_sorted = np.arange(n) - np.repeat(starts, np.diff(np.append(starts, n)))
    if rank_sorted.max() >= width:
        at = int(order[int(np.argmax(rank_sorted >= width))])
        group = tuple(int(a[at]) for a in above)
        raise StorageError(
            f"{_who(name)}{fmt.name} stores at most {width} entries per group, but the group at "
            f"level coordinates {group} holds more; prune it to {width} (e.g. "
            "sparsec.nn.masks.nm_mask) or choose another format"
        )
    slots = np.empty(n, dtype=np.int64)
    slots[order] = rank_sorted
    return slots


def from_dense(
    array: Any, fmt: MappedFormat, index_dtype: Any = None, dtype: Any = None, name: str = ""
) -> MappedTensor:
    """Nonzeros of a numpy array, torch tensor or nested list, in ``fmt``."""
    requested = value_dtype(dtype)
    if _is_torch_tensor(array):
        array = array.detach().cpu().numpy()
    try:
        values = coerce_values(np.asarray(array), requested, name)
    except (TypeError, ValueError) as err:
        raise InputError(f"{_who(name)}cannot be read as an array: {err}") from None
    nonzero = np.nonzero(values)
    coords = np.stack([c.astype(np.int64) for c in nonzero]) if values.ndim else None
    if coords is None:
        raise FormatError(
            f"{_who(name)}{fmt.name} needs a tensor of order {fmt.order}, not a scalar"
        )
    return pack_mapped(coords, values[nonzero], values.shape, fmt, index_dtype, None, name)


def from_scipy(
    matrix: Any, fmt: MappedFormat, index_dtype: Any = None, dtype: Any = None, name: str = ""
) -> MappedTensor:
    """A scipy sparse matrix in ``fmt``; a ``bsr_array`` of the same blocks keeps its pattern
    (explicit zero blocks included) and values."""
    block = _bsr_block(fmt)
    if matrix.format == "bsr" and block is not None and tuple(matrix.blocksize) == block:
        m = matrix.copy()
        m.sum_duplicates()  # sorts the block indices, sums repeated blocks
        return _from_blocks(m.shape, fmt, m.indptr, m.indices, m.data, index_dtype, dtype, name)
    coo = matrix.tocoo()
    coords = np.stack([np.asarray(x, dtype=np.int64) for x in coo.coords])
    return pack_mapped(coords, coo.data, coo.shape, fmt, index_dtype, dtype, name)


def from_torch(
    t: Any, fmt: MappedFormat, index_dtype: Any = None, dtype: Any = None, name: str = ""
) -> MappedTensor:
    """A torch tensor (dense, COO, CSR, BSR) in ``fmt``; a ``sparse_bsr`` of the same blocks
    keeps its pattern and values."""
    import torch

    t = t.detach().cpu()
    if t.layout == torch.strided:
        return from_dense(t, fmt, index_dtype, dtype, name)
    block = _bsr_block(fmt)
    if t.layout == torch.sparse_bsr and block is not None and tuple(t.values().shape[1:]) == block:
        return _from_blocks(
            tuple(t.shape),
            fmt,
            t.crow_indices().numpy(),
            t.col_indices().numpy(),
            t.values().numpy(),
            index_dtype,
            dtype,
            name,
        )
    coo = t.to_sparse_coo().coalesce()
    return pack_mapped(
        coo.indices().numpy(), coo.values().numpy(), tuple(t.shape), fmt, index_dtype, dtype, name
    )


def _bsr_block(fmt: MappedFormat) -> tuple[int, int] | None:
    if not fmt.name.startswith("bsr("):
        return None
    blocks = fmt.blocks()
    return blocks[0], blocks[1]


def _from_blocks(
    shape: Sequence[int],
    fmt: MappedFormat,
    indptr: Any,
    indices: Any,
    data: Any,
    index_dtype: Any,
    dtype: Any,
    name: str,
) -> MappedTensor:
    """A bsr tensor from block-row pointers, block columns and ``(blocks, R, C)`` values."""
    shape = check_shape(shape, name)
    fmt.check_shape(shape, name)
    vals = np.ascontiguousarray(np.asarray(data)).reshape(-1)
    levels = [None, (np.asarray(indptr), np.asarray(indices)), None, None]
    parts = packing.from_arrays(
        fmt.level_shape(shape),
        fmt.inner,
        levels,
        vals,
        name=name,
        index_dtype=index_dtype,
        dtype=dtype,
    )
    return MappedTensor(tuple(shape), fmt, _own(parts))


def as_mapped(
    obj: Any, fmt: MappedFormat, name: str = "", index_dtype: Any = None, dtype: Any = None
) -> MappedTensor:
    """Any tensor a user may pass (MappedTensor, sparsec Tensor, scipy, torch, numpy,
    nested list) in ``fmt``."""
    if isinstance(obj, MappedTensor):
        converted = obj if obj.format == fmt else obj.to_format(fmt)
        return converted.astype(dtype, index_dtype=index_dtype)
    if isinstance(obj, Tensor):
        coords, vals = obj.coords()
        return pack_mapped(
            coords, vals, obj.shape, fmt, index_dtype or obj.index_dtype, dtype, name
        )
    if _is_scipy_sparse(obj):
        return from_scipy(obj, fmt, index_dtype, dtype, name)
    if _is_torch_tensor(obj):
        return from_torch(obj, fmt, index_dtype, dtype, name)
    return from_dense(obj, fmt, index_dtype, dtype, name)


def resolve(format: Any, order: int, name: str = "") -> MappedFormat | None:
    """The `MappedFormat` a spec names, or None for a plain format."""
    if not looks_mapped(format):
        return None
    fmt = parse_mapped(format, order, name)
    return fmt if isinstance(fmt, MappedFormat) else None


def _who(name: str) -> str:
    return f"tensor {name!r}: " if name else ""


def construct(kind: str, plain: Any, obj: Any, format: Any, options: dict[str, Any]) -> Any:
    """The public constructors' call for a mapped ``format`` (`maps.MAPPED`): ``kind`` says
    which ("dense", "scipy", "torch", "coo": ``obj`` is (coords, values), "as": any
    tensor); a map that only permutes is a plain format, made by ``plain``."""
    name = options.get("name", "")
    index_dtype, dtype = options.get("index_dtype"), options.get("dtype")
    if kind == "coo":
        coords, values = obj
        return pack_any(coords, values, options["shape"], format, index_dtype, dtype, name)
    if kind == "as":
        return as_any(obj, format, name, index_dtype, dtype)
    order = len(getattr(obj, "shape", None) or np.shape(obj))
    fmt = parse_mapped(format, order, name)
    if not isinstance(fmt, MappedFormat):
        return plain(obj, fmt, **options)
    make = {"dense": from_dense, "scipy": from_scipy, "torch": from_torch}[kind]
    return make(obj, fmt, index_dtype, dtype, name)


def as_any(obj: Any, format: Any, name: str, index_dtype: Any, dtype: Any) -> Any:
    """`sparsec.as_tensor` where a mapped format or tensor is involved."""
    if format is None:  # a MappedTensor kept in its format
        return obj.astype(dtype, index_dtype=index_dtype)
    order = len(getattr(obj, "shape", None) or np.shape(obj))
    fmt = parse_mapped(format, order, name) if looks_mapped(format) else format
    if isinstance(fmt, MappedFormat):
        return as_mapped(obj, fmt, name, index_dtype, dtype)
    if isinstance(obj, MappedTensor):  # to a plain format
        made = obj.to_format(parse_format(fmt, order, name))
        return made.astype(dtype, index_dtype=index_dtype)
    return as_tensor(obj, fmt, name=name, index_dtype=index_dtype, dtype=dtype)


MAPPED.append(construct)
