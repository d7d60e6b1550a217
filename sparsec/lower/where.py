"""Dense precompute (TACO's ``where``): some factors of the product, or a term of a sum
(any subexpression under ``+`` and ``-``), are computed into a dense workspace over one or
more variables, per thread, and the rest of the expression reads it (a workspace over
several variables is row-major in their listed order).

`plan_where` places it (before the first loop that only the workspace expression uses)
and splits the loops inside into the producer's and the consumer's; `emit_where` emits
both loop nests through the caller's ``nest`` callback.
"""

from __future__ import annotations

from collections.abc import Callable

from ..abi import OUT_OF_MEMORY
from ..errors import LoweringError, ScheduleError
from ..frontend.concrete import ZERO, CExpr, Sum, accesses, without
from ..frontend.notation import Access, BinOp, Literal, Neg, factors
from ..ir import nodes as ir
from ..middle.plan import Precompute
from ..tensors.formats import Dense, LevelNames, dense, dense_extent
from .ctx import Ctx, DenseWsSink, Sink, Where
from .env import LowerEnv

DENSE = Dense()

#: lowers the loops ``order`` of ``expr`` into ``sink`` in ``ctx`` (`lowerer.loops`)
Nest = Callable[[tuple[str, ...], CExpr, Ctx, Sink], ir.Block]


def plan_where(env: LowerEnv, pre: Precompute, order: tuple[str, ...]) -> Where:
    """Where a dense precompute goes: before the first loop that only the workspace
    expression uses (or the workspace's own variable); the loops inside it split into
    the producer's and the consumer's. Allocates the threads' workspaces."""
    plan = env.plan
    assert plan is not None
    rhs = env.spec.statement.rhs
    name = f"{pre.workspace}_ws"
    while name in env.formats:
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
    rvars |= set(env.lhs.indices)
    for var in pre.vars:
        if var not in evars:
            raise ScheduleError(f"{pre.origin}: {var} is not an index of {pre.expr}")
    own = (evars - rvars) | set(pre.vars)
    at = next(n for n, loop in enumerate(order) if set(plan.binds(loop)) & own)
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
    env.formats[name] = dense(len(pre.vars))
    base = env.namer.fresh(f"{pre.workspace}_all")
    dim = _extent(env, pre.vars)
    env.top += [
        ir.Comment(f"{pre.origin}: a dense workspace over {', '.join(pre.vars)} per thread"),
        ir.Alloc(ir.VAL, base, ir.mul(ir.Var(env.sig.threads), dim)),
        ir.Return(OUT_OF_MEMORY, ir.Unary("!", ir.Var(base))),
    ]
    env.bottom.append(ir.Free(base))
    return Where(
        order[at],
        pre.vars,
        tuple(producer),
        tuple(consumer),
        tuple(produce),
        workspace,
        base,
        pre.origin,
        sub,
        reads,
    )


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


def emit_where(env: LowerEnv, expr: CExpr, ctx: Ctx, sink: Sink, nest: Nest) -> ir.Block:
    """This thread's workspace zeroed, the producer's loops adding into it, then the
    consumer's loops reading it in place of the produced factors."""
    where = env.where
    assert where is not None
    if where.sub is not None:
        produced, consumed = _split(env, where, expr)
    else:
        rest = list(factors(expr))
        for f in where.produce:
            if f not in rest:
                raise LoweringError(f"internal: {f} missing from {expr} at the precompute")
            rest.remove(f)
        produced, consumed = _product(where.produce), _product([where.workspace, *rest])
    if produced is ZERO:  # absent at this point of the loops above: no workspace to fill
        return nest(where.consumer_order, consumed, ctx, sink)
    dim = _extent(env, where.vars)
    ws = env.namer.fresh(where.workspace.name)
    q = env.namer.fresh("q")
    zero = ir.Assign(ir.Load(ws, ir.Var(q)), ir.FloatLit(0.0))
    stmts: list[ir.Stmt] = [
        ir.Comment(f"{where.origin}"),
        ir.Pointer(ir.VAL, ws, where.base, ir.mul(ir.Call("thread_id", ()), dim)),
        ir.For(q, ir.IntLit(0), dim, ir.block(zero)),
    ]
    env.local_vals[where.workspace.name] = ws
    with env.scope(in_where=True):
        stmts.append(nest(where.producer_order, produced, ctx, DenseWsSink(ws, where.vars)))
        stmts.append(nest(where.consumer_order, consumed, ctx, sink))
    return ir.block(*stmts)


def _split(env: LowerEnv, where: Where, expr: CExpr) -> tuple[CExpr, CExpr]:
    """A precomputed subexpression's producer and consumer at the loop it is placed at,
    where ``expr`` is the statement's right-hand side less the accesses that the loops
    above found absent: both are taken from the statement without the same accesses
    (a subexpression absent altogether leaves the workspace absent too)."""
    assert where.sub is not None and where.consumer is not None
    rhs = env.spec.statement.rhs
    present = set(accesses(expr))
    absent = frozenset(a for a in accesses(rhs) if a not in present)
    fold = not env.exact
    if without(rhs, absent, fold, fold) != expr:
        raise LoweringError(f"internal: {expr} is not {rhs} at the precompute")
    produced = without(where.sub, absent, fold, fold)
    gone = absent | {where.workspace} if produced is ZERO else absent
    return produced, without(where.consumer, gone, fold, fold)


def _extent(env: LowerEnv, vars_: tuple[str, ...]) -> ir.Expr:
    """The entries of one thread's workspace over ``vars_``: the product of their extents."""
    return dense_extent(ir.Var(env.sig.dim(v)) for v in vars_)


def ws_slot(env: LowerEnv, vars_: tuple[str, ...], ctx: Ctx) -> ir.Expr:
    """The entry of the workspace over ``vars_`` at their bound coordinates: its dense
    levels located row-major (``p_k = p_{k-1} * N_k + i_k``)."""
    slot: ir.Expr | None = None
    for v in vars_:
        at = LevelNames(ir.Var(env.sig.dim(v)))
        slot = DENSE.locate_position(slot, ctx.coords[v], at)
    assert slot is not None
    return slot


def _product(parts: list[Access | Literal] | tuple[Access | Literal, ...]) -> CExpr:
    expr: CExpr = parts[0]
    for p in parts[1:]:
        expr = BinOp("*", expr, p, (0, 0))  # type: ignore[arg-type]
    return expr
