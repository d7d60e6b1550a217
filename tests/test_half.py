"""float16 and bfloat16 values: stored in 16 bits, computed in float32, on the CUDA target
(the emulation, NVRTC, a device when one is lent) and on the C target where the compiler
has the types. Results are compared with torch, which computes half products and sums in
float32 from the half inputs and rounds the result; integer-valued data where atomics
reorder sums (every partial sum is then exact, so the results are equal)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from conftest import assert_same_storage

import sparsec
from sparsec import DTypeError, SparsecError
from sparsec.policy.machine import c_half_types, use
from sparsec.runtime import device, nvrtc
from sparsec.runtime.binding import widen
from sparsec.tensors.halves import from_storage, to_storage
from sparsec.tensors.stored import Stored, stored

HALVES = ("float16", "bfloat16")
#: the rounding of one result to the type: half its precision, relative (2^-11, 2^-8)
EPS = {"float16": 2.0**-11, "bfloat16": 2.0**-8}
SPMM = "C(i,j) = W(i,k) * X(k,j)"
SPMV = "y(i) = A(i,j) * x(j)"
SDDMM = "A(i,j) = S(i,j) * U(i,k) * V(k,j)"
ADD = "A(i,j) = B(i,j) + C(i,j)"
MTTKRP = "A(i,j) = B(i,k,l) * D(l,j) * C(k,j)"
SPGEMM = "A(i,j) = B(i,k) * C(k,j)"
NONZERO_SPMV = (
    "fuse(i,j,f), pos(f,fp,A), split(fp,b,fp1,256), split(fp1,t,n,4), "
    "parallelize(b,GPUBlock,Atomics), parallelize(t,GPUThread,Atomics)"
)

needs_nvrtc = pytest.mark.skipif(
    nvrtc.nvrtc() is None and shutil.which("nvcc") is None,
    reason="neither NVRTC (pip install nvidia-cuda-nvrtc-cu12) nor nvcc is available",
)


def _tdt(dtype):
    return getattr(torch, dtype)


def _sparse(shape, seed, dtype, density=0.3, integer=False):
    """A torch tensor of ``dtype`` with real zeros, an empty row and an empty column."""
    g = torch.Generator().manual_seed(seed)
    if integer:
        values = torch.randint(-3, 4, shape, generator=g).float()
    else:
        values = torch.randn(shape, generator=g) * 4
    values[torch.rand(shape, generator=g) > density] = 0
    values[1] = 0
    if len(shape) > 1:
        values[:, -1] = 0
    return values.to(_tdt(dtype))


def _dense(shape, seed, dtype, integer=False):
    g = torch.Generator().manual_seed(seed)
    if integer:
        return torch.randint(-3, 4, shape, generator=g).float().to(_tdt(dtype))
    return torch.randn(shape, generator=g).to(_tdt(dtype))


def _close(got, want32, dtype):
    """``got`` (a result in ``dtype``) against the float32 result ``want32``: within the
    rounding to ``dtype`` (plus float32 summation order)."""
    got32 = torch.as_tensor(got).float()
    bound = EPS[dtype] * want32.abs() + 1e-6 * (1 + want32.abs().max())
    assert got32.shape == want32.shape
    assert ((got32 - want32).abs() <= bound).all(), (got32 - want32).abs().max()


def _c_or_refused(dtype):
    """Skip-free: the C target computes ``dtype`` where the compiler has it, else refuses."""
    return dtype in c_half_types()


# ------------------------------------------------------------------ storage on the host
@pytest.mark.parametrize("dtype", HALVES)
def test_storage_round_trips_every_value_and_rounds_as_torch(dtype):
    bits = np.arange(1 << 16, dtype=np.uint16)
    stored = bits.view(np.float16) if dtype == "float16" else bits
    as_torch = torch.from_numpy(bits.view(np.int16)).view(_tdt(dtype)).float().numpy()
    values = from_storage(stored, dtype)
    finite = ~np.isnan(values)
    assert np.array_equal(np.isnan(as_torch), ~finite)  # NaN payloads may differ
    assert np.array_equal(values[finite].view(np.uint32), as_torch[finite].view(np.uint32))
    assert np.array_equal(to_storage(values[finite], dtype).view(np.uint16), bits[finite])
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(100_000) * 10.0 ** rng.uniform(-9, 6, 100_000)).astype(np.float32)
    x = np.concatenate([x, [np.inf, -np.inf, 0.0, -0.0, 65504, 65520, 65519.9, 6e-8, 3e-8]])
    x = x.astype(np.float32)
    want = torch.from_numpy(x).to(_tdt(dtype)).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(to_storage(x, dtype).view(np.uint16), want)
    assert np.isnan(from_storage(to_storage(np.float32(np.nan), dtype), dtype))


def test_float64_rounds_once_to_bfloat16():
    # just above the tie between 1 and 1 + 2^-7: float64 -> float32 would round to the tie
    x = np.array([1 + 2.0**-8 + 2.0**-30, 1 + 2.0**-8, 1 + 3 * 2.0**-8])
    assert list(from_storage(to_storage(x, "bfloat16"), "bfloat16")) == [
        1 + 2.0**-7,
        1.0,
        1 + 2.0**-6,
    ]


# ------------------------------------------------------------------ the CUDA emulation
@pytest.mark.parametrize("dtype", HALVES)
def test_conversions_in_the_kernel_round_as_the_host(dtype):
    """Every product of two halves is exact in float32, so the kernel's one rounding
    (sc_st, in integer arithmetic under the emulation) must give torch's bits; sc_ld reads
    subnormals, infinities and the largest values."""
    rng = np.random.default_rng(7)
    n = 4000
    a = (rng.standard_normal(n) * 10.0 ** rng.uniform(-4, 2, n)).astype(np.float32)
    b = (rng.standard_normal(n) * 10.0 ** rng.uniform(-4, 2, n)).astype(np.float32)
    special = [65504, -65504, 6e-8, -6e-5, 1e-7, np.inf, -np.inf, 1e-3, -2.5, 2.0**-24, 300]
    a[: len(special)] = special
    b[: len(special)] = [1, -1, 1, 1, 0.5, 1, 1, 5, 2, 0.5, 300]
    ta = torch.from_numpy(a).to(_tdt(dtype))
    tb = torch.from_numpy(b).to(_tdt(dtype))
    k = sparsec.kernel("c(i) = a(i) * b(i)", {"a": "d", "b": "d"}, target="cuda-emulated")
    got = k(a=ta, b=tb)
    assert got.dtype == _tdt(dtype)
    want = (ta.float() * tb.float()).to(_tdt(dtype))
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("fmt", ["csr", "coo"])
def test_spmm_from_torch_matches_torch(dtype, fmt):
    W, X = _sparse((70, 45), 1, dtype), _dense((45, 37), 2, dtype)
    k = sparsec.kernel(SPMM, {"W": fmt}, target="cuda-emulated")
    given = W.to_sparse_csr() if fmt == "csr" else W.to_sparse()
    got = k(W=given, X=X)
    assert isinstance(got, torch.Tensor) and got.dtype == _tdt(dtype)
    _close(got, W.float() @ X.float(), dtype)


@pytest.mark.parametrize("dtype", HALVES)
def test_spmm_of_integers_is_exact(dtype):
    W, X = _sparse((40, 30), 3, dtype, integer=True), _dense((30, 600), 4, dtype, integer=True)
    k = sparsec.kernel(SPMM, {"W": "csr"}, target="cuda-emulated")
    assert torch.equal(k(W=W.to_sparse_csr(), X=X), (W.float() @ X.float()).to(_tdt(dtype)))


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("schedule", [None, NONZERO_SPMV])
def test_spmv_with_and_without_atomics(dtype, schedule):
    A, x = _sparse((300, 200), 5, dtype, integer=True), _dense((200,), 6, dtype, integer=True)
    k = sparsec.kernel(SPMV, {"A": "csr"}, target="cuda-emulated", schedule=schedule)
    got = k(A=A.to_sparse_csr(), x=x)
    assert torch.equal(got, (A.float() @ x.float()).to(_tdt(dtype)))
    A, x = _sparse((300, 200), 7, dtype), _dense((200,), 8, dtype)
    _close(k(A=A.to_sparse_csr(), x=x), A.float() @ x.float(), dtype)


@pytest.mark.parametrize("dtype", HALVES)
def test_mttkrp_adds_atomically_into_a_float_output(dtype):
    """The default 3-tensor mapping adds into its output with atomics: a 16-bit kernel that
    adds into its output gets a float32 one (rounded after the kernel), so its sums and
    atomics are float32's."""
    B = _sparse((20, 15, 12), 9, dtype, density=0.2, integer=True)
    D, C = _dense((12, 9), 10, dtype, integer=True), _dense((15, 9), 11, dtype, integer=True)
    k = sparsec.kernel(MTTKRP, {"B": "csf"}, target="cuda-emulated")
    want = torch.einsum("ikl,lj,kj->ij", B.float(), D.float(), C.float())
    gen = k.generated(dtype)
    assert gen.wide_output and "sc_acc_t* __restrict__ A_vals" in gen.source
    assert (
        "atomicAdd(&A_vals[" in gen.source and "const sc_val_t* __restrict__ B_vals" in gen.source
    )
    assert torch.equal(k(B=B.to_sparse(), D=D, C=C), want.to(_tdt(dtype)))


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("out", ["dense", "csr"])
def test_sddmm(dtype, out):
    S, U, V = _sparse((50, 40), 12, dtype), _dense((50, 16), 13, dtype), _dense((16, 40), 14, dtype)
    k = sparsec.kernel(SDDMM, {"S": "csr", "A": out}, target="cuda-emulated")
    got = k(S=S.to_sparse_csr(), U=U, V=V)
    want = S.float() * (U.float() @ V.float())
    if out == "csr":
        assert isinstance(got, sparsec.Tensor) and got.vals.dtype == np.float32
        got = torch.from_numpy(got.to_dense())
        assert torch.equal(got, got.to(_tdt(dtype)).float())  # values of the type
    _close(got, want, dtype)


@pytest.mark.parametrize("dtype", HALVES)
def test_sparse_add_into_csr_is_the_c_targets(dtype):
    B, C = _sparse((60, 50), 15, dtype), _sparse((60, 50), 16, dtype)
    k = sparsec.kernel(ADD, {"A": "csr", "B": "csr", "C": "csr"}, target="cuda-emulated")
    got = k(B=B.to_sparse_csr(), C=C.to_sparse_csr())
    want = (B.float() + C.float()).to(_tdt(dtype)).float()
    assert torch.equal(torch.from_numpy(got.to_dense()), want)
    if _c_or_refused(dtype):
        on_c = sparsec.kernel(ADD, {"A": "csr", "B": "csr", "C": "csr"})
        # one thread appends in order; three append in chunks of rows moved into place
        for threads in (1, 3):
            mine = on_c(B=B.to_sparse_csr(), C=C.to_sparse_csr(), threads=threads)
            assert_same_storage(mine, got)


@pytest.mark.parametrize("dtype", HALVES)
def test_sparse_add_with_rows_carried_appends_serially_in_16_bits(dtype):
    """A dcsr operand carries its row cursor from row to row, so the chunked single pass
    falls back to the serial one: in 16 bits that one is built without the vector passes
    too. Three threads count and fill in two phases; all equal the float32 sum, rounded."""
    B, C = _sparse((40, 30), 17, dtype), _sparse((40, 30), 18, dtype)
    fmts = {"A": "csr", "B": "csr", "C": "dcsr"}
    want = (B.float() + C.float()).to(_tdt(dtype)).float()
    if not _c_or_refused(dtype):
        with pytest.raises(sparsec.DTypeError):
            sparsec.kernel(ADD, fmts)(B=B.to_sparse_csr(), C=C.to_sparse_csr())
        return
    k = sparsec.kernel(ADD, fmts)
    generated = k.generated(dtype)
    assert generated.append == "sparsec_append" and not generated.chunked
    for threads in (1, 3):
        got = k(B=B.to_sparse_csr(), C=C, threads=threads)  # C converted to dcsr
        assert torch.equal(torch.from_numpy(got.to_dense()).float(), want)


@pytest.mark.parametrize("hashed", [False, True], ids=["dense-rows", "hash-tables"])
@pytest.mark.parametrize("dtype", HALVES)
def test_spgemm_sums_rows_in_a_float_workspace(dtype, hashed, monkeypatch):
    """SpGEMM's per-thread dense rows (`sc_ws_vals`) and its hash tables' values
    (`sc_ws_hvals`, `device.HASH_WORKSPACE`) are float: each output entry is one float32 sum,
    rounded once (equal to torch's on integer data)."""
    from sparsec.runtime import device

    monkeypatch.setattr(device, "HASH_WORKSPACE", hashed)
    B, C = _sparse((30, 25), 41, dtype, integer=True), _sparse((25, 20), 42, dtype, integer=True)
    fmts = {"A": "csr", "B": "csr", "C": "csr"}
    k = sparsec.kernel(SPGEMM, fmts, target="cuda-emulated")
    src = k.generated(dtype).source
    assert (
        "sc_acc_t* __restrict__ sc_ws_vals" in src and "sc_acc_t* __restrict__ sc_ws_hvals" in src
    )
    got = k(B=B.to_sparse_csr(), C=C.to_sparse_csr())
    want = (B.float() @ C.float()).to(_tdt(dtype)).float()
    assert torch.equal(torch.from_numpy(got.to_dense()), want)
    if _c_or_refused(dtype):
        on_c = sparsec.kernel(SPGEMM, fmts)(B=B.to_sparse_csr(), C=C.to_sparse_csr())
        np.testing.assert_array_equal(on_c.to_dense(), got.to_dense())


# ------------------------------------------------------------------ inputs and dtypes
def test_numpy_float16_in_float16_out():
    rng = np.random.default_rng(3)
    W = rng.integers(-3, 4, (30, 20)).astype(np.float16)
    W[rng.random(W.shape) > 0.3] = 0
    X = rng.integers(-3, 4, (20, 8)).astype(np.float16)
    k = sparsec.kernel(SPMM, {"W": "csr"}, target="cuda-emulated")
    got = k(W=sparsec.Tensor.from_dense(W.astype(np.float32), "csr"), X=X)
    # a float32 Tensor and a float16 array: float32, as torch promotes
    assert got.dtype == np.float32
    got = k(W=W, X=X)
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, (W.astype(np.float32) @ X.astype(np.float32)))


@pytest.mark.parametrize(
    ("a", "b", "want"),
    [
        ("float16", "float16", torch.float16),
        ("bfloat16", "bfloat16", torch.bfloat16),
        ("float16", "bfloat16", torch.float32),
        ("float16", "float32", torch.float32),
        ("bfloat16", "float64", torch.float64),
    ],
)
def test_promotion_follows_torch(a, b, want):
    W, X = _sparse((12, 10), 17, a), _dense((10, 5), 18, b)
    k = sparsec.kernel(SPMM, {"W": "csr"}, target="cuda-emulated")
    got = k(W=W.to_sparse_csr(), X=X)
    assert got.dtype == want == torch.promote_types(W.dtype, X.dtype)
    _close(got, W.float() @ X.float(), "bfloat16" if want != torch.float64 else "float16")


def test_a_kernel_built_for_bfloat16_rounds_float_inputs():
    X = np.array([[1 + 2.0**-8 + 2.0**-20], [3.0]], dtype=np.float32)
    W = np.array([[1.0, 0.0], [0.0, 2.0]], dtype=np.float32)
    k = sparsec.kernel(SPMM, {"W": "csr"}, target="cuda-emulated", dtype="bfloat16")
    got = k(W=W, X=X)  # no torch input: bfloat16 values come back as float32
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, [[1 + 2.0**-7], [6.0]])


def test_half_kernels_source():
    k = sparsec.kernel(SPMM, {"W": "csr"}, target="cuda-emulated", dtype="bfloat16")
    src = k.source
    assert "typedef unsigned short sc_val_t;" in src and "typedef float sc_acc_t;" in src
    assert "sc_ld(W_vals[" in src and "= sc_st(" in src
    assert "values bfloat16 stored as unsigned short, computed in float" in src
    assert not k.generated("bfloat16").wide_output  # rows of C are stored once, in 16 bits
    assert "sc_val_t* __restrict__ C_vals" in src
    for dtype in ("float32", "float64"):
        assert "sc_ld" not in k.generated(dtype).source


# ------------------------------------------------------------------ NVRTC
@needs_nvrtc
@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize(
    ("expr", "formats", "schedule"),
    [
        (SPMM, {"W": "csr"}, None),
        (SPMV, {"A": "csr"}, None),
        (SPMV, {"A": "csr"}, NONZERO_SPMV),
        (SDDMM, {"S": "csr", "A": "csr"}, None),
        (ADD, {"A": "csr", "B": "csr", "C": "csr"}, None),
        (MTTKRP, {"B": "csf"}, None),
        (SPGEMM, {"A": "csr", "B": "csr", "C": "csr"}, None),
    ],
    ids=["spmm", "spmv", "spmv-atomics", "sddmm-csr", "add-csr", "mttkrp", "spgemm"],
)
def test_nvrtc_compiles_without_spills(dtype, expr, formats, schedule):
    k = sparsec.kernel(expr, formats, target="cuda", schedule=schedule, dtype=dtype)
    reports = k.verify()
    assert [r.arch for r in reports] == list(nvrtc.ARCHS)
    assert all(r.spills == 0 and r.registers > 0 for r in reports), [str(r) for r in reports]


# ------------------------------------------------------------------ the C target
@pytest.mark.parametrize("dtype", HALVES)
def test_c_target_where_the_compiler_has_the_type(dtype):
    W, X = _sparse((64, 48), 19, dtype), _dense((48, 33), 20, dtype)
    A, x = _sparse((90, 70), 21, dtype, integer=True), _dense((70,), 22, dtype, integer=True)
    spmm = sparsec.kernel(SPMM, {"W": "csr"})
    spmv = sparsec.kernel(SPMV, {"A": "coo"})
    if not _c_or_refused(dtype):
        with pytest.raises(DTypeError, match="float32"):
            spmm(W=W.to_sparse_csr(), X=X)
        return
    got = spmm(W=W.to_sparse_csr(), X=X)
    assert got.dtype == _tdt(dtype)
    _close(got, W.float() @ X.float(), dtype)
    assert torch.equal(spmv(A=A.to_sparse(), x=x), (A.float() @ x.float()).to(_tdt(dtype)))
    assert "typedef float sc_acc_t;" in spmm.generated(dtype).source


def test_c_target_refuses_types_the_compiler_lacks():
    W, X = _sparse((8, 6), 23, "float16"), _dense((6, 3), 24, "float16")
    k = sparsec.kernel(SPMM, {"W": "csr"}, target="c")
    with use(half=frozenset()), pytest.raises(DTypeError, match="cast the inputs to float32"):
        k(W=W.to_sparse_csr(), X=X)
    # the emulation needs no compiler support
    assert k.target == "c"
    _close(
        sparsec.kernel(SPMM, {"W": "csr"}, target="cuda-emulated")(W=W.to_sparse_csr(), X=X),
        W.float() @ X.float(),
        "float16",
    )


# ------------------------------------------------------------------ a device
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", HALVES)
def test_half_spmm_on_the_device(dtype):
    try:
        device.cupy_device()
    except SparsecError as err:
        pytest.skip(str(err))
    W, X = _sparse((300, 256), 25, dtype), _dense((256, 700), 26, dtype)
    k = sparsec.kernel(SPMM, {"W": "csr"}, target="cuda")
    got = k(W=W.to_sparse_csr(), X=X.cuda())
    assert got.is_cuda and got.dtype == _tdt(dtype)
    _close(got.cpu(), W.float() @ X.float(), dtype)
    Wi, Xi = _sparse((300, 256), 27, dtype, integer=True), _dense((256, 70), 28, dtype, True)
    got = k(W=Wi.to_sparse_csr(), X=Xi)
    assert torch.equal(got, (Wi.float() @ Xi.float()).to(_tdt(dtype)))


def test_half_inputs_promote_on_the_c_target_with_float64():
    """float16 operands were refused before issue 22; with a float64 operand the call is
    float64, as torch promotes."""
    A = np.array([[1.0, 0.0, 2.0], [0.0, 0.0, 0.0], [3.0, 0.5, 0.0]])
    k = sparsec.kernel(SPMV, {"A": "csr"})
    for x in (np.array([1, -2, 0.25], np.float16), torch.tensor([1, -2, 0.25]).half()):
        got = k(A=A, x=x)
        assert got.dtype in (np.float64, torch.float64)
        np.testing.assert_array_equal(np.asarray(got), A @ np.array([1, -2, 0.25]))
    got = k(A=np.eye(3, dtype=np.float16), x=np.ones(3))
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, np.ones(3))


@pytest.mark.parametrize("dtype", HALVES)
def test_folded_factors_combine_in_float(dtype):
    """A(i,j)*p(j)/g(j) folds p/g into one input at call time: 16-bit factors are combined
    in float32 and stored once (bfloat16 bits are no numbers to multiply)."""
    A = _sparse((9, 7), 29, dtype)
    p, g = _dense((7,), 30, dtype), _dense((7,), 31, dtype).abs() + 0.5
    k = sparsec.kernel("y(i) = A(i,j) * p(j) / g(j)", {"A": "csr"}, target="cuda-emulated")
    got = k(A=A.to_sparse_csr(), p=p, g=g)
    folded = (p.float() / g.float()).to(_tdt(dtype)).float()
    assert "p_fold" in k.schedule
    _close(got, A.float() @ folded, dtype)


@pytest.mark.parametrize("dtype", HALVES)
def test_check_compares_16_bit_results(dtype):
    k = sparsec.kernel(SDDMM, {"S": "csr"}, target="cuda-emulated")
    S, U, V = _sparse((30, 20), 32, dtype), _dense((30, 8), 33, dtype), _dense((8, 20), 34, dtype)
    result = k.check(S=S.to_sparse_csr(), U=U, V=V)
    assert result.dtype == dtype and result.max_abs_error > 0
    scalar = sparsec.kernel("y(i) = a * A(i,j) * x(j)", {"A": "csr"}, target="cuda-emulated")
    A, x = _sparse((12, 9), 35, dtype), _dense((9,), 36, dtype)
    got = scalar(a=1.5, A=A.to_sparse_csr(), x=x)
    _close(got, 1.5 * (A.float() @ x.float()), dtype)
    assert scalar.check(a=1.5, A=A.to_sparse_csr(), x=x).dtype == dtype


@pytest.mark.parametrize("dtype", HALVES)
def test_operands_widened_to_int64_keep_their_16_bit_values(dtype):
    """An int64 operand widens the others' indices (in `convert_input`, and in `prepare`
    when a large input forced int64): they stay 16-bit valued."""
    B, C = _sparse((20, 15), 37, dtype), _sparse((20, 15), 38, dtype)
    k = sparsec.kernel(
        "A(i,j) = B(i,j) * C(i,j) * 2",
        {"B": "csr", "C": "csr"},
        target="cuda-emulated",
        dtype=dtype,
    )
    wide = sparsec.Tensor.from_torch(B.float().to_sparse_csr()).astype(index_dtype="int64")
    got = k(
        B=wide,
        C=C.to_sparse_csr(),
    )
    assert torch.equal(got, (B.float() * C.float() * 2).to(_tdt(dtype)))
    narrow = stored(sparsec.Tensor.from_torch(C.float().to_sparse_csr()), dtype)
    widened = widen(narrow)
    assert widened.index_dtype == np.int64 and isinstance(widened, Stored)
    np.testing.assert_array_equal(widened.stored, narrow.stored)


@pytest.mark.parametrize("dtype", HALVES)
def test_a_repeated_index_reads_the_diagonal_in_16_bits(dtype):
    """A(i,i) is a copy of A's diagonal made at call time: a 16-bit kernel's is stored too."""
    A, x = _sparse((9, 9), 39, dtype, density=0.6), _dense((9,), 40, dtype)
    A[2, 2] = 3.0
    k = sparsec.kernel("y(i) = A(i,i) * x(i)", {"A": "csr"}, target="cuda-emulated")
    got = k(A=A.to_sparse_csr(), x=x)
    assert torch.equal(got, (A.float().diagonal() * x.float()).to(_tdt(dtype)))


def test_torch_integer_operands_do_not_widen_the_call():
    """As before 16-bit values: a torch integer tensor takes no part in the promotion."""
    A = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    got = sparsec.kernel(SPMV, {"A": "csr"})(A=A, x=torch.tensor([3, 4]))
    assert got.dtype == torch.float32 and got.tolist() == [3.0, 8.0]


@pytest.mark.gpu
def test_cupy_float16_in_cupy_float16_out():
    try:
        cp = device.cupy_device()
    except SparsecError as err:
        pytest.skip(str(err))
    W, X = _sparse((200, 96), 43, "float16", integer=True), _dense((96, 300), 44, "float16", True)
    # W as a sparsec Tensor: a torch operand would make the result a CUDA torch tensor
    k = sparsec.kernel(SPMM, {"W": "csr"}, target="cuda", dtype="float16")
    got = k(W=sparsec.Tensor.from_torch(W.float().to_sparse_csr()), X=cp.asarray(X.numpy()))
    assert isinstance(got, cp.ndarray) and got.dtype == np.float16
    want = (W.float() @ X.float()).half().numpy()
    np.testing.assert_array_equal(cp.asnumpy(got), want)


@pytest.mark.parametrize("dtype", HALVES)
def test_compacted_outputs_and_lane_groups_in_16_bits(dtype):
    """16-bit values through the GPU's other mappings: sparse add into DCSR and COO (rows,
    then a compaction) and SpMV rows long enough for a group of lanes per row (CSR-vector,
    the group's float sum rounded once), against torch on integer data."""
    tdt = _tdt(dtype)
    gen = torch.Generator().manual_seed(7)
    B = torch.randint(-3, 4, (50, 40), generator=gen) * (torch.rand(50, 40, generator=gen) < 0.2)
    C = torch.randint(-3, 4, (50, 40), generator=gen) * (torch.rand(50, 40, generator=gen) < 0.2)
    B[:10], C[:5] = 0, 0  # empty rows in one operand, in both
    B, C = B.to(tdt), C.to(tdt)
    for fmt in ("dcsr", "coo"):
        fmts = {"B": "csr", "C": "csr", "A": fmt}
        k = sparsec.kernel("A(i,j) = B(i,j) + C(i,j)", fmts, target="cuda-emulated")
        got = k(B=B.to_sparse_csr(), C=C.to_sparse_csr())
        assert str(got.format) == fmt
        want = (B.float() + C.float()).to(tdt).float()
        assert torch.equal(torch.from_numpy(got.to_dense()), want)
    A = torch.randint(-3, 4, (64, 300), generator=gen) * (torch.rand(64, 300, generator=gen) < 0.5)
    A[3] = 0
    A, x = A.to(tdt), torch.randint(-2, 3, (300,), generator=gen).to(tdt)
    k = sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": "csr"}, target="cuda-emulated")
    got = k(A=A.to_sparse_csr(), x=x)
    assert "group of lanes" in k.schedule
    assert torch.equal(torch.as_tensor(got), (A.float() @ x.float()).to(tdt))


@pytest.mark.parametrize("library", ["numpy", "torch"])
@pytest.mark.parametrize("int_dtype", ["int32", "int64", "bool"])
def test_integer_operands_follow_one_rule_in_numpy_and_torch(library, int_dtype):
    """Issue 36 item 20: numpy's int32 made a float32 kernel float64 while torch's kept
    float32; one rule now (torch's, docs/semantics.md Value types): integer and bool
    arrays take no part beside floating ones, whichever library holds them; alone they
    compute in their own promoted type (issue 40), as numpy and torch do."""
    A = np.array([[1.0, 0.0], [0.0, 2.0]], dtype=np.float32)
    x = np.array([3, 1], dtype=int_dtype)
    if library == "torch":
        A, x = torch.from_numpy(A), torch.from_numpy(x)
    k = sparsec.kernel(SPMV, {"A": "csr"})
    got = k(A=A, x=x)
    assert str(got.dtype).removeprefix("torch.") == "float32"
    assert got.tolist() == ([3.0, 2.0] if int_dtype != "bool" else [1.0, 2.0])
    alone = k(A=A.to(torch.int64) if library == "torch" else A.astype(np.int64), x=x)
    assert str(alone.dtype).removeprefix("torch.") == "int64"
    assert alone.tolist() == ([3, 2] if int_dtype != "bool" else [1, 2])
    T = sparsec.Tensor.from_dense(np.asarray(A), "csr")
    assert (T @ x).dtype == k(A=T, x=x).dtype  # the operators take the same rule
    assert str((T @ x).dtype).removeprefix("torch.") == "float32"
    assert (np.float64(2) * T).dtype == np.float32  # a number never widens


# ------------------------------------------------------------------ 16-bit Tensors (issue 36)
@pytest.mark.parametrize("dtype", HALVES)
def test_16_bit_tensors_reach_kernels_and_come_back_16_bit(dtype):
    """Issue 36 item 19: Tensor.from_torch of a half CSR tensor and T.astype(16-bit) were
    refused, and T @ x_f16 came back float32. A 16-bit Tensor now promotes as its type,
    keeps it through the operators (T + T, T.T, 2 * T are 16-bit), pickles as itself, and
    reaches a float32 kernel as its exact float32 values (never its 16-bit bits)."""
    import pickle

    tdt = _tdt(dtype)
    A = torch.tensor([[1.0, 0.0, 2.5], [0.0, 0.0, 0.0], [-3.0, 0.5, 0.0]])
    T = sparsec.Tensor.from_torch(A.to(tdt).to_sparse_csr())
    assert isinstance(T, Stored) and T.value_dtype == dtype and T.nnz == 4
    assert T.to_torch().dtype == tdt
    U = sparsec.Tensor.from_dense(A.numpy(), "csr").astype(dtype if dtype == "float16" else tdt)
    assert U.value_dtype == dtype and np.array_equal(U.to_dense(), T.to_dense())
    back = pickle.loads(pickle.dumps(T))
    assert back.value_dtype == dtype and np.array_equal(back.to_dense(), T.to_dense())
    assert T.astype(np.float32).dtype == np.float32 and not isinstance(T.astype("float32"), Stored)
    assert isinstance(T.T, Stored) and T.T.value_dtype == dtype
    x32 = torch.tensor([1.0, 2.0, 4.0])
    got = T @ x32  # float32 promotes over 16-bit: a float32 kernel reads T's exact values
    assert got.dtype == torch.float32 and got.tolist() == (A @ x32).tolist()
    if not _c_or_refused(dtype):
        with pytest.raises(DTypeError, match="cast the inputs to float32"):
            T @ x32.to(tdt)
        return
    for _ in range(2):  # the first call and the fast path
        got = T @ x32.to(tdt)
        assert got.dtype == tdt and got.float().tolist() == (A @ x32).tolist()
    for result in (T + T, 2 * T, -T):
        assert isinstance(result, Stored) and result.value_dtype == dtype, result


def test_sparse_linear_runs_in_float16():
    """Issue 36 item 19: SparseLinear.from_linear(linear.half()) was refused; it computes in
    float16 (float32 sums), forward and backward, and sparsify swaps half layers."""
    if not _c_or_refused("float16"):
        pytest.skip("this C compiler has no float16 type (the kernel refuses it clearly)")
    import sparsec.nn

    torch.manual_seed(0)
    lin = torch.nn.Linear(6, 4).half()
    with torch.no_grad():
        lin.weight.copy_(torch.randint(-3, 4, (4, 6)).half())
        lin.bias.copy_(torch.randint(-3, 4, (4,)).half())
    layer = sparsec.nn.SparseLinear.from_linear(lin, 0.5)
    assert layer.values.dtype == torch.float16
    x = torch.randint(-3, 4, (3, 6)).half().requires_grad_(True)
    y = layer(x)
    mask = layer.to_dense() != 0
    want = torch.nn.functional.linear(x.float(), lin.weight.float() * mask, lin.bias.float())
    assert y.dtype == torch.float16 and torch.equal(y.float(), want.detach())
    y.sum().backward()
    assert layer.values.grad.dtype == torch.float16 and x.grad.dtype == torch.float16
    model = torch.nn.Sequential(torch.nn.Linear(6, 6)).half()
    sparsec.nn.sparsify(model, 0.5)
    assert isinstance(model[0], sparsec.nn.SparseLinear)
