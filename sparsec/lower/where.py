"""Dense precompute (TACO's ``where``): some factors of the product are computed into a
dense workspace over one or more variables, per thread, and the rest of the product reads
it (a workspace over several variables is row-major in their listed order).

`plan_where` places it (before the first loop that only the workspace expression uses)
and splits the loops inside into the producer's and the consumer's; `emit_where` emits
both loop nests through the caller's ``nest`` callback.
"""

from __future__ import annotations

from collections.abc import Callable

from ..abi import OUT_OF_MEMORY
from ..errors import LoweringError, ScheduleError
from ..frontend.concrete import CExpr
from ..frontend.notation import Access, BinOp, Literal, factors
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
    have = factors(rhs)
    if not have:
        raise ScheduleError(
            f"{pre.origin}: the right-hand side {rhs} is not a product; precompute takes "
            "some of its factors"
        )
    produce: list[Access | Literal] = []
    for f in factors(pre.expr):
        match = next((g for g in have if g == f), None)
        if match is None:
            raise ScheduleError(f"{pre.origin}: {f} is not a factor of the right-hand side {rhs}")
        have.remove(match)
        produce.append(match)
    evars = {i for f in produce if isinstance(f, Access) for i in f.indices}
    rvars = {i for f in have if isinstance(f, Access) for i in f.indices}
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
    name = f"{pre.workspace}_ws"
    while name in env.formats:
        name += "_"
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
        Access(name, pre.vars),
        base,
        pre.origin,
    )


def emit_where(env: LowerEnv, expr: CExpr, ctx: Ctx, sink: Sink, nest: Nest) -> ir.Block:
    """This thread's workspace zeroed, the producer's loops adding into it, then the
    consumer's loops reading it in place of the produced factors."""
    where = env.where
    assert where is not None
    rest = list(factors(expr))
    for f in where.produce:
        if f not in rest:
            raise LoweringError(f"internal: {f} missing from {expr} at the precompute")
        rest.remove(f)
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
        produced = _product(where.produce)
        stmts.append(nest(where.producer_order, produced, ctx, DenseWsSink(ws, where.vars)))
        consumed = _product([where.workspace, *rest])
        stmts.append(nest(where.consumer_order, consumed, ctx, sink))
    return ir.block(*stmts)


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
