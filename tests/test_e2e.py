"""A pruned BERT encoder whose linear layers run through sparsec equals the same pruned
model in dense torch (the end-to-end check behind ``python -m bench e2e``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bench.e2e import (
    Config,
    forward,
    inputs,
    linear_names,
    prune,
    random_params,
    sparsec_linear,
    torch_linear,
)

TINY = Config(layers=2, hidden=48, heads=4, intermediate=96, vocab=2000)


@pytest.mark.parametrize("sparsity", [0.0, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("threads", [1, 2])
def test_pruned_encoder_matches_torch(sparsity, threads):
    params = prune(random_params(TINY, seed=3), TINY, sparsity)
    for name in linear_names(TINY):
        w = params[f"{name}.weight"]
        assert abs(float((w == 0).mean()) - sparsity) < 0.01
    ids, mask = inputs(TINY, batch=3, seq=16)
    with torch.no_grad():
        want = forward(params, TINY, ids, mask, torch_linear(params))
        got = forward(params, TINY, ids, mask, sparsec_linear(params, TINY, threads))
    assert got.shape == (3, TINY.hidden)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
    assert torch.isfinite(got).all()


def test_padding_is_ignored_by_the_pooling():
    params = random_params(TINY, seed=4)
    ids, mask = inputs(TINY, batch=2, seq=8)
    changed = ids.clone()
    changed[1, 6:] = 1234  # tokens under the padding mask
    with torch.no_grad():
        a = forward(params, TINY, ids, mask, torch_linear(params))
        b = forward(params, TINY, changed, mask, torch_linear(params))
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("way", ["rows", "dense"])
def test_the_breakdown_counts_a_dense_layers_f_linear_as_its_kernel(way, monkeypatch):
    """`bench.breakdown` on a model of one SparseLinear: whichever way the layer runs (its
    measurement forced here), the kernel part is time spent, and a dense layer's F.linear
    is its kernel (no op around it, as no torch op runs)."""
    from bench.breakdown import breakdown
    from sparsec.nn import SparseLinear
    from sparsec.policy import calibrated

    monkeypatch.setattr(calibrated, "enabled", lambda: True)
    torch.manual_seed(3)
    layer = SparseLinear.from_linear(torch.nn.Linear(64, 48), 0.5)
    x = torch.randn(40, 64)
    layer.ways_measured[(40).bit_length()] = way
    with torch.no_grad():
        got = breakdown(layer, lambda: layer(x), repeats=3)
    assert got["kernel"] > 0 and got["sparse"] >= got["kernel"]
    if way == "dense":
        assert got["op"] == 0.0
