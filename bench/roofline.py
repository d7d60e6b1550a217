"""Roofline: sparsec's kernels against the machine's own ceilings, measured here.

    python -m bench.roofline [--quick] [--threads N]

Ceilings, measured at 1 and N threads before the kernels:
  bandwidth   a = b + 3 c (torch, float64, three arrays far larger than the last-level
              cache): bytes moved / time, the "triad" of STREAM
  peak FMA    a C loop of 12 independent fused multiply-add chains on vectors of the host's
              width (`machine().vector_bytes`, GCC vector types, cc -O3 -march=native), per
              value type: 2 flops per lane per FMA

Kernels (sparsec default schedule, checked against scipy/numpy before timing):
  memory-bound, as a fraction of the triad bandwidth, over their compulsory traffic (every
  stored array of every operand read once, the output written once: for SpMV's gathered x a
  lower bound):
    spmv-random   y(i) = A(i,j) * x(j), 1M x 1M, 10 random columns per row, float64
    spmv-banded   the same, 2M x 2M, 5 diagonals
    ttv           A(i,j) = B(i,j,k) * c(k), B 1000^3 CSF with 4M entries
  compute-bound, as a fraction of the peak FMA rate, over the flops the loop nest must do:
    spmm          C(i,j) = W(i,k) * X(k,j), W 3072 x 768 at 90 % (BERT FFN shape), X 768 x 512:
                  2 nnz(W) * 512 flops (float64 and float32)
    mttkrp        A(i,j) = B(i,k,l) * D(l,j) * C(k,j), B 1000^3 CSF with 2M entries, rank 32:
                  2 nnz * 32 (B * D into a fiber's row) + 2 fibers * 32 (the row times C)
    sddmm         A(i,j) = B(i,j) * C(i,k) * D(k,j), B 20k^2 at 10 per row, k = 64, CSR output:
                  2 nnz * 64

Medians of interleaved rounds (`measure_rounds`), the 1-minute load average beside each
row: a figure taken with the load above the thread count is a busy machine's, and says so.
Nothing about speed is asserted.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shlex
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

import sparsec
from sparsec.policy.machine import machine

from .common import Table, environment, measure_rounds, progress, write_results
from .core import random_rows_csr, triad_gbps

#: independent FMA chains per thread: enough to cover an FMA's latency on two pipes
CHAINS = 12

_PEAK_C = r"""
#include <stdint.h>
typedef {ctype} sc_v __attribute__((vector_size({width})));
/* {chains} independent chains of a = a * m + c on whole vectors (each in a register), on
   each of `threads` threads; returns a sum so nothing is optimised away */
double sc_peak(int64_t iters, int threads) {{
  double total = 0;
  #pragma omp parallel num_threads(threads) reduction(+:total)
  {{
    sc_v m, c;
    for (int l = 0; l < (int)(sizeof m / sizeof m[0]); l++) {{ m[l] = 0.999999; c[l] = 1e-7; }}
    {declare}
    for (int64_t it = 0; it < iters; it++) {{
      {update}
    }}
    sc_v s = {sum};
    for (int l = 0; l < (int)(sizeof m / sizeof m[0]); l++) total += s[l];
  }}
  return total;
}}
"""


def _peak_source(ctype: str, width: int) -> str:
    names = [f"a{q}" for q in range(CHAINS)]
    return _PEAK_C.format(
        ctype=ctype,
        width=width,
        chains=CHAINS,
        declare=" ".join(f"sc_v {a} = c * ({ctype}){q + 1};" for q, a in enumerate(names)),
        update=" ".join(f"{a} = {a} * m + c;" for a in names),
        sum=" + ".join(names),
    )


def peak_flops(dtype: str, threads: int, seconds: float = 0.3) -> float:
    """GFLOP/s of CHAINS independent FMA chains per thread, the host's vector width."""
    ctype = {"float64": "double", "float32": "float"}[dtype]
    width = machine().vector_bytes
    lanes = width // np.dtype(dtype).itemsize
    with tempfile.TemporaryDirectory() as tmp:
        src, lib = Path(tmp) / "peak.c", Path(tmp) / "peak.so"
        src.write_text(_peak_source(ctype, width))
        cc = os.environ.get("SPARSEC_CC", "cc")
        flags = shlex.split(os.environ.get("SPARSEC_CFLAGS", "-O3 -march=native -fopenmp"))
        subprocess.run(
            [cc, *flags, "-ffp-contract=fast", "-shared", "-fPIC", str(src), "-o", str(lib)],
            check=True,
        )
        fn = ctypes.CDLL(str(lib)).sc_peak
        fn.restype, fn.argtypes = ctypes.c_double, [ctypes.c_int64, ctypes.c_int]
        iters = 1 << 20
        while True:  # grow the run to `seconds`, then keep the best of three
            start = time.perf_counter()
            fn(iters, threads)
            took = time.perf_counter() - start
            if took > seconds / 4:
                break
            iters *= 2
        best = min(_timed(lambda: fn(iters, threads)) for _ in range(3))
    return 2 * lanes * CHAINS * iters * threads / best / 1e9


def _timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


# --------------------------------------------------------------------------- cases


@dataclass
class Case:
    name: str
    detail: str
    kernel: sparsec.Kernel
    inputs: dict[str, Any]
    expected: np.ndarray | sp.spmatrix
    #: compulsory bytes (memory-bound) or flops (compute-bound), and which
    amount: float
    bound: str  # "memory" or "compute"
    dtype: str = "float64"


def _bytes(*arrays: Any) -> int:
    """The stored bytes of numpy arrays and sparsec tensors (every level's arrays)."""
    total = 0
    for a in arrays:
        if isinstance(a, sparsec.Tensor):
            total += a.vals.nbytes
            for level in a.levels:
                total += sum(x.nbytes for x in (level.pos, level.crd) if x is not None)
        else:
            total += np.asarray(a).nbytes
    return total


def cases(quick: bool, rng: np.random.Generator) -> list[Case]:
    scale = 8 if quick else 1
    found: list[Case] = []

    n = 1_000_000 // scale
    A = random_rows_csr(n, 10, rng, np.float64)
    x = rng.uniform(-1, 1, n)
    At = sparsec.Tensor.from_scipy(A)
    k = sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": "csr"})
    found.append(
        Case("spmv-random", f"{n} x {n}, 10 per row", k, {"A": At, "x": x}, A @ x,
             _bytes(At, x) + n * 8, "memory")
    )  # fmt: skip

    n = 2_000_000 // scale
    B = sp.diags([rng.uniform(-1, 1, n) for _ in range(5)], range(-2, 3), (n, n), "csr")
    Bt = sparsec.Tensor.from_scipy(B)
    x = rng.uniform(-1, 1, n)
    found.append(
        Case("spmv-banded", f"{n} x {n}, 5 diagonals", k, {"A": Bt, "x": x}, B @ x,
             _bytes(Bt, x) + n * 8, "memory")
    )  # fmt: skip

    m = 1000 // (2 if quick else 1)
    T = sparsec.random((m, m, m), 4e6 / m**3 / scale, "csf", seed=1)
    c = rng.uniform(-1, 1, m)
    ttv = sparsec.kernel("A(i,j) = B(i,j,k) * c(k)", {"B": "csf"})
    want = np.einsum("ijk,k->ij", T.to_dense(), c) if quick else None
    found.append(
        Case("ttv", f"B {m}^3 csf, {T.nnz} entries", ttv, {"B": T, "c": c}, want,
             _bytes(T, c) + m * m * 8, "memory")
    )  # fmt: skip

    for dtype in ("float64", "float32"):
        W = sp.random(3072, 768, density=0.1, format="csr", random_state=rng).astype(dtype)
        X = rng.uniform(-1, 1, (768, 512)).astype(dtype)
        spmm = sparsec.kernel("C(i,j) = W(i,k) * X(k,j)", {"W": "csr"})
        found.append(
            Case(f"spmm-{dtype}", "W 3072x768 90 % x X 768x512", spmm,
                 {"W": sparsec.Tensor.from_scipy(W), "X": X}, W @ X, 2 * W.nnz * 512,
                 "compute", dtype)
        )  # fmt: skip

    rank = 32
    M = sparsec.random((m, m, m), 2e6 / m**3 / scale, "csf", seed=2)
    D, C = rng.uniform(-1, 1, (m, rank)), rng.uniform(-1, 1, (m, rank))
    mttkrp = sparsec.kernel("A(i,j) = B(i,k,l) * D(l,j) * C(k,j)", {"B": "csf"})
    crd = M.levels[1].crd
    fibers = len(crd) if crd is not None else M.nnz
    want = np.einsum("ikl,lj,kj->ij", M.to_dense(), D, C) if quick else None
    found.append(
        Case("mttkrp", f"B {m}^3 csf, {M.nnz} entries, rank {rank}", mttkrp,
             {"B": M, "D": D, "C": C}, want, 2 * M.nnz * rank + 2 * fibers * rank, "compute")
    )  # fmt: skip

    n = 20_000 // scale
    S = random_rows_csr(n, 10, rng, np.float64)
    Cd, Dd = rng.uniform(-1, 1, (n, 64)), rng.uniform(-1, 1, (64, n))
    sddmm = sparsec.kernel("A(i,j) = B(i,j) * C(i,k) * D(k,j)", {"A": "csr", "B": "csr"})
    r = np.repeat(np.arange(n), np.diff(S.indptr))
    vals = S.data * np.einsum("pk,kp->p", Cd[r], Dd[:, S.indices])
    found.append(
        Case("sddmm", f"B {n}^2, 10 per row, k = 64, CSR out", sddmm,
             {"B": sparsec.Tensor.from_scipy(S), "C": Cd, "D": Dd},
             sp.csr_matrix((vals, S.indices, S.indptr), shape=S.shape), 2 * S.nnz * 64, "compute")
    )  # fmt: skip
    return found


def _check(case: Case, got: Any) -> None:
    if case.expected is None:
        return
    dense = got.to_scipy().toarray() if isinstance(got, sparsec.Tensor) else np.asarray(got)
    want = case.expected.toarray() if sp.issparse(case.expected) else case.expected
    tol = 1e-3 if case.dtype == "float32" else 1e-9
    if not np.allclose(dense, want, rtol=tol, atol=tol * max(1.0, float(np.abs(want).max()))):
        raise AssertionError(f"{case.name}: sparsec differs from scipy/numpy")


def _load() -> float:
    return os.getloadavg()[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.roofline", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes (CI smoke)")
    parser.add_argument("--threads", type=int, default=None, help="threads (default: all)")
    args = parser.parse_args(argv)
    top = args.threads or machine().cores
    counts = sorted({1, top})
    rng = np.random.default_rng(20261126)

    ceilings: dict[str, dict[int, float]] = {"triad GB/s": {}, "float64 GFLOP/s": {},
                                             "float32 GFLOP/s": {}}  # fmt: skip
    progress("ceilings: bandwidth")
    n = (1 << 22) if args.quick else (1 << 25)
    ceilings["triad GB/s"] = triad_gbps(counts, n, warmup=3, repeats=10)
    for t in counts:
        progress(f"ceilings: peak FMA at {t} thread(s)")
        for dtype in ("float64", "float32"):
            ceilings[f"{dtype} GFLOP/s"][t] = peak_flops(dtype, t, 0.05 if args.quick else 0.3)

    table = Table(["kernel", "detail", "threads", "ms", "rate", "ceiling", "fraction", "load"])
    rows: list[dict[str, Any]] = []
    for case in cases(args.quick, rng):
        progress(f"{case.name}: {case.detail}")
        _check(case, case.kernel(threads=1, **case.inputs))
        fns = {t: (lambda t=t, c=case: c.kernel(threads=t, **c.inputs)) for t in counts}
        timings = measure_rounds({str(t): f for t, f in fns.items()})
        load = _load()
        for t in counts:
            ms = timings[str(t)].median_ms
            if case.bound == "memory":
                rate, ceiling = case.amount / ms / 1e6, ceilings["triad GB/s"][t]
                unit = "GB/s"
            else:
                rate, ceiling = case.amount / ms / 1e6, ceilings[f"{case.dtype} GFLOP/s"][t]
                unit = "GFLOP/s"
            table.add(case.name, case.detail, t, f"{ms:.3f}", f"{rate:.1f} {unit}",
                      f"{ceiling:.1f} {unit}", f"{rate / ceiling:.0%}", f"{load:.2f}")  # fmt: skip
            rows.append({"kernel": case.name, "detail": case.detail, "threads": t, "ms": ms,
                         "bound": case.bound, "rate": rate, "ceiling": ceiling,
                         "fraction": rate / ceiling, "load": load,
                         "samples_ms": list(timings[str(t)].samples_ms)})  # fmt: skip
    print("ceilings (measured): " + "; ".join(
        f"{name} " + ", ".join(f"{v:.1f} at {t}T" for t, v in per.items())
        for name, per in ceilings.items()))  # fmt: skip
    print(f"medians of interleaved rounds; load: 1-min average; cores: {machine().cores}")
    print(table.render())
    write_results(
        "roofline",
        {"environment": environment(), "ceilings": ceilings, "rows": rows, "quick": args.quick},
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
