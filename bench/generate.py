"""Cold code generation time: ``python -m bench generate [--rounds N]``.

Each measurement is a fresh Python process that imports sparsec (not timed), then times
its first ``Kernel.generated()`` for one statement ("first"), or the generation of a new
statement after another one loaded the parser and templates ("next"): parsing, the middle end, every
lowering, the passes and the printer, with no in-process memo warm. Nothing is compiled.
The cases run in interleaved rounds; the table gives each one's median and spread in ms,
with the CPU model and load (these are facts about that machine). ``--against DIR`` times
another checkout's sparsec in the same rounds, interleaved, so both see the same load.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

#: name -> (expression, formats, target)
CASES = {
    "spmv": ("y(i) = A(i,j) * x(j)", {"A": "csr"}, "c"),
    "spmm": ("C(i,j) = A(i,k) * B(k,j)", {"A": "csr"}, "c"),
    "spgemm": ("C(i,j) = A(i,k) * B(k,j)", {"A": "csr", "B": "csr", "C": "csr"}, "c"),
    "mttkrp": ("A(i,j) = B(i,k,l) * D(l,j) * C(k,j)", {"B": "csf"}, "c"),
    "spmv-cuda": ("y(i) = A(i,j) * x(j)", {"A": "csr"}, "cuda-emulated"),
    "spgemm-cuda": (
        "C(i,j) = A(i,k) * B(k,j)",
        {"A": "csr", "B": "csr", "C": "csr"},
        "cuda-emulated",
    ),
}

_CHILD = """
import sys, time
import sparsec
expr, formats, target, warm = {args!r}
if warm:  # the parser, the templates and the printer loaded by another statement first
    sparsec.kernel("w(i) = u(i) * v(i) + 2", target=target).generated()
start = time.perf_counter()
k = sparsec.kernel(expr, formats, target=target)
k.generated()
print(time.perf_counter() - start)
"""


def _once(name: str, tree: str, warm: bool) -> float:
    code = _CHILD.format(args=(*CASES[name], warm))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tree
    )
    return float(out.stdout.strip()) * 1e3


def _cpu() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    rounds = 7
    if "--rounds" in argv:
        rounds = int(argv[argv.index("--rounds") + 1])
    if "--quick" in argv:  # a smoke run: one round
        rounds = 1
    trees = {"here": os.getcwd()}
    if "--against" in argv:  # another checkout, timed in the same rounds (same load)
        trees["against"] = argv[argv.index("--against") + 1]
    times: dict[tuple[str, str, bool], list[float]] = {}
    for _ in range(rounds):
        for name in CASES:
            for warm in (False, True):
                for label, tree in trees.items():
                    times.setdefault((label, name, warm), []).append(_once(name, tree, warm))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"cold generate, {rounds} rounds; CPU: {_cpu()}, {os.cpu_count()} cpus, load {load:.2f}")
    print("first: the process's first kernel; next: a new statement after another one")
    print(f"{'tree':8s} {'case':13s} {'kernel':6s} {'median ms':>10s} {'min':>8s} {'max':>8s}")
    for (label, name, warm), samples in times.items():
        print(
            f"{label:8s} {name:13s} {'next' if warm else 'first':6s} "
            f"{statistics.median(samples):10.2f} {min(samples):8.2f} {max(samples):8.2f}"
        )
    results = Path(__file__).resolve().parent / "results"
    results.mkdir(exist_ok=True)
    record = {
        "cpu": _cpu(),
        "load": load,
        "rounds": rounds,
        "trees": trees,
        "ms": {f"{t} {n} {'next' if w else 'first'}": v for (t, n, w), v in times.items()},
    }
    (results / "generate.json").write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
