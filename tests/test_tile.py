"""Register tiles (`sparsec.passes.tile`): tiled kernels give torch's results for every width of
the tiled loop (no tile, whole tiles, tiles plus a remainder), both value types, and the
pass leaves alone what it does not understand."""

from __future__ import annotations

import sys
from dataclasses import replace

import numpy as np
import pytest
from conftest import MEASURED_ON, sparse_array, torch_reference

import sparsec
from sparsec import abi
from sparsec.ir import nodes as ir
from sparsec.ir.visit import arrays, free_vars, statements
from sparsec.passes.tile import tile
from sparsec.policy import decision
from sparsec.policy.decision import DEFAULTS
from sparsec.policy.machine import use
from sparsec.tensors import buffers as runtime

SPMM = "Y(i,j) = W(i,k) * X(k,j)"
MTTKRP = "A(i,j) = B(i,k,l) * D(l,j) * C(k,j)"
# tile widths: 32 to 128 values with 16- to 64-byte vectors; these cover none, one,
# several and partial tiles for all of them
WIDTHS = [0, 1, 31, 64, 97, 160, 300]


def _close(got, want, dtype):
    tol = 1e-4 if dtype == "float32" else 1e-12
    scale = max(1.0, np.abs(want).max(initial=0.0))
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale)


@pytest.mark.parametrize(("dtype", "index_dtype"), [("float32", "int64"), ("float64", "int32")])
@pytest.mark.parametrize("width", WIDTHS)
def test_spmm_tiles_match_torch(width, dtype, index_dtype, rng):
    w = sparse_array((37, 23), rng, 0.3)
    w[5] = 0.0  # an empty row
    x = sparse_array((23, width), rng, 0.9)
    k = sparsec.kernel(SPMM, {"W": "csr"}, dtype=dtype, index_dtype=index_dtype)
    assert "sc_vload" in k.source and "register tiles" in k.schedule
    want = torch_reference("ik,kj->ij", {"W": w, "X": x})
    for threads in (1, 2):
        got = np.asarray(k(W=w.astype(dtype), X=x.astype(dtype), threads=threads))
        _close(got, want, dtype)


@pytest.mark.parametrize("narrowest", [2, 4, 8])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_every_width_accumulates_right(dtype, narrowest, rng, monkeypatch):
    """Rows narrower than a tile, and the columns after whole tiles, run in tiles of half
    and a quarter as many vectors, then in the plain loop. Every width up to two tiles of
    the widest vectors (128 float32 values on 64-byte vectors) and a few values more meets
    each combination of them on any vector width; integer values make every sum exact. The
    plain loop starts after the narrowest tile built, however narrow that is (8: none)."""
    tiles = replace(DEFAULTS.tile, narrowest=narrowest)
    monkeypatch.setattr(decision, "DEFAULTS", replace(DEFAULTS, tile=tiles))
    w = sparse_array((13, 9), rng, 0.4, integer=True).astype(dtype)
    w[4] = 0  # an empty row
    spmm = sparsec.Kernel(SPMM, {"W": "csr"}, dtype=dtype)
    accumulate = sparsec.Kernel("Y(i,j) += W(i,k) * X(k,j)", {"W": "csr"}, dtype=dtype)
    b = sparse_array((5, 6, 4), rng, 0.4, integer=True).astype(dtype)
    b[2] = 0  # an empty slice
    mttkrp = sparsec.Kernel(MTTKRP, {"B": "csf"}, dtype=dtype)
    assert all("register tiles" in k.schedule for k in (spmm, accumulate, mttkrp))
    # a tile of 8 vectors, then at most one of 4 and one of 2 (down to the narrowest)
    assert spmm.source.count("sc_vec_t sc_acc") == {2: 8 + 4 + 2, 4: 8 + 4, 8: 8}[narrowest]
    for width in range(0, 2 * 128 + 20):
        x = rng.integers(-3, 4, (9, width)).astype(dtype)
        y0 = rng.integers(-3, 4, (13, width)).astype(dtype)
        want = w.astype(np.float64) @ x
        np.testing.assert_array_equal(spmm(W=w, X=x, threads=1 + width % 2), want)
        np.testing.assert_array_equal(accumulate(W=w, X=x, Y=y0.copy()), y0 + want)
        d = rng.integers(-3, 4, (4, width)).astype(dtype)
        c = rng.integers(-3, 4, (6, width)).astype(dtype)
        ref = np.einsum("ikl,lj,kj->ij", b.astype(np.float64), d, c)
        np.testing.assert_array_equal(mttkrp(B=b, D=d, C=c, threads=2), ref, err_msg=f"{width}")


@pytest.mark.parametrize("width", [5, 32, 70])
@pytest.mark.parametrize("fmt", ["csf", "uqq", "dss"])
def test_mttkrp_tiles_across_two_loops(width, fmt, rng):
    b = sparse_array((9, 11, 8), rng, 0.3, integer=True)
    d = sparse_array((8, width), rng, 0.8, integer=True)
    c = sparse_array((11, width), rng, 0.8, integer=True)
    k = sparsec.kernel(MTTKRP, {"B": fmt})
    got = np.asarray(k(B=b, D=d, C=c))
    np.testing.assert_array_equal(got, torch_reference("ikl,lj,kj->ij", {"B": b, "D": d, "C": c}))


@pytest.mark.parametrize(
    ("expr", "inputs", "ref"),
    [
        ("Y(i,j) = -W(i,k) * X(k,j) / 4", "WX", "-(W @ X) / 4"),
        ("Y(i,j) = W(i,k) * (X(k,j) - Z(k,j))", "WXZ", "W @ (X - Z)"),
        ("Y(i,j) = 2 * W(i,k) * X(k,j)", "WX", "2 * (W @ X)"),
        ("Y(i,j) = W(i,k) * v(k) * X(k,j)", "WvX", "W @ (v[:, None] * X)"),
        ("Y(i,j) = A(i,k) * X(k,j)", "AX", "A @ X"),
    ],
)
def test_tiled_expressions(expr, inputs, ref, rng):
    dense = {
        "W": sparse_array((20, 30), rng, 0.4, integer=True),
        "A": sparse_array((20, 30), rng, 0.4, integer=True),
        "v": sparse_array((30,), rng, 0.5, integer=True),
        "X": sparse_array((30, 90), rng, 0.9, integer=True),
        "Z": rng.choice([1.0, 2.0, 4.0], size=(30, 90)),
    }
    given = {n: dense[n] for n in inputs}
    k = sparsec.kernel(expr, {"W": "csr"} if "W" in given else {})
    assert "sc_vload" in k.source
    _close(np.asarray(k(**given)), torch_reference(ref, given), "float64")


def test_refused_nests_are_left_alone():
    # an atomic store (nonzero-parallel SpMM) is not tiled
    k = sparsec.kernel(
        SPMM, {"W": "csr"}, schedule="fuse(i,k,f), pos(f,fp,W), parallelize(fp,CPUThread,Atomics)"
    )
    assert "sc_vload" not in k.source and "register tiles" not in k.schedule
    # a loop whose output location moves with every loop around it has nothing to hold
    k = sparsec.kernel("y(j) = A(i,j) * x(i)", {"A": "dense"})
    assert "sc_vload" not in k.source
    # SpMV: the inner loop is sparse
    assert "sc_vload" not in sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": "csr"}).source


def _loop(var: str, body: ir.Block) -> ir.For:
    return ir.For(var, ir.IntLit(0), ir.Var(f"{var}_dim"), body)


def test_pass_refuses_a_region_that_reads_its_output():
    """``Y`` read inside the region (here by a bound) would see values held in registers."""
    store = ir.Assign(
        ir.Load("Y", ir.Bin("+", ir.Var("row"), ir.Var("j"))),
        ir.Load("X", ir.Bin("+", ir.Var("k"), ir.Var("j"))),
        "+=",
    )
    inner = _loop("j", ir.block(store))
    reads_y = ir.block(ir.Decl(ir.I64, "q", ir.Load("Y", ir.Var("k"))), inner)
    body, notes = tile(ir.block(_loop("k", reads_y)))
    assert notes == () and body == ir.block(_loop("k", reads_y))
    clean = ir.block(_loop("k", ir.block(inner)))
    body, notes = tile(clean)
    assert notes == ("j in register tiles across loop k",)


def test_pass_refuses_an_output_that_moves_in_the_region():
    store = ir.Assign(
        ir.Load("Y", ir.Bin("+", ir.Var("k"), ir.Var("j"))),
        ir.Load("X", ir.Var("j")),
        "+=",
    )
    nest = ir.block(_loop("k", ir.block(_loop("j", ir.block(store)))))
    assert tile(nest) == (nest, ())


def test_pass_refuses_a_strided_or_unknown_index():
    for index in (
        ir.Bin("*", ir.Var("j"), ir.IntLit(2)),  # stride 2
        ir.Load("perm", ir.Var("j")),  # gather
    ):
        store = ir.Assign(
            ir.Load("Y", ir.Var("j")), ir.Load("X", ir.Bin("+", ir.Var("k"), index)), "+="
        )
        nest = ir.block(_loop("k", ir.block(_loop("j", ir.block(store)))))
        assert tile(nest) == (nest, ())


def _calls(node) -> list[ir.Call]:
    """Every call in an IR tree."""
    found = [node] if isinstance(node, ir.Call) else []
    if isinstance(node, tuple):
        parts = node
    elif hasattr(node, "__dataclass_fields__"):
        parts = tuple(getattr(node, f) for f in node.__dataclass_fields__)
    else:
        parts = ()
    for part in parts:
        found.extend(_calls(part))
    return found


def _gather_region(index: ir.Expr, row: str = "r") -> ir.For:
    """``for k: for j: Y[row + j] += X[index + j]``"""
    store = ir.Assign(
        ir.Load("Y", ir.Bin("+", ir.Var(row), ir.Var("j"))),
        ir.Load("X", ir.Bin("+", index, ir.Var("j"))),
        "+=",
    )
    return _loop("k", ir.block(_loop("j", ir.block(store))))


def _zero_row(array: str = "Y", row: str = "row") -> ir.For:
    store = ir.Assign(ir.Load(array, ir.Bin("+", ir.Var(row), ir.Var("p"))), ir.FloatLit(0.0))
    return ir.For("p", ir.IntLit(0), ir.Var("j_dim"), ir.block(store))


def _work(body: ir.Block) -> tuple[ir.Stmt, ...]:
    """``body``'s statements after the tile pass's entry check of its extent (`stages`),
    which it asserts is there and first."""
    check = ir.Return(
        abi.STAGES_MISSING,
        ir.Call("stages_missing", (ir.Var("j_dim"), ir.Var("SC_STAGES_j_dim"))),
    )
    assert body.body[0] == check
    return body.body[1:]


def test_tiles_take_over_the_zeroing_of_their_row():
    """A row zeroed just before its region (declarations between) is not stored and
    reloaded: the accumulators start at zero and only the leftover columns are zeroed."""
    gather = ir.Bin("*", ir.Var("k"), ir.Var("ld"))
    body, _ = tile(
        ir.block(_zero_row(), ir.Decl(ir.I64, "r", ir.Var("row")), _gather_region(gather))
    )
    assert _work(body)[0] == ir.Decl(ir.I64, "r", ir.Var("row"))  # the zeroing loop is gone
    fns = [c.fn for c in _calls(body)]
    # the whole tiles' 8 accumulators, and the narrower tiles' 4 and 2
    assert fns.count("vzero") == 8 + 4 + 2 and "vload" in fns
    assert not any(c.fn == "vload" and c.args[0].left == ir.Var("Y") for c in _calls(body))
    tiled = body.body[-1]
    assert isinstance(tiled, ir.Block)
    remainder = tiled.body[-1]
    assert isinstance(remainder, ir.If)
    *narrower, last = remainder.branches[0][1].body
    assert [type(s) for s in narrower] == [ir.Decl, ir.If, ir.If]
    for stage, vectors in zip(narrower[1:], (4, 2), strict=True):
        # each narrower tile is built where the extent needs it (`stages`)
        ((built, loop),) = stage.branches
        assert built == ir.Call("stage", (ir.Var("SC_STAGES_j_dim"), ir.IntLit(vectors)))
        assert [type(s) for s in loop.body] == [ir.For]
    assert isinstance(last, ir.If)
    leftover = last.branches[0][1].body[0]
    assert isinstance(leftover, ir.For) and leftover.var == "p"
    # after the whole tiles and the narrower ones: sc_q0 / 2 * 2 vectors on
    whole = ir.Bin("*", ir.Var("sc_tiles0"), ir.Var("SC_TILE"))
    pairs = ir.Bin("*", ir.Bin("/", ir.Var("sc_q0"), ir.IntLit(2)), ir.IntLit(2))
    assert leftover.start == ir.Bin("+", whole, ir.Bin("*", pairs, ir.Var("SC_VLEN")))


@pytest.mark.parametrize(
    "between",
    [
        ir.Assign(ir.Load("Z", ir.Var("row")), ir.FloatLit(1.0)),  # not a declaration
        ir.Decl(ir.I64, "q", ir.Load("Y", ir.Var("row"))),  # reads the zeroed row
    ],
)
def test_zeroing_is_kept_when_something_else_comes_between(between):
    gather = ir.Bin("*", ir.Var("k"), ir.Var("ld"))
    stmts = (_zero_row(), between, ir.Decl(ir.I64, "r", ir.Var("row")), _gather_region(gather))
    body, notes = tile(ir.block(*stmts))
    assert notes and _work(body)[:3] == stmts[:3]
    assert "vzero" not in [c.fn for c in _calls(body)]


@pytest.mark.parametrize("zero", [_zero_row(array="Z"), _zero_row(row="other")])
def test_zeroing_of_another_row_is_kept(zero):
    gather = ir.Bin("*", ir.Var("k"), ir.Var("ld"))
    body, _ = tile(ir.block(zero, _gather_region(gather, row="row")))
    assert _work(body)[0] == zero and "vzero" not in [c.fn for c in _calls(body)]


def test_prefetch_only_rows_found_through_an_index_array():
    """``X[crd[k] * ld + j]``: the row iteration k + PREFETCH_DISTANCE gathers is
    prefetched; ``X[k * ld + j]`` is a stride the hardware predicts, left alone."""
    PREFETCH_DISTANCE = DEFAULTS.tile.prefetch_distance

    strided = ir.Bin("*", ir.Var("k"), ir.Var("ld"))
    body, notes = tile(ir.block(_gather_region(strided)))
    fns = [c.fn for c in _calls(body)]
    assert not {"prefetch", "prefetch_row"} & set(fns) and "prefetched" not in notes[0]
    gathered = ir.Bin("*", ir.Load("crd", ir.Var("k")), ir.Var("ld"))
    body, notes = tile(ir.block(_gather_region(gathered)))
    prefetches = [c for c in _calls(body) if c.fn == "prefetch_row"]
    for p in prefetches:  # each with the rows' stride: ld, free of the gathered index
        row = p.args[1]
        assert "ld" in free_vars(row) and "k" not in free_vars(row) and not arrays(row)
    last = ir.Bin("-", ir.Var("k_dim"), ir.IntLit(1))
    ahead = ir.Bin("+", ir.Var("k"), ir.IntLit(PREFETCH_DISTANCE))
    ahead = ir.Load("crd", ir.Call("min", (ahead, last)))  # clamped to the loop's last
    # one in each loop over tiles: the whole tiles, then those of 4 and 2 vectors
    assert len(prefetches) == 3 and all(ahead in _subexpressions(p) for p in prefetches)
    assert notes == (
        f"j in register tiles across loop k (gathered rows prefetched {PREFETCH_DISTANCE} ahead)",
    )


def test_a_prefetch_gets_the_span_its_index_array_can_reach():
    """``X[crd[k] * ld + j]`` with crd's level of extent ``n``: each prefetch gets the span
    ``n * ld`` of the rows it can reach (the template skips a span the L1 holds); where the
    pass is not told the extent, -1 (unknown: always prefetched)."""
    gathered = ir.Bin("*", ir.Load("crd", ir.Var("k")), ir.Var("ld"))
    for extents, known in (
        ({"crd": ir.Var("n")}, True),
        ({}, False),
        ({"other": ir.Var("n")}, False),
    ):
        body, _ = tile(ir.block(_gather_region(gathered)), extents=extents)
        prefetches = [c for c in _calls(body) if c.fn == "prefetch_row"]
        assert len(prefetches) == 3
        for p in prefetches:
            span = p.args[2]
            if not known:
                assert span == ir.IntLit(-1)
                continue
            # the tile's first column (sc_j*) cancels: the span is the rows' alone
            tiles = free_vars(span) - {"n", "ld"}
            assert {"n", "ld"} <= free_vars(span) and not arrays(span)
            assert all(v.startswith("sc_j") for v in tiles)
            for n, ld, j in ((7, 16, 0), (96, 128, 40)):
                at = {"n": n, "ld": ld} | dict.fromkeys(tiles, j)
                assert _evaluate(span, at) == n * ld


def _evaluate(e: ir.Expr, env: dict[str, int]) -> int:
    match e:
        case ir.IntLit():
            return e.value
        case ir.Var():
            return env[e.name]
        case ir.Bin(op="+"):
            return _evaluate(e.left, env) + _evaluate(e.right, env)
        case ir.Bin(op="-"):
            return _evaluate(e.left, env) - _evaluate(e.right, env)
        case ir.Bin(op="*"):
            return _evaluate(e.left, env) * _evaluate(e.right, env)
    raise AssertionError(f"not an integer expression: {e!r}")


@pytest.mark.parametrize("l1", [32 << 10, 48 << 10])
def test_gathers_within_a_span_the_l1_holds_are_not_prefetched(l1, rng):
    """SparseLinear's layout in column blocks, ``Yt(o,t) = W(b,o,k) * Xt(b,k,t)``: each
    prefetch gets the span of one block's rows (k_dim rows of t_dim values), which the
    template compares with the machine's L1 data cache (`Machine.l1_data`); CSR SpMM's span
    is all of X's rows. The sums are the same whether or not a row is prefetched."""
    with use(l1_data=l1):
        k = sparsec.Kernel(
            "Yt(o,t) = W(b,o,k) * Xt(b,k,t)",
            {"W": "dds"},
            schedule="split(o,o0,o1,8), reorder(o0,b,o1,k,t), parallelize(o0,CPUThread,NoRaces)",
        )
        src = k.generated("float64").source
        assert f"#define SC_L1_DATA_BYTES ((int64_t){l1})" in src
        assert "(pXt1 * k_dim + k_dim) * t_dim + sc_j" in src  # the block's span
        spmm = sparsec.Kernel(SPMM, {"W": "csr"}).source
        assert "k_dim * j_dim + sc_j0 - (0 * j_dim + sc_j0))" in spmm
        # blocks of 24 rows: 24 x 256 float64 (48 KB) fits a 48 KB L1, not a 32 KB one
        w = sparse_array((2 * 24 * 20, 1), rng, 0.4, integer=True).reshape(2, 20, 24)
        dense = np.zeros((20, 48))
        for b in range(2):
            dense[:, 24 * b : 24 * (b + 1)] = w[b]
        xt = rng.integers(-3, 4, (2, 24, 256)).astype(np.float64)
        want = dense @ xt.reshape(48, 256)
        for threads in (1, 2):
            np.testing.assert_array_equal(np.asarray(k(W=w, Xt=xt, threads=threads)), want)


def _subexpressions(e: ir.Expr) -> list[ir.Expr]:
    from sparsec.ir.visit import children

    return [e, *(s for c in children(e) for s in _subexpressions(c))]


@pytest.mark.parametrize("way", [4 << 10, 8 << 10])
def test_the_l1_way_is_the_machines(way, rng):
    """The rows whose gathers are not prefetched into L1 are those a multiple of the
    machine's L1 way apart (`Machine.l1_way`), which the template takes as it is."""
    with use(l1_way=way):
        k = sparsec.Kernel(SPMM, {"W": "csr"})
        assert f"#define SC_L1_WAY_BYTES ((int64_t){way})" in k.generated("float64").source
        w = sparse_array((30, 40), rng, 0.3, integer=True)
        # rows 4 KB apart: aliased in a 4 KB way, not in an 8 KB one; the same sums either way
        x = rng.integers(-3, 4, (40, 512)).astype(np.float64)
        np.testing.assert_array_equal(np.asarray(k(W=w, X=x, threads=2)), w @ x)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("width", [64, 97, 300, 512])
def test_prefetching_spmm_matches_torch_for_every_row_length(width, dtype, rng):
    """Rows of 0 to 15 stored entries: shorter than the prefetch distance (no prefetching
    iteration), exactly it, and longer (the prefetched iteration clamped to the row's
    last)."""
    w = np.zeros((16, 40))
    for r in range(16):
        w[r, rng.choice(40, size=r, replace=False)] = rng.integers(-4, 5, size=r) + 0.5
    x = sparse_array((40, width), rng, 0.8, integer=True)
    k = sparsec.kernel(SPMM, {"W": "csr"}, dtype=dtype)
    assert "sc_prefetch" in k.source and "sc_vzero" in k.source
    want = torch_reference("ik,kj->ij", {"W": w, "X": x})
    for threads in (1, 2):
        got = np.asarray(k(W=w.astype(dtype), X=x.astype(dtype), threads=threads))
        np.testing.assert_array_equal(got, want)


def test_mttkrp_prefetches_across_its_fibers():
    """MTTKRP's l fibers hold about one entry each, so prefetching within a fiber never runs:
    the l loop prefetches the D row 6 positions on in the slice's run of positions (into the
    next fibers, clamped to the run's last), and the k loop the C row its iteration 6 on
    gathers (clamped to the slice's last k). SpMM's single loop prefetches within its row,
    clamped to the last entry of the row that its depth block holds."""
    for fmt in ("csf", "dss"):
        k = sparsec.Kernel(MTTKRP, {"B": fmt})
        src = k.source
        assert "sc_pfend0 = B2_pos[pB1] < pB2_end ? B3_pos[pB2_end] - 1 : 0;" in src
        assert "sc_prefetch(C_vals + (B2_crd[sc_min(pB2 + 6, pB2_end - 1)] * j_dim" in src
        assert "sc_prefetch(D_vals + (B3_crd[sc_min(pB3 + 6, sc_pfend0)] * j_dim" in src
        assert "sc_pf0" not in src
        assert "prefetched 6 ahead, across segments" in k.schedule
    spmm = sparsec.Kernel(SPMM, {"W": "csr"})
    # in depth blocks, clamped to the block's last entry of the row
    within = "sc_prefetch_row(X_vals + (W2_crd[sc_min(pW2 + 6, sc_hi0 - 1)] * j_dim + sc_j0)"
    assert within in spmm.source and "across segments" not in spmm.schedule


@pytest.mark.parametrize("fmt", ["csf", "dss", "uqq"])
@pytest.mark.parametrize("width", [64, 97])
def test_prefetching_mttkrp_matches_torch_across_fibers(fmt, width, rng):
    """Slices with no entries, fibers of one entry and of many, and a full last slice (its
    prefetch indices clamp at the arrays' ends): exact integer results, on 1 and 2 threads."""
    b = np.zeros((7, 9, 12))
    b[1, 2, 5] = 3.0  # a slice of one fiber of one entry
    b[2] = sparse_array((9, 12), rng, 0.15, integer=True)  # fibers of about one entry
    b[4, :, :] = rng.integers(-3, 4, size=(9, 12)) + 0.5  # long fibers
    b[6] = sparse_array((9, 12), rng, 0.6, integer=True)  # the last slice, full to the end
    d = sparse_array((12, width), rng, 0.8, integer=True)
    c = sparse_array((9, width), rng, 0.8, integer=True)
    k = sparsec.kernel(MTTKRP, {"B": fmt})
    want = torch_reference("ikl,lj,kj->ij", {"B": b, "D": d, "C": c})
    for threads in (1, 2):
        np.testing.assert_array_equal(np.asarray(k(B=b, D=d, C=c, threads=threads)), want)


# ------------------------------------------------------------ non-temporal output tiles


def test_dense_outputs_store_their_tiles_through_the_streaming_store():
    with use(MEASURED_ON):  # the threshold is the machine's last-level cache
        k = sparsec.Kernel(SPMM, {"W": "csr"})
        src = k.generated("float32").source
        # a call in depth blocks (`sparsec.passes.bands`) reads its output tiles back: never streamed
        flag = (
            "int64_t sc_stream_out = i_dim * j_dim >= SC_STREAM_OUT_VALUES && sc_depth == 0"
            " && sc_rows_aligned(Y_vals, j_dim);"
        )
        assert flag in src
        assert "sc_vstore_out(Y_vals + " in src and "sc_vstore(Y_vals" not in src
        kernel_fn = src.split("\nint sparsec_kernel(")[1].split("\n}\n")[0] + "\n}"
        assert kernel_fn.rstrip().endswith("sc_store_fence();\n  return 0;\n}")
        assert f"((int64_t){8 << 20} / (int64_t)sizeof(sc_val_t))" in src
        assert f"output tiles stored non-temporally from {8 << 20} bytes" in k.schedule
        for expr, fmts in [
            ("y(i) = A(i,j) * x(j)", {"A": "csr"}),
            (SPMM, {"W": "csr", "Y": "csr"}),
        ]:
            assert "sc_stream_out" not in sparsec.Kernel(expr, fmts).source


def test_tiles_into_a_workspace_keep_the_plain_store():
    """A precomputed workspace is read right after its tiles are stored: no streaming, and
    no flag or note when no tile stores into the output itself. (The whole product is
    precomputed: a workspace that another factor multiplies is marked slot by slot, and
    its producer's loop, storing the marks too, is not tiled.)"""
    k = sparsec.Kernel(MTTKRP, {"B": "csf"}, schedule="precompute(B(i,k,l)*D(l,j)*C(k,j), j, jw)")
    body = k.source.split("int sparsec_kernel(")[1]
    assert "sc_vstore(jw_ws" in body and "sc_vstore_out(" not in body
    assert "sc_stream_out" not in body and "sc_store_fence" not in body
    assert "non-temporally" not in k.schedule


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("width", [48, 64, 97, 256, 300])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("aligned", [True, False])
def test_streamed_output_tiles_equal_plain_ones(dtype, width, threads, aligned, monkeypatch):
    """With the threshold at 64 bytes every output is big enough to stream; it streams
    where the array starts on a vector boundary and its rows are whole vectors (``aligned``:
    every output allocated on a cache line; otherwise numpy's 16 bytes), and takes plain
    stores elsewhere (rows of 97 values, or 300 in float32, start unaligned). Rows of 48 and
    64 values stream from the narrower tiles too on some vector width. Either way the result
    is the plain stores' bit for bit, and torch's."""
    rng = np.random.default_rng(width)
    w = sparse_array((150, 40), rng, 0.3).astype(dtype)
    x = rng.standard_normal((40, width)).astype(dtype)
    tensor = sparsec.as_tensor(w, "csr")
    plain = sparsec.Kernel(SPMM, {"W": "csr"})(W=tensor, X=x, threads=threads)
    if aligned:
        monkeypatch.setattr(runtime, "ALIGN_FROM_BYTES", 0)
        monkeypatch.setattr(sys.modules["sparsec.runtime.fastpath"], "ALIGN_FROM_BYTES", 0)
    with use(last_level_cache=64):
        k = sparsec.Kernel(SPMM, {"W": "csr"})
        assert "((int64_t)64 / (int64_t)sizeof(sc_val_t))" in k.generated(dtype).source
        got = k(W=tensor, X=x, threads=threads)
    np.testing.assert_array_equal(got, plain)
    _close(got, torch_reference("ik,kj->ij", {"W": w, "X": x}), dtype)


@pytest.mark.parametrize("n", [0, 5, 131071, 131072, 300_003])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_large_outputs_are_cache_line_aligned(n, dtype):
    a = runtime.aligned_empty(n, np.dtype(dtype))
    assert a.shape == (n,) and a.dtype == dtype and a.flags.c_contiguous and a.flags.writeable
    if a.nbytes >= runtime.ALIGN_FROM_BYTES:
        assert a.ctypes.data % 64 == 0
    w = sparsec.as_tensor(np.eye(1200, 600, dtype=dtype), "csr")
    k = sparsec.kernel(SPMM, {"W": "csr"})
    for _ in range(2):  # the general path, then the fast path
        out = k(W=w, X=np.ones((600, 256), dtype))
        assert out.ctypes.data % 64 == 0


# the widths of `test_a_kernel_built_for_one_width_runs_every_width`: with 16- to 64-byte
# vectors of float32 or float64 (2 to 16 lanes), each stage (whole tiles, the tiles of 4 and
# 2 vectors, the columns left) is needed by some and not by others
STAGE_WIDTHS = [0, 1, 8, 16, 24, 32, 48, 64, 96, 128, 136, 200]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_kernel_built_for_one_width_runs_every_width(dtype, rng):
    """A tiled kernel is built with the register-tile stages its first call's width needs
    (`sparsec.passes.stages`). A later width that needs no others runs on it; one that
    does meets the kernel's entry check (nothing written) and the kernel is rebuilt with
    every stage. Each width first, then all of them, on integer values (exact sums), on 1
    and 2 threads, through the fast path and the general one."""
    w = sparse_array((13, 9), rng, 0.4, integer=True).astype(dtype)
    w[4] = 0  # an empty row
    b = sparse_array((5, 6, 4), rng, 0.4, integer=True).astype(dtype)
    b[2] = 0  # an empty slice
    for first in STAGE_WIDTHS:
        spmm = sparsec.Kernel(SPMM, {"W": "csr"}, dtype=dtype)
        mttkrp = sparsec.Kernel(MTTKRP, {"B": "csf"}, dtype=dtype)
        for n, width in enumerate((first, *STAGE_WIDTHS)):
            x = rng.integers(-3, 4, (9, width)).astype(dtype)
            d = rng.integers(-3, 4, (4, width)).astype(dtype)
            c = rng.integers(-3, 4, (6, width)).astype(dtype)
            want = w.astype(np.float64) @ x
            want3 = np.einsum("ikl,lj,kj->ij", b.astype(np.float64), d, c)
            for threads in (1, 2):
                np.testing.assert_array_equal(spmm(W=w, X=x, threads=threads), want)
                got = mttkrp(B=sparsec.Tensor.from_dense(b, "csf"), D=d, C=c, threads=threads)
                np.testing.assert_array_equal(got, want3)
            if n == 0:  # built for the first width
                for k in (spmm, mttkrp):
                    source = k.executable(dtype, "int32").loaded.generated.source
                    assert source.startswith(f"#define SC_HINT_j_dim {first}\n")


def test_a_stage_extent_the_function_computes_keeps_every_stage():
    """Only an extent that is a parameter can be checked on entry: a region over a local
    extent is built with every stage (its guards are true) and the function checks
    nothing."""
    region = _gather_region(ir.Bin("*", ir.Var("k"), ir.Var("ld")))
    inner = region.body.body[0]
    local = replace(region, body=ir.block(replace(inner, end=ir.Var("n"))))
    body, notes = tile(ir.block(ir.Decl(ir.I64, "n", ir.Var("j_dim")), local))
    assert notes and not any(isinstance(s, ir.Return) for s in body.body)
    assert not [c for c in _calls(body) if c.fn == "stage"]
    conditions = [c for s in statements(body) if isinstance(s, ir.If) for c, _ in s.branches]
    # the whole tiles and the two narrower ones built always; the columns left where any
    assert conditions.count(ir.IntLit(1)) == 3
    assert any(
        isinstance(c, ir.Bin) and c.op == "&&" and c.left == ir.IntLit(1) for c in conditions
    )


def _blocked_dense(rows: int, cols: int, r: int, c: int, rng) -> np.ndarray:
    """A rows x cols integer matrix of r x c blocks, about half of them stored (zeros
    inside the stored ones too), with an empty block row."""
    keep = rng.random((rows // r, cols // c)) < 0.5
    keep[1] = False  # an empty block row
    cells = np.kron(keep, np.ones((r, c))) * rng.integers(-3, 4, (rows, cols))
    return cells.astype(np.float64)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("block", [(2, 3), (3, 2), (4, 4), (1, 4), (8, 2)])
@pytest.mark.parametrize("width", WIDTHS)
def test_a_blocks_rows_share_their_tiles(block, width, dtype, rng):
    """bsr(R,C) SpMM: a block's R rows (2 <= R <= 4, fixed in the code) are held in the
    tiles together across the block row, each vector of X loaded once for all of them;
    R = 1 and R = 8 keep one row per tile. Integer values: every order sums alike."""
    r, c = block
    fmt = f"bsr({r},{c})"
    k = sparsec.kernel("Y(i,k) = A(i,j) * X(j,k)", {"A": fmt}, dtype=dtype)
    held = 2 <= r <= 4
    assert ("register tiles of" in k.schedule) == held, k.schedule
    a = _blocked_dense(8 * r, 6 * c, r, c, rng)
    x = rng.integers(-3, 4, (6 * c, width)).astype(np.float64)
    tensor = sparsec.Tensor.from_dense(a.astype(dtype), fmt)
    for threads in (1, 2):
        got = np.asarray(k(A=tensor, X=x.astype(dtype), threads=threads))
        np.testing.assert_array_equal(got, (a @ x).astype(dtype))


@pytest.mark.parametrize(("vector_bytes", "walk"), [(32, 2), (64, 4)])
def test_held_rows_fill_the_registers_the_machine_has(vector_bytes, walk, rng):
    """A tile of a block's 4 rows uses 8 accumulators where the machine has 16 vector
    registers (AVX2: 2 vectors per row a walk) and 16 where it has 32 (AVX-512: 4), and
    gives the product either way (built for this host's compiler, whatever the facts)."""
    with use(vector_bytes=vector_bytes):
        k = sparsec.Kernel("Y(i,k) = A(i,j) * X(j,k)", {"A": "bsr(4,4)"})
        source = k.source
    first_walk = source[source.index("sc_vec_t sc_acc0_0_0") : source.index("for (int64_t pA2")]
    assert first_walk.count("sc_vec_t sc_acc0_") == 4 * walk
    a = _blocked_dense(32, 24, 4, 4, rng)
    x = rng.integers(-3, 4, (24, 300)).astype(np.float64)
    tensor = sparsec.Tensor.from_dense(a, "bsr(4,4)")
    with use(vector_bytes=vector_bytes):
        np.testing.assert_array_equal(k(A=tensor, X=x), a @ x)
