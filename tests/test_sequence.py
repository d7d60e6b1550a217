"""Sums under ``+``/``-`` lowered as a sequence (issue 23, item 1; sparsec/lower/sequence.py).

``Y(i,j) = A(i,k)*B(k,j) + D(i,j)`` with B in CSR has no fused loop order (the sum over k
nested under ``+`` runs inside j, B needs k before j): the output is initialised from the
terms without a sum, then each contraction adds into it in its own loop order, inside the
loops the steps share. Every case is compared with numpy on the densified inputs (empty
rows and columns, explicit zeros stored), float32/float64 and int32/int64 indices, one and
two threads, on the C target and the CUDA source run on the CPU (``cuda-emulated``).
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from conftest import sparse_array

import sparsec
from sparsec.base.errors import LoweringError, ScheduleError, SparsecError

I, J, K, L = 9, 7, 6, 5

#: (expression, formats, numpy reference on the dense inputs, shapes)
CASES: list[tuple[str, dict[str, str], object, dict[str, tuple[int, ...]]]] = [
    (
        "Y(i,j) = A(i,k) * B(k,j) + D(i,j)",
        {"A": "csr", "B": "csr"},
        lambda t: t["A"] @ t["B"] + t["D"],
        {"A": (I, K), "B": (K, J), "D": (I, J)},
    ),
    (
        "Y(i,j) = A(i,k) * B(k,j) - D(i,j)",
        {"A": "csr", "B": "csr", "D": "csr"},
        lambda t: t["A"] @ t["B"] - t["D"],
        {"A": (I, K), "B": (K, J), "D": (I, J)},
    ),
    (
        "Y(i,j) = D(i,j) - A(i,k) * B(k,j)",
        {"A": "dcsr", "B": "csr"},
        lambda t: t["D"] - t["A"] @ t["B"],
        {"A": (I, K), "B": (K, J), "D": (I, J)},
    ),
    (
        "Y(i,j) = 2 * A(i,k) * B(k,j) - D(i,j)",
        {"A": "csr", "B": "csr"},
        lambda t: 2 * (t["A"] @ t["B"]) - t["D"],
        {"A": (I, K), "B": (K, J), "D": (I, J)},
    ),
    (
        "Y(i,j) = A(i,k) * B(k,j) + C(i,l) * E(l,j)",
        {"A": "csr", "B": "csr", "C": "csr", "E": "csr"},
        lambda t: t["A"] @ t["B"] + t["C"] @ t["E"],
        {"A": (I, K), "B": (K, J), "C": (I, L), "E": (L, J)},
    ),
    (
        "Y(i,j) = A(i,k) * B(k,j) + 1.5 - C(i,l) * E(l,j) * 0.5",
        {"A": "csr", "B": "csr", "C": "csr", "E": "csr"},
        lambda t: t["A"] @ t["B"] + 1.5 - 0.5 * (t["C"] @ t["E"]),
        {"A": (I, K), "B": (K, J), "C": (I, L), "E": (L, J)},
    ),
    (
        "Y(i,j) = B(i,k,l) * C(l,j) * D(k,j) + E(i,j)",
        {"B": "dss", "C": "csr", "D": "csr"},
        lambda t: np.einsum("ikl,lj,kj->ij", t["B"], t["C"], t["D"]) + t["E"],
        {"B": (I, K, L), "C": (L, J), "D": (K, J), "E": (I, J)},
    ),
    # no loop shared by every step (D read in j,i order): a sequence of whole nests
    (
        "Y(i,j) = A(i,k) * B(k,j) + D(j,i)",
        {"A": "csr", "B": "csr", "D": "csr"},
        lambda t: t["A"] @ t["B"] + t["D"].T,
        {"A": (I, K), "B": (K, J), "D": (J, I)},
    ),
]
IDS = [c[0].replace(" ", "") for c in CASES]
DTYPES = [("float64", "int32"), ("float32", "int64")]


def _inputs(fmts, shapes, dtype, index_dtype, seed=3):
    """Dense arrays with empty rows/columns, and the kernel's inputs: sparse ones packed
    with some stored entries set to an explicit zero."""
    rng = np.random.default_rng(seed)
    dense, given = {}, {}
    for name, shape in shapes.items():
        arr = sparse_array(shape, rng).astype(dtype)
        fmt = fmts.get(name, "dense")
        if fmt == "csr":
            m = sp.csr_matrix(arr)
            m.data[:: max(1, m.nnz // 3)] = 0.0  # stored zeros stay stored
            arr = m.toarray()
            given[name] = sparsec.Tensor.from_scipy(m, index_dtype=index_dtype)
            assert given[name].nnz > np.count_nonzero(arr)
        elif fmt == "dense":
            given[name] = arr
        else:
            given[name] = sparsec.Tensor.from_dense(arr, fmt, index_dtype=index_dtype)
        dense[name] = arr
    return dense, given


@pytest.mark.parametrize(("dtype", "index_dtype"), DTYPES, ids=["f64i32", "f32i64"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_sequence_matches_numpy_on_the_c_target(case, dtype, index_dtype):
    expr, fmts, ref, shapes = case
    k = sparsec.kernel(expr, fmts, dtype=dtype, index_dtype=index_dtype)
    assert "lowered as a sequence" in k.schedule
    assert "lowered as a sequence" in k.source  # the header comment says it too
    dense, given = _inputs(fmts, shapes, dtype, index_dtype)
    want = ref(dense)
    tol = 1e-5 if dtype == "float32" else 1e-12
    for threads in (1, 2):
        got = np.asarray(k(threads=threads, **given), dtype=np.float64)
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    assert k.check(threads=2, **given)


@pytest.mark.parametrize("case", CASES[:1] + CASES[3:6], ids=IDS[:1] + IDS[3:6])
def test_sequence_check_on_random_inputs(case):
    expr, fmts, _, _ = case
    k = sparsec.kernel(expr, fmts)
    inputs, _ = k.random_inputs(seed=5)
    assert k.check(threads=2, **inputs)


def test_the_shared_loop_is_parallel_and_each_step_keeps_its_order():
    """SpMM plus a bias: i on threads (each i owns its row), the bias stored in the row,
    then the contraction in SpMM's order (k then j, B's rows read in storage order)."""
    k = sparsec.kernel("Y(i,j) = A(i,k) * B(k,j) + D(i,j)", {"A": "csr", "B": "csr"})
    assert k.generated().loop_order == ("i",)
    assert "loop i runs on CPU threads" in k.schedule
    src = k.source
    body = src[src.index("int sparsec_kernel(") :]
    assert body.count("#pragma omp parallel for") == 1
    bias, product = body.index("// Y += D(i,j)"), body.index("// Y += sum(k,")
    assert bias < product
    # the contraction walks B's row k (its positions), j innermost
    assert "int64_t j = B2_crd[pB2]" in body[product:]


#: the cases with a thread-per-row GPU mapping: the shared loop i a plain range, or (A
#: dcsr merged with the dense D) one coordinate per thread, A's row located by a search
MAPPED = CASES[:7]


@pytest.mark.parametrize(("dtype", "index_dtype"), DTYPES, ids=["f64i32", "f32i64"])
@pytest.mark.parametrize("case", MAPPED, ids=[IDS[CASES.index(c)] for c in MAPPED])
def test_sequence_under_cuda_emulation(case, dtype, index_dtype):
    expr, fmts, ref, shapes = case
    k = sparsec.kernel(expr, fmts, dtype=dtype, index_dtype=index_dtype, target="cuda-emulated")
    assert "lowered as a sequence" in k.schedule
    assert "GPUThread" in k.schedule
    dense, given = _inputs(fmts, shapes, dtype, index_dtype)
    got = np.asarray(k(**given), dtype=np.float64)
    tol = 1e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(got, ref(dense), rtol=tol, atol=tol)


@pytest.mark.parametrize("case", [CASES[-1]], ids=[IDS[-1]])
def test_unmapped_sequences_say_no_gpu_mapping(case):
    """No shared loop: the usual clear error, never wrong code. (A shared loop that walks
    a sparse level merged with a dense operand maps since split merges locate each
    thread's coordinate: `test_sequence_under_cuda_emulation`.)"""
    expr, fmts, _, _ = case
    with pytest.raises(ScheduleError, match="no GPU mapping"):
        sparsec.kernel(expr, fmts, target="cuda-emulated").source  # noqa: B018


@pytest.mark.parametrize(
    ("expr", "fmts"),
    [
        ("y(i) = A(i,j) * x(j) + b(i)", {"A": "csr"}),
        ("Y(i,j) = A(i,k) * B(k,j)", {"A": "csr", "B": "csr"}),
        ("Y(i,j) = A(i,k) * B(k,j) + D(i,j)", {"A": "csr", "B": "csc"}),
    ],
)
def test_kernels_with_a_fused_order_stay_one_nest(expr, fmts):
    """The sequence is a fallback: where one nest has a legal order it is kept (the sum
    under + computed into a scalar where it is used)."""
    k = sparsec.kernel(expr, fmts)
    assert "sequence" not in k.schedule
    body = k.source[k.source.index("int sparsec_kernel(") :]
    assert "// y +=" not in body and "// Y +=" not in body
    inputs, _ = k.random_inputs(seed=1)
    assert k.check(**inputs)


def test_spmv_plus_bias_is_one_fused_nest():
    k = sparsec.kernel("y(i) = A(i,j) * x(j) + b(i)", {"A": "csr"})
    assert k.generated().loop_order == ("i",)
    body = k.source[k.source.index("int sparsec_kernel(") :]
    # one outer loop over i: the sum over j is nested in it, into a scalar, then b added
    assert body.count("for (int64_t i = 0; i < i_dim; i++)") == 1
    assert body.count("y_vals[") == 1


def test_a_schedule_applies_to_the_shared_loops_only():
    expr, fmts = "Y(i,j) = A(i,k) * B(k,j) + D(i,j)", {"A": "csr", "B": "csr"}
    k = sparsec.kernel(expr, fmts, schedule="split(i,i0,i1,4), parallelize(i0,CPUThread,NoRaces)")
    dense, given = _inputs(fmts, CASES[0][3], "float64", "int32")
    np.testing.assert_allclose(k(threads=2, **given), dense["A"] @ dense["B"] + dense["D"])
    with pytest.raises(ScheduleError, match="lowered as a sequence"):
        sparsec.kernel(expr, fmts, schedule="reorder(j,i)").source  # noqa: B018
    with pytest.raises(ScheduleError, match="not a loop of this kernel"):
        sparsec.kernel(expr, fmts, schedule="split(j,j0,j1,4)").source  # noqa: B018


@pytest.mark.parametrize(("dtype", "index_dtype"), DTYPES, ids=["f64i32", "f32i64"])
@pytest.mark.parametrize("out", ["csr", "dcsr"])
@pytest.mark.parametrize("case", CASES[:7], ids=IDS[:7])
def test_sparse_output_per_row_through_a_workspace(case, out, dtype, index_dtype):
    """Y csr/dcsr: per row the steps scatter into a dense workspace, gathered into the
    row; one thread appends in a single pass, two count and fill (both agree)."""
    expr, fmts, ref, shapes = case
    fmts = {**fmts, "Y": out}
    k = sparsec.kernel(expr, fmts, dtype=dtype, index_dtype=index_dtype)
    assert "lowered as a sequence" in k.schedule and "dense workspace over j" in k.schedule
    dense, given = _inputs(fmts, shapes, dtype, index_dtype)
    want = ref(dense)
    tol = 1e-5 if dtype == "float32" else 1e-12
    patterns = []
    for threads in (1, 2):
        got = k(threads=threads, **given)
        assert isinstance(got, sparsec.Tensor) and str(got.format) == out
        np.testing.assert_allclose(np.asarray(got), want, rtol=tol, atol=tol)
        m = got.to_scipy()
        patterns.append((m.indptr.tolist(), m.indices.tolist()) if out == "csr" else m.nnz)
    assert patterns[0] == patterns[1]
    assert k.check(threads=2, **given)


def test_sparse_output_keeps_only_reached_entries():
    """A CSR bias: the result's pattern is the union of the bias's and the product's."""
    fmts = {"A": "csr", "B": "csr", "D": "csr", "Y": "csr"}
    k = sparsec.kernel("Y(i,j) = A(i,k) * B(k,j) + D(i,j)", fmts)
    A = sp.csr_matrix(np.array([[0, 1.0, 0], [0, 0, 0], [2.0, 0, 0]]))
    B = sp.csr_matrix(np.array([[0, 0, 3.0, 0], [1.0, 0, 0, 0], [0, 0, 0, 0]]))
    D = sp.csr_matrix(np.array([[0, 0, 0, 0], [0, 5.0, 0, 0], [0, 0, 0, 0]]))
    got = k(A=A, B=B, D=D).to_scipy()
    assert got.indptr.tolist() == [0, 1, 2, 3]
    assert got.indices.tolist() == [0, 1, 2]
    assert got.data.tolist() == [1.0, 5.0, 6.0]


@pytest.mark.parametrize(
    ("expr", "out"),
    [("Y(i,j) = A(i,k) * B(k,j) + D(i,j)", "csc"), ("Y(i,j) = A(i,k) * B(k,j) + D(j,i)", "csr")],
)
def test_sparse_output_without_a_row_sequence_is_converted_or_refused_clearly(expr, out):
    """No row loop shared by every step in the output's storage order: either another
    layer makes it run (call-time conversion) and the values are right, or it keeps the
    clear error naming B's order."""
    fmts = {"A": "csr", "B": "csr", "D": "csr", "Y": out}
    try:
        k = sparsec.kernel(expr, fmts)
        k.source  # noqa: B018
    except SparsecError as err:
        assert isinstance(err, LoweringError | ScheduleError)
        assert "B(k,j) is stored as csr" in str(err)
        return
    inputs, _ = k.random_inputs(seed=2)
    assert k.check(**inputs)


@pytest.mark.parametrize("out", ["dense", "csr"])
def test_sequence_under_a_semiring(out):
    """Under min_plus the steps combine with the semiring's add: Y = D, then Y min= the
    contraction's min over k of A + B (the identity where nothing is stored)."""
    fmts = {"A": "csr", "B": "csr"} | ({} if out == "dense" else {"Y": out})
    k = sparsec.kernel("Y(i,j) = A(i,k) * B(k,j) + D(i,j)", fmts, semiring="min_plus")
    assert "lowered as a sequence" in k.schedule
    inputs, _ = k.random_inputs(seed=3)
    assert k.check(**inputs)
    assert k.check(threads=2, **inputs)


def test_a_transposed_product_plus_a_vector_runs_as_two_nests():
    """``a(i) = B(k,i)*c(k) + d(i)`` with B csr: the sum over k cannot run inside i, so
    a = d over i, then a += B(k,i)*c(k) over B's rows (a scatter, serial)."""
    k = sparsec.kernel("a(i) = B(k,i) * c(k) + d(i)", {"B": "csr"})
    assert "lowered as a sequence of loop nests" in k.schedule
    rng = np.random.default_rng(8)
    B = sparse_array((6, 5), rng)
    c, d = rng.random(6), rng.random(5)
    for threads in (1, 2):
        got = k(B=sparsec.Tensor.from_dense(B, "csr"), c=c, d=d, threads=threads)
        np.testing.assert_allclose(got, B.T @ c + d, rtol=1e-12)
