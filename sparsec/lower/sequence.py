"""Sums under ``+``/``-`` lowered as a sequence (TACO's ``where`` over a ``seq``).

``Y(i,j) = A(i,k)*B(k,j) + D(i,j)`` keeps its sum over ``k`` nested under ``+``
(`frontend.concrete`), and a nested sum runs inside the output's loops: ``k`` innermost,
which B in CSR (``k`` before ``j``) rules out. When the fused nest has no legal order, the
statement is lowered as

    where(Y(i,j) = w(j), seq(w(j) = D(i,j), w(j) += A(i,k)*B(k,j)))

with the output row itself as the workspace: inside the loops over the free indices every
term visits first, in the same order (``i`` here; the *shared loops*), the output is
initialised from the terms without a sum, then each contraction adds into it in its own
loop order, co-iterating its own operands' levels (``for k in A(i,:): for j in B(k,:)``).
Each iteration of the shared loops owns its slice of the output, so the outermost one
runs on threads without races, and the slice stays in cache between the steps.

The schedule (`middle.schedule`) decides whether a statement is lowered so (the fused nest
found no order) and which loops are shared; `emit_sequence` emits the steps where the
shared loops have bound their variables (`lowerer.loops` calls it there). A sparse output
(csr-like) takes the sequence per row through a dense workspace over its last level.
"""

from __future__ import annotations

from ..frontend.concrete import CExpr, Sum
from ..ir import nodes as ir
from ..middle.steps import split_terms, step_order
from .ctx import Ctx, Nest, Sink
from .env import LowerEnv


def emit_sequence(env: LowerEnv, expr: CExpr, ctx: Ctx, sink: Sink, nest: Nest) -> ir.Block:
    """The steps of ``expr`` (the right-hand side at this point of the shared loops)
    into ``sink``, the output: the initialisation, then each contraction, each adding
    into the output (zeroed before) in its own loop order inside the bound loops."""
    steps = split_terms(expr)
    bound = tuple(ctx.coords)
    free = tuple(i for i in env.inputs.lhs.indices if i not in ctx.coords)
    parts: list[CExpr] = [] if steps.init is None else [steps.init]
    parts += steps.contractions
    stmts: list[ir.Stmt] = []
    with env.scope(in_sequence=True):
        for part in parts:
            order = step_order(env.inputs.spec, free, part, bound)
            body = part.body if isinstance(part, Sum) else part
            stmts.append(ir.Comment(f"{env.inputs.lhs.name} += {part}"))
            stmts.append(nest(order, body, ctx, sink))
    return ir.block(*stmts)
