"""Differential fuzzing of the mapped formats (bsr(R,C), nm(N,M)) against an independent
reference: random statements (`generators.random_statement`) whose matrices are stored
blocked or N:M where the rules allow it (docs/semantics.md, Dimensions apart from
levels), random blocks and extents (0 blocks included), empty and explicit-zero blocks,
groups with fewer entries than their width, the C target and the CUDA emulation, both
value and index dtypes, dense, sparse and bsr outputs.

The reference is `sparsec.api.reference` evaluating the user's statement, as written, on
the dense inputs, with each tensor's stored pattern computed here from the documented
model, not read from sparsec: a bsr tensor stores every cell of each block it stores; an
N:M tensor stores its entries, and a group with fewer than N also stores a zero at the
group's first coordinate (the padding). The only refusal allowed is the documented
"no loop order" for a plain sparse operand's random mode ordering, and on the CUDA
emulation the default's "no GPU mapping" for a nest it cannot map (as in tests/test_fuzz.py).

CI draws 200 cases from fixed seeds; the ``slow`` marker draws 3,000
(``pytest -n 2 -m slow tests/test_fuzz_formats.py``).
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from generators import random_statement

import sparsec
from sparsec.api.reference import compare, reference
from sparsec.base.errors import LoweringError, ScheduleError
from sparsec.frontend.parser import parse_expression


def mapped_case(r: random.Random) -> dict:
    """A statement with at least one mapped matrix, formats that the rules accept, extents
    that divide, and the inputs' construction recipe."""
    while True:
        expr, tensors = random_statement(r, depth=2, stop=0.35, divide=0.1, max_free=2)
        blocks: dict[str, int] = {}
        whole: set[str] = set()  # indices a mapped tensor stores undivided
        formats: dict[str, str] = {}
        for name, ix in tensors.items():
            if len(ix) != 2 or r.random() < 0.25:
                continue
            a, b = ix
            if r.random() < 0.6 and not {a, b} & whole:
                rb, cb = blocks.get(a) or r.choice([1, 2, 3]), blocks.get(b) or r.choice([1, 2, 3])
                blocks[a], blocks[b] = rb, cb
                formats[name] = f"bsr({rb},{cb})"
            elif a not in blocks and b not in whole:
                m = blocks.get(b) or r.choice([2, 3, 4])
                blocks[b] = m
                whole.add(a)
                formats[name] = f"nm({r.randint(1, m)},{m})"
        if formats:
            break
    for name, ix in tensors.items():  # plain tensors: sparse where no index is split
        if ix and name not in formats and not set(ix) & set(blocks) and r.random() < 0.5:
            ordering = list(range(len(ix)))
            r.shuffle(ordering)
            letters = "".join(r.choice("ds") for _ in ix)
            formats[name] = f"{letters}:{','.join(map(str, ordering))}"
    free = expr[2 : expr.index(")")].split(",") if expr.startswith("O(") else []
    if len(free) == 2 and all(i in blocks for i in free) and r.random() < 0.4:
        formats["O"] = f"bsr({blocks[free[0]]},{blocks[free[1]]})"
    used = sorted({i for ix in tensors.values() for i in ix})
    dims = {
        i: blocks[i] * r.choice([0, 1, 2, 3]) if i in blocks else r.choice([0, 1, 2, 3, 5])
        for i in used
    }
    return {
        "expr": expr,
        "tensors": tensors,
        "formats": formats,
        "dims": dims,
        "density": r.choice([0.0, 0.3, 0.7, 1.0]),
        "dtype": r.choice(["float64", "float32"]),
        "index_dtype": r.choice(["int32", "int64"]),
        "target": "cuda-emulated" if r.random() < 0.25 else "c",
        "seed": r.randint(0, 10**6),
    }


def _blocked(shape, rb, cb, density, rng):
    """Integer values (zeros among them) in randomly stored blocks, an all-zero one at
    times: (dense, stored pattern, coords, values)."""
    dense = np.zeros(shape)
    stored = np.zeros(shape, dtype=bool)
    coords, vals = [], []
    for bi in range(shape[0] // rb):
        for bj in range(shape[1] // cb):
            if rng.random() >= density:
                continue
            block = rng.integers(-2, 3, (rb, cb)).astype(float)
            if rng.random() < 0.1:
                block[:] = 0.0
            rows, cols = np.meshgrid(np.arange(rb) + bi * rb, np.arange(cb) + bj * cb)
            dense[rows.T, cols.T] = block
            stored[rows.T, cols.T] = True
            coords.append(np.stack([rows.T.ravel(), cols.T.ravel()]))
            vals.append(block.ravel())
    return dense, stored, coords, vals


def _nm(shape, n, m, density, rng):
    """At most n entries in each group of m along the last mode (integers, zeros among
    them); a group with fewer than n also stores its first coordinate (the padding)."""
    dense = np.zeros(shape)
    stored = np.zeros(shape, dtype=bool)
    coords, vals = [], []
    for i in range(shape[0]):
        for g in range(shape[1] // m):
            count = int(rng.binomial(n, density))
            cols = rng.choice(m, size=count, replace=False) + g * m
            values = rng.integers(-2, 3, count).astype(float)
            dense[i, cols] = values
            stored[i, cols] = True
            if count < n:
                stored[i, g * m] = True
            coords.append(np.stack([np.full(count, i), cols]))
            vals.append(values)
    return dense, stored, coords, vals


def _inputs(case: dict) -> tuple[dict, dict, dict]:
    """(kernel inputs, dense float64 values, stored patterns) per tensor."""
    rng = np.random.default_rng(case["seed"])
    given, dense, stored = {}, {}, {}
    for name, ix in case["tensors"].items():
        shape = tuple(case["dims"][i] for i in ix)
        fmt = case["formats"].get(name, "")
        if not ix:
            given[name] = float(rng.integers(1, 4))
            dense[name] = torch.tensor(given[name], dtype=torch.float64)
            continue
        if fmt.startswith(("bsr", "nm")):
            a, b = (int(x) for x in fmt[fmt.index("(") + 1 : -1].split(","))
            make = _blocked if fmt.startswith("bsr") else _nm
            values, pattern, coords, vals = make(shape, a, b, case["density"], rng)
            c = np.concatenate(coords, axis=1) if coords else np.zeros((2, 0), np.int64)
            v = np.concatenate(vals) if vals else np.zeros(0)
            given[name] = sparsec.Tensor.from_coo(
                c, v, shape, fmt, dtype=case["dtype"], index_dtype=case["index_dtype"]
            )
            stored[name] = torch.from_numpy(pattern)
        else:
            values = rng.integers(-2, 3, shape).astype(float)
            values[rng.random(shape) >= case["density"]] = 0.0
            if fmt:  # a format without a map: its stored entries (what its dense levels
                # force included) are the core's, fuzzed by tests/test_fuzz.py
                t = sparsec.Tensor.from_dense(
                    values, fmt, dtype=case["dtype"], index_dtype=case["index_dtype"]
                )
                given[name] = t
                pattern = np.zeros(shape, dtype=bool)
                pattern[tuple(t.coords()[0])] = True
                stored[name] = torch.from_numpy(pattern)
            else:
                given[name] = values.astype(case["dtype"])
        dense[name] = torch.from_numpy(values)
    return given, dense, stored


def run_case(case: dict) -> None:
    given, dense, stored = _inputs(case)
    assignment = parse_expression(case["expr"])
    want = reference(assignment, dense, case["dims"], None, stored, "sparse").numpy()
    try:
        k = sparsec.kernel(case["expr"], case["formats"], target=case["target"])
    except ScheduleError as err:  # the CUDA default maps no loop of this nest
        assert case["target"] != "c" and "no GPU mapping" in str(err), err
        return
    try:
        got = k(**given)
    except LoweringError as err:
        assert "no loop order" in str(err), err
        return
    if isinstance(got, sparsec.MappedTensor | sparsec.Tensor):
        got = got.to_dense()
    compare(np.asarray(got), want, case["dtype"], f"{case}")


def _cases(seed: int, n: int) -> list[dict]:
    r = random.Random(seed)
    return [mapped_case(r) for _ in range(n)]


@pytest.mark.parametrize("chunk", range(10))
def test_mapped_formats_match_the_reference(chunk: int) -> None:
    for case in _cases(1000 + chunk, 20):
        run_case(case)


@pytest.mark.slow
@pytest.mark.parametrize("chunk", range(10))
def test_mapped_formats_match_the_reference_slow(chunk: int) -> None:
    for case in _cases(5000 + chunk, 300):
        run_case(case)
