"""sparsec benchmark suites: ``python -m bench [SUITE ...] [--quick] [--threads N]``.

A suite is a module with ``main(argv: list[str] | None = None) -> int`` that accepts at
least ``--quick`` (small sizes, a few seconds, for CI smoke runs) and ``--threads N``, prints
a table to stdout and writes ``bench/results/<suite>.json``. Register it in `SUITES`.
"""

from __future__ import annotations

#: suite name -> (module, one-line description); run in this order by ``python -m bench``.
SUITES: dict[str, tuple[str, str]] = {
    "core": ("bench.core", "SpMV (random, banded roofline), SpMM CSR x dense, compile times"),
    "sparse": ("bench.sparse", "sparse outputs: SpGEMM and sparse add into CSR, serial"),
    "schedule": ("bench.schedule", "default schedule vs serial kernel; TACO-style schedules"),
    "bert": ("bench.bert", "pruned BERT weights: SpMM vs torch dense/CSR, scipy, MKL; plot"),
    "panels": (
        "bench.panels",
        "column panels: whole width vs packed panels, the cost model's pick",
    ),
    "contention": (
        "bench.contention",
        "SpMV on a quiet machine and beside busy processes: default vs 1 and all threads",
    ),
    "e2e": ("bench.e2e", "pruned MiniLM forward pass: sparsec linear layers vs dense torch"),
    "linear": (
        "bench.linear",
        "SparseLinear vs dense F.linear (BERT, MiniLM FFN; 50/70/90 %), the raw kernel beside",
    ),
    "language": (
        "bench.language",
        "division, sums under +, n-operand sums, semirings vs reciprocal, scipy, GraphBLAS",
    ),
    "graphs": (
        "bench.graphs",
        "sparsec.graph on R-MAT vs python-graphblas (LAGraph) and csgraph; bool vs float64 BFS",
    ),
    "taco": (
        "bench.taco",
        "side by side with TACO (its C++ API, and its C with -march=native), 1 and 2 threads",
    ),
    "taco_compile": (
        "bench.taco_compile",
        "cold compile in fresh processes: sparsec generate + cc vs TACO lower + cc",
    ),
    "roofline": (
        "bench.roofline",
        "SpMV, banded SpMV, TTV vs measured bandwidth; SpMM, MTTKRP, SDDMM vs peak FMA rate",
    ),
    "graphblas": (
        "bench.graphblas",
        "side by side with python-graphblas: SpMV, SpGEMM, add, B + C*D, SDDMM, 1 and 2 threads",
    ),
    "distributed": (
        "bench.distributed",
        "sparsec.distributed on a 2-worker Dask cluster vs one process; sd.model up to P=512",
    ),
    "generate": (
        "bench.generate",
        "cold code generation in fresh processes: SpMV, SpMM, SpGEMM, MTTKRP, CUDA defaults",
    ),
    "formats": (
        "bench.formats",
        "bsr(4,4) and nm(2,4) SpMV/SpMM vs sparsec's CSR of the same entries and scipy",
    ),
    "gpu": ("bench.gpu", "CUDA kernels: ptxas report, bytes-moved roofline, cuSPARSE on a GPU"),
    "gpu_lanes": ("bench.gpu_lanes", "SpMV lanes per row, 2 to 128 per row, on a GPU"),
}
