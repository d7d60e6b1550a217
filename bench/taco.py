"""TACO side by side: sparsec against TACO itself, on the same data, in interleaved rounds.

    python -m bench taco [--quick] [--threads 1,2] [--kernels spmv_rand,add] [--rounds 3]

Everything but TACO is in this repository: the inputs are drawn by `bench.taco_data`
(fixed seeds) and written once as files; `bench/taco_driver.cpp`, built here against the
TACO checkout, loads them through TACO's C++ API, builds each kernel with TACO's default
schedule and times it in its own process; `bench.taco_cases` holds the kernels and their
scipy/numpy references. Per kernel:

1. sparsec builds the kernel (``sparsec.kernel``, inputs packed once); the driver builds
   TACO's, and its C is compiled again here with ``-march=native`` ("taco-native": TACO's
   own loops with the flags sparsec compiles with, called by the same driver on the same
   TACO tensors). A dense result is timed in ``compute`` alone (its storage allocated
   once, as TACO's assemble does); a sparse one as TACO's default, assemble then compute
   ("taco"), and as one fused function, assembling while it computes ("taco fused",
   "taco-native").
2. Every contender's result at every thread count is checked against the reference; a
   contender that fails is not timed ("wrong" in the table).
3. `ROUNDS` interleaved rounds (the order rotates by round): per thread count each
   contender gets a block after `bench.common.SETTLE_S` of quiet, 2 untimed calls, then its
   share of 10 timed calls and more until the block has timed `bench.common.BLOCK_MIN_S`
   (at most `bench.common.MOST_PER_BLOCK`). sparsec is timed around its Python call
   (``time.perf_counter``), TACO around the C call in the driver (steady clock): TACO's
   figure holds no call overhead, sparsec's does.

Ratios are TACO ms / sparsec ms (> 1: sparsec faster): the median of the rounds' own
ratios (each round times the two back to back), with their range beside it (a wide
range: a busy spell hit a block); the ms columns are the pooled samples' medians;
the load column is the 1-minute load average seen during the kernel's rounds, and the CPU
model heads the table: a figure is a fact about that CPU under that load. With the load
above the core count, the 2-thread figures say little.

Where things are (environment variables):
  SPARSEC_TACO       a TACO source checkout built in ``build/`` (``build/lib/libtaco.so``);
                     default ``~/taco-bench/src``. Without one this says how to get one.
  SPARSEC_TACO_WORK  the driver build, the data and the kernels' files (default
                     ``~/taco-bench``)
  CXX, TACO_CC       the compilers of the driver (g++) and of TACO's C (cc, TACO's own)
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from . import common
from .common import Table, Timing, environment, progress, write_results
from .taco_cases import CASES, Case, check
from .taco_data import ensure, folder, read

#: rounds per kernel: on a 2-vCPU VM whose speed halves for seconds at a time, three
#: rounds put a contender's median in one spell as often as not (ratios of 0.58x and 1.02x
#: for the same two loops in two runs); five give each round's ratio a majority
ROUNDS = 5
QUICK = ("spmv_rand", "add")
#: TACO's own flags for its C (Module::compile), then the native build's
TACO_CFLAGS = "-O3 -ffast-math -std=c99"
NATIVE_CFLAGS = TACO_CFLAGS + " -march=native"

HOW_TO = """no TACO build at {lib}: this suite compares sparsec with TACO itself, from a TACO
checkout you build once (about 10 minutes on 2 cores):

  git clone https://github.com/tensor-compiler/taco ~/taco-bench/src
  cd ~/taco-bench/src
  # the pybind11 submodule is only for TACO's Python bindings, which are off here, but
  # CMake wants its folder:
  mkdir -p python_bindings/pybind11
  echo '# placeholder (PYTHON=OFF)' > python_bindings/pybind11/CMakeLists.txt
  mkdir -p build && cd build
  cmake -DCMAKE_BUILD_TYPE=Release -DOPENMP=ON -DPYTHON=OFF -DGIT_SUBMODULE=OFF ..
  make -j2 taco

then run `python -m bench taco` again, or point SPARSEC_TACO at another checkout."""


def checkout() -> Path | None:
    """The TACO checkout to use, or None (after printing how to get one) without a build."""
    taco = Path(os.environ.get("SPARSEC_TACO", Path.home() / "taco-bench" / "src")).expanduser()
    lib = taco / "build" / "lib" / "libtaco.so"
    if not lib.exists():
        print(HOW_TO.format(lib=lib))
        return None
    return taco


def work_folder() -> Path:
    return Path(os.environ.get("SPARSEC_TACO_WORK", Path.home() / "taco-bench")).expanduser()


def build_driver(taco: Path, work: Path) -> Path:
    """``work/driver/taco_driver`` built from ``bench/taco_driver.cpp`` against ``taco``;
    rebuilt when the source, the command or libtaco changes."""
    out = work / "driver" / "taco_driver"
    out.parent.mkdir(parents=True, exist_ok=True)
    src = Path(__file__).with_name("taco_driver.cpp")
    lib = taco / "build" / "lib"
    command = [
        *shlex.split(os.environ.get("CXX", "g++")),
        "-O2",
        "-std=c++17",
        "-fopenmp",
        f"-I{taco / 'include'}",
        f"-I{taco / 'build' / 'include'}",
        str(src),
        "-o",
        str(out),
        f"-L{lib}",
        "-ltaco",
        f"-Wl,-rpath,{lib}",
    ]
    stamp = hashlib.sha256(src.read_bytes() + " ".join(command).encode())
    stamp.update(str((lib / "libtaco.so").stat().st_mtime_ns).encode())
    seen = out.with_suffix(".stamp")
    if out.exists() and seen.exists() and seen.read_text() == stamp.hexdigest():
        return out
    progress("building the TACO driver")
    subprocess.run(command, check=True)
    seen.write_text(stamp.hexdigest())
    return out


class Driver:
    """One ``taco_driver`` process: a kernel's TACO tensors and its compiled modules."""

    def __init__(self, exe: Path, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [str(exe)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
            env=env,
        )

    def ask(self, line: str) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        reply = self.proc.stdout.readline().strip()
        if not reply or reply.startswith("ERROR"):
            raise RuntimeError(f"taco_driver, on {line!r}: {reply or 'exited'}")
        return reply

    def time(self, variant: str, mode: str, threads: int, share: int) -> list[float]:
        block = f"2 {share} {common.BLOCK_MIN_S} {common.MOST_PER_BLOCK}"
        reply = self.ask(f"time {variant} {mode} {threads} {block}").split()
        return [float(ms) for ms in reply[1:]]

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
            self.proc.wait(timeout=60)


def _info(reply: str) -> dict[str, Any]:
    head, _, concrete = reply.partition(" concrete=")
    info: dict[str, Any] = {"concrete": concrete}
    for word in head.split()[1:]:
        key, _, value = word.partition("=")
        info[key] = float(value)
    return info


def start_taco(
    case: Case, exe: Path, files: dict[str, Path], fused: bool, env: dict[str, str] | None = None
) -> tuple[Driver, dict[str, Any]]:
    """A driver (in ``env``) with ``case``'s operands loaded and TACO's kernel compiled
    (with the fused function when ``fused``); the COMPILED reply's figures."""
    driver = Driver(exe, env)
    for name, (source, fmt) in case.operands.items():
        driver.ask(f"load {name} {fmt} {files[source]}")
    kind = "f4" if case.float32 else "f8"
    with_fused = "fused" if fused else "-"
    reply = driver.ask(f"compile {case.result} {kind} {case.order} {with_fused} {case.expr}")
    return driver, _info(reply)


def _native(driver: Driver, where: Path) -> str:
    """Compile the driver's TACO C with `NATIVE_CFLAGS` and load it into the driver."""
    source, lib = where / "taco.c", where / "taco_native.so"
    driver.ask(f"source {source}")
    cc = shlex.split(os.environ.get("TACO_CC", "cc"))
    flags = [*NATIVE_CFLAGS.split(), "-fopenmp", "-shared", "-fPIC"]
    subprocess.run([*cc, *flags, str(source), "-o", str(lib), "-lm"], check=True)
    driver.ask(f"native {lib}")
    return " ".join([*cc, *flags])


def run_kernel(
    case: Case, exe: Path, files: dict[str, Path], where: Path, threads: list[int], rounds: int
) -> dict[str, Any]:
    """Check, then time, sparsec and TACO's variants on ``case``."""
    import sparsec

    where.mkdir(parents=True, exist_ok=True)
    data = case.load(files)
    reference = case.reference(data)
    res: dict[str, Any] = {"kernel": case.name, "detail": case.describe(data), "wrong": {}}
    kernel = sparsec.kernel(case.expr, case.sparsec_formats())
    inputs = case.sparsec_inputs(data)
    start = time.perf_counter()
    kernel(threads=threads[0], **inputs)
    res["sparsec_first_call_ms"] = (time.perf_counter() - start) * 1e3
    driver, res["taco_compile"] = start_taco(case, exe, files, fused=case.sparse)
    try:
        res["native_cc"] = _native(driver, where)
        # label -> (variant, mode) of the driver
        modes = (
            {
                "taco": ("taco", "ac"),
                "taco fused": ("taco", "fused"),
                "taco-native": ("native", "fused"),
            }
            if case.sparse
            else {"taco": ("taco", "compute"), "taco-native": ("native", "compute")}
        )
        for t in threads:
            bad = check(kernel(threads=t, **inputs), reference, case.float32)
            if bad:
                res["wrong"].setdefault("sparsec", f"{t}T: {bad}")
            for label, (variant, mode) in modes.items():
                path = where / f"{label.replace(' ', '_')}_{t}.sct"
                driver.ask(f"dump {variant} {mode} {t} {path}")
                bad = check(read(path), reference, case.float32)
                path.unlink()
                if bad:
                    res["wrong"].setdefault(label, f"{t}T: {bad}")
        for label, why in res["wrong"].items():
            progress(f"{case.name}: {label} is WRONG, not timed: {why}")
        blocks: dict[str, Any] = {
            label: (lambda t, n, v=variant, m=mode: driver.time(v, m, t, n))
            for label, (variant, mode) in modes.items()
        }
        blocks["sparsec"] = lambda t, n: list(
            common.measure(
                lambda: kernel(threads=t, **inputs),
                warmup=2,
                repeats=n,
                floor=1,
                min_seconds=common.BLOCK_MIN_S,
            ).samples_ms
        )
        blocks = {label: fn for label, fn in blocks.items() if label not in res["wrong"]}
        res.update(_rounds(blocks, threads, rounds))
    finally:
        driver.close()
    return res


def _rounds(blocks: dict[str, Any], threads: list[int], rounds: int) -> dict[str, Any]:
    """Interleaved rounds of timed blocks (see the module's docstring): label -> threads ->
    the pooled samples' `Timing` summary plus each round's median; the loads seen."""
    share = -(-common.MIN_REPEATS // rounds)
    samples: dict[str, dict[int, list[list[float]]]] = {
        lab: {t: [] for t in threads} for lab in blocks
    }
    labels = list(blocks)
    loads = [os.getloadavg()[0]]
    for r in range(rounds):
        order = labels[r % len(labels) :] + labels[: r % len(labels)]
        for t in threads:
            for label in order:
                if label != "sparsec":  # common.measure waits on its own
                    time.sleep(common.SETTLE_S)
                samples[label][t].append(blocks[label](t, share))
            loads.append(os.getloadavg()[0])
    timings = {
        lab: {
            str(t): Timing(tuple(ms for block in got for ms in block), 2).summary()
            | {"round_medians_ms": [statistics.median(block) for block in got]}
            for t, got in per.items()
        }
        for lab, per in samples.items()
    }
    return {"timings": timings, "load": {"min": min(loads), "max": max(loads), "seen": loads}}


def round_ratios(theirs: dict[str, Any], mine: dict[str, Any]) -> list[float]:
    """Each round's ratio of the two contenders' medians (their blocks ran back to back)."""
    pairs = zip(theirs["round_medians_ms"], mine["round_medians_ms"], strict=True)
    return [a / b for a, b in pairs]


def ratio_of(theirs: dict[str, Any], mine: dict[str, Any]) -> float:
    """The ratio reported: the median of the rounds' own ratios, each a pair of blocks timed
    back to back (a slow spell that covers one contender's block in one round moves one
    ratio of five; it moves the pooled medians' ratio whenever it covers more of one
    contender's rounds than of the other's)."""
    return statistics.median(round_ratios(theirs, mine))


def _ratio(theirs: dict[str, Any], mine: dict[str, Any]) -> str:
    """`ratio_of`, and the range of the rounds' own ratios."""
    each = round_ratios(theirs, mine)
    ratio = f"{ratio_of(theirs, mine):.2f}x"
    return ratio if len(each) < 2 else f"{ratio} ({min(each):.2f}-{max(each):.2f})"


def tables(results: list[dict[str, Any]], threads: list[int]) -> tuple[Table, Table]:
    """The side-by-side table (ratio = TACO ms / sparsec ms) and each contender's speedup
    from 1 thread to the others."""
    side = Table(
        ["kernel", "threads", "sparsec ms", "contender", "its ms", "ratio (rounds)", "load"]
    )
    scaling = Table(["kernel", "who", "threads", "1T ms", "its ms", "speedup"])
    for res in results:
        name = res["kernel"]
        if "error" in res:
            side.add(name, "", "", "error", res["error"][:60], "", "")
            continue
        timings, load = res["timings"], res["load"]
        seen = f"{load['min']:.1f}-{load['max']:.1f}"
        for label in res["wrong"]:
            side.add(name, "", "", label, "wrong", "", seen)
        ours = timings.get("sparsec")
        for t in threads:
            mine = ours[str(t)] if ours else None
            for label, per in timings.items():
                if label == "sparsec":
                    continue
                theirs = per[str(t)]
                side.add(
                    name,
                    t,
                    f"{mine['median_ms']:.4g}" if mine else "-",
                    label,
                    f"{theirs['median_ms']:.4g}",
                    _ratio(theirs, mine) if mine else "-",
                    seen,
                )
        for label, per in timings.items():
            for t in threads:
                if t != 1 and "1" in per:
                    one, many = per["1"]["median_ms"], per[str(t)]["median_ms"]
                    scaling.add(name, label, t, f"{one:.4g}", f"{many:.4g}", f"{one / many:.2f}x")
    return side, scaling


def _commit(taco: Path) -> str:
    done = subprocess.run(
        ["git", "-C", str(taco), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return done.stdout.strip() or "unknown"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench taco",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--quick", action="store_true", help=f"{', '.join(QUICK)} at 1/10 size, 1 round"
    )
    ap.add_argument("--threads", default="1,2", help="thread counts, e.g. 1,2")
    ap.add_argument("--kernels", default=None, help=f"comma-separated, from {', '.join(CASES)}")
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    args = ap.parse_args(argv)
    names = args.kernels.split(",") if args.kernels else list(QUICK if args.quick else CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        ap.error(f"unknown kernel(s) {', '.join(unknown)}; known: {', '.join(CASES)}")
    taco = checkout()
    if taco is None:
        return 0
    threads = [int(t) for t in str(args.threads).split(",")]
    rounds = 1 if args.quick else max(1, args.rounds)
    common.settle(not args.quick)
    work = work_folder()
    try:
        exe = build_driver(taco, work)
    except (OSError, subprocess.CalledProcessError) as err:
        print(f"[bench] could not build bench/taco_driver.cpp against {taco}: {err}")
        return 1
    needed = sorted({src for n in names for src, _ in CASES[n].operands.values()})
    progress(f"taco: the inputs of {', '.join(names)} (drawn once)")
    files = ensure(needed, folder(work, args.quick), 10 if args.quick else 1)
    env = environment()
    machine = env.get("sparsec_machine")
    target = machine.get("target", "?") if isinstance(machine, dict) else "?"
    print(
        f"[bench] TACO {_commit(taco)} ({taco}) against sparsec on {env['processor']} "
        f"(sparsec's -march {target}), {env['cpu_count']} CPUs, load {os.getloadavg()[0]:.2f} at the start"
    )
    results = []
    for name in names:
        progress(f"taco: {name} at {threads} thread(s), {rounds} round(s)")
        try:
            results.append(
                run_kernel(CASES[name], exe, files, work / "kernels" / name, threads, rounds)
            )
        except (RuntimeError, subprocess.CalledProcessError) as err:
            results.append({"kernel": name, "error": str(err)})
    side, scaling = tables(results, threads)
    print("[bench] TACO side by side (ratio = TACO ms / sparsec ms; > 1: sparsec faster)")
    print(side.render())
    if len(threads) > 1 and 1 in threads:
        print("[bench] scaling (1-thread ms / n-thread ms)")
        print(scaling.render())
    for res in results:
        if "detail" in res:
            print(f"  {res['kernel']}: {res['detail']}")
    print(f"[bench] load {os.getloadavg()[0]:.2f} at the end")
    payload = {
        "environment": env,
        "taco": {
            "checkout": str(taco),
            "commit": _commit(taco),
            "cflags": TACO_CFLAGS,
            "native_cflags": NATIVE_CFLAGS,
        },
        "threads": threads,
        "rounds": rounds,
        "kernels": results,
    }
    write_results("taco-quick" if args.quick else "taco", payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
