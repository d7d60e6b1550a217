"""Differential fuzz of `sparsec.nn` against the dense masked layer in torch (issue 36, "close
the blind spot"): `SparseLinear` forward and backward over random shapes (1-row and 1-column
weights included), sparsities (0 and 1 included), with and without bias, float32 and
float64, inputs of 1, 2 and 3 dimensions, whole rows and column blocks of 1 to 12 inputs
(the L1 data cache drawn small), each way a call may run (`SparseLinear.ways`: blocks, whole
rows, dense on a kept dense copy) drawn as if the host had measured it fastest; layers pruned in N:M groups and whole blocks (issue 39);
and `sparsify` on small models.

The reference is written from the documented contract, not from sparsec's code paths: the
layer stores W's ``round((1 - s) * numel)`` entries of largest magnitude (ties: the lower
flat index first), and computes ``F.linear(x, W * mask, b)``. Its mask is read from the
layer's own ``pos``/``crd`` by plain torch, then checked against that contract; gradients
of the input, of the stored values (the dense weight's gradient at the mask) and of the
bias are compared. Values are small integers, so every sum is exact in any order.

Fast suite: `FAST` cases (fixed seeds); ``-m slow``: `SLOW` cases.
"""

from __future__ import annotations

import contextlib
from unittest import mock

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from mask_oracle import block_reference, nm_reference

import sparsec.nn
from sparsec.nn import SparseLinear
from sparsec.policy import calibrated
from sparsec.policy.machine import use

FAST, SLOW = 240, 3000
SPARSITIES = (0.0, 1.0, 0.5, 0.9, 0.3, 0.75)


def _dense_mask(layer: SparseLinear) -> torch.Tensor:
    """The stored pattern as a bool (out, in) mask, from pos/crd by plain torch."""
    mask = torch.zeros(layer.out_features, layer.in_features, dtype=torch.bool)
    pos, crd = layer.pos.long().tolist(), layer.crd.long().tolist()
    for o in range(layer.out_features):
        for p in range(pos[o], pos[o + 1]):
            mask[o, crd[p]] = True
    return mask


def _expected_mask(weight: torch.Tensor, sparsity: float) -> torch.Tensor:
    """The documented choice: round((1 - s) * numel) largest magnitudes, lower flat index
    first among equals."""
    flat = weight.abs().reshape(-1).tolist()
    keep = int(round((1.0 - sparsity) * len(flat)))
    order = sorted(range(len(flat)), key=lambda n: (-flat[n], n))[:keep]
    mask = torch.zeros(len(flat), dtype=torch.bool)
    mask[order] = True
    return mask.reshape(weight.shape)


def one_case(rng: np.random.Generator) -> str:
    out_f, in_f = int(rng.integers(1, 8)), int(rng.integers(1, 13))
    sparsity = SPARSITIES[rng.integers(len(SPARSITIES))] if rng.random() < 0.6 else rng.random()
    bias = bool(rng.random() < 0.5)
    dtype = (torch.float32, torch.float64)[rng.integers(2)]
    lead = [(), (int(rng.integers(1, 5)),), (int(rng.integers(1, 4)), int(rng.integers(1, 4)))][
        rng.integers(3)
    ]
    what = f"out={out_f} in={in_f} s={sparsity:.3f} bias={bias} {dtype} lead={lead}"
    lin = torch.nn.Linear(in_f, out_f, bias=bias, dtype=dtype)
    with torch.no_grad():
        lin.weight.copy_(torch.from_numpy(rng.integers(-3, 4, (out_f, in_f))).to(dtype))
        if bias:
            lin.bias.copy_(torch.from_numpy(rng.integers(-3, 4, out_f)).to(dtype))
    given = sparsity if rng.random() < 0.85 else None  # None: keep the nonzeros
    # the column blocks follow the L1 data cache (costs.column_block): tiny ones make blocks
    # of 1 to 4 inputs at these widths; calls in blocks from 1 token or from the host's count
    l1 = (None, 64, 1024, 1536, 2048)[rng.integers(5)]
    with use(l1_data=l1) if l1 is not None else contextlib.nullcontext():
        layer = SparseLinear.from_linear(lin, given)
    if rng.random() < 0.5:
        layer.block_tokens = 1
    what += f" block={layer.block} from {layer.block_tokens} tokens"
    mask = _dense_mask(layer)
    weight = lin.weight.detach()
    want_mask = weight != 0 if given is None else _expected_mask(weight, given)
    assert torch.equal(mask, want_mask), f"{what}: pattern {mask} != documented {want_mask}"
    assert layer.nnz == int(mask.sum()), what
    assert layer.sparsity == pytest.approx(1 - int(mask.sum()) / (out_f * in_f)), what

    x = torch.from_numpy(rng.integers(-3, 4, (*lead, in_f))).to(dtype).requires_grad_(True)
    # the way the call runs, as the host's measurement would have chosen it
    tokens = int(np.prod(lead)) if lead else 1
    ways = layer.ways(tokens)
    layer.ways_measured[tokens.bit_length()] = way = ways[rng.integers(len(ways))]
    what += f" way={way} of {ways}"
    with mock.patch.object(calibrated, "enabled", lambda: True):
        _matches_dense(layer, lin, mask, x, rng, what)
    return what


def _matches_dense(
    layer: SparseLinear,
    lin: torch.nn.Linear,
    mask: torch.Tensor,
    x: torch.Tensor,
    rng: np.random.Generator,
    what: str,
) -> None:
    """``layer(x)`` and every gradient (input, stored values, bias) against
    ``F.linear(x, W * mask, b)`` on ``lin``'s weight and bias, exactly."""
    x_ref = x.detach().clone().requires_grad_(True)
    w_ref = lin.weight.detach().clone().requires_grad_(True)
    b_ref = None if lin.bias is None else lin.bias.detach().clone().requires_grad_(True)
    y = layer(x)
    y_ref = F.linear(x_ref, w_ref * mask, b_ref)
    assert y.shape == y_ref.shape and y.dtype == x.dtype, what
    torch.testing.assert_close(y, y_ref, rtol=0, atol=0, msg=lambda m: f"{what}: {m}")
    dy = torch.from_numpy(rng.integers(-2, 3, tuple(y.shape))).to(x.dtype)
    y.backward(dy)
    y_ref.backward(dy)
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=0, atol=0, msg=lambda m: f"{what}: dx {m}")
    assert w_ref.grad is not None
    torch.testing.assert_close(
        layer.values.grad, w_ref.grad[mask], rtol=0, atol=0, msg=lambda m: f"{what}: dW {m}"
    )
    if b_ref is not None:
        assert layer.bias is not None
        torch.testing.assert_close(
            layer.bias.grad, b_ref.grad, rtol=0, atol=0, msg=lambda m: f"{what}: db {m}"
        )


def sparsify_case(rng: np.random.Generator) -> str:
    dims = [int(rng.integers(1, 9)) for _ in range(int(rng.integers(2, 5)))]
    sparsity = SPARSITIES[rng.integers(len(SPARSITIES))]
    min_features = int(rng.integers(1, 5))
    layers: list[torch.nn.Module] = []
    for a, b in zip(dims, dims[1:], strict=False):
        layers += [torch.nn.Linear(a, b, bias=bool(rng.random() < 0.7)), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1]).double()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.from_numpy(rng.integers(-3, 4, tuple(p.shape))).double())
    dense = [m for m in model if isinstance(m, torch.nn.Linear)]
    originals = [(m.weight.detach().clone(), m.bias) for m in dense]
    what = f"dims={dims} s={sparsity} min_features={min_features}"
    sparsec.nn.sparsify(model, sparsity, min_features=min_features)
    x = torch.from_numpy(rng.integers(-3, 4, (3, dims[0]))).double()
    want = x
    swapped = 0
    for m, (weight, bias) in zip(
        [m for m in model if not isinstance(m, torch.nn.ReLU)], originals, strict=True
    ):
        if min(weight.shape) >= min_features:
            assert isinstance(m, SparseLinear), what
            mask = _dense_mask(m)
            assert torch.equal(mask, _expected_mask(weight, sparsity)), what
            want = F.linear(want, weight * mask, bias)
            swapped += 1
        else:
            assert isinstance(m, torch.nn.Linear), what
            want = F.linear(want, weight, bias)
        if m is not model[-1]:
            want = torch.relu(want)
    assert len(sparsec.nn.report(model)) == swapped, what
    torch.testing.assert_close(model(x), want, rtol=0, atol=0, msg=lambda m: f"{what}: {m}")
    return what


def structured_case(rng: np.random.Generator) -> str:
    """A layer pruned in N:M groups or whole blocks (issue 39): the pattern against the
    documented rule, and the forward and gradients against the masked dense layer."""
    dtype = (torch.float32, torch.float64)[rng.integers(2)]
    nm = block = None
    if rng.random() < 0.5:
        m = int(rng.integers(1, 9))
        nm = (int(rng.integers(1, m + 1)), m)
        out_f, in_f = int(rng.integers(1, 7)), m * int(rng.integers(1, 4))
        kw = {"pattern": f"{nm[0]}:{nm[1]}"}
        sparsity = None if rng.random() < 0.7 else 1 - nm[0] / nm[1]
    else:
        block = (int(rng.integers(1, 5)), int(rng.integers(1, 9)))
        out_f, in_f = block[0] * int(rng.integers(1, 4)), block[1] * int(rng.integers(1, 4))
        kw = {"block": block}
        sparsity = None if rng.random() < 0.15 else SPARSITIES[rng.integers(len(SPARSITIES))]
    what = f"out={out_f} in={in_f} {kw} s={sparsity} {dtype}"
    lin = torch.nn.Linear(in_f, out_f, dtype=dtype)
    with torch.no_grad():
        lin.weight.copy_(torch.from_numpy(rng.integers(-3, 4, (out_f, in_f))).to(dtype))
        lin.bias.copy_(torch.from_numpy(rng.integers(-3, 4, out_f)).to(dtype))
    layer = SparseLinear.from_linear(lin, sparsity, **kw)
    mask = _dense_mask(layer)
    weight = lin.weight.detach()
    want = (
        nm_reference(weight, *nm) if nm is not None else block_reference(weight, sparsity, *block)
    )
    assert torch.equal(mask, want), f"{what}: pattern {mask} != documented {want}"
    x = torch.from_numpy(rng.integers(-3, 4, (int(rng.integers(1, 5)), in_f))).to(dtype)
    _matches_dense(layer, lin, mask, x.requires_grad_(True), rng, what)
    return what


def bsr_case(rng: np.random.Generator) -> str:
    """A layer stored bsr(R,C) (`BlockSparseLinear`, issue 39): its kept blocks against the
    documented block rule (every cell of a kept block stored, zeros too), and the forward
    and every gradient against the masked dense layer; the values' gradient in the blocks'
    storage order (block rows, then block columns, then the cells row by row)."""
    dtype = (torch.float32, torch.float64)[rng.integers(2)]
    r, c = int(rng.integers(1, 5)), int(rng.integers(1, 9))
    out_f, in_f = r * int(rng.integers(1, 4)), c * int(rng.integers(1, 4))
    sparsity = SPARSITIES[rng.integers(len(SPARSITIES))]
    what = f"out={out_f} in={in_f} bsr({r},{c}) s={sparsity} {dtype}"
    lin = torch.nn.Linear(in_f, out_f, bias=bool(rng.random() < 0.7), dtype=dtype)
    with torch.no_grad():
        lin.weight.copy_(torch.from_numpy(rng.integers(-3, 4, (out_f, in_f))).to(dtype))
        if lin.bias is not None:
            lin.bias.copy_(torch.from_numpy(rng.integers(-3, 4, out_f)).to(dtype))
    layer = SparseLinear.from_linear(lin, sparsity, format=f"bsr({r},{c})")
    assert isinstance(layer, sparsec.nn.BlockSparseLinear), what
    weight = lin.weight.detach()
    kept = block_reference(weight, sparsity, r, c)
    blocks = kept.reshape(out_f // r, r, in_f // c, c).any(dim=(1, 3))
    mask = blocks.repeat_interleave(r, 0).repeat_interleave(c, 1)
    assert torch.equal(layer.to_dense() != 0, (weight * mask) != 0), what
    x = torch.from_numpy(rng.integers(-3, 4, (int(rng.integers(1, 5)), in_f))).to(dtype)
    x.requires_grad_(True)
    x_ref = x.detach().clone().requires_grad_(True)
    w_ref = weight.clone().requires_grad_(True)
    b_ref = None if lin.bias is None else lin.bias.detach().clone().requires_grad_(True)
    y, y_ref = layer(x), F.linear(x_ref, w_ref * mask, b_ref)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=0, msg=lambda m: f"{what}: {m}")
    dy = torch.from_numpy(rng.integers(-2, 3, tuple(y.shape))).to(dtype)
    y.backward(dy)
    y_ref.backward(dy)
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=0, atol=0, msg=lambda m: f"{what}: dx {m}")
    assert w_ref.grad is not None
    by_block = w_ref.grad.reshape(out_f // r, r, in_f // c, c).permute(0, 2, 1, 3)
    torch.testing.assert_close(
        layer.values.grad, by_block[blocks].reshape(-1), rtol=0, atol=0,
        msg=lambda m: f"{what}: dW {m}",
    )  # fmt: skip
    if b_ref is not None:
        torch.testing.assert_close(layer.bias.grad, b_ref.grad, rtol=0, atol=0)
    return what


def _run(seed: int, count: int) -> int:
    rng = np.random.default_rng(seed)
    for _ in range(count):
        one_case(rng)
        if rng.random() < 0.1:
            sparsify_case(rng)
        if rng.random() < 0.25:
            structured_case(rng)
        if rng.random() < 0.15:
            bsr_case(rng)
    return count


@pytest.mark.parametrize("seed", range(4))
def test_sparse_linear_fuzz(seed):
    _run(seed, FAST // 4)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(100, 110))
def test_sparse_linear_fuzz_slow(seed):
    _run(seed, SLOW // 10)
