"""GPU suite, on paper until a GPU is lent: ptxas' report for every CUDA kernel and a
bytes-moved model against HBM bandwidth; with a GPU, timings against cuSPARSE.

    python -m bench.gpu [--quick] [--bandwidth TBPS]

For SpMV, SpMM and MTTKRP under each GPU schedule (the default and TACO-style ones; for
SpMV also thread-per-row and CSR-vector with 4, 8 and 16 lanes per row, the default
picking one per call from the average row length: 4 for 10/row): the
registers per thread, spill bytes and theoretical occupancy on sm_90 (NVRTC), the
compulsory bytes every implementation must move, and the time that takes at HBM bandwidth
(3.35 TB/s, H100 SXM, by default): the roofline no schedule can beat. Each kernel is first
run through the CUDA emulation on a small instance and checked against numpy.

Compulsory traffic (values v = 8 or 4 bytes, indices 4): SpMV CSR ``nnz*(8+4) +
(rows+1)*4 + cols*8 + rows*8``; SpMM ``nnz*(v+4) + (rows+1)*4 + cols*n*v + rows*n*v``; MTTKRP CSF
``nnz*(8+4) + fibers*(4+4) + slices*(4+4) + (K+L)*rank*8 + I*rank*8`` (each dense factor read
once, the output written once). Gathers of x / X / D / C rows that miss the cache and the
atomics' read-modify-writes come on top; the model is a lower bound.

Where CuPy finds a device, each kernel is also run there: its result is checked against the
reference, then the kernel alone is timed on staged inputs (`Kernel.device_launch`; CUDA
events around 10 launches back to back, median of 30 such batches, after warm-up; a kernel
that adds with atomics zeroes its output inside the timing). "call ms" is a whole Python
call with the dense inputs already in GPU memory as CuPy arrays (timed the same way: the
sparse `Tensor` stays on the device after its first call); "host call ms" one with the
workload's numpy and scipy inputs, their conversion and the copies to and from the device
included (wall clock, median of 10). Baselines, timed the same way on
device-resident operands and checked: cuSPARSE through ``cupyx.scipy.sparse`` and through
torch's sparse CSR tensors (each call includes that library's per-call setup: descriptors,
buffers, the output's allocation), and torch's dense matmul for SpMM.

The float16 and bfloat16 SpMM rows run kernels built for that dtype (values stored in 16
bits, float32 arithmetic) on float32 inputs holding values of the type, checked against the
float64 product within the type's rounding; their baselines are torch's sparse CSR and
dense matmul in the same 16-bit type (``cupyx.scipy.sparse`` has no 16-bit matrices).
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

import sparsec
from sparsec.policy.schedules import vector_lanes, vector_schedule
from sparsec.runtime import device
from sparsec.tensors.halves import HALF, from_storage, readable, to_storage

from .common import Table, environment, progress, write_results
from .core import WrongResult, pruned_csr, random_rows_csr

SPMV = "y(i) = A(i,j) * x(j)"
SPMM = "C(i,j) = W(i,k) * X(k,j)"
MTTKRP = "A(i,j) = B(i,k,l) * D(l,j) * C(k,j)"

SCHEDULES: dict[str, dict[str, str | None]] = {
    "spmv": {
        "default (CSR-vector: lanes per row from the average row length)": None,
        "thread per row": "split(i,i0,i1,256), parallelize(i0,GPUBlock,NoRaces), "
        "parallelize(i1,GPUThread,NoRaces)",
        **{
            f"CSR-vector, {lanes} lanes per row": ", ".join(
                str(c) for c in vector_schedule("i", "j", "A", lanes)
            )
            for lanes in (4, 8, 16)
        },
        "warp per row": "split(i,i0,i1,8), pos(j,jp,A), split(jp,j0,j1,32), "
        "reorder(i0,i1,j0,j1), parallelize(i0,GPUBlock,NoRaces), "
        "parallelize(i1,GPUWarp,NoRaces), parallelize(j1,GPUThread,ParallelReduction)",
        "nonzero-parallel": "fuse(i,j,f), pos(f,fp,A), split(fp,b,fp1,2048), "
        "split(fp1,t,n,8), parallelize(b,GPUBlock,Atomics), parallelize(t,GPUThread,Atomics)",
    },
    "spmm": {
        "default (row per block, 4|2 columns per thread)": None,
        "thread per row": "split(i,i0,i1,256), parallelize(i0,GPUBlock,NoRaces), "
        "parallelize(i1,GPUThread,NoRaces)",
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
    #: spmv, spmm or mttkrp (the expression, formats and schedules)
    kind: str
    detail: str
    traffic: int
    inputs: dict[str, Any]
    reference: np.ndarray
    #: the labels of SCHEDULES[kind] to run (all when empty)
    only: tuple[str, ...] = ()
    #: the kernels' value dtype when it is a 16-bit one (None: the inputs')
    dtype: str | None = None

    @property
    def value_name(self) -> str:
        return self.dtype or str(next(iter(self.inputs.values())).dtype)


def workloads(quick: bool) -> list[Workload]:
    rng = np.random.default_rng(0)
    found = []
    # SpMV: 1M rows (about 130 MB moved: more than the H100's 50 MB L2, so repeated launches
    # stream from HBM)
    n = 2000 if quick else 1_000_000
    a = random_rows_csr(n, 10, rng, np.float64)
    x = rng.standard_normal(n)
    spmv_bytes = a.nnz * 12 + (n + 1) * 4 + n * 8 + n * 8
    found.append(Workload("spmv", f"A {n}^2, 10/row", spmv_bytes, {"A": a, "x": x}, a @ x))
    # SpMM: TACO's shape in float64 (every schedule), then BERT-base weights in float32 at
    # the widths of bench bert and BERT's hidden size (the default mapping only)
    spmm = (
        (3072, 768, 0.9, 512, np.float64),
        (3072, 768, 0.9, 128, np.float32),
        (3072, 768, 0.9, 512, np.float32),
        (3072, 768, 0.9, 2048, np.float32),
        (768, 3072, 0.8, 512, np.float32),
        (768, 3072, 0.8, 2048, np.float32),
        (768, 768, 0.7, 768, np.float32),
        # a pruned model's 16-bit weights (float32 inputs holding values of the type)
        (3072, 768, 0.9, 512, "float16"),
        (3072, 768, 0.9, 512, "bfloat16"),
        (768, 3072, 0.8, 2048, "float16"),
    )
    chosen = spmm if not quick else (*spmm[:2], spmm[-3])
    for n, (rows, cols, sparsity, batch, dtype) in enumerate(chosen):
        if quick:
            rows, cols, batch = rows // 32, cols // 12, batch // 16
        half = dtype if dtype in HALF else None
        w = pruned_csr(rows, cols, sparsity, rng).astype(np.float32 if half else dtype)
        xs = rng.standard_normal((cols, batch)).astype(np.float32 if half else dtype)
        if half:  # values of the 16-bit type, so that the float64 reference is exact
            w.data = from_storage(to_storage(w.data, half), half)
            xs = from_storage(to_storage(xs, half), half).reshape(xs.shape)
        size = 2 if half else np.dtype(dtype).itemsize
        spmm_bytes = w.nnz * (size + 4) + (rows + 1) * 4 + (cols + rows) * batch * size
        name = half or np.dtype(dtype).name
        detail = f"W {rows}x{cols} {sparsity:.0%} pruned, X {cols}x{batch}, {name}"
        only = () if n == 0 else (next(iter(SCHEDULES["spmm"])),)
        reference = w.astype(np.float64) @ xs.astype(np.float64)
        found.append(Workload("spmm", detail, spmm_bytes, {"W": w, "X": xs}, reference, only, half))
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
    found.append(
        Workload(
            "mttkrp",
            f"B {dim}^3, {len(flat)} nonzeros, rank {rank}",
            mttkrp_bytes,
            {"B": b, "D": d, "C": c},
            ref,
        )
    )
    return found


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


def _verified(k: sparsec.Kernel, w: Workload) -> list[Any]:
    """ptxas' report on the kernel that runs ``w``: for the SpMV default, the group size
    its rows' average length picks (`vector_lanes`) where that is not thread-per-row."""
    if w.kind == "spmv" and not k.commands:
        a = w.inputs["A"]
        lanes = vector_lanes(a.nnz / a.shape[0])
        if lanes:
            commands = ", ".join(str(c) for c in vector_schedule("i", "j", "A", lanes))
            return sparsec.kernel(SPMV, FORMATS["spmv"], target="cuda", schedule=commands).verify()
    return k.verify()


def _event_median(run: Any, repeats: int = 30, batch: int = 10) -> float:
    """Device time of one ``run()`` in ms: the median over ``repeats`` of ``batch`` runs
    issued back to back between two CUDA events (on the legacy default stream, CuPy's and
    torch's default), so the GPU stays busy and a run's host-side launch cost is hidden
    where it is shorter than the run; after warm-up."""
    cp = device.cupy_device()
    for _ in range(3):
        run()
    cp.cuda.Device().synchronize()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    samples = []
    for _ in range(repeats):
        start.record()
        for _ in range(batch):
            run()
        end.record()
        end.synchronize()
        samples.append(cp.cuda.get_elapsed_time(start, end) / batch)
    return statistics.median(samples)


#: the relative tolerance of a result by value dtype (16-bit ones: twice their rounding)
TOLERANCES = {"float64": 1e-9, "float32": 1e-4, "float16": 1e-3, "bfloat16": 8e-3}


def _close(got: np.ndarray, want: np.ndarray, dtype: str | None = None) -> bool:
    tol = TOLERANCES[dtype or ("float32" if got.dtype == np.float32 else "float64")]
    got = np.asarray(got, dtype=np.float64)
    return bool(np.allclose(got, want, rtol=tol, atol=tol * np.abs(want).max()))


#: unit roundoff of each 16-bit type
UNIT_ROUNDOFF = {"float16": 2.0**-11, "bfloat16": 2.0**-8}


def _within_accumulation(got: np.ndarray, w: Workload) -> bool:
    """A 16-bit baseline that may add in its own type (torch's sparse CSR product): each
    entry within the bound of n additions in that type, n the longest row, ``n * u *
    (|W| @ |X|)`` plus the final rounding (Higham's bound for any summation order). An
    index or value wrong anywhere still fails it: the error then is of the terms' size."""
    m, dense = w.inputs["W"], w.inputs["X"]
    u = UNIT_ROUNDOFF[w.dtype or ""]
    n = int(np.diff(m.indptr).max(initial=1))
    bound = n * u * (abs(m) @ np.abs(dense)) + u * np.abs(w.reference)
    return bool(np.all(np.abs(np.asarray(got, dtype=np.float64) - w.reference) <= bound))


def _device_times(k: sparsec.Kernel, w: Workload) -> tuple[float, float, float] | None:
    """(the kernel alone on staged inputs, a call with the dense inputs in GPU memory, a
    call with host inputs and its copies), in ms; each result is checked first."""
    try:
        cp = device.cupy_device()
    except sparsec.SparsecError:
        return None
    launch, out = k.device_launch(**w.inputs)
    launch()
    got = cp.asnumpy(out).reshape(w.reference.shape)
    if w.dtype is not None and got.dtype == np.uint16:  # bfloat16 storage: its bits
        got = readable(got, w.dtype)
    if not _close(got, w.reference, w.dtype):
        raise WrongResult(f"{w.kind} {w.detail}: the device result disagrees with the reference")
    kernel_ms = _event_median(launch)
    # what a caller repeating the product holds: dense operands in GPU memory, the sparse
    # one as a sparsec Tensor (converted once; its arrays stay on the device)
    on_device = {
        n: cp.asarray(v)
        if isinstance(v, np.ndarray)
        else sparsec.as_tensor(v, FORMATS[w.kind].get(n))
        for n, v in w.inputs.items()
    }
    got = cp.asnumpy(k(**on_device)).reshape(w.reference.shape)
    if not _close(got, w.reference, w.dtype):
        raise WrongResult(f"{w.kind} {w.detail}: a call on device inputs disagrees")
    device_call_ms = _event_median(lambda: k(**on_device))
    k(**w.inputs)
    samples = []
    for _ in range(10):
        start = time.perf_counter()
        k(**w.inputs)
        samples.append((time.perf_counter() - start) * 1e3)
    return kernel_ms, device_call_ms, statistics.median(samples)


def _baseline_times(w: Workload) -> dict[str, float]:
    """cuSPARSE CSR times dense through ``cupyx.scipy.sparse`` and through torch's sparse
    CSR tensors, and for SpMM torch's dense matmul; operands already on the device, each
    result checked. Empty without a GPU."""
    try:
        cp = device.cupy_device()
        import cupyx.scipy.sparse as csp  # type: ignore[import-not-found]
    except (sparsec.SparsecError, ImportError):
        return {}
    if w.kind == "mttkrp":
        return {}
    m, dense = (
        (w.inputs["A"], w.inputs["x"]) if w.kind == "spmv" else (w.inputs["W"], w.inputs["X"])
    )
    found = {}
    if w.dtype is None:  # cupyx.scipy.sparse has no 16-bit matrices
        dm, dd = csp.csr_matrix(m), cp.asarray(dense)
        if not _close(cp.asnumpy(dm @ dd), w.reference):
            raise WrongResult(f"{w.kind}: cuSPARSE (CuPy) disagrees with the reference")
        found["cuSPARSE (CuPy)"] = _event_median(lambda: dm @ dd)
    try:
        import torch
    except ImportError:
        return found
    if not torch.cuda.is_available():
        return found
    kind = getattr(torch, w.dtype) if w.dtype is not None else None
    tm = torch.sparse_csr_tensor(
        torch.as_tensor(m.indptr.astype(np.int64)),
        torch.as_tensor(m.indices.astype(np.int64)),
        torch.as_tensor(m.data).to(kind),
        size=m.shape,
    ).to("cuda")
    td = torch.as_tensor(dense, device="cuda").to(kind)
    try:
        product = tm @ td
    except RuntimeError as err:  # a 16-bit sparse product this torch build lacks
        progress(f"{w.kind} {w.detail}: no torch sparse CSR baseline ({err})")
        product = None
    if product is not None:
        found_product = product.float().cpu().numpy()
        if w.dtype in UNIT_ROUNDOFF:
            agrees = _within_accumulation(found_product, w)
        else:
            agrees = _close(found_product, w.reference, w.dtype)
        if not agrees:
            raise WrongResult(f"{w.kind}: torch sparse CSR disagrees with the reference")
        found["cuSPARSE (torch CSR)"] = _event_median(lambda: tm @ td)
    if w.kind == "spmm":
        tw = torch.as_tensor(m.toarray(), device="cuda").to(kind)
        found["torch dense"] = _event_median(lambda: tw @ td)
    return found


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
            "kernel ms",
            "% roofline",
            "call ms",
            "host call ms",
            "cuSPARSE CuPy ms",
            "cuSPARSE torch ms",
            "vs faster",
            "torch dense ms",
        ]
    )
    records = []
    for w in workloads(args.quick):
        progress(f"{w.kind}: {w.detail}")
        baselines = _baseline_times(w)
        for label, schedule in SCHEDULES[w.kind].items():
            if w.only and label not in w.only:
                continue
            expr, fmts = EXPRS[w.kind], FORMATS[w.kind]
            emulated = sparsec.kernel(
                expr, fmts, target="cuda-emulated", schedule=schedule, dtype=w.dtype
            )
            small, want = small_instance(w.kind)  # integers: exact in 16 bits too
            got = np.asarray(emulated(**small), dtype=np.float64)
            if not np.allclose(got, want):
                raise WrongResult(f"{w.kind} {label}: the emulation disagrees with numpy")
            (sm90,) = [r for r in _verified(emulated, w) if r.arch == "sm_90"]
            on_gpu = sparsec.kernel(expr, fmts, target="cuda", schedule=schedule, dtype=w.dtype)
            times = _device_times(on_gpu, w)
            kernel_ms, device_call_ms, call_ms = times if times is not None else (None,) * 3
            roofline_us = w.traffic / (args.bandwidth * 1e12) * 1e6
            cusparse = min(
                (t for name, t in baselines.items() if name.startswith("cuSPARSE")), default=None
            )
            table.add(
                w.kind
                if w.kind != "spmm"
                else f"spmm {w.detail.split(' pruned')[0][2:]} x{w.inputs['X'].shape[1]} {w.value_name}",
                label,
                sm90.registers,
                sm90.spills,
                f"{sm90.occupancy:.0%}",
                w.traffic / 1e6,
                roofline_us,
                kernel_ms,
                None if kernel_ms is None else f"{roofline_us / 1e3 / kernel_ms:.0%}",
                device_call_ms,
                call_ms,
                baselines.get("cuSPARSE (CuPy)"),
                baselines.get("cuSPARSE (torch CSR)"),
                None if cusparse is None or kernel_ms is None else f"{cusparse / kernel_ms:.2f}x",
                baselines.get("torch dense"),
            )
            records.append(
                {
                    "case": w.kind,
                    "detail": w.detail,
                    "schedule": label,
                    "commands": emulated.schedule,
                    "ptxas_sm90": str(sm90),
                    "bytes": w.traffic,
                    "roofline_us": roofline_us,
                    "kernel_ms": kernel_ms,
                    "device_call_ms": device_call_ms,
                    "host_call_ms": call_ms,
                    "baselines_ms": baselines,
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
