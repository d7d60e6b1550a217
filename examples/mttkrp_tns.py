"""MTTKRP on a FROSTT .tns tensor: A(i,j) = B(i,k,l) * D(l,j) * C(k,j) with B stored as CSF.

python examples/mttkrp_tns.py [tensor.tns] [rank]    # default: examples/data/small.tns, 8
"""

import sys
from pathlib import Path

import numpy as np

import sparsec
from sparsec.io import load_tns

path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "data" / "small.tns"
rank = int(sys.argv[2]) if len(sys.argv) > 2 else 8

B = load_tns(path, "csf")  # compressed at every level: B1_pos/B1_crd, B2_..., B3_...
n_i, n_k, n_l = B.shape
print(f"{path.name}: {n_i} x {n_k} x {n_l}, {B.nnz} nonzeros, format {B.format}")

rng = np.random.default_rng(0)
C = rng.standard_normal((n_k, rank))  # factor matrices (dense)
D = rng.standard_normal((n_l, rank))

mttkrp = sparsec.kernel("A(i,j) = B(i,k,l) * D(l,j) * C(k,j)", {"B": "csf"})
A = mttkrp(B=B, C=C, D=D)
print(f"A: {A.shape[0]} x {A.shape[1]}, ||A||_F = {np.linalg.norm(A):.6f}")
print(mttkrp.check(B=B, C=C, D=D))  # the same run compared with torch.einsum on dense inputs

print(f"\nloop order {', '.join(mttkrp.generated().loop_order)}; the generated C:\n")
print(mttkrp.source)
