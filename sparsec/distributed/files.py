"""Reading Matrix Market (``.mtx``) and FROSTT (``.tns``) files on the workers.

The driver reads only the header; the data is cut into byte ranges, each parsed by a task on a
worker (a range owns the lines that start inside it). A histogram pass counts the entries per
slice of the split mode, the driver cuts the slices into parts balanced by nonzeros (a slice
heavier than nnz/P split by position between two parts), and each
part is gathered from the parsed ranges by a task. Every step is a task reading the file, so
Dask redoes lost parts after a worker dies (the file must be readable from every worker).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..base.errors import InputError
from ..tensors.formats import parse_format
from . import split, tasks
from ._dask import client_of
from .tensor import DistributedTensor, check_parts, default_parts

#: bytes per parsed range unless ``chunk_bytes`` is given (at least one range per part)
CHUNK_BYTES = 64 << 20
FIELDS = {"real": 1, "integer": 1, "double": 1, "pattern": 0}


def _mtx_header(path: str) -> tuple[tuple[int, int], int, str, bool]:
    """(shape, byte offset of the first entry, field, symmetric) from a coordinate .mtx file."""
    try:
        return _read_mtx_header(path)
    except OSError as err:
        raise InputError(
            f"cannot read {path}: {err.strerror or err}; give the path of a Matrix Market "
            "file that the driver and every worker can read"
        ) from None


def _read_mtx_header(path: str) -> tuple[tuple[int, int], int, str, bool]:
    with open(path, "rb") as f:
        banner = f.readline().decode("ascii", "replace").split()
        if len(banner) < 5 or banner[0].lower() != "%%matrixmarket":
            raise InputError(f"{path}: not a Matrix Market file (no %%MatrixMarket banner)")
        kind, layout, field, symmetry = (w.lower() for w in banner[1:5])
        if kind != "matrix" or layout != "coordinate":
            raise InputError(
                f"{path}: read_mtx reads sparse 'matrix coordinate' files, not {layout}"
            )
        if field not in FIELDS or symmetry not in ("general", "symmetric"):
            raise InputError(
                f"{path}: field {field!r} / symmetry {symmetry!r} not supported; read_mtx takes "
                "real, integer or pattern values, general or symmetric"
            )
        line = f.readline()
        while line.startswith(b"%") or not line.strip():
            if not line:
                raise InputError(f"{path}: no size line")
            line = f.readline()
        try:
            m, n, _ = (int(w) for w in line.split())
        except ValueError:
            raise InputError(f"{path}: bad size line {line.strip()!r}") from None
        return (m, n), f.tell(), field, symmetry == "symmetric"


def _ranges(path: str, start: int, pieces: int, chunk_bytes: int | None) -> list[tuple[int, int]]:
    size = os.path.getsize(path)
    span = max(1, size - start)
    count = max(pieces, -(-span // (chunk_bytes or CHUNK_BYTES)))
    edges = np.linspace(start, size, count + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(edges, edges[1:], strict=False) if b > a]


def read_mtx(
    path: str | os.PathLike[str],
    parts: int | None = None,
    *,
    client: Any = None,
    format: Any = "csr",
    dtype: Any = "float64",
    index_dtype: Any = None,
    chunk_bytes: int | None = None,
) -> DistributedTensor:
    """A Matrix Market coordinate file as a `DistributedTensor`, parsed on the workers."""
    client = client_of(client)
    path = os.path.abspath(os.fspath(path))
    shape, start, field, symmetric = _mtx_header(path)
    columns = 2 + FIELDS[field]
    spec = {"columns": columns, "order": 2, "symmetric": symmetric, "shape": shape}
    return _build(client, path, start, spec, parts, format, dtype, index_dtype, chunk_bytes)


def read_tns(
    path: str | os.PathLike[str],
    parts: int | None = None,
    *,
    shape: tuple[int, ...] | None = None,
    client: Any = None,
    format: Any = "csf",
    dtype: Any = "float64",
    index_dtype: Any = None,
    chunk_bytes: int | None = None,
) -> DistributedTensor:
    """A FROSTT ``.tns`` file (1-based coordinates then a value per line, ``#`` comments) as a
    `DistributedTensor`, parsed on the workers; ``shape`` defaults to the largest coordinates."""
    client = client_of(client)
    path = os.path.abspath(os.fspath(path))
    order = _tns_order(path)
    spec = {"columns": order + 1, "order": order, "symmetric": False, "shape": shape}
    return _build(client, path, 0, spec, parts, format, dtype, index_dtype, chunk_bytes)


def _tns_order(path: str) -> int:
    try:
        with open(path, "rb") as f:
            for line in f:
                words = line.split(b"#")[0].split()
                if words:
                    if len(words) < 2:
                        break
                    return len(words) - 1
    except OSError as err:
        raise InputError(f"cannot read {path}: {err}") from None
    raise InputError(f"{path}: no entries (a .tns line is 'i j ... value', 1-based)")


def _build(
    client: Any,
    path: str,
    start: int,
    spec: dict[str, Any],
    parts: int | None,
    format: Any,
    dtype: Any,
    index_dtype: Any,
    chunk_bytes: int | None,
) -> DistributedTensor:
    parts = check_parts(parts) or default_parts(client)
    order = spec["order"]
    fmt = parse_format(format, order, os.path.basename(path))
    ranges = _ranges(path, start, parts, chunk_bytes)
    pieces = [
        client.submit(tasks.parse_range, path, a, b, spec, start, pure=False) for a, b in ranges
    ]
    shape = spec["shape"]
    if shape is None:
        highs = client.gather(client.map(tasks.max_coords, pieces, [order] * len(pieces)))
        shape = tuple(int(h) + 1 for h in np.max(np.array(highs).reshape(-1, order), axis=0))
    shape = tuple(int(s) for s in shape)
    mode = fmt.ordering[0]
    hists = client.map(tasks.count_along, pieces, [mode] * len(pieces), [shape] * len(pieces))
    counts = np.sum(client.gather(hists), axis=0)
    cuts = split.cuts_from_counts(counts, parts)  # a heavy slice split by position
    starts = np.concatenate([[0], np.cumsum(counts)])
    idt = np.dtype(
        index_dtype or ("int32" if max(shape) < 2**31 and counts.sum() < 2**31 else "int64")
    )
    futures = [
        client.submit(
            tasks.gather_range,
            mode,
            c,
            int(starts[c.lo]),
            shape,
            fmt,
            idt,
            np.dtype(dtype).name,
            *pieces,
            pure=False,
        )
        for c in cuts
    ]
    return DistributedTensor(
        client, futures, cuts, shape, fmt, mode, dtype, idt, "files", os.path.basename(path)
    )
