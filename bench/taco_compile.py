"""Cold compile against TACO: sparsec's generate + cc against TACO's lower + cc, each kernel
compiled in fresh processes, on the kernels of `bench.taco` (issue 24).

    python -m bench.taco_compile [--quick] [--kernels spmv_rand,...] [--repeats 3]
                                 [--taco-cflags "-O3 -ffast-math -std=c99 -march=native"]

What is timed, per repeat (the contenders alternate their order from repeat to repeat):

- sparsec "kernel": a fresh Python process with an empty ``SPARSEC_CACHE_DIR`` (no kernel
  cache hit) that has already compiled one unrelated small kernel, so the process's one-time
  setup (the grammar's tables, the template, the compiler probe) is done, times
  ``sparsec.kernel(...)`` (parse, plan) plus ``Kernel.executable(...)`` for the call's
  dtypes and extents, as its first call builds it (generate C, cc, load; a tiled kernel
  holds the register-tile stages of those extents, `sparsec.passes.stages`): the compile
  of a kernel never built before. This is the
  figure held against TACO's lower + cc (TACO's one-time setup, loading libtaco, is
  outside its timer too). No kernel run is in it: the first and second calls are timed
  apart. A kernel whose sparse output has a single pass builds its two phases when a call
  first needs them (`sparsec.runtime.loaded.Loaded`); the first call of these kernels
  runs the single pass, so the figure is what a user waits for before a first result.
- sparsec "process": the same with no setup before (the first kernel of a process).
- TACO: a fresh ``bench/taco_driver.cpp`` process (TACO keeps no kernel cache on disk)
  that loads the operands (untimed), then times parsing the expression, TACO's default
  transformations, lowering (assemble and compute) and ``Module::compile`` (C, cc,
  dlopen), what ``TensorBase::compile()`` does; for a sparse output also the fused
  assemble-while-compute function, in a module of its own, reported apart. TACO
  compiles with ``TACO_CFLAGS = --taco-cflags``, by default TACO-native's flags (TACO's
  own plus ``-march=native``, as ``bench taco`` times it); sparsec with its defaults
  (``-O3 -march=native -fopenmp -falign-loops=32``). Both use the same ``cc``.

Medians over the repeats; ratio = sparsec kernel ms / TACO lower + cc ms (> 1: sparsec
slower). Needs the TACO build that ``bench taco`` finds, and uses its driver and data
(the same variables).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from .common import Table, environment, progress, write_results
from .taco import build_driver, checkout, start_taco, work_folder
from .taco_cases import CASES
from .taco_data import ensure, folder

ROOT = Path(__file__).resolve().parent.parent

#: the one kernel of ``--quick`` (a smoke run)
QUICK_KERNEL = "spmv_rand"

_PROBE = r"""
import json, os, sys, time
from pathlib import Path
import numpy as np
import sparsec
from bench.taco_cases import CASES
case = CASES[{name!r}]
inputs = case.sparsec_inputs(case.load({{k: Path(v) for k, v in {files!r}.items()}}))
load0 = os.getloadavg()[0]
if {setup!r}:  # the process's one-time setup, on an unrelated small kernel
    sparsec.kernel("w(i) = u(i) * v(i) + u(i)")(u=np.ones(3), v=np.ones(3))
t0 = time.perf_counter()
k = sparsec.kernel(case.expr, case.sparsec_formats())
t1 = time.perf_counter()
prepared = k.binder.prepare(inputs)  # validates and converts inputs: not compile
t2 = time.perf_counter()
k.executable(prepared.dtype, prepared.index_dtype, prepared)  # as the first call builds it
t3 = time.perf_counter()
k(threads=1, **inputs)
t4 = time.perf_counter()
k(threads=1, **inputs)
t5 = time.perf_counter()
ms = lambda a, b: (b - a) * 1e3
print(json.dumps({{"parse_plan_ms": ms(t0, t1), "generate_cc_ms": ms(t2, t3),
                  "compile_ms": ms(t0, t1) + ms(t2, t3), "first_call_ms": ms(t3, t4),
                  "second_call_ms": ms(t4, t5), "load": (load0 + os.getloadavg()[0]) / 2}}))
"""


def _sparsec(name: str, files: dict[str, str], setup: bool) -> dict[str, float]:
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    )
    with tempfile.TemporaryDirectory(prefix="sc-compile-") as cache:
        done = subprocess.run(
            [sys.executable, "-c", _PROBE.format(name=name, files=files, setup=setup)],
            env=dict(env, SPARSEC_CACHE_DIR=cache),
            capture_output=True,
            text=True,
            check=True,
        )
    return json.loads(done.stdout.strip().splitlines()[-1])


def _taco(exe: Path, name: str, files: dict[str, Path], cflags: str) -> dict[str, float]:
    """A fresh driver: TACO's tensors loaded (untimed), then its kernel compiled, with the
    fused function of a sparse result in a second module (reported apart)."""
    load0 = os.getloadavg()[0]
    driver, info = start_taco(
        CASES[name], exe, files, fused=True, env=dict(os.environ, TACO_CFLAGS=cflags)
    )
    driver.close()
    out = {key: value for key, value in info.items() if isinstance(value, float)}
    out["lower_cc_ms"] = out["lower_ms"] + out["cc_ms"]
    out["load"] = (load0 + os.getloadavg()[0]) / 2
    return out


def _median(rows: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in rows) for key in rows[0]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.taco_compile", description=__doc__)
    ap.add_argument("--quick", action="store_true", help=f"only {QUICK_KERNEL}, one repeat")
    ap.add_argument("--threads", default="1", help="ignored: compiling is one thread's work")
    ap.add_argument("--kernels", default=None, help=f"comma-separated, from {', '.join(CASES)}")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--taco-cflags", default="-O3 -ffast-math -std=c99 -march=native")
    args = ap.parse_args(argv)
    kernels = (
        args.kernels.split(",") if args.kernels else [QUICK_KERNEL] if args.quick else list(CASES)
    )
    unknown = [n for n in kernels if n not in CASES]
    if unknown:
        ap.error(f"unknown kernel(s) {', '.join(unknown)}; known: {', '.join(CASES)}")
    taco = checkout()
    if taco is None:
        return 0
    work = work_folder()
    exe = build_driver(taco, work)
    needed = sorted({src for n in kernels for src, _ in CASES[n].operands.values()})
    files = ensure(needed, folder(work, False), 1)
    repeats = 1 if args.quick else max(1, args.repeats)
    table = Table(
        [
            "kernel",
            "sparsec ms",
            "parse+plan",
            "generate+cc",
            "1st kernel of a process",
            "TACO lower+cc ms",
            "ratio",
            "TACO fused module",
            "load",
        ]
    )
    results: dict[str, Any] = {"taco_cflags": args.taco_cflags, "kernels": {}}
    for name in kernels:
        progress(f"taco_compile: {name}, {repeats} repeat(s)")
        runs: dict[str, list[dict[str, float]]] = {"kernel": [], "process": [], "taco": []}
        for r in range(repeats):
            order = ["kernel", "process", "taco"]
            for what in order if r % 2 == 0 else order[::-1]:
                if what == "taco":
                    runs[what].append(_taco(exe, name, files, args.taco_cflags))
                else:
                    paths = {key: str(path) for key, path in files.items()}
                    runs[what].append(_sparsec(name, paths, setup=what == "kernel"))
        mine, first, theirs = (_median(runs[w]) for w in ("kernel", "process", "taco"))
        fused = theirs.get("fused_lower_ms", 0.0) + theirs.get("fused_cc_ms", 0.0)
        loads = [row["load"] for rows in runs.values() for row in rows]
        table.add(
            name,
            f"{mine['compile_ms']:.1f}",
            f"{mine['parse_plan_ms']:.1f}",
            f"{mine['generate_cc_ms']:.1f}",
            f"{first['compile_ms']:.1f}",
            f"{theirs['lower_cc_ms']:.1f}",
            f"{mine['compile_ms'] / theirs['lower_cc_ms']:.2f}",
            f"{fused:.0f}" if theirs.get("sparse") else "-",
            f"{min(loads):.1f}-{max(loads):.1f}",
        )
        results["kernels"][name] = {"sparsec": mine, "process": first, "taco": theirs, "raw": runs}
    print("[bench] cold compile (ratio = sparsec kernel ms / TACO lower + cc ms; > 1: slower)")
    print(table.render())
    write_results(
        "taco_compile-quick" if args.quick else "taco_compile",
        {"environment": environment(), "taco": str(taco), **results},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
