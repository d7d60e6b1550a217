"""``schedule="auto"``: time a few candidate schedules on the call's own inputs and keep the
fastest, remembered on disk.

Candidates (each kept only if it is legal for the expression and formats): the default; the
outermost loop split into blocks of 16 and of 128 rows on threads; the default's parallel
loop with the innermost loop vectorised (``CPUVector``); and position-space parallelism
over the leading sparse operand's nonzeros (``fuse`` + ``pos`` + ``split``, with Atomics or
per-thread Temporary copies), which balances skewed rows. Every candidate's result is
compared with the default's before it is timed; the median of `REPEATS` calls decides.

The winner is cached in ``<cache dir>/autotune.json`` under a key of the expression, the
formats, the value and index dtypes, the thread count and a sparsity signature of the
inputs (shapes, and each sparse input's nonzero count rounded to a power of two), so later
kernels and processes skip the tuning for inputs of the same kind.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ScheduleError
from ..middle.schedule import name_supply
from ..runtime.build import cache_dir
from ..tensors.tensor import Tensor

if TYPE_CHECKING:
    from .kernel import Kernel

REPEATS = 5
#: a candidate whose first timed call is this many times slower than the best so far is
#: not timed further
SKIP_FACTOR = 4
_lock = threading.Lock()


def candidates(kernel: Kernel) -> list[str | None]:
    """Schedules worth timing for ``kernel``'s expression and formats (None: default)."""
    spec = kernel.spec
    order = kernel.generated().loop_order
    found: list[str | None] = [None]
    if not order:
        return found
    v, last = order[0], order[-1]
    fresh = name_supply(set(spec.indices) | {t.name for t in spec.tensors})

    outer, inner = fresh(f"{v}_blk"), fresh(f"{v}_in")
    for block in (16, 128):
        found.append(f"split({v},{outer},{inner},{block}), parallelize({outer},CPUThread,NoRaces)")
    if len(order) > 1:
        found.append(f"parallelize({v},CPUThread,NoRaces), parallelize({last},CPUVector,NoRaces)")
        w = order[1]
        sparse = next((t for t in spec.inputs if not t.format.is_dense), None)
        if sparse is not None:  # the leading sparse operand's nonzeros, in chunks
            f, fp, c, rest = fresh("fused"), fresh("fpos"), fresh("chunk"), fresh("fpos1")
            for races in ("Atomics", "Temporary"):
                found.append(
                    f"fuse({v},{w},{f}), pos({f},{fp},{sparse.name}), split({fp},{c},{rest},2048), "
                    f"parallelize({c},CPUThread,{races})"
                )
    return found


def key(
    kernel: Kernel, inputs: Mapping[str, Any], dtype: str, index_dtype: str, threads: int
) -> str:
    """The cache key: expression, formats, dtypes, threads and the inputs' sparsity signature."""
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
            str(kernel.assignment),
            {t.name: str(t.format) for t in kernel.spec.tensors},
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
    try:
        with open(_path()) as f:
            found = json.load(f).get(entry)
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) and "schedule" in found else None


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
            with os.fdopen(fd, "w") as f:
                json.dump(table, f, indent=1, sort_keys=True)
            os.replace(tmp, path)
        except OSError:
            pass


def tune(kernel: Kernel, inputs: Mapping[str, Any], threads: int | None) -> dict[str, Any]:
    """Time every legal candidate on ``inputs``; returns the winner and all medians."""
    from .kernel import Kernel

    reference = None
    timings: dict[str, float] = {}
    for schedule in candidates(kernel):
        label = schedule or "default"
        try:
            variant = Kernel(
                kernel.expression,
                kernel.formats,
                schedule=schedule,
                dtype=kernel.dtype,
                index_dtype=kernel.index_dtype,
            )
        except ScheduleError:
            continue
        got = _dense(variant(**inputs, threads=threads))  # compiles, and warms up
        if reference is None:
            reference = got
        elif not np.allclose(got, reference, rtol=1e-4, atol=1e-6, equal_nan=True):
            continue  # never choose a schedule that disagrees with the default
        samples = [_time(variant, inputs, threads)]
        fastest = min(timings.values(), default=math.inf)
        if samples[0] * 1e3 < SKIP_FACTOR * fastest:  # hopeless candidates get one timing
            samples += [_time(variant, inputs, threads) for _ in range(REPEATS - 1)]
        timings[label] = statistics.median(samples) * 1e3
    winner = min(timings, key=timings.__getitem__)
    return {"schedule": None if winner == "default" else winner, "medians_ms": timings}


def _time(kernel: Kernel, inputs: Mapping[str, Any], threads: int | None) -> float:
    start = time.perf_counter()
    kernel(**inputs, threads=threads)
    return time.perf_counter() - start


def _dense(value: Any) -> np.ndarray:
    if isinstance(value, Tensor):
        return value.to_dense()
    if hasattr(value, "numpy") and not isinstance(value, np.ndarray):
        return value.numpy()
    return np.asarray(value)
