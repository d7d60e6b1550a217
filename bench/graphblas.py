"""sparsec against SuiteSparse:GraphBLAS (python-graphblas) in the same process (issue 24).

    python -m bench graphblas [--quick] [--threads 1,2]

The kernels of issue 24's GraphBLAS comparison, at the sizes of `bench.taco`'s inputs
(the same constructions, drawn here with a fixed seed, so no TACO build is needed): SpMV 50k and 100k (10 random entries per row), SpGEMM 20k x 20k squared, sparse
add ``B + C`` and ``B + C * D`` (D on C's pattern, so the product is not empty), all CSR
into CSR, and SDDMM ``B(i,j) * C(i,k) * D(k,j)`` into CSR (20k, k = 64). Both get their
preferred layouts, prepared outside the timing: CSR matrices, and ``D`` stored transposed,
for GraphBLAS's masked dot product (row-major ``D`` makes it compute the whole dense
product) and for sparsec's dots, which read ``D`` along ``k`` (passed as the transposed
copy's view ``Dt.T``, read without a copy; a row-major ``D`` costs sparsec a transposing
copy per call, ~1 ms here). Every result is checked against scipy before timing.

Timing: per case and thread count, sparsec and GraphBLAS in `measure_rounds` (interleaved
rounds, pooled medians); the ratio is GraphBLAS ms / sparsec ms (> 1: sparsec faster);
the load average before and after each case is recorded (above the core count, the
2-thread figures mean little). Without python-graphblas it says so and times nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp

import sparsec

from .common import (
    Table,
    environment,
    graphblas,
    measure_rounds,
    progress,
    settle,
    write_results,
)
from .core import random_rows_csr


@dataclass
class Case:
    name: str
    detail: str
    #: threads -> (sparsec call, graphblas call)
    calls: Callable[[int], tuple[Callable[[], Any], Callable[[], Any]]]
    reference: Any
    medians: dict[int, tuple[float, float]] = field(default_factory=dict)
    load: dict[int, tuple[float, float]] = field(default_factory=dict)


def _cases(gb: Any, quick: bool) -> list[Case]:
    rng = np.random.default_rng(20240601)
    scale = 10 if quick else 1
    T = sparsec.Tensor
    plus_times, times, plus = gb.semiring.plus_times, gb.binary.times, gb.binary.plus

    def g(m: sp.csr_matrix) -> Any:
        return gb.io.from_scipy_sparse(m)

    cases = []
    for n in (50_000 // scale, 100_000 // scale):
        A, x = random_rows_csr(n, 10, rng, np.float64), rng.uniform(-1, 1, n)
        k = sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": "csr"})
        At, gA, gx = T.from_scipy(A), g(A), gb.Vector.from_dense(x)
        cases.append(
            Case(
                f"spmv {n}",
                f"y = A x, {n}^2, 10/row",
                lambda t, k=k, At=At, x=x, gA=gA, gx=gx: (
                    lambda: k(A=At, x=x, threads=t),
                    lambda: gA.mxv(gx, plus_times).new(),
                ),
                A @ x,
            )
        )
    n = 20_000 // scale
    S = random_rows_csr(n, 10, rng, np.float64)
    k = sparsec.kernel("C(i,j) = A(i,k) * B(k,j)", {"A": "csr", "B": "csr", "C": "csr"})
    St, gS = T.from_scipy(S), g(S)
    cases.append(
        Case(
            "spgemm",
            f"C = A A, {n}^2, 10/row, CSR out",
            lambda t: (lambda: k(A=St, B=St, threads=t), lambda: gS.mxm(gS, plus_times).new()),
            S @ S,
        )
    )
    B, C = random_rows_csr(n, 10, rng, np.float64), random_rows_csr(n, 10, rng, np.float64)
    D = C.copy()
    D.data = rng.uniform(-1, 1, D.nnz)
    Bt, Ct, Dt = T.from_scipy(B), T.from_scipy(C), T.from_scipy(D)
    gB, gC, gD = g(B), g(C), g(D)
    add = sparsec.kernel("A(i,j) = B(i,j) + C(i,j)", {"A": "csr", "B": "csr", "C": "csr"})
    cases.append(
        Case(
            "add",
            f"A = B + C, {n}^2, 10/row each, CSR out",
            lambda t: (lambda: add(B=Bt, C=Ct, threads=t), lambda: gB.ewise_add(gC, plus).new()),
            B + C,
        )
    )
    bcd = sparsec.kernel(
        "A(i,j) = B(i,j) + C(i,j) * D(i,j)", {"A": "csr", "B": "csr", "C": "csr", "D": "csr"}
    )
    cases.append(
        Case(
            "B + C*D",
            f"A = B + C .* D, {n}^2, D on C's pattern, CSR out",
            lambda t: (
                lambda: bcd(B=Bt, C=Ct, D=Dt, threads=t),
                lambda: gB.ewise_add(gC.ewise_mult(gD, times).new(), plus).new(),
            ),
            B + C.multiply(D),
        )
    )
    P = random_rows_csr(n, 10, rng, np.float64)
    L, R = rng.uniform(-1, 1, (n, 64)), rng.uniform(-1, 1, (64, n))
    sddmm = sparsec.kernel("A(i,j) = B(i,j) * C(i,k) * D(k,j)", {"A": "csr", "B": "csr"})
    Rt = np.ascontiguousarray(R.T)  # D stored transposed, for both
    Pt, gP, gL, gRt = T.from_scipy(P), g(P), gb.Matrix.from_dense(L), gb.Matrix.from_dense(Rt)

    def masked() -> Any:
        M = gb.Matrix(float, n, n)
        M(gP.S) << plus_times(gL @ gRt.T)
        return gP.ewise_mult(M, times).new()

    rows = np.repeat(np.arange(n), np.diff(P.indptr))
    vals = P.data * np.einsum("pk,kp->p", L[rows], R[:, P.indices])
    cases.append(
        Case(
            "sddmm",
            f"A = B .* (C D), {n}^2, 10/row, k = 64, CSR out",
            lambda t: (lambda: sddmm(B=Pt, C=L, D=Rt.T, threads=t), masked),
            sp.csr_matrix((vals, P.indices, P.indptr), shape=P.shape),
        )
    )
    return cases


def _as_scipy(out: Any, gb: Any) -> Any:
    if isinstance(out, sparsec.Tensor):
        return out.to_scipy()
    if isinstance(out, gb.Matrix):
        return gb.io.to_scipy_sparse(out)
    if isinstance(out, gb.Vector):
        return out.to_dense(fill_value=0.0)
    return np.asarray(out)


def _check(case: Case, got: Any, who: str) -> None:
    ref = case.reference
    if sp.issparse(ref):
        diff = abs(sp.csr_matrix(got) - ref).max() if ref.nnz else 0.0
        scale = max(1.0, abs(ref).max())
    else:
        diff, scale = float(np.abs(got - ref).max()), max(1.0, float(np.abs(ref).max()))
    if diff > 1e-9 * scale:
        raise SystemExit(f"{case.name}: {who} differs from scipy by {diff}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench graphblas", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="sizes / 10, one short round")
    ap.add_argument("--threads", default="1,2", help="thread counts, e.g. 1,2")
    args = ap.parse_args(argv)
    gb = graphblas()
    if gb is None:
        return 0
    settle(not args.quick)
    threads = [int(t) for t in str(args.threads).split(",")]
    cases = _cases(gb, args.quick)
    for case in cases:
        for t in threads:
            gb.ss.config["nthreads"] = t
            ours, theirs = case.calls(t)
            _check(case, _as_scipy(ours(), gb), f"sparsec {t}T")
            _check(case, _as_scipy(theirs(), gb), f"graphblas {t}T")
            progress(f"graphblas: {case.name} at {t} thread(s)")
            before = os.getloadavg()[0]
            timings = measure_rounds({"sparsec": ours, "graphblas": theirs})
            case.load[t] = (before, os.getloadavg()[0])
            case.medians[t] = (timings["sparsec"].median_ms, timings["graphblas"].median_ms)
    table = Table(["case", "threads", "sparsec ms", "graphblas ms", "ratio", "load"])
    for case in cases:
        for t in threads:
            mine, theirs = case.medians[t]
            lo, hi = case.load[t]
            table.add(
                case.name,
                t,
                f"{mine:.4g}",
                f"{theirs:.4g}",
                f"{theirs / mine:.2f}x",
                f"{lo:.1f}-{hi:.1f}",
            )
    print(
        "[bench] python-graphblas side by side (ratio = graphblas ms / sparsec ms; > 1: sparsec faster)"
    )
    print(table.render())
    if 1 in threads and len(threads) > 1:
        scaling = Table(["case", "threads", "sparsec speedup", "graphblas speedup"])
        for case in cases:
            one = case.medians[1]
            for t in threads:
                if t != 1:
                    mine, theirs = case.medians[t]
                    scaling.add(case.name, t, f"{one[0] / mine:.2f}x", f"{one[1] / theirs:.2f}x")
        print("[bench] scaling (1-thread ms / n-thread ms)")
        print(scaling.render())
    payload = {
        "environment": environment(),
        "graphblas": gb.__version__,
        "cases": [
            {
                "case": c.name,
                "detail": c.detail,
                "median_ms": {
                    str(t): {"sparsec": m[0], "graphblas": m[1]} for t, m in c.medians.items()
                },
                "load": {str(t): list(v) for t, v in c.load.items()},
            }
            for c in cases
        ],
    }
    write_results("graphblas-quick" if args.quick else "graphblas", payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
