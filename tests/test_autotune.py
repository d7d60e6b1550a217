"""schedule="auto": candidates timed on the first call's inputs, the winner cached on disk."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import sparse_array

import sparsec
from sparsec.api import autotune
from sparsec.base.target import C
from sparsec.middle.commands import parse_commands
from sparsec.policy import calibrated, tuning
from sparsec.policy.decision import Decision, decide, with_options

SPMV = "y(i) = A(i,j) * x(j)"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARSEC_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_auto_tunes_once_and_matches(cache, rng):
    a = sparsec.Tensor.from_dense(sparse_array((300, 200), rng), "csr")
    x = rng.standard_normal(200)
    k = sparsec.kernel(SPMV, {"A": "csr"}, schedule="auto")
    assert k.schedule.startswith("auto: not tuned yet")
    np.testing.assert_allclose(k(A=a, x=x, threads=2), a.to_dense() @ x)
    assert k.schedule.startswith("auto: ") and "medians on the tuning inputs" in k.schedule
    table = json.loads((cache / "autotune.json").read_text())
    (entry,) = table.values()
    assert "default" in entry["medians_ms"] and len(entry["medians_ms"]) >= 3
    assert entry["schedule"] is None or entry["schedule"] in entry["medians_ms"]
    k.check(A=a, x=x, threads=2)


def test_the_disk_cache_skips_tuning(cache, rng, monkeypatch):
    a = sparsec.Tensor.from_dense(sparse_array((120, 90), rng), "csr")
    x = rng.standard_normal(90)
    sparsec.kernel(SPMV, {"A": "csr"}, schedule="auto")(A=a, x=x, threads=2)

    def no_tuning(*args, **kwargs):
        raise AssertionError("tuned again despite the cache")

    monkeypatch.setattr(autotune, "tune", no_tuning)
    again = sparsec.kernel(SPMV, {"A": "csr"}, schedule="auto")
    np.testing.assert_allclose(again(A=a, x=x, threads=2), a.to_dense() @ x)
    # another thread count is another kind of call: it would tune
    with pytest.raises(AssertionError, match="tuned again"):
        again(A=a, x=x, threads=1)


def test_keys_follow_the_sparsity_signature(rng):
    k = sparsec.kernel(SPMV, {"A": "csr"}, schedule="auto")
    sparse = sparsec.Tensor.from_dense(sparse_array((100, 100), rng, 0.05), "csr")
    denser = sparsec.Tensor.from_dense(sparse_array((100, 100), rng, 0.6), "csr")
    x = np.ones(100)
    keys = {
        autotune.key(k.assignment, k.spec, {"A": m, "x": x}, "float64", "int32", t)
        for m in (sparse, denser)
        for t in (1, 2)
    }
    assert len(keys) == 4


def test_candidates_are_legal_or_skipped(cache, rng):
    expr = "A(i,j) = B(i,k,l) * D(l,j) * C(k,j)"
    k = sparsec.kernel(expr, {"B": "csf"}, schedule="auto")
    shapes = {"B": (9, 7, 6), "D": (6, 5), "C": (7, 5)}
    inputs = {n: sparse_array(s, rng) for n, s in shapes.items()}
    got = k(**inputs, threads=2)
    want = np.einsum("ikl,lj,kj->ij", inputs["B"], inputs["D"], inputs["C"])
    np.testing.assert_allclose(got, want, atol=1e-12)
    assert len(tuning.candidates(k.spec, k.generated().loop_order)) >= 4


def test_auto_is_for_the_cpu():
    with pytest.raises(sparsec.ScheduleError, match="auto"):
        sparsec.kernel(SPMV, {"A": "csr"}, target="cuda", schedule="auto")


def test_candidates_are_decisions_built_from_the_default():
    """The tuner searches typed decisions (issue 37 item 3): the default first, the others
    it under other commands, never text parsed again; the label names each in the table."""
    k = sparsec.kernel(SPMV, {"A": "csr"}, schedule="auto")
    default = decide(k.spec, C)
    found = tuning.candidates(k.spec, k.generated().loop_order, default)
    assert found[0] == default and default.label is None
    assert all(isinstance(d, Decision) for d in found)
    by_commands = [d for d in found[1:] if not d.tuned]
    assert by_commands
    for d in by_commands:
        assert d.passes == default.passes and d.prepare == default.prepare
        assert d.commands and parse_commands(d.label) == d.commands
    assert len({d.label for d in found}) == len(found)


def test_candidates_search_the_calibrated_options():
    """schedule="auto" searches the options host calibration sets (issue 38): the default
    under each other value of each, named in its label, all else the default's."""
    k = sparsec.kernel(SPMV, {"A": "csr"}, schedule="auto")
    default = decide(k.spec, C)
    tuned = [d for d in tuning.candidates(k.spec, k.generated().loop_order, default) if d.tuned]
    wanted = {
        (name, value)
        for name, values in calibrated.CHOICES.items()
        for value in values
        if value != values[0] and not name.startswith("costs.")  # a call's, not the code's
    }
    assert {d.tuned for d in tuned} == {((n, v),) for n, v in wanted}
    for d in tuned:
        ((name, value),) = d.tuned
        assert d.commands == default.commands and d.label == f"with {name}={value!r}"
        assert d.passes == with_options(default.passes, {name: value}) != default.passes


def test_a_table_written_before_decisions_is_read(cache, rng, monkeypatch):
    """The stored format is the schedule's text: a winner recorded as text is found among
    the candidates by its label and run without tuning."""
    a = sparsec.Tensor.from_dense(sparse_array((60, 40), rng), "csr")
    x = rng.standard_normal(40)
    k = sparsec.kernel(SPMV, {"A": "csr"}, schedule="auto")
    text = "split(i,i_blk,i_in,16), parallelize(i_blk,CPUThread,NoRaces)"
    assert text in {d.label for d in tuning.candidates(k.spec, k.generated().loop_order)}
    entry = autotune.key(k.assignment, k.spec, {"A": a, "x": x}, "float64", "int32", 2)
    autotune.record(entry, {"schedule": text, "medians_ms": {"default": 2.0, text: 1.0}})

    def no_tuning(*args, **kwargs):
        raise AssertionError("tuned again despite the table")

    monkeypatch.setattr(autotune, "tune", no_tuning)
    np.testing.assert_allclose(k(A=a, x=x, threads=2), a.to_dense() @ x)
    assert k.schedule.startswith(f"auto: {text} (")


class _Timed:
    """A stand-in executable: each run advances the fake clock by its cost, times the
    machine's slowdown at that moment (``slow(call number)``)."""

    def __init__(self, cost, clock):
        self.cost, self.clock = cost, clock

    def run(self, prepared, threads):
        self.clock.calls += 1
        self.clock.now += self.cost * self.clock.slow(self.clock.calls)
        return np.zeros(3)


class _Clock:
    def __init__(self, slow):
        self.now, self.calls, self.slow = 0.0, 0, slow

    def __call__(self):
        return self.now


class _Candidate:
    def __init__(self, label):
        self.label = label


def _tune(costs, slow, monkeypatch):
    clock = _Clock(slow)
    monkeypatch.setattr(autotune, "clock", clock)
    decisions = [_Candidate(None if name == "default" else name) for name in costs]
    build = lambda d: _Timed(costs[d.label or "default"], clock)  # noqa: E731
    return autotune.tune(build, decisions, None, 2)


def test_candidates_are_timed_in_interleaved_rounds(monkeypatch):
    """A machine that runs slower for its first calls (a clock ramping up, a burst of load)
    must not decide: timed one after another, the default would take every slow call and
    the last candidate none, and the equal last one would win; timed in rotating rounds,
    the truly faster one does."""
    costs = {"default": 1.0, "faster": 0.8, "same": 1.0}
    result = _tune(costs, lambda n: 3.0 if n <= 12 else 1.0, monkeypatch)
    assert result["schedule"] == "faster"
    assert result["medians_ms"] == pytest.approx({k: v * 1e3 for k, v in costs.items()})


@pytest.mark.parametrize(("cost", "wins"), [(0.95, False), (0.85, True)])
def test_a_candidate_within_the_margin_keeps_the_default(cost, wins, monkeypatch):
    """Candidates whose code differs only in layout time a few % apart: a candidate must
    beat the default by `MARGIN` to replace it."""
    result = _tune({"default": 1.0, "other": cost}, lambda n: 1.0, monkeypatch)
    assert result["schedule"] == ("other" if wins else None)


def test_repeated_calls_decide_nothing_again(cache, rng, monkeypatch):
    """A kind of call already decided runs its executable: no key, candidates or table are
    computed again (they cost more than a small kernel); another thread count is another
    kind, and a changed calibration decides again."""
    a = sparsec.Tensor.from_dense(sparse_array((80, 60), rng), "csr")
    x = rng.standard_normal(60)
    k = sparsec.kernel(SPMV, {"A": "csr"}, schedule="auto")
    seen = []
    real = tuning.candidates
    monkeypatch.setattr(tuning, "candidates", lambda *a, **kw: seen.append(1) or real(*a, **kw))
    for _ in range(3):
        np.testing.assert_allclose(k(A=a, x=x, threads=2), a.to_dense() @ x)
    assert len(seen) == 1
    k(A=a, x=x, threads=1)
    assert len(seen) == 2
    with calibrated.trying({"stream_locality": None}):
        np.testing.assert_allclose(k(A=a, x=x, threads=1), a.to_dense() @ x)
    assert len(seen) == 3
