"""Layouts: SpMM on pruned BERT weights in whole rows, column bands, packed panels and
depth blocks.

    python -m bench panels [--quick] [--threads N]

For each shape, the same kernel runs in each layout that applies to it, then as the
runtime chooses (`sparsec.policy.costs`: `panels_pay`, then `bands_pay` from 1024
columns; `depth_rows` below). From 1024 columns: whole rows (bands and panels off), in
column bands (`sparsec.passes.bands`, forced on) and in packed panels of 128 columns (the panel
cost model overridden). Below: whole rows and depth blocks (forced on). The table shows
which layout the cost models chose and whether it was the fastest. Each result is checked
against scipy first.
"""

from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager
from typing import Any

import numpy as np

import sparsec
from sparsec.policy.machine import machine

from .common import Table, environment, measure, progress, settle, write_results
from .core import WrongResult, pruned_csr

COSTS = sys.modules["sparsec.policy.costs"]
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
    (768, 3072, 0.7, 512),
    (768, 3072, 0.8, 512),
    (768, 3072, 0.95, 512),
    (768, 3072, 0.98, 512),
    (3072, 768, 0.8, 512),
    (384, 1536, 0.8, 512),
    (768, 3072, 0.8, 128),
)
QUICK = ((96, 384, 0.8, 1024), (48, 2560, 0.8, 512))
LAYOUTS = ("whole", "bands", "panels", "depth")
#: the layouts that apply at a call's width
WIDE, NARROW = ("whole", "bands", "panels"), ("whole", "depth")
_NEVER, _ALWAYS = 1 << 62, 0


@contextmanager
def _layout(mode: str) -> Any:
    """'whole', 'bands', 'panels' or 'depth' forced through the cost models' thresholds;
    'chosen': the runtime's cost models, as shipped."""
    panels = ("PANEL_MIN_BYTES", "PANEL_MIN_REUSE", "PANEL_MIN_REUSE_BEYOND_CACHE")
    bands = ("BAND_MIN_BYTES", "BAND_MIN_REUSE")
    depth = ("DEPTH_MIN_BYTES", "DEPTH_MIN_OVER_OUTPUT", "DEPTH_MIN_REUSE", "DEPTH_MIN_ENTRIES")
    saved = {n: getattr(COSTS, n) for n in (*panels, *bands, *depth)}
    forced = {n: _ALWAYS if mode == "panels" else _NEVER for n in panels}
    forced |= {n: _ALWAYS if mode == "bands" else _NEVER for n in bands}
    forced |= {n: _ALWAYS if mode == "depth" else _NEVER for n in depth}
    try:
        if mode != "chosen":
            for n, v in forced.items():
                setattr(COSTS, n, v)
        yield
    finally:
        for n, v in saved.items():
            setattr(COSTS, n, v)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.panels", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="one small shape (CI smoke)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    settle(not args.quick)
    rng = np.random.default_rng(0)
    table = Table(["shape", *(f"{m} ms" for m in LAYOUTS), "chosen", "chosen ms", "right"])
    records = []
    for rows, inner, sparsity, columns in QUICK if args.quick else SHAPES:
        label = f"{rows}x{inner} {sparsity:.0%} x{columns}"
        progress(label)
        w = pruned_csr(rows, inner, sparsity, rng).astype(np.float32)
        x = rng.standard_normal((inner, columns)).astype(np.float32)
        tensor = sparsec.as_tensor(w, "csr")
        want = w @ x
        layouts = WIDE if columns >= COSTS.PANEL_MIN_COLUMNS else NARROW
        times = {}
        for mode in (*layouts, "chosen"):
            k = sparsec.Kernel(SPMM, {"W": "csr"})
            with _layout(mode):
                got = k(W=tensor, X=x, threads=args.threads)
                if not np.allclose(got, want, rtol=1e-4, atol=1e-3):
                    raise WrongResult(f"{label}: {mode} disagrees with scipy")
                times[mode] = measure(
                    lambda k=k, w=tensor, x=x: k(W=w, X=x, threads=args.threads), repeats=5
                ).median_ms
        values, out_elements = {"W": tensor, "X": x}, rows * columns
        k = sparsec.Kernel(SPMM, {"W": "csr"})
        dims = {"i": rows, "j": columns, "k": inner}
        if COSTS.panels_pay(columns, ("X",), values, out_elements):
            chose = "panels"
        elif k.columns.band_tiles(dims, values):
            chose = "bands"
        elif k.columns.depth_rows(dims, values):
            chose = "depth"
        else:
            chose = "whole"
        fastest = min(layouts, key=lambda m: times[m])
        table.add(
            label,
            *(times[m] if m in times else "-" for m in LAYOUTS),
            chose,
            times["chosen"],
            "yes" if chose == fastest else f"no ({fastest})",
        )
        records.append(
            {
                "shape": label,
                **{f"{m}_ms": times[m] for m in times},
                "chosen": chose,
                "fastest": fastest,
            }
        )
    print(table.render())
    print(
        f"\n{args.threads} threads, float32; last-level cache {machine().last_level_cache >> 20} MB"
    )
    path = write_results(
        "panels-quick" if args.quick else "panels",
        {"environment": environment(), "threads": args.threads, "rows": records},
    )
    progress(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
