"""Core suite: SpMV and SpMM against scipy.sparse and torch, plus kernel compile times.

    python -m bench.core [--quick] [--threads N] [--no-compile]

Cases (float64 unless stated; indices int32):
  spmv-tiny     SpMV on 256 x 256 (10 per row): per-call overhead, nothing else
  spmv-random   y(i) = A(i,j) * x(j), A n x n with exactly 10 distinct random columns per row
  spmv-banded   the same on a 5-diagonal (offsets -2..2) matrix: the memory-bandwidth roofline
  spmm          C(i,j) = W(i,k) * X(k,j), W 3072x768 magnitude-pruned to 90 %, X 768x512 dense
                (float64 and float32)
  triad         a = b + s*c with torch: a measured memory-bandwidth reference for the SpMV rows

Every result (sparsec and baselines) is checked against scipy before anything is timed; a
mismatch raises `WrongResult`. Nothing about speed is asserted. Effective bandwidth uses the
compulsory-traffic model of CSR SpMV: each of vals/crd read once, pos once, x once, y once:
``nnz*(val+idx) + (rows+1)*idx + cols*val + rows*val`` bytes. For spmv-random that is a lower
bound (x is gathered), for spmv-banded it is close to what really moves.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
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
    ROUNDS,
    CaseResult,
    Contender,
    Row,
    Table,
    environment,
    measure,
    measure_rounds,
    progress,
    settle,
    torch_threads,
    write_results,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
DENSE_LIMIT_BYTES = 256 * 2**20  # torch dense baselines only where the dense operand fits this
SPMV = "y(i) = A(i,j) * x(j)"
SPMM = "C(i,j) = W(i,k) * X(k,j)"


class WrongResult(AssertionError):
    """A kernel (sparsec or a baseline) disagrees with scipy: the benchmark is void."""


@dataclass(frozen=True, slots=True)
class Config:
    quick: bool
    threads: int  # sparsec's "all threads"
    torch_threads: int  # torch's default at start-up
    warmup: int
    repeats: int
    random_n: int
    per_row: int
    banded_n: int
    spmm_shape: tuple[int, int, int]  # W rows, W cols (= X rows), X cols
    spmm_sparsity: float
    triad_n: int
    compile_repeats: int

    @staticmethod
    def make(quick: bool, threads: int | None, compile_repeats: int | None) -> Config:
        import torch

        common = {
            "quick": quick,
            "threads": threads or machine().cores,
            "torch_threads": torch.get_num_threads(),
            "per_row": 10,
            "spmm_sparsity": 0.9,
        }
        if quick:
            return Config(
                **common,
                warmup=1,
                repeats=10,
                random_n=2_000,
                banded_n=20_000,
                spmm_shape=(768, 192, 64),
                triad_n=2**20,
                compile_repeats=1 if compile_repeats is None else compile_repeats,
            )
        return Config(
            **common,
            warmup=3,
            repeats=25,
            random_n=100_000,
            banded_n=2_000_000,
            spmm_shape=(3072, 768, 512),
            triad_n=2**23,
            compile_repeats=3 if compile_repeats is None else compile_repeats,
        )


# --------------------------------------------------------------------------- inputs


def random_rows_csr(n: int, per_row: int, rng: np.random.Generator, dtype: Any) -> sp.csr_matrix:
    """An n x n CSR matrix with exactly ``per_row`` distinct, uniformly drawn columns per row.

    Rows are drawn with replacement and re-drawn (vectorised) while they hold a duplicate:
    rejection sampling, so each row is a uniform ``per_row``-subset of the columns.
    """
    cols = np.sort(rng.integers(0, n, size=(n, per_row)), axis=1)
    while True:
        bad = np.flatnonzero((np.diff(cols, axis=1) == 0).any(axis=1))
        if bad.size == 0:
            break
        cols[bad] = np.sort(rng.integers(0, n, size=(bad.size, per_row)), axis=1)
    indptr = np.arange(0, n * per_row + 1, per_row, dtype=np.int32)
    vals = rng.uniform(-1.0, 1.0, size=n * per_row).astype(dtype)
    return sp.csr_matrix((vals, cols.reshape(-1).astype(np.int32), indptr), shape=(n, n))


def banded_csr(n: int, offsets: range, rng: np.random.Generator, dtype: Any) -> sp.csr_matrix:
    diagonals = [rng.uniform(-1.0, 1.0, size=n - abs(k)).astype(dtype) for k in offsets]
    return _int32(sp.diags(diagonals, list(offsets), shape=(n, n), format="csr", dtype=dtype))


def pruned_csr(rows: int, cols: int, sparsity: float, rng: np.random.Generator) -> sp.csr_matrix:
    """Gaussian weights with the smallest ``sparsity`` fraction (by magnitude) set to zero."""
    dense = rng.standard_normal((rows, cols))
    keep = round((1.0 - sparsity) * dense.size)
    flat = np.abs(dense).reshape(-1)
    kept = np.sort(np.argpartition(flat, flat.size - keep)[flat.size - keep :])
    r, c = np.divmod(kept, cols)
    return _int32(sp.csr_matrix((dense.reshape(-1)[kept], (r, c)), shape=(rows, cols)))


def _int32(m: sp.csr_matrix) -> sp.csr_matrix:
    m.sum_duplicates()
    m.sort_indices()
    m.indices = m.indices.astype(np.int32, copy=False)
    m.indptr = m.indptr.astype(np.int32, copy=False)
    return m


def torch_csr(m: sp.csr_matrix) -> Any:
    import torch

    with warnings.catch_warnings():  # "sparse CSR support is in beta"
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(
            torch.from_numpy(m.indptr),
            torch.from_numpy(m.indices),
            torch.from_numpy(m.data),
            size=m.shape,
            check_invariants=True,  # once, here; never inside a timed call
        )


def spmv_traffic(rows: int, cols: int, nnz: int, val_bytes: int, idx_bytes: int) -> int:
    """Compulsory bytes of CSR SpMV: vals, crd, pos, x and y each moved once."""
    return (
        nnz * (val_bytes + idx_bytes) + (rows + 1) * idx_bytes + cols * val_bytes + rows * val_bytes
    )


# --------------------------------------------------------------------------- contenders


def sparsec_contenders(cfg: Config, k: sparsec.Kernel, **inputs: Any) -> list[Contender]:
    counts = sorted({1, cfg.threads})
    return [Contender("sparsec", t, lambda t=t: k(threads=t, **inputs)) for t in counts]


def torch_contenders(cfg: Config, impl: str, fn: Callable[[], Any]) -> list[Contender]:
    counts = sorted({1, cfg.torch_threads}, reverse=True)
    return [Contender(impl, t, fn, uses_torch=True) for t in counts]


def run_case(
    cfg: Config, case: CaseResult, reference: np.ndarray, contenders: list[Contender]
) -> CaseResult:
    """Check every contender against ``reference``, then time them in rounds
    (`measure_rounds`: each contender in its own block per round, samples pooled)."""
    rtol, atol = (1e-4, 1e-5) if reference.dtype == np.float32 else (1e-9, 1e-12)
    atol *= max(1.0, float(np.abs(reference).max(initial=0.0)))
    for c in contenders:
        with _scope(c):
            got = _numpy(c.run())
        if got.shape != reference.shape or not np.allclose(got, reference, rtol=rtol, atol=atol):
            err = np.abs(got - reference).max() if got.shape == reference.shape else float("nan")
            raise WrongResult(
                f"{case.name}: {c.impl} ({c.threads} threads) disagrees with scipy: shape "
                f"{got.shape} vs {reference.shape}, max abs error {err:.3g}"
            )
    progress(f"{case.name}: {len(contenders)} contenders in {ROUNDS} rounds")
    named = {f"{c.impl} {c.threads}": c for c in contenders}
    timings = measure_rounds(
        {name: c.run for name, c in named.items()},
        warmup=cfg.warmup,
        repeats=cfg.repeats,
        scopes={name: (lambda c=c: _scope(c)) for name, c in named.items()},
    )
    for name, c in named.items():
        timing = timings[name]
        gbps = case.traffic_bytes / (timing.median_ms * 1e6) if case.traffic_bytes else None
        case.rows.append(Row(c.impl, c.threads, timing, gbps))
    return case


def _scope(c: Contender) -> contextlib.AbstractContextManager[None]:
    return torch_threads(c.threads) if c.uses_torch else contextlib.nullcontext()


def _numpy(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):
        value = value.detach().cpu()
        value = value.to_dense() if value.layout != _strided() else value
        return value.numpy()
    return np.asarray(value)


def _strided() -> Any:
    import torch

    return torch.strided


# --------------------------------------------------------------------------- cases


def spmv_case(
    cfg: Config, name: str, detail: str, A: sp.csr_matrix, seed: int, roofline: bool = True
) -> CaseResult:
    import torch

    x = np.random.default_rng(seed).uniform(-1.0, 1.0, size=A.shape[1]).astype(A.dtype)
    item, idx = A.dtype.itemsize, A.indices.dtype.itemsize
    case = CaseResult(name, detail, {"shape": A.shape, "nnz": A.nnz, "dtype": A.dtype.name})
    if roofline:  # not for cache-resident inputs, where the traffic model means nothing
        case.traffic_bytes = spmv_traffic(A.shape[0], A.shape[1], A.nnz, item, idx)
    k = sparsec.kernel(SPMV, {"A": "csr"})
    At = sparsec.Tensor.from_scipy(A)
    case.params["loop_order"] = k.generated(A.dtype.name).loop_order
    Tt, xt = torch_csr(A), torch.from_numpy(x)
    contenders = [
        *sparsec_contenders(cfg, k, A=At, x=x),
        Contender("scipy", 1, lambda: A @ x),
        *torch_contenders(cfg, "torch-csr", lambda: Tt @ xt),
    ]
    if A.shape[0] * A.shape[1] * item <= DENSE_LIMIT_BYTES:
        D = torch.from_numpy(A.toarray())
        contenders += torch_contenders(cfg, "torch-dense", lambda: D @ xt)
    return run_case(cfg, case, A @ x, contenders)


def spmm_case(cfg: Config, dtype: Any, seed: int) -> CaseResult:
    import torch

    rows, inner, cols = cfg.spmm_shape
    rng = np.random.default_rng(seed)
    W = pruned_csr(rows, inner, cfg.spmm_sparsity, rng).astype(dtype)
    X = rng.uniform(-1.0, 1.0, size=(inner, cols)).astype(dtype)
    name = f"spmm-{np.dtype(dtype).name}"
    detail = f"W {rows}x{inner} csr {cfg.spmm_sparsity:.0%} sparse x X {inner}x{cols} dense"
    case = CaseResult(
        name, detail, {"W": W.shape, "X": X.shape, "nnz": W.nnz, "dtype": np.dtype(dtype).name}
    )
    k = sparsec.kernel(SPMM, {"W": "csr"})
    Wt = sparsec.Tensor.from_scipy(W)
    case.params["loop_order"] = k.generated(np.dtype(dtype).name).loop_order
    Tt, Xt, Dt = torch_csr(W), torch.from_numpy(X), torch.from_numpy(W.toarray())
    contenders = [
        *sparsec_contenders(cfg, k, W=Wt, X=X),
        Contender("scipy", 1, lambda: W @ X),
        *torch_contenders(cfg, "torch-csr", lambda: Tt @ Xt),
        *torch_contenders(cfg, "torch-dense", lambda: Dt @ Xt),
    ]
    return run_case(cfg, case, W @ X, contenders)


def triad(cfg: Config) -> dict[int, float]:
    """GB/s of ``a = b + 3 c`` (float64, torch) per thread count: 3 arrays moved once."""
    counts = sorted({1, cfg.threads, cfg.torch_threads})
    return triad_gbps(counts, cfg.triad_n, warmup=cfg.warmup, repeats=cfg.repeats)


def triad_gbps(counts: list[int], n: int, *, warmup: int, repeats: int) -> dict[int, float]:
    """GB/s of ``a = b + 3 c`` on float64 torch tensors of n elements at each thread count
    of ``counts``: three arrays moved once per call."""
    import torch

    a, b, c = (torch.full((n,), v, dtype=torch.float64) for v in (0.0, 1.0, 2.0))
    out: dict[int, float] = {}
    for t in counts:
        progress(f"triad: {t} thread(s)")
        with torch_threads(t):
            timing = measure(
                lambda: torch.add(b, c, alpha=3.0, out=a), warmup=warmup, repeats=repeats
            )
        out[t] = 3 * n * 8 / (timing.median_ms * 1e6)
    return out


# --------------------------------------------------------------------------- compile times

_COMPILE_PROBE = r"""
import json, time
t0 = time.perf_counter()
import numpy as np
import sparsec
t1 = time.perf_counter()
k = sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": "csr"})
t2 = time.perf_counter()
A = sparsec.random((64, 64), 0.1, "csr", seed=0)
x = np.ones(64)
t3 = time.perf_counter()
k(A=A, x=x, threads=1)
t4 = time.perf_counter()
k(A=A, x=x, threads=1)
t5 = time.perf_counter()
# SpMM: a tiled kernel (register tiles, bands, depth blocks, streamed stores), the most
# code the C compiler sees
m = sparsec.kernel("C(i,j) = W(i,k) * X(k,j)", {"W": "csr"}, dtype="float32")
t6 = time.perf_counter()
W = sparsec.random((64, 64), 0.1, "csr", seed=0)
X = np.ones((64, 128), np.float32)
t7 = time.perf_counter()
m(W=W, X=X, threads=1)
t8 = time.perf_counter()
ms = lambda a, b: (b - a) * 1e3
print(json.dumps({"import_ms": ms(t0, t1), "kernel_ms": ms(t1, t2),
                  "first_call_ms": ms(t3, t4), "second_call_ms": ms(t4, t5),
                  "spmm_kernel_ms": ms(t5, t6), "spmm_first_call_ms": ms(t7, t8)}))
"""


def compile_times(cfg: Config) -> dict[str, dict[str, float]]:
    """Median phase times of a fresh process on an empty cache (cold) and a populated one."""
    runs: dict[str, list[dict[str, float]]] = {"cold": [], "warm": []}
    for i in range(cfg.compile_repeats):
        cache = tempfile.mkdtemp(prefix="sparsec-bench-cache-")
        try:
            for state in ("cold", "warm"):
                progress(f"compile: {state} cache, run {i + 1}/{cfg.compile_repeats}")
                runs[state].append(_probe(cache))
        finally:
            shutil.rmtree(cache, ignore_errors=True)
    return {
        state: {key: statistics.median(r[key] for r in rs) for key in rs[0]}
        for state, rs in runs.items()
    }


def _probe(cache: str) -> dict[str, float]:
    env = dict(os.environ, SPARSEC_CACHE_DIR=cache)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-c", _COMPILE_PROBE], env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"compile probe failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- report


def report(cfg: Config, cases: list[CaseResult], bw: dict[int, float]) -> str:
    n = cfg.threads
    table = Table(
        [
            "case",
            "impl",
            "thr",
            "median ms",
            "min ms",
            "max ms",
            "GB/s",
            "% triad",
            "sc@1T speedup",
            f"sc@{n}T speedup",
        ]
    )
    for case in cases:
        sc1, scn = case.median("sparsec", 1), case.median("sparsec", n)
        for r in case.rows:
            baseline = r.impl != "sparsec"
            table.add(
                case.name,
                r.impl,
                r.threads,
                r.timing.median_ms,
                r.timing.min_ms,
                r.timing.max_ms,
                r.gbps,
                None
                if r.gbps is None or r.threads not in bw
                else f"{100 * r.gbps / bw[r.threads]:.0f}%",
                f"{r.timing.median_ms / sc1:.2f}x" if baseline and sc1 else None,
                f"{r.timing.median_ms / scn:.2f}x" if baseline and scn else None,
            )
    lines = [f"{c.name}: {c.detail}" for c in cases]
    lines.append(
        "triad (torch, a = b + 3c): " + ", ".join(f"{t}T {g:.1f} GB/s" for t, g in bw.items())
    )
    lines.append(
        "speedup = baseline median / sparsec median at 1 or all threads (>1: sparsec faster)"
    )
    return "\n".join(lines) + "\n\n" + table.render()


def compile_report(times: dict[str, dict[str, float]]) -> str:
    table = Table(["phase (new process)", "cold cache ms", "warm cache ms"])
    labels = {
        "import_ms": "import sparsec",
        "kernel_ms": "sparsec.kernel(...) (SpMV)",
        "first_call_ms": "first call (generate+cc / load)",
        "second_call_ms": "second call",
        "spmm_kernel_ms": "sparsec.kernel(...) (SpMM)",
        "spmm_first_call_ms": "first call, SpMM (generate+cc / load)",
    }
    for key, label in labels.items():
        table.add(label, times["cold"][key], times["warm"][key])
    return table.render()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.core", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--quick", action="store_true", help="small sizes and few runs (CI smoke)")
    parser.add_argument(
        "--threads", type=int, default=None, help="sparsec's all-threads count (default: all cores)"
    )
    parser.add_argument("--no-compile", action="store_true", help="skip the compile-time probe")
    parser.add_argument("--compile-repeats", type=int, default=None)
    args = parser.parse_args(argv)
    settle(not args.quick)
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be >= 1")
    cfg = Config.make(args.quick, args.threads, args.compile_repeats)
    env = environment()
    load = os.getloadavg()[0]
    if load > 0.5:
        progress(
            f"warning: load average {load:.2f} before start: other processes share the "
            "cores, so multi-threaded timings will be noisy"
        )
    progress(
        f"core suite ({'quick' if cfg.quick else 'full'}), sparsec threads 1 and {cfg.threads}, "
        f"torch threads {cfg.torch_threads} and 1"
    )

    rng = np.random.default_rng(0)
    n, b = cfg.random_n, cfg.banded_n
    progress("building inputs")
    cases = [
        spmv_case(
            cfg,
            "spmv-tiny",
            "A 256x256, 10 random nonzeros per row: per-call overhead",
            random_rows_csr(256, 10, rng, np.float64),
            seed=0,
            roofline=False,
        ),
        spmv_case(
            cfg,
            "spmv-random",
            f"A {n}x{n}, {cfg.per_row} random nonzeros per row, float64",
            random_rows_csr(n, cfg.per_row, rng, np.float64),
            seed=1,
        ),
        spmv_case(
            cfg,
            "spmv-banded",
            f"A {b}x{b}, 5 diagonals (offsets -2..2), float64",
            banded_csr(b, range(-2, 3), rng, np.float64),
            seed=2,
        ),
        spmm_case(cfg, np.float64, seed=3),
        spmm_case(cfg, np.float32, seed=3),
    ]
    bw = triad(cfg)
    print(report(cfg, cases, bw))
    compile = None if args.no_compile else compile_times(cfg)
    if compile is not None:
        print()
        print(compile_report(compile))

    payload = {
        "suite": "core",
        "config": cfg,
        "environment": env,
        "triad_gbps": bw,
        "cases": [
            {
                "name": c.name,
                "detail": c.detail,
                "params": c.params,
                "traffic_bytes": c.traffic_bytes,
                "rows": [
                    {"impl": r.impl, "threads": r.threads, "gbps": r.gbps, **r.timing.summary()}
                    for r in c.rows
                ],
            }
            for c in cases
        ],
        "compile": compile,
        "load_average": {"start": load, "end": os.getloadavg()[0]},
    }
    path = write_results("core-quick" if cfg.quick else "core", payload)
    progress(f"results written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
