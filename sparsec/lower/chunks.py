"""The single pass of a rowwise sparse output (CSR) in chunks of rows, on threads.

The runtime cuts the rows into chunks of consecutive rows (balanced by the inputs' entries)
and gives each chunk its own region of the output's crd and vals, each large enough for the
entries of its own rows (the proven bound of `sparsec.middle.capacity` over those rows), one
after the other. A chunk appends its rows into its region from its own counter, exactly as
the serial pass does, records each row's end in ``pos`` and its own end in the chunk table.
The runtime then moves the chunks together (`sparsec.runtime.sparse_out.chunked_pass`):
chunk 0's region is where the output starts, so it stays; every other chunk's entries are
copied behind those before it and its rows' ``pos`` shifted by as much. Each copy goes
leftwards from its region's start and ends before the next region, so it overwrites
nothing not yet moved (where it overlaps its own source, numpy copies through a buffer).

This replaces counting every row, a prefix sum and a second pass (`sparse_out.two_phase`)
with one pass and a copy of the entries outside chunk 0. The moves are the runtime's (numpy
copies) rather than generated C: in C they made a sparse add's compile markedly slower for
a copy that is a small part of the pass (docs/decisions.md, "CSR-like outputs on several
threads").

One chunk's rows are their own function (`APPEND_ROWS_NAME`, the serial pass's body with its
rows and its region given by the chunk): inside an OpenMP loop the compiler would reach the
kernel's arrays through the loop's shared data and lose their ``restrict`` (a merge ran
slower so); a function keeps them. It stops with CAPACITY_EXCEEDED like the serial pass, and
the loop marks that chunk's end -1.

The runtime passes the chunks in ``sc_sizes`` after the output's level sizes (``L`` of them,
``C`` chunks), laid out as `sparsec.abi.CHUNK_TABLE` says (`Table` reads it)::

    sc_sizes[L]                      C
    sc_sizes[L + 1 + c]              chunk c's first row (C + 1 entries: the last is the rows)
    sc_sizes[L + 2 + C + c]          chunk c's region starts (C + 1 entries: the last ends it)
    sc_sizes[L + 3 + 2C + c]         written: the end chunk c reached (-1: it stopped)
"""

from __future__ import annotations

from dataclasses import dataclass

from ..abi import APPEND_ROWS_NAME, CHUNK_PARAM, CHUNK_TABLE, Namer
from ..ir import nodes as ir
from ..ir.visit import statements
from ..middle.commands import Unit


@dataclass(frozen=True, slots=True)
class Table:
    """The chunk table in the kernel: ``sizes`` (``sc_sizes``) after ``levels`` sizes."""

    sizes: str
    levels: int
    chunks: ir.Expr

    def _at(self, part: str, c: ir.Expr) -> ir.Load:
        start, times = CHUNK_TABLE[part]
        off: ir.Expr = ir.IntLit(self.levels + start)
        if times:
            off = ir.Bin("+", off, ir.mul(ir.IntLit(times), self.chunks))
        return ir.Load(self.sizes, ir.add(off, c))

    def row(self, c: ir.Expr) -> ir.Load:
        return self._at("row", c)

    def region(self, c: ir.Expr) -> ir.Load:
        return self._at("region", c)

    def end(self, c: ir.Expr) -> ir.Load:
        return self._at("end", c)


@dataclass(frozen=True, slots=True)
class ChunkFrame:
    """The kernel's names that the chunked single pass uses (`Assembler.chunk_frame`)."""

    #: the row loop's variable and its extent
    row: str
    rows: ir.Expr
    #: the variable holding the chunk count (declared by the rows function's prologue)
    chunks: str
    sizes: str
    #: the output's levels, its last level, that level's pos, and the arrays moved
    levels: int
    last: int
    pos: str
    arrays: tuple[str, ...]
    #: the kernel's parameters, in order (the rows function is called with them)
    params: tuple[str, ...]
    namer: Namer
    #: what the rows function carries from row to row by design: the output's counter
    #: (from the chunk's region start) and the workspace (each call allocates its own)
    carried: frozenset[str] = frozenset()


def wrap(body: ir.Block, frame: ChunkFrame) -> tuple[ir.Block, ir.Block] | None:
    """From the lowered single pass ``body`` (its prologue and epilogue those of a chunk,
    `Assembler.chunked`): the rows function's body (its row loop over the chunk's rows)
    and the append function's (the chunks on threads; the runtime moves them). None when
    the body has no plain loop over all rows at its top, or one row's iteration continues
    where the previous left off (the serial pass runs)."""
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
    # operand's rows, merged with the output's) carries one row into the next: serial
    before = {s.name for s in body.body[:at] if isinstance(s, ir.Decl | ir.Alloc | ir.Pointer)}
    if (before - frame.carried) & _written(loop.body):
        return None
    chunk = ir.Var(CHUNK_PARAM)
    mine = Table(frame.sizes, frame.levels, ir.Var(frame.chunks))
    rows = ir.For(frame.row, mine.row(chunk), mine.row(ir.add(chunk, ir.IntLit(1))), loop.body)
    rows_body = ir.block(*body.body[:at], rows, *body.body[at + 1 :])

    fresh = frame.namer.fresh
    chunks, c, status = ir.Var(fresh("chunks")), ir.Var(fresh("c")), ir.Var(fresh("status"))
    at_ = Table(frame.sizes, frame.levels, chunks)
    call = ir.Call(APPEND_ROWS_NAME, (*(ir.Var(p) for p in frame.params), c))
    run = ir.For(
        c.name,
        ir.IntLit(0),
        chunks,
        ir.block(
            ir.Decl(ir.I64, status.name, call),
            ir.If(((status, ir.block(ir.Assign(at_.end(c), ir.IntLit(-1)))),)),
        ),
        parallel=ir.Parallel(Unit.CPUThread, "static"),
    )
    append_body = ir.block(
        ir.Decl(ir.I64, chunks.name, ir.Load(frame.sizes, ir.IntLit(frame.levels))), run
    )
    return rows_body, append_body


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
