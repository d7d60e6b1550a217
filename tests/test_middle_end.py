"""Middle end as tables: reduction placement, merge lattices, iteration-graph orders."""

from __future__ import annotations

import pytest

from sparsec.base.errors import LoweringError
from sparsec.frontend.concrete import ZERO, concretize, exact, without
from sparsec.frontend.notation import Access
from sparsec.frontend.parser import parse_expression
from sparsec.middle.lattice import Iterator, build
from sparsec.middle.order import loop_order
from sparsec.middle.spec import make_spec
from sparsec.tensors.formats import parse_format

# ---------------------------------------------------------------- reductions
PLACEMENT = [
    ("y(i) = A(i,j) * x(j)", "y(i) = sum(j, A(i,j) * x(j))"),
    ("a = B(i,j) * C(i,j)", "a = sum(i,j, B(i,j) * C(i,j))"),
    ("A(i,j) = B(i,k,l) * D(l,j) * C(k,j)", "A(i,j) = sum(k,l, B(i,k,l) * D(l,j) * C(k,j))"),
    ("a(i) = B(i,k) * c(k) + d(i)", "a(i) = sum(k, B(i,k) * c(k)) + d(i)"),
    ("r(i) = b(i) - A(i,k) * x(k)", "r(i) = b(i) - sum(k, A(i,k) * x(k))"),
    ("a(i) = B(i,k) * c(k) + D(i,k)", "a(i) = sum(k, B(i,k) * c(k) + D(i,k))"),
    (
        "a(i) = alpha * B(i,k) * c(k) + beta * d(i)",
        "a(i) = sum(k, alpha * B(i,k) * c(k)) + beta * d(i)",
    ),
    ("a(i) = -(B(i,k) * c(k))", "a(i) = sum(k, -(B(i,k) * c(k)))"),
    # a sum is never moved across a division by a non-literal: (Σk X) / d is inf where
    # d = 0, Σk (X / d) is NaN as soon as one X is 0 (issue 18)
    ("a(i) = B(i,k) * c(k) / d(i)", "a(i) = sum(k, B(i,k) * c(k)) / d(i)"),
    ("y(i) = (A(i,j) * x(j)) / w(i)", "y(i) = sum(j, A(i,j) * x(j)) / w(i)"),
    ("y(i) = A(i,j) / d(i)", "y(i) = sum(j, A(i,j)) / d(i)"),
    # ... but it is lifted over a non-zero literal divisor (a finite factor)
    ("a(i) = B(i,k) * c(k) / 2", "a(i) = sum(k, B(i,k) * c(k) / 2.0)"),
    # nor through a product with a factor that divides (it may be inf: 0 * inf is NaN)
    ("a(i) = (B(i,k) * c(k)) * (1 / d(i))", "a(i) = sum(k, B(i,k) * c(k)) * (1.0 / d(i))"),
    # a factor that does not divide is finite: the sum is lifted over it
    ("a(i) = (B(i,k) / d(k)) * e(i)", "a(i) = sum(k, B(i,k) / d(k) * e(i))"),
    # nothing inside a divisor moves: there the sign of a zero sum decides +inf or -inf
    ("a(i) = 1 / ((B(i,k) * c(k)) * d(i))", "a(i) = 1.0 / (sum(k, B(i,k) * c(k)) * d(i))"),
    ("a(i) = 1 / -(B(i,k) * c(k))", "a(i) = 1.0 / -sum(k, B(i,k) * c(k))"),
    ("a(i) = d(i) / (B(i,k) * c(k))", "a(i) = d(i) / sum(k, B(i,k) * c(k))"),
    (
        "a(i) = B(i,k) * (C(k,l) * d(l) + e(k))",
        "a(i) = sum(k, B(i,k) * (sum(l, C(k,l) * d(l)) + e(k)))",
    ),
    ("a(i) = (B(i,k) + C(i,k)) * d(k)", "a(i) = sum(k, (B(i,k) + C(i,k)) * d(k))"),
    ("y(i) += A(i,j) * x(j)", "y(i) += sum(j, A(i,j) * x(j))"),
]


@pytest.mark.parametrize("text,expected", PLACEMENT)
def test_sum_placement(text, expected):
    assert str(concretize(parse_expression(text))) == expected


def test_nested_sum_in_product_is_lifted_into_enclosing_sum():
    # B * (C*d + e): the l sum sits under "+", so it stays nested inside the k sum
    st = concretize(parse_expression("a(i) = B(i,k) * (C(k,l) * d(l) + e(k))"))
    assert st.top_sums == ("k",)


# ------------------------------------------------------------------ lattices
def _lattice(text: str, formats: dict[str, str], var: str):
    st = concretize(parse_expression(text))
    orders = {a.name: a.order for a in parse_expression(text).accesses()}
    fmts = {n: parse_format(formats.get(n, "dense"), o, n) for n, o in orders.items()}

    def iterator_of(access: Access):
        fmt = fmts[access.name]
        levels = [access.indices[m] for m in fmt.ordering]
        if var in levels and fmt.levels[levels.index(var)].position_iteration:
            return Iterator(access, levels.index(var))
        return None

    # the lattices of division="ieee" (the sparse convention's: tests/test_division.py)
    lattice = build(st.rhs, iterator_of, exact(st.rhs, "ieee"))
    return [
        (sorted(str(it) for it in p.iterators), str(p.expr)) for p in lattice.points
    ], lattice.full


LATTICES = [
    # intersection: one point
    ("a(i) = b(i) * c(i)", {"b": "s", "c": "s"}, [(["b1", "c1"], "b(i) * c(i)")], False),
    # union: both, then each alone
    (
        "a(i) = b(i) + c(i)",
        {"b": "s", "c": "s"},
        [(["b1", "c1"], "b(i) + c(i)"), (["b1"], "b(i)"), (["c1"], "c(i)")],
        False,
    ),
    # dense operand: locate, not iterate (b * c with c dense iterates b only)
    ("a(i) = b(i) * c(i)", {"b": "s"}, [(["b1"], "b(i) * c(i)")], False),
    # union with a dense operand covers every coordinate: full lattice
    ("a(i) = b(i) + c(i)", {"b": "s"}, [(["b1"], "b(i) + c(i)"), ([], "c(i)")], True),
    # subtraction keeps the sign of the right operand alone
    (
        "a(i) = b(i) - c(i)",
        {"b": "s", "c": "s"},
        [(["b1", "c1"], "b(i) - c(i)"), (["b1"], "b(i)"), (["c1"], "-c(i)")],
        False,
    ),
    # (b + c) * d: every point needs d
    (
        "a(i) = (b(i) + c(i)) * d(i)",
        {"b": "s", "c": "s", "d": "s"},
        [
            (["b1", "c1", "d1"], "(b(i) + c(i)) * d(i)"),
            (["b1", "d1"], "b(i) * d(i)"),
            (["c1", "d1"], "c(i) * d(i)"),
        ],
        False,
    ),
    # four operands, mixed
    (
        "a(i) = b(i) + c(i) + d(i) * e(i)",
        {"b": "s", "c": "s", "d": "s"},
        [
            (["b1", "c1", "d1"], "b(i) + c(i) + d(i) * e(i)"),
            (["b1", "d1"], "b(i) + d(i) * e(i)"),
            (["c1", "d1"], "c(i) + d(i) * e(i)"),
            (["b1", "c1"], "b(i) + c(i)"),
            (["b1"], "b(i)"),
            (["c1"], "c(i)"),
            (["d1"], "d(i) * e(i)"),
        ],
        False,
    ),
    # a scalar or a literal is present everywhere
    ("a(i) = alpha * b(i)", {"b": "s"}, [(["b1"], "alpha * b(i)")], False),
    ("a(i) = b(i) + 2", {"b": "s"}, [(["b1"], "b(i) + 2.0"), ([], "2.0")], True),
    # division by a sparse operand under division="ieee": full (0/0 is NaN)
    (
        "a(i) = b(i) / c(i)",
        {"b": "s", "c": "s"},
        [(["b1", "c1"], "b(i) / c(i)"), (["b1"], "b(i) / 0"), (["c1"], "0 / c(i)"), ([], "0 / 0")],
        True,
    ),
    # division by a literal keeps the numerator's pattern
    ("a(i) = b(i) / 2", {"b": "s"}, [(["b1"], "b(i) / 2.0")], False),
    # the lattice of i for SpMV with A in DCSR: A's first level
    ("y(i) = A(i,j) * x(j)", {"A": "dcsr"}, [(["A1"], "A(i,j) * x(j)")], False),
]


@pytest.mark.parametrize("text,formats,points,full", LATTICES)
def test_merge_lattice(text, formats, points, full):
    var = "i"
    got, got_full = _lattice(text, formats, var)
    assert got == points
    assert got_full == full


def test_without_folds_only_structural_zeros():
    st = concretize(parse_expression("a(i) = b(i) * c(i) + 0 * d(i)"))
    b = Access("b", ("i",))
    assert str(without(st.rhs, frozenset({b}))) == "0.0 * d(i)"
    assert without(Access("b", ("i",)), frozenset({b})) is ZERO


# ------------------------------------------------------------------- orders
def _order(text: str, formats: dict[str, str]) -> tuple[str, ...]:
    spec = make_spec(parse_expression(text), formats)
    st = spec.statement
    from sparsec.frontend.concrete import accesses

    return loop_order(st.loop_indices, [st.lhs, *accesses(st.rhs)], spec.formats)


ORDERS = [
    ("y(i) = A(i,j) * x(j)", {"A": "csr"}, ("i", "j")),
    ("y(i) = A(i,j) * x(j)", {"A": "csc"}, ("j", "i")),
    ("y(i) = A(i,j) * x(j)", {"A": "dense"}, ("i", "j")),
    # SpMM: row-wise (Gustavson) so the dense B row is contiguous in the inner loop
    ("C(i,j) = A(i,k) * B(k,j)", {"A": "csr"}, ("i", "k", "j")),
    ("C(i,j) = A(i,k) * B(k,j)", {"A": "csr", "B": "csc"}, ("i", "j", "k")),
    # MTTKRP: B's levels i, k, l then the dense j
    ("A(i,j) = B(i,k,l) * D(l,j) * C(k,j)", {"B": "csf"}, ("i", "k", "l", "j")),
    ("A(i,j) = B(i,k,l) * D(l,j) * C(k,j)", {"B": "sss:2,0,1"}, ("l", "i", "k", "j")),
    ("A(i,j) = B(i,j) + C(i,j)", {"B": "csc", "C": "csc"}, ("j", "i")),
]


@pytest.mark.parametrize("text,formats,order", ORDERS)
def test_loop_order(text, formats, order):
    assert _order(text, formats) == order


def test_impossible_order_names_tensor_and_fix():
    with pytest.raises(LoweringError) as err:
        _order("A(i,j) = B(i,j) + C(i,j)", {"B": "csr", "C": "csc"})
    msg = str(err.value)
    assert "B(i,j) (csr) needs i before j" in msg
    assert "C(i,j) (csc) needs j before i" in msg
    # the format as a user writes it (issue 18: it said 'ds:0,1' for csr)
    assert "Store C with mode ordering 0,1 (format 'csr')" in msg


FIXABLE = [
    ("A(i,j) = B(i,j) + C(i,j)", {"B": "csr", "C": "csc"}, "C", "csr"),
    ("A(i,j) = B(i,j) * C(i,j)", {"B": "dcsc", "C": "dcsr"}, "C", "dcsc"),
    ("A(i,j) = B(i,j) + C(j,i)", {"B": "csr", "C": "csr"}, "C", "csc"),
    ("a(i) = B(k,i) * c(k) + d(i)", {"B": "csr"}, "B", "csc"),
    ("A(i,j) = B(i,j,k) * C(i,k,j)", {"B": "sss", "C": "sss"}, "C", "sss:0,2,1"),
]


@pytest.mark.parametrize("text,formats,name,fix", FIXABLE)
def test_the_suggested_format_works(text, formats, name, fix):
    with pytest.raises(
        LoweringError, match=f"Store {name} with mode ordering .* \\(format '{fix}'\\)"
    ):
        _order(text, formats)
    _order(text, {**formats, name: fix})  # the advice is true: this order exists


@pytest.mark.parametrize("fmt", ["csr", "csc", "dcsr", "coo"])
def test_a_tensor_read_in_two_mode_orders_gets_advice_that_works(fmt):
    # issue 18: the error said "store B with mode ordering 1,0", and that format gave the
    # same error. No ordering serves B(i,j) and B(j,i); a transposed copy or dense B does.
    import numpy as np

    import sparsec

    # issue 23: with no schedule, B(j,i) reads a converted copy of B (the call below);
    # a user schedule's refusal stands, with its advice
    with pytest.raises(LoweringError) as err:
        sparsec.kernel("a = B(i,j) * B(j,i)", {"B": fmt}, schedule="reorder(i,j)").generated()
    msg = str(err.value)
    assert f"B(i,j) ({fmt}) needs" in msg and "B is read in two mode orders" in msg
    assert "Store B with mode ordering" not in msg
    assert f"write B_t(i,j) in place of B(j,i), give B_t the format '{fmt}'" in msg
    assert f"B_t=sparsec.Tensor.from_scipy(B.to_scipy().T, '{fmt}')" in msg
    assert "or store B dense" in msg
    dense = np.array([[1.0, 2.0, 0.0], [0.0, 0.0, 0.0], [3.0, 0.0, 5.0]])
    B = sparsec.Tensor.from_dense(dense, fmt)
    B_t = sparsec.Tensor.from_scipy(B.to_scipy().T, fmt)
    k = sparsec.kernel("a = B(i,j) * B_t(i,j)", {"B": fmt, "B_t": fmt})
    assert k(B=B, B_t=B_t) == pytest.approx(np.sum(dense * dense.T))
    k = sparsec.kernel("a = B(i,j) * B(j,i)", {"B": "dense"})
    assert k(B=dense) == pytest.approx(np.sum(dense * dense.T))
    k = sparsec.kernel("a = B(i,j) * B(j,i)", {"B": fmt})
    assert k(B=B) == pytest.approx(np.sum(dense * dense.T))


def test_nested_sum_that_needs_inner_index_first_is_rejected():
    # issue 23: the nested sum has no order inside i (B csr needs k first), so the
    # statement runs as a sequence of nests: a = d, then a += B(k,i) * c(k) over k, i
    spec = make_spec(parse_expression("a(i) = B(k,i) * c(k) + d(i)"), {"B": "csr"})
    from sparsec.pipeline import generate

    assert "lowered as a sequence of loop nests" in generate(spec).schedule
    with pytest.raises(LoweringError, match="Store B with mode ordering 1,0"):
        generate(make_spec(parse_expression("a(i) = B(k,i) * c(k) / d(i)"), {"B": "csr"}))
