"""Column coarsening for CUDA: each thread computes several output columns at once.

SpMM's default GPU mapping runs a row per block and the row's columns across the block's
threads: ``for j (threads): acc = 0; for p in row i: acc += W[p] * X[crd[p], j]; C[i, j] =
acc``. Per multiply-add a thread loads a coordinate, a weight and an ``X`` element. This
pass gives each thread 4 columns ``j, j + B, j + 2B, j + 3B`` (B = the block's threads, so
a warp's accesses stay contiguous) in one sweep over the row: the coordinate and weight
loads are shared by the columns, and the columns' independent sums give the loads more to
overlap. Sweeps of 4 columns per thread cover all they can, then sweeps of 2, and the
columns left over (fewer than 2B) run through the original loop.

Every output element still receives the same additions in the same order, so results do
not change. The pass is CUDA-only, is applied to default mappings (an explicit schedule is
printed as written), and is conservative: the thread loop's body may only declare locals,
assign them, store at positions that differ per column, and run serial loops whose bounds
do not depend on the column; anything else leaves the loop alone.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import count

from ..ir import nodes as ir
from ..ir.visit import exprs, free_vars, map_blocks, statements, subexpressions, substitute
from ..middle.commands import Unit

#: columns per thread in the first sweeps (measured on an H100: 4 beat 1, 2 and 8 on
#: pruned-BERT SpMM), then 2 for what is left (768 = 512 + 256 columns), then 1
FACTORS = (4, 2)
#: threads per block when a loop is coarsened: a first sweep covers 4 * 128 = 512 columns
BLOCK = 128
_THREADS = ir.Call("block_threads", ())
_THREAD = ir.Call("thread_in_block", ())
#: calls whose value differs between the lanes of a warp, or that exchange values
_LANE_CALLS = frozenset(
    {"warp_sum", "lane", "thread_id", "group_sum", "group_lane", "segment_sum", "segment_head"}
)


def coarsen(body: ir.Block) -> tuple[ir.Block, tuple[str, ...]]:
    """``body`` with every eligible thread loop coarsened, and a note per loop."""
    notes: list[str] = []
    return _block(body, notes, count(), frozenset()), tuple(notes)


def _block(b: ir.Block, notes: list[str], ids: count[int], outer: frozenset[str]) -> ir.Block:
    out, scope = [], set(outer)
    for s in b.body:
        out.append(_stmt(s, notes, ids, frozenset(scope)))
        if isinstance(s, ir.Decl) and outer:
            scope.add(s.name)  # a local of an outer loop's body varies with it
    return ir.Block(tuple(out))


def _stmt(s: ir.Stmt, notes: list[str], ids: count[int], outer: frozenset[str]) -> ir.Stmt:
    """``outer``: the variables of the loops around ``s`` and the locals of their bodies."""
    match s:
        case ir.For(parallel=par, end=end) if par is not None and par.unit == Unit.GPUThread:
            # a thread loop bounded by an outer loop's variable is a split piece of a
            # row range (thread-per-row), not a range of output columns
            plain = par.schedule not in ("lane", "group") and not free_vars(end) & outer
            done = _coarsen(s, next(ids)) if plain else None
            if done is None:
                return s
            per = " then ".join(map(str, FACTORS))
            notes.append(f"{s.var}: {per} columns per thread ({BLOCK} threads per block)")
            return done
    inner = outer | {s.var} if isinstance(s, ir.For) else outer
    return map_blocks(s, lambda b: _block(b, notes, ids, inner))


# ------------------------------------------------------------------ analysis
def _walk(b: ir.Block) -> list[ir.Stmt] | None:
    """Every statement of ``b`` (loop bodies included, blocks flattened), or None if one is
    not understood: only locals, plain assignments and serial loops are."""
    found: list[ir.Stmt] = [s for s in statements(b) if not isinstance(s, ir.Block)]
    return found if all(_understood(s) for s in found) else None


def _understood(s: ir.Stmt) -> bool:
    match s:
        case ir.Decl() | ir.Comment() | ir.Assign(atomic=False) | ir.For(parallel=None):
            return True
    return False


def _reads(s: ir.Stmt) -> set[str]:
    """The variables ``s`` reads (an assigned variable is written, not read)."""
    match s:
        case ir.Assign(target=ir.Var(), value=value):
            return free_vars(value)
        case ir.Decl() | ir.Assign() | ir.For():
            return set().union(*(free_vars(e) for e in exprs(s)))
    return set()


def _calls(e: ir.Expr) -> set[str]:
    """The helpers ``e`` calls."""
    return {x.fn for x in subexpressions(e) if isinstance(x, ir.Call)}


def _per_column(stmts: list[ir.Stmt], j: str) -> set[str] | None:
    """The locals whose value depends on the column ``j`` (``j`` included), or None when
    the body cannot be split by column. A statement that does not depend on the column
    runs once per sweep instead of once per column, so it may only set the body's own
    locals (which it sets to the same value for every column)."""
    column = {j}
    changed = True
    while changed:
        changed = False
        for s in stmts:
            name = None
            match s:
                case ir.Decl(name=n):
                    name = n
                case ir.Assign(target=ir.Var(name=n)):
                    name = n
            if name is not None and name not in column and _reads(s) & column:
                column.add(name)
                changed = True
    declared = {s.name for s in stmts if isinstance(s, ir.Decl)}
    declared |= {s.var for s in stmts if isinstance(s, ir.For)}
    for s in stmts:
        match s:
            case ir.For(var=var) if var in column or _reads(s) & column:
                return None  # a loop whose trip count depends on the column
            case ir.Assign(target=ir.Load(index=index)) if not free_vars(index) & column:
                return None  # a store every column would make to one place
            case ir.Assign(target=ir.Var(name=name)) if name not in declared:
                return None  # an update of a variable from outside: once per column
            case ir.Decl(init=init) | ir.Assign(value=init) if init is not None and (
                _calls(init) & _LANE_CALLS
            ):
                return None
    if not column - {j} <= declared:
        return None  # a value carried across columns (declared outside the loop)
    return column


# ------------------------------------------------------------------- rewrite
def _coarsen(loop: ir.For, n: int) -> ir.Block | None:
    if loop.start != ir.IntLit(0) or loop.unroll:
        return None
    stmts = _walk(loop.body)
    if stmts is None:
        return None
    j = loop.var
    column = _per_column(stmts, j)
    if column is None:
        return None
    # only worth it when a serial loop does per-column work that shares its other loads
    if not any(isinstance(s, ir.For) and _touches(s.body, column) for s in stmts):
        return None
    stmts_out: list[ir.Stmt] = [
        ir.Comment(f"{' then '.join(map(str, FACTORS))} columns of {j} per thread, then one")
    ]
    start: ir.Expr = ir.IntLit(0)

    def plus(a: ir.Expr, b: ir.Expr) -> ir.Expr:
        return b if a == ir.IntLit(0) else ir.Bin("+", a, b)

    for factor in FACTORS:
        span, tiles, tile = f"sc_span{n}_{factor}", f"sc_tiles{n}_{factor}", f"sc_tile{n}_{factor}"
        first = ir.Bin("+", plus(start, ir.Bin("*", ir.Var(tile), ir.Var(span))), _THREAD)
        columns = [
            ir.Decl(
                ir.I64,
                _rename(j, c),
                plus(first, ir.Bin("*", ir.IntLit(c), _THREADS)) if c else first,
            )
            for c in range(factor)
        ]
        body = _split(loop.body, column, factor)
        stmts_out += [
            ir.Decl(ir.I64, span, ir.Bin("*", ir.IntLit(factor), _THREADS)),
            ir.Decl(
                ir.I64,
                tiles,
                ir.Bin(
                    "/",
                    loop.end if start == ir.IntLit(0) else ir.Bin("-", loop.end, start),
                    ir.Var(span),
                ),
            ),
            ir.For(tile, ir.IntLit(0), ir.Var(tiles), ir.Block((*columns, *body.body))),
        ]
        start = plus(start, ir.Bin("*", ir.Var(tiles), ir.Var(span)))
    stmts_out.append(replace(loop, start=start))
    return ir.Block(tuple(stmts_out))


def _touches(b: ir.Block, column: set[str]) -> bool:
    stmts = _walk(b) or []
    return any(_reads(s) & column or _writes(s) & column for s in stmts)


def _writes(s: ir.Stmt) -> set[str]:
    match s:
        case ir.Decl(name=n) | ir.Assign(target=ir.Var(name=n)):
            return {n}
    return set()


def _rename(name: str, c: int) -> str:
    return f"sc_{name}_{c}"


def _split(b: ir.Block, column: set[str], factor: int) -> ir.Block:
    """``b`` with each per-column statement repeated for ``factor`` columns (its locals
    renamed), shared statements and loops kept once."""
    out: list[ir.Stmt] = []
    for s in b.body:
        match s:
            case ir.For():
                out.append(replace(s, body=_split(s.body, column, factor)))
            case ir.Block():
                out.extend(_split(s, column, factor).body)
            case ir.Comment():
                out.append(s)
            case _ if (_reads(s) | _writes(s)) & column:
                out.extend(
                    _substitute(s, {v: _rename(v, c) for v in column}) for c in range(factor)
                )
            case _:
                out.append(s)
    return ir.Block(tuple(out))


def _substitute(s: ir.Stmt, names: dict[str, str]) -> ir.Stmt:
    """``s`` with the variables in ``names`` renamed (its own declaration included)."""
    env = {old: ir.Var(new) for old, new in names.items()}
    match s:
        case ir.Decl(name=n, init=init):
            return replace(
                s, name=names.get(n, n), init=None if init is None else substitute(init, env)
            )
        case ir.Assign(target=ir.Var(name=n), value=value):
            return replace(s, target=ir.Var(names.get(n, n)), value=substitute(value, env))
        case ir.Assign(target=ir.Load(array=a, index=index), value=value):
            return replace(
                s, target=ir.Load(a, substitute(index, env)), value=substitute(value, env)
            )
    raise AssertionError(s)
