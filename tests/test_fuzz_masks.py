"""Differential fuzzing of masks (issue 36): ``mask="M"`` and ``mask="~M"`` with ``=`` and
``+=`` into every output format (dense, sparse vectors, csr, csc, dcsr, dcsc, coo, csf),
under plus_times, min_plus, max_plus and or_and, for SpMV-, SpGEMM-, SDDMM-like, add and
elementwise statements and a quotient under ``division="ieee"`` (outside the mask absent,
not ``0 * inf``), M in any format with explicit stored zeros and empty rows.

The reference follows docs/semantics.md ("Masks", "Semirings", "Outputs"), written here
with numpy on (value, presence) arrays, apart from sparsec: compute the unmasked result
and where it is structurally present (a product needs both operands, a sum either, a
reduction a term), then keep it where M stores an entry (``M``) or stores none (``~M``).
Outside, a dense output holds the add's identity (``=``) or its current value (``+=``); a
sparse one stores nothing (``=``) or its current entries (``+=``: the union of C's entries
and the masked pattern, added where both are). A dense M stores every coordinate.

A kernel is drawn (statement, formats, semiring, mask, ``=``/``+=``) and called on several
data draws; the fast suite draws `FAST` kernels, ``-m slow`` `SLOW`. Data are small
integers (exact in any order of the sums).
"""

from __future__ import annotations

import numpy as np
import pytest

import sparsec
from sparsec.base.errors import LoweringError, ScheduleError

FAST, SLOW, DRAWS = 48, 600, 5

#: statement -> (output indices, {operand: indices}, operands that are dense)
STATEMENTS = {
    "y(i) = A(i,j) * x(j)": ("i", {"A": "ij", "x": "j"}, {"x"}),
    "y(j) = A(i,j) * x(i)": ("j", {"A": "ij", "x": "i"}, {"x"}),
    "y(i) = a(i) + b(i)": ("i", {"a": "i", "b": "i"}, set()),
    "C(i,j) = A(i,k) * B(k,j)": ("ij", {"A": "ik", "B": "kj"}, set()),
    "C(i,j) = S(i,j) * D(i,k) * E(k,j)": ("ij", {"S": "ij", "D": "ik", "E": "kj"}, {"D", "E"}),
    "C(i,j) = A(i,j) + B(i,j)": ("ij", {"A": "ij", "B": "ij"}, set()),
    "C(i,j) = A(i,j) * B(i,j)": ("ij", {"A": "ij", "B": "ij"}, set()),
    "C(i,j,k) = A(i,j,k) * x(k)": ("ijk", {"A": "ijk", "x": "k"}, {"x"}),
    # plus_times with division="ieee": the dense IEEE value (0/0 is NaN), present everywhere
    "y(i) = A(i,j) / x(j)": ("i", {"A": "ij", "x": "j"}, {"x"}),
}
IEEE = "y(i) = A(i,j) / x(j)"
SPARSE_IN = {
    1: ["s", "d"],
    2: ["csr", "csc", "dcsr", "coo", "dense"],
    3: ["csf", "coo", "sds:2,0,1"],
}
OUTPUTS = {
    1: ["d", "s"],
    2: ["dense", "csr", "csc", "dcsr", "dcsc", "coo"],
    3: ["dense", "csf", "coo"],
}
MASKS = {1: ["s", "d", None], 2: ["csr", "csc", "dcsr", "coo", "dd", None], 3: ["csf", "coo", None]}
#: semiring -> (add as a numpy reduction, multiply, identity of add, values read as truth)
RINGS = {
    "plus_times": (np.add, np.multiply, 0.0, False),
    "min_plus": (np.minimum, np.add, np.inf, False),
    "max_plus": (np.maximum, np.add, -np.inf, False),
    "or_and": (np.logical_or, np.logical_and, 0.0, True),
}


# ------------------------------------------------------------------ the reference
class Ref:
    """Dense values with presence, under one semiring (docs/semantics.md, Semirings)."""

    def __init__(self, ring: str) -> None:
        self.add, self.mul, self.identity, self.boolean = RINGS[ring]

    def read(self, v: np.ndarray) -> np.ndarray:
        return (v != 0).astype(float) if self.boolean else v

    def times(self, a, b):
        (va, pa), (vb, pb) = a, b
        present = pa & pb
        return np.where(present, self.mul(va, vb).astype(float), self.identity), present

    def plus(self, a, b):
        (va, pa), (vb, pb) = a, b
        both = self.add(va, vb).astype(float)
        value = np.where(pa & pb, both, np.where(pa, va, np.where(pb, vb, self.identity)))
        return value, pa | pb

    def reduce(self, a, axis: int):
        v, p = a
        value = self.add.reduce(np.where(p, v, self.identity), axis=axis).astype(float)
        present = p.any(axis=axis)
        return np.where(present, value, self.identity), present


def reference(stmt: str, ring: str, data: dict) -> tuple[np.ndarray, np.ndarray]:
    """The unmasked result of ``stmt`` and its presence; ``data``: name -> (values, stored)."""
    r = Ref(ring)
    t = {n: (r.read(v), p) for n, (v, p) in data.items()}
    match stmt:
        case "y(i) = A(i,j) * x(j)":
            return r.reduce(r.times(t["A"], _b(t["x"], (None, slice(None)))), 1)
        case "y(j) = A(i,j) * x(i)":
            return r.reduce(r.times(t["A"], _b(t["x"], (slice(None), None))), 0)
        case "C(i,j,k) = A(i,j,k) * x(k)":
            return r.times(t["A"], _b(t["x"], (None, None, slice(None))))
        case "y(i) = a(i) + b(i)" | "C(i,j) = A(i,j) + B(i,j)":
            a, b = (t[n] for n in sorted(t))
            return r.plus(a, b)
        case "C(i,j) = A(i,j) * B(i,j)":
            return r.times(t["A"], t["B"])
        case "y(i) = A(i,j) / x(j)":
            with np.errstate(divide="ignore", invalid="ignore"):
                value = (data["A"][0] / data["x"][0][None, :]).sum(axis=1)
            return value, np.ones(value.shape, dtype=bool)
        case "C(i,j) = A(i,k) * B(k,j)":
            return r.reduce(r.times(_b(t["A"], (..., None)), _b(t["B"], (None, ...))), 1)
        case "C(i,j) = S(i,j) * D(i,k) * E(k,j)":
            sd = r.times(_b(t["S"], (slice(None), None, slice(None))), _b(t["D"], (..., None)))
            return r.reduce(r.times(sd, _b(t["E"], (None, ...))), 1)
    raise AssertionError(stmt)


def _b(x, at):
    return x[0][at], x[1][at]


def masked(ring: str, result, keep: np.ndarray, accumulate: bool, current) -> tuple:
    """The masked output as (values, stored): docs/semantics.md, Masks."""
    r = Ref(ring)
    value, present = result
    present = present & keep
    if not accumulate:
        return np.where(present, value, r.identity), present
    cv, cp = current
    cv = r.read(cv)
    both = r.add(cv, value).astype(float)
    out = np.where(present & cp, both, np.where(present, value, cv))
    return out, present | cp


# ------------------------------------------------------------------ the cases
def _array(rng: np.random.Generator, shape, integer_density: float = 0.4):
    """Values in -3..3 and where they are stored: explicit zeros among them, one empty
    first-mode slice (when there are two or more)."""
    stored = rng.random(shape) < integer_density
    if shape[0] > 1:
        stored[rng.integers(shape[0])] = False
    values = np.where(stored, rng.integers(-3, 4, shape), 0).astype(float)
    return values, stored


def _tensor(values: np.ndarray, stored: np.ndarray, fmt: str) -> object:
    if fmt in ("dense", "d", "dd", "ddd"):
        return values.copy()
    coords = np.array(np.nonzero(stored)).reshape(values.ndim, -1)
    return sparsec.Tensor.from_coo(coords, values[stored], values.shape, fmt)


def _entries(out, order: int) -> dict:
    coords, vals = out.coords()
    return {tuple(int(x) for x in c): float(v) for c, v in zip(coords.T, vals, strict=True)}


def draw_kernel(rng: np.random.Generator) -> dict:
    stmt = str(rng.choice(list(STATEMENTS)))
    lhs, operands, dense = STATEMENTS[stmt]
    order = len(lhs)
    formats = {
        n: str(rng.choice(SPARSE_IN[len(ix)])) for n, ix in operands.items() if n not in dense
    }
    out_name = stmt[0]
    out = str(rng.choice(OUTPUTS[order]))
    formats[out_name] = out
    mfmt = rng.choice(MASKS[order])
    if mfmt is not None:
        formats["M"] = str(mfmt)
    return {
        "stmt": stmt,
        "formats": formats,
        "ring": "plus_times" if stmt == IEEE else str(rng.choice(list(RINGS))),
        "mask": str(rng.choice(["M", "~M"])),
        "accumulate": bool(rng.random() < 0.5),
        "out": out,
        "mfmt": formats.get("M") or _default_mask(out, order),
    }


def _default_mask(out: str, order: int) -> str:
    """The mask's format when none is given: the output's when sparse, else the compressed
    default (docs/semantics.md)."""
    if out not in ("dense", "d"):
        return out
    return {1: "s", 2: "csr", 3: "csf"}[order]


def run_kernel(seed: int) -> int:
    """Draw a kernel and check it on `DRAWS` data draws; the cases run (0 if refused)."""
    rng = np.random.default_rng(seed)
    case = draw_kernel(rng)
    stmt, ring, mask, out = case["stmt"], case["ring"], case["mask"], case["out"]
    lhs, operands, dense = STATEMENTS[stmt]
    text = stmt.replace(" = ", " += ") if case["accumulate"] else stmt
    try:
        division = "ieee" if stmt == IEEE else "sparse"
        k = sparsec.kernel(text, case["formats"], mask=mask, semiring=ring, division=division)
    except (LoweringError, ScheduleError) as err:
        # documented refusals: no loop order for these formats into this output
        assert "order" in str(err) or "sparse" in str(err), err
        return 0
    out_name = stmt[0]
    sparse_out = out not in ("dense", "d")
    for _ in range(DRAWS):
        sizes = {v: int(rng.integers(1, 6)) for v in "ijk"}
        data, given = {}, {}
        for name, ix in operands.items():
            shape = tuple(sizes[v] for v in ix)
            if name in dense or case["formats"][name] in ("dense", "d"):
                values = rng.integers(-3, 4, shape).astype(float)  # present everywhere
                data[name] = (values, np.ones(shape, dtype=bool))
                given[name] = values
            else:
                data[name] = _array(rng, shape)
                given[name] = _tensor(*data[name], case["formats"][name])
        shape = tuple(sizes[v] for v in lhs)
        mvals, mstored = _array(rng, shape, 0.45)
        if case["mfmt"] in ("dd", "d"):
            mstored = np.ones(shape, dtype=bool)  # a dense M stores every coordinate
        given["M"] = _tensor(mvals, mstored, case["mfmt"])
        keep = ~mstored if mask == "~M" else mstored
        current = None
        if case["accumulate"]:
            cvals, cstored = _array(rng, shape)
            if ring == "or_and":
                cvals = (cvals != 0).astype(float)
            if not sparse_out:
                cstored = np.ones(shape, dtype=bool)
                if ring in ("min_plus", "max_plus") and rng.random() < 0.5:
                    cvals = np.where(rng.random(shape) < 0.3, RINGS[ring][2], cvals)
            current = (cvals, cstored)
            given[out_name] = _tensor(cvals, cstored, out)
        want_v, want_p = masked(
            ring, reference(stmt, ring, data), keep, case["accumulate"], current
        )
        got = k(**given, threads=int(rng.integers(1, 3)))
        what = f"{text} {case['formats']} mask={mask} semiring={ring}"
        if sparse_out:
            entries = _entries(got, len(shape))
            want = {tuple(int(x) for x in c): float(want_v[tuple(c)]) for c in np.argwhere(want_p)}
            assert entries.keys() == want.keys(), (
                f"{what}: pattern {sorted(entries)} != {sorted(want)}"
            )
            for c, v in want.items():
                assert entries[c] == v or np.isnan(v) and np.isnan(entries[c]), (
                    f"{what}: at {c}: {entries[c]} != {v}"
                )
        else:
            np.testing.assert_array_equal(np.asarray(got, dtype=float), want_v, err_msg=what)
    return DRAWS


@pytest.mark.parametrize("chunk", range(4))
def test_masks_against_numpy(chunk: int) -> None:
    ran = sum(run_kernel(seed) for seed in range(chunk, FAST, 4))
    assert ran >= DRAWS * FAST // 8  # most kernels compile (the refusals are few)


@pytest.mark.slow
@pytest.mark.parametrize("chunk", range(10))
def test_masks_against_numpy_slow(chunk: int) -> None:
    sum(run_kernel(seed) for seed in range(FAST + chunk, FAST + SLOW, 10))
