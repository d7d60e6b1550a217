"""Loops that only raise flags become a test of their range.

A sparse output's count phase keeps of a sum only whether it reached a term: SDDMM's
count walks ``for (k = 0; k < k_dim; k++) { ...; reached = 1; }`` at every stored entry
of B, a loop whose only effect is ``reached = 1`` when its range is not empty. The C
compiler deletes it at -O2 and above, at a price in compile time; here it becomes
``if (0 < k_dim) reached = 1;``, so the count function is light enough to build at -O1
(`light_count`).

A loop folds when it is serial and its body holds only comments, declarations of its own
locals (initialised without calls), and assignments of integer literals to variables
declared outside it, possibly under a test of outer names. Loops inside are folded first,
so nests of such loops fold whole."""

from __future__ import annotations

from ..ir import nodes as ir
from ..ir.visit import blocks, free_vars, map_blocks, statements, subexpressions


def fold_flag_loops(body: ir.Block) -> ir.Block:
    """``body`` with every flag-only loop replaced by a test of its range."""
    out: list[ir.Stmt] = []
    for s in body.body:
        s = map_blocks(s, fold_flag_loops)
        folded = _folded(s) if isinstance(s, ir.For) else None
        out.append(s if folded is None else folded)
    return ir.Block(tuple(out))


def _folded(loop: ir.For) -> ir.Stmt | None:
    if loop.parallel is not None:
        return None
    local = {loop.var}
    sets: list[ir.Stmt] = []
    for s in loop.body.body:
        match s:
            case ir.Comment():
                continue
            case ir.Decl(name=name, init=init):
                if init is not None and any(isinstance(e, ir.Call) for e in subexpressions(init)):
                    return None
                local.add(name)
            case _ if _raises(s, local):
                sets.append(s)
            case _:
                return None
    if not sets:
        return None
    return ir.If(((ir.Bin("<", loop.start, loop.end), ir.Block(tuple(sets))),))


def _raises(s: ir.Stmt, local: set[str]) -> bool:
    """``s`` only sets flags declared outside the loop (``local``: its own names): an
    integer literal assigned, or such sets under a test of outer names (a folded loop)."""
    match s:
        case ir.Assign(target=ir.Var(name=name), value=ir.IntLit(), op="=", atomic=False):
            return name not in local
        case ir.If(branches=branches, orelse=None):
            return all(
                not (free_vars(cond) & local)
                and not any(isinstance(e, ir.Call) for e in subexpressions(cond))
                and all(_raises(t, local) for t in block.body)
                for cond, block in branches
            )
    return False


def light_count(body: ir.Block) -> bool:
    """Whether a count function does no work worth -O3's compile time: no loop inside a
    loop that walks positions (a merge's ``while``, a workspace) and no workspace; after
    `fold_flag_loops`, SDDMM's count is one pass over B's row lengths."""
    return not any(isinstance(s, ir.While | ir.Alloc) for s in statements(body)) and (
        _depth(body) <= 2
    )


def _depth(body: ir.Block) -> int:
    deepest = 0
    for s in body.body:
        inner = max((_depth(b) for b in blocks(s)), default=0)
        deepest = max(deepest, inner + isinstance(s, ir.For | ir.While))
    return deepest
