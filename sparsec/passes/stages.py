"""Register-tile stages a build compiles: those the call's extent needs, or all of them.

A tiled region (`tile`) covers its columns in stages: whole tiles of `VECTORS` vectors,
then at most one tile of each narrower width down to `NARROWEST` vectors, then the columns
left (fewer than `NARROWEST` vectors) through the original nest. Which stages run depends
on the extent alone: at 512 float64 columns on 8-lane vectors only whole tiles, at MTTKRP's
rank 32 only the tile of 4 vectors, at both no columns left. Every stage is a copy of the
region that the C compiler optimises on its own, and the stages that never run cost most
of a tiled kernel's compile: the unused ones of SpMM at 512 columns and of MTTKRP at rank
32 took much of cc1's time (docs/decisions.md, "A tiled kernel is built with the
register-tile stages").

So each stage is guarded by a compile-time constant. A stage is a bit: whole tiles
`VECTORS`, a narrower tile its vectors, the columns left 1 (`REMAINDER`). The template
defines, per extent parameter ``p`` whose regions are guarded, ``SC_STAGES_p``: the stages
``SC_HINT_p`` needs (the extent the build was made for, `sparsec.abi.stage_hints`), or all
of them when the build names no extent. The compiler drops a guarded stage whose bit is
off before it optimises anything. The template's ``SC_STAGES_NEED`` computes the bits from the vectors'
lanes as the compiler sees them, so no fact of the host enters.

Each guarded function first checks its extent: one that needs a stage not built returns
STAGES_MISSING before writing anything, and `Kernel` builds the kernel with all stages and
runs the call again. Only extents that are parameters are guarded (the check runs at the
function's entry); a region whose extent is computed in the function keeps every stage.
"""

from __future__ import annotations

from ..abi import STAGES_MISSING
from ..ir import nodes as ir
from ..ir.visit import map_blocks, map_children, statements, subexpressions

#: the columns left after the narrowest tile, as a stage bit
REMAINDER = 1
#: the template's per-extent macro of the stages built (the extent they were built for is
#: ``SC_HINT_``'s, `sparsec.abi.stage_hints`)
STAGES_PREFIX = "SC_STAGES_"


def guard(end: ir.Expr, bit: int, stmt: ir.Stmt) -> ir.Stmt:
    """``stmt`` (a stage of a region over ``[0, end)``) run only when built with ``bit``;
    itself where ``end`` is no variable."""
    if not isinstance(end, ir.Var):
        return stmt
    return ir.If(((built(end, bit), ir.Block((stmt,))),))


def built(end: ir.Expr, bit: int) -> ir.Expr:
    """Whether the stage ``bit`` of regions over ``[0, end)`` is built (a constant)."""
    if not isinstance(end, ir.Var):
        return ir.IntLit(1)
    return ir.Call("stage", (ir.Var(STAGES_PREFIX + end.name), ir.IntLit(bit)))


def checked(body: ir.Block) -> ir.Block:
    """``body`` with an entry check per extent its stages are guarded by, where that
    extent is a parameter; a guard on a variable the function declares is made true."""
    extents = _guarded(body)
    if not extents:
        return body
    declared = {s.name for s in statements(body) if isinstance(s, ir.Decl)}
    declared |= {s.var for s in statements(body) if isinstance(s, ir.For)}
    local = extents & declared
    if local:
        body = _unguard(body, local)
    checks = tuple(
        ir.Return(STAGES_MISSING, ir.Call("stages_missing", (ir.Var(p), ir.Var(STAGES_PREFIX + p))))
        for p in sorted(extents - declared)
    )
    return ir.Block((*checks, *body.body))


def guarded_extents(*bodies: ir.Block) -> tuple[str, ...]:
    """The extent parameters whose stages ``bodies`` guard (the template defines their
    ``SC_STAGES_`` and ``SC_HINT_``)."""
    found: set[str] = set()
    for body in bodies:
        found |= _guarded(body)
    return tuple(sorted(found))


def _guarded(body: ir.Block) -> set[str]:
    """The extents of the stage guards in ``body`` (guards are only ever conditions of an
    ``if``: `guard`, `built`)."""
    found = set()
    for s in statements(body):
        if isinstance(s, ir.If):
            for cond, _ in s.branches:
                for e in subexpressions(cond):
                    if isinstance(e, ir.Call) and e.fn == "stage":
                        macro = e.args[0]
                        assert isinstance(macro, ir.Var)
                        found.add(macro.name.removeprefix(STAGES_PREFIX))
    return found


def _unguard(body: ir.Block, local: set[str]) -> ir.Block:
    """``body`` with the guards on the extents ``local`` replaced by 1 (every stage)."""

    def expr(e: ir.Expr) -> ir.Expr:
        if isinstance(e, ir.Call) and e.fn == "stage":
            macro = e.args[0]
            if isinstance(macro, ir.Var) and macro.name.removeprefix(STAGES_PREFIX) in local:
                return ir.IntLit(1)
        return map_children(e, expr)

    def stmt(s: ir.Stmt) -> ir.Stmt:
        if isinstance(s, ir.If):
            s = ir.If(tuple((expr(c), b) for c, b in s.branches), s.orelse)
        return map_blocks(s, block)

    def block(b: ir.Block) -> ir.Block:
        return ir.Block(tuple(stmt(s) for s in b.body))

    return block(body)
