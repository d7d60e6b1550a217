"""Column panels: a long dense output index computed in packed panels (`Kernel._run_panels`).

The thresholds are lowered so small inputs run in panels; every result must equal the
whole-width run bit for bit (each element gets the same additions in the same order) and
match dense torch.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
from conftest import MEASURED_ON, pruned_csr, sparse_array, torch_reference

import sparsec

COSTS = sys.modules["sparsec.policy.costs"]
EXECUTABLE = sys.modules["sparsec.runtime.executable"]
BUFFERS = sys.modules["sparsec.tensors.buffers"]
COPIES = sys.modules["sparsec.runtime.copies"]
SPMM = "C(i,j) = W(i,k) * X(k,j)"


@pytest.fixture
def small_panels(monkeypatch):
    monkeypatch.setattr(COSTS, "PANEL_COLUMNS", 8)
    monkeypatch.setattr(COSTS, "PANEL_MIN_COLUMNS", 16)
    monkeypatch.setattr(COSTS, "PANEL_MIN_BYTES", 0)
    monkeypatch.setattr(COSTS, "PANEL_MIN_REUSE", 0)
    monkeypatch.setattr(COSTS, "PANEL_MIN_REUSE_BEYOND_CACHE", 0)


def _whole(expr, fmts, inputs, threads, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(COSTS, "PANEL_MIN_BYTES", 1 << 62)
        return sparsec.Kernel(expr, fmts)(**inputs, threads=threads)


@pytest.mark.parametrize("width", [16, 17, 40, 64 + 3, 300])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_spmm_in_panels_equals_the_whole_run(width, dtype, threads, small_panels, monkeypatch):
    rng = np.random.default_rng(width)
    w = sparse_array((37, 29), rng, 0.3).astype(dtype)
    w[5] = 0  # an empty row
    x = rng.standard_normal((29, width)).astype(dtype)
    k = sparsec.Kernel(SPMM, {"W": "csr"})
    assert k.columns.index == "j" and k.columns.carriers == ("X",)
    tensor = sparsec.as_tensor(w, "csr")
    got = k(W=tensor, X=x, threads=threads)
    again = k(W=tensor, X=x, threads=threads)  # a repeated call (the fast path refuses it)
    whole = _whole(SPMM, {"W": "csr"}, {"W": tensor, "X": x}, threads, monkeypatch)
    np.testing.assert_array_equal(got, whole)
    np.testing.assert_array_equal(again, whole)
    # the kernel ran at the panels' widths, not the call's: it was built with every
    # register-tile stage (`sparsec.passes.stages`), not for the call's extent
    (built,) = k._executables.values()
    assert not built.loaded.generated.source.startswith("#define SC_HINT_")
    tol = 1e-4 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(
        got, torch_reference("ik,kj->ij", {"W": w, "X": x}), rtol=tol, atol=tol
    )


def test_packed_panels_start_on_a_cache_line(small_panels, monkeypatch):
    """Every packed panel the kernel receives starts on a 64-byte boundary, whatever the
    allocator gives (numpy: 16 bytes): a row of a misaligned panel splits every vector load
    over two cache lines. The copy itself is exact at any offset and dtype. (Panels run in
    Python here, the compiled driver off; the driver's own: below.)"""
    monkeypatch.setattr(EXECUTABLE, "panels_fn", lambda: None)
    for dtype in ("float32", "float64", "int8"):
        for offset in range(3):
            src = np.arange(offset + 7 * 11, dtype=dtype)[offset:].reshape(7, 11)
            for view in (src, src[:, 2:9], src.T):
                copy = BUFFERS.aligned_copy(view)
                assert copy.flags.c_contiguous and BUFFERS.address(copy) % 64 == 0
                np.testing.assert_array_equal(copy, view)
    seen = []
    real_run = EXECUTABLE.Executable.run

    def run(self, prepared, threads):
        if prepared.dims["j"] <= 8:  # a panel
            seen.append(BUFFERS.address(prepared.values["X"]) % 64)
        return real_run(self, prepared, threads)

    monkeypatch.setattr(EXECUTABLE.Executable, "run", run)
    rng = np.random.default_rng(3)
    w = sparse_array((23, 19), rng, 0.3).astype("float32")
    x = rng.standard_normal((19, 40)).astype("float32")
    got = sparsec.Kernel(SPMM, {"W": "csr"})(W=w, X=x, threads=1)
    np.testing.assert_allclose(got, w @ x, rtol=1e-5, atol=1e-5)
    assert seen == [0] * 5


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_misaligned_gathered_operand_is_copied_onto_a_cache_line(dtype, monkeypatch):
    """A call run whole whose X is off a 64-byte boundary (rows of whole cache lines, many
    gathers per byte) gets X copied onto one, on the first call and on the repeated one
    (which the fast path hands to the general path); an aligned X, or one gathered too
    little, is passed as it is. The calling thread copies alone while the kernel's threads
    share the split loads, so the gathers per byte copied must be `threads` times as many
    (about 20 here: copied on 1 thread, not on 2). The results are exact either way."""
    copies = []
    real = EXECUTABLE.packed_copy

    def spy(array, threads=1, scratch=None):
        copies.append(array.shape)
        copied = real(array, threads, scratch)
        assert BUFFERS.address(copied) % 64 == 0
        return copied

    monkeypatch.setattr(EXECUTABLE, "packed_copy", spy)
    rng = np.random.default_rng(11)
    w = rng.integers(-3, 4, (40, 30)) * (rng.random((40, 30)) < 0.5)
    w[7] = 0
    x = rng.integers(-3, 4, (30, 64)).astype(dtype)
    raw = np.empty(x.size + 64, dtype)
    at = (-BUFFERS.address(raw) % 64) // raw.itemsize
    aligned = raw[at : at + x.size].reshape(x.shape)
    off = raw[at + 16 // raw.itemsize : at + 16 // raw.itemsize + x.size].reshape(x.shape)
    aligned[...], tensor = x, sparsec.as_tensor(w.astype(dtype), "csr")
    k = sparsec.Kernel(SPMM, {"W": "csr"})
    assert k.columns.carriers == ("X",)
    want = w @ x
    stored = int((w != 0).sum())
    assert 2 * COSTS.REALIGN_MIN_REUSE > stored / 30 >= COSTS.REALIGN_MIN_REUSE
    for _ in range(2):
        np.testing.assert_array_equal(k(W=tensor, X=aligned, threads=1), want)
    assert copies == []
    off[...] = x
    for _ in range(2):
        np.testing.assert_array_equal(k(W=tensor, X=off, threads=1), want)
    assert copies == [(30, 64)] * 2
    for _ in range(2):
        np.testing.assert_array_equal(k(W=tensor, X=off, threads=2), want)
    assert len(copies) == 2
    monkeypatch.setattr(COSTS, "REALIGN_MIN_REUSE", 1 << 30)  # gathered too little
    np.testing.assert_array_equal(k(W=tensor, X=off, threads=1), want)
    assert len(copies) == 2


def test_gathers_a_blocks_rows_share_count_once_for_the_copy(monkeypatch):
    """bsr(4,4) SpMM holds a block's 4 rows in one register tile (`Generated.shared_rows`),
    so each gathered vector of X serves 4 output rows: the copy onto a cache line weighs
    a quarter of the gathers, and with the reuse threshold between the two counts an X
    16 bytes off a line is copied for CSR of the same entries and not for bsr (on the
    first call and the fast path's). The results are exact either way."""
    copies = []
    real = EXECUTABLE.packed_copy

    def spy(array, threads=1, scratch=None):
        copies.append(array.shape)
        return real(array, threads, scratch)

    monkeypatch.setattr(EXECUTABLE, "packed_copy", spy)
    rng = np.random.default_rng(5)
    keep = rng.random((10, 8)) < 0.6
    w = np.kron(keep, np.ones((4, 4))) * rng.integers(-3, 4, (40, 32))
    raw = np.empty(32 * 64 + 64)
    at = (-BUFFERS.address(raw) % 64) // raw.itemsize + 2  # 16 bytes off a line
    x = raw[at : at + 32 * 64].reshape(32, 64)
    x[...] = rng.integers(-3, 4, (32, 64))
    bsr = sparsec.Kernel(SPMM, {"W": "bsr(4,4)"})
    csr = sparsec.Kernel(SPMM, {"W": "csr"})
    stored = int(keep.sum()) * 16
    # gathered / copied = stored * 64 * 8 / (32 * 64 * 8): a reuse threshold between the
    # counts with and without the block's rows
    monkeypatch.setattr(COSTS, "REALIGN_MIN_REUSE", stored / 32 / 2)
    for k, fmt, copied in ((bsr, "bsr(4,4)", 0), (csr, "csr", 2)):
        tensor = sparsec.Tensor.from_dense(w, fmt)
        del copies[:]
        for _ in range(2):
            np.testing.assert_array_equal(k(W=tensor, X=x, threads=1), w @ x)
        assert len(copies) == copied, fmt
    assert "register tiles of 4 rows" in bsr.schedule


@pytest.mark.parametrize("whole", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_transposed_operand_is_packed_as_it_is(whole, dtype, small_panels, monkeypatch):
    """X passed as a transposed view (the activations tokens first, read as Xt): the binder
    keeps its strides, each panel is packed from it by the compiled band copy onto a cache
    line, and a call run whole gets it C-ordered first; the result is the C-ordered X's,
    bit for bit, in 2 and 3 dimensions. (Panels run in Python here, the compiled driver
    off: its packing is in C, `test_the_compiled_driver_runs_the_panels`.)"""
    monkeypatch.setattr(EXECUTABLE, "panels_fn", lambda: None)
    if whole:
        monkeypatch.setattr(COSTS, "PANEL_MIN_BYTES", 1 << 62)
    monkeypatch.setattr(COPIES, "STRIDED_COPY_BYTES", 0)
    packed = []
    real = COPIES._band_copy

    def spy(array, threads, out):
        packed.append(BUFFERS.address(out) % 64)
        return real(array, threads, out)

    monkeypatch.setattr(COPIES, "_band_copy", spy)
    rng = np.random.default_rng(12)
    w = (rng.integers(-3, 4, (23, 30)) * (rng.random((23, 30)) < 0.4)).astype(dtype)
    w[4] = 0
    tokens_first = rng.integers(-3, 4, (40, 30)).astype(dtype)
    view = tokens_first.T  # (30, 40): rows 1 apart, columns 30 apart
    assert not view.flags.c_contiguous
    k = sparsec.Kernel(SPMM, {"W": "csr"})
    tensor = sparsec.as_tensor(w, "csr")
    want = k(W=tensor, X=np.ascontiguousarray(view))
    np.testing.assert_array_equal(k(W=tensor, X=view), want)
    np.testing.assert_array_equal(want, w @ view)
    assert packed and set(packed) == {0}
    k3 = sparsec.Kernel("C(i,j) = W(b,i,k) * X(b,k,j)", {"W": "dds"})
    w3 = sparsec.as_tensor(np.ascontiguousarray(w.reshape(23, 5, 6).transpose(1, 0, 2)), "dds")
    view3 = view.reshape(5, 6, 40)  # a view: the leading axes nest
    assert np.shares_memory(view3, tokens_first)
    np.testing.assert_array_equal(k3(W=w3, X=view3), want)


@pytest.mark.parametrize(("threads", "workers", "inner"), [(2, 2, 1), (3, 3, 1), (8, 5, 1)])
def test_panels_are_shared_among_workers(threads, workers, inner, small_panels, monkeypatch):
    """5 panels on ``threads`` threads: min(threads, 5) workers, each running its panels'
    kernels on threads // workers threads; the result is the whole run's, bit for bit.
    (Panels run in Python here, the compiled driver off; the driver's own: below.)"""
    monkeypatch.setattr(EXECUTABLE, "panels_fn", lambda: None)
    pools, runs = [], []

    class Recording(EXECUTABLE.ThreadPoolExecutor):
        def __init__(self, n, **kw):
            pools.append(n)
            super().__init__(n, **kw)

    real_run = EXECUTABLE.Executable.run

    def run(self, prepared, threads):
        runs.append((prepared.dims["j"], threads))
        return real_run(self, prepared, threads)

    rng = np.random.default_rng(7)
    w = sparse_array((23, 19), rng, 0.3)
    x = rng.standard_normal((19, 40))
    whole = _whole(SPMM, {"W": "csr"}, {"W": w, "X": x}, threads, monkeypatch)
    monkeypatch.setattr(EXECUTABLE, "ThreadPoolExecutor", Recording)
    monkeypatch.setattr(EXECUTABLE.Executable, "run", run)
    got = sparsec.Kernel(SPMM, {"W": "csr"})(W=w, X=x, threads=threads)
    np.testing.assert_array_equal(got, whole)
    assert pools == [workers]
    assert sorted(runs)[:-1] == [(8, inner)] * 5 and runs[0] == (40, threads)


@pytest.mark.parametrize("sequence", [False, True])
@pytest.mark.parametrize("threads", [1, 2, 3, 4])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_compiled_driver_runs_the_panels(sequence, threads, dtype, small_panels, monkeypatch):
    """The panels of a call run in one C call per panel width (`copies.panels_fn`): its
    full panels, then the last narrower one; on min(threads, panels) workers of one thread
    each, or in sequence on all the call's threads, or in Python where workers would each
    need several threads. X transposed and C-ordered alike, integer values: the whole run's
    result bit for bit, and the kernel's time reported to `KERNEL_CLOCKS`."""
    monkeypatch.setattr(COSTS, "panels_in_sequence", lambda: sequence)
    calls, reported = [], []
    real = EXECUTABLE.panels_fn()

    def driver(*args):
        calls.append(
            (args[10], args[11], args[12], args[14], args[15])
        )  # first, width, count, workers, inner
        return real(*args)

    monkeypatch.setattr(EXECUTABLE, "panels_fn", lambda: driver)
    monkeypatch.setattr(EXECUTABLE, "KERNEL_CLOCKS", [reported.append])
    rng = np.random.default_rng(threads)
    w = (rng.integers(-3, 4, (23, 30)) * (rng.random((23, 30)) < 0.4)).astype(dtype)
    w[4] = 0
    tokens_first = rng.integers(-3, 4, (43, 30)).astype(dtype)
    k = sparsec.Kernel(SPMM, {"W": "csr"})
    tensor = sparsec.as_tensor(w, "csr")
    want = _whole(SPMM, {"W": "csr"}, {"W": tensor, "X": tokens_first.T.copy()}, 1, monkeypatch)
    np.testing.assert_array_equal(want, w @ tokens_first.T)
    for x in (tokens_first.T, np.ascontiguousarray(tokens_first.T)):
        calls.clear()
        np.testing.assert_array_equal(k(W=tensor, X=x, threads=threads), want)
        workers = 1 if sequence else min(threads, 6)
        inner = threads // workers
        if workers > 1 and inner > 1:
            assert calls == []  # Python's workers
            continue
        assert calls == [(0, 8, 5, workers, inner), (40, 3, 1, workers, inner)]
        assert len(reported) >= 2 and all(r > 0 for r in reported)


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_large_panels_copy_on_the_calls_threads(threads, dtype, small_panels, monkeypatch):
    """Panels in sequence on all the call's threads: a panel's pack and its output's
    placing are shared among those threads from `SC_SHARED_COPY_BYTES` (256 KB) on, so
    here both are (5,000 rows of X and of the output, 8 columns of 8 or 4 bytes: 320 and
    160 KB), with an output panel narrower than the rest (43 columns) and X C-ordered and
    transposed. Integer values: the whole run's result bit for bit, and numpy's."""
    monkeypatch.setattr(COSTS, "panels_in_sequence", lambda: True)
    monkeypatch.setattr(COSTS, "PANEL_COLUMNS", 8 if dtype == "float64" else 16)
    calls = []
    real = EXECUTABLE.panels_fn()

    def driver(*args):
        calls.append((args[7], args[11], args[14], args[15]))  # rows, width, workers, inner
        return real(*args)

    monkeypatch.setattr(EXECUTABLE, "panels_fn", lambda: driver)
    rng = np.random.default_rng(threads)
    n = 5000
    w = sp_random_integers(n, n, 0.002, rng, dtype)
    x = rng.integers(-3, 4, (43, n)).astype(dtype)
    k = sparsec.Kernel(SPMM, {"W": "csr"})
    tensor = sparsec.as_tensor(w, "csr")
    want = (w.astype(np.float64) @ x.T.astype(np.float64)).astype(dtype)
    for operand in (x.T, np.ascontiguousarray(x.T)):
        calls.clear()
        np.testing.assert_array_equal(k(W=tensor, X=operand, threads=threads), want)
        width = 8 if dtype == "float64" else 16
        assert calls and all(c == (n, c[1], 1, threads) for c in calls)
        assert calls[0][1] == width and n * width * np.dtype(dtype).itemsize >= 1 << 18


def sp_random_integers(rows, cols, density, rng, dtype):
    """A scipy CSR matrix of small integers at ``density``, its first row empty."""
    import scipy.sparse as sp

    m = sp.random(rows, cols, density, format="csr", random_state=rng, dtype=np.float64)
    m.data[:] = rng.integers(1, 4, m.nnz) * rng.choice([-1, 1], m.nnz)
    m = m.tolil()
    m[0] = 0
    return m.tocsr().astype(dtype)


def test_a_kernels_failure_in_the_driver_is_raised(small_panels, monkeypatch):
    """A status the kernel returns inside the driver is the call's error, as in Python."""
    from sparsec.base.errors import SparsecError

    real = EXECUTABLE.panels_fn()
    monkeypatch.setattr(EXECUTABLE, "panels_fn", lambda: lambda *a: 7 if real(*a) == 0 else 7)
    rng = np.random.default_rng(5)
    w = sparse_array((9, 7), rng, 0.5)
    with pytest.raises(SparsecError):
        sparsec.Kernel(SPMM, {"W": "csr"})(W=w, X=rng.standard_normal((7, 40)), threads=1)


def test_two_carriers_and_mttkrp(small_panels, monkeypatch):
    rng = np.random.default_rng(3)
    expr = "C(i,j) = W(i,k) * X(k,j) * Z(k,j)"
    w = sparse_array((20, 15), rng, 0.4)
    x, z = rng.standard_normal((15, 50)), rng.standard_normal((15, 50))
    k = sparsec.Kernel(expr, {"W": "csr"})
    assert k.columns.carriers == ("X", "Z")
    inputs = {"W": sparsec.as_tensor(w, "csr"), "X": x, "Z": z}
    np.testing.assert_array_equal(k(**inputs), _whole(expr, {"W": "csr"}, inputs, 2, monkeypatch))

    mttkrp = "A(i,j) = B(i,k,l) * D(l,j) * C(k,j)"
    b = sparse_array((9, 8, 7), rng, 0.3)
    d, c = rng.standard_normal((7, 33)), rng.standard_normal((8, 33))
    k = sparsec.Kernel(mttkrp, {"B": "csf"})
    assert k.columns.index == "j" and k.columns.carriers == ("D", "C")
    got = k(B=sparsec.as_tensor(b, "csf"), D=d, C=c)
    want = torch_reference("ikl,lj,kj->ij", {"B": b, "D": d, "C": c})
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    ("expr", "fmts"),
    [
        (SPMM, {"W": "csr", "C": "dd:1,0"}),  # the output's last level is not j
        (SPMM, {"W": "csr", "X": "dd:1,0"}),  # X is stored column-major
        ("C(i,j) = A(i,j) * B(i,j)", {"A": "csr"}),  # a sparse operand uses j
        ("C(i,j) = A(i,j) + B(i,j)", {}),  # dense operands only
        ("C(i,j) = W(i,k) * X(j,k)", {"W": "csr"}),  # j is not X's last mode
        ("C(i,j) = W(i,j) * x(j)", {"W": "csr"}),  # j in the sparse operand
        ("C(i,j) += W(i,k) * X(k,j)", {"W": "csr"}),  # accumulates into its input
    ],
)
def test_where_panels_do_not_apply(expr, fmts):
    assert sparsec.Kernel(expr, fmts).columns.index is None


def test_when_panels_pay():
    """The cost model, on the shapes and the machine it was measured on (8 MB of
    last-level cache)."""

    def pay(*args):
        return COSTS.panels_pay(*args, on=MEASURED_ON)

    def case(rows, inner, density, columns):
        x = np.empty((inner, columns), np.float32)
        return columns, ("X",), {"W": pruned_csr(rows, inner, density), "X": x}, rows * columns

    assert pay(*case(768, 3072, 0.2, 2048))  # 171 -> 79 ms
    assert pay(*case(768, 3072, 0.05, 2048))  # beyond the cache: 41 -> 29 ms
    assert pay(*case(768, 3072, 0.02, 2048))  # shared copies: 20.1 -> 16.0 ms
    assert not pay(*case(768, 3072, 0.01, 2048))  # 11.6 -> 11.9 ms
    assert pay(*case(384, 1536, 0.05, 2048))  # 7.7 -> 7.3 ms
    assert not pay(*case(384, 1536, 0.035, 2048))  # 5.8 -> 6.7 ms
    assert not pay(*case(384, 1536, 0.02, 2048))  # 3.7 -> 6.0 ms
    assert pay(*case(3072, 768, 0.2, 2048))  # 78 -> 66 ms
    assert not pay(*case(3072, 768, 0.05, 2048))  # a 25 MB output to place: 21.7 -> 22.9 ms
    assert not pay(*case(384, 1536, 0.1, 1024))  # within the cache: 4.7 -> 7.0 ms
    assert not pay(*case(768, 3072, 0.2, 512))  # too few columns
    assert not pay(*case(1536, 384, 0.1, 2048))  # X is 3 MB: small enough to leave whole


def test_the_shared_caches_threshold_is_the_hosts():
    """Within the last-level cache, where a row's gathers span more than the core's cache,
    panels need the host's calibrated bytes gathered per byte moved
    (`costs.panel_min_reuse`: 48 by default, 24 where calibration found that the shared
    cache feeds such gathers slowly); where the dense operand falls into windows that each
    fit the core's cache (``slices``: a weight in column blocks), 48 whatever the host."""
    from sparsec.policy import calibrated

    x = np.empty((768, 1024), np.float32)  # 3 MB: past 512 KB, within 8 MB
    args = (1024, ("X",), {"W": pruned_csr(3072, 768, 0.1), "X": x}, 3072 * 1024)
    # 34 bytes gathered per byte moved (X and twice the 12 MB output); the size gate at
    # 1 MB (`costs.panel_min_bytes`, as calibrated on the Intel VM), so it lets 3 MB by
    gate = {"costs.panel_min_bytes": 1 << 20}
    with calibrated.trying(gate):
        assert not COSTS.panels_pay(*args, on=MEASURED_ON)
    with calibrated.trying({**gate, "costs.panel_min_reuse": 24}):
        assert COSTS.panels_pay(*args, on=MEASURED_ON)
        assert COSTS.panels_pay(*args, on=MEASURED_ON, slices=4)  # 768 KB windows
        assert not COSTS.panels_pay(*args, on=MEASURED_ON, slices=8)  # 384 KB: they fit
    with calibrated.trying({**gate, "costs.panel_min_reuse": 48}):
        assert not COSTS.panels_pay(*args, on=MEASURED_ON)


@pytest.mark.parametrize(
    ("expr", "fmts", "sliced"),
    [
        ("Yt(o,t) = W(b,o,k) * Xt(b,k,t)", {"W": "dds"}, ("b",)),  # SparseLinear's blocks
        ("Yt(o,t) = W(b,o,k) * Xt(b,k,t)", {"W": "dss"}, ("b",)),
        ("Yt(o,t) = W(b,o,k) * Xt(b,k,t)", {"W": "sds"}, ()),  # b compressed: not a window
        ("Yt(o,t) = W(b,o,k) * Xt(b,k,t)", {"W": "dds:1,0,2"}, ()),  # o above b
        ("Yt(o,t) = W(b,o,k) * Xt(b,k,t) * Z(k,t)", {"W": "dds"}, ()),  # Z has no b
        (SPMM, {"W": "csr"}, ()),
        (SPMM, {"W": "bsr(2,2)"}, ()),
        ("A(i,j) = B(i,k,l) * D(l,j) * C(k,j)", {"B": "csf"}, ()),
    ],
)
def test_windows_of_the_dense_operands(expr, fmts, sliced):
    """`Columns.sliced`: a carrier's summed index that every sparse operand holding it
    stores in a dense level with only dense levels above."""
    k = sparsec.Kernel(expr, fmts)
    assert k.columns.index is not None
    assert k.columns.sliced == sliced


def test_a_call_in_column_blocks_keeps_its_windows_whole(monkeypatch):
    """A weight stored in column blocks (W(b,o,k) ``dds``) is gathered from one window of
    Xt at a time: where a window fits the core's cache the call runs whole under
    PANEL_MIN_REUSE (here never met), where it does not the host's threshold decides (here
    0: panels), by the general path and by the fast path alike. Integer values: the same
    result either way."""
    from sparsec.policy import calibrated
    from sparsec.policy import machine as machines

    monkeypatch.setattr(COSTS, "PANEL_MIN_COLUMNS", 16)
    monkeypatch.setattr(COSTS, "PANEL_COLUMNS", 8)
    monkeypatch.setattr(COSTS, "PANEL_MIN_REUSE", 10**9)
    calls = []
    real = EXECUTABLE.panels_fn()
    monkeypatch.setattr(EXECUTABLE, "panels_fn", lambda: lambda *a: calls.append(1) or real(*a))
    whole = []
    run_whole = EXECUTABLE.Executable.run_whole
    monkeypatch.setattr(
        EXECUTABLE.Executable, "run_whole", lambda *a: whole.append(1) or run_whole(*a)
    )
    rng = np.random.default_rng(4)
    dense = rng.integers(-3, 4, (4, 20, 6)) * (rng.random((4, 20, 6)) < 0.5)
    dense[:, 3] = 0  # an empty row in every block
    xt = rng.integers(-3, 4, (4, 6, 40)).astype(np.float64)
    w = sparsec.Tensor.from_dense(dense.astype(np.float64), "dds")
    k = sparsec.Kernel("Yt(o,t) = W(b,o,k) * Xt(b,k,t)", {"W": "dds"})
    want = np.einsum("bok,bkt->ot", dense, xt)
    window = 6 * 40 * 8  # one block's rows of Xt, of the four
    with calibrated.trying({"costs.panel_min_bytes": 0, "costs.panel_min_reuse": 0}):
        for core, panels in ((window, False), (window - 1, True)):
            with machines.use(core_cache=core, last_level_cache=1 << 30):
                calls.clear()
                whole.clear()
                for _ in range(3):  # the general path, then the fast path
                    np.testing.assert_array_equal(k(W=w, Xt=xt, threads=1), want)
                assert len(calls) == (3 if panels else 0)
                # whole: the fast path ran the calls after the first (it refuses panels)
                assert len(whole) == (0 if panels else 1)


def test_last_level_cache_is_read_or_assumed():
    from sparsec.policy.machine import host

    assert host().last_level_cache >= 256 << 10


def test_scratch_buffers_are_kept_per_thread_and_number():
    """A packed copy made in scratch (`copies.scratch_array`) reuses the calling thread's
    buffer of that number from call to call, on a cache line, grown to the largest asked
    for; another number, or another thread, has its own. The copy equals the source."""
    import threading

    a = COPIES.scratch_array(0, (5, 7), np.float32)
    b = COPIES.scratch_array(0, (3, 2), np.float64)
    c = COPIES.scratch_array(1, (5, 7), np.float32)
    assert BUFFERS.address(a) == BUFFERS.address(b) and BUFFERS.address(a) % 64 == 0
    assert not np.shares_memory(a, c) and c.shape == (5, 7) and c.dtype == np.float32
    big = COPIES.scratch_array(0, (100, 100), np.float64)  # grown
    assert big.shape == (100, 100) and BUFFERS.address(big) % 64 == 0
    other = []
    t = threading.Thread(target=lambda: other.append(COPIES.scratch_array(0, (5, 7), np.float32)))
    t.start()
    t.join()
    assert not np.shares_memory(other[0], big)
    huge = COPIES.SCRATCH_MAX_BYTES // 8 + 1  # beyond the largest kept: fresh memory
    first = COPIES.scratch_array(5, (huge,), np.float64)
    assert not np.shares_memory(first, COPIES.scratch_array(5, (huge,), np.float64))
    src = np.arange(60, dtype=np.float32).reshape(6, 10)
    for view in (src, src.T, src[:, 3:8]):
        got = COPIES.packed_copy(view, 2, 3)
        np.testing.assert_array_equal(got, view)
        assert got.flags.c_contiguous and BUFFERS.address(got) % 64 == 0
        assert BUFFERS.address(got) == BUFFERS.address(COPIES.scratch_array(3, (1,), np.uint8))
