"""Dot loops summed on vector lanes in blocks (`sparsec.passes.dots`): which loops the pass
takes, and that the blocked sums equal dense torch at every block boundary, with empty rows,
stored zeros and sparse outputs whose presence a dot loop decides."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import sparsec
from sparsec.policy.decision import DEFAULTS

BLOCK = DEFAULTS.dot_block


def _csr(rows: int, cols: int, density: float, rng, dtype, stored_zero: bool = True):
    a = sp.random(rows, cols, density=density, format="csr", random_state=rng, dtype=np.float64)
    a.data = rng.integers(-3, 4, a.nnz).astype(np.float64)  # integers: any order sums alike
    if rows > 1:
        a = a.tolil()
        a[rows // 2, :] = 0  # an empty row
        a = a.tocsr()
        a.eliminate_zeros()
    if stored_zero and a.nnz:
        a.data[0] = 0.0  # a stored zero
    return a.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("index_dtype", ["int32", "int64"])
@pytest.mark.parametrize("t", [1, BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK + 5])
def test_sddmm_dot_loop_matches_torch_at_block_boundaries(dtype, index_dtype, t, rng):
    """dW(o,i) = W(o,i) * dY(o,t) * X(i,t): W's pattern, a dot product over t per entry
    (the gradient of a pruned linear layer's weight), CSR output."""
    k = sparsec.kernel(
        "dW(o,i) = W(o,i) * dY(o,t) * X(i,t)",
        {"W": "csr", "dW": "csr"},
        dtype=np.dtype(dtype).name,
        index_dtype=index_dtype,
    )
    assert "omp simd reduction(+:sc_dot" in k.source
    W = _csr(13, 9, 0.4, rng, dtype)
    dY = rng.integers(-3, 4, (13, t)).astype(dtype)
    X = rng.integers(-3, 4, (9, t)).astype(dtype)
    for threads in (1, 2):
        got = k(W=W, dY=dY, X=X, threads=threads)
        want = torch.from_numpy(W.toarray()) * (torch.from_numpy(dY) @ torch.from_numpy(X).T)
        assert np.array_equal(got.to_dense(), want.numpy())
        # the output's pattern is W's, stored zeros included
        assert got.to_scipy().nnz == W.nnz


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [0, 1, BLOCK, 2 * BLOCK + 3])
def test_dense_gemv_and_row_sums_match_torch(dtype, n, rng):
    gemv = sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": "dense"}, dtype=np.dtype(dtype).name)
    sums = sparsec.kernel("y(i) = A(i,j)", {"A": "csr"}, dtype=np.dtype(dtype).name)
    for k in (gemv, sums):
        assert "omp simd reduction(+:sc_dot" in k.source, k.assignment
    A = rng.integers(-3, 4, (7, n)).astype(dtype)
    x = rng.integers(-3, 4, n).astype(dtype)
    assert np.array_equal(gemv(A=A, x=x), (torch.from_numpy(A) @ torch.from_numpy(x)).numpy())
    S = _csr(7, n, 0.5, rng, dtype) if n else sp.csr_matrix((7, 0), dtype=dtype)
    assert np.array_equal(sums(A=S, threads=2), np.asarray(S.sum(axis=1)).ravel().astype(dtype))


def test_a_gather_or_a_strided_walk_is_left_serial():
    """CSR SpMV gathers x at each entry's column; C(i,k) * D(k,j) under a user's loop order
    walks D down a column (the default reads a transposed copy): vector lanes would serve
    both with gathers, so their loops stay as they were."""
    for expr, formats, schedule in (
        ("y(i) = A(i,j) * x(j)", {"A": "csr"}, None),
        ("A(i,j) = B(i,j) * C(i,k) * D(k,j)", {"A": "csr", "B": "csr"}, "reorder(i,j,k)"),
    ):
        assert "sc_dot" not in sparsec.kernel(expr, formats, schedule=schedule).source, expr


def test_a_semiring_sum_is_not_reordered():
    k = sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": "dense"}, semiring="min_plus")
    assert "sc_dot" not in k.source


def test_float32_long_dot_keeps_double_precision(rng):
    """float32 terms summed in value-typed partials of BLOCK terms added into the double
    accumulator: a 1e6-term dot product of uniform [0, 1) terms stays within a few float32
    ulps of the exact sum (a float running sum drifts by ~1e-3 here)."""
    n = 1_000_000
    A = rng.random((1, n)).astype(np.float32)
    x = rng.random(n).astype(np.float32)
    k = sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": "dense"}, dtype="float32")
    got = float(k(A=A, x=x)[0])
    exact = float(A[0].astype(np.float64) @ x.astype(np.float64))
    assert abs(got - exact) / exact < 1e-6


def test_the_schedule_note_says_so():
    k = sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": "dense"})
    assert "summed on vector lanes" in k.source


@pytest.mark.parametrize("t", [0, 1, BLOCK + 1])
def test_reached_flags_are_set_outside_the_lanes(t, rng):
    """A dot loop sets a sparse output's "reached" flag every iteration, so the flag is
    set once before the blocks when the loop runs at all (no ``max`` reduction on the
    lanes): an empty sum (t = 0) stores no entry, any other stores W's pattern."""
    k = sparsec.kernel("dW(o,i) = W(o,i) * dY(o,t) * X(i,t)", {"W": "csr", "dW": "csr"})
    assert "omp simd reduction(+:sc_dot" in k.source
    assert "reduction(max:" not in k.source
    W = _csr(11, 7, 0.5, rng, np.float64)
    dY = rng.integers(-3, 4, (11, t)).astype(np.float64)
    X = rng.integers(-3, 4, (7, t)).astype(np.float64)
    want = torch.from_numpy(W.toarray()) * (torch.from_numpy(dY) @ torch.from_numpy(X).T)
    for threads in (1, 2):
        got = k(W=W, dY=dY, X=X, threads=threads)
        assert np.array_equal(got.to_dense(), want.numpy())
        assert got.to_scipy().nnz == (W.nnz if t else 0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_blocks_row_sums_into_value_typed_partials(dtype, rng):
    """A bsr block's row is a loop of fixed extent left to the C compiler to unroll; its
    terms sum into partials of the value type, added into the accumulator once per row
    (a float32 term is not converted to double one by one), equal to torch on integers
    with empty block rows."""
    k = sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": "bsr(4,4)"}, dtype=np.dtype(dtype).name)
    assert "sc_dot1_part0" in k.source and "omp simd" not in k.source
    assert "short dot loop(s) summed into value-typed partials" in k.source
    dense = np.zeros((16, 12), dtype=dtype)
    dense[0:4, 4:8] = rng.integers(-3, 4, (4, 4))
    dense[8:12, 0:4] = rng.integers(-3, 4, (4, 4))
    dense[8:12, 8:12] = rng.integers(-3, 4, (4, 4))
    a = sparsec.Tensor.from_scipy(sp.bsr_array(dense, blocksize=(4, 4)), "bsr(4,4)")
    x = rng.integers(-3, 4, 12).astype(dtype)
    want = (torch.from_numpy(dense) @ torch.from_numpy(x)).numpy()
    assert np.array_equal(k(A=a, x=x), want)
