"""The runtime's device path (``target="cuda"``) on the CPU stand-in for CuPy and a GPU
(tests/stand_in_device.py): the arguments in device form, uploads, a sparse output's
launches, the compaction on device arrays and the arrays a result keeps on the device. On
the first GPU lent, 44 `runtime_device` tests failed in this Python, never reached by the emulation
target (an output array a phase does not write went to CuPy as an object array); these
run it in CI. Each result is compared with the C target's, array by array."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_same_storage, case_id, formatted_inputs, sparse_array
from hypothesis import given, settings
from hypothesis import strategies as st
from stand_in_device import DeviceArray, StandIn
from test_cuda import MTTKRP, MTTKRP_SCHEDULES, SPMM, SPMV, SPMV_SCHEDULES
from test_fuzz import CI, random_case, run_case
from test_sparse_outputs import CASES

import sparsec
from sparsec.runtime import device as runtime_device


@pytest.fixture
def device(monkeypatch):
    """The stand-in, as `runtime_device.cupy_device` returns it."""
    stand_in = StandIn()
    monkeypatch.setattr(runtime_device, "cupy_device", lambda: stand_in)
    return stand_in


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_the_sparse_output_suite_through_the_device_path(case, device, rng):
    """Rowwise outputs (count, device prefix sum, fill) and staged ones (then compacted on
    the device): the C target's arrays; the result keeps the device arrays it was made in."""
    expr, fmts, _, shapes = case
    _, given = formatted_inputs(fmts, shapes, rng, integer=True)
    got = sparsec.kernel(expr, fmts, target="cuda")(**given)
    assert_same_storage(got, sparsec.kernel(expr, fmts, target="c")(**given))
    kept = got.device_array("vals", -1, lambda host: pytest.fail("uploaded a kept array"))
    assert isinstance(kept, DeviceArray)
    np.testing.assert_array_equal(kept.get(), got.vals)


@pytest.mark.parametrize("hashed", [False, True], ids=["dense-rows", "hash"])
def test_spgemm_workspaces_and_a_chained_call_on_the_device_path(hashed, device, rng, monkeypatch):
    """SpGEMM's per-row workspaces (dense rows, hash tables sized from the counts), then a
    product of its result read from the arrays it kept on the device: nothing uploaded but
    the new operand."""
    monkeypatch.setattr(runtime_device, "HASH_WORKSPACE", hashed)
    expr = "C(i,j) = A(i,k) * B(k,j)"
    fmts = {"A": "csr", "B": "csr", "C": "csr"}
    a = sparsec.Tensor.from_dense(sparse_array((120, 50), rng, integer=True), "csr")
    b = sparsec.Tensor.from_dense(sparse_array((50, 70), rng, integer=True), "csr")
    got = sparsec.kernel(expr, fmts, target="cuda")(A=a, B=b)
    want = sparsec.kernel(expr, fmts, target="c")(A=a, B=b)
    assert_same_storage(got, want)
    square = sparsec.Tensor.from_dense(sparse_array((70, 70), rng, integer=True), "csr")
    before = device.uploads
    again = sparsec.kernel(expr, fmts, target="cuda")(A=got, B=square)
    assert device.uploads - before == 3  # square's pos, crd and vals; none of got's
    assert_same_storage(again, sparsec.kernel(expr, fmts, target="c")(A=want, B=square))


@pytest.mark.parametrize(
    "schedule", [None, SPMV_SCHEDULES["thread-per-row"]], ids=["default", "thread-per-row"]
)
def test_dense_outputs_follow_their_inputs_on_the_device_path(schedule, device, rng):
    """A host x gives a host result; a device x a device one (no copy back); the CSR-vector
    default (shuffles) and thread-per-row agree with numpy."""
    a = sparse_array((500, 300), rng, integer=True)
    x = rng.integers(-3, 4, 300).astype(np.float64)
    k = sparsec.kernel(SPMV, {"A": "csr"}, target="cuda", schedule=schedule)
    tensor = sparsec.Tensor.from_dense(a, "csr")
    host = k(A=tensor, x=x)
    assert type(host) is np.ndarray
    np.testing.assert_array_equal(host, a @ x)
    on_device = k(A=tensor, x=device.asarray(x))
    assert isinstance(on_device, DeviceArray)
    np.testing.assert_array_equal(on_device.get(), a @ x)


def test_atomic_kernels_relaunched_on_staged_inputs(device, rng):
    """`device_launch`: MTTKRP's nonzero-parallel atomics into the staged output, zeroed
    before each launch, so that two launches give the product once."""
    shapes = {"B": (30, 20, 16), "D": (16, 8), "C": (20, 8)}
    dense, given = formatted_inputs({"B": "csf"}, shapes, rng, integer=True)
    schedule = MTTKRP_SCHEDULES["nonzero-parallel"]
    k = sparsec.kernel(MTTKRP, {"B": "csf"}, target="cuda", schedule=schedule)
    launch, out = k.device_launch(**given)
    launch()
    launch()
    want = np.einsum("ikl,lj,kj->ij", dense["B"], dense["D"], dense["C"])
    np.testing.assert_array_equal(out.get().reshape(want.shape), want)


def test_half_values_in_device_memory_come_back_in_their_type(device, rng):
    """float16 on the device in, float16 on the device out (float32 arithmetic, one
    rounding), as on the C target."""
    w = sparse_array((60, 40), rng, integer=True).astype(np.float16)
    x = rng.integers(-3, 4, (40, 24)).astype(np.float16)
    tensor = sparsec.Tensor.from_dense(w.astype(np.float32), "csr")
    k = sparsec.kernel(SPMM, {"W": "csr"}, target="cuda", dtype="float16")
    got = k(W=tensor, X=device.asarray(x))
    assert isinstance(got, DeviceArray) and got.dtype == np.float16
    want = sparsec.kernel(SPMM, {"W": "csr"}, target="c", dtype="float16")(W=tensor, X=x)
    np.testing.assert_array_equal(got.get(), want)


def test_the_stand_in_refuses_what_cupy_refuses(device):
    """The stand-in is strict where CuPy is: a host array to a device function or as a
    kernel argument fails (else it would hide the defects it is here to find)."""
    with pytest.raises(TypeError, match="host numpy array"):
        device.cumsum(np.zeros(3))
    kernel = device.RawKernel("__global__ void f(double* a) {}", "f")
    with pytest.raises(TypeError, match="not a kernel argument"):
        kernel((1,), (1,), (np.zeros(3),))


@settings(CI, max_examples=200)
@given(st.randoms(use_true_random=False))
def test_fuzz_through_the_device_path(r):
    """The fuzzer's draws (random expressions, formats, schedules, sparse outputs, empty
    extents, pickled inputs) with every kernel on ``target="cuda"``, on the stand-in."""
    case = random_case(r)
    case["target"] = "cuda"
    with pytest.MonkeyPatch.context() as patch:
        stand_in = StandIn()
        patch.setattr(runtime_device, "cupy_device", lambda: stand_in)
        run_case(case)
