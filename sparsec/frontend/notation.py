"""Index-notation AST: what the parser builds and every later stage reads.

Nodes are immutable. Spans ``(start, end)`` index the source text and do not take part
in equality, so ``parse(str(ast)) == ast`` holds (the printer emits the fewest
parentheses that keep the tree).

A scalar operand or scalar left-hand side is an `Access` with no indices.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, assert_never

Span = tuple[int, int]
NO_SPAN: Span = (0, 0)


@dataclass(frozen=True, slots=True)
class Access:
    """``name(i, j, ...)``: tensor ``name`` read (or written) at index variables."""

    name: str
    indices: tuple[str, ...]
    span: Span = field(default=NO_SPAN, compare=False)
    #: one span per index variable, for errors that point at a single index
    index_spans: tuple[Span, ...] = field(default=(), compare=False)
    #: a complemented structural mask ``~M`` (`middle.spec.apply_mask`): present where
    #: ``M`` stores no entry; in a lattice, where ``M``'s last level is present its
    #: products are absent (`concrete.without_masked`), and an absent ``~M`` leaves its
    #: product (`concrete.without`)
    complement: bool = False
    #: a structural mask's access (``M`` or ``~M``, `middle.spec.apply_mask`): its value is
    #: never read, and where it is absent its product is absent under either division
    #: convention (`concrete.without` folds it even where it folds nothing else)
    pattern: bool = False

    @property
    def order(self) -> int:
        return len(self.indices)

    def __str__(self) -> str:
        text = f"{self.name}({','.join(self.indices)})" if self.indices else self.name
        return f"~{text}" if self.complement else text


@dataclass(frozen=True, slots=True)
class Literal:
    """A numeric constant (finite)."""

    value: float
    span: Span = field(default=NO_SPAN, compare=False)

    def __str__(self) -> str:
        return repr(float(self.value))


@dataclass(frozen=True, slots=True)
class Neg:
    operand: Expr
    span: Span = field(default=NO_SPAN, compare=False)

    def __str__(self) -> str:
        inner = str(self.operand)
        if precedence(self.operand) < UNARY_PREC:
            inner = f"({inner})"
        return f"-{inner}"


@dataclass(frozen=True, slots=True)
class BinOp:
    """``left op right`` with ``op`` one of ``+ - * /``."""

    op: str
    left: Expr
    right: Expr
    span: Span = field(default=NO_SPAN, compare=False)

    def __str__(self) -> str:
        prec = BINARY_PREC[self.op]
        left, right = str(self.left), str(self.right)
        if precedence(self.left) < prec:
            left = f"({left})"
        # Operators are left-associative: an equal-precedence right child needs parentheses.
        if precedence(self.right) <= prec:
            right = f"({right})"
        return f"{left} {self.op} {right}"


@dataclass(frozen=True, slots=True)
class Call:
    """``fn(arg, ...)``: a function of the language (`sparsec.frontend.functions`)."""

    fn: str
    args: tuple[Expr, ...]
    span: Span = field(default=NO_SPAN, compare=False)

    def __str__(self) -> str:
        return f"{self.fn}({', '.join(map(str, self.args))})"


Expr = Access | Literal | Neg | BinOp | Call

BINARY_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}
UNARY_PREC = 3
ATOM_PREC = 4


def precedence(expr: Expr) -> int:
    match expr:
        case BinOp(op=op):
            return BINARY_PREC[op]
        case Neg():
            return UNARY_PREC
        case _:
            # Accesses, literals, calls, and later stages' atoms (``sum(k, ...)``,
            # structural 0).
            return ATOM_PREC


@dataclass(frozen=True, slots=True)
class Assignment:
    """``lhs = rhs`` or, with ``accumulate``, ``lhs += rhs``."""

    lhs: Access
    rhs: Expr
    accumulate: bool = False
    span: Span = field(default=NO_SPAN, compare=False)

    def __str__(self) -> str:
        return f"{self.lhs} {'+=' if self.accumulate else '='} {self.rhs}"

    def accesses(self) -> Iterator[Access]:
        """The left-hand side, then every right-hand access in source order."""
        yield self.lhs
        yield from accesses(self.rhs)

    @property
    def free_indices(self) -> tuple[str, ...]:
        return self.lhs.indices

    @property
    def summed_indices(self) -> tuple[str, ...]:
        """Indices of the right-hand side that the left-hand side lacks, first use first."""
        seen: dict[str, None] = {}
        for access in accesses(self.rhs):
            for index in access.indices:
                if index not in self.lhs.indices:
                    seen.setdefault(index)
        return tuple(seen)


def accesses(expr: Expr) -> Iterator[Access]:
    """Every access in ``expr``, left to right."""
    match expr:
        case Access():
            yield expr
        case Literal():
            return
        case Neg(operand=operand):
            yield from accesses(operand)
        case BinOp(left=left, right=right):
            yield from accesses(left)
            yield from accesses(right)
        case Call(args=args):
            for arg in args:
                yield from accesses(arg)
        case _:
            assert_never(expr)


def factors(expr: Any) -> list[Any]:
    """The factors of a product (accesses and literals, a negation as a factor ``-1``), or
    [] if ``expr`` is not one (a sum, or a concrete expression's nested sum)."""
    match expr:
        case BinOp(op="*", left=left, right=right):
            a, b = factors(left), factors(right)
            return a + b if a and b else []
        case Access() | Literal():
            return [expr]
        case Neg(operand=x):
            inner = factors(x)
            return [Literal(-1.0), *inner] if inner else []
        case _:
            return []


def factor_chain(expr: Any) -> list[Any]:
    """A product chain's factors through negations, left to right (``-a * (b * c)``: a, b,
    c); anything else is its own one factor. Unlike `factors`, drops signs and keeps any
    factor (a sum, or a concrete expression's nested sum)."""
    match expr:
        case BinOp(op="*", left=left, right=right):
            return factor_chain(left) + factor_chain(right)
        case Neg(operand=x):
            return factor_chain(x)
        case _:
            return [expr]


def indices_of(expr: Expr) -> frozenset[str]:
    return frozenset(i for a in accesses(expr) for i in a.indices)
