"""The CUDA path on a machine without a GPU: generate MTTKRP for the GPU, compile it with
NVRTC for sm_80 and sm_90, and run the same source on the CPU through the emulation.

    python examples/gpu_kernels.py
"""

from __future__ import annotations

import numpy as np

import sparsec

rng = np.random.default_rng(0)
B = (rng.random((40, 30, 20)) < 0.05) * rng.integers(1, 5, (40, 30, 20)).astype(float)
D = rng.integers(-2, 3, (20, 8)).astype(float)
C = rng.integers(-2, 3, (30, 8)).astype(float)
want = np.einsum("ikl,lj,kj->ij", B, D, C)

expr = "A(i,j) = B(i,k,l) * D(l,j) * C(k,j)"
k = sparsec.kernel(expr, {"B": "csf"}, target="cuda-emulated")
print(f"schedule: {k.schedule}")
for report in k.verify():  # NVRTC from the pip wheel (or nvcc); no GPU needed
    print(f"compiled: {report}")
A = k(B=B, D=D, C=C)  # integer-valued data: atomics may add in any order, exactly
assert np.array_equal(A, want)
print("the emulated CUDA kernel matches numpy")

# a warp per row: lanes stride over the row's nonzeros, a shuffle reduction adds them up
spmv = sparsec.kernel(
    "y(i) = A(i,j) * x(j)",
    {"A": "csr"},
    target="cuda-emulated",
    schedule="split(i,i0,i1,8), pos(j,jp,A), split(jp,j0,j1,32), reorder(i0,i1,j0,j1), "
    "parallelize(i0,GPUBlock,NoRaces), parallelize(i1,GPUWarp,NoRaces), "
    "parallelize(j1,GPUThread,ParallelReduction)",
)
M = (rng.random((500, 300)) < 0.02) * rng.integers(1, 9, (500, 300)).astype(float)
x = rng.integers(-3, 4, 300).astype(float)
assert np.array_equal(spmv(A=M, x=x), M @ x)
print("warp-per-row SpMV matches numpy")
print(k.source.split('extern "C" ')[1])
