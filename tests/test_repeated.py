"""Repeated indices (issue 23 item 2): ``A(i,i)`` and ``B(i,i,j)`` read the stored entries
whose repeated coordinates agree (a derived input filtered at call time), against
torch.einsum on the densified inputs; C and cuda-emulated, float32/float64 values with
int32/int64 indices, dense and sparse operands and outputs, empty rows and stored zeros.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sparsec
from sparsec.base.errors import NotationError, ShapeError
from sparsec.tensors import convert

DTYPES = [("float32", "int32"), ("float64", "int64")]


def _array(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Random values, about half zeros, an empty first slice, a nonzero and a zero on the
    diagonal."""
    rng = np.random.default_rng(seed)
    a = rng.uniform(-2, 2, shape) * (rng.random(shape) < 0.5)
    a[0] = 0.0
    a[(1,) * len(shape)] = 1.5
    a[(2,) * len(shape)] = 0.0
    return a


def _tensor(a: np.ndarray, fmt: str, dtype: str, index_dtype: str) -> object:
    if fmt == "dense":
        return a.astype(dtype)
    t = sparsec.Tensor.from_dense(a, fmt, dtype=dtype, index_dtype=index_dtype)
    if t.nnz and fmt != "coo":
        # store an explicit zero on the diagonal: present, valued 0
        coords = np.concatenate([t.coords()[0], np.full((len(a.shape), 1), 2)], axis=1)
        vals = np.concatenate([t.coords()[1], [0.0]])
        t = sparsec.Tensor.from_coo(
            coords, vals, a.shape, fmt, index_dtype=index_dtype, dtype=dtype
        )
    return t


def _close(got: object, want: torch.Tensor, dtype: str) -> None:
    got = got.to_dense() if isinstance(got, sparsec.Tensor) else np.asarray(got)
    tol = 1e-4 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(got, want.numpy(), rtol=tol, atol=tol)


#: (expression, shape of A or B, einsum of the reference, the output's sparse format)
CASES = [
    ("a = A(i,i)", (5, 5), "ii->", None),
    ("y(i) = A(i,i)", (5, 5), "ii->i", "s"),
    ("y(j) = B(i,i,j)", (4, 4, 6), "iij->j", "s"),
    ("Y(i,j) = B(i,i,j)", (4, 4, 6), "iij->ij", "csr"),
    ("y(i) = B(j,i,j)", (5, 4, 5), "jij->i", "s"),
]
MATRIX_FORMATS = ["dense", "csr", "csc", "dcsr", "coo"]
TENSOR_FORMATS = ["dense", "sss", "dsd", "sss:2,0,1"]


def _formats(shape: tuple[int, ...]) -> list[str]:
    return MATRIX_FORMATS if len(shape) == 2 else TENSOR_FORMATS


@pytest.mark.parametrize("dtype,index_dtype", DTYPES)
@pytest.mark.parametrize("expr,shape,einsum,out", CASES, ids=[c[0] for c in CASES])
def test_repeated_index_on_c(expr, shape, einsum, out, dtype, index_dtype):
    name = expr.split("= ")[1][0]
    a = _array(shape, 1)
    want = torch.einsum(einsum, torch.from_numpy(a))
    for fmt in _formats(shape):
        value = _tensor(a, fmt, dtype, index_dtype)
        outputs = [None, out] if out else [None]
        for output in outputs:
            formats = {name: fmt}
            if output:
                formats[expr.split("(")[0]] = output
            k = sparsec.kernel(expr, formats)
            assert "filtered at call time" in k.schedule
            _close(k(**{name: value}), want, dtype)


@pytest.mark.parametrize("dtype,index_dtype", DTYPES)
@pytest.mark.parametrize("expr,shape,einsum,out", CASES, ids=[c[0] for c in CASES])
def test_repeated_index_on_cuda_emulated(expr, shape, einsum, out, dtype, index_dtype):
    name = expr.split("= ")[1][0]
    a = _array(shape, 2)
    want = torch.einsum(einsum, torch.from_numpy(a))
    for fmt in _formats(shape)[:2]:
        k = sparsec.kernel(expr, {name: fmt}, target="cuda-emulated")
        _close(k(**{name: _tensor(a, fmt, dtype, index_dtype)}), want, dtype)


@pytest.mark.parametrize("fmt", ["dense", "csr", "coo"])
def test_a_diagonal_in_a_product(fmt):
    a, b = _array((5, 5), 3), _array((5, 6), 4)
    x = np.arange(5.0)
    A = _tensor(a, fmt, "float64", "int32")
    ta, tb, tx = (torch.from_numpy(v) for v in (a, b, x))
    k = sparsec.kernel("y(i) = A(i,i) * x(i)", {"A": fmt})
    _close(k(A=A, x=x), torch.einsum("ii,i->i", ta, tx), "float64")
    k = sparsec.kernel("C(i,j) = A(i,i) * B(i,j)", {"A": fmt, "B": "csr", "C": "csr"})
    _close(k(A=A, B=sparsec.Tensor.from_dense(b, "csr")), torch.einsum("ii,ij->ij", ta, tb), "")
    # a tensor read on its diagonal and whole; and a diagonal read against its transpose
    k = sparsec.kernel("y(i) = A(i,j) * A(j,j)", {"A": fmt})
    _close(k(A=A), torch.einsum("ij,jj->i", ta, ta), "float64")
    assert k.check(A=A).max_abs_error < 1e-9


def test_presence_is_the_stored_diagonal():
    # a stored zero on the diagonal is present: a sparse output keeps it
    a = np.diag([1.0, 0.0, 3.0, 0.0])
    coords = np.array([[0, 1, 2, 3], [0, 1, 2, 0]])
    A = sparsec.Tensor.from_coo(coords, np.array([1.0, 0.0, 3.0, 7.0]), (4, 4), "csr")
    k = sparsec.kernel("y(i) = A(i,i)", {"A": "csr", "y": "s"})
    y = k(A=A)
    np.testing.assert_array_equal(y.to_dense(), np.diag(a))
    assert y.nnz == 3  # (0,0), the stored zero (1,1), (2,2); not (3,0)


def test_a_tensor_passed_again_filters_once(monkeypatch):
    calls = []
    real = convert.derive_entries

    def counted(*args, **kwargs):
        calls.append(args[3])
        return real(*args, **kwargs)

    monkeypatch.setattr(convert, "derive_entries", counted)
    a = _array((6, 6), 5)
    A = sparsec.Tensor.from_dense(a, "csr")
    k = sparsec.kernel("a = A(i,i)", {"A": "csr"})
    for _ in range(3):
        assert k(A=A) == pytest.approx(np.trace(a))
    # another expression with the same pattern reuses the copy
    k2 = sparsec.kernel("y(j) = A(j,j)", {"A": "csr"})
    np.testing.assert_allclose(k2(A=A), np.diag(a))
    assert len(calls) == 1


def test_repeated_modes_need_equal_extents():
    k = sparsec.kernel("a = A(i,i)", {"A": "csr"})
    with pytest.raises(ShapeError, match="index i has extent 3 .* but 4"):
        k(A=np.ones((3, 4)))


def test_the_output_may_not_repeat_an_index():
    with pytest.raises(NotationError, match="appears twice in Y\\(i,i\\), the output"):
        sparsec.kernel("Y(i,i) = A(i)")


def test_check_and_random_inputs():
    k = sparsec.kernel("y(j) = B(i,i,j)", {"B": "sss"})
    inputs, dims = k.random_inputs()
    assert inputs["B"].shape == (dims["i"], dims["i"], dims["j"])
    assert k.check(**inputs).max_abs_error < 1e-9
