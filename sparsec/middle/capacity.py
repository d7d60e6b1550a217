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

The rules are read off the statement once, at code generation (`entry_bound_of`: an `EntryBound`,
frozen data that travels in `sparsec.backends.Generated`), and counted on each call's
inputs (`EntryBound.count`), so the runtime never reads the statement.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..frontend.concrete import CExpr, Statement, Sum, Zero, accesses, divides
from ..frontend.functions import FUNCTIONS
from ..frontend.notation import Access, BinOp, Call, Literal, Neg, factor_chain


@dataclass(frozen=True, slots=True)
class Operand:
    """An access of an input: its name, its indices, whether it is complemented (``~M``)."""

    name: str
    indices: tuple[str, ...]
    complement: bool = False


@dataclass(frozen=True, slots=True)
class Stored:
    """A tensor: its stored entries (capped by the dense size of its indices)."""

    operand: Operand
    free: frozenset[str]


@dataclass(frozen=True, slots=True)
class Everything:
    """Present everywhere over ``free`` (a complement, a function with ``f(0) != 0``)."""

    free: frozenset[str]


@dataclass(frozen=True, slots=True)
class Constant:
    """A literal (1) or an absent zero (0), over no index."""

    entries: int
    free: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Combined:
    """``parts``, each widened to ``free``, combined by ``rule``: "min" (an intersection),
    "sum" (a union) or "first" (present where the first part is: a quotient by a
    literal, a function with ``f(0) = 0``)."""

    rule: str
    parts: tuple[Node, ...]
    free: frozenset[str]


@dataclass(frozen=True, slots=True)
class Summed:
    """``Σ`` of ``body``; over one index ``index`` of a product of tensors and literals,
    also ``Σ_k Π_f c_f(k)`` over that product's tensors ``chain`` (None: no such sum)."""

    body: Node
    free: frozenset[str]
    index: str | None = None
    chain: tuple[Operand, ...] = ()


Node = Stored | Everything | Constant | Combined | Summed


@dataclass(frozen=True, slots=True)
class EntryBound:
    """The bound of one statement's output, as data: `count` it on a call's inputs."""

    #: the output's indices
    out: frozenset[str]
    #: the expression divides by a non-literal (lowered exactly under ``"ieee"``)
    divides: bool
    root: Node
    #: every access of the right-hand side, left to right (nested sums included)
    operands: tuple[Operand, ...]

    def count(
        self,
        values: Mapping[str, Any],
        dims: Mapping[str, int],
        division: str = "sparse",
        rows: tuple[str, int, int] | None = None,
    ) -> int:
        """At most how many entries the output gets for these inputs, under the kernel's
        ``division`` convention (`sparsec.frontend.semantics`). ``rows`` = (an output
        index ``i``, ``lo``, ``hi``): only the entries with ``lo <= i < hi`` (a chunk of a
        rowwise output's rows, `sparsec.runtime.sparse_out.chunked_pass`)."""
        full = dims[rows[0]] if rows is not None else 0
        if rows is not None:
            dims = {**dims, rows[0]: rows[2] - rows[1]}
        dense = _size(dims, self.out)
        if division == "ieee" and self.divides:
            return dense  # exact lowering: present everywhere
        n = _Bound(values, dims, rows, full).of(self.root)
        return int(min(dense, n * _size(dims, self.out - self.root.free)))


def entry_bound_of(stmt: Statement) -> EntryBound:
    """The rules above for ``stmt``'s output, read off the statement once."""
    rhs: CExpr = Sum(stmt.top_sums, stmt.rhs) if stmt.top_sums else stmt.rhs
    operands = tuple(_operand(a) for a in accesses(stmt.rhs))
    return EntryBound(frozenset(stmt.lhs.indices), divides(rhs), _node(rhs), operands)


def entry_bound(
    stmt: Statement,
    values: Mapping[str, Any],
    dims: Mapping[str, int],
    division: str = "sparse",
    rows: tuple[str, int, int] | None = None,
) -> int:
    """At most how many entries the output of ``stmt`` gets for these inputs
    (`EntryBound.count` of its `entry_bound_of`)."""
    return entry_bound_of(stmt).count(values, dims, division, rows)


def _operand(a: Access) -> Operand:
    return Operand(a.name, a.indices, a.complement)


def _node(e: CExpr) -> Node:
    """The rule of ``e`` (the module's list)."""
    match e:
        case Access(indices=indices, complement=True):
            # present where the operand stores nothing: bounded by everything
            return Everything(frozenset(indices))
        case Access(indices=indices):
            return Stored(_operand(e), frozenset(indices))
        case Literal():
            return Constant(1)
        case Zero():
            return Constant(0)
        case Neg(operand=x):
            return _node(x)  # type: ignore[arg-type]
        case BinOp(op=op, left=a, right=b):
            pair = (_node(a), _node(b))  # type: ignore[arg-type]
            free = pair[0].free | pair[1].free
            # a quotient is present where its numerator is (the sparse convention; the
            # exact one is `EntryBound.divides`)
            rule = {"*": "min", "+": "sum", "-": "sum", "/": "first"}.get(op)
            return Combined(rule, pair, free) if rule else Everything(free)
        case Call(fn=fn, args=args):
            parts = tuple(_node(a) for a in args)  # type: ignore[arg-type]
            free = frozenset().union(*(p.free for p in parts))
            if fn in ("max", "min"):
                return Combined("sum", parts, free)
            if FUNCTIONS[fn].keeps_pattern(args):
                return Combined("first", parts, free)
            return Everything(free)
        case Sum(indices=summed, body=body):
            inner = _node(body)
            free = inner.free - frozenset(summed)
            factors = factor_chain(body)
            if len(summed) != 1 or any(not isinstance(f, Access | Literal) for f in factors):
                return Summed(inner, free)
            chain = tuple(_operand(f) for f in factors if isinstance(f, Access))
            return Summed(inner, free, summed[0], chain)
    raise AssertionError(e)


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

    def _stored(self, a: Operand) -> int:
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

    def _cut(self, a: Operand) -> tuple[int, int] | None:
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

    def of(self, node: Node) -> int:
        """A bound on the present tuples of ``node`` over its free indices."""
        match node:
            case Everything(free=free):
                return _size(self.dims, free)
            case Stored(operand=a, free=free):
                return min(self._stored(a), _size(self.dims, free))
            case Constant(entries=n):
                return n
            case Combined(rule=rule, parts=parts, free=free):
                widened = [self.of(p) * _size(self.dims, free - p.free) for p in parts]
                n = min(widened) if rule == "min" else sum(widened) if rule == "sum" else widened[0]
                return min(n, _size(self.dims, free))
            case Summed(body=body, free=free, index=k, chain=chain):
                n = min(self.of(body), _size(self.dims, free))
                if k is not None:
                    n = min(n, self._contracted(k, chain))
                return n
        raise AssertionError(node)

    def _contracted(self, k: str, chain: tuple[Operand, ...]) -> int:
        """``Σ_k Π_f c_f(k)`` over the tensors ``chain`` of a product of tensors and
        literals."""
        total = np.ones(self.dims[k], dtype=np.float64)
        for f in chain:
            total *= self._counts(f, k)
        # float64 sums: a margin above rounding, then one more for good measure
        return math.ceil(float(total.sum()) * (1 + 1e-9)) + 1

    def _counts(self, a: Operand, k: str) -> np.ndarray | float:
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
