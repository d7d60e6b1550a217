"""A magnitude-pruned linear layer: Y = X W^T + b with W (384 x 384) 90 % sparse, stored CSR.

sparsec computes the transposed product Yt(o,t) = W(o,i) * Xt(i,t) + b(o): the loop nest walks
each stored row of W once and streams a contiguous row of Xt (all tokens) per nonzero. torch
runs the same layer dense. Both are timed with all cores.

    python examples/pruned_layer.py
"""

import time

import numpy as np
import torch

import sparsec

features, tokens, sparsity = 384, 256, 0.90
rng = np.random.default_rng(0)

weight = rng.standard_normal((features, features)) / np.sqrt(features)
threshold = np.quantile(np.abs(weight), sparsity)
weight[np.abs(weight) < threshold] = 0.0  # magnitude pruning: keep the largest 10 %
bias = rng.standard_normal(features)
X = rng.standard_normal((tokens, features))

W = sparsec.Tensor.from_dense(weight, "csr")  # validated once; pass the Tensor in hot loops
print(f"W: {W.shape[0]} x {W.shape[1]} csr, {W.nnz} nonzeros ({1 - W.nnz / weight.size:.0%} sparse)")

layer = sparsec.kernel("Yt(o,t) = W(o,i) * Xt(i,t) + b(o)", {"W": "csr"})
Xt = np.ascontiguousarray(X.T)
Y = layer(W=W, Xt=Xt, b=bias).T

with torch.no_grad():
    Wd, Xd, bd = (torch.from_numpy(a) for a in (weight, X, bias))
    want = torch.nn.functional.linear(Xd, Wd, bd).numpy()
error = float(np.abs(Y - want).max())
assert np.allclose(Y, want), f"sparsec and torch disagree (max abs error {error:.3g})"
print(f"Y: {Y.shape[0]} x {Y.shape[1]}, matches torch dense: max abs error {error:.3g}")


def best_ms(fn, runs=20):
    fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * min(times)


sparse_ms = best_ms(lambda: layer(W=W, Xt=Xt, b=bias))
with torch.no_grad():
    dense_ms = best_ms(lambda: torch.nn.functional.linear(Xd, Wd, bd))
print(f"sparsec csr: {sparse_ms:.3f} ms   torch dense: {dense_ms:.3f} ms   (best of 20, float64)")
