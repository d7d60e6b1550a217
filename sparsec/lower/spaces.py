"""The loops of the schedule's spaces: split and divide pieces, ``pos`` (iterating one
operand's stored positions), ``fuse`` (one loop over several variables or levels) and
``bound`` (a promised extent).

A space's loops count an offset in the space; the loop that completes it binds the
space's original variables (or, in a position space, the operand's positions and their
coordinates) and hands the rest of the nest to the caller's ``nest`` callback.
"""

from __future__ import annotations

from dataclasses import replace

from ..base.errors import ScheduleError
from ..frontend.concrete import ZERO, CExpr, accesses
from ..frontend.notation import Access
from ..ir import nodes as ir
from ..middle.commands import Unit
from ..middle.lattice import Iterator, Lattice, build, ordered
from ..middle.order import level_indices
from ..middle.plan import Space
from ..tensors.formats import Dense, LevelNames, dense_extent
from .ctx import Ctx, NestPoint, OutputSink, SegmentSink, SpaceState, unit
from .env import LowerEnv
from .levels import crd, iterator, level, locate, names, unique
from .output import flush_runs
from .parallel import inside, loop_setup
from .positions import distinct, pos_access, whole_coordinates
from .races import Loop
from .rows import rest_of_nest, split_row
from .window import merge_at, window_merge

DENSE = Dense()


def space_loop(env: LowerEnv, loop: str, place: NestPoint, outermost: bool) -> ir.Block:
    """One loop of a schedule space at ``place``: a split piece, or the space's own loop."""
    expr, ctx, sink = place.expr, place.ctx, place.sink
    plan = env.decided.plan
    assert plan is not None
    sname = plan.space_of(loop)
    assert sname is not None
    space = plan.spaces[sname]
    pre: list[ir.Stmt] = []
    if sname not in ctx.spaces:
        whole_coordinates(env, space, expr)
        stmts, state = _enter_space(env, space, ctx)
        pre += stmts
        ctx = ctx.bind(spaces={sname: state})
    extent = _extent(env, loop, ctx)
    name = env.decided.var_names[loop]
    completes = plan.leaves(sname)[-1] == loop
    setup = loop_setup(env, Loop(loop, distinct(env, space), sink, "for", extent, outermost))
    inner = ctx.bind(loopvars={loop: ir.Var(name)})
    merge = merge_at(env, space, expr, ctx) if completes else None
    if merge is not None and setup.parallel is None:
        # a serial piece that completes a split merge: one walk over its coordinates
        if setup.unroll:
            raise ScheduleError(f"unroll({loop},{setup.unroll}): {loop}'s piece walks a merge")
        x0 = _offset(env, sname, ctx.bind(loopvars={loop: ir.IntLit(0)}))
        walk = window_merge(env, space, merge, (x0, ir.add(x0, extent)), replace(place, ctx=ctx))
        return ir.block(*pre, *setup.pre, walk, *setup.post)

    # a serial loop over fused positions advances its parents' positions as cursors; a
    # parallel one searches them per iteration
    cursors: dict[int, str] | None = None
    if completes and space.kind == "fusedpos" and setup.parallel is None:
        first = _offset(env, sname, ctx.bind(loopvars={loop: ir.IntLit(0)}))
        init, cursors = _cursors_init(env, space, ctx.spaces[sname], first)
        pre += init

    # atomic stores from this serial loop, one output element per iteration: add up runs
    # that hit the same element (consecutive positions of one row) and store each run once
    flush: list[ir.Stmt] = []
    target = sink
    if (
        completes
        and not place.rest
        and setup.parallel is None
        and env.flags.atomic_writes
        and env.decided.assembler is None
        and isinstance(sink, OutputSink)
    ):
        acc, at = env.inputs.namer.fresh("run"), env.inputs.namer.fresh("run_at")
        pre += [ir.Decl(ir.ACC, acc, ir.FloatLit(0.0)), ir.Decl(ir.I64, at, ir.IntLit(-1))]
        target = SegmentSink(acc, at)
        flush += flush_runs(env, target, loop)

    def body() -> ir.Block:
        if not completes:
            return place.inside(inner, target)
        x = _offset(env, sname, inner)
        here = replace(place, ctx=inner, sink=target)
        if merge is not None:
            # a parallel piece that completes a split merge: one coordinate each
            return window_merge(env, space, merge, (x, ir.add(x, ir.IntLit(1))), here)
        return _bind_space(env, space, x, here, cursors)

    par = setup.parallel
    if par is not None and par.unit == Unit.GPUThread and not par.schedule:
        setup.flags["thread_loop"] = (loop, name, extent)
    loop_body = inside(env, setup, body)
    for_loop = ir.For(name, ir.IntLit(0), extent, loop_body, setup.parallel, setup.unroll)
    return ir.block(*pre, *setup.pre, for_loop, *flush, *setup.post)


def _extent(env: LowerEnv, node: str, ctx: Ctx) -> ir.Expr:
    """The trip count of ``node``'s loop (a space or a split piece)."""
    plan = env.decided.plan
    assert plan is not None
    if node in plan.spaces:
        return ctx.spaces[node].extent
    piece = plan.pieces[node]
    whole = _extent(env, piece.parent, ctx)
    f = ir.IntLit(piece.factor)
    chunk = ir.Bin("/", ir.Bin("+", whole, ir.IntLit(piece.factor - 1)), f)
    if piece.outer:
        return f if piece.divide else chunk
    step = chunk if piece.divide else f
    before = ir.mul(_offset(env, piece.sibling, ctx), step)
    return ir.Call("min", (step, ir.Bin("-", whole, before)))


def _offset(env: LowerEnv, node: str, ctx: Ctx) -> ir.Expr:
    """``node``'s offset in its space from the bound loop variables."""
    plan = env.decided.plan
    assert plan is not None
    kids = plan.children.get(node)
    if kids is None:
        return ctx.loopvars[node]
    outer, inner = kids
    piece = plan.pieces[outer]
    if piece.divide:
        whole = _extent(env, node, ctx)
        step: ir.Expr = ir.Bin(
            "/", ir.Bin("+", whole, ir.IntLit(piece.factor - 1)), ir.IntLit(piece.factor)
        )
    else:
        step = ir.IntLit(piece.factor)
    return ir.add(ir.mul(_offset(env, outer, ctx), step), _offset(env, inner, ctx))


def _enter_space(env: LowerEnv, space: Space, ctx: Ctx) -> tuple[list[ir.Stmt], SpaceState]:
    """Declare the range of ``space`` where its first loop starts."""
    stmts: list[ir.Stmt] = []
    if space.kind == "dense":
        (var,) = space.vars
        if space.bound is not None and space.bound[1] == "MaxExact":
            return [], SpaceState(ir.IntLit(0), ir.IntLit(space.bound[0]))
        return [], SpaceState(ir.IntLit(0), env.inputs.sig.extent(var))
    if space.kind == "fused":
        size = dense_extent(env.inputs.sig.extent(var) for var in space.vars)
        return [], SpaceState(ir.IntLit(0), size)
    access = pos_access(env, space)
    fmt = env.inputs.formats[access.name]
    levels = level_indices(access, fmt)
    first = levels.index(space.vars[0])
    if ctx.depth(access) != first:
        above = ", ".join(levels[:first])
        raise ScheduleError(
            f"{space.origin}: {access}'s levels above {space.vars[0]} ({above}) must be "
            f"bound before the loops of {space.name} start; reorder so that they enclose it"
        )
    ranges: list[tuple[ir.Expr, ir.Expr]] = []
    for n in range(len(space.vars)):
        k = first + n
        level = fmt.levels[k]
        if n == 0:
            # the positions under the parent's position
            parent = ctx.levels.get((access, k - 1)) if k > 0 else None
            segment = (parent.pos, parent.next) if parent else None
            lo, hi = level.bounds(segment, names(env, access, k))
        else:
            # the positions under the previous level's whole range
            lo, hi = level.range_bounds(*ranges[-1], names(env, access, k))
        lo_name = env.inputs.namer.fresh(f"p{access.name}{k + 1}_lo")
        hi_name = env.inputs.namer.fresh(f"p{access.name}{k + 1}_hi")
        stmts += [ir.Decl(ir.I64, lo_name, lo), ir.Decl(ir.I64, hi_name, hi)]
        ranges.append((ir.Var(lo_name), ir.Var(hi_name)))
    lo, hi = ranges[-1]
    return stmts, SpaceState(lo, ir.Bin("-", hi, lo), tuple(ranges))


def _cursors_init(
    env: LowerEnv, space: Space, state: SpaceState, first: ir.Expr
) -> tuple[list[ir.Stmt], dict[int, str]]:
    """Before a serial loop over fused positions: each compressed parent level's
    position at the loop's first child position (advanced in the loop). Walks up the
    levels as `_bind_space` does: a child's parent position is computed where its level
    function can (singleton: shared; dense: divided), else searched in its ``pos``."""
    access = pos_access(env, space)
    fmt = env.inputs.formats[access.name]
    top = level_indices(access, fmt).index(space.vars[0])
    last = top + len(space.vars) - 1
    searched = {k: (n, arr) for n, k, arr in _parent_searches(env, space, access)}
    cursors: dict[int, str] = {}
    stmts: list[ir.Stmt] = []
    target: ir.Expr = ir.add(state.lo, first)
    for k in range(last - 1, top - 1, -1):
        parent = fmt.levels[k + 1].parent_position(target, names(env, access, k + 1))
        if parent is not None:
            target = parent
            continue
        n, arr = searched[k + 1]
        lo, hi = state.levels[n]
        cur = env.inputs.namer.fresh(f"p{access.name}{k + 1}_at")
        stmts.append(ir.Decl(ir.I64, cur, ir.Call("search", (ir.Var(arr), lo, hi, target))))
        cursors[k + 1] = cur
        target = ir.Var(cur)
    return stmts, cursors


def _parent_searches(env: LowerEnv, space: Space, access: Access) -> list[tuple[int, int, str]]:
    """(index in space, 1-based level number, child pos array) for each fused level whose
    child level is compressed: its position is found by searching the child's pos."""
    fmt = env.inputs.formats[access.name]
    first = level_indices(access, fmt).index(space.vars[0])
    found = []
    for n in range(len(space.vars) - 1):
        k = first + n
        child = fmt.levels[k + 1]
        if child.position_iteration and not child.inherits_parent_range:
            found.append((n, k + 1, env.inputs.sig.array(access.name, "pos", k + 1)))
    return found


def _bind_space(
    env: LowerEnv, space: Space, x: ir.Expr, place: NestPoint, cursors: dict[int, str] | None
) -> ir.Block:
    """The space's offset ``x`` is known at ``place``: bind its original variables and go on.

    ``cursors``: for a serial loop over fused positions, the variables that follow each
    searched parent level (else each parent is searched afresh)."""
    expr, ctx = place.expr, place.ctx
    stmts: list[ir.Stmt] = []
    lhs = env.inputs.lhs
    if space.kind in ("dense", "fused"):
        values = _dense_coords(env, space, x)
        if env.decided.assembler is not None:
            # a GPU split over a rowwise sparse output's rows: each row opened as usual
            ((var, value),) = values
            expr = scheduled_expr(env, space, var, expr, ctx)
            return split_row(env, var, value, replace(place, expr=expr))
        for var, value in values:
            expr = scheduled_expr(env, space, var, expr, ctx)
            name = env.decided.var_names[var]
            stmts.append(ir.Decl(ir.I64, name, value))
            ctx = ctx.bind({var: ir.Var(name)}, covered=var)
            located, ctx = locate(env, ctx, [lhs, *accesses(expr)])
            stmts.append(located)
        return ir.block(*stmts, place.nest(place.rest, expr, ctx, place.sink))
    access = pos_access(env, space)
    fmt = env.inputs.formats[access.name]
    first = level_indices(access, fmt).index(space.vars[0])
    state = ctx.spaces[space.name]
    positions: dict[int, ir.Expr] = {}
    last = first + len(space.vars) - 1
    p_last = env.inputs.namer.fresh(f"p{access.name}{last + 1}")
    stmts.append(ir.Decl(ir.I64, p_last, ir.add(state.lo, x)))
    positions[last] = ir.Var(p_last)
    searched = {k: (n, arr) for n, k, arr in _parent_searches(env, space, access)}
    for k in range(last - 1, first - 1, -1):
        below = positions[k + 1]
        parent = fmt.levels[k + 1].parent_position(below, names(env, access, k + 1))
        if parent is not None:
            positions[k] = parent
            continue
        n, arr = searched[k + 1]
        lo, hi = state.levels[n]
        if cursors is not None:
            cur = ir.Var(cursors[k + 1])
            ahead = ir.add(cur, ir.IntLit(1))
            step = ir.block(ir.Assign(cur, ahead))
            stmts.append(ir.While(ir.Bin("<=", ir.Load(arr, ahead), below), step))
            positions[k] = cur
        else:
            found = env.inputs.namer.fresh(f"p{access.name}{k + 1}")
            stmts.append(ir.Decl(ir.I64, found, ir.Call("search", (ir.Var(arr), lo, hi, below))))
            positions[k] = ir.Var(found)
    for n, var in enumerate(space.vars):
        k = first + n
        meets = _meets_sparse(env, space, var, expr, ctx) if space.kind == "pos" else None
        if meets is None:
            expr = scheduled_expr(env, space, var, expr, ctx)
        name = env.decided.var_names[var]
        pos = positions[k]
        coord = fmt.levels[k].coordinate(pos, names(env, access, k), k == 0)
        stmts.append(ir.Decl(ir.I64, name, coord))
        ctx = ctx.bind({var: ir.Var(name)}, {(access, k): unit(pos)})
        if meets is not None:
            stmts += _locate_cases(env, space, var, meets, replace(place, ctx=ctx))
            return ir.block(*stmts)
        if n < len(space.vars) - 1:
            located, ctx = locate(env, ctx, [lhs, *accesses(expr)])
            stmts.append(located)
    # the last variable may open a sparse output's row (a GPU position loop over its rows)
    return ir.block(*stmts, rest_of_nest(env, space.vars[-1], replace(place, expr=expr, ctx=ctx)))


def _meets_sparse(env: LowerEnv, space: Space, var: str, expr: CExpr, ctx: Ctx) -> Lattice | None:
    """The lattice at ``var`` of a position loop over ``space.tensor``'s level when other
    operands are sparse there too (TACO's ``pos(i, ipos, A)`` on ``A(i) * B(i)``), else
    None. Every lattice point must hold the pos tensor where its level is sparse (the loop
    visits only its entries) and the other sparse levels must be unique: each is then located by a search of its
    segment for the coordinate (`_locate_cases`)."""
    lattice = build(expr, lambda a: iterator(env, a, var, ctx), env.inputs.exact)
    if not lattice.points:
        return None
    others = [it for it in ordered(lattice.iterators) if it.access.name != space.tensor]
    if not others:
        return None
    # a dense level of the pos tensor has no iterator: its positions visit every coordinate
    own = [it for it in lattice.iterators if it.access.name == space.tensor]
    if own and any(own[0] not in p.iterators for p in lattice.points):
        raise ScheduleError(
            f"{space.origin}: the expression needs {var} where {space.tensor} has no "
            f"entry (a sum with a term without {space.tensor}); pos visits only "
            f"{space.tensor}'s entries"
        )
    for it in others:
        if not unique(env, it):
            raise ScheduleError(
                f"{space.origin}: at {var}, {it.access}'s level repeats coordinates; pos "
                f"over {space.tensor} locates the other sparse operands by a search, which "
                "needs unique levels (convert it, e.g. from coo to csr)"
            )
    return lattice


def _locate_cases(
    env: LowerEnv, space: Space, var: str, lattice: Lattice, place: NestPoint
) -> list[ir.Stmt]:
    """The body of a position loop at ``var`` (bound in ``place.ctx``): each other sparse
    operand located in its segment (a galloping search for the coordinate, present when
    found), then the first lattice point whose operands are all present. A point of the
    pos tensor alone runs where the others are absent; without one, nothing is computed
    there (the intersection)."""
    ctx = place.ctx
    stmts: list[ir.Stmt] = []
    coord = ctx.coords[var]
    here: dict[Iterator, ir.Expr] = {}
    found: dict[Iterator, ir.Expr] = {}
    for it in ordered(lattice.iterators):
        if it.access.name == space.tensor:
            continue
        k = it.level
        parent = ctx.levels.get((it.access, k - 1)) if k > 0 else None
        at = names(env, it.access, k)
        lo, hi = level(env, it.access, k).bounds((parent.pos, parent.next) if parent else None, at)
        p = env.inputs.namer.fresh(f"p{it.access.name}{k + 1}")
        end = env.inputs.namer.fresh(f"{p}_end")
        flag = env.inputs.namer.fresh(f"{var}{it.access.name}_here")
        stmts += [
            ir.Decl(ir.I64, end, hi),
            ir.Decl(ir.I64, p, ir.Call("gallop", (ir.Var(at.crd), lo, ir.Var(end), coord))),
            ir.Decl(
                ir.BOOL,
                flag,
                ir.conj(
                    ir.Bin("<", ir.Var(p), ir.Var(end)),
                    ir.Bin("==", crd(env, it, ir.Var(p)), coord),
                ),
            ),
        ]
        here[it], found[it] = ir.Var(flag), ir.Var(p)
    branches: list[tuple[ir.Expr, ir.Block]] = []
    orelse: ir.Block | None = None
    for point in lattice.points:
        its = [it for it in ordered(point.iterators) if it in here]
        inner = ctx.bind(levels={(it.access, it.level): unit(found[it]) for it in its})
        # a sparse output's row is opened in each case (its count starts at zero)
        case = rest_of_nest(env, var, replace(place, expr=point.expr, ctx=inner))
        if not its:
            orelse = case
            break
        branches.append((ir.conj(*(here[it] for it in its)), case))
    stmts.append(ir.If(tuple(branches), orelse))
    return stmts


def _dense_coords(env: LowerEnv, space: Space, x: ir.Expr) -> list[tuple[str, ir.Expr]]:
    """The coordinates of a dense or fused space at offset ``x``, outermost first: the
    fused variables are dense levels of one flattened space (coordinate ``x % N``, parent
    position ``x / N``, innermost first)."""
    values: list[tuple[str, ir.Expr]] = []
    remaining = x
    for var in reversed(space.vars[1:]):
        at = LevelNames(env.inputs.sig.extent(var))
        values.append((var, DENSE.coordinate(remaining, at, top=False)))
        parent = DENSE.parent_position(remaining, at)
        assert parent is not None
        remaining = parent
    values.append((space.vars[0], remaining))
    return values[::-1]


def scheduled_expr(env: LowerEnv, space: Space, var: str, expr: CExpr, ctx: Ctx) -> CExpr:
    """The expression once ``var`` is bound by a schedule space: its lattice must be
    a plain range (dense spaces) or iterate only the pos tensor (position spaces)."""
    lattice = build(expr, lambda a: iterator(env, a, var, ctx), env.inputs.exact)
    if not lattice.points:
        return ZERO
    its = ordered(lattice.iterators)
    if space.kind in ("dense", "fused"):
        if its:
            a = its[0].access
            raise ScheduleError(
                f"{space.origin}: {var} is iterated through {a}'s "
                f"{env.inputs.formats[a.name].levels[its[0].level].spelling!r} level, so its "
                f"loop is not a plain range; iterate its positions with "
                f"pos({var},{var}pos,{a.name}) and transform that"
            )
        return lattice.points[0].expr
    others = [it for it in its if it.access.name != space.tensor]
    if others:
        raise ScheduleError(
            f"{space.origin}: at {var}, {others[0].access} is also sparse; pos visits "
            f"{space.tensor}'s stored positions alone, so the other operands must be dense "
            f"at {var}"
        )
    if its and any(its[0] not in p.iterators for p in lattice.points):
        raise ScheduleError(
            f"{space.origin}: the expression needs {var} where {space.tensor} has no "
            f"entry (a sum with a term without {space.tensor}); pos visits only "
            f"{space.tensor}'s entries"
        )
    return lattice.points[0].expr
