"""Reduction placement: index notation → an expression tree with explicit `Sum` nodes.

Semantics (documented in docs/semantics.md): an index that is absent from the left-hand
side is summed over the *smallest* subexpression containing all its occurrences (TACO's
rule). So ``a(i) = B(i,k)*c(k) + d(i)`` means ``a(i) = (Σk B(i,k)*c(k)) + d(i)``; ``d``
is not multiplied by the size of ``k``. `place` builds that tree: it *is* the meaning of
the statement, and the dense reference (sparsec/reference.py) evaluates the statement
from the notation by the same rule, independently of what happens here next.

Sums are then lifted where that keeps the value and costs no more (`lift`), so a
reduction can run in the same loop nest as the output: through unary minus, through a
product whose other factor holds no sum and cannot be infinite or NaN (``(Σk X) * Y =
Σk (X * Y)`` when ``Y`` has no ``k``, no sum and does not divide), when the semiring's
multiply distributes over its add (`Semiring.distributive`), and through a division by a
non-zero literal. A sum is never moved across a
division by anything else (``(Σk X) / w`` is not ``Σk X / w`` when ``w`` is 0: ``inf``
against ``0/0 = NaN`` terms), nor anywhere inside a divisor, where a zero's sign decides
``+inf`` against ``-inf``. Sums left under ``+``/``-``/a division are *nested*: the
lowerer computes them into a scalar temporary (TACO's ``where``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import assert_never

from .functions import FUNCTIONS
from .notation import Access, Assignment, BinOp, Call, Literal, Neg


@dataclass(frozen=True, slots=True)
class Sum:
    """``Σ indices . body``"""

    indices: tuple[str, ...]
    body: CExpr

    def __str__(self) -> str:
        return f"sum({','.join(self.indices)}, {self.body})"


@dataclass(frozen=True, slots=True)
class Zero:
    """A structural zero: an operand that is absent at the current lattice point.

    Distinct from ``Literal(0.0)`` so that only absence, never user text, is folded.
    """

    def __str__(self) -> str:
        return "0"


CExpr = Access | Literal | Neg | BinOp | Call | Sum | Zero
ZERO = Zero()


# From here on `Neg` and `BinOp` also hold `Sum` and `Zero` operands: the notation nodes
# are reused rather than copied, and these two constructors are where that widening is
# stated once for the type checker.
def _neg(operand: CExpr, span: tuple[int, int]) -> CExpr:
    return Neg(operand, span)  # type: ignore[arg-type]


def _bin(op: str, left: CExpr, right: CExpr, span: tuple[int, int]) -> CExpr:
    return BinOp(op, left, right, span)  # type: ignore[arg-type]


def _call(fn: str, args: tuple[CExpr, ...], span: tuple[int, int]) -> CExpr:
    return Call(fn, args, span)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class Statement:
    """``lhs (+)= Σ top_sums . rhs`` with nested sums inside ``rhs``."""

    lhs: Access
    rhs: CExpr
    top_sums: tuple[str, ...]
    accumulate: bool

    @property
    def loop_indices(self) -> tuple[str, ...]:
        """Indices of the outer loop nest (before ordering): free, then lifted sums."""
        return self.lhs.indices + self.top_sums

    def __str__(self) -> str:
        op = "+=" if self.accumulate else "="
        rhs = f"sum({','.join(self.top_sums)}, {self.rhs})" if self.top_sums else str(self.rhs)
        return f"{self.lhs} {op} {rhs}"


def children(expr: CExpr) -> tuple[CExpr, ...]:
    match expr:
        case Access() | Literal() | Zero():
            return ()
        case Neg(operand=x):
            return (x,)
        case BinOp(left=left, right=right):
            return (left, right)
        case Call(args=args):
            return args  # type: ignore[return-value]
        case Sum(body=body):
            return (body,)
        case _:
            assert_never(expr)


def accesses(expr: CExpr) -> Iterator[Access]:
    """Every access in ``expr``, left to right (nested sums included)."""
    if isinstance(expr, Access):
        yield expr
    for child in children(expr):
        yield from accesses(child)


def index_counts(expr: CExpr) -> Counter[str]:
    return Counter(i for a in accesses(expr) for i in a.indices)


def place(assignment: Assignment) -> CExpr:
    """The right-hand side with each summed index at the lowest common ancestor of its uses.

    This is the statement as written (parentheses bound the sums); nothing is moved.
    """
    summed = assignment.summed_indices
    totals = index_counts(assignment.rhs)

    def place_at(expr: CExpr) -> CExpr:
        here = index_counts(expr)
        match expr:
            case Neg(operand=x):
                rebuilt: CExpr = _neg(place_at(x), expr.span)
            case BinOp(op=op, left=left, right=right):
                rebuilt = _bin(op, place_at(left), place_at(right), expr.span)
            case Call(fn=fn, args=args):
                rebuilt = _call(fn, tuple(place_at(a) for a in args), expr.span)
            case Access() | Literal() | Zero() | Sum():
                rebuilt = expr
            case _:
                assert_never(expr)
        child_counts = [index_counts(c) for c in children(expr)]
        lca = tuple(
            i
            for i in summed
            if here[i] == totals[i] and not any(c[i] == totals[i] for c in child_counts)
        )
        return Sum(lca, rebuilt) if lca else rebuilt

    return place_at(assignment.rhs)


def concretize(assignment: Assignment, distributive: bool = True) -> Statement:
    """Place each summed index at the lowest common ancestor of its uses, then lift
    (``distributive``: the semiring's multiply distributes over its add, `lift`)."""
    top, body = lift(place(assignment), distributive)
    return Statement(assignment.lhs, body, top, assignment.accumulate)


def lift(expr: CExpr, distributive: bool = True) -> tuple[tuple[str, ...], CExpr]:
    """Pull sums up where the value stays the same and the work does not grow; normalise
    nested sums.

    Through unary ``-`` (exact up to the sign of a zero sum, which only a divisor can
    tell, and divisors are never rewritten); through ``*`` when the multiply distributes
    over the add (``max(a, b) * c`` is not ``max(a*c, b*c)`` for a negative ``c``: not
    under ``max_times``/``min_times``) and the other factor holds no sum and does not
    divide. A sum in the other factor would be recomputed at every term (``(Σi B(i)) *
    (Σl C(l))`` is O(n + m), ``Σi Σl B(i)*C(l)`` O(n·m), and NaN where an infinite
    ``B(i)`` meets ``Σl C(l) = 0``); a divisor may be infinite (``(Σk X) * Y`` and ``Σk
    X*Y`` differ when ``Y`` is infinite and some ``X`` is zero). Through a numerator only
    over a non-zero literal divisor. Never out of a function's operand (``f(Σk X)`` is
    not ``Σk f(X)``).
    """
    match expr:
        case Sum(indices=indices, body=body):
            inner, lifted = lift(body, distributive)
            return indices + inner, lifted
        case BinOp(op="*", left=left, right=right):
            vl, bl = lift(left, distributive)
            vr, br = lift(right, distributive)
            # a side's sums cross the product only over a plain factor: no sum, no divisor
            if vl and not (distributive and _plain(vr, br)):
                vl, bl = (), Sum(vl, bl)
            if vr and not (distributive and _plain(vl, bl)):
                vr, br = (), Sum(vr, br)
            return vl + vr, _bin("*", bl, br, expr.span)
        case BinOp(op="/", left=left, right=Literal(value=v) as right) if v != 0:
            vl, bl = lift(left, distributive)
            return vl, _bin("/", bl, right, expr.span)
        case BinOp(op="/", left=left, right=right):
            # Neither side's sums cross the division, and the divisor stays as written.
            return (), _bin("/", nest(left, distributive), right, expr.span)
        case BinOp(op=op, left=left, right=right):
            return (), _bin(op, nest(left, distributive), nest(right, distributive), expr.span)
        case Neg(operand=x):
            vx, bx = lift(x, distributive)
            return vx, _neg(bx, expr.span)
        case Call(fn=fn, args=args):
            return (), _call(fn, tuple(nest(a, distributive) for a in args), expr.span)
        case Access() | Literal() | Zero():
            return (), expr
        case _:
            assert_never(expr)


def _plain(lifted: tuple[str, ...], body: CExpr) -> bool:
    """May a sum cross a product with this factor (lifted sums ``lifted``, ``body``)? Only
    when it holds no sum (one would run again at every term of the crossing sum) and
    cannot be infinite or NaN (`unbounded`)."""
    return not lifted and not _has_sum(body) and not unbounded(body)


def _has_sum(expr: CExpr) -> bool:
    return isinstance(expr, Sum) or any(_has_sum(c) for c in children(expr))


def nest(expr: CExpr, distributive: bool = True) -> CExpr:
    """A subexpression that stays below its parent: its lifted sums form one `Sum`."""
    indices, body = lift(expr, distributive)
    return Sum(indices, body) if indices else body


def unbounded(expr: CExpr) -> bool:
    """May ``expr`` be infinite or NaN for finite operands (a division, ``log``, ``exp``)?
    Then a sum does not cross a product with it."""
    if isinstance(expr, Call) and not FUNCTIONS[expr.fn].finite:
        return True
    return divides(expr) or any(unbounded(c) for c in children(expr))


def exact(expr: CExpr, division: str) -> bool:
    """Is ``expr`` lowered exactly (`lattice.build`)? Under ``"ieee"`` division, when it
    divides by a non-literal; under ``"sparse"`` never (a quotient is absent where its
    numerator is, docs/semantics.md)."""
    return division == "ieee" and divides(expr)


def divides(expr: CExpr) -> bool:
    """Does ``expr`` divide by anything but a non-zero literal (so inf/NaN may arise)?"""
    match expr:
        case BinOp(op="/", left=left, right=Literal(value=v)) if v != 0:
            return divides(left)
        case BinOp(op="/"):
            return True
        case _:
            return any(divides(c) for c in children(expr))


# ------------------------------------------------------------- simplification
def without(
    expr: CExpr,
    absent: frozenset[Access],
    fold: bool = True,
    sparse_division: bool = False,
    divisor: bool = False,
) -> CExpr:
    """``expr`` with the ``absent`` accesses replaced by structural zeros, folded; an
    absent complemented mask ``~M`` (`Access.complement`: ``M`` has no entry here) is the
    one of its product instead, which it leaves.

    Folding follows the ring: ``0*x = 0``, ``0+x = x``, ``x-0 = x``, ``0-x = -x``,
    ``-0 = 0``, ``Σ 0 = 0``, ``0/x = 0`` only for a literal ``x`` (otherwise ``0/0`` must
    stay NaN, as dense torch computes it). Nothing is folded with ``fold=False`` (exact
    lowering). Inside a divisor (``divisor``) only absent nodes fold, to a +0: there the
    sign of a zero decides ``+inf`` against ``-inf``, so a present ``0 - x`` is computed
    as IEEE arithmetic computes it (``+0 - +0`` is +0, not the ``-x`` of the ring).
    """
    match expr:
        case Access(complement=True) if expr in absent:
            # an absent ~M is the multiplicative one: `apply_mask` only ever multiplies by it
            raise AssertionError(f"{expr} absent outside a product")
        case Access():
            return ZERO if expr in absent else expr
        case Literal() | Zero():
            return expr
        case BinOp(op="*", left=Access(complement=True) as mask, right=rest) if mask in absent:
            return without(rest, absent, fold, sparse_division, divisor)  # ~M absent: no entry
        case BinOp(op="*", left=rest, right=Access(complement=True) as mask) if mask in absent:
            return without(rest, absent, fold, sparse_division, divisor)
        case BinOp(op="*", left=Access(pattern=True) as mask) if mask in absent:
            return ZERO  # outside the mask: absent, not 0 * rhs (NaN for an infinite rhs)
        case BinOp(op="*", right=Access(pattern=True) as mask) if mask in absent:
            return ZERO
        case Neg(operand=operand):
            x = without(operand, absent, fold, sparse_division, divisor)
            return ZERO if x is ZERO and fold else _neg(x, expr.span)
        case Sum(indices=indices, body=body):
            inner = without(body, absent, fold, sparse_division, divisor)
            return ZERO if inner is ZERO else Sum(indices, inner)
        case BinOp(op="/", left=left, right=right):
            a = without(left, absent, fold, sparse_division, divisor)
            # a divisor's absent nodes are +0 under the sparse convention (no 0/0 of an
            # absent quotient); exact lowering folds nothing
            b = without(right, absent, fold and sparse_division, sparse_division, True)
            literal = isinstance(b, Literal) and b.value != 0
            if fold and a is ZERO and (literal or sparse_division):
                return ZERO
            return _bin("/", a, b, expr.span)
        case BinOp(op=op, left=left, right=right):
            a = without(left, absent, fold, sparse_division, divisor)
            b = without(right, absent, fold, sparse_division, divisor)
            if not fold:
                # 0 + 0, 0 - 0 and 0 * 0 are +0 exactly: absent (a mask's product, under
                # "ieee", leaves such a sum with no term present)
                return ZERO if a is ZERO and b is ZERO else _bin(op, a, b, expr.span)
            match op:
                case "*":
                    return ZERO if a is ZERO or b is ZERO else _bin(op, a, b, expr.span)
                case "+" | "-" if divisor:
                    return ZERO if a is ZERO and b is ZERO else _bin(op, a, b, expr.span)
                case "+":
                    if a is ZERO:
                        return b
                    return a if b is ZERO else _bin(op, a, b, expr.span)
                case "-":
                    if b is ZERO:
                        return a
                    return _neg(b, expr.span) if a is ZERO else _bin(op, a, b, expr.span)
                case _:
                    raise AssertionError(op)
        case Call(fn=fn, args=args):
            folded = tuple(without(a, absent, fold, sparse_division, divisor) for a in args)
            # pow keeps its base's pattern; max/min are absent where both operands are
            operands = folded[:1] if fn == "pow" else folded
            if fold and FUNCTIONS[fn].keeps_pattern(args) and all(a is ZERO for a in operands):
                return ZERO
            return _call(fn, folded, expr.span)
        case _:
            assert_never(expr)


def without_masked(
    expr: CExpr, masked: frozenset[Access], absent: frozenset[Access], exact: bool
) -> CExpr:
    """`without` (folded unless ``exact``) where, besides ``absent``, each complemented mask
    in ``masked`` is absent (``M`` stores an entry here): its products are structural
    zeros, whatever else they hold (also under ``exact``), and the rest stays (the current
    value of a sparse ``+=``, ``C_old + ~M * E``); ``ZERO`` when nothing present is left."""
    if not masked:
        return without(expr, absent, fold=not exact, sparse_division=not exact)
    left = _mask_out(expr, masked)
    if without(left, absent, sparse_division=True) is ZERO:
        return ZERO
    return without(left, absent, fold=not exact, sparse_division=not exact)


def _mask_out(expr: CExpr, masked: frozenset[Access]) -> CExpr:
    """``expr`` with the products by the ``masked`` complements replaced by ``ZERO``."""
    match expr:
        case BinOp(op="*", left=Access(complement=True) as mask) if mask in masked:
            return ZERO
        case BinOp(op="*", right=Access(complement=True) as mask) if mask in masked:
            return ZERO
        case Access() | Literal() | Zero():
            return expr
        case Neg(operand=x):
            return _neg(_mask_out(x, masked), expr.span)
        case Sum(indices=indices, body=body):
            return Sum(indices, _mask_out(body, masked))
        case BinOp(op=op, left=left, right=right):
            return _bin(op, _mask_out(left, masked), _mask_out(right, masked), expr.span)
        case Call(fn=fn, args=args):
            return _call(fn, tuple(_mask_out(a, masked) for a in args), expr.span)
        case _:
            assert_never(expr)
