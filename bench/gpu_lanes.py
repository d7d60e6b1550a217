"""SpMV's lanes per row on a GPU: thread-per-row and CSR-vector with 2-32 lanes per row,
over rows of 2 to 128 nonzeros, against cuSPARSE; the data behind `vector_lanes`.

    python -m bench.gpu_lanes [--quick]

Each matrix is n x n with exactly ``per_row`` uniformly drawn columns per row and about
16M nonzeros (n = 16M / per_row, at most 1M rows), float64 values, int32 indices. Each
kernel's result is checked against scipy, then the kernel alone is timed on staged inputs
(`Kernel.device_launch`, CUDA events around 10 launches, median of 30 batches), as
``bench gpu`` does; cuSPARSE is ``cupyx.scipy.sparse``'s CSR times a vector, timed the
same way. Without a GPU it says so and exits.
"""

from __future__ import annotations

import argparse

import numpy as np

import sparsec
from sparsec.policy.schedules import vector_lanes, vector_schedule
from sparsec.runtime import device

from .common import Table, environment, progress, write_results
from .core import WrongResult, random_rows_csr
from .gpu import SCHEDULES, SPMV, _event_median

LANES = (2, 4, 8, 16, 32)


def _schedules() -> dict[str, str]:
    found = {"thread per row": SCHEDULES["spmv"]["thread per row"]}
    for lanes in LANES:
        commands = ", ".join(str(c) for c in vector_schedule("i", "j", "A", lanes))
        found[f"{lanes} lanes"] = commands
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_lanes", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes")
    parser.add_argument("--threads", type=int, default=None, help="ignored (suite interface)")
    args = parser.parse_args(argv)
    try:
        cp = device.cupy_device()
        import cupyx.scipy.sparse as csp  # type: ignore[import-not-found]
    except (sparsec.SparsecError, ImportError) as err:
        progress(f"no GPU: {err}")
        return 0
    schedules = _schedules()
    kernels = {
        label: sparsec.kernel(SPMV, {"A": "csr"}, target="cuda", schedule=s)
        for label, s in schedules.items()
    }
    table = Table(["per row", "rows", "cuSPARSE ms", *schedules, "best", "default picks"])
    records = []
    rng = np.random.default_rng(0)
    total = 200_000 if args.quick else 16_000_000
    for per_row in (2, 3, 4, 6, 8, 10, 16, 24, 32, 64, 128):
        n = min(1_000_000, total // per_row)
        progress(f"{per_row} per row, {n} rows")
        a = random_rows_csr(n, per_row, rng, np.float64)
        x = rng.standard_normal(n)
        want = a @ x
        tensor = sparsec.Tensor.from_scipy(a, "csr")
        times = {}
        for label, k in kernels.items():
            launch, out = k.device_launch(A=tensor, x=cp.asarray(x))
            launch()
            if not np.allclose(cp.asnumpy(out), want, rtol=1e-9, atol=1e-9):
                raise WrongResult(f"{per_row} per row, {label}: disagrees with scipy")
            times[label] = _event_median(launch)
        da, dx = csp.csr_matrix(a), cp.asarray(x)
        if not np.allclose(cp.asnumpy(da @ dx), want, rtol=1e-9, atol=1e-9):
            raise WrongResult(f"{per_row} per row: cuSPARSE disagrees with scipy")
        cusparse = _event_median(lambda da=da, dx=dx: da @ dx)
        best = min(times, key=times.__getitem__)
        lanes = vector_lanes(per_row)
        picked = f"{lanes} lanes" if lanes else "thread per row"
        table.add(per_row, n, cusparse, *times.values(), best, picked)
        records.append({"per_row": per_row, "rows": n, "cusparse_ms": cusparse, "kernel_ms": times})
    print(table.render())
    print("\nkernel ms: the kernel alone on staged inputs; best: the fastest sparsec mapping")
    path = write_results(
        "gpu_lanes-quick" if args.quick else "gpu_lanes",
        {"environment": environment(), "rows": records},
    )
    progress(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
