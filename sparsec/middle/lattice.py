"""Merge lattices (Kjolstad et al., OOPSLA 2017, §5).

For one index variable ``v``, each operand access contributes an *iterator* when the
level that stores ``v`` iterates positions (compressed, singleton); operands whose level
is dense (located), or that do not use ``v`` at all, are present at every coordinate.

A lattice point is the set of iterators that are present; its expression is the
right-hand side with every other iterator's access set to zero. Lattices are built over
the expression tree with

* ``conjunction`` (``*``): every union ``p ∪ q`` of a left and a right point;
* ``disjunction`` (``+``, ``-``): the conjunction plus both operands' points;
* division under ``"ieee"`` (lowered ``exact``): ``a / b`` is not zero where ``a`` is
  (``0/0`` is NaN), so both operands are made *full* first (the empty point is added),
  unless ``b`` is a literal; under ``"sparse"``: the numerator's points, with the divisor
  co-iterated exactly where present (``a ∧ full(b)``; an absent divisor reads 0);
* a function (`sparsec.frontend.functions`) with ``f(0) = 0``: its operand's points
  (``max``/``min``: a disjunction; ``pow(a, p)`` with a positive literal ``p``: ``a``'s);
  any other is *full* (absent operands compute ``f(0)``).

The empty point ``∅`` means "every coordinate": a lattice containing it is iterated by a
dense loop over ``v``'s range with sparse iterators advanced by coordinate match.
Points whose expression folds to zero are dropped (``optimize``).

A complemented mask ``~M`` (`Access.complement`) is co-iterated as a full operand: at
``M``'s upper levels a point where ``M`` is present keeps ``~M`` (deeper levels decide) and
one where it is absent drops it with no effect (``without``: ``M`` has no entry below, so
everything below is allowed); at ``M``'s last level a point where ``M`` is present is a
point computes the expression with ``~M``'s products absent (`without_masked`): what is left is
a sparse ``+=``'s current value, or nothing, a *skip* case kept with the expression ``ZERO``
(its case emits nothing) rather than dropped: dropping it would let the lower point, where
``M`` is absent, fire where ``M`` has an entry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import assert_never

from ..base.errors import LoweringError
from ..frontend.concrete import ZERO, CExpr, Sum, Zero, without_masked
from ..frontend.functions import FUNCTIONS
from ..frontend.notation import Access, BinOp, Call, Literal, Neg


@dataclass(frozen=True, slots=True, order=True)
class Iterator:
    """Positions of ``access``'s storage ``level`` (the level that holds the variable)."""

    access: Access
    level: int

    def __str__(self) -> str:
        return f"{self.access.name}{self.level + 1}"


Point = frozenset[Iterator]


def ordered(its: Iterable[Iterator]) -> list[Iterator]:
    """Iterators in one fixed order: by name and level, then the access's index variables
    (``A(k,i)`` and ``A(k,j)`` both print as ``A2``). Never set order, which follows the
    hash seed: generated code, and so the compile cache's key, must not."""
    return sorted(its, key=lambda it: (str(it), it.access.indices))


@dataclass(frozen=True, slots=True)
class LatticePoint:
    iterators: Point
    expr: CExpr

    def __str__(self) -> str:
        its = ",".join(sorted(map(str, self.iterators))) or "∅"
        return f"[{its}] {self.expr}"


@dataclass(frozen=True, slots=True)
class Lattice:
    """Points from the top (all iterators) down; ``full`` when ``∅`` is a point."""

    points: tuple[LatticePoint, ...]

    @property
    def iterators(self) -> tuple[Iterator, ...]:
        its: set[Iterator] = set()
        for p in self.points:
            its |= p.iterators
        return tuple(ordered(its))

    @property
    def full(self) -> bool:
        return any(not p.iterators for p in self.points)

    @property
    def range_loop(self) -> bool:
        """The loop is a plain range over the index (``∅`` is the only point): every
        operand at this index is dense or located."""
        return self.full and not self.iterators

    @property
    def position_loop(self) -> bool:
        """The loop walks one operand's positions (one point, one iterator): a ``for``
        loop when that level is unique; otherwise a walk over runs of equal coordinates.
        Anything that is neither this nor `range_loop` is a merge (``while`` loops)."""
        return len(self.points) == 1 and len(self.iterators) == 1

    def sub_points(self, top: LatticePoint) -> tuple[LatticePoint, ...]:
        """Points below (or equal to) ``top``: the cases of ``top``'s co-iteration loop."""
        return tuple(p for p in self.points if p.iterators <= top.iterators)

    def __str__(self) -> str:
        return "\n".join(map(str, self.points))


def conjunction(a: list[Point], b: list[Point]) -> list[Point]:
    """``a ∧ b``: both operands present (multiplication)."""
    return _dedupe([p | q for p in a for q in b])


def disjunction(a: list[Point], b: list[Point]) -> list[Point]:
    """``a ∨ b``: either operand present (addition, subtraction)."""
    return _dedupe(conjunction(a, b) + a + b)


def full(a: list[Point]) -> list[Point]:
    """``a`` made present everywhere (adds the empty point)."""
    return _dedupe(a + [frozenset()])


def _dedupe(points: list[Point]) -> list[Point]:
    return list(dict.fromkeys(points))


def point_sets(
    expr: CExpr, iterator_of: Callable[[Access], Iterator | None], exact: bool = False
) -> list[Point]:
    """The lattice points (iterator sets) of ``expr`` for one index variable.

    ``exact`` (inside a divisor) makes every operand full, so every combination of present
    iterators is its own point: there a zero's sign decides the sign of an infinity.
    """
    match expr:
        case Access():
            it = iterator_of(expr)
            if it is None:
                return [frozenset()]
            # ~M is co-iterated but present everywhere: where M is absent it allows all
            full_here = exact or expr.complement
            return [frozenset({it}), frozenset()] if full_here else [frozenset({it})]
        case Literal():
            return [frozenset()]
        case Zero():
            return [frozenset()] if exact else []
        case Neg(operand=x):
            return point_sets(x, iterator_of, exact)
        case Sum(body=body):
            return point_sets(body, iterator_of, exact)
        case BinOp(op="*", left=left, right=right):
            return conjunction(
                point_sets(left, iterator_of, exact), point_sets(right, iterator_of, exact)
            )
        case BinOp(op="+" | "-", left=left, right=right):
            return disjunction(
                point_sets(left, iterator_of, exact), point_sets(right, iterator_of, exact)
            )
        case BinOp(op="/", left=left, right=right):
            numerator = point_sets(left, iterator_of, exact)
            if isinstance(right, Literal) and right.value != 0:
                return numerator
            # not exact: the sparse convention, absent where the numerator is
            kept = full(numerator) if exact else numerator
            return conjunction(kept, point_sets(right, iterator_of, exact=True))
        case Call(fn=fn, args=args):
            sets = [point_sets(a, iterator_of, exact) for a in args]
            if fn in ("max", "min"):
                return disjunction(sets[0], sets[1])
            if FUNCTIONS[fn].keeps_pattern(args):
                return sets[0] if len(sets) == 1 else conjunction(sets[0], sets[1])
            return full(sets[0] if len(sets) == 1 else disjunction(sets[0], sets[1]))
        case BinOp(op=op):
            raise AssertionError(f"unknown operator {op}")
        case _:
            assert_never(expr)


def build(
    expr: CExpr,
    iterator_of: Callable[[Access], Iterator | None],
    exact: bool = False,
    flagged: bool = True,
) -> Lattice:
    """The merge lattice of ``expr`` for the variable that ``iterator_of`` describes.

    ``iterator_of(access)`` returns the iterator an access contributes, or ``None`` when
    the access is present at every coordinate (dense level, or variable not used).
    With ``exact`` (an expression that divides by a non-literal, so infinities and NaN
    can arise), every subset of iterators is a point and nothing is folded: each case
    computes what dense arithmetic computes, ``inf * 0`` included.

    A sum of many one-iterator terms gets its `UnionLattice` (unless ``flagged`` is off:
    the lowering then wants every point after all).
    """
    if flagged and (union := union_lattice(expr, iterator_of, exact)) is not None:
        return union
    sets = point_sets(expr, iterator_of, exact)
    by_access = {it.access: it for p in sets for it in p}
    if exact and len(by_access) > MAX_EXACT_ITERATORS:
        raise LoweringError(
            f"this expression divides by a non-constant, which needs every combination of "
            f"{len(by_access)} sparse operands co-iterated at one index; at most "
            f"{MAX_EXACT_ITERATORS} are supported. Store some operands dense"
        )
    points = []
    for p in sorted(sets, key=lambda s: -len(s)):
        absent = frozenset(a for a, it in by_access.items() if it not in p)
        # ~M where M's last level stores an entry: its products are absent, not the rest
        # (a sparse +='s current value)
        masked = frozenset(
            it.access for it in p if it.access.complement and it.level == it.access.order - 1
        )
        simplified = without_masked(expr, masked, absent, exact)
        if masked and simplified is ZERO:
            # a skip case, kept (with no body) so that a lower point, where M is absent,
            # does not fire here
            points.append(LatticePoint(p, ZERO))
        elif simplified is not ZERO:
            points.append(LatticePoint(p, simplified))
    computed = [p.iterators for p in points if p.expr is not ZERO]
    # a skip matters only above a computing point (which would fire there otherwise); one
    # above none (M alone, the rhs absent) would be a loop over M's rest that does nothing
    kept = [p for p in points if p.expr is not ZERO or any(q < p.iterators for q in computed)]
    return Lattice(tuple(kept))


MAX_EXACT_ITERATORS = 5


# ----------------------------------------------------------------- flagged unions
UNION_FROM = 4
"""From this many iterators on, a union is co-iterated with presence flags (`UnionLattice`):
the lattice's C grows with its ``2^n - 1`` points and its compile time faster still, the
flags' C barely grows, and both run as fast (docs/decisions.md, "Flagged unions"). Three
operands stay on the lattice so that the code of existing kernels does not change."""


@dataclass(frozen=True, slots=True)
class UnionLattice(Lattice):
    """The lattice of a sum of terms that each need at most one iterator, summarised:
    its top point (every iterator, the whole expression) and, when some term needs none,
    ``∅``. Its ``2^n - 1`` points are never built: `lower.union` co-iterates it with one
    presence flag per iterator and one case body, an absent term contributing zero, the
    identity of ``+``. Its `iterators`, `full`, `range_loop` and `position_loop` are
    those of the lattice it stands for; `sub_points` is not (only the flags' lowering
    consumes it)."""


def union_lattice(
    expr: CExpr, iterator_of: Callable[[Access], Iterator | None], exact: bool = False
) -> UnionLattice | None:
    """``expr``'s lattice as a `UnionLattice` when ``expr`` is a tree of ``+``, ``-`` and
    unary minus whose leaves (terms) each need at most one iterator (an access, a
    literal-scaled access, a product with located factors), and together at least
    `UNION_FROM` iterators; otherwise None (the lattice is built point by point). Decided
    from the expression alone, in time linear in its size."""
    if exact:
        return None
    terms: list[CExpr] = []
    if not _union_terms(expr, terms):
        return None
    its: set[Iterator] = set()
    full = False
    for term in terms:
        found: set[Iterator] = set()
        if not _plain_term(term, iterator_of, found) or len(found) > 1:
            return None
        full = full or not found
        its |= found
    if len(its) < UNION_FROM:
        return None
    top = LatticePoint(frozenset(its), expr)
    return UnionLattice((top, LatticePoint(frozenset(), expr)) if full else (top,))


def _union_terms(expr: CExpr, terms: list[CExpr]) -> bool:
    """Collect the leaves of ``expr``'s ``+``/``-``/negation tree into ``terms``."""
    match expr:
        case BinOp(op="+" | "-", left=left, right=right):
            return _union_terms(left, terms) and _union_terms(right, terms)
        case Neg(operand=x):
            return _union_terms(x, terms)
        case _:
            terms.append(expr)
            return True


def _plain_term(
    expr: CExpr, iterator_of: Callable[[Access], Iterator | None], found: set[Iterator]
) -> bool:
    """Whether ``expr`` is a product of accesses and literals (a division only by a
    non-zero literal), present exactly where all its iterators are: then an absent
    iterator makes the whole term zero. Collects its iterators into ``found``. Anything
    else (nested sums, functions, divisors that may be zero) is not."""
    match expr:
        case Access(complement=True):
            return False  # an absent ~M does not make the term zero
        case Access():
            it = iterator_of(expr)
            if it is not None:
                found.add(it)
            return True
        case Literal():
            return True
        case Neg(operand=x):
            return _plain_term(x, iterator_of, found)
        case BinOp(op="*", left=left, right=right):
            return _plain_term(left, iterator_of, found) and _plain_term(right, iterator_of, found)
        case BinOp(op="/", left=left, right=Literal(value=v)) if v != 0:
            return _plain_term(left, iterator_of, found)
        case _:
            return False
