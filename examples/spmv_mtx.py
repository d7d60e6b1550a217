"""SpMV on a Matrix Market file: load it, compile y(i) = A(i,j) * x(j) for CSR, compare with scipy.

python examples/spmv_mtx.py [matrix.mtx]     # default: examples/data/small.mtx
"""

import sys
from pathlib import Path

import numpy as np
import scipy.io

import sparsec
from sparsec.io import load_mtx

path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "data" / "small.mtx"

# CSR by default; a symmetric file (like small.mtx) is expanded to both triangles.
A = load_mtx(path, "csr")
print(f"{path.name}: {A.shape[0]} x {A.shape[1]}, {A.nnz} stored nonzeros")

spmv = sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": "csr"})
x = np.linspace(-1.0, 1.0, A.shape[1])
y = spmv(A=A, x=x)  # compiled on first use, then cached on disk

expected = scipy.io.mmread(path).tocsr() @ x
error = float(np.abs(y - expected).max())
assert np.allclose(y, expected), f"sparsec and scipy disagree (max abs error {error:.3g})"
print(
    f"y = A @ x matches scipy.sparse: max abs error {error:.3g}, ||y||_2 = {np.linalg.norm(y):.6f}"
)
