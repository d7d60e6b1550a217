"""The level functions of `tensors.formats` applied to one access of the statement: its
iterators at an index variable, coordinate access, and locating its dense levels."""

from __future__ import annotations

from ..base.errors import LoweringError
from ..frontend.notation import Access
from ..ir import nodes as ir
from ..middle.lattice import Iterator
from ..middle.order import level_indices
from ..tensors.formats import LevelFormat, LevelNames
from .ctx import Ctx, unit
from .env import LowerEnv


def level(env: LowerEnv, access: Access, k: int) -> LevelFormat:
    return env.inputs.formats[access.name].levels[k]


def names(env: LowerEnv, access: Access, k: int) -> LevelNames:
    """The kernel's names for level ``k`` of ``access`` (only the arrays it stores)."""
    fmt = env.inputs.formats[access.name]
    arrays = fmt.levels[k].arrays
    t = access.name
    return LevelNames(
        env.inputs.sig.extent(level_indices(access, fmt)[k]),
        env.inputs.sig.array(t, "pos", k) if "pos" in arrays else "",
        env.inputs.sig.array(t, "crd", k) if "crd" in arrays else "",
    )


def iterator(env: LowerEnv, access: Access, var: str, ctx: Ctx) -> Iterator | None:
    """The iterator of ``access`` at ``var``: its level holding ``var``, when that level
    iterates positions (a dense level is located instead)."""
    levels = level_indices(access, env.inputs.formats[access.name])
    if var not in levels:
        return None
    k = levels.index(var)
    if not level(env, access, k).position_iteration:
        return None
    if ctx.depth(access) != k:
        raise LoweringError(f"internal: level {k + 1} of {access} iterated before its parent")
    return Iterator(access, k)


def crd(env: LowerEnv, it: Iterator, pos: ir.Expr) -> ir.Expr:
    """The coordinate of iterator ``it`` at position ``pos``."""
    k = it.level
    return level(env, it.access, k).coordinate(pos, names(env, it.access, k), k == 0)


def unique(env: LowerEnv, it: Iterator) -> bool:
    return level(env, it.access, it.level).unique


def locate(env: LowerEnv, ctx: Ctx, accs: list[Access]) -> tuple[ir.Block, Ctx]:
    """Compute positions of locatable levels whose coordinate and parent are known."""
    decls: list[ir.Stmt] = []
    for access in dict.fromkeys(accs):
        fmt = env.inputs.formats[access.name]
        levels = level_indices(access, fmt)
        k = ctx.depth(access)
        while k < len(levels) and fmt.levels[k].locate and levels[k] in ctx.coords:
            parent = ctx.levels[(access, k - 1)].pos if k > 0 else None
            coord = ctx.coords[levels[k]]
            pos = fmt.levels[k].locate_position(parent, coord, names(env, access, k))
            p = env.inputs.namer.fresh(f"p{access.name}{k + 1}")
            decls.append(ir.Decl(ir.I64, p, pos))
            ctx = ctx.bind(levels={(access, k): unit(ir.Var(p))})
            k += 1
    return ir.block(*decls), ctx
