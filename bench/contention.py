"""Contention suite: SpMV on a quiet machine, then with busy processes competing for the cores.

    python -m bench contention [--quick] [--threads N] [--busy N ...]

A default call (no ``threads=``: `sparsec.runtime.binding.default_threads`, which leaves out the
cores other work keeps busy), ``threads=1`` and ``threads=N`` (all cores) are timed in
interleaved rounds (`measure_rounds`), first with nothing of ours competing, then with each
``--busy`` count of processes spinning on the cores (``multiprocessing``, spawned: default
one, and as many as there are cores). For each phase it reports the medians, each over the
1-thread median, the cores the load meter found busy (`sparsec.policy.machine.busy`), the
threads the default call chose and the load average. "Quiet" is only as quiet as the
machine is: on a shared machine other work is already there (the load columns say so).

What should hold: on a quiet machine the default call is about the all-thread time; on a
busy one, about the 1-thread time, where an all-thread call is many times slower (its
threads wait at the end of the call for one that the other work has descheduled).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import time
from typing import Any

import numpy as np

import sparsec
from sparsec.policy.machine import LOAD_INTERVAL_S, busy, machine
from sparsec.runtime.binding import configured_threads, default_threads

from .common import Table, environment, measure_rounds, progress, settle, write_results

SPMV = "y(i) = A(i,j) * x(j)"


def _spin(stop: Any) -> None:
    """A competing process: busy on a core until ``stop`` is set."""
    while not stop.is_set():
        for _ in range(100_000):
            pass


def _phase(name: str, busy_processes: int, calls: dict[str, Any], repeats: int) -> dict[str, Any]:
    """Time ``calls`` with ``busy_processes`` spinning beside them."""
    context = multiprocessing.get_context("spawn")  # never fork a process running OpenMP
    stop = context.Event()
    spinners = [
        context.Process(target=_spin, args=(stop,), daemon=True) for _ in range(busy_processes)
    ]
    for p in spinners:
        p.start()
    try:
        if spinners:
            time.sleep(1.0)  # the spinners' start-up, then a few windows of the load meter
        for _ in range(4):
            calls["default"]()
            time.sleep(LOAD_INTERVAL_S)
        measured_busy, chosen = busy(), default_threads()
        timings = measure_rounds(calls, repeats=repeats)
        loadavg = os.getloadavg()[0]
    finally:
        stop.set()
        for p in spinners:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
    medians = {label: t.median_ms for label, t in timings.items()}
    return {
        "phase": name,
        "busy_processes": busy_processes,
        "busy_cores_measured": measured_busy,
        "default_threads": chosen,
        "loadavg_1min": loadavg,
        "median_ms": medians,
        "over_1_thread": {label: m / medians["1 thread"] for label, m in medians.items()},
        "timings": timings,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.contention", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--quick", action="store_true", help="small sizes and few runs (CI smoke)")
    parser.add_argument(
        "--threads", type=int, default=None, help="the all-threads count (default: all cores)"
    )
    parser.add_argument(
        "--busy",
        type=int,
        nargs="+",
        default=None,
        help="numbers of competing busy processes, one phase each (default: 1 and the cores)",
    )
    args = parser.parse_args(argv)
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be >= 1")
    settle(not args.quick)
    threads = args.threads or configured_threads()
    cores = machine().cores
    phases = args.busy or sorted({1, cores})
    n = 20_000 if args.quick else 100_000
    per_row = 5
    progress(f"contention suite: SpMV {n}x{n}, {per_row} per row; busy phases {phases}")

    A = sparsec.random((n, n), per_row / n, "csr", seed=1)
    x = np.random.default_rng(2).uniform(-1.0, 1.0, n)
    k = sparsec.kernel(SPMV, {"A": "csr"})
    # within a dot product's rounding bound, relative to sum |a||x| (a row whose terms
    # cancel may differ from scipy's further than 1e-12 of its result: the kernel's
    # multiply-adds are fused where the CPU has FMA)
    sp = A.to_scipy()
    bound = 1e-12 * (abs(sp) @ np.abs(x))
    assert np.all(np.abs(k(A=A, x=x, threads=threads) - sp @ x) <= bound), "SpMV differs"
    calls = {
        "default": lambda: k(A=A, x=x),
        "1 thread": lambda: k(A=A, x=x, threads=1),
        f"{threads} threads": lambda: k(A=A, x=x, threads=threads),
    }
    repeats = 10 if args.quick else 60
    results = [_phase("quiet", 0, calls, repeats)]
    for count in phases:
        results.append(_phase(f"{count} busy", count, calls, repeats))

    table = Table(
        [
            "phase",
            "busy cores",
            "loadavg",
            "default threads",
            "default ms",
            "1 thread ms",
            f"{threads} threads ms",
            "default / 1",
            f"{threads} / 1",
        ]
    )
    for r in results:
        med, ratio = r["median_ms"], r["over_1_thread"]
        table.add(
            r["phase"],
            round(r["busy_cores_measured"], 2),
            round(r["loadavg_1min"], 2),
            r["default_threads"],
            med["default"],
            med["1 thread"],
            med[f"{threads} threads"],
            f"{ratio['default']:.2f}x",
            f"{ratio[f'{threads} threads']:.2f}x",
        )
    print(f"SpMV {n}x{n} ({A.nnz} nonzeros), float64, {cores} cores")
    print(table.render())
    payload = {
        "suite": "contention",
        "environment": environment(),
        "matrix": {"n": n, "nnz": A.nnz},
        "threads": threads,
        "phases": results,
    }
    path = write_results("contention-quick" if args.quick else "contention", payload)
    progress(f"results written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
