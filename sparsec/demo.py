"""``python -m sparsec.demo``: compile, check and time SpMV and MTTKRP on built-in data.

The data are generated (seeded): a 20k×20k matrix with ~10 nonzeros per row and empty
rows, and a 200³ tensor with 100k nonzeros. Each kernel is checked against dense torch on
a small instance first, then timed on one thread and as a default call (no ``threads=``:
`configured_threads`, ``OMP_NUM_THREADS`` or every core, fewer while other work keeps
cores busy) against scipy (SpMV) and numpy (MTTKRP), both single threaded; the speedups
are the baseline's time over each. The table says how many threads the default calls took
and, below it, how busy the machine was while they ran: forcing every core on a busy
machine would time the wait for a descheduled thread, many times the kernel's own
(docs/decisions.md, "A default call leaves busy cores alone").
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

import sparsec
from sparsec.api.calibrate import calibrate_first
from sparsec.policy.machine import busy, machine
from sparsec.runtime.binding import configured_threads, default_threads


def _median_ms(fn, repeat: int = 15, seen: list[float] | None = None) -> float:
    """The median of ``repeat`` timed calls after a warm-up; ``seen`` (when given) gets the
    threads a default call took and the busy cores measured, after each call."""
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
        if seen is not None:
            seen.extend((default_threads(), busy()))
    return 1e3 * float(np.median(times))


def _threads_taken(seen: list[float]) -> str:
    """The default calls' thread counts: one number, or the range they spanned."""
    counts = sorted({int(n) for n in seen[0::2]})
    return str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"


def table(rows: list[tuple[Any, ...]]) -> str:
    """The demo's table: per kernel, its times on 1 thread and as a default call (with the
    threads that call took), the baseline's, and the speedup over the baseline of each."""
    head = (
        f"{'kernel':40} {'formats':8} {'check':6} {'1 thread':>10} {'default':>10} "
        f"{'threads':>7} {'baseline':>16} {'speedup 1':>9} {'speedup default':>15}"
    )
    lines = [head, "-" * len(head)]
    for name, fmts, verdict, one, default, taken, base_name, base in rows:
        ok = "ok" if verdict.max_abs_error < 1e-9 else "FAIL"
        lines.append(
            f"{name:40} {fmts:8} {ok:6} {one:8.3f}ms {default:8.3f}ms {taken:>7} "
            f"{base_name:>6} {base:7.3f}ms {_speedup(base, one):>9} "
            f"{_speedup(base, default):>15}"
        )
    return "\n".join(lines)


def load_note(most_busy: float, cores: int, configured: int) -> str:
    """The line under the table: how busy the machine was while the default calls ran."""
    if most_busy < 0.5:
        return f"The machine was quiet: default calls ran on the configured {configured} threads."
    return (
        f"The machine was busy: other work kept up to {most_busy:.1f} of its {cores} cores "
        "busy while the default calls ran, so they took the cores left (the threads column; "
        "a thread on a busy core waits a whole time slice). Timings on a quiet machine are "
        "the kernel's own; pass threads=N to force N."
    )


def _speedup(base_ms: float, ms: float) -> str:
    """``base_ms / ms``: one decimal from 1x, two significant digits below (a busy
    machine's 0.04x stays readable, where one decimal would print 0.0x)."""
    if ms <= 0:
        return "-"
    ratio = base_ms / ms
    return f"{ratio:.1f}x" if ratio >= 1 else f"{ratio:.2g}x"


def main() -> None:
    if calibrate_first() is not None:
        print()
    rows = []
    seen: list[float] = []

    spmv = sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": "csr"})
    verdict = spmv.check(**spmv.random_inputs({"i": 301, "j": 257})[0])
    A = sparsec.random((20_000, 20_000), 10 / 20_000, "csr", seed=1)
    x = np.random.default_rng(2).uniform(-1, 1, 20_000)
    A_scipy = A.to_scipy()
    np.testing.assert_allclose(spmv(A=A, x=x), A_scipy @ x, rtol=1e-12, atol=1e-12)
    rows.append(
        (
            "SpMV  y(i) = A(i,j)*x(j)",
            "A:csr",
            verdict,
            _median_ms(lambda: spmv(A=A, x=x, threads=1)),
            _median_ms(lambda: spmv(A=A, x=x), seen=seen),
            _threads_taken(seen),
            "scipy",
            _median_ms(lambda: A_scipy @ x),
        )
    )

    mttkrp = sparsec.kernel("A(i,j) = B(i,k,l) * D(l,j) * C(k,j)", {"B": "csf"})
    verdict = mttkrp.check(**mttkrp.random_inputs({"i": 31, "j": 8, "k": 29, "l": 23})[0])
    B = sparsec.random((200, 200, 200), 100_000 / 200**3, "csf", seed=3)
    rng = np.random.default_rng(4)
    D, C = rng.uniform(size=(200, 16)), rng.uniform(size=(200, 16))
    (i, k, l), v = B.coords()
    mine: list[float] = []

    def numpy_mttkrp() -> np.ndarray:
        out = np.zeros((200, 16))
        np.add.at(out, i, v[:, None] * D[l] * C[k])
        return out

    np.testing.assert_allclose(mttkrp(B=B, D=D, C=C), numpy_mttkrp(), rtol=1e-10)
    rows.append(
        (
            "MTTKRP A(i,j) = B(i,k,l)*D(l,j)*C(k,j)",
            "B:csf",
            verdict,
            _median_ms(lambda: mttkrp(B=B, D=D, C=C, threads=1)),
            _median_ms(lambda: mttkrp(B=B, D=D, C=C), seen=mine),
            _threads_taken(mine),
            "numpy",
            _median_ms(numpy_mttkrp),
        )
    )

    seen += mine
    print(table(rows))
    print(load_note(max(seen[1::2], default=0.0), machine().cores, configured_threads()))
    print('\nGenerated SpMV kernel (sparsec compile "y(i) = A(i,j) * x(j)" -f A:csr):\n')
    body = spmv.source.split("int sparsec_kernel(", 1)[1]
    body = body.split("\n\n/* sparsec_kernel with its arguments", 1)[0]  # not the packed entry
    print("int sparsec_kernel(" + body)


if __name__ == "__main__":
    main()
