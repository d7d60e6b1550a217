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
runtime's cost model (`sparsec.kernel._bands_pay`): ``0`` runs each row whole in one band,
which is the loop the tile pass made. Every output element gets the same additions in the
same order either way, so results do not depend on the choice.

The pass applies to a parallel CPU loop at the top of the kernel whose body is local
declarations around exactly one tiled region (as `tile.tile` builds it), with the number
of tiles computed from values fixed for the whole kernel; anything else is left alone.
It is C-only.
"""

from __future__ import annotations

from dataclasses import replace

from . import ir
from .tile import free_vars

#: the kernel parameter that holds the tiles per band for a call (0: whole rows)
BAND = "sc_band"


def band(body: ir.Block) -> tuple[ir.Block, tuple[str, ...]]:
    """``body`` with each eligible top-level parallel loop run in column bands, and a
    note per loop banded."""
    out: list[ir.Stmt] = []
    notes: list[str] = []
    for s in body.body:
        banded = _banded(s) if isinstance(s, ir.For) else None
        if banded is None:
            out.append(s)
            continue
        out.append(banded)
        notes.append("register tiles run in column bands when the runtime finds it pays")
    return ir.Block(tuple(out)), tuple(notes)


def _tiled_region(s: ir.Stmt) -> tuple[ir.Comment, ir.Decl, ir.For, ir.If] | None:
    """The parts of a region the tile pass built: a comment, the tile count, the loop
    over tiles and the leftover columns."""
    if not isinstance(s, ir.Block) or len(s.body) != 4:
        return None
    comment, count, tiles, rest = s.body
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
    return comment, count, tiles, rest


def _banded(loop: ir.For) -> ir.Block | None:
    par = loop.parallel
    if par is None or par.unit != "CPUThread" or par.reduction or par.flags or par.collapse != 1:
        return None
    work = [s for s in loop.body.body if not isinstance(s, ir.Decl | ir.Comment)]
    if len(work) != 1:
        return None  # anything besides the region would run once per band
    parts = _tiled_region(work[0])
    if parts is None:
        return None
    comment, count, tiles, rest = parts
    assert count.init is not None
    local = {loop.var} | {s.name for s in loop.body.body if isinstance(s, ir.Decl)}
    if free_vars(count.init) & local:
        return None
    uid = count.name.removeprefix("sc_tiles")
    b, width, bands = ir.Var(f"sc_b{uid}"), ir.Var(f"sc_bw{uid}"), ir.Var(f"sc_bands{uid}")
    total = ir.Var(count.name)
    one = ir.IntLit(1)
    first = ir.Bin("*", b, width)
    body = []
    for s in loop.body.body:
        if s is work[0]:
            s = ir.Block(
                (
                    comment,
                    replace(tiles, start=first, end=ir.Call("min", (total, ir.add(first, width)))),
                    ir.If(((ir.Bin("==", b, ir.Bin("-", bands, one)), ir.Block((rest,))),)),
                )
            )
        body.append(s)
    rows = replace(loop, body=ir.Block(tuple(body)), parallel=None)
    return ir.Block(
        (
            ir.Comment(f"loop {tiles.var}'s tiles in bands of {BAND} tiles (0: whole rows)"),
            count,
            ir.Decl(
                ir.I64,
                width.name,
                ir.Select(
                    ir.Bin(">", ir.Var(BAND), ir.IntLit(0)),
                    ir.Var(BAND),
                    ir.Call("max", (total, one)),
                ),
            ),
            ir.Decl(
                ir.I64,
                bands.name,
                ir.Call(
                    "max",
                    (one, ir.Bin("/", ir.Bin("-", ir.add(total, width), one), width)),
                ),
            ),
            ir.For(
                b.name,
                ir.IntLit(0),
                bands,
                ir.Block((rows,)),
                parallel=replace(par, collapse=2),
            ),
        )
    )
