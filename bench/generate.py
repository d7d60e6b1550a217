"""Cold code generation time: ``python -m bench generate [--rounds N]``.

Each measurement is a fresh Python process that imports sparsec (not timed), then times
its first ``Kernel.generated()`` for one statement: parsing, the middle end, every
lowering, the passes and the printer, with no in-process memo warm. Nothing is compiled.
The cases run in interleaved rounds; the table gives each one's median and spread in ms,
with the CPU model and load (these are facts about that machine).
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
expr, formats, target = {args!r}
start = time.perf_counter()
k = sparsec.kernel(expr, formats, target=target)
k.generated()
print(time.perf_counter() - start)
"""


def _once(name: str) -> float:
    code = _CHILD.format(args=CASES[name])
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=os.getcwd()
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
    if "--quick" in argv:
        rounds = 3
    times: dict[str, list[float]] = {name: [] for name in CASES}
    for _ in range(rounds):
        for name in CASES:
            times[name].append(_once(name))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"cold generate, {rounds} rounds; CPU: {_cpu()}, {os.cpu_count()} cpus, load {load:.2f}")
    print(f"{'case':14s} {'median ms':>10s} {'min':>8s} {'max':>8s}")
    for name, samples in times.items():
        print(
            f"{name:14s} {statistics.median(samples):10.1f} {min(samples):8.1f} {max(samples):8.1f}"
        )
    results = Path(__file__).resolve().parent / "results"
    results.mkdir(exist_ok=True)
    record = {"cpu": _cpu(), "load": load, "rounds": rounds, "ms": times}
    (results / "generate.json").write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
