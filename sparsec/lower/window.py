"""Split merges on the GPU: a loop over a variable where several sparse operands meet
(``a(i) = b(i) + c(i)``), or a sparse one in a sum with a dense one, split into pieces of
coordinates.

The split's outer pieces are plain ranges, so they map to GPU blocks and threads; the
piece that completes the split binds a window of coordinates ``[lo, hi)`` and co-iterates
the operands there (`coiterate` with a window), each iterator starting at its first
position in the window, found by a binary search of its sorted coordinates, instead of
walking from the start of its level. A serial completing piece is one walk over its
window (a thread's chunk of coordinates); a parallel one is a window of one coordinate
per iteration.

Only on the CUDA target: on the C target a merge runs as one serial walk, and a split of
it is refused (`spaces.scheduled_expr`), as before.
"""

from __future__ import annotations

from dataclasses import replace

from ..frontend.concrete import CExpr
from ..ir import nodes as ir
from ..middle.lattice import Lattice, UnionLattice, build
from ..middle.plan import Space
from .coiterate import Walk, coiterate
from .ctx import Ctx, NestPoint
from .env import LowerEnv
from .levels import iterator
from .rows import rest_of_nest


def merge_at(env: LowerEnv, space: Space, expr: CExpr, ctx: Ctx) -> Lattice | None:
    """The lattice at a dense space's variable when the GPU loop that completes its split
    must co-iterate sparse operands (a merge, or a sparse operand in a sum with a dense
    one), else None (a plain range, or a single operand's positions: ``pos`` applies)."""
    if not env.inputs.gpu or space.kind != "dense" or len(space.vars) != 1:
        return None
    (var,) = space.vars
    lattice = build(expr, lambda a: iterator(env, a, var, ctx), env.inputs.exact)
    if isinstance(lattice, UnionLattice) or not lattice.points:
        return None
    if not lattice.iterators or lattice.position_loop:
        return None
    return lattice


def window_merge(
    env: LowerEnv, space: Space, lattice: Lattice, window: tuple[ir.Expr, ir.Expr], place: NestPoint
) -> ir.Block:
    """The co-iteration of ``lattice`` over the coordinates ``window`` of the space's
    variable in ``place.ctx``, the rest of the nest in each case (``place.expr``: unread, each
    case has its own)."""
    (var,) = space.vars

    def body(expr: CExpr, inner: Ctx) -> ir.Block:
        return rest_of_nest(env, var, replace(place, expr=expr, ctx=inner))

    return coiterate(env, lattice, Walk(var, place.ctx, place.sink, body), window=window)
