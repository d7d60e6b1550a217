"""Prefetched gathers: the rows a register tile (`tile.py`) gathers, fetched ahead.

Two shapes, measured on pruned-BERT SpMM (`bench bert`) and MTTKRP (docs/decisions.md:
"Tiles prefetch gathered rows", "No prefetch into L1", "A row narrower than a tile"):

- *Within segments* (`Gathers.within`). When a vector load's row is found through an index
  array that the region's innermost loop walks (SpMM's ``X[W_crd[p], j]``), each iteration
  prefetches the tile of the row that iteration ``p + prefetch_distance`` will load (one
  cache line, mid-tile, which measured faster than one per line), that iteration clamped
  to the loop's last. Hardware prefetchers cannot predict these rows; strided loads are left
  to them. The prefetch (``sc_prefetch_row``) also gets the rows' stride, and where that is
  a multiple of an L1 way's bytes (4 KB on x86), where every row's tile falls in the same
  L1 sets and the line fetched ahead is evicted before its use, none is made (SpMM with
  512 float64 columns gains). It also gets the span of the rows the index array can reach
  (the level's extent times the stride, where the pass is given the extent), and none is
  made where that span fits the L1 data cache: the rows are then cached already (the
  column blocks of `sparsec.nn.SparseLinear` are sized to it), and a prefetch only costs
  the loop an index load and an address (pruned-BERT SpMM in column blocks, float32, on an
  Intel server: docs/decisions.md, "No gather prefetch into a span the L1 holds"). (The
  loop used to be split in two, the last iterations without prefetches: as fast, measured
  on the harness's SpMM in float64 and float32, but twice the code, and a longer -O3
  compile once tiles of fewer vectors came.)
- *Across segments* (`Gathers.across`). When the innermost loop walks segments ``pos[q] ..
  pos[q + 1]`` of the loop around it (MTTKRP's l fibers in its k fibers, about one entry
  each on random tensors, where prefetching within a fiber finds nothing ahead), the segments of the
  region make one run of positions: the innermost loop prefetches ``prefetch_distance``
  positions on in that run, into the next segments, and the loop around it prefetches the
  rows that its own iteration that far on gathers (MTTKRP's ``C[k, :]``), each index
  clamped to its range's last. MTTKRP (2000³, 1M entries, rank 32) measured faster.

Prefetches change no load, store or addition: results are unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from ..ir import nodes as ir
from ..ir.visit import bindings, free_vars, map_children, subexpressions, substitute


@dataclass(frozen=True, slots=True)
class Gathers:
    """A tile's vector loads and the region that runs them."""

    #: the region's loops, its root first, down to the loop around the tiled j loop
    loops: tuple[ir.For, ...]
    #: the tile's vector loads (lane 0 addresses), candidates for prefetching
    addresses: tuple[ir.Expr, ...]
    #: the offset of the tile's middle vector from lane 0 (where a prefetch points)
    middle: ir.Expr
    #: names the region declares (their values change inside it)
    inside: frozenset[str]
    uid: int
    #: iterations ahead that a gathered row is prefetched (`policy.decision.TileOptions`)
    distance: int
    #: each compressed level's crd array -> the level's extent (the rows it can reach)
    extents: Mapping[str, ir.Expr] = field(default_factory=dict)

    def prefetches(
        self,
        loop: ir.For,
        ahead: ir.Expr,
        inner: frozenset[str] = frozenset(),
        row_aware: bool = False,
    ) -> list[ir.Stmt]:
        """Prefetches, for ``loop`` (one of the region's), of the rows that iteration
        ``ahead`` gathers: one per distinct vector load of the tile whose row comes through
        an index array that ``loop`` walks. A load that also needs a name of ``inner``
        (the loops inside ``loop``, and what they declare) is theirs to prefetch.
        ``row_aware``: each prefetch also gets the rows' stride and the span of the rows
        the index array can reach (-1 where its extent is not known), ``sc_prefetch_row``,
        and none is made where that stride aliases in the L1 cache's sets or that span fits
        the L1 cache."""
        env = bindings(loop.body.body)
        out: list[ir.Stmt] = []
        seen: set[ir.Expr] = set()
        for at in self.addresses:
            at = substitute(at, env)
            if at in seen or not _gathers(at, loop.var) or free_vars(at) & inner:
                continue
            # names the loop declares were substituted; anything else from the region
            # (outer loops' variables and locals) is unchanged across this loop
            seen.add(at)
            moved = ir.add(substitute(at, {loop.var: ahead}), self.middle)
            rows = _rows(at, loop.var, self.extents) if row_aware else None
            if rows is None:
                out.append(ir.Effect(ir.Call("prefetch", (moved,))))
            else:
                out.append(ir.Effect(ir.Call("prefetch_row", (moved, *rows))))
        return out

    def segments(self) -> tuple[ir.For, ir.Expr] | None:
        """``(parent, last)`` when the region's innermost loop walks, in each iteration
        ``q`` of the loop around it (``parent``), the segment ``pos[q] .. pos[q + 1]`` of one
        position array (MTTKRP's l fibers inside its k fibers), and the parent's bounds are
        fixed in the region: the segments of its iterations then make one run of positions,
        whose last is ``last`` (an expression of names from outside the region)."""
        if len(self.loops) < 2:
            return None
        parent, loop = self.loops[-2], self.loops[-1]
        if (free_vars(parent.start) | free_vars(parent.end)) & self.inside:
            return None
        env = bindings(parent.body.body)
        start, end = substitute(loop.start, env), substitute(loop.end, env)
        q = ir.Var(parent.var)
        if not isinstance(start, ir.Load) or start.index != q:
            return None
        if end != ir.Load(start.array, ir.add(q, ir.IntLit(1))):
            return None
        # pos[parent's end] is read only where the parent runs (it is then its last segment's
        # end); an empty parent gives 0, never read
        last = ir.Bin("-", ir.Load(start.array, parent.end), ir.IntLit(1))
        return parent, ir.Select(ir.Bin("<", parent.start, parent.end), last, ir.IntLit(0))

    def across(self, region: ir.For, parent: ir.For, last: ir.Expr) -> ir.Stmt | None:
        """``region`` with its two innermost loops prefetching ahead across segments: the
        innermost loop the rows ``distance`` positions on in the parent's run of
        positions (into the next segments: MTTKRP's l fibers hold about one entry each), and
        the parent the rows its own iteration that far on gathers (MTTKRP's ``C[k, :]``),
        each index clamped to its range's last. None when neither has a load to prefetch."""
        loop = self.loops[-1]
        end = f"sc_pfend{self.uid}"
        distance = ir.IntLit(self.distance)
        ahead = ir.Call("min", (ir.add(ir.Var(loop.var), distance), ir.Var(end)))
        own = self.prefetches(loop, ahead)
        # the parent's prefetches open its body, before its declarations: a row that needs
        # a name declared there (one the substitution kept) or inside is not theirs
        inner = {loop.var} | {d.name for d in loop.body.body if isinstance(d, ir.Decl)}
        inner |= {d.name for d in parent.body.body if isinstance(d, ir.Decl)}
        parent_last = ir.Bin("-", parent.end, ir.IntLit(1))
        parent_ahead = ir.Call("min", (ir.add(ir.Var(parent.var), distance), parent_last))
        theirs = self.prefetches(parent, parent_ahead, frozenset(inner))
        if not own and not theirs:
            return None

        def walk(s: ir.For) -> ir.For:
            body = s.body.body
            if s.var == loop.var:
                return replace(s, body=_after_declarations(s.body, own))
            inside = [walk(x) if isinstance(x, ir.For) else x for x in body]
            if s.var == parent.var:
                return replace(s, body=ir.block(*theirs, *inside))
            return replace(s, body=ir.Block(tuple(inside)))

        return ir.block(ir.Decl(ir.I64, end, last), walk(region))

    def within(self, region: ir.For) -> ir.For | None:
        """``region`` with its innermost loop prefetching the rows that iteration
        ``distance`` on gathers, that iteration clamped to the loop's last (the
        index array is read only where the loop runs); None when there is nothing to
        prefetch."""
        last = self.loops[-1]
        distance = ir.IntLit(self.distance)
        final = ir.Bin("-", last.end, ir.IntLit(1))
        ahead = ir.Call("min", (ir.add(ir.Var(last.var), distance), final))
        prefetch = self.prefetches(last, ahead, row_aware=True)
        if not prefetch:
            return None

        def walk(loop: ir.For) -> ir.For:
            if loop.var == last.var:
                return replace(loop, body=_after_declarations(loop.body, prefetch))
            body = [walk(s) if isinstance(s, ir.For) else s for s in loop.body.body]
            return replace(loop, body=ir.Block(tuple(body)))

        return walk(region)


def _after_declarations(body: ir.Block, stmts: list[ir.Stmt]) -> ir.Block:
    """``body`` with ``stmts`` after its declarations (and comments), before the rest."""
    decls = [s for s in body.body if isinstance(s, ir.Decl | ir.Comment)]
    rest = [s for s in body.body if not isinstance(s, ir.Decl | ir.Comment)]
    return ir.block(*decls, *stmts, *rest)


def _rows(at: ir.Expr, var: str, extents: Mapping[str, ir.Expr]) -> tuple[ir.Expr, ir.Expr] | None:
    """The distance, in values, between the rows that address ``at`` gathers through its
    one index load that depends on ``var`` (its value at index 1 less its value at 0, a
    loop-invariant expression the compiler folds), and the span of the rows that load can
    reach (its value at the load array's extent, from ``extents``, less its value at 0; -1
    where the extent is not known); None when ``at`` gathers through more than one such
    load."""
    loads = {x for x in subexpressions(at) if isinstance(x, ir.Load) and var in free_vars(x.index)}
    if len(loads) != 1:
        return None
    (load,) = loads
    if isinstance(at, ir.Bin) and at.op == "+" and isinstance(at.left, ir.Var):
        at = at.right  # the array's base: the difference of offsets, not of pointers

    def at_row(row: ir.Expr) -> ir.Expr:
        def put(e: ir.Expr) -> ir.Expr:
            return row if e == load else map_children(e, put)

        return put(at)

    first = at_row(ir.IntLit(0))
    stride = ir.Bin("-", at_row(ir.IntLit(1)), first)
    extent = extents.get(load.array)
    span = ir.IntLit(-1) if extent is None else ir.Bin("-", at_row(extent), first)
    return stride, span


def _gathers(e: ir.Expr, var: str) -> bool:
    """Whether ``e`` loads from an array at an index that depends on ``var``."""
    return any(isinstance(x, ir.Load) and var in free_vars(x.index) for x in subexpressions(e))
