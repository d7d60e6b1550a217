"""Complemented structural masks (issue 23, item 7): ``mask="~M"`` computes the output only
where ``M`` stores NO entry (GraphBLAS's ``C<!M> = A*B``: a BFS frontier masked by the
visited set). ``M``'s explicit zeros are entries all the same. ``M`` is co-iterated in the
merge lattice: where its last level is present the case computes nothing. Compared with
numpy on densified inputs, on the C target and ``cuda-emulated``."""

from __future__ import annotations

import numpy as np
import pytest
from test_masks import TARGETS, TYPES, dense, matrix, pattern, tensor

import sparsec


def product(a: np.ndarray, b: np.ndarray, stored: np.ndarray) -> np.ndarray:
    return np.where(~stored, a @ b, 0.0)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(("dtype", "index"), TYPES)
@pytest.mark.parametrize("out", ["csr", "dense"])
@pytest.mark.parametrize("threads", [1, 2])
def test_complement_spgemm(target: str, dtype: str, index: str, out: str, threads: int) -> None:
    a, b = matrix(7, 6, 1), matrix(6, 8, 2)
    stored, m = pattern((7, 8), 3, "csr", index)
    fmts = {"A": "csr", "B": "csr", "C": "csr" if out == "csr" else "dd"}
    k = sparsec.kernel(
        "C(i,j) = A(i,k) * B(k,j)", fmts, mask="~M", target=target, dtype=dtype, index_dtype=index
    )
    inputs = {"A": tensor(a, "csr", dtype, index), "B": tensor(b, "csr", dtype, index), "M": m}
    got = k(**inputs, threads=threads)
    want = product(a, b, stored)
    np.testing.assert_allclose(dense(got), want, rtol=1e-6)
    assert (want != 0).any() and ((a @ b) != 0)[stored].any()  # the mask removes something
    if out == "csr":
        # presence is the product's and not M's: no entry where M stores one
        rows, cols = got.coords()[0]
        assert not stored[rows, cols].any()
        assert got.nnz == int(((a != 0).astype(int) @ (b != 0).astype(int) != 0)[~stored].sum())
    k.check(**inputs)


@pytest.mark.parametrize("mfmt", ["dcsr", "csr"])
def test_complement_mask_formats(mfmt: str) -> None:
    """M compressed at both levels (a row absent from M allows the whole row) or CSR."""
    a, b = matrix(6, 5, 21), matrix(5, 7, 22)
    stored, m = pattern((6, 7), 23, mfmt, "int32")
    k = sparsec.kernel(
        "C(i,j) = A(i,k) * B(k,j)", {"A": "csr", "B": "csr", "C": "csr", "M": mfmt}, mask="~M"
    )
    inputs = {"A": tensor(a, "csr", "float64", "int32"), "B": tensor(b, "csr", "float64", "int32")}
    np.testing.assert_allclose(dense(k(**inputs, M=m)), product(a, b, stored))
    k.check(**inputs, M=m)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(("dtype", "index"), TYPES)
@pytest.mark.parametrize("threads", [1, 2])
def test_bfs_step_masked_by_unvisited(target: str, dtype: str, index: str, threads: int) -> None:
    """One BFS step: the next frontier ``f2(i) = A(j,i) * f(j)`` where ``v``, the visited
    set (a sparse vector), stores no entry."""
    rng = np.random.default_rng(31)
    adj = (rng.random((10, 10)) < 0.3).astype(float)
    adj[4, :] = 0.0  # an empty row
    frontier = np.zeros(10)
    frontier[[0, 3, 7]] = 1.0
    visited, v = pattern((10,), 32, "s", index)
    visited[[0, 3, 7]] = True
    v = sparsec.Tensor.from_coo(
        np.array([np.nonzero(visited)[0]]),
        np.zeros(int(visited.sum())),
        (10,),
        "s",
        index_dtype=index,
    )  # explicit zeros: entries all the same
    k = sparsec.kernel(
        "f2(i) = A(j,i) * f(j)",
        {"A": "csr", "f2": "d"},
        mask="~v",
        target=target,
        dtype=dtype,
        index_dtype=index,
    )
    got = dense(
        k(A=tensor(adj, "csr", dtype, index), f=frontier.astype(dtype), v=v, threads=threads)
    )
    want = np.where(~visited, adj.T @ frontier, 0.0)
    assert want.any() and (adj.T @ frontier)[visited].any()
    np.testing.assert_allclose(got, want)
    k.check(A=tensor(adj, "csr", dtype, index), f=frontier.astype(dtype), v=v)


@pytest.mark.parametrize("out", ["s", "d"])
def test_spmv_sparse_vector_complement(out: str) -> None:
    """``y<!M> = A x`` with a sparse vector M, into a sparse and a dense output."""
    a = matrix(8, 8, 8)
    x = np.random.default_rng(9).integers(1, 3, 8).astype(float)
    stored, m = pattern((8,), 10, "s", "int64")
    k = sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": "csr", "y": out}, mask="~M")
    got = k(A=tensor(a, "csr", "float64", "int64"), x=x, M=m)
    np.testing.assert_allclose(dense(got), np.where(~stored, a @ x, 0.0))
    if out == "s":
        assert not stored[got.coords()[0][0]].any()


@pytest.mark.parametrize("target", TARGETS)
def test_spmv_dense_mask_allows_nothing(target: str) -> None:
    """A dense M stores every coordinate (its level is located), so ``~M`` allows none:
    the output stays absent (0); its values, zeros included, do not matter."""
    a = matrix(6, 5, 41)
    x = np.arange(1.0, 6.0)
    m = np.zeros(6)
    k = sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": "csr", "M": "d"}, mask="~M", target=target)
    got = dense(k(A=tensor(a, "csr", "float64", "int32"), x=x, M=m))
    np.testing.assert_array_equal(got, np.zeros(6))
    assert (a @ x).any()
    k.check(A=tensor(a, "csr", "float64", "int32"), x=x, M=m)


def test_csr_mask_of_dense_matrix_rows() -> None:
    """A mask stored ``ds`` with a compressed first level and dense rows ("sd"): a row M
    stores is masked out entirely (located test), a row it does not store is allowed."""
    a, b = matrix(5, 4, 51), matrix(4, 6, 52)
    rows = np.array([0, 3])
    stored = np.zeros((5, 6), dtype=bool)
    stored[rows, :] = True
    m = sparsec.Tensor.from_dense(stored.astype(float), "sd")
    k = sparsec.kernel(
        "C(i,j) = A(i,k) * B(k,j)", {"A": "csr", "B": "csr", "C": "dd", "M": "sd"}, mask="~M"
    )
    inputs = {"A": tensor(a, "csr", "float64", "int32"), "B": tensor(b, "csr", "float64", "int32")}
    np.testing.assert_allclose(dense(k(**inputs, M=m)), product(a, b, stored))


@pytest.mark.parametrize("target", TARGETS)
def test_min_plus_complement(target: str) -> None:
    """Under min_plus, outside ``~M`` (where M has an entry) the output is absent: +inf."""
    a, x = matrix(6, 5, 17), np.arange(1.0, 6.0)
    stored, m = pattern((6,), 18, "s", "int32")
    k = sparsec.kernel(
        "y(i) = A(i,j) * x(j)", {"A": "csr"}, mask="~M", semiring="min_plus", target=target
    )
    got = dense(k(A=tensor(a, "csr", "float64", "int32"), x=x, M=m))
    terms = np.where(a != 0, a + x[None, :], np.inf).min(axis=1)
    np.testing.assert_array_equal(got, np.where(~stored, terms, np.inf))
    k.check(A=tensor(a, "csr", "float64", "int32"), x=x, M=m)


def test_complement_of_a_wide_union() -> None:
    """A sum of four sparse operands (a flagged union unmasked) under ``~M``: the lattice."""
    ops = {n: matrix(5, 6, 60 + s) for s, n in enumerate("ABDE")}
    stored, m = pattern((5, 6), 65, "csr", "int32")
    k = sparsec.kernel(
        "C(i,j) = A(i,j) + B(i,j) + D(i,j) + E(i,j)",
        {n: "csr" for n in [*ops, "C"]},
        mask="~M",
    )
    inputs = {n: tensor(v, "csr", "float64", "int32") for n, v in ops.items()}
    got = k(**inputs, M=m)
    np.testing.assert_allclose(dense(got), np.where(~stored, sum(ops.values()), 0.0))
    k.check(**inputs, M=m)


def test_check_on_random_inputs() -> None:
    k = sparsec.kernel("C(i,j) = A(i,k) * B(k,j)", {"A": "csr", "B": "csr", "C": "csr"}, mask="~M")
    inputs, _ = k.random_inputs(seed=3, density=0.4)
    k.check(**inputs)
    masked = sparsec.kernel(
        "C(i,j) = A(i,k) * B(k,j)", {"A": "csr", "B": "csr", "C": "csr"}, mask="M"
    )
    plain = sparsec.kernel("C(i,j) = A(i,k) * B(k,j)", {"A": "csr", "B": "csr", "C": "csr"})
    both = dense(k(**inputs)) + dense(masked(**inputs))
    np.testing.assert_allclose(both, dense(plain(A=inputs["A"], B=inputs["B"])))


def test_accumulate_keeps_entries_where_mask_stores() -> None:
    a, x = matrix(6, 5, 15), np.arange(5.0)
    stored, m = pattern((6,), 16, "s", "int32")
    k = sparsec.kernel("y(i) += A(i,j) * x(j)", {"A": "csr"}, mask="~M")
    got = dense(k(A=tensor(a, "csr", "float64", "int32"), x=x, M=m, y=np.full(6, 3.0)))
    np.testing.assert_allclose(got, np.where(~stored, 3.0 + a @ x, 3.0))


def test_no_complement_code_unchanged() -> None:
    """The complement adds no code to kernels without it: M's iteration shows only in ~M's."""
    fmts = {"A": "csr", "B": "csr", "C": "csr"}
    plain = sparsec.kernel("C(i,j) = A(i,k) * B(k,j)", fmts)
    comp = sparsec.kernel("C(i,j) = A(i,k) * B(k,j)", fmts, mask="~M")
    assert "M2_crd" in comp.source and "M2_crd" not in plain.source


def test_cli_complement(capsys: pytest.CaptureFixture[str]) -> None:
    from sparsec.cli import main

    expr = "C(i,j) = A(i,k) * B(k,j)"
    assert main(["compile", expr, "-f", "A:csr", "-f", "B:csr", "--mask", "~M", "--check"]) == 0
    assert "check: ok" in capsys.readouterr().out


@pytest.mark.parametrize("mask", ["M", "~M"])
def test_mask_re_laid_out(mask: str) -> None:
    """A CSC mask under a row-major loop order is re-laid out at call time (`Derived`);
    the re-layout is still the mask (a pattern; ``~`` kept): its stored zeros are entries."""
    a, b = matrix(7, 6, 1), matrix(6, 8, 2)
    stored, m = pattern((7, 8), 3, "csc", "int32")
    fmts = {"A": "csr", "B": "csr", "C": "csr", "M": "csc"}
    k = sparsec.kernel("C(i,j) = A(i,k) * B(k,j)", fmts, mask=mask)
    assert k.spec.derived  # the case this pins: M is read through a re-layout
    inputs = {"A": tensor(a, "csr", "float64", "int32"), "B": tensor(b, "csr", "float64", "int32")}
    keep = ~stored if mask.startswith("~") else stored
    np.testing.assert_allclose(dense(k(**inputs, M=m)), np.where(keep, a @ b, 0.0))
    k.check(**inputs, M=m)


@pytest.mark.parametrize(
    "schedule",
    ["pos(j,jpos,A), split(jpos,j0,j1,2)", "split(i,i0,i1,2), parallelize(i0,CPUThread,NoRaces)"],
)
def test_complement_under_a_schedule(schedule: str) -> None:
    """A position space over A meets M's iterator: each case is located in M's segment,
    the case where M is present still computes nothing."""
    a = matrix(7, 8, 1)
    stored, m = pattern((7, 8), 3, "csr", "int32")
    fmts = {"A": "csr", "C": "dd", "M": "csr"}
    k = sparsec.kernel("C(i,j) = A(i,j) * 2", fmts, mask="~M", schedule=schedule)
    got = dense(k(A=tensor(a, "csr", "float64", "int32"), M=m, threads=2))
    np.testing.assert_allclose(got, np.where(~stored, 2 * a, 0.0))
    assert (a != 0)[stored].any()


def test_pos_over_the_complemented_mask_refused() -> None:
    """``~M`` is present where M is not: a loop over M's positions cannot compute it."""
    with pytest.raises(sparsec.ScheduleError, match="where M has no entry"):
        sparsec.kernel(
            "C(i,j) = A(i,j) * 2",
            {"A": "csr", "C": "dd", "M": "csr"},
            mask="~M",
            schedule="pos(j,jpos,M)",
        )


def test_lattice_of_a_complement() -> None:
    """At M's last level: the point where M is present is a skip case (ZERO) above the
    rhs's point; M alone is no point (no loop over M's rest); a dense rhs (no iterator)
    keeps the skip above ∅."""
    from sparsec.frontend.concrete import ZERO
    from sparsec.frontend.notation import Access, BinOp
    from sparsec.middle.lattice import Iterator, build

    m, a = Access("M", ("i",), complement=True), Access("A", ("i",))
    expr = BinOp("*", m, a)
    sparse = build(expr, lambda x: Iterator(x, 0))
    assert [(sorted(map(str, p.iterators)), p.expr) for p in sparse.points] == [
        (["A1", "M1"], ZERO),
        (["A1"], a),
    ]
    dense_rhs = build(expr, lambda x: Iterator(x, 0) if x is m else None)
    assert [(sorted(map(str, p.iterators)), p.expr) for p in dense_rhs.points] == [
        (["M1"], ZERO),
        ([], a),
    ]
    upper = build(BinOp("*", Access("M", ("i", "j"), complement=True), a), lambda x: Iterator(x, 0))
    assert all(p.expr is not ZERO for p in upper.points)  # M's level 1 of 2: deeper decides


@pytest.mark.parametrize("mfmt", ["csr", "dcsr", "sd"])
@pytest.mark.parametrize("out", ["csr", "dcsr", "coo"])
def test_sparse_accumulate_keeps_current_value_where_mask_stores(mfmt: str, out: str) -> None:
    """Issue 36, item 4: ``C += E`` under ``~M`` into a sparse C keeps C's current value
    where M stores an entry, also where E and C are both present there (that lattice point
    was a skip case for the whole ``C_old + ~M * E``, C_old included); "sd" (M's last level
    dense) is decided in the lowerer rather than the lattice."""
    a = matrix(6, 7, 71)
    c = matrix(6, 7, 72)
    if mfmt == "sd":
        stored = np.zeros((6, 7), dtype=bool)
        stored[[0, 3, 4], :] = True
        m = sparsec.Tensor.from_coo(np.array(np.nonzero(stored)), np.zeros(21), (6, 7), "sd")
    else:
        stored, m = pattern((6, 7), 73, mfmt, "int32")
    k = sparsec.kernel("C(i,j) += A(i,j)", {"A": "csr", "C": out, "M": mfmt}, mask="~M")
    current = tensor(c, out, "float64", "int32")
    got = k(A=tensor(a, "csr", "float64", "int32"), C=current, M=m)
    want = np.where(stored, c, c + a)
    assert ((a != 0) & (c != 0) & stored).any()  # the case that was dropped
    np.testing.assert_array_equal(dense(got), want)
    rows, cols = got.coords()[0]
    assert set(zip(rows, cols, strict=True)) == set(
        zip(*np.nonzero((c != 0) | ((a != 0) & ~stored)), strict=True)
    )
    k.check(A=tensor(a, "csr", "float64", "int32"), C=current, M=m)
