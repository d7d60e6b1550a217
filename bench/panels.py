"""Column layouts: SpMM on pruned BERT weights, whole rows, column bands and packed panels.

    python -m bench panels [--quick] [--threads N]

For each shape, the same kernel runs four ways: whole rows (bands and panels off), in
column bands (`sparsec.bands`, forced on), in packed panels of 128 columns (the panel
cost model overridden), and as the runtime chooses (`sparsec.kernel`'s default:
`_panels_pay`, then `_bands_pay`). The table shows which layout the cost models chose and
whether it was the fastest of the three. Each result is checked against scipy first.
"""

from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager
from typing import Any

import numpy as np

import sparsec

from .common import Table, environment, measure, progress, settle, write_results
from .core import WrongResult, pruned_csr

KERNEL = sys.modules["sparsec.kernel"]
SPMM = "C(i,j) = W(i,k) * X(k,j)"
#: (rows, inner, sparsity, columns): around the cost models' thresholds
SHAPES = (
    (768, 3072, 0.8, 2048),
    (768, 3072, 0.9, 2048),
    (768, 3072, 0.95, 2048),
    (768, 3072, 0.98, 2048),
    (768, 3072, 0.99, 2048),
    (384, 1536, 0.95, 2048),
    (384, 1536, 0.98, 2048),
    (3072, 768, 0.8, 2048),
    (3072, 768, 0.9, 2048),
    (3072, 768, 0.95, 2048),
    (3072, 768, 0.98, 2048),
    (768, 768, 0.8, 2048),
    (768, 768, 0.95, 2048),
    (1536, 384, 0.98, 2048),
    (768, 3072, 0.8, 1024),
    (384, 1536, 0.9, 1024),
    (384, 1536, 0.5, 1024),
)
QUICK = ((96, 384, 0.8, 1024),)
MODES = ("whole", "bands", "panels", "chosen")
_NEVER, _ALWAYS = 1 << 62, 0


@contextmanager
def _layout(mode: str) -> Any:
    """'whole', 'bands' or 'panels' forced through the cost models' thresholds;
    'chosen': the runtime's cost models, as shipped."""
    panels = ("PANEL_MIN_BYTES", "PANEL_MIN_REUSE", "PANEL_MIN_REUSE_BEYOND_CACHE")
    bands = ("BAND_MIN_BYTES", "BAND_MIN_REUSE")
    saved = {n: getattr(KERNEL, n) for n in (*panels, *bands)}
    forced = {n: _ALWAYS if mode == "panels" else _NEVER for n in panels}
    forced |= {n: _ALWAYS if mode == "bands" else _NEVER for n in bands}
    try:
        if mode != "chosen":
            for n, v in forced.items():
                setattr(KERNEL, n, v)
        yield
    finally:
        for n, v in saved.items():
            setattr(KERNEL, n, v)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.panels", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="one small shape (CI smoke)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    settle(not args.quick)
    rng = np.random.default_rng(0)
    table = Table(["shape", *(f"{m} ms" for m in MODES[:3]), "chosen", "chosen ms", "right"])
    records = []
    for rows, inner, sparsity, columns in QUICK if args.quick else SHAPES:
        label = f"{rows}x{inner} {sparsity:.0%} x{columns}"
        progress(label)
        w = pruned_csr(rows, inner, sparsity, rng).astype(np.float32)
        x = rng.standard_normal((inner, columns)).astype(np.float32)
        tensor = sparsec.as_tensor(w, "csr")
        want = w @ x
        times = {}
        for mode in MODES:
            k = sparsec.Kernel(SPMM, {"W": "csr"})
            with _layout(mode):
                got = k(W=tensor, X=x, threads=args.threads)
                if not np.allclose(got, want, rtol=1e-4, atol=1e-3):
                    raise WrongResult(f"{label}: {mode} disagrees with scipy")
                times[mode] = measure(
                    lambda k=k, w=tensor, x=x: k(W=w, X=x, threads=args.threads), repeats=5
                ).median_ms
        values, out_elements = {"W": tensor, "X": x}, rows * columns
        if KERNEL._panels_pay(columns, ("X",), values, out_elements):
            chose = "panels"
        elif KERNEL._bands_pay(columns, ("X",), values, out_elements):
            chose = "bands"
        else:
            chose = "whole"
        fastest = min(MODES[:3], key=lambda m: times[m])
        table.add(
            label,
            *(times[m] for m in MODES[:3]),
            chose,
            times["chosen"],
            "yes" if chose == fastest else f"no ({fastest})",
        )
        records.append(
            {
                "shape": label,
                **{f"{m}_ms": times[m] for m in MODES},
                "chosen": chose,
                "fastest": fastest,
            }
        )
    print(table.render())
    print(
        f"\n{args.threads} threads, float32; last-level cache {sparsec.runtime.last_level_cache() >> 20} MB"
    )
    path = write_results(
        "panels-quick" if args.quick else "panels",
        {"environment": environment(), "threads": args.threads, "rows": records},
    )
    progress(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
