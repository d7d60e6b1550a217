"""A magnitude-pruned linear layer with sparsec.nn: Y = X W^T + b with W (384 x 384) 90 %
sparse, stored CSR, as a torch module that trains and compiles.

``SparseLinear.from_linear`` keeps the largest 10 % of the weights (the pattern: pos/crd
buffers; the values: a parameter). Its call is ``Yt(o,t) = W(o,i) * Xt(i,t)``, the bias
added by torch, with W in column blocks where the tokens' activations outgrow the L1 cache:
``Yt(o,t) = W(b,o,k) * Xt(b,k,t)``, i = b*B + k. The loop nest (o0, b, o1, k, t) takes
the output rows in chunks of 64 (o = 64*o0 + o1), walks each chunk's stored rows block by
block, and streams a contiguous row of Xt (all tokens) per nonzero, while block b's rows of
Xt stay in L1. torch runs the same pruned layer dense; both
are timed on one thread and on all cores. ``sparsec.nn.sparsify(model, 0.9)`` does the same
to every Linear of a model.

    python examples/pruned_layer.py
"""

import importlib.util
import time

import torch

import sparsec.nn

features, tokens, sparsity = 384, 256, 0.90
torch.manual_seed(0)
dense = torch.nn.Linear(features, features)
layer = sparsec.nn.SparseLinear.from_linear(dense, sparsity)  # magnitude pruning
with torch.no_grad():
    dense.weight.copy_(layer.to_dense())  # the same pruned layer, dense
print(
    f"W: {features} x {features} csr, {layer.nnz} nonzeros ({layer.sparsity:.0%} sparse), "
    f"loop order {', '.join(layer.kernel.generated().loop_order)}"
)

X = torch.randn(4, tokens // 4, features)  # any leading shape
with torch.no_grad():
    Y, want = layer(X), dense(X)
error = float((Y - want).abs().max())
assert torch.allclose(Y, want, atol=1e-5), f"sparsec and torch disagree ({error:.3g})"
print(f"Y: {tuple(Y.shape)}, matches torch dense: max abs error {error:.3g}")

compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")  # no graph break
with torch.no_grad():
    assert torch.allclose(compiled(X), Y)
print("torch.compile(fullgraph=True): same output")


def best_ms(fn, runs=20):
    fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * min(times)


def step(module):
    module.zero_grad(set_to_none=True)
    module(X).square().sum().backward()


trains = importlib.util.find_spec("sparsec.api.gradient") is not None
for threads in (1, None):  # None: sparsec's default (all cores) and torch's default
    torch_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    layer.threads = threads
    with torch.no_grad():
        sparse_ms = best_ms(lambda: layer(X))
        dense_ms = best_ms(lambda: dense(X))
    label = "1 thread" if threads else "all cores"
    line = f"{label:>9s}: forward sparsec csr {sparse_ms:7.3f} ms, torch dense {dense_ms:7.3f} ms"
    if trains:
        line += (
            f"; forward+backward {best_ms(lambda: step(layer)):7.3f} ms, "
            f"{best_ms(lambda: step(dense)):7.3f} ms"
        )
    torch.set_num_threads(torch_threads)
    print(line + " (best of 20)")
