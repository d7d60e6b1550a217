"""Integer and bool values (issue 40): every integral type runs the core statements on C and
the CUDA emulation, exactly, against the numpy reference computed in that type
(`Kernel.check`) and against expectations written here from docs/semantics.md ("Value
types"): wrapping overflow, integer division, semiring identities per type, bool's or/and,
promotion, scalars, refusals, and `Tensor` holding the types. The semiring oracle's
``types`` family (tests/test_fuzz_semirings.py) and the core fuzz (tests/test_fuzz.py)
draw the types too."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sparsec
from sparsec.base.errors import DTypeError, InputError
from sparsec.base.values import INTEGRAL, promote

TARGETS = ("c", "cuda-emulated")
INTEGERS = tuple(t for t in INTEGRAL if t != "bool")

STATEMENTS = (
    ("y(i) = A(i,j) * x(j)", {"A": "csr"}),
    ("y(j) = A(i,j) * x(i)", {"A": "csr"}),  # a scatter: atomics on threads and the GPU
    ("C(i,j) = A(i,j) + B(i,j)", {"A": "csr", "B": "dcsr", "C": "csr"}),
    ("C(i,j) = A(i,k) * B(k,j)", {"A": "csr", "B": "csr", "C": "csr"}),
    ("C(i,j) = A(i,j) * D(i,k) * E(k,j)", {"A": "csr", "C": "csr"}),  # SDDMM
    ("A(i,j) = B(i,k,l) * D(l,j) * C(k,j)", {"B": "csf"}),  # MTTKRP
    ("y(i) = a * A(i,j) * x(j) + z(i)", {"A": "coo"}),
    ("C(i,j) = max(A(i,j), B(i,j)) - abs(B(i,j))", {"A": "csr", "B": "csr", "C": "dense"}),
    ("C(i,j) = A(i,j) / B(i,j)", {"A": "csr", "B": "csr", "C": "dense"}),
)


def _allowed(statement: str, dtype: str) -> bool:
    """bool has no '-' or '/' (refused: `test_bool_refuses_minus_and_division`)."""
    return dtype != "bool" or not ("-" in statement or "/" in statement)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", INTEGRAL)
def test_every_type_runs_the_core_statements(dtype, target):
    for n, (statement, formats) in enumerate(STATEMENTS):
        if not _allowed(statement, dtype):
            continue
        k = sparsec.kernel(statement, formats, dtype=dtype, target=target)
        inputs, _ = k.random_inputs(seed=n, density=0.4)
        result = k.check(**inputs, threads=2)
        assert result.dtype == dtype and result.max_abs_error == 0.0


@pytest.mark.parametrize("target", TARGETS)
def test_overflow_wraps_as_numpy(target):
    k = sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": "csr"}, target=target)
    a = np.array([[100, 100, 0], [-128, 0, -1], [0, 0, 0]], dtype=np.int8)
    x = np.array([2, 1, 1], dtype=np.int8)
    y = k(A=a, x=x)
    assert y.dtype == np.int8
    np.testing.assert_array_equal(y, a @ x)  # numpy wraps: 200 + 100 = 300 = 44 (mod 256)
    assert y.tolist() == [44, -1, 0]  # -256 - 1 = -257 wraps to -1
    big = np.array([[2**63 - 1, 2**63 - 1]], dtype=np.int64)
    assert k(A=big, x=np.array([1, 2], dtype=np.int64)).tolist() == [2**63 - 3]
    u = np.array([[2**64 - 1, 5]], dtype=np.uint64)
    assert k(A=u, x=np.array([2, 1], dtype=np.uint64)).tolist() == [3]


@pytest.mark.parametrize("target", TARGETS)
def test_integer_division_truncates_and_never_traps(target):
    k = sparsec.kernel(
        "C(i) = A(i) / B(i)", {"A": "dense", "B": "dense", "C": "dense"}, target=target
    )
    a = np.array([7, -7, 7, -7, 5, -5, 0, -128, -128, 127], dtype=np.int8)
    b = np.array([2, 2, -2, -2, 0, 0, 0, -1, 1, -1], dtype=np.int8)
    # truncation toward zero; x / 0: the largest value for x > 0, the smallest for x < 0, 0
    # for 0; the smallest / -1 wraps to itself
    assert k(A=a, B=b).tolist() == [3, -3, -3, 3, 127, -128, 0, -128, -128, -127]
    u = k(A=np.array([7, 0, 9], dtype=np.uint32), B=np.array([0, 0, 4], dtype=np.uint32))
    assert u.tolist() == [2**32 - 1, 0, 2]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(
    "ring,dtype,empty",
    [
        ("min_plus", "int64", 2**63 - 1),
        ("max_plus", "int64", -(2**63)),
        ("min_plus", "uint8", 255),
        ("max_times", "uint16", 0),
        ("min_times", "int32", 2**31 - 1),
        ("or_and", "bool", False),
    ],
)
def test_semiring_identity_is_the_types_limit(ring, dtype, empty, target):
    k = sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": "csr"}, semiring=ring, target=target)
    a = np.array([[0, 3, 1], [0, 0, 0], [2, 0, 0]], dtype=dtype)
    x = np.array([5, 1, 2], dtype=dtype)
    a_t = sparsec.Tensor.from_coo(np.array([[0, 0, 2], [1, 2, 0]]), a[a != 0], (3, 3), "csr")
    y = k(A=a_t, x=x)
    assert y.dtype == np.dtype(dtype)
    assert y[1] == empty  # an empty row: no term, the add's identity in the type
    k.check(A=a_t, x=x)


def test_min_plus_is_exact_beyond_two_to_the_53():
    # shortest paths with int64 weights past float64's integers
    k = sparsec.kernel("d(j) = A(i,j) * s(i)", {"A": "csr"}, semiring="min_plus")
    big = 2**60 + 1
    a = sparsec.Tensor.from_coo(np.array([[0, 1], [1, 2]]), np.array([big, 3]), (3, 3), "csr")
    d = k(A=a, s=np.array([0, big, 2**62], dtype=np.int64))
    assert d.tolist() == [2**63 - 1, big, big + 3]


@pytest.mark.parametrize("target", TARGETS)
def test_bool_is_or_and(target):
    k = sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": "csr"}, target=target)
    a = np.array([[1, 1, 0], [0, 0, 1], [0, 0, 0]], dtype=bool)
    y = k(A=a, x=np.array([True, True, False]))
    assert y.dtype == np.bool_ and y.tolist() == [True, False, False]
    add = sparsec.kernel("C(i,j) = A(i,j) + B(i,j)", {"A": "csr", "B": "csr", "C": "csr"})
    c = add(A=a, B=a)  # True + True is True: stored as 1, never 2
    assert c.vals.dtype == np.bool_ and c.vals.view(np.uint8).max() == 1


def test_bool_refuses_minus_and_division():
    flags = np.ones(3, dtype=bool)
    for statement in ("C(i) = A(i) - B(i)", "C(i) = A(i) / B(i)", "C(i) = -(A(i) + B(i))"):
        k = sparsec.kernel(statement, {"C": "dense"})
        with pytest.raises(DTypeError, match="no meaning on bool"):
            k(A=flags, B=flags)


def test_integral_kernels_refuse_floating_functions_and_literals():
    a = np.arange(4, dtype=np.int32)
    with pytest.raises(DTypeError, match=r"exp\(...\) computes in floating point"):
        sparsec.kernel("C(i) = exp(A(i))", {"C": "dense"})(A=a)
    with pytest.raises(DTypeError, match="the literal 0.5 is not a value of int32"):
        sparsec.kernel("C(i) = 0.5 * A(i)", {"C": "dense"})(A=a)
    # the same statements in floating point, by the dtype or by the inputs
    np.testing.assert_allclose(
        sparsec.kernel("C(i) = exp(A(i))", {"C": "dense"})(A=a * 1.0), np.exp(a)
    )
    assert sparsec.kernel("C(i) = 0.5 * A(i)", dtype="float64")(A=a).tolist() == [0, 0.5, 1, 1.5]


def test_scalars_must_be_values_of_the_type():
    k = sparsec.kernel("y(i) = a * x(i)", {"y": "dense"}, dtype="int8")
    assert k(a=3, x=np.array([1, 50], dtype=np.int8)).tolist() == [3, -106]
    with pytest.raises(DTypeError, match="300 is out of the range of int8"):
        k(a=300, x=np.ones(2, dtype=np.int8))
    with pytest.raises(DTypeError, match="2.5 is not a value of int8"):
        k(a=2.5, x=np.ones(2, dtype=np.int8))
    with pytest.raises(InputError, match="pass a number"):
        k(a=True, x=np.ones(2, dtype=np.int8))


@pytest.mark.parametrize(
    "types,want",
    [
        (("int8", "uint8"), "int16"),
        (("int32", "int64"), "int64"),
        (("uint16", "uint32"), "uint32"),
        (("bool", "int8"), "int8"),
        (("bool", "bool"), "bool"),
        (("uint64", "int64"), "float64"),  # no integer type holds both: numpy's float64
        (("int32", "float32"), "float32"),  # integer arrays take no part beside floats
        (("int64", "float16"), "float16"),
    ],
)
def test_promotion_is_one_rule_for_numpy_and_torch(types, want):
    k = sparsec.kernel("C(i) = A(i) * B(i)", {"C": "dense"})
    a = np.array([1, 2, 3]).astype(types[0])
    b = np.array([1, 0, 1]).astype(types[1])
    got = k(A=a, B=b)
    assert got.dtype == np.dtype(want)
    tgot = k(A=torch.from_numpy(a), B=torch.from_numpy(b))  # the same rule, torch's dtypes
    assert tgot.dtype == getattr(torch, want)
    if "float" not in "".join(types):
        assert promote(types) == want == np.result_type(*types).name


def test_a_float_scalar_makes_integer_arrays_compute_in_float64():
    k = sparsec.kernel("y(i) = a * x(i)", {"y": "dense"})
    assert k(a=2.5, x=np.array([1, 2], dtype=np.int32)).tolist() == [2.5, 5.0]
    assert k(a=2, x=np.array([1, 2], dtype=np.int32)).dtype == np.int32


@pytest.mark.parametrize("dtype", INTEGRAL)
def test_tensor_holds_every_type(dtype):
    dense = np.array([[0, 1, 0], [3, 0, 0], [0, 0, 0]]).astype(dtype)
    t = sparsec.Tensor.from_dense(dense, "csr")
    assert t.vals.dtype == np.dtype(dtype) and t.nnz == 2
    np.testing.assert_array_equal(t.to_dense(), dense)
    assert t.to_dense().dtype == np.dtype(dtype)
    np.testing.assert_array_equal(t.to_format("csc").to_dense(), dense)
    np.testing.assert_array_equal(t.to_scipy().toarray(), dense)
    if dtype not in ("uint16", "uint32", "uint64"):  # torch 2.13 has no sparse kernels for them
        back = sparsec.Tensor.from_torch(torch.from_numpy(dense).to_sparse_csr())
        np.testing.assert_array_equal(back.to_dense(), dense)
        assert back.vals.dtype == np.dtype(dtype)
    assert t.astype("float32").vals.dtype == np.float32


def test_stored_zeros_stay_entries():
    t = sparsec.Tensor.from_coo(
        np.array([[0, 1], [0, 1]]), np.array([0, 5], dtype=np.int16), (2, 2), "csr"
    )
    assert t.nnz == 2
    k = sparsec.kernel("C(i,j) = A(i,j) * B(i,j)", {"A": "csr", "B": "dense", "C": "csr"})
    c = k(A=t, B=np.full((2, 2), 3, dtype=np.int16))
    assert c.nnz == 2 and c.to_dense().tolist() == [[0, 0], [0, 15]]


def test_tensor_operators_keep_the_type():
    a = sparsec.Tensor.from_dense(np.array([[1, 0], [2, 3]], dtype=np.int32), "csr")
    assert (a @ np.array([1, 1], dtype=np.int32)).dtype == np.int32
    assert (a + a).vals.dtype == np.int32
    assert (a @ np.array([0.5, 1.0])).dtype == np.float64


def test_a_sum_moved_across_a_literal_division_is_refused_in_integers():
    # (Σj A x) / 2 is computed as Σj (A x / 2) for real numbers (docs: Reductions); integer
    # division truncates each term, so an integral kernel refuses rather than differ
    with pytest.raises(DTypeError, match="moved across a division by a literal"):
        sparsec.kernel("y(i) = A(i,j) * x(j) / 2", {"A": "csr"}, dtype="int32")
    k = sparsec.kernel("y(i) = A(i,j) * x(j) / 2", {"A": "csr"})
    with pytest.raises(DTypeError, match="divide the result after the call"):
        k(A=np.eye(2, dtype=np.int32), x=np.ones(2, dtype=np.int32))
    # a division inside the sum's term is no move: exact in the type
    t = sparsec.kernel("o = (T0(i) / 2) * T1(i)", {}, dtype="int32")
    assert t(T0=np.array([3, 5], dtype=np.int32), T1=np.array([1, 1], dtype=np.int32)) == 3


def test_a_sum_moved_across_a_plus_multiply_is_refused_in_integers():
    # min(a + s, b + s) is min(a, b) + s for real numbers; once a sum wraps it is not, so
    # an integral min_plus kernel whose sum the compiler would move across + s is refused
    with pytest.raises(DTypeError, match="moved across a product whose multiply is \\+"):
        sparsec.kernel("y(i) = A(i,j) * x(j) * s", {"A": "csr"}, semiring="min_plus", dtype="int64")
    plain = sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": "csr"}, semiring="min_plus", dtype="int64")
    assert plain(A=np.array([[1, 2]]), x=np.array([5, 1])).tolist() == [3]
    masked = sparsec.kernel(  # a mask only filters: its product moves nothing
        "O(j) = T(i,j)", {"T": "coo", "O": "s"}, semiring="max_plus", mask="~M", dtype="uint32"
    )
    assert masked.source
