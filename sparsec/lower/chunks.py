"""The single pass of a rowwise sparse output (CSR) in chunks of rows, on threads.

The runtime cuts the rows into chunks of consecutive rows (balanced by the inputs' entries)
and gives each chunk its own region of the output's crd and vals, each large enough for the
whole output (the proven capacity of `sparsec.middle.bound`). A chunk appends its rows into
its region from its own counter, exactly as the serial pass does, and records each row's end
in ``pos``. Then the chunks are moved down to follow each other: chunk 0's region is where
the output starts, so it stays; every other chunk's entries are copied to the end of those
before it, in parallel, and its rows' ``pos`` shifted by as much. The copies never overlap:
the output fits region 0 (its size is at most the capacity), and every other region lies
past it.

This replaces counting every row, a prefix sum and a second pass (`sparse_out.two_phase`)
with one pass and a copy of the entries outside chunk 0.

The runtime passes the chunks in ``sc_sizes`` after the output's level sizes (``L`` of them,
``C`` chunks), laid out by `table`::

    sc_sizes[L]                      C
    sc_sizes[L + 1 + c]              chunk c's first row (C + 1 entries: the last is the rows)
    sc_sizes[L + 2 + C + c]          chunk c's region starts (C + 1 entries: the last ends it)
    sc_sizes[L + 3 + 2C + c]         written: the end chunk c reached (-1: out of room),
                                     then its entries
    sc_sizes[L + 3 + 3C + c]         written: where chunk c's entries go

and reads the output's entries from ``sc_sizes[last]``. A chunk out of room leaves its rows
(`LEAVE`) and the kernel reports CAPACITY_EXCEEDED once every chunk has stopped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..abi import CAPACITY_EXCEEDED, Namer
from ..ir import nodes as ir
from ..ir.visit import statements

#: the label a chunk out of room jumps to (the end of its rows)
LEAVE = "sc_leave"


def table(levels: int, chunks: int) -> tuple[int, int, int, int, int]:
    """Where the chunk table's parts start in ``sc_sizes`` (rows, regions, ends,
    destinations), and the table's length, for an output of ``levels`` levels."""
    rows = levels + 1
    regions = rows + chunks + 1
    ends = regions + chunks + 1
    dests = ends + chunks
    return rows, regions, ends, dests, dests + chunks


@dataclass(frozen=True, slots=True)
class ChunkFrame:
    """The kernel's names that the chunked single pass uses (`Assembler.chunk_frame`)."""

    #: the row loop's variable and its extent
    row: str
    rows: ir.Expr
    #: the last level's counter and capacity (declared per chunk), the out-of-room flag
    count: str
    capacity: str
    failed: str
    sizes: str
    #: the output's levels, its last level, that level's pos, and the arrays moved
    levels: int
    last: int
    pos: str
    arrays: tuple[tuple[str, str], ...]
    namer: Namer


def _at(frame: ChunkFrame, start: int, chunks: ir.Expr, times: int, c: ir.Expr) -> ir.Load:
    """``sc_sizes[start + times * C + c]``."""
    off: ir.Expr = ir.IntLit(start)
    if times:
        off = ir.Bin("+", off, ir.mul(ir.IntLit(times), chunks))
    return ir.Load(frame.sizes, ir.add(off, c))


def wrap(body: ir.Block, frame: ChunkFrame) -> ir.Block | None:
    """``body`` with its row loop run in chunks, then the chunks moved into place; None
    when the body has no plain loop over all rows at its top, or one row's iteration
    continues where the previous left off (the serial pass runs)."""
    at = next(
        (
            n
            for n, s in enumerate(body.body)
            if isinstance(s, ir.For)
            and s.var == frame.row
            and s.start == ir.IntLit(0)
            and s.end == frame.rows
            and s.parallel is None
        ),
        None,
    )
    if at is None:
        return None
    loop = body.body[at]
    assert isinstance(loop, ir.For)
    # a variable declared before the rows and advanced in them (a cursor over another
    # operand's rows, merged with the output's) carries one row into the next, and an
    # array allocated before them and written in them is shared: serial
    before = {s.name for s in body.body[:at] if isinstance(s, ir.Decl | ir.Alloc | ir.Pointer)}
    if before & _written(loop.body):
        return None
    L = frame.levels
    fresh = frame.namer.fresh
    chunks, c = ir.Var(fresh("chunks")), ir.Var(fresh("c"))
    threads = ir.Parallel("CPUThread", "static")

    def sizes(start: int, times: int, index: ir.Expr) -> ir.Load:
        return _at(frame, start, chunks, times, index)

    count = ir.Var(frame.count)
    rows = ir.For(frame.row, sizes(L + 1, 0, c), sizes(L + 2, 0, c), loop.body)
    ended = ir.Select(ir.Var(frame.failed), ir.IntLit(-1), count)
    run = ir.For(
        c.name,
        ir.IntLit(0),
        chunks,
        ir.block(
            ir.Decl(ir.I64, frame.count, sizes(L + 2, 1, c)),
            ir.Decl(ir.I64, frame.capacity, sizes(L + 3, 1, c)),
            ir.Decl(ir.I64, frame.failed, ir.IntLit(0)),
            rows,
            ir.Label(LEAVE),
            ir.Assign(sizes(L + 3, 2, c), ended),
        ),
        parallel=threads,
    )
    return ir.block(
        *body.body[:at],
        ir.Decl(ir.I64, chunks.name, ir.Load(frame.sizes, ir.IntLit(L))),
        run,
        *body.body[at + 1 :],
        *_compact(frame, chunks, sizes),
    )


def _written(body: ir.Block) -> set[str]:
    """The variables and arrays that the statements in ``body`` assign or pass to a call."""
    names: set[str] = set()
    for s in statements(body):
        if isinstance(s, ir.Assign):
            target = s.target
            names.add(target.name if isinstance(target, ir.Var) else target.array)
        elif isinstance(s, ir.Effect):
            names.update(a.name for a in s.call.args if isinstance(a, ir.Var))
    return names


def _compact(
    frame: ChunkFrame, chunks: ir.Var, sizes: Callable[[int, int, ir.Expr], ir.Load]
) -> list[ir.Stmt]:
    """After every chunk ran: where each chunk's entries go (or CAPACITY_EXCEEDED: a chunk
    ran out of room, or all of them together do not fit region 0), then every chunk but
    the first moved there, in equal shares, and its rows' pos shifted."""
    L = frame.levels
    fresh = frame.namer.fresh
    to, bad = ir.Var(fresh("to")), ir.Var(fresh("bad"))
    c, end, start = ir.Var(fresh("c")), ir.Var(fresh("end")), ir.Var(fresh("from"))
    plan = ir.For(
        c.name,
        ir.IntLit(0),
        chunks,
        ir.block(
            ir.Decl(ir.I64, end.name, sizes(L + 3, 2, c)),
            ir.Decl(ir.I64, start.name, sizes(L + 2, 1, c)),
            ir.If(((ir.Bin("<", end, ir.IntLit(0)), ir.block(ir.Assign(bad, ir.IntLit(1)))),)),
            ir.Assign(sizes(L + 3, 2, c), ir.Bin("-", end, start)),
            ir.Assign(sizes(L + 3, 3, c), to),
            ir.Assign(to, ir.Bin("+", to, ir.Bin("-", end, start))),
        ),
    )
    # the entries after chunk 0 are moved in equal shares, one per chunk's thread, each
    # share taking its part of every chunk it covers; each thread shifts its chunk's pos
    first, moved = ir.Var(fresh("first")), ir.Var(fresh("moved"))
    t, m, p = ir.Var(fresh("t")), ir.Var(fresh("c")), fresh("p")
    lo, hi, dest = ir.Var(fresh("lo")), ir.Var(fresh("hi")), ir.Var(fresh("to"))
    a, b = ir.Var(fresh("a")), ir.Var(fresh("b"))

    def share(k: ir.Expr) -> ir.Expr:
        return ir.Bin("+", first, ir.Bin("/", ir.Bin("*", moved, k), chunks))

    src = ir.Bin("+", sizes(L + 2, 1, m), ir.Bin("-", a, dest))
    copies: list[ir.Stmt] = [
        ir.Effect(
            ir.Call(
                "copy", (ir.Bin("+", ir.Var(x), a), ir.Bin("+", ir.Var(x), src), ir.Bin("-", b, a))
            )
        )
        for _, x in frame.arrays
    ]
    parts = ir.For(
        m.name,
        ir.IntLit(1),
        chunks,
        ir.block(
            ir.Decl(ir.I64, dest.name, sizes(L + 3, 3, m)),
            ir.Decl(ir.I64, a.name, ir.Call("max", (lo, dest))),
            ir.Decl(ir.I64, b.name, ir.Call("min", (hi, ir.Bin("+", dest, sizes(L + 3, 2, m))))),
            ir.If(((ir.Bin("<", a, b), ir.block(*copies)),)),
        ),
    )
    slot = ir.Load(frame.pos, ir.Bin("+", ir.Var(p), ir.IntLit(1)))
    shift = ir.Bin("-", sizes(L + 2, 1, t), sizes(L + 3, 3, t))
    shifted = ir.Assign(slot, ir.Bin("-", slot, shift))
    rows = ir.For(p, sizes(L + 1, 0, t), sizes(L + 2, 0, t), ir.block(shifted))
    move = ir.For(
        t.name,
        ir.IntLit(0),
        chunks,
        ir.block(
            ir.Decl(ir.I64, lo.name, share(t)),
            ir.Decl(ir.I64, hi.name, share(ir.Bin("+", t, ir.IntLit(1)))),
            parts,
            ir.If(((ir.Bin(">", t, ir.IntLit(0)), ir.block(rows)),)),
        ),
        parallel=ir.Parallel("CPUThread", "static"),
    )
    return [
        ir.Decl(ir.I64, to.name, ir.IntLit(0)),
        ir.Decl(ir.I64, bad.name, ir.IntLit(0)),
        plan,
        # the output must fit region 0 for the moves not to overlap: it does when the
        # bound holds; a bound too small for the whole (not for any chunk) stops here
        ir.Return(CAPACITY_EXCEEDED, ir.Bin("||", bad, ir.Bin(">", to, sizes(L + 3, 0, chunks)))),
        ir.Assign(ir.Load(frame.sizes, ir.IntLit(frame.last)), to),
        ir.Decl(ir.I64, first.name, sizes(L + 3, 2, ir.IntLit(0))),
        ir.Decl(ir.I64, moved.name, ir.Bin("-", to, first)),
        move,
    ]
