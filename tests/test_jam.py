"""Interleaved reductions (`sparsec.passes.jam`).

Where a serial loop's body sums along an inner loop (SDDMM: for each stored ``B(i,j)``, a
dot product over ``k``), `WAYS` outer iterations run their sums in one inner loop. Checked
against dense torch and bit for bit against the same kernel built without the pass, on
rows of every length modulo `WAYS` (empty rows included), stored zeros, both dtypes and
index widths, 1 thread (the single-pass append) and 2 (the two phases); loops the pass
must leave alone are left alone.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sparsec
from sparsec import Tensor
from sparsec.api.kernel import Kernel
from sparsec.ir import nodes as ir
from sparsec.passes.jam import jam
from sparsec.pipeline import lists
from sparsec.policy.decision import DEFAULTS

WAYS = DEFAULTS.jam_ways

SDDMM = "A(i,j) = B(i,j) * C(i,k) * D(k,j)"


def _rows_of_every_length(rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Row r holds r % (2 * WAYS + 1) entries (row 0 and others empty), one a stored zero
    candidate; values integers so that sums are exact in float32 too."""
    dense = np.zeros((rows, cols))
    for r in range(rows):
        n = r % (2 * WAYS + 1)
        cols_r = rng.choice(cols, size=min(n, cols), replace=False)
        dense[r, cols_r] = rng.integers(1, 4, size=cols_r.size) * rng.choice([-1, 1], cols_r.size)
    return dense


def _with_stored_zero(dense: np.ndarray, dtype: str, index_dtype: str) -> Tensor:
    rows, cols = np.nonzero(dense)
    zi, zj = next(
        (i, j) for i, j in zip(*np.nonzero(dense == 0), strict=True) if i in set(rows.tolist())
    )
    coords = np.array([[*rows, zi], [*cols, zj]], dtype=np.int64)
    values = np.concatenate([dense[rows, cols], [0.0]])
    return Tensor.from_coo(coords, values, dense.shape, "csr", dtype=dtype, index_dtype=index_dtype)


def _unjammed(expr: str, formats: dict[str, str], monkeypatch, inputs, **kw) -> Tensor:
    """What the kernel built without the pass (a fresh `Kernel`, not the memoized one)
    returns for ``inputs``."""
    with monkeypatch.context() as m:
        for name in ("C_PASSES", "C_APPEND_PASSES"):
            kept = tuple(p for p in getattr(lists, name) if p is not lists._jam)
            m.setattr(lists, name, kept)
        k = Kernel(expr, formats, **{n: v for n, v in kw.items() if n != "threads"})
        out = k(**inputs, threads=kw.get("threads"))
        assert "interleaved" not in k.source
        return out


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("depth", [1, 5, 37])
@pytest.mark.parametrize("dtype,index_dtype", [("float64", "int32"), ("float32", "int64")])
def test_sddmm_interleaved_matches_torch_and_the_plain_loop(
    dtype, index_dtype, depth, threads, rng, monkeypatch
):
    b = _rows_of_every_length(23, 12, rng)
    B = _with_stored_zero(b, dtype, index_dtype)
    C = rng.integers(-3, 4, (23, depth)).astype(dtype)
    D = rng.integers(-3, 4, (depth, 12)).astype(dtype)
    formats = {"A": "csr", "B": "csr"}
    k = sparsec.kernel(SDDMM, formats, dtype=dtype)
    assert f"loop pB2 runs {WAYS} iterations' sums interleaved" in k.schedule
    got = k(B=B, C=C, D=D, threads=threads)
    want = torch.from_numpy(B.to_dense().astype(np.float64)) * (
        torch.from_numpy(C.astype(np.float64)) @ torch.from_numpy(D.astype(np.float64))
    )
    np.testing.assert_array_equal(got.to_dense(), want.numpy())  # integers: exact
    assert got.nnz == B.nnz  # B's pattern, the stored zero included
    again = _unjammed(
        SDDMM, formats, monkeypatch, dict(B=B, C=C, D=D), dtype=dtype, threads=threads
    )
    np.testing.assert_array_equal(got.levels[1].crd, again.levels[1].crd)
    np.testing.assert_array_equal(got.vals, again.vals)


def test_real_values_are_bit_identical_to_the_plain_loop(rng, monkeypatch):
    B = Tensor.from_dense(_rows_of_every_length(40, 30, rng) * rng.uniform(0.1, 1, (40, 30)), "csr")
    C, D = rng.uniform(-1, 1, (40, 19)), rng.uniform(-1, 1, (19, 30))
    k = sparsec.kernel(SDDMM, {"A": "csr", "B": "csr"})
    for threads in (1, 2):
        inputs = dict(B=B, C=C, D=D)
        plain = _unjammed(SDDMM, {"A": "csr", "B": "csr"}, monkeypatch, inputs, threads=threads)
        np.testing.assert_array_equal(k(**inputs, threads=threads).vals, plain.vals)


def test_a_dense_output_dot_product_is_interleaved(rng):
    """D(j,k) already fits the loops i, j, k; the tail stores into a dense output."""
    expr = "A(i,j) = B(i,j) * C(i,k) * D(j,k)"
    b = _rows_of_every_length(17, 9, rng)
    C, D = rng.uniform(-1, 1, (17, 6)), rng.uniform(-1, 1, (9, 6))
    k = sparsec.kernel(expr, {"B": "csr"})
    got = k(B=Tensor.from_dense(b, "csr"), C=C, D=D, threads=2)
    np.testing.assert_allclose(got, b * (C @ D.T), rtol=1e-12, atol=1e-12)
    k.check(B=Tensor.from_dense(b, "csr"), C=C, D=D)


@pytest.mark.parametrize(
    "expr,formats",
    [
        ("y(i) = A(i,j) * x(j)", {"A": "csr"}),  # the row loop is parallel
        ("A(i,j) = B(i,j,k) * c(k)", {"B": "csf"}),  # the k range moves with j
        ("C(i,j) = W(i,k) * X(k,j)", {"W": "csr"}),  # stores in the inner loop
        ("C(i,j) = A(i,k) * B(k,j)", {"A": "csr", "B": "csr", "C": "csr"}),
        ("A(i,j) = B(i,j) + C(i,j)", {"A": "csr", "B": "csr", "C": "csr"}),
    ],
)
def test_loops_without_an_independent_inner_sum_are_left_alone(expr, formats):
    assert "interleaved" not in sparsec.kernel(expr, formats).source


def _loop(head: tuple[ir.Stmt, ...], tail: tuple[ir.Stmt, ...], **inner) -> ir.For:
    """for p in [0, n): head; for k in [0, m): acc += x[p] * y[k]; tail"""
    body = ir.Block(
        (
            ir.Assign(
                ir.Var("acc"),
                ir.Bin("*", ir.Load("x", ir.Var("p")), ir.Load("y", ir.Var("k"))),
                "+=",
            ),
        )
    )
    loop = ir.For("k", inner.get("start", ir.IntLit(0)), ir.Var("m"), body)
    return ir.For("p", ir.IntLit(0), ir.Var("n"), ir.Block((*head, loop, *tail)))


_HEAD = (ir.Decl(ir.ACC, "acc", ir.FloatLit(0.0)),)
_STORE = (ir.Assign(ir.Load("out", ir.Var("q")), ir.Var("acc")),)
_SET_ONLY = ir.For(
    "k", ir.IntLit(0), ir.Var("m"), ir.Block((ir.Assign(ir.Var("acc"), ir.FloatLit(1.0)),))
)


def test_the_ir_shape_it_rewrites():
    body, notes = jam(ir.Block((_loop(_HEAD, _STORE),)))
    assert notes == (f"loop p runs {WAYS} iterations' sums interleaved",)
    groups = body.body[3]
    assert isinstance(groups, ir.For) and isinstance(body.body[4], ir.For)
    inner = next(s for s in groups.body.body if isinstance(s, ir.For))
    assert len(inner.body.body) == WAYS  # one chain per iteration


@pytest.mark.parametrize(
    "loop",
    [
        # the inner range depends on the outer iteration
        _loop(_HEAD, _STORE, start=ir.Var("p")),
        # the head reads what the tail assigns (q advances per iteration)
        _loop(
            (*_HEAD, ir.Decl(ir.I64, "at", ir.Var("q"))),
            (*_STORE, ir.Assign(ir.Var("q"), ir.Bin("+", ir.Var("q"), ir.IntLit(1)))),
        ),
        # the sums read an array the tail stores into
        _loop(_HEAD, (ir.Assign(ir.Load("y", ir.Var("p")), ir.Var("acc")),)),
        # the tail moves the loop's own variable
        _loop(_HEAD, (*_STORE, ir.Assign(ir.Var("p"), ir.Bin("+", ir.Var("p"), ir.IntLit(1))))),
        # no compound assignment: nothing to interleave
        ir.For("p", ir.IntLit(0), ir.Var("n"), ir.Block((*_HEAD, _SET_ONLY))),
    ],
)
def test_loops_it_must_not_reorder(loop):
    assert jam(ir.Block((loop,))) == (ir.Block((loop,)), ())


def test_a_parallel_loop_is_left_alone():
    loop = _loop(_HEAD, _STORE)
    par = ir.For(loop.var, loop.start, loop.end, loop.body, ir.Parallel("CPUThread"))
    assert jam(ir.Block((par,)))[1] == ()
