"""Semirings (issue 23, item 5): ``sparsec.kernel(..., semiring=...)`` against a numpy
semiring reference written here (not the library's): absent entries are the add's
identity, ``*`` needs both operands present, ``+`` either."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import sparsec
from sparsec.base.errors import SparsecError
from sparsec.runtime import nvrtc

#: name -> (add ufunc, multiply ufunc, identity, boolean)
RINGS = {
    "min_plus": (np.minimum, np.add, np.inf, False),
    "max_plus": (np.maximum, np.add, -np.inf, False),
    "max_times": (np.maximum, np.multiply, -np.inf, False),
    "min_times": (np.minimum, np.multiply, np.inf, False),
    "or_and": (np.logical_or, np.logical_and, 0.0, True),
    "plus_times": (np.add, np.multiply, 0.0, False),
}
TARGETS = ("c", "cuda-emulated")
#: the name of each semiring's add in the generated helpers (sc_warp_min, ...)
RINGS_ADD = {
    "min_plus": "min",
    "max_plus": "max",
    "max_times": "max",
    "min_times": "min",
    "or_and": "or",
}


def matrix(rows: int, cols: int, seed: int, boolean: bool = False) -> np.ndarray:
    """A small matrix with empty rows and columns, some stored... values in 1..8 (0/1
    for boolean semirings)."""
    rng = np.random.default_rng(seed)
    a = np.where(rng.random((rows, cols)) < 0.35, rng.integers(1, 9, (rows, cols)), 0.0)
    a[1, :] = 0.0  # an empty row
    a[:, 2 % cols] = 0.0  # an empty column
    return (a != 0).astype(float) if boolean else a.astype(float)


def vector(n: int, seed: int, boolean: bool = False) -> np.ndarray:
    rng = np.random.default_rng(seed)
    v = rng.integers(0, 2 if boolean else 6, n).astype(float)
    return v


def ref_mv(ring: str, a: np.ndarray, x: np.ndarray) -> np.ndarray:
    """y(i) = A(i,j) * x(j): the add over stored A(i,j) of A(i,j) (*) x(j)."""
    add, mul, ident, boolean = RINGS[ring]
    terms = np.where(a != 0, mul(a, x[None, :]).astype(float), ident)
    out = add.reduce(terms, axis=1).astype(float)
    return (out != 0).astype(float) if boolean else out


def ref_mm(
    ring: str, a: np.ndarray, b: np.ndarray, b_sparse: bool
) -> tuple[np.ndarray, np.ndarray]:
    """C(i,j) = A(i,k) * B(k,j): value (identity where absent) and presence."""
    add, mul, ident, boolean = RINGS[ring]
    pa = a != 0
    pb = b != 0 if b_sparse else np.ones(b.shape, bool)
    present = pa[:, :, None] & pb[None, :, :]
    with np.errstate(invalid="ignore"):
        terms = np.where(present, mul(a[:, :, None], b[None, :, :]).astype(float), ident)
    out = add.reduce(terms, axis=1).astype(float)
    if boolean:
        out = (out != 0).astype(float)
    return out, present.any(axis=1)


def run(k: sparsec.Kernel, **inputs: object) -> np.ndarray:
    out = k(**inputs)
    return np.asarray(out.to_dense() if hasattr(out, "to_dense") else out, dtype=float)


def tensor(a: np.ndarray, fmt: str, dtype: str, index: str) -> sparsec.Tensor:
    return sparsec.Tensor.from_dense(a.astype(dtype), fmt, index_dtype=index)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fmt", ["csr", "csc", "coo"])
@pytest.mark.parametrize("ring", list(RINGS))
def test_spmv_every_semiring(ring: str, fmt: str, target: str) -> None:
    boolean = RINGS[ring][3]
    a, x = matrix(7, 6, 1, boolean), vector(6, 2, boolean)
    k = sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": fmt}, semiring=ring, target=target)
    got = run(k, A=tensor(a, fmt, "float64", "int32"), x=x)
    want = ref_mv(ring, a, x)
    np.testing.assert_array_equal(got, want)
    if not boolean:
        assert got[1] == RINGS[ring][2]  # the empty row holds the add's identity
    k.check(A=tensor(a, fmt, "float64", "int32"), x=x)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(("dtype", "index"), [("float32", "int64"), ("float64", "int32")])
@pytest.mark.parametrize("threads", [1, 2])
def test_bellman_ford_relaxation(target: str, dtype: str, index: str, threads: int) -> None:
    """d2(i) = min(d(i), min_j A(j,i) + d(j)): one Bellman-Ford step keeping the old distance."""
    a = matrix(8, 8, 3)
    d = np.full(8, np.inf)
    d[0] = 0.0
    # csr on the GPU (a push along rows of A(j,i)) has no mapping under plus_times either
    fmt = "csr" if target == "c" else "csc"
    k = sparsec.kernel(
        "d2(i) = A(j,i) * d(j) + d(i)", {"A": fmt}, semiring="min_plus", target=target
    )
    want = np.minimum(d, ref_mv("min_plus", a.T, d))
    for _ in range(3):
        got = k(A=tensor(a, fmt, dtype, index), d=d.astype(dtype), threads=threads)
        np.testing.assert_allclose(np.asarray(got, dtype=float), want, rtol=1e-6)
        d = np.asarray(got, dtype=float)
        want = np.minimum(d, ref_mv("min_plus", a.T, d))


@pytest.mark.parametrize("target", TARGETS)
def test_bfs_step_or_and(target: str) -> None:
    a = matrix(9, 9, 4, boolean=True)
    f = np.zeros(9)
    f[[0, 3]] = 1.0
    k = sparsec.kernel("f2(i) = A(j,i) * f(j)", {"A": "csr"}, semiring="or_and", target=target)
    got = run(k, A=tensor(a, "csr", "float32", "int32"), f=f.astype("float32"))
    want = ((a.T != 0) & (f[None, :] != 0)).any(axis=1).astype(float)
    np.testing.assert_array_equal(got, want)
    assert set(np.unique(got)) <= {0.0, 1.0}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("ring", ["min_plus", "max_times", "max_plus"])
def test_spmm_dense_output(ring: str, target: str) -> None:
    a, b = matrix(6, 5, 5), matrix(5, 4, 6) + 1.0
    k = sparsec.kernel("C(i,j) = A(i,k) * B(k,j)", {"A": "csr"}, semiring=ring, target=target)
    got = run(k, A=tensor(a, "csr", "float64", "int64"), B=b)
    want, _ = ref_mm(ring, a, b, b_sparse=False)
    np.testing.assert_array_equal(got, want)
    assert np.all(got[1] == RINGS[ring][2])  # an empty row of A


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("ring", ["min_times", "or_and"])
def test_spgemm_dense_output(ring: str, target: str) -> None:
    boolean = RINGS[ring][3]
    a, b = matrix(6, 5, 12, boolean), matrix(5, 7, 13, boolean)
    k = sparsec.kernel(
        "C(i,j) = A(i,k) * B(k,j)", {"A": "csr", "B": "csr"}, semiring=ring, target=target
    )
    got = run(k, A=tensor(a, "csr", "float32", "int64"), B=tensor(b, "csr", "float32", "int64"))
    want, _ = ref_mm(ring, a, b, b_sparse=True)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("ring", ["min_plus", "max_times", "or_and"])
def test_spgemm_into_csr(ring: str, target: str) -> None:
    """min_plus "square": 2-hop shortest paths, into a CSR output keeping the pattern."""
    boolean = RINGS[ring][3]
    a = matrix(7, 7, 7, boolean)
    k = sparsec.kernel(
        "C(i,j) = A(i,k) * B(k,j)",
        {"A": "csr", "B": "csr", "C": "csr"},
        semiring=ring,
        target=target,
    )
    out = k(A=tensor(a, "csr", "float64", "int32"), B=tensor(a, "csr", "float64", "int32"))
    want, present = ref_mm(ring, a, a, b_sparse=True)
    stored = np.zeros(a.shape, bool)
    coords = out.coords()[0]
    stored[tuple(coords)] = True
    np.testing.assert_array_equal(stored, present)
    np.testing.assert_array_equal(out.to_dense()[present], want[present])
    k.check(A=tensor(a, "csr", "float64", "int32"), B=tensor(a, "csr", "float64", "int32"))


def test_sparse_add_is_the_monoid() -> None:
    """C(i,j) = A(i,j) + B(i,j) under min_plus: the union, min where both are stored."""
    a, b = matrix(6, 5, 8), matrix(6, 5, 9)
    k = sparsec.kernel(
        "C(i,j) = A(i,j) + B(i,j)",
        {"A": "csr", "B": "csr", "C": "csr"},
        semiring="min_plus",
        target="c",
    )
    out = k(A=tensor(a, "csr", "float64", "int32"), B=tensor(b, "csr", "float64", "int32"))
    want = np.where(a != 0, a, np.inf)
    want = np.minimum(want, np.where(b != 0, b, np.inf))
    present = (a != 0) | (b != 0)
    np.testing.assert_array_equal(out.to_dense()[present], want[present])


@pytest.mark.parametrize("threads", [1, 2])
def test_parallel_schedules(threads: int) -> None:
    """A csc SpMV (columns scatter into shared rows: atomics) and a scalar reduction under
    max_plus, with 1 and 2 threads; a `parallelize` with Atomics on the C target."""
    a, x = matrix(40, 30, 10), vector(30, 11)
    k = sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": "csc"}, semiring="max_plus")
    np.testing.assert_array_equal(
        run(k, A=tensor(a, "csc", "float64", "int32"), x=x, threads=threads),
        ref_mv("max_plus", a, x),
    )
    s = sparsec.kernel("s = A(i,j) * x(j)", {"A": "csr"}, semiring="min_times")
    got = float(np.asarray(s(A=tensor(a, "csr", "float64", "int32"), x=x + 1, threads=threads)))
    assert got == np.min(np.where(a != 0, a * (x + 1)[None, :], np.inf))


def test_refusals() -> None:
    for expr in ("y(i) = A(i,j) * x(j) - x(i)", "y(i) = A(i,j) / x(j)", "y(i) = -A(i,j) * x(j)"):
        with pytest.raises(SparsecError, match="no meaning under semiring='min_plus'"):
            sparsec.kernel(expr, {"A": "csr"}, semiring="min_plus")
    with pytest.raises(SparsecError, match="unknown semiring"):
        sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": "csr"}, semiring="min_max")


def test_default_code_unchanged() -> None:
    """plus_times generates exactly the code of a kernel built without the option."""
    spec = ("y(i) = A(i,j) * x(j) + x(i)", {"A": "csc"})
    assert sparsec.kernel(*spec, semiring="plus_times").source == sparsec.kernel(*spec).source


@pytest.mark.parametrize(
    "schedule",
    [
        "parallelize(j,CPUThread,Atomics)",
        "fuse(i,j,f), pos(f,fp,A), split(fp,c,fp2,8), parallelize(c,CPUThread,Atomics)",
        "fuse(i,j,f), pos(f,fp,A), split(fp,c,fp2,8), parallelize(c,CPUThread,Temporary)",
    ],
)
def test_user_schedules_with_races(schedule: str) -> None:
    """Schedules whose threads share output elements: atomics (a critical section for a
    min, OpenMP having no atomic min) and private copies, with 2 threads."""
    fmt = "csc" if schedule.startswith("parallelize(j") else "csr"
    a, x = matrix(40, 30, 14), vector(30, 15)
    k = sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": fmt}, semiring="min_plus", schedule=schedule)
    got = run(k, A=tensor(a, fmt, "float32", "int32"), x=x.astype("float32"), threads=2)
    np.testing.assert_array_equal(got, ref_mv("min_plus", a, x))
    if "Atomics" in schedule:
        assert "omp critical" in k.source


@pytest.mark.parametrize("ring", ["min_plus", "or_and"])
def test_sequence_spmm_plus_bias(ring: str) -> None:
    """Y(i,j) = A(i,k) * B(k,j) + D(i,j) with B csr: the sum under '+' lowered as a
    sequence (the output started from D, then the contraction added with the semiring's add)."""
    boolean = RINGS[ring][3]
    a, b, d = matrix(6, 5, 16, boolean), matrix(5, 4, 17, boolean), matrix(6, 4, 18, boolean)
    k = sparsec.kernel("Y(i,j) = A(i,k) * B(k,j) + D(i,j)", {"A": "csr", "B": "csr"}, semiring=ring)
    got = run(
        k, A=tensor(a, "csr", "float64", "int32"), B=tensor(b, "csr", "float64", "int32"), D=d
    )
    mm, _ = ref_mm(ring, a, b, b_sparse=True)
    add = RINGS[ring][0]
    want = add(mm, d).astype(float)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("target", TARGETS)
def test_accumulate_combines_with_current(target: str) -> None:
    """y(i) += A(i,j) * x(j) under max_plus: max of the current value and the row's max."""
    a, x = matrix(7, 6, 19), vector(6, 20)
    y0 = np.arange(7, dtype=float)
    k = sparsec.kernel("y(i) += A(i,j) * x(j)", {"A": "csr"}, semiring="max_plus", target=target)
    got = run(k, A=tensor(a, "csr", "float64", "int32"), x=x, y=y0)
    np.testing.assert_array_equal(got, np.maximum(y0, ref_mv("max_plus", a, x)))


@pytest.mark.parametrize("ring", ["min_plus", "max_times", "or_and"])
def test_warp_reduction_on_gpu(ring: str) -> None:
    """A GPU schedule whose warps reduce a row with shuffles combines the lanes with the
    semiring's add (lane 0 stores the warp's value)."""
    schedule = (
        "split(i,i0,i1,8), split(i1,w,l,1), pos(j,jp,A), split(jp,jp0,lane,32), "
        "parallelize(i0,GPUBlock,NoRaces), parallelize(w,GPUWarp,NoRaces), "
        "parallelize(lane,GPUThread,ParallelReduction)"
    )
    boolean = RINGS[ring][3]
    a, x = matrix(20, 70, 21, boolean), vector(70, 22, boolean)
    a[3, :] = 1.0  # a row longer than a warp
    k = sparsec.kernel(
        "y(i) = A(i,j) * x(j)",
        {"A": "csr"},
        target="cuda-emulated",
        schedule=schedule,
        semiring=ring,
    )
    assert f"sc_warp_{RINGS_ADD[ring]}(" in k.source.split("sparsec_kernel(")[-1]
    got = run(k, A=tensor(a, "csr", "float64", "int32"), x=x)
    np.testing.assert_array_equal(got, ref_mv(ring, a, x))


@pytest.mark.skipif(
    nvrtc.nvrtc() is None and shutil.which("nvcc") is None,
    reason="neither NVRTC (pip install nvidia-cuda-nvrtc-cu12) nor nvcc is available",
)
@pytest.mark.parametrize("ring", ["min_plus", "max_times", "or_and"])
@pytest.mark.parametrize("fmt", ["csr", "csc"])
def test_cuda_source_compiles(ring: str, fmt: str) -> None:
    """The real CUDA compiler takes the semiring source (csc: the compare-and-swap
    updates; csr: one thread per row), float32 and float64."""
    for dtype in ("float64", "float32"):
        k = sparsec.kernel(
            "y(i) = A(i,j) * x(j)", {"A": fmt}, semiring=ring, target="cuda", dtype=dtype
        )
        assert [r.arch for r in k.verify()] == ["sm_80", "sm_90"]
        assert ("sc_atomic_" in k.source.split("sparsec_kernel(")[-1]) == (fmt == "csc")


@pytest.mark.parametrize("out", ["dense", "csr"])
@pytest.mark.parametrize("ring", ["min_plus", "max_times", "or_and"])
@pytest.mark.parametrize("target", TARGETS)
def test_sum_of_many_sparse_operands(ring: str, target: str, out: str) -> None:
    """A sum of 5 sparse terms (one scaled by a dense vector) co-iterated as a flagged
    union: an absent term is the add's identity, and the code stays linear in the terms."""
    boolean = RINGS[ring][3]
    add, mul, ident, _ = RINGS[ring]
    ms = [matrix(6, 7, 40 + n, boolean) for n in range(5)]
    x = vector(7, 50, boolean) + (0.0 if boolean else 1.0)
    names = "ABDEF"
    expr = "C(i,j) = A(i,j) * x(j) + " + " + ".join(f"{n}(i,j)" for n in names[1:])
    formats = {**{n: "csr" for n in names}, "C": out}
    k = sparsec.kernel(expr, formats, semiring=ring, target=target)
    assert len(k.source) < 40_000  # one case body, not 2^5 lattice points
    got = run(
        k, **{n: tensor(m, "csr", "float64", "int32") for n, m in zip(names, ms, strict=True)}, x=x
    )
    terms = [np.where(ms[0] != 0, mul(ms[0], x[None, :]).astype(float), ident)]
    terms += [np.where(m != 0, m, ident) for m in ms[1:]]
    want = add.reduce(np.array(terms), axis=0).astype(float)
    if boolean:
        want = (want != 0).astype(float)
    present = np.any([m != 0 for m in ms], axis=0)
    np.testing.assert_array_equal(got[present], want[present])
    if out == "dense":
        np.testing.assert_array_equal(got[~present], np.full((~present).sum(), ident))
    else:
        np.testing.assert_array_equal(got[~present], 0.0)


@pytest.mark.parametrize("fmt", ["ddq", "ddp", "dq"])
def test_padded_singletons_are_refused_under_a_semiring(fmt: str) -> None:
    """ELL's singleton pads each row with stored zeros at coordinate 0: under min_plus
    they would be candidates of the min (0 + x(0)), so such formats are refused with a
    fix, while plus_times (where a padded 0 adds nothing) still takes them."""
    order = len(fmt)
    idx = "ijk"[:order]
    expr = f"y(i) = A({','.join(idx)}) * x({idx[-1]})"
    with pytest.raises(SparsecError, match="pads rows with stored zeros"):
        sparsec.kernel(expr, {"A": fmt}, semiring="min_plus")
    sparsec.kernel(expr, {"A": fmt})


def test_a_workspace_is_filled_with_the_identity_only_where_it_was_allocated() -> None:
    """The identity fill of a calloc'd workspace came before the allocation's NULL check
    (an out-of-memory wrote through NULL instead of returning the status): it is guarded."""
    import re

    k = sparsec.kernel(
        "C(i,j) = A(i,k) * B(k,j)", {"A": "csr", "B": "csr", "C": "csr"}, semiring="min_plus"
    )
    fills = re.findall(r"(.*)\n\s*for \(int64_t (\w+)_q = 0", k.source)
    assert fills, k.source
    for before, name in fills:
        assert before.strip() == f"if ({name}) {{", (before, name)
