"""Host calibration: short measurements that choose, on this CPU, the pass options whose
best value differs between CPUs (`policy.calibrated.CHOICES`), as FFTW's wisdom and
OpenBLAS's per-core kernels do. ``sparsec tune`` runs it (and a process starts it in the
background on a host that has none); the choices are stored per CPU and read by every C
kernel's decision.

Each option has a probe: kernels whose speed that option decides, on data sized past the
core's cache, built once for each of the option's values (all else the defaults) and
timed in interleaved rounds at one thread and at every core. A value other than the
default is chosen only when it is at least `MARGIN` faster in every setting (each probe
kernel at each thread count: a stream hint that helps random rows must not hurt a band),
then the fastest by the geometric mean of its ratios to the default, so noise keeps the
safe default; a value's time is the lower quartile of its calls (other work only adds
time). The whole is sized to take a few seconds, most of them compiling (the issue's
budget is half a minute).

Probes:

- ``stream_locality``: CSR SpMV, float64, rows of 10 entries on average (Poisson), and a
  banded matrix of 5 diagonals, each past the core's cache: the stream prefetches' hint,
  or none.
- ``reassociate``: the same SpMV with its row sums reordered by the compiler (in vector
  lanes) or in order.
- ``tile.prefetch_distance``: CSR SpMM, float32, a pruned weight's rows over a dense
  operand past the core's cache (the register tiles' gathered rows): how far ahead, or
  no prefetch.
- ``costs.panel_fit``: whole calls of such an SpMM in panels, its weight 50 % pruned and a
  128-column panel of its dense operand 1.5 times the core's cache: panels of 128
  columns, or narrowed until they fit that cache (`policy.costs.panel_columns`).
- ``costs.panel_min_bytes``: whole calls of a float32 SpMM with 1024 columns whose dense
  operand is 1.5 times the core's cache: from what size of the dense operands a call
  runs in packed column panels (`policy.costs.panels_pay`). On a CPU whose shared cache
  feeds the gathers well, whole rows win; where it does not, panels do.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..policy import calibrated
from ..policy.decision import DEFAULTS, PassOptions, with_options
from ..policy.machine import machine

#: a value replaces the default only when this much faster at every thread count
MARGIN = 0.03
#: interleaved rounds per probe
ROUNDS = 5

#: builds the probe's call for one value of its option (``{option: value}``) and a thread
#: count (compiles; called once per value)
Build = Callable[[dict[str, Any], int], Callable[[], object]]
#: ``timer(option, value, threads, call)``: seconds of one timed call (the real timer calls
#: ``call()``; a test's fake returns a number of its choosing)
Timer = Callable[[str, Any, int, Callable[[], object]], float]


@dataclass(frozen=True)
class Probe:
    """Kernels whose speed ``option`` decides, and how to build each one's call (by its
    label): a value must win on every one of them."""

    option: str
    about: str
    builds: tuple[tuple[str, Build], ...]
    #: timed calls per value, setting and round (fewer for a long probe call)
    calls: int = 7


def _spmv(changes: dict[str, Any], threads: int) -> Callable[[], object]:
    m = machine()
    n = max(200_000, 4 * m.core_cache // 12)  # past the core's cache (12 bytes an entry)
    rng = np.random.default_rng(7)
    lengths = np.minimum(rng.poisson(10, n), 24)
    pos = np.concatenate([[0], np.cumsum(lengths)])
    crd = np.sort(rng.integers(0, n - 24, size=(n, 24)), axis=1) + np.arange(24)  # distinct
    crd = crd[np.arange(24) < lengths[:, None]]  # each row's first columns, in order
    A = (pos, crd, rng.random(len(crd)), (n, n))
    options = with_options(DEFAULTS, changes)
    return _call("y(i) = A(i,j) * x(j)", {"A": A, "x": rng.random(n)}, options, threads)


def _banded(changes: dict[str, Any], threads: int) -> Callable[[], object]:
    m = machine()
    n = max(400_000, 4 * m.core_cache // 12 // 5 * 5)  # 5 entries a row, past the cache
    rng = np.random.default_rng(9)
    offsets = np.arange(-2, 3)
    cols = np.arange(n)[:, None] + offsets
    keep = (cols >= 0) & (cols < n)
    pos = np.concatenate([[0], np.cumsum(keep.sum(axis=1))])
    A = (pos, cols[keep], rng.random(int(pos[-1])), (n, n))
    options = with_options(DEFAULTS, changes)
    return _call("y(i) = A(i,j) * x(j)", {"A": A, "x": rng.random(n)}, options, threads)


def _spmm(changes: dict[str, Any], threads: int) -> Callable[[], object]:
    m = machine()
    rows, inner = 512, 4096
    width = max(64, min(512, 4 * m.core_cache // (inner * 4)))  # X past the core's cache
    rng = np.random.default_rng(11)
    keep = rng.random((rows, inner)) < 0.05
    lengths = keep.sum(axis=1)
    pos = np.concatenate([[0], np.cumsum(lengths)])
    crd = np.nonzero(keep)[1]
    W = (pos, crd, rng.random(len(crd)).astype(np.float32), (rows, inner))
    X = rng.random((inner, width)).astype(np.float32)
    options = with_options(DEFAULTS, changes)
    return _call("Y(o,t) = W(o,i) * X(i,t)", {"W": W, "X": X}, options, threads)


def _panels(changes: dict[str, Any], threads: int) -> Callable[[], object]:
    """A whole call (the runtime decides its layout) of a float32 SpMM whose dense operand,
    1.5 times the core's cache and under the default threshold, is the case the
    threshold decides: 1024 columns, a 50 % pruned weight."""
    from ..tensors.tensor import Tensor
    from .kernel import kernel

    m = machine()
    columns = 1024
    rows = max(256, min(1000, int(1.5 * m.core_cache) // (columns * 4)))
    rng = np.random.default_rng(13)
    W = rng.random((1024, rows), dtype=np.float32)
    W[rng.random(W.shape) < 0.5] = 0
    X = rng.random((rows, columns), dtype=np.float32)
    k = kernel("Y(o,t) = W(o,i) * X(i,t)", formats={"W": "csr"})
    Wt = Tensor.from_dense(W, "csr")

    def call() -> object:
        with calibrated.trying(changes):
            return k(W=Wt, X=X, threads=threads)

    return call


def _call(
    expr: str, inputs: dict[str, Any], options: PassOptions, threads: int
) -> Callable[[], object]:
    """A call of ``expr``'s default C kernel on ``inputs`` (a CSR operand as ``(pos, crd,
    vals, shape)``) built with the pass ``options`` instead of the host's: the executable
    alone, its inputs bound once (the kernel is timed, not the binding)."""
    from ..tensors.tensor import Tensor
    from .kernel import kernel

    formats = {name: "csr" for name, v in inputs.items() if isinstance(v, tuple)}
    bound = {
        name: Tensor.from_arrays(v[3], "csr", [None, (v[0], v[1])], v[2], index_dtype="int32")
        if isinstance(v, tuple)
        else v
        for name, v in inputs.items()
    }
    k = kernel(expr, formats=formats)
    prepared = k.binder.prepare(bound, threads)
    default = k._decide(prepared.dtype)
    changed = tuple(
        (name, _field(options, name))
        for name in calibrated.CHOICES
        if not name.startswith("costs.") and _field(options, name) != _field(default.passes, name)
    )
    decided = replace(default, passes=replace(options, run=default.passes.run), tuned=changed)
    executable = k._candidate(decided, prepared.dtype, prepared.index_dtype)
    return lambda: executable.run(prepared, threads)


def _wide(changes: dict[str, Any], threads: int) -> Callable[[], object]:
    """Whole calls, in panels, of a float32 SpMM with 1024 columns and a 50 % pruned weight
    whose 128-column panel of X is 1.5 times the core's cache (BERT-base's FFN down on a
    1 MB one): whether panels narrow to fit that cache."""
    from ..tensors.tensor import Tensor
    from .kernel import kernel

    m = machine()
    rows = max(768, min(6144, int(1.5 * m.core_cache) // (128 * 4)))
    rng = np.random.default_rng(17)
    W = rng.random((768, rows), dtype=np.float32)  # rows enough to repay each panel's copy
    W[rng.random(W.shape) < 0.5] = 0
    X = rng.random((rows, 1024), dtype=np.float32)
    k = kernel("Y(o,t) = W(o,i) * X(i,t)", formats={"W": "csr"})
    Wt = Tensor.from_dense(W, "csr")
    trial = {"costs.panel_min_bytes": 0, **changes}  # in panels, whatever the gate says

    def call() -> object:
        with calibrated.trying(trial):
            return k(W=Wt, X=X, threads=threads)

    return call


#: the SpMV probes: random rows and a banded matrix (the two kinds of stream a prefetch may
#: help or hinder)
_SPMVS = (("random", _spmv), ("banded", _banded))

PROBES = (
    Probe("stream_locality", "CSR SpMV float64, random ~10 a row and 5 diagonals", _SPMVS),
    Probe("reassociate", "CSR SpMV float64, random ~10 a row and 5 diagonals", _SPMVS),
    Probe("tile.prefetch_distance", "CSR SpMM float32, a 95 % pruned weight", (("", _spmm),)),
    Probe("costs.panel_min_bytes", "SpMM float32 calls, X 1.5x the core's cache", (("", _panels),)),
    Probe(
        "costs.panel_fit",
        "SpMM float32 calls in panels, 50 % pruned, a panel 1.5x the core's cache",
        (("", _wide),),
        calls=3,
    ),
)


def _field(options: PassOptions, name: str) -> Any:
    if name.startswith("tile."):
        return getattr(options.tile, name.removeprefix("tile."))
    return getattr(options, name)


def wall_timer(option: str, value: Any, threads: int, call: Callable[[], object]) -> float:
    """The real timer: one call's wall time."""
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


@dataclass(frozen=True)
class Calibration:
    """What a calibration chose (option -> value) and the medians (ms) by option, value
    and thread count that chose it (each the lower quartile of its calls)."""

    chosen: dict[str, Any]
    measured: dict[str, dict[str, dict[str, float]]]
    seconds: float


def calibrate(
    timer: Timer = wall_timer,
    probes: tuple[Probe, ...] = PROBES,
    *,
    threads: tuple[int, ...] | None = None,
    save: bool = True,
    say: Callable[[str], None] = lambda _: None,
) -> Calibration:
    """Measure each probe's option values on this machine and choose (see the module's
    docstring); store the choice for this CPU unless ``save`` is off."""
    began = time.perf_counter()
    cores = machine().cores
    counts = threads or tuple(sorted({1, cores}))
    chosen: dict[str, Any] = {}
    measured: dict[str, dict[str, dict[str, float]]] = {}
    for probe in probes:
        values = calibrated.CHOICES[probe.option]
        # each setting: a probe kernel at a thread count; a value must win in every one
        settings = [(label, build, n) for label, build in probe.builds for n in counts]
        calls: dict[tuple[int, int], Callable[[], object]] = {}
        samples: dict[tuple[int, int], list[float]] = {}
        for at, value in enumerate(values):
            for where, (_, build, n) in enumerate(settings):
                calls[at, where] = _lazy(build, {probe.option: value}, n)
        for _ in range(ROUNDS):  # interleaved: a slow spell hits every value alike
            for at, value in enumerate(values):
                for where, (_, _, n) in enumerate(settings):
                    call = calls[at, where]
                    timer(probe.option, value, n, call)  # warm (and build, the first time)
                    for _ in range(probe.calls):
                        took = timer(probe.option, value, n, call)
                        samples.setdefault((at, where), []).append(took)
        medians = {key: _lower_quartile(got) for key, got in samples.items()}
        names = [f"{label} {n}T".strip() for label, _, n in settings]
        measured[probe.option] = {
            repr(value): {name: medians[at, where] * 1e3 for where, name in enumerate(names)}
            for at, value in enumerate(values)
        }
        best = _best(len(values), len(settings), medians)
        chosen[probe.option] = values[best]
        say(
            f"{probe.option}: {values[best]!r} ({probe.about}; ms at "
            + ", ".join(names)
            + ": "
            + "; ".join(
                f"{v!r} " + "/".join(f"{medians[at, w] * 1e3:.3f}" for w in range(len(names)))
                for at, v in enumerate(values)
            )
            + ")"
        )
    if save:
        calibrated.save(chosen, measured)
    return Calibration(chosen, measured, time.perf_counter() - began)


def _best(values: int, settings: int, medians: dict[tuple[int, int], float]) -> int:
    """The index of the value chosen: among the values at least `MARGIN` faster than the
    default (index 0) in every setting, the fastest by the geometric mean of its ratios to
    the default; the default where none is."""

    def ratio(at: int) -> float:
        logs = [math.log(medians[at, w] / medians[0, w]) for w in range(settings)]
        return math.exp(sum(logs) / len(logs))

    better = [
        at
        for at in range(1, values)
        if all(medians[at, w] <= (1 - MARGIN) * medians[0, w] for w in range(settings))
    ]
    return min(better, key=ratio) if better else 0


def _lower_quartile(samples: list[float]) -> float:
    """The time below which a quarter of ``samples`` fall: another process's work only
    ever adds time, so the low end is the option's own (the median is a coin toss on a
    shared machine)."""
    return statistics.quantiles(samples, n=4)[0] if len(samples) > 1 else samples[0]


def _lazy(build: Build, changes: dict[str, Any], threads: int) -> Callable[[], object]:
    """``build(changes, threads)``'s call, built at its first use (a fake timer never
    builds)."""
    made: list[Callable[[], object]] = []

    def call() -> object:
        if not made:
            made.append(build(changes, threads))
        return made[0]()

    return call
