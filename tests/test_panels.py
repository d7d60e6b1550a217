"""Column panels: a long dense output index computed in packed panels (`Kernel._run_panels`).

The thresholds are lowered so small inputs run in panels; every result must equal the
whole-width run bit for bit (each element gets the same additions in the same order) and
match dense torch.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
from conftest import sparse_array, torch_reference

import sparsec

KERNEL = sys.modules["sparsec.kernel"]
SPMM = "C(i,j) = W(i,k) * X(k,j)"


@pytest.fixture
def small_panels(monkeypatch):
    monkeypatch.setattr(KERNEL, "PANEL_COLUMNS", 8)
    monkeypatch.setattr(KERNEL, "PANEL_MIN_COLUMNS", 16)
    monkeypatch.setattr(KERNEL, "PANEL_MIN_BYTES", 0)
    monkeypatch.setattr(KERNEL, "PANEL_MIN_READS", 0)


def _whole(expr, fmts, inputs, threads, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(KERNEL, "PANEL_MIN_BYTES", 1 << 62)
        return sparsec.Kernel(expr, fmts)(**inputs, threads=threads)


@pytest.mark.parametrize("width", [16, 17, 40, 64 + 3, 300])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("threads", [1, 2])
def test_spmm_in_panels_equals_the_whole_run(width, dtype, threads, small_panels, monkeypatch):
    rng = np.random.default_rng(width)
    w = sparse_array((37, 29), rng, 0.3).astype(dtype)
    w[5] = 0  # an empty row
    x = rng.standard_normal((29, width)).astype(dtype)
    k = sparsec.Kernel(SPMM, {"W": "csr"})
    assert k._panel_index == "j" and k._panel_carriers == ("X",)
    tensor = sparsec.as_tensor(w, "csr")
    got = k(W=tensor, X=x, threads=threads)
    again = k(W=tensor, X=x, threads=threads)  # a repeated call (the fast path refuses it)
    whole = _whole(SPMM, {"W": "csr"}, {"W": tensor, "X": x}, threads, monkeypatch)
    np.testing.assert_array_equal(got, whole)
    np.testing.assert_array_equal(again, whole)
    tol = 1e-4 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(
        got, torch_reference("ik,kj->ij", {"W": w, "X": x}), rtol=tol, atol=tol
    )


def test_two_carriers_and_mttkrp(small_panels, monkeypatch):
    rng = np.random.default_rng(3)
    expr = "C(i,j) = W(i,k) * X(k,j) * Z(k,j)"
    w = sparse_array((20, 15), rng, 0.4)
    x, z = rng.standard_normal((15, 50)), rng.standard_normal((15, 50))
    k = sparsec.Kernel(expr, {"W": "csr"})
    assert k._panel_carriers == ("X", "Z")
    inputs = {"W": sparsec.as_tensor(w, "csr"), "X": x, "Z": z}
    np.testing.assert_array_equal(k(**inputs), _whole(expr, {"W": "csr"}, inputs, 2, monkeypatch))

    mttkrp = "A(i,j) = B(i,k,l) * D(l,j) * C(k,j)"
    b = sparse_array((9, 8, 7), rng, 0.3)
    d, c = rng.standard_normal((7, 33)), rng.standard_normal((8, 33))
    k = sparsec.Kernel(mttkrp, {"B": "csf"})
    assert k._panel_index == "j" and k._panel_carriers == ("D", "C")
    got = k(B=sparsec.as_tensor(b, "csf"), D=d, C=c)
    want = torch_reference("ikl,lj,kj->ij", {"B": b, "D": d, "C": c})
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    ("expr", "fmts"),
    [
        (SPMM, {"W": "csr", "C": "dd:1,0"}),  # the output's last level is not j
        (SPMM, {"W": "csr", "X": "dd:1,0"}),  # X is stored column-major
        ("C(i,j) = A(i,j) * B(i,j)", {"A": "csr"}),  # a sparse operand uses j
        ("C(i,j) = A(i,j) + B(i,j)", {}),  # dense operands only
        ("C(i,j) = W(i,k) * X(j,k)", {"W": "csr"}),  # j is not X's last mode
        ("C(i,j) = W(i,j) * x(j)", {"W": "csr"}),  # j in the sparse operand
        ("C(i,j) += W(i,k) * X(k,j)", {"W": "csr"}),  # accumulates into its input
    ],
)
def test_where_panels_do_not_apply(expr, fmts):
    assert sparsec.Kernel(expr, fmts)._panel_index is None


def test_when_panels_pay():
    """Wide enough, dense operands larger than the caches, and read often enough."""
    import scipy.sparse as sp

    pay = KERNEL._panels_pay
    x = np.empty((3072, 2048), np.float32)  # 24 MB
    dense_w = sparsec.as_tensor(sp.random(768, 3072, 0.2, format="csr", random_state=0), "csr")
    sparse_w = sparsec.as_tensor(sp.random(768, 3072, 0.02, format="csr", random_state=0), "csr")
    assert pay(2048, ("X",), {"W": dense_w, "X": x})  # 154 entries per row of X
    assert not pay(2048, ("X",), {"W": sparse_w, "X": x})  # 15 per row: packing costs more
    assert not pay(512, ("X",), {"W": dense_w, "X": x[:, :512]})  # too few columns
    small = np.empty((384, 2048), np.float32)  # 3 MB: stays in cache whole
    assert not pay(2048, ("X",), {"W": dense_w, "X": small})
