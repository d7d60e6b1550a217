"""Structured pruning (`sparsec.nn.masks`, issue 39): N:M groups and whole blocks, checked
against the oracle written from the documented rule with plain Python sorts
(tests/mask_oracle.py), on integer
weights full of ties; the layers they make against dense torch; and every refusal."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from mask_oracle import block_reference, nm_reference

import sparsec.nn
from sparsec.base.errors import InputError
from sparsec.nn import SparseLinear, block_mask, magnitude_mask, nm_mask


def _weight(rng, shape, dtype=torch.float64):
    return torch.from_numpy(rng.integers(-3, 4, shape)).to(dtype)


@pytest.mark.parametrize(("n", "m"), [(2, 4), (1, 4), (4, 8), (1, 1), (3, 3), (1, 2)])
def test_nm_masks_keep_the_largest_of_every_group(n, m, rng):
    for rows, groups in [(1, 1), (5, 3), (8, 16)]:
        weight = _weight(rng, (rows, groups * m))
        mask = nm_mask(weight, n, m)
        assert torch.equal(mask, nm_reference(weight, n, m))
        assert torch.equal(mask.reshape(rows, groups, m).sum(-1), torch.full((rows, groups), n))


@pytest.mark.parametrize("block", [(1, 8), (4, 4), (2, 1), (3, 5)])
@pytest.mark.parametrize("sparsity", [0.0, 0.5, 0.9, 1.0, None])
def test_block_masks_keep_whole_blocks_of_largest_norm(block, sparsity, rng):
    r, c = block
    weight = _weight(rng, (r * 4, c * 3))
    weight[:r, :c] = 0  # an all-zero block, never kept when sparsity is None
    mask = block_mask(weight, sparsity, block)
    assert torch.equal(mask, block_reference(weight, sparsity, r, c))


def test_one_by_one_blocks_are_the_magnitude_mask(rng):
    weight = _weight(rng, (7, 13))
    for sparsity in (0.0, 0.3, 0.5, 0.77, 1.0):
        assert torch.equal(block_mask(weight, sparsity, (1, 1)), magnitude_mask(weight, sparsity))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    "kw", [{"pattern": "2:4"}, {"pattern": "1:8"}, {"block": (4, 4), "sparsity": 0.5}]
)
def test_structured_layers_compute_the_masked_dense_layer(kw, dtype, rng):
    """Forward and every gradient of a layer pruned in groups or blocks equal dense torch's
    on the masked weight, exactly (integer values)."""
    lin = torch.nn.Linear(32, 16, dtype=dtype)
    with torch.no_grad():
        lin.weight.copy_(_weight(rng, (16, 32), dtype))
        lin.bias.copy_(_weight(rng, (16,), dtype))
    sparsity = kw.pop("sparsity", None)
    layer = SparseLinear.from_linear(lin, sparsity, **kw)
    mask = (
        nm_mask(lin.weight, *map(int, kw["pattern"].split(":")))
        if "pattern" in kw
        else block_mask(lin.weight, sparsity, kw["block"])
    )
    assert layer.nnz == int(mask.sum())
    x = _weight(rng, (3, 5, 32), dtype).requires_grad_(True)
    x_ref = x.detach().clone().requires_grad_(True)
    w_ref = lin.weight.detach().clone().requires_grad_(True)
    y, y_ref = layer(x), F.linear(x_ref, w_ref * mask, lin.bias.detach())
    torch.testing.assert_close(y, y_ref, rtol=0, atol=0)
    dy = _weight(rng, tuple(y.shape), dtype)
    y.backward(dy)
    y_ref.backward(dy)
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=0, atol=0)
    torch.testing.assert_close(layer.values.grad, w_ref.grad[mask], rtol=0, atol=0)


def test_sparsify_prunes_in_patterns_and_leaves_the_shapes_they_do_not_divide(rng):
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 12), torch.nn.ReLU(), torch.nn.Linear(12, 6), torch.nn.Linear(6, 3)
    ).double()
    sparsec.nn.sparsify(model, pattern="2:4")
    # 16 and 12 inputs divide into groups of 4; 6 does not: that layer stays dense
    assert [type(m).__name__ for m in model] == ["SparseLinear", "ReLU", "SparseLinear", "Linear"]
    assert [r.sparsity for r in sparsec.nn.report(model)] == [0.5, 0.5]
    blocked = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.Linear(8, 3)).double()
    sparsec.nn.sparsify(blocked, 0.75, block=(4, 4))
    assert [type(m).__name__ for m in blocked] == ["SparseLinear", "Linear"]
    assert blocked[0].nnz == 32


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"pattern": "2:4", "block": (1, 4)}, "not both"),
        ({"pattern": "5:4"}, "1 <= N <= M"),
        ({"pattern": "0:4"}, "1 <= N <= M"),
        ({"pattern": "two:four"}, "is not 'N:M'"),
        ({"pattern": 24}, "is not 'N:M'"),
        ({"pattern": "2:4", "sparsity": 0.9}, "0.5 sparse"),
        ({"pattern": "2:3"}, "not a multiple of 3"),
        ({"block": (0, 4), "sparsity": 0.5}, "positive ints"),
        ({"block": (4,), "sparsity": 0.5}, "positive ints"),
        ({"block": (True, 4), "sparsity": 0.5}, "positive ints"),
        ({"block": (3, 4), "sparsity": 0.5}, "do not tile a 8 x 16"),
        ({"block": (4, 4), "sparsity": 1.5}, r"\[0, 1\]"),
    ],
)
def test_structured_pruning_refuses_what_it_cannot_do(kw, match):
    lin = torch.nn.Linear(16, 8)
    sparsity = kw.pop("sparsity", None)
    with pytest.raises(InputError, match=match):
        SparseLinear.from_linear(lin, sparsity, **kw)


def test_sparsify_refuses_a_bad_pattern_before_looking_for_layers():
    with pytest.raises(InputError, match="is not 'N:M'"):
        sparsec.nn.sparsify(torch.nn.Sequential(torch.nn.ReLU()), pattern="2-4")
    with pytest.raises(InputError, match="positive ints"):
        sparsec.nn.sparsify(torch.nn.Sequential(torch.nn.ReLU()), 0.5, block=(1, 0))
    with pytest.raises(InputError, match="not both"):
        sparsec.nn.sparsify(torch.nn.Linear(4, 4), block=(1, 1), pattern="1:1")


def test_masks_take_ties_in_index_order():
    """Equal magnitudes: the lower position wins, in groups, blocks and flat alike."""
    weight = torch.ones(2, 8, dtype=torch.float64)
    assert nm_mask(weight, 2, 4)[0].tolist() == [True, True, False, False] * 2
    blocks = block_mask(weight, 0.5, (1, 4))
    assert blocks.tolist() == [[True] * 8, [False] * 8]  # blocks in row-major order
    assert np.flatnonzero(magnitude_mask(weight, 0.75).reshape(-1).numpy()).tolist() == [0, 1, 2, 3]
