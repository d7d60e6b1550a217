"""Differential testing: random expressions and formats against dense torch.

Each seed builds a random statement (1–8 operands of order 0–3 over i, j, k with
``+ - * /``, literals, unary minus, ``=`` or ``+=``), random per-tensor formats (dense,
compressed, COO chains, any mode ordering), random extents including 0 and 1, a value
dtype and an index dtype, then runs `Kernel.check` on random inputs with empty slices.
A seed either matches torch or raises `LoweringError` when no loop order fits the chosen
mode orderings (a documented, reported limitation). Seeds are fixed so every failure
reproduces: ``pytest tests/test_differential.py -k "seed-123"``.
"""

from __future__ import annotations

import random

import pytest
from generators import random_formats, random_statement

import sparsec
from sparsec.base.errors import LoweringError


def random_case(seed: int) -> tuple[str, dict[str, str], dict[str, int], int, str, str]:
    r = random.Random(seed)
    expr, tensors = random_statement(r, depth=3, stop=0.3, accumulate=0.1)
    formats = random_formats(r, tensors, coo=0.2)
    used = sorted({i for ix in tensors.values() for i in ix})
    dims = {i: r.randint(0, 5) for i in used}
    return (
        expr,
        formats,
        dims,
        r.randint(0, 10**6),
        r.choice(["float64", "float32"]),
        r.choice(["int32", "int64"]),
    )


def run_case(seed: int) -> None:
    expr, formats, dims, data_seed, dtype, index_dtype = random_case(seed)
    try:
        k = sparsec.kernel(expr, formats, dtype=dtype, index_dtype=index_dtype)
        inputs, _ = k.random_inputs(dims, seed=data_seed, density=0.4)
        k.check(**inputs)
    except LoweringError as err:
        # only the documented limitations: no loop order, or too many exact operands
        assert "no loop order" in str(err) or "Store" in str(err) or "at most" in str(err)


@pytest.mark.parametrize("seed", range(150), ids=lambda s: f"seed-{s}")
def test_random_expressions_match_torch(seed):
    run_case(seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(150, 5150), ids=lambda s: f"seed-{s}")
def test_random_expressions_match_torch_slow(seed):
    run_case(seed)
