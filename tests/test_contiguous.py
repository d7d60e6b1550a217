"""Dense reads fed transposed (`sparsec.middle.derive.contiguous`).

SDDMM ``A(i,j) = B(i,j) * C(i,k) * D(k,j)`` runs loops ``i, j, k`` and would read ``D``
down its columns in the innermost loop; it reads a copy of ``D`` with its levels in loop
order instead. Results are those of dense torch (equal to the strided read's on
integer-valued data, whatever order the vector lanes sum in), on sparse and dense outputs, both dtypes and
index widths, 1 and 2 threads, with empty rows and stored zeros. Reads that are already
contiguous, or read once in all, and kernels with a user schedule or for CUDA are left as
they were.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import sparse_array

import sparsec
from sparsec import Tensor
from sparsec.middle.spec import Derived

SDDMM = "A(i,j) = B(i,j) * C(i,k) * D(k,j)"


def _transposed(k: sparsec.Kernel) -> list[str]:
    return [d.name for d in k.spec.derived if isinstance(d, Derived) and d.source.format.is_dense]


def _with_stored_zero(dense: np.ndarray, fmt: str, dtype: str, index_dtype: str) -> Tensor:
    """``dense`` in ``fmt`` plus one explicit zero in a non-empty row."""
    rows, cols = np.nonzero(dense)
    zi, zj = next(
        (i, j) for i, j in zip(*np.nonzero(dense == 0), strict=True) if i in set(rows.tolist())
    )
    coords = np.array([[*rows, zi], [*cols, zj]], dtype=np.int64)
    values = np.concatenate([dense[rows, cols], [0.0]])
    return Tensor.from_coo(coords, values, dense.shape, fmt, dtype=dtype, index_dtype=index_dtype)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype,index_dtype", [("float64", "int32"), ("float32", "int64")])
@pytest.mark.parametrize("out", ["csr", "dense"])
def test_sddmm_reads_d_transposed_and_matches_torch(out, dtype, index_dtype, threads, rng):
    b = sparse_array((13, 11), rng)
    b[4] = 0.0  # an empty row besides the one sparse_array makes
    B = _with_stored_zero(b, "csr", dtype, index_dtype)
    C = rng.uniform(-1, 1, (13, 6)).astype(dtype)
    D = rng.uniform(-1, 1, (6, 11)).astype(dtype)
    formats = {"B": "csr"} | ({"A": "csr"} if out == "csr" else {})
    k = sparsec.kernel(SDDMM, formats, dtype=dtype)
    if out == "csr":  # a dense output runs loops i, k, j: D is read along its rows
        assert _transposed(k) == ["D_as"]
        assert "D transposed at call time" in k.schedule
    got = k(B=B, C=C, D=D, threads=threads)
    dense_got = got.to_dense() if isinstance(got, Tensor) else np.asarray(got)
    want = torch.from_numpy(B.to_dense().astype(np.float64)) * (
        torch.from_numpy(C.astype(np.float64)) @ torch.from_numpy(D.astype(np.float64))
    )
    tol = 1e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(dense_got, want.numpy(), rtol=tol, atol=tol)
    if isinstance(got, Tensor):  # the output keeps B's pattern, its stored zero included
        assert got.nnz == B.nnz
    k.check(B=B, C=C, D=D)


def test_sddmm_is_bit_identical_to_the_strided_read(rng):
    """The user's schedule keeps the strided read: the same sums (integer-valued data, so
    the dots pass's reordering of the contiguous one cannot hide a wrong element)."""
    B = Tensor.from_dense(np.round(sparse_array((17, 9), rng) * 8), "csr")
    C = rng.integers(-4, 5, (17, 300)).astype(np.float64)
    D = rng.integers(-4, 5, (300, 9)).astype(np.float64)
    fed = sparsec.kernel(SDDMM, {"B": "csr", "A": "csr"})
    strided = sparsec.kernel(SDDMM, {"B": "csr", "A": "csr"}, schedule="reorder(i,j,k)")
    assert _transposed(fed) == ["D_as"] and _transposed(strided) == []
    for threads in (1, 2):
        a = fed(B=B, C=C, D=D, threads=threads)
        b = strided(B=B, C=C, D=D, threads=threads)
        np.testing.assert_array_equal(a.vals, b.vals)
        np.testing.assert_array_equal(a.levels[1].crd, b.levels[1].crd)


def test_torch_inputs_and_a_non_contiguous_d(rng):
    B = sparse_array((8, 10), rng)
    C = torch.from_numpy(rng.uniform(-1, 1, (8, 5)))
    D = torch.from_numpy(rng.uniform(-1, 1, (10, 5))).T  # a transposed view
    k = sparsec.kernel(SDDMM, {"B": "csr"})
    got = k(B=Tensor.from_dense(B, "csr"), C=C, D=D)
    want = B * (C @ D).numpy()
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12, atol=1e-12)


def test_an_order_three_read_gets_its_levels_in_loop_order(rng):
    """E(l,k,j), which the innermost loop would walk along a mode other than its last,
    is read with its levels in loop order."""
    expr = "A(i,j) = B(i,j) * C(i,k) * E(l,k,j) * f(l)"
    b = sparse_array((6, 5), rng)
    C, E, f = rng.uniform(-1, 1, (6, 4)), rng.uniform(-1, 1, (3, 4, 5)), rng.uniform(-1, 1, 3)
    k = sparsec.kernel(expr, {"B": "csr", "A": "csr"})
    assert _transposed(k) == ["E_as"]
    (fed,) = [d for d in k.spec.derived if d.name == "E_as"]
    order = k.generated().loop_order
    assert [fed.indices[m] for m in fed.format.ordering] == [v for v in order if v in "jkl"]
    assert order[-1] != "j"
    got = k(B=Tensor.from_dense(b, "csr"), C=C, E=E, f=f).to_dense()
    want = b * np.einsum("ik,lkj,l->ij", C, E, f)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "expr,formats",
    [
        ("C(i,j) = W(i,k) * X(k,j)", {"W": "csr"}),  # X read along its rows already
        ("y(i) = A(i,j) * x(j)", {"A": "csr"}),  # a vector
        ("y(i) = D(j,i) * x(j)", {}),  # D read once in all: a copy would not pay
        ("A(i,j) = B(i,j) * C(i,k) * D(j,k)", {"B": "csr"}),  # D(j,k) already fits
    ],
)
def test_reads_that_fit_or_are_read_once_are_left_alone(expr, formats):
    assert _transposed(sparsec.kernel(expr, formats)) == []


def test_cuda_and_user_schedules_keep_the_read(rng):
    assert _transposed(sparsec.kernel(SDDMM, {"B": "csr"}, target="cuda-emulated")) == []
    assert _transposed(sparsec.kernel(SDDMM, {"B": "csr"}, schedule="serial")) == []


@pytest.mark.parametrize("layout", ["row-major", "column-major", "strided"])
def test_a_source_read_only_through_its_copy_is_copied_once(layout, rng):
    """D is read only through its transposed copy D_as: passed as its transpose's view (the
    layout D_as wants: GraphBLAS's 'D stored transposed'), the copy is that memory, with no
    copy made; row-major or strided, one copy from D as passed. Before, D was first made
    C-contiguous, then copied again. Results equal on integer data; C, read as it is, is
    still made contiguous when passed column-major."""
    B = Tensor.from_dense(np.round(sparse_array((15, 12), rng) * 8), "csr")
    C = rng.integers(-4, 5, (15, 7)).astype(np.float64)
    Dt = rng.integers(-4, 5, (12, 7)).astype(np.float64)  # D^T, rows of D's columns
    D = {
        "row-major": np.ascontiguousarray(Dt.T),
        "column-major": Dt.T,
        "strided": np.ascontiguousarray(np.repeat(Dt.T, 2, axis=1))[:, ::2],
    }[layout]
    k = sparsec.kernel(SDDMM, {"B": "csr", "A": "csr"})
    assert _transposed(k) == ["D_as"]
    prepared = k.binder.prepare({"B": B, "C": np.asfortranarray(C), "D": D})
    copy = prepared.values["D_as"]
    assert copy.flags.c_contiguous and np.array_equal(copy, Dt)
    assert np.shares_memory(copy, D) == (layout == "column-major")
    assert prepared.values["C"].flags.c_contiguous
    got = k(B=B, C=np.asfortranarray(C), D=D).to_dense()
    np.testing.assert_array_equal(got, B.to_dense() * (C @ Dt.T))


@pytest.mark.parametrize("threads", [1, 2, 3, 7])
@pytest.mark.parametrize(
    "shape,axes", [((64, 301), (1, 0)), ((5, 6, 7), (2, 0, 1)), ((2, 900), (1, 0)), ((3,), (0,))]
)
def test_large_copies_on_threads_equal_numpys(shape, axes, threads, monkeypatch):
    """A copy made in slabs by several threads (every copy counts as large here) is numpy's,
    for more threads than rows too, and a C-ordered array is passed through as it is."""
    from sparsec.runtime import copies as convert

    monkeypatch.setattr(convert, "PARALLEL_COPY_BYTES", 0)
    array = np.arange(np.prod(shape), dtype=np.float64).reshape(shape).transpose(axes)
    got = convert.contiguous_copy(array, threads)
    assert got.flags.c_contiguous and got.shape == array.shape
    np.testing.assert_array_equal(got, np.ascontiguousarray(array))
    same = np.ascontiguousarray(array)
    assert convert.contiguous_copy(same, threads) is same


def _views(dtype: str) -> dict[str, np.ndarray]:
    base = (np.arange(37 * 301) % 251 - 125).astype(dtype).reshape(37, 301)
    return {
        "transposed": base.T,
        "every other row and third column": base[::2, ::3],
        "a transposed slice": base[3:30:2, 5:290:7].T,
        "one column": base[:, 4:5],
        "no rows": base[:0].T,
    }


@pytest.mark.parametrize("threads", [1, 2, 3, 7])
@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "int32", "int16", "int64"])
def test_band_copies_equal_numpys(dtype, threads, monkeypatch):
    """The compiled band copy (every 2-D copy that reads across rows counts as large here)
    is numpy's, bit for bit, for every value width, at more threads than rows too."""
    from sparsec.runtime import copies as convert

    monkeypatch.setattr(convert, "STRIDED_COPY_BYTES", 0)
    for what, view in _views(dtype).items():
        if what != "no rows":  # (either way: nothing to copy)
            assert convert._across_rows(view) == (what != "one column"), what
        got = convert.contiguous_copy(view, threads)
        assert got.flags.c_contiguous and got.dtype == view.dtype, what
        np.testing.assert_array_equal(got, np.ascontiguousarray(view), err_msg=what)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64", "float16"])
def test_transposes_copied_in_register_blocks_equal_numpys(dtype, threads, monkeypatch):
    """A source that runs along the output's rows (the transpose of a C-ordered array) is
    copied in blocks, a cache line of rows by a vector of columns transposed in registers
    (4- and 8-byte values; 2-byte ones take the bands): bit for bit numpy's at whole blocks,
    with rows and columns left over, from an offset that puts no load on a vector boundary,
    and at more threads than blocks. Both copies that use it are checked: the C-ordered one
    and the packed one on a cache line."""
    from sparsec.runtime import copies as convert

    monkeypatch.setattr(convert, "STRIDED_COPY_BYTES", 0)
    shapes = [(16, 8), (32, 16), (48, 24), (17, 9), (15, 7), (64, 3), (3, 64), (1, 100), (100, 1)]
    for rows, cols in shapes:
        n = (cols + 1) * (rows + 3)
        base = (np.arange(n) % 1021 - 510).astype(dtype).reshape(cols + 1, rows + 3)
        for view in (base[:cols, :rows].T, base[1:, 3:].T):
            assert view.strides[0] == view.itemsize and convert._across_rows(view)
            want = np.ascontiguousarray(view)
            for got in (convert.contiguous_copy(view, threads), convert.packed_copy(view, threads)):
                assert got.flags.c_contiguous and got.dtype == view.dtype
                np.testing.assert_array_equal(got, want, err_msg=f"{rows}x{cols}")


@pytest.mark.parametrize("threads", [1, 2])
def test_a_transposed_dense_operand_is_bound_by_the_compiled_copy(threads, monkeypatch, rng):
    """A dense operand passed as a transposed view that the kernel reads C-ordered (the
    gradient kernels read SparseLinear's activations so) is made C-ordered by the compiled
    copy on the call's threads, not by numpy's copy of a transpose (a source column read for
    every output row: 3.5 ms against 1.2 for a 1536 x 1024 float32 one); the result is the
    C-ordered operand's, bit for bit."""
    from sparsec.runtime import binding

    seen = []
    real = binding.contiguous_copy

    def spy(array, threads):
        seen.append((array.flags.c_contiguous, threads))
        return real(array, threads)

    monkeypatch.setattr(binding, "contiguous_copy", spy)
    k = sparsec.Kernel("y(i) = A(i,j) * X(j,t) * v(t)", {"A": "csr"}, dtype="float32")
    a = sparsec.as_tensor(sparse_array((40, 300), rng, integer=True).astype(np.float32), "csr")
    tokens_first = rng.integers(-3, 4, size=(200, 300)).astype(np.float32)
    v = rng.integers(-2, 3, size=200).astype(np.float32)
    got = k(A=a, X=tokens_first.T, v=v, threads=threads)
    assert (False, threads) in seen
    np.testing.assert_array_equal(got, k(A=a, X=np.ascontiguousarray(tokens_first.T), v=v))
    np.testing.assert_array_equal(got, a.to_dense() @ (tokens_first.T @ v))


def test_the_output_gradient_is_made_c_ordered_once_by_the_compiled_copy(monkeypatch, rng):
    """SparseLinear's output gradient arrives transposed (the layer returns Yt.T): the
    backward makes it C-ordered once, by the compiled copy, for both gradient kernels that
    read it (torch's copy of the transpose was 3x slower), and the gradients are the dense
    layer's, exactly."""
    import torch.nn.functional as F

    from sparsec.nn import SparseLinear
    from sparsec.runtime import copies

    seen = []
    real = copies.contiguous_copy

    def spy(array, threads):
        seen.append(array.shape)
        return real(array, threads)

    monkeypatch.setattr(copies, "contiguous_copy", spy)
    lin = torch.nn.Linear(48, 40, dtype=torch.float64)
    with torch.no_grad():
        lin.weight.copy_(torch.from_numpy(rng.integers(-3, 4, (40, 48))).double())
    layer = SparseLinear.from_linear(lin, 0.6)
    x = torch.from_numpy(rng.integers(-3, 4, (70, 48))).double().requires_grad_(True)
    dy = torch.from_numpy(rng.integers(-3, 4, (70, 40))).double()
    layer(x).backward(dy)
    assert seen.count((40, 70)) == 1  # dYt, copied once for dX and dW both
    mask = layer.to_dense().detach() != 0
    w = (lin.weight.detach() * mask).requires_grad_(True)
    x_ref = x.detach().clone().requires_grad_(True)
    F.linear(x_ref, w, lin.bias.detach()).backward(dy)
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=0, atol=0)
    torch.testing.assert_close(layer.values.grad, w.grad[mask], rtol=0, atol=0)


def test_copies_the_band_copy_does_not_take_are_numpys(monkeypatch):
    """Reversed, unaligned and 16-byte values, and more than two axes, go to numpy."""
    from sparsec.runtime import copies as convert

    monkeypatch.setattr(convert, "STRIDED_COPY_BYTES", 0)
    base = np.arange(40 * 30, dtype=np.float64).reshape(40, 30)
    raw = np.zeros(base.nbytes + 1, dtype=np.uint8)[1:].view(np.float64).reshape(40, 30)
    raw[...] = base  # a view at an odd address
    cases = [base[::-1].T, raw.T, base.astype(np.complex128).T, base.reshape(4, 10, 30).T]
    assert not raw.flags.aligned
    for view in cases:
        assert not convert._across_rows(view)
        np.testing.assert_array_equal(convert.contiguous_copy(view, 2), view)


def test_without_a_c_compiler_numpy_copies(monkeypatch):
    """Where the band copy cannot be built, the copy is numpy's, and the build is not
    tried again at every call."""
    from sparsec.base.errors import CompileError
    from sparsec.runtime import copies as convert

    tries = []

    def no_compiler(source):
        tries.append(source)
        raise CompileError("no C compiler")

    monkeypatch.setattr(convert, "STRIDED_COPY_BYTES", 0)
    monkeypatch.setattr(convert, "compile_cached", no_compiler)
    caches = (convert._library, convert._copy_fn, convert.panels_fn)
    for cache in caches:
        cache.cache_clear()
    try:
        view = np.arange(600.0).reshape(20, 30).T
        for _ in range(3):
            np.testing.assert_array_equal(convert.contiguous_copy(view, 2), view)
        assert len(tries) == 1
        assert convert.panels_fn() is None and len(tries) == 1  # nor for the panel driver
    finally:
        for cache in caches:
            cache.cache_clear()


@pytest.mark.parametrize("copy", ["slabs", "bands"])
@pytest.mark.parametrize("threads", [1, 2])
def test_sddmm_with_its_copy_on_threads_matches_torch(threads, copy, rng, monkeypatch):
    """D's transposed copy made by the call's threads, in numpy's slabs on Python threads or
    by the compiled band copy: the kernel reads the same values."""
    from sparsec.runtime import copies as convert

    monkeypatch.setattr(convert, "PARALLEL_COPY_BYTES", 0)
    monkeypatch.setattr(convert, "STRIDED_COPY_BYTES", 0 if copy == "bands" else 1 << 60)
    b = sparse_array((40, 50), rng, 0.2, integer=True)
    b[7] = 0  # an empty row
    c = rng.integers(-3, 4, (40, 33)).astype(np.float64)
    d = rng.integers(-3, 4, (33, 50)).astype(np.float64)
    k = sparsec.kernel(SDDMM, {"A": "csr", "B": "csr"})
    assert _transposed(k) == ["D_as"]
    got = k(B=b, C=c, D=d, threads=threads).to_dense()
    want = torch.einsum("ij,ik,kj->ij", *(torch.from_numpy(v) for v in (b, c, d))).numpy()
    np.testing.assert_array_equal(got, want)


def test_a_child_forked_after_the_copy_threads_started_copies_on_its_own(monkeypatch):
    """The copy threads do not survive fork: a child makes its own (else its first large
    copy on threads would wait forever for the parent's)."""
    import multiprocessing

    from sparsec.runtime import copies as convert

    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("no fork start method on this platform")
    monkeypatch.setattr(convert, "PARALLEL_COPY_BYTES", 0)
    array = np.arange(600.0).reshape(20, 30).T
    # more slabs than the pool has threads: every thread starts, then waits idle
    np.testing.assert_array_equal(convert.contiguous_copy(array, 30), array)
    with multiprocessing.get_context("fork").Pool(1) as pool:
        got = pool.apply_async(_copy_on_threads, (array,)).get(timeout=30)
    np.testing.assert_array_equal(got, array)


def _copy_on_threads(array: np.ndarray) -> np.ndarray:
    from sparsec.runtime import copies as convert

    convert.PARALLEL_COPY_BYTES = 0
    return convert.contiguous_copy(array, 30)
