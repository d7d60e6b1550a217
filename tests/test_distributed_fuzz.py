"""Differential fuzz of the distributed planner (issue 36): random statements run with
`sparsec.distributed` for P in {1, 2, 3} parts against the single-process kernel on the same
inputs, and both against a dense numpy evaluation written from docs/semantics.md (sums at
the smallest subexpression holding their index, absent entries the add's identity, masks
structural). Exact: every value is an integer.

The statements are SpMV/SpMM/SDDMM-like products of a sparse A (read as A(i,j) or A(j,i),
sometimes at both) with dense and sparse factors, the same dense tensor read at the split
index and at another one, sums of terms under + and -, summed split indices (reduce),
scalar and sparse outputs, masks M and ~M, and min_plus. A is a distributed tensor cut
along either mode (heavy rows split by position or not), or driver data that the planner
cuts (or replicates a dense operand against). A call may refuse only what the docs refuse:
splitting a summed index whose sum does not enclose the whole right-hand side, or one
whose partial outputs a semiring other than plus_times would have to add.

One in-process cluster per module. The fast suite draws `FAST` statements; the ``slow``
marker `SLOW` (``pytest -m slow tests/test_distributed_fuzz.py``).
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field

import numpy as np
import pytest

distributed = pytest.importorskip(
    "distributed", reason="sparsec.distributed needs dask[distributed] (the 'distributed' extra)"
)

import sparsec  # noqa: E402
import sparsec.distributed as sd  # noqa: E402

FAST = 36
SLOW = 400
PARTS = (1, 2, 3)
DRAWS = 3  # data draws per statement and part count
SPARSE_FORMATS = ("csr", "csc", "dcsr", "coo")
#: refusals the docs make for a split along a summed index
REFUSALS = ("enclose the whole right-hand side", "adds partial outputs with +")


@pytest.fixture(scope="module")
def client():
    cluster = distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None
    )
    with distributed.Client(cluster) as c:
        yield c
    cluster.close()


# ----------------------------------------------------------------- statements


@dataclass
class Statement:
    lhs: tuple[str, ...]  # the output's indices
    output: str  # "y" dense vector / "Y" dense matrix / "Z" sparse / "a" scalar
    #: (sign, factors); a factor is (tensor, indices)
    terms: list[tuple[str, list[tuple[str, tuple[str, ...]]]]]
    semiring: str
    mask: str = ""
    formats: dict[str, str] = field(default_factory=dict)

    def text(self) -> str:
        lhs = f"{self.output}({','.join(self.lhs)})" if self.lhs else self.output
        parts = []
        for k, (sign, factors) in enumerate(self.terms):
            body = " * ".join(f"{n}({','.join(ix)})" if ix else n for n, ix in factors)
            parts.append(body if k == 0 else f" {sign} {body}")
        return f"{lhs} = {''.join(parts)}"


def draw_statement(rng: np.random.Generator) -> Statement:
    """A random statement over i, j (the two modes of A), k (X's columns), l and m (the
    contractions of later terms): each summed index is used inside one product term only
    (an index summed in two terms is summed over their sum, docs/semantics.md)."""
    semiring = "min_plus" if rng.random() < 0.25 else "plus_times"
    out = ["y(i)", "y(j)", "Y(i,k)", "a", "Z(i,j)"][rng.integers(5)]
    if semiring != "plus_times" and out == "Z(i,j)":
        out = "y(i)"
    name = out[0]
    lhs = tuple(out[2:-1].split(",")) if "(" in out else ()
    first = ("A", ("i", "j")) if rng.random() < 0.6 else ("A", ("j", "i"))
    pool = [("x", ("i",)), ("x", ("j",)), ("z", ("j",)), ("B", ("i", "j")), ("A", ("j", "i"))]
    pool += [("B", ("j", "i")), ("s", ())]
    if "k" in lhs:
        pool = [("X", ("j", "k")), ("X", ("i", "k"))]
    chosen = [
        pool[t] for t in rng.permutation(len(pool))[: rng.integers(0 if "k" not in lhs else 1, 3)]
    ]
    main = [first, *[f for f in chosen if f != first]]
    rng.shuffle(main)
    terms = [("+", main)]
    if lhs and rng.random() < 0.6:  # more terms over the output's indices only
        extra = {
            ("i",): [[("x", ("i",))], [("z", ("i",))], [("B", ("i", "l")), ("z", ("l",))]],
            ("j",): [[("x", ("j",))], [("s", ()), ("z", ("j",))]],
            ("i", "k"): [[("X", ("i", "k"))], [("x", ("i",)), ("X", ("i", "k"))]],
            ("i", "j"): [[("B", ("i", "j"))], [("x", ("i",)), ("x", ("j",))], [("A", ("j", "i"))]],
        }[lhs]
        for local in ("l", "m")[: rng.integers(1, 3)]:  # a term's own summed index
            sign = "-" if semiring == "plus_times" and rng.random() < 0.4 else "+"
            term = extra[rng.integers(len(extra))]
            terms.append(
                (sign, [(n, tuple(local if i == "l" else i for i in ix)) for n, ix in term])
            )
    mask = ""
    if lhs and name != "Z" and rng.random() < 0.2:
        mask = "~M" if rng.random() < 0.5 else "M"
    formats = {"A": SPARSE_FORMATS[rng.integers(len(SPARSE_FORMATS))], "B": "csr"}
    if name == "Z":
        formats["Z"] = "csr"
    if mask:
        formats["M"] = "s" if len(lhs) == 1 else "csr"
    used = {n for _, fs in terms for n, _ in fs}
    formats = {n: f for n, f in formats.items() if n in used or n in ("Z", "M")}
    return Statement(lhs, name, terms, semiring, mask, formats)


# ----------------------------------------------------------------- data and reference


def draw_data(st: Statement, rng: np.random.Generator) -> tuple[dict, dict]:
    """(inputs, dense values with presence) for a statement: integers, A and B with stored
    zeros and an empty row and column, r columns of X."""
    n, r = int(rng.integers(4, 13)), int(rng.integers(1, 4))
    low, high = (0, 6) if st.semiring == "min_plus" else (-3, 4)
    dense: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    inputs: dict = {}

    def sparse(name: str, shape: tuple[int, ...], fmt: str, density: float) -> None:
        present = rng.random(shape) < density
        if len(shape) == 2 and shape[0] > 2:
            present[rng.integers(shape[0])] = False
            present[:, rng.integers(shape[1])] = False
        vals = rng.integers(low, high, shape).astype(float)
        vals[rng.random(shape) < 0.15] = 0.0  # stored zeros
        coords = np.array(np.nonzero(present))
        inputs[name] = sparsec.Tensor.from_coo(coords, vals[present], shape, fmt)
        dense[name] = (np.where(present, vals, 0.0), present)

    for nm, ix in {n: ix for _, fs in st.terms for n, ix in fs}.items():
        if nm in ("A", "B"):
            sparse(nm, (n, n), st.formats[nm], float(rng.choice([0.15, 0.35, 0.7])))
        elif nm == "s":
            inputs[nm] = float(rng.integers(low, high))
            dense[nm] = (np.array(inputs[nm]), np.array(True))
        else:
            shape = tuple(r if i == "k" else n for i in ix)
            inputs[nm] = rng.integers(low, high, shape).astype(float)
            dense[nm] = (inputs[nm], np.ones(shape, dtype=bool))
    if st.mask:
        shape = tuple(r if i == "k" else n for i in st.lhs)
        sparse("M", shape, st.formats["M"], 0.5)
    return inputs, dense


def reference(st: Statement, dense: dict) -> np.ndarray:
    """The statement evaluated densely: each term over a grid of its indices, its local
    indices reduced with the add; terms combined with the add; then the mask."""
    any_tensor = next(v for v, _ in dense.values() if v.ndim)
    n = any_tensor.shape[0]
    r = next((v.shape[1] for nm, (v, _) in dense.items() if nm == "X"), 1)
    extent = {"i": n, "j": n, "l": n, "m": n, "k": r}
    minplus = st.semiring == "min_plus"
    total = None
    for sign, factors in st.terms:
        idx = list(st.lhs) + sorted({i for _, ix in factors for i in ix} - set(st.lhs))
        grid = tuple(extent[i] for i in idx)
        value = np.zeros(grid) if minplus else np.ones(grid)
        present = np.ones(grid, dtype=bool)
        for nm, ix in factors:
            v, p = dense[nm]
            order = [ix.index(i) for i in idx if i in ix]
            shape = [extent[i] if i in ix else 1 for i in idx]
            fv = np.transpose(v, order).reshape(shape) if ix else v
            fp = np.transpose(p, order).reshape(shape) if ix else p
            value = value + fv if minplus else value * fv
            present = present & fp
        local = tuple(range(len(st.lhs), len(idx)))
        if minplus:
            term = (
                np.where(present, value, np.inf).min(axis=local)
                if local
                else np.where(present, value, np.inf)
            )
        else:
            term = value.sum(axis=local) if local else value
        term = np.broadcast_to(term, tuple(extent[i] for i in st.lhs))
        if total is None:
            total = np.array(term, dtype=float)
        elif minplus:
            total = np.minimum(total, term)
        else:
            total = total + term if sign == "+" else total - term
    assert total is not None
    if st.mask:
        keep = dense["M"][1] if st.mask == "M" else ~dense["M"][1]
        total = np.where(keep, total, np.inf if minplus else 0.0)
    return total


def dense_of(value) -> np.ndarray:
    if isinstance(value, sd.DistributedTensor | sparsec.Tensor):
        return value.to_dense()
    return np.asarray(value, dtype=float)


# ----------------------------------------------------------------- one statement


def run_statement(client, seed: int) -> tuple[int, int]:
    """Every part count and data draw of statement ``seed``: (cases computed, refused)."""
    rng = np.random.default_rng(seed)
    st = draw_statement(rng)
    expr = st.text()
    options = {"semiring": st.semiring, "mask": st.mask or None}
    single = sparsec.kernel(expr, st.formats, **options)
    dk = sd.kernel(expr, st.formats, **options)
    computed = refused = 0
    for P in PARTS:
        for _ in range(DRAWS):
            inputs, dense = draw_data(st, rng)
            want = reference(st, dense)
            got_single = dense_of(single(**inputs))
            np.testing.assert_array_equal(got_single, want, err_msg=f"single-process: {expr}")
            how = rng.integers(3)
            call = dict(inputs)
            fmt = sparsec.parse_format(st.formats["A"], 2)
            mode = fmt.ordering[0]
            if how < 2:  # A cut on the driver into P parts along either mode
                mode = int(rng.integers(2))
                call["A"] = sd.from_tensor(
                    inputs["A"], P, client=client, mode=mode, split_heavy=bool(how)
                )
                options_call = {}
            else:  # driver data: the planner cuts A (or replicates a dense operand)
                options_call = {"parts": P, "client": client}
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # a repartition states its volume
                    got = dense_of(dk(**call, **options_call))
            except sparsec.SparsecError as err:
                # only a split along a summed index whose sum does not enclose every term,
                # or under a semiring other than plus_times (the planner may split B)
                said = re.search(r"along the summed index '(\w+)'", str(err))
                summed = said is not None and said.group(1) not in st.lhs
                nonlinear = len(st.terms) > 1 or st.semiring != "plus_times"
                if not (summed and nonlinear and any(m in str(err) for m in REFUSALS)):
                    raise AssertionError(f"{expr} (P={P}, how={how}): {err}") from None
                refused += 1
                continue
            np.testing.assert_array_equal(
                got, want, err_msg=f"{expr} (P={P}, A mode {mode}, how={how})"
            )
            computed += 1
    return computed, refused


def test_distributed_planner_fuzz(client) -> None:
    computed = refused = 0
    for seed in range(FAST):
        c, r = run_statement(client, seed)
        computed, refused = computed + c, refused + r
    assert computed >= 0.5 * FAST * len(PARTS) * DRAWS, (computed, refused)


@pytest.mark.slow
def test_distributed_planner_fuzz_slow(client) -> None:
    computed = refused = 0
    for seed in range(1000, 1000 + SLOW):
        c, r = run_statement(client, seed)
        computed, refused = computed + c, refused + r
    print(f"distributed fuzz: {computed} computed, {refused} refused as documented")
    assert computed >= 0.5 * SLOW * len(PARTS) * DRAWS, (computed, refused)
