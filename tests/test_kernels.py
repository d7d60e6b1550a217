"""End to end: generated C kernels against ``torch.einsum`` on the densified inputs.

Each row: expression, formats, the einsum that defines the answer, and the operand
shapes. Every row runs with float32/float64 values and int32/int64 indices on random
inputs with real zeros, an empty first-mode slice and an empty second-mode slice.
"""

from __future__ import annotations

import re
import sys

import numpy as np
import pytest
import torch
from conftest import case_id, sparse_array, torch_reference

import sparsec

I, J, K, L = 7, 6, 5, 4

# (expression, formats, reference, {tensor: shape})
SPMV = "y(i) = A(i,j) * x(j)"
CASES: list[tuple[str, dict[str, str], str, dict[str, tuple[int, ...]]]] = []

for a_fmt in ("csr", "csc", "dcsr", "coo", "dense"):
    for x_fmt in ("dense", "s"):
        CASES.append((SPMV, {"A": a_fmt, "x": x_fmt}, "ij,j->i", {"A": (I, J), "x": (J,)}))

for fmts in ({"A": "csr", "B": "dense"}, {"A": "csr", "B": "csc"}):
    CASES.append(("C(i,j) = A(i,k) * B(k,j)", fmts, "ik,kj->ij", {"A": (I, K), "B": (K, J)}))

for b_fmt in ("sss", "dss", "uqq"):
    CASES.append(
        (
            "A(i,j) = B(i,k,l) * D(l,j) * C(k,j)",
            {"B": b_fmt},
            "ikl,lj,kj->ij",
            {"B": (I, K, L), "D": (L, J), "C": (K, J)},
        )
    )

for c_fmt in ("dense", "s"):
    CASES.append(
        (
            "A(i,j) = B(i,j,k) * c(k)",
            {"B": "csf", "c": c_fmt},
            "ijk,k->ij",
            {"B": (I, J, K), "c": (K,)},
        )
    )
CASES.append(
    ("A(i,j,l) = B(i,j,k) * C(k,l)", {"B": "csf"}, "ijk,kl->ijl", {"B": (I, J, K), "C": (K, L)})
)

VEC = {"b": (I,), "c": (I,), "d": (I,), "e": (I,)}
VECTOR_EXPRS = [
    ("a(i) = b(i) * c(i)", "b*c"),
    ("a(i) = b(i) + c(i)", "b+c"),
    ("a(i) = (b(i) + c(i)) * d(i)", "(b+c)*d"),
    ("a(i) = b(i) + c(i) + d(i) * e(i)", "b+c+d*e"),
]
VECTOR_MIXES = [
    {"b": "s", "c": "s", "d": "s", "e": "s"},
    {"b": "s", "c": "dense", "d": "s", "e": "dense"},
    {"b": "dense", "c": "s", "d": "dense", "e": "s"},
    {"b": "s", "c": "s", "d": "dense", "e": "s"},
]
for expr, python in VECTOR_EXPRS:
    for mix in VECTOR_MIXES:
        used = {n: f for n, f in mix.items() if f"{n}(i)" in expr}
        CASES.append((expr, used, python, {n: VEC[n] for n in used}))

for op, python in (("+", "B+C"), ("*", "B*C")):
    for b_fmt, c_fmt in (
        ("csr", "csr"),
        ("dcsr", "dcsr"),
        ("csc", "csc"),
        ("csr", "dcsr"),
        ("dcsc", "csc"),
        ("csr", "dense"),
        ("dense", "dcsc"),
    ):
        CASES.append(
            (
                f"A(i,j) = B(i,j) {op} C(i,j)",
                {"B": b_fmt, "C": c_fmt},
                python,
                {"B": (I, J), "C": (I, J)},
            )
        )

for b_fmt in ("dense", "s"):
    CASES.append(
        (
            "r(i) = b(i) - A(i,k) * x(k)",
            {"A": "csr", "b": b_fmt},
            "b - A@x",
            {"b": (I,), "A": (I, K), "x": (K,)},
        )
    )
for c_fmt in ("csr", "dense"):
    CASES.append(
        ("a = B(i,j) * C(i,j)", {"B": "csr", "C": c_fmt}, "ij,ij->", {"B": (I, J), "C": (I, J)})
    )
for d_fmt in ("dense", "s"):
    CASES.append(
        (
            "a(i) = alpha * B(i,k) * c(k) + beta * d(i)",
            {"B": "csr", "d": d_fmt},
            "alpha*B@c + beta*d",
            {"alpha": (), "B": (I, K), "c": (K,), "beta": (), "d": (I,)},
        )
    )
CASES.append(
    ("y(i) += A(i,j) * x(j)", {"A": "csr"}, "y + A@x", {"A": (I, J), "x": (J,), "y": (I,)})
)
CASES.append(
    (
        "A(i,j) = B(i,j) * C(i,k) * D(k,j)",
        {"B": "csr"},
        "ij,ik,kj->ij",
        {"B": (I, J), "C": (I, K), "D": (K, J)},
    )
)


def _inputs(fmts, shapes, rng, dtype, index_dtype):
    dense, given = {}, {}
    for name, shape in shapes.items():
        if not shape:
            dense[name] = given[name] = float(rng.uniform(0.5, 2.0))
            continue
        arr = sparse_array(shape, rng).astype(dtype)
        dense[name] = arr
        fmt = fmts.get(name, "dense")
        if fmt == "dense":
            given[name] = arr
        else:
            given[name] = sparsec.Tensor.from_dense(arr, fmt, index_dtype=index_dtype)
    return dense, given


@pytest.mark.parametrize("index_dtype", ["int32", "int64"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_matches_dense_torch(case, dtype, index_dtype, rng):
    expr, fmts, ref, shapes = case
    dense, given = _inputs(fmts, shapes, rng, dtype, index_dtype)
    k = sparsec.kernel(expr, fmts)
    got = k(**given)
    want = torch_reference(ref, dense)
    assert np.asarray(got).dtype == np.dtype(dtype)
    tol = 1e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64), want, rtol=tol, atol=tol)
    # the kernel's own check agrees with torch as well
    k.check(**given)


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_thread_counts_agree(threads, rng):
    A = sparse_array((300, 200), rng)
    x = rng.uniform(-1, 1, 200)
    k = sparsec.kernel(SPMV, {"A": "csr"})
    y = k(A=sparsec.Tensor.from_dense(A, "csr"), x=x, threads=threads)
    np.testing.assert_allclose(y, A @ x, rtol=1e-12, atol=1e-12)


def test_torch_inputs_give_torch_output(rng):
    A = torch.from_numpy(sparse_array((8, 6), rng))
    x = torch.rand(6, dtype=torch.float64)
    y = sparsec.kernel(SPMV, {"A": "csr"})(A=A.to_sparse_csr(), x=x)
    assert isinstance(y, torch.Tensor)
    torch.testing.assert_close(y, A @ x)


def test_scipy_input_is_packed(rng):
    import scipy.sparse as sp

    A = sp.random(40, 30, density=0.1, format="csr", random_state=3)
    x = rng.uniform(size=30)
    y = sparsec.kernel(SPMV, {"A": "csr"})(A=A, x=x)
    np.testing.assert_allclose(y, A @ x, rtol=1e-12)
    # a declared format that differs from what was passed is packed into it
    y2 = sparsec.kernel(SPMV, {"A": "dcsr"})(A=A.tocsc(), x=x)
    np.testing.assert_allclose(y2, A @ x, rtol=1e-12)


def test_scalar_output_is_a_number(rng):
    B = sparse_array((5, 4), rng)
    a = sparsec.kernel("a = B(i,j) * B(i,j)", {"B": "csr"})(B=B)
    assert np.ndim(a) == 0
    assert a == pytest.approx(float((B * B).sum()))


def test_default_formats_make_the_widest_input_sparse():
    k = sparsec.kernel("A(i,j) = B(i,k,l) * D(l,j) * C(k,j)")
    assert k.formats["B"].spelling == "sss"
    assert all(k.formats[n].is_dense for n in "ADC")
    k = sparsec.kernel("y(i) = A(i,j) * x(j)", {"x": "s"})
    assert k.formats["A"].is_dense and k.formats["x"].spelling == "s"


def test_sparse_accumulate_kernel_rebuilds_from_its_formats():
    """A sparse '+=' compiles C = C_old + (E); C_old is the spec's own tensor, so the
    formats a copy, a pickle or schedule='auto' rebuild the kernel from leave it out."""
    import copy
    import pickle

    expr = "C(i,j) += A(i,k) * B(k,j)"
    k = sparsec.Kernel(expr, {"C": "csr", "A": "csr"})
    assert set(k.formats) == {"C", "A", "B"}
    inputs, _ = k.random_inputs()
    want = k(**inputs).to_dense()
    for clone in (pickle.loads(pickle.dumps(k)), copy.copy(k)):
        assert clone.formats == k.formats
        np.testing.assert_array_equal(clone(**inputs).to_dense(), want)
    assert sparsec.Kernel(expr, k.formats, schedule="auto").check(**inputs).max_abs_error < 1e-12


def test_empty_and_zero_sized_inputs():
    k = sparsec.kernel(SPMV, {"A": "csr"})
    y = k(A=np.zeros((4, 3)), x=np.ones(3))
    np.testing.assert_array_equal(y, np.zeros(4))
    y = k(A=np.zeros((0, 3)), x=np.ones(3))
    assert y.shape == (0,)
    y = k(A=np.zeros((3, 0)), x=np.ones(0))
    np.testing.assert_array_equal(y, np.zeros(3))


def test_nested_sum_is_not_scaled_by_reduction_extent(rng):
    # d(i) sits outside the k reduction: it must be added once, not K times
    B = sparse_array((6, 5), rng)
    c, d = rng.uniform(size=5), rng.uniform(size=6)
    y = sparsec.kernel("a(i) = B(i,k) * c(k) + d(i)", {"B": "csr"})(B=B, c=c, d=d)
    np.testing.assert_allclose(y, B @ c + d, rtol=1e-12)


def test_division_matches_dense_semantics(rng):
    b = sparse_array((9,), rng)
    c = sparse_array((9,), rng)
    k = sparsec.kernel("a(i) = b(i) / c(i)", {"b": "s", "c": "s"}, division="ieee")
    with np.errstate(divide="ignore", invalid="ignore"):
        want = b / c
    np.testing.assert_array_equal(np.isnan(k(b=b, c=c)), np.isnan(want))
    k.check(b=b, c=c)


# (expression, numpy value as written) over A (2x2, a zero row in the csr case), x, w, c
AS_WRITTEN = [
    ("y(i) = (A(i,j) * x(j)) / w(i)", lambda A, x, w, c: (A @ x) / w),
    ("y(i) = A(i,j) * x(j) / w(i)", lambda A, x, w, c: (A @ x) / w),
    ("y(i) = A(i,j) / w(i)", lambda A, x, w, c: A.sum(axis=1) / w),
    ("y(i) = (A(i,j) * x(j)) * (1 / w(i))", lambda A, x, w, c: (A @ x) * (1 / w)),
    ("y(i) = 1 / ((A(i,j) * x(j)) * c(i))", lambda A, x, w, c: 1 / ((A @ x) * c)),
    ("y(i) = 1 / -(A(i,j) * x(j))", lambda A, x, w, c: 1 / -(A @ x)),
    ("y(i) = w(i) / (A(i,j) * x(j) * c(i))", lambda A, x, w, c: w / ((A @ x) * c)),
]


@pytest.mark.parametrize("a_fmt", ["dense", "csr"])
@pytest.mark.parametrize("expr,numpy", AS_WRITTEN, ids=[e for e, _ in AS_WRITTEN])
def test_a_sum_is_not_moved_across_a_division(expr, numpy, a_fmt):
    # issue 18: the sum was lifted through the division, Σj (A*x / w): NaN where
    # (Σj A*x) / w is inf, and a zero sum's sign lost inside a divisor (inf for -inf)
    A = np.array([[1.0, 0.0], [0.0, 3.0], [0.0, 0.0]])
    x = np.array([1.0, 1.0])
    w = np.array([0.0, 1.0, 0.0])
    c = np.array([2.0, 1.0, -2.0])
    given = {"A": A, "x": x, "w": w, "c": c}
    # numpy's dense values: the "ieee" convention (the sparse one: tests/test_division.py)
    k = sparsec.kernel(expr, {"A": a_fmt}, division="ieee")
    inputs = {t.name: given[t.name] for t in k.spec.inputs}
    if a_fmt != "dense":
        inputs["A"] = sparsec.Tensor.from_dense(A, a_fmt)
    with np.errstate(divide="ignore", invalid="ignore"):
        want = numpy(A, x, w, c)
    got = np.asarray(k(**inputs))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
    k.check(**inputs)


def test_check_evaluates_the_statement_as_written(monkeypatch):
    # The reference reads the notation, not the compiler's concrete statement: a compiler
    # that lifts the sum across the division (the bug above) is caught by check.
    from sparsec.base.errors import CheckError
    from sparsec.frontend.concrete import Statement
    from sparsec.frontend.notation import Access, BinOp

    def lifted_across_the_division(assignment, distributive=True):
        a, x, w = (Access("A", ("i", "j")), Access("x", ("j",)), Access("w", ("i",)))
        return Statement(assignment.lhs, BinOp("/", BinOp("*", a, x), w), ("j",), False)

    monkeypatch.setattr("sparsec.middle.spec.concretize", lifted_across_the_division)
    k = sparsec.Kernel("y(i) = (A(i,j) * x(j)) / w(i)", {"A": "csr"}, division="ieee")
    A = sparsec.Tensor.from_dense(np.array([[1.0, 0.0], [0.0, 3.0]]), "csr")
    with np.errstate(divide="ignore", invalid="ignore"):
        assert np.isnan(k(A=A, x=np.ones(2), w=np.array([0.0, 1.0]))[0])
    with pytest.raises(CheckError, match=r"differs from dense torch at \[0\]: got nan"):
        k.check(A=A, x=np.ones(2), w=np.array([0.0, 1.0]))


SPARSE_ACCUMULATE = [
    ("C(i,j) += A(i,j)", {"A": "csr", "C": "csr"}, lambda d: d["A"]),
    ("C(i,j) += A(i,j) * B(i,j)", {"A": "csc", "B": "dcsc", "C": "csc"}, lambda d: d["A"] * d["B"]),
    (
        "C(i,j) += A(i,j) - B(i,j)",
        {"A": "dcsr", "B": "csr", "C": "dcsr"},
        lambda d: d["A"] - d["B"],
    ),
    ("C(i,j) += A(i,k) * B(k,j)", {"A": "csr", "B": "csc", "C": "csr"}, lambda d: d["A"] @ d["B"]),
    (
        "C(i,j) += A(i,k) * B(k,j)",
        {"A": "csr", "B": "dense", "C": "coo"},
        lambda d: d["A"] @ d["B"],
    ),
    (
        "C(i,j) += 2 * A(i,j) / B(i,j)",
        {"A": "csr", "B": "dense", "C": "csr"},
        lambda d: 2 * d["A"] / d["B"],
    ),
    ("y(i) += A(i,j) * x(j)", {"A": "csr", "y": "s"}, lambda d: d["A"] @ d["x"]),
]


@pytest.mark.parametrize(
    "expr,formats,numpy", SPARSE_ACCUMULATE, ids=[f"{e} {f}" for e, f, _ in SPARSE_ACCUMULATE]
)
def test_sparse_accumulate_adds_to_the_given_value(expr, formats, numpy, rng):
    # issue 18: '+=' into a sparse output was refused ("write C = C + ... instead", which
    # was refused in turn); it now adds to the current value the caller passes as C
    out = "y" if expr.startswith("y") else "C"
    shapes = {"A": (6, 5), "B": (6, 5), "C": (6, 5), "x": (5,), "y": (6,)}
    if "k)" in expr:
        shapes.update(A=(6, 4), B=(4, 5))
    k = sparsec.kernel(expr, formats)
    names = {a.name for a in k.assignment.accesses()}
    dense = {n: sparse_array(shapes[n], rng) for n in names}
    if "/" in expr:
        dense["B"] = rng.uniform(0.5, 2.0, shapes["B"])
    dense[out][1] = 0.0  # an empty row the new terms may fill
    given = {
        n: sparsec.Tensor.from_dense(v, formats[n]) if formats.get(n, "dense") != "dense" else v
        for n, v in dense.items()
    }
    before = given[out].to_dense().copy()
    got = k(**given)
    assert isinstance(got, sparsec.Tensor) and got is not given[out]
    assert got.format == given[out].format
    np.testing.assert_allclose(got.to_dense(), dense[out] + numpy(dense), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(given[out].to_dense(), before)  # the caller's C is kept
    k.check(**given)


def test_sparse_accumulate_stores_the_union_of_the_patterns():
    c = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 2.0, 0.0]])
    a = np.array([[0.0, 3.0, 0.0], [0.0, 0.0, 4.0], [0.0, -2.0, 0.0]])
    k = sparsec.kernel("C(i,j) += A(i,j)", {"A": "csr", "C": "csr"})
    got = k(A=sparsec.Tensor.from_dense(a, "csr"), C=sparsec.Tensor.from_dense(c, "csr"))
    coords, vals = got.coords()
    assert sorted(zip(*coords.tolist(), strict=True)) == [(0, 0), (0, 1), (1, 2), (2, 1)]
    np.testing.assert_array_equal(got.to_dense(), c + a)  # 2 + -2 stays an explicit zero
    assert 0.0 in vals.tolist()


def test_every_refusal_of_reading_the_output_points_at_what_works():
    with pytest.raises(sparsec.NotationError, match=r"use \+= to accumulate into it") as err:
        sparsec.kernel("C(i,j) = C(i,j) + A(i,j)", {"A": "csr", "C": "csr"})
    assert "C(i,j) += <the other terms>" in str(err.value)
    assert "write C = C +" not in str(err.value)
    a = sparsec.Tensor.from_dense(np.eye(3), "csr")
    got = sparsec.kernel("C(i,j) += A(i,j)", {"A": "csr", "C": "csr"})(A=a, C=a)
    np.testing.assert_array_equal(got.to_dense(), 2 * np.eye(3))


def test_sparse_accumulate_names_the_current_value_as_the_output():
    k = sparsec.kernel("C(i,j) += A(i,j)", {"A": "csr", "C": "csr"})
    a = sparsec.Tensor.from_dense(np.eye(3), "csr")
    with pytest.raises(sparsec.InputError, match=r"missing input 'C'; kernel .* takes C, A"):
        k(A=a)
    with pytest.raises(sparsec.ShapeError):
        k(A=a, C=sparsec.Tensor.from_dense(np.eye(4), "csr"))
    inputs, _ = k.random_inputs({"i": 4, "j": 3})
    assert set(inputs) == {"A", "C"}
    k.check(**inputs)


def test_source_is_readable_c():
    src = sparsec.kernel(SPMV, {"A": "csr"}).source
    assert "restrict" in src and "A2_pos" in src and "A2_crd" in src and "x_vals" in src
    assert "formats: y: dense (d), A: csr (ds), x: dense (d)" in src


ZEROING = [
    # (expression, formats, output zeroed up front, stores with "=")
    ("y(i) = A(i,j) * x(j)", {"A": "csr"}, False, True),
    # empty rows are never visited (zeroed); a visited row is stored once
    ("y(i) = A(i,j) * x(j)", {"A": "dcsr"}, True, True),
    ("y(i) = A(i,j) * x(j)", {"A": "coo"}, True, True),  # a run of equal rows, stored once
    ("y(i) = A(i,j) * x(j)", {"A": "csc"}, True, False),  # scatter over rows
    ("C(i,j) = A(i,k) * B(k,j)", {"A": "csr"}, False, False),  # row slice zeroed in the loop
    ("a(i) = b(i) + c(i)", {"b": "s"}, True, True),  # co-iteration: one case stores each i
    ("A(i,j) = B(i,j,k) * c(k)", {"B": "csf"}, True, True),  # TTV: each fiber's sum once
    # a sequence of nests adds into each row (zeroed in the loop)
    ("A(i,j) = B(i,j) + C(i,k) * D(k,j)", {"B": "csr", "C": "csr", "D": "csr"}, False, False),
    ("A(i,j) = B(i,j) * c(j)", {"B": "dense"}, False, True),
]


@pytest.mark.parametrize("expr,formats,zeroed,assigns", ZEROING)
def test_output_zeroing_only_where_needed(expr, formats, zeroed, assigns, rng):
    k = sparsec.kernel(expr, formats)
    src = k.source
    assert ("// zero the output" in src) == zeroed
    accumulates = re.search(rf"\b{k.spec.output.name}_vals\[[^\]]+\] \+=", src) is not None
    assert accumulates == (not assigns)
    # and the answer is right with outputs poisoned (NaN) before the call
    inputs, _ = k.random_inputs({i: 9 for i in k.spec.indices}, seed=5)
    k.check(**inputs)


@pytest.mark.parametrize("rows", [30, 3000])  # outputs below and above the aligned size
def test_dense_outputs_reach_the_kernel_poisoned_in_test_mode(rows, monkeypatch, rng):
    """With SPARSEC_POISON=1 (set by conftest) a dense output is NaN when the kernel gets
    it, on the general path and on the fast path, so an element it fails to write shows."""
    # the modules that pass the output's address: the general path's and the fast path's
    call_paths = (sys.modules["sparsec.runtime.args"], sys.modules["sparsec.runtime.fastpath"])
    seen: list[bool] = []
    real_address = call_paths[0].address

    def recording(array):
        # the output: flat on the general path, in its shape on the fast path
        if isinstance(array, np.ndarray) and array.shape in ((rows * 100,), (rows, 100)):
            seen.append(bool(np.isnan(array).all()))
        return real_address(array)

    for module in call_paths:
        monkeypatch.setattr(module, "address", recording)
    k = sparsec.Kernel("C(i,j) = W(i,k) * X(k,j)", {"W": "csr"})
    w = sparsec.as_tensor(sparse_array((rows, 20), rng), "csr")
    x = rng.uniform(size=(20, 100))
    first = k(W=w, X=x)
    again = k(W=w, X=x)
    assert k._fast is not None and seen == [True, True]
    np.testing.assert_array_equal(first, again)


def test_repeated_calls_take_the_fast_path_and_still_validate(rng):
    k = sparsec.kernel("y(i) = alpha * A(i,j) * x(j)", {"A": "csr"})
    A = sparsec.Tensor.from_dense(sparse_array((30, 20), rng), "csr")
    x = rng.uniform(size=20)
    first = k(alpha=2.0, A=A, x=x)
    assert k._fast is not None
    for _ in range(3):
        np.testing.assert_array_equal(k(alpha=2.0, A=A, x=x), first)
    # different sizes through the same fast path
    B = sparsec.Tensor.from_dense(sparse_array((7, 5), rng), "csr")
    z = rng.uniform(size=5)
    np.testing.assert_allclose(k(alpha=0.5, A=B, x=z), 0.5 * (B.to_dense() @ z), rtol=1e-12)
    # inputs that do not fit fall back to the general path, which validates and converts
    with pytest.raises(sparsec.ShapeError):
        k(alpha=2.0, A=A, x=np.ones(21))
    with pytest.raises(sparsec.InputError):
        k(alpha=2.0, A=A)
    np.testing.assert_allclose(k(alpha=2, A=A, x=x.astype(np.float32)), first, rtol=1e-6)
    np.testing.assert_allclose(k(alpha=2.0, A=A.to_scipy(), x=x[::-1].copy()[::-1]), first)
    np.testing.assert_allclose(k(alpha=2.0, A=A, x=np.asfortranarray(x)), first)


def test_the_fast_path_is_written_for_its_kernel_without_user_text(rng):
    """The fast path's call is Python source generated per kernel: names reach it only as
    bound constants. It returns what the general path does, a scalar output included, and
    hands every call that does not fit back to the general path."""
    k = sparsec.Kernel("Out(row,col) = Weights(row,mid) * acts(mid,col)", {"Weights": "csr"})
    w = sparse_array((33, 21), rng)
    tensor = sparsec.as_tensor(w, "csr")
    acts = rng.uniform(size=(21, 70))
    first = k(Weights=tensor, acts=acts)
    assert k._fast is not None
    for word in ("Out", "Weights", "acts", "row", "col", "mid"):
        assert re.search(rf"\b{word}\b", k._fast.source) is None
    np.testing.assert_array_equal(k(Weights=tensor, acts=acts), first)
    np.testing.assert_allclose(first, w @ acts, rtol=1e-12)
    with pytest.raises(sparsec.ShapeError):
        k(Weights=tensor, acts=acts[:20].copy())
    np.testing.assert_allclose(k(Weights=tensor, acts=acts[:, ::2]), w @ acts[:, ::2], rtol=1e-12)

    # integer values: the OpenMP reduction's order varies between calls (dynamic chunks,
    # the thread count a loaded machine leaves), so only an exact sum compares bit for bit
    dot = sparsec.Kernel("s = a(i) * b(i)", {"a": "s"})
    a = sparse_array((40,), rng, integer=True)
    b = rng.integers(-9, 10, size=40).astype(np.float64)
    packed = sparsec.as_tensor(a, "s")
    once, twice = dot(a=packed, b=b), dot(a=packed, b=b)
    assert dot._fast is not None
    assert type(twice) is type(once) and np.ndim(twice) == 0
    assert twice == once and once == pytest.approx(float(a @ b), rel=1e-12)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_panel_operand_passed_transposed_takes_the_fast_path(dtype, monkeypatch, rng):
    """SparseLinear passes its activations as a transposed view, Xt = X(t,i).T. The fast
    path takes such a panel operand (`Columns.carriers`): it makes it C-ordered by the
    compiled copy and calls the kernel, with no turn through the general path, and gives
    the general path's values bit for bit, also for a view off a vector boundary."""
    from sparsec.runtime.executable import Executable

    k = sparsec.Kernel("C(i,j) = W(i,k) * X(k,j)", {"W": "csr"}, dtype=dtype)
    w = sparse_array((45, 37), rng, integer=True).astype(dtype)
    tensor = sparsec.as_tensor(w, "csr")
    tokens_first = rng.integers(-3, 4, size=(83, 40)).astype(dtype)
    want = w @ tokens_first[:, :37].T
    general = k(W=tensor, X=tokens_first[:, :37].T, threads=2)
    assert k._fast is not None
    runs = []
    real = Executable.run
    monkeypatch.setattr(Executable, "run", lambda self, *a: runs.append(1) or real(self, *a))
    for view in (tokens_first[:, :37].T, tokens_first[1:, 3:].T):
        assert not view.flags.c_contiguous
        got = k(W=tensor, X=view, threads=2)
        np.testing.assert_array_equal(got, w @ view)
    assert runs == []
    np.testing.assert_array_equal(general, want)


def test_the_fast_path_passes_its_arguments_packed_unless_a_scalar_is_among_them(rng):
    """A C kernel without scalar value parameters also exports ``sparsec_kernel_packed``,
    which reads the ABI's arguments from one int64 array; the fast path calls it (one
    ctypes argument), the general path the plain entry, and both give the same values."""
    k = sparsec.Kernel("C(i,j) = W(i,k) * X(k,j)", {"W": "csr"}, dtype="float32")
    w = sparse_array((45, 31), rng, integer=True).astype(np.float32)
    x = rng.integers(-3, 4, size=(31, 75)).astype(np.float32)
    tensor = sparsec.as_tensor(w, "csr")
    general = k(W=tensor, X=x, threads=2)
    assert k.generated("float32").packed and "int sparsec_kernel_packed(" in k.source
    assert k._fast is not None and "FNP(PACK(" in k._fast.source
    fast = k(W=tensor, X=x, threads=2)
    want = torch.einsum("ik,kj->ij", torch.from_numpy(w), torch.from_numpy(x)).numpy()
    np.testing.assert_array_equal(general, want)
    np.testing.assert_array_equal(fast, want)
    # no stored entries (empty crd and vals arrays) and a single column, through the same path
    empty = sparsec.as_tensor(np.zeros((45, 31), np.float32), "csr")
    np.testing.assert_array_equal(k(W=empty, X=x, threads=2), np.zeros((45, 75), np.float32))
    np.testing.assert_array_equal(k(W=tensor, X=x[:, :1].copy(), threads=1), want[:, :1])
    # a float scalar fits no int64: that kernel has the plain entry only
    scaled = sparsec.Kernel("y(i) = alpha * A(i,j) * x(j)", {"A": "csr"})
    assert not scaled.generated().packed and "sparsec_kernel_packed" not in scaled.source
    a = sparsec.as_tensor(sparse_array((12, 9), rng), "csr")
    v = rng.uniform(size=9)
    first = scaled(alpha=3.0, A=a, x=v)
    assert scaled._fast is not None and "FN(" in scaled._fast.source
    assert "FNP" not in scaled._fast.source
    np.testing.assert_array_equal(scaled(alpha=3.0, A=a, x=v), first)
