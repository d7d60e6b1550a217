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

from dataclasses import replace

from ..abi import OUT_OF_MEMORY
from ..base.errors import LoweringError
from ..frontend.concrete import ZERO, CExpr, accesses, without
from ..frontend.notation import Access, BinOp, Literal, factors
from ..frontend.semirings import Semiring
from ..ir import nodes as ir
from ..middle.placement import Placement
from ..tensors.formats import Dense, LevelNames, dense_extent
from .ctx import Ctx, DenseWsSink, Nest, Sink, Where
from .env import LowerEnv
from .output import nothing_written

DENSE = Dense()
#: the C template's constant: 1 where 0 annihilates every value of the kernel's type
ZERO_ANNIHILATES = "SC_ZERO_ANNIHILATES"


def marks_needed(ring: Semiring, placed: Placement, rhs: CExpr) -> tuple[bool, bool]:
    """Whether the consumer must tell a slot the producer reached from one it did not,
    and whether only a floating type must. A product's term is absent where a factor
    is (docs/semantics.md: Sparse zeros, Semirings), but a dense workspace holds the add's
    identity there, which the multiply may not annihilate: ``0 * inf`` is NaN under
    plus_times (0 annihilates every integer), ``-inf * -1`` is +inf under max_times, an
    integral +inf (the type's limit) plus 1 wraps under min_plus, and ``pair`` and
    ``second`` do not read it at all. Only ``and`` makes false of false whatever the
    other operand. A workspace that is a term of a sum (``placed.sub``) is added, and
    one that is the whole product is stored as it is: the identity is the add's, and
    they need none."""
    if placed.sub is not None or ring.multiply == "and":
        return False, False
    if len(factors(rhs)) == len(placed.produce):
        return False, False
    return True, ring.is_default


def plan_where(env: LowerEnv, placed: Placement) -> Where:
    """The dense precompute the schedule placed (`middle.placement`), with the threads'
    workspaces allocated (and their marks, where `marks_needed`)."""
    base = env.inputs.namer.fresh(f"{placed.label}_all")
    dim = _extent(env, placed.vars)
    count = ir.mul(ir.Var(env.inputs.sig.threads), dim)
    env.found.top += [
        ir.Comment(f"{placed.origin}: a dense workspace over {', '.join(placed.vars)} per thread"),
        ir.Alloc(ir.VAL, base, count),
    ]
    needed, float_only = marks_needed(env.inputs.ring, placed, env.inputs.spec.statement.rhs)
    if not needed:
        env.found.top.append(ir.Return(OUT_OF_MEMORY, ir.Unary("!", ir.Var(base))))
        env.found.bottom.append(ir.Free(base))
        return Where(placed, base)
    marks = env.inputs.namer.fresh(f"{placed.label}_marks_all")
    missing = ir.Bin("||", ir.Unary("!", ir.Var(base)), ir.Unary("!", ir.Var(marks)))
    env.found.top += [
        ir.Comment("and a byte per slot: whether its producer reached it"),
        ir.Alloc(ir.U8, marks, count),
        ir.If(
            (
                (
                    missing,
                    ir.block(ir.Free(base), ir.Free(marks), ir.Return(OUT_OF_MEMORY, ir.IntLit(1))),
                ),
            )
        ),
    ]
    env.found.bottom += [ir.Free(base), ir.Free(marks)]
    return Where(placed, base, marks, float_only)


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
    mine = ir.mul(ir.Call("thread_id", ()), dim)
    stmts: list[ir.Stmt] = [
        ir.Comment(f"{placed.origin}"),
        ir.Pointer(ir.VAL, ws, where.base, mine),
    ]
    marks = None
    if where.marks is not None:
        marks = env.inputs.namer.fresh(f"{placed.workspace.name}_marks")
        stmts.append(ir.Pointer(ir.U8, marks, where.marks, mine))
    # the producer's loops are the workspace's own: each slot it fills it visits once, so
    # visiting them again after the consumer clears the workspace in the producer's
    # iterations (a sparse row's entries), not its whole extent; the workspaces start
    # cleared (allocated zeroed, filled with the add's identity under a semiring)
    revisit = set(placed.producer_order) == set(placed.vars)
    if not revisit:
        q = env.inputs.namer.fresh("q")
        zero = [ir.Assign(ir.Load(ws, ir.Var(q)), ir.FloatLit(0.0))]
        if marks is not None:
            zero.append(ir.Assign(ir.Load(marks, ir.Var(q)), ir.IntLit(0)))
        stmts.append(ir.For(q, ir.IntLit(0), dim, ir.block(*zero)))
    env.found.local_vals[placed.workspace.name] = ws
    fill = DenseWsSink(ws, placed.vars, marks=marks, float_only=where.float_only)
    read = (marks, placed.vars, where.float_only) if marks is not None else None
    with env.scope(in_where=True):
        stmts.append(nest(placed.producer_order, produced, ctx, fill))
        with env.scope(ws_marks=read):
            stmts.append(nest(placed.consumer_order, consumed, ctx, sink))
        if revisit:
            clear = replace(fill, reset=True)
            stmts.append(nest(placed.producer_order, produced, ctx, clear))
    return ir.block(*stmts)


def marked(env: LowerEnv, ctx: Ctx, sink: Sink, stmts: list[ir.Stmt]) -> list[ir.Stmt]:
    """A consumer's store, made where the workspace's slot was reached (its marks,
    `Flags.ws_marks`); ``stmts`` as they are elsewhere, and inside the loops of a
    nested sum that do not bind every workspace variable (its total is stored under
    the guard)."""
    found = env.flags.ws_marks
    if found is None:
        return stmts
    marks, vars_, float_only = found
    if any(v not in ctx.coords for v in vars_):
        return stmts
    nothing_written(env, sink)  # the output elements the guard skips are zeroed up front
    cond: ir.Expr = ir.Load(marks, ws_slot(env, vars_, ctx))
    if float_only:
        cond = ir.Bin("||", ir.Var(ZERO_ANNIHILATES), cond)
    return [ir.If(((cond, ir.block(*stmts)),))]


def mark(env: LowerEnv, sink: DenseWsSink, ctx: Ctx) -> list[ir.Stmt]:
    """The producer's mark of the slot it adds into (cleared with a reset)."""
    if sink.marks is None:
        return []
    store = ir.Assign(
        ir.Load(sink.marks, ws_slot(env, sink.vars, ctx)), ir.IntLit(0 if sink.reset else 1)
    )
    if sink.float_only:
        return [ir.If(((ir.Unary("!", ir.Var(ZERO_ANNIHILATES)), ir.block(store)),))]
    return [store]


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
