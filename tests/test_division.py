"""Division keeps sparsity (issue 23, item 3).

Under ``division="sparse"`` (the default) ``a / b`` is structurally absent where ``a`` is:
``y(i) = A(i,j)*x(j)/d(i)`` walks A's entries only, ``C(i,j) = A(i,j)/d(i)`` into CSR keeps
A's pattern, and a divisor absent where the numerator is present reads 0 (``a/0 = ±inf``).
Under ``division="ieee"`` every entry is the dense IEEE value (``0/0 = NaN`` at absent
entries). `Kernel.check` compares with the convention the kernel was built with.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import sparse_array

import sparsec
from sparsec import Tensor
from sparsec.frontend.concrete import concretize, exact
from sparsec.frontend.notation import Access
from sparsec.frontend.parser import parse_expression
from sparsec.middle.lattice import Iterator, build

TARGETS = ("c", "cuda-emulated")
DTYPES = (("float64", "int32"), ("float32", "int64"))


def _csr(dense: np.ndarray, dtype: str, index_dtype: str, zeros: int = 1) -> Tensor:
    """``dense`` as CSR with ``zeros`` explicit zeros stored in non-empty rows."""
    rows, cols = np.nonzero(dense)
    full_rows = set(rows.tolist())
    extra = [(i, j) for i, j in zip(*np.nonzero(dense == 0), strict=True) if i in full_rows]
    extra = extra[:zeros]
    coords = np.array(
        [rows.tolist() + [i for i, _ in extra], cols.tolist() + [j for _, j in extra]],
        dtype=np.int64,
    )
    values = np.concatenate([dense[rows, cols], np.zeros(len(extra))])
    return Tensor.from_coo(coords, values, dense.shape, "csr", dtype=dtype, index_dtype=index_dtype)


def _stored(t: Tensor) -> np.ndarray:
    mask = np.zeros(t.shape, dtype=bool)
    mask[tuple(t.coords()[0])] = True
    return mask


def _assert_same(got: np.ndarray, want: np.ndarray, dtype: str) -> None:
    got = np.asarray(got, dtype=np.float64)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    finite = np.isfinite(want)
    rtol = 1e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(got[finite], want[finite], rtol=rtol, atol=rtol)
    np.testing.assert_array_equal(np.sign(got[~finite]), np.sign(want[~finite]))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype,index_dtype", DTYPES)
def test_spmv_divided_by_a_dense_vector(dtype, index_dtype, target, rng):
    dense = sparse_array((8, 6), rng)
    A = _csr(dense, dtype, index_dtype)
    x = rng.uniform(-1, 1, 6).astype(dtype)
    d = rng.uniform(0.5, 2, 8).astype(dtype)
    empty = ~_stored(A).any(axis=1)
    assert empty.any() and (~empty).any()
    d[np.flatnonzero(empty)[0]] = 0.0  # 0/0 where the row is empty: absent, so 0
    d[np.flatnonzero(~empty)[0]] = 0.0  # a present row over 0: ±inf (or NaN for a 0 sum)
    k = sparsec.kernel("y(i) = A(i,j) * x(j) / d(i)", {"A": "csr"}, target=target, dtype=dtype)
    a = A.to_dense().astype(np.float64)
    with np.errstate(all="ignore"):
        want = np.where(empty, 0.0, (a @ x.astype(np.float64)) / d.astype(np.float64))
    _assert_same(k(A=A, x=x, d=d), want, dtype)
    k.check(A=A, x=x, d=d)


@pytest.mark.parametrize("dtype,index_dtype", DTYPES)
def test_csr_divided_by_a_vector_keeps_the_pattern(dtype, index_dtype, rng):
    dense = sparse_array((9, 7), rng)
    A = _csr(dense, dtype, index_dtype)
    d = rng.uniform(0.5, 2, 9).astype(dtype)
    d[np.flatnonzero(_stored(A).any(axis=1))[0]] = 0.0
    k = sparsec.kernel("C(i,j) = A(i,j) / d(i)", {"A": "csr", "C": "csr"}, dtype=dtype)
    C = k(A=A, d=d).validate()
    assert C.nnz == A.nnz
    np.testing.assert_array_equal(C.coords()[0], A.coords()[0])
    with np.errstate(all="ignore"):
        want = np.where(_stored(A), A.to_dense() / d[:, None], 0.0).astype(np.float64)
    _assert_same(C.to_dense(), want, dtype)
    k.check(A=A, d=d)


@pytest.mark.parametrize("target", TARGETS)
def test_csr_divided_by_a_vector_into_a_dense_output(target, rng):
    A = _csr(sparse_array((6, 5), rng), "float64", "int32")
    d = rng.uniform(0.5, 2, 6)
    d[0] = 0.0
    k = sparsec.kernel("C(i,j) = A(i,j) / d(i)", {"A": "csr"}, target=target)
    with np.errstate(all="ignore"):
        want = np.where(_stored(A), A.to_dense() / d[:, None], 0.0)
    _assert_same(k(A=A, d=d), want, "float64")
    k.check(A=A, d=d)


def _two(rng: np.random.Generator) -> tuple[Tensor, Tensor]:
    a, b = sparse_array((7, 6), rng), sparse_array((7, 6), rng)
    b[a != 0] = np.where(rng.random(int((a != 0).sum())) < 0.5, 0.0, 1.5)  # some A over no B
    return _csr(a, "float64", "int32"), _csr(b, "float64", "int32", zeros=0)


@pytest.mark.parametrize("target", TARGETS)
def test_ieee_division_is_nan_at_absent_entries(target, rng):
    A, B = _two(rng)
    k = sparsec.kernel(
        "C(i,j) = A(i,j) / B(i,j)", {"A": "csr", "B": "csr"}, target=target, division="ieee"
    )
    got = k(A=A, B=B)
    with np.errstate(all="ignore"):
        want = A.to_dense() / B.to_dense()
    _assert_same(got, want, "float64")
    assert np.isnan(got[~_stored(A) & ~_stored(B)]).all()
    k.check(A=A, B=B)


@pytest.mark.parametrize("target", TARGETS)
def test_sparse_division_of_two_sparse_matrices(target, rng):
    A, B = _two(rng)
    k = sparsec.kernel("C(i,j) = A(i,j) / B(i,j)", {"A": "csr", "B": "csr"}, target=target)
    got = k(A=A, B=B)
    a_there, b_there = _stored(A), _stored(B)
    with np.errstate(all="ignore"):
        want = np.where(a_there, A.to_dense() / B.to_dense(), 0.0)
    _assert_same(got, want, "float64")
    only_a = a_there & ~b_there & (A.to_dense() != 0)
    assert only_a.any()
    assert np.isinf(got[only_a]).all()  # A present over an absent B: a/0
    assert (got[~a_there] == 0).all()  # absent numerator: absent
    k.check(A=A, B=B)


def test_sparse_division_into_csr_has_the_numerator_s_pattern(rng):
    A, B = _two(rng)
    k = sparsec.kernel("C(i,j) = A(i,j) / B(i,j)", {"A": "csr", "B": "csr", "C": "csr"})
    C = k(A=A, B=B).validate()
    np.testing.assert_array_equal(C.coords()[0], A.coords()[0])
    k.check(A=A, B=B)


@pytest.mark.parametrize("division", ["sparse", "ieee"])
@pytest.mark.parametrize(
    "expr,fmts",
    [
        ("y(i) = A(i,j) * x(j) / d(i)", {"A": "csr"}),
        ("y(i) = A(i,j) * x(j) * (1 / w(i))", {"A": "csr"}),
        ("y(i) = A(i,j) / w(i) + x(i)", {"A": "csr"}),
        ("C(i,j) = A(i,j) / d(i) + B(i,j)", {"A": "csr", "B": "csr", "C": "csr"}),
        ("a(i) = b(i) / c(i)", {"b": "s", "c": "s"}),
        ("y(i) = 1 / (A(i,j) * x(j) + 2)", {"A": "csr"}),
    ],
)
def test_check_passes_under_both_conventions(expr, fmts, division):
    k = sparsec.kernel(expr, fmts, division=division)
    for seed, density in enumerate((0.0, 0.3, 1.0)):
        inputs, _ = k.random_inputs(seed=seed, density=density)
        k.check(**inputs)


def test_the_conventions_differ_where_the_numerator_is_absent():
    A = Tensor.from_dense(np.array([[1.0, 0.0], [0.0, 0.0]]), "csr")
    d = np.array([0.0, 0.0])
    with np.errstate(all="ignore"):
        sparse = sparsec.kernel("C(i,j) = A(i,j) / d(i)", {"A": "csr"})(A=A, d=d)
        ieee = sparsec.kernel("C(i,j) = A(i,j) / d(i)", {"A": "csr"}, division="ieee")(A=A, d=d)
    np.testing.assert_array_equal(sparse, [[np.inf, 0.0], [0.0, 0.0]])
    assert np.isinf(ieee[0, 0]) and np.isnan(ieee[[0, 1, 1], [1, 0, 1]]).all()


def _points(text: str, var: str, sparse: dict[str, int], division: str) -> list[list[str]]:
    """The merge lattice of ``var`` (``sparse``: the level of each compressed operand
    that holds ``var``), as the lowering builds it under ``division``."""
    rhs = concretize(parse_expression(text)).rhs

    def iterator_of(access: Access) -> Iterator | None:
        level = sparse.get(access.name)
        return None if level is None or var not in access.indices else Iterator(access, level)

    lattice = build(rhs, iterator_of, exact(rhs, division))
    return [sorted(str(it) for it in p.iterators) for p in lattice.points]


def test_sparse_division_lattice_is_the_numerator_s():
    # b / c: the numerator's points, the divisor co-iterated where present
    assert _points("a(i) = b(i) / c(i)", "i", {"b": 0, "c": 0}, "sparse") == [["b1", "c1"], ["b1"]]
    assert _points("a(i) = b(i) / c(i)", "i", {"b": 0, "c": 0}, "ieee") == [
        ["b1", "c1"],
        ["b1"],
        ["c1"],
        [],
    ]
    # the nested sum of A(i,j)*x(j)/d(i) at j walks A's row only (no dense loop over j)
    body = "t(i) = A(i,j) * x(j) / d(i)"
    assert _points(body, "j", {"A": 1}, "sparse") == [["A2"]]
    assert [] in _points(body, "j", {"A": 1}, "ieee")


def test_sparse_division_walks_the_numerator_s_positions():
    # "ieee" is the exact lowering: a dense loop over j, every case; "sparse" walks A's row
    ieee = sparsec.kernel("y(i) = A(i,j) * x(j) / d(i)", {"A": "csr"}, division="ieee")
    sparse = sparsec.kernel("y(i) = A(i,j) * x(j) / d(i)", {"A": "csr"})
    assert "for (int64_t j = 0; j < j_dim; j++)" in ieee.source
    assert "for (int64_t j = 0; j < j_dim; j++)" not in sparse.source
    assert "for (int64_t pA2 = A2_pos[pA1]; pA2 < pA2_end; pA2++)" in sparse.source


def test_a_sum_over_an_empty_range_is_absent_in_the_reference():
    """``o = sum(i, T0(i)) / sum(j, T1(j))`` with i and j of extent 0: neither sum reaches a
    term, so under the sparse convention the quotient is absent (0), as the kernel computes;
    the reference read a dense operand's empty sum as present (0 / 0 = NaN)."""
    x = np.zeros(0)
    k = sparsec.kernel("o = -(-(T0(i) / T1(j)) / 2)", {"T0": "d:0", "T1": "d:0"})
    assert float(k(T0=x, T1=x)) == 0.0
    k.check(T0=x, T1=x)
    ieee = sparsec.kernel("o = T0(i) / T1(j)", {"T0": "d:0", "T1": "d:0"}, division="ieee")
    assert np.isnan(float(ieee(T0=x, T1=x)))
    ieee.check(T0=x, T1=x)


@pytest.mark.parametrize(
    "expr",
    [
        "O(i) = T0(i) / (T1(i,k) / x(k))",
        "O(i) = -(T0(i) / -(T1(i,k) / x(k)))",
        "O(i) = T0(i) / (T1(i,k) * (1 / x(k)))",
    ],
)
def test_a_quotient_inside_a_divisor_is_absent_where_its_numerator_is(expr):
    """Found by the fuzzer: a divisor's nested sparse quotient at an empty row of T1, over
    x(k) = 0. It is absent (0 whatever 0/0 would be) as everywhere under the sparse
    convention, so the divisor is a zero and the result infinite, as the kernel computes;
    the reference computed the divisor densely (0/0 = NaN) and called the kernel wrong."""
    T1 = Tensor.from_dense(np.array([[0.0, 0.0], [0.0, 2.0]]), "csr")
    inputs = {"T0": np.array([1.0, 3.0]), "T1": T1, "x": np.array([0.0, 4.0])}
    for target in TARGETS:
        k = sparsec.kernel(expr, {"T1": "csr"}, target=target)
        with np.errstate(all="ignore"):
            got = k(**inputs)
        assert np.isinf(got[0]) and abs(got[1]) == 6.0, got
        k.check(**inputs)


def test_a_sum_whose_terms_are_all_absent_is_absent():
    """Found by the slow fuzz: in ``o = -(-(Σk T0(i,j,k) / T1(i)) / T2(j))`` with k of
    extent 0, each term of the sum over i is absent (its sum over k reaches nothing), so
    that sum is absent too and the quotient by T2 = 0 is 0. The sum over i set its flag at
    every term, present or not, and the kernel returned 0/0 = NaN (a dense output only:
    a sparse output's sums already asked whether each term was present)."""
    expr = "o = -(-(T0(i,j,k) / T1(i)) / T2(j))"
    inputs = {"T0": np.zeros((2, 1, 0)), "T1": np.zeros(2), "T2": np.zeros(1)}
    for target in TARGETS:
        k = sparsec.kernel(expr, {}, target=target)
        assert float(k(**inputs)) == 0.0
        k.check(**inputs)


@pytest.mark.parametrize("target", ["c", "cuda-emulated"])
@pytest.mark.parametrize(
    "expr",
    [
        "O(k) = (T0(k) + T1(k,s)) / T2(k)",
        "O(k) = (T0(k) - T1(k,s)) / T2(k)",
        "O(k) = (T0(k) + T3(s,k)) / T2(k)",
    ],
)
def test_a_sum_that_reaches_nothing_beside_an_absent_access_is_absent(expr, target):
    """Where T0 stores nothing the lattice's case is ``Σs T1(k,s) / T2(k)``: a quotient
    present only where the sum reaches a term. The statement's quotient is surely present
    (T0 is an access), so no flag was kept for the sum and an empty row of T1 over a zero
    of T2 gave 0/0 = NaN instead of 0 (found by tests/test_fuzz_formats.py); the last
    form sums over an empty range (extent 0)."""
    t0 = Tensor.from_dense(np.array([1.0, 0.0, 0.0]), "s")
    t1 = Tensor.from_dense(np.array([[1.0, 0.0], [0.0, 0.0], [0.0, 2.0]]), "ds")
    formats = {"T0": "s", "T1": "ds"} if "T1" in expr else {"T0": "s"}
    k = sparsec.kernel(expr, formats, target=target)
    args = {"T0": t0, "T2": np.zeros(3)}
    args.update({"T1": t1} if "T1" in expr else {"T3": np.zeros((0, 3))})
    got = k(**args)
    assert got[1] == 0.0  # T0 absent there, T1's row empty: the quotient is absent
    k.check(**args)
