"""An upper bound on the entries of a sparse output, from the inputs' metadata.

The single-pass kernel of a sparse output (`sparsec.pipeline`, ``sparsec_append``) appends into
arrays the runtime allocates before it runs; their capacity comes from here. An output
entry exists where some lattice case of the expression ran, that is where the expression
is structurally present, so the bound follows the expression (``N`` counts the
coordinate tuples over an expression's free indices where it is present, ``D(S)`` is the
product of the extents of the indices ``S``):

* a tensor: its stored entries (a dense operand: all of them); its complement ``~M``:
  everything; a literal: 1, everywhere;
* ``a * b`` (intersection): ``min(N(a)·D(F(b)∖F(a)), N(b)·D(F(a)∖F(b)))``;
* ``a + b``, ``a - b`` (union): the sum of the same two terms; ``a / c`` for a non-zero
  literal ``c``: the bound of ``a``;
* an expression that divides by anything else is lowered exactly (`lattice.build`): an
  absent operand is read as ``0.0`` and every combination of operands is a case, since
  ``x / 0`` is infinite and ``inf * 0`` NaN. No operator then keeps a pattern, not even
  ``*`` (``alpha / C(k) * B(k,i)`` has an entry wherever ``C(k)`` is absent): everything;
* a function (`sparsec.frontend.functions`) with ``f(0) = 0``: its operand's bound
  (``max``/``min``: the union's); any other function: everything;
* ``Σ_k`` of a product of tensors (SpGEMM, SpMSpV, TTM): ``Σ_k Π_f c_f(k)``, where
  ``c_f(k)`` counts factor ``f``'s entries with coordinate ``k`` (a tuple of the product
  over the summed index determines at most one output coordinate); other sums: the
  bound of their body;
* everything is capped by the dense size of its indices.

Each rule over-counts, never under-counts; the kernel also stops (status
`assemble.CAPACITY_EXCEEDED`) rather than write past a capacity, so a wrong bound could
only cost the fallback to the two-phase assembly, not memory safety.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..frontend.concrete import CExpr, Statement, Sum, Zero, exact
from ..frontend.functions import FUNCTIONS
from ..frontend.notation import Access, BinOp, Call, Literal, Neg, factor_chain


def entry_bound(
    stmt: Statement,
    values: Mapping[str, Any],
    dims: Mapping[str, int],
    division: str = "sparse",
    rows: tuple[str, int, int] | None = None,
) -> int:
    """At most how many entries the output of ``stmt`` gets for these inputs, under the
    kernel's ``division`` convention (`sparsec.frontend.semantics`). ``rows`` = (an output
    index ``i``, ``lo``, ``hi``): only the entries with ``lo <= i < hi`` (a chunk of a
    rowwise output's rows, `sparsec.runtime.sparse_out.chunked_pass`)."""
    full = dims[rows[0]] if rows is not None else 0
    if rows is not None:
        dims = {**dims, rows[0]: rows[2] - rows[1]}
    rhs: CExpr = Sum(stmt.top_sums, stmt.rhs) if stmt.top_sums else stmt.rhs
    out = frozenset(stmt.lhs.indices)
    dense = _size(dims, out)
    if exact(rhs, division):
        return dense  # exact lowering: present everywhere
    free, n = _Bound(values, dims, rows, full).of(rhs)
    return int(min(dense, n * _size(dims, out - free)))


def _size(dims: Mapping[str, int], indices: frozenset[str]) -> int:
    return math.prod(dims[i] for i in indices)


class _Bound:
    """The rules above; with ``rows``, the expression with the row index ``i`` restricted
    to ``lo <= i < hi`` (``dims[i]`` is then ``hi - lo``): an operand over ``i`` counts its
    entries in those rows where that is cheap (a dense array, a CSR-like tensor whose
    outer dense level is ``i``), else all of them. Every rule is monotone in its operands'
    counts, so an operand left whole only over-counts."""

    def __init__(
        self,
        values: Mapping[str, Any],
        dims: Mapping[str, int],
        rows: tuple[str, int, int] | None = None,
        full: int = 0,
    ) -> None:
        self.values = values
        self.dims = dims
        self.rows = rows
        #: the row index's whole extent (``dims`` holds the range's)
        self.full = full

    def _stored(self, a: Access) -> int:
        """``a``'s stored entries (within the rows, where `_cut` or a dense array allows)."""
        v = self.values[a.name]
        cut = self._cut(a)
        if cut is not None:
            return cut[1] - cut[0]
        if self.rows is not None and not hasattr(v, "nnz") and a.indices.count(self.rows[0]) == 1:
            # a dense array (in level order: any axis may be the row's) holds size / full
            # values per row
            _, lo, hi = self.rows
            if self.full > 0 and np.ndim(v) == len(a.indices):
                return int(np.size(v)) // self.full * (hi - lo)
        return _stored(v)

    def _cut(self, a: Access) -> tuple[int, int] | None:
        """The positions of ``a``'s entries within the rows, where ``a``'s value is a
        matrix stored as a dense level of the row index over one compressed level."""
        if self.rows is None:
            return None
        row, lo, hi = self.rows
        v = self.values[a.name]
        if not hasattr(v, "nnz") or v.order != 2 or a.indices.count(row) != 1:
            return None
        if not v.format.levels[0].locate or a.indices[v.format.ordering[0]] != row:
            return None
        pos = v.levels[1].pos
        if pos is None or len(pos) != v.shape[v.format.ordering[0]] + 1 or hi >= len(pos):
            return None
        return int(pos[lo]), int(pos[hi])

    def of(self, e: CExpr) -> tuple[frozenset[str], int]:
        """(free indices of ``e``, bound on its present tuples over them)."""
        match e:
            case Access(indices=indices, complement=True):
                # present where the operand stores nothing: bounded by everything
                return frozenset(indices), _size(self.dims, frozenset(indices))
            case Access(indices=indices):
                free = frozenset(indices)
                return free, min(self._stored(e), _size(self.dims, free))
            case Literal():
                return frozenset(), 1
            case Zero():
                return frozenset(), 0
            case Neg(operand=x):
                return self.of(x)  # type: ignore[arg-type]
            case BinOp(op=op, left=a, right=b):
                fa, na = self.of(a)  # type: ignore[arg-type]
                fb, nb = self.of(b)  # type: ignore[arg-type]
                free = fa | fb
                wa, wb = na * _size(self.dims, fb - fa), nb * _size(self.dims, fa - fb)
                match op:
                    case "*":
                        n = min(wa, wb)
                    case "+" | "-":
                        n = wa + wb
                    case "/":
                        # a quotient is present where its numerator is (the sparse
                        # convention; the exact one returned above)
                        n = wa
                    case _:
                        n = _size(self.dims, free)
                return free, min(n, _size(self.dims, free))
            case Call(fn=fn, args=args):
                parts = [self.of(a) for a in args]  # type: ignore[arg-type]
                free = frozenset().union(*(f for f, _ in parts))
                widened = [n * _size(self.dims, free - f) for f, n in parts]
                if fn in ("max", "min"):
                    n = sum(widened)
                elif FUNCTIONS[fn].keeps_pattern(args):
                    n = widened[0]
                else:
                    n = _size(self.dims, free)
                return free, min(n, _size(self.dims, free))
            case Sum(indices=summed, body=body):
                fb, nb = self.of(body)
                free = fb - frozenset(summed)
                n = min(nb, _size(self.dims, free))
                if len(summed) == 1:
                    n = min(n, self._contracted(summed[0], body, n))
                return free, n
        raise AssertionError(e)

    def _contracted(self, k: str, body: CExpr, known: int) -> int:
        """``Σ_k Π_f c_f(k)`` when ``body`` is a product of tensors and literals; else
        ``known`` (the bound already proved)."""
        factors = factor_chain(body)
        if any(not isinstance(f, Access | Literal) for f in factors):
            return known
        total = np.ones(self.dims[k], dtype=np.float64)
        for f in factors:
            if isinstance(f, Access):
                total *= self._counts(f, k)
        # float64 sums: a margin above rounding, then one more for good measure
        return math.ceil(float(total.sum()) * (1 + 1e-9)) + 1

    def _counts(self, a: Access, k: str) -> np.ndarray | float:
        """Entries of ``a`` per coordinate of index ``k`` (all of them if ``k`` is absent)."""
        v = self.values[a.name]
        dims = self.dims
        if a.complement:  # present where the operand stores nothing: everything
            return float(_size(dims, frozenset(a.indices) - {k}))
        if k not in a.indices:
            return float(self._stored(a))
        if not hasattr(v, "nnz"):  # dense: every coordinate of the other modes
            return float(_size(dims, frozenset(a.indices) - {k}))
        mode = a.indices.index(k)
        if a.indices.count(k) > 1:
            return float(self._stored(a))  # a diagonal: at most all entries per k
        cut = self._cut(a) if self.rows is not None and k != self.rows[0] else None
        if cut is not None:  # the rows' entries by column
            crd = v.levels[1].crd[cut[0] : cut[1]]
            return np.bincount(crd, minlength=dims[k])[: dims[k]].astype(np.float64)
        level = v.format.ordering.index(mode)
        st = v.levels[level]
        if level == v.order - 1 and st.crd is not None and len(st.crd) == v.nnz:
            return np.bincount(st.crd, minlength=dims[k])[: dims[k]].astype(np.float64)
        if v.order == 2 and level == 0 and v.format.levels[0].locate:
            below = v.levels[1]
            if below.pos is not None:  # CSR's rows, CSC's columns
                return np.diff(below.pos).astype(np.float64)
        coords = v._mode_coords()[mode]
        return np.bincount(coords, minlength=dims[k])[: dims[k]].astype(np.float64)


def _stored(v: Any) -> int:
    """Entries a value stores: a Tensor's, or all of a dense array's (1 for a scalar)."""
    return int(v.nnz) if hasattr(v, "nnz") else int(np.size(v))
