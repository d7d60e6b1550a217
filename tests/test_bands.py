"""Column bands (`sparsec.bands`): which kernels take ``sc_band``, and that any number of
tiles per band gives the whole-row run's result bit for bit (each output element gets the
same additions in the same order) and dense torch's, for widths below a tile, at tile and
band boundaries and past them, on 1 to 3 threads."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import scipy.sparse as sp
from conftest import sparse_array, torch_reference

import sparsec
from sparsec import ir
from sparsec.bands import band

KERNEL = sys.modules["sparsec.kernel"]
SPMM = "C(i,j) = W(i,k) * X(k,j)"
MTTKRP = "A(i,j) = B(i,k,l) * D(l,j) * C(k,j)"


def _params(k: sparsec.Kernel, dtype: str = "float64") -> list[str]:
    return [p.field for p in k.generated(dtype).signature.params]


@pytest.fixture
def bands_of(monkeypatch):
    """Run every call with ``n`` tiles per band (0: whole rows)."""

    def force(n: int) -> None:
        monkeypatch.setattr(KERNEL.Kernel, "_band_tiles", lambda self, dims, values: n)

    return force


@pytest.mark.parametrize(
    ("expr", "fmts"),
    [(SPMM, {"W": "csr"}), (MTTKRP, {"B": "csf"}), (SPMM, {"W": "dcsr"})],
)
def test_tiled_parallel_rows_take_a_band_argument(expr, fmts):
    k = sparsec.Kernel(expr, fmts)
    assert _params(k)[-2:] == ["threads", "band"]
    assert "collapse(2)" in k.source and "int sc_band" in k.source
    assert "column bands" in k.schedule


@pytest.mark.parametrize(
    ("expr", "fmts", "kw"),
    [
        ("y(i) = A(i,j) * x(j)", {"A": "csr"}, {}),  # nothing tiled
        (SPMM, {"W": "csr"}, {"schedule": "serial"}),  # no parallel loop
        (SPMM, {"W": "csr", "C": "csr"}, {}),  # a sparse output (appended rows)
        (SPMM, {"W": "csr"}, {"target": "cuda-emulated"}),  # C only
        (
            SPMM,
            {"W": "csr"},
            {"schedule": "split(i,i0,i1,16), parallelize(i0,CPUThread,NoRaces)"},
        ),  # the parallel loop holds a loop, not the tiles
    ],
)
def test_other_kernels_do_not(expr, fmts, kw):
    k = sparsec.Kernel(expr, fmts, **kw)
    assert "band" not in _params(k)
    assert "sc_band" not in k.source and "collapse" not in k.source


M = ir.Var("m")


def _region(count: ir.Expr = M) -> ir.Block:
    """A region in the shape the tile pass builds (its loops' bodies do not matter here)."""
    store = ir.Assign(ir.Load("y", ir.Var("i")), ir.FloatLit(1.0), "+=")
    return ir.Block(
        (
            ir.Comment("j in tiles of SC_TILE values held in registers"),
            ir.Decl(ir.I64, "sc_tiles0", count),
            ir.For("sc_t0", ir.IntLit(0), ir.Var("sc_tiles0"), ir.block(store)),
            ir.If(((ir.Var("rest"), ir.block(store)),)),
        )
    )


def _rows(*body: ir.Stmt, parallel: bool = True) -> ir.For:
    par = ir.Parallel("CPUThread", "dynamic") if parallel else None
    # a Block, not ir.block: the region stays one statement, as the tile pass leaves it
    return ir.For("i", ir.IntLit(0), ir.Var("n"), ir.Block(body), par)


def test_a_parallel_loop_around_one_region_is_banded():
    body, notes = band(ir.block(_rows(ir.Decl(ir.I64, "q", ir.Var("i")), _region())))
    assert len(notes) == 1
    banded = body.body[0]
    assert isinstance(banded, ir.Block)
    outer = banded.body[-1]
    assert isinstance(outer, ir.For) and outer.var == "sc_b0" and outer.parallel is not None
    assert outer.parallel.collapse == 2
    (rows,) = outer.body.body
    assert isinstance(rows, ir.For) and rows.var == "i" and rows.parallel is None


@pytest.mark.parametrize(
    "loop",
    [
        # a statement beside the region would run once per band
        _rows(_region(), ir.Assign(ir.Load("z", ir.Var("i")), ir.FloatLit(0.0), "=")),
        # the tile count depends on the row
        _rows(ir.Decl(ir.I64, "w", ir.Var("i")), _region(ir.Var("w"))),
        # a serial loop: nothing to share out
        _rows(_region(), parallel=False),
        # no tiled region at all
        _rows(ir.Assign(ir.Load("y", ir.Var("i")), ir.FloatLit(1.0), "+=")),
    ],
    ids=["beside", "row-dependent", "serial", "untiled"],
)
def test_other_loops_are_left_alone(loop):
    body, notes = band(ir.block(loop))
    assert body == ir.block(loop) and notes == ()


@pytest.mark.parametrize("width", [5, 64, 64 * 3 + 7, 300, 512])
@pytest.mark.parametrize("tiles", [1, 2, 3])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_spmm_in_bands_equals_the_whole_run(width, tiles, dtype, threads, bands_of):
    rng = np.random.default_rng(width * 7 + tiles)
    w = sparse_array((41, 29), rng, 0.3).astype(dtype)
    w[5] = 0  # an empty row
    x = rng.standard_normal((29, width)).astype(dtype)
    tensor = sparsec.as_tensor(w, "csr")
    bands_of(0)
    whole = sparsec.Kernel(SPMM, {"W": "csr"})(W=tensor, X=x, threads=threads)
    bands_of(tiles)
    k = sparsec.Kernel(SPMM, {"W": "csr"})
    got = k(W=tensor, X=x, threads=threads)
    again = k(W=tensor, X=x, threads=threads)  # the fast path fills sc_band too
    np.testing.assert_array_equal(got, whole)
    np.testing.assert_array_equal(again, whole)
    tol = 1e-4 if dtype == "float32" else 1e-12
    want = torch_reference("ik,kj->ij", {"W": w, "X": x})
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("tiles", [1, 2])
def test_banded_accumulation_and_mttkrp_match_torch(tiles, bands_of, rng):
    """Tiles that start from the output's current values (``+=``), and MTTKRP's tiles
    across two loops, with integer values so every sum is exact."""
    bands_of(tiles)
    w = sparse_array((19, 23), rng, 0.3, integer=True)
    x = rng.integers(-3, 4, (23, 200)).astype(np.float64)
    c0 = rng.integers(-3, 4, (19, 200)).astype(np.float64)
    got = sparsec.Kernel("C(i,j) += W(i,k) * X(k,j)", {"W": "csr"})(W=w, X=x, C=c0, threads=2)
    np.testing.assert_array_equal(got, c0 + torch_reference("ik,kj->ij", {"W": w, "X": x}))

    b = sparse_array((9, 8, 7), rng, 0.3, integer=True)
    d = rng.integers(-3, 4, (7, 150)).astype(np.float64)
    c = rng.integers(-3, 4, (8, 150)).astype(np.float64)
    got = sparsec.Kernel(MTTKRP, {"B": "csf"})(B=sparsec.as_tensor(b, "csf"), D=d, C=c, threads=3)
    want = torch_reference("ikl,lj,kj->ij", {"B": b, "D": d, "C": c})
    np.testing.assert_array_equal(got, want)


def test_when_bands_pay():
    """The cost model, on the shapes it was measured on (float32, 2 threads, 2048 columns
    unless stated; times whole -> banded)."""
    pay = KERNEL._bands_pay

    def case(rows, inner, density, columns=2048):
        w = sp.random(rows, inner, density, format="csr", random_state=0, dtype=np.float32)
        x = np.empty((inner, columns), np.float32)
        return columns, ("X",), {"W": sparsec.as_tensor(w, "csr"), "X": x}, rows * columns

    assert pay(*case(384, 1536, 0.02))  # 5.3 -> 3.4 ms
    assert pay(*case(768, 768, 0.1))  # 12.4 -> 9.8 ms
    assert pay(*case(3072, 768, 0.1))  # 44 -> 37 ms
    assert pay(*case(3072, 768, 0.05))  # 28.5 -> 21.8 ms
    assert not pay(*case(3072, 768, 0.02))  # the 25 MB output dominates: 8.2 -> 12.5 ms
    assert not pay(*case(1536, 384, 0.02))  # X is 3 MB: 1.9 -> 3.1 ms
    assert not pay(*case(384, 384, 0.1))  # 2.6 -> 2.9 ms
    assert not pay(*case(768, 3072, 0.3, 512))  # too few columns


def test_bands_are_asked_for_only_with_a_panel_index():
    k = sparsec.Kernel(SPMM, {"W": "csr"})
    x = np.zeros((1536, 2048), np.float32)
    w = sparsec.as_tensor(sp.random(384, 1536, 0.02, format="csr", dtype=np.float32), "csr")
    assert k._band_tiles({"i": 384, "j": 2048, "k": 1536}, {"W": w, "X": x}) == KERNEL.BAND_TILES
    assert k._band_tiles({"i": 384, "j": 512, "k": 1536}, {"W": w, "X": x[:, :512]}) == 0
    acc = sparsec.Kernel("C(i,j) += W(i,k) * X(k,j)", {"W": "csr"})
    assert acc._band_tiles({"i": 384, "j": 2048, "k": 1536}, {"W": w, "X": x}) == 0
