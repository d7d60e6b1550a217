"""Column panels: SpMM on pruned BERT-base weights, whole width against packed panels.

    python -m bench panels [--quick] [--threads N]

For each shape, the same kernel runs three ways: whole width (panels off), always in
panels of 128 columns (the cost model overridden), and as the runtime chooses
(`sparsec.kernel`'s default, `_panels_pay`). The table shows which the cost model chose and
whether that was the faster of the two. Each result is checked against scipy first.
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
#: (rows, inner, sparsity, columns): around the cost model's thresholds
SHAPES = (
    (768, 3072, 0.8, 2048),
    (768, 3072, 0.9, 2048),
    (768, 3072, 0.95, 2048),
    (768, 3072, 0.98, 2048),
    (768, 3072, 0.99, 2048),
    (384, 1536, 0.95, 2048),
    (384, 1536, 0.98, 2048),
    (3072, 768, 0.8, 2048),
    (3072, 768, 0.95, 2048),
    (768, 768, 0.8, 2048),
    (768, 3072, 0.8, 1024),
    (384, 1536, 0.9, 1024),
    (384, 1536, 0.5, 1024),
)
QUICK = ((96, 384, 0.8, 1024),)


@contextmanager
def _panels(mode: str) -> Any:
    """'off': never; 'on': whenever the expression allows (thresholds at zero); 'chosen':
    the runtime's cost model, as shipped."""
    names = ("PANEL_MIN_BYTES", "PANEL_MIN_REUSE", "PANEL_MIN_REUSE_BEYOND_CACHE")
    saved = {n: getattr(KERNEL, n) for n in names}
    if mode == "chosen":
        yield
        return
    try:
        for n in names:
            setattr(KERNEL, n, 1 << 62 if mode == "off" else 0)
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
    table = Table(["shape", "whole ms", "panels ms", "chosen", "chosen ms", "right"])
    records = []
    for rows, inner, sparsity, columns in QUICK if args.quick else SHAPES:
        label = f"{rows}x{inner} {sparsity:.0%} x{columns}"
        progress(label)
        w = pruned_csr(rows, inner, sparsity, rng).astype(np.float32)
        x = rng.standard_normal((inner, columns)).astype(np.float32)
        tensor = sparsec.as_tensor(w, "csr")
        want = w @ x
        times = {}
        for mode in ("off", "on", "chosen"):
            k = sparsec.Kernel(SPMM, {"W": "csr"})
            with _panels(mode):
                got = k(W=tensor, X=x, threads=args.threads)
                if not np.allclose(got, want, rtol=1e-4, atol=1e-3):
                    raise WrongResult(f"{label}: panels {mode} disagree with scipy")
                times[mode] = measure(
                    lambda k=k, w=tensor, x=x: k(W=w, X=x, threads=args.threads), repeats=5
                ).median_ms
        out_elements = rows * columns
        chose = KERNEL._panels_pay(columns, ("X",), {"W": tensor, "X": x}, out_elements)
        faster = "panels" if times["on"] < times["off"] else "whole"
        table.add(
            label,
            times["off"],
            times["on"],
            "panels" if chose else "whole",
            times["chosen"],
            "yes" if ("panels" if chose else "whole") == faster else "no",
        )
        records.append(
            {
                "shape": label,
                "whole_ms": times["off"],
                "panels_ms": times["on"],
                "chosen": "panels" if chose else "whole",
                "chosen_ms": times["chosen"],
            }
        )
    print(table.render())
    print(
        f"\n{args.threads} threads, float32; last-level cache {KERNEL.last_level_cache() >> 20} MB"
    )
    path = write_results(
        "panels-quick" if args.quick else "panels",
        {"environment": environment(), "threads": args.threads, "rows": records},
    )
    progress(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
