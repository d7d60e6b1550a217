"""Mapped formats (issue 39): bsr(R,C) and nm(N,M) -- their spelling, their round trips
with scipy and torch, every core statement over them against numpy on C and the CUDA
emulation, and the refusals (docs/semantics.md, Dimensions apart from levels)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import sparsec
from sparsec import FormatError, MappedTensor, NotationError, ShapeError, StorageError
from sparsec.tensors.maps import DIV, MOD, MappedFormat, parse_mapped

TARGETS = pytest.mark.parametrize("target", ["c", "cuda-emulated"])
DTYPES = pytest.mark.parametrize("dtype", ["float64", "float32"])


def blocked(rows: int, cols: int, r: int, c: int, seed: int, fill: float = 0.4) -> np.ndarray:
    """Integer values in r x c blocks, about ``fill`` of them stored; the first block row
    is empty and the first stored block holds a zero."""
    rng = np.random.default_rng(seed)
    keep = rng.random((rows // r, cols // c)) < fill
    keep[0] = False
    d = rng.integers(-3, 4, (rows, cols)).astype(float) * np.kron(keep, np.ones((r, c)))
    return d


def pruned(rows: int, cols: int, n: int, m: int, seed: int) -> np.ndarray:
    """At most n nonzeros in each group of m along the rows; some groups hold fewer, one
    row is empty."""
    rng = np.random.default_rng(seed)
    d = np.zeros((rows, cols))
    for i in range(1, rows):
        for g in range(cols // m):
            count = rng.integers(0, n + 1)
            at = rng.choice(m, size=count, replace=False) + g * m
            d[i, at] = rng.integers(1, 4, count) * rng.choice([-1, 1], count)
    return d


# ------------------------------------------------------------------ spelling


def test_named_formats_and_the_spelled_map():
    bsr = parse_mapped("bsr(4,2)", 2)
    assert isinstance(bsr, MappedFormat) and bsr.inner.spelling == "dsdd"
    assert [(e.dim, e.op, e.block) for e in bsr.exprs] == [
        (0, DIV, 4), (1, DIV, 2), (0, MOD, 4), (1, MOD, 2)
    ]  # fmt: skip
    spelled = parse_mapped("(i, j) -> (i floordiv 4 : dense, j / 2 : s, i mod 4 : d, j % 2 : d)", 2)
    assert isinstance(spelled, MappedFormat) and spelled.exprs == bsr.exprs
    assert spelled.inner == bsr.inner
    nm = parse_mapped("nm(2,4)", 2)
    assert isinstance(nm, MappedFormat) and nm.inner.spelling == "dddp"
    assert parse_mapped("nm(2,4)", 3).inner.spelling == "ddddp"
    # a map that only permutes is the plain format with that mode ordering
    assert parse_mapped("(i,j) -> (j : d, i : s)", 2) == sparsec.parse_format("csc", 2)


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("bsr(0,2)", "at least 1"),
        ("nm(3,2)", "1 <= N <= M"),
        ("(i,j) -> (i/4 : d, j : s)", "floordiv B' and then 'mod B'"),
        ("(i,j) -> (i%4 : d, i/4 : d, j : s)", "floordiv B' and then 'mod B'"),
        ("(i,j) -> (i/2 : d, j : s, i%4 : d)", "one block"),
        ("(i,j) -> (k : d, j : s)", "a dimension"),
        ("(i,j) -> (i : x, j : s)", "expression : level"),
    ],
)
def test_bad_maps_say_what_is_wrong(spec, match):
    with pytest.raises(FormatError, match=match):
        parse_mapped(spec, 2)


def test_bsr_is_for_matrices():
    with pytest.raises(FormatError, match="matrices"):
        sparsec.Tensor.from_dense(np.ones((2, 2, 2)), "bsr(2,2)")


# ------------------------------------------------------------------ round trips


def test_bsr_round_trips_with_scipy_keeping_zero_blocks():
    d = blocked(8, 12, 2, 3, seed=1)
    b = sp.bsr_array(d, blocksize=(2, 3))
    zero_block = sp.bsr_array(
        (np.zeros((1, 2, 3)), np.array([3]), np.array([0, 1, 1, 1, 1])), shape=(8, 12)
    )
    b = (b + zero_block).tobsr(blocksize=(2, 3))
    t = sparsec.Tensor.from_scipy(b, "bsr(2,3)")
    assert isinstance(t, MappedTensor) and t.format.name == "bsr(2,3)"
    np.testing.assert_array_equal(t.to_dense(), d)
    back = t.to_scipy()
    assert back.format == "bsr" and back.blocksize == (2, 3)
    np.testing.assert_array_equal(back.toarray(), d)
    assert t.nnz == b.nnz  # the stored all-zero block stays an entry


def test_bsr_round_trips_with_torch():
    d = blocked(6, 8, 2, 2, seed=2)
    t = sparsec.Tensor.from_torch(torch.tensor(d).to_sparse_bsr((2, 2)), "bsr(2,2)")
    np.testing.assert_array_equal(t.to_dense(), d)
    out = t.to_torch()
    assert out.layout == torch.sparse_bsr and tuple(out.values().shape[1:]) == (2, 2)
    torch.testing.assert_close(out.to_dense(), torch.tensor(d))
    # another block size, and from a CSR tensor: through the entries
    t4 = sparsec.Tensor.from_torch(torch.tensor(d).to_sparse_csr(), "bsr(3,4)")
    np.testing.assert_array_equal(t4.to_dense(), d)


@pytest.mark.parametrize("fmt", ["bsr(2,2)", "bsr(1,4)", "nm(2,4)", "nm(1,2)"])
def test_from_dense_to_dense_and_conversions(fmt):
    n = int(fmt[3]) if fmt.startswith("nm") else 0
    d = pruned(6, 8, n, int(fmt[5]), seed=3) if n else blocked(6, 8, 2, 4, seed=3)
    t = sparsec.Tensor.from_dense(d, fmt, dtype="float32", index_dtype="int64")
    assert t.dtype == np.float32 and t.index_dtype == np.int64
    np.testing.assert_array_equal(t.to_dense(), d)
    csr = sparsec.as_tensor(t, "csr")
    assert isinstance(csr, sparsec.Tensor)
    np.testing.assert_array_equal(csr.to_dense(), d)
    again = sparsec.as_tensor(csr, fmt)
    np.testing.assert_array_equal(again.to_dense(), d)
    assert sparsec.as_tensor(t) is t and t.to_format(fmt) is t
    np.testing.assert_array_equal(t.to_scipy().toarray(), d)
    np.testing.assert_array_equal(t.to_torch().to_dense().numpy(), d)


@pytest.mark.parametrize("fmt", ["bsr(2,2)", "nm(2,4)"])
def test_empty_and_zero_extent_tensors(fmt):
    for shape in [(4, 8), (0, 8), (4, 0)]:
        t = sparsec.Tensor.from_dense(np.zeros(shape), fmt)
        assert t.shape == shape and not t.to_dense().any()


def test_a_group_with_too_many_entries_is_refused():
    d = np.zeros((2, 8))
    d[1, 4:7] = 1.0  # three entries in a group of a 2:4 tensor
    with pytest.raises(StorageError, match="at most 2 entries per group"):
        sparsec.Tensor.from_dense(d, "nm(2,4)")


def test_a_shape_the_blocks_do_not_divide_is_refused():
    with pytest.raises(ShapeError, match="multiple of 4"):
        sparsec.Tensor.from_dense(np.ones((6, 8)), "bsr(4,4)")
    with pytest.raises(ShapeError, match="multiple of 4"):
        sparsec.Tensor.from_dense(np.ones((2, 6)), "nm(2,4)")


def test_from_coo_sums_duplicates_before_numbering_slots():
    t = sparsec.Tensor.from_coo([[0, 0, 0], [1, 1, 2]], [1.0, 2.0, 5.0], (2, 4), "nm(2,4)")
    np.testing.assert_array_equal(t.to_dense()[0], [0, 3, 5, 0])


# ------------------------------------------------------------------ statements


def _tensor(d, fmt, dtype):
    return sparsec.Tensor.from_dense(d.astype(dtype), fmt)


def _close(got, want, dtype):
    if isinstance(got, MappedTensor | sparsec.Tensor):
        got = got.to_dense()
    tol = 1e-4 if dtype == "float32" else 1e-10
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64), want, rtol=tol, atol=tol)


@TARGETS
@DTYPES
@pytest.mark.parametrize("fmt", ["bsr(2,3)", "bsr(4,1)", "nm(2,3)"])
def test_spmv_and_spmm(target, dtype, fmt):
    d = pruned(12, 12, 2, 3, seed=4) if fmt.startswith("nm") else blocked(12, 12, 4, 3, seed=4)
    rng = np.random.default_rng(5)
    x, X = rng.random(12).astype(dtype), rng.random((12, 5)).astype(dtype)
    a = _tensor(d, fmt, dtype)
    k = sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": fmt}, target=target)
    _close(k(A=a, x=x), d @ x, dtype)
    k = sparsec.kernel("Y(i,k) = A(i,j) * X(j,k)", {"A": fmt}, target=target)
    _close(k(A=a, X=X), d @ X, dtype)
    k = sparsec.kernel("Y(j,k) = A(i,j) * X(i,k)", {"A": fmt}, target=target)
    _close(k(A=a, X=X), d.T @ X, dtype)


@TARGETS
@DTYPES
def test_sddmm_add_multiply_and_spgemm_with_bsr_outputs(target, dtype):
    d, e = blocked(8, 12, 2, 4, seed=6), blocked(8, 12, 2, 4, seed=7)
    rng = np.random.default_rng(8)
    P, Q = rng.random((8, 3)).astype(dtype), rng.random((3, 12)).astype(dtype)
    a, b = _tensor(d, "bsr(2,4)", dtype), _tensor(e, "bsr(2,4)", dtype)
    out = {"A": "bsr(2,4)", "B": "bsr(2,4)", "C": "bsr(2,4)"}
    sddmm = sparsec.kernel(
        "C(i,j) = A(i,j) * P(i,k) * Q(k,j)", {"A": "bsr(2,4)", "C": "bsr(2,4)"}, target=target
    )
    got = sddmm(A=a, P=P, Q=Q)
    assert isinstance(got, MappedTensor) and got.format.name == "bsr(2,4)"
    _close(got, d * (P @ Q), dtype)
    dense_out = sparsec.kernel(
        "C(i,j) = A(i,j) * P(i,k) * Q(k,j)", {"A": "bsr(2,4)"}, target=target
    )
    _close(dense_out(A=a, P=P, Q=Q), d * (P @ Q), dtype)
    _close(sparsec.kernel("C(i,j) = A(i,j) + B(i,j)", out, target=target)(A=a, B=b), d + e, dtype)
    _close(sparsec.kernel("C(i,j) = A(i,j) * B(i,j)", out, target=target)(A=a, B=b), d * e, dtype)
    f = blocked(12, 8, 4, 2, seed=9)
    spgemm = sparsec.kernel(
        "C(i,k) = A(i,j) * F(j,k)",
        {"A": "bsr(2,4)", "F": "bsr(4,2)", "C": "bsr(2,2)"},
        target=target,
    )
    _close(spgemm(A=a, F=_tensor(f, "bsr(4,2)", dtype)), d @ f, dtype)


@TARGETS
def test_mttkrp_over_an_nm_tensor(target):
    rng = np.random.default_rng(10)
    b = np.stack([pruned(4, 8, 2, 4, seed=s) for s in range(3)], axis=1)  # i, k, l
    D, C = rng.random((8, 5)), rng.random((3, 5))
    k = sparsec.kernel("A(i,j) = B(i,k,l) * D(l,j) * C(k,j)", {"B": "nm(2,4)"}, target=target)
    _close(
        k(B=sparsec.Tensor.from_dense(b, "nm(2,4)"), D=D, C=C),
        np.einsum("ikl,lj,kj->ij", b, D, C),
        "float64",
    )


def test_a_plain_sparse_operand_on_undivided_indices_and_dense_levels():
    d = blocked(8, 8, 2, 2, seed=11)
    rng = np.random.default_rng(12)
    s = rng.integers(0, 3, (8, 5)).astype(float) * (rng.random((8, 5)) < 0.4)
    x = rng.random(5)
    # S(j,k) in CSR: j, split by A's blocks, is its dense level
    k = sparsec.kernel("y(i) = A(i,j) * S(j,k) * x(k)", {"A": "bsr(2,2)", "S": "csr"})
    _close(k(A=d, S=sparsec.Tensor.from_dense(s, "csr"), x=x), d @ s @ x, "float64")


def test_inputs_of_every_kind_are_converted():
    d = blocked(4, 6, 2, 3, seed=13)
    x = np.arange(6.0)
    k = sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": "bsr(2,3)"})
    for given in (d, torch.tensor(d), sp.csr_array(d), sparsec.Tensor.from_dense(d, "csr")):
        _close(k(A=given, x=x), d @ x, "float64")
    got = k(A=d, x=torch.tensor(x))
    assert isinstance(got, torch.Tensor) and got.shape == (4,)


def test_the_kernel_says_its_maps_and_pickles():
    k = sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": "bsr(2,2)"})
    assert str(k.formats["A"]) == "bsr(2,2)"
    assert "levels: i = i0 * 2 + i1" in k.source
    assert "A is bsr(2,2), stored over its levels as A(i0,j0,i1,j1)" in k.source
    again = pickle.loads(pickle.dumps(k))
    d = blocked(4, 4, 2, 2, seed=14)
    _close(again(A=d, x=np.ones(4)), d.sum(axis=1), "float64")


@pytest.mark.parametrize("fmt", ["bsr(2,3)", "nm(2,4)"])
def test_random_inputs_and_check(fmt):
    k = sparsec.kernel("Y(i,k) = A(i,j) * X(j,k)", {"A": fmt})
    inputs, dims = k.random_inputs({"i": 6, "j": 12}, seed=3)
    assert isinstance(inputs["A"], MappedTensor) and inputs["A"].shape == (6, 12)
    assert dims["i"] == 6 and dims["j"] == 12 and inputs["X"].shape == (12, dims["k"])
    k.check(**inputs)
    _close(k(**inputs), inputs["A"].to_dense() @ inputs["X"], "float64")


def test_gradients_reach_dense_torch_operands():
    d = blocked(4, 6, 2, 3, seed=15)
    x = torch.arange(6.0, dtype=torch.float64, requires_grad=True)
    k = sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": "bsr(2,3)"})
    y = k(A=d, x=x)
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.tensor(d.sum(axis=0)))


# ------------------------------------------------------------------ refusals


@pytest.mark.parametrize(
    ("expr", "formats", "error", "match"),
    [
        (
            "y(i) = A(i,j) * x(j) + B(i,j) * x(j)",
            {"A": "bsr(2,2)", "B": "csr"},
            FormatError,
            "compressed level",
        ),
        ("C(i,j) = A(i,j) + B(i,j)", {"A": "bsr(2,2)", "B": "bsr(4,4)"}, FormatError, "agree"),
        ("C(i,j) = A(i,j) + B(i,j)", {"A": "bsr(2,2)", "B": "nm(2,4)"}, FormatError, "agree"),
        ("y(i) = A(i,j) * B(j,i)", {"A": "bsr(2,2)", "B": "nm(1,2)"}, FormatError, "whole"),
        ("y(i) = A(i,i)", {"A": "bsr(2,2)"}, NotationError, "repeats an index"),
    ],
)
def test_statements_the_rules_refuse(expr, formats, error, match):
    with pytest.raises(error, match=match):
        sparsec.kernel(expr, formats)


def test_masks_and_padding_semirings_are_refused():
    with pytest.raises(FormatError, match="mask"):
        sparsec.kernel("C(i,j) = A(i,j) * B(i,j)", {"A": "bsr(2,2)"}, mask="M")
    with pytest.raises(FormatError, match="pads"):
        sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": "nm(2,4)"}, semiring="min_plus")


def test_a_dense_operand_the_blocks_do_not_divide():
    k = sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": "bsr(2,2)"})
    with pytest.raises(ShapeError, match="multiple of 2"):
        k(A=blocked(4, 4, 2, 2, seed=16), x=np.ones(5))


def test_distributed_kernels_refuse_maps():
    pytest.importorskip("dask")
    import sparsec.distributed as sd

    with pytest.raises(FormatError, match="mapped formats"):
        sd.kernel("y(i) = A(i,j) * x(j)", {"A": "bsr(2,2)"})


def test_the_parallel_rows_have_their_own_function_where_blocks_fix_extents():
    """`lower.outline`: a kernel whose formats fix loop extents runs its parallel loop's
    rows in `sparsec_rows` (the parameters' restrict kept), with the same results at 1 and
    2 threads; a kernel without fixed extents keeps its loop, and `outline` turns it off."""
    from sparsec.policy import calibrated

    d = blocked(64, 64, 4, 4, seed=17)
    x = np.arange(64.0)
    k = sparsec.Kernel("y(i) = A(i,j) * x(j)", {"A": "bsr(4,4)"})
    assert "static __attribute__((noinline)) int sparsec_rows(" in k.source
    for threads in (1, 2):
        _close(k(A=d, x=x, threads=threads), d @ x, "float64")
    assert "sparsec_rows" not in sparsec.Kernel("y(i) = A(i,j) * x(j)", {"A": "csr"}).source
    with calibrated.trying({"outline": "all"}):
        assert "sparsec_rows" in sparsec.Kernel("y(i) = A(i,j) * x(j)", {"A": "csr"}).source
    with calibrated.trying({"outline": "off"}):
        off = sparsec.Kernel("y(i) = A(i,j) * x(j)", {"A": "bsr(4,4)"})
        assert "sparsec_rows" not in off.source
        _close(off(A=d, x=x, threads=2), d @ x, "float64")


def test_the_levels_fixed_extents_are_checked_and_extents_take_the_users_indices():
    k = sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": "bsr(4,4)"})
    wrong = sparsec.Tensor.from_dense(np.ones((2, 2, 3, 3)), "dsdd")  # blocks of 3, not 4
    with pytest.raises(ShapeError, match="formats fix it at 4"):
        k.run_levels({"A": wrong, "x": np.ones((2, 3))}, 1)
    dims = k.extents({"i": 8, "j": 16})
    assert (dims["i0"], dims["i1"], dims["j0"], dims["j1"]) == (2, 4, 4, 4)


def test_a_mapped_tensor_has_the_tensor_operators():
    d, e = blocked(8, 12, 2, 3, seed=18), blocked(8, 12, 2, 3, seed=19)
    f = blocked(12, 8, 3, 4, seed=20)
    a, b = sparsec.Tensor.from_dense(d, "bsr(2,3)"), sparsec.Tensor.from_dense(e, "bsr(2,3)")
    c = sparsec.Tensor.from_dense(f, "bsr(3,4)")
    x, X = np.arange(12.0), np.ones((12, 3))
    _close(a @ x, d @ x, "float64")
    _close(a @ X, d @ X, "float64")
    _close(np.arange(8.0) @ a, np.arange(8.0) @ d, "float64")
    for got, want, fmt in (
        (a + b, d + e, "bsr(2,3)"),
        (a * b, d * e, "bsr(2,3)"),
        (a @ c, d @ f, "bsr(2,4)"),
        (a.T, d.T, "bsr(3,2)"),
        (-a, -d, "bsr(2,3)"),
        (a * 2, 2 * d, "bsr(2,3)"),
    ):
        assert isinstance(got, MappedTensor) and str(got.format) == fmt
        _close(got, want, "float64")
    _close(a.sum(axis=1), d.sum(axis=1), "float64")
    nm = sparsec.Tensor.from_dense(pruned(4, 8, 2, 4, seed=21), "nm(2,4)")
    with pytest.raises(sparsec.InputError, match="transpose"):
        nm.T  # noqa: B018
    with pytest.raises(sparsec.InputError, match=r"bsr\(R,K\) @ bsr\(K,C\)"):
        a @ sparsec.Tensor.from_dense(f, "csr")
