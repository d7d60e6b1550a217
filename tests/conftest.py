"""Shared fixtures: a private kernel cache per test session and sparse-friendly random data."""

from __future__ import annotations

import functools
import os
import tempfile

import numpy as np
import pytest

from sparsec import Tensor
from sparsec.policy.machine import Machine, use

_CACHE = tempfile.mkdtemp(prefix="sparsec-test-cache-")
os.environ.setdefault("SPARSEC_CACHE_DIR", _CACHE)
# tests never depend on the host: no calibration is read or started (the calibration tests
# turn it on under their own cache directory)
os.environ["SPARSEC_TUNE"] = "0"
# every fresh output starts as NaN, so an element a kernel forgets to write fails a test
os.environ["SPARSEC_POISON"] = os.environ.get("SPARSEC_POISON", "1")


def sparse_array(
    shape: tuple[int, ...],
    rng: np.random.Generator,
    density: float = 0.35,
    *,
    integer: bool = False,
) -> np.ndarray:
    """A dense array with real zeros: ~``density`` nonzeros, an empty first-mode slice and,
    for order ≥ 2, an empty slice along the second mode (so empty rows/columns occur)."""
    if integer:
        values = rng.integers(1, 5, size=shape) * rng.choice([-1, 1], size=shape)
    else:
        values = rng.uniform(-1.0, 1.0, size=shape)
    arr = np.where(rng.random(shape) < density, values, 0.0).astype(np.float64)
    if len(shape) >= 1 and shape[0] > 2:
        arr[rng.integers(shape[0])] = 0.0
    if len(shape) >= 2 and shape[1] > 2:
        arr[:, rng.integers(shape[1])] = 0.0
    return arr


#: the machine the cost models' constants were measured on (sparsec/kernel.py): a 2-core
#: Zen 1 VM with 512 KB of L2 per core, 8 MB of L3 and AVX2. A test of a decision derived
#: from the machine passes this one (or another) explicitly, so it holds on any host.
MEASURED_ON = Machine(
    core_cache=512 << 10,
    last_level_cache=8 << 20,
    cores=2,
    vector_bytes=32,
    flags=frozenset({"sse2", "avx", "avx2", "fma"}),
    target="znver1",
    busy=0.0,
)
_AVX512 = frozenset({"sse2", "avx", "avx2", "fma", "avx512f"})
#: machines unlike it (issue 18): each L2 with each L3 and each vector width (AVX2, AVX-512)
SIMULATED = tuple(
    Machine(
        core_cache=l2,
        last_level_cache=l3,
        cores=cores,
        vector_bytes=vector,
        flags=_AVX512 if vector == 64 else MEASURED_ON.flags,
        target="x86-64-v4" if vector == 64 else "x86-64-v3",
        busy=0.0,
    )
    for l2 in (256 << 10, 512 << 10, 1 << 20, 2 << 20)
    for l3, cores in ((8 << 20, 4), (32 << 20, 16))
    for vector in (32, 64)
)


def formatted_inputs(fmts, shapes, rng, dtype="float64", index_dtype="int32", integer=False):
    """(dense arrays, the inputs to pass): ``sparse_array`` of each shape in ``dtype``,
    stored in its format of ``fmts`` (dense where it has none); a shape ``()`` is the
    scalar 1.5."""
    dense, given = {}, {}
    for name, shape in shapes.items():
        if not shape:
            dense[name] = given[name] = 1.5
            continue
        arr = sparse_array(shape, rng, integer=integer).astype(dtype)
        dense[name] = arr
        fmt = fmts.get(name, "dense")
        given[name] = (
            arr if fmt == "dense" else Tensor.from_dense(arr, fmt, index_dtype=index_dtype)
        )
    return dense, given


@functools.cache
def pruned_csr(rows: int, inner: int, density: float, dtype: type = np.float32) -> Tensor:
    """A seeded random ``rows`` x ``inner`` CSR weight (scipy's ``sparse.random``, exactly
    ``density`` of its entries stored), made once per process: the cost models' tests
    weigh the same shapes on several machines."""
    import scipy.sparse as sp

    w = sp.random(rows, inner, density, format="csr", random_state=0, dtype=dtype)
    return Tensor.from_scipy(w, "csr")


def machine_id(m: Machine) -> str:
    """A test id: ``l2=1M,l3=32M,cores=16,vector=64`` (SPARSEC_MACHINE's syntax)."""

    def size(n: int) -> str:
        return f"{n >> 20}M" if n >= 1 << 20 else f"{n >> 10}K"

    return (
        f"l2={size(m.core_cache)},l3={size(m.last_level_cache)},"
        f"cores={m.cores},vector={m.vector_bytes}"
    )


@pytest.fixture(params=SIMULATED, ids=machine_id)
def simulated_machine(request: pytest.FixtureRequest):
    """The test runs with each of `SIMULATED` as the machine (`sparsec.policy.machine.use`)."""
    with use(request.param) as chosen:
        yield chosen


@pytest.fixture(autouse=True, scope="session")
def _steady_load():
    """Default calls use every core whatever else runs on the machine, so the suite takes
    the same (parallel) paths on a busy machine as on a quiet one; the adaptation to the
    load has its own tests (tests/test_machine.py)."""
    with use(busy=0.0):
        yield


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20261122)


def torch_reference(
    ref: str, dense: dict[str, np.ndarray], operands: list[str] | None = None
) -> np.ndarray:
    """The expected result: an einsum spec over ``operands`` (default: the non-scalar dense
    inputs in order), or a Python expression over the named torch tensors."""
    import torch

    tensors = {n: torch.from_numpy(np.asarray(v, dtype=np.float64)) for n, v in dense.items()}
    if "->" in ref:
        names = operands or [n for n in dense if np.ndim(dense[n]) > 0]
        return torch.einsum(ref, *(tensors[n] for n in names)).numpy()
    return eval(ref, {}, tensors).numpy()  # noqa: S307 - fixed strings from the test tables


def case_id(case: tuple) -> str:
    """A readable test id: the expression without spaces and its formats."""
    expr, fmts = case[0], case[1]
    return f"{expr.replace(' ', '')}[{','.join(f'{n}:{f}' for n, f in fmts.items())}]"


def assert_same_storage(got: Tensor, want: Tensor) -> None:
    """Two sparse tensors hold the same arrays: format, shape, dtypes, every level's pos and
    crd, and the values (canonical outputs compared array by array)."""
    assert got.format == want.format and got.shape == want.shape
    assert got.index_dtype == want.index_dtype and got.vals.dtype == want.vals.dtype
    for k, (x, y) in enumerate(zip(got.levels, want.levels, strict=True)):
        for name, u, v in (("pos", x.pos, y.pos), ("crd", x.crd, y.crd)):
            assert (u is None) == (v is None), (k, name)
            if u is not None:
                assert u.dtype == v.dtype, (k, name)
                np.testing.assert_array_equal(u, v, err_msg=f"level {k} {name}")
    np.testing.assert_array_equal(got.vals, want.vals)
