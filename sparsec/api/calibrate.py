"""Host calibration: short measurements that choose, on this CPU, the pass options whose
best value differs between CPUs (`policy.calibrated.CHOICES`), as FFTW's wisdom and
OpenBLAS's per-core kernels do. ``sparsec tune`` runs it (and a process starts it in the
background on a host that has none); the choices are stored per CPU and read by every C
kernel's decision.

Each option has a probe: kernels whose speed that option decides, on data sized past the
core's cache, built once for each of the option's values (all else the defaults) and
timed in interleaved rounds at one thread and at every core. A value other than the
default is chosen only when it is at least `MARGIN` faster in some setting (a probe kernel
at a thread count) and at most `TOLERANCE` slower in every other (a stream hint that
helps random rows must not hurt a band), then the fastest by the geometric mean of its
ratios to the default, so noise keeps the safe default. A value's time in a round is the
lower quartile of its calls (other work only adds time), each setting's values are timed
back to back, and a value's ratio to the default in a setting is the median over the
rounds of its ratio in each round (a VM's second core slows for seconds at a time: a
paired ratio sees one spell, pooled samples two). The whole is sized to take a few seconds, most of them compiling (the issue's
budget is half a minute).

Probes:

- ``stream_locality``: CSR SpMV, float64, on three matrices: rows of 10 entries on
  average (Poisson) past the core's cache, rows of exactly 10 whose x fits in half the
  core's cache (TACO's benchmark matrices: the gathers hit, so the loop's own
  instructions count), rows of 1.5 entries on average (a TTV's fibers of one or two,
  where a vectorised sum's setup outweighs its lanes) and a banded matrix of 5 diagonals
  past the core's cache: the stream prefetches' hint, or none.
- ``stream_lines``: the same SpMVs, each stream prefetch covering two cache lines or one.
- ``reassociate``: the same SpMVs with their row sums reordered by the compiler (in vector
  lanes) or in order.
- ``tile.prefetch_distance``: CSR SpMM, float32, a pruned weight's rows over a dense
  operand past the core's cache (the register tiles' gathered rows): how far ahead, or
  no prefetch.
- ``costs.panel_fit``: whole calls of such an SpMM in panels, its weight 50 % pruned and a
  128-column panel of its dense operand 1.5 times the core's cache: panels of 128
  columns, or narrowed until they fit that cache (`policy.costs.panel_columns`).
- ``costs.panels_in_sequence``: the same calls at every core, each after a copy on the
  call's OpenMP threads: panels shared among workers or one after another on all threads.
- ``costs.panel_min_bytes``: whole calls of a float32 SpMM with 1024 columns whose dense
  operand is 1.5 times the core's cache: from what size of the dense operands a call
  runs in packed column panels (`policy.costs.panels_pay`). On a CPU whose shared cache
  feeds the gathers well, whole rows win; where it does not, panels do.
- ``costs.panel_min_reuse``: whole calls of a float32 SpMM with 1024 columns whose dense
  operand, 1.5 times the core's cache, fits the shared one, with 32 bytes gathered per
  byte a panel layout moves: whether such calls run whole (48 bytes needed) or in panels
  (24), i.e. how well this CPU's shared cache feeds gathers that outgrow the core's.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..policy import calibrated
from ..policy.decision import DEFAULTS, PassOptions, option_of, with_options
from ..policy.machine import machine

#: a value replaces the default only when this much faster in some setting ...
MARGIN = 0.03
#: ... and at most this much slower in every other (the spread of a probe's lower
#: quartiles between rounds on a quiet machine is about 1 %)
TOLERANCE = 0.02
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
    #: the option matters only with several threads: timed at every core only
    parallel_only: bool = False


@functools.cache
def _spmv_data(core_cache: int) -> dict[str, Any]:
    """A CSR matrix of ~10 entries a row (Poisson) past a cache of ``core_cache`` bytes, and
    its x: built once, so every value of an option is timed on the same memory (one
    allocation's alignment against another's can differ more than the values do)."""
    n = max(200_000, 4 * core_cache // 12)  # 12 bytes an entry
    rng = np.random.default_rng(7)
    lengths = np.minimum(rng.poisson(10, n), 24)
    pos = np.concatenate([[0], np.cumsum(lengths)])
    crd = np.sort(rng.integers(0, n - 24, size=(n, 24)), axis=1) + np.arange(24)  # distinct
    crd = crd[np.arange(24) < lengths[:, None]]  # each row's first columns, in order
    return {"A": _csr(pos, crd, rng.random(len(crd)), (n, n)), "x": rng.random(n)}


@functools.cache
def _cached_data(core_cache: int) -> dict[str, Any]:
    """A CSR matrix of exactly 10 entries a row whose x fills half a cache of
    ``core_cache`` bytes, and its x (once): the gathers hit the core's cache, as in TACO's
    benchmark matrices, so the loop's own instructions decide its speed."""
    n = max(16_384, core_cache // 2 // 8)
    rng = np.random.default_rng(8)
    crd = np.sort(rng.integers(0, n - 10, size=(n, 10)), axis=1) + np.arange(10)  # distinct
    pos = np.arange(0, 10 * n + 1, 10)
    return {"A": _csr(pos, crd.ravel(), rng.random(10 * n), (n, n)), "x": rng.random(n)}


@functools.cache
def _short_data(core_cache: int) -> dict[str, Any]:
    """A CSR matrix of rows of 1.5 entries on average (Poisson, many empty) past a cache of
    ``core_cache`` bytes, over an x of 16,384 values (in any core's cache), and that x
    (once): the innermost loops of a TTV over a tensor's fibers of one or two entries,
    where a vectorised sum's setup costs more than its lanes save."""
    n = max(400_000, 4 * core_cache // 12)
    width = 16_384
    rng = np.random.default_rng(10)
    lengths = np.minimum(rng.poisson(1.5, n), 8)
    pos = np.concatenate([[0], np.cumsum(lengths)])
    crd = np.sort(rng.integers(0, width - 8, size=(n, 8)), axis=1) + np.arange(8)
    crd = crd[np.arange(8) < lengths[:, None]]
    return {"A": _csr(pos, crd, rng.random(len(crd)), (n, width)), "x": rng.random(width)}


@functools.cache
def _banded_data(core_cache: int) -> dict[str, Any]:
    """A matrix of 5 diagonals past a cache of ``core_cache`` bytes, and its x (once)."""
    n = max(400_000, 4 * core_cache // 12 // 5 * 5)
    rng = np.random.default_rng(9)
    cols = np.arange(n)[:, None] + np.arange(-2, 3)
    keep = (cols >= 0) & (cols < n)
    pos = np.concatenate([[0], np.cumsum(keep.sum(axis=1))])
    return {"A": _csr(pos, cols[keep], rng.random(int(pos[-1])), (n, n)), "x": rng.random(n)}


@functools.cache
def _spmm_data(core_cache: int) -> dict[str, Any]:
    """A 95 % pruned float32 weight and a dense operand past a cache of ``core_cache``
    bytes (once)."""
    rows, inner = 512, 4096
    width = max(64, min(512, 4 * core_cache // (inner * 4)))
    rng = np.random.default_rng(11)
    keep = rng.random((rows, inner)) < 0.05
    pos = np.concatenate([[0], np.cumsum(keep.sum(axis=1))])
    crd = np.nonzero(keep)[1]
    W = _csr(pos, crd, rng.random(len(crd)).astype(np.float32), (rows, inner))
    return {"W": W, "X": rng.random((inner, width)).astype(np.float32)}


def _csr(pos: Any, crd: Any, vals: Any, shape: tuple[int, int]) -> Any:
    from ..tensors.tensor import Tensor

    return Tensor.from_arrays(shape, "csr", [None, (pos, crd)], vals, index_dtype="int32")


def _spmv_on(data_of: Callable[[int], dict[str, Any]]) -> Build:
    """The probe build of a float64 CSR SpMV over ``data_of``'s matrix and x (made once per
    cache size)."""

    def build(changes: dict[str, Any], threads: int) -> Callable[[], object]:
        data = data_of(machine().core_cache)
        return _call("y(i) = A(i,j) * x(j)", data, with_options(DEFAULTS, changes), threads)

    return build


def _spmm(changes: dict[str, Any], threads: int) -> Callable[[], object]:
    data = _spmm_data(machine().core_cache)
    return _call("Y(o,t) = W(o,i) * X(i,t)", data, with_options(DEFAULTS, changes), threads)


@functools.cache
def _pruned(rows: int, inner: int, columns: int, seed: int, kept: float = 0.5) -> dict[str, Any]:
    """A float32 weight of ``rows`` x ``inner`` pruned to the fraction ``kept`` of its
    entries and a dense operand of ``inner`` x ``columns`` (once per shape)."""
    from ..tensors.tensor import Tensor

    rng = np.random.default_rng(seed)
    W = rng.random((rows, inner), dtype=np.float32)
    W[rng.random(W.shape) < 1 - kept] = 0
    X = rng.random((inner, columns), dtype=np.float32)
    return {"W": Tensor.from_dense(W, "csr"), "X": X}


def _whole_calls(
    changes: dict[str, Any], threads: int, data: dict[str, Any]
) -> Callable[[], object]:
    """Whole calls (the runtime decides their layout) of SpMM on ``data`` under the
    calibrated values ``changes``."""
    from .kernel import kernel

    k = kernel("Y(o,t) = W(o,i) * X(i,t)", formats={"W": "csr"})

    def call() -> object:
        with calibrated.trying(changes):
            return k(**data, threads=threads)

    return call


def _panels(changes: dict[str, Any], threads: int) -> Callable[[], object]:
    """Whole calls of a float32 SpMM whose dense operand, 1.5 times the core's cache and
    under the default threshold, is the case the threshold decides: 1024 columns, a 50 %
    pruned weight."""
    rows = max(256, min(1000, int(1.5 * machine().core_cache) // (1024 * 4)))
    return _whole_calls(changes, threads, _pruned(1024, rows, 1024, 13))


def _call(
    expr: str, inputs: dict[str, Any], options: PassOptions, threads: int
) -> Callable[[], object]:
    """A call of ``expr``'s default C kernel on ``inputs`` (the CSR operand a `Tensor`)
    built with the pass ``options`` instead of the host's: the executable alone, its
    inputs bound once (the kernel is timed, not the binding)."""
    from ..tensors.tensor import Tensor
    from .kernel import kernel

    formats = {name: "csr" for name, v in inputs.items() if isinstance(v, Tensor)}
    k = kernel(expr, formats=formats)
    prepared = k.binder.prepare(inputs, threads)
    default = k._decide(prepared.dtype)
    changed = tuple(
        (name, option_of(options, name))
        for name in calibrated.CHOICES
        if not name.startswith("costs.")
        and option_of(options, name) != option_of(default.passes, name)
    )
    decided = replace(default, passes=replace(options, run=default.passes.run), tuned=changed)
    executable = k._candidate(decided, prepared.dtype, prepared.index_dtype)
    return lambda: executable.run(prepared, threads)


def _reaching(changes: dict[str, Any], threads: int) -> Callable[[], object]:
    """Whole calls of a float32 SpMM with 1024 columns whose dense operand, 1.5 times the
    core's cache, fits the last-level cache, and gathers 32 bytes from it per byte a panel
    layout moves (`policy.costs.panels_pay`), between the two values: BERT-base's FFN up
    at 90 % on a 2 MB core cache (768 inputs, 3072 outputs), 4 outputs an input."""
    inner = max(192, min(1536, int(1.5 * machine().core_cache) // (1024 * 4)))
    # gathered / moved = rows * inner * kept / (inner + 2 * rows) = 4 * inner * kept / 9
    kept = min(1.0, 32 * 9 / (4 * inner))
    trial = {"costs.panel_min_bytes": 0, **changes}
    return _whole_calls(trial, threads, _pruned(4 * inner, inner, 1024, 19, kept))


def _wide(changes: dict[str, Any], threads: int) -> Callable[[], object]:
    """Whole calls, in panels, of a float32 SpMM with 1024 columns and a 50 % pruned weight
    whose 128-column panel of X is 1.5 times the core's cache (BERT-base's FFN down on a
    1 MB one): whether panels narrow to fit that cache. 768 rows of the weight repay each
    panel's copy."""
    rows = max(768, min(6144, int(1.5 * machine().core_cache) // (128 * 4)))
    trial = {"costs.panel_min_bytes": 0, **changes}  # in panels, whatever the gate says
    return _whole_calls(trial, threads, _pruned(768, rows, 1024, 17))


def _sequence(changes: dict[str, Any], threads: int) -> Callable[[], object]:
    """The panel-width probe's calls, each after a copy on the call's OpenMP threads (as in
    a model, where a torch op runs before each layer and leaves its threads spinning):
    panels shared among workers, or in sequence on all threads."""
    from ..runtime.copies import contiguous_copy

    rows = max(768, min(6144, int(1.5 * machine().core_cache) // (128 * 4)))
    data = _pruned(768, rows, 1024, 17)
    trial = {"costs.panel_min_bytes": 0, **changes}
    calls = _whole_calls(trial, threads, data)
    Xt = data["X"].T  # a strided view: copied by compiled code on the OpenMP threads

    def call() -> object:
        contiguous_copy(Xt, threads)
        return calls()

    return call


#: the SpMV probes: random rows past the core's cache and within it, rows of one or two
#: entries (a TTV's fibers), and a banded matrix (the kinds of stream a prefetch or a
#: vectorised sum may help or hinder)
_SPMVS = (
    ("random", _spmv_on(_spmv_data)),
    ("in cache", _spmv_on(_cached_data)),
    ("short", _spmv_on(_short_data)),
    ("banded", _spmv_on(_banded_data)),
)
_SPMV_ABOUT = "CSR SpMV float64: random ~10 a row, 10 a row in cache, ~1.5 a row, 5 diagonals"

PROBES = (
    Probe("stream_locality", _SPMV_ABOUT, _SPMVS),
    Probe("stream_lines", _SPMV_ABOUT, _SPMVS),
    Probe("reassociate", _SPMV_ABOUT, _SPMVS),
    Probe("tile.prefetch_distance", "CSR SpMM float32, a 95 % pruned weight", (("", _spmm),)),
    Probe("costs.panel_min_bytes", "SpMM float32 calls, X 1.5x the core's cache", (("", _panels),)),
    Probe(
        "costs.panel_min_reuse",
        "SpMM float32 calls, X 1.5x the core's cache, 32 bytes gathered per byte moved",
        (("", _reaching),),
        calls=3,
    ),
    Probe(
        "costs.panel_fit",
        "SpMM float32 calls in panels, 50 % pruned, a panel 1.5x the core's cache",
        (("", _wide),),
        calls=3,
    ),
    Probe(
        "costs.panels_in_sequence",
        "SpMM float32 calls in panels, 50 % pruned, after an OpenMP copy",
        (("", _sequence),),
        calls=3,
        parallel_only=True,
    ),
)


def wall_timer(option: str, value: Any, threads: int, call: Callable[[], object]) -> float:
    """The real timer: one call's wall time."""
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


@dataclass(frozen=True)
class Calibration:
    """What a calibration chose (option -> value) and the times (ms: each the lower
    quartile of its calls) by option, value and setting that chose it."""

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
        ns = tuple(n for n in counts if n > 1) if probe.parallel_only else counts
        settings = [(label, build, n) for label, build in probe.builds for n in ns]
        if not settings:  # one core: the option cannot matter here
            chosen[probe.option] = values[0]
            continue
        calls: dict[tuple[int, int], Callable[[], object]] = {}
        samples: dict[tuple[int, int], list[float]] = {}
        rounds: dict[tuple[int, int], list[float]] = {}  # each round's lower quartile
        for at, value in enumerate(values):
            for where, (_, build, n) in enumerate(settings):
                calls[at, where] = _lazy(build, {probe.option: value}, n)
        for _ in range(ROUNDS):  # interleaved: a slow spell hits every value alike
            for where, (_, _, n) in enumerate(settings):
                for at, value in enumerate(values):
                    call = calls[at, where]
                    timer(probe.option, value, n, call)  # warm (and build, the first time)
                    took = [timer(probe.option, value, n, call) for _ in range(probe.calls)]
                    samples.setdefault((at, where), []).extend(took)
                    rounds.setdefault((at, where), []).append(_lower_quartile(took))
        medians = {key: _lower_quartile(got) for key, got in samples.items()}
        # paired: each value against the default in the same round, a setting's values
        # timed back to back; the median of the rounds' ratios
        ratios = {
            (at, w): statistics.median(
                mine / base for mine, base in zip(rounds[at, w], rounds[0, w], strict=True)
            )
            for (at, w) in rounds
        }
        names = [f"{label} {n}T".strip() for label, _, n in settings]
        measured[probe.option] = {
            repr(value): {name: medians[at, where] * 1e3 for where, name in enumerate(names)}
            for at, value in enumerate(values)
        }
        best = _best(len(values), len(settings), ratios)
        chosen[probe.option] = values[best]
        say(
            f"{probe.option}: {values[best]!r} ({probe.about}; ms at "
            + ", ".join(names)
            + ": "
            + "; ".join(
                f"{v!r} " + "/".join(f"{medians[at, w] * 1e3:.3f}" for w in range(len(names)))
                for at, v in enumerate(values)
            )
            + "; paired ratios to the default: "
            + "; ".join(
                f"{v!r} " + "/".join(f"{ratios[at, w]:.2f}" for w in range(len(names)))
                for at, v in enumerate(values)
                if at
            )
            + ")"
        )
    if save:
        calibrated.save(chosen, measured)
    return Calibration(chosen, measured, time.perf_counter() - began)


def calibrate_first(say: Callable[[str], None] = print) -> Calibration | None:
    """Calibrate this CPU now where calibration is on and none is stored (a timed run does,
    so that its timings use the host's choices and no background calibration runs beside
    them); None where nothing was to do."""
    if not calibrated.enabled() or calibrated.load() is not None:
        return None
    say("calibrating this CPU once (sparsec tune; SPARSEC_TUNE=0 skips it) ...")
    done = calibrate()
    say(f"stored in {calibrated.path()} ({done.seconds:.1f} s)")
    return done


def _best(values: int, settings: int, ratios: dict[tuple[int, int], float]) -> int:
    """The index of the value chosen, by each value's time over the default's (index 0)
    in each setting (``ratios``): among the values at least `MARGIN` faster than the
    default in some setting and at most `TOLERANCE` slower in every setting, the fastest
    by the geometric mean of its ratios; the default where none is."""

    def ratio(at: int) -> float:
        logs = [math.log(ratios[at, w]) for w in range(settings)]
        return math.exp(sum(logs) / len(logs))

    better = [
        at
        for at in range(1, values)
        if any(ratios[at, w] <= 1 - MARGIN for w in range(settings))
        and all(ratios[at, w] <= 1 + TOLERANCE for w in range(settings))
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
