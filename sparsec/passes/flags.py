"""A sparse output's count phase, simplified before the C compiler sees it.

A count keeps of a sum only whether it reached a term: SDDMM's count walked ``for (k = 0;
k < k_dim; k++) { ...; reached = 1; }`` at every stored entry of B, a loop whose only
effect is ``reached = 1`` when its range is not empty (`fold_flag_loops` makes it
``if (0 < k_dim) reached = 1;``), and then counted B's row one entry at a time under that
invariant flag (`count_in_closed_form` adds the row's length at once). GCC finds both only
at -O3, at a price in compile time; simplified here, the count is light (`light_count`)
and is built at -O1 (``SC_LIGHT_OPT``): SDDMM compiles faster and its count runs as fast
as before. The closed form alone, at -O3, compiled slower (GCC vectorizes the simpler
loop), so the two go together (docs/decisions.md, "A light count phase").

A loop folds when it is serial and its body holds only comments, declarations of its own
locals (initialised without calls), and assignments of integer literals to variables
declared outside it, possibly under a test of outer names. Loops inside are folded first,
so nests of such loops fold whole."""

from __future__ import annotations

from collections.abc import Callable

from ..ir import nodes as ir
from ..ir.visit import blocks, free_vars, map_blocks, statements, subexpressions, substitute


def fold_flag_loops(body: ir.Block) -> ir.Block:
    """``body`` with every flag-only loop replaced by a test of its range."""
    return _loops_replaced(body, _folded)


def _loops_replaced(body: ir.Block, replace: Callable[[ir.For], ir.Stmt | None]) -> ir.Block:
    """``body`` with each loop (inner ones first) replaced where ``replace`` gives a
    statement for it."""
    out: list[ir.Stmt] = []
    for s in body.body:
        s = map_blocks(s, lambda b: _loops_replaced(b, replace))
        found = replace(s) if isinstance(s, ir.For) else None
        out.append(s if found is None else found)
    return ir.Block(tuple(out))


def _folded(loop: ir.For) -> ir.Stmt | None:
    parts = _parts(loop)
    if parts is None:
        return None
    local, _, rest = parts
    if not rest or not all(_raises(s, local) for s in rest):
        return None
    return ir.If(((ir.Bin("<", loop.start, loop.end), ir.Block(tuple(rest))),))


def _parts(loop: ir.For) -> tuple[set[str], dict[str, ir.Expr | None], list[ir.Stmt]] | None:
    """A serial loop's own names (its variable and its locals), its locals' initial values
    and its other statements (comments left out); None for a parallel loop or a local
    initialised by a call."""
    if loop.parallel is not None:
        return None
    inits: dict[str, ir.Expr | None] = {}
    rest: list[ir.Stmt] = []
    for s in loop.body.body:
        match s:
            case ir.Comment():
                continue
            case ir.Decl(name=name, init=init):
                if init is not None and _calls(init):
                    return None
                inits[name] = init
            case _:
                rest.append(s)
    return {loop.var, *inits}, inits, rest


def _raises(s: ir.Stmt, local: set[str]) -> bool:
    """``s`` only sets flags declared outside the loop (``local``: its own names): an
    integer literal assigned, or such sets under a test of outer names (a folded loop)."""
    match s:
        case ir.Assign(target=ir.Var(name=name), value=ir.IntLit(), op="=", atomic=False):
            return name not in local
        case ir.If(branches=branches, orelse=None):
            return all(
                not (free_vars(cond) & local)
                and not _calls(cond)
                and all(_raises(t, local) for t in block.body)
                for cond, block in branches
            )
    return False


def count_in_closed_form(body: ir.Block) -> ir.Block:
    """``body`` with every loop that only counts its iterations under a condition that
    does not change in it (``if (c) n = n + 1``, ``c`` perhaps through a flag the loop sets
    from an invariant test) replaced by ``if (c && start < end) n = n + (end - start)``:
    after `fold_flag_loops`, SDDMM's count of a row is its length in B when k has a term,
    with no walk over the row (GCC finds this form only at -O3, by unswitching)."""
    return _loops_replaced(body, _counted)


def _counted(loop: ir.For) -> ir.Stmt | None:
    parts = _parts(loop)
    if parts is None:
        return None
    local, inits, rest = parts
    # a local flag: the invariant test it holds (0 until a test raises it)
    flags: dict[str, ir.Expr] = {n: ir.IntLit(0) for n, v in inits.items() if v == ir.IntLit(0)}
    counter: tuple[str, ir.Expr] | None = None

    def invariant(e: ir.Expr) -> bool:
        return not (free_vars(e) & local) and not _calls(e)

    for s in rest:
        match s:
            case ir.If(branches=((cond, ir.Block(body=(only,))),), orelse=None):
                match only:
                    case ir.Assign(target=ir.Var(name=f), value=ir.IntLit(value=1), op="="):
                        if flags.get(f) != ir.IntLit(0) or not invariant(cond):
                            return None
                        flags[f] = cond
                    case ir.Assign(
                        target=ir.Var(name=n), value=ir.Bin("+", ir.Var(name=m), ir.IntLit(1))
                    ) if n == m and n not in local and counter is None:
                        test = substitute(cond, flags)
                        if not invariant(test):
                            return None
                        counter = (n, test)
                    case _:
                        return None
            case _:
                return None
    if counter is None:
        return None
    n, test = counter
    added = ir.Bin("+", ir.Var(n), ir.Bin("-", loop.end, loop.start))
    guard = ir.conj(test, ir.Bin("<", loop.start, loop.end))
    return ir.If(((guard, ir.Block((ir.Assign(ir.Var(n), added),))),))


def _calls(e: ir.Expr) -> bool:
    return any(isinstance(x, ir.Call) for x in subexpressions(e))


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
