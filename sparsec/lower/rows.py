"""Entering a loop iteration that binds an output variable: a sparse output's level is
opened there (a row's first position, its count or its append afterwards:
`Assembler.around`), the located levels of every access are computed, and the rest of the
nest runs inside. Shared by the lowerer's loops and the schedule spaces' loops (a GPU
split over a rowwise output's rows)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ..frontend.concrete import CExpr, accesses
from ..ir import nodes as ir
from .ctx import Ctx, NestPoint, WorkspaceSink, unit
from .env import LowerEnv
from .levels import locate

#: the rest of the nest in a context; ``gather``: the output's row is scattered into the
#: workspace and gathered after (Gustavson)
Inner = Callable[[Ctx, bool], ir.Block]


def enter_output(env: LowerEnv, var: str, expr: CExpr, ctx: Ctx, inner: Inner) -> ir.Block:
    """Code for the body of one iteration that has just bound ``var``."""
    asm = env.decided.assembler
    lhs = env.inputs.lhs
    k = asm.level_of(var) if asm is not None else None
    if asm is None or k is None:
        located, ctx = locate(env, ctx, [lhs, *accesses(expr)])
        return ir.block(located, inner(ctx, False))
    if var == env.decided.workspace:
        located, ctx = locate(env, ctx, list(accesses(expr)))
        return ir.block(located, inner(ctx, False))
    slot = asm.bind(k)
    if slot is not None:
        ctx = ctx.bind(levels={(lhs, k): unit(slot)})
    known = ctx.depth(lhs)
    located, ctx = locate(env, ctx, [lhs, *accesses(expr)])
    # the dense levels above the first sparse one may be bound in any order (rowwise
    # outputs): a row starts where the last of them is located, whichever var that is
    row = asm.layout.dense_prefix - 1
    if known <= row < ctx.depth(lhs):
        k = row
    bound = ctx.levels.get((lhs, k))
    before, after = asm.around(k, bound.pos if bound else None)
    gather = bool(env.decided.workspace) and k == asm.layout.last - 1 and bound is not None
    return ir.block(located, *before, inner(ctx, gather), *after)


def split_row(env: LowerEnv, var: str, value: ir.Expr, place: NestPoint) -> ir.Block:
    """A split piece's iteration that binds a rowwise sparse output's row variable
    ``var`` to ``value`` (a GPU thread's row): the row opened, the rest of the nest inside
    (scattered into the workspace and gathered, for SpGEMM)."""
    name = env.decided.var_names[var]
    inner = place.ctx.bind({var: ir.Var(name)}, covered=var)
    return ir.block(ir.Decl(ir.I64, name, value), rest_of_nest(env, var, replace(place, ctx=inner)))


def rest_of_nest(env: LowerEnv, var: str, place: NestPoint) -> ir.Block:
    """The loops ``place.rest`` inside an iteration of a schedule space's piece that has just
    bound ``var`` in ``place.ctx``: a sparse output's level opened there (`enter_output`), and
    its row scattered into the workspace and gathered, for SpGEMM."""
    asm = env.decided.assembler

    def inner(c: Ctx, gather: bool) -> ir.Block:
        if gather and asm is not None:
            return ir.block(place.inside(c, WorkspaceSink()), *asm.gather())
        return place.inside(c)

    return enter_output(env, var, place.expr, place.ctx, inner)
