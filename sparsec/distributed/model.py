"""`sd.model`: what splitting a real sparsity pattern into P parts costs, without a cluster.

For each part (cut as a call would cut it: balanced by nonzeros along the split mode, heavy
slices split by position) it counts the part's own bytes, and for every dense operand
indexed by one of the tensor's other indices the bytes a part needs when the operand is
replicated (all of it) against those it needs exactly (the rows its coordinates touch),
so a user can see when more machines, or a 2-D split, would pay.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..base.errors import InputError
from ..tensors.tensor import as_tensor
from . import partition as planner
from . import split
from .tensor import check_parts


@dataclass(frozen=True)
class Model:
    """Estimates for one P (bytes are summed over the parts)."""

    parts: int
    kind: str
    index: str
    imbalance: float
    max_part_nnz: int
    part_bytes: int
    replicated_bytes: int
    needed_bytes: int
    output_bytes: int

    @property
    def moved_bytes(self) -> int:
        """Bytes a call sends with dense operands replicated to every part."""
        return self.part_bytes + self.replicated_bytes + self.output_bytes

    def __str__(self) -> str:
        return (
            f"P={self.parts} {self.kind} on {self.index!r}: imbalance {self.imbalance:.2f}, "
            f"largest part {self.max_part_nnz} nnz, dense operands {self.replicated_bytes} B "
            f"replicated vs {self.needed_bytes} B needed, output {self.output_bytes} B"
        )


def model(
    kernel: Any,
    tensor: Any,
    parts: int,
    *,
    name: str | None = None,
    dims: Mapping[str, int] | None = None,
) -> Model:
    """Estimate a distributed call of ``kernel`` (a `sd.kernel`) on ``tensor`` cut in ``parts``.

    ``name`` is the operand ``tensor`` stands for (default: the first sparse one); ``dims``
    gives extents of indices the tensor does not carry (default 1, a vector)."""
    k = getattr(kernel, "kernel", kernel)
    parts = check_parts(parts) or 1
    formats = k.formats
    idx = planner.rhs_indices(k.assignment)
    sparse = [n for n in idx if idx[n] and not formats[n].is_dense]
    name = name or (sparse[0] if sparse else None)
    if name is None or name not in idx:
        raise InputError(f"{k.assignment}: name the sparse operand to model (name=)")
    t = as_tensor(tensor, formats[name])
    out = k.spec.output
    kind, index, mode = planner.classify(
        k.assignment,
        out.format.ordering if out.order else (),
        out.format.is_dense,
        name,
        t.format.ordering[0],
    )
    extents = dict(dims or {})
    extents.update(zip(idx[name], t.shape, strict=True))
    coords, _ = t.coords()
    order = split.sort_by(coords, mode)
    coords = coords[:, order]
    cuts = split.cuts(coords[mode], t.shape[mode], parts)
    entry = t.dtype.itemsize + t.order * t.index_dtype.itemsize
    value = t.dtype.itemsize
    replicated = needed = out_bytes = 0
    for c in cuts:
        piece = coords[:, c.start : c.end]
        for op in planner.operands(k.assignment, index, k.semantics.mask):
            n, ind = op.name, op.indices
            if n == name or not ind or not formats[n].is_dense:
                continue
            size = int(np.prod([extents.get(i, 1) for i in ind])) * value
            if op.sliced:  # each part gets its range
                share = (
                    size * (c.hi - c.lo) ** len(op.axes) // max(1, extents[index]) ** len(op.axes)
                )
                replicated += share
                needed += share
                continue
            replicated += size
            shared = [i for i in ind if i in idx[name]]
            if not shared:
                needed += size
                continue
            axis = idx[name].index(shared[0])
            touched = len(np.unique(piece[axis])) if piece.shape[1] else 0
            needed += size * touched // max(1, extents[shared[0]])
        lhs = k.assignment.lhs.indices
        full = int(np.prod([extents.get(i, 1) for i in lhs])) * value
        if kind == "reduce" or index not in lhs:
            out_bytes += full
        else:
            out_bytes += full * (c.hi - c.lo) // max(1, extents[index])
    counts = [c.nnz for c in cuts]
    mean = sum(counts) / max(1, len(counts))
    return Model(
        parts=len(cuts),
        kind=kind,
        index=index,
        imbalance=max(counts) / mean if mean else 1.0,
        max_part_nnz=max(counts, default=0),
        part_bytes=t.nnz * entry,
        replicated_bytes=replicated,
        needed_bytes=needed,
        output_bytes=out_bytes,
    )
