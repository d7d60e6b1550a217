"""The distributed planner: which index a call splits, and how the parts' outputs combine,
read from the notation (never from a kernel's name).

- ``concatenate``: the split index is an output index; parts compute disjoint output slices
  (dense outputs are placed side by side, sparse ones joined by shifting ``pos``).
- ``reduce``: the split index is summed away; the parts' partial outputs are added by a tree.
- ``repartition``: the split index is an output index but not the sparse output's outermost
  level; the tensor is first moved to parts along that level (a warning states the volume).
- ``replicate``: no tensor is distributed and a dense operand outweighs the sparse ones; the
  sparse operands go to every part and the dense one is split along an output index.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import SparsecError
from ..frontend.notation import Access, Assignment, accesses, factor_chain, indices_of

KINDS = ("concatenate", "reduce", "repartition", "replicate")


@dataclass(frozen=True)
class Plan:
    """What a call does: the class, the split index and tensor, per-part bytes received."""

    kind: str
    index: str
    tensor: str
    parts: int
    bytes_per_part: tuple[int, ...] = ()
    imbalance: float = 1.0
    #: bytes a repartition moves between workers (0 unless ``kind == "repartition"``)
    moved: int = 0
    #: the tensor's mode the parts are cut along
    mode: int = 0
    notes: tuple[str, ...] = field(default=())

    def __str__(self) -> str:
        per = ", ".join(_size(b) for b in self.bytes_per_part)
        text = (
            f"{self.kind}: split {self.tensor} along index {self.index!r} into {self.parts} "
            f"part(s); imbalance {self.imbalance:.2f}; bytes per part: {per}"
        )
        if self.moved:
            text += f"; repartition moves {_size(self.moved)}"
        return text


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)  # pragma: no cover


def rhs_indices(assignment: Assignment) -> dict[str, tuple[str, ...]]:
    """Each right-hand tensor's indices (its first access)."""
    found: dict[str, tuple[str, ...]] = {}
    for a in accesses(assignment.rhs):
        found.setdefault(a.name, a.indices)
    return found


def classify(
    assignment: Assignment,
    output_ordering: Sequence[int],
    output_dense: bool,
    tensor: str,
    mode: int,
) -> tuple[str, str, int]:
    """(kind, split index, mode to cut along) for distributing ``tensor`` along ``mode``."""
    if assignment.accumulate:
        raise SparsecError(
            f"{assignment}: a distributed call writes a new output; write '=' and add on the driver"
        )
    idx = rhs_indices(assignment)[tensor]
    index = idx[mode]
    out = assignment.lhs.indices
    if index not in out:
        require_linear(assignment, index, tensor)
        return "reduce", index, mode
    if output_dense or out.index(index) == output_ordering[0]:
        return "concatenate", index, mode
    outer = out[output_ordering[0]]
    if outer in idx:
        return "repartition", outer, idx.index(outer)
    return "concatenate", index, mode  # joined by re-packing the coordinates


def require_linear(assignment: Assignment, index: str, tensor: str) -> None:
    """Partial outputs over disjoint ranges of a summed ``index`` add up to the whole only if
    the sum over ``index`` encloses the whole right-hand side (a product chain)."""
    chain = factor_chain(assignment.rhs)
    holding = [f for f in chain if index in indices_of(f)]
    if len(holding) >= 2 or (len(holding) == 1 and isinstance(holding[0], Access)):
        return
    raise SparsecError(
        f"{assignment}: splitting {tensor} along the summed index {index!r} needs the sum over "
        f"{index!r} to enclose the whole right-hand side (a product); distribute along an "
        "output index instead (another format or mode=), or sum the terms in separate kernels"
    )


def overlap_safe(assignment: Assignment, tensor: str) -> bool:
    """Parts sharing a slice split by position are exact when ``tensor`` is a bare factor of
    the right-hand side's product chain (each of its entries lands in one part)."""
    return any(isinstance(f, Access) and f.name == tensor for f in factor_chain(assignment.rhs))


def replicate_index(
    assignment: Assignment, dense: Mapping[str, Any], sparse: Sequence[str]
) -> tuple[str, str] | None:
    """(dense tensor, index) for the replicate class: the largest dense operand and one of its
    output indices that no sparse operand carries; None if there is none."""
    idx = rhs_indices(assignment)
    sparse_idx = {i for name in sparse for i in idx[name]}
    for name in sorted(dense, key=lambda n: -int(np.asarray(dense[n]).nbytes)):
        for i in idx[name]:
            if i in assignment.lhs.indices and i not in sparse_idx:
                return name, i
    return None


def even_ranges(extent: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` nearly equal ranges covering ``[0, extent)`` (empty ones dropped)."""
    edges = np.linspace(0, extent, max(1, parts) + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(edges, edges[1:], strict=False) if b > a]
