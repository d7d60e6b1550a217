"""``sparsec.nn``: pruned torch layers that run as sparsec kernels (imports torch, so it is
imported on its own: ``import sparsec.nn``; ``import sparsec`` stays free of torch).

    import sparsec.nn
    sparsec.nn.sparsify(model, 0.9, min_features=64)   # every eligible nn.Linear, in place
    sparsec.nn.sparsify(model, pattern="2:4")          # or 2 of every 4 inputs, or
    sparsec.nn.sparsify(model, 0.9, block=(1, 8))      # whole blocks of 1 x 8
    for row in sparsec.nn.report(model): print(row)

`SparseLinear` (sparsec/nn/linear.py) holds the pattern and values of one layer and calls
its kernel through a torch custom op (`sparsec.api.torch_op`), so the model trains and
``torch.compile(fullgraph=True)`` traces it with no graph break.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..base.errors import InputError
from ..tensors.mapped import resolve
from .blocked import BlockSparseLinear
from .layers import ACTIVATIONS
from .linear import SparseLinear
from .masks import block_mask, check_block, fits, magnitude_mask, nm_mask, parse_pattern

__all__ = [
    "BlockSparseLinear",
    "ACTIVATIONS",
    "LayerReport",
    "SparseLinear",
    "block_mask",
    "magnitude_mask",
    "nm_mask",
    "report",
    "sparsify",
]


@dataclass(frozen=True, slots=True)
class LayerReport:
    """One SparseLinear of a model: its qualified name, shape, stored entries, sparsity."""

    name: str
    in_features: int
    out_features: int
    nnz: int
    sparsity: float

    def __str__(self) -> str:
        return (
            f"{self.name}: {self.out_features} x {self.in_features}, {self.nnz} stored, "
            f"{self.sparsity:.1%} sparse"
        )


def sparsify(
    model: torch.nn.Module,
    sparsity: float | None = None,
    *,
    block: tuple[int, int] | None = None,
    pattern: str | None = None,
    min_features: int = 1,
    threads: int | None = None,
    format: str = "csr",
) -> torch.nn.Module:
    """Swap, in place, every ``nn.Linear`` of ``model`` (the model itself included if it is
    one: then the new layer is returned) whose in and out features are both at least
    ``min_features`` for a `SparseLinear` magnitude-pruned to ``sparsity`` (None: keep
    each layer's zeros): in whole ``block = (r, c)`` blocks, or to an N:M ``pattern`` such
    as ``"2:4"`` (`sparsec.nn.masks`). A layer whose shape the blocks or groups do not
    divide stays dense, as a layer under ``min_features`` does. The projections of
    ``nn.MultiheadAttention`` stay dense (it reads their weights, never calls them).
    ``format="bsr(R,C)"`` stores each layer in R x C blocks (`BlockSparseLinear`; with no
    ``block``, the pruning keeps whole R x C blocks; a shape they do not divide stays
    dense). Returns the model; `report` lists what was swapped."""
    if not isinstance(model, torch.nn.Module):
        hint = (
            ": to prune a weight tensor use sparsec.nn.magnitude_mask(weight, sparsity)"
            if isinstance(model, torch.Tensor)
            else ""
        )
        raise InputError(
            f"sparsify takes a torch.nn.Module (a model, or an nn.Linear), not a "
            f"{type(model).__name__}{hint}"
        )
    if min_features < 1:
        raise InputError(f"min_features must be at least 1, got {min_features}")
    if block is not None and pattern is not None:
        raise InputError("give block or pattern, not both (an N:M pattern is along each row)")
    if block is not None:
        check_block(block)
    if pattern is not None:
        parse_pattern(pattern)
    stored = resolve(format, 2) if format != "csr" else None
    if format != "csr" and (stored is None or not stored.name.startswith("bsr(")):
        raise InputError(f"sparsify stores layers as 'csr' or 'bsr(R,C)', not {format!r}")
    if stored is not None and block is None and pattern is None:
        block = (stored.blocks()[0], stored.blocks()[1])

    def eligible(m: torch.nn.Module) -> bool:
        return (
            isinstance(m, torch.nn.Linear)
            and min(m.in_features, m.out_features) >= min_features
            and m.weight.dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16)
            and fits((m.out_features, m.in_features), block, pattern)
            and (stored is None or fits((m.out_features, m.in_features), _blocks(stored), None))
        )

    def pruned(m: torch.nn.Linear) -> Any:
        return SparseLinear.from_linear(
            m, sparsity, threads=threads, block=block, pattern=pattern, format=format
        )

    if eligible(model):
        assert isinstance(model, torch.nn.Linear)
        return pruned(model)
    for parent in list(model.modules()):
        if isinstance(parent, torch.nn.MultiheadAttention):
            continue  # its forward reads out_proj.weight directly, never calls the module
        for child_name, child in list(parent.named_children()):
            if eligible(child):
                assert isinstance(child, torch.nn.Linear)
                layer = pruned(child)
                setattr(parent, child_name, layer.to(child.weight.device))
    return model


def _blocks(fmt: Any) -> tuple[int, int]:
    blocks = fmt.blocks()
    return blocks[0], blocks[1]


def report(model: torch.nn.Module) -> list[LayerReport]:
    """Every SparseLinear (and BlockSparseLinear) of ``model``, in module order, with the
    sparsity it reached."""
    return [
        LayerReport(name or "(model)", m.in_features, m.out_features, m.nnz, m.sparsity)
        for name, m in model.named_modules()
        if isinstance(m, SparseLinear | BlockSparseLinear)
    ]
