"""Stream prefetching: read a compressed level's arrays ahead of the loop that walks them.

CSR SpMV lowers to ``for i: for p in [pos[i], pos[i+1]): acc += vals[p] * x[crd[p]]``.
Across the rows, ``crd`` and ``vals`` are read front to back: two streams, each advancing
by a row's length per outer iteration. When the rows are short (SpMV's 10 entries), the
inner loop is mostly ``x`` gathers that miss L2, and the hardware prefetchers left to
themselves do not keep the streams ahead of it. This pass puts, before such a loop, a
prefetch of each stream ``stream_distance`` positions past where the loop starts:
``stream_lines`` cache lines (two by default) per stream per outer iteration, with the
decision's locality hint (``stream_locality``: the data is read once, but a non-temporal
hint costs some CPUs more than it saves; None turns the pass's prefetches off).

A loop is a *stream loop* when it

- runs serially inside another loop (the streams continue across its iterations),
- nests no loop itself (its body is the per-entry work),
- starts at a non-constant position (a ``pos`` lookup, not a dense ``0``),

and its streams are the arrays its body loads at exactly the loop variable (``vals[p]``,
``crd[p]``) and never stores to. Loops that the tile pass turned into register tiles nest
loops and are not touched: their cost is in the gathered rows, which they prefetch
themselves.

Prefetch addresses are formed as integers (``sc_prefetch_stream`` in the C template), so a
prefetch past an array's end forms no out-of-bounds pointer and faults on nothing. The pass
changes no load, store or order of additions: results are bit-identical. It is C-only.

Measured by timing the generated SpMV with and without the pass, interleaved with scipy in
one process (100k x 100k, 10 random entries per row, float64, 2-core Zen VM), two runs:
faster on 1 and 2 threads; float32 and the banded matrix gain less; rows of 100 entries,
neutral (the numbers: docs/decisions.md, "Stream loops prefetch their crd and vals").
Distances from 64 to 320 measured alike; one line per stream per row was slower than two
there (rows of 10 doubles span two lines), but faster on an Intel server VM where x fits
the core's cache (fewer instructions: docs/decisions.md), so host calibration picks the
lines; a loop that prefetches exactly the lines of the row that distance ahead was slower
still (its trip count of 1 or 2 mispredicts).
"""

from __future__ import annotations

from ..ir import nodes as ir
from ..ir.visit import exprs, map_blocks, statements, subexpressions
from ..policy.decision import DEFAULTS, PassOptions


def prefetch_streams(
    body: ir.Block, options: PassOptions = DEFAULTS
) -> tuple[ir.Block, tuple[str, ...]]:
    """``body`` with a prefetch of each stream loop's streams before the loop, and a note
    per distinct set of streams; each stream is prefetched ``options.stream_distance``
    positions past the loop's start."""
    notes: list[str] = []
    if options.stream_locality is None:  # the host's prefetchers do better alone
        return body, ()
    return _block(body, notes, inside=False, distance=options.stream_distance), tuple(notes)


def _block(b: ir.Block, notes: list[str], inside: bool, distance: int) -> ir.Block:
    out: list[ir.Stmt] = []
    declared: dict[str, ir.Expr] = {}
    for s in b.body:
        if isinstance(s, ir.Decl) and s.init is not None:
            declared[s.name] = s.init
        if isinstance(s, ir.For):
            streams = _streams(s) if inside and not _one_position(s, declared) else ()
            if streams:
                note = f"{', '.join(streams)} prefetched {distance} positions ahead"
                if note not in notes:
                    notes.append(note)
                ahead = ir.add(s.start, ir.IntLit(distance))
                out.extend(
                    ir.Effect(ir.Call("prefetch_stream", (ir.Var(a), ahead))) for a in streams
                )
        out.append(_stmt(s, notes, inside, distance))
    return ir.Block(tuple(out))


def _stmt(s: ir.Stmt, notes: list[str], inside: bool, distance: int) -> ir.Stmt:
    inner = inside or isinstance(s, ir.For | ir.While)
    return map_blocks(s, lambda b: _block(b, notes, inner, distance))


def _one_position(loop: ir.For, declared: dict[str, ir.Expr]) -> bool:
    """Does ``loop`` walk one position, ``start .. start + 1`` (a singleton level under a
    dense one: ELL's and N:M's stored coordinate)? Its streams advance by one entry per
    outer iteration, so a prefetch before it would be issued at every entry, more
    instructions than the entry's own loads, for streams the hardware follows on its own
    (docs/decisions.md, "Stream loops prefetch their crd and vals")."""
    end = loop.end
    if isinstance(end, ir.Var) and end.name in declared:
        end = declared[end.name]
    return end == ir.add(loop.start, ir.IntLit(1))


#: what a stream loop's body may not hold: a loop (the body is the per-entry work) or
#: workspace memory
_REFUSED = (ir.For, ir.While, ir.Alloc, ir.Pointer, ir.Free)


def _streams(loop: ir.For) -> tuple[str, ...]:
    """The arrays ``loop`` streams (sorted): those its body loads at exactly the loop
    variable and never stores to; ``()`` when it is not a stream loop. (A store's own
    location counts as a load here, and its array as stored.)"""
    if loop.parallel is not None or isinstance(loop.start, ir.IntLit):
        return ()
    body = list(statements(loop.body))
    if any(isinstance(s, _REFUSED) for s in body):
        return ()
    at = ir.Var(loop.var)
    stores = {
        s.target.array for s in body if isinstance(s, ir.Assign) and isinstance(s.target, ir.Load)
    }
    loads = {
        x.array
        for s in body
        if not isinstance(s, ir.Return)  # a status check is no stream
        for e in exprs(s)
        for x in subexpressions(e)
        if isinstance(x, ir.Load) and x.index == at
    }
    return tuple(sorted(loads - stores))
