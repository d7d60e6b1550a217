"""Schedule suite: what the default schedule's CPU threads buy over the serial kernel, and
TACO-style user schedules beside it.

    python -m bench.schedule [--quick] [--threads N]

Cases (float64, indices int32; every result checked against scipy/numpy before timing;
MTTKRP also times two numpy formulations, ``np.add.at`` and a segmented ``reduceat``):
  spmv     y(i) = A(i,j) * x(j), A n x n with exactly 10 random columns per row (CSR)
  spmm     C(i,j) = W(i,k) * X(k,j), W 3072x768 magnitude-pruned to 90 % (CSR), X 768x512
  mttkrp   A(i,j) = B(i,k,l) * D(l,j) * C(k,j), B 2000^3 with 1M random nonzeros (CSF),
           rank 32

Rows per case: the serial kernel (``schedule="serial"``), the default schedule at 1 thread
and at N threads (default: every core), and user schedules at N threads:
  spmv     fuse(i,j,f), pos(f,fp,A), split(fp,c,fp2,2048), parallelize(c,CPUThread,Atomics)
           (TACO's nonzero-parallel SpMV: balanced over nonzeros, atomics on y)
  spmm     split(i,i0,i1,16), pos(k,kpos,W), split(kpos,k0,k1,8), reorder(i0,i1,k0,j,k1),
           parallelize(i0,CPUThread,NoRaces), parallelize(j,CPUVector,IgnoreRaces)
  mttkrp   precompute(B(i,k,l)*D(l,j), j, jw)   (TACO's CPU MTTKRP workspace)
Speedups are the serial kernel's median over each row's median.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

import numpy as np

import sparsec
from sparsec.policy.machine import machine

from .common import (
    ROUNDS,
    CaseResult,
    Row,
    Table,
    environment,
    measure_rounds,
    progress,
    settle,
    write_results,
)
from .core import WrongResult, pruned_csr, random_rows_csr

SPMV = "y(i) = A(i,j) * x(j)"
SPMM = "C(i,j) = W(i,k) * X(k,j)"
MTTKRP = "A(i,j) = B(i,k,l) * D(l,j) * C(k,j)"

USER = {
    "spmv": "fuse(i,j,f), pos(f,fp,A), split(fp,c,fp2,2048), parallelize(c,CPUThread,Atomics)",
    "spmm": "split(i,i0,i1,16), pos(k,kpos,W), split(kpos,k0,k1,8), reorder(i0,i1,k0,j,k1), "
    "parallelize(i0,CPUThread,NoRaces), parallelize(j,CPUVector,IgnoreRaces)",
    "mttkrp": "precompute(B(i,k,l)*D(l,j), j, jw)",
}


@dataclass(frozen=True, slots=True)
class Config:
    quick: bool
    threads: int
    repeats: int
    spmv_n: int
    spmm_shape: tuple[int, int, int]
    mttkrp_dim: int
    mttkrp_nnz: int
    rank: int

    @staticmethod
    def make(quick: bool, threads: int | None) -> Config:
        cores = threads or machine().cores
        if quick:
            return Config(True, cores, 3, 2000, (96, 64, 32), 40, 4000, 8)
        return Config(False, cores, 20, 100_000, (3072, 768, 512), 2000, 1_000_000, 32)


def _check(got: Any, want: np.ndarray, what: str) -> None:
    got = np.asarray(got)
    if not np.allclose(got, want, rtol=1e-9, atol=1e-9 * max(1.0, float(np.abs(want).max()))):
        raise WrongResult(f"{what}: max abs error {np.abs(got - want).max():.3g}")


def run(
    cfg: Config, name: str, detail: str, expr: str, formats: dict[str, str], inputs: dict[str, Any]
) -> CaseResult:
    want = None
    result = CaseResult(name, detail, {"expr": expr, "formats": formats})
    variants = [
        ("serial", "serial", 1),
        ("default", None, 1),
        ("default", None, cfg.threads),
        ("user", USER[name], cfg.threads),
    ]
    calls = {}
    for label, schedule, threads in variants:
        k = sparsec.kernel(expr, formats, schedule=schedule)
        got = k(**inputs, threads=threads)
        if want is None:
            want = np.asarray(got)
        else:
            _check(got, want, f"{name} {label} x{threads}")
        calls[label, threads] = lambda k=k, t=threads: k(**inputs, threads=t)
    progress(f"{name}: {len(calls)} schedules in {ROUNDS} rounds")
    timings = measure_rounds(
        {f"{label} {threads}": fn for (label, threads), fn in calls.items()},
        warmup=3,
        repeats=cfg.repeats,
    )
    for label, threads in calls:
        result.rows.append(Row(label, threads, timings[f"{label} {threads}"]))
    return result


def cases(cfg: Config) -> list[CaseResult]:
    rng = np.random.default_rng(0)
    progress("building inputs")
    a = random_rows_csr(cfg.spmv_n, 10, rng, np.float64)
    x = rng.standard_normal(cfg.spmv_n)
    # packed once, as a user calling a kernel many times would (no per-call conversion)
    packed = sparsec.Tensor.from_scipy(a)
    spmv = run(cfg, "spmv", f"A {cfg.spmv_n}^2, 10/row", SPMV, {"A": "csr"}, {"A": packed, "x": x})
    _check(sparsec.kernel(SPMV, {"A": "csr"})(A=a, x=x), a @ x, "spmv vs scipy")

    rows, cols, batch = cfg.spmm_shape
    w = pruned_csr(rows, cols, 0.9, rng)
    xs = rng.standard_normal((cols, batch))
    spmm = run(
        cfg,
        "spmm",
        f"W {rows}x{cols} 90 % pruned, X {cols}x{batch}",
        SPMM,
        {"W": "csr"},
        {"W": sparsec.Tensor.from_scipy(w), "X": xs},
    )
    _check(sparsec.kernel(SPMM, {"W": "csr"})(W=w, X=xs), w @ xs, "spmm vs scipy")

    n, nnz, r = cfg.mttkrp_dim, cfg.mttkrp_nnz, cfg.rank
    flat = np.unique(rng.integers(0, n**3, size=int(nnz * 1.01)))[:nnz]
    coords = np.stack(np.unravel_index(flat, (n, n, n)))
    vals = rng.standard_normal(len(flat))
    b = sparsec.Tensor.from_coo(coords, vals, (n, n, n), "csf")
    d, c = rng.standard_normal((n, r)), rng.standard_normal((n, r))
    mttkrp = run(
        cfg,
        "mttkrp",
        f"B {n}^3 with {len(flat)} nonzeros (csf), rank {r}",
        MTTKRP,
        {"B": "csf"},
        {"B": b, "D": d, "C": c},
    )
    i, k, l = coords

    def numpy_add_at() -> np.ndarray:
        out = np.zeros((n, r))
        np.add.at(out, i, vals[:, None] * d[l] * c[k])
        return out

    # the coordinates are sorted by i: one segmented sum per nonempty row
    starts = np.flatnonzero(np.r_[True, i[1:] != i[:-1]])

    def numpy_reduceat() -> np.ndarray:
        out = np.zeros((n, r))
        out[i[starts]] = np.add.reduceat(vals[:, None] * d[l] * c[k], starts, axis=0)
        return out

    ref = numpy_add_at()
    _check(numpy_reduceat(), ref, "numpy reduceat vs add.at")
    _check(sparsec.kernel(MTTKRP, {"B": "csf"})(B=b, D=d, C=c), ref, "mttkrp vs numpy")
    progress("mttkrp: numpy add.at and reduceat")
    numpy = {"numpy add.at": numpy_add_at, "numpy reduceat": numpy_reduceat}
    for label, timing in measure_rounds(numpy, repeats=cfg.repeats).items():
        mttkrp.rows.append(Row(label, 1, timing))
    return [spmv, spmm, mttkrp]


def report(cfg: Config, results: list[CaseResult]) -> str:
    table = Table(["case", "schedule", "threads", "median ms", "min ms", "max ms", "vs serial"])
    for case in results:
        serial = case.median("serial", 1)
        assert serial is not None
        for row in case.rows:
            t = row.timing
            table.add(
                case.name,
                row.impl,
                row.threads,
                t.median_ms,
                t.min_ms,
                t.max_ms,
                f"{serial / t.median_ms:.2f}x",
            )
    lines = [table.render(), ""]
    for case in results:
        numpy = [r.timing.median_ms for r in case.rows if r.impl.startswith("numpy")]
        fast = case.median("default", cfg.threads)
        if numpy and fast:
            lines.append(
                f"{case.name}: default schedule at {cfg.threads} threads is "
                f"{min(numpy) / fast:.1f}x the fastest numpy ({min(numpy):.1f} ms)"
            )
    for name, text in USER.items():
        lines.append(f"user schedule for {name}: {text}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.schedule", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--quick", action="store_true", help="small sizes and few runs (CI smoke)")
    parser.add_argument("--threads", type=int, default=None, help="threads for the parallel rows")
    args = parser.parse_args(argv)
    settle(not args.quick)
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be >= 1")
    cfg = Config.make(args.quick, args.threads)
    progress(f"schedule suite ({'quick' if cfg.quick else 'full'}), threads 1 and {cfg.threads}")
    results = cases(cfg)
    print(report(cfg, results))
    path = write_results(
        "schedule-quick" if cfg.quick else "schedule",
        {"environment": environment(), "config": cfg, "user_schedules": USER, "cases": results},
    )
    progress(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
