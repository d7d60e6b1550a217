"""Memory footprints of `Kernel.random_inputs` and `Kernel.check`, and the refusal of what
will not fit.

``check`` compares with a dense torch reference, so every operand is densified (float64),
the statement is evaluated densely (`sparsec.api.reference`) and the result is compared with
the kernel's densified output. For large extents that is many times the memory the sparse
kernel needs: 10^5 x 10^5 is 80 GB per dense operand. The estimate here is a sum of the
arrays those steps hold (rounded up; a few small ones left out) and is compared with the
memory the system reports available, so a request that cannot fit is refused with the
numbers instead of being killed by the kernel's OOM killer half way.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Mapping
from typing import assert_never

from ..base.errors import InputError
from ..frontend.concrete import unbounded
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
)
from ..middle.spec import Spec

#: share of the available memory an estimate may use (the rest: the interpreter, torch,
#: the compiler, and the estimate's own slack)
BUDGET_SHARE = 0.8
_F64 = 8
#: dense float64 arrays of the output's shape that the comparison holds at its peak: the
#: result, the reference, the tolerance, the difference and their masks
_COMPARE_ARRAYS = 6
#: bytes per stored entry and mode while `sparsec.random` packs: coordinates and their
#: level-order copy (int64 each), plus per entry the sort keys and values
_PACK_PER_MODE, _PACK_PER_ENTRY = 16, 32


def available_bytes() -> int | None:
    """Memory the system can give this process now: Linux's MemAvailable, else the free
    physical pages; None where neither is known."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _cells(spec: Spec, name: str, dims: Mapping[str, int]) -> int:
    access = next(a for a in spec.assignment.accesses() if a.name == name)
    return math.prod(dims[i] for i in access.indices)


def _reference_elements(assignment: Assignment, dims: Mapping[str, int]) -> int:
    """Elements of the largest intermediate of the dense reference's evaluation: each node
    with both operands broadcast to the union of their indices, a product chain (where
    nothing divides) contracted factor by factor from the left, as `torch.einsum` does."""
    summed = set(assignment.summed_indices)
    totals = Counter(i for a in accesses(assignment.rhs) for i in a.indices)
    # elementwise where a value may be infinite: any division, log, exp (as the reference)
    exact = unbounded(assignment.rhs) or any(
        isinstance(e, BinOp) and e.op == "/" for e in _nodes(assignment.rhs)
    )
    biggest = 0

    def size(labels: tuple[str, ...]) -> None:
        nonlocal biggest
        biggest = max(biggest, math.prod(dims[x] for x in labels))

    def closed(expr: Expr, labels: tuple[str, ...]) -> tuple[str, ...]:
        here = Counter(i for a in accesses(expr) for i in a.indices)
        return tuple(x for x in labels if not (x in summed and here[x] == totals[x]))

    def value(expr: Expr) -> tuple[str, ...]:
        match expr:
            case Access(indices=indices):
                labels = tuple(dict.fromkeys(indices))
            case Literal():
                labels = ()
            case Neg(operand=x):
                labels = value(x)
                size(labels)
            case BinOp(op="*") if not exact:
                parts = [value(f) for f in factor_chain(expr)]
                every = tuple(dict.fromkeys(x for p in parts for x in p))
                closing = set(every) - set(closed(expr, every))
                labels = ()
                for n, part in enumerate(parts):  # each step's result, its sums taken
                    later = {x for p in parts[n + 1 :] for x in p}
                    union = dict.fromkeys(labels + part)
                    labels = tuple(x for x in union if x not in closing or x in later)
                    if n:  # a contraction's result (the first factor is an operand)
                        size(labels)
            case BinOp(left=left, right=right):
                labels = tuple(dict.fromkeys(value(left) + value(right)))
                size(labels)
            case Call(args=args):
                labels = tuple(dict.fromkeys(x for a in args for x in value(a)))
                size(labels)
            case _:
                assert_never(expr)
        return closed(expr, labels)

    value(assignment.rhs)
    return biggest


def _nodes(expr: Expr) -> list[Expr]:
    match expr:
        case Neg(operand=x):
            return [expr, *_nodes(x)]
        case BinOp(left=left, right=right):
            return [expr, *_nodes(left), *_nodes(right)]
        case Call(args=args):
            return [expr, *(n for a in args for n in _nodes(a))]
        case _:
            return [expr]


def check_parts(
    spec: Spec,
    dims: Mapping[str, int],
    *,
    density: float | None = None,
    check: bool = True,
    itemsize: int = _F64,
    index_size: int = 4,
) -> list[tuple[str, int]]:
    """(what, bytes) of the arrays on extents ``dims``: with ``density``, those of the
    random inputs `Kernel.random_inputs` makes (sparse ones packed from about ``density``
    x cells entries); with ``check``, those `Kernel.check` adds (dense copies of the
    inputs, the dense reference, the comparison)."""
    parts: list[tuple[str, int]] = []
    wanted = [*spec.inputs, *((spec.output,) if spec.statement.accumulate else ())]
    cells = {t.name: _cells(spec, t.name, dims) for t in wanted if t.order}
    for t in wanted:
        if t.order == 0 or density is None:
            continue
        if t.is_dense:
            parts.append((f"random dense {t.name}", 3 * _F64 * cells[t.name]))
        else:
            nnz = round(density * cells[t.name])
            packing = nnz * (_PACK_PER_MODE * t.order + _PACK_PER_ENTRY)
            parts.append((f"packing random {t.name} ({nnz:.3g} entries)", packing))
            parts.append((f"{t.name}'s storage", nnz * (itemsize + index_size * t.order)))
    if not check:
        return parts
    for name, n in cells.items():
        parts.append((f"{name} densified for torch", _F64 * n))
    if cells:  # densifying makes one more copy at a time
        parts.append(("a densified copy", _F64 * max(cells.values())))
    parts.append(("the dense reference", _F64 * _reference_elements(spec.assignment, dims)))
    out = _COMPARE_ARRAYS * _F64 * _cells(spec, spec.output.name, dims)
    parts.append((f"the output {spec.output.name} and its comparison", out))
    return parts


def _gb(n: float) -> str:
    return f"{n / 1e9:,.1f} GB" if n >= 1e8 else f"{n / 1e6:,.1f} MB"


def ensure_fits(parts: list[tuple[str, int]], what: str, available: int | None = None) -> None:
    """Raise `InputError` when the arrays ``parts`` would not fit in `BUDGET_SHARE` of the
    available memory (``available``, or `available_bytes`; nothing is refused where the
    system does not say)."""
    available = available_bytes() if available is None else available
    need = sum(n for _, n in parts)
    if available is None or need <= BUDGET_SHARE * available:
        return
    largest = sorted(parts, key=lambda p: -p[1])[:3]
    listed = ", ".join(f"{name}: {_gb(n)}" for name, n in largest)
    raise InputError(
        f"{what} would need about {_gb(need)} of memory ({listed}), more than the "
        f"{_gb(available)} this machine has available; use smaller extents (--dims) or, "
        "for sparse inputs, a lower density"
    )
