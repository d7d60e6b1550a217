"""Sparse outputs the GPU cannot fill row by row (DCSR, DCSC, COO, CSF, 'ssd', sparse
vectors; issue 22 item 2): computed into a rowwise staging output (``d...ds``, the same
count / prefix-sum / fill launches as CSR), then compacted into the asked-for levels
(`sparsec.runtime.compaction`). Every case of the sparse-output suite
(tests/test_sparse_outputs.py) runs on ``cuda-emulated`` with no schedule and matches the C
target's output array by array (canonical: sorted, unique); the kernels compile with NVRTC
for sm_80 and sm_90 without spills."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import assert_same_storage, case_id, formatted_inputs, sparse_array
from test_cuda import needs_compiler
from test_sparse_outputs import CASES

import sparsec
from sparsec.middle.staging import needs_staging, staging_format
from sparsec.runtime import compaction
from sparsec.tensors.formats import parse_format

#: the suite's cases whose output is not rowwise: each goes through the compaction
STAGED = [c for c in CASES if needs_staging(sparsec.kernel(c[0], c[1]).spec)]


def _given(case, rng, dtype, index_dtype):
    _, fmts, _, shapes = case
    return formatted_inputs(fmts, shapes, rng, dtype, index_dtype, integer=True)


@pytest.mark.parametrize(
    ("dtype", "index_dtype"), [("float64", "int32"), ("float32", "int64")], ids=["f64i32", "f32i64"]
)
@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_the_sparse_output_suite_on_the_gpu(case, dtype, index_dtype, rng):
    expr, fmts = case[0], case[1]
    kw = {"dtype": dtype, "index_dtype": index_dtype}
    k = sparsec.kernel(expr, fmts, target="cuda-emulated", **kw)
    assert "sparsec_assemble(" in k.source and "GPU" in k.schedule
    name = k.spec.output.name
    assert ("then compacted" in k.schedule) == (case in STAGED), k.schedule
    assert len(STAGED) >= 20
    _, given = _given(case, rng, dtype, index_dtype)
    got = k(**given)
    got.validate("out")
    assert_same_storage(got, sparsec.kernel(expr, fmts, target="c", **kw)(**given))
    assert got.format == k.formats[name]
    k.check(**given)  # against dense torch


@needs_compiler
@pytest.mark.parametrize("case", STAGED, ids=[case_id(c) for c in STAGED])
def test_staged_kernels_compile_without_spills(case):
    k = sparsec.kernel(case[0], case[1], target="cuda-emulated")
    reports = k.verify()
    assert {r.arch for r in reports} >= {"sm_80", "sm_90"}, reports
    for r in reports:
        assert r.spills == 0, str(r)


@pytest.mark.parametrize("fmt", ["dcsr", "dcsc", "coo", "sd"])
def test_many_rows_empty_rows_and_all_empty(fmt, rng):
    """More rows than a block and a grid's chunk (several threads and blocks count rows),
    long runs of empty rows, an all-zero result and a single row."""
    expr = "A(i,j) = B(i,j) + C(i,j)"
    fmts = {"A": fmt, "B": "dcsr", "C": "csr"}
    k = sparsec.kernel(expr, fmts, target="cuda-emulated")
    c_target = sparsec.kernel(expr, fmts, target="c")
    b = sparse_array((5000, 13), rng, 0.05, integer=True)
    b[1000:4000] = 0
    c = sparse_array((5000, 13), rng, 0.02, integer=True)
    c[:2500] = 0
    for bb, cc in ((b, c), (np.zeros_like(b), np.zeros_like(c)), (b[:1], c[:1])):
        given = {
            "B": sparsec.Tensor.from_dense(bb, "dcsr"),
            "C": sparsec.Tensor.from_dense(cc, "csr"),
        }
        got = k(**given)
        assert_same_storage(got, c_target(**given))
        np.testing.assert_array_equal(got.to_dense(), bb + cc)


def test_a_sparse_vector_from_a_reduction_keeps_cancellations(rng):
    """y = A x into a sparse vector: rows reached are entries even where the sum cancels
    to zero (an explicit zero), as on the C target."""
    a = np.array([[1.0, -1.0, 0.0], [0.0, 0.0, 0.0], [2.0, 0.0, 3.0]])
    k = sparsec.kernel("y(i) = A(i,j) * x(j)", {"y": "s", "A": "csr"}, target="cuda-emulated")
    got = k(A=sparsec.Tensor.from_dense(a, "csr"), x=np.ones(3))
    assert list(got.levels[0].crd) == [0, 2] and list(got.vals) == [0.0, 5.0]


@pytest.mark.parametrize(
    ("spelling", "shape"),
    [("ss", (6, 5)), ("ss:1,0", (6, 5)), ("uq", (6, 5)), ("sss", (4, 3, 5)), ("dss", (4, 3, 5))]
    + [("ssd", (4, 3, 5)), ("sd", (6, 5)), ("uqq", (4, 3, 5)), ("s", (9,))]
    # extents of zero (found by the fuzzer: a COO output of 0 x 0)
    + [("uq", (0, 0)), ("ss", (0, 5)), ("uq", (4, 0)), ("sss", (2, 0, 3)), ("s", (0,))],
)
def test_compact_builds_what_packing_builds(spelling, shape, rng):
    """The compaction on its own: from a tensor's rows (its ``d...ds`` storage) to the
    levels `Tensor.from_dense` packs, for every appended layout."""
    dense = sparse_array(shape, rng, integer=True)
    fmt = parse_format(spelling, len(shape))
    want = sparsec.Tensor.from_dense(dense, fmt)
    lead = 1 if len(shape) == 1 else 0
    rows_fmt = staging_format(fmt)
    staged = sparsec.Tensor.from_dense(dense.reshape((1,) * lead + shape), rows_fmt)
    last = staged.levels[-1]
    extents = tuple(staged.shape[m] for m in staged.format.ordering)
    levels, vals = compaction.compact((last.pos, last.crd, staged.vals), extents, lead, fmt, np)
    for k, ((pos, crd), st) in enumerate(zip(levels, want.levels, strict=True)):
        for u, v in ((pos, st.pos), (crd, st.crd)):
            assert (u is None) == (v is None), k
            if u is not None:
                np.testing.assert_array_equal(u, v)
    np.testing.assert_array_equal(vals, want.vals)


@pytest.mark.gpu
@pytest.mark.parametrize("case", STAGED, ids=[case_id(c) for c in STAGED])
def test_staged_outputs_on_the_device(case, rng):
    """The same kernels and compaction (cupy.searchsorted, cumsum, bincount) on a GPU,
    array by array equal to the C target's output."""
    from test_cuda import _device_or_skip

    _device_or_skip()
    expr, fmts = case[0], case[1]
    dense, given = _given(case, rng, "float64", "int32")
    got = sparsec.kernel(expr, fmts, target="cuda")(**given)
    assert_same_storage(got, sparsec.kernel(expr, fmts, target="c")(**given))
    ref = {n: torch.from_numpy(v) for n, v in dense.items()}
    assert got.nnz >= 0 and ref is not None


def test_kept_device_arrays_are_not_uploaded_again():
    """A sparse output computed on a device keeps the arrays the launches wrote as its
    device copies (`Tensor.keep_device_arrays`): a next call reads them, no upload."""
    t = sparsec.Tensor.from_dense(np.eye(3), "csr")
    marker = object()
    t.keep_device_arrays({("crd", 1): marker})

    def upload(host):
        raise AssertionError("uploaded a kept array")

    assert t.device_array("crd", 1, upload) is marker
    assert t.device_array("pos", 1, lambda h: "copied") == "copied"


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["csr", "dcsr", "coo"])
def test_a_sparse_output_stays_on_the_device(fmt, rng):
    """SpGEMM on a GPU: the result's arrays stay on the device as its device copies, and
    a chained product reads them there; both equal the C target's."""
    from test_cuda import _device_or_skip

    _device_or_skip()
    import cupy

    fmts = {"A": "csr", "B": "csr", "C": fmt}
    expr = "C(i,j) = A(i,k) * B(k,j)"
    a = sparsec.Tensor.from_dense(sparse_array((300, 40), rng, integer=True), "csr")
    b = sparsec.Tensor.from_dense(sparse_array((40, 40), rng, integer=True), "csr")
    got = sparsec.kernel(expr, fmts, target="cuda")(A=a, B=b)
    want = sparsec.kernel(expr, fmts, target="c")(A=a, B=b)
    assert_same_storage(got, want)
    kept = got.device_array("vals", -1, lambda h: None)
    assert isinstance(kept, cupy.ndarray)
    np.testing.assert_array_equal(kept.get(), want.vals)
    if fmt == "coo":  # a COO row level has no thread-per-row mapping for a CSR output
        with pytest.raises(sparsec.ScheduleError, match="not one per row"):
            sparsec.kernel(expr, {"A": fmt, "B": "csr", "C": "csr"}, target="cuda")
        fmt, got, want = "dcsr", got.to_format("dcsr"), want.to_format("dcsr")
    chained = {"A": fmt, "B": "csr", "C": "csr"}
    again = sparsec.kernel(expr, chained, target="cuda")(A=got, B=b)
    assert_same_storage(again, sparsec.kernel(expr, chained, target="c")(A=want, B=b))


#: the suite's cases whose GPU kernels scatter into a workspace (SpGEMM, y = Aᵀx)
SCATTERED = [c for c in CASES if "sc_ws_" in sparsec.kernel(c[0], c[1], target="cuda").source]


@pytest.mark.parametrize("case", SCATTERED, ids=[case_id(c) for c in SCATTERED])
def test_the_workspace_cases_through_hash_tables(case, rng, monkeypatch):
    """The same cases with each row's hash table forced (`device.HASH_WORKSPACE`): the
    arrays of the C target, staged or not."""
    from sparsec.runtime import device

    monkeypatch.setattr(device, "HASH_WORKSPACE", True)
    assert len(SCATTERED) >= 4
    expr, fmts = case[0], case[1]
    _, given = _given(case, rng, "float64", "int64")
    kw = {"index_dtype": "int64"}
    got = sparsec.kernel(expr, fmts, target="cuda-emulated", **kw)(**given)
    assert_same_storage(got, sparsec.kernel(expr, fmts, target="c", **kw)(**given))


def test_user_schedules_on_staged_outputs():
    """A user's GPU mapping applies to the staging output's rows: a split of DCSR's row
    loop runs (equal to the C target); a GPU loop over a sparse vector's coordinates,
    which its single row appends in order, is refused, never wrong."""
    expr, fmts = "A(i,j) = B(i,j) * C(i,j)", {"A": "dcsr", "B": "csr", "C": "csr"}
    schedule = (
        "split(i,i0,i1,32), parallelize(i0,GPUBlock,NoRaces), parallelize(i1,GPUThread,NoRaces)"
    )
    k = sparsec.kernel(expr, fmts, target="cuda-emulated", schedule=schedule)
    assert "then compacted" in k.schedule
    rng = np.random.default_rng(3)
    given = {
        n: sparsec.Tensor.from_dense(sparse_array((100, 9), rng, integer=True), "csr") for n in "BC"
    }
    assert_same_storage(k(**given), sparsec.kernel(expr, fmts, target="c")(**given))
    with pytest.raises(sparsec.ScheduleError, match="filled a whole row per GPU thread"):
        sparsec.kernel(
            "a(i) = b(i)",
            {"a": "s", "b": "dense"},
            target="cuda-emulated",
            schedule="parallelize(i,GPUBlock,NoRaces)",
        ).generated()
