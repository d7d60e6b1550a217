"""Gradients derived from the notation (issue 20 item 1): `sparsec.api.gradient.gradients`
and eager autograd through `Kernel.__call__`, against dense torch autograd on densified
inputs (a sparse input's gradient gathered at its stored entries)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import scipy.sparse as sp

import sparsec
from sparsec.api.gradient import gradient_kernel, gradients
from sparsec.frontend.derivative import NotDifferentiable, derivative
from sparsec.frontend.parser import parse_expression

torch = pytest.importorskip("torch")


def _sparse(m: int, n: int, seed: int, fmt: str = "csr") -> sp.spmatrix:
    """A random matrix with an empty row and a stored zero."""
    a = sp.random(m, n, density=0.4, format="coo", random_state=seed)
    rows, cols, vals = a.row.copy(), a.col.copy(), a.data.copy()
    keep = rows != 1  # row 1 is empty
    rows, cols, vals = rows[keep], cols[keep], vals[keep]
    if len(vals):
        vals[0] = 0.0  # a real zero, stored
    return sp.coo_matrix((vals, (rows, cols)), shape=(m, n)).asformat(fmt)


def _dense_grads(
    fn: Callable[..., torch.Tensor], dense: dict[str, np.ndarray], dy: np.ndarray
) -> dict[str, np.ndarray]:
    leaves = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in dense.items()}
    fn(**leaves).backward(torch.as_tensor(dy))
    return {k: v.grad.numpy() for k, v in leaves.items()}


def _compare(
    kernel: sparsec.Kernel,
    inputs: dict[str, object],
    fn: Callable[..., torch.Tensor],
    seed: int = 0,
) -> None:
    dense = {
        k: np.asarray(sparsec.as_tensor(v).to_dense(), dtype=np.float64) for k, v in inputs.items()
    }
    out = np.asarray(kernel(**inputs))
    dy = np.random.default_rng(seed).standard_normal(out.shape)
    got = gradients(kernel, inputs, dy, list(inputs))
    want = _dense_grads(fn, dense, dy)
    for name, value in inputs.items():
        t = sparsec.as_tensor(value)
        if t.format.is_dense:
            expected = want[name]
        else:
            expected = want[name][tuple(t.coords()[0])]  # at the stored entries, in order
        assert np.shape(got[name]) == np.shape(expected), name
        np.testing.assert_allclose(got[name], expected, rtol=1e-10, atol=1e-12, err_msg=name)


TARGETS = ["c", "cuda-emulated"]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fmt", ["csr", "csc", "coo"])
def test_spmv(fmt: str, target: str) -> None:
    a = _sparse(6, 5, 1, fmt)
    x = np.random.default_rng(2).standard_normal(5)
    k = sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": fmt}, target=target)
    _compare(k, {"A": a, "x": x}, lambda A, x: A @ x)


@pytest.mark.parametrize("target", TARGETS)
def test_spmm_sparse_w(target: str) -> None:
    w = _sparse(6, 5, 3)
    x = np.random.default_rng(4).standard_normal((5, 3))
    k = sparsec.kernel("Y(i,j) = W(i,k) * X(k,j)", {"W": "csr"}, target=target)
    assert gradient_kernel(k, "W").statement == "dW(i,k) = dY(i,j) * X(k,j)"
    assert gradient_kernel(k, "X").statement == "dX(k,j) = dY(i,j) * W(i,k)"
    _compare(k, {"W": w, "X": x}, lambda W, X: W @ X)


def test_sddmm_dense_output() -> None:
    s = _sparse(5, 4, 5)
    rng = np.random.default_rng(6)
    a, b = rng.standard_normal((5, 3)), rng.standard_normal((3, 4))
    k = sparsec.kernel("C(i,j) = S(i,j) * A(i,k) * B(k,j)", {"S": "csr"})
    _compare(k, {"S": s, "A": a, "B": b}, lambda S, A, B: S * (A @ B))


def test_mttkrp_csf() -> None:
    rng = np.random.default_rng(7)
    dense_b = rng.standard_normal((4, 3, 5)) * (rng.random((4, 3, 5)) < 0.3)
    dense_b[1] = 0.0  # an empty slice
    b = sparsec.as_tensor(dense_b, "csf")
    d, c = rng.standard_normal((5, 2)), rng.standard_normal((3, 2))
    k = sparsec.kernel("A(i,j) = B(i,k,l) * D(l,j) * C(k,j)", {"B": "csf"})
    _compare(k, {"B": b, "D": d, "C": c}, lambda B, D, C: torch.einsum("ikl,lj,kj->ij", B, D, C))


def test_scalar_times_matrix_plus_matrix() -> None:
    rng = np.random.default_rng(8)
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    k = sparsec.kernel("Y(i,j) = alpha * A(i,j) + B(i,j)", {"A": "dd"})
    _compare(k, {"alpha": 1.5, "A": a, "B": b}, lambda alpha, A, B: alpha * A + B)
    got = gradients(k, {"alpha": 1.5, "A": a, "B": b}, np.ones((3, 4)), ["alpha"])
    assert np.ndim(got["alpha"]) == 0
    np.testing.assert_allclose(got["alpha"], a.sum())


@pytest.mark.parametrize(
    ("expr", "fn"),
    [
        ("Y(i,j) = relu(W(i,k) * X(k,j) + b(i))", lambda W, X, b: torch.relu(W @ X + b[:, None])),
        ("Y(i,j) = tanh(W(i,k) * X(k,j)) - b(i)", lambda W, X, b: torch.tanh(W @ X) - b[:, None]),
        ("Y(i,j) = exp(W(i,k)) * X(k,j) * b(i)", lambda W, X, b: (torch.exp(W) @ X) * b[:, None]),
        (
            "Y(i,j) = sigmoid(W(i,k) * X(k,j)) + sin(b(i)) * cos(b(i))",
            lambda W, X, b: torch.sigmoid(W @ X) + (torch.sin(b) * torch.cos(b))[:, None],
        ),
        (
            "Y(i,j) = abs(W(i,k) * X(k,j)) + pow(b(i), 3) * 2 - pow(b(i), 2) / 4",
            lambda W, X, b: torch.abs(W @ X) + (b**3 * 2 - b**2 / 4)[:, None],
        ),
        (
            "Y(i,j) = max(W(i,k) * X(k,j), b(i)) + min(-b(i), X(i,j))",
            lambda W, X, b: torch.maximum(W @ X, b[:, None]) + torch.minimum(-b[:, None], X),
        ),
    ],
)
def test_functions(expr: str, fn: Callable[..., torch.Tensor]) -> None:
    rng = np.random.default_rng(9)
    w = _sparse(4, 4, 10)
    x, b = rng.standard_normal((4, 3)), rng.standard_normal(4)
    k = sparsec.kernel(expr, {"W": "csr"})
    _compare(k, {"W": w, "X": x, "b": b}, fn)


def test_read_twice_is_the_sum_of_both_terms() -> None:
    a = _sparse(5, 3, 11).toarray()
    k = sparsec.kernel("C(i,j) = A(k,i) * A(k,j)", {"A": "dd"})
    _compare(k, {"A": a}, lambda A: A.T @ A)
    s = derivative(parse_expression("C(i,j) = A(k,i) * A(k,j)"), "A", "dC", "dA")
    assert str(s.statement) == "dA(k,i) = dC(i,j) * A(k,j) + dC(i1,i) * A(k,i1)"


def test_sparse_input_read_twice_and_broadcast() -> None:
    a = _sparse(5, 3, 12, "csr")
    k = sparsec.kernel("C(i,j) = A(k,i) * A(k,j)", {"A": "csr"})
    _compare(k, {"A": a}, lambda A: A.T @ A)
    k = sparsec.kernel("y(i) = A(i,j)", {"A": "csr"})
    _compare(k, {"A": a}, lambda A: A.sum(1))


def test_dense_broadcast_gradient() -> None:
    a = np.random.default_rng(13).standard_normal((3, 4))
    k = sparsec.kernel("y(j) = A(i,j)", {"A": "dd"})
    _compare(k, {"A": a}, lambda A: A.sum(0))


@pytest.mark.parametrize(
    ("expr", "kwargs", "what"),
    [
        ("y(i) = A(i,j) * x(j) / d(i)", {}, "division"),
        ("y(i) = sqrt(A(i,j) * x(j))", {}, "sqrt"),
        ("y(i) = A(i,j) * log(x(j))", {}, "log"),
        ("y(i) = A(i,j) * pow(x(j), 0.5)", {}, "pow"),
        ("y(i) = A(i,j) * x(j)", {"semiring": "min_plus"}, "semiring"),
        ("Y(i,j) = A(i,j) * B(i,j)", {"mask": "M"}, "masked"),
    ],
)
def test_refusals_name_the_construct_and_input(expr: str, kwargs: dict, what: str) -> None:
    k = sparsec.kernel(expr, **kwargs)
    name = "x" if "x(" in expr else "B"
    with pytest.raises(NotDifferentiable, match=what) as err:
        gradient_kernel(k, name)
    assert f"'{name}'" in str(err.value)


def test_gradient_kernels_are_kept() -> None:
    k = sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": "csr"})
    assert gradient_kernel(k, "x") is gradient_kernel(k, "x")
    assert gradient_kernel(k, "x").statement == "dx(j) = dy(i) * A(i,j)"


def test_torch_inputs_give_torch_gradients() -> None:
    a = torch.tensor(_sparse(4, 3, 14).toarray(), requires_grad=True)
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    k = sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": "dd"})
    dy = torch.randn(4, dtype=torch.float64)
    got = gradients(k, {"A": a, "x": x}, dy, ["A", "x"])
    assert torch.is_tensor(got["x"]) and torch.is_tensor(got["A"])
    torch.testing.assert_close(got["x"], a.detach().T @ dy)
    torch.testing.assert_close(got["A"], torch.outer(dy, x.detach()))


# ----------------------------------------------------------------- eager autograd

LAYOUTS = {
    "csr": lambda d: d.to_sparse_csr(),
    "csc": lambda d: d.to_sparse_csc(),
    "coo": lambda d: d.to_sparse_coo().coalesce(),
}


def _pattern(m: int, n: int, seed: int) -> torch.Tensor:
    """A float64 matrix with an empty row 1 and a stored zero once made sparse (the zero is
    put back into the values, so it stays an entry)."""
    return torch.from_numpy(_sparse(m, n, seed).toarray())


def _rebuild(template: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``template``'s layout and pattern with ``values`` (differentiable)."""
    match template.layout:
        case torch.sparse_csr:
            return torch.sparse_csr_tensor(
                template.crow_indices(), template.col_indices(), values, template.shape
            )
        case torch.sparse_csc:
            return torch.sparse_csc_tensor(
                template.ccol_indices(), template.row_indices(), values, template.shape
            )
        case _:
            return torch.sparse_coo_tensor(template.indices(), values, template.shape)


def _sparse_torch(dense: torch.Tensor, layout: str) -> torch.Tensor:
    """``dense`` in a torch sparse layout, keeping one stored zero (entry (0, c) of the
    first stored column of row 0, set to 0 after the conversion)."""
    s = LAYOUTS[layout](dense)
    vals = s.values().clone()
    if len(vals):
        vals[0] = 0.0
    out = _rebuild(s, vals)
    return out.coalesce() if layout == "coo" else out


@pytest.mark.parametrize("layout", ["csr", "csc", "coo"])
def test_gradcheck_spmv_and_spmm(layout: str) -> None:
    a = _sparse_torch(_pattern(5, 4, 20), layout)
    x = torch.randn(4, dtype=torch.float64, requires_grad=True)
    xs = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    vals = a.values().detach().clone().requires_grad_(True)
    spmv = sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": layout})
    spmm = sparsec.kernel("Y(i,j) = A(i,k) * X(k,j)", {"A": layout})
    assert torch.autograd.gradcheck(lambda v, x: spmv(A=_rebuild(a, v), x=x), (vals, x))
    assert torch.autograd.gradcheck(lambda v, x: spmm(A=_rebuild(a, v), X=x), (vals, xs))
    # against dense torch, masked to the pattern
    y = spmm(A=_rebuild(a, vals), X=xs)
    g = torch.randn_like(y)
    y.backward(g)
    dense = a.to_dense().requires_grad_(True)
    (dense @ xs.detach()).backward(g)
    pattern = _rebuild(a, torch.ones_like(vals)).to_dense() != 0
    torch.testing.assert_close(_rebuild(a, vals.grad).to_dense(), dense.grad * pattern)


def test_gradcheck_sddmm_dense_output() -> None:
    s = _sparse_torch(_pattern(4, 5, 21), "csr")
    vals = s.values().detach().clone().requires_grad_(True)
    a = torch.randn(4, 2, dtype=torch.float64, requires_grad=True)
    b = torch.randn(2, 5, dtype=torch.float64, requires_grad=True)
    k = sparsec.kernel("C(i,j) = S(i,j) * A(i,k) * B(k,j)", {"S": "csr"})
    assert torch.autograd.gradcheck(lambda v, a, b: k(S=_rebuild(s, v), A=a, B=b), (vals, a, b))


def test_gradcheck_mttkrp() -> None:
    dense = torch.from_numpy(np.random.default_rng(22).standard_normal((3, 4, 5)))
    dense = dense * (torch.rand(3, 4, 5, generator=torch.Generator().manual_seed(0)) < 0.3)
    dense[1] = 0.0
    b = dense.to_sparse_coo().coalesce()
    vals = b.values().detach().clone().requires_grad_(True)
    d = torch.randn(5, 2, dtype=torch.float64, requires_grad=True)
    c = torch.randn(4, 2, dtype=torch.float64, requires_grad=True)
    k = sparsec.kernel("A(i,j) = B(i,k,l) * D(l,j) * C(k,j)", {"B": "csf"})
    assert torch.autograd.gradcheck(lambda v, d, c: k(B=_rebuild(b, v), D=d, C=c), (vals, d, c))


def test_gradcheck_alpha_a_plus_b_and_functions() -> None:
    alpha = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    a = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    k = sparsec.kernel("Y(i,j) = alpha * A(i,j) + B(i,j)", {"A": "dd"})
    assert torch.autograd.gradcheck(lambda al, a, b: k(alpha=al, A=a, B=b), (alpha, a, b))
    w = _sparse_torch(_pattern(4, 3, 23), "csr")
    vals = w.values().detach().clone().requires_grad_(True)
    x = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(4, dtype=torch.float64, requires_grad=True)
    for expr in (
        "Y(i,j) = relu(W(i,k) * X(k,j) + b(i))",
        "Y(i,j) = tanh(W(i,k) * X(k,j)) * exp(b(i))",
    ):
        f = sparsec.kernel(expr, {"W": "csr"})
        assert torch.autograd.gradcheck(
            lambda v, x, b, f=f: f(W=_rebuild(w, v), X=x, b=b), (vals, x, bias)
        )


@pytest.mark.parametrize("target", TARGETS)
def test_eager_matches_dense_torch(target: str) -> None:
    w = _sparse_torch(_pattern(5, 4, 24).float(), "csr")
    vals = w.values().detach().clone().requires_grad_(True)
    x = torch.randn(4, 3, requires_grad=True)
    k = sparsec.kernel("Y(i,j) = relu(W(i,k) * X(k,j))", {"W": "csr"}, target=target)
    y = k(W=_rebuild(w, vals), X=x)
    assert y.grad_fn is not None and y.dtype == torch.float32
    g = torch.randn_like(y)
    y.backward(g)
    dense = w.to_dense().requires_grad_(True)
    x2 = x.detach().clone().requires_grad_(True)
    torch.relu(dense @ x2).backward(g)
    pattern = _rebuild(w, torch.ones_like(vals)).to_dense() != 0
    torch.testing.assert_close(_rebuild(w, vals.grad).to_dense(), dense.grad * pattern)
    torch.testing.assert_close(x.grad, x2.grad)


def test_division_is_refused_at_backward_not_forward() -> None:
    a = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    d = torch.rand(3, dtype=torch.float64) + 1
    k = sparsec.kernel("y(i) = A(i,j) / d(i)", {"A": "dd"})
    y = k(A=a, d=d)  # the forward runs
    torch.testing.assert_close(y.detach(), a.detach().sum(1) / d)
    with pytest.raises(NotDifferentiable, match=r"division.*'A'|'A'.*division"):
        y.sum().backward()


def test_no_grad_calls_are_unchanged() -> None:
    a = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    x = torch.randn(4, dtype=torch.float64)
    k = sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": "dd"})
    with torch.no_grad():
        y = k(A=a, x=x)
    assert y.grad_fn is None and not y.requires_grad
    plain = k(A=a.detach(), x=x)
    assert plain.grad_fn is None
    torch.testing.assert_close(y, plain)
    np.testing.assert_allclose(k(A=a.detach().numpy(), x=x.numpy()), plain.numpy())
    tracked = k(A=a, x=x)
    assert tracked.grad_fn is not None
    torch.testing.assert_close(tracked.detach(), plain)


def test_sparse_output_carries_grad_fn() -> None:
    dense = _pattern(4, 5, 25)
    s = _sparse_torch(dense, "csr")
    a = torch.randn(4, 2, dtype=torch.float64, requires_grad=True)
    b = torch.randn(2, 5, dtype=torch.float64, requires_grad=True)
    k = sparsec.kernel("C(i,j) = S(i,j) * A(i,k) * B(k,j)", {"S": "csr", "C": "csr"})
    c = k(S=s, A=a, B=b)
    assert c.layout == torch.sparse_csr and c.grad_fn is not None
    assert torch.autograd.gradcheck(lambda a, b: k(S=s, A=a, B=b).to_dense(), (a, b))
    c.values().sum().backward()
    a2 = a.detach().clone().requires_grad_(True)
    (s.to_dense() * (a2 @ b.detach())).sum().backward()
    torch.testing.assert_close(a.grad, a2.grad)


@pytest.mark.parametrize("target", TARGETS)
def test_sign_function(target: str) -> None:
    # row 1 empty, a stored zero at (0, 1)
    vals, cols = np.array([-2.0, 0.0, 3.0, 0.5, -1.0]), np.array([0, 1, 2, 0, 2])
    a = sp.csr_matrix((vals, cols, np.array([0, 3, 3, 5])), shape=(3, 3))
    out = sparsec.kernel("C(i,j) = sign(A(i,j))", {"A": "csr"}, target=target)(A=a)
    np.testing.assert_array_equal(out, np.sign(a.toarray()))
    dense = sparsec.kernel("y(i) = sign(x(i)) * 2", target=target)(x=np.array([-3.0, 0.0, 4.0]))
    np.testing.assert_array_equal(dense, [-2.0, 0.0, 2.0])


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_int64_indices_and_float32(index_dtype: type) -> None:
    a = sparsec.as_tensor(_sparse(6, 5, 26), "csr", index_dtype=index_dtype, dtype=np.float32)
    x = np.random.default_rng(27).standard_normal((5, 2)).astype(np.float32)
    k = sparsec.kernel("Y(i,j) = A(i,k) * X(k,j)", {"A": "csr"})
    dy = np.random.default_rng(28).standard_normal((6, 2)).astype(np.float32)
    got = gradients(k, {"A": a, "X": x}, dy, ["A", "X"])
    dense = a.to_dense()
    np.testing.assert_allclose(got["X"], dense.T @ dy, rtol=1e-5)
    np.testing.assert_allclose(got["A"], (dy @ x.T)[tuple(a.coords()[0])], rtol=1e-5)
    assert got["A"].dtype == np.float32 and got["A"].shape == (a.nnz,)


@pytest.mark.parametrize("fmt", ["dd", "csr"])
def test_accumulate_current_value_gets_dy(fmt: str) -> None:
    a = _sparse(4, 3, 29)
    x = np.random.default_rng(30).standard_normal(3)
    c = _sparse(4, 4, 31) if fmt == "csr" else np.random.default_rng(32).standard_normal((4, 4))
    k = sparsec.kernel("C(i,j) += A(i,k) * x(k) * A(j,k)", {"A": "csr", "C": fmt})
    dy = np.random.default_rng(33).standard_normal((4, 4))
    got = gradients(k, {"A": a, "x": x, "C": c}, dy, ["C", "x"])
    dense_a = a.toarray()
    np.testing.assert_allclose(got["x"], np.einsum("ij,ik,jk->k", dy, dense_a, dense_a))
    if fmt == "csr":
        np.testing.assert_allclose(got["C"], dy[tuple(sparsec.as_tensor(c).coords()[0])])
    else:
        np.testing.assert_allclose(got["C"], dy)
