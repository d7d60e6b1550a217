"""Shared benchmark machinery: timing, baseline thread control, tables, JSON results.

Timing contract: ``warmup`` untimed calls, then ``repeats`` (>= 10) calls each timed alone
with ``time.perf_counter``; a `Timing` keeps every sample and reports median/min/max in ms.
Speedups are always ``baseline_median / sparsec_median`` (> 1: sparsec is faster).

Baselines run with an explicit thread count: torch through ``torch.set_num_threads``,
scipy.sparse is single-threaded by construction. Each library is timed in its own block
(all sparsec runs, then scipy, then torch) so one OpenMP runtime's spinning workers do not
steal the cores of another's timed region on a small machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"
MIN_REPEATS = 10


@dataclass(frozen=True, slots=True)
class Timing:
    """Wall-clock samples of one callable, in milliseconds."""

    samples_ms: tuple[float, ...]
    warmup: int

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples_ms)

    @property
    def min_ms(self) -> float:
        return min(self.samples_ms)

    @property
    def max_ms(self) -> float:
        return max(self.samples_ms)

    def summary(self) -> dict[str, Any]:
        return {
            "median_ms": self.median_ms,
            "min_ms": self.min_ms,
            "max_ms": self.max_ms,
            "runs": len(self.samples_ms),
            "warmup": self.warmup,
            "samples_ms": list(self.samples_ms),
        }


#: seconds to wait before each contender. torch and MKL bring their own OpenMP runtimes,
#: whose idle workers keep spinning after each call (libgomp's GOMP_SPINCOUNT, Intel's
#: KMP_BLOCKTIME of 200 ms); timed right after them, a kernel on the same two cores loses
#: up to half its speed (SpMV at 2 threads: 1.0 ms alone, 1.7 ms right after torch)
SETTLE_S = 0.3


def settle(on: bool) -> None:
    """Wait `SETTLE_S` before each contender and fill each block of `measure_rounds` to
    `BLOCK_MIN_S` of timed calls (full runs), or not (``--quick`` smoke runs, whose
    timings are not read)."""
    global SETTLE_S, BLOCK_MIN_S
    SETTLE_S = 0.3 if on else 0.0
    BLOCK_MIN_S = 0.05 if on else 0.0


def measure(
    fn: Callable[[], Any],
    *,
    warmup: int = 3,
    repeats: int = 20,
    floor: int = MIN_REPEATS,
    min_seconds: float = 0.0,
) -> Timing:
    """Time ``fn()``: after `SETTLE_S` of quiet, ``warmup`` untimed calls, then
    ``max(repeats, floor)`` timed ones (`measure_rounds` asks for fewer per block), and
    more while the timed calls have taken less than ``min_seconds`` in all (at most
    `MOST_PER_BLOCK`)."""
    if SETTLE_S:
        time.sleep(SETTLE_S)
    for _ in range(warmup):
        fn()
    samples: list[float] = []
    least = max(repeats, floor)
    spent = 0.0
    while len(samples) < least or (spent < min_seconds and len(samples) < MOST_PER_BLOCK):
        start = time.perf_counter()
        fn()
        took = time.perf_counter() - start
        spent += took
        samples.append(took * 1e3)
    return Timing(tuple(samples), warmup)


#: rounds of `measure_rounds`: the machine this suite is tuned on is a shared VM whose
#: speed drops for seconds at a time; a contender timed in one block can land wholly in
#: such a spell, one timed in three blocks spread over the case cannot
ROUNDS = 3
#: timed seconds each block of `measure_rounds` fills at least: a call of 50 us gets 200
#: samples per block instead of 4, so the median of a short call is not four draws of
#: the VM's noise; calls of 15 ms and more are unaffected
BLOCK_MIN_S = 0.05
MOST_PER_BLOCK = 200


def measure_rounds(
    fns: Mapping[str, Callable[[], Any]],
    *,
    warmup: int = 2,
    repeats: int = 10,
    scopes: Mapping[str, Callable[[], contextlib.AbstractContextManager[Any]]] | None = None,
) -> dict[str, Timing]:
    """Time every contender of ``fns`` in `ROUNDS` rounds: each round runs each contender
    in its own block (after `SETTLE_S`, ``warmup`` untimed calls, then its share of the
    ``max(repeats, 10)`` timed calls, and more until the block has timed `BLOCK_MIN_S`),
    inside ``scopes[name]()`` when given (torch's
    thread count, say). The median of the pooled samples is robust to a slow spell that
    hits one block, and no contender's samples all come from one moment."""
    total = max(repeats, MIN_REPEATS)
    share = -(-total // ROUNDS)
    samples: dict[str, list[float]] = {name: [] for name in fns}
    scopes = scopes or {}
    for _ in range(ROUNDS):
        for name, fn in fns.items():
            with scopes.get(name, contextlib.nullcontext)():
                timing = measure(fn, warmup=warmup, repeats=share, floor=1, min_seconds=BLOCK_MIN_S)
            samples[name].extend(timing.samples_ms)
    return {name: Timing(tuple(got), warmup) for name, got in samples.items()}


# --------------------------------------------------------------------------- threads


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run the body with ``torch.set_num_threads(n)``; restore the previous count after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def threadpool_info() -> list[dict[str, Any]] | None:
    """threadpoolctl's view of the loaded BLAS/OpenMP pools, or None when not installed."""
    try:
        import threadpoolctl
    except ImportError:
        return None
    return threadpoolctl.threadpool_info()


def environment() -> dict[str, Any]:
    """Versions and machine facts recorded next to every result."""
    import numpy
    import scipy

    env: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "numpy": numpy.__version__,
        "scipy": scipy.__version__,
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "SPARSEC_CFLAGS": os.environ.get("SPARSEC_CFLAGS"),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    try:
        import torch

        env["torch"] = torch.__version__
        env["torch_default_threads"] = torch.get_num_threads()
        env["torch_parallel_info"] = torch.__config__.parallel_info()
    except ImportError:
        env["torch"] = None
    try:
        from sparsec.policy.machine import machine

        facts = machine()
        env["sparsec_machine"] = {
            "core_cache": facts.core_cache,
            "last_level_cache": facts.last_level_cache,
            "cores": facts.cores,
            "vector_bytes": facts.vector_bytes,
            "target": facts.target,
            "l1_way": facts.l1_way,
            "l1_data": facts.l1_data,
        }
    except Exception as err:  # record, never fail a benchmark over metadata
        env["sparsec_machine"] = f"unknown ({err})"
    try:
        from sparsec.runtime import build as runtime

        tc = runtime.toolchain()
        env["sparsec_cc"] = " ".join(tc.cc)
        env["sparsec_flags"] = " ".join(tc.flags)
        env["sparsec_cc_version"] = tc.identity.splitlines()[1] if "\n" in tc.identity else ""
    except Exception as err:  # record, never fail a benchmark over metadata
        env["sparsec_cc"] = f"unknown ({err})"
    info = threadpool_info()
    if info is not None:
        env["threadpoolctl"] = info
    env["sparsec_calibration"] = calibration()
    return env


def calibration() -> str:
    """The pass options sparsec's kernels use on this host: the stored calibration's
    choices, or the defaults (calibration off or none stored)."""
    try:
        from sparsec.policy import calibrated

        if not calibrated.enabled():
            return "defaults (SPARSEC_TUNE=0)"
        found = calibrated.load()
        if found is None:
            return "defaults (no calibration stored for this CPU)"
        chosen = ", ".join(f"{k}={v!r}" for k, v in sorted(found["options"].items()))
        return f"calibrated {found['made']}: {chosen}"
    except Exception as err:  # record, never fail a benchmark over metadata
        return f"unknown ({err})"


def calibrate_first() -> None:
    """Calibrate this host now where calibration is on and none is stored, so no
    background calibration (`sparsec.policy.calibrated`) runs beside the timings."""
    from sparsec.api.calibrate import calibrate_first as ensure

    ensure(say=lambda line: print(f"[calibrate] {line}", file=sys.stderr))


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


# --------------------------------------------------------------------------- output


def graphblas() -> Any | None:
    """python-graphblas, or None after saying that it is not installed (a suite against it
    then has nothing to time)."""
    try:
        import graphblas as gb
    except ImportError:
        print("python-graphblas is not installed (pip install python-graphblas): nothing to time")
        return None
    return gb


def progress(message: str) -> None:
    """One progress line on stderr (stdout stays the report)."""
    print(f"[bench] {message}", file=sys.stderr, flush=True)


@dataclass
class Table:
    """A plain-text table: a header row, then rows of already formatted cells."""

    columns: Sequence[str]
    rows: list[Sequence[str]] = field(default_factory=list)

    def add(self, *cells: Any) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"row has {len(cells)} cells, table has {len(self.columns)} columns")
        self.rows.append([_cell(c) for c in cells])

    def render(self) -> str:
        widths = [len(c) for c in self.columns]
        for row in self.rows:
            widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]

        # First column left-aligned (names), the rest right-aligned (numbers).
        def line(cells: Sequence[str]) -> str:
            parts = [
                c.ljust(w) if i == 0 or not _numeric(c) else c.rjust(w)
                for i, (c, w) in enumerate(zip(cells, widths, strict=True))
            ]
            return "  ".join(parts).rstrip()

        rule = "  ".join("-" * w for w in widths)
        return "\n".join([line(list(self.columns)), rule, *(line(r) for r in self.rows)])


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value >= 100:
            return f"{value:.1f}"
        if value >= 1:
            return f"{value:.2f}"
        return f"{value:.3f}"
    return str(value)


def _numeric(cell: str) -> bool:
    return cell == "-" or cell.rstrip("x%").replace(".", "", 1).isdigit()


def write_results(name: str, payload: dict[str, Any]) -> Path:
    """Write ``payload`` to ``bench/results/<name>.json`` (directory created); return the path."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=_jsonable) + "\n")
    os.replace(tmp, path)
    return path


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, Timing):
        return obj.summary()
    if hasattr(obj, "__dataclass_fields__"):
        return asdict(obj)
    if hasattr(obj, "tolist"):
        return obj.tolist()
    return str(obj)


# --------------------------------------------------------------------------- records


@dataclass(frozen=True, slots=True)
class Contender:
    """One implementation of a case at one thread count; ``run()`` returns its result."""

    impl: str
    threads: int
    run: Callable[[], Any]
    uses_torch: bool = False


@dataclass
class Row:
    impl: str
    threads: int
    timing: Timing
    #: effective bandwidth, for memory-bound cases that state their traffic
    gbps: float | None = None


@dataclass
class CaseResult:
    name: str
    detail: str
    params: dict[str, Any]
    rows: list[Row] = field(default_factory=list)
    #: compulsory bytes moved, where a roofline applies
    traffic_bytes: int | None = None

    def median(self, impl: str, threads: int) -> float | None:
        for r in self.rows:
            if r.impl == impl and r.threads == threads:
                return r.timing.median_ms
        return None
