"""Structural masks (issue 23, item 7): ``sparsec.kernel(..., mask="M")`` computes the
output only where ``M`` stores an entry (explicit zeros included; values ignored), as
GraphBLAS's masked operations; the mask is a pattern factor that drives the iteration.
Compared with numpy on densified inputs, on the C target and ``cuda-emulated``."""

from __future__ import annotations

import numpy as np
import pytest

import sparsec
from sparsec.base.errors import NotationError, SparsecError

TARGETS = ("c", "cuda-emulated")
TYPES = (("float32", "int32"), ("float64", "int64"))


def matrix(rows: int, cols: int, seed: int, density: float = 0.4) -> np.ndarray:
    """Values in 1..8 with an empty row and an empty column."""
    rng = np.random.default_rng(seed)
    a = np.where(rng.random((rows, cols)) < density, rng.integers(1, 9, (rows, cols)), 0.0)
    a[1 % rows, :] = 0.0
    a[:, 2 % cols] = 0.0
    return a


def pattern(shape: tuple[int, ...], seed: int, fmt: str, index: str) -> tuple[np.ndarray, object]:
    """A mask with an empty row whose stored values are mostly explicit zeros (they are
    structural entries all the same): (its stored pattern as bool, the tensor)."""
    rng = np.random.default_rng(seed)
    stored = rng.random(shape) < 0.45
    stored[(1 % shape[0],)] = False  # an empty row (or entry, for a vector)
    coords = np.nonzero(stored)
    values = np.where(rng.random(len(coords[0])) < 0.7, 0.0, 5.0)
    m = sparsec.Tensor.from_coo(np.array(coords), values, shape, fmt, index_dtype=index)
    return stored, m


def dense(out: object) -> np.ndarray:
    return np.asarray(out.to_dense() if hasattr(out, "to_dense") else out, dtype=float)


def tensor(a: np.ndarray, fmt: str, dtype: str, index: str) -> sparsec.Tensor:
    return sparsec.Tensor.from_dense(a.astype(dtype), fmt, index_dtype=index)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(("dtype", "index"), TYPES)
@pytest.mark.parametrize("out", ["csr", "dense"])
@pytest.mark.parametrize("threads", [1, 2])
def test_masked_spgemm(target: str, dtype: str, index: str, out: str, threads: int) -> None:
    a, b = matrix(7, 6, 1), matrix(6, 8, 2)
    stored, m = pattern((7, 8), 3, "csr", index)
    fmts = {"A": "csr", "B": "csr", "C": "csr" if out == "csr" else "dd"}
    k = sparsec.kernel(
        "C(i,j) = A(i,k) * B(k,j)", fmts, mask="M", target=target, dtype=dtype, index_dtype=index
    )
    inputs = {"A": tensor(a, "csr", dtype, index), "B": tensor(b, "csr", dtype, index), "M": m}
    got = k(**inputs, threads=threads)
    np.testing.assert_allclose(dense(got), np.where(stored, a @ b, 0.0), rtol=1e-6)
    if out == "csr":
        # the output's pattern is the mask's and the product's: nothing outside M is stored
        assert not (dense(got) != 0)[~stored].any()
        assert got.nnz <= int(stored.sum())
    k.check(**inputs)  # the reference masks independently of the rewrite


def test_masked_spgemm_default_formats() -> None:
    """With no format for M: the output's when sparse; its iteration is M's pos/crd."""
    a, b = matrix(5, 5, 4), matrix(5, 5, 5)
    stored, m = pattern((5, 5), 6, "csr", "int32")
    k = sparsec.kernel("C(i,j) = A(i,k) * B(k,j)", {"A": "csr", "B": "csr", "C": "csr"}, mask="M")
    assert str(k.spec.tensor("M").format) == str(k.spec.tensor("C").format)
    assert "M2_pos" in k.source and "M2_crd" in k.source
    got = k(A=tensor(a, "csr", "float64", "int32"), B=tensor(b, "csr", "float64", "int32"), M=m)
    np.testing.assert_allclose(dense(got), np.where(stored, a @ b, 0.0))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(("dtype", "index"), TYPES)
def test_triangle_counting(target: str, dtype: str, index: str) -> None:
    """GraphBLAS's triangle count: C = L*L masked by L, summed; numpy's trace(A^3)/6."""
    rng = np.random.default_rng(7)
    adj = np.triu(rng.random((9, 9)) < 0.5, 1)
    adj = adj | adj.T
    low = np.tril(adj, -1).astype(float)
    k = sparsec.kernel(
        "C(i,j) = L(i,k) * L(k,j)",
        {"L": "csr", "C": "csr" if target == "c" else "dd"},
        mask="M",
        target=target,
        dtype=dtype,
        index_dtype=index,
    )
    lt = tensor(low, "csr", dtype, index)
    got = dense(k(L=lt, M=lt))  # the same tensor as operand and mask
    a = adj.astype(float)
    assert got.sum() == pytest.approx(np.trace(a @ a @ a) / 6)
    np.testing.assert_allclose(got, np.where(low != 0, low @ low, 0.0))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(("dtype", "index"), TYPES)
@pytest.mark.parametrize("out", ["s", "d"])
def test_masked_spmv_bfs_step(target: str, dtype: str, index: str, out: str) -> None:
    """A BFS step's product, kept where a sparse vector mask stores an entry (a sparse
    vector output on the GPU: computed as one row, then compacted)."""
    a = matrix(8, 8, 8)
    x = np.random.default_rng(9).integers(0, 3, 8).astype(float)
    stored, m = pattern((8,), 10, "s", index)
    k = sparsec.kernel(
        "y(i) = A(i,j) * x(j)",
        {"A": "csr", "y": out},
        mask="M",
        target=target,
        dtype=dtype,
        index_dtype=index,
    )
    got = dense(k(A=tensor(a, "csr", dtype, index), x=x.astype(dtype), M=m))
    np.testing.assert_allclose(got, np.where(stored, a @ x, 0.0), rtol=1e-6)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(("dtype", "index"), TYPES)
def test_sddmm_like_driven_by_mask(target: str, dtype: str, index: str) -> None:
    """Dense A and B masked by a sparse M: the loops over i and j are M's (its pos/crd),
    so the product is computed only at M's entries (SDDMM's pattern)."""
    rng = np.random.default_rng(11)
    a, b = rng.uniform(-1, 1, (6, 4)), rng.uniform(-1, 1, (4, 7))
    stored, m = pattern((6, 7), 12, "csr", index)
    k = sparsec.kernel(
        "C(i,j) = A(i,k) * B(k,j)",
        {"M": "csr", "C": "csr" if target == "c" else "dd"},
        mask="M",
        target=target,
        dtype=dtype,
        index_dtype=index,
    )
    # B as passed (on C the kernel reads it transposed, `derive.contiguous`: B_as)
    assert k.formats["A"].is_dense and k.formats["B"].is_dense
    assert ("B_as" in k.source) == (target == "c")
    header = k.source.split("*/")[0]
    # C: i, j over M then k; CUDA's default mapping: threads over i, then k, j over M's row
    assert ("loop order: i, j, k" if target == "c" else "k, j" + chr(10)) in header
    src = k.source
    assert "M2_pos" in src and "M2_crd" in src
    got = k(A=a.astype(dtype), B=b.astype(dtype), M=m)
    np.testing.assert_allclose(dense(got), np.where(stored, a @ b, 0.0), rtol=1e-5, atol=1e-6)
    if target == "c":
        assert got.nnz == int(stored.sum())  # every entry of M, no other


def test_mask_values_ignored() -> None:
    """Structural: a mask of explicit zeros keeps the same entries as one of ones."""
    a = matrix(5, 5, 13)
    stored, m = pattern((5, 5), 14, "csr", "int32")
    k = sparsec.kernel("C(i,j) = A(i,j) * 2", {"A": "csr", "C": "csr"}, mask="M")
    ones = sparsec.Tensor.from_dense(stored.astype(float), "csr")
    t = tensor(a, "csr", "float64", "int32")
    np.testing.assert_array_equal(dense(k(A=t, M=m)), dense(k(A=t, M=ones)))
    np.testing.assert_array_equal(dense(k(A=t, M=m)), np.where(stored, 2 * a, 0.0))


def test_unmasked_source_unchanged() -> None:
    plain = sparsec.kernel("C(i,j) = A(i,k) * B(k,j)", {"A": "csr", "B": "csr", "C": "csr"})
    assert "M2_pos" not in plain.source


@pytest.mark.parametrize(
    ("mask", "words"),
    [
        ("A", "already a tensor"),
        ("C", "already a tensor"),
        ("2M", "not a tensor name"),
        ("M N", "not a tensor name"),
        ("~~M", "written once"),
        ("M~", "not a tensor name"),
    ],
)
def test_bad_mask_names(mask: str, words: str) -> None:
    with pytest.raises(NotationError, match=words):
        sparsec.kernel("C(i,j) = A(i,k) * B(k,j)", {"A": "csr"}, mask=mask)


def test_mask_must_be_a_string() -> None:
    with pytest.raises(SparsecError, match="tensor name"):
        sparsec.kernel("C(i,j) = A(i,k) * B(k,j)", {"A": "csr"}, mask=3)  # type: ignore[arg-type]


@pytest.mark.parametrize("target", TARGETS)
def test_accumulate_keeps_entries_outside_the_mask(target: str) -> None:
    """``y += M .* (A x)``: outside the mask the output keeps its current value."""
    a, x = matrix(6, 5, 15), np.arange(5.0)
    stored, m = pattern((6,), 16, "s", "int32")
    k = sparsec.kernel("y(i) += A(i,j) * x(j)", {"A": "csr"}, mask="M", target=target)
    y = np.full(6, 3.0)
    got = dense(k(A=tensor(a, "csr", "float64", "int32"), x=x, M=m, y=y.copy()))
    np.testing.assert_allclose(got, np.where(stored, 3.0 + a @ x, 3.0))


@pytest.mark.parametrize("out", ["csr", "dd"])
def test_check_on_random_inputs(out: str) -> None:
    """`Kernel.check` masks its reference itself: a mask the kernel ignored would differ."""
    k = sparsec.kernel("C(i,j) = A(i,k) * B(k,j)", {"A": "csr", "B": "csr", "C": out}, mask="M")
    inputs, _ = k.random_inputs(seed=3, density=0.4)
    k.check(**inputs)
    plain = sparsec.kernel("C(i,j) = A(i,k) * B(k,j)", {"A": "csr", "B": "csr", "C": out})
    unmasked = dense(plain(A=inputs["A"], B=inputs["B"]))
    masked = dense(k(**inputs))
    assert (masked != unmasked).any()  # these inputs tell a masked kernel from an unmasked one


def test_masked_min_plus() -> None:
    """Under a semiring, outside the mask the output is absent: the add's identity."""
    a, x = matrix(6, 5, 17), np.arange(1.0, 6.0)
    stored, m = pattern((6,), 18, "s", "int32")
    k = sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": "csr"}, mask="M", semiring="min_plus")
    got = dense(k(A=tensor(a, "csr", "float64", "int32"), x=x, M=m))
    terms = np.where(a != 0, a + x[None, :], np.inf).min(axis=1)
    np.testing.assert_array_equal(got, np.where(stored, terms, np.inf))
    k.check(A=tensor(a, "csr", "float64", "int32"), x=x, M=m)


def test_cli_mask(capsys: pytest.CaptureFixture[str]) -> None:
    from sparsec.cli import main

    expr = "C(i,j) = A(i,k) * B(k,j)"
    assert main(["compile", expr, "-f", "A:csr", "-f", "B:csr", "--mask", "M", "--check"]) == 0
    assert "check: ok" in capsys.readouterr().out


def test_complement_is_accepted() -> None:
    """``~M`` (once refused) compiles; its access prints as ``~M(i,j)``."""
    k = sparsec.kernel("C(i,j) = A(i,k) * B(k,j)", {"A": "csr"}, mask="~M")
    assert "~M(i,j)" in str(k.spec.assignment)


@pytest.mark.parametrize("mask", ["M", "~M"])
def test_mask_on_a_scalar_output_refused(mask: str) -> None:
    """Issue 36, item 5: a scalar output has no entries to select; the mask used to be read
    as a value and multiplied the sum (5x for M = 5.0)."""
    with pytest.raises(NotationError, match="scalar output 'a'.*drop mask="):
        sparsec.kernel("a = A(i,k) * A(k,i)", {"A": "csr"}, mask=mask)


@pytest.mark.parametrize("out", ["d", "s"])
def test_mask_under_ieee_division_is_absent_outside(out: str) -> None:
    """Found by the mask fuzz family (issue 36): under ``division="ieee"`` an absent M's
    product was computed as ``0 * rhs``, NaN where the rhs is infinite, instead of absent;
    and a sparse ``+=`` stored 0 where neither the current value nor the masked rhs is."""
    a, x = np.array([[1.0, 0.0], [2.0, 3.0], [4.0, 0.0]]), np.array([0.0, 1.0])
    m = sparsec.Tensor.from_coo(np.array([[1]]), np.array([0.0]), (3,), "s")
    k = sparsec.kernel(
        "y(i) = A(i,j) / x(j)", {"A": "csr", "M": "s", "y": out}, mask="M", division="ieee"
    )
    np.testing.assert_array_equal(
        dense(k(A=tensor(a, "csr", "float64", "int32"), x=x, M=m)), [0, np.inf, 0]
    )
    k.check(A=tensor(a, "csr", "float64", "int32"), x=x, M=m)
    acc = sparsec.kernel(
        "y(i) += A(i,j) / x(j)", {"A": "csr", "M": "s", "y": "s"}, mask="M", division="ieee"
    )
    current = sparsec.Tensor.from_coo(np.array([[2]]), np.array([5.0]), (3,), "s")
    got = acc(A=tensor(a, "csr", "float64", "int32"), x=x, M=m, y=current)
    assert got.coords()[0].tolist() == [[1, 2]] and got.coords()[1].tolist() == [np.inf, 5.0]
