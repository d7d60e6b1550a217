"""Where a dense precompute goes in the loops (TACO's ``where``): `place` decides it from
the statement and the plan alone; `lower.where` allocates the workspace and emits it."""

from __future__ import annotations

from dataclasses import dataclass

from ..base.errors import ScheduleError
from ..frontend.concrete import CExpr, Sum, accesses
from ..frontend.notation import Access, BinOp, Literal, Neg, factors
from ..frontend.semirings import semiring
from .plan import Plan
from .precompute import Precompute
from .spec import Spec


@dataclass(frozen=True, slots=True)
class Placement:
    """A dense precompute placed: ``workspace(vars) = producer`` before the loop ``at``,
    then the consumer reads ``workspace``."""

    at: str
    vars: tuple[str, ...]
    producer_order: tuple[str, ...]
    consumer_order: tuple[str, ...]
    produce: tuple[Access | Literal, ...]
    workspace: Access
    #: the workspace's name in generated code (`Precompute.workspace`)
    label: str
    origin: str
    #: a precomputed subexpression (not a product's factors): the right-hand side's node,
    #: and the right-hand side reading ``workspace`` in its place
    sub: CExpr | None = None
    consumer: CExpr | None = None


def place(spec: Spec, plan: Plan, pre: Precompute, order: tuple[str, ...]) -> Placement:
    """Where a dense precompute goes: before the first loop that only the workspace
    expression uses (or the workspace's own variable), hoisted out of the serial loops
    just outside it that only the rest of the expression uses (`_hoisted`); the loops
    inside it split into the producer's and the consumer's."""
    rhs = spec.statement.rhs
    name = f"{pre.workspace}_ws"
    while name in spec.formats:
        name += "_"
    workspace = Access(name, pre.vars)
    have = factors(rhs)
    produce: list[Access | Literal] = []
    sub: CExpr | None = None
    if have and factors(pre.expr):
        for f in factors(pre.expr):
            match = next((g for g in have if g == f), None)
            if match is None:
                raise ScheduleError(
                    f"{pre.origin}: {f} is not a factor of the right-hand side {rhs}"
                )
            have.remove(match)
            produce.append(match)
        evars = {i for f in produce if isinstance(f, Access) for i in f.indices}
        rvars = {i for f in have if isinstance(f, Access) for i in f.indices}
        reads: CExpr | None = None
    else:
        sub, reads = _subexpression(pre, rhs, workspace)
        evars = {i for a in accesses(sub) for i in a.indices}
        rvars = {i for a in accesses(reads) if a != workspace for i in a.indices}
    rvars |= set(spec.statement.lhs.indices)
    for var in pre.vars:
        if var not in evars:
            raise ScheduleError(f"{pre.origin}: {var} is not an index of {pre.expr}")
    own = (evars - rvars) | set(pre.vars)
    at = _hoisted(
        plan,
        order,
        evars - own,
        next(n for n, loop in enumerate(order) if set(plan.binds(loop)) & own),
    )
    producer: list[str] = []
    consumer: list[str] = []
    for loop in order[at:]:
        if plan.space_of(loop) is not None:
            raise ScheduleError(
                f"{pre.origin}: the loop {loop} ({plan.origin(loop)}) runs inside the "
                "workspace; the loops inside a precompute cannot be split, pos-iterated "
                "or fused"
            )
        if loop in pre.vars:
            producer.append(loop)
            consumer.append(loop)
        elif loop in evars - rvars:
            producer.append(loop)
        elif loop in evars:
            raise ScheduleError(
                f"{pre.origin}: {loop} indexes both {pre.expr} and the rest of the "
                f"expression but runs inside the workspace over {pre.var}; reorder so "
                f"that {loop} encloses the loops of {', '.join(sorted(own))}"
            )
        else:
            consumer.append(loop)
    summed = [loop for loop in producer if loop not in pre.vars]
    ring = semiring(spec.semantics.semiring)
    if summed and sub is None and have and not ring.distributive:
        raise ScheduleError(
            f"{pre.origin}: the workspace sums over {', '.join(summed)} inside the product "
            f"with {' * '.join(str(f) for f in have)}, which moves that sum across a "
            f"multiply; under {ring.name} the multiply does not distribute over the add "
            "(docs/semantics.md: Semirings), so the result would change. Precompute the "
            f"whole product, or list {', '.join(summed)} among the workspace's variables"
        )
    return Placement(
        order[at],
        pre.vars,
        tuple(producer),
        tuple(consumer),
        tuple(produce),
        workspace,
        pre.workspace,
        pre.origin,
        sub,
        reads,
    )


def _hoisted(plan: Plan, order: tuple[str, ...], shared: set[str], at: int) -> int:
    """The outermost loop the workspace can be placed before, given the first loop ``at``
    of its own variables: the loops just outside ``at`` that neither the workspace
    expression reads nor any thread or unit runs (the consumer's alone, as ``j`` in
    ``t = L(i,j) * L(i,k) * L(j,k)`` with ``L(i,k)`` precomputed over ``k``) go inside
    it, so the workspace is filled once for all their iterations rather than once per
    iteration. The loops binding ``shared`` (the expression's variables outside the
    workspace) and the parallelized loops stay outside: a workspace enclosing a
    parallel loop would leave that loop serial."""
    while at > 0:
        loop = order[at - 1]
        if loop in plan.parallel or set(plan.binds(loop)) & shared or not plan.binds(loop):
            break
        if plan.space_of(loop) is not None:
            break
        at -= 1
    return at


def _subexpression(pre: Precompute, rhs: CExpr, workspace: Access) -> tuple[CExpr, CExpr]:
    """The node of ``rhs`` that ``pre.expr`` names (a sum placed on it included), and
    ``rhs`` reading ``workspace`` in its place. Only under ``+``, ``-`` and negation: the
    workspace is dense, so where the subexpression is absent it reads 0 (the add's
    identity under a semiring), which a sum of terms cannot tell from absent; a product
    or quotient could (``0 * inf``, ``0 / 0``)."""

    def swap(expr: CExpr) -> tuple[CExpr, CExpr] | None:
        if expr == pre.expr or (isinstance(expr, Sum) and expr.body == pre.expr):
            return expr, workspace
        match expr:
            case Neg(operand=x):
                found = swap(x)
                return found and (found[0], Neg(found[1], expr.span))  # type: ignore[arg-type]
            case BinOp(op="+" | "-", left=left, right=right):
                if found := swap(left):
                    return found[0], BinOp(expr.op, found[1], right, expr.span)  # type: ignore[arg-type]
                if found := swap(right):
                    return found[0], BinOp(expr.op, left, found[1], expr.span)  # type: ignore[arg-type]
        return None

    found = swap(rhs)
    if found is None:
        raise ScheduleError(
            f"{pre.origin}: {pre.expr} is neither some factors of the right-hand side {rhs} "
            "nor one of its terms (a subexpression under + and - only: a workspace is "
            "dense, and under a product or quotient its zeros would differ from an absent "
            "value); precompute a product's factors or a term of the sum"
        )
    return found
