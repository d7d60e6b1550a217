"""Register tiles: accumulate a dense innermost loop's output in vector registers.

SpMM ``Y(i,j) = W(i,k) * X(k,j)`` lowers to ``for k in row i: for j: Y[i,j] += w * X[k,j]``.
The compiler vectorises the j loop, but every multiply-add still loads and stores ``Y``:
two loads and a store per FMA, where one load would do. This pass rewrites such a nest
(the *region*: serial loops whose bodies only declare locals, ending in the j loop) into
tiles of `VECTORS` vectors of ``j``: each tile's output elements live in registers for the
whole region (``sc_acc0 .. sc_acc7``) and are stored once after it. The columns left over
(fewer than a tile) run through the original nest.

Each output element still receives the same additions in the same order, so results do
not change. The pass is C-only (the CUDA printer never sees it) and conservative: it
applies only when every piece of the j loop's body is understood, and otherwise leaves
the nest alone. The region's loops must be serial and its output location invariant in
them; loads in the body are either invariant in j (broadcast) or at ``base + j``
(contiguous vector loads).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import count

from . import ir

#: accumulators per tile: 8 AVX2 registers of the 16, leaving room for loads and the
#: broadcast factor; FMA latency × issue width is also about 8 on current x86 cores
VECTORS = 8
#: macros of the C template: lanes per vector (set from the compiler's target flags)
#: and values per tile
VLEN = ir.Var("SC_VLEN")
TILE = ir.Var("SC_TILE")
_OPS = frozenset("+-*/")


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
    return ir.Block(tuple(_stmt(s, notes, ids) for s in b.body))


def _stmt(s: ir.Stmt, notes: list[str], ids: count[int]) -> ir.Stmt:
    match s:
        case ir.For():
            if s.parallel is None:
                nest = _nest(s)
                if nest is not None:
                    tiled = _tile(nest, next(ids))
                    if tiled is not None:
                        loops = ", ".join(loop.var for loop in nest.loops)
                        notes.append(f"{nest.inner.var} in register tiles across loop {loops}")
                        return tiled
            return replace(s, body=_block(s.body, notes, ids))
        case ir.While():
            return replace(s, body=_block(s.body, notes, ids))
        case ir.If():
            branches = tuple((c, _block(b, notes, ids)) for c, b in s.branches)
            orelse = _block(s.orelse, notes, ids) if s.orelse is not None else None
            return replace(s, branches=branches, orelse=orelse)
        case ir.Block():
            return _block(s, notes, ids)
    return s


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


def _tile(nest: _Nest, uid: int) -> ir.Stmt | None:
    try:
        return _Tiler(nest, uid).build()
    except _Refuse:
        return None


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
        self.env: dict[str, ir.Expr] = {}
        *decls, store = nest.inner.body.body
        for d in decls:
            assert isinstance(d, ir.Decl) and d.init is not None
            self.env[d.name] = self.resolve(d.init)
        assert isinstance(store, ir.Assign) and isinstance(store.target, ir.Load)
        self.store = store
        self.out = store.target.array

    def resolve(self, e: ir.Expr) -> ir.Expr:
        match e:
            case ir.Var(name=name) if name in self.env:
                return self.env[name]
            case ir.Load(array=a, index=i):
                return ir.Load(a, self.resolve(i))
            case ir.Bin(op=op, left=a, right=b):
                return ir.Bin(op, self.resolve(a), self.resolve(b))
            case ir.Unary(op=op, operand=x):
                return ir.Unary(op, self.resolve(x))
            case ir.Call(fn=fn, args=args):
                return ir.Call(fn, tuple(self.resolve(a) for a in args))
            case ir.Select(cond=c, then=a, other=b):
                return ir.Select(self.resolve(c), self.resolve(a), self.resolve(b))
        return e

    def base(self, index: ir.Expr) -> ir.Expr:
        """``b`` with ``index == b + j`` and ``b`` free of j; else refuse."""
        if self.j not in free_vars(index):
            raise _Refuse
        if index == ir.Var(self.j):
            return ir.IntLit(0)
        if isinstance(index, ir.Bin) and index.op == "+":
            a, b = index.left, index.right
            if self.j not in free_vars(b):
                return ir.add(self.base(a), b)
            if self.j not in free_vars(a):
                return ir.add(a, self.base(b))
        raise _Refuse

    def vector(self, e: ir.Expr, lane: int) -> ir.Expr:
        """The value expression over vector ``lane`` of the tile."""
        match e:
            case ir.Load(array=a, index=index):
                if a == self.out:
                    raise _Refuse
                if self.j not in free_vars(index):
                    return e
                at = ir.add(ir.add(self.base(index), ir.Var(self.jt)), self._lane(lane))
                return ir.Call("vload", (ir.Bin("+", ir.Var(a), at),))
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

    def build(self) -> ir.Stmt:
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
        region = self._replace_inner(nest.loops[0], inner)
        tiles = ir.Var(f"sc_tiles{self.uid}")
        t = f"sc_t{self.uid}"
        tile_loop = ir.For(
            t,
            ir.IntLit(0),
            tiles,
            ir.block(
                ir.Decl(ir.I64, self.jt, ir.Bin("*", ir.Var(t), TILE)),
                *(ir.Decl(ir.VEC, a, ir.Call("vload", (slot(v),))) for v, a in enumerate(acc)),
                region,
                *(ir.Effect(ir.Call("vstore", (slot(v), ir.Var(a)))) for v, a in enumerate(acc)),
            ),
        )
        rest = ir.Bin("*", tiles, TILE)
        remainder = self._replace_inner(nest.loops[0], None, start=rest)
        return ir.block(
            ir.Comment(f"{nest.inner.var} in tiles of SC_TILE values held in registers"),
            ir.Decl(ir.I64, tiles.name, ir.Bin("/", end, TILE)),
            tile_loop,
            ir.If(((ir.Bin("<", rest, end), ir.block(remainder)),)),
        )

    def _replace_inner(
        self, loop: ir.For, body: ir.Block | None, start: ir.Expr | None = None
    ) -> ir.For:
        """``loop`` with the j loop replaced by ``body``, or started at ``start``."""
        if loop is self.nest.inner:
            assert start is not None
            return replace(loop, start=start)
        stmts: list[ir.Stmt] = []
        for s in loop.body.body:
            if isinstance(s, ir.For):
                if s is self.nest.inner and body is not None:
                    stmts.extend(body.body)
                    continue
                s = self._replace_inner(s, body, start)
            stmts.append(s)
        return replace(loop, body=ir.Block(tuple(stmts)))
