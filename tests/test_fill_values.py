"""Fill values (issue 40): a `Tensor`'s ``fill_value`` is the value of its absent entries
(pydata sparse's and Finch's), written by ``to_dense`` and kept by conversions; a kernel
reads a tensor whose fill is not its absent value (0, or the semiring's identity) as the
dense array it stands for (docs/semantics.md, "Fill values"). The differential family
compares a call on filled sparse inputs with the same statement on their dense arrays
through an all-dense kernel, itself checked against torch."""

from __future__ import annotations

import pickle
import random

import numpy as np
import pytest
from generators import random_statement

import sparsec
from sparsec.base.errors import DTypeError, FormatError

INF = np.inf


def test_to_dense_writes_the_fill_and_from_dense_stores_the_rest():
    a = np.array([[1.0, INF, INF], [INF, 0.0, 3.0]])
    t = sparsec.Tensor.from_dense(a, "csr", fill_value=INF)
    assert t.nnz == 3 and t.fill_value == INF  # the stored 0 is an entry
    np.testing.assert_array_equal(t.to_dense(), a)
    assert "fill_value=inf" in repr(t)
    plain = sparsec.Tensor.from_dense(np.ones((2, 3)), "csr")
    assert plain.fill_value is None and plain.to_dense().min() == 1


def test_conversions_keep_the_fill():
    a = np.array([[2, 7, 7], [7, 7, 5]], dtype=np.int32)
    t = sparsec.Tensor.from_dense(a, "csr", fill_value=7)
    for converted in (
        t.to_format("csc"),
        t.to_format("coo"),
        t.astype("int64"),
        pickle.loads(pickle.dumps(t)),
    ):
        assert converted.fill_value == 7
        np.testing.assert_array_equal(converted.to_dense(), a)
    dense = t.to_format("dense")
    assert dense.nnz == 6 and dense.to_dense().tolist() == a.tolist()
    stored = sparsec.Tensor.from_coo([[0, 1], [0, 1]], [7, 3], (2, 2), "csr", fill_value=7)
    assert stored.nnz == 2 and stored.eliminate_zeros().nnz == 1  # the stored fill dropped
    assert stored.with_fill_value(None).to_dense().tolist() == [[7, 0], [0, 3]]


def test_a_fill_is_a_value_of_the_type_and_scipy_torch_have_none():
    with pytest.raises(DTypeError, match="fill_value 2.5 is not a value of int8"):
        sparsec.Tensor.from_dense(np.zeros((2, 2), np.int8), "csr", fill_value=2.5)
    t = sparsec.Tensor.from_dense(np.ones((2, 2)), "csr", fill_value=1.0)
    with pytest.raises(FormatError, match="absent entries as 0"):
        t.to_scipy()
    with pytest.raises(FormatError, match="absent entries as 0"):
        t.to_torch()
    nan = sparsec.Tensor.from_dense(np.array([[np.nan, 1.0]]), "csr", fill_value=np.nan)
    assert nan.nnz == 1 and np.isnan(nan.to_dense()[0, 0])


def test_a_fill_that_takes_part_reads_the_operand_dense():
    a = np.array([[2.0, 1.0, 1.0], [1.0, 1.0, 5.0]])
    t = sparsec.Tensor.from_dense(a, "csr", fill_value=1.0)
    assert t.nnz == 2
    k = sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": "csr"})
    x = np.array([1.0, 2.0, 3.0])
    np.testing.assert_array_equal(k(A=t, x=x), a @ x)
    k.check(A=t, x=x)


@pytest.mark.parametrize("dtype", ["float64", "int64", "uint16"])
def test_a_semirings_identity_as_fill_keeps_the_operand_sparse(dtype):
    far = INF if dtype == "float64" else np.iinfo(dtype).max
    d = np.array([[0, 4, far], [far, 0, 1], [2, far, 0]], dtype=dtype)
    t = sparsec.Tensor.from_dense(d, "csr", fill_value=far)
    assert t.nnz == 6
    k = sparsec.kernel(
        "C(i,j) = A(i,k) * B(k,j)", {"A": "csr", "B": "csr", "C": "csr"}, semiring="min_plus"
    )
    got = k(A=t, B=t)
    assert got.to_dense().tolist() == [[0, 4, 5], [3, 0, 1], [2, 6, 0]]
    k.check(A=t, B=t)
    # a 0 fill under min_plus is a distance 0 everywhere: read dense
    zero = t.with_fill_value(0)
    dense = np.where(d == far, 0, d)
    want = (dense[:, :, None] + dense[None, :, :]).min(axis=1)
    np.testing.assert_array_equal(k(A=zero, B=zero).to_dense(), want)


def test_a_masks_fill_is_never_read():
    m = sparsec.Tensor.from_coo([[0, 1, 2], [0, 1, 2]], np.ones(3), (3, 3), "csr", fill_value=5.0)
    k = sparsec.kernel(
        "C(i,j) = A(i,j) * B(i,j)", {"A": "dense", "B": "dense", "C": "csr"}, mask="M"
    )
    got = k(A=np.full((3, 3), 2.0), B=np.full((3, 3), 3.0), M=m)
    assert got.nnz == 3 and got.to_dense().tolist() == (np.eye(3) * 6).tolist()


# ---------------------------------------------------------------- the differential family
FILLS = (None, 0.0, 1.0, -2.0, 0.5)


DRAWS = 10


def _case(seed: int) -> None:
    """One statement, compiled once, on `DRAWS` draws of data and fills."""
    r = random.Random(seed)
    expr, tensors = random_statement(r, depth=2, stop=0.35, divide=0.0, max_free=2)
    formats = {
        name: r.choice(["csr", "csc", "dcsr", "coo"] if len(ix) == 2 else ["s", "dense"])
        for name, ix in tensors.items()
        if len(ix) in (1, 2)
    }
    sparse = {name: fmt for name, fmt in formats.items() if fmt != "dense"}
    k = sparsec.kernel(expr, sparse)
    reference = sparsec.kernel(expr, {})  # every operand dense
    rng = np.random.default_rng(seed)
    for draw in range(DRAWS):
        dims = {i: r.choice([1, 2, 3, 4]) for i in "ijk"}
        inputs, dense = {}, {}
        for name, ix in tensors.items():
            shape = tuple(dims[i] for i in ix)
            values = rng.integers(-3, 4, shape).astype(np.float64)
            if name in sparse:
                fill = r.choice(FILLS)
                holes = rng.random(shape) < 0.5
                values = np.where(holes, 0.0 if fill is None else fill, values)
                inputs[name] = sparsec.Tensor.from_dense(values, sparse[name], fill_value=fill)
            else:
                inputs[name] = values if ix else float(values)
            dense[name] = values if ix else float(values)
        if draw == 0:
            reference.check(**dense)  # the reference itself against torch
        got = k(**inputs)
        want = reference(**dense)
        got = got.to_dense() if isinstance(got, sparsec.Tensor) else got
        note = f"{expr} {sparse} seed={seed} draw={draw}"
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12, err_msg=note)


def test_fill_fuzz_fast():
    for seed in range(20):  # 200 cases
        _case(seed)


@pytest.mark.slow
@pytest.mark.parametrize("part", range(4))
def test_fill_fuzz_slow(part):
    for seed in range(1000 + part, 1200, 4):  # 2,000 cases
        _case(seed)
