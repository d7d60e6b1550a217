"""Tensor files: FROSTT ``.tns`` (any order) and Matrix Market ``.mtx`` (matrices).

``.tns``: one entry per line, 1-based coordinates then the value, whitespace separated,
``#`` comment lines. The shape is the largest coordinate per mode unless given, or unless a
``# shape: 3 4 5`` comment (which `save_tns` writes) records it. ``.mtx`` goes through
``scipy.io.mmread``/``mmwrite``, which expand symmetric files and read pattern files as ones.
A ``.gz`` suffix after either is read and written compressed.

Loaders return a `Tensor` in ``format`` (default: `default_sparse` of the order -- CSR for a
matrix -- or dense for a Matrix Market array file). Unreadable files raise `InputError`
naming the path and, where it can be found, the line.
"""

from __future__ import annotations

import gzip
import re
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np

from ..base.errors import FormatError, InputError, SparsecError
from .formats import Format, default_sparse
from .tensor import Tensor, as_tensor, from_dense, from_scipy, pack

PathLike = str | Path
_SHAPE_COMMENT = re.compile(r"^#\s*shape\s*[:=]?\s*((?:\d+\s*)*)$", re.IGNORECASE)


def _open(path: Path, mode: str = "rt") -> IO[Any]:
    """``open`` or, for a ``.gz`` suffix, ``gzip.open``."""
    if path.suffix == ".gz":
        return gzip.open(path, mode)  # type: ignore[return-value]
    return open(path, mode)


def _stem_suffix(path: Path) -> str:
    """``.tns`` for ``a.tns`` and ``a.tns.gz``."""
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes = suffixes[:-1]
    return suffixes[-1] if suffixes else ""


def _rethrow(path: Path, err: SparsecError) -> SparsecError:
    """The same error class with the path in front of the message."""
    return type(err)(f"{path}: {err.message}")


# --------------------------------------------------------------------------- FROSTT


def _data_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, text) of each entry line: not blank, not a comment."""
    with _open(path) as f:
        for number, line in enumerate(f, start=1):
            text = line.split("#", 1)[0].strip()
            if text:
                yield number, text


def _line_of_entry(path: Path, entry: int) -> tuple[int, str]:
    for i, (number, text) in enumerate(_data_lines(path)):
        if i == entry:
            return number, text
    return 0, ""


def _first_bad_line(path: Path) -> str:
    """Why np.loadtxt refused the file, as 'line N: reason' (scanned only on failure)."""
    columns = None
    for number, text in _data_lines(path):
        fields = text.split()
        try:
            [float(x) for x in fields]
        except ValueError:
            return f"line {number}: cannot read {text!r} as numbers"
        if columns is not None and len(fields) != columns:
            return f"line {number}: {len(fields)} columns where earlier lines have {columns}"
        columns = len(fields)
    return "unreadable"


def _shape_comment(path: Path) -> tuple[int, ...] | None:
    """The shape recorded by a ``# shape: ...`` comment before the first entry, if any."""
    with _open(path) as f:
        for line in f:
            text = line.strip()
            if text and not text.startswith("#"):
                return None
            if m := _SHAPE_COMMENT.match(text):
                return tuple(int(d) for d in m.group(1).split())
    return None


def load_tns(
    path: PathLike,
    format: str | Format | None = None,
    *,
    shape: tuple[int, ...] | None = None,
    index_dtype: Any = None,
    dtype: Any = None,
) -> Tensor:
    """Read a FROSTT file; duplicate coordinates are summed."""
    path = Path(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "input contained no data"
            data = np.loadtxt(path, comments="#", ndmin=2, dtype=np.float64)
    except OSError as err:
        raise InputError(f"cannot read {path}: {err.strerror or err}") from None
    except ValueError:
        raise InputError(f"{path}: not a .tns file: {_first_bad_line(path)}") from None
    if shape is None:
        shape = _shape_comment(path)
    if data.size == 0:
        if shape is None:
            raise InputError(f"{path}: no entries, so the shape is unknown; pass shape=")
        data = np.zeros((0, len(shape) + 1))
    order = data.shape[1] - 1
    coords = data[:, :order]
    integral = np.isfinite(coords) & (coords >= 1) & (coords == np.floor(coords))
    bad = np.flatnonzero(~np.all(integral, axis=1))
    if bad.size:
        number, text = _line_of_entry(path, int(bad[0]))
        raise InputError(
            f"{path}: line {number}: coordinates must be integers >= 1 (1-based), got {text!r}"
        )
    index = coords.astype(np.int64).T - 1
    if shape is None:
        shape = tuple(int(m) + 1 for m in index.max(axis=1)) if index.size else (0,) * order
    if len(shape) != order:
        raise InputError(f"{path}: entries have {order} coordinates but the shape is {shape}")
    fmt = default_sparse(order) if format is None else format
    try:
        return pack(index, data[:, order], shape, fmt, index_dtype, dtype)
    except SparsecError as err:
        raise _rethrow(path, err) from None


def save_tns(path: PathLike, tensor: Any) -> None:
    """Write every stored entry of ``tensor`` (a Tensor or anything `as_tensor` takes; its
    explicit zeros too, `Tensor.eliminate_zeros` drops them) 1-based, with a ``# shape:``
    comment line."""
    tensor = as_tensor(tensor)
    path = Path(path)
    coords, values = tensor.coords()
    rows = np.column_stack([coords.T + 1, values]) if tensor.order else values[:, None]
    fmt = ["%d"] * tensor.order + ["%.17g"]
    header = "shape: " + " ".join(map(str, tensor.shape))
    with _open(path, "wt") as f:
        np.savetxt(f, rows, fmt=fmt, header=header, comments="# ")


# --------------------------------------------------------------------------- Matrix Market


def load_mtx(
    path: PathLike,
    format: str | Format | None = None,
    *,
    index_dtype: Any = None,
    dtype: Any = None,
) -> Tensor:
    """Read a Matrix Market file (coordinate or array; symmetric and pattern via scipy).
    Values keep the file's field: ``real`` float64, ``integer`` int64, ``pattern`` bool
    (GraphBLAS's reading of a graph's adjacency); ``dtype`` converts them."""
    import scipy.io
    import scipy.sparse

    path = Path(path)
    if not path.exists():
        raise InputError(f"cannot read {path}: no such file")
    try:
        matrix = scipy.io.mmread(path)
        field = scipy.io.mminfo(path)[4]
    except (ValueError, OSError, EOFError, IndexError, TypeError) as err:
        raise InputError(f"{path}: not a Matrix Market file: {err}") from None
    if dtype is None and field == "pattern":
        dtype = np.bool_
    elif dtype is None and field == "integer":
        dtype = np.int64
    try:
        if scipy.sparse.issparse(matrix):
            fmt = default_sparse(2) if format is None else format
            return from_scipy(matrix, fmt, index_dtype=index_dtype, dtype=dtype)
        return from_dense(np.asarray(matrix), format, index_dtype=index_dtype, dtype=dtype)
    except SparsecError as err:
        raise _rethrow(path, err) from None


def save_mtx(path: PathLike, tensor: Any) -> None:
    """Write an order-2 tensor's stored entries (explicit zeros too; a Tensor, a scipy matrix
    or anything `as_tensor` takes) as a coordinate Matrix Market file."""
    import scipy.io
    import scipy.sparse

    tensor = as_tensor(tensor)
    if tensor.order != 2:
        raise FormatError(
            f"Matrix Market files hold matrices; this tensor has order {tensor.order}"
        )
    coords, values = tensor.coords()
    matrix = scipy.sparse.coo_array((values, (coords[0], coords[1])), shape=tensor.shape)
    path = Path(path)
    with _open(path, "wb") as f:
        scipy.io.mmwrite(f, matrix, symmetry="general")  # as stored: no pattern inferred


# --------------------------------------------------------------------------- by suffix

_LOADERS: dict[str, Callable[..., Tensor]] = {".tns": load_tns, ".mtx": load_mtx}
_SAVERS: dict[str, Callable[[PathLike, Tensor], None]] = {".tns": save_tns, ".mtx": save_mtx}


def _pick(path: Path, table: dict[str, Any]) -> Any:
    suffix = _stem_suffix(path)
    if suffix not in table:
        known = ", ".join(sorted(table))
        raise InputError(f"{path}: unknown tensor file type {suffix!r}; expected {known} (.gz ok)")
    return table[suffix]


def load(path: PathLike, format: str | Format | None = None, **options: Any) -> Tensor:
    """`load_tns` or `load_mtx` by the file's suffix."""
    return _pick(Path(path), _LOADERS)(path, format, **options)


def save(path: PathLike, tensor: Any) -> None:
    """`save_tns` or `save_mtx` by the file's suffix."""
    _pick(Path(path), _SAVERS)(path, tensor)
