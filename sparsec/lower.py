"""Lowering: concrete index notation + formats → loop IR (TACO's level-function lowering).

For each index variable in loop order the lowerer builds the merge lattice of the
expression and emits one of

* a dense loop over ``0..N`` when the lattice is *full* (some point has no iterator),
  co-iterating any sparse iterators by coordinate match;
* a position loop ``for p in pos[parent]..pos[parent+1]`` for a single iterator;
* for several iterators, one ``while`` loop per lattice point, each running while all
  its iterators have positions left, with one case per sub-point (TACO's co-iteration).

Inside a case, levels that hold the bound variable are *located* when they are dense
(``p_k = p_{k-1} * N + i``), and lowering recurses on the case's simplified expression.
At the innermost level the value is stored into the output (``+=`` into a zeroed dense
output), or into a scalar accumulator when only reduction loops remain. Nested sums
(left under ``+``) are computed into scalar temporaries where they are used.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from . import ir
from .abi import Namer, Signature
from .assemble import Assembler
from .concrete import ZERO, CExpr, Sum, Zero, accesses
from .errors import LoweringError
from .lattice import Iterator, Lattice, LatticePoint, build, divides
from .notation import Access, BinOp, Literal, Neg
from .order import level_indices, loop_order, output_edges
from .spec import Spec


@dataclass(frozen=True, slots=True)
class Bound:
    """A storage level whose position is known: ``pos`` and the end of its segment."""

    pos: ir.Expr
    next: ir.Expr


@dataclass(frozen=True, slots=True)
class Ctx:
    """What is known at a point of the loop nest (immutable; extended by `bind`)."""

    coords: dict[str, ir.Expr] = field(default_factory=dict)
    levels: dict[tuple[Access, int], Bound] = field(default_factory=dict)
    #: variables bound by plain dense loops, which visit every coordinate exactly once
    covered: frozenset[str] = frozenset()

    def bind(
        self,
        coords: dict[str, ir.Expr] | None = None,
        levels: dict[tuple[Access, int], Bound] | None = None,
        covered: str | None = None,
    ) -> Ctx:
        return replace(
            self,
            coords={**self.coords, **(coords or {})},
            levels={**self.levels, **(levels or {})},
            covered=self.covered | {covered} if covered else self.covered,
        )

    def depth(self, access: Access) -> int:
        """Number of leading levels of ``access`` whose positions are known."""
        k = 0
        while (access, k) in self.levels:
            k += 1
        return k


@dataclass(frozen=True, slots=True)
class OutputSink:
    pass


@dataclass(frozen=True, slots=True)
class AccSink:
    name: str
    #: set to 1 when a term is added (sparse outputs store only reached entries)
    flag: str = ""


@dataclass(frozen=True, slots=True)
class WorkspaceSink:
    """Scatter into a dense workspace over the output's last level (Gustavson)."""


Sink = OutputSink | AccSink | WorkspaceSink


@dataclass(frozen=True, slots=True)
class LoweredKernel:
    body: ir.Block
    loop_order: tuple[str, ...]
    #: loops that run on CPU threads, by index variable
    parallel_loops: tuple[str, ...] = ()
    #: every output element is written exactly once (no zeroing; ``=`` stores)
    exclusive: bool = False


class Lowerer:
    """Holds what every step needs: the spec, the ABI names, and the name supply."""

    def __init__(
        self,
        spec: Spec,
        sig: Signature,
        namer: Namer,
        *,
        parallel: bool = True,
        exclusive: bool = False,
        counting: bool = False,
    ) -> None:
        self.spec = spec
        self.sig = sig
        self.namer = namer
        self.formats = spec.formats
        self.lhs = spec.statement.lhs
        self.parallel = parallel
        self.var_names = {i: namer.fresh(i) for i in spec.indices}
        #: dense-exact lowering (see `lattice.build`) when the expression may make inf/NaN
        self.exact = divides(spec.statement.rhs)
        #: second pass: output writes are known to be exclusive (see `lower`)
        self.exclusive = exclusive
        self.out_op = "=" if exclusive else "+="
        #: per output write site: does it write each element exactly once?
        self.write_sites: list[bool] = []
        self.parallel_loops: list[str] = []
        #: zero the output slice of each outermost iteration (cache-hot) instead of up front
        self.zero_in_loop = False
        self.zeroed_slices = False
        #: sparse output: the kernel assembles pos/crd/vals (``counting``: sizes only)
        self.assembler = None if spec.output.format.is_dense else Assembler(self, counting=counting)
        #: index of the output's last level when it is scattered into a workspace
        self.workspace: str | None = None

    # ----------------------------------------------------------------- entry
    def kernel(self) -> LoweredKernel:
        stmt = self.spec.statement
        everything = [self.lhs, *accesses(stmt.rhs)]
        extra = output_edges(self.lhs, self.spec.output.format, stmt.top_sums)
        try:
            order = loop_order(stmt.loop_indices, everything, self.formats, extra=extra)
        except LoweringError:
            if self.assembler is None or not self.assembler.can_scatter():
                raise
            # the last output level cannot come before the reductions: scatter it into a
            # dense workspace and append the row afterwards (Gustavson's SpGEMM)
            ws = self.assembler.vars[self.assembler.layout.last]
            extra = tuple(e for e in extra if ws not in (e.before, e.after))
            order = loop_order(stmt.loop_indices, everything, self.formats, extra=extra)
            self.workspace = ws
        if self.assembler is not None:
            alloc = self.assembler.workspace_alloc(self.workspace)
            ctx = self._locate(Ctx(), [self.lhs])
            if self.workspace and self.assembler.layout.last == 0:
                body = self._scatter_gather(order, stmt.rhs, ctx[1])
            else:
                body = self.loops(order, stmt.rhs, ctx[1], OutputSink(), outermost=True)
            return LoweredKernel(
                ir.block(
                    *self.assembler.prologue(),
                    *alloc,
                    ctx[0],
                    body,
                    *self.assembler.workspace_free(self.workspace),
                    *self.assembler.epilogue(),
                ),
                order,
            )
        self.zero_in_loop = (
            not stmt.accumulate
            and not self.exclusive
            and self.lhs.order > 0
            and order[0] == level_indices(self.lhs, self.spec.output.format)[0]
        )
        ctx = self._locate(Ctx(), [self.lhs])
        body = self.loops(order, stmt.rhs, ctx[1], OutputSink(), outermost=True)
        zeroed = stmt.accumulate or self.exclusive or self.zeroed_slices
        init = None if zeroed else self._zero_output()
        exclusive = bool(self.write_sites) and all(self.write_sites) and not stmt.accumulate
        return LoweredKernel(
            ir.block(init, ctx[0], body), order, tuple(self.parallel_loops), exclusive
        )

    def _write(self, ctx: Ctx, value: ir.Expr | None) -> ir.Block:
        """Store into the output; records whether this site writes each element once."""
        if self.assembler is not None:
            return ir.block(*self.assembler.store(self._output_slot(ctx), value))
        assert value is not None
        lhs = set(self.lhs.indices)
        self.write_sites.append(lhs <= ctx.covered and set(ctx.coords) <= lhs)
        return ir.block(ir.Assign(self._output_slot(ctx), value, self.out_op))

    def _zero_output(self) -> ir.Stmt:
        out = self.spec.output
        size: ir.Expr = ir.IntLit(1)
        for var in level_indices(self.lhs, out.format):
            size = ir.mul(size, ir.Var(self.sig.dim(var)))
        vals = self.sig.array(out.name, "vals")
        p = self.namer.fresh("p")
        store = ir.Assign(ir.Load(vals, ir.Var(p)), ir.FloatLit(0.0))
        par = ir.Parallel("CPUThread", "static") if self.parallel and self.lhs.order else None
        return ir.block(
            ir.Comment(f"zero the output {out.name}"),
            ir.For(p, ir.IntLit(0), size, ir.block(store), par),
        )

    def _zero_slice(self, coord: ir.Expr) -> ir.Stmt:
        """Zero the output elements whose first-level coordinate is ``coord``."""
        self.zeroed_slices = True
        size: ir.Expr = ir.IntLit(1)
        for var in level_indices(self.lhs, self.spec.output.format)[1:]:
            size = ir.mul(size, ir.Var(self.sig.dim(var)))
        vals = self.sig.array(self.spec.output.name, "vals")
        p = self.namer.fresh("p")
        start = ir.mul(coord, size)
        store = ir.Assign(ir.Load(vals, ir.add(start, ir.Var(p))), ir.FloatLit(0.0))
        return ir.For(p, ir.IntLit(0), size, ir.block(store))

    def _parallel_for(self, var: str, trip: ir.Expr) -> tuple[ir.Stmt, ir.Parallel]:
        """A dynamic schedule with about eight chunks per thread (skewed rows balance)."""
        self.parallel_loops.append(var)
        chunk = self.namer.fresh("chunk")
        threads = ir.Var(self.sig.threads)
        per = ir.Bin("*", ir.IntLit(8), threads)
        size = ir.Bin("/", ir.Bin("+", trip, ir.Bin("-", per, ir.IntLit(1))), per)
        decl = ir.Decl(ir.I64, chunk, ir.Call("max", (ir.IntLit(1), size)))
        return decl, ir.Parallel("CPUThread", "dynamic", chunk)

    # ------------------------------------------------------------ loop nests
    def loops(
        self,
        order: tuple[str, ...],
        expr: CExpr,
        ctx: Ctx,
        sink: Sink,
        outermost: bool = False,
    ) -> ir.Block:
        """Code computing ``Σ order . expr`` (over the not-yet-bound ``order``) into ``sink``."""
        if expr is ZERO:
            self._nothing_written(sink)
            return ir.Block()
        if (
            order
            and isinstance(sink, OutputSink)
            and not set(order) & set(self.lhs.indices)
            and ctx.depth(self.lhs) == self.lhs.order
        ):
            acc = self.namer.fresh("acc")
            if self.assembler is None:
                return ir.block(
                    ir.Decl(ir.VAL, acc, ir.FloatLit(0.0)),
                    self.loops(order, expr, ctx, AccSink(acc)),
                    self._write(ctx, ir.Var(acc)),
                )
            # sparse output: an entry exists only if some term reached it
            reached = self.namer.fresh("reached")
            counting = self.assembler.counting
            return ir.block(
                None if counting else ir.Decl(ir.VAL, acc, ir.FloatLit(0.0)),
                ir.Decl(ir.BOOL, reached, ir.IntLit(0)),
                self.loops(order, expr, ctx, AccSink("" if counting else acc, reached)),
                ir.If(((ir.Var(reached), self._write(ctx, None if counting else ir.Var(acc))),)),
            )
        if not order:
            return self.compute(expr, ctx, sink)
        var, rest = order[0], order[1:]
        lattice = build(expr, lambda a: self._iterator(a, var, ctx), self.exact)
        if not lattice.points:
            self._nothing_written(sink)
            return ir.Block()
        return self.merge(var, rest, lattice, ctx, sink, outermost)

    def _nothing_written(self, sink: Sink) -> None:
        """A branch that stores nothing: the output must then be zeroed up front."""
        if isinstance(sink, OutputSink):
            self.write_sites.append(False)

    def _iterator(self, access: Access, var: str, ctx: Ctx) -> Iterator | None:
        levels = level_indices(access, self.formats[access.name])
        if var not in levels:
            return None
        k = levels.index(var)
        if not self.formats[access.name].levels[k].position_iteration:
            return None
        if ctx.depth(access) != k:
            raise LoweringError(f"internal: level {k + 1} of {access} iterated before its parent")
        return Iterator(access, k)

    # ------------------------------------------------------------ co-iterate
    def merge(
        self,
        var: str,
        rest: tuple[str, ...],
        lattice: Lattice,
        ctx: Ctx,
        sink: Sink,
        outermost: bool,
    ) -> ir.Block:
        iterators = lattice.iterators
        name = self.var_names[var]
        if lattice.full and not iterators:
            return self._dense_loop(var, rest, lattice.points[0], ctx, sink, outermost)
        if len(iterators) == 1 and len(lattice.points) == 1:
            return self._position_loop(var, rest, lattice.points[0], ctx, sink, outermost)

        state = {it: self._iterator_state(it, ctx) for it in iterators}
        init = [ir.Decl(ir.I64, s.pos, s.lo) for s in state.values()]
        init += [ir.Decl(ir.I64, s.end, s.hi) for s in state.values()]
        if lattice.full:
            loop_body = self._dense_case_body(var, rest, lattice, lattice.points, state, ctx, sink)
            loop = ir.For(name, ir.IntLit(0), ir.Var(self.sig.dim(var)), loop_body)
            return ir.block(*init, loop)
        loops: list[ir.Stmt] = []
        for top in lattice.points:
            its = sorted(top.iterators, key=str)
            cond = ir.conj(
                *(ir.Bin("<", ir.Var(state[it].pos), ir.Var(state[it].end)) for it in its)
            )
            reads: list[ir.Stmt] = [
                ir.Decl(ir.I64, state[it].coord, self._crd(it, ir.Var(state[it].pos))) for it in its
            ]
            coord: ir.Expr = ir.Var(state[its[0]].coord)
            for it in its[1:]:
                coord = ir.Call("min", (coord, ir.Var(state[it].coord)))
            reads.append(ir.Decl(ir.I64, name, coord))
            body = self._dense_case_body(
                var, rest, lattice, lattice.sub_points(top), state, ctx, sink, its, reads
            )
            loops.append(ir.While(cond, body))
        return ir.block(*init, *loops)

    def _dense_case_body(
        self,
        var: str,
        rest: tuple[str, ...],
        lattice: Lattice,
        cases: tuple[LatticePoint, ...],
        state: dict[Iterator, _IterState],
        ctx: Ctx,
        sink: Sink,
        live: list[Iterator] | None = None,
        reads: list[ir.Stmt] | None = None,
    ) -> ir.Block:
        """One step of co-iteration: which iterators sit at ``var``, the cases, advancing.

        In a dense loop (``live`` is None) every iterator may be exhausted, so presence is
        ``p < end && crd[p] == var``; in a while loop the condition guarantees positions.
        """
        name = self.var_names[var]
        its = live if live is not None else sorted(lattice.iterators, key=str)
        stmts: list[ir.Stmt] = list(reads or [])
        for it in its:
            s = state[it]
            if live is None:
                here = ir.conj(
                    ir.Bin("<", ir.Var(s.pos), ir.Var(s.end)),
                    ir.Bin("==", self._crd(it, ir.Var(s.pos)), ir.Var(name)),
                )
            else:
                here = ir.Bin("==", ir.Var(s.coord), ir.Var(name))
            stmts.append(ir.Decl(ir.BOOL, s.here, here))
            stmts.extend(self._segment(it, s, ir.Var(name)))
        branches: list[tuple[ir.Expr, ir.Block]] = []
        orelse: ir.Block | None = None
        for point in cases:
            body = self._case(var, rest, point, state, ctx, sink)
            if point.iterators:
                cond = ir.conj(*(ir.Var(state[it].here) for it in sorted(point.iterators, key=str)))
                branches.append((cond, body))
            else:
                orelse = body
                break
        if branches:
            stmts.append(ir.If(tuple(branches), orelse))
        elif orelse is not None:
            stmts.extend(orelse.body)
        counting = self.assembler is not None and self.assembler.counting
        for it in its:
            s = state[it]
            if counting and self._unique(it):
                # no values are read while counting: advance without a branch (a merge's
                # branches are unpredictable; GCC keeps them for the select otherwise)
                step: ir.Expr = ir.Bin("+", ir.Var(s.pos), ir.Var(s.here))
            else:
                step = ir.Select(ir.Var(s.here), s.advance, ir.Var(s.pos))
            stmts.append(ir.Assign(ir.Var(s.pos), step))
        return ir.block(*stmts)

    def _segment(
        self, it: Iterator, s: _IterState, coord: ir.Expr, guarded: bool = True
    ) -> list[ir.Stmt]:
        """For a non-unique level: find the end of the run of equal coordinates (only when
        the iterator is present at ``coord``, unless ``guarded`` is off)."""
        if self._unique(it):
            return []
        nxt = ir.Var(s.next)
        guard = [ir.Var(s.here)] if guarded else []
        scan = ir.While(
            ir.conj(
                *guard,
                ir.Bin("<", nxt, ir.Var(s.end)),
                ir.Bin("==", self._crd(it, nxt), coord),
            ),
            ir.block(ir.Assign(nxt, ir.Bin("+", nxt, ir.IntLit(1)))),
        )
        return [ir.Decl(ir.I64, s.next, ir.Bin("+", ir.Var(s.pos), ir.IntLit(1))), scan]

    def _case(
        self,
        var: str,
        rest: tuple[str, ...],
        point: LatticePoint,
        state: dict[Iterator, _IterState],
        ctx: Ctx,
        sink: Sink,
    ) -> ir.Block:
        levels = {
            (it.access, it.level): Bound(ir.Var(state[it].pos), state[it].advance)
            for it in point.iterators
        }
        inner = ctx.bind({var: ir.Var(self.var_names[var])}, levels)
        return self._enter(var, rest, point.expr, inner, sink)

    def _enter(
        self, var: str, rest: tuple[str, ...], expr: CExpr, ctx: Ctx, sink: Sink
    ) -> ir.Block:
        """Code for the body of one iteration that has just bound ``var``."""
        level = self.assembler.level_of(var) if self.assembler else None
        if self.assembler is None or level is None:
            located, ctx = self._locate(ctx, [self.lhs, *accesses(expr)])
            return ir.block(located, self.loops(rest, expr, ctx, sink))
        if var == self.workspace:
            located, ctx = self._locate(ctx, list(accesses(expr)))
            return ir.block(located, self.loops(rest, expr, ctx, sink))
        slot = self.assembler.bind(level)
        if slot is not None:
            ctx = ctx.bind(levels={(self.lhs, level): Bound(slot, ir.Bin("+", slot, ir.IntLit(1)))})
        located, ctx = self._locate(ctx, [self.lhs, *accesses(expr)])
        bound = ctx.levels.get((self.lhs, level))
        before, after = self.assembler.around(level, bound.pos if bound else None)
        if self.workspace and level == self.assembler.layout.last - 1:
            inner = self._scatter_gather(rest, expr, ctx)
        else:
            inner = self.loops(rest, expr, ctx, sink)
        return ir.block(located, *before, inner, *after)

    def _scatter_gather(self, rest: tuple[str, ...], expr: CExpr, ctx: Ctx) -> ir.Block:
        """Scatter the remaining loops into the workspace, then append its sorted row."""
        assert self.assembler is not None
        return ir.block(self.loops(rest, expr, ctx, WorkspaceSink()), *self.assembler.gather())

    def _dense_loop(
        self,
        var: str,
        rest: tuple[str, ...],
        point: LatticePoint,
        ctx: Ctx,
        sink: Sink,
        outermost: bool,
    ) -> ir.Block:
        name = self.var_names[var]
        inner = ctx.bind({var: ir.Var(name)}, covered=var)
        body = self._enter(var, rest, point.expr, inner, sink)
        if outermost and self.zero_in_loop:
            body = ir.block(self._zero_slice(ir.Var(name)), body)
        trip = ir.Var(self.sig.dim(var))
        par = self._parallel_for(var, trip) if self._can_parallelize(var, outermost) else None
        loop = ir.For(name, ir.IntLit(0), trip, body, par[1] if par else None)
        return ir.block(par[0] if par else None, loop)

    def _position_loop(
        self,
        var: str,
        rest: tuple[str, ...],
        point: LatticePoint,
        ctx: Ctx,
        sink: Sink,
        outermost: bool,
    ) -> ir.Block:
        (it,) = point.iterators
        s = self._iterator_state(it, ctx)
        name = self.var_names[var]
        pos = ir.Var(s.pos)
        read = ir.Decl(ir.I64, name, self._crd(it, pos))
        if self._unique(it):
            levels = {(it.access, it.level): Bound(pos, ir.Bin("+", pos, ir.IntLit(1)))}
            inner = ctx.bind({var: ir.Var(name)}, levels)
            body = ir.block(read, self._enter(var, rest, point.expr, inner, sink))
            end = ir.Decl(ir.I64, s.end, s.hi)
            trip = ir.Bin("-", ir.Var(s.end), s.lo)
            par = self._parallel_for(var, trip) if self._can_parallelize(var, outermost) else None
            loop = ir.For(s.pos, s.lo, ir.Var(s.end), body, par[1] if par else None)
            return ir.block(end, par[0] if par else None, loop)
        # Non-unique level: walk runs of equal coordinates; children see [p, next).
        levels = {(it.access, it.level): Bound(pos, ir.Var(s.next))}
        inner = ctx.bind({var: ir.Var(name)}, levels)
        body = ir.block(
            read,
            *self._segment(it, s, ir.Var(name), guarded=False),
            self._enter(var, rest, point.expr, inner, sink),
            ir.Assign(pos, ir.Var(s.next)),
        )
        return ir.block(
            ir.Decl(ir.I64, s.pos, s.lo),
            ir.Decl(ir.I64, s.end, s.hi),
            ir.While(ir.Bin("<", pos, ir.Var(s.end)), body),
        )

    def _can_parallelize(self, var: str, outermost: bool) -> bool:
        """Outermost loop over an output index: every iteration writes its own slice."""
        if self.assembler is not None and not self.assembler.rowwise:
            return False  # appending into one sequence of positions is serial
        return self.parallel and outermost and var in self.lhs.indices

    # ------------------------------------------------------------- iterators
    def _iterator_state(self, it: Iterator, ctx: Ctx) -> _IterState:
        t, k = it.access.name, it.level
        fmt = self.formats[t].levels[k]
        parent = ctx.levels.get((it.access, k - 1)) if k > 0 else None
        if fmt.inherits_parent_range:
            assert parent is not None
            lo, hi = parent.pos, parent.next
        else:
            ppos = parent.pos if parent else ir.IntLit(0)
            pos_arr = self.sig.array(t, "pos", k)
            lo = ir.Load(pos_arr, ppos)
            hi = ir.Load(pos_arr, ir.add(ppos, ir.IntLit(1)))
        var = level_indices(it.access, self.formats[t])[k]
        p = self.namer.fresh(f"p{t}{k + 1}")
        nxt = self.namer.fresh(f"{p}_next") if not fmt.unique else ""
        here = self.namer.fresh(f"{var}{t}_here")
        advance = ir.Var(nxt) if nxt else ir.Bin("+", ir.Var(p), ir.IntLit(1))
        return _IterState(
            pos=p,
            end=self.namer.fresh(f"{p}_end"),
            coord=self.namer.fresh(f"{var}{t}"),
            here=here,
            next=nxt,
            lo=lo,
            hi=hi,
            advance=advance,
        )

    def _crd(self, it: Iterator, pos: ir.Expr) -> ir.Expr:
        return ir.Load(self.sig.array(it.access.name, "crd", it.level), pos)

    def _unique(self, it: Iterator) -> bool:
        return self.formats[it.access.name].levels[it.level].unique

    # ---------------------------------------------------------------- locate
    def _locate(self, ctx: Ctx, accs: list[Access]) -> tuple[ir.Block, Ctx]:
        """Compute positions of dense levels whose coordinate and parent are known."""
        decls: list[ir.Stmt] = []
        for access in dict.fromkeys(accs):
            fmt = self.formats[access.name]
            levels = level_indices(access, fmt)
            k = ctx.depth(access)
            while k < len(levels) and fmt.levels[k].locate and levels[k] in ctx.coords:
                parent = ctx.levels[(access, k - 1)].pos if k > 0 else None
                coord = ctx.coords[levels[k]]
                pos = (
                    coord
                    if parent is None
                    else ir.add(ir.mul(parent, ir.Var(self.sig.dim(levels[k]))), coord)
                )
                p = self.namer.fresh(f"p{access.name}{k + 1}")
                decls.append(ir.Decl(ir.I64, p, pos))
                ctx = ctx.bind(
                    levels={(access, k): Bound(ir.Var(p), ir.Bin("+", ir.Var(p), ir.IntLit(1)))}
                )
                k += 1
        return ir.block(*decls), ctx

    # --------------------------------------------------------------- compute
    def _output_slot(self, ctx: Ctx) -> ir.Load:
        vals = self.sig.array(self.lhs.name, "vals")
        if self.lhs.order == 0:
            return ir.Load(vals, ir.IntLit(0))
        return ir.Load(vals, ctx.levels[(self.lhs, self.lhs.order - 1)].pos)

    def compute(self, expr: CExpr, ctx: Ctx, sink: Sink) -> ir.Block:
        """The innermost statement: add the value of ``expr`` into ``sink``.

        When only counting a sparse output's positions, no value is computed.
        """
        stmts: list[ir.Stmt] = []
        counting = self.assembler is not None and self.assembler.counting
        value = None if counting else self.value(expr, ctx, stmts)
        match sink:
            case OutputSink():
                stmts.append(self._write(ctx, value))
            case AccSink(name=name, flag=flag):
                if value is not None:
                    stmts.append(ir.Assign(ir.Var(name), value, "+="))
                if flag:
                    stmts.append(ir.Assign(ir.Var(flag), ir.IntLit(1)))
            case WorkspaceSink():
                assert self.assembler is not None and self.workspace is not None
                coord = ir.Var(self.var_names[self.workspace])
                stmts.extend(self.assembler.scatter(coord, value))
        return ir.block(*stmts)

    def value(self, expr: CExpr, ctx: Ctx, stmts: list[ir.Stmt]) -> ir.Expr:
        """The IR value of ``expr`` with every variable bound; nested sums emit into ``stmts``."""
        match expr:
            case Access(name=name, order=0):
                return ir.Var(self.sig.value(name))
            case Access():
                last = ctx.levels.get((expr, expr.order - 1))
                if last is None:
                    raise LoweringError(f"internal: {expr} read before all its levels are bound")
                return ir.Load(self.sig.array(expr.name, "vals"), last.pos)
            case Literal(value=v):
                return ir.FloatLit(v)
            case Zero():
                return ir.FloatLit(0.0)
            case Neg(operand=x):
                return ir.Unary("-", self.value(x, ctx, stmts))
            case BinOp(op=op, left=left, right=right):
                return ir.Bin(op, self.value(left, ctx, stmts), self.value(right, ctx, stmts))
            case Sum(indices=indices, body=body):
                outer = tuple(ctx.coords)
                order = loop_order(indices, list(accesses(body)), self.formats, outer)
                t = self.namer.fresh("t")
                stmts.append(ir.Decl(ir.VAL, t, ir.FloatLit(0.0)))
                stmts.extend(self.loops(order, body, ctx, AccSink(t)).body)
                return ir.Var(t)
            case _:
                raise AssertionError(expr)


@dataclass(frozen=True, slots=True)
class _IterState:
    """Names of one iterator's variables in one co-iteration loop."""

    pos: str
    end: str
    coord: str
    here: str
    next: str
    lo: ir.Expr
    hi: ir.Expr
    advance: ir.Expr


def lower(
    spec: Spec, make_names, *, parallel: bool = True, counting: bool = False
) -> tuple[LoweredKernel, Signature]:
    """Lower ``spec``; a second pass drops the output zeroing when every element is
    written exactly once (plain dense loops over all output indices), storing with ``=``.

    ``make_names()`` returns a fresh ``(Signature, Namer)``, so both passes name alike.
    ``counting`` lowers the assemble kernel of a sparse output (sizes only).
    """
    sig, namer = make_names()
    if not spec.output.format.is_dense:
        lowered = Lowerer(spec, sig, namer, parallel=parallel, counting=counting).kernel()
        return lowered, sig
    first = Lowerer(spec, sig, namer, parallel=parallel).kernel()
    if not first.exclusive:
        return first, sig
    sig, namer = make_names()
    return Lowerer(spec, sig, namer, parallel=parallel, exclusive=True).kernel(), sig
