"""The single pass of a CSR output in chunks of rows, one per thread (`sparsec.lower.chunks`):
each chunk appends into its own region, then the chunks are moved into place. Every result
is compared with numpy on the densified inputs and with the two-phase assembly (count,
prefix sum, fill), storage array by storage array, at 1, 2 and 3 threads on row counts no
thread count divides, with empty rows, stored zeros and capacities at their limits."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import scipy.sparse as sp
from conftest import assert_same_storage, sparse_array

import sparsec

COSTS = sys.modules["sparsec.policy.costs"]
SPARSE_OUT = sys.modules["sparsec.runtime.sparse_out"]

CSR3 = {"A": "csr", "B": "csr", "C": "csr"}
#: (expression, formats, operand shapes (rows x cols), numpy reference)
KERNELS = [
    ("A(i,j) = B(i,j) + C(i,j)", CSR3, {"B": (31, 17), "C": (31, 17)}, lambda B, C: B + C),
    (
        "A(i,j) = B(i,j) + C(i,j) * D(i,j)",
        {**CSR3, "D": "csr"},
        {"B": (31, 17), "C": (31, 17), "D": (31, 17)},
        lambda B, C, D: B + C * D,
    ),
    ("A(i,j) = B(i,k) * C(k,j)", CSR3, {"B": (31, 13), "C": (13, 17)}, lambda B, C: B @ C),
    (
        "A(i,j) = B(i,j) - C(i,j)",
        {"A": "csc", "B": "csc", "C": "csc"},
        {"B": (17, 31), "C": (17, 31)},
        lambda B, C: B - C,
    ),
]
IDS = ["add", "b_plus_cd", "spgemm", "csc_sub"]


def _inputs(fmts, shapes, rng, zeros: bool = True):
    """Integer-valued operands (sums exact in any order) with empty rows and columns; the
    sparse ones also hold stored zeros, which are structure."""
    dense, given = {}, {}
    for name, shape in shapes.items():
        arr = sparse_array(shape, rng, integer=True)
        dense[name] = arr
        fmt = fmts.get(name, "dense")
        if fmt == "dense":
            given[name] = arr
            continue
        m = sp.csr_matrix(arr) if fmt == "csr" else sp.csc_matrix(arr)
        if zeros and m.nnz:
            m.data[:: max(1, m.nnz // 5)] = 0.0  # stored, so present
            dense[name] = m.toarray()
        given[name] = sparsec.Tensor.from_scipy(m, fmt)
    return dense, given


def _spy(monkeypatch) -> list[int]:
    """The thread counts the chunked pass ran with (it, not the two phases, built them)."""
    seen: list[int] = []
    real = SPARSE_OUT.chunked_pass

    def spy(out, prepared, bound, nthreads, poison):
        done = real(out, prepared, bound, nthreads, poison)
        if done is not None:
            seen.append(nthreads)
        return done

    monkeypatch.setattr(SPARSE_OUT, "chunked_pass", spy)
    return seen


@pytest.mark.parametrize("index_dtype", ["int32", "int64"])
@pytest.mark.parametrize(("expr", "fmts", "shapes", "ref"), KERNELS, ids=IDS)
def test_chunks_match_numpy_and_the_two_phases(
    expr, fmts, shapes, ref, index_dtype, rng, monkeypatch
):
    dense, given = _inputs(fmts, shapes, rng)
    given = {
        n: (v.astype(index_dtype=index_dtype) if isinstance(v, sparsec.Tensor) else v)
        for n, v in given.items()
    }
    k = sparsec.kernel(expr, fmts)
    assert k.executable("float64", index_dtype).loaded.generated.chunked
    seen = _spy(monkeypatch)
    outs = {t: k(**given, threads=t) for t in (1, 2, 3)}
    assert seen == [1, 2, 3]
    monkeypatch.setattr(COSTS, "SINGLE_PASS_ENTRIES", -1)  # count, prefix sum, fill
    counted = k(**given, threads=2)
    want = ref(*dense.values())
    for got in outs.values():
        got.validate("out")
        assert_same_storage(got, counted)
        np.testing.assert_array_equal(np.asarray(got), want)


@pytest.mark.parametrize("threads", [1, 2, 3, 4])
@pytest.mark.parametrize("rows", [0, 1, 2, 5, 9])
def test_chunks_of_few_rows_and_empty_chunks(rows, threads, rng, monkeypatch):
    """Fewer rows than threads, no rows, and whole chunks of empty rows."""
    b = sparse_array((rows, 6), rng, integer=True)
    c = sparse_array((rows, 6), rng, integer=True)
    b[: rows // 2 + 1] = 0.0  # the first chunk (or more) stores nothing
    c[: rows // 2 + 1] = 0.0
    k = sparsec.kernel("A(i,j) = B(i,j) + C(i,j)", CSR3)
    B, C = sparsec.Tensor.from_dense(b, "csr"), sparsec.Tensor.from_dense(c, "csr")
    seen = _spy(monkeypatch)
    got = k(B=B, C=C, threads=threads).validate("out")
    assert seen == [threads]
    np.testing.assert_array_equal(np.asarray(got), b + c)
    assert got.nnz == np.count_nonzero((b != 0) | (c != 0))


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize(("expr", "fmts", "shapes", "ref"), KERNELS[:3], ids=IDS[:3])
def test_chunk_capacities_at_their_limits(expr, fmts, shapes, ref, threads, rng, monkeypatch):
    """Each chunk's region holds the proven bound plus one row of slack: for bounds from
    nothing to the exact entry count the pass either builds the right output or stops
    with CAPACITY_EXCEEDED before writing past its region (poisoned: an error; else the two
    phases run), never a wrong or overrun output."""
    dense, given = _inputs(fmts, shapes, rng, zeros=False)
    k = sparsec.kernel(expr, fmts)
    want = k(**given, threads=1)
    nnz = want.nnz
    executable = k.executable("float64", "int32")
    for bound in sorted({0, 1, nnz // 3, nnz // 2, nnz - 17, nnz - 1, nnz}):
        if bound < 0:
            continue
        monkeypatch.setattr(SPARSE_OUT, "entry_bound", lambda *a, b=bound: b)
        monkeypatch.setattr(executable, "poison", True)
        try:
            got = k(**given, threads=threads)
        except sparsec.SparsecError as err:
            assert f"capacity bound {bound} was too small" in str(err)
            assert bound < nnz
        else:
            assert_same_storage(got.validate("out"), want)
        monkeypatch.setattr(executable, "poison", False)
        assert_same_storage(k(**given, threads=threads).validate("out"), want)
    np.testing.assert_array_equal(np.asarray(want), ref(*dense.values()))


def test_chunks_balance_rows_by_the_inputs_entries(monkeypatch):
    """Skewed rows: the chunks split the rows where the inputs' entries (plus one per row)
    are halved, not at the middle row, and the result is the same."""
    rng = np.random.default_rng(7)
    n = 200
    lengths = np.where(np.arange(n) < 20, 150, 2)  # the first tenth holds most entries
    rows = np.repeat(np.arange(n), lengths)
    cols = np.concatenate([rng.choice(300, size=m, replace=False) for m in lengths])
    m = sp.csr_matrix((rng.integers(1, 5, rows.size).astype(float), (rows, cols)), shape=(n, 300))
    B = sparsec.Tensor.from_scipy(m)
    k = sparsec.kernel("A(i,j) = B(i,j) + C(i,j)", CSR3)
    starts: list[np.ndarray] = []
    real = SPARSE_OUT._row_starts

    def spy(out, prepared, rows_, chunks):
        got = real(out, prepared, rows_, chunks)
        starts.append(got)
        return got

    monkeypatch.setattr(SPARSE_OUT, "_row_starts", spy)
    got = k(B=B, C=B, threads=2).validate("out")
    np.testing.assert_array_equal(np.asarray(got), 2 * m.toarray())
    (cut,) = starts
    assert cut[0] == 0 and cut[-1] == n
    assert 10 <= cut[1] <= 20  # entries (2 x 3000 of 3360 + rows) halve within row 20


def test_rows_merged_with_another_operands_rows_stay_serial(rng):
    """A dcsr operand's row cursor carries one row into the next: the single pass stays
    serial (two phases on threads), and the answer is the same at every thread count."""
    k = sparsec.kernel("A(i,j) = B(i,j) + C(i,j)", {"A": "csr", "B": "csr", "C": "dcsr"})
    assert not k.executable("float64", "int32").loaded.generated.chunked
    assert "chunks" not in k.source
    b, c = sparse_array((9, 7), rng, integer=True), sparse_array((9, 7), rng, integer=True)
    B, C = sparsec.Tensor.from_dense(b, "csr"), sparsec.Tensor.from_dense(c, "dcsr")
    for t in (1, 2, 3):
        np.testing.assert_array_equal(np.asarray(k(B=B, C=C, threads=t).validate()), b + c)


@pytest.mark.parametrize(
    ("expr", "fmts", "shapes", "ref"),
    [
        (
            "A(i,j) = B(i,j) * C(i,k) * D(k,j)",
            {"A": "csr", "B": "csr"},
            {"B": (31, 17), "C": (31, 5), "D": (5, 17)},
            lambda B, C, D: B * (C @ D),
        ),
        (
            "A(i,j) = B(i,j) * C(i,j)",
            {"A": "csr", "B": "csr"},
            {"B": (31, 17), "C": (31, 17)},
            lambda B, C: B * C,
        ),
    ],
    ids=["sddmm", "times_dense"],
)
def test_a_count_over_one_operands_positions_takes_the_two_phases(
    expr, fmts, shapes, ref, rng, monkeypatch
):
    """SDDMM's count walks B's positions (no merge, no workspace): cheap next to the dot
    products, so every thread count, one included, counts and fills in two phases rather
    than append serially or in chunks, and no single-pass function is compiled. Every
    thread count gives numpy's answer."""
    dense, given = _inputs(fmts, shapes, rng)
    k = sparsec.kernel(expr, fmts)
    generated = k.executable("float64", "int32").loaded.generated
    assert not generated.chunked and not generated.append
    assert "sparsec_append" not in generated.source
    seen = _spy(monkeypatch)
    for t in (1, 2, 3):
        got = k(**given, threads=t).validate("out")
        np.testing.assert_array_equal(np.asarray(got), ref(*dense.values()))
    assert seen == []


def test_only_single_row_level_outputs_run_in_chunks():
    """'dds' (rows over two dense levels) and dcsr keep their earlier passes."""
    for fmt in ("dds", "dcsr"):
        fmts = {"A": fmt, "B": fmt, "C": fmt}
        expr = "A(i,j,k) = B(i,j,k) + C(i,j,k)" if fmt == "dds" else "A(i,j) = B(i,j) + C(i,j)"
        k = sparsec.kernel(expr, fmts)
        assert not k.executable("float64", "int32").loaded.generated.chunked


def test_too_large_chunk_regions_take_the_two_phases(rng, monkeypatch):
    """Past `costs.CHUNKED_ENTRIES` reserved in all, the rows are counted and filled."""
    b, c = sparse_array((11, 8), rng, integer=True), sparse_array((11, 8), rng, integer=True)
    B, C = sparsec.Tensor.from_dense(b, "csr"), sparsec.Tensor.from_dense(c, "csr")
    k = sparsec.kernel("A(i,j) = B(i,j) + C(i,j)", CSR3)
    want = k(B=B, C=C, threads=2)
    monkeypatch.setattr(COSTS, "CHUNKED_ENTRIES", 0)
    seen = _spy(monkeypatch)
    assert_same_storage(k(B=B, C=C, threads=2).validate("out"), want)
    assert seen == []
    np.testing.assert_array_equal(np.asarray(want), b + c)


def test_the_two_phases_are_built_when_a_call_first_needs_them(rng, monkeypatch, tmp_path):
    """A kernel with a single pass is built without its two phases (``SC_APPEND_ONLY``):
    calls on 1 and 2 threads append and build nothing more; a call that must count and
    fill (its chunk regions too large) builds them then, and matches the single pass.
    The source shown and written out keeps every function."""
    monkeypatch.setenv("SPARSEC_CACHE_DIR", str(tmp_path))  # a kernel no other test built
    a, b = sparse_array((13, 9), rng, integer=True), sparse_array((9, 12), rng, integer=True)
    A, B = sparsec.Tensor.from_dense(a, "csr"), sparsec.Tensor.from_dense(b, "csr")
    k = sparsec.kernel("C(i,j) = A(i,k) * B(k,j)", {"A": "csr", "B": "csr", "C": "csr"})
    assert "int sparsec_kernel(" in k.source and "int sparsec_assemble(" in k.source
    loaded = k.executable("float64", "int32").loaded
    assert loaded.append is not None and not loaded.phases_built
    want = k(A=A, B=B, threads=1)
    assert_same_storage(k(A=A, B=B, threads=2), want)
    assert not loaded.phases_built
    monkeypatch.setattr(COSTS, "CHUNKED_ENTRIES", 0)
    assert_same_storage(k(A=A, B=B, threads=2).validate("out"), want)
    assert loaded.phases_built and loaded.fn is not None and loaded.assemble is not None
    np.testing.assert_array_equal(np.asarray(want), a @ b)


def test_a_kernel_without_a_single_pass_builds_everything_at_once():
    """SDDMM (two phases only) and a dense output have nothing left to build later."""
    k = sparsec.kernel("A(i,j) = B(i,j) * C(i,k) * D(k,j)", {"A": "csr", "B": "csr"})
    loaded = k.executable("float64", "int32").loaded
    assert loaded.phases_built and loaded.append is None and loaded.assemble is not None
    spmv = sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": "csr"})
    assert spmv.executable("float64", "int32").loaded.phases_built


@pytest.mark.parametrize("threads", [2, 4])
def test_each_chunk_reserves_room_for_its_own_rows(threads, rng, monkeypatch):
    """A chunk's region holds the bound on its own rows' entries (plus slack), so the
    regions together reserve about one output, not one per thread as when each chunk had
    room for the whole output."""
    b, c = sparse_array((40, 30), rng, integer=True), sparse_array((30, 50), rng, integer=True)
    B, C = sparsec.Tensor.from_dense(b, "csr"), sparsec.Tensor.from_dense(c, "csr")
    k = sparsec.kernel("A(i,j) = B(i,k) * C(k,j)", CSR3)
    reserved = []
    real = SPARSE_OUT.allocate

    def spy(out, prepared, sizes, extra, poison):
        reserved.append(int(sizes[-1]))
        return real(out, prepared, sizes, extra, poison)

    monkeypatch.setattr(SPARSE_OUT, "allocate", spy)
    seen = _spy(monkeypatch)
    got = k(B=B, C=C, threads=threads).validate("out")
    assert seen == [threads]
    np.testing.assert_array_equal(np.asarray(got), b @ c)
    plan = k.generated().bound
    bound = SPARSE_OUT.entry_bound(plan, {"B": B, "C": C}, {"i": 40, "j": 50, "k": 30})
    slack = SPARSE_OUT.LAST_LEVEL_SLACK * 50
    assert bound <= reserved[0] <= bound + threads * (slack + 1)


def _kept(array: np.ndarray) -> int:
    """The bytes ``array`` keeps allocated: its own, or those of the array it views."""
    owner = array if array.base is None else array.base
    return int(np.asarray(owner).nbytes)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_a_result_keeps_at_most_twice_its_entries(threads, rng, monkeypatch):
    """The chunks' regions hold a bound on the entries, not their count. A result that
    fills at least half of them views them; a smaller one is copied out, so a loose bound
    does not stay allocated behind it. (Shrinking the arrays in place instead made the C
    allocator give their pages back at every call: a fresh capacity then faulted its pages
    in again, the larger part of a sparse add's time.)"""
    full = sparse_array((23, 40), rng, integer=True, density=0.5)
    half = np.where(np.arange(40) % 2 == 0, full, 0.0)  # every other column: a loose bound
    k = sparsec.kernel("A(i,j) = B(i,j) * C(i,j)", CSR3)
    seen = _spy(monkeypatch)
    for b, c in ((full, full), (full, half), (half, 1.0 - np.where(half, 1.0, 0.0))):
        B, C = sparsec.Tensor.from_dense(b, "csr"), sparsec.Tensor.from_dense(c, "csr")
        got = k(B=B, C=C, threads=threads).validate("out")
        np.testing.assert_array_equal(np.asarray(got), b * c)
        for array in (got.levels[1].crd, got.vals):
            assert _kept(array) <= 2 * array.nbytes
    assert seen == [threads] * 3


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_several_chunks_bound_only_their_own_rows(threads, rng, monkeypatch):
    """On one chunk the whole output is bounded once; on several, each chunk's rows are,
    and their bounds summed stand for the whole's (computing the whole's too cost SpGEMM
    as much again), including in the choice of the two phases for too large an output."""
    b, c = sparse_array((40, 30), rng, integer=True), sparse_array((30, 50), rng, integer=True)
    B, C = sparsec.Tensor.from_dense(b, "csr"), sparsec.Tensor.from_dense(c, "csr")
    k = sparsec.kernel("A(i,j) = B(i,k) * C(k,j)", CSR3)
    calls = []
    real = SPARSE_OUT.entry_bound

    def spy(*args):
        calls.append(args[4] if len(args) > 4 else None)
        return real(*args)

    monkeypatch.setattr(SPARSE_OUT, "entry_bound", spy)
    seen = _spy(monkeypatch)
    got = k(B=B, C=C, threads=threads).validate("out")
    np.testing.assert_array_equal(np.asarray(got), b @ c)
    assert seen == [threads]
    if threads == 1:
        assert calls == [None]
    else:
        assert len(calls) == threads and all(rows is not None for rows in calls)
        assert [rows[1:] for rows in calls] == sorted(rows[1:] for rows in calls)
    whole = real(k.generated().bound, {"B": B, "C": C}, {"i": 40, "j": 50, "k": 30})
    monkeypatch.setattr(COSTS, "SINGLE_PASS_ENTRIES", whole // 2)  # too large: two phases
    got = k(B=B, C=C, threads=threads).validate("out")
    np.testing.assert_array_equal(np.asarray(got), b @ c)
    assert seen == [threads]
