"""Differential fuzz of `sparsec.Tensor`'s operators, numpy's entry points and
`sparsec.einsum` against numpy on the densified operands (issue 36, "close the blind
spot").

Operands are random matrices and order-3 tensors in every format the operators take (csr,
csc, coo, dcsr, dcsc; csf and coo for order 3), with small integer values (every sum is
exact), explicit stored zeros and empty rows; dense operands are numpy or torch, float32,
float64 or integer. The reference follows the documented contract (sparsec/api/array.py,
docs/semantics.md), computed by numpy and by plain Python sets over the stored
coordinates, never by sparsec: each result's value, its kind (dense like the dense operand,
or a `Tensor`), its format (T's for + - * and scalar ops), its stored pattern (union for
+ and -, intersection for *, T's for a scalar or dense factor, the structural product for
T @ S, stored zeros kept) and its dtype (torch's promotion over the floating operands;
integers and numbers never widen). Every numpy entry point gives what the operator does,
and what has no sparse meaning is an `InputError`.

Fast suite: `FAST` draws (fixed seeds) over CSR and CSC matrices and CSF cubes, one value
dtype per seed, so that it compiles few kernels (the session's cache starts empty; each
draw checks about 45 results); ``-m slow``: `SLOW` draws over every format and dtype pair.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sparsec
from sparsec.base.errors import InputError

FAST, SLOW = 40, 4000
MATRIX_FORMATS = ("csr", "csc", "coo", "dcsr", "dcsc")
CUBE_FORMATS = ("csf", "coo")


def random_sparse(rng, shape, fmt, dtype):
    """A Tensor with integer values, a stored zero where there is room, an empty first row;
    returned with its dense array and its set of stored coordinates."""
    cells = int(np.prod(shape))
    count = int(rng.integers(0, cells + 1)) if cells else 0
    flat = rng.choice(cells, count, replace=False) if count else np.zeros(0, dtype=np.int64)
    coords = np.array(np.unravel_index(flat, shape), dtype=np.int64).reshape(len(shape), -1)
    if shape[0] > 1:  # an empty first row
        coords = coords[:, coords[0] != 0]
    vals = rng.integers(-4, 5, coords.shape[1]).astype(dtype)
    if vals.size and rng.random() < 0.7:
        vals[rng.integers(vals.size)] = 0.0  # an explicit zero (maybe one more from the draw)
    t = sparsec.Tensor.from_coo(coords, vals, shape, fmt, dtype=dtype)
    dense = np.zeros(shape, dtype=dtype)
    dense[tuple(coords)] = vals
    stored = set(map(tuple, coords.T.tolist()))
    assert t.nnz == len(stored)
    return t, dense, stored


def pattern(t):
    return set(map(tuple, t.coords()[0].T.tolist()))


def dense_operand(rng, shape, library):
    kind = rng.choice(["float64", "float32", "int32"])
    x = rng.integers(-3, 4, shape).astype(kind)
    return (torch.from_numpy(x) if library == "torch" else x), x


def promoted(*dtypes):
    """torch's rule over the floating dtypes (integers take no part; none: float64)."""
    floats = {np.dtype(d) for d in dtypes if np.dtype(d).kind == "f"}
    return np.dtype(np.float32) if floats == {np.dtype(np.float32)} else np.dtype(np.float64)


def as_numpy(result):
    return result.numpy() if isinstance(result, torch.Tensor) else result


class Case:
    """One draw: ``check`` compares a result with the reference and says which case failed."""

    def __init__(self, rng, order, profile):
        self.rng = rng
        m, n, k = (int(rng.integers(1, 6)) for _ in range(3))
        if rng.random() < 0.05:
            m = 0 if rng.random() < 0.5 else m
        self.shape = (m, n) if order == 2 else (m, n, k)
        formats = MATRIX_FORMATS if order == 2 else CUBE_FORMATS
        formats, dtypes = profile or (formats, (np.float32, np.float64))
        formats = [f for f in formats if (f in MATRIX_FORMATS) == (order == 2)]
        self.fmts = [formats[rng.integers(len(formats))] for _ in range(2)]
        self.dts = [dtypes[rng.integers(len(dtypes))] for _ in range(2)]
        self.T, self.D, self.P = random_sparse(rng, self.shape, self.fmts[0], self.dts[0])
        self.library = "torch" if rng.random() < 0.3 else "numpy"
        self.what = f"shape={self.shape} formats={self.fmts} dtypes={self.dts} {self.library}"

    def check(self, name, got, want, *, sparse=None, fmt=None, stored=None, dtype=None, like=None):
        what = f"{self.what}: {name}"
        if sparse is not None:
            assert isinstance(got, sparsec.Tensor) == sparse, f"{what}: kind {type(got)}"
        if isinstance(got, sparsec.Tensor):
            if fmt is not None:
                assert str(got.format) == fmt, f"{what}: format {got.format} != {fmt}"
            if stored is not None:
                assert pattern(got) == stored, f"{what}: pattern {pattern(got)} != {stored}"
            value = got.to_scipy().toarray() if got.order == 2 else np.asarray(got)
        else:
            if like is not None:  # dense results are of the dense operand's library
                torch_in = isinstance(like, torch.Tensor)
                assert isinstance(got, torch.Tensor) == torch_in, f"{what}: got {type(got)}"
            value = as_numpy(got)
        if dtype is not None:
            assert np.dtype(str(value.dtype)) == np.dtype(dtype), f"{what}: dtype {value.dtype}"
        np.testing.assert_array_equal(np.asarray(value, dtype=np.float64), want, err_msg=what)


def matrix_case(rng, profile=None):
    c = Case(rng, 2, profile)
    T, D, P = c.T, c.D, c.P
    m, n = c.shape
    fmt = str(T.format)
    S, E, Q = random_sparse(rng, c.shape, c.fmts[1], c.dts[1])
    both = promoted(c.dts[0], c.dts[1])
    x, xn = dense_operand(rng, (n,), c.library)
    X, Xn = dense_operand(rng, (n, int(rng.integers(1, 4))), c.library)
    y, yn = dense_operand(rng, (m,), c.library)
    w, wn = dense_operand(rng, (m, n), c.library)
    # products with dense operands: dense, of the dense operand's library
    for name, got, want, other, given in [
        ("T @ x", T @ x, D @ xn, xn, x),
        ("np.dot(T, x)", np.dot(T, xn), D @ xn, xn, xn),
        ("np.matmul(T, x)", np.matmul(T, xn), D @ xn, xn, xn),
        ("T @ X", T @ X, D @ Xn, Xn, X),
        ("y @ T", y @ T, yn @ D, yn, y),
        ("np.dot(y, T)", np.dot(yn, T), yn @ D, yn, yn),
    ]:
        dtype = promoted(c.dts[0], other.dtype)
        c.check(name, got, want, sparse=False, dtype=dtype, like=given)
    # sparse @ sparse: the structural product, a Tensor
    R, F, _ = random_sparse(rng, (n, int(rng.integers(1, 5))), c.fmts[1], c.dts[1])
    rows = {}
    for a, b in _stored_of(R):
        rows.setdefault(a, set()).add(b)
    product = {(i, j) for i, k in P for j in rows.get(k, ())}
    for name, got in [("T @ S", T @ R), ("np.matmul(T, S)", np.matmul(T, R))]:
        c.check(name, got, D @ F, sparse=True, stored=product, dtype=both)
    # elementwise with a sparse operand: union / intersection in T's format
    for name, got, want, stored in [
        ("T + S", T + S, D + E, P | Q),
        ("T - S", T - S, D - E, P | Q),
        ("T * S", T * S, D * E, P & Q),
        ("np.add(T, S)", np.add(T, S), D + E, P | Q),
        ("np.multiply(T, S)", np.multiply(T, S), D * E, P & Q),
    ]:
        c.check(name, got, want, sparse=True, fmt=fmt, stored=stored, dtype=both)
    # with dense operands matched to trailing modes
    for name, got, want, other, given in [
        ("T + w", T + w, D + wn, wn, w),
        ("w - T", w - T, wn - D, wn, w),
        ("T + x", T + x, D + xn, xn, x),
        ("np.subtract(T, x)", np.subtract(T, xn), D - xn, xn, xn),
    ]:
        dtype = promoted(c.dts[0], other.dtype)
        c.check(name, got, want, sparse=False, dtype=dtype, like=given)
    for name, got, want, other in [
        ("T * w", T * w, D * wn, wn),
        ("x * T", x * T, xn * D, xn),
        ("np.multiply(x, T)", np.multiply(xn, T), xn * D, xn),
    ]:
        c.check(
            name, got, want, sparse=True, fmt=fmt, stored=P, dtype=promoted(c.dts[0], other.dtype)
        )
    # numbers: T's pattern and dtype, stored zeros kept
    s = float(rng.integers(-3, 4)) or 2.0
    number = (s, np.float64(s), np.float32(s), np.int64(int(s)))[rng.integers(4)]
    for name, got, want in [
        ("s * T", number * T, s * D),
        ("T * s", T * number, D * s),
        ("T / s", T / number, D / s),
        ("-T", -T, -D),
        ("np.negative(T)", np.negative(T), -D),
        ("T + 0", T + 0, D),
    ]:
        c.check(name, got, want, sparse=True, fmt=fmt, stored=P, dtype=c.dts[0])
    # transpose, sums, dtypes
    flipped = {(j, i) for i, j in P}
    c.check("T.T", T.T, D.T, sparse=True, stored=flipped, dtype=c.dts[0])
    c.check("np.transpose(T)", np.transpose(T), D.T, sparse=True, stored=flipped)
    c.check("T.sum()", np.asarray(T.sum()), D.sum())
    for axis in (0, 1, -1):
        c.check(f"T.sum({axis})", T.sum(axis), D.sum(axis), sparse=False, dtype=c.dts[0])
        c.check(f"np.sum(T, {axis})", np.sum(T, axis=axis), D.sum(axis), sparse=False)
    other = np.float64 if c.dts[0] == np.float32 else np.float32
    c.check("astype", T.astype(other), D, sparse=True, fmt=fmt, stored=P, dtype=other)
    # einsum, numpy's spelling, against numpy's einsum
    for spelling, operands, dense in [
        ("ij,j->i", (T, xn), (D, xn)),
        ("ij,ij->", (T, S), (D, E)),
        ("ij->j", (T,), (D,)),
        ("ij,kj->ik", (T, S), (D, E)),
    ]:
        want = np.einsum(spelling, *(a.astype(np.float64) for a in dense))
        c.check(f"einsum {spelling}", sparsec.einsum(spelling, *operands), want, sparse=False)
    got = sparsec.einsum("ij,ij->ij", T, S, out_format="csr")
    c.check("einsum ij,ij->ij csr", got, D * E, sparse=True, fmt="csr", stored=P & Q)
    # what has no sparse meaning is refused, the same way at every entry point
    for name, call in [
        ("T + 1", lambda: T + 1),
        ("np.exp", lambda: np.exp(T)),
        ("np.allclose", lambda: np.allclose(T, D)),
        ("np.add out=", lambda: np.add(T, S, out=np.zeros(c.shape))),
    ]:
        with pytest.raises(InputError):
            call()
            raise AssertionError(f"{c.what}: {name} was not refused")
    return c.what


def cube_case(rng, profile=None):
    c = Case(rng, 3, profile)
    T, D, P = c.T, c.D, c.P
    fmt = str(T.format)
    S, E, Q = random_sparse(rng, c.shape, c.fmts[1], c.dts[1])
    both = promoted(c.dts[0], c.dts[1])
    z, zn = dense_operand(rng, c.shape[1:], c.library)
    for name, got, want, stored in [
        ("T + S", T + S, D + E, P | Q),
        ("T - S", T - S, D - E, P | Q),
        ("T * S", T * S, D * E, P & Q),
    ]:
        c.check(name, got, want, sparse=True, fmt=fmt, stored=stored, dtype=both)
    c.check("T * z", T * z, D * zn, sparse=True, fmt=fmt, stored=P)
    c.check("T + z", T + z, D + zn, sparse=False)
    c.check("2 * T", 2 * T, 2 * D, sparse=True, fmt=fmt, stored=P, dtype=c.dts[0])
    for axis in (None, 0, 2, (0, 1)):
        c.check(f"T.sum({axis})", np.asarray(T.sum(axis)), D.sum(axis))
    c.check("einsum ijk,jk->i", sparsec.einsum("ijk,jk->i", T, zn), np.einsum("ijk,jk->i", D, zn))
    return c.what


def _stored_of(t):
    return pattern(t)


def _run(seed, count, profile=None):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        (matrix_case if rng.random() < 0.8 else cube_case)(rng, profile)


@pytest.mark.parametrize(("seed", "dtype"), [(0, np.float64), (1, np.float32)])
def test_tensor_operators_fuzz(seed, dtype):
    _run(seed, FAST // 2, (("csr", "csc", "csf"), (dtype,)))


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(100, 110))
def test_tensor_operators_fuzz_slow(seed):
    _run(seed, SLOW // 10)
