"""Distributed suite: sparsec.distributed on a 2-worker Dask LocalCluster against one process,
and `sd.model` for P up to 512.

    python -m bench.distributed [--quick] [--threads N]

Cluster rows (SpMV, SpMM, MTTKRP; float64, int32): the kernel in this process on the whole
tensor ("one process"), the distributed call ("distributed", numpy result on the driver),
and its overheads measured apart: "task latency" (submit and gather one no-op task),
"transfer" (send the dense operands to a worker by tasks, as
a call does, and touch them there: includes one task latency) and "kernel on parts" (the slowest
part's kernel time, timed inside the worker). Medians over interleaved rounds; the machine
is shared, so its load is recorded. Model rows: bytes moved and imbalance per P on a
generated power-law matrix and a FROSTT-like (power-law) 3-tensor.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import numpy as np
import scipy.sparse as sp

import sparsec
from sparsec.distributed import tasks

from .common import Table, environment, measure_rounds, progress, write_results

SPMV = ("y(i) = A(i,j) * x(j)", {"A": "csr"})
SPMM = ("Y(i,k) = A(i,j) * X(j,k)", {"A": "csr"})
MTTKRP = ("Y(i,j) = T(i,k,l) * D(l,j) * C(k,j)", {"T": "csf"})


def power_law_matrix(n: int, mean_per_row: int, seed: int = 0) -> sp.csr_matrix:
    """Rows with Zipf-distributed lengths (a few very heavy rows), columns also skewed."""
    rng = np.random.default_rng(seed)
    lengths = np.minimum(rng.zipf(1.8, n), n // 4)
    lengths = np.maximum(1, (lengths * mean_per_row / lengths.mean()).astype(int))
    rows = np.repeat(np.arange(n), lengths)
    cols = np.minimum(rng.zipf(1.5, len(rows)) - 1, n - 1)
    cols = (cols * 7919 + rows) % n  # spread the hot columns
    A = sp.csr_matrix((rng.random(len(rows)), (rows, cols)), shape=(n, n))
    A.sum_duplicates()
    return A


def power_law_tensor(shape: tuple[int, int, int], nnz: int, seed: int = 1) -> sparsec.Tensor:
    rng = np.random.default_rng(seed)
    coords = np.stack([np.minimum(rng.zipf(1.6, nnz) - 1, s - 1) for s in shape])
    coords[0] = (coords[0] * 104729) % shape[0]
    return sparsec.Tensor.from_coo(coords, rng.random(nnz), shape, "csf")


def _parts_time(client: Any, k: Any, d: Any, inputs: dict[str, Any], name: str, reps: int) -> float:
    """Slowest part's median kernel time (ms), timed on the workers."""
    futs = [
        client.submit(_time_part, k._args, name, part, inputs, reps, pure=False)
        for part in d.futures
    ]
    return max(client.gather(futs))


def _time_part(args: bytes, name: str, part: Any, inputs: dict[str, Any], reps: int) -> float:
    kern = tasks.worker_kernel(args)
    call = dict(inputs, **{name: part})
    kern(threads=1, **call)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        kern(threads=1, **call)
        times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times))


def _time_case(
    client: Any,
    local: Any,
    dk: Any,
    name: str,
    whole: Any,
    d: Any,
    dense: dict[str, Any],
    quick: bool,
) -> dict[str, Any]:
    """Interleaved rounds: one process, the distributed call, and its overheads apart."""
    return measure_rounds(
        {
            "one process (1 thread)": lambda: local(threads=1, **{name: whole}, **dense),
            "distributed (2 workers)": lambda: dk(**{name: d}, **dense),
            "task latency": lambda: client.submit(int, 1, pure=False).result(),
            "transfer": lambda: client.gather(
                [
                    client.submit(len, client.submit(tasks.identity, v, pure=False))
                    for v in dense.values()
                ]
            ),
        },
        warmup=1,
        repeats=5 if quick else 10,
    )


def cluster_rows(quick: bool, table: Table, payload: dict[str, Any]) -> None:
    import distributed

    import sparsec.distributed as sd

    n = 20_000 if quick else 400_000
    A = power_law_matrix(n, 16)
    T = power_law_tensor((n // 10, 500, 400), 200_000 if quick else 4_000_000)
    rng = np.random.default_rng(2)
    cases = {
        "spmv": (SPMV, "A", A, {"x": rng.random(n)}),
        "spmm (k=32)": (SPMM, "A", A, {"X": rng.random((n, 32))}),
        "mttkrp (j=16)": (MTTKRP, "T", T, {"D": rng.random((400, 16)), "C": rng.random((500, 16))}),
    }
    cluster = distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    )
    with distributed.Client(cluster) as client:
        for label, ((expr, formats), name, value, dense) in cases.items():
            progress(f"cluster: {label}")
            local = sparsec.kernel(expr, formats)
            whole = sparsec.as_tensor(value, formats[name])
            dk = sd.kernel(expr, formats)
            d = sd.from_tensor(whole, 2, client=client, name=name).persist()
            want = local(threads=1, **{name: whole}, **dense)
            got = dk(**{name: d}, **dense)
            if not np.allclose(got, want):
                raise AssertionError(f"{label}: distributed result differs")
            timings = _time_case(client, local, dk, name, whole, d, dense, quick)
            part_ms = _parts_time(client, dk, d, {k: v for k, v in dense.items()}, name, 5)
            row = {key: t.median_ms for key, t in timings.items()}
            row["kernel on parts"] = part_ms
            row["nnz"] = whole.nnz
            payload["cluster"][label] = row
            table.add(
                label,
                whole.nnz,
                row["one process (1 thread)"],
                row["distributed (2 workers)"],
                part_ms,
                row["task latency"],
                row["transfer"],
            )
    cluster.close()


def model_rows(quick: bool, table: Table, payload: dict[str, Any]) -> None:
    import sparsec.distributed as sd

    n = 20_000 if quick else 1_000_000
    A = power_law_matrix(n, 16)
    T = power_law_tensor((n // 10, 2000, 1000), 200_000 if quick else 5_000_000)
    kernels = {
        "spmv power-law": (sd.kernel(*SPMV), A, {}),
        "spmm power-law (k=64)": (sd.kernel(*SPMM), A, {"k": 64}),
        "mttkrp frostt-like (j=16)": (sd.kernel(*MTTKRP), T, {"j": 16}),
    }
    for label, (k, value, dims) in kernels.items():
        progress(f"model: {label}")
        for P in (1, 2, 8, 32, 128, 512):
            m = sd.model(k, value, parts=P, dims=dims)
            payload["model"].setdefault(label, []).append(m.__dict__)
            table.add(
                label,
                P,
                m.imbalance,
                m.max_part_nnz,
                m.part_bytes >> 20,
                m.replicated_bytes >> 20,
                m.needed_bytes >> 20,
                m.output_bytes >> 20,
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.distributed", description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--no-cluster", action="store_true", help="the model table only")
    args = parser.parse_args(argv)
    try:
        import distributed  # noqa: F401
    except ImportError:
        print("bench distributed needs dask[distributed]: pip install 'sparsec[distributed]'")
        return 0
    payload: dict[str, Any] = {"environment": environment(), "cluster": {}, "model": {}}
    payload["load_before"] = os.getloadavg()
    if not args.no_cluster:
        table = Table(
            [
                "case",
                "nnz",
                "one proc ms",
                "distributed ms",
                "kernel on parts ms",
                "task latency ms",
                "transfer ms",
            ]
        )
        cluster_rows(args.quick, table, payload)
        print(table.render())
        print()
    model = Table(
        [
            "tensor",
            "P",
            "imbalance",
            "max part nnz",
            "parts MiB",
            "dense replicated MiB",
            "dense needed MiB",
            "output MiB",
        ]
    )
    model_rows(args.quick, model, payload)
    print(model.render())
    payload["load_after"] = os.getloadavg()
    print(f"\nload average before/after: {payload['load_before']} / {payload['load_after']}")
    write_results("distributed", payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
