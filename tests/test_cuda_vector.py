"""Rows shared by a warp's lanes (CSR-vector) on the CUDA target, without a GPU: a row per
group of 2-32 lanes, each lane striding over the row's nonzeros, the group's sum made by
shuffles within the group and stored by its first lane. Checked through the CPU emulation
(whose shuffles meet only the lanes a mask names, within segments of a width) against
numpy with integer values, on rows that are empty, of length 1 and longer than a warp, and
compiled with NVRTC for sm_80 and sm_90 without spills."""

from __future__ import annotations

import numpy as np
import pytest
from test_cuda import _device_or_skip, _no_spills, needs_compiler

import sparsec
from sparsec import ScheduleError
from sparsec.policy.schedules import vector_lanes, vector_schedule

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


# ------------------------------------------------ the default: lanes chosen per call
def test_lanes_per_row_from_the_average_row_length():
    # the largest power of two at most half the average (bench gpu_lanes, on an H200)
    assert [vector_lanes(a) for a in (0, 1, 3.99, 4, 7.9, 8, 10, 16, 31, 32, 33, 64, 1e6)] == [
        0,
        0,
        0,
        2,
        2,
        4,
        4,
        8,
        8,
        16,
        16,
        32,
        32,
    ]
    assert vector_lanes(float("nan")) == 0


VECTOR_ELIGIBLE = [
    (SPMV, {"A": "csr"}, ("i", "j", "A")),
    ("y(i) = A(i,j)", {"A": "csr"}, ("i", "j", "A")),
    ("y(i) = A(i,j) * x(j) * z(j)", {"A": "csr"}, ("i", "j", "A")),
    (SPMV, {"A": "coo"}, None),  # non-unique rows: nonzero-parallel stays
    (SPMV, {"A": "dcsr"}, None),  # compressed rows
    (SPMV, {"A": "dense"}, None),
    ("y(i) = A(i,j) * x(j) + b(i)", {"A": "csr"}, None),  # a sum: lanes would add b(i) each
    ("y(i) = A(i,j) * B(i,j)", {"A": "csr", "B": "csr"}, None),  # a merge of two rows
    ("C(i,k) = A(i,j) * X(j,k)", {"A": "csr"}, None),  # SpMM: row per block
    ("y(j) = A(i,j) * x(i)", {"A": "csr"}, None),  # rows scattered into the output
]


@pytest.mark.parametrize(("expr", "fmts", "want"), VECTOR_ELIGIBLE, ids=range(len(VECTOR_ELIGIBLE)))
def test_which_defaults_may_take_rows_by_lane_groups(expr, fmts, want):
    k = sparsec.kernel(expr, fmts, target="cuda")
    assert k._vector == want
    assert ("group of lanes" in k.schedule) == (want is not None)


def _rows_of(average: int, rows: int, cols: int, seed: int) -> np.ndarray:
    """Rows around ``average`` nonzeros: empty ones, single ones and some past a warp."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 2 * average + 1, rows)
    lengths[::7], lengths[1::11], lengths[2::29] = 0, 1, min(cols, average + 33)
    a = np.zeros((rows, cols))
    for i, n in enumerate(lengths):
        a[i, rng.choice(cols, n, replace=False)] = rng.integers(-5, 6, n)
    return a


@needs_compiler
@pytest.mark.parametrize(
    ("average", "lanes"), [(2, 0), (5, 2), (10, 4), (24, 8), (45, 16), (110, 32)]
)
def test_default_spmv_gives_long_rows_to_lane_groups(average, lanes):
    k = sparsec.Kernel(SPMV, {"A": "csr"}, target="cuda-emulated")  # not memoized: fresh
    cols = max(120, 3 * average)
    a = _rows_of(average, 150, cols, average)
    t = sparsec.Tensor.from_dense(a, "csr")
    assert vector_lanes(t.nnz / 150) == lanes
    x = np.random.default_rng(0).integers(-4, 5, cols).astype(np.float64)
    np.testing.assert_array_equal(k(A=t, x=x), a @ x)
    assert k.check(A=t, x=x).max_abs_error == 0
    ran = [d.label for d, _, _ in k._candidates]  # each kept decision, by its commands
    if lanes in (0,):
        assert ran == []  # thread-per-row: the kernel of k.source
    elif lanes == 32:
        assert len(ran) == 1 and "GPUWarp" in ran[0] and "i_group" not in ran[0]
    else:
        assert len(ran) == 1 and f"split(i_rows,i_warp,i_group,{32 // lanes})" in ran[0]
    # the same group size again: the kept kernel
    np.testing.assert_array_equal(k(A=t, x=2 * x), 2 * (a @ x))
    assert len(k._candidates) == len(ran)


@needs_compiler
def test_one_kernel_several_row_lengths():
    """Calls with short and long rows each run their own kernel, all matching numpy."""
    k = sparsec.Kernel("y(i) = A(i,j)", {"A": "csr"}, target="cuda-emulated", dtype="float32")
    for average in (1, 6, 12, 3, 40, 6):
        a = _rows_of(average, 90, 100, average).astype(np.float32)
        np.testing.assert_array_equal(k(A=sparsec.Tensor.from_dense(a, "csr")), a.sum(axis=1))
    assert len(k._candidates) == 3  # groups of 4, 8 and 16 lanes


@needs_compiler
@pytest.mark.parametrize("lanes", [4, 8, 16])
def test_default_vector_kernels_compile_without_spills(lanes):
    for dtype in ("float32", "float64"):
        k = sparsec.kernel(SPMV, {"A": "csr"}, target="cuda", schedule=_groups(lanes), dtype=dtype)
        _no_spills(k)


# ------------------------------------------------------------------- device
@pytest.mark.gpu
@pytest.mark.parametrize("lanes", [2, 4, 8, 16, 32])
def test_lane_groups_on_the_device(lanes):
    _device_or_skip()
    k = sparsec.kernel(SPMV, {"A": "csr"}, target="cuda", schedule=_groups(lanes))
    _spmv(k, rows=3001, cols=700, seed=lanes)


@pytest.mark.gpu
@pytest.mark.parametrize(("average", "dtype"), [(2, "float64"), (10, "float64"), (45, "float32")])
def test_default_spmv_on_the_device(average, dtype):
    """The default's per-call choice on a GPU, with device-resident x and through
    `device_launch` (what `bench gpu` times)."""
    cp = _device_or_skip()
    k = sparsec.Kernel(SPMV, {"A": "csr"}, target="cuda", dtype=dtype)
    a = _rows_of(average, 5000, 400, average).astype(dtype)
    t = sparsec.Tensor.from_dense(a, "csr")
    x = (np.arange(400) % 9 - 4).astype(dtype)
    np.testing.assert_array_equal(k(A=t, x=x), a @ x)
    np.testing.assert_array_equal(cp.asnumpy(k(A=t, x=cp.asarray(x))), a @ x)
    launch, out = k.device_launch(A=t, x=x)
    launch()
    np.testing.assert_array_equal(cp.asnumpy(out), a @ x)


# ------------------------------- warp-segmented runs before atomics (nonzero-parallel)
def _nonzeros(block: int, per_thread: int, fmt: str = "csr") -> str:
    fused = "fuse(i,j,f), pos(f,fp,A)" if fmt == "csr" else "pos(i,fp,A)"
    return (
        f"{fused}, split(fp,b,fp1,{block * per_thread}), split(fp1,t,n,{per_thread}), "
        "parallelize(b,GPUBlock,Atomics), parallelize(t,GPUThread,Atomics)"
    )


@needs_compiler
@pytest.mark.parametrize(
    ("block", "per_thread"),
    [(256, 8), (32, 3), (48, 2), (64, 1), (96, 5)],
    ids=["256x8", "32x3", "48x2-partial-warp", "64x1", "96x5"],
)
@pytest.mark.parametrize("rows", [1, 7, 203])
def test_nonzero_parallel_lanes_combine_runs_before_atomics(block, per_thread, rows):
    """Each thread's last run is combined with its neighbours' (rows across several
    lanes' chunks: up to 100 nonzeros here) before the segments' first lanes add
    atomically; blocks of 48 threads leave a warp half empty."""
    k = sparsec.kernel(
        SPMV, {"A": "csr"}, target="cuda-emulated", schedule=_nonzeros(block, per_thread)
    )
    assert "sc_segment_sum(run, run_at, t" in k.source and "if (run_head)" in k.source
    _spmv(k, rows=rows, cols=150, seed=rows)
    if rows == 203:
        _no_spills(k)


@needs_compiler
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_default_nonzero_mapping_of_a_tensor_combines_runs(dtype):
    """TTV's default (CSF's levels fused, 8 nonzeros per thread): fibers of up to 60
    nonzeros span several lanes, and empty slices sit between them."""
    expr = "A(i,j) = B(i,j,k) * c(k)"
    k = sparsec.kernel(expr, {"B": "csf"}, target="cuda-emulated", dtype=dtype)
    assert "sc_segment_sum" in k.source
    rng = np.random.default_rng(4)
    b = np.zeros((9, 7, 60), dtype=dtype)
    for i, j in [(0, 0), (0, 3), (2, 1), (2, 2), (5, 6), (8, 0)]:
        n = int(rng.integers(1, 61))
        b[i, j, rng.choice(60, n, replace=False)] = rng.integers(-3, 4, n)
    c = (np.arange(60) % 5 - 2).astype(dtype)
    got = k(B=sparsec.Tensor.from_dense(b, "csf"), c=c)
    np.testing.assert_array_equal(got, np.einsum("ijk,k->ij", b, c))
    _no_spills(k)


def test_runs_stay_per_thread_under_a_semiring():
    """A semiring's add is not a sum of lanes: each thread adds its last run itself."""
    k = sparsec.kernel(
        SPMV, {"A": "csr"}, target="cuda", schedule=_nonzeros(256, 8), semiring="min_plus"
    )
    assert "sc_segment" not in k.source and "sc_atomic_min" in k.source


@needs_compiler
def test_runs_below_a_data_dependent_loop_stay_per_thread():
    """A serial walk inside a loop whose trips differ between lanes (each row's own
    positions, split): lanes would not all reach a shuffle, so each adds its runs."""
    schedule = (
        "split(i,b,t,64), pos(j,jp,A), split(jp,j0,j1,4), parallelize(b,GPUBlock,Atomics), "
        "parallelize(t,GPUThread,Atomics)"
    )
    k = sparsec.kernel(
        "y(j) = A(i,j) * x(i)", {"A": "csr"}, target="cuda-emulated", schedule=schedule
    )
    assert "sc_segment" not in k.source
    a = _matrix(150, 90, 2)
    x = np.arange(150.0) % 7 - 3
    np.testing.assert_array_equal(k(A=sparsec.Tensor.from_dense(a, "csr"), x=x), x @ a)


# ----------------------------------------------- the emulation's shuffles themselves
_SHIM_PROGRAM = r"""
#include "cuda_shim.h"
#include <stdio.h>
static int out[2][64];
int main(int argc, char** argv) {
  int mode = argv[1][0] - '0';
  auto body = [&]() {
    int t = threadIdx.x, lane = t & 31;
    if (mode == 0) {  // groups of 8: each group's mask, width 8
      unsigned mask = 0xffu << (lane & ~7);
      out[0][t] = __shfl_down_sync(mask, 100 + t, 3, 8);
      out[1][t] = __shfl_up_sync(mask, 100 + t, 2, 8);
    } else if (mode == 1) {  // the third group of each warp skips its shuffle
      if ((lane >> 3) == 2) return;
      out[0][t] = __shfl_down_sync(0xffu << (lane & ~7), 100 + t, 1, 8);
    } else if (mode == 2) {  // a prefix of 20 lanes, the whole width
      if (lane >= 20) return;
      out[0][t] = __shfl_down_sync((1u << 20) - 1, 100 + t, 4);
      out[1][t] = __shfl_up_sync((1u << 20) - 1, 100 + t, 4);
    } else if (mode == 3) {  // a lane outside its own mask
      __shfl_down_sync(0xfffffffeu, t, 1);
    } else {  // a named lane exits before the meeting
      if (lane == 5) return;
      __shfl_down_sync(0xffffffffu, t, 1);
    }
  };
  sc_emu::launch(1, 48, true, body);  // a warp and a half: lanes 32-47 exist
  for (int r = 0; r < 2; r++) {
    for (int t = 0; t < 48; t++) printf("%d ", out[r][t]);
    printf("\n");
  }
  return 0;
}
"""


def _read(t: int, source: int, width: int, named: set[int]) -> int:
    """CUDA's shuffle for thread ``t`` (of a 48-thread block) reading lane ``source``: its
    value when it lies in the caller's segment of ``width`` lanes, is named by the mask
    and exists, else the caller's own."""
    lane, base = t % 32, t - t % 32
    lo = lane - lane % width
    ok = lo <= source < lo + width and source in named and source < min(32, 48 - base)
    return 100 + base + source if ok else 100 + t


def _shuffled(mode: int) -> list[list[int]]:
    out = [[0] * 48, [0] * 48]
    prefix = set(range(20))
    for t in range(48):
        lane = t % 32
        group = set(range(lane - lane % 8, lane - lane % 8 + 8))
        if mode == 0:
            out[0][t], out[1][t] = _read(t, lane + 3, 8, group), _read(t, lane - 2, 8, group)
        elif mode == 1 and lane // 8 != 2:
            out[0][t] = _read(t, lane + 1, 8, group)
        elif mode == 2 and lane < 20:
            out[0][t] = _read(t, lane + 4, 32, prefix)
            out[1][t] = _read(t, lane - 4, 32, prefix)
    return out


def _shim_binary(tmp_path):
    import shlex
    import shutil
    import subprocess

    from sparsec.base.resources import data_dir

    cxx = shlex.split(__import__("os").environ.get("SPARSEC_CXX", "c++")) or ["c++"]
    if shutil.which(cxx[0]) is None:
        pytest.skip(f"no C++ compiler {cxx[0]!r} for the CUDA emulation")
    (tmp_path / "shuffles.cpp").write_text(_SHIM_PROGRAM)
    binary = tmp_path / "shuffles"
    include = f"-I{data_dir('templates')}"
    subprocess.run(
        [
            *cxx,
            "-std=c++20",
            "-O1",
            "-fopenmp",
            include,
            str(tmp_path / "shuffles.cpp"),
            "-o",
            str(binary),
        ],
        check=True,
    )
    return binary


def test_emulated_shuffles_follow_masks_and_widths(tmp_path):
    """The shim's shuffles on their own, against CUDA's rules: groups of 8 lanes with
    their own masks (one group absent), a running prefix of 20 lanes, a partial warp;
    a lane outside its own mask, or a named lane that exits first, aborts instead of
    hanging or reading garbage."""
    import subprocess

    binary = _shim_binary(tmp_path)
    for mode in (0, 1, 2):
        done = subprocess.run([str(binary), str(mode)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        got = [[int(v) for v in line.split()] for line in done.stdout.splitlines()]
        assert got == _shuffled(mode), mode
    for mode in (3, 4):
        done = subprocess.run([str(binary), str(mode)], capture_output=True, timeout=60)
        assert done.returncode != 0, mode


@needs_compiler
def test_default_lane_groups_for_accumulate_and_scipy_inputs():
    """``y(i) += ...`` adds each group's sum to the given y once; a scipy CSR input is
    measured like a Tensor."""
    import scipy.sparse as sp

    k = sparsec.Kernel("y(i) += A(i,j) * x(j)", {"A": "csr"}, target="cuda-emulated")
    a = _rows_of(12, 100, 80, 3)
    x, y = np.arange(80.0) % 5, np.arange(100.0) % 3 - 1
    np.testing.assert_array_equal(k(A=sp.csr_array(a), x=x, y=y.copy()), y + a @ x)
    (ran,) = [d.label for d, _, _ in k._candidates]
    assert "split(i_rows,i_warp,i_group,8)" in ran  # 4 lanes
