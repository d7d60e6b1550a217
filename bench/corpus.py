"""The sha256 corpus of generated sources: a refactoring of the compiler keeps it identical.

``python -m bench.corpus write FILE [--quick]`` generates (without compiling) every kernel
of a fixed corpus and writes one sha256 per case: the core cases of the kernel tests on
every target and dtype pair, the differential and fuzz seeds, the schedule tests' fixed and
random schedules, the GPU mappings of the CUDA tests, the autotuner's candidates, semirings
and masks. A case the compiler refuses records its error type and message instead, so
refusals are held too. ``python -m bench.corpus compare OLD NEW`` prints every case whose
hash changed (exit status 1 when one did). Run it from the repository root: the cases come
from ``tests/``, and the ``sparsec`` imported is the one in the working directory.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

Case = tuple[str, dict[str, str], str, Any, str, str, dict[str, str]]


def _tests_on_path() -> None:
    if str(Path.cwd() / "tests") not in sys.path:
        sys.path.insert(0, str(Path.cwd() / "tests"))


def _cases(quick: bool) -> Iterator[Case]:
    """(expr, formats, target, schedule, dtype, index_dtype, extra kernel options)."""
    _tests_on_path()
    import test_cuda
    import test_differential
    import test_fuzz
    import test_kernels
    import test_schedule

    pairs = (("float64", "int32"), ("float32", "int64"))
    scale = 4 if quick else 1
    core = [(expr, fmts) for expr, fmts, _, _ in test_kernels.CASES]
    for expr, fmts in core:
        for dtype, idx in pairs:
            for target, schedule in (("c", None), ("c", "serial"), ("cuda-emulated", None)):
                yield expr, fmts, target, schedule, dtype, idx, {}
            for ring in ("min_plus", "max_times"):
                for target in ("c", "cuda-emulated"):
                    yield expr, fmts, target, None, dtype, idx, {"semiring": ring}
    for seed in range(0, 1200 // scale):
        expr, fmts, _, _, dtype, idx = test_differential.random_case(seed)
        for target, schedule in (("c", None), ("c", "serial"), ("cuda-emulated", None)):
            yield expr, fmts, target, schedule, dtype, idx, {}
    for seed in range(0, 1200 // scale):
        case = test_fuzz.random_case(random.Random(seed))
        yield (
            case["expr"],
            case["formats"],
            case["target"],
            None,
            case["dtype"],
            case["index_dtype"],
            {},
        )
    for expr, fmts, schedule, _, _ in test_schedule.ACCEPTANCE:
        yield expr, fmts, "c", schedule, "float64", "int32", {}
    for expr, fmts, schedule, *_ in test_schedule.PRECOMPUTES:
        yield expr, fmts, "c", schedule, "float64", "int32", {}
    for seed in range(0, 600 // scale):
        expr, fmts, _, _, _, schedule = test_schedule._property_case(seed)
        yield expr, fmts, "c", schedule, "float64", "int32", {}
    for _, expr, fmts, schedule, _ in test_cuda.GPU_MAPPINGS:
        for dtype, idx in pairs:
            yield expr, fmts, "cuda-emulated", schedule, dtype, idx, {}
    for table, expr, fmts in (
        (test_cuda.SPMV_SCHEDULES, test_cuda.SPMV, {"A": "csr"}),
        (test_cuda.MTTKRP_SCHEDULES, test_cuda.MTTKRP, {"B": "csf"}),
    ):
        for schedule in table.values():
            yield expr, fmts, "cuda-emulated", schedule, "float64", "int32", {}
    masked = (
        ("C(i,j) = A(i,k) * B(k,j)", {"A": "csr", "B": "csr", "C": "csr", "M": "csr"}),
        ("C(i,j) = A(i,k) * B(k,j)", {"A": "csr", "B": "dense", "M": "csr"}),
        ("C(i,j) = A(i,j) + B(i,j)", {"A": "csr", "B": "csr", "C": "csr", "M": "csr"}),
        ("y(i) = A(i,j) * x(j)", {"A": "csr", "M": "s"}),
    )
    for expr, fmts in masked:
        for mask in ("M", "~M"):
            for target in ("c", "cuda-emulated"):
                yield expr, fmts, target, None, "float64", "int32", {"mask": mask}


def _tuned(expr: str, fmts: dict[str, str]) -> Iterator[Case]:
    """The autotuner's candidate decisions of a C kernel, by their commands as written."""
    import sparsec
    from sparsec.policy import tuning

    k = sparsec.kernel(expr, fmts)
    for decision in tuning.candidates(k.spec, k.generated().loop_order):
        yield expr, fmts, "c", decision.label, "float64", "int32", {}


def _one(case: Case) -> str:
    import sparsec

    expr, fmts, target, schedule, dtype, idx, extra = case
    try:
        k = sparsec.kernel(
            expr, fmts, target=target, schedule=schedule, dtype=dtype, index_dtype=idx, **extra
        )
        text = k.generated(dtype, idx).source
    except sparsec.SparsecError as err:
        said = f"{type(err).__name__}: {err}"
        return "refused " + hashlib.sha256(said.encode()).hexdigest()
    return hashlib.sha256(text.encode()).hexdigest()


def corpus(quick: bool = False) -> dict[str, str]:
    """Case (its repr) -> sha256 of its source or refusal, generated for the kernel tests'
    fixed machine (`conftest.MEASURED_ON`), so two hosts hash alike."""
    from sparsec.policy.machine import use

    _tests_on_path()
    import conftest

    with use(conftest.MEASURED_ON):
        return _hashed(quick)


def _hashed(quick: bool) -> dict[str, str]:
    found: dict[str, str] = {}
    cases = list(_cases(quick))
    import test_kernels

    for expr, fmts, _, _ in test_kernels.CASES:
        cases.extend(_tuned(expr, fmts))
    for case in cases:
        key = repr(case)
        if key not in found:
            found[key] = _one(case)
    return found


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "write":
        start = time.perf_counter()
        found = corpus(quick="--quick" in argv)
        Path(argv[1]).write_text(json.dumps(found, indent=0, sort_keys=True))
        refused = sum(1 for v in found.values() if v.startswith("refused"))
        print(
            f"{len(found)} cases ({refused} refused) hashed in "
            f"{time.perf_counter() - start:.0f} s -> {argv[1]}"
        )
        return 0
    if len(argv) == 3 and argv[0] == "compare":
        old = json.loads(Path(argv[1]).read_text())
        new = json.loads(Path(argv[2]).read_text())
        changed = sorted(k for k in old.keys() & new.keys() if old[k] != new[k])
        only = sorted(old.keys() ^ new.keys())
        for key in changed:
            print(f"changed: {key}")
        for key in only:
            print(f"in one corpus only: {key}")
        same = len(old.keys() & new.keys()) - len(changed)
        print(f"{same} identical, {len(changed)} changed, {len(only)} in one only")
        return 1 if changed or only else 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
