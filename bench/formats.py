"""Formats suite (issue 39): blocked and N:M tensors against their CSR and scipy.

    python -m bench formats [--quick] [--threads N] [--n ROWS] [--blocks B]

Cases, each at 1 thread and at ``--threads`` (default: every core), float64 and float32,
int32 indices:

  bsr-spmv    y(i) = A(i,j) * x(j), A n x n of dense 4 x 4 blocks, ``--blocks`` (8) distinct
              random block columns per block row (n = ``--n``, 65,536: 2.1 M stored values)
  bsr-spmm    Y(i,k) = A(i,j) * X(j,k), the same A (n / 4 rows of it), X of 32 columns
  nm-spmv     y(i) = A(i,j) * x(j), A n/32 x n/16 pruned 2:4 (2 of every group of 4 kept)

Contenders: sparsec on the mapped format (``bsr(4,4)``, ``nm(2,4)``), sparsec on CSR holding
the same stored entries (a block's zeros included), scipy's ``bsr_array @`` (bsr cases) and
``csr_array @`` (single-threaded by construction). Every contender's result is compared
with scipy's before anything is timed. Timing: `common.measure_rounds` (interleaved rounds,
pooled medians); speedups are ``contender median / sparsec mapped median``.

Targets (issue 39): bsr SpMV and SpMM >= 1.5x sparsec's own CSR and >= 1.0x scipy's bsr.

``formats="auto"`` (`sparsec.api.auto`) on 12 generated matrices of different structure
(`AUTO_MATRICES`: uniform, power-law rows, banded, blocked, hypersparse, dense rows, ...),
SpMV float64 at 1 thread: the auto kernel's call (its choice made beforehand) against CSR
and against the best of every format timed (csr, dcsr, every bsr that divides the shape).
The best is the least of those medians, which the samples that chose it favour where
formats run within the noise of each other, so the ratio to it comes from a second
measurement of auto and that best alone ("again"). Targets: geometric mean >= 1.3x over
CSR, and >= 0.95x of the best found by timing all.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import numpy as np
import scipy.sparse as sp

import sparsec

from .common import Table, environment, measure_rounds, progress, write_results

#: the issue's targets for the bsr cases: (against sparsec's CSR, against scipy's bsr)
TARGETS = {"bsr-spmv": (1.5, 1.0), "bsr-spmm": (1.5, 1.0)}


class WrongResult(AssertionError):
    pass


def blocked(n: int, per: int, block: int, dtype: str, rng: np.random.Generator) -> Any:
    """A scipy bsr_array of n x n with ``per`` distinct block columns per block row."""
    rows = n // block
    cols = np.stack([np.sort(rng.choice(n // block, per, replace=False)) for _ in range(rows)])
    data = rng.uniform(-1, 1, (rows * per, block, block)).astype(dtype)
    return sp.bsr_array((data, cols.ravel(), np.arange(rows + 1) * per), shape=(n, n))


def pruned_24(rows: int, n: int, dtype: str, rng: np.random.Generator) -> Any:
    """A csr_array of rows x n keeping 2 random entries in every group of 4 of each row."""
    groups = n // 4
    keep = np.argsort(rng.random((rows, groups, 4)), axis=2)[:, :, :2]
    cols = np.sort((keep + 4 * np.arange(groups)[None, :, None]).reshape(rows, -1), axis=1)
    data = rng.uniform(-1, 1, cols.size).astype(dtype)
    pos = np.arange(rows + 1) * cols.shape[1]
    return sp.csr_array((data, cols.ravel(), pos), shape=(rows, n))


def _check(name: str, got: Any, want: Any, dtype: str) -> None:
    tol = 1e-3 if dtype == "float32" else 1e-9
    err = float(np.max(np.abs(np.asarray(got) - want), initial=0.0))
    scale = max(1.0, float(np.max(np.abs(want), initial=0.0)))
    if err > tol * scale:
        raise WrongResult(f"{name}: max abs error {err:.3g} against scipy")


def run_case(case: str, dtype: str, threads: int, args: argparse.Namespace) -> dict[str, Any]:
    rng = np.random.default_rng(7)
    n = args.n
    if case.startswith("bsr"):
        mapped = blocked(n if case == "bsr-spmv" else n // 4, args.blocks, 4, dtype, rng)
        fmt, statement = "bsr(4,4)", "y(i) = A(i,j) * x(j)"
    else:
        mapped = pruned_24(n // 32, n // 16, dtype, rng)
        fmt, statement = "nm(2,4)", "y(i) = A(i,j) * x(j)"
    csr = mapped.tocsr()
    cols = mapped.shape[1]
    if case == "bsr-spmm":
        statement = "Y(i,k) = A(i,j) * X(j,k)"
        x = rng.uniform(-1, 1, (cols, 32)).astype(dtype)
    else:
        x = rng.uniform(-1, 1, cols).astype(dtype)
    name = "X" if x.ndim == 2 else "x"
    tm = sparsec.Tensor.from_scipy(mapped, fmt)
    tc = sparsec.Tensor.from_scipy(csr, "csr")
    km = sparsec.kernel(statement, {"A": fmt})
    kc = sparsec.kernel(statement, {"A": "csr"})
    fns = {
        "sparsec " + fmt: lambda: km(A=tm, threads=threads, **{name: x}),
        "sparsec csr": lambda: kc(A=tc, threads=threads, **{name: x}),
        "scipy csr": lambda: csr @ x,
    }
    if case.startswith("bsr"):
        fns["scipy bsr"] = lambda: mapped @ x
    want = csr @ x
    for label, fn in fns.items():
        _check(f"{case} {label}", fn(), want, dtype)
    timings = measure_rounds(fns, repeats=args.repeats)
    mine = timings["sparsec " + fmt].median_ms
    return {
        "case": case,
        "dtype": dtype,
        "threads": threads,
        "stored": int(tm.nnz),
        "median_ms": {k: t.median_ms for k, t in timings.items()},
        "speedup": {
            k: t.median_ms / mine for k, t in timings.items() if not k.startswith("sparsec " + fmt)
        },
        "timings": timings,
    }


def _from_rows(n: int, m: int, lengths: Any, rng: np.random.Generator) -> Any:
    rows = np.repeat(np.arange(n), lengths)
    cols = rng.integers(0, m, rows.size)
    a = sp.csr_array((rng.uniform(-1, 1, rows.size), (rows, cols)), shape=(n, m))
    a.sum_duplicates()
    return a


def _banded(n: int, half: int, rng: np.random.Generator) -> Any:
    offsets = list(range(-half, half + 1))
    diags = [rng.uniform(-1, 1, n - abs(o)) for o in offsets]
    return sp.diags_array(diags, offsets=offsets, shape=(n, n), format="csr")


def _blocks(n: int, per: int, r: int, c: int, rng: np.random.Generator) -> Any:
    blocks = _from_rows(n // r, n // c, np.full(n // r, per), rng)
    return sp.csr_array(sp.kron(blocks, np.ones((r, c)), format="csr"))


def auto_matrices(scale: int, rng: np.random.Generator) -> dict[str, Any]:
    """The 12 matrices of the auto table, n = 131,072 / ``scale`` rows."""
    n = 131_072 // scale
    dense_rows = _from_rows(n, n, np.full(n, 8), rng).tolil()
    for i in rng.choice(n, 4, replace=False):
        dense_rows[int(i), :] = rng.uniform(-1, 1, n)
    return {
        "uniform-10": _from_rows(n, n, np.full(n, 10), rng),
        "uniform-40": _from_rows(n, n, np.full(n, 40), rng),
        "power-law": _from_rows(n, n, np.minimum(rng.zipf(1.8, n), n // 8), rng),
        "banded-5": _banded(n, 2, rng),
        "banded-33": _banded(n, 16, rng),
        "blocked-2x2": _blocks(n, 4, 2, 2, rng),
        "blocked-4x4": _blocks(n, 3, 4, 4, rng),
        "blocked-8x8": _blocks(n, 2, 8, 8, rng),
        "rows-1x4": _blocks(n, 4, 1, 4, rng),
        "hypersparse": _from_rows(n, n, (rng.random(n) < 0.01) * 20, rng),
        "dense-rows": sp.csr_array(dense_rows),
        "diagonal": _banded(n, 0, rng),
    }


def run_auto(args: argparse.Namespace) -> tuple[Table, list[dict[str, Any]]]:
    """The auto table: per matrix, auto's choice against CSR and the best timed."""
    from sparsec.policy.formats import BLOCKS

    rng = np.random.default_rng(11)
    table = Table(["matrix", "nnz", "auto chose", "best", "auto ms", "csr ms", "x csr",
                   "again: auto ms", "best ms", "x best"])  # fmt: skip
    rows = []
    statement = "y(i) = A(i,j) * x(j)"
    for name, a in auto_matrices(16 if args.quick else 1, rng).items():
        progress(f"auto {name}")
        x = rng.uniform(-1, 1, a.shape[1])
        want = a @ x
        auto = sparsec.kernel(statement, formats="auto")
        _check(f"auto {name}", auto(A=a, x=x, threads=1), want, "float64")
        formats = ["csr", "dcsr"] + [
            f"bsr({r},{c})" for r, c in BLOCKS if a.shape[0] % r == 0 and a.shape[1] % c == 0
        ]
        fns = {"auto": lambda auto=auto, a=a, x=x: auto(A=a, x=x, threads=1)}
        for fmt in formats:
            t = sparsec.as_tensor(sparsec.Tensor.from_scipy(a, "csr"), fmt)
            k = sparsec.kernel(statement, {"A": fmt})
            _check(f"{name} {fmt}", k(A=t, x=x, threads=1), want, "float64")
            fns[fmt] = lambda k=k, t=t, x=x: k(A=t, x=x, threads=1)
        timings = measure_rounds(fns, repeats=args.repeats)
        ms = {k: t.median_ms for k, t in timings.items()}
        best = min(formats, key=lambda f: ms[f])
        chose = auto.choices["A"]["chosen"]
        # the best is the least of eight medians, several often within the noise of each
        # other: the same samples that picked it favour it (a format auto chose and the
        # bench found best read 0.89x of itself). So auto and the best are timed again,
        # on fresh samples, for the ratio against the best
        again = measure_rounds({"auto": fns["auto"], best: fns[best]}, repeats=args.repeats)
        against = {k: t.median_ms for k, t in again.items()}
        table.add(name, a.nnz, chose, best, ms["auto"], ms["csr"],
                  f"{ms['csr'] / ms['auto']:.2f}x", against["auto"], against[best],
                  f"{against[best] / against['auto']:.2f}x")  # fmt: skip
        rows.append({"matrix": name, "nnz": a.nnz, "chose": chose, "best": best, "median_ms": ms,
                     "against_best_ms": against, "choices": auto.choices,
                     "timings": timings})  # fmt: skip
    return table, rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench formats")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--n", type=int, default=65536)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--only", choices=("kernels", "auto"), help="one of the two tables")
    args = parser.parse_args(argv if argv is not None else sys.argv[1:])
    if args.quick:
        args.n, args.repeats = 4096, 10
    load = os.getloadavg()
    env = environment()
    rows = []
    table = Table(
        ["case", "dtype", "threads", "mapped ms", "csr ms", "scipy bsr ms", "x own csr",
         "x scipy bsr", "x scipy csr", "target"]
    )  # fmt: skip
    for case in ("bsr-spmv", "bsr-spmm", "nm-spmv") if args.only != "auto" else ():
        for dtype in ("float64", "float32"):
            for threads in sorted({1, args.threads}):
                progress(f"{case} {dtype} {threads}T")
                row = run_case(case, dtype, threads, args)
                rows.append(row)
                ms, up = row["median_ms"], row["speedup"]
                mapped = next(
                    v for k, v in ms.items() if k.startswith("sparsec ") and k != "sparsec csr"
                )
                goal = TARGETS.get(case)
                met = None
                if goal is not None:
                    met = up["sparsec csr"] >= goal[0] and up["scipy bsr"] >= goal[1]
                table.add(
                    case,
                    dtype,
                    threads,
                    mapped,
                    ms["sparsec csr"],
                    ms.get("scipy bsr"),
                    f"{up['sparsec csr']:.2f}x",
                    f"{up['scipy bsr']:.2f}x" if "scipy bsr" in up else None,
                    f"{up['scipy csr']:.2f}x",
                    None if met is None else ("met" if met else "unmet"),
                )
    auto_table, auto_rows = run_auto(args) if args.only != "kernels" else (None, [])
    after = os.getloadavg()
    print(
        f"# formats: {env['processor']}, {env['cpu_count']} CPUs; load {load[0]:.2f} -> "
        f"{after[0]:.2f}"
    )
    print(table.render())
    if auto_table is None:
        write_results(
            "formats", {"environment": env, "load": [load, os.getloadavg()], "rows": rows}
        )
        return 0
    over_csr = [r["median_ms"]["csr"] / r["median_ms"]["auto"] for r in auto_rows]
    over_best = [r["against_best_ms"][r["best"]] / r["against_best_ms"]["auto"] for r in auto_rows]
    geo = float(np.exp(np.mean(np.log(over_csr))))
    print()
    print(
        "formats='auto', SpMV float64, 1 thread (targets: geomean >= 1.3x csr, each >= 0.95x best)"
    )
    print(auto_table.render())
    print(
        f"geomean over csr {geo:.2f}x ({'met' if geo >= 1.3 else 'unmet'}); worst against the "
        f"best {min(over_best):.2f}x ({'met' if min(over_best) >= 0.95 else 'unmet'})"
    )
    payload = {"environment": env, "load": [load, after], "rows": rows, "auto": auto_rows}
    path = write_results("formats", payload)
    progress(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
