"""The inputs of the TACO side by side (`bench.taco`): drawn here with fixed seeds and
written once as files that both sides read, the C++ driver (``bench/taco_driver.cpp``) and
this process.

File format (``.sct``, little endian): one ASCII header line, then the data.

    sctensor dense <f4|f8> <d0> <d1> ...\\n           then prod(d) values, row-major
    sctensor coo <f4|f8> <nnz> <d0> <d1> ...\\n       then, for each mode, nnz int32
                                                      coordinates; then nnz values

A coo file's entries are distinct and sorted row-major, so a CSR or CSF built from it is
the same on both sides. The driver writes its results in the same format (a CSR result
as coo), so one reader checks them.

Each input is drawn from its own stream, seeded by `SEED` and its name, so any subset of
the inputs comes out the same as when all are drawn, on every machine with the same numpy.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from .core import banded_csr, pruned_csr, random_rows_csr

SEED = 20261128
#: bump when a construction below changes: the data folder's name carries it, so old files
#: are never read as new ones
VERSION = 1
_MAGIC = "sctensor"


@dataclass(frozen=True, slots=True)
class Coo:
    """A sparse tensor as sorted, distinct coordinates (int32, one array per mode)."""

    dims: tuple[int, ...]
    coords: tuple[np.ndarray, ...]
    vals: np.ndarray

    def csr(self) -> sp.csr_matrix:
        """The matrix as scipy CSR (int32 indices); only for order 2."""
        if len(self.dims) != 2:
            raise ValueError(f"a CSR needs a matrix, this has {len(self.dims)} modes")
        rows, cols = self.coords
        indptr = np.zeros(self.dims[0] + 1, np.int32)
        np.cumsum(np.bincount(rows, minlength=self.dims[0]), out=indptr[1:])
        return sp.csr_matrix((self.vals, cols, indptr), shape=self.dims)


Data = np.ndarray | Coo


def coo_of(m: sp.spmatrix) -> Coo:
    """A scipy matrix as a `Coo` (duplicates summed, rows then columns sorted)."""
    m = sp.csr_matrix(m)
    m.sum_duplicates()
    m.sort_indices()
    rows = np.repeat(np.arange(m.shape[0], dtype=np.int32), np.diff(m.indptr))
    return Coo(tuple(m.shape), (rows, m.indices.astype(np.int32)), m.data)


def write(path: Path, data: Data) -> None:
    """Write ``data`` (a float32/float64 array or a `Coo`) to ``path``, through a temporary
    file, so a reader never sees half a file."""
    vals = np.ascontiguousarray(data.vals if isinstance(data, Coo) else data)
    kind = {np.dtype(np.float32): "f4", np.dtype(np.float64): "f8"}.get(vals.dtype)
    if kind is None:
        raise ValueError(f"values must be float32 or float64, not {vals.dtype}")
    if isinstance(data, Coo):
        head = ["coo", kind, str(vals.size), *map(str, data.dims)]
        parts = [np.ascontiguousarray(c, dtype="<i4") for c in data.coords]
    else:
        head, parts = ["dense", kind, *map(str, data.shape)], []
    tmp = path.with_suffix(".part")
    with open(tmp, "wb") as f:
        f.write((" ".join([_MAGIC, *head]) + "\n").encode())
        for part in parts:
            part.tofile(f)
        vals.astype(vals.dtype.newbyteorder("<"), copy=False).tofile(f)
    tmp.replace(path)


def read(path: Path) -> Data:
    """The array or `Coo` in ``path`` (written by `write` or by the driver)."""
    with open(path, "rb") as f:
        head = f.readline().decode().split()
        if len(head) < 3 or head[0] != _MAGIC or head[2] not in ("f4", "f8"):
            raise ValueError(f"{path}: not a {_MAGIC} file")
        dtype = np.dtype("<" + head[2])
        if head[1] == "dense":
            dims = tuple(int(d) for d in head[3:])
            return np.fromfile(f, dtype, int(np.prod(dims))).reshape(dims)
        nnz, dims = int(head[3]), tuple(int(d) for d in head[4:])
        coords = tuple(np.fromfile(f, "<i4", nnz) for _ in dims)
        return Coo(dims, coords, np.fromfile(f, dtype, nnz))


# --------------------------------------------------------------------------- inputs


def _uniform(*shape: int) -> Callable[[np.random.Generator, int], Data]:
    def draw(rng: np.random.Generator, scale: int) -> Data:
        return rng.uniform(-1.0, 1.0, size=tuple(max(1, s // scale) for s in shape))

    return draw


def _rows(n: int) -> Callable[[np.random.Generator, int], Data]:
    """n x n with exactly 10 distinct random columns in each row."""
    return lambda rng, scale: coo_of(random_rows_csr(n // scale, 10, rng, np.float64))


def _scipy_random(rng: np.random.Generator, scale: int) -> Data:
    """100k x 100k drawn as scipy's ``sp.random`` draws (10 per row on average, but a row's
    length varies, as a Poisson count does): the rows of real matrices are not all alike."""
    n = 100_000 // scale
    m = sp.random(n, n, density=10 / n, format="csr", random_state=rng)
    m.data = rng.uniform(-1.0, 1.0, size=m.nnz)
    return coo_of(m)


def _band(rng: np.random.Generator, scale: int) -> Data:
    return coo_of(banded_csr(2_000_000 // scale, range(-2, 3), rng, np.float64))


def _pruned(rows: int, cols: int) -> Callable[[np.random.Generator, int], Data]:
    """A 90 % magnitude-pruned Gaussian weight matrix (a BERT-base FFN shape)."""
    return lambda rng, scale: coo_of(pruned_csr(rows // scale, cols // scale, 0.9, rng))


def _float32(name: str) -> Callable[[np.random.Generator, int], Data]:
    """Input ``name``'s values cast to float32 (its own stream is not used)."""

    def draw_f4(rng: np.random.Generator, scale: int) -> Data:
        data = draw(name, scale)
        if isinstance(data, Coo):
            return Coo(data.dims, data.coords, data.vals.astype(np.float32))
        return data.astype(np.float32)

    return draw_f4


def _three(rng: np.random.Generator, scale: int) -> Data:
    """2000^3 with 1M distinct uniformly random coordinates."""
    n, nnz = 2000 // scale, 1_000_000 // scale**3 or 1000
    flat = np.unique(rng.integers(0, n**3, size=nnz + nnz // 8))
    flat = np.sort(rng.choice(flat, size=min(nnz, flat.size), replace=False))
    i, rest = np.divmod(flat, n * n)
    j, k = np.divmod(rest, n)
    coords = tuple(c.astype(np.int32) for c in (i, j, k))
    return Coo((n, n, n), coords, rng.uniform(-1.0, 1.0, size=flat.size))


#: input name -> how it is drawn (from its own generator, and a size divisor: 1 for the
#: real run, 10 for ``--quick``)
INPUTS: dict[str, Callable[[np.random.Generator, int], Data]] = {
    "rows50k": _rows(50_000),
    "x50k": _uniform(50_000),
    "rows100k": _rows(100_000),
    "x100k": _uniform(100_000),
    "rows200k": _rows(200_000),
    "x200k": _uniform(200_000),
    "sprandom100k": _scipy_random,
    "band2m": _band,
    "x2m": _uniform(2_000_000),
    "pruned3072x768": _pruned(3072, 768),
    "pruned3072x768_f4": _float32("pruned3072x768"),
    "dense768x512": _uniform(768, 512),
    "dense768x512_f4": _float32("dense768x512"),
    "t2000": _three,
    "dense2000x32a": _uniform(2000, 32),
    "dense2000x32b": _uniform(2000, 32),
    "x2000": _uniform(2000),
    "pruned768x3072": _pruned(768, 3072),
    "rows20k": _rows(20_000),
    "rows20k_b": _rows(20_000),
    "dense20000x64": _uniform(20_000, 64),
    "dense64x20000": _uniform(64, 20_000),
}


def folder(work: Path, quick: bool) -> Path:
    """Where the inputs of a run live under the work folder (versioned; quick apart)."""
    return work / f"data-v{VERSION}{'-quick' if quick else ''}"


def draw(name: str, scale: int = 1) -> Data:
    """Input ``name`` at size divisor ``scale``, from its own seeded stream."""
    rng = np.random.default_rng([SEED, zlib.crc32(name.encode())])
    return INPUTS[name](rng, scale)


def ensure(names: Sequence[str], where: Path, scale: int) -> dict[str, Path]:
    """The files of inputs ``names`` in ``where``, drawn and written where missing."""
    where.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name in names:
        path = where / f"{name}.sct"
        if not path.exists():
            write(path, draw(name, scale))
        paths[name] = path
    return paths
