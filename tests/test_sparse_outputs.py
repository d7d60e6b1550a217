"""Sparse outputs: the kernel assembles pos/crd/vals; results match torch and keep invariants.

Every case: compile, run (outputs poisoned first), validate the assembled storage, compare
the dense values with ``torch.einsum`` on the dense inputs, for float32/float64 and
int32/int64 indices, on inputs with empty rows and slices.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from conftest import assert_same_storage, case_id, sparse_array, torch_reference

import sparsec

COSTS = sys.modules["sparsec.policy.costs"]
SPARSE_OUT = sys.modules["sparsec.runtime.sparse_out"]
I, J, K, L = 7, 6, 5, 4

# (expression, formats, einsum or python reference, shapes)
CASES: list[tuple[str, dict[str, str], str, dict[str, tuple[int, ...]]]] = []
for fmt in ("csr", "dcsr", "csc", "dcsc"):
    for op, ref in (("+", "B+C"), ("*", "B*C"), ("-", "B-C")):
        CASES.append(
            (
                f"A(i,j) = B(i,j) {op} C(i,j)",
                {"A": fmt, "B": fmt, "C": fmt},
                ref,
                {"B": (I, J), "C": (I, J)},
            )
        )
for b, c, a in (
    ("csr", "dense", "csr"),
    ("dense", "csr", "csr"),
    ("dcsr", "csr", "dcsr"),
    ("csr", "dcsr", "csr"),
):
    for op, ref in (("+", "B+C"), ("*", "B*C")):
        CASES.append(
            (
                f"A(i,j) = B(i,j) {op} C(i,j)",
                {"A": a, "B": b, "C": c},
                ref,
                {"B": (I, J), "C": (I, J)},
            )
        )
VEC = {"b": (I,), "c": (I,), "d": (I,)}
for expr, ref in (
    ("a(i) = b(i) + c(i)", "b+c"),
    ("a(i) = b(i) * c(i)", "b*c"),
    ("a(i) = b(i) * c(i) + d(i)", "b*c+d"),
):
    for mix in (
        {"b": "s", "c": "s", "d": "s"},
        {"b": "s", "c": "dense", "d": "s"},
        {"b": "dense", "c": "s", "d": "dense"},
    ):
        used = {n: f for n, f in mix.items() if f"{n}(i)" in expr}
        CASES.append((expr, {"a": "s", **used}, ref, {n: VEC[n] for n in used}))
for a_fmt in ("csr", "dcsr"):
    CASES.append(
        (
            "y(i) = A(i,j) * x(j)",
            {"y": "s", "A": a_fmt, "x": "s"},
            "ij,j->i",
            {"A": (I, J), "x": (J,)},
        )
    )
CASES += [
    ("A(i,j) = 2 * B(i,j)", {"A": "csr", "B": "csr"}, "2*B", {"B": (I, J)}),
    ("A(i,j) = -B(i,j)", {"A": "dcsr", "B": "csr"}, "-B", {"B": (I, J)}),
    (
        "A(i,j,m) = B(i,j,m) * C(i,j,m)",
        {"A": "csf", "B": "csf", "C": "csf"},
        "B*C",
        {"B": (I, J, K), "C": (I, J, K)},
    ),
    (
        "C(i,j,k) = A(i,j,k) + B(i,j,k)",
        {"C": "uqq", "A": "uqq", "B": "uqq"},
        "A+B",
        {"A": (I, J, K), "B": (I, J, K)},
    ),
    (
        "C(i,j) = A(i,j) + B(i,j)",
        {"C": "coo", "A": "coo", "B": "csr"},
        "A+B",
        {"A": (I, J), "B": (I, J)},
    ),
    (
        "A(i,j,l) = B(i,j,k) * C(k,l)",
        {"A": "ssd", "B": "csf"},
        "ijk,kl->ijl",
        {"B": (I, J, K), "C": (K, L)},
    ),
    (
        "A(i,j,l) = B(i,j,k) * C(k,l)",
        {"A": "sss", "B": "csf"},
        "ijk,kl->ijl",
        {"B": (I, J, K), "C": (K, L)},
    ),
    (
        "A(i,j) = B(i,j) * C(i,k) * D(k,j)",
        {"A": "csr", "B": "csr"},
        "ij,ik,kj->ij",
        {"B": (I, J), "C": (I, K), "D": (K, J)},
    ),
    # SpGEMM as inner products: B stored by columns
    (
        "C(i,j) = A(i,k) * B(k,j)",
        {"C": "csr", "A": "csr", "B": "csc"},
        "ik,kj->ij",
        {"A": (I, K), "B": (K, J)},
    ),
    # Aᵀ·A with A stored as CSC (its level order k-within-i fits the loop order i, j, k)
    ("C(i,j) = A(k,i) * A(k,j)", {"C": "csr", "A": "csc"}, "ki,kj->ij", {"A": (K, I)}),
    (
        "a(i) = B(i,j) * c(j) + d(i)",
        {"a": "s", "B": "dcsr", "d": "s"},
        "B@c+d",
        {"B": (I, J), "c": (J,), "d": (I,)},
    ),
    # SpGEMM through a dense workspace (Gustavson): csr x csr, dcsr x csr, into csr and dcsr
    (
        "C(i,j) = A(i,k) * B(k,j)",
        {"C": "csr", "A": "csr", "B": "csr"},
        "ik,kj->ij",
        {"A": (I, K), "B": (K, J)},
    ),
    (
        "C(i,j) = A(i,k) * B(k,j)",
        {"C": "csr", "A": "dcsr", "B": "csr"},
        "ik,kj->ij",
        {"A": (I, K), "B": (K, J)},
    ),
    (
        "C(i,j) = A(i,k) * B(k,j)",
        {"C": "dcsr", "A": "dcsr", "B": "dcsr"},
        "ik,kj->ij",
        {"A": (I, K), "B": (K, J)},
    ),
    # a sparse vector built by scattering: y = Aᵀ x
    ("y(j) = A(k,j) * x(k)", {"y": "s", "A": "csr"}, "kj,k->j", {"A": (K, J), "x": (K,)}),
]


@pytest.mark.parametrize("index_dtype", ["int32", "int64"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_sparse_output_matches_torch(case, dtype, index_dtype, rng, monkeypatch):
    expr, fmts, ref, shapes = case
    dense, given = {}, {}
    for name, shape in shapes.items():
        arr = sparse_array(shape, rng).astype(dtype)
        dense[name] = arr
        fmt = fmts.get(name, "dense")
        given[name] = (
            arr if fmt == "dense" else sparsec.Tensor.from_dense(arr, fmt, index_dtype=index_dtype)
        )
    k = sparsec.kernel(expr, fmts)
    out = k(**given)
    assert isinstance(out, sparsec.Tensor)
    out.validate("out")
    assert out.format == k.formats[k.spec.output.name]
    assert out.index_dtype == np.dtype(index_dtype) and out.dtype == np.dtype(dtype)
    tol = 1e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(
        np.asarray(out),
        torch_reference(ref, dense, ["A", "A"] if ref == "ki,kj->ij" else None),
        rtol=tol,
        atol=tol,
    )
    k.check(**given)
    # one pass into bounded arrays (one thread) and two phases (counted exactly) build
    # the same storage
    single = k(**given, threads=1)
    monkeypatch.setattr(COSTS, "SINGLE_PASS_ENTRIES", -1)
    for got in (single, k(**given, threads=1)):
        got.validate("out")
        assert_same_storage(got, out)


def test_pattern_is_structural_and_cancellation_zeros_are_kept(rng):
    B = sparsec.Tensor.from_dense(sparse_array((8, 9), rng), "csr")
    out = sparsec.kernel("A(i,j) = B(i,j) - C(i,j)", {"A": "csr", "B": "csr", "C": "csr"})(B=B, C=B)
    assert out.nnz == B.nnz  # B - B keeps B's pattern ...
    np.testing.assert_array_equal(out.vals, 0.0)  # ... as explicit zeros (TACO's semantics)
    np.testing.assert_array_equal(out.levels[1].crd, B.levels[1].crd)


def test_intersection_pattern_and_sddmm_pattern(rng):
    B = sparsec.Tensor.from_dense(sparse_array((8, 9), rng), "csr")
    C, D = rng.uniform(size=(8, 3)), rng.uniform(size=(3, 9))
    out = sparsec.kernel("A(i,j) = B(i,j) * C(i,k) * D(k,j)", {"A": "csr", "B": "csr"})(
        B=B, C=C, D=D
    )
    np.testing.assert_array_equal(out.levels[1].pos, B.levels[1].pos)  # exactly B's pattern
    np.testing.assert_array_equal(out.levels[1].crd, B.levels[1].crd)


def test_spmspv_keeps_only_reached_rows(rng):
    A = np.zeros((5, 4))
    A[0, 1], A[2, 3], A[4, 0] = 1.0, 2.0, 3.0
    x = np.zeros(4)
    x[1], x[0] = 5.0, 7.0
    y = sparsec.kernel("y(i) = A(i,j) * x(j)", {"y": "s", "A": "csr", "x": "s"})(A=A, x=x)
    np.testing.assert_array_equal(y.levels[0].crd, [0, 4])  # row 2 meets no stored x entry
    np.testing.assert_array_equal(y.vals, [5.0, 21.0])


@pytest.mark.parametrize("fmt", ["csr", "dcsr", "csc", "coo"])
def test_empty_and_full_inputs(fmt):
    k = sparsec.kernel("A(i,j) = B(i,j) + C(i,j)", {"A": fmt, "B": fmt, "C": fmt})
    empty = np.zeros((4, 3))
    out = k(B=empty, C=empty)
    assert out.nnz == 0 and out.shape == (4, 3)
    out.validate()
    full = np.arange(1.0, 13.0).reshape(4, 3)
    out = k(B=full, C=full)
    assert out.nnz == 12
    np.testing.assert_array_equal(np.asarray(out), 2 * full)
    out = k(B=np.zeros((0, 3)), C=np.zeros((0, 3)))
    assert out.shape == (0, 3) and out.nnz == 0


def test_conversions_out(rng):
    B = sparse_array((6, 5), rng)
    out = sparsec.kernel("A(i,j) = B(i,j) * C(i,j)", {"A": "csr", "B": "csr", "C": "csr"})(B=B, C=B)
    np.testing.assert_allclose(out.to_scipy().toarray(), B * B)
    t = out.to_torch()
    assert t.layout == torch.sparse_csr
    np.testing.assert_allclose(t.to_dense().numpy(), B * B)


def test_spgemm_uses_a_workspace():
    src = sparsec.kernel("C(i,j) = A(i,k) * B(k,j)", {"C": "csr", "A": "csr", "B": "csr"}).source
    assert "workspace: a dense row over j" in src and "sc_sort_reached(w_list, w_len" in src
    assert "free(w_all);" in src  # one workspace row per thread, rows run in parallel
    assert "#pragma omp parallel for" in src.split("sparsec_kernel(")[1]


def test_rowwise_outputs_are_parallel_and_match_across_thread_counts(rng):
    A = sparsec.Tensor.from_dense(sparse_array((60, 40), rng, integer=True), "csr")
    B = sparsec.Tensor.from_dense(sparse_array((40, 50), rng, integer=True), "csr")
    k = sparsec.kernel("C(i,j) = A(i,k) * B(k,j)", {"C": "csr", "A": "csr", "B": "csr"})
    results = [k(A=A, B=B, threads=t) for t in (1, 2, 4)]
    for r in results:
        r.validate()
        np.testing.assert_array_equal(r.levels[1].pos, results[0].levels[1].pos)
        np.testing.assert_array_equal(r.levels[1].crd, results[0].levels[1].crd)
        np.testing.assert_array_equal(r.vals, results[0].vals)
    np.testing.assert_array_equal(np.asarray(results[0]), A.to_dense() @ B.to_dense())
    # a dcsr output appends into one sequence: serial
    assert (
        "omp parallel"
        not in sparsec.kernel(
            "C(i,j) = A(i,j) + B(i,j)", {"C": "dcsr", "A": "csr", "B": "csr"}
        ).source
    )


def test_transpose_product_with_csr_says_how_to_store_it():
    # issue 23: with no schedule A is converted at call time; a schedule's refusal stands
    k = sparsec.kernel("C(i,j) = A(k,i) * A(k,j)", {"C": "csr", "A": "csr"})
    assert "converted at call time" in k.schedule
    inputs, _ = k.random_inputs({"i": 5, "j": 5, "k": 4}, seed=0, density=0.5)
    k.check(**inputs)
    with pytest.raises(sparsec.LoweringError, match="Store A with mode ordering 1,0"):
        sparsec.kernel(
            "C(i,j) = A(k,i) * A(k,j)", {"C": "csr", "A": "csr"}, schedule="reorder(i,j,k)"
        ).generated()


def test_workspace_is_only_used_when_needed():
    src = sparsec.kernel("A(i,j) = B(i,j) + C(i,j)", {"A": "csr", "B": "csr", "C": "csr"}).source
    # the prelude declares calloc; no kernel body allocates (the printer writes "(T*)calloc(")
    assert "// workspace:" not in src and "*)calloc(" not in src
    assert src.count("free(") == 1  # the declaration


def test_plus_equals_into_sparse_output_adds_to_the_given_value():
    # was refused (issue 18: with advice that was refused in turn); now y_old + A @ x
    k = sparsec.kernel("y(i) += A(i,j) * x(j)", {"y": "s", "A": "csr"})
    a = np.array([[0.0, 2.0], [0.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
    y = np.array([0.0, 5.0, 0.0, 1.0])
    got = k(
        A=sparsec.Tensor.from_dense(a, "csr"), x=np.ones(2), y=sparsec.Tensor.from_dense(y, "s")
    )
    np.testing.assert_array_equal(got.to_dense(), y + a @ np.ones(2))
    assert got.coords()[0].tolist() == [[0, 1, 3]]  # y's entries and A's non-empty rows


@pytest.mark.parametrize("fmt", ["sds", "uqd", "qs", "sds:2,0,1"])
def test_unsupported_output_layouts_are_clear_errors(fmt):
    with pytest.raises(sparsec.FormatError):
        sparsec.kernel(
            "A(i,j,k) = B(i,j,k)" if len(fmt.split(":")[0]) == 3 else "A(i,j) = B(i,j)", {"A": fmt}
        )


# ------------------------------------------------------------------ single pass
def test_block_output_whose_last_row_stores_nothing(monkeypatch):
    """An 'sd' output zeroes the block at the next position before it knows whether the
    row stores anything; the last row here stores nothing (disjoint columns), so that block
    lies past the last entry (found by ASan: the runtime keeps a spare block for it)."""
    b, c = np.zeros((3, 4)), np.zeros((3, 4))
    b[0, 1], c[0, 1] = 2.0, 3.0
    b[2, 0], c[2, 3] = 1.0, 5.0
    k = sparsec.kernel("A(i,j) = B(i,j) * C(i,j)", {"A": "sd", "B": "ss", "C": "ss"})
    for limit in (COSTS.SINGLE_PASS_ENTRIES, -1):  # one pass, then two phases
        monkeypatch.setattr(COSTS, "SINGLE_PASS_ENTRIES", limit)
        out = k(B=b, C=c).validate()
        np.testing.assert_array_equal(np.asarray(out), b * c)
        assert out.levels[0].crd.tolist() == [0] and len(out.vals) == 4


def _bound(expr, fmts, division="sparse", **inputs):
    """`capacity.entry_bound` of ``expr``'s kernel on these inputs (those named in ``fmts``
    given dense and stored in that format), under the kernel's ``division``."""
    from sparsec.middle.capacity import entry_bound

    k = sparsec.kernel(expr, fmts, division=division)
    values = {
        n: (sparsec.Tensor.from_dense(v, fmts[n]) if n in fmts else v) for n, v in inputs.items()
    }
    return entry_bound(k.spec.statement, values, k.binder.prepare(values).dims, division)


def test_entry_bound_hand_values():
    eye, ones = np.eye(4), np.ones((4, 4))
    anti = np.fliplr(np.eye(4))
    # union: the entries of both (disjoint here, so the bound is exact); intersection: the fewer
    assert (
        _bound("A(i,j) = B(i,j) + C(i,j)", {"A": "csr", "B": "csr", "C": "csr"}, B=eye, C=anti) == 8
    )
    assert (
        _bound("A(i,j) = B(i,j) * C(i,j)", {"A": "csr", "B": "csr", "C": "csr"}, B=eye, C=ones) == 4
    )
    # a literal is present everywhere; a dense operand too
    assert _bound("A(i,j) = B(i,j) + 2", {"A": "csr", "B": "csr"}, B=eye) == 16
    assert _bound("A(i,j) = B(i,j) * D(i,j)", {"A": "csr", "B": "csr"}, B=eye, D=ones) == 4
    # SpGEMM: the products over k, sum_k (entries of column k of B) x (entries of row k of C)
    b = np.zeros((4, 4))
    b[:, 0] = 1.0  # column 0 full
    c = np.zeros((4, 4))
    c[0, :2] = 1.0  # row 0 has 2 entries
    got = _bound("A(i,j) = B(i,k) * C(k,j)", {"A": "csr", "B": "csr", "C": "csr"}, B=b, C=c)
    assert 8 <= got <= 9  # 4 x 2 products (plus the margin of one)
    # broadcast over an index the operand lacks: every j of a stored i
    v = np.array([1.0, 0.0, 2.0, 0.0])
    assert _bound("A(i,j) = v(i) * D(i,j)", {"A": "csr", "v": "s"}, v=v, D=ones) == 8


@pytest.mark.parametrize("expr", ["C(i,j) = A(i,j) + B(i,j)", "C(i,j) = A(i,k) * B(k,j)"])
def test_entry_bound_of_a_complement_mask_counts_where_the_mask_stores_nothing(expr, rng):
    """``~M`` is present where M stores nothing: a mask storing few entries must not bound
    the output by those few (it did: the capacity's slack hid it until each chunk of rows
    got its own bound). Whole, and over ranges of rows; the kernel's answer is numpy's."""
    from sparsec.middle.capacity import entry_bound

    a, b = sparse_array((9, 8), rng, integer=True), sparse_array((8, 8), rng, integer=True)
    if "k" not in expr:
        b = sparse_array((9, 8), rng, integer=True)
    m = np.zeros((9, 8))
    m[0, :2] = m[4, 3] = 1.0  # three entries: the complement holds 69
    k = sparsec.kernel(expr, {"A": "csr", "B": "csr", "C": "csr"}, mask="~M")
    values = {n: sparsec.Tensor.from_dense(v, "csr") for n, v in (("A", a), ("B", b), ("M", m))}
    prepared = k.binder.prepare(values)
    got = k(**values, threads=3).validate()
    want = np.where(m == 0, a @ b if "k" in expr else a + b, 0.0)
    np.testing.assert_array_equal(np.asarray(got), want)
    present = got.to_scipy()
    stmt = k.spec.statement
    assert entry_bound(stmt, prepared.values, prepared.dims) >= present.nnz
    for lo, hi in ((0, 1), (0, 4), (1, 5), (4, 9)):
        bound = entry_bound(stmt, prepared.values, prepared.dims, "sparse", ("i", lo, hi))
        assert bound >= present[lo:hi].nnz, (lo, hi)


@pytest.mark.parametrize(
    ("expr", "fmts", "shapes"),
    [
        ("A(i,j) = B(i,k) * C(k,j)", {"B": "csr", "C": "csr"}, {"B": (23, 9), "C": (9, 14)}),
        ("A(i,j) = B(i,j) + C(i,j) * D(i,j)", {"B": "csr", "C": "csr", "D": "dcsr"}, None),
        (
            "A(i,j) = B(i,j) * C(i,k) * D(k,j)",
            {"B": "csr"},
            {"B": (23, 14), "C": (23, 4), "D": (4, 14)},
        ),
        ("A(i,j) = B(i,j) + C(j,i)", {"B": "csr", "C": "csr"}, {"B": (23, 14), "C": (14, 23)}),
        (
            "A(i,j) = v(i) * D(i,j) + B(i,j)",
            {"v": "s", "B": "csc"},
            {"v": (23,), "D": (23, 14), "B": (23, 14)},
        ),
        ("A(i,j) = B(i,k) * C(k,j)", {"B": "csc", "C": "csr"}, {"B": (23, 9), "C": (9, 14)}),
        # D dense and column-major: its array's axes are (j, i), the row's is the second
        ("A(i,j) = B(i,j) + D(i,j)", {"B": "csr", "D": "dd:1,0"}, {"B": (9, 23), "D": (9, 23)}),
    ],
    ids=[
        "spgemm",
        "b_plus_cd",
        "sddmm",
        "transposed",
        "dense_vector",
        "csc_left_whole",
        "dense_column_major",
    ],
)
def test_entry_bound_over_a_range_of_rows_covers_those_rows(expr, fmts, shapes, rng):
    """`entry_bound` restricted to rows lo..hi of the output (a chunk of the single pass)
    is at least the entries the output has in those rows, for every range: CSR operands
    over the row are cut to those rows, dense ones scaled, anything else (CSC, a matrix
    read transposed, DCSR) counted whole. The ranges' bounds of a CSR SpGEMM add up to the
    whole bound (plus each range's margin of one): a thread's region is its share."""
    from sparsec.middle.capacity import entry_bound

    shapes = shapes or {n: (23, 14) for n in ("B", "C", "D")}
    dense = {n: sparse_array(shape, rng) for n, shape in shapes.items()}
    for n in dense:
        if n in fmts and len(shapes[n]) == 2:
            dense[n][shapes[n][0] // 3] = 0.0  # an empty row
    k = sparsec.kernel(expr, {"A": "csr", **fmts})
    values = {
        n: sparsec.Tensor.from_dense(v, fmts[n]) if fmts.get(n, "dd")[:2] != "dd" else v
        for n, v in dense.items()
    }
    result = k(**values)
    prepared = k.binder.prepare(values)  # the statement's operands (a transposed D_as, say)
    values, dims = prepared.values, prepared.dims
    out = np.asarray(result)
    stmt = k.spec.statement
    whole = entry_bound(stmt, values, dims)
    assert whole >= np.count_nonzero(out) or whole >= out.size
    rows = out.shape[0]
    cuts = sorted({0, 1, rows // 4, rows // 2, rows // 2 + 1, rows - 1, rows})
    for lo in cuts:
        for hi in cuts:
            if hi < lo:
                continue
            got = entry_bound(stmt, values, dims, "sparse", ("i", lo, hi))
            present = result.to_scipy()[lo:hi]
            assert present.nnz <= got <= max(whole, (hi - lo) * out.shape[1]), (lo, hi)
    if expr.startswith("A(i,j) = B(i,k)") and fmts["B"] == "csr":
        parts = [
            entry_bound(stmt, values, dims, "sparse", ("i", a, b)) for a, b in ((0, 7), (7, rows))
        ]
        assert whole <= sum(parts) <= whole + 2


@pytest.mark.parametrize(
    ("expr", "fmts"),
    [
        ("A(i,j) = B(i,j) + C(i,j)", {"A": "dcsr", "B": "dcsr", "C": "dcsr"}),  # appends
        ("A(i,j) = B(i,j) + C(i,j)", {"A": "csr", "B": "csr", "C": "csr"}),  # row checks
        ("A(i,j) = B(i,k) * C(k,j)", {"A": "csr", "B": "csr", "C": "csr"}),  # a workspace
        ("A(i,j) = B(i,j) * C(i,j)", {"A": "sd", "B": "dcsr", "C": "dcsr"}),  # dense blocks
    ],
)
def test_too_small_a_bound_stops_the_kernel(expr, fmts, monkeypatch, rng):
    """The single-pass kernel checks its capacities: given too small a bound it stops
    before writing past them; the tests treat that as a bug, users get the two phases."""
    b = sparsec.Tensor.from_dense(sparse_array((30, 20), rng), fmts["B"])
    c = sparsec.Tensor.from_dense(sparse_array((20 if "k" in expr else 30, 20), rng), fmts["C"])
    k = sparsec.kernel(expr, fmts)
    want = k(B=b, C=c, threads=1)
    monkeypatch.setattr(SPARSE_OUT, "entry_bound", lambda *a: 3)
    with pytest.raises(sparsec.SparsecError, match="capacity bound 3 was too small"):
        k(B=b, C=c, threads=1)
    monkeypatch.setattr(k.executable("float64", "int32"), "poison", False)
    assert_same_storage(k(B=b, C=c, threads=1).validate(), want)


# ------------------------------------------------------- schedules, sparse outputs
@pytest.mark.parametrize("fmt", ["csr", "dcsr"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("single_pass", [True, False])
def test_bound_is_checked_for_a_sparse_output(fmt, threads, single_pass, monkeypatch, rng):
    """A `bound` on a reduction loop is checked by a sparse output's kernels (the count,
    the fill and the single pass) as by a dense output's: ShapeError, never wrong values."""
    if not single_pass:
        monkeypatch.setattr(COSTS, "SINGLE_PASS_ENTRIES", -1)
    expr = "A(i,j) = B(i,j) * C(i,k) * D(k,j)"
    for schedule, good, bad, message in (
        ("bound(k,kb,4,MaxExact)", 4, 6, "exactly 4"),
        ("bound(k,kb,4,MaxConstraint)", 3, 5, "at most 4"),
    ):
        k = sparsec.kernel(expr, {"B": "csr", "A": fmt}, schedule=schedule)
        b = sparse_array((5, 7), rng)
        c, d = sparse_array((5, good), rng), sparse_array((good, 7), rng)
        out = k(B=b, C=c, D=d, threads=threads).validate()
        np.testing.assert_allclose(np.asarray(out), b * (c @ d))
        with pytest.raises(sparsec.ShapeError, match=rf"bound\(k,kb,4,Max.*{message}"):
            k(B=b, C=sparse_array((5, bad), rng), D=sparse_array((bad, 7), rng), threads=threads)


# ------------------------------------------------- dense levels out of storage order
ROWS_OUT_OF_ORDER = [
    # the input's levels hold j above i, the output's i above j
    ("C(i,j,l) = A(i,j,k) * B(k,l)", {"A": "sss:1,0,2", "C": "dds"}),
    ("A(m,j,i) = B(j,m,i) + C(i,j,m)", {"C": "u0q1s2", "A": "dds:1,2,0"}),
    # the row level (m) is located last, in order: the single pass appended rows (j, i, m)
    # in the wrong order (unsorted crd)
    ("A(i,j,m,l) = B(j,i,m,l)", {"B": "ssss", "A": "ddds"}),
    # ... and the output's last level scattered into a workspace (B is read row by row)
    ("C(i,j,l) = A(j,i,k) * B(k,l)", {"A": "sss", "B": "csr", "C": "dds"}),
    ("C(i,j,l) = A(j,i,k) * B(k,l)", {"A": "dss", "B": "csr", "C": "dds"}),
]


@pytest.mark.parametrize(("expr", "fmts"), ROWS_OUT_OF_ORDER)
def test_rows_visited_out_of_storage_order(expr, fmts):
    """A rowwise output (dense levels, then one compressed level) whose dense levels the
    inputs visit in another order than stored: each row is counted and filled on its own,
    so the rows may come in any order (the row's counter was declared only when its last
    stored dense level was the loop that located it, so the C did not compile)."""
    k = sparsec.kernel(expr, fmts)
    assert "sparsec_append" not in k.source  # the single pass appends rows in order
    dims = dict.fromkeys(k.spec.indices, 4) | {"i": 3, "j": 5}
    for seed, density in enumerate((0.0, 0.3, 0.7, 1.0)):
        inputs, _ = k.random_inputs(dims, seed=seed, density=density)
        for threads in (1, 2):
            k.check(**inputs, threads=threads)


@pytest.mark.parametrize("out", ["ddss", "ddsd"])
def test_appended_rows_out_of_storage_order_say_which_format_works(out):
    """Dense levels above more than one appended level are filled in one sequence, so they
    must be visited in storage order: an input that forbids it is refused before any C,
    naming a format that works (this computed wrong values)."""
    # issue 23: with no schedule B is converted at call time; a schedule's refusal stands
    k = sparsec.kernel("A(i,j,m,l) = B(j,i,m,l)", {"B": "ssss", "A": out})
    assert "converted at call time" in k.schedule
    inputs, _ = k.random_inputs({"i": 3, "j": 4, "m": 2, "l": 3}, seed=0, density=0.5)
    k.check(**inputs)
    with pytest.raises(sparsec.LoweringError, match=r"Store B with mode ordering 1,0,2,3"):
        sparsec.kernel(
            "A(i,j,m,l) = B(j,i,m,l)", {"B": "ssss", "A": out}, schedule="reorder(i,j,m,l)"
        ).generated()
    k = sparsec.kernel("A(i,j,m,l) = B(j,i,m,l)", {"B": "ssss:1,0,2,3", "A": out})
    inputs, _ = k.random_inputs({"i": 3, "j": 4, "m": 2, "l": 3}, seed=0, density=0.5)
    k.check(**inputs)


# ------------------------------------------------------------ nested sums' patterns
def _pattern_inputs():
    b = np.zeros((6, 4))
    b[0, 1], b[2, 3], b[4, 0] = 1.0, 2.0, 3.0  # rows 1, 3 and 5 empty
    c = np.zeros(6)
    c[0], c[1] = 5.0, 7.0
    # y(i) = B(i,j) * (C(j,k) + d(j)): row 0 meets C's row 0, row 1 d(1), row 2 nothing
    bb = np.zeros((3, 4))
    bb[0, 0], bb[1, 1], bb[2, 2] = 1.0, 2.0, 3.0
    cc = np.zeros((4, 5))
    cc[0, 3] = 4.0
    d = np.zeros(4)
    d[1] = 5.0
    # E(i,j) = A(i,k) * (T(k,j,l) + D(k,j)): row 0 meets T(0,2,.) and D(1,0); row 1 nothing
    a = np.zeros((2, 4))
    a[0, 0], a[0, 1], a[1, 2] = 1.0, 1.0, 1.0
    t = np.zeros((4, 3, 5))
    t[0, 2, 1] = 1.0
    dd = np.zeros((4, 3))
    dd[1, 0] = 2.0
    return {"B": b, "c": c}, {"B": bb, "C": cc, "d": d}, {"A": a, "T": t, "D": dd}


UNION, ROWS, SCATTER = _pattern_inputs()
NESTED_SUM_PATTERNS = [
    # a sum left under + or - is present where it has a term, as a top-level sum is
    ("y(i) = B(i,m) - c(i)", {"B": "csr", "c": "s", "y": "s"}, UNION, [[0, 1, 2, 4]]),
    ("y(i) = B(i,m) + c(i)", {"B": "csr", "c": "s", "y": "s"}, UNION, [[0, 1, 2, 4]]),
    ("y(i) = B(i,m) - c(i)", {"B": "dcsr", "c": "s", "y": "s"}, UNION, [[0, 1, 2, 4]]),
    ("y(i) = B(i,m)", {"B": "csr", "y": "s"}, {"B": UNION["B"]}, [[0, 2, 4]]),
    ("y(i) = 2 * B(i,m) - c(i) / 2", {"B": "csr", "c": "s", "y": "s"}, UNION, [[0, 1, 2, 4]]),
    # ... inside a top-level sum (the reached flag of the row)
    (
        "y(i) = B(i,j) * (C(j,k) + d(j))",
        {"B": "csr", "C": "csr", "d": "s", "y": "s"},
        ROWS,
        [[0, 1]],
    ),
    # ... appended, and scattered into a workspace row
    (
        "E(i,j) = A(i,k) * (T(k,j,l) + D(k,j))",
        {"A": "csr", "T": "dds", "D": "csr", "E": "dcsr"},
        SCATTER,
        [[0], [0, 2]],
    ),
    (
        "E(i,j) = A(i,k) * (T(k,j,l) + D(k,j))",
        {"A": "csr", "T": "dds", "D": "csr", "E": "csr"},
        SCATTER,
        [None, [0, 2]],
    ),
]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("single_pass", [True, False])
@pytest.mark.parametrize(("expr", "fmts", "inputs", "crd"), NESTED_SUM_PATTERNS)
def test_a_nested_sum_is_present_only_where_it_has_a_term(
    expr, fmts, inputs, crd, threads, single_pass, monkeypatch
):
    """docs/semantics.md: an entry exists exactly where a term is structurally present,
    and a sum over a row with no entries is no entry. A sum nested under ``+`` was taken
    as present wherever its operand's level is dense (every row of a csr B stored, as
    explicit zeros), while the same sum at the top stored only the rows it reached."""
    if not single_pass:
        monkeypatch.setattr(COSTS, "SINGLE_PASS_ENTRIES", -1)
    k = sparsec.kernel(expr, fmts)
    out = k(**inputs, threads=threads).validate()
    assert [None if level.crd is None else level.crd.tolist() for level in out.levels] == crd
    k.check(**inputs, threads=threads)


# --------------------------------------------------- capacity bound of a division
@pytest.mark.parametrize(
    ("expr", "fmts"),
    [
        ("A(k,i) = alpha / C(k) * B(k,i)", {"A": "dcsr", "C": "s", "B": "csr"}),
        ("A(k,i) = B(k,i) * C(k) / D(k,i)", {"A": "dcsr", "C": "s", "B": "dcsr", "D": "csr"}),
        ("A(k,i) = B(k,i) / C(k) + D(k,i)", {"A": "coo", "C": "s", "B": "csr", "D": "csr"}),
        ("A(k,i) = B(k,i) / C(k)", {"A": "sd", "C": "s", "B": "csr"}),
    ],
)
def test_division_single_pass_bound_covers_the_exact_pattern(expr, fmts, monkeypatch):
    """Under division="ieee", a division by a non-literal is lowered exactly: an absent
    operand reads as 0.0 and ``inf * 0`` is NaN, so even ``alpha / C(k) * B(k,i)`` has an entry at every (k, i),
    not only at B's. The single pass's capacity bound must say so: with SPARSEC_POISON
    (conftest) a bound too small is an error, and the two phases are never needed."""

    def no_two_phases(*args, **kwargs):
        raise AssertionError("the single pass fell back to the two phases")

    monkeypatch.setattr(SPARSE_OUT, "two_phase", no_two_phases)
    k = sparsec.kernel(expr, fmts, division="ieee")
    for seed, density in enumerate((0.0, 0.4, 1.0)):
        inputs, dims = k.random_inputs({"k": 5, "i": 4}, seed=seed, density=density)
        out = k(**inputs, threads=1).validate()
        assert out.nnz == dims["k"] * dims["i"]  # present everywhere
        k.check(**inputs, threads=1)


def test_entry_bound_of_divisions():
    eye, c = np.eye(4), np.array([1.0, 0.0, 0.0, 2.0])
    # exact lowering (division="ieee"): every (k, i), whatever the product's other
    # factor stores; the sparse convention: the quotient is present where its numerator
    # (the scalar alpha: everywhere) is, so the product keeps B's pattern
    for division, want in (("ieee", 16), ("sparse", 4)):
        got = _bound(
            "A(k,i) = alpha / C(k) * B(k,i)",
            {"A": "dcsr", "C": "s", "B": "csr"},
            division,
            alpha=2.0,
            C=c,
            B=eye,
        )
        assert got == want, division
    # a sparse numerator over a dense divisor keeps the numerator's pattern
    assert _bound("A(k,i) = B(k,i) / D(k,i)", {"A": "dcsr", "B": "csr"}, B=eye, D=eye + 1) == 4
    # a non-zero literal divisor keeps the numerator's pattern
    assert _bound("A(k,i) = B(k,i) / 2", {"A": "dcsr", "B": "csr"}, B=eye) == 4
