"""sparsec.Tensor as a sparse array (issue 20, item 4): its operators against scipy.sparse,
numpy and torch on the same data (stored zeros, empty rows and columns), the 100k x 100k
case in bounded memory, the dense conversion's refusal, and `sparsec.einsum`."""

from __future__ import annotations

import subprocess
import sys
import tracemalloc

import numpy as np
import pytest
import scipy.sparse as sp

import sparsec
from sparsec.base.errors import DTypeError, InputError, ShapeError
from sparsec.policy.machine import use

torch = pytest.importorskip("torch")

FORMATS = ("csr", "csc", "coo", "dcsr")
#: (value dtype, index dtype) pairs, swept on CSR; the other formats run float64/int32
DTYPES = ((np.float64, np.int32), (np.float32, np.int32), (np.float64, np.int64))


def matrix(shape=(7, 5), fmt="csr", dtype=np.float64, index_dtype=np.int32, seed=0):
    """A random matrix with an empty row, an empty column and one stored zero; returned as
    the Tensor and the same entries as a scipy CSR array (the stored zero kept)."""
    rng = np.random.default_rng(seed)
    dense = np.round(rng.random(shape) * (rng.random(shape) < 0.45) * 8, 1)
    dense[2] = 0  # an empty row
    dense[:, 1] = 0  # an empty column, where the stored zero goes
    r, c = np.nonzero(dense)
    rows, cols = np.append(r, 4), np.append(c, 1)
    vals = np.append(dense[r, c], 0.0).astype(dtype)
    t = sparsec.Tensor.from_coo(
        np.stack([rows, cols]), vals, shape, fmt, index_dtype=index_dtype, dtype=dtype
    )
    assert t.nnz == len(vals)  # the zero is stored
    return t, sp.csr_array((vals, (rows, cols)), shape=shape)


def tol(dtype):
    return {"rtol": 1e-5, "atol": 1e-5} if dtype == np.float32 else {"rtol": 1e-12, "atol": 1e-12}


def dense_of(x):
    return np.asarray(x.to_scipy().toarray() if isinstance(x, sparsec.Tensor) else x)


CASES = [(f, np.float64, np.int32) for f in FORMATS] + [("csr", *d) for d in DTYPES[1:]]


@pytest.mark.parametrize(("fmt", "dtype", "idx"), CASES)
def test_matmul_with_dense_operands(fmt, dtype, idx):
    t, a = matrix((7, 5), fmt, dtype, idx)
    rng = np.random.default_rng(1)
    x, y, X = rng.random(5), rng.random(7), rng.random((5, 3))
    np.testing.assert_allclose(t @ x, a @ x, **tol(dtype))
    np.testing.assert_allclose(y @ t, y @ a, **tol(dtype))
    np.testing.assert_allclose(t @ X, a @ X, **tol(dtype))
    np.testing.assert_allclose(X.T @ t.T, (a @ X).T, **tol(dtype))
    got = t @ torch.from_numpy(x.astype(dtype))  # torch in, torch out
    assert isinstance(got, torch.Tensor) and got.dtype == torch.from_numpy(x.astype(dtype)).dtype
    np.testing.assert_allclose(got.numpy(), a @ x, **tol(dtype))
    assert (t @ x.astype(np.float32)).dtype == np.result_type(dtype, np.float32)


@pytest.mark.parametrize(("fmt", "dtype", "idx"), CASES)
def test_matmul_sparse_sparse(fmt, dtype, idx):
    t, a = matrix((7, 5), fmt, dtype, idx)
    s, b = matrix((5, 6), "csr", dtype, idx, seed=3)
    got = t @ s
    assert isinstance(got, sparsec.Tensor) and got.format == sparsec.parse_format("csr", 2)
    np.testing.assert_allclose(dense_of(got), (a @ b).toarray(), **tol(dtype))
    np.testing.assert_allclose(dense_of(t @ t.T), (a @ a.T).toarray(), **tol(dtype))
    cc = t.to_format("csc") @ s.to_format("csc")
    assert cc.format == sparsec.parse_format("csc", 2)
    np.testing.assert_allclose(dense_of(cc), (a @ b).toarray(), **tol(dtype))
    np.testing.assert_allclose(dense_of(t @ sp.csr_array(b)), (a @ b).toarray(), **tol(dtype))


@pytest.mark.parametrize(("fmt", "dtype", "idx"), CASES)
def test_add_sub_union(fmt, dtype, idx):
    t, a = matrix((7, 5), fmt, dtype, idx)
    s, b = matrix((7, 5), "csr", dtype, idx, seed=5)
    for got, want in ((t + s, a + b), (t - s, a - b), (s - t, b - a)):
        assert isinstance(got, sparsec.Tensor)
        np.testing.assert_allclose(dense_of(got), want.toarray(), **tol(dtype))
    assert (t + s).format == t.format
    # the union pattern: the stored zero of t stays stored in t + t
    assert (t + t).nnz == t.nnz
    d = np.random.default_rng(2).random((7, 5))
    np.testing.assert_allclose(t + d, a.toarray() + d, **tol(dtype))
    np.testing.assert_allclose(d - t, d - a.toarray(), **tol(dtype))
    row = np.arange(5.0)  # matched to the trailing mode, as numpy broadcasts
    np.testing.assert_allclose(t + row, a.toarray() + row, **tol(dtype))
    got = torch.from_numpy(d) + t
    assert isinstance(got, torch.Tensor)
    np.testing.assert_allclose(got.numpy(), a.toarray() + d, **tol(dtype))


@pytest.mark.parametrize(("fmt", "dtype", "idx"), CASES)
def test_scalar_ops_keep_the_pattern(fmt, dtype, idx):
    t, a = matrix((7, 5), fmt, dtype, idx)
    for got, want in ((t * 2, a * 2), (2.5 * t, a * 2.5), (-t, -a), (t / 4, a / 4)):
        assert isinstance(got, sparsec.Tensor) and got.format == t.format
        assert got.nnz == t.nnz and got.dtype == dtype  # stored zeros kept, dtype kept
        np.testing.assert_allclose(dense_of(got), want.toarray(), **tol(dtype))
    assert t + 0 is t and t * np.float64(1.0) is not t


@pytest.mark.parametrize(("fmt", "dtype", "idx"), CASES)
def test_elementwise_product(fmt, dtype, idx):
    t, a = matrix((7, 5), fmt, dtype, idx)
    s, b = matrix((7, 5), "csr", dtype, idx, seed=7)
    got = t * s
    assert isinstance(got, sparsec.Tensor) and got.format == t.format
    np.testing.assert_allclose(dense_of(got), a.multiply(b).toarray(), **tol(dtype))
    d = np.random.default_rng(4).random((7, 5))
    got = t * d  # t's pattern
    assert isinstance(got, sparsec.Tensor) and got.nnz == t.nnz
    np.testing.assert_allclose(dense_of(got), a.toarray() * d, **tol(dtype))


@pytest.mark.parametrize(("fmt", "dtype", "idx"), CASES)
def test_transpose_sum_len(fmt, dtype, idx):
    t, a = matrix((7, 5), fmt, dtype, idx)
    tt = t.T
    assert tt.shape == (5, 7) and tt.vals is t.vals  # the same storage, no copy
    np.testing.assert_array_equal(dense_of(tt), a.toarray().T)
    if fmt == "csr":
        assert tt.format == sparsec.parse_format("csc", 2)
    assert tt.T.format == t.format
    np.testing.assert_allclose(t.sum(), a.sum(), **tol(dtype))
    for axis in (0, 1, -1, (0, 1)):
        np.testing.assert_allclose(t.sum(axis), a.toarray().sum(axis), **tol(dtype))
    assert len(t) == 7 and t.ndim == 2 and t.shape == (7, 5) and bool(t)
    assert t.astype(np.float32).dtype == np.float32


def test_order_3_and_vectors():
    rng = np.random.default_rng(0)
    dense = rng.random((4, 3, 5)) * (rng.random((4, 3, 5)) < 0.4)
    t = sparsec.as_tensor(dense, "csf")
    np.testing.assert_allclose(dense_of_any(t + t), 2 * dense)
    np.testing.assert_allclose(t.sum(1), dense.sum(1))
    np.testing.assert_allclose(dense_of_any(t.T), dense.transpose(2, 1, 0))
    v = sparsec.as_tensor(np.array([0.0, 2.0, 0.0, 1.0, 3.0]), "s")
    a, _ = matrix((7, 5))
    np.testing.assert_allclose(dense_of_any(a @ v), dense_of(a) @ np.asarray(v))
    assert len(v) == 5 and v.ndim == 1


def dense_of_any(t):
    return np.asarray(t)


def test_bad_operands_are_refused_clearly():
    t, _ = matrix((7, 5))
    with pytest.raises(ShapeError, match="do not agree"):
        t @ np.ones(4)
    with pytest.raises(ShapeError, match="differ"):
        t + matrix((5, 7))[0]
    with pytest.raises(ShapeError, match="trailing"):
        t + np.ones((7, 1))
    with pytest.raises(ShapeError, match="`@` takes vectors and matrices"):
        t @ np.ones((5, 2, 2))
    with pytest.raises(InputError, match="nonzero number"):
        t + 1
    with pytest.raises(DTypeError, match="complex"):
        t * 1j
    with pytest.raises(TypeError):
        t @ "x"
    with pytest.raises(ShapeError, match="out of range"):
        t.sum(2)
    with pytest.raises(TypeError, match="order-0"):
        len(sparsec.as_tensor(1.0))


# ---------------------------------------------------------------- numpy's and scipy's entry points


def test_numpy_entry_points_agree_with_the_operators():
    """Issue 36 item 17: np.dot went dense while np.matmul was refused; every numpy entry
    point now runs the operator it names (sparse results stay Tensors)."""
    t, a = matrix((7, 5))
    x, y = np.arange(5.0), np.arange(7.0)
    dense = a.toarray()
    for got, want in [
        (np.dot(t, x), dense @ x),
        (np.matmul(t, x), dense @ x),
        (np.dot(y, t), y @ dense),
        (np.matmul(y, t), y @ dense),
        (np.add(x, t), x + dense),
        (np.subtract(t, x), dense - x),
        (np.sum(t, axis=0), dense.sum(0)),
        (np.sum(t, 1), dense.sum(1)),
    ]:
        assert isinstance(got, np.ndarray)
        np.testing.assert_allclose(got, want)
    for got, want in [
        (np.dot(t, t.T), dense @ dense.T),
        (np.matmul(t, t.T), dense @ dense.T),
        (np.add(t, t), 2 * dense),
        (np.multiply(x, t), x * dense),
        (np.negative(t), -dense),
        (np.multiply(np.float64(2), t), 2 * dense),
        (np.dot(2.0, t), 2 * dense),
        (np.transpose(t), dense.T),
    ]:
        assert isinstance(got, sparsec.Tensor)
        np.testing.assert_allclose(dense_of(got), want)
        assert got.nnz <= t.nnz * max(t.shape)  # assembled by a kernel, not densified


@pytest.mark.parametrize(
    "call",
    [
        lambda t, x: np.exp(t),
        lambda t, x: np.allclose(t, t),
        lambda t, x: np.concatenate([t, t]),
        lambda t, x: np.add.reduce(t),
        lambda t, x: np.multiply(t, 2.0, out=x),
        lambda t, x: np.einsum("ij,j->i", t, x),
        lambda t, x: np.transpose(t, (0, 1)),
    ],
)
def test_numpy_entry_points_without_a_sparse_meaning_are_refused(call):
    t, _ = matrix((7, 5))
    with pytest.raises(InputError, match="sparsec"):
        call(t, np.zeros((7, 5)))


@pytest.mark.parametrize("kind", ["csr_matrix", "csr_array", "coo_matrix"])
def test_a_scipy_operand_never_densifies_a_tensor(kind):
    """Issue 36 item 17: ``A @ T`` with A scipy returned a dense ndarray (scipy calls
    np.asanyarray on T). scipy's operators get a refusal naming the sparse spelling; + and
    - defer to T and stay sparse; explicit conversions (np.asarray, a constructor) convert."""
    t, a = matrix((7, 7))
    s = getattr(sp, kind)(a)
    for densifying in (lambda: s @ t, lambda: s.dot(t), lambda: s.multiply(t)):
        with pytest.raises(InputError, match=r"sparsec.as_tensor\(A\) @ T"):
            densifying()
    assert isinstance(sparsec.as_tensor(s) @ t, sparsec.Tensor)
    for got, want in ((s + t, 2 * a.toarray()), (s - t, 0 * a.toarray())):
        assert isinstance(got, sparsec.Tensor)
        np.testing.assert_allclose(dense_of(got), want)
    np.testing.assert_allclose(np.asarray(t), a.toarray())
    np.testing.assert_allclose(sp.csr_array(t).toarray(), a.toarray())


# ---------------------------------------------------------------- the 100k x 100k case


@pytest.fixture(scope="module")
def huge():
    n, nnz = 100_000, 100_000
    rng = np.random.default_rng(0)
    cells = rng.choice(n * n, nnz, replace=False)
    a = sp.csr_array((rng.random(nnz), (cells // n, cells % n)), shape=(n, n))
    return sparsec.Tensor.from_scipy(a), a


def test_100k_square_with_100k_entries_stays_sparse(huge):
    t, a = huge
    x = np.random.default_rng(1).random(a.shape[1])
    ops = {
        "T @ x": (lambda: t @ x, lambda: a @ x),
        "T + T": (lambda: t + t, lambda: a + a),
        "T * 2": (lambda: t * 2, lambda: a * 2),
        "T.T": (lambda: t.T, lambda: a.T),
        "T.sum(0)": (lambda: t.sum(0), lambda: a.sum(0)),
        "T @ T.T": (lambda: t @ t.T, lambda: a @ a.T),
    }
    dense_bytes = a.shape[0] * a.shape[1] * 8  # 80 GB
    for name, (ours, theirs) in ops.items():
        ours()  # compiled (or loaded from the cache) outside the measurement
        tracemalloc.start()
        got = ours()
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < 64 << 20, (name, peak)  # a few arrays of nnz or n entries
        assert peak < dense_bytes / 1000
        want = theirs()
        if isinstance(got, sparsec.Tensor):
            diff = abs(got.to_scipy() - sp.csr_array(want)).max()
            assert got.nnz == sp.csr_array(want).nnz and diff < 1e-12, name
        else:
            np.testing.assert_allclose(got, want, rtol=1e-12, err_msg=name)


def test_dense_conversion_refused_when_it_would_not_fit(huge):
    t, _ = huge
    tracemalloc.start()
    with use(memory=16 << 30), pytest.raises(InputError, match=r"74\.5 GiB.*to_scipy"):
        np.asarray(t)
    with use(memory=16 << 30), pytest.raises(InputError, match="more than half"):
        t.to_dense()
    assert tracemalloc.get_traced_memory()[1] < 1 << 20  # refused before allocating
    tracemalloc.stop()
    small, a = matrix()
    with use(memory=16 << 30):
        np.testing.assert_array_equal(np.asarray(small), a.toarray())
    with use(memory=100), pytest.raises(InputError, match="more than half"):
        small.to_dense()


def test_machine_memory_fact_reads_from_the_environment():
    code = "from sparsec.policy.machine import machine; print(machine().memory)"
    env = {"SPARSEC_MACHINE": "memory=3G", "PATH": ""}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == str(3 << 30), out.stderr


def test_import_sparsec_brings_io():
    code = "import sparsec; print(callable(sparsec.io.load), callable(sparsec.io.save))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "True True", out.stderr


# ---------------------------------------------------------------- sparsec.einsum

EINSUMS = [
    ("ij,j->i", ((7, 5), (5,))),  # SpMV
    ("ij,jk->ik", ((7, 5), (5, 3))),  # SpMM
    ("ji,j->i", ((7, 5), (7,))),  # transposed SpMV
    ("ij,j", ((7, 5), (5,))),  # implicit output: i
    ("ij->ji", ((7, 5),)),
    ("ij->", ((7, 5),)),
    ("ii->", ((6, 6),)),  # trace
    ("ii->i", ((6, 6),)),  # diagonal
    ("i,j->ij", ((7,), (5,))),  # outer product
    ("ij,k->ijk", ((7, 5), (3,))),
    ("ij,ij->ij", ((7, 5), (7, 5))),  # elementwise
    ("ij,ij", ((7, 5), (7, 5))),  # implicit: a full contraction
    (",ij->ij", ((), (7, 5))),  # a scalar operand
]


@pytest.mark.parametrize(("spelling", "shapes"), EINSUMS)
@pytest.mark.parametrize("fmt", ["csr", "csc", "coo"])
def test_einsum_matches_numpy(spelling, shapes, fmt):
    rng = np.random.default_rng(0)
    dense = [rng.random(s) * (rng.random(s) < 0.5) if s else np.float64(2.5) for s in shapes]
    first = max(range(len(shapes)), key=lambda i: len(shapes[i]))  # the sparse one
    dense[first][1] = 0  # an empty row (a zero for a vector)
    operands = list(dense)
    operands[first] = sparsec.as_tensor(dense[first], fmt if len(shapes[first]) == 2 else "s")
    got = sparsec.einsum(spelling, *operands)
    np.testing.assert_allclose(got, np.einsum(spelling, *dense), rtol=1e-12, atol=1e-12)


def test_einsum_sparse_operands_and_outputs():
    t, a = matrix((7, 5))
    s, b = matrix((5, 6), "csc", seed=3)
    got = sparsec.einsum("ik,kj->ij", t, s, out_format="csr")
    assert isinstance(got, sparsec.Tensor) and got.format == sparsec.parse_format("csr", 2)
    np.testing.assert_allclose(dense_of(got), (a @ b).toarray(), atol=1e-12)
    np.testing.assert_allclose(sparsec.einsum("ik,kj->ij", a, b), (a @ b).toarray(), atol=1e-12)
    x = torch.from_numpy(np.arange(5.0))
    got = sparsec.einsum("ij,j->i", t, x)  # torch in, torch out
    assert isinstance(got, torch.Tensor)
    np.testing.assert_allclose(got.numpy(), a @ np.arange(5.0), atol=1e-12)
    np.testing.assert_allclose(sparsec.einsum("ij,j->i", t, np.arange(5)), a @ np.arange(5.0))


@pytest.mark.parametrize(
    ("spelling", "count", "error", "match"),
    [
        ("ij,j->i", 1, InputError, "name 2 operand"),
        ("ij,j->i", 3, InputError, "name 2 operand"),
        ("i$,j->i", 2, sparsec.ParseError, r"'\$' is not a subscript"),
        ("...j,j->i", 2, sparsec.ParseError, "not supported"),
        ("ij,j->ii", 2, sparsec.ParseError, "repeated in the output"),
        ("ij,j->q", 2, sparsec.ParseError, "appears in no operand"),
        ("ijk,j->i", 2, ShapeError, "has order 2"),
        ("ij,i->i", 2, ShapeError, "subscript 'i' is 7"),
    ],
)
def test_einsum_bad_spellings(spelling, count, error, match):
    t, _ = matrix((7, 5))
    operands = [t, np.ones(5), np.ones(5)][:count]
    with pytest.raises(error, match=match):
        sparsec.einsum(spelling, *operands)
