"""Register tiles: accumulate a dense innermost loop's output in vector registers.

SpMM ``Y(i,j) = W(i,k) * X(k,j)`` lowers to ``for k in row i: for j: Y[i,j] += w * X[k,j]``.
The compiler vectorises the j loop, but every multiply-add still loads and stores ``Y``:
two loads and a store per FMA, where one load would do. This pass rewrites such a nest
(the *region*: serial loops whose bodies only declare locals, ending in the j loop) into
tiles of ``vectors`` (8) vectors of ``j``: each tile's output elements live in registers for
the whole region (``sc_acc0 .. sc_acc7``) and are stored once after it. The columns left over
(fewer than a tile) run in at most one tile of 4 vectors and one of 2 (``narrowest``), so a
row narrower than a tile still accumulates in registers (MTTKRP at rank 32 in float64 on
64-byte vectors: docs/decisions.md, "A row narrower than a tile"); the rest, fewer than
2 vectors, runs through the original nest. A build has the stages its extent needs (`stages`).

*A block's rows held together.* In bsr(R,C) SpMM, ``Y(i0,i1,k) = A(i0,j0,i1,j1) *
X(j0,j1,k)``, the region is the block row (``j0``, then the block's ``i1`` and ``j1``),
and the output row moves with ``i1``, a loop of R iterations fixed in the code. With
2 <= R <= ``rows`` (`TileOptions`), the tiles hold the R rows' columns together across the whole block
row: each row's statement is the j loop's with ``i1`` replaced by its number (the
declarations that depend on it substituted), so each vector of X is loaded once for the
R rows and no accumulator is stored between blocks. A tile's columns then run in walks of
``row_accumulators // R`` vectors per row (`TileOptions`: 8 accumulators, as one row's
tile, or 16 where the host has 32 vector registers).

Two more things make a tile cheaper, measured on pruned-BERT SpMM (`bench bert`):

- *Zero-started tiles.* When the statement just before the region (with only local
  declarations between) zeroes exactly the output row the tiles cover, the accumulators
  start at zero and the zeroing shrinks to the columns left over: no store and reload of
  the row.
- *Prefetched gathers* (`gathers.py`): rows that a vector load finds through an index
  array the region walks are prefetched ahead of the loop that gathers them.

Each output element still receives the same additions in the same order, so results do
not change. The pass is C-only (the CUDA printer never sees it) and conservative: it
applies only when every piece of the j loop's body is understood, and otherwise leaves
the nest alone. The region's loops must be serial and its output location invariant in
them; loads in the body are either invariant in j (broadcast) or at ``base + j``
(contiguous vector loads).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from itertools import count

from ..ir import nodes as ir
from ..ir.visit import arrays, bindings, free_vars, map_blocks, substitute
from ..policy.decision import DEFAULTS, TileOptions
from .gathers import Gathers
from .stages import REMAINDER, built, checked, guard

#: macros of the C template: lanes per vector (set from the compiler's target flags)
#: and values per tile
VLEN = ir.Var("SC_VLEN")
TILE = ir.Var("SC_TILE")
_OPS = frozenset("+-*")


@dataclass(frozen=True, slots=True)
class _Nest:
    """A region: ``loops[0]`` (the region's root) down to ``inner`` (the j loop);
    ``rows``: one loop of ``loops[1:]`` over a few rows fixed in the code (`_rows`), whose
    rows the tiles hold together."""

    loops: tuple[ir.For, ...]
    inner: ir.For
    rows: ir.For | None = None


def _rows(loop: ir.For, most: int) -> int:
    """The rows of ``loop`` when it runs over ``[0, R)`` with ``2 <= R <= most`` fixed in
    the code (a block's rows of a bsr(R,C) tensor, `Spec.static`), else 0."""
    if loop.start == ir.IntLit(0) and isinstance(loop.end, ir.IntLit):
        return loop.end.value if 2 <= loop.end.value <= most else 0
    return 0


def tile(
    body: ir.Block,
    options: TileOptions = DEFAULTS.tile,
    extents: Mapping[str, ir.Expr] | None = None,
    held: list[int] | None = None,
) -> tuple[ir.Block, tuple[str, ...]]:
    """``body`` with every eligible region tiled in tiles of ``options.vectors`` vectors
    (then narrower ones down to ``options.narrowest``), and a note per region tiled.
    ``extents``: each compressed level's ``crd`` array -> the level's extent (the rows a
    gather through it can reach, `Gathers.prefetches`). ``held``: where given, each tiled
    region's rows held together (1 for one row) are appended to it."""
    notes: list[str] = []
    ids = count()
    tiled = _block(body, notes, ids, options, extents or {}, held)
    return (checked(tiled) if notes else tiled), tuple(notes)


def _block(
    b: ir.Block,
    notes: list[str],
    ids: count[int],
    options: TileOptions,
    extents: Mapping[str, ir.Expr],
    held: list[int] | None = None,
) -> ir.Block:
    out: list[ir.Stmt] = []
    # the last loop that zeroes a row, its index in `out`, and the local declarations
    # after it
    zeroing: tuple[int, ir.For] | None = None
    between: list[ir.Decl] = []
    for s in b.body:
        before = _Zeroing(zeroing[1], tuple(between)) if zeroing is not None else None
        done = _stmt(s, notes, ids, options, extents, before, held)
        if isinstance(done, _ZeroStarted):
            assert zeroing is not None
            del out[zeroing[0]]
            done = done.stmt
        out.append(done)
        if isinstance(done, ir.For) and _zeroes_row(done) is not None:
            zeroing, between = (len(out) - 1, done), []
        elif isinstance(done, ir.Decl) and zeroing is not None:
            between.append(done)
        elif not isinstance(done, ir.Comment):
            zeroing = None
    return ir.Block(tuple(out))


@dataclass(frozen=True, slots=True)
class _Zeroing:
    """A loop that zeroes a row, and the declarations between it and a region."""

    loop: ir.For
    decls: tuple[ir.Decl, ...]


@dataclass(frozen=True, slots=True)
class _ZeroStarted:
    """A tiled region that took over the zeroing loop just before it."""

    stmt: ir.Stmt


def _zeroes_row(s: ir.Stmt) -> tuple[str, ir.Expr] | None:
    """``(array, index)`` when ``s`` is ``for p in [0, end): array[index] = 0``."""
    if not isinstance(s, ir.For) or s.parallel is not None or s.start != ir.IntLit(0):
        return None
    target = zero_store(s)
    return None if target is None else (target.array, target.index)


def zero_store(loop: ir.For) -> ir.Load | None:
    """The location ``loop``'s one statement zeroes (``out[index] = 0``, not atomic)."""
    if len(loop.body.body) != 1:
        return None
    store = loop.body.body[0]
    if (
        isinstance(store, ir.Assign)
        and store.op == "="
        and not store.atomic
        and isinstance(store.target, ir.Load)
        and store.value == ir.FloatLit(0.0)
    ):
        return store.target
    return None


def _stmt(
    s: ir.Stmt,
    notes: list[str],
    ids: count[int],
    opts: TileOptions,
    extents: Mapping[str, ir.Expr],
    before: _Zeroing | None = None,
    held: list[int] | None = None,
) -> ir.Stmt | _ZeroStarted:
    match s:
        case ir.For():
            if s.parallel is None:
                nest = _nest(s, opts.rows)
                if nest is not None:
                    found = _tile(nest, ids, opts, extents, before)
                    if found is not None:
                        tiled, prefetched, rows = found
                        loops = ", ".join(loop.var for loop in nest.loops if loop is not rows)
                        count_rows = 1 if rows is None else _rows(rows, opts.rows)
                        of_rows = "" if rows is None else f" of {count_rows} rows ({rows.var})"
                        note = f"{nest.inner.var} in register tiles{of_rows} across loop {loops}"
                        if prefetched:
                            where = ", across segments" if prefetched == "across segments" else ""
                            note += (
                                f" (gathered rows prefetched {opts.prefetch_distance} ahead{where})"
                            )
                        notes.append(note)
                        if held is not None:
                            held.append(count_rows)
                        return tiled
    return map_blocks(s, lambda b: _block(b, notes, ids, opts, extents, held=held))


def _nest(root: ir.For, most_rows: int) -> _Nest | None:
    """The chain of loops from ``root`` to an innermost accumulating loop, when every body
    on the way is local declarations (and comments) around exactly one loop; its first
    loop below the root over at most ``most_rows`` fixed rows is its ``rows``."""
    loops: list[ir.For] = []
    rows: ir.For | None = None
    loop = root
    while True:
        if loop.parallel is not None or loop.unroll:
            return None
        inner = [s for s in loop.body.body if not isinstance(s, ir.Decl | ir.Comment)]
        if _accumulates(loop):
            return _Nest(tuple(loops), loop, rows) if loops else None
        if len(inner) != 1 or not isinstance(inner[0], ir.For):
            return None
        if loops and rows is None and _rows(loop, most_rows):
            rows = loop
        loops.append(loop)
        loop = inner[0]


def _accumulates(loop: ir.For) -> bool:
    """``for j in [0, end): <declarations>; out[...] += value`` (not atomic)."""
    *decls, last = loop.body.body or (None,)
    return (
        loop.start == ir.IntLit(0)
        and isinstance(last, ir.Assign)
        and last.op == "+="
        and not last.atomic
        and isinstance(last.target, ir.Load)
        and all(isinstance(d, ir.Decl) and d.init is not None for d in decls)
    )


class _Refuse(Exception):
    """The nest is not in the form the pass understands; it is left alone."""


def _tile(
    nest: _Nest,
    ids: count[int],
    options: TileOptions,
    extents: Mapping[str, ir.Expr],
    before: _Zeroing | None,
) -> tuple[ir.Stmt | _ZeroStarted, str, ir.For | None] | None:
    """The tiled region (a `_ZeroStarted` when it took over ``before``), how it
    prefetches (`_Tiler.prefetched`) and the loop whose rows its tiles hold together, or
    None."""
    try:
        tiler = _Tiler(nest, ids, options, extents)
        zero = before is not None and nest.rows is None and tiler.zeroed_by(before)
        tiled = tiler.build(zero)
    except _Refuse:
        return None
    return (_ZeroStarted(tiled) if zero else tiled), tiler.prefetched, tiler.rows


class _Tiler:
    def __init__(
        self, nest: _Nest, ids: count[int], options: TileOptions, extents: Mapping[str, ir.Expr]
    ) -> None:
        self.nest = nest
        self.extents = extents
        self.vectors, self.narrowest = options.vectors, options.narrowest  # see TileOptions
        self.row_accumulators = options.row_accumulators
        self.distance = options.prefetch_distance
        self.j = nest.inner.var
        #: the region's number; its narrower tiles (see `build`) draw theirs from ``ids``
        self.uid = next(ids)
        self.ids = ids
        #: the column a tile starts at (set per tile loop)
        self.jt = f"sc_j{self.uid}"
        # names the region declares (their values change inside it)
        inside = {loop.var for loop in nest.loops} | {self.j}
        types: dict[str, str] = {}
        for loop in nest.loops:
            for s in loop.body.body:
                if isinstance(s, ir.Decl):
                    inside.add(s.name)
                    types[s.name] = s.type
        self.inside = inside
        self.types = types
        # the j loop's declarations, substituted into its statement
        *decls, store = nest.inner.body.body
        assert all(isinstance(d, ir.Decl) and d.init is not None for d in decls)
        self.env = bindings(decls)
        assert isinstance(store, ir.Assign) and isinstance(store.target, ir.Load)
        self.store = store
        self.out = store.target.array
        #: the rows held together (`_rows`), and each row's names -> values
        self.rows: ir.For | None = None
        self.row_envs: list[dict[str, ir.Expr]] = []
        if nest.rows is not None:
            self._take_rows(nest.rows)
        #: the loop that zeroed the tiles' row, when the tiles took it over
        self.zeroing: ir.For | None = None
        #: the tile's vector loads (lane 0 addresses), candidates for prefetching
        self.gathers: list[ir.Expr] = []
        #: how gathered rows are prefetched: "" (not), "within segments" or "across segments"
        self.prefetched = ""

    def _take_rows(self, rows: ir.For) -> None:
        """Hold the rows of ``rows`` together when the output's row is its variable's (a
        block's rows of Y): each row's statement is the j loop's with every declaration
        from ``rows`` down substituted and the row's number for its variable, so the
        region needs none of them (`_replace_inner` drops them). Left as a plain region
        loop where the output does not move with it, or a loop below it moves with it."""
        nest = self.nest
        below = nest.loops[nest.loops.index(rows) :]
        decls = [d for loop in below for d in loop.body.body if isinstance(d, ir.Decl)]
        decls += [d for d in nest.inner.body.body if isinstance(d, ir.Decl)]
        if any(d.init is None for d in decls):
            return
        env = bindings(decls)
        moved = {rows.var} | {d.name for d in decls}
        for loop in (*below[1:], nest.inner):
            if (free_vars(loop.start) | free_vars(loop.end)) & moved:
                return
        assert isinstance(self.store.target, ir.Load)
        if rows.var not in free_vars(substitute(self.store.target.index, env)):
            return
        assert isinstance(rows.end, ir.IntLit)
        self.rows = rows
        self.row_envs = [
            {name: substitute(value, {rows.var: ir.IntLit(r)}) for name, value in env.items()}
            for r in range(rows.end.value)
        ]

    def resolve(self, e: ir.Expr) -> ir.Expr:
        return substitute(e, self.env)

    def base(self, index: ir.Expr, var: str | None = None) -> ir.Expr:
        """``b`` with ``index == b + var`` (``var`` j by default) and ``b`` free of it;
        else refuse."""
        var = var or self.j
        if var not in free_vars(index):
            raise _Refuse
        if index == ir.Var(var):
            return ir.IntLit(0)
        if isinstance(index, ir.Bin) and index.op == "+":
            a, b = index.left, index.right
            if var not in free_vars(b):
                return ir.add(self.base(a, var), b)
            if var not in free_vars(a):
                return ir.add(a, self.base(b, var))
        raise _Refuse

    def zeroed_by(self, before: _Zeroing) -> bool:
        """Whether ``before.loop`` zeroes exactly the output row the tiles cover: the
        same array and end, and the same base once the declarations between are
        substituted (none of which reads the output)."""
        found = _zeroes_row(before.loop)
        assert found is not None
        array, index = found
        if array != self.out or before.loop.end != self.nest.inner.end:
            return False
        assert isinstance(self.store.target, ir.Load)
        if any(d.init is None or self.out in arrays(d.init) for d in before.decls):
            return False
        env = bindings(before.decls)
        try:
            zeroed = self.base(index, before.loop.var)
            tiled = substitute(self.base(self.resolve(self.store.target.index)), env)
        except _Refuse:
            return False
        if zeroed != tiled:
            return False
        self.zeroing = before.loop
        return True

    def vector(self, e: ir.Expr, lane: int) -> ir.Expr:
        """The value expression over vector ``lane`` of the tile."""
        match e:
            case ir.Load(array=a, index=index):
                if a == self.out:
                    raise _Refuse
                if self.j not in free_vars(index):
                    return e
                at = ir.add(ir.add(self.base(index), ir.Var(self.jt)), self._lane(lane))
                address = ir.Bin("+", ir.Var(a), at)
                if lane == 0:
                    self.gathers.append(address)
                return ir.Call("vload", (address,))
            case ir.Bin(op=op, left=a, right=b) if op in _OPS:
                return ir.Bin(op, self.vector(a, lane), self.vector(b, lane))
            case ir.Call(fn="vdiv", args=(a, b)):  # a division of values: lane by lane
                return ir.Call("vdiv", (self.vector(a, lane), self.vector(b, lane)))
            case ir.Unary(op="-", operand=x):
                return ir.Unary("-", self.vector(x, lane))
            case ir.FloatLit():
                return e
            case ir.Var(name=name) if self.types.get(name) == ir.VAL:
                return e
        raise _Refuse

    @staticmethod
    def _lane(v: int) -> ir.Expr:
        return ir.IntLit(0) if v == 0 else ir.Bin("*", ir.IntLit(v), VLEN)

    def build(self, zero: bool = False) -> ir.Stmt:
        nest, store = self.nest, self.store
        end = nest.inner.end
        if free_vars(end) & self.inside:
            raise _Refuse
        assert isinstance(store.target, ir.Load)
        if self.rows is None:
            out_bases = [self.base(self.resolve(store.target.index))]
            values = [self.resolve(store.value)]
        else:
            out_bases = [self.base(substitute(store.target.index, e)) for e in self.row_envs]
            values = [substitute(store.value, e) for e in self.row_envs]
        if any(free_vars(out_base) & self.inside for out_base in out_bases):
            raise _Refuse
        # the output is written only here: nothing in the region may read it
        for loop in nest.loops:
            reads = arrays(loop.start) | arrays(loop.end)
            for s in loop.body.body:
                if isinstance(s, ir.Decl) and s.init is not None:
                    reads |= arrays(s.init)
            if self.out in reads:
                raise _Refuse
        row = (values, out_bases)
        tiles = ir.Var(f"sc_tiles{self.uid}")
        main = self._tiles(self.vectors, self.uid, tiles, ir.IntLit(0), row, zero)
        rest = ir.Bin("*", tiles, TILE)
        # the columns left (fewer than a tile): at most one tile of half as many vectors,
        # then of a quarter, down to `narrowest` vectors, so a row narrower than a tile (MTTKRP's
        # rank 32 in float64 on 8-lane vectors) still accumulates in registers; `q` is the
        # whole vectors left, fewer than a tile's
        q = ir.Var(f"sc_q{self.uid}")
        stages: list[ir.Stmt] = []
        vectors = self.vectors // 2
        while vectors >= self.narrowest:
            first = ir.add(rest, ir.mul(self._down(q, 2 * vectors), VLEN))
            runs = ir.Bin("/", q, ir.IntLit(vectors))
            if 2 * vectors < self.vectors:
                runs = ir.Bin("%", runs, ir.IntLit(2))
            uid = next(self.ids)
            stage = self._tiles(vectors, uid, runs, first, row, zero)
            stages.append(guard(end, vectors, stage))  # built where the extent needs it
            vectors //= 2
        left = ir.add(rest, ir.mul(self._down(q, self.narrowest), VLEN))
        remainder = self._replace_inner(nest.loops[0], None, start=left)
        zeroing = replace(self.zeroing, start=left) if zero and self.zeroing else None
        leftover = ir.Bin("&&", built(end, REMAINDER), ir.Bin("<", left, end))
        return ir.block(
            ir.Comment(f"{nest.inner.var} in tiles of SC_TILE values held in registers"),
            ir.Decl(ir.I64, tiles.name, ir.Bin("/", end, TILE)),
            guard(end, self.vectors, main),
            ir.If(
                (
                    (
                        ir.Bin("<", rest, end),
                        ir.block(
                            ir.Decl(ir.I64, q.name, ir.Bin("/", ir.Bin("-", end, rest), VLEN)),
                            *stages,
                            ir.If(((leftover, ir.block(zeroing, remainder)),)),
                        ),
                    ),
                )
            ),
        )

    def _down(self, q: ir.Var, m: int) -> ir.Expr:
        """``q`` rounded down to a multiple of ``m`` (0 where ``m`` is a whole tile: ``q``
        is less)."""
        if m >= self.vectors:
            return ir.IntLit(0)
        return ir.Bin("*", ir.Bin("/", q, ir.IntLit(m)), ir.IntLit(m))

    def _tiles(
        self,
        vectors: int,
        uid: int,
        runs: ir.Expr,
        first: ir.Expr,
        row: tuple[list[ir.Expr], list[ir.Expr]],
        zero: bool,
    ) -> ir.For:
        """The loop over ``runs`` tiles of ``vectors`` vectors from column ``first``: each
        tile's accumulators loaded (or zeroed), the region run once into them, then
        stored. ``row``: each output row's value and base (one row, or the rows held
        together: a tile's columns then run in walks of the region with
        ``row_accumulators // R`` vectors of every row each, each vector of the other
        operand loaded once for all the rows)."""
        values, out_bases = row
        self.gathers = []
        self.jt = f"sc_j{uid}"
        jt = ir.Var(self.jt)
        width = TILE if vectors == self.vectors else ir.Bin("*", ir.IntLit(vectors), VLEN)
        rows = len(values)
        walk = vectors if rows == 1 else max(1, min(vectors, self.row_accumulators // rows))
        body: list[ir.Stmt] = []
        prefetched = ""
        for lo in range(0, vectors, walk):
            lanes = range(lo, min(vectors, lo + walk))
            acc = {
                (r, v): f"sc_acc{uid}_{v}" if rows == 1 else f"sc_acc{uid}_{r}_{v}"
                for r in range(rows)
                for v in lanes
            }

            def slot(r: int, v: int) -> ir.Expr:
                at = ir.add(ir.add(out_bases[r], jt), self._lane(v))
                return ir.Bin("+", ir.Var(self.out), at)

            sums = [
                ir.Assign(ir.Var(a), self.vector(values[r], v), "+=") for (r, v), a in acc.items()
            ]
            region, prefetched = self._region(ir.block(*sums), uid, vectors)
            body += [
                *(
                    ir.Decl(
                        ir.VEC, a, ir.Call("vzero", ()) if zero else ir.Call("vload", (slot(r, v),))
                    )
                    for (r, v), a in acc.items()
                ),
                region,
                *(
                    ir.Effect(ir.Call("vstore", (slot(r, v), ir.Var(a))))
                    for (r, v), a in acc.items()
                ),
            ]
        if vectors == self.vectors:
            self.prefetched = prefetched
        t = f"sc_t{uid}"
        return ir.For(
            t,
            ir.IntLit(0),
            runs,
            ir.block(
                ir.Decl(ir.I64, jt.name, ir.add(first, ir.Bin("*", ir.Var(t), width))),
                *body,
            ),
        )

    def _region(self, inner: ir.Block, uid: int, vectors: int) -> tuple[ir.Stmt, str]:
        """The region walked with ``inner`` for the j loop, its gathered rows prefetched
        where `Gathers` finds how (not for rows held together: their loads are found
        from substituted declarations), and how they are (`prefetched`)."""
        walked = self._replace_inner(self.nest.loops[0], inner)
        if self.rows is not None or self.distance <= 0:
            return walked, ""
        gathers = Gathers(
            self.nest.loops,
            tuple(self.gathers),
            self._lane(vectors // 2),
            frozenset(self.inside),
            uid,
            self.distance,
            self.extents,
        )
        segments = gathers.segments()
        across = None if segments is None else gathers.across(walked, *segments)
        if across is not None:
            return across, "across segments"
        within = gathers.within(walked)
        return (walked, "") if within is None else (within, "within segments")

    def _replace_inner(
        self, loop: ir.For, body: ir.Block | None, start: ir.Expr | None = None, below: bool = False
    ) -> ir.For:
        """``loop`` with the j loop replaced by ``body`` (without the loop of the rows held
        together, and the declarations ``below`` it), or started at ``start``."""
        if loop is self.nest.inner:
            assert start is not None
            # the columns left of the tiles: iterations independent as the tiles' lanes are
            # (each writes its own output value), so `omp simd` vectorises them without the
            # compiler's alias checks and loop versions (docs/decisions.md, "A cold compile")
            return replace(loop, start=start, parallel=loop.parallel or ir.Parallel("CPUVector"))
        stmts: list[ir.Stmt] = []
        for s in loop.body.body:
            if isinstance(s, ir.For):
                deeper = below
                if body is not None and s is self.rows:
                    # the rows held together: the loop and the declarations from it
                    # down are gone (each row's statement has them substituted)
                    (s,) = [t for t in s.body.body if isinstance(t, ir.For)]
                    deeper = True
                if s is self.nest.inner and body is not None:
                    stmts.extend(body.body)
                    continue
                s = self._replace_inner(s, body, start, deeper)
            elif below and isinstance(s, ir.Decl):
                continue
            stmts.append(s)
        return replace(loop, body=ir.Block(tuple(stmts)))
