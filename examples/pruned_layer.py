"""A magnitude-pruned linear layer: Y = X W^T + b with W (384 x 384) 90 % sparse, stored CSR.

sparsec computes the transposed product, starting from the bias: Yt(o,t) += W(o,i) * Xt(i,t)
with Yt = b broadcast over tokens. The loop nest (o, i, t) walks each stored row of W once and
streams a contiguous row of Xt (all tokens) per nonzero. Writing "... + b(o)" in the same
statement would scope the sum over i inside t (loop order o, t, i: Xt read down a column),
several times slower. torch runs the same layer dense; both are timed on one thread and on
all cores.

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
print(
    f"W: {W.shape[0]} x {W.shape[1]} csr, {W.nnz} nonzeros ({1 - W.nnz / weight.size:.0%} sparse)"
)

layer = sparsec.kernel("Yt(o,t) += W(o,i) * Xt(i,t)", {"W": "csr"})
Xt = np.ascontiguousarray(X.T)
start = np.broadcast_to(bias[:, None], (features, tokens))  # Yt before the += : the bias
Y = layer(W=W, Xt=Xt, Yt=start).T
print(f"loop order {', '.join(layer.generated().loop_order)}")

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


for threads in (1, None):  # None: sparsec's default (all cores) and torch's default
    torch_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    sparse_ms = best_ms(lambda t=threads: layer(W=W, Xt=Xt, Yt=start, threads=t))
    with torch.no_grad():
        dense_ms = best_ms(lambda: torch.nn.functional.linear(Xd, Wd, bd))
    torch.set_num_threads(torch_threads)
    label = "1 thread" if threads else "all cores"
    print(
        f"{label:>9s}: sparsec csr {sparse_ms:7.3f} ms, torch dense {dense_ms:7.3f} ms (best of 20)"
    )
