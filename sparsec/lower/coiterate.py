"""Co-iteration (MLIR's LoopEmitter): the loops over one index variable's lattice.

For the merge lattice of the expression at an index variable, emit one of

* a dense loop over ``0..N`` when the lattice is *full* (some point has no iterator),
  co-iterating any sparse iterators by coordinate match;
* a position loop ``for p in pos[parent]..pos[parent+1]`` for a single iterator;
* for several iterators, one ``while`` loop per lattice point, each running while all
  its iterators have positions left, with one case per sub-point (TACO's co-iteration).

The caller passes the loop BODY as a callback: ``body(expr, ctx)`` lowers one iteration
of a case, whose expression is ``expr``, in ``ctx`` (the variable bound, the case's
iterators' positions known).
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterator as Iter
from contextlib import contextmanager
from dataclasses import dataclass, replace

from ..base.errors import ScheduleError
from ..frontend.concrete import CExpr
from ..ir import nodes as ir
from ..middle.lattice import Iterator, Lattice, LatticePoint, ordered
from ..middle.order import level_indices
from .ctx import Ctx, Position, Sink, unit
from .env import LowerEnv
from .levels import crd, level, names, unique
from .output import zero_slice
from .parallel import inside, loop_setup
from .races import Loop

#: lowers the body of one iteration: the case's expression, the context inside
Body = Callable[[CExpr, Ctx], ir.Block]


@dataclass(frozen=True, slots=True)
class Walk:
    """The loop over ``var`` being lowered in ``ctx``: ``body`` lowers each case of an
    iteration, which stores into ``sink``; ``outermost``: the kernel's first loop."""

    var: str
    ctx: Ctx
    sink: Sink
    body: Body
    outermost: bool = False


@dataclass(frozen=True, slots=True)
class Step:
    """One step of a merge's while loop: the iterators it runs while (``live``), the
    coordinates it reads first, and the variable an intersection gallops to (`mergeby`)."""

    live: tuple[Iterator, ...]
    reads: tuple[ir.Stmt, ...]
    gallop_to: str | None


@dataclass(frozen=True, slots=True)
class Present(Position):
    """A level bound by a flagged union (`lower.union`), whose iterator sits at the bound
    coordinate only where ``here`` holds: below it, ranges are empty elsewhere."""

    here: ir.Expr


@dataclass(frozen=True, slots=True)
class IterState:
    """Names of one iterator's variables in one co-iteration loop."""

    pos: str
    end: str
    coord: str
    here: str
    next: str
    lo: ir.Expr
    hi: ir.Expr
    advance: ir.Expr


def iterator_state(env: LowerEnv, it: Iterator, ctx: Ctx) -> IterState:
    """An iterator's position range under its parent's position, and its names."""
    t, k = it.access.name, it.level
    fmt = level(env, it.access, k)
    parent = ctx.levels.get((it.access, k - 1)) if k > 0 else None
    lo, hi = fmt.bounds((parent.pos, parent.next) if parent else None, names(env, it.access, k))
    if isinstance(parent, Present):
        # the parent may be absent here (a flagged union): then no children, and its
        # position (possibly the end) is not read
        lo, hi = (ir.Select(parent.here, x, ir.IntLit(0)) for x in (lo, hi))
    var = level_indices(it.access, env.inputs.formats[t])[k]
    p = env.inputs.namer.fresh(f"p{t}{k + 1}")
    nxt = env.inputs.namer.fresh(f"{p}_next") if not fmt.unique else ""
    here = env.inputs.namer.fresh(f"{var}{t}_here")
    advance = ir.Var(nxt) if nxt else ir.Bin("+", ir.Var(p), ir.IntLit(1))
    return IterState(
        pos=p,
        end=env.inputs.namer.fresh(f"{p}_end"),
        coord=env.inputs.namer.fresh(f"{var}{t}"),
        here=here,
        next=nxt,
        lo=lo,
        hi=hi,
        advance=advance,
    )


def coiterate(
    env: LowerEnv, lattice: Lattice, walk: Walk, window: tuple[ir.Expr, ir.Expr] | None = None
) -> ir.Block:
    """The loops of ``walk`` over its variable for ``lattice``, its body in each case of
    each iteration.

    ``window``: only the coordinates ``[lo, hi)`` of the variable (a piece of a split
    merge, `lower.window`): each iterator starts at its first position at or after ``lo``,
    found by a binary search, and a merge stops at ``hi``."""
    var, ctx, sink = walk.var, walk.ctx, walk.sink
    iterators = lattice.iterators
    name = env.decided.var_names[var]
    if window is not None:
        assert iterators and not lattice.position_loop
    elif lattice.range_loop:
        return _dense_loop(env, lattice.points[0], walk)
    if lattice.position_loop:
        return _position_loop(env, lattice.points[0], walk)

    merged = ", ".join(sorted({str(it.access) for it in iterators}))
    loop_setup(env, Loop(var, frozenset({var}), sink, f"it co-iterates {merged}", ir.IntLit(0)))
    gallop = env.decided.plan is not None and env.decided.plan.mergeby.get(var) == "Gallop"
    if gallop and (lattice.full or len(lattice.points) != 1):
        raise ScheduleError(
            f"mergeby({var},Gallop): the loop over {var} merges {merged} as a union "
            "(some terms need only one of them); galloping skips ahead in an "
            "intersection only"
        )
    state = {it: iterator_state(env, it, ctx) for it in iterators}
    if window is not None:
        state = {it: _windowed(env, it, s, window, lattice.full) for it, s in state.items()}
    init = [ir.Decl(ir.I64, s.pos, s.lo) for s in state.values()]
    init += [ir.Decl(ir.I64, s.end, s.hi) for s in state.values()]
    if lattice.full:
        loop_body = _case_body(env, lattice, lattice.points, state, walk)
        first, stop = window or (ir.IntLit(0), env.inputs.sig.extent(var))
        loop = ir.For(name, first, stop, loop_body)
        return ir.block(*init, loop)
    loops: list[ir.Stmt] = []
    # each step of the merge advances an iterator and appends at most one entry
    room: ir.Expr = ir.IntLit(0)
    for st in state.values():
        room = ir.add(room, ir.Bin("-", ir.Var(st.end), ir.Var(st.pos)))
    with capacity_checked(env, var, room) as check:
        loops += _merge_loops(env, lattice, state, walk, gallop)
    return ir.block(*init, *check, *loops)


def _windowed(
    env: LowerEnv, it: Iterator, s: IterState, window: tuple[ir.Expr, ir.Expr], full: bool
) -> IterState:
    """``s`` restricted to the coordinates ``window``: its first position at or after the
    window's start, and (unless a dense loop over the window bounds the walk) its first at
    or after the window's end, both by a binary search of its sorted coordinates."""
    at = names(env, it.access, it.level).crd
    if not at:
        raise ScheduleError(
            f"{it.access}'s level {it.level + 1} stores no coordinates to search; a split "
            "of a merge needs compressed levels"
        )
    lo = ir.Call("gallop", (ir.Var(at), s.lo, s.hi, window[0]))
    hi = s.hi if full else ir.Call("gallop", (ir.Var(at), s.lo, s.hi, window[1]))
    return replace(s, lo=lo, hi=hi)


def _merge_loops(
    env: LowerEnv, lattice: Lattice, state: dict[Iterator, IterState], walk: Walk, gallop: bool
) -> list[ir.Stmt]:
    """One while loop per lattice point, each while all its iterators have entries."""
    name = env.decided.var_names[walk.var]
    loops: list[ir.Stmt] = []
    for top in lattice.points:
        its = ordered(top.iterators)
        cond = ir.conj(*(ir.Bin("<", ir.Var(state[it].pos), ir.Var(state[it].end)) for it in its))
        reads: list[ir.Stmt] = [
            ir.Decl(ir.I64, state[it].coord, crd(env, it, ir.Var(state[it].pos))) for it in its
        ]
        coord: ir.Expr = ir.Var(state[its[0]].coord)
        for it in its[1:]:
            coord = ir.Call("min", (coord, ir.Var(state[it].coord)))
        reads.append(ir.Decl(ir.I64, name, coord))
        target = None
        if gallop:
            top_coord: ir.Expr = ir.Var(state[its[0]].coord)
            for it in its[1:]:
                top_coord = ir.Call("max", (top_coord, ir.Var(state[it].coord)))
            target = env.inputs.namer.fresh(f"{name}_max")
            reads.append(ir.Decl(ir.I64, target, top_coord))
        step = Step(tuple(its), tuple(reads), target)
        loops.append(
            ir.While(cond, _case_body(env, lattice, lattice.sub_points(top), state, walk, step))
        )
    return loops


def _case_body(
    env: LowerEnv,
    lattice: Lattice,
    cases: tuple[LatticePoint, ...],
    state: dict[Iterator, IterState],
    walk: Walk,
    step: Step | None = None,
) -> ir.Block:
    """One step of co-iteration: which iterators sit at the walk's variable, the cases,
    advancing.

    In a dense loop (no ``step``) every iterator may be exhausted, so presence is
    ``p < end && crd[p] == var``; in a while loop the condition guarantees positions.
    """
    var = walk.var
    name = env.decided.var_names[var]
    its = step.live if step is not None else ordered(lattice.iterators)
    gallop_to = step.gallop_to if step is not None else None
    stmts: list[ir.Stmt] = list(step.reads if step is not None else ())
    for it in its:
        s = state[it]
        if step is None:
            here = ir.conj(
                ir.Bin("<", ir.Var(s.pos), ir.Var(s.end)),
                ir.Bin("==", crd(env, it, ir.Var(s.pos)), ir.Var(name)),
            )
        else:
            here = ir.Bin("==", ir.Var(s.coord), ir.Var(name))
        stmts.append(ir.Decl(ir.BOOL, s.here, here))
        stmts.extend(segment(env, it, s, ir.Var(name)))
    branches: list[tuple[ir.Expr, ir.Block]] = []
    orelse: ir.Block | None = None
    for point in cases:
        levels = {
            (it.access, it.level): Position(ir.Var(state[it].pos), state[it].advance)
            for it in point.iterators
        }
        case = walk.body(point.expr, walk.ctx.bind({var: ir.Var(name)}, levels))
        if point.iterators:
            cond = ir.conj(*(ir.Var(state[it].here) for it in ordered(point.iterators)))
            branches.append((cond, case))
        else:
            orelse = case
            break
    if branches:
        stmts.append(ir.If(tuple(branches), orelse))
    elif orelse is not None:
        stmts.extend(orelse.body)
    if gallop_to is not None:
        # an intersection: all present -> step on; else every iterator gallops to the
        # largest current coordinate (a present one is already there)
        everyone = ir.conj(*(ir.Var(state[it].here) for it in its))
        for it in its:
            s = state[it]
            crd_array = names(env, it.access, it.level).crd
            jump = ir.Call(
                "gallop", (ir.Var(crd_array), ir.Var(s.pos), ir.Var(s.end), ir.Var(gallop_to))
            )
            stmts.append(ir.Assign(ir.Var(s.pos), ir.Select(everyone, s.advance, jump)))
        return ir.block(*stmts)
    counting = env.decided.assembler is not None and env.decided.assembler.mode.counting
    for it in its:
        s = state[it]
        if counting and unique(env, it):
            # no values are read while counting: advance without a branch (a merge's
            # branches are unpredictable; GCC keeps them for the select otherwise)
            ahead: ir.Expr = ir.Bin("+", ir.Var(s.pos), ir.Var(s.here))
        else:
            ahead = ir.Select(ir.Var(s.here), s.advance, ir.Var(s.pos))
        stmts.append(ir.Assign(ir.Var(s.pos), ahead))
    return ir.block(*stmts)


def segment(
    env: LowerEnv, it: Iterator, s: IterState, coord: ir.Expr, guarded: bool = True
) -> list[ir.Stmt]:
    """For a non-unique level: find the end of the run of equal coordinates (only when
    the iterator is present at ``coord``, unless ``guarded`` is off)."""
    if unique(env, it):
        return []
    nxt = ir.Var(s.next)
    guard = [ir.Var(s.here)] if guarded else []
    scan = ir.While(
        ir.conj(*guard, ir.Bin("<", nxt, ir.Var(s.end)), ir.Bin("==", crd(env, it, nxt), coord)),
        ir.block(ir.Assign(nxt, ir.Bin("+", nxt, ir.IntLit(1)))),
    )
    return [ir.Decl(ir.I64, s.next, ir.Bin("+", ir.Var(s.pos), ir.IntLit(1))), scan]


@contextmanager
def capacity_checked(env: LowerEnv, var: str, room: ir.Expr) -> Iter[list[ir.Stmt]]:
    """Lower a loop body under one up-front capacity check when the loop appends the
    output's last level (`Assembler.precheck`); yields the check's statements."""
    asm = env.decided.assembler
    check = asm.precheck(var, room) if asm is not None else []
    if asm is None or not check:
        yield check
        return
    with env.scope(checked=True):
        yield check


def _dense_loop(env: LowerEnv, point: LatticePoint, walk: Walk) -> ir.Block:
    var, ctx, sink, outermost, body = walk.var, walk.ctx, walk.sink, walk.outermost, walk.body
    name = env.decided.var_names[var]
    trip = env.inputs.sig.extent(var)
    setup = loop_setup(env, Loop(var, frozenset({var}), sink, "for", trip, outermost))
    inner = ctx.bind({var: ir.Var(name)}, covered=var)
    with capacity_checked(env, var, trip) as check:
        step = inside(env, setup, lambda: body(point.expr, inner))
    if outermost and env.decided.zero_in_loop:
        step = ir.block(zero_slice(env, ir.Var(name)), step)
    loop = ir.For(name, ir.IntLit(0), trip, step, setup.parallel, setup.unroll)
    return ir.block(*setup.pre, *check, loop, *setup.post)


def _position_loop(env: LowerEnv, point: LatticePoint, walk: Walk) -> ir.Block:
    var, ctx, sink, outermost, body = walk.var, walk.ctx, walk.sink, walk.outermost, walk.body
    (it,) = point.iterators
    s = iterator_state(env, it, ctx)
    name = env.decided.var_names[var]
    pos = ir.Var(s.pos)
    read = ir.Decl(ir.I64, name, crd(env, it, pos))
    if unique(env, it):
        inner = ctx.bind({var: ir.Var(name)}, {(it.access, it.level): unit(pos)})
        end = ir.Decl(ir.I64, s.end, s.hi)
        trip = ir.Bin("-", ir.Var(s.end), s.lo)
        setup = loop_setup(env, Loop(var, frozenset({var}), sink, "for", trip, outermost))
        with capacity_checked(env, var, trip) as check:
            step = inside(env, setup, lambda: ir.block(read, body(point.expr, inner)))
        loop = ir.For(s.pos, s.lo, ir.Var(s.end), step, setup.parallel, setup.unroll)
        return ir.block(end, *setup.pre, *check, loop, *setup.post)
    # Non-unique level: walk runs of equal coordinates; children see [p, next).
    walks = f"it walks runs of equal coordinates of {it.access}'s non-unique level"
    loop_setup(env, Loop(var, frozenset({var}), sink, walks, ir.IntLit(0)))
    inner = ctx.bind({var: ir.Var(name)}, {(it.access, it.level): Position(pos, ir.Var(s.next))})
    step = ir.block(
        read,
        *segment(env, it, s, ir.Var(name), guarded=False),
        body(point.expr, inner),
        ir.Assign(pos, ir.Var(s.next)),
    )
    return ir.block(
        ir.Decl(ir.I64, s.pos, s.lo),
        ir.Decl(ir.I64, s.end, s.hi),
        ir.While(ir.Bin("<", pos, ir.Var(s.end)), step),
    )
