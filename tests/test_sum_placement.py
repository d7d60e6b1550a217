"""Issue 36: where sums sit and what absent nodes are (items 1, 7, 8, 18, and the two
semantics it settles), on the C target and the CUDA emulation."""

from __future__ import annotations

import numpy as np
import pytest
from semiring_oracle import Leaf, Op, Operand, Oracle, place

import sparsec
from sparsec.base.errors import ScheduleError
from sparsec.frontend.concrete import concretize
from sparsec.frontend.parser import parse_expression

TARGETS = ("c", "cuda-emulated")
T = sparsec.Tensor


def sparse_vector(values: list[float], stored: list[int]) -> sparsec.Tensor:
    """A sparse vector storing ``values`` at ``stored`` (explicit zeros kept)."""
    v = np.asarray(values, dtype=float)
    return T.from_coo(np.array([stored]), v[stored], (len(v),), "s")


# ------------------------------------------------------------ item 1: semirings
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(("ring", "want"), [("max_times", -1.0), ("min_times", 6.0)])
def test_a_sum_does_not_cross_a_multiply_that_does_not_distribute(ring, want, target):
    """``max_k (max_i B(i,k)) * (max_j C(k,j))``: lifting both sums gave max over (i,j) of
    B*C = 6 (-3 * -2), but ``max(a, b) * c`` is ``min(a*c, b*c)`` for a negative c."""
    B = T.from_dense(np.array([[-1.0], [-3.0]]), "csr")
    C = T.from_dense(np.array([[-2.0, 1.0]]), "csr")
    k = sparsec.kernel(
        "a = B(i,k) * C(k,j)", {"B": "csr", "C": "csr"}, semiring=ring, target=target
    )
    assert float(k(B=B, C=C)) == want
    k.check(B=B, C=C)


def test_only_a_distributive_multiply_lets_a_sum_cross_it():
    text = "y(i) = A(i,j) * x(j) * c(i)"
    assert str(concretize(parse_expression(text))) == "y(i) = sum(j, A(i,j) * x(j) * c(i))"
    kept = "y(i) = sum(j, A(i,j) * x(j)) * c(i)"
    assert str(concretize(parse_expression(text), distributive=False)) == kept


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("ring", ["max_times", "min_times", "min_plus", "or_and"])
def test_masked_and_three_factor_products_under_a_semiring(ring, target):
    """``y(i) = B(i,k) * C(k,j) * D(j,l)`` masked by M: the sums over j and l sit on
    their factors; an empty column of B (k = 1) is absent, not ``-inf * -2 = +inf``."""
    B = np.array([[-1.0, 0.0, 2.0], [3.0, 0.0, -2.0], [0.0, 0.0, 0.0]])
    C = np.array([[-2.0, 1.0], [-2.0, -3.0], [0.0, -1.0]])
    D = np.array([[1.0, -1.0], [2.0, 0.0]])
    stored_B, stored_C = B != 0, C != 0
    stored_C[2, 0] = True  # an explicit zero
    M = sparse_vector([1.0, 0.0, 1.0], [0, 1])
    k = sparsec.kernel(
        "y(i) = B(i,k) * C(k,j) * D(j,l)",
        {"B": "csr", "C": "csc"},
        semiring=ring,
        mask="M",
        target=target,
    )
    got = k(
        B=T.from_coo(np.array(np.nonzero(stored_B)), B[stored_B], B.shape, "csr"),
        C=T.from_coo(np.array(np.nonzero(stored_C)), C[stored_C], C.shape, "csc"),
        D=D,
        M=M,
    )
    root = Op("*", Op("*", Leaf("B", ("i", "k")), Leaf("C", ("k", "j"))), Leaf("D", ("j", "l")))
    place(root, {"j", "k", "l"})
    oracle = Oracle(
        ring,
        {
            "B": Operand(B, stored_B),
            "C": Operand(C, stored_C),
            "D": Operand(D, np.ones((2, 2), bool)),
        },
        {"i": 3, "k": 3, "j": 2, "l": 2},
    )
    want, present = oracle.output(root, ("i",), False, None, (False, np.array([True, True, False])))
    np.testing.assert_array_equal(got, np.where(present, want, oracle.identity))


# --------------------------------------------------------------- item 8: placement
PLACED = [
    ("a = B(i) * C(l)", "a = sum(i, B(i)) * sum(l, C(l))"),
    ("a = B(i) * B(k)", "a = sum(i, B(i)) * sum(k, B(k))"),
    ("A(j) = B(i) * C(m,j)", "A(j) = sum(i, B(i)) * sum(m, C(m,j))"),
    ("A(k) = (C(k) - (B(j) + B(j))) * B(m)", "A(k) = (C(k) - sum(j, B(j) + B(j))) * sum(m, B(m))"),
    # a factor with no sum is crossed, as before (MTTKRP's k crosses D(l,j))
    ("A(i,j) = B(i,k,l) * C(k,j) * D(l,j)", "A(i,j) = sum(l,k, B(i,k,l) * C(k,j) * D(l,j))"),
    ("a(i) = B(i,k) * c(k) * d(i)", "a(i) = sum(k, B(i,k) * c(k) * d(i))"),
]


@pytest.mark.parametrize(("text", "expected"), PLACED)
def test_two_factors_sums_stay_on_their_factors(text, expected):
    assert str(concretize(parse_expression(text))) == expected


def test_independent_sums_keep_infinities_on_c():
    """``(Σi B)(Σl C)`` is ``inf * 1``; the double loop computed ``inf * 0`` (a stored 0)."""
    B, C = sparse_vector([np.inf, 0.0], [0, 1]), sparse_vector([0.0, 1.0], [0, 1])
    k = sparsec.kernel("a = B(i) * C(l)", {"B": "s", "C": "s"})
    assert float(k(B=B, C=C)) == np.inf
    k.check(B=B, C=C)


@pytest.mark.parametrize("target", TARGETS)
def test_a_sum_on_one_factor_keeps_infinities(target):
    """``A(j) = (Σi B(i)) * (Σm C(m,j))``: inf where C's column sums to 1 through a stored 0."""
    B = sparse_vector([np.inf, 2.0], [0, 1])
    C = T.from_coo(np.array([[0, 1, 1], [0, 0, 1]]), np.array([0.0, 1.0, -1.0]), (2, 2), "csr")
    k = sparsec.kernel("A(j) = B(i) * C(m,j)", {"B": "s", "C": "csr"}, target=target)
    with np.errstate(invalid="ignore"):
        got = k(B=B, C=C)
    np.testing.assert_array_equal(got, [np.inf, -np.inf])
    k.check(B=B, C=C)


def test_a_schedule_cannot_reorder_sums_that_stay_apart():
    with pytest.raises(ScheduleError, match="i is summed inside a nested sum"):
        sparsec.kernel("a = B(i) * B(k)", {"B": "s"}, schedule="reorder(i,k)")


@pytest.mark.parametrize("target", ["c"])
def test_an_absent_nested_sum_times_an_infinite_one_is_absent(target):
    """Found by the placement fuzz: ``(Σl B(l)) * (Σj C(j))`` with B storing nothing is
    absent (0), not ``0 * -inf``."""
    B, C = sparse_vector([0.0, 0.0], []), np.array([-np.inf, 1.0])
    k = sparsec.kernel("a = B(l) * C(j)", {"B": "s"}, target=target)
    assert float(k(B=B, C=C)) == 0.0
    k.check(B=B, C=C)


# ------------------------------------------------- item 7 and absent nodes in divisors
DIVISORS = [
    # (expression, sparse, ieee) with B = [1, -2, 3, -4], C = [1, -, -, 2], D = [2, -, -1, -]
    ("y(i) = B(i) / (C(i) / D(i))", [2.0, -np.inf, np.inf, -0.0], [2.0, np.nan, -np.inf, -0.0]),
    ("y(i) = B(i) / (B(i) * C(i))", [1.0, -np.inf, np.inf, 0.5], [1.0, np.inf, np.inf, 0.5]),
    ("y(i) = B(i) / -C(i)", [-1.0, -np.inf, np.inf, 2.0], [-1.0, np.inf, -np.inf, 2.0]),
    ("y(i) = B(i) / (C(i) - D(i))", [-1.0, -np.inf, 3.0, -2.0], [-1.0, -np.inf, 3.0, -2.0]),
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(("text", "sparse", "ieee"), DIVISORS)
def test_an_absent_node_inside_a_divisor_is_positive_zero(text, sparse, ieee, target):
    """Under ``"sparse"`` an absent node of a divisor is +0, never computed (no ``0/0``
    of an absent quotient, no ``-0`` of an absent product or negation); ``"ieee"`` is dense
    IEEE arithmetic (``B * 0`` is ``-0`` for a negative B)."""
    inputs = {
        "B": sparse_vector([1.0, -2.0, 3.0, -4.0], [0, 1, 2, 3]),
        "C": sparse_vector([1.0, 0.0, 0.0, 2.0], [0, 3]),
        "D": sparse_vector([2.0, 0.0, -1.0, 0.0], [0, 2]),
    }
    used = {n: v for n, v in inputs.items() if f"{n}(" in text}
    for division, want in (("sparse", sparse), ("ieee", ieee)):
        k = sparsec.kernel(text, dict.fromkeys(used, "s"), division=division, target=target)
        with np.errstate(all="ignore"):
            got = k(**used)
        np.testing.assert_array_equal(got, want, err_msg=division)
        k.check(**used)


# ------------------------------------------------------------- or_and's += (settled)
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("out", ["s", "dense"])
def test_or_and_accumulate_stores_truth_values(out, target):
    """``y += E`` under or_and stores ``y or E``: a current 2 or 3 becomes 1, whether a term
    of E reaches it (row 0) or not (row 2)."""
    A = T.from_dense(np.array([[0.0, 1.0], [0.0, 0.0], [0.0, 0.0], [1.0, 0.0]]), "csr")
    y = sparse_vector([2.0, 0.0, 3.0, 0.0], [0, 2]) if out == "s" else np.array([2.0, 0, 3, 0])
    k = sparsec.kernel(
        "y(i) += A(i,j) * x(j)", {"A": "csr", "y": out}, semiring="or_and", target=target
    )
    got = k(A=A, x=np.ones(2), y=y)
    dense = got.to_dense() if isinstance(got, sparsec.Tensor) else got
    np.testing.assert_array_equal(dense, [1.0, 0.0, 1.0, 1.0])
    k.check(A=A, x=np.ones(2), y=y)


# -------------------------------------------------------------------- item 18: check
def test_check_names_the_reference_it_compared_with():
    A = T.from_dense(np.array([[1.0, 0.0], [2.0, 3.0]]), "csr")
    k = sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": "csr"}, semiring="max_plus")
    assert "matches the dense max_plus reference (numpy)" in str(k.check(A=A, x=np.ones(2)))
    assert "dense torch" not in str(k.check(A=A, x=np.ones(2)))
    plain = sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": "csr"})
    assert "matches dense torch" in str(plain.check(A=A, x=np.ones(2)))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(
    ("mask", "want"), [("", [1.0, 0.0, 1.0, 1.0]), ("M", [1.0, 0.0, 3.0, 0.0])]
)
def test_or_and_accumulate_into_a_scattered_dense_output(mask, want, target):
    """Found by the semiring fuzz: ``y(i) += A(j,i) * x(j)`` with A in CSR scatters into y
    and reaches rows 0 and 3 only; row 2 kept its 3 (a dense output's elements the loops
    never visit). It is ``3 or nothing``, 1, inside the mask; outside the mask (rows 2
    and 3 under M) y keeps its value."""
    A = T.from_dense(np.array([[0.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0]]), "csr")
    y = np.array([2.0, 0.0, 3.0, 0.0])
    inputs = {"A": A, "x": np.ones(2), "y": y}
    if mask:
        inputs["M"] = sparse_vector([1.0, 0.0, 0.0, 0.0], [0, 1])  # an explicit zero at 1
    k = sparsec.kernel(
        "y(i) += A(j,i) * x(j)", {"A": "csr"}, semiring="or_and", target=target, mask=mask
    )
    np.testing.assert_array_equal(k(**inputs), want)
    k.check(**inputs)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("mask", ["M", "~M"])
def test_or_and_masked_accumulate_into_a_sparse_output_keeps_the_outside(mask, target):
    """Found by the slow semiring fuzz: ``y += E`` masked, into a sparse y, is compiled as
    ``y = y_old + M*E`` and read y_old as truth values everywhere: a stored 3 outside the
    mask came back 1. Inside it is ``y or E`` (1), outside y keeps its value."""
    A = T.from_dense(np.array([[0.0, 1.0], [0.0, 0.0], [0.0, 0.0], [1.0, 0.0]]), "csr")
    y = sparse_vector([2.0, 0.0, 3.0, 0.0], [0, 2])
    M = sparse_vector([1.0, 0.0, 0.0, 0.0], [0, 1])  # an explicit zero at 1
    k = sparsec.kernel(
        "y(i) += A(i,j) * x(j)", {"A": "csr", "y": "s"}, semiring="or_and", mask=mask, target=target
    )
    got = k(A=A, x=np.ones(2), y=y, M=M)
    want = [1.0, 0.0, 3.0, 0.0] if mask == "M" else [2.0, 0.0, 1.0, 1.0]
    np.testing.assert_array_equal(got.to_dense(), want)
    k.check(A=A, x=np.ones(2), y=y, M=M)
