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

REPEATS = 5
#: a candidate whose first timed call is this many times slower than the best so far is
#: not timed further
SKIP_FACTOR = 4
_lock = threading.Lock()


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
    signature = []
    for name in sorted(inputs):
        v = inputs[name]
        if isinstance(v, Tensor):
            bucket = round(math.log2(v.nnz + 1))
            signature.append([name, list(v.shape), bucket])
        else:
            signature.append([name, list(np.shape(v))])
    text = json.dumps(
        [
            str(statement),
            {t.name: str(t.format) for t in spec.tensors},
            dtype,
            index_dtype,
            threads,
            signature,
        ],
        sort_keys=True,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:24]


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
    raises `ScheduleError`) on ``prepared``; returns the winner's label and all medians."""
    reference = None
    timings: dict[str, float] = {}
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
        samples = [_time(executable, prepared, threads)]
        fastest = min(timings.values(), default=math.inf)
        if samples[0] * 1e3 < SKIP_FACTOR * fastest:  # hopeless candidates get one timing
            samples += [_time(executable, prepared, threads) for _ in range(REPEATS - 1)]
        timings[label] = statistics.median(samples) * 1e3
    winner = min(timings, key=timings.__getitem__)
    return {"schedule": None if winner == "default" else winner, "medians_ms": timings}


def winner(result: dict[str, Any] | None, decisions: Sequence[Decision]) -> Decision | None:
    """The decision of ``decisions`` that ``result`` (`tune`'s, or `lookup`'s from the table)
    chose, found by its label; None without a result, or where no candidate bears it any
    more (the candidates changed since it was recorded)."""
    if result is None:
        return None
    return next((d for d in decisions if d.label == result["schedule"]), None)


def _time(executable: Executable, prepared: Prepared, threads: int | None) -> float:
    start = time.perf_counter()
    executable.run(prepared, threads)
    return time.perf_counter() - start


def _dense(value: Any) -> np.ndarray:
    if isinstance(value, Tensor):
        return value.to_dense()
    return np.asarray(value)
