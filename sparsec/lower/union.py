"""Flagged unions: a sum of many sparse operands co-iterated in code linear in their number.

The merge lattice of ``A1 + ... + An`` at an index has ``2^n - 1`` points, and TACO's
co-iteration (`coiterate`) prints a while loop per point with a case per sub-point. For a
`UnionLattice` (a tree of ``+``/``-`` whose terms each need at most one iterator, see
`middle.lattice.union_lattice`) this module prints one loop instead::

    while any iterator has positions left:
        i = min over the live iterators of their coordinate
        here_t = iterator t sits at i                 (one flag per iterator)
        body once: a term whose iterator is absent reads as 0, the identity of +
        advance the iterators that sit at i

(a dense ``for`` over the range, with ``here_t = p_t < end_t && crd[p_t] == i``, when some
term needs no iterator). The body is lowered once, for the whole expression, with every
iterator's level bound (`Present`); its value loads of an iterator's last level become
``here_t ? term : 0`` (the guard is hoisted through ``*``, ``/`` and negation, so an absent
term is never evaluated: ``0 * inf`` is not computed where the lattice would skip the term).
Below an absent iterator the child levels' ranges are empty (`coiterate.iterator_state`), so
nested sparse levels (CSF) run the same union level by level. A sparse output gets an entry
at each visited coordinate, which is where some term is present: the OR of the terms'
presence, as the lattice's cases give it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ..frontend.concrete import CExpr, accesses
from ..frontend.notation import Access
from ..frontend.semirings import Semiring
from ..ir import nodes as ir
from ..ir.visit import blocks, map_blocks, map_children
from ..middle.lattice import Iterator, UnionLattice, build
from ..middle.order import level_indices
from .coiterate import IterState, Present, Walk, capacity_checked, coiterate, segment
from .coiterate import iterator_state as state_of
from .ctx import Ctx, Position
from .env import LowerEnv
from .levels import crd, iterator, unique
from .parallel import loop_setup
from .races import Loop

#: (vals array, position variable) -> the flag under which that load is present
Guards = dict[tuple[str, str], str]


def flagged_union(
    env: LowerEnv, lattice: UnionLattice, walk: Walk, rest: tuple[str, ...], expr: CExpr
) -> ir.Block:
    """The loop of ``walk`` for ``lattice`` (of ``expr``, the loops ``rest`` inside):
    flagged when `_flags_fit`, else the lattice built point by point and co-iterated as
    usual."""
    var, ctx, sink = walk.var, walk.ctx, walk.sink
    if not _flags_fit(env, var, rest, lattice, expr, ctx):
        full = build(expr, lambda a: iterator(env, a, var, ctx), env.inputs.exact, flagged=False)
        return coiterate(env, full, walk)
    its = lattice.iterators
    name = env.decided.var_names[var]
    merged = ", ".join(sorted({str(it.access) for it in its}))
    loop_setup(env, Loop(var, frozenset({var}), sink, f"it co-iterates {merged}", ir.IntLit(0)))
    state = {it: state_of(env, it, ctx) for it in its}
    init = [ir.Decl(ir.I64, s.pos, s.lo) for s in state.values()]
    init += [ir.Decl(ir.I64, s.end, s.hi) for s in state.values()]
    levels: dict[tuple[Access, int], Position] = {
        (it.access, it.level): Present(ir.Var(s.pos), s.advance, ir.Var(s.here))
        for it, s in state.items()
    }
    inner = ctx.bind({var: ir.Var(name)}, levels)

    def case() -> list[ir.Stmt]:
        return [*_guarded(env, state, walk.body(expr, inner)).body, *_advance(env, state)]

    if lattice.full:
        flags: list[ir.Stmt] = []
        for it, s in state.items():
            at = ir.conj(
                ir.Bin("<", ir.Var(s.pos), ir.Var(s.end)),
                ir.Bin("==", crd(env, it, ir.Var(s.pos)), ir.Var(name)),
            )
            flags += [ir.Decl(ir.BOOL, s.here, at), *segment(env, it, s, ir.Var(name))]
        loop = ir.For(name, ir.IntLit(0), env.inputs.sig.extent(var), ir.block(*flags, *case()))
        return ir.block(*init, loop)
    # each step advances an iterator and appends at most one entry
    room: ir.Expr = ir.IntLit(0)
    for s in state.values():
        room = ir.add(room, ir.Bin("-", ir.Var(s.end), ir.Var(s.pos)))
    with capacity_checked(env, var, room) as check:
        step = ir.block(*_merge_step(env, var, state), *case())
    live = [ir.Bin("<", ir.Var(s.pos), ir.Var(s.end)) for s in state.values()]
    cond = live[0]
    for more in live[1:]:
        cond = ir.Bin("||", cond, more)
    return ir.block(*init, *check, ir.While(cond, step))


def _flags_fit(
    env: LowerEnv,
    var: str,
    rest: tuple[str, ...],
    lattice: UnionLattice,
    expr: CExpr,
    ctx: Ctx,
) -> bool:
    """Whether the flags compute what the lattice would, here: plain arithmetic (no other
    semiring, no mask), no galloping asked for, and below each iterator only iterated
    levels, bound by exactly the loops still to come (so an absent iterator leaves empty
    ranges, never a located position to read, and every loop below sees its term as
    absent, not as present everywhere); and no access in ``expr`` absent from an
    enclosing union without being one of these iterators."""
    semantics = env.inputs.spec.semantics
    if semantics.mask:
        return False
    if env.decided.plan is not None and env.decided.plan.mergeby.get(var) == "Gallop":
        return False  # the lattice's co-iteration says why galloping cannot merge a union
    for it in lattice.iterators:
        fmt = env.inputs.formats[it.access.name]
        below = range(it.level + 1, len(fmt.levels))
        if not all(fmt.levels[k].position_iteration for k in below):
            return False
        if level_indices(it.access, fmt)[it.level + 1 :] != rest:
            return False
    flagged = {it.access for it in lattice.iterators}
    for (access, _), bound in ctx.levels.items():
        if isinstance(bound, Present) and access not in flagged and access in accesses(expr):
            return False
    return True


def _merge_step(env: LowerEnv, var: str, state: dict[Iterator, IterState]) -> list[ir.Stmt]:
    """The coordinate of this step (the least live coordinate; an exhausted iterator reads
    as the extent, past every coordinate) and each iterator's flag."""
    name = env.decided.var_names[var]
    extent = env.inputs.sig.extent(var)
    stmts: list[ir.Stmt] = []
    least: ir.Expr | None = None
    for it, s in state.items():
        pos = ir.Var(s.pos)
        at = ir.Select(ir.Bin("<", pos, ir.Var(s.end)), crd(env, it, pos), extent)
        stmts.append(ir.Decl(ir.I64, s.coord, at))
        least = ir.Var(s.coord) if least is None else ir.Call("min", (least, ir.Var(s.coord)))
    assert least is not None
    stmts.append(ir.Decl(ir.I64, name, least))
    for it, s in state.items():
        stmts.append(ir.Decl(ir.BOOL, s.here, ir.Bin("==", ir.Var(s.coord), ir.Var(name))))
        stmts.extend(segment(env, it, s, ir.Var(name)))
    return stmts


def _advance(env: LowerEnv, state: dict[Iterator, IterState]) -> list[ir.Stmt]:
    """Step the iterators that sit at this coordinate (as `coiterate` does: without a
    branch while counting a sparse output's entries)."""
    counting = env.decided.assembler is not None and env.decided.assembler.mode.counting
    stmts: list[ir.Stmt] = []
    for it, s in state.items():
        pos, here = ir.Var(s.pos), ir.Var(s.here)
        if counting and unique(env, it):
            step: ir.Expr = ir.Bin("+", pos, here)
        else:
            step = ir.Select(here, s.advance, pos)
        stmts.append(ir.Assign(pos, step))
    return stmts


# ------------------------------------------------------------------ guarded values
def _guarded(env: LowerEnv, state: dict[Iterator, IterState], block: ir.Block) -> ir.Block:
    """``block`` with each value that reads an iterator's last level made
    ``here ? value : 0``."""
    guards: Guards = {}
    for it, s in state.items():
        if it.level == len(env.inputs.formats[it.access.name].levels) - 1:
            vals = env.found.local_vals.get(it.access.name) or env.inputs.sig.array(
                it.access.name, "vals"
            )
            guards[(vals, s.pos)] = s.here
    if not guards:
        return block
    return _guard_block(block, lambda e: _settle(e, guards, env.inputs.ring))


def _guard_block(block: ir.Block, fn: Callable[[ir.Expr], ir.Expr]) -> ir.Block:
    return ir.Block(tuple(_guard_stmt(s, fn) for s in block.body))


def _guard_stmt(s: ir.Stmt, fn: Callable[[ir.Expr], ir.Expr]) -> ir.Stmt:
    """The values ``s`` computes, through ``fn`` (positions and conditions never read a
    value array, so only initialisers, stored values and calls are rewritten)."""
    match s:
        case ir.Decl(init=init) if init is not None:
            return replace(s, init=fn(init))
        case ir.Assign(value=value):
            return replace(s, value=fn(value))
        case ir.Effect(call=call):
            rewritten = fn(call)
            assert isinstance(rewritten, ir.Call)
            return replace(s, call=rewritten)
        case _ if blocks(s):
            return map_blocks(s, lambda b: _guard_block(b, fn))
        case _:
            return s


def _settle(e: ir.Expr, guards: Guards, ring: Semiring) -> ir.Expr:
    """``e`` with its pending guard applied (``cond ? e : 0``; under a semiring, its
    add's identity instead of 0)."""
    value, cond = _hoist(e, guards, ring)
    return value if cond is None else ir.Select(cond, value, ir.FloatLit(ring.identity))


#: the loop IR operator of a semiring's multiply (`lower.semiring.combine`)
_PRODUCT = {"*": "*", "+": "+", "and": "&&"}


def _hoist(e: ir.Expr, guards: Guards, ring: Semiring) -> tuple[ir.Expr, ir.Expr | None]:
    """``e`` and the condition under which it is present: a guarded load's flag, carried
    up through products (the semiring's multiply), a dividend, negation and a boolean
    semiring's truth test (an absent factor annihilates the term), settled at anything
    else (a sum of terms, a call)."""
    match e:
        case ir.Load(array=array, index=ir.Var(name=pos)) if (array, pos) in guards:
            return e, ir.Var(guards[(array, pos)])
        case ir.Unary(op="-", operand=x):
            value, cond = _hoist(x, guards, ring)
            return ir.Unary("-", value), cond
        case ir.Bin(op="!=", left=x, right=ir.FloatLit(value=0.0)) if ring.boolean:
            value, cond = _hoist(x, guards, ring)
            return ir.Bin("!=", value, ir.FloatLit(0.0)), cond
        case ir.Call(fn="pair" | "second" as fn, args=(left, right)) if fn == ring.multiply:
            (a, ca), (b, cb) = _hoist(left, guards, ring), _hoist(right, guards, ring)
            conds = [c for c in (ca, cb) if c is not None]
            return ir.Call(fn, (a, b)), ir.conj(*conds) if conds else None
        case ir.Bin(op=op, left=left, right=right) if op == _PRODUCT.get(ring.multiply):
            (a, ca), (b, cb) = _hoist(left, guards, ring), _hoist(right, guards, ring)
            conds = [c for c in (ca, cb) if c is not None]
            return ir.Bin(op, a, b), ir.conj(*conds) if conds else None
        case ir.Call(fn="vdiv", args=(left, right)):
            a, ca = _hoist(left, guards, ring)
            return ir.Call("vdiv", (a, _settle(right, guards, ring))), ca
        case _:
            return map_children(e, lambda c: _settle(c, guards, ring)), None
