"""Dense precompute (TACO's ``where``): some factors of the product, or a term of a sum
(any subexpression under ``+`` and ``-``), are computed into a dense workspace over one or
more variables, per thread, and the rest of the expression reads it (a workspace over
several variables is row-major in their listed order).

`middle.placement` places it (before the first loop that only the workspace expression
uses) and splits the loops inside into the producer's and the consumer's; `plan_where`
allocates the threads' workspaces there, and `emit_where` emits both loop nests through
the caller's ``nest`` callback.
"""

from __future__ import annotations

from ..abi import OUT_OF_MEMORY
from ..base.errors import LoweringError
from ..frontend.concrete import ZERO, CExpr, accesses, without
from ..frontend.notation import Access, BinOp, Literal, factors
from ..ir import nodes as ir
from ..middle.placement import Placement
from ..tensors.formats import Dense, LevelNames, dense_extent
from .ctx import Ctx, DenseWsSink, Nest, Sink, Where
from .env import LowerEnv

DENSE = Dense()


def plan_where(env: LowerEnv, placed: Placement) -> Where:
    """The dense precompute the schedule placed (`middle.placement`), with the threads'
    workspaces allocated."""
    base = env.inputs.namer.fresh(f"{placed.label}_all")
    dim = _extent(env, placed.vars)
    env.found.top += [
        ir.Comment(f"{placed.origin}: a dense workspace over {', '.join(placed.vars)} per thread"),
        ir.Alloc(ir.VAL, base, ir.mul(ir.Var(env.inputs.sig.threads), dim)),
        ir.Return(OUT_OF_MEMORY, ir.Unary("!", ir.Var(base))),
    ]
    env.found.bottom.append(ir.Free(base))
    return Where(placed, base)


def emit_where(env: LowerEnv, expr: CExpr, ctx: Ctx, sink: Sink, nest: Nest) -> ir.Block:
    """This thread's workspace zeroed, the producer's loops adding into it, then the
    consumer's loops reading it in place of the produced factors."""
    where = env.decided.where
    assert where is not None
    placed = where.placed
    if placed.sub is not None:
        produced, consumed = _split(env, placed, expr)
    else:
        rest = list(factors(expr))
        for f in placed.produce:
            if f not in rest:
                raise LoweringError(f"internal: {f} missing from {expr} at the precompute")
            rest.remove(f)
        produced, consumed = _product(placed.produce), _product([placed.workspace, *rest])
    if produced is ZERO:  # absent at this point of the loops above: no workspace to fill
        return nest(placed.consumer_order, consumed, ctx, sink)
    dim = _extent(env, placed.vars)
    ws = env.inputs.namer.fresh(placed.workspace.name)
    q = env.inputs.namer.fresh("q")
    zero = ir.Assign(ir.Load(ws, ir.Var(q)), ir.FloatLit(0.0))
    stmts: list[ir.Stmt] = [
        ir.Comment(f"{placed.origin}"),
        ir.Pointer(ir.VAL, ws, where.base, ir.mul(ir.Call("thread_id", ()), dim)),
        ir.For(q, ir.IntLit(0), dim, ir.block(zero)),
    ]
    env.found.local_vals[placed.workspace.name] = ws
    with env.scope(in_where=True):
        stmts.append(nest(placed.producer_order, produced, ctx, DenseWsSink(ws, placed.vars)))
        stmts.append(nest(placed.consumer_order, consumed, ctx, sink))
    return ir.block(*stmts)


def _split(env: LowerEnv, placed: Placement, expr: CExpr) -> tuple[CExpr, CExpr]:
    """A precomputed subexpression's producer and consumer at the loop it is placed at,
    where ``expr`` is the statement's right-hand side less the accesses that the loops
    above found absent: both are taken from the statement without the same accesses
    (a subexpression absent altogether leaves the workspace absent too)."""
    assert placed.sub is not None and placed.consumer is not None
    rhs = env.inputs.spec.statement.rhs
    present = set(accesses(expr))
    absent = frozenset(a for a in accesses(rhs) if a not in present)
    fold = not env.inputs.exact
    if without(rhs, absent, fold, fold) != expr:
        raise LoweringError(f"internal: {expr} is not {rhs} at the precompute")
    produced = without(placed.sub, absent, fold, fold)
    gone = absent | {placed.workspace} if produced is ZERO else absent
    return produced, without(placed.consumer, gone, fold, fold)


def _extent(env: LowerEnv, vars_: tuple[str, ...]) -> ir.Expr:
    """The entries of one thread's workspace over ``vars_``: the product of their extents."""
    return dense_extent(env.inputs.sig.extent(v) for v in vars_)


def ws_slot(env: LowerEnv, vars_: tuple[str, ...], ctx: Ctx) -> ir.Expr:
    """The entry of the workspace over ``vars_`` at their bound coordinates: its dense
    levels located row-major (``p_k = p_{k-1} * N_k + i_k``)."""
    slot: ir.Expr | None = None
    for v in vars_:
        at = LevelNames(env.inputs.sig.extent(v))
        slot = DENSE.locate_position(slot, ctx.coords[v], at)
    assert slot is not None
    return slot


def _product(parts: list[Access | Literal] | tuple[Access | Literal, ...]) -> CExpr:
    expr: CExpr = parts[0]
    for p in parts[1:]:
        expr = BinOp("*", expr, p, (0, 0))  # type: ignore[arg-type]
    return expr
