"""Host calibration: choices made from measurements (a fake timer stands for the host), stored
per CPU, read by every C kernel's decision, and ignored, for the defaults, wherever the file
is missing, corrupt, foreign or outdated, or calibration is off."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

import sparsec
from sparsec.api import calibrate as cal
from sparsec.base.resources import write_entry
from sparsec.base.target import C
from sparsec.policy import calibrated, decision
from sparsec.policy.machine import use

SPMV = "y(i) = A(i,j) * x(j)"


@pytest.fixture
def calibrating(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Calibration on, in a cache directory of its own, with background runs recorded
    instead of started."""
    monkeypatch.setenv("SPARSEC_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(calibrated.ENV, "1")
    started: list[Any] = []
    monkeypatch.setattr(calibrated, "start_background", lambda on=None: started.append(on))
    calibrated._cache.clear()
    yield started
    calibrated._cache.clear()


def fake_timer(times: dict[tuple[str, Any], float]) -> cal.Timer:
    """Seconds per option value (1.0 for a value not named), the same at every thread
    count; the probe's kernel is never built."""

    def timer(option: str, value: Any, threads: int, call: Any) -> float:
        return times.get((option, value), 1.0)

    return timer


def test_calibration_picks_the_fastest_value_and_stores_it(calibrating: list[Any]) -> None:
    times = {("stream_locality", None): 0.5, ("stream_locality", 0): 0.8}
    times[("tile.prefetch_distance", 12)] = 0.99  # within the margin: the default stays
    done = cal.calibrate(fake_timer(times), threads=(1, 2))
    assert done.chosen == {
        "stream_locality": None,
        "stream_lines": 2,
        "reassociate": False,
        "tile.prefetch_distance": 6,
        "costs.panel_min_bytes": 4 << 20,
        "costs.panel_min_reuse": 48,
        "costs.panel_fit": False,
        "costs.panels_in_sequence": False,
    }
    stored = calibrated.load()
    assert stored is not None and stored["options"] == done.chosen
    assert stored["measured"]["stream_locality"]["None"]["banded 2T"] == pytest.approx(500.0)
    assert calibrated.overrides() == done.chosen
    assert calibrating == []  # a calibration was found: nothing started


def test_a_value_must_lose_in_no_setting(calibrating: list[Any]) -> None:
    def timer(option: str, value: Any, threads: int, call: Any) -> float:
        if option == "stream_locality" and value == 0:
            return 0.2 if threads == 1 else 1.5  # faster alone, slower on both cores
        if option == "reassociate" and value:
            return 0.5 if threads == 1 else 1.0 + 1.5 * cal.TOLERANCE  # just past the tolerance
        return 1.0

    chosen = cal.calibrate(timer, threads=(1, 2), save=False).chosen
    assert chosen["stream_locality"] == 3 and chosen["reassociate"] is False


def test_a_value_that_wins_in_one_setting_and_loses_in_none_is_chosen(
    calibrating: list[Any],
) -> None:
    """The probe's settings are kernels the option may help: the fewer instructions of one
    cache line per prefetch pay where the gathers hit the cache and are even elsewhere."""
    labels: dict[int, str] = {}

    def timer(option: str, value: Any, threads: int, call: Any) -> float:
        if option != "stream_lines" or value != 1:
            return 1.0
        # the settings' calls are distinct objects; the second SpMV ("in cache") wins
        label = labels.setdefault(id(call), str(len(labels)))
        return 0.85 if label in ("2", "3") else 1.0 + cal.TOLERANCE / 2

    chosen = cal.calibrate(timer, threads=(1, 2), save=False).chosen
    assert chosen["stream_lines"] == 1


def test_a_noisy_round_does_not_decide(calibrating: list[Any]) -> None:
    """Ratios are paired by round and their median taken: a slow spell that ends between
    the default's block and the other value's in one round does not make that value win
    (pooled over the rounds, the default's lower quartile would be the spell's, the
    other's not)."""
    settings = 2 * len(cal._SPMVS)  # each SpMV at 1 and 2 threads
    per_round = settings * 2 * (1 + cal.PROBES[0].calls)  # 2 values, warm + timed
    calls = {"n": 0}

    def timer(option: str, value: Any, threads: int, call: Any) -> float:
        if option != "reassociate":
            return 1.0
        at = calls["n"] // per_round
        calls["n"] += 1
        slow = at < 4 if value is False else at < 3  # the spell ends inside round 4
        return (1.1 if slow else 1.0) * (1.0 if value is False else 1.01)

    assert cal.calibrate(timer, threads=(1, 2), save=False).chosen["reassociate"] is False


def test_decisions_use_the_stored_choice(calibrating: list[Any]) -> None:
    calibrated.save({"stream_locality": None, "tile.prefetch_distance": 0}, {})
    spec = sparsec.kernel(SPMV, formats={"A": "csr"}).spec
    passes = decision.decide(spec, C).passes
    assert passes.stream_locality is None and passes.tile.prefetch_distance == 0
    # names no other test uses: a memoized kernel keeps the source it generated first
    k = sparsec.kernel("calz(r) = Calb(r,c) * calw(c)", formats={"Calb": "csr"})
    assert "prefetched" not in k.source and "sc_prefetch_stream(Calb" not in k.source
    B = sparsec.Tensor.from_dense(np.array([[1.0, 0.0], [0.0, 0.0], [2.0, 3.0]]), "csr")
    np.testing.assert_allclose(k(Calb=B, calw=np.array([1.0, 2.0])), [1.0, 0.0, 8.0])
    with_hint = sparsec.kernel("calz(r) = Calb(r,c) * calw(c) * 2", formats={"Calb": "csr"})
    calibrated.save({"stream_locality": 0, "tile.prefetch_distance": 6}, {})
    assert "__builtin_prefetch((const void*)at, 0, 0)" in with_hint.source


@pytest.mark.parametrize(
    "damage",
    [
        "missing",
        "not json",
        "truncated",
        "version",
        "foreign",
        "unknown option",
        "bad value",
        "bad type",
    ],
)
def test_a_damaged_calibration_falls_back_to_the_defaults(
    calibrating: list[Any], damage: str
) -> None:
    good = {"stream_locality": None, "tile.prefetch_distance": 12}
    where = calibrated.save(good, {})
    assert calibrated.load() is not None
    payload = json.loads(calibrated.read_entry(where) or b"")
    if damage == "missing":
        where.unlink()
    elif damage == "not json":
        write_entry(where, b"{not json")
    elif damage == "truncated":
        where.write_bytes(where.read_bytes()[:-20])
    else:
        if damage == "version":
            payload["version"] = calibrated.VERSION + 1
        elif damage == "foreign":
            payload["key"] = "skylake-000000000000"
        elif damage == "unknown option":
            payload["options"]["prefetch_everything"] = True
        elif damage == "bad value":
            payload["options"]["stream_locality"] = 7
        else:  # false == 0, but a hint printed as False would not compile
            payload["options"]["stream_locality"] = False
        write_entry(where, json.dumps(payload).encode())
    calibrated._cache.clear()
    assert calibrated.load() is None and calibrated.overrides() == {}
    spec = sparsec.kernel(SPMV, formats={"A": "csr"}).spec
    # the machine's defaults (its facts, not a calibration's choices)
    assert decision.decide(spec, C).passes == replace(decision.defaults(), run=decision.C_PASSES)
    assert len(calibrating) == 1  # no usable file: a background calibration starts, once
    calibrated.overrides()
    assert len(calibrating) == 1


def test_off_means_the_defaults_and_nothing_started(
    calibrating: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    calibrated.save({"stream_locality": None, "tile.prefetch_distance": 6}, {})
    monkeypatch.setenv(calibrated.ENV, "0")
    assert calibrated.overrides() == {}
    spec = sparsec.kernel(SPMV, formats={"A": "csr"}).spec
    assert decision.decide(spec, C).passes.stream_locality == decision.DEFAULTS.stream_locality
    assert calibrating == []


def test_each_cpu_has_its_own_calibration(calibrating: list[Any]) -> None:
    calibrated.save({"stream_locality": 0, "tile.prefetch_distance": 6}, {})
    with use(target="sapphirerapids", flags=frozenset({"avx512f", "amx_tile"})):
        assert calibrated.load() is None  # another CPU: not this one's choice
        assert calibrated.overrides() == {}
    assert calibrated.overrides()["stream_locality"] == 0


def test_save_refuses_a_value_that_is_not_a_choice(calibrating: list[Any]) -> None:
    with pytest.raises(ValueError, match="not a calibrated choice"):
        calibrated.save({"stream_locality": 5}, {})


def test_the_probes_build_and_time_their_kernels(calibrating: list[Any]) -> None:
    """The real probes, each value built and called once per round on one thread (sizes
    from a small machine's facts, so this stays short)."""
    calls: list[tuple[str, Any]] = []

    def timer(option: str, value: Any, threads: int, call: Any) -> float:
        call()
        calls.append((option, value))
        return 1.0

    with use(core_cache=64 << 10):
        done = cal.calibrate(timer, threads=(1,), save=False)
    assert done.chosen == {name: values[0] for name, values in calibrated.CHOICES.items()}
    serial = {p.option for p in cal.PROBES if not p.parallel_only}
    assert serial and {p.option for p in cal.PROBES} == set(calibrated.CHOICES)
    wanted = {(n, v) for n, vs in calibrated.CHOICES.items() if n in serial for v in vs}
    assert {c for c in calls} == wanted  # an option of several threads: not timed on one


def test_a_reassociated_kernel_says_so_and_agrees(calibrating: list[Any]) -> None:
    """A kernel is generated under the calibration of its first use."""
    rng = np.random.default_rng(5)
    A = rng.integers(-3, 4, size=(300, 200)) * (rng.random((300, 200)) < 0.1)
    A[7] = 0
    x = rng.integers(-2, 3, size=200).astype(np.float64)
    with calibrated.trying({"reassociate": True}):
        k = sparsec.kernel("calr(r) = Calq(r,c) * calv(c)", formats={"Calq": "csr"})
        got = k(Calq=sparsec.Tensor.from_dense(A.astype(np.float64), "csr"), calv=x)
    assert k.generated().reassociate and "reassociates this kernel's sums" in k.source
    np.testing.assert_array_equal(got, A @ x)  # integers: exact in any order


def test_reassociation_is_a_build_flag_of_the_whole_unit(
    calibrating: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not a function attribute: GCC inlines no helper into a function whose optimize
    options differ from the helper's, and a register-tiled SpMM whose vector helpers
    stayed calls ran 2.4x slower (Intel Xeon VM). The unit is built with the flags."""
    from sparsec.runtime import build

    built: list[tuple[str, ...]] = []
    real = build.compile_cached

    def spy(source: str, language: str = "c", flags: tuple[str, ...] = ()) -> Any:
        built.append(flags)
        return real(source, language, flags)

    monkeypatch.setattr(build, "compile_cached", spy)
    rng = np.random.default_rng(6)
    W = rng.integers(-3, 4, size=(64, 48)) * (rng.random((64, 48)) < 0.3)
    X = rng.integers(-2, 3, size=(48, 40)).astype(np.float32)
    with calibrated.trying({"reassociate": True}):
        k = sparsec.kernel("calY(o,t) = calW(o,i) * calX(i,t)", formats={"calW": "csr"})
        got = k(calW=sparsec.Tensor.from_dense(W.astype(np.float32), "csr"), calX=X)
    assert "register tiles" in k.source  # a tiled kernel, with vector helpers
    assert "associative" not in k.source.replace("-fassociative-math", "")  # no attribute
    assert build.REASSOCIATE_FLAGS in built
    np.testing.assert_array_equal(got, W @ X)


def test_the_command_line_shows_the_stored_calibration(
    calibrating: list[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    from sparsec.cli import main

    assert main(["tune", "--show"]) == 1
    assert "no calibration for this CPU" in capsys.readouterr().out
    calibrated.save({"stream_locality": 0, "tile.prefetch_distance": 6}, {"x": {}})
    assert main(["tune", "--show"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["options"] == {"stream_locality": 0, "tile.prefetch_distance": 6}
    assert shown["key"] == calibrated.key()


def test_a_calibrated_threshold_steers_the_runtime(calibrating: list[Any]) -> None:
    """A cost model's calibrated threshold takes its constant's place (panels for a dense
    operand of 2 MB, under the default 4 MB), and a call in panels computes the same."""
    from sparsec.policy import costs

    rng = np.random.default_rng(3)
    W = rng.random((256, 512)) * (rng.random((256, 512)) < 0.5)
    X = rng.random((512, 1024))
    values = {"W": sparsec.Tensor.from_dense(W, "csr"), "X": X}
    k = sparsec.kernel("calY(o,t) = W(o,i) * X(i,t)", formats={"W": "csr"})
    columns = k.executable("float64", "int32").columns
    dims = {"o": 256, "i": 512, "t": 1024}
    assert columns.width(dims, values) == 0  # 4 MB of X needed by default
    calibrated.save({"costs.panel_min_bytes": 1 << 20}, {})
    assert columns.width(dims, values) == costs.PANEL_COLUMNS
    np.testing.assert_allclose(k(**values), W @ X)
    with calibrated.trying({}):  # a block without calibration: the constant again
        assert columns.width(dims, values) == 0


def test_panels_narrow_to_fit_the_core_cache_where_calibrated(calibrating: list[Any]) -> None:
    """``costs.panel_fit``: a panel of X halves while it outgrows the core's cache (down to
    PANEL_MIN_WIDTH); without it every panel is PANEL_COLUMNS wide. Either way the call
    computes the same."""
    from sparsec.policy import costs

    rng = np.random.default_rng(4)
    k = sparsec.kernel("calP(o,t) = W(o,i) * X(i,t)", formats={"W": "csr"})
    columns = k.executable("float32", "int32").columns
    W = (rng.random((256, 600)) * (rng.random((256, 600)) < 0.5)).astype(np.float32)
    X = rng.random((600, 1024)).astype(np.float32)  # a 128-column panel: 300 KB
    values = {"W": sparsec.Tensor.from_dense(W, "csr"), "X": X}
    dims = {"o": 256, "i": 600, "t": 1024}
    on = {"costs.panel_min_bytes": 0}
    with use(core_cache=256 << 10):
        with calibrated.trying(on):
            assert columns.width(dims, values) == costs.PANEL_COLUMNS
        with calibrated.trying({**on, "costs.panel_fit": True}):
            assert columns.width(dims, values) == 64  # 150 KB fits, 300 KB did not
            np.testing.assert_allclose(k(**values), W @ X, rtol=1e-5)
    with use(core_cache=64 << 10), calibrated.trying({**on, "costs.panel_fit": True}):
        assert columns.width(dims, values) == costs.PANEL_MIN_WIDTH  # never narrower
    with use(core_cache=1 << 20), calibrated.trying({**on, "costs.panel_fit": True}):
        assert columns.width(dims, values) == costs.PANEL_COLUMNS  # fits whole


def test_panels_in_sequence_where_calibrated(calibrating: list[Any]) -> None:
    """``costs.panels_in_sequence``: a 2-thread call's panels run one after another on
    both threads instead of on two workers; the result is the same, element for element."""
    from sparsec.runtime import executable as runtime

    rng = np.random.default_rng(8)
    W = (rng.random((256, 600)) * (rng.random((256, 600)) < 0.5)).astype(np.float32)
    X = rng.random((600, 1024)).astype(np.float32)
    values = {"W": sparsec.Tensor.from_dense(W, "csr"), "X": X}
    k = sparsec.kernel("calS(o,t) = W(o,i) * X(i,t)", formats={"W": "csr"})
    pools: list[int] = []
    real = runtime.ThreadPoolExecutor
    driver = runtime.panels_fn()

    def counted(workers: int, **kw: Any) -> Any:
        pools.append(workers)
        return real(workers, **kw)

    def driven(*args: Any) -> Any:
        if args[11] == 128:  # the full panels' call: its workers
            pools.append(args[14])
        return driver(*args)

    with pytest.MonkeyPatch.context() as m:
        # the workers of the panels in Python, or of the compiled driver's team
        m.setattr(runtime, "ThreadPoolExecutor", counted)
        m.setattr(runtime, "panels_fn", lambda: driven)
        with calibrated.trying({"costs.panel_min_bytes": 0}):
            shared = k(**values, threads=2)
        assert pools == [2]
        with calibrated.trying({"costs.panel_min_bytes": 0, "costs.panels_in_sequence": True}):
            in_turn = k(**values, threads=2)
        assert pools in ([2], [2, 1])  # no workers the second time (or a team of one)
    np.testing.assert_array_equal(shared, in_turn)
    np.testing.assert_allclose(in_turn, W @ X, rtol=1e-5)
