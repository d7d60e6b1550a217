"""Shared fixtures: a private kernel cache per test session and sparse-friendly random data."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest

_CACHE = tempfile.mkdtemp(prefix="sparsec-test-cache-")
os.environ.setdefault("SPARSEC_CACHE_DIR", _CACHE)
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
