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
    """A region: ``loops[0]`` (the region's root) down to ``inner`` (the j loop)."""

    loops: tuple[ir.For, ...]
    inner: ir.For


def tile(
    body: ir.Block,
    options: TileOptions = DEFAULTS.tile,
    extents: Mapping[str, ir.Expr] | None = None,
) -> tuple[ir.Block, tuple[str, ...]]:
    """``body`` with every eligible region tiled in tiles of ``options.vectors`` vectors
    (then narrower ones down to ``options.narrowest``), and a note per region tiled.
    ``extents``: each compressed level's ``crd`` array -> the level's extent (the rows a
    gather through it can reach, `Gathers.prefetches`)."""
    notes: list[str] = []
    ids = count()
    tiled = _block(body, notes, ids, options, extents or {})
    return (checked(tiled) if notes else tiled), tuple(notes)


def _block(
    b: ir.Block,
    notes: list[str],
    ids: count[int],
    options: TileOptions,
    extents: Mapping[str, ir.Expr],
) -> ir.Block:
    out: list[ir.Stmt] = []
    # the last loop that zeroes a row, its index in `out`, and the local declarations
    # after it
    zeroing: tuple[int, ir.For] | None = None
    between: list[ir.Decl] = []
    for s in b.body:
        before = _Zeroing(zeroing[1], tuple(between)) if zeroing is not None else None
        done = _stmt(s, notes, ids, options, extents, before)
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
) -> ir.Stmt | _ZeroStarted:
    match s:
        case ir.For():
            if s.parallel is None:
                nest = _nest(s)
                if nest is not None:
                    found = _tile(nest, ids, opts, extents, before)
                    if found is not None:
                        tiled, prefetched = found
                        loops = ", ".join(loop.var for loop in nest.loops)
                        note = f"{nest.inner.var} in register tiles across loop {loops}"
                        if prefetched:
                            where = ", across segments" if prefetched == "across segments" else ""
                            note += (
                                f" (gathered rows prefetched {opts.prefetch_distance} ahead{where})"
                            )
                        notes.append(note)
                        return tiled
    return map_blocks(s, lambda b: _block(b, notes, ids, opts, extents))


def _nest(root: ir.For) -> _Nest | None:
    """The chain of loops from ``root`` to an innermost accumulating loop, when every body
    on the way is local declarations (and comments) around exactly one loop."""
    loops: list[ir.For] = []
    loop = root
    while True:
        if loop.parallel is not None or loop.unroll:
            return None
        inner = [s for s in loop.body.body if not isinstance(s, ir.Decl | ir.Comment)]
        if _accumulates(loop):
            return _Nest(tuple(loops), loop) if loops else None
        if len(inner) != 1 or not isinstance(inner[0], ir.For):
            return None
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
) -> tuple[ir.Stmt | _ZeroStarted, str] | None:
    """The tiled region (a `_ZeroStarted` when it took over ``before``) and how it
    prefetches (`_Tiler.prefetched`), or None."""
    try:
        tiler = _Tiler(nest, ids, options, extents)
        zero = before is not None and tiler.zeroed_by(before)
        tiled = tiler.build(zero)
    except _Refuse:
        return None
    return (_ZeroStarted(tiled) if zero else tiled), tiler.prefetched


class _Tiler:
    def __init__(
        self, nest: _Nest, ids: count[int], options: TileOptions, extents: Mapping[str, ir.Expr]
    ) -> None:
        self.nest = nest
        self.extents = extents
        self.vectors, self.narrowest = options.vectors, options.narrowest  # see TileOptions
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
        #: the loop that zeroed the tiles' row, when the tiles took it over
        self.zeroing: ir.For | None = None
        #: the tile's vector loads (lane 0 addresses), candidates for prefetching
        self.gathers: list[ir.Expr] = []
        #: how gathered rows are prefetched: "" (not), "within segments" or "across segments"
        self.prefetched = ""

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
        out_base = self.base(self.resolve(store.target.index))
        if free_vars(out_base) & self.inside:
            raise _Refuse
        # the output is written only here: nothing in the region may read it
        for loop in nest.loops:
            reads = arrays(loop.start) | arrays(loop.end)
            for s in loop.body.body:
                if isinstance(s, ir.Decl) and s.init is not None:
                    reads |= arrays(s.init)
            if self.out in reads:
                raise _Refuse
        value = self.resolve(store.value)
        tiles = ir.Var(f"sc_tiles{self.uid}")
        main = self._tiles(self.vectors, self.uid, tiles, ir.IntLit(0), value, out_base, zero)
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
            stage = self._tiles(vectors, uid, runs, first, value, out_base, zero)
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
        value: ir.Expr,
        out_base: ir.Expr,
        zero: bool,
    ) -> ir.For:
        """The loop over ``runs`` tiles of ``vectors`` vectors from column ``first``: each
        tile's accumulators loaded (or zeroed), the region run once into them, then
        stored."""
        nest = self.nest
        self.gathers = []
        self.jt = f"sc_j{uid}"
        jt = ir.Var(self.jt)
        sums = [self.vector(value, v) for v in range(vectors)]
        acc = [f"sc_acc{uid}_{v}" for v in range(vectors)]
        width = TILE if vectors == self.vectors else ir.Bin("*", ir.IntLit(vectors), VLEN)

        def slot(v: int) -> ir.Expr:
            return ir.Bin("+", ir.Var(self.out), ir.add(ir.add(out_base, jt), self._lane(v)))

        inner = ir.block(*(ir.Assign(ir.Var(a), s, "+=") for a, s in zip(acc, sums, strict=True)))
        walked = self._replace_inner(nest.loops[0], inner)
        gathers = Gathers(
            nest.loops,
            tuple(self.gathers),
            self._lane(vectors // 2),
            frozenset(self.inside),
            uid,
            self.distance,
            self.extents,
        )
        segments = gathers.segments() if self.distance > 0 else None
        across = None if segments is None else gathers.across(walked, *segments)
        prefetched = ""
        if across is not None:
            region, prefetched = across, "across segments"
        else:
            within = gathers.within(walked) if self.distance > 0 else None
            prefetched = "within segments" if within is not None else ""
            region = walked if within is None else within
        if vectors == self.vectors:
            self.prefetched = prefetched
        t = f"sc_t{uid}"
        return ir.For(
            t,
            ir.IntLit(0),
            runs,
            ir.block(
                ir.Decl(ir.I64, jt.name, ir.add(first, ir.Bin("*", ir.Var(t), width))),
                *(
                    ir.Decl(
                        ir.VEC, a, ir.Call("vzero", ()) if zero else ir.Call("vload", (slot(v),))
                    )
                    for v, a in enumerate(acc)
                ),
                region,
                *(ir.Effect(ir.Call("vstore", (slot(v), ir.Var(a)))) for v, a in enumerate(acc)),
            ),
        )

    def _replace_inner(
        self, loop: ir.For, body: ir.Block | None, start: ir.Expr | None = None
    ) -> ir.For:
        """``loop`` with the j loop replaced by ``body``, or started at ``start``."""
        if loop is self.nest.inner:
            assert start is not None
            # the columns left of the tiles: iterations independent as the tiles' lanes are
            # (each writes its own output value), so `omp simd` vectorises them without the
            # compiler's alias checks and loop versions (docs/decisions.md, "A cold compile")
            return replace(loop, start=start, parallel=loop.parallel or ir.Parallel("CPUVector"))
        stmts: list[ir.Stmt] = []
        for s in loop.body.body:
            if isinstance(s, ir.For):
                if s is self.nest.inner and body is not None:
                    stmts.extend(body.body)
                    continue
                s = self._replace_inner(s, body, start)
            stmts.append(s)
        return replace(loop, body=ir.Block(tuple(stmts)))
