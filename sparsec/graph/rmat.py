"""R-MAT / Kronecker graphs with a fixed seed, after the Graph500 specification.

An R-MAT graph (Chakrabarti, Zhan and Faloutsos, 2004) has ``2**scale`` vertices and
``edge_factor * 2**scale`` generated edges. Each edge picks one quadrant of the adjacency
matrix per bit of its row and column, top bit first, with probabilities ``a`` (top left),
``b`` (top right), ``c`` (bottom left) and ``d = 1 - a - b - c`` (bottom right); Graph500's
Kronecker generator uses ``a, b, c = 0.57, 0.19, 0.19``. As Graph500 does, the vertex labels
are then permuted by a seeded random permutation, so that a vertex's degree says nothing of
its id. Duplicate edges are merged, self loops dropped unless asked for, and an undirected
graph is stored symmetric.

Everything is drawn from one ``numpy.random.Generator`` seeded by ``seed``, in a fixed order
(the quadrants level by level, the permutation, the weights), so a seed names one matrix.
"""

from __future__ import annotations

import numbers
from typing import TypeGuard

import numpy as np
import scipy.sparse as sp

from ..base.errors import InputError

__all__ = ["rmat"]

#: the largest scale: 2**30 vertices, so an id fits int32 and the key ``i << scale | j`` int64
#: (memory is the real bound: about 30 bytes per generated edge while drawing)
MAX_SCALE = 30


def rmat(
    scale: int,
    edge_factor: int = 16,
    *,
    a: float = 0.57,
    b: float = 0.19,
    c: float = 0.19,
    seed: int = 0,
    undirected: bool = True,
    self_loops: bool = False,
    weights: tuple[int, int] | None = None,
) -> sp.csr_array:
    """The adjacency matrix of an R-MAT graph, ``(2**scale, 2**scale)``, int64 values.

    ``edge_factor * 2**scale`` edges are generated (Graph500's defaults: edge factor 16 and
    ``a, b, c = 0.57, 0.19, 0.19``); after merging duplicates (and, unless ``self_loops``,
    dropping the loops) fewer remain. With ``undirected`` each edge ``(i, j)`` is stored as
    both ``(i, j)`` and ``(j, i)``. The values are 1 (the pattern), or with
    ``weights=(lo, hi)`` an integer drawn uniformly from ``[lo, hi]`` once per distinct
    edge (an undirected edge's two entries share it). Indices are sorted and unique.

    Each level's quadrant comes from one float32 draw (probabilities resolved to 2**-24).
    Vectorised over the edges: scale 20 (16.8M edges) takes a few seconds.
    """
    _check(scale, edge_factor, a, b, c, seed, weights)
    scale, edge_factor = int(scale), int(edge_factor)
    n = 1 << scale
    rng = np.random.default_rng(seed)
    rows, cols = _edges(scale, n * edge_factor, a, b, c, rng)
    perm = rng.permutation(n).astype(rows.dtype)
    rows, cols = perm[rows], perm[cols]
    if not self_loops:
        keep = rows != cols
        rows, cols = rows[keep], cols[keep]
    if undirected:
        rows, cols = np.minimum(rows, cols), np.maximum(rows, cols)
    # the distinct edges, sorted by row then column, as sorted unique keys ``i * n + j``
    keys = (rows.astype(np.int64) << scale) | cols
    keys.sort()
    if len(keys):
        keys = keys[np.concatenate([[True], keys[1:] != keys[:-1]])]
    if weights is None:
        values = np.ones(len(keys), dtype=np.int64)
    else:
        lo, hi = weights
        values = rng.integers(lo, hi, size=len(keys), endpoint=True, dtype=np.int64)
    distinct = _from_keys(keys, values, scale)
    return _mirrored(distinct) if undirected else distinct


def _from_keys(keys: np.ndarray, values: np.ndarray, scale: int) -> sp.csr_array:
    """The CSR matrix of sorted unique keys ``i << scale | j`` and their values."""
    n = 1 << scale
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(keys >> scale, minlength=n), out=indptr[1:])
    return _csr(values, keys & (n - 1), indptr, n)


def _mirrored(upper: sp.csr_array) -> sp.csr_array:
    """The symmetric matrix whose upper triangle (diagonal included) is ``upper``'s.

    The strict upper triangle's transpose ``lower`` (scipy's transpose is a counting sort,
    so its rows come out sorted) holds in row ``r`` only columns below ``r``, and ``upper``
    only columns from ``r`` on: the result's row is ``lower``'s followed by ``upper``'s, so
    an entry at position ``p`` of row ``r`` moves to ``p + upper.indptr[r]`` (from
    ``lower``) or to ``p + lower.indptr[r + 1]`` (from ``upper``). No sort is needed.
    """
    n = upper.shape[0]
    up = upper.indptr.astype(np.int64)
    ucount = np.diff(up)
    diagonal = np.repeat(np.arange(n, dtype=upper.indices.dtype), ucount) == upper.indices
    strict = upper
    if diagonal.any():
        off = ~diagonal
        strict_ptr = np.zeros_like(up)
        np.cumsum(ucount - np.bincount(upper.indices[diagonal], minlength=n), out=strict_ptr[1:])
        strict = _csr(upper.data[off], upper.indices[off], strict_ptr, n)
    lower = sp.csr_array(strict.T)
    lp = lower.indptr.astype(np.int64)
    indptr = lp + up
    indices = np.empty(indptr[-1], dtype=upper.indices.dtype)
    values = np.empty(indptr[-1], dtype=upper.data.dtype)
    to = np.arange(lower.nnz) + np.repeat(up[:-1], np.diff(lp))
    indices[to], values[to] = lower.indices, lower.data
    to = np.arange(upper.nnz) + np.repeat(lp[1:], ucount)
    indices[to], values[to] = upper.indices, upper.data
    return _csr(values, indices, indptr, n)


def _csr(values: np.ndarray, indices: np.ndarray, indptr: np.ndarray, n: int) -> sp.csr_array:
    """A CSR array whose rows the caller built sorted and without duplicates; its index
    arrays in int32 where they fit (as scipy would choose), else int64."""
    small = indptr[-1] <= np.iinfo(np.int32).max and n <= np.iinfo(np.int32).max
    index = np.int32 if small else np.int64
    out = sp.csr_array(
        (values, indices.astype(index, copy=False), indptr.astype(index, copy=False)),
        shape=(n, n),
        copy=False,
    )
    out.has_sorted_indices = True
    out.has_canonical_format = True
    return out


def _edges(
    scale: int, m: int, a: float, b: float, c: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """``m`` edges' (row, column), one quadrant per bit level from one uniform draw each.

    A draw ``u`` picks top left below ``a``, top right below ``a + b``, bottom left below
    ``a + b + c`` and bottom right otherwise: the row bit is ``u >= a + b``, the column bit
    is set in ``[a, a + b)`` and from ``a + b + c`` on.
    """
    rows = np.zeros(m, dtype=np.int32)  # ids below 2**MAX_SCALE fit
    cols = np.zeros(m, dtype=np.int32)
    ta, tab, tabc = np.float32(a), np.float32(a + b), np.float32(a + b + c)
    u = np.empty(m, dtype=np.float32)
    bit = np.empty(m, dtype=bool)
    right = np.empty(m, dtype=bool)
    shifted = np.empty(m, dtype=np.int32)
    for level in range(scale):
        rng.random(out=u, dtype=np.float32)
        np.greater_equal(u, tab, out=bit)  # the row bit: the bottom half
        np.left_shift(bit, level, out=shifted, dtype=np.int32, casting="unsafe")
        rows |= shifted
        # the column bit: the right half, u in [a, a + b) or u >= a + b + c
        np.greater_equal(u, ta, out=right)
        np.greater(right, bit, out=right)  # right and not bit
        np.greater_equal(u, tabc, out=bit)
        right |= bit
        np.left_shift(right, level, out=shifted, dtype=np.int32, casting="unsafe")
        cols |= shifted
    return rows, cols


def _integer(x: object) -> TypeGuard[numbers.Integral]:
    """An int or numpy integer, not a bool."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _check(
    scale: object,
    edge_factor: object,
    a: float,
    b: float,
    c: float,
    seed: object,
    weights: object,
) -> None:
    """Refuse arguments that name no graph, saying what to pass instead."""
    if not _integer(scale) or not 1 <= int(scale) <= MAX_SCALE:
        raise InputError(
            f"rmat: scale must be an integer from 1 to {MAX_SCALE} (the graph has 2**scale "
            f"vertices), not {scale!r}"
        )
    if not _integer(edge_factor) or int(edge_factor) < 1:
        raise InputError(
            f"rmat: edge_factor must be an integer >= 1 (edges generated per vertex; "
            f"Graph500 uses 16), not {edge_factor!r}"
        )
    for name, p in (("a", a), ("b", b), ("c", c)):
        if not isinstance(p, numbers.Real) or isinstance(p, bool) or not 0 < float(p) < 1:
            raise InputError(
                f"rmat: probability {name} must be a number strictly between 0 and 1, "
                f"not {p!r} (Graph500 uses a, b, c = 0.57, 0.19, 0.19)"
            )
    if not a + b + c < 1:
        raise InputError(
            f"rmat: a + b + c must be below 1 (d = 1 - a - b - c is the fourth quadrant's "
            f"probability), but a + b + c = {a + b + c!r}; lower a, b or c"
        )
    if not _integer(seed) or int(seed) < 0:
        raise InputError(f"rmat: seed must be a non-negative integer, not {seed!r}")
    if weights is not None:
        if (
            not isinstance(weights, tuple)
            or len(weights) != 2
            or not all(_integer(w) for w in weights)
        ):
            raise InputError(
                f"rmat: weights must be None (a pattern of 1s) or a pair of integers "
                f"(lo, hi), not {weights!r}"
            )
        lo, hi = weights
        if lo > hi:
            raise InputError(f"rmat: weights=(lo, hi) needs lo <= hi, got {weights!r}; swap them")
