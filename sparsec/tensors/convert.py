"""Conversions in: scipy sparse and torch (dense, COO, CSR, CSC) to tensor storage.

csr/csc inputs whose target is the matching preset reuse indptr/indices through `from_arrays`;
everything else goes through `pack` as COO. Like the packers, these return `StorageParts`:
`sparsec.tensors.tensor` wraps them in a `Tensor` under the same names and adds `as_tensor`
(which passes a `Tensor` through and hands anything else to `storage_of`). The conversions out
(`to_scipy`, `to_torch`, `to_dense`) are `Tensor` methods.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from ..base.errors import FormatError, InputError, StorageError
from .formats import Format, parse_format
from .packing import from_arrays, from_dense, pack
from .storage import (
    StorageParts,
    _is_torch_tensor,
    _torch_numpy,
    _who,
    coerce_values,
    value_dtype,
)

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
) -> StorageParts:
    """From any scipy sparse matrix/array; default format follows its type (csr, csc, coo).

    csr->csr and csc->csc reuse indptr/indices (after summing duplicates and sorting indices
    on a copy when the matrix is not canonical)."""
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
) -> StorageParts:
    """From a dense, sparse COO, CSR or CSC torch tensor; default format follows layout.
    Hybrid tensors (dense value dimensions) are refused."""
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
            except StorageError:
                # only unsorted or duplicate indices may fall back to torch's own coalescing;
                # a broken pos/crd would make torch read outside its arrays
                pos_arr, crd_arr = storage[1]  # type: ignore[misc]
                if not _compressed_structure_ok(pos_arr, crd_arr, t.shape, fmt):
                    raise
    else:
        fmt = parse_format("coo" if format is None else format, t.dim(), name)
    coo = t.to_sparse_coo().coalesce()
    data = coerce_values(_torch_numpy(coo.values(), requested, name), requested, name)
    return pack(coo.indices().numpy(), data, tuple(t.shape), fmt, index_dtype, name=name)


def _compressed_structure_ok(pos: Any, crd: Any, shape: Any, fmt: Format) -> bool:
    """pos and crd of a CSR/CSC could be read safely (order and duplicates aside)."""
    pos, crd = np.asarray(pos), np.asarray(crd)
    outer, inner = (shape[m] for m in fmt.ordering)
    return bool(
        pos.ndim == 1
        and crd.ndim == 1
        and len(pos) == outer + 1
        and pos[0] == 0
        and pos[-1] == len(crd)
        and np.all(np.diff(pos) >= 0)
        and (len(crd) == 0 or (crd.min() >= 0 and crd.max() < inner))
    )


# ---- anything


def storage_of(obj: Any, format: str | Format | None, name: str, **options: Any) -> StorageParts:
    """The storage of a numpy array, scipy sparse matrix, torch tensor, number or nested list
    (``options``: index_dtype, dtype): `as_tensor` for anything not a `Tensor` already."""
    if _is_scipy_sparse(obj):
        return from_scipy(obj, format, name=name, **options)
    if _is_torch_tensor(obj):
        return from_torch(obj, format, name=name, **options)
    if isinstance(obj, (np.ndarray, np.generic, int, float, complex, list, tuple)):
        return from_dense(obj, format, name=name, **options)
    raise InputError(
        f"tensor {name!r} must be a numpy array, scipy sparse matrix, torch tensor, sparsec "
        f"Tensor or number, not {type(obj).__name__}"
    )


# ---- derived inputs (repeated indices, re-layouts)


def derive_entries(
    shape: tuple[int, ...],
    coords: np.ndarray,
    values: np.ndarray,
    indices: tuple[str, ...],
    format: Format,
    index_dtype: Any = None,
) -> StorageParts:
    """The stored entries ``(coords, values)`` (mode-order COO, ``(order, nnz)``) of a
    tensor of ``shape`` read as ``indices``, re-packed in ``format``: the entries whose
    coordinates agree wherever ``indices`` repeats a variable (the diagonal of ``A(i,i)``),
    on one mode per distinct variable in first use order. With no repeated variable this is
    a re-layout (a CSR re-packed as CSC, any mode ordering or level format). Vectorised,
    O(nnz log nnz) for the sort `pack` does; stored zeros stay stored (presence, not value,
    is what a sparse level carries). The repeated modes' extents must agree (the caller
    checked the index's extent)."""
    distinct = tuple(dict.fromkeys(indices))
    first = [indices.index(v) for v in distinct]
    keep = np.ones(coords.shape[1], dtype=bool)
    for mode, v in enumerate(indices):
        other = first[distinct.index(v)]
        if other != mode:
            keep &= coords[mode] == coords[other]
    kept = coords[first][:, keep] if keep.size else coords[first]
    out_shape = tuple(shape[m] for m in first)
    return pack(kept, values[keep], out_shape, format, index_dtype, values.dtype)


def derive_dense(array: Any, level_indices: tuple[str, ...], out_indices: tuple[str, ...]) -> Any:
    """A dense array whose axes are ``level_indices`` (repeats allowed) seen with axes
    ``out_indices`` (each variable once): the diagonal where a variable repeats
    (``einsum('ii->i')``), a transpose otherwise. A view: the caller makes the C-ordered
    copy a kernel reads (`sparsec.runtime.copies`)."""
    letters = {v: chr(ord("a") + n) for n, v in enumerate(dict.fromkeys(level_indices))}
    spec = "".join(letters[v] for v in level_indices) + "->"
    spec += "".join(letters[v] for v in out_indices)
    return np.einsum(spec, array)
