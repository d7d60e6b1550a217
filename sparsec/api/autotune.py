"""``schedule="auto"``: time the candidate decisions (`sparsec.policy.tuning`) on the call's
own inputs and keep the fastest, remembered on disk.

`tune` times `Executable`s, one per legal candidate, each built by the caller's ``build``:
every candidate's result is compared with the default's before it is timed; the median of
`REPEATS` runs decides.

The winner is cached in ``<cache dir>/autotune.json`` under a key of the expression, the
formats, the value and index dtypes, the thread count and a sparsity signature of the
inputs (shapes, and each sparse input's nonzero count rounded to a power of two), so later
kernels and processes skip the tuning for inputs of the same kind. A result names its
winner by the decision's label (`Decision.label`: its commands as written, None for the
default), as the table stored schedules before decisions: old tables stay readable.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..base.errors import ScheduleError
from ..middle.spec import Spec
from ..policy.decision import Decision
from ..runtime.build import cache_dir
from ..runtime.executable import Executable
from ..runtime.inputs import Prepared
from ..tensors.tensor import Tensor

#: interleaved rounds in which every candidate still in the running is timed once
REPEATS = 7
#: a candidate whose first timed call is this many times slower than the best first call is
#: not timed further
SKIP_FACTOR = 4
#: a sample lasts at least this long (short kernels are run several times back to back),
#: and takes at most MOST_CALLS runs
SAMPLE_S = 1e-3
MOST_CALLS = 64
#: a candidate replaces the default only when its median is at least this much lower:
#: candidates whose code is the same up to its layout differ by up to ~8 % in one tuning
#: run (CSR SpMV, 2-core Zen 5 VM), and a pick inside that band is noise
MARGIN = 0.1
_lock = threading.Lock()
#: the tuner's clock (a test sets a fake one)
clock = time.perf_counter


def key(
    statement: object,
    spec: Spec,
    inputs: Mapping[str, Any],
    dtype: str,
    index_dtype: str,
    threads: int,
) -> str:
    """The cache key: the statement (as written), the formats, dtypes, threads and the
    inputs' sparsity signature."""
    text = json.dumps(
        [
            str(statement),
            {t.name: str(t.format) for t in spec.tensors},
            dtype,
            index_dtype,
            threads,
            signature(inputs),
        ],
        sort_keys=True,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def signature(inputs: Mapping[str, Any]) -> tuple[tuple[Any, ...], ...]:
    """The inputs' kind, as the key reads it: each input's shape, and a sparse one's nonzero
    count rounded to a power of two (hashable: a kernel remembers its choice by it)."""
    found: list[tuple[Any, ...]] = []
    for name in sorted(inputs):
        v = inputs[name]
        if isinstance(v, Tensor):
            found.append((name, tuple(v.shape), round(math.log2(v.nnz + 1))))
        else:
            found.append((name, tuple(np.shape(v))))
    return tuple(found)


def _path() -> str:
    return str(cache_dir() / "autotune.json")


def lookup(entry: str) -> dict[str, Any] | None:
    """The recorded result for ``entry``, or None where the table lacks it or is not one
    `record` wrote (unreadable, damaged, edited): the kernel then tunes again."""
    try:
        with open(_path()) as f:
            table = json.load(f)
    except (OSError, ValueError):
        return None
    found = table.get(entry) if isinstance(table, dict) else None
    if not isinstance(found, dict) or not isinstance(found.get("schedule", 0), str | None):
        return None
    medians = found.get("medians_ms")
    if not isinstance(medians, dict) or not all(
        isinstance(v, int | float) for v in medians.values()
    ):
        return None
    return found


def record(entry: str, result: dict[str, Any]) -> None:
    """Add one entry to the on-disk table (atomic replace; an unwritable cache is skipped)."""
    with _lock:
        path = _path()
        try:
            with open(path) as f:
                table = json.load(f)
            if not isinstance(table, dict):
                table = {}
        except (OSError, ValueError):
            table = {}
        table[entry] = result
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".json.tmp")
        except OSError:
            return
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(table, f, indent=1, sort_keys=True)
            os.replace(tmp, path)
        except OSError:
            pass
        finally:  # a write that failed (disk full) leaves no temporary file behind
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def tune(
    build: Callable[[Decision], Executable],
    decisions: Sequence[Decision],
    prepared: Prepared,
    threads: int | None,
) -> dict[str, Any]:
    """Time the executable ``build(decision)`` of every legal decision (an illegal one
    raises `ScheduleError`) on ``prepared``; returns the winner's label and all medians.

    Each candidate is built and checked first (its first run compiles it and warms it up).
    Then all are timed in interleaved rounds, the order rotating by round, so no candidate
    gains from coming later (a warmer cache, a clock ramping up) or loses to a burst of
    load: `REPEATS` rounds, each sample the mean of enough calls to last `SAMPLE_S`. One
    whose first sample is `SKIP_FACTOR` times the best first sample is not timed further."""
    reference = None
    ready: dict[str, Executable] = {}
    for decision in decisions:
        label = decision.label or "default"
        try:
            executable = build(decision)
        except ScheduleError:
            continue
        got = _dense(executable.run(prepared, threads))  # compiles, and warms up
        if reference is None:
            reference = got
        elif not np.allclose(got, reference, rtol=1e-4, atol=1e-6, equal_nan=True):
            continue  # never choose a schedule that disagrees with the default
        ready[label] = executable
    first = {label: _time(e, prepared, threads, 1) for label, e in ready.items()}
    best = min(first.values())
    calls = max(1, min(MOST_CALLS, math.ceil(SAMPLE_S / max(best, 1e-9))))
    timed = [label for label in ready if first[label] < SKIP_FACTOR * best] or [
        min(first, key=first.__getitem__)
    ]
    samples: dict[str, list[float]] = {label: [first[label]] for label in ready}
    for r in range(REPEATS):
        for label in timed[r % len(timed) :] + timed[: r % len(timed)]:
            samples[label].append(_time(ready[label], prepared, threads, calls))
    timings = {
        label: statistics.median(found[1:] or found) * 1e3 for label, found in samples.items()
    }
    winner = min(timings, key=timings.__getitem__)
    if "default" in timings and timings[winner] > (1 - MARGIN) * timings["default"]:
        winner = "default"  # within the noise of the default: not worth a change
    return {"schedule": None if winner == "default" else winner, "medians_ms": timings}


def winner(result: dict[str, Any] | None, decisions: Sequence[Decision]) -> Decision | None:
    """The decision of ``decisions`` that ``result`` (`tune`'s, or `lookup`'s from the table)
    chose, found by its label; None without a result, or where no candidate bears it any
    more (the candidates changed since it was recorded)."""
    if result is None:
        return None
    return next((d for d in decisions if d.label == result["schedule"]), None)


def _time(executable: Executable, prepared: Prepared, threads: int | None, calls: int) -> float:
    """Seconds per run of ``executable``: the mean of ``calls`` runs back to back."""
    start = clock()
    for _ in range(calls):
        executable.run(prepared, threads)
    return (clock() - start) / calls


def _dense(value: Any) -> np.ndarray:
    if isinstance(value, Tensor):
        return value.to_dense()
    return np.asarray(value)
