"""Rows shared by a warp's lanes (CSR-vector) on the CUDA target, without a GPU: a row per
group of 2-32 lanes, each lane striding over the row's nonzeros, the group's sum made by
shuffles within the group and stored by its first lane. Checked through the CPU emulation
(whose shuffles meet only the lanes a mask names, within segments of a width) against
numpy with integer values, on rows that are empty, of length 1 and longer than a warp, and
compiled with NVRTC for sm_80 and sm_90 without spills."""

from __future__ import annotations

import numpy as np
import pytest
from test_cuda import _no_spills, needs_compiler

import sparsec
from sparsec import ScheduleError
from sparsec.policy.schedules import vector_schedule

SPMV = "y(i) = A(i,j) * x(j)"
#: row lengths, cycled: empty rows, single nonzeros, and rows around and past a group,
#: a warp and two warps
LENGTHS = (0, 1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 64, 65, 100, 0, 1)


def _matrix(rows: int, cols: int, seed: int, lengths=LENGTHS) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a = np.zeros((rows, cols))
    for i in range(rows):
        n = min(cols, lengths[i % len(lengths)])
        a[i, rng.choice(cols, n, replace=False)] = rng.integers(-5, 6, n)
    return a


def _spmv(k: sparsec.Kernel, rows: int = 203, cols: int = 150, seed: int = 1) -> None:
    a = _matrix(rows, cols, seed)
    x = np.random.default_rng(seed + 1).integers(-4, 5, cols).astype(np.float64)
    got = k(A=sparsec.Tensor.from_dense(a, "csr"), x=x)
    np.testing.assert_array_equal(got, a @ x)


def _groups(lanes: int) -> str:
    return ", ".join(str(c) for c in vector_schedule("i", "j", "A", lanes))


@needs_compiler
@pytest.mark.parametrize("lanes", [2, 4, 8, 16, 32])
def test_spmv_rows_per_lane_group(lanes):
    k = sparsec.kernel(SPMV, {"A": "csr"}, target="cuda-emulated", schedule=_groups(lanes))
    _spmv(k)
    _no_spills(k)
    if lanes < 32:
        assert f"sc_group_sum(acc, {lanes})" in k.source
        assert f"if (sc_group_lane({lanes}) == 0)" in k.source
        assert f"j_pos += {lanes})" in k.source
    else:
        assert "sc_warp_sum(acc)" in k.source and "sc_group_sum" not in k.source


@needs_compiler
@pytest.mark.parametrize("rows", [1, 5, 33, 257])
def test_groups_past_the_last_row_skip_their_shuffles(rows):
    """Rows that end inside a warp: the groups past them skip their loop body (shuffles
    included); the others' shuffles name their own group's lanes only, so they complete."""
    k = sparsec.kernel(SPMV, {"A": "csr"}, target="cuda-emulated", schedule=_groups(4))
    _spmv(k, rows=rows, cols=70, seed=rows)


@needs_compiler
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("index_dtype", ["int32", "int64"])
def test_group_sums_in_each_value_and_index_type(dtype, index_dtype):
    k = sparsec.kernel(SPMV, {"A": "csr"}, target="cuda-emulated", schedule=_groups(8), dtype=dtype)
    a = _matrix(100, 90, 5)
    x = np.arange(90, dtype=dtype) % 7 - 3
    t = sparsec.Tensor.from_dense(a.astype(dtype), "csr", index_dtype=index_dtype)
    np.testing.assert_array_equal(k(A=t, x=x), (a @ x).astype(dtype))


@needs_compiler
@pytest.mark.parametrize("semiring", ["min_plus", "max_times"])
def test_group_reductions_under_a_semiring(semiring):
    """A semiring's add combines a group's lanes (sc_group_min / sc_group_max)."""
    k = sparsec.kernel(
        SPMV, {"A": "csr"}, target="cuda-emulated", schedule=_groups(4), semiring=semiring
    )
    c = sparsec.kernel(SPMV, {"A": "csr"}, semiring=semiring)
    a = _matrix(90, 80, 7)
    x = np.random.default_rng(3).integers(1, 9, 80).astype(np.float64)
    t = sparsec.Tensor.from_dense(a, "csr")
    np.testing.assert_array_equal(k(A=t, x=x), c(A=t, x=x))
    assert f"sc_group_{semiring.split('_')[0]}(acc, 4)" in k.source
    _no_spills(k)


@needs_compiler
def test_rowsum_and_sum_of_products_by_groups():
    """Any row reduced into a dense element maps: a row sum, and two dense factors."""
    rowsum = "y(i) = A(i,j)"
    k = sparsec.kernel(rowsum, {"A": "csr"}, target="cuda-emulated", schedule=_groups(16))
    a = _matrix(120, 60, 9)
    np.testing.assert_array_equal(k(A=sparsec.Tensor.from_dense(a, "csr")), a.sum(axis=1))
    three = "y(i) = A(i,j) * x(j) * z(j)"
    k = sparsec.kernel(three, {"A": "csr"}, target="cuda-emulated", schedule=_groups(2))
    x, z = np.arange(60.0) % 5 - 2, np.arange(60.0) % 3
    np.testing.assert_array_equal(k(A=sparsec.Tensor.from_dense(a, "csr"), x=x, z=z), a @ (x * z))


BAD_GROUPS = [
    # the loop over groups must be a split piece by 2, 4, 8 or 16
    (
        "split(i,i0,i1,64), split(i1,iw,ig,3), pos(j,jp,A), parallelize(i0,GPUBlock,NoRaces), "
        "parallelize(iw,GPUWarp,NoRaces), parallelize(ig,GPUThread,NoRaces), "
        "parallelize(jp,GPUThread,ParallelReduction)",
        "split by 2, 4, 8 or 16",
    ),
    (
        "split(i,i0,i1,64), split(i1,iw,ig,32), pos(j,jp,A), parallelize(i0,GPUBlock,NoRaces), "
        "parallelize(iw,GPUWarp,NoRaces), parallelize(ig,GPUThread,NoRaces), "
        "parallelize(jp,GPUThread,ParallelReduction)",
        "split by 2, 4, 8 or 16",
    ),
    # the lanes of a group reduce into the row's element: NoRaces is a wrong sum
    (
        "split(i,i0,i1,64), split(i1,iw,ig,4), pos(j,jp,A), parallelize(i0,GPUBlock,NoRaces), "
        "parallelize(iw,GPUWarp,NoRaces), parallelize(ig,GPUThread,NoRaces), "
        "parallelize(jp,GPUThread,NoRaces)",
        "wrong sum",
    ),
]


@pytest.mark.parametrize(("schedule", "why"), BAD_GROUPS, ids=range(len(BAD_GROUPS)))
def test_bad_lane_groups_are_schedule_errors(schedule, why):
    with pytest.raises(ScheduleError, match=why):
        sparsec.kernel(SPMV, {"A": "csr"}, target="cuda", schedule=schedule)
