"""The parallel loop's rows in a function of their own (`sparsec.lower.outline`), on and
off, on the kernels it touches most.

    python -m bench.outline [--quick] [--threads N]

Each case builds its kernel twice, with ``outline="all"`` (every kernel's loop moved, not
only where blocks fix extents as by default) and ``"off"`` (`calibrated.trying`), checks
both against scipy, and times both in interleaved rounds (`common.measure_rounds`) at 1
thread and at ``--threads``. Ratios are off / on (> 1: the outlined kernel is faster);
"moved" says whether the loop qualified (`outline_rows`: no reduction across its
iterations, only integer locals read), else both kernels are the same code.

  spmv-csr     y(i) = A(i,j) * x(j), 100,000 x 100,000, 10 random columns per row, float64
  spmm-csr     Y(i,k) = A(i,j) * X(j,k), 20,000 square, 10 per row, X of 128 columns, float32
  sddmm-csr    C(i,j) = A(i,j) * D(i,k) * E(k,j) into CSR, 20,000 square, 10 per row, k = 64
  spmv-bsr     y(i) = A(i,j) * x(j), A bsr(4,4) 65,536 square, 8 blocks per block row, float32
  linear-70    Yt(o,t) = W(o,i) * Xt(i,t), W 3072 x 768 at 70 % (CSR), 128 tokens, float32
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import numpy as np
import scipy.sparse as sp

import sparsec
from sparsec.policy import calibrated

from .common import Table, environment, measure_rounds, progress, write_results
from .formats import blocked


def _random_csr(n: int, m: int, per: int, dtype: str, rng: np.random.Generator) -> Any:
    cols = np.sort(rng.integers(0, m, (n, per)), axis=1)
    data = rng.uniform(-1, 1, n * per).astype(dtype)
    a = sp.csr_array((data, cols.ravel(), np.arange(n + 1) * per), shape=(n, m))
    a.sum_duplicates()
    return a


def cases(quick: bool) -> dict[str, tuple[str, dict[str, str], dict[str, Any], Any]]:
    """name -> (statement, formats, inputs, scipy's result)."""
    rng = np.random.default_rng(3)
    s = 8 if quick else 1
    out: dict[str, tuple[str, dict[str, str], dict[str, Any], Any]] = {}
    a = _random_csr(100_000 // s, 100_000 // s, 10, "float64", rng)
    x = rng.uniform(-1, 1, a.shape[1])
    out["spmv-csr"] = ("y(i) = A(i,j) * x(j)", {"A": "csr"}, {"A": a, "x": x}, a @ x)
    b = _random_csr(20_000 // s, 20_000 // s, 10, "float32", rng)
    xm = rng.uniform(-1, 1, (b.shape[1], 128)).astype(np.float32)
    out["spmm-csr"] = ("Y(i,k) = A(i,j) * X(j,k)", {"A": "csr"}, {"A": b, "X": xm}, b @ xm)
    d = rng.uniform(-1, 1, (b.shape[0], 64)).astype(np.float32)
    e = rng.uniform(-1, 1, (64, b.shape[1])).astype(np.float32)
    want = b.multiply(d @ e).toarray() if quick else None
    out["sddmm-csr"] = (
        "C(i,j) = A(i,j) * D(i,k) * E(k,j)",
        {"A": "csr", "C": "csr"},
        {"A": b, "D": d, "E": e},
        want,
    )
    w = blocked(65_536 // s, 8, 4, "float32", rng)
    xw = rng.uniform(-1, 1, w.shape[1]).astype(np.float32)
    tw = sparsec.Tensor.from_scipy(w, "bsr(4,4)")
    out["spmv-bsr"] = ("y(i) = A(i,j) * x(j)", {"A": "bsr(4,4)"}, {"A": tw, "x": xw}, w @ xw)
    dense = rng.uniform(-1, 1, (3072, 768)).astype(np.float32)
    dense[np.abs(dense) < np.quantile(np.abs(dense), 0.7)] = 0.0
    wl = sp.csr_array(dense)
    xt = rng.uniform(-1, 1, (768, 128)).astype(np.float32)
    out["linear-70"] = ("Yt(o,t) = W(o,i) * Xt(i,t)", {"W": "csr"}, {"W": wl, "Xt": xt}, wl @ xt)
    return out


def _dense(v: Any) -> Any:
    return v.to_dense() if hasattr(v, "to_dense") else np.asarray(v)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.outline")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv if argv is not None else sys.argv[1:])
    load = os.getloadavg()
    env = environment()
    table = Table(["case", "moved", "threads", "outlined ms", "not ms", "not / outlined"])
    rows = []
    for name, (stmt, formats, inputs, want) in cases(args.quick).items():
        inputs = {
            k: sparsec.Tensor.from_scipy(v, formats[k]) if sp.issparse(v) else v
            for k, v in inputs.items()
        }
        made = {}
        for label, on in (("outlined", "all"), ("not", "off")):
            with calibrated.trying({"outline": on}):
                k = sparsec.Kernel(stmt, formats)
                got = k(**inputs)
                assert on == "all" or "sparsec_rows" not in k.source, name
            if want is not None:
                tol = 1e-3 * max(1.0, float(np.abs(want).max()))
                if not np.allclose(_dense(got), want, atol=tol, rtol=1e-3):
                    raise AssertionError(f"{name} ({label}) differs from scipy")
            made[label] = k
        for threads in sorted({1, args.threads}):
            progress(f"{name} {threads}T")
            fns = {
                label: (lambda k=k, threads=threads, inputs=inputs: k(threads=threads, **inputs))
                for label, k in made.items()
            }
            t = measure_rounds(fns, repeats=20 if not args.quick else 10)
            on_ms, off_ms = t["outlined"].median_ms, t["not"].median_ms
            moved = "sparsec_rows" in made["outlined"].source
            table.add(
                name, "yes" if moved else "no", threads, on_ms, off_ms, f"{off_ms / on_ms:.2f}x"
            )
            rows.append({"case": name, "threads": threads, "timings": t})
    after = os.getloadavg()
    print(
        f"# outline: {env['processor']}, {env['cpu_count']} CPUs; load {load[0]:.2f} -> {after[0]:.2f}"
    )
    print(table.render())
    write_results("outline", {"environment": env, "load": [load, after], "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
