"""`DistributedTensor`: a sparse tensor cut along one mode into parts that live on Dask workers.

Each part is a `sparsec.Tensor` (a Dask future) holding the entries whose coordinate on the
split mode lies in its range, shifted to start at 0 (`split`). Parts built by tasks (files,
dask arrays, `open`, `repartition`) are recomputed by Dask when a worker dies; parts
``scatter``-ed from the driver (`from_scipy`, `from_tensor`) are not, and a call that needs a
lost one raises a `SparsecError` naming it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..base.errors import InputError, SparsecError
from ..tensors.formats import Format, parse_format
from ..tensors.tensor import Tensor, as_tensor
from . import split, tasks
from ._dask import client_of, distributed, lost

MANIFEST = "manifest.json"
SCATTERED = "scattered"


class DistributedTensor:
    """Parts (futures of `sparsec.Tensor`) along mode ``mode``, part ``p`` over ``cuts[p]``."""

    def __init__(
        self,
        client: Any,
        futures: Sequence[Any],
        cuts: Sequence[split.Cut],
        shape: Sequence[int],
        format: Format,
        mode: int,
        dtype: Any,
        index_dtype: Any,
        origin: str,
        name: str = "",
    ) -> None:
        self.client = client
        self.futures = list(futures)
        self.cuts = list(cuts)
        self.shape = tuple(int(n) for n in shape)
        self.format = format
        self.mode = mode
        self.dtype = np.dtype(dtype)
        self.index_dtype = np.dtype(index_dtype)
        #: "scattered" (driver data, not recoverable) or what built the parts by tasks
        self.origin = origin
        self.name = name

    # ------------------------------------------------------------------ facts
    @property
    def parts(self) -> int:
        return len(self.futures)

    @property
    def order(self) -> int:
        return len(self.shape)

    @property
    def bounds(self) -> list[tuple[int, int]]:
        """Each part's ``[lo, hi)`` on the split mode (neighbours share a split heavy slice)."""
        return [(c.lo, c.hi) for c in self.cuts]

    @property
    def part_nnz(self) -> list[int]:
        return [c.nnz for c in self.cuts]

    @property
    def nnz(self) -> int:
        return sum(self.part_nnz)

    @property
    def overlapping(self) -> bool:
        """Some slice is split by position between two parts."""
        return any(a.hi > b.lo for a, b in zip(self.cuts, self.cuts[1:], strict=False))

    @property
    def imbalance(self) -> float:
        """The largest part's nonzeros over the mean (1.0 is perfect balance)."""
        counts = self.part_nnz
        mean = sum(counts) / max(1, len(counts))
        return max(counts) / mean if mean else 1.0

    def __repr__(self) -> str:
        return (
            f"DistributedTensor(shape={self.shape}, format={self.format}, nnz={self.nnz}, "
            f"parts={self.parts}, mode={self.mode}, dtype={self.dtype}, origin={self.origin})"
        )

    # ------------------------------------------------------------- gathering
    def persist(self) -> DistributedTensor:
        """Wait until every part is in worker memory; the tensor itself."""
        self.gather_futures(self.futures, wait_only=True)
        return self

    def gather_futures(self, futures: Sequence[Any], *, wait_only: bool = False) -> Any:
        """Gather (or wait for) futures computed from this tensor's parts; a lost scattered
        part becomes a SparsecError naming it."""
        dd = distributed()
        try:
            if wait_only:
                dd.wait(list(futures))
                bad = lost(list(futures))
                if bad:
                    raise dd.client.FutureCancelledError(futures[bad[0]].key, "lost")
                return None
            return self.client.gather(list(futures))
        except SparsecError:
            raise
        except Exception as err:
            raise self.lost_error(err) from None

    def unrecoverable(self) -> bool:
        """Whether parts are gone for good: scattered from the driver and lost with their
        worker. Parts made by tasks (files, dask arrays, a kernel's output) read as lost for
        a moment after their worker dies, and the scheduler recomputes them."""
        return self.origin == SCATTERED and bool(lost(self.futures))

    def lost_error(self, err: BaseException) -> BaseException:
        gone = lost(self.futures)
        if self.origin == SCATTERED and gone:
            which = ", ".join(str(p) for p in gone)
            return SparsecError(
                f"part(s) {which} of distributed tensor {self.name or '(unnamed)'} were lost with "
                "their worker: parts scattered from the driver (sd.from_scipy/sd.from_tensor) "
                "cannot be recomputed by Dask; build the tensor again, or load it on the "
                "workers (sd.read_mtx, sd.read_tns, sd.open, sd.from_dask_array), which "
                "survives a lost worker"
            )
        return err

    def to_tensor(self) -> Tensor:
        """The whole tensor on the driver, in this tensor's format."""
        parts = self.gather_futures(self.futures)
        return split.join(parts, self.bounds, self.mode, self.shape)

    def to_scipy(self) -> Any:
        return self.to_tensor().to_scipy()

    def to_dense(self) -> np.ndarray:
        return self.to_tensor().to_dense()

    # ------------------------------------------------------------- moving
    def repartition(self, parts: int | None = None, mode: int | None = None) -> DistributedTensor:
        """Parts along ``mode`` (default: the same), balanced by nonzeros at slice boundaries;
        each new part is a task reading the old parts, so Dask can redo it."""
        mode = self.mode if mode is None else mode
        parts = check_parts(parts) or self.parts
        if not 0 <= mode < self.order:
            raise InputError(f"mode {mode} is out of range for an order-{self.order} tensor")
        hists = self.client.map(
            tasks.histogram,
            self.futures,
            [self.mode] * self.parts,
            [c.lo for c in self.cuts],
            [mode] * self.parts,
            [self.shape[mode]] * self.parts,
        )
        counts = np.sum(self.gather_futures(hists), axis=0)
        found = split.cuts_from_counts(counts, parts, split_heavy=False)  # whole slices
        return self.aligned(mode, found)

    def aligned(self, mode: int, cuts: Sequence[split.Cut], format: Format | None = None) -> Any:
        """Parts along ``mode`` with the given ranges (their nonzeros are counted anew)."""
        fmt = format or self.format
        lows = [c.lo for c in self.cuts]
        futures = [
            self.client.submit(
                tasks.select_part,
                mode,
                c.lo,
                c.hi,
                self.shape,
                fmt,
                self.index_dtype,
                self.mode,
                lows,
                *self.futures,
                pure=False,
            )
            for c in cuts
        ]
        nnz = self.gather_futures(self.client.map(tasks.nnz, futures))
        starts = np.concatenate([[0], np.cumsum(nnz)]).astype(int)
        new = [
            split.Cut(int(starts[p]), int(starts[p + 1]), c.lo, c.hi) for p, c in enumerate(cuts)
        ]
        return DistributedTensor(
            self.client,
            futures,
            new,
            self.shape,
            fmt,
            mode,
            self.dtype,
            self.index_dtype,
            "tasks",
            self.name,
        )

    def save(self, path: str | os.PathLike[str]) -> str:
        """Write a partition directory: ``manifest.json`` and one ``part-<p>.npz`` per part
        (written by the workers, so ``path`` must be shared storage on a cluster)."""
        root = os.fspath(path)
        os.makedirs(root, exist_ok=True)
        names = [f"part-{p:05d}.npz" for p in range(self.parts)]
        writes = self.client.map(
            tasks.save_part, self.futures, [os.path.join(root, n) for n in names], pure=False
        )
        self.gather_futures(writes)
        manifest = {
            "sparsec": "distributed-tensor",
            "version": 1,
            "shape": list(self.shape),
            "format": self.format.spelling,
            "ordering": list(self.format.ordering),
            "mode": self.mode,
            "dtype": self.dtype.name,
            "index_dtype": self.index_dtype.name,
            "parts": [
                {"file": n, "lo": c.lo, "hi": c.hi, "nnz": c.nnz}
                for n, c in zip(names, self.cuts, strict=True)
            ],
        }
        with open(os.path.join(root, MANIFEST), "w") as f:
            json.dump(manifest, f, indent=1)
        return root


# ------------------------------------------------------------------ builders


def from_tensor(
    t: Any,
    parts: int | None = None,
    *,
    client: Any = None,
    mode: int | None = None,
    format: Any = None,
    dtype: Any = None,
    index_dtype: Any = None,
    split_heavy: bool = True,
    name: str = "",
) -> DistributedTensor:
    """Cut a driver tensor (anything `sparsec.as_tensor` takes) into ``parts`` balanced by
    nonzeros along ``mode`` (default: the format's outermost stored mode) and scatter them."""
    client = client_of(client)
    parts = check_parts(parts)
    t = as_tensor(t, format, name=name, dtype=dtype, index_dtype=index_dtype)
    if t.order == 0 or t.format.is_dense:
        raise InputError("a distributed tensor is sparse: give a sparse format (csr, csf, ...)")
    mode = t.format.ordering[0] if mode is None else mode
    if not 0 <= mode < t.order:
        raise InputError(f"mode {mode} is out of range for an order-{t.order} tensor")
    coords, vals = t.coords()
    order = split.sort_by(coords, mode)
    coords, vals = coords[:, order], vals[order]
    found = split.cuts(coords[mode], t.shape[mode], parts or default_parts(client), split_heavy)
    pieces = [
        split.make_part(
            coords[:, c.start : c.end],
            vals[c.start : c.end],
            t.shape,
            mode,
            c.lo,
            c.hi,
            t.format,
            t.index_dtype,
        )
        for c in found
    ]
    futures = client.scatter(pieces, hash=False)
    return DistributedTensor(
        client, futures, found, t.shape, t.format, mode, t.dtype, t.index_dtype, SCATTERED, name
    )


def from_scipy(A: Any, parts: int | None = None, **options: Any) -> DistributedTensor:
    """`from_tensor` for a scipy sparse matrix (CSR by default: parts are row blocks)."""
    options.setdefault("format", "csc" if getattr(A, "format", "") == "csc" else "csr")
    return from_tensor(A, parts, **options)


def from_dask_array(
    array: Any,
    *,
    format: Any = "csr",
    client: Any = None,
    dtype: Any = None,
    index_dtype: Any = None,
    name: str = "",
) -> DistributedTensor:
    """A matrix from a 2-D dask array whose chunks are scipy sparse (or numpy) blocks: one
    part per row of chunks, built by tasks (so Dask redoes them if a worker dies)."""
    client = client_of(client)
    if getattr(array, "ndim", None) != 2 or not hasattr(array, "to_delayed"):
        raise InputError("from_dask_array takes a 2-D dask array (chunks: scipy sparse or numpy)")
    fmt = parse_format(format, 2, name)
    blocks = array.to_delayed()
    row_chunks = array.chunks[0]
    lows = np.concatenate([[0], np.cumsum(row_chunks)]).astype(int)
    futures = []
    for r in range(blocks.shape[0]):
        row = client.compute(list(blocks[r]))
        futures.append(client.submit(tasks.block_row, fmt, dtype, index_dtype, *row, pure=False))
    nnz = client.gather(client.map(tasks.nnz, futures))
    starts = np.concatenate([[0], np.cumsum(nnz)]).astype(int)
    found = [
        split.Cut(int(starts[r]), int(starts[r + 1]), int(lows[r]), int(lows[r + 1]))
        for r in range(len(futures))
    ]
    first = client.submit(tasks.dtypes, futures[0]).result()
    return DistributedTensor(
        client, futures, found, array.shape, fmt, 0, first[0], first[1], "dask-array", name
    )


def open_dir(
    path: str | os.PathLike[str], *, client: Any = None, name: str = ""
) -> DistributedTensor:
    """The tensor a `DistributedTensor.save` wrote; each part is loaded by a task on a worker."""
    client = client_of(client)
    root = os.fspath(path)
    try:
        with open(os.path.join(root, MANIFEST)) as f:
            m = json.load(f)
        if m.get("sparsec") != "distributed-tensor":
            raise ValueError("not a sparsec partition manifest")
        fmt = parse_format(m["format"], len(m["shape"]))
        fmt = Format(fmt.levels, tuple(m["ordering"]))
        entries = m["parts"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise InputError(f"{root} is not a partition directory written by save(): {err}") from None
    futures = [
        client.submit(
            tasks.load_part, os.path.join(root, e["file"]), fmt, m["index_dtype"], pure=False
        )
        for e in entries
    ]
    starts = np.concatenate([[0], np.cumsum([e["nnz"] for e in entries])]).astype(int)
    found = [
        split.Cut(int(starts[p]), int(starts[p + 1]), e["lo"], e["hi"])
        for p, e in enumerate(entries)
    ]
    return DistributedTensor(
        client,
        futures,
        found,
        m["shape"],
        fmt,
        m["mode"],
        m["dtype"],
        m["index_dtype"],
        "files",
        name or os.path.basename(root),
    )


def check_parts(parts: Any) -> int | None:
    """``parts=`` as given (None: one per worker thread), or an InputError if it is not a
    positive whole number."""
    if parts is None:
        return None
    if isinstance(parts, bool) or not isinstance(parts, int | np.integer) or parts < 1:
        raise InputError(
            f"parts={parts!r}: give a whole number of parts, at least 1 (or leave it out "
            "for one part per worker thread)"
        )
    return int(parts)


def default_parts(client: Any) -> int:
    """One part per worker thread."""
    return max(1, sum(client.nthreads().values()))
