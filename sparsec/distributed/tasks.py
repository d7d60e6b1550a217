"""What runs on the Dask workers: building, measuring, saving and loading parts, and running
a kernel on one part. Module-level functions, so tasks pickle by reference."""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..api.kernel import Kernel, _rebuild_kernel
from ..base.errors import SparsecError
from ..tensors.formats import Format
from ..tensors.tensor import Tensor, as_tensor
from . import split


def nnz(part: Tensor) -> int:
    return part.nnz


def dtypes(part: Tensor) -> tuple[str, str]:
    return part.dtype.name, part.index_dtype.name


def histogram(part: Tensor, mode: int, lo: int, on: int, extent: int) -> np.ndarray:
    c, _ = split.global_coords(part, mode, lo)
    return np.bincount(c[on], minlength=extent)


def select_part(
    on: int,
    lo: int,
    hi: int,
    shape: Sequence[int],
    fmt: Format,
    idt: Any,
    mode: int,
    lows: Sequence[int],
    *parts: Tensor,
) -> Tensor:
    pieces = [split.global_coords(p, mode, low) for p, low in zip(parts, lows, strict=True)]
    c, v = split.select(pieces, on, lo, hi)
    if not len(v):
        v = np.zeros(0, dtype=parts[0].dtype)
    return split.make_part(c, v.astype(parts[0].dtype), shape, on, lo, hi, fmt, idt)


def cut_part(part: Tensor, axes: Sequence[int], lo: int, hi: int) -> Tensor:
    return split.cut(part, axes, lo, hi)


def block_row(fmt: Format, dtype: Any, index_dtype: Any, *blocks: Any) -> Tensor:
    import scipy.sparse as sp

    row = sp.hstack([sp.csr_matrix(b) for b in blocks], format="csr")
    return as_tensor(row, fmt, dtype=dtype, index_dtype=index_dtype)


def save_part(part: Tensor, path: str) -> str:
    arrays: dict[str, Any] = {"vals": part.vals, "shape": np.array(part.shape, np.int64)}
    for k, st in enumerate(part.levels):
        if st.pos is not None:
            arrays[f"pos{k}"] = st.pos
        if st.crd is not None:
            arrays[f"crd{k}"] = st.crd
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    return path


def load_part(path: str, fmt: Format, index_dtype: str) -> Tensor:
    from ..tensors.storage import LevelStorage

    try:
        with np.load(path) as z:
            levels = tuple(
                LevelStorage(
                    z[f"pos{k}"] if f"pos{k}" in z else None,
                    z[f"crd{k}"] if f"crd{k}" in z else None,
                )
                for k in range(fmt.order)
            )
            shape = tuple(int(n) for n in z["shape"])
            tensor = Tensor(shape, fmt, levels, z["vals"], np.dtype(index_dtype))
    except (OSError, KeyError, ValueError) as err:
        raise SparsecError(f"{path}: not a part file written by save(): {err}") from None
    return tensor.validate(path)


#: kernels rebuilt from their pickled arguments, once per process
_KERNELS: dict[bytes, Kernel] = {}


def worker_kernel(args: bytes) -> Kernel:
    """The kernel of a call's parts, rebuilt once per process. Built with every
    register-tile stage (`sparsec.passes.stages`): the parts' extents differ, and the
    library the driver builds before the parts run (`DistributedKernel.build`) has them
    all, so a worker sharing its compile cache loads it."""
    found = _KERNELS.get(args)
    if found is None:
        found = _KERNELS[args] = _rebuild_kernel(*pickle.loads(args))
        found.all_stages()
    return found


def plain_formats(k: Kernel) -> dict[str, Format]:
    """A kernel's formats, none of them mapped (`DistributedKernel` refuses maps)."""
    return {n: f for n, f in k.formats.items() if isinstance(f, Format)}


def run_part(args: bytes, label: str, names: list[str], threads: int | None, *values: Any) -> Any:
    """One part on a worker: the kernel on this part's inputs; a failure names the part."""
    k = worker_kernel(args)
    formats = plain_formats(k)
    inputs = {}
    for n, v in zip(names, values, strict=True):
        if isinstance(v, Tensor) and n in formats and v.format != formats[n]:
            v = v.to_format(formats[n])
        inputs[n] = v
    try:
        return k(threads=threads, **inputs)
    except Exception as err:
        raise SparsecError(
            f"kernel {k.expression!r} failed on {label}: {type(err).__name__}: {err}"
        ) from None


def add(a: Any, b: Any, add_args: bytes | None) -> Any:
    if add_args is None or not isinstance(a, Tensor):
        return np.asarray(a) + np.asarray(b)
    return worker_kernel(add_args)(P=a, Q=b)


def meta(t: Tensor) -> tuple[int, str, str]:
    return t.nnz, t.dtype.name, t.index_dtype.name


def parse_range(path: str, start: int, end: int, spec: dict[str, Any], first: int) -> Any:
    """The entries of the lines that start in bytes ``[start, end)``: 0-based int64
    coordinates ``(order, n)`` and float64 values (``.mtx`` symmetric: mirrored too)."""
    columns, order = spec["columns"], spec["order"]
    with open(path, "rb") as f:
        f.seek(max(first, start - 1))
        if start > first:
            f.readline()  # the line under way at `start` belongs to the range before
        at = f.tell()
        data = f.read(max(0, end - at)) if at < end else b""
        if data and not data.endswith(b"\n"):
            data += f.readline()
    lines = [ln.split(b"#")[0] for ln in data.splitlines()]
    words = b" ".join(ln for ln in lines if ln.strip() and not ln.lstrip().startswith(b"%")).split()
    if len(words) % columns:
        raise SparsecError(
            f"{path}: bytes {start}-{end}: each entry line needs {columns} numbers "
            f"({order} coordinates{' and a value' if columns > order else ''})"
        )
    try:
        table = np.array(words, dtype=np.float64).reshape(-1, columns)
    except ValueError as err:
        raise SparsecError(f"{path}: bytes {start}-{end}: {err}") from None
    coords = table[:, :order].T.astype(np.int64) - 1
    vals = table[:, order] if columns > order else np.ones(len(table))
    shape = spec["shape"]
    bad = (coords < 0).any(axis=0)
    if shape is not None:
        bad |= (coords >= np.array(shape)[:, None]).any(axis=0)
    if bad.any():
        raise SparsecError(
            f"{path}: bytes {start}-{end}: coordinate {tuple(coords[:, bad.argmax()] + 1)} is "
            f"outside the shape {shape} (coordinates are 1-based)"
        )
    if spec["symmetric"]:
        off = coords[0] != coords[1]
        coords = np.concatenate([coords, coords[::-1, off]], axis=1)
        vals = np.concatenate([vals, vals[off]])
    return coords, vals


def max_coords(piece: Any, order: int) -> np.ndarray:
    coords = piece[0]
    return coords.max(axis=1) if coords.shape[1] else np.full(order, -1)


def count_along(piece: Any, mode: int, shape: Sequence[int]) -> np.ndarray:
    return np.bincount(piece[0][mode], minlength=shape[mode])


def gather_range(
    mode: int,
    cut: split.Cut,
    base: int,
    shape: Sequence[int],
    fmt: Format,
    idt: Any,
    dtype: str,
    *pieces: Any,
) -> Tensor:
    """One part from the parsed ranges: the entries with ``cut.lo <= coords[mode] < cut.hi``
    at positions ``[cut.start, cut.end)`` of the entries ordered by slice, within a slice in
    file order (the ranges' order, then each range's); ``base`` is the position of slice
    ``cut.lo``'s first entry. Two parts sharing a split slice select it the same way, so
    each of its entries lands in exactly one of them."""
    c, v = split.select(list(pieces), mode, cut.lo, cut.hi)
    order = np.argsort(c[mode], kind="stable")  # by slice, file order within one
    keep = order[cut.start - base : cut.end - base]
    return split.make_part(c[:, keep], v[keep].astype(dtype), shape, mode, cut.lo, cut.hi, fmt, idt)


def identity(value: Any) -> Any:
    """A driver value carried by a task (the scheduler holds it, so it can be redone)."""
    return value
