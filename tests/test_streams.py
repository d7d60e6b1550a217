"""Stream prefetching (`sparsec.passes.streams`): which loops get their crd/vals streams prefetched,
and kernels that do still give torch's results exactly, for rows shorter and longer than the
prefetch distance and rows at the very end of the arrays."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import sparse_array, torch_reference

import sparsec
from sparsec.ir import nodes as ir
from sparsec.passes.streams import prefetch_streams
from sparsec.policy.decision import DEFAULTS

DISTANCE = DEFAULTS.stream_distance

P = ir.Var("p")
START = ir.Load("pos", ir.Var("i"))


def _inner(*body: ir.Stmt, start: ir.Expr = START, parallel: ir.Parallel | None = None) -> ir.For:
    return ir.For(
        "p",
        start,
        ir.Load("pos", ir.Bin("+", ir.Var("i"), ir.IntLit(1))),
        ir.block(*body),
        parallel,
    )


def _outer(*body: ir.Stmt) -> ir.For:
    return ir.For("i", ir.IntLit(0), ir.Var("n"), ir.block(*body))


def _prefetched(body: ir.Block) -> list[tuple[str, ir.Expr]]:
    """(array, position) of every stream prefetch in ``body``, in order."""
    found: list[tuple[str, ir.Expr]] = []

    def walk(b: ir.Block) -> None:
        for s in b.body:
            if isinstance(s, ir.Effect) and s.call.fn == "prefetch_stream":
                array, at = s.call.args
                assert isinstance(array, ir.Var)
                found.append((array.name, at))
            elif isinstance(s, ir.For | ir.While):
                walk(s.body)
            elif isinstance(s, ir.If):
                for _, then in s.branches:
                    walk(then)

    walk(body)
    return found


SPMV_ROW = (
    ir.Decl(ir.I64, "j", ir.Load("crd", P)),
    ir.Assign(ir.Var("acc"), ir.Bin("*", ir.Load("vals", P), ir.Load("x", ir.Var("j"))), "+="),
)


@pytest.mark.parametrize(
    ("program", "streams"),
    [
        # SpMV's row loop: crd and vals, not x (gathered at crd[p])
        (_outer(_inner(*SPMV_ROW)), ["crd", "vals"]),
        # a loop that is not inside another has no stream running across iterations
        (_inner(*SPMV_ROW), []),
        # a dense loop restarts at 0: the same data every outer iteration
        (_outer(_inner(*SPMV_ROW, start=ir.IntLit(0))), []),
        # a loop run in parallel is left to its threads
        (_outer(_inner(*SPMV_ROW, parallel=ir.Parallel("CPUThread"))), []),
        # an array the loop stores to is not prefetched for reading
        (_outer(_inner(ir.Assign(ir.Load("out", P), ir.Load("vals", P)))), ["vals"]),
        (_outer(_inner(ir.Assign(ir.Load("vals", P), ir.Load("vals", P), "+="))), []),
        # loads next to p are not loads at p
        (_outer(_inner(ir.Assign(ir.Var("a"), ir.Load("vals", ir.add(P, ir.IntLit(1)))))), []),
        # a loop of one position (a singleton under a dense level: ELL's, N:M's) would
        # prefetch at every entry: not a stream loop, its end given directly or declared
        (
            _outer(
                ir.For("p", ir.Var("q"), ir.add(ir.Var("q"), ir.IntLit(1)), ir.block(*SPMV_ROW))
            ),
            [],
        ),
        (
            _outer(
                ir.Decl(ir.I64, "q_end", ir.add(ir.Var("q"), ir.IntLit(1))),
                ir.For("p", ir.Var("q"), ir.Var("q_end"), ir.block(*SPMV_ROW)),
            ),
            [],
        ),
        # a conditional body still streams
        (
            _outer(_inner(ir.If(((ir.Load("mask", P), ir.block(*SPMV_ROW)),)))),
            ["crd", "mask", "vals"],
        ),
    ],
)
def test_which_loops_stream(program, streams):
    body, notes = prefetch_streams(ir.block(program))
    found = _prefetched(body)
    assert [a for a, _ in found] == streams
    for _, at in found:
        assert at == ir.Bin("+", START, ir.IntLit(DISTANCE))
    assert bool(notes) == bool(streams)


def test_a_loop_that_nests_a_loop_is_not_a_stream_loop_but_its_inner_loop_is():
    nested = _outer(
        _inner(
            ir.Decl(ir.I64, "k", ir.Load("crd", P)),
            ir.For(
                "q",
                ir.Load("pos2", ir.Var("k")),
                ir.Load("pos2", ir.add(ir.Var("k"), ir.IntLit(1))),
                ir.block(ir.Assign(ir.Var("acc"), ir.Load("vals2", ir.Var("q")), "+=")),
            ),
        )
    )
    body, _ = prefetch_streams(ir.block(nested))
    assert [a for a, _ in _prefetched(body)] == ["vals2"]
    # the prefetch sits right before the q loop, inside the p loop's body
    (outer,) = body.body
    assert isinstance(outer, ir.For)
    (p_loop,) = [s for s in outer.body.body if isinstance(s, ir.For)]
    kinds = [type(s).__name__ for s in p_loop.body.body]
    assert kinds == ["Decl", "Effect", "For"]


def _kernel_body(source: str) -> str:
    """The generated functions, without the template's helpers."""
    return source[source.index("int sparsec_kernel(") :]


def test_spmv_source_prefetches_its_streams():
    k = sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": "csr"})
    assert f"sc_prefetch_stream(A2_crd, A2_pos[pA1] + {DISTANCE})" in k.source
    assert f"sc_prefetch_stream(A_vals, A2_pos[pA1] + {DISTANCE})" in k.source
    assert "A2_crd, A_vals prefetched" in k.schedule


def test_nm_and_ell_entries_are_not_prefetched_one_by_one():
    for expr, fmt in (
        ("y(i) = A(i,j) * x(j)", "nm(2,4)"),
        ("y(i) = A(i,k,j) * x(j)", "ddp"),  # ELL: k counts a row's stored entries
    ):
        k = sparsec.kernel(expr, {"A": fmt})
        assert "sc_prefetch_stream(A" not in k.source, fmt  # nor in an outlined function


def test_tiled_spmm_rows_are_not_stream_loops():
    """SpMM's k loop holds the register tiles (it nests loops): its cost is in the gathered
    rows of X, which the tile pass prefetches."""
    k = sparsec.kernel("Y(i,j) = W(i,k) * X(k,j)", {"W": "csr"})
    assert "sc_prefetch_stream(" not in _kernel_body(k.source)
    assert "positions ahead" not in k.schedule


def _rows_of_every_length(rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Row r holds r % 300 entries, so rows shorter and longer than the distance, empty rows
    and, last, the rows whose prefetches reach past the arrays' end."""
    a = np.zeros((rows, cols))
    for r in range(rows):
        n = r % 300
        a[r, rng.choice(cols, size=n, replace=False)] = rng.integers(-4, 5, size=n) + 0.5
    return a


@pytest.mark.parametrize(("dtype", "index_dtype"), [("float32", "int32"), ("float64", "int64")])
@pytest.mark.parametrize(
    ("expr", "formats", "ref", "x_axis"),
    [
        ("y(i) = A(i,j) * x(j)", {"A": "csr"}, "ij,j->i", 1),
        ("y(i) = A(i,j) * x(j)", {"A": "dcsr"}, "ij,j->i", 1),
        ("y(j) = A(i,j) * x(i)", {"A": "csr"}, "ij,i->j", 0),
        ("y(i) = A(i,j) * B(i,j)", {"A": "csr", "B": "dd"}, "ij,ij->i", None),
    ],
)
def test_streaming_kernels_match_torch(expr, formats, ref, x_axis, dtype, index_dtype, rng):
    a = _rows_of_every_length(320, 310, rng)
    a[7] = 0.0
    operands = {"A": a}
    if x_axis is None:
        operands["B"] = sparse_array(a.shape, rng, 0.6, integer=True)
    else:
        operands["x"] = sparse_array((a.shape[x_axis],), rng, 0.8, integer=True)
    k = sparsec.kernel(expr, formats, dtype=dtype, index_dtype=index_dtype)
    assert "sc_prefetch_stream(" in _kernel_body(k.source)
    assert f"prefetched {DISTANCE} positions ahead" in k.schedule
    want = torch_reference(ref, operands)
    for threads in (1, 2):
        got = np.asarray(k(**{n: v.astype(dtype) for n, v in operands.items()}, threads=threads))
        np.testing.assert_array_equal(got, want)
