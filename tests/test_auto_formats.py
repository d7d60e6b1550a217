"""``formats="auto"`` (`sparsec.api.auto`, `sparsec.policy.formats`): the model's view of
a matrix, the candidates it times, the choice kept per input, and results equal to scipy's
whatever is chosen. The timing is replaced by the model's bytes where a test asserts which
format wins, so the choice does not depend on this machine."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import sparsec
from sparsec import FormatError
from sparsec.api import auto
from sparsec.policy.formats import Shape, candidates


def blocked(n: int, r: int, c: int, seed: int) -> sp.csr_array:
    rng = np.random.default_rng(seed)
    keep = sp.random(n // r, n // c, density=0.1, random_state=seed, format="csr")
    return sp.csr_array(sp.kron(keep, np.ones((r, c)))) * rng.uniform(0.5, 1.0)


def hypersparse(n: int, seed: int) -> sp.csr_array:
    rng = np.random.default_rng(seed)
    rows = rng.choice(n, n // 100, replace=False)
    cols = rng.integers(0, n, rows.size)
    return sp.csr_array((rng.uniform(-1, 1, rows.size), (rows, cols)), shape=(n, n))


@pytest.fixture
def by_the_model(monkeypatch):
    """Candidates "timed" as their modelled bytes: the model's ranking decides."""
    made: dict[int, float] = {}

    def per_call(k, args, threads):
        a = args["A"]
        fmt = str(k.formats["A"])
        coords = a.coords()[0]
        return Shape.of(a.shape, coords).bytes(fmt, 8) + made.setdefault(id(k), 0.0)

    monkeypatch.setattr(auto, "_per_call", per_call)


def test_the_shape_counts_rows_and_blocks():
    a = blocked(64, 4, 4, seed=1).tocoo()
    coords = np.stack([a.row, a.col])
    shape = Shape.of(a.shape, coords)
    assert shape.nnz == a.nnz and shape.rows == 64
    assert shape.blocks[(4, 4)] * 16 == a.nnz  # every block full
    want = len({(r // 2, c // 2) for r, c in zip(a.row, a.col, strict=True)})
    assert shape.blocks[(2, 2)] == want
    assert shape.nonempty == len(set(a.row.tolist()))
    assert shape.bytes("bsr(4,4)", 8) < shape.bytes("csr", 8)


def test_candidates_keep_csr_and_drop_blocks_that_do_not_fill():
    a = hypersparse(400, seed=2).tocoo()
    shape = Shape.of(a.shape, np.stack([a.row, a.col]))
    found = candidates(shape, 8)
    assert "csr" in found and found[0] == "dcsr"
    assert not any(f.startswith("bsr(8,8)") for f in found)  # eight zeros per entry


@pytest.mark.parametrize(
    ("matrix", "prefix"),
    [(lambda: blocked(256, 4, 4, seed=3), "bsr("), (lambda: hypersparse(2000, seed=4), "dcsr")],
)
def test_the_choice_follows_the_timing_and_the_result_is_scipys(by_the_model, matrix, prefix):
    a = matrix()
    x = np.arange(a.shape[1], dtype=np.float64)
    k = sparsec.kernel("y(i) = A(i,j) * x(j)", formats="auto")
    assert k.formats["A"] == "auto"
    np.testing.assert_allclose(k(A=a, x=x), a @ x)
    chosen = k.choices["A"]["chosen"]
    assert chosen.startswith(prefix), k.choices
    assert "csr" in k.choices["A"]["candidates"]
    assert str(k.formats["A"]).startswith(prefix)
    assert "formats chosen from the data (formats='auto'): A: " + chosen in k.source


@pytest.mark.parametrize(
    ("times", "want"),
    [
        # within TIE of the fastest: the fewest modelled bytes (bsr(4,4) of full blocks)
        ({"bsr(4,4)": 1.015, "bsr(4,1)": 1.0, "bsr(2,2)": 1.01}, "bsr(4,4)"),
        # beyond it: the fastest, whatever the model says
        ({"bsr(4,4)": 1.05, "bsr(4,1)": 1.0, "bsr(2,2)": 1.01}, "bsr(4,1)"),
        # and CSR still needs beating by MARGIN
        ({"bsr(4,4)": 1 - auto.MARGIN / 2, "bsr(4,1)": 1 - auto.MARGIN / 2, "csr": 1.0}, "csr"),
    ],
)
def test_close_timings_are_told_apart_by_the_model(monkeypatch, times, want):
    """Candidates whose medians are within `auto.TIE` of the fastest are ranked by their
    modelled bytes; a clearer difference is the timing's; CSR is left only for a
    candidate at least `auto.MARGIN` faster. Formats not listed are timed at 2.0."""

    def per_call(k, args, threads):
        return times.get(str(k.formats["A"]), 2.0)

    monkeypatch.setattr(auto, "_per_call", per_call)
    a = blocked(64, 4, 4, seed=8)
    k = sparsec.kernel("y(i) = A(i,j) * x(j)", formats="auto")
    np.testing.assert_allclose(k(A=a, x=np.ones(64)), a @ np.ones(64))
    tried = k.choices["A"]["candidates"]
    assert {"bsr(4,4)", "bsr(4,1)", "bsr(2,2)"} <= set(tried), tried
    assert tried["bsr(4,4)"]["bytes"] < min(tried[f]["bytes"] for f in ("bsr(4,1)", "bsr(2,2)"))
    assert k.choices["A"]["chosen"] == want, k.choices


def test_check_runs_the_chosen_kernel():
    a = blocked(64, 4, 4, seed=9)
    k = sparsec.kernel("y(i) = A(i,j) * x(j)", formats="auto")
    assert "matches" in str(k.check(A=a, x=np.ones(64)))


def test_a_choice_is_kept_for_the_same_input(monkeypatch):
    a = blocked(128, 2, 2, seed=5)
    x = np.ones(128)
    k = sparsec.kernel("y(i) = A(i,j) * x(j)", formats={"A": "auto"})
    calls = []
    real = k._choose
    monkeypatch.setattr(
        k, "_choose", lambda inputs, threads: calls.append(1) or real(inputs, threads)
    )
    for _ in range(3):
        np.testing.assert_allclose(k(A=a, x=x), a @ x)
    assert len(calls) == 1
    other = blocked(128, 2, 2, seed=6)
    np.testing.assert_allclose(k(A=other, x=x), other @ x)
    assert len(calls) == 2


@pytest.mark.parametrize("given", [sparsec.Tensor.from_dense, "dense", "torch"])
def test_every_input_kind(given):
    import torch

    d = blocked(64, 2, 2, seed=7).toarray()
    value = (
        {
            "dense": d,
            "torch": torch.tensor(d).to_sparse_csr(),
        }.get(given)
        if isinstance(given, str)
        else given(d, "coo")
    )  # type: ignore[operator]
    X = np.random.default_rng(8).random((64, 3))
    k = sparsec.kernel("Y(i,k) = A(i,j) * X(j,k)", formats={"A": "auto"})
    np.testing.assert_allclose(k(A=value, X=X), d @ X)


def test_an_order_three_input_gets_the_default_sparse_format():
    t = np.zeros((3, 4, 5))
    t[1, 2, 3] = 2.0
    k = sparsec.kernel("y(i) = B(i,j,l) * c(l)", formats="auto")
    np.testing.assert_allclose(k(B=t, c=np.ones(5)), t.sum(axis=(1, 2)))
    assert str(k.formats["B"]) == "csf"


def test_what_auto_refuses():
    with pytest.raises(FormatError, match="output"):
        sparsec.kernel("C(i,j) = A(i,j) + B(i,j)", formats={"C": "auto"})
    with pytest.raises(FormatError, match="not a tensor"):
        sparsec.kernel("y(i) = A(i,j) * x(j)", formats={"Q": "auto"})
    with pytest.raises(FormatError, match="no tensor input"):
        sparsec.kernel("y = 2", formats="auto")
    with pytest.raises(sparsec.InputError, match="call it first"):
        sparsec.kernel("y(i) = A(i,j) * x(j)", formats="auto").kernel  # noqa: B018
