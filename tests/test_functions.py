"""Functions in the language (issue 23, item 4): ``sqrt(A(i,j))``, ``max(a, b)``, ...

Each function against dense torch on the C target and the CUDA source run on the CPU
(``cuda-emulated``), float32/float64 and int32/int64 indices, with a CSR operand that has
empty rows and explicit zeros; sparsity by each function's value at 0 (a CSR output of
``abs(A)`` has A's pattern, ``exp(A)`` is dense); the fused pruned layer
``relu(W @ X + b)``; the errors for unknown functions and reserved names.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import sparse_array

import sparsec
from sparsec import NotationError, ParseError, ScheduleError, Tensor
from sparsec.frontend.concrete import concretize, exact
from sparsec.frontend.functions import FUNCTIONS
from sparsec.frontend.notation import Access
from sparsec.frontend.parser import parse, parse_expression
from sparsec.middle.lattice import Iterator, build

TARGETS = ("c", "cuda-emulated")
#: (value dtype, index dtype): both of each, in two runs rather than four
DTYPES = (("float64", "int32"), ("float32", "int64"))
UNARY = tuple(name for name, f in FUNCTIONS.items() if f.arity == 1)
BINARY = tuple(name for name, f in FUNCTIONS.items() if f.arity == 2)


def _csr(dense: np.ndarray, dtype: str, index_dtype: str, zeros: int = 2) -> Tensor:
    """``dense`` as CSR, with ``zeros`` explicit zeros stored where it has none."""
    rows, cols = np.nonzero(dense)
    empty_rows = set(np.flatnonzero(~dense.any(axis=1)))
    extra = [(i, j) for i, j in zip(*np.nonzero(dense == 0), strict=True) if i not in empty_rows][
        :zeros
    ]
    coords = np.array(
        [list(rows) + [i for i, _ in extra], list(cols) + [j for _, j in extra]], dtype=np.int64
    )
    values = np.concatenate([dense[rows, cols], np.zeros(len(extra))])
    return Tensor.from_coo(coords, values, dense.shape, "csr", dtype=dtype, index_dtype=index_dtype)


def _dense_of(t: Tensor) -> torch.Tensor:
    return torch.from_numpy(t.to_dense().astype(np.float64))


def _close(got: np.ndarray, want: torch.Tensor, dtype: str) -> None:
    rtol = 1e-4 if dtype == "float32" else 1e-10
    np.testing.assert_allclose(
        np.asarray(got, dtype=np.float64), want.numpy(), rtol=rtol, atol=rtol
    )


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype,index_dtype", DTYPES)
@pytest.mark.parametrize("fn", UNARY)
def test_unary_function_matches_torch(fn, dtype, index_dtype, target, rng):
    dense = sparse_array((7, 6), rng) * 3.0
    A = _csr(dense, dtype, index_dtype)
    k = sparsec.kernel(f"C(i,j) = {fn}(A(i,j))", {"A": "csr"}, target=target, dtype=dtype)
    torch_fn = getattr(torch, FUNCTIONS[fn].torch)
    want = torch_fn(_dense_of(A))  # absent entries are f(0): 0 or dense, by the table
    with np.errstate(all="ignore"):
        _close(k(A=A), want, dtype)
    k.check(A=A)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype,index_dtype", DTYPES)
@pytest.mark.parametrize("fn", BINARY)
def test_binary_function_matches_torch(fn, dtype, index_dtype, target, rng):
    A = _csr(sparse_array((6, 5), rng) * 2.0, dtype, index_dtype)
    B = _csr(sparse_array((6, 5), rng) * 2.0, dtype, index_dtype)
    expr = f"C(i,j) = {fn}(A(i,j), B(i,j))"
    k = sparsec.kernel(expr, {"A": "csr", "B": "csr"}, target=target, dtype=dtype)
    torch_fn = getattr(torch, FUNCTIONS[fn].torch)
    want = torch_fn(_dense_of(A), _dense_of(B))
    with np.errstate(all="ignore"):
        _close(k(A=A, B=B), want, dtype)
    k.check(A=A, B=B)


@pytest.mark.parametrize("target", TARGETS)
def test_functions_compose_with_operators_and_literals(target, rng):
    dense = sparse_array((6, 5), rng)
    A = _csr(dense, "float64", "int32")
    x = rng.uniform(-1, 1, 5)
    expr = "y(i) = sigmoid(A(i,j) * x(j)) + pow(abs(A(i,j)), 2.0) * -tanh(x(j)) + max(x(j), 0.5)"
    k = sparsec.kernel(expr, {"A": "csr"}, target=target)
    a, xt = _dense_of(A), torch.from_numpy(x)
    # j is used in every term, so it is summed over the whole right-hand side
    terms = torch.sigmoid(a * xt) + torch.pow(a.abs(), 2.0) * -torch.tanh(xt)
    want = (terms + torch.maximum(xt, torch.tensor(0.5))).sum(1)
    k.check(A=A, x=x)
    assert str(k.spec.statement).startswith("y(i) = sum(j, sigmoid(A(i,j) * x(j)) + pow(")
    _close(k(A=A, x=x), want, "float64")


@pytest.mark.parametrize("fn", ["abs", "sqrt", "relu", "tanh", "sin"])
def test_zero_preserving_function_keeps_the_pattern_of_a_csr_output(fn, rng):
    dense = sparse_array((8, 6), rng)
    A = _csr(dense, "float64", "int64")
    k = sparsec.kernel(f"C(i,j) = {fn}(A(i,j))", {"A": "csr", "C": "csr"})
    C = k(A=A).validate()
    assert C.nnz == A.nnz  # explicit zeros included, nothing else
    np.testing.assert_array_equal(C.coords()[0], A.coords()[0])
    with np.errstate(all="ignore"):
        want = getattr(torch, FUNCTIONS[fn].torch)(_dense_of(A))
    _close(C.to_dense(), want, "float64")
    k.check(A=A)


@pytest.mark.parametrize("fn", ["exp", "cos", "sigmoid", "log"])
def test_function_with_nonzero_value_at_zero_is_dense(fn, rng):
    dense = sparse_array((5, 4), rng)
    A = _csr(dense, "float64", "int32")
    k = sparsec.kernel(f"C(i,j) = {fn}(A(i,j))", {"A": "csr"})
    got = k(A=A)
    with np.errstate(all="ignore"):
        want = getattr(torch, FUNCTIONS[fn].torch)(torch.from_numpy(dense))
    _close(got, want, "float64")
    # absent entries compute f(0): exp(0) = 1, log(0) = -inf
    assert got[~dense.astype(bool) & (A.to_dense() == 0)].size > 0


def test_a_dense_function_in_a_sparse_output_is_present_everywhere(rng):
    A = _csr(sparse_array((4, 5), rng), "float64", "int32")
    k = sparsec.kernel("C(i,j) = exp(A(i,j))", {"A": "csr", "C": "csr"})
    C = k(A=A).validate()
    assert C.nnz == 20
    _close(C.to_dense(), torch.exp(_dense_of(A)), "float64")


@pytest.mark.parametrize("fn,np_fn", [("max", np.maximum), ("min", np.minimum)])
def test_max_min_co_iterate_as_a_union(fn, np_fn, rng):
    a, b = sparse_array((7, 6), rng), sparse_array((7, 6), rng)
    A, B = _csr(a, "float64", "int32", zeros=0), _csr(b, "float64", "int32", zeros=0)
    k = sparsec.kernel(f"C(i,j) = {fn}(A(i,j), B(i,j))", {"A": "csr", "B": "csr", "C": "csr"})
    C = k(A=A, B=B).validate()
    assert C.nnz == int(np.count_nonzero((a != 0) | (b != 0)))  # the union of the patterns
    np.testing.assert_array_equal(C.to_dense(), np_fn(a, b))
    k.check(A=A, B=B)


def test_pow_keeps_the_pattern_only_for_a_positive_literal_exponent(rng):
    A = _csr(sparse_array((5, 4), rng), "float64", "int32")
    kept = sparsec.kernel("C(i,j) = pow(A(i,j), 3)", {"A": "csr", "C": "csr"})(A=A)
    assert kept.nnz == A.nnz
    dense = sparsec.kernel("C(i,j) = pow(A(i,j), 0)", {"A": "csr", "C": "csr"})(A=A)
    assert dense.nnz == 20  # 0^0 = 1 everywhere
    np.testing.assert_array_equal(dense.to_dense(), np.ones((5, 4)))


def _points(text: str, sparse: tuple[str, ...]) -> list[list[str]]:
    """The lattice of ``i`` for one-index operands, ``sparse`` of them compressed."""
    rhs = concretize(parse_expression(text)).rhs

    def iterator_of(access: Access) -> Iterator | None:
        return Iterator(access, 0) if access.name in sparse else None

    lattice = build(rhs, iterator_of, exact(rhs, "sparse"))
    return [sorted(str(it) for it in p.iterators) for p in lattice.points]


def test_lattices_follow_the_value_at_zero():
    assert _points("a(i) = abs(b(i))", ("b",)) == [["b1"]]
    assert _points("a(i) = exp(b(i))", ("b",)) == [["b1"], []]
    assert _points("a(i) = max(b(i), c(i))", ("b", "c")) == [["b1", "c1"], ["b1"], ["c1"]]
    assert _points("a(i) = pow(b(i), 2)", ("b",)) == [["b1"]]
    assert _points("a(i) = pow(b(i), c(i))", ("b", "c")) == [["b1", "c1"], ["b1"], ["c1"], []]
    assert _points("a(i) = sqrt(b(i)) * c(i)", ("b", "c")) == [["b1", "c1"]]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype,index_dtype", DTYPES)
def test_fused_pruned_layer_is_one_kernel_matching_torch(dtype, index_dtype, target, rng):
    W = _csr(sparse_array((9, 7), rng), dtype, index_dtype)
    X = rng.uniform(-1, 1, (7, 5)).astype(dtype)
    b = rng.uniform(-1, 1, 9).astype(dtype)
    expr = "Y(i,j) = relu(W(i,k) * X(k,j) + b(i))"
    k = sparsec.kernel(expr, {"W": "csr"}, target=target, dtype=dtype)
    # the sum is nested under the function, never lifted out of it
    assert str(k.spec.statement) == "Y(i,j) = relu(sum(k, W(i,k) * X(k,j)) + b(i))"
    w = _dense_of(W)
    want = torch.relu(
        w @ torch.from_numpy(X.astype(np.float64)) + torch.from_numpy(b.astype(np.float64))[:, None]
    )
    _close(k(W=W, X=X, b=b), want, dtype)
    k.check(W=W, X=X, b=b)


def test_a_sum_is_never_lifted_out_of_a_function(rng):
    dense = sparse_array((6, 5), rng)
    A = _csr(dense, "float64", "int32")
    x = rng.uniform(0.1, 1, 5)
    k = sparsec.kernel("y(i) = abs(A(i,j) * x(j))", {"A": "csr"})
    assert str(k.spec.statement) == "y(i) = abs(sum(j, A(i,j) * x(j)))"
    np.testing.assert_allclose(k(A=A, x=x), np.abs(dense @ x), rtol=1e-12)


@pytest.mark.parametrize(
    "text",
    [
        "y(i) = sqrt(A(i,j))",
        "y(i) = max(A(i,j), -x(j)) * pow(x(j), 2.0)",
        "Y(i,j) = relu(W(i,k) * X(k,j) + b(i))",
        "a = -exp(-b)",
        "y(i) = sigmoid((A(i,j) + 1.0) / 2.0)",
    ],
)
def test_calls_print_back_to_the_same_tree(text):
    ast = parse(text)
    assert parse(str(ast)) == ast


def test_unknown_function_names_the_functions():
    with pytest.raises(NotationError) as err:
        sparsec.kernel("y(i) = foo(A(i,j))", {"A": "csr"})
    message = str(err.value)
    assert "unknown function 'foo'" in message
    for name in FUNCTIONS:
        assert name in message


def test_a_tensor_named_after_a_function_is_refused():
    with pytest.raises(NotationError, match="'sqrt' is a function name, reserved"):
        parse_expression("sqrt(i) = A(i)")
    with pytest.raises(NotationError, match="'exp' is a function name, reserved"):
        parse_expression("exp = a")
    with pytest.raises(ParseError, match="'exp', a function"):
        parse_expression("y(i) = A(i) * exp")


def test_wrong_number_of_arguments_is_refused():
    with pytest.raises(NotationError, match="max takes 2 arguments, not 1"):
        parse_expression("y(i) = max(A(i))")
    with pytest.raises(NotationError, match="sqrt takes 1 argument, not 2"):
        parse_expression("y(i) = sqrt(A(i), B(i))")


def test_the_grammar_lists_the_table_s_functions():
    from sparsec.base.resources import data_dir

    grammar = (data_dir("grammar") / "index_notation.lark").read_text()
    line = next(ln for ln in grammar.splitlines() if ln.startswith("FUNCTION"))
    assert set(line.split("/(")[1].split(")")[0].split("|")) == set(FUNCTIONS)


@pytest.mark.parametrize("expr", ["O(j) = sqrt(T0(i,k,j))", "O(j) = -(T0(i,k,j) / -(2 - 2))"])
def test_pos_over_a_non_unique_level_refuses_a_nested_sum(expr):
    """pos over COO's non-unique first level visits j's entries one at a time; a sum
    nested under a function or a division needs all of them at once (sqrt of the sum,
    not a sum of square roots), so the schedule is refused (fuzz: slow_4); without the
    pos the kernel is right."""
    with pytest.raises(ScheduleError, match="non-unique level"):
        sparsec.kernel(expr, {"T0": "uqq:2,1,0"}, schedule=["pos(j,v0,T0)"])
    k = sparsec.kernel(expr, {"T0": "uqq:2,1,0"})
    inputs, _ = k.random_inputs({"i": 3, "j": 2, "k": 2}, seed=0, density=1.0)
    inputs["T0"] = sparsec.Tensor.from_dense(np.abs(inputs["T0"].to_dense()) + 0.5, "uqq:2,1,0")
    k.check(**inputs)
