"""GPU suite, on paper until a GPU is lent: ptxas' report for every CUDA kernel and a
bytes-moved model against HBM bandwidth; with a GPU, timings against cuSPARSE.

    python -m bench.gpu [--quick] [--bandwidth TBPS]

For SpMV, SpMM and MTTKRP under each GPU schedule (the default and TACO-style ones): the
registers per thread, spill bytes and theoretical occupancy on sm_90 (NVRTC), the
compulsory bytes every implementation must move, and the time that takes at HBM bandwidth
(3.35 TB/s, H100 SXM, by default): the roofline no schedule can beat. Each kernel is first
run through the CUDA emulation on a small instance and checked against numpy.

Compulsory traffic (values 8 bytes, indices 4): SpMV CSR ``nnz*(8+4) + (rows+1)*4 + cols*8
+ rows*8``; SpMM ``nnz*(8+4) + (rows+1)*4 + cols*n*8 + rows*n*8``; MTTKRP CSF
``nnz*(8+4) + fibers*(4+4) + slices*(4+4) + (K+L)*rank*8 + I*rank*8`` (each dense factor read
once, the output written once). Gathers of x / X / D / C rows that miss the cache and the
atomics' read-modify-writes come on top; the model is a lower bound.

Where CuPy finds a device, each kernel is also timed (median of 20 after warm-up) next to
``cupyx.scipy.sparse`` (cuSPARSE) for SpMV and SpMM.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

import sparsec
from sparsec import gpu

from .common import Table, environment, progress, write_results
from .core import WrongResult, pruned_csr, random_rows_csr

SPMV = "y(i) = A(i,j) * x(j)"
SPMM = "C(i,j) = W(i,k) * X(k,j)"
MTTKRP = "A(i,j) = B(i,k,l) * D(l,j) * C(k,j)"

SCHEDULES: dict[str, dict[str, str | None]] = {
    "spmv": {
        "default (thread per row)": None,
        "warp per row": "split(i,i0,i1,8), pos(j,jp,A), split(jp,j0,j1,32), "
        "reorder(i0,i1,j0,j1), parallelize(i0,GPUBlock,NoRaces), "
        "parallelize(i1,GPUWarp,NoRaces), parallelize(j1,GPUThread,ParallelReduction)",
        "nonzero-parallel": "fuse(i,j,f), pos(f,fp,A), split(fp,b,fp1,2048), "
        "split(fp1,t,n,8), parallelize(b,GPUBlock,Atomics), parallelize(t,GPUThread,Atomics)",
    },
    "spmm": {
        "default (thread per row)": None,
        "row per block, thread per column": "parallelize(i,GPUBlock,NoRaces), "
        "parallelize(j,GPUThread,NoRaces), reorder(i,j,k)",
    },
    "mttkrp": {
        "default (nonzero-parallel, atomics)": None,
        "thread per slice": "pos(i,ip,B), split(ip,b,t,256), parallelize(b,GPUBlock,NoRaces), "
        "parallelize(t,GPUThread,NoRaces)",
    },
}
FORMATS = {"spmv": {"A": "csr"}, "spmm": {"W": "csr"}, "mttkrp": {"B": "csf"}}
EXPRS = {"spmv": SPMV, "spmm": SPMM, "mttkrp": MTTKRP}


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    detail: str
    traffic: int
    inputs: dict[str, Any]
    reference: np.ndarray


def workloads(quick: bool) -> list[Workload]:
    rng = np.random.default_rng(0)
    n = 2000 if quick else 100_000
    a = random_rows_csr(n, 10, rng, np.float64)
    x = rng.standard_normal(n)
    spmv_bytes = a.nnz * 12 + (n + 1) * 4 + n * 8 + n * 8
    rows, cols, batch = (96, 64, 32) if quick else (3072, 768, 512)
    w = pruned_csr(rows, cols, 0.9, rng)
    xs = rng.standard_normal((cols, batch))
    spmm_bytes = w.nnz * 12 + (rows + 1) * 4 + cols * batch * 8 + rows * batch * 8
    dim, nnz, rank = (40, 4000, 8) if quick else (2000, 1_000_000, 32)
    flat = np.unique(rng.integers(0, dim**3, size=int(nnz * 1.01)))[:nnz]
    coords = np.stack(np.unravel_index(flat, (dim, dim, dim)))
    vals = rng.standard_normal(len(flat))
    b = sparsec.Tensor.from_coo(coords, vals, (dim, dim, dim), "csf")
    d, c = rng.standard_normal((dim, rank)), rng.standard_normal((dim, rank))
    fibers = len(np.unique(coords[0] * dim + coords[1]))
    slices = len(np.unique(coords[0]))
    mttkrp_bytes = len(flat) * 12 + fibers * 8 + slices * 8 + 2 * dim * rank * 8 + dim * rank * 8
    ref = np.zeros((dim, rank))
    np.add.at(ref, coords[0], vals[:, None] * d[coords[2]] * c[coords[1]])
    return [
        Workload("spmv", f"A {n}^2, 10/row", spmv_bytes, {"A": a, "x": x}, a @ x),
        Workload(
            "spmm",
            f"W {rows}x{cols} 90 % pruned, X {cols}x{batch}",
            spmm_bytes,
            {"W": w, "X": xs},
            w @ xs,
        ),
        Workload(
            "mttkrp",
            f"B {dim}^3, {len(flat)} nonzeros, rank {rank}",
            mttkrp_bytes,
            {"B": b, "D": d, "C": c},
            ref,
        ),
    ]


def small_instance(name: str) -> tuple[dict[str, Any], np.ndarray]:
    """A small instance for the emulation check (integer values: atomics reorder sums)."""
    rng = np.random.default_rng(1)
    if name == "spmv":
        a = (rng.random((300, 200)) < 0.05) * rng.integers(1, 5, (300, 200)).astype(float)
        x = rng.integers(-3, 4, 200).astype(float)
        return {"A": a, "x": x}, a @ x
    if name == "spmm":
        w = (rng.random((64, 48)) < 0.1) * rng.integers(1, 5, (64, 48)).astype(float)
        xs = rng.integers(-3, 4, (48, 16)).astype(float)
        return {"W": w, "X": xs}, w @ xs
    b = (rng.random((20, 15, 12)) < 0.1) * rng.integers(1, 5, (20, 15, 12)).astype(float)
    d = rng.integers(-2, 3, (12, 8)).astype(float)
    c = rng.integers(-2, 3, (15, 8)).astype(float)
    return {"B": b, "D": d, "C": c}, np.einsum("ikl,lj,kj->ij", b, d, c)


def _device_time(k: sparsec.Kernel, inputs: dict[str, Any]) -> float | None:
    try:
        cp = gpu.cupy_device()
    except sparsec.SparsecError:
        return None
    k(**inputs)
    samples = []
    for _ in range(20):
        cp.cuda.Device().synchronize()
        start = time.perf_counter()
        k(**inputs)
        cp.cuda.Device().synchronize()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def _cusparse_time(w: Workload) -> float | None:
    try:
        cp = gpu.cupy_device()
        import cupyx.scipy.sparse as csp  # type: ignore[import-not-found]
    except (sparsec.SparsecError, ImportError):
        return None
    if w.name == "mttkrp":
        return None
    m, dense = (
        (w.inputs["A"], w.inputs["x"]) if w.name == "spmv" else (w.inputs["W"], w.inputs["X"])
    )
    dm, dd = csp.csr_matrix(m), cp.asarray(dense)
    dm @ dd
    samples = []
    for _ in range(20):
        cp.cuda.Device().synchronize()
        start = time.perf_counter()
        dm @ dd
        cp.cuda.Device().synchronize()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gpu", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--quick", action="store_true", help="small sizes (CI smoke)")
    parser.add_argument("--threads", type=int, default=None, help="ignored (suite interface)")
    parser.add_argument("--bandwidth", type=float, default=3.35, help="HBM bandwidth, TB/s")
    args = parser.parse_args(argv)
    table = Table(
        [
            "case",
            "schedule",
            "regs",
            "spills",
            "occupancy",
            "MB moved",
            "roofline us",
            "device ms",
            "cuSPARSE ms",
        ]
    )
    records = []
    for w in workloads(args.quick):
        progress(f"{w.name}: {w.detail}")
        cusparse = _cusparse_time(w)
        for label, schedule in SCHEDULES[w.name].items():
            expr, fmts = EXPRS[w.name], FORMATS[w.name]
            emulated = sparsec.kernel(expr, fmts, target="cuda-emulated", schedule=schedule)
            small, want = small_instance(w.name)
            got = np.asarray(emulated(**small))
            if not np.allclose(got, want):
                raise WrongResult(f"{w.name} {label}: the emulation disagrees with numpy")
            (sm90,) = [r for r in emulated.verify() if r.arch == "sm_90"]
            device = (
                _device_time(sparsec.kernel(expr, fmts, target="cuda", schedule=schedule), w.inputs)
                if cusparse is not None
                else None
            )
            roofline_us = w.traffic / (args.bandwidth * 1e12) * 1e6
            table.add(
                w.name,
                label,
                sm90.registers,
                sm90.spills,
                f"{sm90.occupancy:.0%}",
                w.traffic / 1e6,
                roofline_us,
                device,
                cusparse,
            )
            records.append(
                {
                    "case": w.name,
                    "detail": w.detail,
                    "schedule": label,
                    "commands": emulated.schedule,
                    "ptxas_sm90": str(sm90),
                    "bytes": w.traffic,
                    "roofline_us": roofline_us,
                    "device_ms": device,
                    "cusparse_ms": cusparse,
                }
            )
    print(table.render())
    print(
        f"\nroofline: compulsory bytes at {args.bandwidth} TB/s; device columns need a GPU "
        "(CuPy); every kernel above was run by the CUDA emulation and checked first"
    )
    path = write_results(
        "gpu-quick" if args.quick else "gpu",
        {"environment": environment(), "bandwidth_tbps": args.bandwidth, "rows": records},
    )
    progress(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
