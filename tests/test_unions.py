"""Sums of many sparse operands: one flagged co-iteration body (`sparsec.lower.union`), code
linear in the number of operands, same values and the same stored pattern as the merge
lattice's cases would give (an entry wherever some operand stores one, explicit zeros and
exact cancellations kept).

Every operand stores explicit zeros and has empty rows; references are dense numpy sums and
the union of the operands' stored patterns.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
from conftest import sparse_array

import sparsec
from sparsec.base.errors import ScheduleError
from sparsec.frontend.notation import Access, BinOp, Literal
from sparsec.middle.lattice import Iterator, UnionLattice, build, union_lattice

COSTS = sys.modules["sparsec.policy.costs"]
I, J, K = 9, 11, 5
TOL = {"float32": 1e-5, "float64": 1e-12}


def _operand(
    shape: tuple[int, ...], fmt: str, rng: np.random.Generator, dtype: str, index_dtype: str
):
    """(dense values, stored pattern, the argument): a sparse operand stores its nonzeros
    and a few explicit zeros; a dense one is every coordinate."""
    arr = sparse_array(shape, rng, density=0.3).astype(dtype)
    if fmt == "dense":
        return arr, np.ones(shape, dtype=bool), arr
    stored = (arr != 0) | ((rng.random(shape) < 0.05) & (arr == 0))
    if shape[0] > 2:
        stored[rng.integers(shape[0])] = False  # an empty row
        arr[~stored] = 0
    coords = np.nonzero(stored)
    tensor = sparsec.Tensor.from_coo(
        np.stack(coords), arr[coords], shape, fmt, index_dtype=index_dtype
    )
    assert tensor.nnz == int(stored.sum())
    return arr, stored, tensor


def _sum(n: int) -> tuple[str, list[tuple[float, str]]]:
    """``A0 - A1 + 2 * A2 + A3 - A4 + 2 * A5 ...`` over (i,j): the text and its terms."""
    terms = [(1.0, "+"), (-1.0, "-"), (2.0, "+ 2 *")]
    picked = [(terms[t % 3][0], f"{terms[t % 3][1]} A{t}(i,j)") for t in range(n)]
    text = " ".join(s for _, s in picked).removeprefix("+ ")
    return f"C(i,j) = {text}", picked


def _run_sum(n, fmts, out_fmt, dtype, index_dtype, rng, same=None, target="c"):
    expr, terms = _sum(n)
    dense, pattern, given = {}, np.zeros((I, J), dtype=bool), {}
    want = np.zeros((I, J))
    for t, (scale, _) in enumerate(terms):
        name = f"A{t}"
        if same is not None and t in same:  # the same tensor as another operand
            arr, stored, arg = dense[f"A{same[t]}"], None, given[f"A{same[t]}"]
        else:
            arr, stored, arg = _operand((I, J), fmts[t], rng, dtype, index_dtype)
            pattern |= stored
        dense[name], given[name] = arr, arg
        want += scale * arr.astype(np.float64)
    formats = {f"A{t}": fmts[t] for t in range(n)} | {"C": out_fmt}
    k = sparsec.kernel(expr, formats, target=target)
    return k, given, want, pattern


def _check_out(out, want, pattern, dtype, sparse: bool) -> None:
    tol = TOL[dtype]
    np.testing.assert_allclose(np.asarray(out, dtype=np.float64), want, rtol=tol, atol=tol)
    if sparse:
        out.validate("C")
        got = np.zeros(pattern.shape, dtype=bool)
        got[tuple(out.to_scipy().tocoo().coords)] = True
        np.testing.assert_array_equal(got, pattern)  # structural, explicit zeros kept
        assert out.nnz == int(pattern.sum())


CSR_CASES = [
    (4, "csr", "float64", "int32"),
    (4, "dense", "float32", "int64"),
    (5, "csr", "float32", "int32"),
    (5, "dense", "float64", "int64"),
    (8, "csr", "float64", "int64"),
    (8, "csr", "float32", "int32"),
    (8, "dense", "float32", "int32"),
    (12, "csr", "float64", "int32"),
]


@pytest.mark.parametrize(("n", "out", "dtype", "index_dtype"), CSR_CASES)
def test_csr_sum_matches_numpy(n, out, dtype, index_dtype, rng, monkeypatch):
    k, given, want, pattern = _run_sum(n, ["csr"] * n, out, dtype, index_dtype, rng)
    got = k(**given)
    _check_out(got, want, pattern, dtype, out != "dense")
    assert "while" in k.source  # a merge, not a dense loop over j
    for threads in (1, 2):
        _check_out(k(**given, threads=threads), want, pattern, dtype, out != "dense")
    if out != "dense":
        # the two-phase assembly (counting, then filling) builds the same storage
        monkeypatch.setattr(COSTS, "SINGLE_PASS_ENTRIES", -1)
        for threads in (1, 2):
            _check_out(k(**given, threads=threads), want, pattern, dtype, True)


def test_cancellation_keeps_entries_as_exact_zeros(rng):
    # A1 is A0: A0 - A1 cancels to exact zeros that a sparse output keeps (TACO's semantics)
    k, given, want, pattern = _run_sum(5, ["csr"] * 5, "csr", "float64", "int32", rng, {1: 0})
    out = k(**given)
    _check_out(out, want, pattern, "float64", True)
    only_a0 = ~(given["A2"].to_dense() != 0) & ~(given["A3"].to_dense() != 0)
    only_a0 &= ~(given["A4"].to_dense() != 0) & (given["A0"].to_dense() != 0)
    assert only_a0.any()
    np.testing.assert_array_equal(out.to_dense()[only_a0], 0.0)


@pytest.mark.parametrize("out", ["csr", "dense", "dcsr"])
def test_mixed_formats(out, rng):
    fmts = ["dense", "csr", "dcsr", "csr", "csr", "dense", "dcsr"]
    k, given, want, pattern = _run_sum(7, fmts, out, "float64", "int64", rng)
    _check_out(k(**given), want, pattern, "float64", out != "dense")
    _check_out(k(**given, threads=2), want, pattern, "float64", out != "dense")


@pytest.mark.parametrize("out", ["dcsr", "dense"])
def test_dcsr_sum_is_a_union_at_both_levels(out, rng, monkeypatch):
    k, given, want, pattern = _run_sum(6, ["dcsr"] * 6, out, "float32", "int64", rng)
    _check_out(k(**given), want, pattern, "float32", out != "dense")
    assert len(k.source) < 40_000
    if out != "dense":
        monkeypatch.setattr(COSTS, "SINGLE_PASS_ENTRIES", -1)
        _check_out(k(**given, threads=2), want, pattern, "float32", True)


@pytest.mark.parametrize("out", ["csf", "dense"])
def test_csf_3d_sum(out, rng, monkeypatch):
    n = 6
    expr = "C(i,j,k) = " + " + ".join(f"B{t}(i,j,k)" for t in range(n))
    given, want = {}, np.zeros((I, J, K))
    pattern = np.zeros((I, J, K), dtype=bool)
    for t in range(n):
        arr, stored, given[f"B{t}"] = _operand((I, J, K), "csf", rng, "float64", "int32")
        want += arr
        pattern |= stored
    k = sparsec.kernel(expr, {f"B{t}": "csf" for t in range(n)} | {"C": out})
    got = k(**given)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12, atol=1e-12)
    if out != "dense":
        got.validate("C")
        assert got.nnz == int(pattern.sum())
        monkeypatch.setattr(COSTS, "SINGLE_PASS_ENTRIES", -1)
        again = k(**given, threads=2)
        np.testing.assert_allclose(np.asarray(again), want, rtol=1e-12, atol=1e-12)
        assert again.nnz == int(pattern.sum())
    assert len(k.source) < 60_000


@pytest.mark.parametrize(("dtype", "index_dtype"), [("float32", "int32"), ("float64", "int64")])
def test_cuda_emulated(dtype, index_dtype, rng):
    k, given, want, pattern = _run_sum(
        8, ["csr"] * 8, "dense", dtype, index_dtype, rng, target="cuda-emulated"
    )
    _check_out(k(**given), want, pattern, dtype, False)
    try:
        k = sparsec.kernel(
            _sum(8)[0], {f"A{t}": "csr" for t in range(8)} | {"C": "csr"}, target="cuda-emulated"
        )
    except ScheduleError as err:
        assert "sparse outputs have no GPU mapping" in str(err)  # refused, never wrong
    else:
        _check_out(k(**given), want, pattern, dtype, True)


@pytest.mark.parametrize(("n", "bound"), [(8, 40_000), (16, 80_000), (24, 120_000)])
@pytest.mark.parametrize("fmt", ["csr", "dcsr"])
def test_source_grows_linearly(n, bound, fmt):
    # 2^n lattice points would be millions of lines: the flags keep one body per level
    k = sparsec.kernel(_sum(n)[0], {f"A{t}": fmt for t in range(n)} | {"C": fmt})
    assert len(k.source) < bound


# ----------------------------------------------------------------- the lattice side
def _terms(n: int, conjunction: bool = False):
    accesses = [Access(f"A{t}", ("i",)) for t in range(n)]
    expr = accesses[0]
    if conjunction:
        expr = BinOp("*", accesses[0], accesses[1])
    for a in accesses[1 + conjunction :]:
        expr = BinOp("+", expr, BinOp("*", Literal(2.0), a))
    return expr, (lambda a: Iterator(a, 0) if a.name.startswith("A") else None)


def test_union_lattice_only_past_the_threshold():
    expr, it_of = _terms(3)
    assert union_lattice(expr, it_of) is None
    assert not isinstance(build(expr, it_of), UnionLattice)
    expr, it_of = _terms(40)  # 2^40 points, were they built
    lattice = build(expr, it_of)
    assert isinstance(lattice, UnionLattice)
    assert len(lattice.iterators) == 40 and not lattice.full and len(lattice.points) == 1
    assert not lattice.range_loop and not lattice.position_loop
    # a term needing two iterators (an intersection) is left to the lattice
    expr, it_of = _terms(5, conjunction=True)
    assert union_lattice(expr, it_of) is None
    # a term needing none (a located operand) makes it full: a dense loop over the range
    expr, it_of = _terms(5)
    expr = BinOp("-", expr, Access("d", ("i",)))
    lattice = union_lattice(expr, it_of)
    assert lattice is not None and lattice.full
    assert union_lattice(expr, it_of, exact=True) is None
    # a flagged lattice built point by point after all is the ordinary one
    expr, it_of = _terms(4)
    assert len(build(expr, it_of, flagged=False).points) == 15


def test_factors_of_an_absent_term_are_never_evaluated(rng):
    # x(j) is infinite where A0 stores nothing: the lattice skips A0's term there, and so
    # must the flags (the guard covers the whole term, not only A0's load: 0 * inf is NaN)
    shape = (I, J)
    ops = [_operand(shape, "csr", rng, "float64", "int32") for _ in range(5)]
    x, y = rng.uniform(1, 2, J), rng.uniform(1, 2, I)
    empty_cols = np.flatnonzero(~ops[0][1].any(axis=0))
    x[empty_cols] = np.inf
    assert empty_cols.size
    expr = "C(i,j) = A0(i,j) * x(j) + A1(i,j) * y(i) + A2(i,j) / 4 - A3(i,j) + -A4(i,j)"
    with np.errstate(invalid="ignore"):
        terms = [ops[0][0] * x, ops[1][0] * y[:, None], ops[2][0] / 4, -ops[3][0], -ops[4][0]]
        want = sum(np.where(op[1], t, 0.0) for op, t in zip(ops, terms, strict=True))
    pattern = np.any([op[1] for op in ops], axis=0)
    given = {f"A{t}": op[2] for t, op in enumerate(ops)} | {"x": x, "y": y}
    for out in ("csr", "dense"):
        k = sparsec.kernel(expr, {f"A{t}": "csr" for t in range(5)} | {"C": out})
        got = k(**given)
        assert np.isfinite(np.asarray(got)[:, empty_cols]).all()
        _check_out(got, want, pattern, "float64", out != "dense")


def test_a_union_whose_terms_end_above_the_inner_loop_uses_the_lattice(rng):
    # b(i) has no level at j: below an absent b the inner loop would see its term as
    # present everywhere, so the loop over i (4 iterators) keeps the lattice's cases
    mats = [_operand((I, J), "dcsr", rng, "float64", "int64") for _ in range(3)]
    b = _operand((I,), "s", rng, "float64", "int64")
    expr = "C(i,j) = A0(i,j) + A1(i,j) + A2(i,j) + b(i)"
    given = {f"A{t}": m[2] for t, m in enumerate(mats)} | {"b": b[2]}
    want = sum(m[0] for m in mats) + b[0][:, None]
    pattern = np.any([m[1] for m in mats], axis=0) | b[1][:, None]
    for out in ("dcsr", "dense"):
        k = sparsec.kernel(expr, {f"A{t}": "dcsr" for t in range(3)} | {"b": "s", "C": out})
        _check_out(k(**given), want, pattern, "float64", out != "dense")
