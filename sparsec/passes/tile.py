"""Register tiles: accumulate a dense innermost loop's output in vector registers.

SpMM ``Y(i,j) = W(i,k) * X(k,j)`` lowers to ``for k in row i: for j: Y[i,j] += w * X[k,j]``.
The compiler vectorises the j loop, but every multiply-add still loads and stores ``Y``:
two loads and a store per FMA, where one load would do. This pass rewrites such a nest
(the *region*: serial loops whose bodies only declare locals, ending in the j loop) into
tiles of `VECTORS` vectors of ``j``: each tile's output elements live in registers for the
whole region (``sc_acc0 .. sc_acc7``) and are stored once after it. The columns left over
(fewer than a tile) run through the original nest.

Two more things make a tile cheaper, both measured on pruned-BERT SpMM (`bench bert`):

- *Zero-started tiles.* When the statement just before the region (with only local
  declarations between) zeroes exactly the output row the tiles cover, the accumulators
  start at zero and the zeroing shrinks to the columns left over: no store and reload of
  the row.
- *Prefetched gathers.* When a vector load's row is found through an index array that the
  region's innermost loop walks (SpMM's ``X[W_crd[p], j]``), the loop is split: up to
  `PREFETCH_DISTANCE` iterations before its end, each iteration prefetches the tile of the
  row that iteration ``p + PREFETCH_DISTANCE`` will load (one cache line, mid-tile, which
  measured faster than one per line); the last iterations run without. Hardware prefetchers
  cannot predict these rows; strided loads are left to them.
- *Prefetched across segments.* When the innermost loop walks segments ``pos[q] ..
  pos[q + 1]`` of the loop around it (MTTKRP's l fibers in its k fibers, about one entry
  each on random tensors, where the split loop above never prefetches), the segments of the
  region make one run of positions: the innermost loop prefetches ``PREFETCH_DISTANCE``
  positions on in that run, into the next segments, and the loop around it prefetches the
  rows that its own iteration that far on gathers (MTTKRP's ``C[k, :]``), each index
  clamped to its range's last. MTTKRP (2000³, 1M entries, rank 32) measured 1.3–1.5x faster.

Each output element still receives the same additions in the same order, so results do
not change. The pass is C-only (the CUDA printer never sees it) and conservative: it
applies only when every piece of the j loop's body is understood, and otherwise leaves
the nest alone. The region's loops must be serial and its output location invariant in
them; loads in the body are either invariant in j (broadcast) or at ``base + j``
(contiguous vector loads).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from itertools import count

from ..ir import nodes as ir

#: accumulators per tile: 8 AVX2 registers of the 16, leaving room for loads and the
#: broadcast factor; FMA latency × issue width is also about 8 on current x86 cores
VECTORS = 8
#: macros of the C template: lanes per vector (set from the compiler's target flags)
#: and values per tile
VLEN = ir.Var("SC_VLEN")
TILE = ir.Var("SC_TILE")
_OPS = frozenset("+-*/")
#: iterations ahead that a gathered row is prefetched: enough to hide an L2 miss at a few
#: cycles per vector FMA (2 to 12 measured alike on Zen; 6 is in the middle)
PREFETCH_DISTANCE = 6


def children(e: ir.Expr) -> tuple[ir.Expr, ...]:
    """The subexpressions ``e`` reads directly."""
    match e:
        case ir.Load(index=index):
            return (index,)
        case ir.Bin(left=a, right=b):
            return (a, b)
        case ir.Unary(operand=x):
            return (x,)
        case ir.Call(args=args):
            return args
        case ir.Select(cond=c, then=a, other=b):
            return (c, a, b)
    return ()


def free_vars(e: ir.Expr) -> set[str]:
    """The variables ``e`` reads."""
    own = {e.name} if isinstance(e, ir.Var) else set()
    return own.union(*(free_vars(c) for c in children(e)))


def arrays(e: ir.Expr) -> set[str]:
    """The arrays ``e`` loads from."""
    own = {e.array} if isinstance(e, ir.Load) else set()
    return own.union(*(arrays(c) for c in children(e)))


@dataclass(frozen=True, slots=True)
class _Nest:
    """A region: ``loops[0]`` (the region's root) down to ``inner`` (the j loop)."""

    loops: tuple[ir.For, ...]
    inner: ir.For


def tile(body: ir.Block) -> tuple[ir.Block, tuple[str, ...]]:
    """``body`` with every eligible region tiled, and a note per region tiled."""
    notes: list[str] = []
    ids = count()
    return _block(body, notes, ids), tuple(notes)


def _block(b: ir.Block, notes: list[str], ids: count[int]) -> ir.Block:
    out: list[ir.Stmt] = []
    # the last loop that zeroes a row, its index in `out`, and the local declarations
    # after it
    zeroing: tuple[int, ir.For] | None = None
    between: list[ir.Decl] = []
    for s in b.body:
        before = _Zeroing(zeroing[1], tuple(between)) if zeroing is not None else None
        done = _stmt(s, notes, ids, before)
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
    if len(s.body.body) != 1:
        return None
    store = s.body.body[0]
    if (
        isinstance(store, ir.Assign)
        and store.op == "="
        and not store.atomic
        and isinstance(store.target, ir.Load)
        and store.value == ir.FloatLit(0.0)
    ):
        return store.target.array, store.target.index
    return None


def _stmt(
    s: ir.Stmt, notes: list[str], ids: count[int], before: _Zeroing | None = None
) -> ir.Stmt | _ZeroStarted:
    match s:
        case ir.For():
            if s.parallel is None:
                nest = _nest(s)
                if nest is not None:
                    found = _tile(nest, next(ids), before)
                    if found is not None:
                        tiled, prefetched = found
                        loops = ", ".join(loop.var for loop in nest.loops)
                        note = f"{nest.inner.var} in register tiles across loop {loops}"
                        if prefetched:
                            where = ", across segments" if prefetched == "across segments" else ""
                            note += f" (gathered rows prefetched {PREFETCH_DISTANCE} ahead{where})"
                        notes.append(note)
                        return tiled
    return ir.map_blocks(s, lambda b: _block(b, notes, ids))


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
    nest: _Nest, uid: int, before: _Zeroing | None
) -> tuple[ir.Stmt | _ZeroStarted, str] | None:
    """The tiled region (a `_ZeroStarted` when it took over ``before``) and how it
    prefetches (`_Tiler.prefetched`), or None."""
    try:
        tiler = _Tiler(nest, uid)
        zero = before is not None and tiler.zeroed_by(before)
        tiled = tiler.build(zero)
    except _Refuse:
        return None
    return (_ZeroStarted(tiled) if zero else tiled), tiler.prefetched


class _Tiler:
    def __init__(self, nest: _Nest, uid: int) -> None:
        self.nest = nest
        self.j = nest.inner.var
        self.jt = f"sc_j{uid}"
        self.uid = uid
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

    def prefetches(
        self, loop: ir.For, ahead: ir.Expr, inner: frozenset[str] = frozenset()
    ) -> list[ir.Stmt]:
        """Prefetches, for ``loop`` (one of the region's), of the rows that iteration
        ``ahead`` gathers: one per distinct vector load of the tile whose row comes through
        an index array that ``loop`` walks. A load that also needs a name of ``inner``
        (the loops inside ``loop``, and what they declare) is theirs to prefetch."""
        env = bindings(loop.body.body)
        out: list[ir.Stmt] = []
        seen: set[ir.Expr] = set()
        middle = self._lane(VECTORS // 2)
        for at in self.gathers:
            at = substitute(at, env)
            if at in seen or not _gathers(at, loop.var) or free_vars(at) & inner:
                continue
            # names the loop declares were substituted; anything else from the region
            # (outer loops' variables and locals) is unchanged across this loop
            seen.add(at)
            moved = substitute(at, {loop.var: ahead})
            out.append(ir.Effect(ir.Call("prefetch", (ir.add(moved, middle),))))
        return out

    def segments(self) -> tuple[ir.For, ir.Expr] | None:
        """``(parent, last)`` when the region's innermost loop walks, in each iteration
        ``q`` of the loop around it (``parent``), the segment ``pos[q] .. pos[q + 1]`` of one
        position array (MTTKRP's l fibers inside its k fibers), and the parent's bounds are
        fixed in the region: the segments of its iterations then make one run of positions,
        whose last is ``last`` (an expression of names from outside the region)."""
        if len(self.nest.loops) < 2:
            return None
        parent, loop = self.nest.loops[-2], self.nest.loops[-1]
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

    def _across(self, region: ir.For, parent: ir.For, last: ir.Expr) -> ir.Stmt | None:
        """``region`` with its two innermost loops prefetching ahead across segments: the
        innermost loop the rows ``PREFETCH_DISTANCE`` positions on in the parent's run of
        positions (into the next segments: MTTKRP's l fibers hold about one entry each), and
        the parent the rows its own iteration that far on gathers (MTTKRP's ``C[k, :]``),
        each index clamped to its range's last. None when neither has a load to prefetch."""
        loop = self.nest.loops[-1]
        end = f"sc_pfend{self.uid}"
        distance = ir.IntLit(PREFETCH_DISTANCE)
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
        sums = [self.vector(value, v) for v in range(VECTORS)]
        acc = [f"sc_acc{self.uid}_{v}" for v in range(VECTORS)]
        jt = ir.Var(self.jt)

        def slot(v: int) -> ir.Expr:
            return ir.Bin("+", ir.Var(self.out), ir.add(ir.add(out_base, jt), self._lane(v)))

        inner = ir.block(*(ir.Assign(ir.Var(a), s, "+=") for a, s in zip(acc, sums, strict=True)))
        walked = self._replace_inner(nest.loops[0], inner)
        segments = self.segments()
        across = None if segments is None else self._across(walked, *segments)
        if across is not None:
            region, self.prefetched = across, "across segments"
        else:
            last = nest.loops[-1]
            distance = ir.IntLit(PREFETCH_DISTANCE)
            prefetch = self.prefetches(last, ir.Bin("+", ir.Var(last.var), distance))
            self.prefetched = "within segments" if prefetch else ""
            region = self._split(walked, prefetch)
        tiles = ir.Var(f"sc_tiles{self.uid}")
        t = f"sc_t{self.uid}"
        tile_loop = ir.For(
            t,
            ir.IntLit(0),
            tiles,
            ir.block(
                ir.Decl(ir.I64, self.jt, ir.Bin("*", ir.Var(t), TILE)),
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
        rest = ir.Bin("*", tiles, TILE)
        remainder = self._replace_inner(nest.loops[0], None, start=rest)
        zeroing = replace(self.zeroing, start=rest) if zero and self.zeroing else None
        return ir.block(
            ir.Comment(f"{nest.inner.var} in tiles of SC_TILE values held in registers"),
            ir.Decl(ir.I64, tiles.name, ir.Bin("/", end, TILE)),
            tile_loop,
            ir.If(((ir.Bin("<", rest, end), ir.block(zeroing, remainder)),)),
        )

    def _split(self, region: ir.For, prefetch: list[ir.Stmt]) -> ir.Stmt:
        """``region`` with its innermost loop split in two when there is something to
        prefetch: iterations with ``PREFETCH_DISTANCE`` more to come prefetch, the last
        ones do not. (The prefetched row's index is loaded only where it is in range.)"""
        if not prefetch:
            return region
        target = self.nest.loops[-1].var
        split = f"sc_pf{self.uid}"

        def walk(loop: ir.For) -> ir.Stmt:
            if loop.var == target:
                ahead = ir.Bin("-", loop.end, ir.IntLit(PREFETCH_DISTANCE))
                return ir.block(
                    ir.Decl(ir.I64, split, ir.Call("max", (loop.start, ahead))),
                    replace(loop, end=ir.Var(split), body=_after_declarations(loop.body, prefetch)),
                    replace(loop, start=ir.Var(split)),
                )
            body: list[ir.Stmt] = []
            for s in loop.body.body:
                body.extend(ir.block(walk(s)).body if isinstance(s, ir.For) else (s,))
            return replace(loop, body=ir.Block(tuple(body)))

        return walk(region)

    def _replace_inner(
        self, loop: ir.For, body: ir.Block | None, start: ir.Expr | None = None
    ) -> ir.For:
        """``loop`` with the j loop replaced by ``body``, or started at ``start``."""
        if loop is self.nest.inner:
            assert start is not None
            # the columns left of the tiles: iterations independent as the tiles' lanes are
            # (each writes its own output value), so `omp simd` vectorises them without the
            # compiler's alias checks and loop versions (~10 ms of an -O3 compile)
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


def _after_declarations(body: ir.Block, stmts: list[ir.Stmt]) -> ir.Block:
    """``body`` with ``stmts`` after its declarations (and comments), before the rest."""
    decls = [s for s in body.body if isinstance(s, ir.Decl | ir.Comment)]
    rest = [s for s in body.body if not isinstance(s, ir.Decl | ir.Comment)]
    return ir.block(*decls, *stmts, *rest)


def bindings(stmts: Iterable[ir.Stmt]) -> dict[str, ir.Expr]:
    """What each initialised declaration among ``stmts`` stands for, in terms of the
    names declared before them (earlier declarations substituted into later ones)."""
    env: dict[str, ir.Expr] = {}
    for d in stmts:
        if isinstance(d, ir.Decl) and d.init is not None:
            env[d.name] = substitute(d.init, env)
    return env


def substitute(e: ir.Expr, env: Mapping[str, ir.Expr]) -> ir.Expr:
    """``e`` with the variables named in ``env`` replaced by their expressions."""
    match e:
        case ir.Var(name=name) if name in env:
            return env[name]
        case ir.Load(array=a, index=i):
            return ir.Load(a, substitute(i, env))
        case ir.Bin(op=op, left=a, right=b):
            return ir.Bin(op, substitute(a, env), substitute(b, env))
        case ir.Unary(op=op, operand=x):
            return ir.Unary(op, substitute(x, env))
        case ir.Call(fn=fn, args=args):
            return ir.Call(fn, tuple(substitute(a, env) for a in args))
        case ir.Select(cond=c, then=a, other=b):
            return ir.Select(substitute(c, env), substitute(a, env), substitute(b, env))
    return e


def _gathers(e: ir.Expr, var: str) -> bool:
    """Whether ``e`` loads from an array at an index that depends on ``var``."""
    if isinstance(e, ir.Load) and var in free_vars(e.index):
        return True
    return any(_gathers(c, var) for c in children(e))
