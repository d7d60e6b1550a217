"""Sparse outputs on the GPU (issue 22 item 2, rowwise layouts): each row counts its
entries (``sparsec_assemble``), a prefix sum makes the counts offsets, each row appends
from its offset (``sparsec_kernel``). Checked under the CPU emulation against dense torch
and against the C target's output array by array (canonical: sorted, unique), on inputs
with more rows than a block, empty rows and real zeros; both kernels compile with NVRTC
without spills."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import sparse_array
from test_cuda import needs_compiler

import sparsec
from sparsec import ScheduleError

R, C, K = 700, 37, 5

#: (expression, formats, torch reference, shapes)
CASES = [
    (
        "A(i,j) = B(i,j) + C(i,j)",
        {"B": "csr", "C": "csr", "A": "csr"},
        lambda t: t["B"] + t["C"],
        {"B": (R, C), "C": (R, C)},
    ),
    (
        "A(i,j) = B(i,j) * C(i,j)",
        {"B": "csr", "C": "csr", "A": "csr"},
        lambda t: t["B"] * t["C"],
        {"B": (R, C), "C": (R, C)},
    ),
    (
        "A(i,j) = B(i,j) - 2 * C(i,j)",
        {"B": "csr", "C": "dense", "A": "csr"},
        lambda t: t["B"] - 2 * t["C"],
        {"B": (R, C), "C": (R, C)},
    ),
    # SDDMM into CSR: B's pattern, a dense product's values
    (
        "A(i,j) = B(i,j) * C(i,k) * D(k,j)",
        {"B": "csr", "A": "csr"},
        lambda t: t["B"] * (t["C"] @ t["D"]),
        {"B": (R, C), "C": (R, K), "D": (K, C)},
    ),
    # SpGEMM: each thread's rows scattered into its slice of a dense workspace (Gustavson),
    # gathered in order; the count phase counts the bitmap's bits
    (
        "C(i,j) = A(i,k) * B(k,j)",
        {"A": "csr", "B": "csr", "C": "csr"},
        lambda t: t["A"] @ t["B"],
        {"A": (R, 24), "B": (24, C)},
    ),
    # columns across several summary words (4096 coordinates each)
    (
        "C(i,j) = A(i,k) * B(k,j)",
        {"A": "csr", "B": "csr", "C": "csr"},
        lambda t: t["A"] @ t["B"],
        {"A": (40, 6), "B": (6, 9000)},
    ),
    (
        "C(i,j) = A(i,k) * B(k,j) + D(i,j)",
        {"A": "csr", "B": "csr", "D": "csr", "C": "csr"},
        lambda t: t["A"] @ t["B"] + t["D"],
        {"A": (R, 24), "B": (24, C), "D": (R, C)},
    ),
    # found by the fuzzer: a reduction under a dense operand's rows (the default GPU
    # mapping put the columns of a row across threads, each appending at its own offset);
    # and the rows of a non-unique level merged with a dense vector (the window merge never
    # opened the row)
    (
        "O(i,j) = -(T0(i,j,k) + T1(i))",
        {"T0": "ddd", "O": "ds"},
        lambda t: -(t["T0"].sum(2) + t["T1"][:, None]),
        {"T0": (R, 6, 3), "T1": (R,)},
    ),
    (
        "O(i,j) = -(T0(i,j,k) + T1(i))",
        {"T0": "uqq", "O": "ds"},
        lambda t: -(t["T0"].sum(2) + t["T1"][:, None]),
        {"T0": (R, 6, 3), "T1": (R,)},
    ),
    # rows of a 3-tensor (two dense levels above the compressed one)
    (
        "A(i,j,k) = B(i,j,k) + C(i,j,k)",
        {"B": "dds", "C": "dds", "A": "dds"},
        lambda t: t["B"] + t["C"],
        {"B": (30, 11, 9), "C": (30, 11, 9)},
    ),
]


def _inputs(fmts, shapes, seed, dtype, index_dtype):
    rng = np.random.default_rng(seed)
    dense, given = {}, {}
    for name, shape in shapes.items():
        arr = sparse_array(shape, rng, 0.15, integer=True).astype(dtype)
        arr[: shape[0] // 3] *= rng.random(shape[1:]) < 0.5  # some rows emptier than others
        dense[name] = arr
        fmt = fmts.get(name, "dense")
        given[name] = (
            arr if fmt == "dense" else sparsec.Tensor.from_dense(arr, fmt, index_dtype=index_dtype)
        )
    return dense, given


@needs_compiler
@pytest.mark.parametrize(
    ("dtype", "index_dtype"), [("float64", "int32"), ("float32", "int64")], ids=["f64i32", "f32i64"]
)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]} {c[1]}")
def test_rowwise_sparse_outputs_on_the_gpu(case, dtype, index_dtype):
    expr, fmts, ref, shapes = case
    kw = {"dtype": dtype, "index_dtype": index_dtype}
    k = sparsec.kernel(expr, fmts, target="cuda-emulated", **kw)
    assert "sparsec_assemble(" in k.source and "GPUThread" in k.schedule
    assert ("sc_ws_seen" in k.source) == ("A(i,k) * B(k,j)" in expr)
    dense, given = _inputs(fmts, shapes, 5, dtype, index_dtype)
    got = k(**given)
    want = ref({n: torch.from_numpy(v) for n, v in dense.items()}).numpy()
    np.testing.assert_array_equal(got.to_dense(), want)
    # the same arrays as the C target's: canonical rows, the same explicit entries
    cpu = sparsec.kernel(expr, fmts, target="c", **kw)(**given)
    last = len(cpu.levels) - 1
    np.testing.assert_array_equal(got.levels[last].pos, cpu.levels[last].pos)
    np.testing.assert_array_equal(got.levels[last].crd, cpu.levels[last].crd)
    np.testing.assert_array_equal(got.vals, cpu.vals)
    assert got.levels[last].crd.dtype == np.dtype(index_dtype)
    if dtype == "float64":
        for r in k.verify():
            assert r.spills == 0, str(r)


@needs_compiler
def test_all_rows_empty_and_one_row():
    k = sparsec.kernel(
        "A(i,j) = B(i,j) + C(i,j)", {"B": "csr", "C": "csr", "A": "csr"}, target="cuda-emulated"
    )
    for shape in ((300, 4), (1, 9)):
        zero = sparsec.Tensor.from_dense(np.zeros(shape), "csr")
        got = k(B=zero, C=zero)
        assert got.nnz == 0 and list(got.levels[1].pos) == [0] * (shape[0] + 1)
        b = np.arange(np.prod(shape), dtype=float).reshape(shape) % 3
        got = k(B=sparsec.Tensor.from_dense(b, "csr"), C=zero)
        np.testing.assert_array_equal(got.to_dense(), b)


@needs_compiler
@pytest.mark.parametrize(
    ("expr", "fmts"),
    [
        ("A(i,j) = B(i,j) + C(i,j)", {"B": "dcsr", "C": "dcsr", "A": "dcsr"}),
        ("y(i) = A(i,j) * x(j)", {"A": "csr", "y": "s"}),
    ],
)
def test_other_sparse_outputs_map_through_a_compaction(expr, fmts):
    """Outputs appended in one sequence (dcsr, a sparse vector) were refused; they now run
    as rows and are compacted (tests/test_cuda_compaction.py runs the whole suite)."""
    k = sparsec.kernel(expr, fmts, target="cuda-emulated")
    assert "then compacted" in k.schedule and "sparsec_assemble(" in k.source
    shapes = {"B": (R, C), "C": (R, C)} if "B" in fmts else {"A": (R, C), "x": (C,)}
    dense, given = _inputs(fmts, shapes, 3, "float64", "int32")
    got = k(**given)
    want = sparsec.kernel(expr, fmts, target="c")(**given)
    for x, y in zip(got.levels, want.levels, strict=True):
        for u, v in ((x.pos, y.pos), (x.crd, y.crd)):
            assert (u is None) == (v is None)
            if u is not None:
                np.testing.assert_array_equal(u, v)
    np.testing.assert_array_equal(got.vals, want.vals)


def test_gpu_loops_inside_a_sparse_output_row_are_refused():
    """A row appends from its own offset, so one thread fills it: a GPU loop over its
    columns (or a reduction inside it) is a clear ScheduleError, not threads that each
    append from the row's start."""
    sched = ["split(i,ib,it,32)", "parallelize(ib,GPUBlock,NoRaces)"]

    def make(extra: str) -> sparsec.Kernel:
        k = sparsec.kernel(
            "A(i,j) = B(i,j) * C(i,k) * D(k,j)",
            {"B": "csr", "A": "csr"},
            target="cuda-emulated",
            schedule=[*sched, extra],
        )
        k.generated()
        return k

    assert "sparsec_assemble(" in make("parallelize(it,GPUThread,NoRaces)").source
    for loop in ("j", "k"):
        with pytest.raises(ScheduleError, match="filled a whole row per GPU thread"):
            make(f"parallelize({loop},GPUThread,Atomics)")


def test_a_coo_row_level_driving_a_sparse_output_says_how_to_store_it():
    """COO's rows are not unique positions: a thread per position would append one row
    from several threads. The GPU default has no mapping then, and says which formats
    have one (found on the first H200 lent); a DCSR operand maps, by its positions."""
    expr = "C(i,j) = A(i,k) * B(k,j)"
    with pytest.raises(ScheduleError, match=r"A's positions over i are not one per row.*dcsr"):
        sparsec.kernel(expr, {"A": "coo", "B": "csr", "C": "csr"}, target="cuda-emulated")
    k = sparsec.kernel(expr, {"A": "dcsr", "B": "csr", "C": "csr"}, target="cuda-emulated")
    assert "pos(i," in k.schedule


@needs_compiler
def test_a_workspace_larger_than_the_budget_shrinks_the_launch(monkeypatch):
    """The workspace's slices (one per thread) must fit the budget: fewer blocks, then
    fewer threads per block (the loops are strided, so the result is the same)."""
    from sparsec.runtime import device

    k = sparsec.kernel(
        "C(i,j) = A(i,k) * B(k,j)", {"A": "csr", "B": "csr", "C": "csr"}, target="cuda-emulated"
    )
    dense, given = _inputs(
        {"A": "csr", "B": "csr"}, {"A": (600, 7), "B": (7, 500)}, 2, "float64", "int32"
    )
    launches = []
    real = device._workspace

    def spy(*args):
        launches.append(real(*args))
        return launches[-1]

    monkeypatch.setattr(device, "_workspace", spy)
    # a thread's slices: 500 values, a list of 504 and 24 bitmap words, 8 bytes each; the
    # emulation takes a 16th of the budget. Dense rows forced (by the size rule this
    # budget takes hash tables: `test_hash_tables_when_dense_rows_would_shrink_the_launch`)
    monkeypatch.setattr(device, "WORKSPACE_BYTES", 16 * 40 * (500 + 504 + 24) * 8)
    monkeypatch.setattr(device, "HASH_WORKSPACE", False)
    got = k(**given)
    np.testing.assert_array_equal(got.to_dense(), dense["A"] @ dense["B"])
    assert launches and all(grid * block <= 40 for grid, block in launches), launches
    assert any(block < 256 for _, block in launches), launches


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]} {c[1]}")
def test_rowwise_sparse_outputs_on_the_device(case):
    """The same kernels on a GPU (the prefix sum by cupy.cumsum), array by array equal to
    the C target's output."""
    from test_cuda import _device_or_skip

    _device_or_skip()
    expr, fmts, ref, shapes = case
    dense, given = _inputs(fmts, shapes, 6, "float64", "int32")
    got = sparsec.kernel(expr, fmts, target="cuda")(**given)
    cpu = sparsec.kernel(expr, fmts, target="c")(**given)
    last = len(cpu.levels) - 1
    np.testing.assert_array_equal(got.levels[last].pos, cpu.levels[last].pos)
    np.testing.assert_array_equal(got.levels[last].crd, cpu.levels[last].crd)
    np.testing.assert_array_equal(got.vals, cpu.vals)


@needs_compiler
def test_hash_tables_when_dense_rows_would_shrink_the_launch(monkeypatch):
    """The size rule: where a dense row per thread of the whole launch would not fit the
    budget, each row takes a hash table sized from its count (a tally of its scatters for
    the count phase, its exact count for the fill): the launch keeps its size, and the
    rows come out sorted, equal to the C target's."""
    from sparsec.runtime import device

    fmts = {"A": "csr", "B": "csr", "C": "csr"}
    k = sparsec.kernel("C(i,j) = A(i,k) * B(k,j)", fmts, target="cuda-emulated")
    dense, given = _inputs(
        {"A": "csr", "B": "csr"}, {"A": (600, 7), "B": (7, 500)}, 2, "float64", "int32"
    )
    modes, launches = [], []
    real_phase, real_ws = device.run_phase, device._workspace

    def phase(kernel, generated, slots, values, dims, outputs, emulated):
        modes.append(int(outputs[("ws_mode", -1)][0]))
        return real_phase(kernel, generated, slots, values, dims, outputs, emulated)

    def workspace(*args):
        launches.append(real_ws(*args))
        return launches[-1]

    monkeypatch.setattr(device, "run_phase", phase)
    monkeypatch.setattr(device, "_workspace", workspace)
    # dense rows for the launch's 768 threads: 6.3 MB; the tables (rows of ~75 columns
    # reached, 256 slots each): 1.2 MB of keys to count, at most 2.5 MB to fill
    monkeypatch.setattr(device, "WORKSPACE_BYTES", 16 * 3_000_000)
    got = k(**given)
    assert modes == [2, 1, 1], modes  # the tally, the counted tables, the filled tables
    assert all(block == 256 for _, block in launches), launches
    want = sparsec.kernel("C(i,j) = A(i,k) * B(k,j)", fmts, target="c")(**given)
    np.testing.assert_array_equal(got.levels[1].pos, want.levels[1].pos)
    np.testing.assert_array_equal(got.levels[1].crd, want.levels[1].crd)
    np.testing.assert_array_equal(got.vals, want.vals)
    np.testing.assert_array_equal(got.to_dense(), dense["A"] @ dense["B"])
    # tables too large for the budget: that phase runs on dense rows (the launch shrunk)
    modes.clear()
    monkeypatch.setattr(device, "WORKSPACE_BYTES", 16 * 8 * 64)
    got = k(**given)
    assert modes[0] == 2 and modes[1:] == [0, 0], modes
    np.testing.assert_array_equal(got.vals, want.vals)


@needs_compiler
@pytest.mark.parametrize(
    ("dtype", "index_dtype"), [("float64", "int32"), ("float32", "int64")], ids=["f64i32", "f32i64"]
)
@pytest.mark.parametrize(
    "case",
    [c for c in CASES if "sc_ws" in sparsec.kernel(c[0], c[1], target="cuda-emulated").source],
    ids=lambda c: f"{c[0]} {c[1]}",
)
def test_hash_tables_give_the_dense_rows_output(case, dtype, index_dtype, monkeypatch):
    """Every workspace case with hash tables forced: the same arrays as the C target."""
    from sparsec.runtime import device

    monkeypatch.setattr(device, "HASH_WORKSPACE", True)
    expr, fmts, _, shapes = case
    kw = {"dtype": dtype, "index_dtype": index_dtype}
    dense, given = _inputs(fmts, shapes, 8, dtype, index_dtype)
    got = sparsec.kernel(expr, fmts, target="cuda-emulated", **kw)(**given)
    cpu = sparsec.kernel(expr, fmts, target="c", **kw)(**given)
    np.testing.assert_array_equal(got.levels[1].pos, cpu.levels[1].pos)
    np.testing.assert_array_equal(got.levels[1].crd, cpu.levels[1].crd)
    np.testing.assert_array_equal(got.vals, cpu.vals)


@needs_compiler
@pytest.mark.parametrize("ring", ["min_plus", "max_times", "or_and"])
@pytest.mark.parametrize("hashed", [False, True], ids=["dense", "hash"])
def test_semiring_spgemm_through_either_workspace(ring, hashed, monkeypatch):
    """Under a semiring the tables' values start at its add's identity, as the dense
    rows do: both give the C target's arrays."""
    from sparsec.runtime import device

    monkeypatch.setattr(device, "HASH_WORKSPACE", hashed)
    fmts = {"A": "csr", "B": "csr", "C": "csr"}
    rng = np.random.default_rng(4)
    a = (rng.random((300, 40)) < 0.1) * rng.integers(1, 5, (300, 40)).astype(float)
    b = (rng.random((40, 60)) < 0.2) * rng.integers(1, 5, (40, 60)).astype(float)
    given = {"A": sparsec.Tensor.from_dense(a, "csr"), "B": sparsec.Tensor.from_dense(b, "csr")}
    expr = "C(i,j) = A(i,k) * B(k,j)"
    got = sparsec.kernel(expr, fmts, semiring=ring, target="cuda-emulated")(**given)
    want = sparsec.kernel(expr, fmts, semiring=ring, target="c")(**given)
    np.testing.assert_array_equal(got.levels[1].pos, want.levels[1].pos)
    np.testing.assert_array_equal(got.levels[1].crd, want.levels[1].crd)
    np.testing.assert_array_equal(got.vals, want.vals)


@pytest.mark.gpu
@pytest.mark.parametrize("hashed", [False, True], ids=["dense", "hash"])
def test_spgemm_workspaces_on_the_device(hashed, monkeypatch):
    """Both workspace forms on a GPU (the tables' probing and heapsort in CUDA), wide
    enough for several summary words, equal to the C target's arrays."""
    from test_cuda import _device_or_skip

    from sparsec.runtime import device

    _device_or_skip()
    monkeypatch.setattr(device, "HASH_WORKSPACE", hashed)
    fmts = {"A": "csr", "B": "csr", "C": "csr"}
    dense, given = _inputs(
        {"A": "csr", "B": "csr"}, {"A": (2000, 30), "B": (30, 20000)}, 9, "float64", "int32"
    )
    got = sparsec.kernel("C(i,j) = A(i,k) * B(k,j)", fmts, target="cuda")(**given)
    want = sparsec.kernel("C(i,j) = A(i,k) * B(k,j)", fmts, target="c")(**given)
    np.testing.assert_array_equal(got.levels[1].pos, want.levels[1].pos)
    np.testing.assert_array_equal(got.levels[1].crd, want.levels[1].crd)
    np.testing.assert_array_equal(got.vals, want.vals)
