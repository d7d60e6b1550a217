"""One expression, four storage formats. The format decides the loop order (the iteration graph
visits every tensor in its level order) and what each loop walks: every row (csr), only the
stored rows (dcsr), runs of equal row coordinates (coo), or every column (csc).

    python examples/formats.py
"""

import time

import numpy as np

import sparsec

# A hypersparse matrix: 1 % of the rows hold all the nonzeros. dcsr stores only those rows,
# csr walks every row pointer, coo stores one (i, j) pair per nonzero, csc is column-major.
rng = np.random.default_rng(0)
n = 500_000
rows = rng.choice(n, size=n // 100, replace=False)
coords = np.stack([np.repeat(rows, 10), rng.integers(0, n, size=10 * len(rows))])
A = sparsec.Tensor.from_coo(coords, rng.standard_normal(coords.shape[1]), (n, n), "csr")
x = rng.standard_normal(n)
reference = A.to_scipy() @ x

print(f"A: {n} x {n}, {A.nnz} nonzeros in {len(rows)} rows")
print(f"{'format':8s} {'loop order':12s} {'ms/call (1 thread)':>18s}")
for name in ("csr", "dcsr", "coo", "csc"):
    k = sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": name})
    stored = A.to_format(name)  # convert once, outside the timed calls
    y = k(A=stored, x=x, threads=1)
    assert np.allclose(y, reference), name
    start = time.perf_counter()
    for _ in range(20):
        k(A=stored, x=x, threads=1)
    ms = (time.perf_counter() - start) / 20 * 1e3
    print(f"{name:8s} {' -> '.join(k.generated().loop_order):12s} {ms:18.3f}")
print("all four agree with scipy")
