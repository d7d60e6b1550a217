"""sparsec.distributed on a 2-worker Dask LocalCluster (processes, so every part, kernel and
result crosses a pickle): parts, the planner's four classes over formats, dtypes and part
counts, files read on the workers, faults. Every result is compared with dense torch/numpy."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest
import scipy.sparse as sp

distributed = pytest.importorskip(
    "distributed", reason="sparsec.distributed needs dask[distributed] (the 'distributed' extra)"
)

import sparsec  # noqa: E402
import sparsec.distributed as sd  # noqa: E402
from sparsec.distributed import split  # noqa: E402

PARTS = (1, 2, 3, 7)
#: (value dtype, index dtype): every pair once across the four part counts
DTYPES = (("float64", "int32"), ("float32", "int64"), ("float32", "int32"), ("float64", "int64"))


@pytest.fixture(scope="module")
def client():
    cluster = distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    )
    with distributed.Client(cluster) as c:
        yield c
    cluster.close()


def _matrix(m: int, n: int, seed: int, heavy: bool = False) -> sp.csr_matrix:
    """Integer values (sums are exact in any order), stored zeros, an empty row and column;
    ``heavy``: row 5 is full and the others sparser, so it holds more than a third of them."""
    rng = np.random.default_rng(seed)
    dense = np.where(
        rng.random((m, n)) < (0.03 if heavy else 0.15), rng.integers(-3, 4, (m, n)), 0
    ).astype(float)
    dense[2] = 0.0
    dense[:, 1] = 0.0
    if heavy:
        dense[5] = rng.integers(1, 4, n)
    A = sp.csr_matrix(dense)
    A.data[::7] = 0.0  # stored zeros
    return A


def _tensor3(shape: tuple[int, int, int], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    arr = np.where(rng.random(shape) < 0.1, rng.integers(-3, 4, shape), 0).astype(float)
    arr[1] = 0.0
    return arr


# ----------------------------------------------------------------- parts


def test_cuts_balance_and_split_heavy_slices() -> None:
    keys = np.repeat(np.arange(6), [1, 1, 20, 1, 1, 1])
    found = split.cuts(keys, 8, 3)
    assert [(c.lo, c.hi) for c in found][0][0] == 0 and found[-1].hi == 8
    assert sum(c.nnz for c in found) == len(keys)
    assert max(c.nnz for c in found) <= 10  # slice 2 (20 of 25 entries) is split by position
    assert any(a.hi > b.lo for a, b in zip(found, found[1:], strict=False))
    whole = split.cuts(keys, 8, 3, split_heavy=False)
    assert all(a.hi <= b.lo for a, b in zip(whole, whole[1:], strict=False))
    assert split.cuts(np.zeros(0, np.int64), 2, 7) == [split.Cut(0, 0, 0, 2)]  # nothing to cut


@pytest.mark.parametrize("fmt", ["csr", "csc", "dcsr", "coo", "csf"])
def test_parts_round_trip(client, fmt: str) -> None:
    src = sparsec.Tensor.from_dense(_tensor3((9, 5, 4), 1), "csf") if fmt == "csf" else None
    for P, (dt, it) in zip(PARTS, DTYPES, strict=True):
        A = _matrix(17, 11, P, heavy=True)
        value = src if src is not None else A
        d = sd.from_tensor(value, P, client=client, format=fmt, dtype=dt, index_dtype=it)
        want = src.to_dense() if src is not None else A.toarray()
        assert d.dtype == np.dtype(dt) and d.index_dtype == np.dtype(it)
        assert sum(d.part_nnz) == d.nnz and d.parts <= P
        assert d.bounds[0][0] == 0 and d.bounds[-1][1] == d.shape[d.mode]
        np.testing.assert_array_equal(d.persist().to_dense(), want)
        back = d.to_tensor()
        assert back.format == d.format and back.dtype == np.dtype(dt)
        back.validate()


def test_heavy_row_is_split_by_position(client) -> None:
    A = _matrix(30, 40, 3, heavy=True)
    d = sd.from_scipy(A, 3, client=client)
    assert d.overlapping and d.imbalance < 1.2
    whole = sd.from_scipy(A, 3, client=client, split_heavy=False)
    assert not whole.overlapping and whole.imbalance > d.imbalance
    x = np.arange(40.0) - 7
    spmv = sd.kernel("y(i) = A(i,j) * x(j)", {"A": "csr"})
    np.testing.assert_array_equal(spmv(A=d, x=x), A @ x)
    assert ("float64", "int32") in spmv.kernel._executables  # built on the driver first
    # a sum over rows cannot share a row between parts: the call cuts at whole rows first
    t = sd.kernel("y(j) = A(i,j) * x(i) + x(j)", {"A": "csr"})
    with pytest.raises(sparsec.SparsecError, match="enclose the whole right-hand side"):
        t(A=d, x=x[:30])
    add = sd.kernel("y(i) = A(i,j) * x(j) + z(i)", {"A": "csr"})
    z = np.ones(30)
    np.testing.assert_array_equal(add(A=d, x=x, z=z), A @ x + z)


def test_save_open_and_dask_array(client, tmp_path) -> None:
    A = _matrix(23, 13, 4)
    d = sd.from_scipy(A, 3, client=client, dtype="float32", index_dtype="int64")
    d.save(tmp_path / "A")
    opened = sd.open(tmp_path / "A", client=client)
    assert opened.origin == "files" and opened.bounds == d.bounds and opened.part_nnz == d.part_nnz
    assert opened.dtype == np.float32 and opened.index_dtype == np.int64
    np.testing.assert_array_equal(opened.to_dense(), A.toarray())
    with pytest.raises(sparsec.InputError, match="not a partition directory"):
        sd.open(tmp_path, client=client)
    da = pytest.importorskip("dask.array")
    arr = da.from_array(A.toarray(), chunks=(8, 7)).map_blocks(sp.csr_matrix)
    fromda = sd.from_dask_array(arr, client=client)
    assert fromda.parts == 3 and fromda.origin == "dask-array"
    np.testing.assert_array_equal(fromda.to_scipy().toarray(), A.toarray())
    x = np.arange(13.0)
    np.testing.assert_array_equal(
        sd.kernel("y(i) = A(i,j) * x(j)", {"A": "csr"})(A=fromda, x=x), A @ x
    )


# ----------------------------------------------------------------- the planner's classes

M, N, K = 19, 13, 6
X_MAT = np.arange(N * K, dtype=float).reshape(N, K) % 5 - 2


def _inputs(case: str, P: int) -> dict:
    A = _matrix(M, N, 10 + P)
    B = _matrix(N, 11, 20 + P)
    T = _tensor3((M, 7, 5), 30 + P)
    rng = np.random.default_rng(P)
    return {
        "A": A,
        "B": B,
        "T": T,
        "x": rng.integers(-2, 3, N).astype(float),
        "xi": rng.integers(-2, 3, M).astype(float),
        "X": X_MAT,
        "D": rng.integers(-2, 3, (5, 4)).astype(float),
        "C": rng.integers(-2, 3, (7, 4)).astype(float),
        "CI": rng.integers(-2, 3, (M, 4)).astype(float),
        "E": rng.integers(-2, 3, (M, 3)).astype(float),
        "F": rng.integers(-2, 3, (3, N)).astype(float),
    }


#: name -> (expression, formats, the distributed operand and how its inputs are named, class)
CASES = {
    "spmv-csr": (
        "y(i) = A(i,j) * x(j)",
        {"A": "csr"},
        lambda v: {"A": v["A"], "x": v["x"]},
        "concatenate",
    ),
    "spmm-dcsr": (
        "Y(i,k) = A(i,j) * X(j,k)",
        {"A": "dcsr"},
        lambda v: {"A": v["A"], "X": v["X"]},
        "concatenate",
    ),
    "spmv-coo": (
        "y(i) = A(i,j) * x(j)",
        {"A": "coo"},
        lambda v: {"A": v["A"], "x": v["x"]},
        "concatenate",
    ),
    "sddmm-csr": (
        "S(i,j) = A(i,j) * E(i,k) * F(k,j)",
        {"A": "csr", "S": "csr"},
        lambda v: {"A": v["A"], "E": v["E"], "F": v["F"]},
        "concatenate",
    ),
    "mttkrp1-csf": (
        "Y(i,j) = T(i,k,l) * D(l,j) * C(k,j)",
        {"T": "csf"},
        lambda v: {"T": v["T"], "D": v["D"], "C": v["C"]},
        "concatenate",
    ),
    "spgemm-csr": (
        "Z(i,j) = A(i,k) * B(k,j)",
        {"A": "csr", "B": "csr", "Z": "csr"},
        lambda v: {"A": v["A"], "B": v["B"]},
        "concatenate",
    ),
    "mix-csr-dcsr": (
        "y(i) = A(i,j) * G(i,j) * x(j)",
        {"A": "csr", "G": "dcsr"},
        lambda v: {"A": v["A"], "G": v["A"].T.T * 2, "x": v["x"]},
        "concatenate",
    ),
    "tspmv-csr": (
        "y(j) = A(i,j) * xi(i)",
        {"A": "csr"},
        lambda v: {"A": v["A"], "xi": v["xi"]},
        "reduce",
    ),
    "spmv-csc": (
        "y(i) = A(i,j) * x(j)",
        {"A": "csc"},
        lambda v: {"A": v["A"].tocsc(), "x": v["x"]},
        "reduce",
    ),
    "mttkrp2-csf": (
        "Y(k,j) = T(i,k,l) * D(l,j) * CI(i,j)",
        {"T": "csf"},
        lambda v: {"T": v["T"], "D": v["D"], "CI": v["CI"]},
        "reduce",
    ),
    "dot-coo": (
        "s = A(i,j) * W(i,j)",
        {"A": "coo"},
        lambda v: {"A": v["A"], "W": v["A"].toarray() + 1},
        "reduce",
    ),
    "spgemm-csc-sparse-partials": (
        "Z(i,j) = A(k,i) * B(k,j)",
        {"A": "csr", "B": "csr", "Z": "csr"},
        lambda v: {"A": v["A"], "B": _matrix(M, 11, 5)},
        "reduce",
    ),
    "mul-csc-into-csr": (
        "Z(i,j) = A(i,j) * G(i,j)",
        {"A": "csc", "G": "csr", "Z": "csr"},
        lambda v: {"A": v["A"].tocsc(), "G": v["A"] * 3},
        "repartition",
    ),
}


def _distribute(client, name, value, fmt, P, dt, it):
    if name == "T":
        value = sparsec.Tensor.from_dense(value, "csf")
    return sd.from_tensor(value, P, client=client, format=fmt, dtype=dt, index_dtype=it, name=name)


@pytest.mark.parametrize("case", sorted(CASES))
def test_planner_class_against_torch(client, case: str) -> None:
    expr, formats, make, kind = CASES[case]
    k = sd.kernel(expr, formats)
    first = next(iter(formats))
    for P, (dt, it) in itertools.product(PARTS, DTYPES):  # the whole cross product
        inputs = make(_inputs(case, P))
        inputs[first] = _distribute(client, first, inputs[first], formats[first], P, dt, it)
        plan = k.plan(**inputs)
        assert plan.kind == kind and plan.tensor == first and plan.parts == inputs[first].parts
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            result = k.check(**inputs)
        assert result.max_abs_error <= (1e-3 if dt == "float32" else 1e-9)
        moved = [w for w in seen if "repartitioning" in str(w.message)]
        assert bool(moved) == (kind == "repartition")


def test_replicate_small_sparse_large_dense(client) -> None:
    W = _matrix(9, N, 7)
    Xb = np.arange(N * 400, dtype=float).reshape(N, 400) % 7 - 3
    k = sd.kernel("Y(i,b) = W(i,j) * X(j,b)", {"W": "csr"})
    for P, (dt, it) in zip(PARTS, DTYPES, strict=True):
        w = sparsec.Tensor.from_scipy(W).astype(dt, index_dtype=it)
        plan = k.plan(W=w, X=Xb.astype(dt), parts=P)
        assert (plan.kind, plan.index, plan.tensor, plan.parts) == ("replicate", "b", "X", P)
        np.testing.assert_array_equal(k(W=w, X=Xb.astype(dt), parts=P), (W @ Xb).astype(dt))


def _worker_builds() -> list[str]:
    """On a worker: the first line of each library its part kernels built."""
    from sparsec.distributed import tasks

    return [
        e.loaded.generated.source.split("\n", 1)[0]
        for k in tasks._KERNELS.values()
        for e in k._executables.values()
    ]


def test_workers_build_the_driver_s_library(client) -> None:
    """A tiled kernel's parts run at the parts' extents (here X split along its columns):
    each worker builds with every register-tile stage, the library the driver built
    before the parts ran, not one for its own part's extent (`sparsec.passes.stages`)."""
    W = _matrix(9, N, 7)
    Xb = np.arange(N * 300, dtype=float).reshape(N, 300) % 7 - 3
    k = sd.kernel("Y(i,b) = W(i,j) * X(j,b)", {"W": "csr"})
    np.testing.assert_array_equal(k(W=sparsec.Tensor.from_scipy(W), X=Xb, parts=2), W @ Xb)
    firsts = [line for lines in client.run(_worker_builds).values() for line in lines]
    assert firsts and not any(line.startswith("#define SC_HINT_") for line in firsts)


def test_sparse_output_stays_distributed(client) -> None:
    A, B = _matrix(M, N, 1, heavy=True), _matrix(N, 11, 2)
    k = sd.kernel("Z(i,j) = A(i,k) * B(k,j)", {"A": "csr", "B": "csr", "Z": "csr"})
    dA = sd.from_scipy(A, 3, client=client, split_heavy=False)
    Z = k(A=dA, B=B, out="distributed")
    assert isinstance(Z, sd.DistributedTensor) and Z.bounds == dA.bounds
    np.testing.assert_array_equal(Z.to_dense(), (A @ B).toarray())
    overlapping = sd.from_scipy(A, 3, client=client)  # row 5 shared: joined by re-packing
    assert overlapping.overlapping
    np.testing.assert_array_equal(k(A=overlapping, B=B).to_dense(), (A @ B).toarray())


def test_refusals(client) -> None:
    k = sd.kernel("y(i) += A(i,j) * x(j)", {"A": "csr"})
    with pytest.raises(sparsec.SparsecError, match="write '='"):
        k(A=sd.from_scipy(_matrix(5, 4, 0), 2, client=client), x=np.ones(4), y=np.ones(5))
    k = sd.kernel("y(j) = A(i,j) * x(i)", {"A": "csr"}, semiring="min_plus")
    with pytest.raises(sparsec.SparsecError, match="min_plus"):
        k(A=sd.from_scipy(_matrix(5, 4, 0), 2, client=client), x=np.ones(5))
    k = sd.kernel("y(i) = A(i,j) * x(j)", {"A": "csr"})
    with pytest.raises(sparsec.InputError, match="out="):
        k(A=_matrix(5, 4, 0), x=np.ones(4), out="numpy")


def test_model_counts_bytes_and_imbalance() -> None:
    """sd.model on a pattern small enough to count by hand: needs no cluster."""
    A = sp.csr_matrix(np.diag(np.arange(1.0, 9.0)))  # 8 rows, one entry each, on the diagonal
    spmv = sd.kernel("y(i) = A(i,j) * x(j)", {"A": "csr"})
    m1, m4 = sd.model(spmv, A, parts=1), sd.model(spmv, A, parts=4)
    assert (m1.kind, m1.index, m4.parts, m4.imbalance, m4.max_part_nnz) == (
        "concatenate",
        "i",
        4,
        1.0,
        2,
    )
    assert m1.replicated_bytes == m1.needed_bytes == 8 * 8  # x: 8 float64, all needed
    assert m4.replicated_bytes == 4 * 64 and m4.needed_bytes == 64  # each part touches 2 of x
    assert m4.output_bytes == m1.output_bytes == 64  # disjoint slices of y
    t = sd.model(sd.kernel("y(j) = A(i,j) * x(i)", {"A": "csr"}), A, parts=4)
    assert t.kind == "reduce" and t.output_bytes == 4 * 64 and t.needed_bytes == 64
    spmm = sd.model(sd.kernel("Y(i,k) = A(i,j) * X(j,k)", {"A": "csr"}), A, parts=2, dims={"k": 3})
    assert spmm.replicated_bytes == 2 * 8 * 3 * 8 and spmm.needed_bytes == 8 * 3 * 8
    heavy = sp.csr_matrix(np.vstack([np.ones((1, 8)), np.eye(8)[:3]]))
    assert sd.model(spmv, heavy, parts=2).imbalance <= 1.1  # the full row is split


# ----------------------------------------------------------------- operands read at several indices


def _square(n: int, seed: int, heavy: bool = False) -> sp.csr_matrix:
    """An n x n integer matrix with stored zeros, an empty row and column (and a full row
    5 with ``heavy``, split by position between parts)."""
    return _matrix(n, n, seed, heavy)


def _min_plus_step(A: sp.csr_matrix, d: np.ndarray) -> np.ndarray:
    """d2(i) = min(d(i), min_j A(j,i) + d(j)) over A's stored entries (zeros included)."""
    coo = A.tocoo()
    out = d.copy()
    np.minimum.at(out, coo.col, coo.data + d[coo.row])
    return out


def test_dense_operand_read_at_the_split_index_and_another(client) -> None:
    """Issue 36 item 13: a tensor read both at the split index (cut per part) and at another
    index (whole) is two operands of the parts' kernel; the README's Bellman-Ford step and
    y = A x + x failed on every part with a ShapeError."""
    n = 23
    rng = np.random.default_rng(4)
    x = rng.integers(-3, 4, n).astype(float)
    E = rng.integers(-2, 3, (n, 3)).astype(float)
    sssp = sd.kernel("d2(i) = A(j,i) * d(j) + d(i)", {"A": "csc"}, semiring="min_plus")
    axpx = sd.kernel("y(i) = A(i,j) * x(j) + x(i)", {"A": "csr"})
    quad = sd.kernel("y(j) = A(i,j) * x(i) * x(j)", {"A": "csr"})
    sddmm = sd.kernel("S(i,j) = A(i,j) * E(i,k) * E(j,k)", {"A": "csr", "S": "csr"})
    twice = sd.kernel("y(i) = A(i,j) * A(j,i) * x(j)", {"A": "csr"})
    masked = sd.kernel("y(i) = A(i,j) * x(j) + x(i)", {"A": "csr", "M": "s"}, mask="M")
    keep = rng.random(n) < 0.5
    M = sparsec.Tensor.from_coo(np.flatnonzero(keep)[None], np.zeros(keep.sum()), (n,), "s")
    for P in (1, 2, 3):
        A = _square(n, 40 + P)
        d = np.abs(x) * 2
        want = _min_plus_step(A, d)
        np.testing.assert_array_equal(sssp(A=sd.from_scipy(A.tocsc(), P, client=client), d=d), want)
        np.testing.assert_array_equal(sssp(A=A.tocsc(), d=d, parts=P, client=client), want)
        dA = sd.from_scipy(A, P, client=client, split_heavy=False)
        np.testing.assert_array_equal(axpx(A=dA, x=x), A @ x + x)
        np.testing.assert_array_equal(quad(A=dA, x=x), (A.T @ x) * x)
        got = sddmm(A=dA, E=E).to_dense()
        np.testing.assert_array_equal(got, A.toarray() * (E @ E.T))
        np.testing.assert_array_equal(twice(A=dA, x=x), (A.toarray() * A.toarray().T) @ x)
        np.testing.assert_array_equal(masked(A=dA, x=x, M=M), np.where(keep, A @ x + x, 0))
        assert axpx.plan(A=dA, x=x).kind == "concatenate"


def test_a_tensor_read_twice_is_not_split_by_position(client) -> None:
    """Parts sharing a heavy row are exact only for a tensor read once, as a bare factor:
    y(i) = (A x)(i) * (A z)(i) squares a sum, so the row is cut whole first."""
    A = _square(30, 3, heavy=True)
    d = sd.from_scipy(A, 3, client=client)
    assert d.overlapping
    x = np.arange(30.0) % 5 - 2
    z = np.arange(30.0) % 3 - 1
    k = sd.kernel("y(i) = A(i,j) * x(j) * A(i,k) * z(k)", {"A": "csr"})
    np.testing.assert_array_equal(k(A=d, x=x, z=z), (A @ x) * (A @ z))


def test_driver_data_is_cut_along_the_sparse_output_s_outer_index(client) -> None:
    """Driver data whose format's first mode is not the sparse output's outermost index is
    cut along that index in the first place (it reached the distributed tensors'
    repartition and failed there with a bare AssertionError)."""
    A = _matrix(14, 14, 6)
    x = np.arange(14.0) % 4 - 1
    k = sd.kernel("Z(i,j) = A(i,j) * x(i)", {"A": "csc", "Z": "csr"})
    assert k.plan(A=A.tocsc(), x=x, parts=3, client=client).kind == "concatenate"
    got = k(A=A.tocsc(), x=x, parts=3, client=client)
    np.testing.assert_array_equal(got.to_dense(), A.toarray() * x[:, None])


def test_kernel_with_folded_dense_factors_runs_on_the_workers(client) -> None:
    """x(j) * z(j) * A(j,i) reads one folded factor computed per call (`middle.regroup`):
    the kernel's formats named that factor, so its pickled arguments (what a worker
    rebuilds the kernel from) did not make a kernel (found by the distributed fuzz)."""
    import pickle

    expr = "Z(i,j) = x(j) * z(j) * A(j,i) + B(i,j)"
    formats = {"A": "csc", "B": "csr", "Z": "csr"}
    assert pickle.loads(pickle.dumps(sparsec.kernel(expr, formats))).formats.keys() == {
        "Z",
        "A",
        "B",
        "x",
        "z",
    }
    A, B = _matrix(11, 11, 8), _matrix(11, 11, 9)
    x, z = np.arange(11.0) % 3 - 1, np.arange(11.0) % 4
    got = sd.kernel(expr, formats)(A=A.tocsc(), B=B, x=x, z=z, parts=2, client=client)
    np.testing.assert_array_equal(got.to_dense(), (A.toarray() * (x * z)[:, None]).T + B.toarray())


def test_call_mistakes_are_found_on_the_driver(client, tmp_path) -> None:
    """Issue 36 item 16: shapes, names and part counts are checked before anything is
    sent, as a ShapeError or InputError of the driver, not one per part after Dask's log."""
    A = _matrix(12, 9, 2)
    dA = sd.from_scipy(A, 2, client=client)
    k = sd.kernel("y(i) = A(i,j) * x(j) + x(i)", {"A": "csr"})
    with pytest.raises(sparsec.ShapeError, match=r"index j has extent 9 .* but 12 in x"):
        k(A=dA, x=np.ones(12))
    spmv = sd.kernel("y(i) = A(i,j) * x(j)", {"A": "csr"})
    with pytest.raises(sparsec.ShapeError, match="extent 9 in A .* but 8 in x"):
        spmv(A=dA, x=np.ones(8))
    with pytest.raises(sparsec.ShapeError, match=r"x\(j\) reads x at 1 index"):
        spmv(A=dA, x=np.ones((9, 2)))
    with pytest.raises(sparsec.ShapeError, match="but 8 in x"):
        spmv.plan(A=dA, x=np.ones(8))
    with pytest.raises(sparsec.InputError, match="missing input 'x'"):
        spmv(A=dA)
    with pytest.raises(sparsec.InputError, match="unexpected input 'z'"):
        spmv(A=dA, x=np.ones(9), z=np.ones(9))
    for bad in (0, -1, 1.5, True):
        with pytest.raises(sparsec.InputError, match="at least 1"):
            sd.from_scipy(A, parts=bad, client=client)
        with pytest.raises(sparsec.InputError, match="at least 1"):
            spmv(A=A, x=np.ones(9), parts=bad, client=client)
        with pytest.raises(sparsec.InputError, match="at least 1"):
            dA.repartition(parts=bad)
        with pytest.raises(sparsec.InputError, match="at least 1"):
            sd.model(spmv, A, parts=bad)
    with pytest.raises(sparsec.InputError, match="cannot read .*missing.mtx"):
        sd.read_mtx(tmp_path / "missing.mtx", client=client)
    with pytest.raises(sparsec.InputError, match="cannot read .*missing.tns"):
        sd.read_tns(tmp_path / "missing.tns", client=client)


# ----------------------------------------------------------------- files read on the workers


def test_read_mtx_on_workers(client, tmp_path) -> None:
    import scipy.io

    A = _matrix(31, 17, 8, heavy=True)
    A.eliminate_zeros()
    scipy.io.mmwrite(tmp_path / "a.mtx", A)
    S = A[:17, :17] + A[:17, :17].T
    scipy.io.mmwrite(tmp_path / "s.mtx", S.tocoo(), symmetry="symmetric")
    x = np.arange(17.0) - 4
    spmv = sd.kernel("y(i) = A(i,j) * x(j)", {"A": "csr"})
    for P, chunk in ((1, None), (3, 40), (7, 97)):  # small chunks cut lines everywhere
        d = sd.read_mtx(tmp_path / "a.mtx", P, client=client, chunk_bytes=chunk)
        assert d.origin == "files" and d.nnz == A.nnz and d.parts <= P
        assert sum(d.part_nnz) == A.nnz
        np.testing.assert_array_equal(d.to_dense(), A.toarray())
        np.testing.assert_array_equal(spmv(A=d, x=x), A @ x)
        s = sd.read_mtx(tmp_path / "s.mtx", P, client=client, chunk_bytes=chunk, dtype="float32")
        assert s.dtype == np.float32
        np.testing.assert_array_equal(s.to_dense(), S.toarray())
    c = sd.read_mtx(tmp_path / "a.mtx", 2, client=client, format="csc", index_dtype="int64")
    assert c.mode == 1 and c.index_dtype == np.int64
    np.testing.assert_array_equal(c.to_dense(), A.toarray())
    (tmp_path / "bad.mtx").write_text("%%MatrixMarket matrix array real general\n2 2\n1\n2\n3\n4\n")
    with pytest.raises(sparsec.InputError, match="coordinate"):
        sd.read_mtx(tmp_path / "bad.mtx", client=client)
    (tmp_path / "out.mtx").write_text(
        "%%MatrixMarket matrix coordinate real general\n2 2 2\n1 1 1.0\n3 1 2.0\n"
    )
    with pytest.raises(sparsec.SparsecError, match="outside the shape"):
        sd.read_mtx(tmp_path / "out.mtx", client=client)


def test_read_mtx_splits_a_heavy_row_by_position(client, tmp_path) -> None:
    """A file's row heavier than nnz/P is shared by two parts as from driver data, each of
    its entries in exactly one part (file order within the row), whatever ranges the file
    was parsed in; the shared row's sums are joined right."""
    import scipy.io

    A = _matrix(30, 40, 3, heavy=True)
    A.eliminate_zeros()
    scipy.io.mmwrite(tmp_path / "h.mtx", A)
    driver = sd.from_scipy(A, 3, client=client)
    x = np.arange(40.0) - 7
    spmv = sd.kernel("y(i) = A(i,j) * x(j)", {"A": "csr"})
    for chunk in (None, 53, 211):
        d = sd.read_mtx(tmp_path / "h.mtx", 3, client=client, chunk_bytes=chunk)
        assert d.overlapping and d.imbalance < 1.2
        assert d.part_nnz == driver.part_nnz and sum(d.part_nnz) == A.nnz
        np.testing.assert_array_equal(d.to_dense(), A.toarray())
        np.testing.assert_array_equal(spmv(A=d, x=x), A @ x)


def test_read_tns_on_workers(client, tmp_path) -> None:
    T = _tensor3((11, 6, 5), 9)
    coords = np.argwhere(T != 0)
    lines = ["# a FROSTT tensor"] + [
        f"{i + 1} {j + 1} {k + 1} {T[i, j, k]:g}" for i, j, k in coords
    ]
    (tmp_path / "t.tns").write_text("\n".join(lines) + "\n")
    D = np.arange(20.0).reshape(5, 4) % 3
    C = np.arange(24.0).reshape(6, 4) % 4
    mttkrp = sd.kernel("Y(i,j) = T(i,k,l) * D(l,j) * C(k,j)", {"T": "csf"})
    for P, chunk in ((2, 50), (3, None)):
        d = sd.read_tns(tmp_path / "t.tns", P, shape=T.shape, client=client, chunk_bytes=chunk)
        np.testing.assert_array_equal(d.to_dense(), T)
        np.testing.assert_array_equal(mttkrp(T=d, D=D, C=C), np.einsum("ikl,lj,kj->ij", T, D, C))
    guessed = sd.read_tns(tmp_path / "t.tns", 2, client=client)
    assert guessed.shape == tuple(int(n) + 1 for n in coords.max(axis=0))


# ----------------------------------------------------------------- faults (last: they kill workers)


def _holder(client, future) -> str:
    """The address of a worker holding ``future``'s data."""
    return next(iter(client.who_has([future])[future.key]))


def _file_loaded(client, path, m: int, n: int, seed: int):
    """A random m x n matrix written to ``path`` as Matrix Market and read on the workers in
    4 parts (persisted): (the scipy matrix, the distributed tensor)."""
    import scipy.io

    A = _matrix(m, n, seed)
    A.eliminate_zeros()
    scipy.io.mmwrite(path, A)
    return A, sd.read_mtx(path, 4, client=client).persist()


#: how long a killed worker's nanny may take to start a fresh one: the new process imports
#: numpy, scipy, dask and sparsec, which took over 60 s on a 2-core machine at load 14
RESTART_S = 300


def _kill_holder(client, future) -> None:
    """SIGKILL the worker process holding ``future`` (its nanny starts a fresh one)."""
    import os
    import signal

    addr = _holder(client, future)
    pid = client.run(os.getpid, workers=[addr])[addr]
    os.kill(pid, signal.SIGKILL)


def test_killed_worker_file_loaded_spmv_is_still_right(client, tmp_path) -> None:
    """The worker holding a part of a file-loaded matrix is killed just before the call (the
    scheduler has not noticed yet): Dask redoes the lost parts from the file, the call sends
    its operands again, and the answer is right."""
    A, d = _file_loaded(client, tmp_path / "a.mtx", 60, 30, 11)
    x = np.arange(30.0) - 9
    k = sd.kernel("y(i) = A(i,j) * x(j)", {"A": "csr"})
    _kill_holder(client, d.futures[0])
    np.testing.assert_array_equal(k(A=d, x=x), A @ x)
    client.wait_for_workers(2, timeout=RESTART_S)
    np.testing.assert_array_equal(k(A=d, x=x), A @ x)


def _die_once_in_run_part(token: str) -> None:
    """On a worker: make this process's `tasks.run_part` (the function object itself, which
    the worker's cache of unpickled functions also holds) SIGKILL its own process when a part
    of a call runs on it, if no process has yet created the file ``token``; otherwise it runs
    the real `run_part`. Patched on every worker, exactly one dies: the first to run a part."""
    import types

    from sparsec.distributed import tasks

    fn = tasks.run_part
    tasks._sc_test_saved = (fn.__code__, types.FunctionType(fn.__code__, fn.__globals__))
    tasks._sc_test_token = token

    def killer(args, label, names, threads, *values):  # noqa: ANN001, ANN202
        import os
        import signal

        from sparsec.distributed import tasks

        try:
            os.close(os.open(tasks._sc_test_token, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return tasks._sc_test_saved[1](args, label, names, threads, *values)
        os.kill(os.getpid(), signal.SIGKILL)

    fn.__code__ = killer.__code__


def _restore_run_part() -> None:
    """On a worker: undo `_die_once_in_run_part` (a worker started after the kill has none)."""
    from sparsec.distributed import tasks

    saved = getattr(tasks, "_sc_test_saved", None)
    if saved is not None:
        tasks.run_part.__code__ = saved[0]
        del tasks._sc_test_saved


def test_worker_killed_during_a_file_loaded_spmv_call(client, tmp_path) -> None:
    """A worker holding parts of a file-loaded matrix dies while the call's parts run on it
    (the first part task to start kills its process): Dask reruns the lost file-reading tasks
    and the parts on the surviving or restarted worker, and the call returns the right answer.
    Which worker runs a part first is Dask's choice, so every worker is armed and a token file
    lets exactly one of them die."""
    client.wait_for_workers(2, timeout=RESTART_S)
    A, d = _file_loaded(client, tmp_path / "b.mtx", 80, 40, 13)
    x = np.arange(40.0) - 11
    k = sd.kernel("y(i) = A(i,j) * x(j)", {"A": "csr"})
    np.testing.assert_array_equal(k(A=d, x=x), A @ x)  # compiled, every worker warm
    before = set(client.scheduler_info()["workers"])
    token = tmp_path / "died"
    client.run(_die_once_in_run_part, str(token))
    try:
        np.testing.assert_array_equal(k(A=d, x=x), A @ x)
    finally:  # an armed worker that was not restored only passes through: the token exists
        client.run(_restore_run_part, on_error="ignore")
    assert token.exists()  # a part did start on an armed worker, which then died
    # the scheduler reran that part only after it removed the dead worker
    assert not before <= set(client.scheduler_info()["workers"])
    client.wait_for_workers(2, timeout=RESTART_S)
    np.testing.assert_array_equal(k(A=d, x=x), A @ x)


def test_lost_scattered_part_is_a_clear_error(client) -> None:
    import time

    A = _matrix(40, 20, 12)
    d = sd.from_scipy(A, 4, client=client, name="A").persist()
    assert d.origin == "scattered"
    _kill_holder(client, d.futures[0])
    deadline = time.monotonic() + 30
    while all(f.status == "finished" for f in d.futures) and time.monotonic() < deadline:
        time.sleep(0.05)
    k = sd.kernel("y(i) = A(i,j) * x(j)", {"A": "csr"})
    with pytest.raises(
        sparsec.SparsecError, match=r"part\(s\) 0.* of distributed tensor A were lost"
    ):
        k(A=d, x=np.ones(20))
    with pytest.raises(sparsec.SparsecError, match="cannot be recomputed"):
        d.to_tensor()
    client.wait_for_workers(2, timeout=RESTART_S)


def test_kernel_failing_on_a_part_names_kernel_and_part(client) -> None:
    A = _matrix(20, 10, 13)
    good = client.scatter(sparsec.Tensor.from_scipy(A[:10]))
    bad = client.scatter("not a tensor")
    d = sd.DistributedTensor(
        client,
        [good, bad],
        [split.Cut(0, 0, 0, 10), split.Cut(0, 0, 10, 20)],
        A.shape,
        sparsec.parse_format("csr", 2),
        0,
        "float64",
        "int32",
        "scattered",
        "A",
    )
    k = sd.kernel("y(i) = A(i,j) * x(j)", {"A": "csr"})
    with pytest.raises(
        sparsec.SparsecError, match=r"kernel 'y\(i\) = A\(i,j\) \* x\(j\)' failed on part 1 of 2"
    ):
        k(A=d, x=np.ones(10))


def test_missing_dask_is_a_clear_error() -> None:
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['distributed'] = None; sys.modules['dask'] = None\n"
        "import sparsec, sparsec.distributed as sd\n"
        "try:\n    sd.from_scipy(None)\nexcept sparsec.SparsecError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pip install 'sparsec[distributed]'" in out.stdout
