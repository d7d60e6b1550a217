"""Language suite: what issue 23's constructs cost against the same kernel written without
them, scipy and SuiteSparse:GraphBLAS, in one process.

    python -m bench.language [--quick] [--threads N]

Cases (indices int32, float64, A n x n with 10 distinct random columns per row):
  div-spmv      y(i) = A(i,j) * x(j) / d(i)     against  * r(i) (r = 1/d) and scipy (A @ x) / d
  div-csr       C(i,j) = A(i,j) / d(i) into CSR against  * r(i) and scipy A.multiply(r[:, None])
  pagerank      p2(i) = A(i,j) * p(j) / g(j)    against  * h(j) (h = 1/g) and scipy A @ (p / g)
  jacobi        x2(i) = (b(i) - A(i,j) * x(j)) / d(i)   against  * r(i) and scipy (b - A @ x) / d
  spmm-bias     Y(i,j) = A(i,k) * B(k,j) + D(i,j), A and B CSR, D dense, against the SpMM alone
                (and scipy A @ B + D)
  sum-n         C(i,j) = A1(i,j) + ... + An(i,j), every operand and C CSR: cold compile (generate
                and cc into an empty cache directory, in a fresh process) and the call against
                scipy's chain of additions
  min-plus      y(i) = A(i,j) * x(j) under semiring="min_plus" against python-graphblas
                (SuiteSparse) ``A.mxv(x, min_plus)`` when installed
  max-times     the same under max_times

Timing: every contender of a case in `measure_rounds` (interleaved rounds, pooled medians);
ratios are ``contender_median / sparsec_median`` (> 1: sparsec faster). The load average is
recorded before and after each case: a timing taken at a load above the core count is noisy.
Every result is checked against scipy (or GraphBLAS) before it is timed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp

import sparsec

from .common import Table, environment, measure_rounds, progress, settle, write_results


@dataclass
class Case:
    name: str
    detail: str
    #: contender -> median ms
    medians: dict[str, float] = field(default_factory=dict)
    load: tuple[float, float] = (0.0, 0.0)
    extra: dict[str, Any] = field(default_factory=dict)

    def ratio(self, other: str) -> float | None:
        if other not in self.medians or "sparsec" not in self.medians:
            return None
        return self.medians[other] / self.medians["sparsec"]


def random_csr(
    n: int, per_row: int, rng: np.random.Generator, m: int | None = None
) -> sp.csr_matrix:
    m = n if m is None else m
    cols = np.argsort(rng.random((n, m)), axis=1)[:, :per_row] if n * m <= 4_000_000 else None
    if cols is None:
        cols = np.stack([rng.choice(m, per_row, replace=False) for _ in range(n)])
    rows = np.repeat(np.arange(n), per_row)
    vals = rng.uniform(0.5, 1.5, n * per_row)
    a = sp.csr_matrix((vals, (rows, cols.ravel())), shape=(n, m))
    a.sort_indices()
    return a


def _close(got: Any, want: Any, what: str) -> None:
    g = got.toarray() if hasattr(got, "toarray") else np.asarray(got)
    w = want.toarray() if hasattr(want, "toarray") else np.asarray(want)
    if not np.allclose(g, w, rtol=1e-9, atol=1e-12, equal_nan=True):
        raise AssertionError(f"{what}: result differs from the baseline")


def _timed(case: Case, fns: dict[str, Any], threads: int) -> Case:
    before = os.getloadavg()[0]
    timings = measure_rounds(fns)
    case.medians = {name: t.median_ms for name, t in timings.items()}
    case.load = (before, os.getloadavg()[0])
    case.extra["threads"] = threads
    return case


def division_cases(n: int, threads: int, rng: np.random.Generator) -> list[Case]:
    A = random_csr(n, 10, rng)
    At = sparsec.Tensor.from_scipy(A)
    x, b = rng.random(n), rng.random(n)
    d = rng.uniform(1.0, 2.0, n)
    r = 1.0 / d
    csr = {"A": "csr"}
    out: list[Case] = []

    div = sparsec.kernel("y(i) = A(i,j) * x(j) / d(i)", csr)
    mul = sparsec.kernel("y(i) = A(i,j) * x(j) * r(i)", csr)
    _close(div(A=At, x=x, d=d), (A @ x) / d, "div-spmv")
    fns = {
        "sparsec": lambda: div(A=At, x=x, d=d, threads=threads),
        "reciprocal": lambda: mul(A=At, x=x, r=r, threads=threads),
        "scipy": lambda: (A @ x) / d,
    }
    out.append(_timed(Case("div-spmv", f"{n}x{n}, 10/row"), fns, threads))

    divc = sparsec.kernel("C(i,j) = A(i,j) / d(i)", {"A": "csr", "C": "csr"})
    mulc = sparsec.kernel("C(i,j) = A(i,j) * r(i)", {"A": "csr", "C": "csr"})
    got = divc(A=At, d=d).to_scipy()
    if got.nnz != A.nnz:
        raise AssertionError(f"div-csr: {got.nnz} stored entries, A has {A.nnz}")
    _close(got, A.multiply(r[:, None]).tocsr(), "div-csr")
    fns = {
        "sparsec": lambda: divc(A=At, d=d, threads=threads),
        "reciprocal": lambda: mulc(A=At, r=r, threads=threads),
        "scipy": lambda: A.multiply(r[:, None]).tocsr(),
    }
    case = _timed(Case("div-csr", f"{n}x{n}, 10/row, CSR out"), fns, threads)
    case.extra["nnz"] = int(got.nnz)
    out.append(case)

    g = np.asarray(A.sum(axis=0)).ravel() + 1.0
    h = 1.0 / g
    pr = sparsec.kernel("p2(i) = A(i,j) * p(j) / g(j)", csr)
    prm = sparsec.kernel("p2(i) = A(i,j) * p(j) * h(j)", csr)
    _close(pr(A=At, p=x, g=g), A @ (x / g), "pagerank")
    fns = {
        "sparsec": lambda: pr(A=At, p=x, g=g, threads=threads),
        "reciprocal": lambda: prm(A=At, p=x, h=h, threads=threads),
        "scipy": lambda: A @ (x / g),
    }
    out.append(_timed(Case("pagerank", f"{n}x{n}, 10/row"), fns, threads))

    jac = sparsec.kernel("x2(i) = (b(i) - A(i,j) * x(j)) / d(i)", csr)
    jacm = sparsec.kernel("x2(i) = (b(i) - A(i,j) * x(j)) * r(i)", csr)
    _close(jac(A=At, b=b, x=x, d=d), (b - A @ x) / d, "jacobi")
    fns = {
        "sparsec": lambda: jac(A=At, b=b, x=x, d=d, threads=threads),
        "reciprocal": lambda: jacm(A=At, b=b, x=x, r=r, threads=threads),
        "scipy": lambda: (b - A @ x) / d,
    }
    out.append(_timed(Case("jacobi", f"{n}x{n}, 10/row"), fns, threads))
    return out


def spmm_bias_case(quick: bool, threads: int, rng: np.random.Generator) -> Case:
    m, k, n = (384, 192, 64) if quick else (3072, 768, 512)
    A = random_csr(m, max(1, k // 10), rng, k)
    B = random_csr(k, max(1, n // 10), rng, n)
    D = rng.random((m, n))
    At, Bt = sparsec.Tensor.from_scipy(A), sparsec.Tensor.from_scipy(B)
    fmts = {"A": "csr", "B": "csr"}
    biased = sparsec.kernel("Y(i,j) = A(i,k) * B(k,j) + D(i,j)", fmts)
    plain = sparsec.kernel("Y(i,j) = A(i,k) * B(k,j)", fmts)
    _close(biased(A=At, B=Bt, D=D), A @ B + D, "spmm-bias")
    fns = {
        "sparsec": lambda: biased(A=At, B=Bt, D=D, threads=threads),
        "spmm-alone": lambda: plain(A=At, B=Bt, threads=threads),
        "scipy": lambda: (A @ B) + D,
    }
    return _timed(Case("spmm-bias", f"A {m}x{k} 90 % csr, B {k}x{n} 90 % csr"), fns, threads)


_COLD = """
import sys, time, sparsec
n = int(sys.argv[1])
expr = "C(i,j) = " + " + ".join(f"A{t}(i,j)" for t in range(n))
fmts = {f"A{t}": "csr" for t in range(n)} | {"C": "csr"}
start = time.perf_counter()
k = sparsec.kernel(expr, fmts)
src = k.source
gen = time.perf_counter() - start
k.executable("float64", "int32")
print(gen, time.perf_counter() - start, len(src))
"""


def sum_cases(quick: bool, threads: int, rng: np.random.Generator) -> list[Case]:
    out = []
    size = 2000 if quick else 20000
    for n in (4, 8) if quick else (4, 6, 8, 12, 16):
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, SPARSEC_CACHE_DIR=cache)
            done = subprocess.run(
                [sys.executable, "-c", _COLD, str(n)],
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
                check=True,
            )
        gen_s, cold_s, chars = done.stdout.split()
        ops = [random_csr(size, 10, rng) for _ in range(n)]
        tensors = [sparsec.Tensor.from_scipy(a) for a in ops]
        expr = "C(i,j) = " + " + ".join(f"A{t}(i,j)" for t in range(n))
        k = sparsec.kernel(expr, {f"A{t}": "csr" for t in range(n)} | {"C": "csr"})
        args = {f"A{t}": t_ for t, t_ in enumerate(tensors)}
        want = ops[0]
        for a in ops[1:]:
            want = want + a
        _close(k(**args).to_scipy(), want, f"sum-{n}")

        def chain(ops: list[sp.csr_matrix] = ops) -> sp.csr_matrix:
            acc = ops[0]
            for a in ops[1:]:
                acc = acc + a
            return acc

        fns = {"sparsec": lambda k=k, args=args: k(**args, threads=threads), "scipy": chain}
        case = _timed(
            Case(f"sum-{n}", f"{n} CSR operands {size}x{size}, 10/row, CSR out"), fns, threads
        )
        case.extra.update(generate_s=float(gen_s), cold_compile_s=float(cold_s), chars=int(chars))
        out.append(case)
    return out


def semiring_cases(n: int, threads: int, rng: np.random.Generator) -> list[Case]:
    try:
        import graphblas as gb
    except ImportError:
        progress("python-graphblas is not installed: semiring cases run without a baseline")
        gb = None
    A = random_csr(n, 10, rng)
    At = sparsec.Tensor.from_scipy(A)
    x = rng.uniform(0.5, 1.5, n)
    out = []
    for name, identity in (("min_plus", np.inf), ("max_times", -np.inf)):
        k = sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": "csr"}, semiring=name)
        fns: dict[str, Any] = {"sparsec": lambda k=k: k(A=At, x=x, threads=threads)}
        got = k(A=At, x=x)
        if gb is not None:
            gA = gb.Matrix.from_csr(A.indptr, A.indices, A.data, ncols=n)
            gx = gb.Vector.from_dense(x)
            sr = getattr(gb.semiring, name)

            def run(gA: Any = gA, gx: Any = gx, sr: Any = sr) -> Any:
                return gA.mxv(gx, sr).new()

            want = run().to_dense(fill_value=identity)
            _close(got, want, name)
            fns["graphblas"] = run
        case = _timed(Case(name, f"y = A x, {n}x{n}, 10/row, semiring {name}"), fns, threads)
        if gb is not None:
            case.extra["graphblas_threads"] = gb.ss.config["nthreads"]
        out.append(case)
    return out


def report(cases: list[Case]) -> str:
    table = Table(["case", "sparsec ms", "contender", "its ms", "ratio", "load"])
    for c in cases:
        for other, ms in c.medians.items():
            if other == "sparsec":
                continue
            table.add(
                c.name,
                c.medians["sparsec"],
                other,
                ms,
                f"{c.ratio(other):.2f}x",
                f"{c.load[0]:.1f}-{c.load[1]:.1f}",
            )
    lines = [table.render()]
    sums = [c for c in cases if "cold_compile_s" in c.extra]
    if sums:
        t = Table(["sum of n CSR", "generate s", "cold compile s", "source chars"])
        for c in sums:
            t.add(c.name, c.extra["generate_s"], c.extra["cold_compile_s"], c.extra["chars"])
        lines.append(t.render())
    return "\n\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.language", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--quick", action="store_true", help="small sizes and few runs (CI smoke)")
    parser.add_argument("--threads", type=int, default=1, help="sparsec threads (default 1)")
    args = parser.parse_args(argv)
    settle(not args.quick)
    threads = args.threads
    n = 2000 if args.quick else 20000
    rng = np.random.default_rng(0)
    progress(
        f"language suite ({'quick' if args.quick else 'full'}), sparsec at {threads} thread(s)"
    )
    try:
        import graphblas as gb

        gb.ss.config["nthreads"] = threads
    except ImportError:
        pass
    start = time.perf_counter()
    cases = division_cases(n, threads, rng)
    cases.append(spmm_bias_case(args.quick, threads, rng))
    cases += sum_cases(args.quick, threads, rng)
    cases += semiring_cases(n, threads, rng)
    print(report(cases))
    payload = {
        "suite": "language",
        "quick": args.quick,
        "threads": threads,
        "environment": environment(),
        "seconds": time.perf_counter() - start,
        "cases": [c.__dict__ for c in cases],
    }
    path = write_results("language-quick" if args.quick else "language", payload)
    progress(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
