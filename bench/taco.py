"""TACO side by side: sparsec against TACO itself on the same data, in one run.

    python -m bench.taco [--quick] [--threads 1,2] [--kernels spmv_rand,...] [--rounds 3]

Runs the harness of ``../shared/taco-bench`` (a data generator, a C++ driver over libtaco
that keeps one TACO process per variant, and a runner that checks every result against
scipy/numpy before it times TACO, TACO with ``-march=native`` and sparsec in interleaved
rounds). What this module adds: finding a TACO build, building the driver and the data once,
and the table and JSON in the form of the other suites (ratios TACO / sparsec: > 1 means
sparsec is faster), with the load average during each kernel.

Where things are (environment variables):
  SPARSEC_TACO        a TACO source checkout with its build in ``build/`` (libtaco.so);
                      default ``~/taco-bench/src``. Without one this prints how to build it.
  SPARSEC_TACO_BENCH  the harness folder (default ``../shared/taco-bench`` beside the repo)
  SPARSEC_TACO_WORK   where the driver, data and results go (default ``~/taco-bench``)

The runner waits for a quiet machine (1-minute load below 1) before each kernel, up to
``--wait`` seconds; a timing taken above that says so in its load column.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from .common import Table, environment, progress, write_results

ROOT = Path(__file__).resolve().parent.parent
KERNELS = (
    "spmv_randhalf,spmv_rand,spmv_randdouble,spmv_band,spmm,spmm32,mttkrp,ttv,spgemm1,"
    "spgemm2,add,sddmm"
)
QUICK_KERNELS = "spmv_rand,add"

HOW_TO = """no TACO build found (looked for {lib}).
To build one (about 10 minutes on 2 cores):
  git clone https://github.com/tensor-compiler/taco ~/taco-bench/src   (or the fetch tool's mirror)
  cd ~/taco-bench/src && mkdir -p python_bindings/pybind11 \\
    && echo '# not needed with PYTHON=OFF' > python_bindings/pybind11/CMakeLists.txt
  mkdir build && cd build && cmake -DCMAKE_BUILD_TYPE=Release -DOPENMP=ON -DPYTHON=OFF \\
    -DGIT_SUBMODULE=OFF .. && make -j2 taco
then rerun, or point SPARSEC_TACO at the checkout. ../shared/taco-bench/README.txt has more."""


def _paths() -> tuple[Path, Path, Path]:
    taco = Path(os.environ.get("SPARSEC_TACO", Path.home() / "taco-bench" / "src"))
    harness = Path(os.environ.get("SPARSEC_TACO_BENCH", ROOT.parent / "shared" / "taco-bench"))
    work = Path(os.environ.get("SPARSEC_TACO_WORK", Path.home() / "taco-bench"))
    return taco, harness, work


def ready() -> tuple[Path, Path, Path] | None:
    """(the TACO checkout, the work folder, the runner's scripts folder, prepared by
    `_prepare`), or None after saying what is missing (a TACO build, the harness)."""
    taco, harness, work = _paths()
    lib = taco / "build" / "lib" / "libtaco.so"
    if not lib.exists():
        print(HOW_TO.format(lib=lib))
        return None
    if not (harness / "run_bench.py").exists():
        print(f"no TACO harness at {harness}: set SPARSEC_TACO_BENCH to ../shared/taco-bench")
        return None
    return taco, work, _prepare(taco, harness, work)


def harness_env(work: Path, **more: str) -> dict[str, str]:
    """The environment the harness's processes run in: its data, and this checkout first
    on the path (so they import this sparsec)."""
    return dict(
        os.environ,
        BENCH_DATA=str(work / "data"),
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        **more,
    )


def _prepare(taco: Path, harness: Path, work: Path) -> Path:
    """The runner's folder under ``work/scripts``: the harness copied (it is read-only where
    it is shared), its driver built against ``taco``, and the data generated once."""
    scripts = work / "scripts"
    scripts.mkdir(parents=True, exist_ok=True)
    for src in harness.iterdir():
        dst = scripts / src.name
        if src.is_file() and (not dst.exists() or dst.read_bytes() != src.read_bytes()):
            shutil.copyfile(src, dst)
    driver = scripts / "taco_bench"
    if not driver.exists() or driver.stat().st_mtime < (scripts / "taco_bench.cpp").stat().st_mtime:
        progress("building the TACO driver")
        subprocess.run(["make", f"TACO_SRC={taco}"], cwd=scripts, check=True)
    data = work / "data"
    if not data.exists() or not any(data.iterdir()):
        progress("generating the data (about a minute)")
        subprocess.run([sys.executable, "gen_data.py", str(data)], cwd=scripts, check=True)
    return scripts


def _rows(results: dict[str, Any], threads: list[int]) -> Table:
    table = Table(["kernel", "threads", "sparsec ms", "contender", "its ms", "ratio", "load"])
    for res in results["kernels"]:
        if "timings" not in res:
            table.add(res["kernel"], "", "", "error", res.get("error", "?"), "", "")
            continue
        load = res.get("load_during", {})
        seen = f"{load.get('min', 0):.1f}-{load.get('max', 0):.1f}"
        ours = res["timings"]["sparsec"]
        for t in threads:
            mine = ours[str(t)]["median_ms"]
            for label, per in res["timings"].items():
                if label == "sparsec" or str(t) not in per:
                    continue
                theirs = per[str(t)]["median_ms"]
                ratio = f"{theirs / mine:.2f}x"
                table.add(res["kernel"], t, f"{mine:.4g}", label, f"{theirs:.4g}", ratio, seen)
    return table


def _scaling(results: dict[str, Any], threads: list[int]) -> Table:
    """Each kernel's speedup from 1 thread to each other count, for sparsec and every
    contender (the issue asks sparse-output kernels for at least 1.6x on 2 threads)."""
    table = Table(["kernel", "who", "threads", "1T ms", "its ms", "speedup", "load"])
    for res in results["kernels"]:
        timings = res.get("timings")
        if not timings:
            continue
        load = res.get("load_during", {})
        seen = f"{load.get('min', 0):.1f}-{load.get('max', 0):.1f}"
        for label in sorted(timings, key=lambda lab: (lab != "sparsec", lab)):
            per = timings[label]
            for t in threads:
                if t == 1 or "1" not in per or str(t) not in per:
                    continue
                one, many = per["1"]["median_ms"], per[str(t)]["median_ms"]
                table.add(
                    res["kernel"], label, t, f"{one:.4g}", f"{many:.4g}", f"{one / many:.2f}x", seen
                )
    return table


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.taco", description=__doc__)
    ap.add_argument("--quick", action="store_true", help=f"only {QUICK_KERNELS}, one round")
    ap.add_argument("--threads", default="1,2", help="thread counts, e.g. 1,2")
    ap.add_argument("--kernels", default=None, help=f"comma-separated, from {KERNELS}")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--wait", type=float, default=600, help="seconds to wait for a quiet machine")
    args = ap.parse_args(argv)
    found = ready()
    if found is None:
        return 0
    taco, work, scripts = found
    kernels = args.kernels or (QUICK_KERNELS if args.quick else KERNELS)
    rounds = 1 if args.quick else args.rounds
    threads = [int(t) for t in str(args.threads).split(",")]
    out = work / "work" / "results.json"
    env = harness_env(
        work, BENCH_WORK=str(work / "work"), SPARSEC_CACHE_DIR=str(work / "work" / "sc_cache")
    )
    command = [
        sys.executable,
        str(scripts / "run_bench.py"),
        f"--kernels={kernels}",
        f"--threads={','.join(map(str, threads))}",
        f"--rounds={rounds}",
        f"--initial-wait={0 if args.quick else args.wait}",
        f"--kernel-wait={0 if args.quick else min(args.wait, 180)}",
        f"--out={out}",
    ]
    progress(f"[bench] taco: {kernels} at {threads} thread(s), {rounds} round(s)")
    subprocess.run(command, env=env, check=True, stdout=sys.stderr)
    results = json.loads(out.read_text())
    table = _rows(results, threads)
    print("[bench] TACO side by side (ratio = contender ms / sparsec ms; > 1: sparsec faster)")
    print(table.render())
    if 1 in threads and len(threads) > 1:
        print("[bench] scaling (1-thread ms / n-thread ms; each kernel's own runs)")
        print(_scaling(results, threads).render())
    write_results("taco", {"environment": environment(), "taco": str(taco), "runner": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
