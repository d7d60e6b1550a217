"""The distributed planner: which index a call splits, and how the parts' outputs combine,
read from the notation (never from a kernel's name).

- ``concatenate``: the split index is an output index; parts compute disjoint output slices
  (dense outputs are placed side by side, sparse ones joined by shifting ``pos``).
- ``reduce``: the split index is summed away; the parts' partial outputs are added by a tree.
- ``repartition``: the split index is an output index but not the sparse output's outermost
  level; the tensor is first moved to parts along that level (a warning states the volume).
- ``replicate``: no tensor is distributed and a dense operand outweighs the sparse ones; the
  sparse operands go to every part and the dense one is split along an output index.

Once the split index is chosen, every access decides on its own how the parts receive its
tensor (`operands`): cut to each part's range on the modes it reads at the split index, or
whole where it reads none. A tensor read both ways (``y(i) = A(i,j) * x(j) + x(i)``) is
two operands of the parts' kernel, the later one renamed (`parts_statement`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..base.errors import ShapeError, SparsecError
from ..frontend.notation import (
    Access,
    Assignment,
    BinOp,
    Call,
    Expr,
    Literal,
    Neg,
    accesses,
    factor_chain,
    indices_of,
)

KINDS = ("concatenate", "reduce", "repartition", "replicate")


@dataclass(frozen=True)
class Partition:
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
    """Each right-hand tensor's indices at its first access (the one a distributed
    tensor's split mode names the split index of)."""
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
    """Parts sharing a slice split by position are exact when ``tensor`` is read once, as a
    bare factor of the right-hand side's product chain (the output is linear in it, and
    each of its entries lands in one part); ``A(i,j) * A(i,k)`` is not."""
    reads = [a for a in accesses(assignment.rhs) if a.name == tensor]
    return len(reads) == 1 and any(f is reads[0] for f in factor_chain(assignment.rhs))


@dataclass(frozen=True)
class Operand:
    """How the parts receive the accesses of tensor ``name`` that read it at the split
    index on the modes ``axes`` (none: whole): cut to each part's range on those modes,
    under the name ``local`` in the parts' kernel."""

    name: str
    local: str
    axes: tuple[int, ...]
    #: the indices of the first such access (they give the operand's extents)
    indices: tuple[str, ...]

    @property
    def sliced(self) -> bool:
        return bool(self.axes)


def read_accesses(assignment: Assignment, mask: str = "") -> list[Access]:
    """Every access of a tensor a call passes, in source order: the right-hand side's and
    a mask's (read at the output's indices)."""
    found = list(accesses(assignment.rhs))
    if mask:
        found.append(Access(mask.lstrip("~"), assignment.lhs.indices))
    return found


def operands(assignment: Assignment, index: str, mask: str = "") -> list[Operand]:
    """One operand per tensor and set of modes read at ``index``: a tensor's first such
    set keeps its name, others are named apart from every name of the statement."""
    reads = read_accesses(assignment, mask)
    taken = {a.name for a in reads} | {assignment.lhs.name}
    found: dict[tuple[str, tuple[int, ...]], Operand] = {}
    for a in reads:
        axes = tuple(k for k, i in enumerate(a.indices) if i == index)
        if (a.name, axes) in found:
            continue
        local = a.name
        if any(op.name == a.name for op in found.values()):
            n = 1
            while f"{a.name}_{n}" in taken:
                n += 1
            local = f"{a.name}_{n}"
            taken.add(local)
        found[a.name, axes] = Operand(a.name, local, axes, a.indices)
    return list(found.values())


def parts_statement(assignment: Assignment, index: str, found: Sequence[Operand]) -> Assignment:
    """The statement the parts run: ``assignment`` with each access renamed to its
    operand's local name (the same statement where no tensor is read two ways)."""
    local = {(op.name, op.axes): op.local for op in found}

    def walk(e: Expr) -> Expr:
        match e:
            case Access():
                axes = tuple(k for k, i in enumerate(e.indices) if i == index)
                return Access(local.get((e.name, axes), e.name), e.indices)
            case Literal():
                return e
            case Neg():
                return Neg(walk(e.operand))
            case BinOp():
                return BinOp(e.op, walk(e.left), walk(e.right))
            case Call():
                return Call(e.fn, tuple(walk(x) for x in e.args))
        raise AssertionError(e)  # pragma: no cover

    return Assignment(assignment.lhs, walk(assignment.rhs), assignment.accumulate)


def replicate_index(
    assignment: Assignment, dense: Mapping[str, Any], sparse: Sequence[str]
) -> tuple[str, str] | None:
    """(dense tensor, index) for the replicate class: the largest dense operand and one of its
    output indices that no sparse operand carries; None if there is none."""
    idx = rhs_indices(assignment)
    sparse_idx = {i for a in accesses(assignment.rhs) if a.name in sparse for i in a.indices}
    for name in sorted(dense, key=lambda n: -int(np.asarray(dense[n]).nbytes)):
        for i in idx[name]:
            if i in assignment.lhs.indices and i not in sparse_idx:
                return name, i
    return None


def even_ranges(extent: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` nearly equal ranges covering ``[0, extent)`` (empty ones dropped)."""
    edges = np.linspace(0, extent, max(1, parts) + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(edges, edges[1:], strict=False) if b > a]


def extents(
    assignment: Assignment, mask: str, shapes: Mapping[str, tuple[int, ...]]
) -> dict[str, int]:
    """Each index's extent from the shapes of the tensors a call passes, checked on the
    driver before anything moves (a mistake found on the workers is one error per part,
    after Dask's log): every access reads its tensor at as many indices as it has modes,
    and an index has one extent wherever it is used."""
    dims: dict[str, int] = {}
    seen: dict[str, str] = {}
    for a in read_accesses(assignment, mask):
        shape = shapes[a.name]
        if len(shape) != a.order:
            raise ShapeError(
                f"{assignment}: {a} reads {a.name} at {a.order} index(es) but the {a.name} "
                f"passed has shape {tuple(shape)}; pass a tensor of order {a.order}"
            )
        for mode, (i, size) in enumerate(zip(a.indices, shape, strict=True)):
            known = dims.setdefault(i, int(size))
            seen.setdefault(i, f"{a.name} (mode {mode})")
            if known != size:
                raise ShapeError(
                    f"{assignment}: index {i} has extent {known} in {seen[i]} but {size} in "
                    f"{a.name} (mode {mode}); shapes must agree wherever an index is shared"
                )
    return dims
