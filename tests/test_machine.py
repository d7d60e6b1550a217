"""The machine's facts (`sparsec.policy.machine`): read in one place, overridable by
``SPARSEC_MACHINE`` and `use`; the cost models' tests hold on every simulated machine, and
their decisions follow its caches the way the models say; a default call's threads follow
the load."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import test_bands as bands_tests
import test_panels as panels_tests
import test_tile as tile_tests
from conftest import MEASURED_ON, SIMULATED, machine_id, pruned_csr

import sparsec
from sparsec.base.errors import MachineError, SparsecError
from sparsec.policy import machine as M
from sparsec.policy.machine import LoadMeter, Machine, host, machine, parse, threads_for, use
from sparsec.runtime import binding

COSTS = sys.modules["sparsec.policy.costs"]
#: the modules whose calls resolve a call's threads: the general path and the fast path
CALL_PATHS = (sys.modules["sparsec.runtime.executable"], sys.modules["sparsec.runtime.fastpath"])
SPMM = "C(i,j) = W(i,k) * X(k,j)"
REPO = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------ the facts, one place


def test_the_host_is_read_once_and_sane():
    facts = host()
    assert facts is host()
    assert facts.core_cache >= 64 << 10 and facts.last_level_cache >= facts.core_cache
    assert facts.cores >= 1 and facts.vector_bytes in (16, 32, 64)
    assert facts.busy is None and facts.target


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("l2=1M,l3=32M,cores=16,vector=64", {"core_cache": 1 << 20, "last_level_cache": 32 << 20, "cores": 16, "vector_bytes": 64}),
        (" l2 = 256K , llc=8MiB ", {"core_cache": 256 << 10, "last_level_cache": 8 << 20}),
        ("L2=524288,vector=avx2", {"core_cache": 512 << 10, "vector_bytes": 32}),
        ("flags=avx+avx512f,target=skylake-avx512", {"flags": frozenset({"avx", "avx512f"}), "target": "skylake-avx512"}),
        ("busy=1.5", {"busy": 1.5}),
        ("l1way=8K", {"l1_way": 8 << 10}),
        ("", {}),
    ],
)  # fmt: skip
def test_machine_text_names_facts_over_a_base(text, want):
    got = parse(text, MEASURED_ON)
    assert got == dataclasses.replace(MEASURED_ON, **want)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("l2", "key=value"),
        ("l4=8M", "key=value"),
        ("l2=big", "K, M or G"),
        ("cores=2K", "whole number"),
        ("cores=0", "positive"),
        ("l1way=0", "positive"),
        ("vector=-1", "whole number"),
        ("busy=lots", "number of cores"),
        ("busy=-1", ">= 0"),
    ],
)
def test_malformed_machine_text_says_what_to_write(text, says):
    with pytest.raises(MachineError, match=says) as err:
        parse(text, MEASURED_ON)
    assert isinstance(err.value, SparsecError)


def test_use_overrides_nests_and_restores():
    before = machine()
    with use(MEASURED_ON) as outer:
        assert machine() is outer == MEASURED_ON
        with use(core_cache=2 << 20) as inner:
            assert machine() is inner
            assert inner == dataclasses.replace(MEASURED_ON, core_cache=2 << 20)
        with use("l3=32M,cores=16") as text:
            assert (text.last_level_cache, text.cores, text.core_cache) == (32 << 20, 16, 512 << 10)
        assert machine() is outer
    assert machine() == before
    with pytest.raises(MachineError, match="unknown machine facts"):
        with use(l2=1):
            pass
    assert machine() == before


def _in_a_process(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, **env},
        check=False,
    )


def test_the_environment_sets_the_machine_of_a_whole_process():
    code = (
        "from sparsec.policy.machine import machine, host\n"
        "import sparsec\n"
        "m = machine()\n"
        "print(m.core_cache, m.last_level_cache, m.cores, m.vector_bytes, m.target == host().target)\n"
        "k = sparsec.Kernel('C(i,j) = W(i,k) * X(k,j)', {'W': 'csr'})\n"
        "print('(int64_t)8388608 /' in k.generated('float32').source)\n"
    )
    done = _in_a_process(code, SPARSEC_MACHINE="l2=256K,l3=8M,cores=3,vector=32")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["262144", "8388608", "3", "32", "True", "True"]
    bad = _in_a_process(code, SPARSEC_MACHINE="l2=lots")
    assert bad.returncode != 0 and "MachineError" in bad.stderr and "SPARSEC_MACHINE" in bad.stderr


# ------------------------------------------------------- cost models on simulated machines


@pytest.mark.parametrize("m", SIMULATED, ids=machine_id)
def test_the_cost_model_tests_hold_on_every_simulated_machine(m):
    """The tests of the cost models name the machine they were measured on, so they hold
    whatever the machine (here: each simulated one)."""
    with use(m):
        _cost_model_tests()


def _cost_model_tests() -> None:
    bands_tests.test_when_bands_pay()
    bands_tests.test_when_depth_blocks_pay()
    bands_tests.test_bands_are_asked_for_only_with_a_panel_index()
    bands_tests.test_depth_blocks_are_asked_for_only_below_the_panel_columns()
    panels_tests.test_when_panels_pay()
    tile_tests.test_dense_outputs_store_their_tiles_through_the_streaming_store()


def _spmm_case(rows, inner, density, columns):
    x = np.empty((inner, columns), np.float32)
    return columns, ("X",), {"W": pruned_csr(rows, inner, density), "X": x}, rows * columns


def test_decisions_follow_the_simulated_machine(simulated_machine):
    """What each model says of a machine, on that machine: depth blocks hold
    DEPTH_BLOCK_FRACTION of the core's cache, panels ask for less reuse once the dense
    operands outgrow the last-level cache, bands and the vector width change nothing the
    models weigh, and the generated code streams its output from the last-level cache's
    size."""
    m = simulated_machine
    deep = _spmm_case(768, 3072, 0.2, 512)  # X: 6 MB of 2 KB rows, 1 GB gathered
    rows = max(COSTS.DEPTH_MIN_ROWS, int(m.core_cache * COSTS.DEPTH_BLOCK_FRACTION) // 2048)
    assert COSTS.depth_rows(*deep) == COSTS.depth_rows(*deep, on=m) == rows
    # from 12 MB of X: beyond an 8 MB cache (10 bytes gathered per byte moved suffice),
    # within a 32 MB one (48 needed); this case gathers about 15 per byte moved
    wide = _spmm_case(768, 1536, 0.1, 2048)
    assert COSTS.panels_pay(*wide) == (m.last_level_cache < 12 << 20)
    for case in (_spmm_case(384, 1536, 0.02, 2048), _spmm_case(3072, 768, 0.02, 2048)):
        here = COSTS.bands_pay(*case)
        with use(MEASURED_ON):
            assert COSTS.bands_pay(*case) == here  # weighs no fact of the machine
    other = dataclasses.replace(m, vector_bytes=96 - m.vector_bytes)
    assert COSTS.depth_rows(*deep, on=other) == rows
    assert COSTS.panels_pay(*wide, on=other) == COSTS.panels_pay(*wide)
    source = sparsec.Kernel(SPMM, {"W": "csr"}).generated("float32").source
    assert f"((int64_t){m.last_level_cache} / (int64_t)sizeof(sc_val_t))" in source
    assert binding.configured_threads() == (binding._omp_num_threads() or m.cores)


def test_depth_blocks_scale_with_the_core_cache():
    deep = _spmm_case(768, 3072, 0.2, 512)
    by_l2 = {m.core_cache: COSTS.depth_rows(*deep, on=m) for m in SIMULATED if m.vector_bytes == 32}
    assert by_l2 == {256 << 10: 256, 512 << 10: 512, 1 << 20: 1024, 2 << 20: 2048}


@pytest.mark.slow
@pytest.mark.parametrize("m", SIMULATED[::5], ids=machine_id)
def test_cost_model_files_pass_under_the_environment(m):
    """``SPARSEC_MACHINE`` for a whole pytest run, as ``make test`` would set it."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
         "tests/test_bands.py", "tests/test_panels.py", "tests/test_tile.py",
         "-k", "pay or asked or last_level or streaming_store"],
        capture_output=True, text=True, timeout=600, cwd=REPO, check=False,
        env={**os.environ, "SPARSEC_MACHINE": machine_id(m)},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:]


@pytest.mark.slow
def test_the_contention_bench_runs():
    done = subprocess.run(
        [sys.executable, "-m", "bench", "contention", "--quick", "--busy", "1"],
        capture_output=True, text=True, timeout=600, cwd=REPO, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "quiet" in done.stdout and "1 busy" in done.stdout and "default / 1" in done.stdout


# ------------------------------------------------------------------ threads and the load


@pytest.mark.parametrize(
    ("configured", "cores", "busy", "want"),
    [
        (2, 2, 0.0, 2),  # quiet: every thread
        (2, 2, 0.4, 2),  # background noise
        (2, 2, 0.6, 1),  # a core taken: one thread, never two on one free core
        (2, 2, 1.0, 1),
        (2, 2, 2.7, 1),  # more busy than cores: still one
        (16, 16, 4.2, 12),
        (8, 16, 4.2, 8),  # OMP_NUM_THREADS=8 fits the free cores
        (32, 16, 0.0, 32),  # an oversubscribing OMP_NUM_THREADS is kept on a quiet machine
        (32, 16, 1.0, 15),
    ],
)
def test_a_default_call_leaves_the_busy_cores_alone(configured, cores, busy, want):
    assert threads_for(configured, cores, busy) == want


def test_default_threads_follow_the_machine_and_its_load(monkeypatch):
    monkeypatch.setattr(binding, "_omp_num_threads", lambda: None)
    monkeypatch.setattr(binding, "_omp_dynamic_off", lambda: False)
    with use(MEASURED_ON, cores=4, busy=0.0):
        assert binding.default_threads() == binding.resolve_threads(None) == 4
        assert binding.resolve_threads(3) == 3  # an explicit count is kept
        with use(busy=2.6):
            assert binding.default_threads() == 1
        with use(busy=1.0):
            assert binding.default_threads() == 3
        assert binding.default_threads() == 4
    monkeypatch.setattr(binding, "_omp_dynamic_off", lambda: True)
    with use(MEASURED_ON, cores=4, busy=2.6):
        assert binding.default_threads() == 4  # OMP_DYNAMIC=false: no adaptation


def test_a_default_call_on_a_busy_machine_runs_one_thread(monkeypatch):
    """A default call's thread count (general path and fast path alike) follows the
    load: one thread beside a busy core of two, both on a quiet machine."""
    monkeypatch.setattr(binding, "_omp_num_threads", lambda: None)
    monkeypatch.setattr(binding, "_omp_dynamic_off", lambda: False)
    k = sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": "csr"})
    a = sparsec.random((50, 40), 0.2, "csr", seed=3)
    x = np.arange(40.0)
    want = a.to_scipy() @ x
    seen: list[int] = []
    real = binding.resolve_threads

    def spy(threads):
        seen.append(real(threads))
        return seen[-1]

    for module in CALL_PATHS:
        monkeypatch.setattr(module, "resolve_threads", spy)
    for load, threads in ((1.0, 1), (0.0, 2), (1.0, 1)):
        seen.clear()
        with use(MEASURED_ON, cores=2, busy=load):
            for _ in range(3):  # the first call takes the general path, then the fast one
                np.testing.assert_allclose(k(A=a, x=x), want, rtol=1e-12)
        assert seen and set(seen) == {threads}


class _FakeHost:
    """A clock, a process CPU clock and /proc/stat counters for `LoadMeter`."""

    def __init__(self, cpus: int) -> None:
        self.now, self.own, self.busy, self.total, self.cpus = 0.0, 0.0, 0, 0, cpus

    def advance(self, seconds: float, others: float, ours: float) -> None:
        """``seconds`` pass with ``others`` cores busy elsewhere and ``ours`` here."""
        ticks = 100 * seconds
        self.now += seconds
        self.own += ours * seconds
        self.busy += round((others + ours) * ticks)
        self.total += round(self.cpus * ticks)

    def meter(self) -> LoadMeter:
        return LoadMeter(lambda cpus: (self.busy, self.total), lambda: self.now, lambda: self.own)


def test_the_load_meter_counts_other_work_not_ours(monkeypatch):
    monkeypatch.setattr(M, "_cpus", lambda: frozenset({0, 1}))
    fake = _FakeHost(2)
    meter = fake.meter()
    assert meter.busy() == 0.0  # no window yet: a quiet machine
    fake.advance(0.05, others=1.0, ours=1.0)
    assert meter.busy() == 0.0  # under LOAD_INTERVAL_S: not read again
    fake.advance(0.1, others=1.0, ours=1.0)
    assert meter.busy() == pytest.approx(0.5)  # half of the newest window: 1 busy core
    fake.advance(0.2, others=1.0, ours=1.0)
    assert meter.busy() == pytest.approx(0.75)
    fake.advance(0.2, others=0.0, ours=2.0)  # our own threads (spinning ones too) do not count
    assert meter.busy() == pytest.approx(0.375)
    for _ in range(6):
        fake.advance(0.2, others=0.0, ours=0.5)
        meter.busy()
    assert meter.busy() < 0.01


def test_two_adapting_processes_share_the_cores():
    """Each sees the other's threads as busy cores; the averaged estimate makes them settle
    on a share instead of taking turns with all the cores."""
    cores, a, b = 16, 16.0, 16.0
    seen_a = seen_b = 0.0
    for _ in range(12):
        seen_a = M.LOAD_WEIGHT * b + (1 - M.LOAD_WEIGHT) * seen_a
        seen_b = M.LOAD_WEIGHT * a + (1 - M.LOAD_WEIGHT) * seen_b
        a, b = threads_for(cores, cores, seen_a), threads_for(cores, cores, seen_b)
    assert a + b <= cores + 1 and min(a, b) >= cores // 2 - 1


def test_the_load_reads_proc_stat_of_our_cpus():
    reading = M._read_stat(frozenset(range(os.cpu_count() or 1)))
    if not Path("/proc/stat").exists():
        assert reading is None
        return
    assert reading is not None and 0 <= reading[0] <= reading[1]
    assert M._read_stat(frozenset({10_000})) is None


# --------------------------------------------------------------------------- the demo


def test_the_demo_times_the_default_call_and_says_how_busy_the_machine_was():
    """Issue 36 item 21: the second column forced every configured thread (18-30 ms against
    0.8 ms on one, "0.026x", on a busy machine); it times the default (adaptive) call now,
    with the threads it took, and a line says whether the machine was busy."""
    from sparsec.demo import load_note, table

    ok = type("Verdict", (), {"max_abs_error": 0.0})()
    text = table([("SpMV", "A:csr", ok, 0.5, 25.0, "1-2", "scipy", 1.0)])
    head, _, row = text.splitlines()
    assert "speedup 1" in head and "speedup default" in head and "threads" in head
    assert row.split()[-2:] == ["2.0x", "0.04x"]  # below 1x: two digits, not "0.0x"
    assert "1-2" in row.split()
    assert "quiet" in load_note(0.1, 2, 2)
    note = load_note(1.4, 2, 2)
    assert "busy" in note and "1.4 of its 2 cores" in note and "threads=N" in note


def test_machine_of_the_memo_key():
    """A kernel made for one machine is not handed out for another (its code holds the
    machine's last-level cache)."""
    expr = "y(i) = A(i,j) * x(j)"
    with use(MEASURED_ON):
        k = sparsec.kernel(expr, {"A": "csr"})
        assert sparsec.kernel(expr, {"A": "csr"}) is k
    with use(MEASURED_ON, last_level_cache=32 << 20):
        assert sparsec.kernel(expr, {"A": "csr"}) is not k


def test_machine_type_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        MEASURED_ON.cores = 3  # type: ignore[misc]
    assert isinstance(MEASURED_ON, Machine)
