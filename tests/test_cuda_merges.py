"""Merges on the GPU (issue 22 item 1): a loop where several sparse operands meet, or a
sparse one meets a dense one in a sum, split into pieces of coordinates whose outer
pieces are GPU blocks and threads; each thread locates its start by a binary search
(`sparsec.lower.window`). Checked against dense torch under the CPU emulation, on inputs
long enough for many blocks, with empty windows and entries at every chunk boundary,
and compiled with NVRTC without spills."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import sparse_array
from test_cuda import needs_compiler

import sparsec
from sparsec import ScheduleError

#: (expression, formats, einsum or None for an elementwise sum, shapes)
MERGES = [
    ("a(i) = b(i) + c(i)", {"b": "s", "c": "s"}, "b+c", {"b": (5000,), "c": (5000,)}),
    ("a(i) = b(i) * c(i)", {"b": "s", "c": "s"}, "b*c", {"b": (5000,), "c": (5000,)}),
    ("a(i) = b(i) + c(i)", {"b": "s", "c": "dense"}, "b+c", {"b": (5000,), "c": (5000,)}),
    (
        "a(i) = b(i) + c(i) + d(i) * e(i)",
        {"b": "s", "c": "s", "d": "s", "e": "s"},
        "b+c+d*e",
        {n: (4500,) for n in "bcde"},
    ),
    (
        "A(i,j) = B(i,j) + C(i,j)",
        {"B": "dcsr", "C": "dcsr"},
        "B+C",
        {"B": (3000, 9), "C": (3000, 9)},
    ),
    (
        "A(i,j) = B(i,j) + C(i,j)",
        {"B": "dense", "C": "dcsc"},
        "B+C",
        {"B": (7, 2600), "C": (7, 2600)},
    ),
    (
        "A(i,j) = B(i,j) * C(i,j)",
        {"B": "dcsr", "C": "coo"},
        "B*C",
        {"B": (2500, 6), "C": (2500, 6)},
    ),
]


def _inputs(fmts, shapes, seed, dtype="float64", density=0.2):
    rng = np.random.default_rng(seed)
    dense, given = {}, {}
    for name, shape in shapes.items():
        arr = sparse_array(shape, rng, density, integer=True).astype(dtype)
        # runs of empty coordinates of the long (merged) mode longer than a chunk (8) and
        # a block (2048 coordinates)
        view = np.moveaxis(arr, int(np.argmax(shape)), 0)
        view[:40] = 0.0
        view[len(view) // 2 : len(view) // 2 + 2100] = 0.0
        dense[name] = arr
        fmt = fmts.get(name, "dense")
        given[name] = arr if fmt == "dense" else sparsec.Tensor.from_dense(arr, fmt)
    return dense, given


def _want(expr_py: str, dense: dict[str, np.ndarray]) -> np.ndarray:
    import torch

    env = {n: torch.from_numpy(v) for n, v in dense.items()}
    return eval(expr_py, {}, env).numpy()  # noqa: S307 - the table's own expressions


@needs_compiler
@pytest.mark.parametrize("case", MERGES, ids=lambda c: f"{c[0]} {c[1]}")
def test_merges_on_the_gpu(case):
    expr, fmts, ref, shapes = case
    k = sparsec.kernel(expr, fmts, target="cuda-emulated")
    assert "GPUThread" in k.schedule
    assert "sc_gallop(" in k.source  # each thread's start is searched, not walked to
    dense, given = _inputs(fmts, shapes, 3)
    np.testing.assert_array_equal(k(**given), _want(ref, dense))
    for r in k.verify():
        assert r.spills == 0, str(r)


@needs_compiler
def test_an_outermost_merge_of_compressed_levels_walks_chunks():
    """Several sparse operands and no dense term: 8 coordinates per thread, each
    iterator's window found by two binary searches; a dense term gives one coordinate
    per thread (coalesced reads of the dense operand)."""
    k = sparsec.kernel("a(i) = b(i) + c(i)", {"b": "s", "c": "s"}, target="cuda-emulated")
    assert "split(i_chunk,i_thread,i_in,8)" in k.schedule
    assert k.source.count("sc_gallop(b1_crd") == 2
    k = sparsec.kernel("a(i) = b(i) + c(i)", {"b": "s", "c": "dense"}, target="cuda-emulated")
    assert "split(i,i_block,i_thread,256)" in k.schedule
    assert k.source.count("sc_gallop(b1_crd") == 1


@needs_compiler
@pytest.mark.parametrize(
    "schedule",
    [
        # a serial piece of 5 (a remainder at the end of each block's 60)
        "split(i,ib,r,60), split(r,t,q,5), parallelize(ib,GPUBlock,NoRaces), "
        "parallelize(t,GPUThread,NoRaces)",
        # one coordinate per thread
        "split(i,ib,t,32), parallelize(ib,GPUBlock,NoRaces), parallelize(t,GPUThread,NoRaces)",
        # a block per window of 100, its threads over one coordinate each
        "split(i,ib,t,100), parallelize(ib,GPUBlock,NoRaces), parallelize(t,GPUThread,NoRaces)",
    ],
)
@pytest.mark.parametrize("fmt", ["s", "dense"])
def test_user_splits_of_a_merge(schedule, fmt):
    fmts = {"b": "s", "c": fmt, "d": "s"}
    k = sparsec.kernel(
        "a(i) = (b(i) + c(i)) * 2 + d(i)", fmts, target="cuda-emulated", schedule=schedule
    )
    dense, given = _inputs(fmts, {n: (4321,) for n in "bcd"}, 8)
    want = (dense["b"] + dense["c"]) * 2 + dense["d"]
    np.testing.assert_array_equal(k(**given), want)


@needs_compiler
@pytest.mark.parametrize(
    "schedule",
    [
        # a row per block, chunks of 4 columns per thread
        "parallelize(i,GPUBlock,NoRaces), split(j,jt,jc,4), parallelize(jt,GPUThread,NoRaces)",
        # a row per block, a column per thread
        "parallelize(i,GPUBlock,NoRaces), split(j,jb,jt,64), parallelize(jt,GPUThread,NoRaces)",
    ],
)
@pytest.mark.parametrize("c_fmt", ["csr", "dense"])
def test_an_inner_merge_split_across_a_blocks_threads(schedule, c_fmt):
    """The window is searched inside the row's segment (its parent's positions)."""
    fmts = {"B": "csr", "C": c_fmt}
    k = sparsec.kernel("A(i,j) = B(i,j) + C(i,j)", fmts, target="cuda-emulated", schedule=schedule)
    rng = np.random.default_rng(9)
    dense = {n: sparse_array((50, 2300), rng, 0.05, integer=True) for n in "BC"}
    dense["B"][:, 300:800] = 0.0  # a gap in every row longer than a block's columns
    given = {
        n: dense[n] if fmts[n] == "dense" else sparsec.Tensor.from_dense(dense[n], "csr")
        for n in "BC"
    }
    assert dense["B"].any() and dense["C"].any()
    np.testing.assert_array_equal(k(**given), dense["B"] + dense["C"])
    for r in k.verify():
        assert r.spills == 0, str(r)


def test_unroll_of_a_merge_piece_is_refused():
    with pytest.raises(ScheduleError, match="walks a merge"):
        sparsec.kernel(
            "a(i) = b(i) + c(i)",
            {"b": "s", "c": "s"},
            target="cuda-emulated",
            schedule="split(i,ib,r,64), split(r,t,q,8), parallelize(ib,GPUBlock,NoRaces), "
            "parallelize(t,GPUThread,NoRaces), unroll(q,4)",
        ).generated()


def test_a_split_merge_stays_refused_on_the_c_target():
    """The C target walks a merge serially; a split of it is refused as before."""
    with pytest.raises(ScheduleError, match="not a plain range"):
        k = sparsec.kernel("a(i) = b(i) + c(i)", {"b": "s", "c": "s"}, schedule="split(i,i0,i1,16)")
        k.generated()


def test_kernels_without_a_split_merge_are_unchanged():
    """A CSR + CSR sum merges inside a thread's row (j), with no window search."""
    k = sparsec.kernel("A(i,j) = B(i,j) + C(i,j)", {"B": "csr", "C": "csr"}, target="cuda")
    assert "sc_gallop(" not in k.source.split("extern")[1]


@pytest.mark.gpu
@pytest.mark.parametrize("case", MERGES, ids=lambda c: f"{c[0]} {c[1]}")
def test_merges_on_the_device(case):
    from test_cuda import _device_or_skip

    _device_or_skip()
    expr, fmts, ref, shapes = case
    dense, given = _inputs(fmts, shapes, 4)
    got = sparsec.kernel(expr, fmts, target="cuda")(**given)
    np.testing.assert_array_equal(got, _want(ref, dense))
