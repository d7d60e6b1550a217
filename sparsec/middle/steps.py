"""A right-hand side's sums under ``+``/``-`` as the steps of a sequence (TACO's ``where``
over a ``seq``; `lower.sequence` lowers them): the terms, and each step's loop order."""

from __future__ import annotations

from dataclasses import dataclass

from ..frontend.concrete import ZERO, CExpr, Sum
from ..frontend.concrete import accesses as accesses_of
from ..frontend.notation import Access, BinOp, Neg
from .order import loop_order
from .spec import Spec

#: the commands that apply to the shared loops of a sequence (its steps' loops are its own)
SHARED_COMMANDS = frozenset({"parallelize", "split", "divide"})


@dataclass(frozen=True, slots=True)
class Steps:
    """A right-hand side as the steps of a sequence: the terms without a sum (one
    co-iterated initialisation, or None) and each contraction, signs applied."""

    init: CExpr | None
    contractions: tuple[Sum, ...]


def split_terms(expr: CExpr) -> Steps:
    """``expr``'s terms under ``+``/``-`` (through unary minus): the sums among them each
    a step of their own (a subtracted sum negated inside: ``Σk -(A*B)``), the rest
    added back into one expression. Structural zeros (absent at a lattice point) drop."""
    signed: list[tuple[bool, CExpr]] = []

    def walk(e: CExpr, negative: bool) -> None:
        match e:
            case BinOp(op="+", left=left, right=right):
                walk(left, negative)
                walk(right, negative)
            case BinOp(op="-", left=left, right=right):
                walk(left, negative)
                walk(right, not negative)
            case Neg(operand=x):
                walk(x, not negative)
            case _:
                if e is not ZERO:
                    signed.append((negative, e))

    walk(expr, False)
    init: CExpr | None = None
    sums: list[Sum] = []
    for negative, term in signed:
        if isinstance(term, Sum):
            body = Neg(term.body, (0, 0)) if negative else term.body  # type: ignore[arg-type]
            sums.append(Sum(term.indices, body))
        elif init is None:
            init = Neg(term, (0, 0)) if negative else term  # type: ignore[arg-type]
        else:
            init = BinOp("-" if negative else "+", init, term, (0, 0))  # type: ignore[arg-type]
    return Steps(init, tuple(sums))


def step_order(
    spec: Spec, free: tuple[str, ...], step: CExpr, bound: tuple[str, ...]
) -> tuple[str, ...]:
    """One step's loop order inside the loops ``bound``: the output's unbound ``free``
    indices and, for a contraction, its summed ones, in the order its operands' levels
    need (the output, dense, only prefers its storage order)."""
    summed = step.indices if isinstance(step, Sum) else ()
    body = step.body if isinstance(step, Sum) else step
    everything: list[Access] = [spec.statement.lhs, *accesses_of(body)]
    return loop_order(free + summed, everything, spec.formats, bound)
