"""Column bands (`sparsec.passes.bands`): which kernels take ``sc_band``, and that any number of
tiles per band gives the whole-row run's result bit for bit (each output element gets the
same additions in the same order) and dense torch's, for widths below a tile, at tile and
band boundaries and past them, on 1 to 3 threads."""

from __future__ import annotations

import sys
from dataclasses import replace

import numpy as np
import pytest
from conftest import MEASURED_ON, pruned_csr, sparse_array, torch_reference

import sparsec
from sparsec.backends.printer import C, Printer
from sparsec.ir import nodes as ir
from sparsec.passes.bands import band
from sparsec.policy.machine import use

COSTS = sys.modules["sparsec.policy.costs"]
SPMM = "C(i,j) = W(i,k) * X(k,j)"
MTTKRP = "A(i,j) = B(i,k,l) * D(l,j) * C(k,j)"


def _params(k: sparsec.Kernel, dtype: str = "float64") -> list[str]:
    return [p.field for p in k.generated(dtype).signature.params]


@pytest.fixture
def bands_of(monkeypatch):
    """Run every call with ``n`` tiles per band (0: whole rows)."""

    def force(n: int) -> None:
        monkeypatch.setattr(COSTS.Columns, "band_tiles", lambda self, dims, values: n)

    return force


@pytest.mark.parametrize(
    ("expr", "fmts", "deep"),
    [
        (SPMM, {"W": "csr"}, True),
        ("C(i,j) += W(i,k) * X(k,j)", {"W": "csr"}, True),
        (SPMM, {"W": "dcsr"}, True),
        (MTTKRP, {"B": "csf"}, False),  # its tiles span two loops, k and l
    ],
)
def test_tiled_parallel_rows_take_a_band_argument(expr, fmts, deep):
    k = sparsec.Kernel(expr, fmts)
    tail = ["threads", "band", "depth"] if deep else ["threads", "band"]
    assert _params(k)[-len(tail) :] == tail
    assert "collapse(2)" in k.source and "int sc_band" in k.source
    assert "column bands" in k.schedule
    assert ("int sc_depth" in k.source) == deep
    assert ("depth blocks" in k.schedule) == deep
    if deep:  # a call in depth blocks reads its output back: never streamed
        assert "&& sc_depth == 0 && sc_rows_aligned(" in k.source


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
    assert "band" not in _params(k) and "depth" not in _params(k)
    assert "sc_band" not in k.source and "collapse" not in k.source
    assert "sc_depth" not in k.source


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
    body, notes, params = band(ir.block(_rows(ir.Decl(ir.I64, "q", ir.Var("i")), _region())))
    assert len(notes) == 1 and params == ("sc_band",)
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
    body, notes, params = band(ir.block(loop))
    assert body == ir.block(loop) and notes == () and params == ()


@pytest.mark.parametrize("width", [5, 64, 123, 64 * 3 + 7, 300, 512])
@pytest.mark.parametrize("tiles", [1, 2, 3])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_spmm_in_bands_equals_the_whole_run(width, tiles, dtype, threads, bands_of):
    rng = np.random.default_rng(width * 7 + tiles)
    w = sparse_array((41, 29), rng, 0.3).astype(dtype)
    w[5] = 0  # an empty row
    x = rng.standard_normal((29, width)).astype(dtype)
    _spmm_equals_the_whole_run(bands_of, tiles, w, x, threads)


def _spmm_equals_the_whole_run(force, n: int, w: np.ndarray, x: np.ndarray, threads: int):
    """SpMM of ``w`` and ``x`` with ``force(n)`` gives the ``force(0)`` run's result bit
    for bit, on the first call and on the fast path (which fills the argument too), and
    dense torch's."""
    tensor = sparsec.as_tensor(w, "csr")
    force(0)
    whole = sparsec.Kernel(SPMM, {"W": "csr"})(W=tensor, X=x, threads=threads)
    force(n)
    k = sparsec.Kernel(SPMM, {"W": "csr"})
    got = k(W=tensor, X=x, threads=threads)
    again = k(W=tensor, X=x, threads=threads)
    np.testing.assert_array_equal(got, whole)
    np.testing.assert_array_equal(again, whole)
    tol = 1e-4 if w.dtype == np.float32 else 1e-12
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
    pay = COSTS.bands_pay

    def case(rows, inner, density, columns=2048):
        x = np.empty((inner, columns), np.float32)
        return columns, ("X",), {"W": pruned_csr(rows, inner, density), "X": x}, rows * columns

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
    w = pruned_csr(384, 1536, 0.02)
    assert (
        k.columns.band_tiles({"i": 384, "j": 2048, "k": 1536}, {"W": w, "X": x}) == COSTS.BAND_TILES
    )
    assert k.columns.band_tiles({"i": 384, "j": 512, "k": 1536}, {"W": w, "X": x[:, :512]}) == 0
    acc = sparsec.Kernel("C(i,j) += W(i,k) * X(k,j)", {"W": "csr"})
    assert acc.columns.band_tiles({"i": 384, "j": 2048, "k": 1536}, {"W": w, "X": x}) == 0


# --------------------------------------------------------------------------- depth blocks


@pytest.fixture
def depth_of(monkeypatch):
    """Run every call in depth blocks of ``n`` coordinates (0: one block)."""

    def force(n: int) -> None:
        monkeypatch.setattr(COSTS.Columns, "depth_rows", lambda self, dims, values: n)

    return force


def _blocky(shape: tuple[int, int], rng: np.random.Generator, dtype: str) -> np.ndarray:
    """A sparse matrix whose rows cover the depth blocks unevenly: an empty row, a row
    whose entries all sit in one block, a full row, and a band of empty columns."""
    w = sparse_array(shape, rng, 0.3).astype(dtype)
    w[3] = 0
    w[4] = 0
    w[4, 7:10] = 1.5
    w[6] = rng.uniform(-1, 1, shape[1])
    w[:, 11:17] = 0
    return w


@pytest.mark.parametrize("width", [5, 64, 123, 64 * 3 + 7, 300])
@pytest.mark.parametrize("depth", [1, 3, 8, 29, 100])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("threads", [1, 3])
def test_spmm_in_depth_blocks_equals_the_whole_run(width, depth, dtype, threads, depth_of):
    rng = np.random.default_rng(width * 11 + depth)
    w = _blocky((41, 29), rng, dtype)
    x = rng.standard_normal((29, width)).astype(dtype)
    _spmm_equals_the_whole_run(depth_of, depth, w, x, threads)


@pytest.mark.parametrize("depth", [1, 4, 13])
@pytest.mark.parametrize("tiles", [0, 1, 2])
def test_depth_blocks_with_bands_accumulation_and_dcsr_match_torch(
    depth, tiles, depth_of, bands_of
):
    """Depth blocks inside column bands, tiles that start from the output's current
    values (``+=``) and a doubly compressed operand, with integer values so every sum is
    exact."""
    rng = np.random.default_rng(depth * 3 + tiles)
    depth_of(depth)
    bands_of(tiles)
    w = _blocky((23, 31), rng, "float64").round() + 0.0
    w[w != 0] = rng.integers(-4, 5, int((w != 0).sum()))
    x = rng.integers(-3, 4, (31, 330)).astype(np.float64)
    c0 = rng.integers(-3, 4, (23, 330)).astype(np.float64)
    want = torch_reference("ik,kj->ij", {"W": w, "X": x})
    got = sparsec.Kernel(SPMM, {"W": "csr"})(W=w, X=x, threads=2)
    np.testing.assert_array_equal(got, want)
    acc = sparsec.Kernel("C(i,j) += W(i,k) * X(k,j)", {"W": "csr"})
    np.testing.assert_array_equal(acc(W=w, X=x, C=c0, threads=2), c0 + want)
    dcsr = sparsec.Kernel(SPMM, {"W": "dcsr"})
    np.testing.assert_array_equal(dcsr(W=sparsec.as_tensor(w, "dcsr"), X=x, threads=3), want)


def test_depth_blocks_skip_a_kernel_whose_reduction_is_not_one_walk():
    """MTTKRP's tiles span two loops (k, then l): no depth parameter, and its results are
    those of torch whatever the runtime would choose."""
    k = sparsec.Kernel(MTTKRP, {"B": "csf"})
    assert "depth" not in _params(k)


def _walk_region() -> ir.Block:
    """SpMM's region as the tile pass builds it, over positions p of row i (the segment
    ``[pos[i], end)``), with the leftover columns zeroed then accumulated."""
    p, i = ir.Var("p"), ir.Var("i")
    gather = ir.Call("vload", (ir.Bin("+", ir.Var("X"), ir.Var("k")),))
    walk = ir.For(
        "p",
        ir.Load("pos", i),
        ir.Var("end"),
        ir.block(
            ir.Decl(ir.I64, "k", ir.Load("crd", p)),
            ir.Assign(ir.Var("sc_acc0_0"), gather, "+="),
        ),
    )
    out = ir.Bin("+", ir.Var("y"), i)
    tiles = ir.For(
        "sc_t0",
        ir.IntLit(0),
        ir.Var("sc_tiles0"),
        ir.block(
            ir.Decl(ir.VEC, "sc_acc0_0", ir.Call("vzero", ())),
            walk,
            ir.Effect(ir.Call("vstore", (out, ir.Var("sc_acc0_0")))),
        ),
    )
    zero = ir.For(
        "q", ir.Var("r"), ir.Var("n"), ir.block(ir.Assign(ir.Load("y", i), ir.FloatLit(0.0)))
    )
    add = ir.Assign(ir.Load("y", i), ir.Load("X", ir.Var("k")), "+=")
    rest = replace(walk, body=ir.block(ir.Decl(ir.I64, "k", ir.Load("crd", p)), add))
    return ir.Block(
        (
            ir.Comment("j in tiles of SC_TILE values held in registers"),
            ir.Decl(ir.I64, "sc_tiles0", M),
            tiles,
            ir.If(((ir.Var("r"), ir.block(zero, rest)),)),
        )
    )


WALKS = {"crd": ("pos", ir.Var("k_dim"))}
END = ir.Decl(ir.I64, "end", ir.Load("pos", ir.Bin("+", ir.Var("i"), ir.IntLit(1))))


def test_a_region_over_one_walk_runs_in_depth_blocks():
    body, notes, params = band(ir.block(_rows(END, _walk_region())), WALKS)
    assert params == ("sc_band", "sc_depth") and "depth blocks" in notes[0]
    text = "\n".join(Printer(C).stmts(body))
    # the row's positions in the block, by galloping search over its sorted segment
    assert "sc_gallop_row(crd, pos[i], end, sc_kb0 * sc_kd0)" in text
    assert "sc_gallop_row(crd, sc_lo0, end, sc_kb0 * sc_kd0 + sc_kd0)" in text
    # the walks run over the block; tiles resume from the stored output after the first
    assert text.count("for (int64_t p = sc_lo0; p < sc_hi0; p++)") == 2
    assert "sc_acc0_0 = sc_kb0 == 0 ? sc_vzero() : sc_vload(y + i);" in text
    # the leftover columns are zeroed in the first block only
    assert "if (sc_kb0 == 0) {" in text
    # blocks run one after the other, each its own parallel loop over (band, row)
    outer = body.body[0].body[-1]
    assert isinstance(outer, ir.For) and outer.var == "sc_kb0" and outer.parallel is None
    (inner,) = outer.body.body
    assert isinstance(inner, ir.For) and inner.parallel is not None


@pytest.mark.parametrize(
    "case",
    ["no-walks", "end-not-the-segment", "bounds-read-elsewhere", "overwrite"],
)
def test_regions_not_over_one_walk_stay_in_one_block(case):
    region, walks, end = _walk_region(), WALKS, END
    if case == "no-walks":
        walks = {}
    elif case == "end-not-the-segment":
        end = ir.Decl(ir.I64, "end", ir.Load("pos", ir.Bin("+", ir.Var("i"), ir.IntLit(2))))
    elif case == "bounds-read-elsewhere":
        comment, count, tiles, rest = region.body
        spy = ir.Assign(ir.Load("z", ir.Var("i")), ir.Var("end"), "+=")
        rest = replace(rest, branches=((ir.Var("r"), ir.block(*rest.branches[0][1].body, spy)),))
        region = ir.Block((comment, count, tiles, rest))
    else:  # a leftover column written with "=": it would keep only the last block's value
        comment, count, tiles, rest = region.body
        put = ir.Assign(ir.Load("y", ir.Var("i")), ir.FloatLit(2.0))
        rest = replace(rest, branches=((ir.Var("r"), ir.block(*rest.branches[0][1].body, put)),))
        region = ir.Block((comment, count, tiles, rest))
    body, notes, params = band(ir.block(_rows(end, region)), walks)
    assert params == ("sc_band",) and "depth" not in notes[0]
    assert "sc_gallop" not in "\n".join(Printer(C).stmts(body))  # nor sc_gallop_row


def test_when_depth_blocks_pay():
    """The cost model, on the shapes and the machine it was measured on (float32, 2
    threads, 512 columns unless stated, 512 KB of L2; times one block -> blocks of 512
    coordinates)."""

    def rows_for(*args):
        return COSTS.depth_rows(*args, on=MEASURED_ON)

    def case(rows, inner, density, columns=512, dtype=np.float32):
        x = np.empty((inner, columns), dtype)
        w = pruned_csr(rows, inner, density, dtype)
        return columns, ("X",), {"W": w, "X": x}, rows * columns

    block = int(MEASURED_ON.core_cache * COSTS.DEPTH_BLOCK_FRACTION) // (512 * 4)
    assert block == 512
    assert rows_for(*case(768, 3072, 0.3)) == block  # 41.7 -> 22.8 ms
    assert rows_for(*case(768, 3072, 0.2)) == block  # 24.9 -> 16.2 ms
    assert rows_for(*case(768, 3072, 0.05)) == block  # 5.5 -> 4.8 ms
    assert rows_for(*case(768, 3072, 0.02)) == block  # 2.8 -> 2.2 ms
    assert rows_for(*case(768, 3072, 0.2, dtype=np.float64)) == block // 2  # 70.7 -> 34.3 ms
    assert rows_for(*case(3072, 768, 0.2)) == 0  # X is 1.5 MB: 14.6 -> 14.4 ms
    assert rows_for(*case(384, 1536, 0.2)) == 0  # X is 3 MB: 3.6 -> 3.8 ms
    assert rows_for(*case(768, 3072, 0.2, 128)) == 0  # X is 1.5 MB: 3.5 -> 3.6 ms
    assert rows_for(*case(768, 3072, 0.001)) == 0  # too few gathers to repay the blocks
    # not measured, the search guard alone: 4096 rows over 8 blocks need 4 entries per row
    # and block on average (131,072 in all)
    assert rows_for(*case(4096, 4096, 0.004)) == 0  # 67,109 entries
    assert rows_for(*case(4096, 4096, 0.02)) == block  # 335,544 entries


def test_depth_blocks_are_asked_for_only_below_the_panel_columns():
    k = sparsec.Kernel(SPMM, {"W": "csr"})
    w = pruned_csr(768, 3072, 0.2)
    narrow = np.zeros((3072, 512), np.float32)
    wide = np.zeros((3072, 2048), np.float32)
    with use(MEASURED_ON):
        assert k.columns.depth_rows({"i": 768, "j": 512, "k": 3072}, {"W": w, "X": narrow}) > 0
        assert k.columns.depth_rows({"i": 768, "j": 2048, "k": 3072}, {"W": w, "X": wide}) == 0
