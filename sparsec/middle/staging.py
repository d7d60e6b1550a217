"""A sparse output that the GPU cannot fill row by row (DCSR, COO, CSF, a sparse vector, a
compressed level above a dense block), computed through a rowwise *staging* output.

The GPU fills rowwise outputs only (dense levels above one compressed last level: rows
counted, prefix-summed and filled independently). Any other output of the same modes is
a compaction of one: `staged` gives the kernel's spec with the output stored as
``d...ds`` in the same mode order (every level above the last made dense, the last
compressed), so the kernels are the rowwise ones, unchanged; the runtime
(`sparsec.runtime.compaction`) then derives the asked-for levels from the rows' entries:
a compressed level keeps the distinct prefixes (a prefix sum over "new prefix" flags),
COO's levels expand each entry's row into coordinates, a dense block scatters its row.

A sparse vector has no level above its compressed one; its staging output gets a leading
dense level of extent one (the index `ROW`, on the left-hand side only), so it is a
single row."""

from __future__ import annotations

from dataclasses import replace

from ..frontend.concrete import Statement
from ..frontend.notation import Access, Assignment
from ..tensors.formats import Compressed, Dense, Format
from ..tensors.layout import OutputLayout
from .spec import Spec

#: the staging output's leading index for a sparse vector (extent 1): never parsed, so it
#: cannot meet a user's index; the runtime binds its extent
ROW = "sc_row"


def staging_format(fmt: Format) -> Format:
    """``d...ds`` in ``fmt``'s mode order (a leading dense level for a vector)."""
    n = fmt.order
    if n == 1:
        return Format((Dense(), Compressed()), (0, 1))
    return Format((*(Dense() for _ in range(n - 1)), Compressed()), fmt.ordering)


def needs_staging(spec: Spec) -> bool:
    """A sparse output the GPU cannot fill row by row as it is stored."""
    out = spec.output
    return not out.is_dense and not OutputLayout.of(out.format, out.name).rowwise


def staged(spec: Spec) -> Spec:
    """``spec`` with its output stored in `staging_format` (a vector's output indexed by
    ``(ROW, i)``)."""
    out = spec.output
    fmt = staging_format(out.format)
    if out.order != 1:
        return replace(spec, tensors=(replace(out, format=fmt), *spec.inputs))
    stmt, assign = spec.statement, spec.assignment
    lhs = Access(stmt.lhs.name, (ROW, *stmt.lhs.indices), stmt.lhs.span)
    return replace(
        spec,
        assignment=Assignment(lhs, assign.rhs, assign.accumulate),
        statement=Statement(lhs, stmt.rhs, stmt.top_sums, stmt.accumulate),
        tensors=(replace(out, order=2, format=fmt), *spec.inputs),
        indices=(ROW, *spec.indices),
    )
