"""The CUDA target without a GPU: every kernel compiles with NVRTC for sm_80 and sm_90
without spills, and runs through the CPU emulation to the dense torch result. The `device`
tests run the same kernels through CuPy and skip themselves where no device exists."""

from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import case_id, formatted_inputs, sparse_array, torch_reference
from test_kernels import CASES

import sparsec
from sparsec import ScheduleError, SparsecError
from sparsec.runtime import device, nvrtc

SPMV = "y(i) = A(i,j) * x(j)"
MTTKRP = "A(i,j) = B(i,k,l) * D(l,j) * C(k,j)"
SPMM = "C(i,j) = W(i,k) * X(k,j)"
#: SpMM widths: under, at and past a block's threads and a coarsened sweep's 512 columns
#: (4 per thread, 128 threads), then sweeps of 2 (768 = 512 + 256), a remainder, odd widths
SPMM_WIDTHS = (1, 97, 256, 511, 512, 513, 768, 1100)

SPMV_SCHEDULES = {
    "thread-per-row": "split(i,i0,i1,256), parallelize(i0,GPUBlock,NoRaces), "
    "parallelize(i1,GPUThread,NoRaces)",
    "warp-per-row": "split(i,i0,i1,8), pos(j,jp,A), split(jp,j0,j1,32), reorder(i0,i1,j0,j1), "
    "parallelize(i0,GPUBlock,NoRaces), parallelize(i1,GPUWarp,NoRaces), "
    "parallelize(j1,GPUThread,ParallelReduction)",
    "nonzero-parallel": "fuse(i,j,f), pos(f,fp,A), split(fp,b,fp1,2048), split(fp1,t,n,8), "
    "parallelize(b,GPUBlock,Atomics), parallelize(t,GPUThread,Atomics)",
}
MTTKRP_SCHEDULES = {
    "default": None,
    "nonzero-parallel": "fuse(i,k,f), fuse(f,l,g), pos(g,gp,B), split(gp,b,gp1,512), "
    "split(gp1,t,n,16), parallelize(b,GPUBlock,Atomics), parallelize(t,GPUThread,Atomics)",
    "thread-per-slice": "pos(i,ip,B), split(ip,b,t,64), parallelize(b,GPUBlock,NoRaces), "
    "parallelize(t,GPUThread,NoRaces)",
}

needs_compiler = pytest.mark.skipif(
    nvrtc.nvrtc() is None and __import__("shutil").which("nvcc") is None,
    reason="neither NVRTC (pip install nvidia-cuda-nvrtc-cu12) nor nvcc is available",
)


def _given(fmts, shapes, seed, dtype="float64", index_dtype="int32", integer=False):
    rng = np.random.default_rng(seed)
    return formatted_inputs(fmts, shapes, rng, dtype, index_dtype, integer)


def _no_spills(k: sparsec.Kernel) -> None:
    reports = k.verify()
    assert [r.arch for r in reports] == ["sm_80", "sm_90"]
    for r in reports:
        assert r.spills == 0, str(r)
        assert 0 < r.occupancy <= 1 and r.registers > 0, str(r)


# ------------------------------------------------------ the core acceptance list
@needs_compiler
@pytest.mark.parametrize(
    ("dtype", "index_dtype"), [("float64", "int32"), ("float32", "int64")], ids=["f64i32", "f32i64"]
)
@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_core_cases_under_emulation(case, dtype, index_dtype):
    expr, fmts, ref, shapes = case
    k = sparsec.kernel(expr, fmts, target="cuda-emulated")
    dense, given = _given(fmts, shapes, 11, dtype, index_dtype, integer=True)
    got = np.asarray(k(**given), dtype=np.float64)
    want = torch_reference(ref, dense)
    tol = 1e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    if dtype == "float64":
        _no_spills(k)


def test_every_core_case_has_a_gpu_mapping():
    """All 56, merges at the outermost loop included: a split merge locates each
    thread's start (`sparsec.lower.window`)."""
    unmapped = []
    for expr, fmts, _, _ in CASES:
        try:
            sparsec.kernel(expr, fmts, target="cuda-emulated").source  # noqa: B018
        except ScheduleError as err:
            unmapped.append(f"{expr} {fmts}: {err}")
    assert len(CASES) == 56
    assert not unmapped, unmapped


# -------------------------------------------------------------- SpMV, MTTKRP
@needs_compiler
@pytest.mark.parametrize("name", list(SPMV_SCHEDULES))
def test_spmv_gpu_schedules(name):
    schedule = SPMV_SCHEDULES[name]
    k = sparsec.kernel(SPMV, {"A": "csr"}, target="cuda-emulated", schedule=schedule)
    dense, given = _given({"A": "csr"}, {"A": (300, 170), "x": (170,)}, 3, integer=True)
    np.testing.assert_array_equal(k(**given), dense["A"] @ dense["x"])
    _no_spills(k)
    if name == "warp-per-row":
        assert "__shfl_down_sync" in k.source and "sc_warp_sum(acc)" in k.source
    if name == "nonzero-parallel":
        assert "atomicAdd(&y_vals" in k.source


@needs_compiler
@pytest.mark.parametrize("name", list(MTTKRP_SCHEDULES))
def test_mttkrp_gpu_schedules(name):
    k = sparsec.kernel(
        MTTKRP, {"B": "csf"}, target="cuda-emulated", schedule=MTTKRP_SCHEDULES[name]
    )
    shapes = {"B": (30, 20, 16), "D": (16, 8), "C": (20, 8)}
    dense, given = _given({"B": "csf"}, shapes, 4, integer=True)
    want = torch_reference("ikl,lj,kj->ij", dense)
    np.testing.assert_array_equal(k(**given), want)
    _no_spills(k)
    if name != "thread-per-slice":
        assert "atomicAdd(&A_vals" in k.source


# ------------------------------------------ every GPU unit with every race strategy
DOT = "a = v(i) * w(i)"
ROWSUM = "y(i) = C(i,k)"
_SPMV_ADD = "y(i) += A(i,j) * x(j)"
_CSR, _DENSE, _VECS = {"A": "csr"}, {"A": "dense"}, {"v": "dense", "w": "dense"}
_BLOCK_ROW = "parallelize(i,GPUBlock,NoRaces), pos(j,jp,A), split(jp,jw,jl,32), "
_NONZEROS = "fuse(i,j,f), pos(f,fp,A), split(fp,b,fp1,256), "
_DOT_WARPS = "split(i,ib,ir,128), split(ir,iw,il,32), "
#: (id, expression, formats, schedule, None or the refusal). The strategy of every GPU
#: loop that shares an element decides how its parts are combined: warps with Atomics
#: around lanes that reduce (ParallelReduction) add each warp's sum atomically from lane 0.
GPU_MAPPINGS = [
    ("thread-per-row", SPMV, _CSR, SPMV_SCHEDULES["thread-per-row"], None),
    (
        "thread-per-row-ignore",
        SPMV,
        _CSR,
        "split(i,i0,i1,64), parallelize(i0,GPUBlock,IgnoreRaces), "
        "parallelize(i1,GPUThread,IgnoreRaces)",
        None,
    ),
    ("warp-per-row", SPMV, _CSR, SPMV_SCHEDULES["warp-per-row"], None),
    (
        "warps-atomics-lanes-reduce",
        SPMV,
        _CSR,
        _BLOCK_ROW + "parallelize(jw,GPUWarp,Atomics), parallelize(jl,GPUThread,ParallelReduction)",
        None,
    ),
    (
        "warps-atomics-lanes-reduce-accumulate",
        _SPMV_ADD,
        _CSR,
        _BLOCK_ROW + "parallelize(jw,GPUWarp,Atomics), parallelize(jl,GPUThread,ParallelReduction)",
        None,
    ),
    (
        "warps-atomics-lanes-atomics",
        SPMV,
        _CSR,
        _BLOCK_ROW + "parallelize(jw,GPUWarp,Atomics), parallelize(jl,GPUThread,Atomics)",
        None,
    ),
    ("threads-atomics", SPMV, _CSR, _BLOCK_ROW + "parallelize(jl,GPUThread,Atomics)", None),
    (
        "warps-atomics-no-lanes",
        SPMV,
        _CSR,
        _BLOCK_ROW + "parallelize(jw,GPUWarp,Atomics)",
        "every lane of a warp would do it",
    ),
    (
        "threads-reduce-outside-a-warp",
        SPMV,
        _CSR,
        _BLOCK_ROW + "parallelize(jl,GPUThread,ParallelReduction)",
        "ParallelReduction does not apply",
    ),
    (
        "warps-reduce",
        SPMV,
        _CSR,
        _BLOCK_ROW
        + "parallelize(jw,GPUWarp,ParallelReduction), parallelize(jl,GPUThread,ParallelReduction)",
        "ParallelReduction does not apply",
    ),
    (
        "warps-noraces",
        SPMV,
        _CSR,
        _BLOCK_ROW + "parallelize(jw,GPUWarp,NoRaces), parallelize(jl,GPUThread,ParallelReduction)",
        "write the same element of y",
    ),
    (
        "warps-ignoreraces",
        SPMV,
        _CSR,
        _BLOCK_ROW
        + "parallelize(jw,GPUWarp,IgnoreRaces), parallelize(jl,GPUThread,ParallelReduction)",
        "write the same element of y",
    ),
    (
        "dense-rowsum-warps-atomics-lanes-reduce",
        ROWSUM,
        {"C": "dense"},
        "split(k,kw,kl,32), parallelize(i,GPUBlock,NoRaces), parallelize(kw,GPUWarp,Atomics), "
        "parallelize(kl,GPUThread,ParallelReduction)",
        None,
    ),
    (
        "blocks-atomics-warp-per-row-lanes-reduce",
        SPMV,
        _DENSE,
        "split(j,jb,jl,32), reorder(jb,i,jl), parallelize(jb,GPUBlock,Atomics), "
        "parallelize(i,GPUWarp,NoRaces), parallelize(jl,GPUThread,ParallelReduction)",
        None,
    ),
    (
        "blocks-atomics-threads-over-rows",
        SPMV,
        _DENSE,
        "reorder(j,i), parallelize(j,GPUBlock,Atomics), parallelize(i,GPUThread,NoRaces)",
        None,
    ),
    (
        "blocks-noraces-sharing-rows",
        SPMV,
        _DENSE,
        "reorder(j,i), parallelize(j,GPUBlock,NoRaces), parallelize(i,GPUThread,NoRaces)",
        "write the same element of y",
    ),
    ("nonzeros-blocks-threads", SPMV, _CSR, SPMV_SCHEDULES["nonzero-parallel"], None),
    (
        "nonzeros-blocks-warps-lanes-atomics",
        SPMV,
        _CSR,
        _NONZEROS + "split(fp1,w,l,32), parallelize(b,GPUBlock,Atomics), "
        "parallelize(w,GPUWarp,Atomics), parallelize(l,GPUThread,Atomics)",
        None,
    ),
    (
        "nonzeros-blocks-warps-no-lanes",
        SPMV,
        _CSR,
        _NONZEROS + "split(fp1,w,n,8), parallelize(b,GPUBlock,Atomics), "
        "parallelize(w,GPUWarp,Atomics)",
        "every lane of a warp would do it",
    ),
    ("nonzeros-blocks-only", SPMV, _CSR, _NONZEROS + "parallelize(b,GPUBlock,Atomics)", None),
    (
        "nonzeros-lanes-reduce",
        SPMV,
        _CSR,
        _NONZEROS + "split(fp1,w,l,32), parallelize(b,GPUBlock,Atomics), "
        "parallelize(w,GPUWarp,Atomics), parallelize(l,GPUThread,ParallelReduction)",
        "ParallelReduction does not apply",
    ),
    (
        "dot-blocks-warps-atomics-lanes-reduce",
        DOT,
        _VECS,
        _DOT_WARPS + "parallelize(ib,GPUBlock,Atomics), parallelize(iw,GPUWarp,Atomics), "
        "parallelize(il,GPUThread,ParallelReduction)",
        None,
    ),
    (
        "dot-blocks-warps-lanes-atomics",
        DOT,
        _VECS,
        _DOT_WARPS + "parallelize(ib,GPUBlock,Atomics), parallelize(iw,GPUWarp,Atomics), "
        "parallelize(il,GPUThread,Atomics)",
        None,
    ),
    (
        "dot-blocks-warps-no-lanes",
        DOT,
        _VECS,
        _DOT_WARPS + "parallelize(ib,GPUBlock,Atomics), parallelize(iw,GPUWarp,Atomics)",
        "every lane of a warp would do it",
    ),
    (
        "dot-blocks-threads-atomics",
        DOT,
        _VECS,
        "split(i,ib,it,128), parallelize(ib,GPUBlock,Atomics), parallelize(it,GPUThread,Atomics)",
        None,
    ),
    ("dot-blocks-only", DOT, _VECS, "split(i,ib,it,128), parallelize(ib,GPUBlock,Atomics)", None),
    (
        "dot-blocks-noraces",
        DOT,
        _VECS,
        "split(i,ib,it,128), parallelize(ib,GPUBlock,NoRaces), parallelize(it,GPUThread,Atomics)",
        "write the same element of a",
    ),
    (
        "dot-blocks-reduce",
        DOT,
        _VECS,
        "split(i,ib,it,128), parallelize(ib,GPUBlock,ParallelReduction), "
        "parallelize(it,GPUThread,Atomics)",
        "ParallelReduction does not apply",
    ),
    (
        "dot-blocks-ignoreraces",
        DOT,
        _VECS,
        _DOT_WARPS + "parallelize(ib,GPUBlock,IgnoreRaces), parallelize(iw,GPUWarp,Atomics), "
        "parallelize(il,GPUThread,ParallelReduction)",
        "write the same element of a",
    ),
]
_SHAPES = {
    SPMV: {"A": (50, 200), "x": (200,)},
    _SPMV_ADD: {"A": (50, 200), "x": (200,), "y": (50,)},
    ROWSUM: {"C": (9, 150)},
    DOT: {"v": (1000,), "w": (1000,)},
}
_EINSUM = {SPMV: "ij,j->i", _SPMV_ADD: "ij,j->i", ROWSUM: "ik->i", DOT: "i,i->"}


@needs_compiler
@pytest.mark.parametrize("case", GPU_MAPPINGS, ids=[c[0] for c in GPU_MAPPINGS])
def test_gpu_mappings_against_numpy(case):
    """Each mapping gives numpy's result through the emulation (integer values, so sums in
    any order are exact) and compiles with NVRTC, or is refused with a ScheduleError."""
    _, expr, fmts, schedule, refusal = case
    if refusal is not None:
        with pytest.raises(ScheduleError, match=refusal):
            sparsec.kernel(expr, fmts, target="cuda", schedule=schedule)
        return
    k = sparsec.kernel(expr, fmts, target="cuda-emulated", schedule=schedule)
    rng = np.random.default_rng(18)
    dense = {n: sparse_array(s, rng, 0.5, integer=True) for n, s in _SHAPES[expr].items()}
    given = {
        n: sparsec.Tensor.from_dense(a, fmts[n]) if fmts.get(n, "dense") != "dense" else a
        for n, a in dense.items()
    }
    inputs = [dense[n] for n in _SHAPES[expr] if n != "y"]
    want = np.einsum(_EINSUM[expr], *inputs) + (dense["y"] if expr == _SPMV_ADD else 0.0)
    np.testing.assert_array_equal(np.asarray(k(**given)), want)
    assert k.verify()


def test_lanes_reduce_then_warps_add_atomically():
    """Issue 18: warps with Atomics around lanes that reduce stored each warp's sum with a
    plain store, so the warps overwrote each other ([0, 0] for [3, 3])."""
    k = sparsec.kernel(
        ROWSUM,
        {"C": "dense"},
        target="cuda-emulated",
        schedule="split(k,kw,kl,32), parallelize(i,GPUBlock,NoRaces), "
        "parallelize(kw,GPUWarp,Atomics), parallelize(kl,GPUThread,ParallelReduction)",
    )
    np.testing.assert_array_equal(k(C=np.ones((2, 3))), [3.0, 3.0])
    assert "if (sc_lane() == 0) {\n      atomicAdd(&y_vals[" in k.source
    assert k.generated().launch.zero_before
    # the CSR SpMV and its += form: every warp's sum is added atomically (the emulation
    # runs a block's threads in turn, so only the source shows the race of a plain +=)
    for expr in (SPMV, _SPMV_ADD):
        schedule = (
            _BLOCK_ROW
            + "parallelize(jw,GPUWarp,Atomics), parallelize(jl,GPUThread,ParallelReduction)"
        )
        src = sparsec.kernel(expr, _CSR, target="cuda", schedule=schedule).source
        assert "atomicAdd(&y_vals[" in src and not re.search(r"y_vals\[\w+\] \+?=", src)


def test_default_gpu_schedules_are_reported():
    spmv = sparsec.kernel(SPMV, {"A": "csr"}, target="cuda")
    assert spmv.schedule.startswith("default: split(i,")
    assert "GPUThread, race-free" in spmv.schedule
    mttkrp = sparsec.kernel(MTTKRP, {"B": "csf"}, target="cuda")
    assert "pos(" in mttkrp.schedule and "atomicAdd into A" in mttkrp.schedule
    src = mttkrp.source
    assert 'extern "C" __global__ void sparsec_kernel(' in src
    assert "launch: grid = " in src and "block = 256 threads" in src
    assert "__restrict__" in src and "schedule: default: fuse(i,k," in src


@needs_compiler
@pytest.mark.parametrize("width", SPMM_WIDTHS)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_spmm_default_maps_columns_to_threads(width, dtype):
    k = sparsec.kernel(SPMM, {"W": "csr"}, target="cuda-emulated")
    assert k.schedule.startswith("default: reorder(i,j,k), parallelize(i,GPUBlock,NoRaces)")
    assert k.schedule.endswith("j: 4 then 2 columns per thread (128 threads per block)")
    assert k.generated().launch.block == 128 and "sc_acc_3 += " in k.source
    assert "sc_span0_2 = 2 * sc_block_threads()" in k.source
    dense, given = _given({"W": "csr"}, {"W": (40, 45), "X": (45, width)}, 6, dtype, integer=True)
    np.testing.assert_array_equal(k(**given), dense["W"] @ dense["X"])
    _no_spills(k)


def test_coarsening_is_for_default_mappings_with_a_shared_loop():
    """An explicit schedule is printed as written; SpMV's thread loop (its trip count
    depends on the row) and MTTKRP's nonzero-parallel loop are left alone."""
    explicit = sparsec.kernel(
        SPMM,
        {"W": "csr"},
        target="cuda",
        schedule="reorder(i,j,k), parallelize(i,GPUBlock,NoRaces), "
        "parallelize(j,GPUThread,NoRaces)",
    )
    assert "columns per thread" not in explicit.schedule
    assert explicit.generated().launch.block == 256
    for expr, fmts in ((SPMV, {"A": "csr"}), (MTTKRP, {"B": "csf"}), (SPMV, {"A": "coo"})):
        k = sparsec.kernel(expr, fmts, target="cuda")
        assert "columns per thread" not in k.schedule and "sc_span" not in k.source


def test_coarsening_refuses_what_it_cannot_split():
    """A loop that is coarsened, then variants with one thing the pass cannot split."""
    from sparsec.ir import nodes as ir
    from sparsec.passes.coarsen import coarsen

    par = ir.Parallel("GPUThread", "")
    acc, j, nine = ir.Var("acc"), ir.Var("j"), ir.IntLit(9)
    declare = ir.Decl(ir.VAL, "acc", ir.FloatLit(0.0))
    add = ir.Assign(acc, ir.Load("x", j), "+=")
    store = ir.Assign(ir.Load("out", j), acc)

    def coarsened(*body, end=nine):
        inner = ir.For("p", ir.IntLit(0), end, ir.Block((add,)))
        stmts = [inner if s == "inner" else s for s in body]
        loop = ir.For("j", ir.IntLit(0), ir.Var("n"), ir.Block(tuple(stmts)), parallel=par)
        return bool(coarsen(ir.Block((loop,)))[1])

    assert coarsened(declare, "inner", store)
    assert not coarsened("inner", store)  # the accumulator is carried across columns
    assert not coarsened(declare, "inner", ir.Assign(ir.Load("out", ir.IntLit(0)), acc))
    counted = ir.Assign(ir.Var("count"), ir.IntLit(1), "+=")  # declared outside
    assert not coarsened(declare, "inner", counted, store)
    assert not coarsened(declare, "inner", ir.Assign(ir.Load("out", j), acc, "+=", atomic=True))
    assert not coarsened(declare, "inner", store, end=j)  # the trip count depends on j


@pytest.mark.parametrize("fmt", ["coo", "csr", "dcsr"])
def test_no_atomic_updates_of_a_thread_local(fmt):
    """A thread's own accumulator is added to plainly; only the output is atomic. (CUDA's
    atomicAdd on a local variable is an illegal address on a real device: the COO SpMV
    kernel failed its launch there while the CPU emulation, which allows it, passed.)"""
    k = sparsec.kernel(SPMV, {"A": fmt}, target="cuda")
    assert "atomicAdd(&acc" not in k.source
    assert "acc += " in k.source


def test_the_cuda_printer_refuses_an_atomic_on_a_local():
    from sparsec.backends.printer import CUDA, Printer
    from sparsec.ir import nodes as ir

    stmt = ir.Assign(ir.Var("acc"), ir.FloatLit(1.0), "+=", atomic=True)
    with pytest.raises(AssertionError, match="atomic update of the local acc"):
        Printer(CUDA).stmts(stmt)


def test_emulation_source_is_the_cuda_source():
    k = sparsec.kernel(SPMV, {"A": "csr"}, target="cuda-emulated")
    assert k.source in device.emulation_source(k.generated())


# ------------------------------------------------------------------ illegal
GPU_ILLEGAL = [
    (
        SPMV,
        {"A": "csr"},
        "split(i,i0,i1,32), parallelize(i1,GPUThread,NoRaces)",
        "GPUThread without an enclosing GPUBlock",
    ),
    (
        SPMV,
        {"A": "csr"},
        "fuse(i,j,f), pos(f,fp,A), split(fp,b,t,64), parallelize(b,GPUBlock,NoRaces), "
        "parallelize(t,GPUThread,NoRaces)",
        "iterations of b write the same element of y",
    ),
    (
        SPMV,
        {"A": "csr"},
        "split(i,i0,i1,32), parallelize(i0,GPUBlock,NoRaces), parallelize(i1,CPUThread,NoRaces)",
        "CPUThread is a CPU unit",
    ),
    (
        SPMV,
        {"A": "csr"},
        "split(i,i0,i1,32), parallelize(i1,GPUBlock,NoRaces), parallelize(i0,GPUThread,NoRaces)",
        "GPUThread without an enclosing GPUBlock",
    ),
    (
        SPMV,
        {"A": "csr"},
        "split(i,i0,i1,8), parallelize(i1,GPUWarp,NoRaces)",
        "GPUWarp needs an enclosing GPUBlock",
    ),
    (
        SPMV,
        {"A": "csr"},
        "split(i,i0,i1,8), pos(j,jp,A), split(jp,j0,j1,32), reorder(i0,i1,j0,j1), "
        "parallelize(i0,GPUBlock,NoRaces), parallelize(j1,GPUThread,ParallelReduction)",
        "ParallelReduction does not apply here",
    ),
    (
        "C(i,k) = A(i,j) * B(j,k)",
        {"A": "csr"},
        "parallelize(i,GPUBlock,NoRaces), parallelize(j,GPUThread,NoRaces)",
        "while loop|write the same element",
    ),
    (
        SPMV,
        {"A": "csr"},
        "pos(j,jp,A), split(jp,b,t,32), parallelize(b,GPUBlock,NoRaces)",
        "write the same element of y",
    ),
    (
        "y(i) = A(i,j) * x(j)",
        {"A": "csr"},
        "split(i,i0,i1,8), parallelize(i0,GPUBlock,NoRaces), parallelize(i1,GPUWarp,NoRaces)",
        "store into y runs outside the GPUThread loops",
    ),
    # SpGEMM into CSR maps (test_cuda_sparse_out), into DCSR too, through a compaction
    # (test_cuda_compaction); a sparse output's loop still cannot be split by a user
    (
        "C(i,j) = A(i,k) * B(k,j)",
        {"A": "csr", "B": "csr", "C": "dcsr"},
        "split(j,j0,j1,4), parallelize(i,GPUBlock,NoRaces), parallelize(j0,GPUThread,NoRaces)",
        "appended in loop order",
    ),
    (MTTKRP, {"B": "csf"}, "precompute(B(i,k,l)*D(l,j), j, jw)", "GPU mapping|C target only"),
    (SPMV, {"A": "csr"}, "split(i,i0,i1,4)", "the CUDA target needs a GPU mapping"),
    (SPMV, {"A": "csr"}, "serial", "schedule 'serial' is for the C target"),
    # a merge cannot be mapped itself (its iterations carry iterator state); its split
    # pieces can (`test_merges_on_the_gpu`)
    (
        "A(i,j) = B(i,j) + C(i,j)",
        {"B": "dcsr", "C": "dcsr"},
        "parallelize(i,GPUBlock,NoRaces)",
        "while loop",
    ),
]


@pytest.mark.parametrize("case", GPU_ILLEGAL, ids=lambda c: str(c[2])[:50])
def test_illegal_gpu_schedule(case):
    expr, fmts, schedule, message = case
    with pytest.raises(ScheduleError, match=message):
        sparsec.kernel(expr, fmts, target="cuda", schedule=schedule)


# --------------------------------------------------------------- runtime
def test_cuda_target_without_a_device_is_a_clear_error():
    try:
        device.cupy_device()
    except SparsecError:
        pass
    else:
        pytest.skip("a CUDA device is present")
    k = sparsec.kernel(SPMV, {"A": "csr"}, target="cuda")
    assert "__global__" in k.source  # source and verify need no device
    with pytest.raises(SparsecError, match="no CUDA device"):
        k(A=np.eye(3), x=np.ones(3))


def test_grid_is_evaluated_on_the_host():
    k = sparsec.kernel(
        SPMV, {"A": "csr"}, target="cuda-emulated", schedule=SPMV_SCHEDULES["nonzero-parallel"]
    )
    a = sparsec.Tensor.from_dense(np.eye(5000), "csr")
    gen = k.generated()
    params = {p.name: None for p in gen.signature.params}
    params.update({"A2_pos": a.levels[1].pos, "i_dim": 5000, "j_dim": 5000})
    assert device.grid_size(gen.launch, params) == 3  # 5000 nonzeros, 2048 per block


def test_occupancy_model():
    assert nvrtc.occupancy(32, 256) == 1.0
    assert nvrtc.occupancy(64, 256) == 0.5
    assert nvrtc.occupancy(255, 256) == 0.125


def test_cli_cuda_verify_and_check(capsys):
    from sparsec.cli import main

    if nvrtc.nvrtc() is None and __import__("shutil").which("nvcc") is None:
        pytest.skip("no CUDA compiler")
    args = ["compile", MTTKRP, "--target", "cuda", "--verify", "--check", "--print-source"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "atomicAdd(" in out
    assert out.count("verify: ok: sm_") == 2
    assert "run by the CUDA emulation on the CPU" in out


# ------------------------------------------------------------------- device
def _device_or_skip():
    try:
        return device.cupy_device()
    except SparsecError as err:
        pytest.skip(str(err))


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(SPMV_SCHEDULES))
def test_spmv_on_the_device(name):
    _device_or_skip()
    k = sparsec.kernel(SPMV, {"A": "csr"}, target="cuda", schedule=SPMV_SCHEDULES[name])
    dense, given = _given({"A": "csr"}, {"A": (3000, 1700), "x": (1700,)}, 3, integer=True)
    np.testing.assert_array_equal(k(**given), dense["A"] @ dense["x"])


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(MTTKRP_SCHEDULES))
def test_mttkrp_on_the_device(name):
    _device_or_skip()
    k = sparsec.kernel(MTTKRP, {"B": "csf"}, target="cuda", schedule=MTTKRP_SCHEDULES[name])
    shapes = {"B": (60, 40, 30), "D": (30, 16), "C": (40, 16)}
    dense, given = _given({"B": "csf"}, shapes, 4, integer=True)
    np.testing.assert_array_equal(k(**given), torch_reference("ikl,lj,kj->ij", dense))


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("dtype", "index_dtype"), [("float64", "int32"), ("float32", "int64")], ids=["f64i32", "f32i64"]
)
@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_core_cases_on_the_device(case, dtype, index_dtype):
    _device_or_skip()
    expr, fmts, ref, shapes = case
    k = sparsec.kernel(expr, fmts, target="cuda")  # all 56 map
    dense, given = _given(fmts, shapes, 11, dtype, index_dtype, integer=True)
    np.testing.assert_allclose(np.asarray(k(**given)), torch_reference(ref, dense), atol=1e-12)


def test_device_launch_needs_the_cuda_target():
    k = sparsec.kernel(SPMV, {"A": "csr"})
    with pytest.raises(SparsecError, match="device_launch needs target='cuda'"):
        k.device_launch(A=np.eye(3), x=np.ones(3))


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(MTTKRP_SCHEDULES))
def test_device_launch_repeats_the_whole_result(name):
    """Staged once, launched three times: atomics start from a zeroed output each time."""
    cp = _device_or_skip()
    k = sparsec.kernel(MTTKRP, {"B": "csf"}, target="cuda", schedule=MTTKRP_SCHEDULES[name])
    shapes = {"B": (60, 40, 30), "D": (30, 16), "C": (40, 16)}
    dense, given = _given({"B": "csf"}, shapes, 5, integer=True)
    launch, out = k.device_launch(**given)
    for _ in range(3):
        launch()
    got = cp.asnumpy(out).reshape(60, 16)
    np.testing.assert_array_equal(got, torch_reference("ikl,lj,kj->ij", dense))


@pytest.mark.gpu
@pytest.mark.parametrize("width", SPMM_WIDTHS)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_spmm_default_on_the_device(width, dtype):
    _device_or_skip()
    k = sparsec.kernel(SPMM, {"W": "csr"}, target="cuda")
    shapes = {"W": (300, 130), "X": (130, width)}
    dense, given = _given({"W": "csr"}, shapes, 7, dtype, integer=True)
    np.testing.assert_array_equal(k(**given), dense["W"] @ dense["X"])


# ------------------------------------------------------ inputs in GPU memory
class _FakeDeviceArray:
    """Says it lives in GPU memory (as CuPy arrays and CUDA torch tensors do)."""

    shape = (4,)
    dtype = np.dtype(np.float64)

    @property
    def __cuda_array_interface__(self):  # pragma: no cover - never read
        raise AssertionError("the C target must not read device memory")


def test_device_inputs_need_the_cuda_target():
    k = sparsec.kernel(SPMV, {"A": "csr"})
    with pytest.raises(sparsec.InputError, match="input 'x' is in GPU memory.*target is 'c'"):
        k(A=np.eye(4), x=_FakeDeviceArray())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_dense_operands_stay_on_the_device(dtype):
    """X in GPU memory: the result is a CuPy array, W's arrays are copied once."""
    cp = _device_or_skip()
    k = sparsec.kernel(SPMM, {"W": "csr"}, target="cuda")
    dense, given = _given({"W": "csr"}, {"W": (300, 130), "X": (130, 700)}, 8, dtype, integer=True)
    x = cp.asarray(dense["X"])
    got = k(W=given["W"], X=x)
    assert isinstance(got, cp.ndarray) and got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(cp.asnumpy(got), dense["W"] @ dense["X"])
    copies = dict(given["W"]._device)
    again = k(W=given["W"], X=x * 2)
    assert all(given["W"]._device[key] is dev for key, dev in copies.items())
    np.testing.assert_array_equal(cp.asnumpy(again), 2 * (dense["W"] @ dense["X"]))
    assert k.check(W=given["W"], X=x).max_abs_error == 0


@pytest.mark.gpu
def test_device_inputs_in_every_role():
    """Atomics into a device output, a transposed dense operand, '+=' into a device
    array, a scalar result, a CUDA torch tensor, a cupyx sparse matrix."""
    cp = _device_or_skip()
    rng = np.random.default_rng(9)
    dense, given = _given(
        {"B": "csf"}, {"B": (30, 20, 16), "D": (16, 8), "C": (20, 8)}, 4, integer=True
    )
    k = sparsec.kernel(MTTKRP, {"B": "csf"}, target="cuda")
    got = k(B=given["B"], D=cp.asarray(dense["D"]), C=cp.asarray(dense["C"]))
    np.testing.assert_array_equal(cp.asnumpy(got), torch_reference("ikl,lj,kj->ij", dense))

    a = rng.integers(-3, 4, (40, 30)).astype(np.float64)
    x = rng.integers(-3, 4, 30).astype(np.float64)
    col_major = sparsec.kernel(SPMV, {"A": "dd:1,0"}, target="cuda")
    got = col_major(A=cp.asarray(a), x=cp.asarray(x))
    np.testing.assert_array_equal(cp.asnumpy(got), a @ x)

    y0 = rng.integers(-3, 4, 40).astype(np.float64)
    acc = sparsec.kernel("y(i) += A(i,j) * x(j)", {"A": "csr"}, target="cuda")
    a_csr = sparsec.Tensor.from_dense(a, "csr")
    y = cp.asarray(y0)
    got = acc(y=y, A=a_csr, x=cp.asarray(x))
    np.testing.assert_array_equal(cp.asnumpy(got), y0 + a @ x)
    np.testing.assert_array_equal(cp.asnumpy(y), y0)  # '+=' returns a new array

    dot = sparsec.kernel("s = x(i) * z(i)", target="cuda")
    assert dot(x=cp.asarray(x), z=cp.asarray(x)) == float(x @ x)

    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        got = k(B=given["B"], D=torch.as_tensor(dense["D"], device="cuda"), C=dense["C"])
        assert isinstance(got, torch.Tensor) and got.is_cuda
        np.testing.assert_array_equal(got.cpu().numpy(), torch_reference("ikl,lj,kj->ij", dense))

    import cupyx.scipy.sparse as csp
    import scipy.sparse as sp

    w = csp.csr_matrix(sp.csr_matrix(a))
    got = sparsec.kernel(SPMV, {"A": "csr"}, target="cuda")(A=w, x=cp.asarray(x))
    np.testing.assert_array_equal(cp.asnumpy(got), a @ x)


@pytest.mark.gpu
def test_bad_device_inputs_are_clear_errors():
    cp = _device_or_skip()
    k = sparsec.kernel(SPMV, {"A": "csr"}, target="cuda")
    a = sparsec.Tensor.from_dense(np.eye(4), "csr")
    with pytest.raises(sparsec.DTypeError, match="input 'x': int64 values are not supported"):
        k(A=a, x=cp.arange(4))
    with pytest.raises(sparsec.ShapeError, match="input 'x' has 2 dimensions"):
        k(A=a, x=cp.ones((4, 1)))
    with pytest.raises(sparsec.ShapeError):
        k(A=a, x=cp.ones(5))
