"""Regrouped dense factors (`sparsec.middle.regroup`).

``p2(i) = A(i,j) * p(j) / g(j)`` reads ``A(i,j) * T(j)`` with ``T = p / g`` computed once
per call: the same values up to rounding (and the same zeros, infs and NaNs), the same
sparsity, on every format of A, both dtypes and index widths, C and the CUDA shim. Not
done where it could change a value: ``division="ieee"``, semirings, nested sums, a
user's schedule, a mask.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import sparse_array

import sparsec
from sparsec import Tensor
from sparsec.middle.spec import Folded

TARGETS = ("c", "cuda-emulated")
DTYPES = (("float64", "int32"), ("float32", "int64"))
PAGERANK = "p2(i) = A(i,j) * p(j) / g(j)"


def _folds(k: sparsec.Kernel) -> list[Folded]:
    return [d for d in k.spec.derived if isinstance(d, Folded)]


def _tensor(dense: np.ndarray, fmt: str, dtype: str, index_dtype: str) -> Tensor:
    """``dense`` stored in ``fmt`` with one explicit zero in a non-empty row."""
    rows, cols = np.nonzero(dense)
    zero = next(
        (i, j) for i, j in zip(*np.nonzero(dense == 0), strict=True) if i in set(rows.tolist())
    )
    coords = np.array([[*rows, zero[0]], [*cols, zero[1]]], dtype=np.int64)
    values = np.concatenate([dense[rows, cols], [0.0]])
    return Tensor.from_coo(coords, values, dense.shape, fmt, dtype=dtype, index_dtype=index_dtype)


def _assert_same(got: np.ndarray, want: np.ndarray, dtype: str) -> None:
    got = np.asarray(got, dtype=np.float64)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    finite = np.isfinite(want)
    rtol = 1e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(got[finite], want[finite], rtol=rtol, atol=rtol)
    np.testing.assert_array_equal(np.sign(got[~finite]), np.sign(want[~finite]))


def _pagerank_reference(A: Tensor, p: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Σj (A*p)/g over A's stored entries, in float64 (absent entries add nothing)."""
    coords = A.coords()[0]
    vals = A.coords()[1].astype(np.float64)
    out = np.zeros(A.shape[0])
    with np.errstate(all="ignore"):
        terms = vals * p.astype(np.float64)[coords[1]] / g.astype(np.float64)[coords[1]]
    np.add.at(out, coords[0], terms)
    return out


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype,index_dtype", DTYPES)
@pytest.mark.parametrize("fmt", ["csr", "csc", "coo"])
def test_pagerank_is_regrouped_and_exact(fmt, dtype, index_dtype, target, rng):
    dense = sparse_array((9, 7), rng)
    A = _tensor(dense, fmt, dtype, index_dtype)
    p = rng.uniform(-1, 1, 7).astype(dtype)
    g = rng.uniform(0.5, 2, 7).astype(dtype)
    k = sparsec.kernel(PAGERANK, {"A": fmt}, target=target, dtype=dtype)
    (fold,) = _folds(k)
    assert [f.source.name for f in fold.factors] == ["p", "g"]
    assert "regrouped into p_fold(j)" in k.schedule
    got = k(A=A, p=p, g=g)
    _assert_same(got, _pagerank_reference(A, p, g), dtype)
    k.check(A=A, p=p, g=g)  # raises on a mismatch


@pytest.mark.parametrize("target", TARGETS)
def test_zero_divisors_and_infinities_keep_their_nans(target, rng):
    """(A*p)/g and A*(p/g) agree on every inf and NaN: a stored zero of A over g = 0 is
    NaN, a non-zero one ±inf, p = inf over g = inf is NaN; absent entries stay 0."""
    dense = sparse_array((8, 6), rng)
    A = _tensor(dense, "csr", "float64", "int32")
    coords = A.coords()[0]
    p = rng.uniform(-1, 1, 6)
    g = rng.uniform(0.5, 2, 6)
    g[coords[1][0]] = 0.0  # a column holding a stored entry: ±inf (NaN for the stored 0)
    g[coords[1][-1]] = -0.0  # the column of the stored zero: NaN
    j = next(c for c in range(6) if c not in coords[1][[0, -1]])
    p[j], g[j] = np.inf, np.inf
    k = sparsec.kernel(PAGERANK, {"A": "csr"}, target=target)
    assert _folds(k)
    want = _pagerank_reference(A, p, g)
    assert np.isnan(want).any() and np.isinf(want).any()
    _assert_same(k(A=A, p=p, g=g), want, "float64")
    k.check(A=A, p=p, g=g)  # raises on a mismatch


def test_the_fold_follows_the_values_of_each_call(rng):
    A = _tensor(sparse_array((6, 5), rng), "csr", "float64", "int32")
    k = sparsec.kernel(PAGERANK, {"A": "csr"})
    for _ in range(3):
        p, g = rng.uniform(-1, 1, 5), rng.uniform(0.5, 2, 5)
        _assert_same(k(A=A, p=p, g=g), _pagerank_reference(A, p, g), "float64")


def test_torch_inputs_and_float32(rng):
    torch = pytest.importorskip("torch")
    dense = sparse_array((7, 6), rng)
    A = torch.from_numpy(dense.astype(np.float32)).to_sparse_csr()
    p, g = torch.rand(6, dtype=torch.float32), torch.rand(6, dtype=torch.float32) + 0.5
    k = sparsec.kernel(PAGERANK, {"A": "csr"})
    got = k(A=A, p=p, g=g)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float32
    want = dense @ (p.double().numpy() / g.double().numpy())
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("target", TARGETS)
def test_divisors_only_and_two_groups(target, rng):
    """``A/g/h`` divides by T = g*h; ``A*p*q*r*s`` with p, q over j and r, s over i
    folds two groups."""
    dense = sparse_array((7, 6), rng)
    A = _tensor(dense, "csr", "float64", "int32")
    a = A.to_dense()
    g, h = rng.uniform(0.5, 2, 6), rng.uniform(0.5, 2, 6)
    out = "csr" if target == "c" else "dense"  # sparse outputs on the GPU: issue 22
    k = sparsec.kernel("Y(i,j) = A(i,j) / g(j) / h(j)", {"A": "csr", "Y": out}, target=target)
    (fold,) = _folds(k)
    assert all(f.divides for f in fold.factors)
    Y = k(A=A, g=g, h=h)
    if out == "csr":
        assert Y.nnz == A.nnz  # the stored zero stays stored
        Y = Y.to_dense()
    np.testing.assert_allclose(Y, a / g / h, rtol=1e-12)
    p, q, r, s = (rng.uniform(-1, 1, n) for n in (6, 6, 7, 7))
    k = sparsec.kernel("y(i) = r(i) * A(i,j) * p(j) * s(i) * q(j)", {"A": "csr"}, target=target)
    assert len(_folds(k)) == 2
    want = (r * s) * (a @ (p * q))
    np.testing.assert_allclose(k(A=A, p=p, q=q, r=r, s=s), want, rtol=1e-12)


@pytest.mark.parametrize("target", TARGETS)
def test_a_matrix_fold_with_transposed_factors(target, rng):
    """``B(i,j,k) * C(j,k) * D(k,j)`` with D column-major folds ``T(j,k) = C ⊙ Dᵀ``."""
    dense = sparse_array((4, 5, 6), rng, density=0.3)
    B = Tensor.from_dense(dense, "csf")
    C, D = rng.uniform(-1, 1, (5, 6)), rng.uniform(-1, 1, (6, 5))
    k = sparsec.kernel(
        "y(i) = B(i,j,k) * C(j,k) * D(k,j)",
        {"B": "csf", "D": "dd:1,0"},
        target=target,
    )
    assert _folds(k)
    want = np.einsum("ijk,jk,kj->i", dense, C, D)
    np.testing.assert_allclose(k(B=B, C=C, D=D), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "expr,options",
    [
        (PAGERANK, {"division": "ieee"}),
        ("p2(i) = A(i,j) * p(j) * g(j)", {"semiring": "max_times"}),
        ("p2(i) = A(i,j) * p(j) / g(j)", {"schedule": "reorder(i,j)"}),
        # the sum over j stays inside: (Σj A*x) / g * h is not Σj A*x*(h/g)
        ("y(i) = A(i,j) * x(j) / g(i) * h(i)", {}),
        # no sparse factor over more variables than the group's
        ("y(j) = a(j) * p(j) * g(j)", {"formats": {"a": "sparse"}}),
    ],
)
def test_not_regrouped_where_it_could_change_a_value(expr, options, rng):
    options = dict(options)
    formats = options.pop("formats", {"A": "csr"})
    k = sparsec.kernel(expr, formats, **options)
    assert not _folds(k)
    assert "regrouped" not in k.schedule


def test_nested_sum_keeps_its_nan(rng):
    """``(Σj A*x) / g * h`` at g = 0 over a row whose terms are all 0 (one stored zero) is
    0/0 = NaN, where a regrouped Σj A*x*(h/g) would differ in which entries become NaN."""
    A = Tensor.from_coo(np.array([[0, 1, 1], [0, 0, 1]]), np.array([0.0, 2.0, 3.0]), (3, 2), "csr")
    x, g, h = np.array([1.0, 1.0]), np.array([0.0, 0.0, 1.0]), np.array([1.0, 1.0, 1.0])
    k = sparsec.kernel("y(i) = A(i,j) * x(j) / g(i) * h(i)", {"A": "csr"})
    got = k(A=A, x=x, g=g, h=h)
    assert np.isnan(got[0]) and got[1] == np.inf and got[2] == 0.0
    k.check(A=A, x=x, g=g, h=h)  # raises on a mismatch


def test_a_mask_is_never_a_factor_of_the_fold(rng):
    dense = sparse_array((7, 6), rng)
    A = _tensor(dense, "csr", "float64", "int32")
    M = Tensor.from_dense(np.array([1.0, 0, 0, 1, 1, 0, 1]), "sparse")
    p, g = rng.uniform(-1, 1, 6), rng.uniform(0.5, 2, 6)
    k = sparsec.kernel("y(i) = A(i,j) * p(j) * g(j)", {"A": "csr", "y": "dense"}, mask="M")
    (fold,) = _folds(k)
    assert [f.source.name for f in fold.factors] == ["p", "g"]
    want = np.where(M.to_dense() != 0, dense @ (p * g), 0.0)
    np.testing.assert_allclose(k(A=A, p=p, g=g, M=M), want, rtol=1e-12, atol=1e-15)
    k.check(A=A, p=p, g=g, M=M)  # raises on a mismatch


def test_the_generated_code_reads_one_dense_factor(rng):
    k = sparsec.kernel(PAGERANK, {"A": "csr"})
    src = k.generated().source
    assert "p_fold_vals" in src and "g_vals" not in src and "p_vals" not in src
    ieee = sparsec.kernel(PAGERANK, {"A": "csr"}, division="ieee").generated().source
    assert "p_fold" not in ieee


def test_a_fold_inside_a_nested_chain(rng):
    """A chain under ``-`` inside a quotient folds first; the outer chain then reads the
    fold's access, which is not a tensor of the spec yet (differential seed 2912 raised
    KeyError: 'T0_fold')."""
    expr = "o = (-((T0(j) * T1(j)) * (T2(j,k,i) + T3(i))) / ((T4(i,j,k) + T5(j)) / 3))"
    formats = {"T0": "d", "T1": "d", "T2": "uqq:1,0,2", "T3": "d", "T4": "uqq:1,0,2", "T5": "d"}
    k = sparsec.kernel(expr, formats)
    assert [f.name for f in _folds(k)] == ["T0_fold"]
    inputs, _ = k.random_inputs({"i": 3, "j": 5, "k": 3}, seed=251852, density=0.4)
    k.check(**inputs)  # raises on a mismatch
