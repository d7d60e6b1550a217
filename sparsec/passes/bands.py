"""Column bands: run a parallel row loop's register tiles band by band.

After the tile pass, SpMM ``Y(i,j) = W(i,k) * X(k,j)`` is ``parallel for i: for each tile
of j: for p in row i: acc += w * X[crd[p], tile]``. Each row gathers whole rows of ``X``
(all ``j``), so once ``X`` outgrows the caches every row of ``W`` streams its rows of
``X`` from memory again. This pass reorders the work into *bands* of columns, band-major:

    parallel for (band, i) (OpenMP collapse(2)): for each tile of row i in the band: ...

While the threads work through a band, only that band of ``X`` is live (a band of 4 tiles
is 1 KB of each row), so it stays in cache across all the rows that read it. Within a
band the rows are shared out as before (OpenMP dynamic, the same chunks), and each
(band, row) pair writes only its own tiles of the output row, so the loop stays free of
races. The columns left over after the last whole tile run with the last band.

How many tiles make a band is the kernel's ``sc_band`` argument, chosen per call by the
runtime's cost model (`sparsec.policy.costs.bands_pay`): ``0`` runs each row whole in one band,
which is the loop the tile pass made. Every output element gets the same additions in the
same order either way, so results do not depend on the choice.

The pass applies to a parallel CPU loop at the top of the kernel whose body is local
declarations around exactly one tiled region (as `tile.tile` builds it), with the number
of tiles computed from values fixed for the whole kernel; anything else is left alone.
It is C-only.

*Depth blocks* go one step further, for the calls where even a band of ``X`` is too large
for the core's cache (many rows of ``X``, few columns: BERT-base 768x3072 at 512 columns
gathers 1 GB from a 6 MB ``X``). When the region's reduction walks one compressed level
(SpMM's ``p in row i``, coordinate ``k``), the kernel runs over blocks of ``sc_depth``
coordinates of ``k``, one after the other: each row gathers only the rows of ``X`` in the
block, so the block (``sc_depth`` rows of ``X``) stays in the core's cache across all rows
of ``W``. A row finds its positions in the block by galloping search (segments of a
compressed level are sorted); its tiles start from zero in the first block and from the
stored output after it, and the columns left over are zeroed in the first block only.
Every output element still gets the same additions in the same order (coordinates in
increasing order), so results are bit-identical for every ``sc_depth``; ``0`` is one block.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from ..ir import nodes as ir
from ..ir.visit import (
    bindings,
    exprs,
    free_vars,
    map_blocks,
    map_children,
    statements,
    subexpressions,
    substitute,
)
from ..middle.commands import Unit
from .tile import zero_store

#: the kernel parameter that holds the tiles per band for a call (0: whole rows)
BAND = "sc_band"
#: the kernel parameter that holds the coordinates per depth block for a call (0: one block)
DEPTH = "sc_depth"
BAND_NOTE = "register tiles run in column bands when the runtime finds it pays"
DEPTH_NOTE = "and in depth blocks of the reduction when the runtime finds it pays"
#: a compressed level's ``crd`` array -> (its ``pos`` array, the level's extent)
Walks = Mapping[str, tuple[str, ir.Expr]]


def band(
    body: ir.Block, walks: Walks | None = None
) -> tuple[ir.Block, tuple[str, ...], tuple[str, ...]]:
    """``body`` with each eligible top-level parallel loop run in column bands (and in
    depth blocks where ``walks`` names the compressed level its reduction walks), a note
    per loop rewritten, and the parameters the rewritten kernel takes (`BAND`, `DEPTH`)."""
    out: list[ir.Stmt] = []
    notes: list[str] = []
    params: dict[str, None] = {}
    for s in body.body:
        banded = _banded(s, walks or {}) if isinstance(s, ir.For) else None
        if banded is None:
            out.append(s)
            continue
        stmt, deep = banded
        out.append(stmt)
        notes.append(f"{BAND_NOTE} {DEPTH_NOTE}" if deep else BAND_NOTE)
        params[BAND] = None
        if deep:
            params[DEPTH] = None
    return ir.Block(tuple(out)), tuple(notes), tuple(params)


def _tiled_region(
    s: ir.Stmt,
) -> tuple[ir.Comment, ir.Decl, ir.For, ir.If, ir.Expr | None] | None:
    """The parts of a region the tile pass built: a comment, the tile count, the loop
    over tiles, the leftover columns, and the condition the loop is built under (`stages`;
    None: always)."""
    if not isinstance(s, ir.Block) or len(s.body) != 4:
        return None
    comment, count, tiles, rest = s.body
    built = None
    if isinstance(tiles, ir.If) and len(tiles.branches) == 1 and tiles.orelse is None:
        ((built, block),) = tiles.branches
        if len(block.body) != 1:
            return None
        tiles = block.body[0]
    if not (
        isinstance(comment, ir.Comment)
        and isinstance(count, ir.Decl)
        and count.name.startswith("sc_tiles")
        and count.init is not None
        and isinstance(tiles, ir.For)
        and tiles.start == ir.IntLit(0)
        and tiles.end == ir.Var(count.name)
        and tiles.parallel is None
        and isinstance(rest, ir.If)
        and len(rest.branches) == 1
        and rest.orelse is None
    ):
        return None
    return comment, count, tiles, rest, built


def _banded(loop: ir.For, walks: Walks) -> tuple[ir.Block, bool] | None:
    """The loop in bands (and depth blocks when its region allows), and whether in depth
    blocks; None when the loop is not in the form the pass understands."""
    par = loop.parallel
    if par is None or par.unit != Unit.CPUThread or par.reduction or par.flags or par.collapse != 1:
        return None
    work = [s for s in loop.body.body if not isinstance(s, ir.Decl | ir.Comment)]
    if len(work) != 1:
        return None  # anything besides the region would run once per band
    parts = _tiled_region(work[0])
    if parts is None:
        return None
    comment, count, tiles, rest, built = parts
    assert count.init is not None
    local = {loop.var} | {s.name for s in loop.body.body if isinstance(s, ir.Decl)}
    if free_vars(count.init) & local:
        return None
    uid = count.name.removeprefix("sc_tiles")
    b, width, bands = ir.Var(f"sc_b{uid}"), ir.Var(f"sc_bw{uid}"), ir.Var(f"sc_bands{uid}")
    total = ir.Var(count.name)
    one = ir.IntLit(1)
    first = ir.Bin("*", b, width)
    tiles = replace(tiles, start=first, end=ir.Call("min", (total, ir.add(first, width))))
    loop_name = tiles.var
    row_decls = [s for s in loop.body.body if isinstance(s, ir.Decl)]
    deep = _Depth.of(uid, tiles, rest, row_decls, walks)
    body: list[ir.Stmt] = []
    for s in loop.body.body:
        if s is work[0]:
            region: ir.Stmt = tiles
            leftover: ir.Stmt = rest
            if deep is not None:
                body.extend(deep.bounds)
                region, leftover = deep.tiles, deep.rest
            if built is not None:
                region = ir.If(((built, ir.Block((region,))),))
            s = ir.Block(
                (
                    comment,
                    region,
                    ir.If(((ir.Bin("==", b, ir.Bin("-", bands, one)), ir.Block((leftover,))),)),
                )
            )
        body.append(s)
    rows = replace(loop, body=ir.Block(tuple(body)), parallel=None)
    banded: ir.Stmt = ir.For(
        b.name, ir.IntLit(0), bands, ir.Block((rows,)), parallel=replace(par, collapse=2)
    )
    head: list[ir.Stmt] = [
        ir.Comment(f"loop {loop_name}'s tiles in bands of {BAND} tiles (0: whole rows)"),
        count,
        ir.Decl(
            ir.I64,
            width.name,
            ir.Select(
                ir.Bin(">", ir.Var(BAND), ir.IntLit(0)), ir.Var(BAND), ir.Call("max", (total, one))
            ),
        ),
        ir.Decl(
            ir.I64,
            bands.name,
            ir.Call("max", (one, ir.Bin("/", ir.Bin("-", ir.add(total, width), one), width))),
        ),
    ]
    if deep is not None:
        head.extend(deep.head)
        banded = ir.For(deep.block.name, ir.IntLit(0), deep.blocks, ir.Block((banded,)))
    return ir.Block((*head, banded)), deep is not None


@dataclass(frozen=True, slots=True)
class _Walk:
    """The reduction loop(s) of a region: over positions ``var`` of one compressed level,
    from ``start`` (``pos[p]``) to ``end`` (a local holding ``pos[p + 1]``)."""

    var: str
    start: ir.Expr
    end: ir.Var
    crd: str
    extent: ir.Expr


def _walk(tiles: ir.For, row_decls: list[ir.Decl], walks: Walks) -> _Walk | None:
    """The walk of the tiles' region, when its one loop is over the positions of one
    compressed level's segment and holds no loop itself."""
    loops = [s for s in tiles.body.body if isinstance(s, ir.For)]
    if len(loops) != 1 or any(isinstance(x, ir.For) for x in statements(loops[0].body)):
        return None
    (loop,) = loops
    var, start, end = loop.var, loop.start, loop.end
    if not isinstance(end, ir.Var):
        return None
    at = ir.Var(var)
    crds = {
        d.init.array
        for d in loop.body.body
        if isinstance(d, ir.Decl) and isinstance(d.init, ir.Load) and d.init.index == at
    } & set(walks)
    if len(crds) != 1:
        return None
    (crd,) = crds
    pos, extent = walks[crd]
    if not isinstance(start, ir.Load) or start.array != pos:
        return None
    env = bindings(row_decls)
    segment_end = ir.Load(pos, ir.add(substitute(start.index, env), ir.IntLit(1)))
    if end.name not in env or env[end.name] != segment_end:
        return None
    return _Walk(var, start, end, crd, extent)


@dataclass(frozen=True, slots=True)
class _Depth:
    """A banded region rewritten to run over one depth block of its walk per pass."""

    block: ir.Var
    blocks: ir.Var
    #: the block size and count, before the loop over blocks
    head: tuple[ir.Stmt, ...]
    #: the row's positions in the block, before the region
    bounds: tuple[ir.Stmt, ...]
    tiles: ir.Stmt
    rest: ir.Stmt

    @staticmethod
    def of(
        uid: str, tiles: ir.For, rest: ir.If, row_decls: list[ir.Decl], walks: Walks
    ) -> _Depth | None:
        walk = _walk(tiles, row_decls, walks)
        if walk is None:
            return None
        kb, size, count = ir.Var(f"sc_kb{uid}"), ir.Var(f"sc_kd{uid}"), ir.Var(f"sc_kbs{uid}")
        lo, hi = ir.Var(f"sc_lo{uid}"), ir.Var(f"sc_hi{uid}")
        initial = ir.Bin("==", kb, ir.IntLit(0))

        def swap(e: ir.Expr) -> ir.Expr:
            if e == walk.start:
                return lo
            if e == walk.end:
                return hi
            return map_children(e, swap)

        try:
            new_tiles = _deepen_tiles(tiles, walk, swap, initial)
            new_rest = _deepen_rest(rest, walk, swap, initial)
        except _Refuse:
            return None
        if _mentions((new_tiles, new_rest), (walk.start, walk.end)):
            return None  # the segment's bounds are used in a way not understood
        one = ir.IntLit(1)
        key = ir.Bin("*", kb, size)
        several = ir.Bin(">", count, one)
        head = (
            ir.Decl(
                ir.I64,
                size.name,
                ir.Select(
                    ir.Bin(">", ir.Var(DEPTH), ir.IntLit(0)),
                    ir.Var(DEPTH),
                    ir.Call("max", (walk.extent, one)),
                ),
            ),
            ir.Decl(
                ir.I64,
                count.name,
                ir.Call(
                    "max", (one, ir.Bin("/", ir.Bin("-", ir.add(walk.extent, size), one), size))
                ),
            ),
        )
        crd = ir.Var(walk.crd)
        bounds = (
            ir.Decl(
                ir.I64,
                lo.name,
                ir.Select(
                    several, ir.Call("gallop_row", (crd, walk.start, walk.end, key)), walk.start
                ),
            ),
            ir.Decl(
                ir.I64,
                hi.name,
                ir.Select(
                    several, ir.Call("gallop_row", (crd, lo, walk.end, ir.add(key, size))), walk.end
                ),
            ),
        )
        # a later block with no positions in this row leaves its tiles as they are
        guarded = ir.If(((ir.Bin("||", initial, ir.Bin("<", lo, hi)), ir.Block((new_tiles,))),))
        return _Depth(kb, count, head, bounds, guarded, new_rest)


class _Refuse(Exception):
    """The region is not in the form depth blocks understand."""


def _deepen_tiles(
    tiles: ir.For, walk: _Walk, swap: Callable[[ir.Expr], ir.Expr], initial: ir.Expr
) -> ir.For:
    """The tile loop over the block's positions: zero-started accumulators start from
    zero in the first block and from the stored tile after it."""
    stored: dict[str, ir.Expr] = {}
    for s in tiles.body.body:
        if isinstance(s, ir.Effect) and s.call.fn == "vstore":
            at, value = s.call.args
            if isinstance(value, ir.Var):
                stored[value.name] = at
    body: list[ir.Stmt] = []
    for s in tiles.body.body:
        if isinstance(s, ir.Decl) and s.init == ir.Call("vzero", ()):
            if s.name not in stored:
                raise _Refuse
            resume = ir.Call("vload", (stored[s.name],))
            s = replace(s, init=ir.Select(initial, s.init, resume))
        elif isinstance(s, ir.Decl) and s.init is not None:
            s = replace(s, init=swap(s.init))
        elif isinstance(s, ir.For) and s.var == walk.var:
            s = replace(s, start=swap(s.start), end=swap(s.end), body=_swap_effects(s.body, swap))
        elif not isinstance(s, ir.Effect | ir.Comment):
            raise _Refuse
        body.append(s)
    return replace(tiles, body=ir.Block(tuple(body)))


def _swap_effects(body: ir.Block, swap: Callable[[ir.Expr], ir.Expr]) -> ir.Block:
    """The walk's body with its effects' arguments swapped: a prefetch clamped to the
    segment's last position is clamped to the block's."""
    return ir.Block(
        tuple(
            ir.Effect(replace(s.call, args=tuple(swap(a) for a in s.call.args)))
            if isinstance(s, ir.Effect)
            else s
            for s in body.body
        )
    )


def _deepen_rest(
    s: ir.Stmt, walk: _Walk, swap: Callable[[ir.Expr], ir.Expr], initial: ir.Expr
) -> ir.Stmt:
    """The leftover columns over the block's positions: loops that zero the output run
    in the first block only; any other write must add."""
    match s:
        case ir.For() if zero_store(s) is not None:
            return ir.If(((initial, ir.Block((s,))),))
        case ir.For() if _stores_tiles(s):
            return _deepen_tiles(s, walk, swap, initial)  # the narrower tiles
        case ir.For(var=var) if var == walk.var:
            s = replace(s, start=swap(s.start), end=swap(s.end))
        case ir.Assign(target=ir.Load(), op=op) if op != "+=":
            raise _Refuse
        case ir.Decl(init=init) if init is not None:
            return replace(s, init=swap(init))
        case ir.Decl() | ir.Assign() | ir.For() | ir.If() | ir.Block() | ir.Comment():
            pass
        case _:
            raise _Refuse
    return map_blocks(
        s, lambda blk: ir.Block(tuple(_deepen_rest(x, walk, swap, initial) for x in blk.body))
    )


def _stores_tiles(loop: ir.For) -> bool:
    """Whether ``loop`` is a loop over register tiles (its body stores them)."""
    return any(isinstance(x, ir.Effect) and x.call.fn == "vstore" for x in loop.body.body)


def _mentions(stmts: tuple[ir.Stmt, ...], targets: tuple[ir.Expr, ...]) -> bool:
    """Whether any of ``targets`` occurs in the statements (nested ones included)."""
    return any(
        x in targets
        for s in statements(ir.Block(stmts))
        for e in exprs(s)
        for x in subexpressions(e)
    )
